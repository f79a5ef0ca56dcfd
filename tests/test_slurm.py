"""The Slurm walltime-requeue template (chapter 5): its trap logic with stand-in commands (anywhere),
then on a real single-node Slurm cluster (root + Debian's packages; tests/slurm_cluster.py): srun
starts tasks, and a training longer than its walltime checkpoints at the warning signal, is requeued,
resumes and ends with the same loss as an uninterrupted run."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO
from preflight.harness.launch import free_port
from slurm_cluster import slurm_cluster

SBATCH = REPO / "lib" / "preflight" / "slurm" / "walltime_requeue.sbatch"
LINE = re.compile(r"^\[walltime_requeue (\S+) t=([0-9.]+)\] (.*)$")


def _events(text: str) -> list[tuple[float, str]]:
    """The template's log lines: (epoch seconds, message)."""
    return [(float(m.group(2)), m.group(3)) for m in map(LINE.match, text.splitlines()) if m]


def _allocations(text: str) -> list[dict]:
    """One dict per allocation from the job's output file: restart, start, usr1, exit, rc, requeued."""
    out: list[dict] = []
    for t, msg in _events(text):
        if msg.startswith("allocation start:"):
            out.append({"restart": int(re.search(r"restart=(\d+)", msg).group(1)), "start": t,
                        "usr1": None, "exit": None, "rc": None, "requeued": False})
        elif out and msg.startswith("USR1 received"):
            out[-1]["usr1"] = t
        elif out and msg.startswith("training exited:"):
            out[-1]["exit"], out[-1]["rc"] = t, int(re.search(r"rc=(\d+)", msg).group(1))
        elif out and "requeue job" in msg:
            out[-1]["requeued"] = True
    return out


def _losses(path) -> dict[int, str]:
    """step -> loss_hex from a trainloop log (event lines skipped; a step logged twice keeps the last)."""
    steps = {}
    for line in path.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            if "event" not in r:
                steps[int(r["step"])] = r["loss_hex"]
    return steps


def _report(capsys, text: str) -> None:
    with capsys.disabled():           # shown in the `make test` output, not swallowed by capture
        print(f"\n{text}", flush=True)


def test_template_is_valid_bash_and_documented():
    r = subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    text = SBATCH.read_text()
    for want in ("#SBATCH --signal=B:USR1@90", "#SBATCH --requeue", "#SBATCH --open-mode=append",
                 "scontrol requeue", "mapfile -t NODES", "CKPT_DIR", "TRAIN_ARGS", "NPROC", "PYTHON",
                 "sbatch --time=", "--export=ALL,CKPT_DIR="):
        assert want in text, want
    assert "| head" not in text.replace("`| head -n 1`", "")     # SIGPIPE under pipefail


# ------------------------------------------------------------------ the trap, with stand-ins (no Slurm)
def _stub_env(tmp_path, mode: str) -> tuple[dict, dict]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    paths = {"args": tmp_path / "srun.args", "calls": tmp_path / "scontrol.calls", "ckpt": tmp_path / "ckpt"}
    # srun: records its arguments, then plays the training: polls STOP (stop mode), finishes (done
    # mode) or fails (fail mode)
    srun = f"""#!/bin/bash
printf '%s\\n' "$@" > {paths['args']}.tmp && mv {paths['args']}.tmp {paths['args']}
ck={paths['ckpt']}
case "$STUB_MODE" in
  done) : > "$ck/DONE"; exit 0 ;;
  fail) exit 3 ;;
esac
for i in $(seq 400); do [[ -e "$ck/STOP" ]] && exit 0; sleep 0.05; done
exit 9
"""
    scontrol = f"""#!/bin/bash
if [[ "$1" == show ]]; then printf 'node1\\nnode2\\n'; exit 0; fi
echo "$@" >> {paths['calls']}
"""
    for name, text in {"srun": srun, "scontrol": scontrol}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "CKPT_DIR": str(paths["ckpt"]), "STUB_MODE": mode,
           "SLURM_JOB_ID": "7", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "node[1-2]",
           "SLURM_RESTART_COUNT": "3", "NPROC": "4", "PYTHON": "py", "TRAIN_ARGS": "--steps 50 --seed 2"}
    paths["ckpt"].mkdir()
    (paths["ckpt"] / "STOP").write_text("")         # left over from the previous allocation
    return env, paths


@pytest.mark.parametrize("mode, rc, requeued", [("stop", 0, True), ("done", 0, False), ("fail", 3, False)])
def test_template_trap_with_stand_ins(tmp_path, mode, rc, requeued):
    """USR1 -> STOP file -> training exits -> `scontrol requeue`; no requeue when DONE or on a failure;
    the previous allocation's STOP file is removed first; the launch line is torchrun per node."""
    env, paths = _stub_env(tmp_path, mode)
    p = subprocess.Popen(["bash", str(SBATCH)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    try:
        deadline = time.monotonic() + 30
        while not paths["args"].exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert paths["args"].exists(), "the training was not started"
        if mode == "stop":
            assert not (paths["ckpt"] / "STOP").exists(), "the old STOP file was not removed"
            p.send_signal(signal.SIGUSR1)       # Slurm's --signal=B:USR1@N, to the batch shell
        out, _ = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate(timeout=10)
    assert p.returncode == rc, out
    calls = paths["calls"].read_text() if paths["calls"].exists() else ""
    assert ("requeue 7" in calls) == requeued, out
    assert "allocation start: job=7 restart=3" in out
    args = paths["args"].read_text().split("\n")
    for want in ("--nodes=2", "--ntasks-per-node=1", "py", "torch.distributed.run", "--nnodes=2",
                 "--nproc-per-node=4", "--rdzv-backend=c10d", "--rdzv-endpoint=node1:29507",
                 "preflight.harness.trainloop", "--ckpt-dir", str(paths["ckpt"]), "--losses",
                 str(paths["ckpt"] / "train.jsonl"), "--steps", "50", "--seed", "2"):
        assert want in args, want
    assert args[args.index("preflight.harness.trainloop") - 2:][:2] == ["-m", "--"]
    if mode == "stop":
        assert "USR1 received" in out and (paths["ckpt"] / "STOP").exists()
    if mode != "stop":
        assert not (paths["ckpt"] / "STOP").exists()


# ------------------------------------------------------------------ a real cluster
@pytest.fixture
def cluster(tmp_path):
    with slurm_cluster(tmp_path / "slurm") as c:
        yield c


@pytest.mark.slurm
def test_cluster_runs_two_tasks(cluster, record_property, capsys):
    r = cluster.run("srun", "--ntasks=2", "--overcommit", "bash", "-c", "echo $SLURM_PROCID", timeout=60)
    assert r.returncode == 0, r.stderr + cluster.diagnostics()
    assert sorted(r.stdout.split()) == ["0", "1"]
    record_property("slurm_bringup_s", round(cluster.bringup_s, 2))
    _report(capsys, f"Slurm single-node bring-up: {cluster.bringup_s:.1f} s")


STEPS, CKPT_EVERY, STEP_SLEEP, SEED = 40, 5, 2.5, 3     # ~100 s of steps: more than one 2-min allocation
TIME_MIN, SIGNAL_S = 2, 30        # Slurm signals 30..90 s before the limit: the first allocation stops


@pytest.mark.slurm
def test_walltime_requeue_round_trip(cluster, tmp_path, tmp_path_factory, record_property, capsys):
    """sbatch --time=2 of ~100 s of steps: USR1 before the limit -> checkpoint -> requeue -> resume ->
    DONE, in >= 2 allocations, with the final loss of an uninterrupted run, bit for bit."""
    if importlib.util.find_spec("preflight.harness.trainloop") is None:
        pytest.skip("preflight.harness.trainloop is not there yet")
    ckpt, out_file = tmp_path / "ckpt", tmp_path / "job.out"
    train_args = f"--steps {STEPS} --ckpt-every {CKPT_EVERY} --seed {SEED}"

    t0 = time.monotonic()
    job = cluster.submit(SBATCH, f"--time={TIME_MIN}", f"--signal=B:USR1@{SIGNAL_S}", f"--output={out_file}",
                         f"--chdir={tmp_path}", "--job-name=preflight-requeue-test",
                         env={"CKPT_DIR": str(ckpt), "PYTHON": sys.executable, "NPROC": "1",
                              "RDZV_PORT": str(free_port()),        # not 29500 + job id: other clusters run here
                              "TRAIN_ARGS": f"{train_args} --step-sleep {STEP_SLEEP}"})
    state = cluster.wait(job, {"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "OUT_OF_MEMORY"},
                         timeout=600)
    round_trip = time.monotonic() - t0
    text = out_file.read_text() if out_file.exists() else "(no output file)"
    assert state == "COMPLETED", f"job {job}: {state}\n{text}\n{cluster.diagnostics()}"

    allocs = _allocations(text)
    restarts = [a["restart"] for a in allocs]
    assert len(allocs) >= 2 and restarts == list(range(len(allocs))), text   # SLURM_RESTART_COUNT 0, 1, ...
    limit_s = TIME_MIN * 60
    for a in allocs[:-1]:            # every allocation but the last: stopped in time, then requeued
        assert a["usr1"] is not None and a["rc"] == 0 and a["requeued"], text
        assert a["exit"] - a["start"] < limit_s, f"stopped {a['exit'] - a['start']:.0f} s after start\n{text}"
    assert allocs[-1]["usr1"] is None or allocs[-1]["rc"] == 0, text
    assert (ckpt / "DONE").exists()
    recs = cluster.jobcomp_records(job)          # one record per allocation; requeued ones read PENDING
    assert recs and recs[-1]["JobState"] == "COMPLETED"
    assert not [r for r in recs if r["JobState"] in ("TIMEOUT", "FAILED", "CANCELLED")], recs

    # the same training, uninterrupted and without the sleeps
    ref = tmp_path / "ref"
    r = subprocess.run([sys.executable, "-m", "preflight.harness.trainloop", "--ckpt-dir", str(ref / "ckpt"),
                        *train_args.split(), "--losses", str(ref / "losses.jsonl"), "--step-sleep", "0"],
                       env={k: v for k, v in os.environ.items() if not k.startswith("SLURM_")},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    got, want = _losses(ckpt / "train.jsonl"), _losses(ref / "losses.jsonl")
    # resumed, not started again: a step is recomputed at most back to the last checkpoint
    rows = [ln for ln in (ckpt / "train.jsonl").read_text().splitlines() if ln.strip() and '"event"' not in ln]
    assert len(rows) <= STEPS + (len(allocs) - 1) * CKPT_EVERY, f"{len(rows)} steps logged for {STEPS}"
    assert sorted(got) == sorted(want) and max(want) == STEPS
    assert got[STEPS] == want[STEPS], f"final loss {got[STEPS]} after requeue, {want[STEPS]} uninterrupted"
    assert got == want

    result = {"round_trip_s": round(round_trip, 1), "bringup_s": round(cluster.bringup_s, 2),
              "allocations": len(allocs), "time_limit_s": limit_s, "signal_s": SIGNAL_S,
              "signal_before_limit_s": [round(limit_s - (a["usr1"] - a["start"]), 1) for a in allocs if a["usr1"]],
              "requeue_gap_s": [round(b["start"] - a["exit"], 1) for a, b in zip(allocs, allocs[1:])],
              "steps": STEPS, "step_sleep_s": STEP_SLEEP, "final_loss_hex": got[STEPS]}
    for folder in (tmp_path, tmp_path_factory.getbasetemp()):
        (folder / "slurm_round_trip.json").write_text(json.dumps(result, indent=1))
    for k in ("round_trip_s", "allocations", "signal_before_limit_s", "requeue_gap_s"):
        record_property(f"slurm_{k}", result[k])
    _report(capsys, f"Slurm walltime requeue round trip: {round_trip:.0f} s, {len(allocs)} allocations, "
                    f"signal {result['signal_before_limit_s']} s before the limit, requeue gaps "
                    f"{result['requeue_gap_s']} s ({tmp_path_factory.getbasetemp() / 'slurm_round_trip.json'})")
