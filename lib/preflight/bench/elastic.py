"""Elastic restart under torchrun: a worker dies, the job comes back by itself and resumes.

``torchrun --max-restarts=K --rdzv-backend=c10d`` (torch.distributed.elastic) watches its workers;
when one exits abnormally (here: SIGKILL, as when the kernel's OOM killer or a hardware fault takes
a process) the agent stops the surviving workers, runs a new rendezvous, and starts them all again
with ``TORCHELASTIC_RESTART_COUNT`` one higher. The training script does the rest: it loads the
newest valid checkpoint and goes on. Measured here, with two DDP processes on gloo:

- **recovery time**: from the kill to the first training step completed after the restart
  (failure detection, teardown, rendezvous, process start with ``import torch``, checkpoint load);
- **steps lost**: the steps done since the last checkpoint, computed again;
- the final loss against an uninterrupted run of the same command (bitwise).

Known trap (field notes, a PyTorch issue): by default the restarted workers reuse the rendezvous
store's TCP server and gloo may try the dead worker's old port; ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``
makes every restart clean. On a cluster the same command runs under ``srun`` on every node with the
rendezvous endpoint on the first node (see ``preflight/slurm/walltime_requeue.sbatch``).

Runnable alone: ``python -m preflight.bench.elastic --json``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from preflight.bench.launch import free_port, run_torchrun
from preflight.bench.trainloop import read_log
from preflight.records import Method

METHOD = Method("elastic", 1, required=("restarts", "killed_after_step", "resumed_from", "steps_lost", "recovery_s",
                                        "time_to_regain_s", "final_loss_equal", "wall_s"))
TIMEOUT_S = 300


def torchrun_cmd(ckpt_dir: Path, log: Path, steps: int, every: int, nproc: int, max_restarts: int,
                 *extra: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={nproc}",
            f"--max-restarts={max_restarts}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}",
            "--rdzv-id=preflight-elastic", "--monitor-interval=0.5",
            "-m", "preflight.bench.trainloop", "--ckpt-dir", str(ckpt_dir), "--losses", str(log),
            "--steps", str(steps), "--ckpt-every", str(every), *extra]


def _run(cmd: list[str], timeout: float = TIMEOUT_S) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", PYTHONUNBUFFERED="1",
               CUDA_VISIBLE_DEVICES="")      # CPU ranks (gloo): no CUDA start-up inside the recovery time
    return run_torchrun(cmd, env, timeout)


def measure_elastic(workdir: str | os.PathLike | None = None, steps: int = 120, every: int = 20,
                    kill_step: int = 55, step_sleep: float = 0.05, nproc: int = 2, quick: bool = False) -> dict:
    """An uninterrupted torchrun run and one whose rank 1 is SIGKILLed after ``kill_step``."""
    if quick:
        steps, every, kill_step = 60, 10, 25
    own = workdir is None
    work = Path(workdir or tempfile.mkdtemp(prefix="preflight-elastic-"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        _run(torchrun_cmd(work / "ref", work / "ref.jsonl", steps, every, nproc, 0))
        ref, _ = read_log(work / "ref.jsonl")
        t0 = time.perf_counter()
        out = _run(torchrun_cmd(work / "run", work / "run.jsonl", steps, every, nproc, 2,
                                "--kill-at-step", str(kill_step), "--kill-rank", "1", "--step-sleep", str(step_sleep)))
        wall = time.perf_counter() - t0
        steps_df, events = read_log(work / "run.jsonl")
        kill = events[events["event"] == "kill"].iloc[0]
        restarts = events[events["event"] == "start"]
        after = steps_df[steps_df["restart"] > 0]
        first_after = after.iloc[0]
        resumed_from = int(first_after["resumed_from"])
        regained = after[after["step"] >= int(kill["step"])].iloc[0]
        step_s = float(ref["t"].diff().median()) if len(ref) > 2 else None
        final_equal = ref["loss_hex"].iloc[-1] == steps_df["loss_hex"].iloc[-1]
        return {
            "config": {"steps": steps, "ckpt_every": every, "nproc": nproc, "step_sleep_s": step_sleep,
                       "kill_step": kill_step, "max_restarts": 2, "rdzv": "c10d on 127.0.0.1",
                       "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"},
            "restarts": int(restarts["restart"].max()),
            "killed_after_step": int(kill["step"]), "resumed_from": resumed_from,
            "steps_lost": int(kill["step"]) - resumed_from,
            "recovery_s": round(float(first_after["t"]) - float(kill["t"]), 3),
            "time_to_regain_s": round(float(regained["t"]) - float(kill["t"]), 3),
            "final_loss_equal": bool(final_equal),
            "final_loss": float(steps_df["loss"].iloc[-1]), "reference_final_loss": float(ref["loss"].iloc[-1]),
            "reference_step_s": step_s, "wall_s": round(wall, 2),
            "agent_log_tail": "\n".join(out.splitlines()[-8:]),
        }
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m preflight.bench.elastic", description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", default=None, help="where the runs write (default: a temporary folder, removed)")
    ap.add_argument("--quick", action="store_true", help="fewer steps: a smoke test")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument("--out", help="results folder for the versioned record (elastic.json)")
    a = ap.parse_args(argv)
    res = measure_elastic(a.workdir, quick=a.quick)
    if a.out:
        from preflight.records import save_record

        path = save_record(METHOD.record({"quick": a.quick}, res), a.out)
        print(f"record -> {path}", file=sys.stderr if a.json else sys.stdout)
    if a.json:
        print(json.dumps(res, indent=1))
    else:
        print(f"killed after step {res['killed_after_step']}, resumed from {res['resumed_from']} "
              f"({res['steps_lost']} steps lost), training again after {res['recovery_s']:.1f} s; "
              f"final loss bitwise equal: {res['final_loss_equal']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
