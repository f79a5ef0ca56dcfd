"""Starting multi-process benches: who am I, how many of us can run here, and torchrun from Python.

Every distributed bench in ``preflight.bench`` (scaling, allreduce, overlap, pipeline, elastic) has
two halves that meet here:

- **the worker** (one process per rank) asks :func:`dist_env` who it is and joins the process group
  with :func:`init_distributed`. Three launchers are understood, in this order: ``torchrun`` (it sets
  RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT), ``srun`` with one task per device (the
  same facts derived from SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID / SLURM_JOB_NODELIST), or
  nothing at all (a single process on a free local port).
- **the launcher side** (a notebook, a test, the audit) asks :func:`max_processes` how many ranks this
  machine can run meaningfully, builds the command with :func:`torchrun_cmd` and runs it with
  :func:`run_torchrun`, which stops the whole process tree on a timeout.

Nothing here imports torch at module level: the launcher side stays cheap, and the test helpers can
use :func:`free_ports` without a torch start-up.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys

__all__ = ["dist_env", "first_slurm_host", "free_port", "free_ports", "init_distributed", "max_processes",
           "run_torchrun", "torchrun_cmd"]


# --- who am I: torchrun, srun or alone ----------------------------------------------------------------

def first_slurm_host(nodelist: str) -> str:
    """First hostname of a Slurm node list: ``"gpu[003-010,12],login1"`` -> ``"gpu003"``.

    Rank 0 runs there, so it is the rendezvous address (MASTER_ADDR) every task can compute alone.
    Inside a batch script ``scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1`` is the usual
    way; this pure version serves tasks started by ``srun`` without torchrun.
    """
    first, depth = "", 0
    for ch in nodelist.strip():
        if ch == "," and depth == 0:
            break
        depth += ch == "["
        depth -= ch == "]"
        first += ch
    # every bracket group: keep its first element ("003-010,12" -> "003")
    return re.sub(r"\[([^\],\-]+)[^\]]*\]", r"\1", first)


def dist_env(environ: dict | None = None) -> dict:
    """Rank layout from the environment, as a dict (pure function of ``environ``).

    torchrun sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT (and GROUP_WORLD_SIZE =
    nodes); they win when present. Otherwise, under ``srun`` with one task per device, they are derived
    from SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID / SLURM_JOB_NODELIST, with a port derived from
    the job id (so concurrent jobs on a shared head node do not collide). Neither: one process (on a
    free local port, the only part not decided by ``environ``).
    Keys: rank, world_size, local_rank, local_world_size, nodes, master_addr, master_port, launcher.
    """
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        world = int(env["WORLD_SIZE"])
        local_world = int(env.get("LOCAL_WORLD_SIZE", world))
        nodes = env.get("GROUP_WORLD_SIZE") or env.get("SLURM_NNODES") or max(1, world // max(1, local_world))
        return {"rank": int(env["RANK"]), "world_size": world, "local_rank": int(env.get("LOCAL_RANK", 0)),
                "local_world_size": local_world, "nodes": int(nodes),
                "master_addr": env.get("MASTER_ADDR", "127.0.0.1"),
                "master_port": int(env.get("MASTER_PORT", 29500)), "launcher": "torchrun"}
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        world = int(env["SLURM_NTASKS"])
        nodes = int(env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES") or 1)
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "127.0.0.1"
        per_node = env.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]
        local_world = int(per_node) if per_node.isdigit() else max(1, world // nodes)
        port = env.get("MASTER_PORT") or 10000 + int(env.get("SLURM_JOB_ID", 0)) % 20000
        return {"rank": int(env["SLURM_PROCID"]), "world_size": world,
                "local_rank": int(env.get("SLURM_LOCALID", 0)), "local_world_size": local_world,
                "nodes": nodes, "master_addr": env.get("MASTER_ADDR") or first_slurm_host(nodelist),
                "master_port": int(port), "launcher": "srun"}
    return {"rank": 0, "world_size": 1, "local_rank": 0, "local_world_size": 1, "nodes": 1,
            "master_addr": "127.0.0.1", "master_port": int(env.get("MASTER_PORT", 0)) or free_port(),
            "launcher": "single"}


def init_distributed(use_gpu: bool = True, **kw):
    """Join the process group from the launcher's environment: (dist_env dict, this rank's device).

    NCCL on ``cuda:LOCAL_RANK`` when this node has a GPU for every local rank; otherwise gloo on the
    CPU (NCCL refuses two ranks on one GPU: "Duplicate GPU detected"), and ``use_gpu=False`` asks for
    the CPU outright. ``kw`` goes to ``init_process_group`` (e.g. ``timeout``).

    Under srun or alone, the variables ``init_process_group`` reads (RANK, MASTER_ADDR, ...) are set
    from :func:`dist_env` first, so one worker serves all three launchers.
    """
    import torch
    import torch.distributed as dist

    de = dist_env()
    for key, var in (("rank", "RANK"), ("world_size", "WORLD_SIZE"), ("local_rank", "LOCAL_RANK"),
                     ("master_addr", "MASTER_ADDR"), ("master_port", "MASTER_PORT")):
        os.environ.setdefault(var, str(de[key]))     # srun / single: what init_process_group reads
    if use_gpu and torch.cuda.is_available() and torch.cuda.device_count() >= de["local_world_size"]:
        device = torch.device("cuda", de["local_rank"])
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", rank=de["rank"], world_size=de["world_size"], device_id=device, **kw)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", rank=de["rank"], world_size=de["world_size"], **kw)
    return de, device


# --- free ports ----------------------------------------------------------------------------------------

def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports on 127.0.0.1 that were free a moment ago.

    The operating system picks each one (bind to port 0); the sockets stay bound together until all
    are picked, so the ports differ. Another process may still take one before it is used: good for
    tests and single-machine runs, not a reservation.
    """
    socks = []
    try:
        for _ in range(n):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            sock.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


def free_port() -> int:
    """One free TCP port on 127.0.0.1 (see :func:`free_ports`), e.g. for a rendezvous endpoint."""
    return free_ports(1)[0]


# --- the launcher side: how many, which command, run it -----------------------------------------------

def max_processes() -> tuple[int, str]:
    """How many ranks this machine can run meaningfully, and the unit label.

    GPUs: one rank per device, ``"GPUs (nccl)"``. CPU: one rank per usable core (the affinity mask,
    not ``os.cpu_count()``), ``"processes (CPU, gloo)"``: more ranks than cores time the OS
    scheduler, not the collective.
    """
    import torch

    if torch.cuda.is_available():
        return torch.cuda.device_count(), "GPUs (nccl)"
    return len(os.sched_getaffinity(0)), "processes (CPU, gloo)"


def torchrun_cmd(nproc: int, module: str, *args: str) -> list[str]:
    """``torchrun --standalone --nproc_per_node=nproc -m module args...`` for this interpreter.

    ``python -m torch.distributed.run`` is torchrun without relying on the script being on PATH (a
    virtual environment that is not activated). ``--standalone`` runs a local rendezvous on a free
    port, so concurrent launches on one machine do not collide.
    """
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", module, *map(str, args)]


def run_torchrun(cmd: list[str], env: dict, timeout: float) -> str:
    """Run a launcher command (torchrun) in its own process group; its output (stdout and stderr
    together, e.g. the NCCL_DEBUG=INFO log).

    On a timeout the whole group is stopped (SIGTERM, then SIGKILL): killing only torchrun would leave
    its workers running, holding ports and cores. Raises ``TimeoutError`` then, and ``RuntimeError``
    with the output's last 60 lines when the command exits non-zero.
    """
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
                output, _ = proc.communicate(timeout=10)
                break
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue
        raise TimeoutError(f"torchrun did not finish within {timeout:.0f} s: {' '.join(cmd)}") from None
    if proc.returncode != 0:
        tail = "\n".join(output.strip().splitlines()[-60:])
        raise RuntimeError(f"torchrun exited with {proc.returncode}: {' '.join(cmd)}\n{tail}")
    return output


def exit_worker(main) -> None:
    """Run a torchrun worker's ``main()`` and end the process with ``os._exit``.

    By then the record is written and every rank has passed the barrier and destroyed the process
    group. A normal interpreter exit still aborted in about 1 run in 40 on gloo (2 cores, torch 2.13:
    "terminate called without an active exception", in C++ teardown after the last Python frame),
    and torchrun then failed a finished run; with ``os._exit``, 0 in 80. (``main()`` itself returns
    normally, for callers in-process.)"""
    import os
    import sys

    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
