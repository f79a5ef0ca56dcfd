"""The launch helpers every multi-process bench shares (``preflight.harness.launch``): who a rank is
under torchrun / srun / alone (pure functions of the environment), free ports, the torchrun command,
and the runner that stops a whole process group on a timeout."""
from __future__ import annotations

import socket
import sys
import time

import pytest

from preflight.harness import launch


# ---------------------------------------------------------------------------- environment (pure)
@pytest.mark.parametrize("nodelist, first", [
    ("gpu001", "gpu001"),
    ("gpu[003-010,12]", "gpu003"),
    ("gpu[003-010,12],login1", "gpu003"),
    ("a100-[7,9]", "a100-7"),
    ("rack[1-2]-node[01-04]", "rack1-node01"),
    ("n1,n2", "n1"),
])
def test_first_slurm_host(nodelist, first):
    assert launch.first_slurm_host(nodelist) == first


def test_dist_env_from_slurm():
    env = {"SLURM_PROCID": "13", "SLURM_NTASKS": "16", "SLURM_LOCALID": "5", "SLURM_NNODES": "2",
           "SLURM_JOB_NODELIST": "gpu[007-008]", "SLURM_NTASKS_PER_NODE": "8(x2)", "SLURM_JOB_ID": "4242"}
    d = launch.dist_env(env)
    assert d == {"rank": 13, "world_size": 16, "local_rank": 5, "local_world_size": 8, "nodes": 2,
                 "master_addr": "gpu007", "master_port": 10000 + 4242, "launcher": "srun"}
    env["MASTER_ADDR"], env["MASTER_PORT"] = "head", "29999"
    d = launch.dist_env(env)
    assert (d["master_addr"], d["master_port"]) == ("head", 29999)


def test_dist_env_torchrun_wins_over_slurm():
    env = {"RANK": "9", "WORLD_SIZE": "16", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "8",
           "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "n0", "MASTER_PORT": "29400",
           "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_NNODES": "2"}
    assert launch.dist_env(env) == {"rank": 9, "world_size": 16, "local_rank": 1, "local_world_size": 8,
                                     "nodes": 2, "master_addr": "n0", "master_port": 29400,
                                     "launcher": "torchrun"}


def test_dist_env_single_process():
    d = launch.dist_env({})
    assert (d["rank"], d["world_size"], d["nodes"], d["launcher"]) == (0, 1, 1, "single")
    assert d["master_port"] > 0


# ---------------------------------------------------------------------------- ports, command, runner
def test_free_ports_are_distinct_and_bindable():
    ports = launch.free_ports(3)
    assert len(set(ports)) == 3 and all(p > 0 for p in ports)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", launch.free_port()))


def test_torchrun_cmd_is_standalone_for_this_interpreter():
    cmd = launch.torchrun_cmd(2, "preflight.bench.scaling", "--out", "/x", "--steps", 5)
    assert cmd == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                   "-m", "preflight.bench.scaling", "--out", "/x", "--steps", "5"]


def test_max_processes_names_its_unit():
    n, unit = launch.max_processes()
    assert n >= 0
    assert unit in ("GPUs (nccl)", "processes (CPU, gloo)")


def test_run_torchrun_returns_output_and_reports_failures():
    assert launch.run_torchrun([sys.executable, "-c", "print('hello')"], {}, 30).strip() == "hello"
    with pytest.raises(RuntimeError, match="exited with 3"):
        launch.run_torchrun([sys.executable, "-c", "print('boom'); raise SystemExit(3)"], {}, 30)


def test_run_torchrun_stops_the_whole_group_on_timeout(tmp_path):
    marker = tmp_path / "child-alive"
    # the parent starts a child in the same session, then both sleep: the timeout must stop both
    child = f"import time; time.sleep(2); open({str(marker)!r}, 'w').close()"
    code = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(30)"
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="did not finish within 1 s"):
        launch.run_torchrun([sys.executable, "-c", code], {}, 1)
    assert time.monotonic() - t0 < 15
    time.sleep(2.5)
    assert not marker.exists()
