"""Bitwise resume, proven with a real SIGKILL: does the checkpoint hold everything?

1. Run ``preflight.harness.trainloop`` to the end without interruption: the reference loss sequence.
2. Run it again and SIGKILL the process at a random step between two checkpoints (the parent watches
   its log; nothing in the child knows it is coming).
3. Start the same command again: it resumes from the newest valid checkpoint, recomputes the steps
   lost since, and finishes. Every loss must equal the reference **bit for bit** (compared as
   ``float.hex``): same data order, same dropout masks, same augmentation, same optimiser moments,
   same learning rate.
4. Resume the killed run once per left-out part (``rng``, ``data``, ``optimizer``, ``scheduler``):
   how far, and from which step, the loss departs from the reference.

Runnable alone: ``python -m preflight.bench.resume --json``.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from preflight.core.records import Method

METHOD = Method("resume", 1, required=("killed_after_step", "checkpoint_step", "steps_lost", "resume_bitwise", "rows",
                                      "curves"), runs_on="cpu")
TIMEOUT_S = 300


def trainloop_cmd(ckpt_dir: Path, log: Path, steps: int, every: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "preflight.harness.trainloop", "--ckpt-dir", str(ckpt_dir), "--losses", str(log),
            "--steps", str(steps), "--ckpt-every", str(every), *extra]


def _env() -> dict:
    """The training runs are CPU-only: hide any GPU, or each of them would create a CUDA context
    (seconds, and GPU memory) only to save a CUDA RNG state nothing uses."""
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="")


def run_to_end(cmd: list[str]) -> None:
    run_all_to_end([cmd])


def run_all_to_end(cmds: list[list[str]]) -> None:
    """Run ``cmds`` side by side to their end (runs whose time nothing reads: the left-out-part resumes,
    compared bit for bit, which no sharing of the cores can change); RuntimeError naming the first that
    failed, after every one has ended."""
    procs = [subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for cmd in cmds]
    errors = []
    try:
        for cmd, proc in zip(cmds, procs, strict=True):
            _, err = proc.communicate(timeout=TIMEOUT_S)
            if proc.returncode != 0:
                errors.append(f"{' '.join(cmd)} exited with {proc.returncode}:\n{err[-3000:]}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if errors:
        raise RuntimeError(errors[0])


class LogTail:
    """The highest step a growing JSON-lines loss log has reached, reading only the bytes appended
    since the last call (the watcher polls every 2 ms; re-reading the whole log each time would cost
    O(steps) per poll). A line still being written is kept until its newline arrives; a log that
    shrank (replaced by a new run) is read again from the start."""

    def __init__(self, log: Path):
        self.log, self.offset, self.partial, self.last = Path(log), 0, b"", 0

    def step(self) -> int:
        try:
            with open(self.log, "rb") as f:
                if os.fstat(f.fileno()).st_size < self.offset:
                    self.offset, self.partial, self.last = 0, b"", 0
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return self.last
        self.offset += len(chunk)
        *lines, self.partial = (self.partial + chunk).split(b"\n")
        for line in lines:
            if b'"loss"' in line:
                try:
                    self.last = max(self.last, int(json.loads(line).get("step", 0)))
                except ValueError:      # not JSON: a torn line from a killed writer
                    pass
        return self.last


def run_and_kill(cmd: list[str], log: Path, kill_step: int, timeout: float = TIMEOUT_S) -> dict:
    """Start ``cmd``, SIGKILL it once its log shows ``kill_step``; when and where it died."""
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    tail = LogTail(log)
    try:
        while tail.step() < kill_step:
            if proc.poll() is not None:
                raise RuntimeError(f"the run ended before step {kill_step}: {proc.stderr.read()[-2000:]}")
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"step {kill_step} not reached in {timeout:.0f} s")
            time.sleep(0.002)
        proc.send_signal(signal.SIGKILL)
        t_kill = time.time()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return {"killed_after_step": tail.step(), "t_kill": t_kill, "returncode": proc.returncode}


def compare(ref, other, from_step: int = 0):
    """Per step after ``from_step``: the reference loss, the other run's, and |difference|."""
    m = ref[["step", "loss", "loss_hex"]].merge(other[["step", "loss", "loss_hex"]], on="step",
                                                suffixes=("_ref", "_run"))
    m = m[m["step"] > from_step].copy()
    m["abs_diff"] = (m["loss_run"] - m["loss_ref"]).abs()
    m["equal"] = m["loss_hex_run"] == m["loss_hex_ref"]
    return m


def measure_resume(workdir: str | os.PathLike | None = None, steps: int = 200, every: int = 20,
                   step_sleep: float = 0.01, seed: int = 0, quick: bool = False) -> dict:
    """Reference run, killed run, full resume and one resume per left-out part; JSON-ready."""
    from preflight.harness.trainloop import PARTS, read_log

    if quick:
        steps, every = 80, 10
    own = workdir is None
    work = Path(workdir or tempfile.mkdtemp(prefix="preflight-resume-"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        t0 = time.perf_counter()
        run_to_end(trainloop_cmd(work / "ref", work / "ref.jsonl", steps, every))
        ref, _ = read_log(work / "ref.jsonl")
        reference_s = time.perf_counter() - t0

        # kill somewhere strictly between two checkpoints, in the middle half of the run
        rng = random.Random(seed)
        candidates = [s for s in range(steps // 4, 3 * steps // 4) if s % every not in (0, every - 1)]
        kill_step = rng.choice(candidates)
        killed = work / "killed"
        kill = run_and_kill(trainloop_cmd(killed, work / "run.jsonl", steps, every, "--step-sleep", str(step_sleep)),
                            work / "run.jsonl", kill_step)
        latest = (killed / "latest").read_text().strip()
        ckpt_step = int(latest.split("-")[1])
        for part in PARTS:                     # the same checkpoint, for the broken resumes
            shutil.copytree(killed, work / f"omit-{part}")

        t1 = time.perf_counter()
        run_to_end(trainloop_cmd(killed, work / "run.jsonl", steps, every))
        resume_s = time.perf_counter() - t1
        full, _ = read_log(work / "run.jsonl")
        cmp_full = compare(ref, full)
        rows = [{"variant": "full state", "steps_compared": len(cmp_full),
                 "bitwise_equal": bool(cmp_full["equal"].all()) and len(cmp_full) == steps,
                 "first_divergent_step": _first_divergent(cmp_full), "max_abs_diff": float(cmp_full["abs_diff"].max()),
                 "final_loss": float(full["loss"].iloc[-1])}]
        curves = []
        # the left-out-part resumes are compared bit for bit, not timed: side by side
        run_all_to_end([trainloop_cmd(work / f"omit-{part}", work / f"omit-{part}.jsonl", steps, every, "--omit", part)
                        for part in PARTS])
        for part in PARTS:
            other, _ = read_log(work / f"omit-{part}.jsonl")
            c = compare(ref, other, from_step=ckpt_step)
            rows.append({"variant": f"without {part}", "steps_compared": len(c), "bitwise_equal": bool(c["equal"].all()),
                         "first_divergent_step": _first_divergent(c), "max_abs_diff": float(c["abs_diff"].max()),
                         "final_loss": float(other["loss"].iloc[-1])})
            curves += [{"variant": f"without {part}", "step": int(r.step), "abs_diff": float(r.abs_diff)}
                       for r in c.itertuples()]
        return {
            "config": {"steps": steps, "ckpt_every": every, "step_sleep_s": step_sleep, "seed": seed,
                       "model": "MLP 32-128-128-1, dropout 0.1, AdamW, warm-up + cosine LR, shuffled batches of 32"},
            "kill_step": kill_step, "killed_after_step": kill["killed_after_step"], "checkpoint_step": ckpt_step,
            "steps_lost": kill["killed_after_step"] - ckpt_step,
            "resume_bitwise": rows[0]["bitwise_equal"],
            "reference_final_loss": float(ref["loss"].iloc[-1]),
            "reference_s": round(reference_s, 2), "resume_s": round(resume_s, 2),
            "rows": rows, "curves": curves,
        }
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)


def _first_divergent(c) -> int | None:
    bad = c[~c["equal"]]
    return int(bad["step"].iloc[0]) if len(bad) else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m preflight.bench.resume", description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", default=None, help="where the runs write (default: a temporary folder, removed)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seed", type=int, default=0, help="chooses the kill step")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument("--out", help="results folder for the versioned record (resume.json)")
    a = ap.parse_args(argv)
    res = measure_resume(a.workdir, seed=a.seed, quick=a.quick)
    if a.out:
        from preflight.core.records import save_record

        path = save_record(METHOD.record({"quick": a.quick, "seed": a.seed}, res), a.out)
        print(f"record -> {path}", file=sys.stderr if a.json else sys.stdout)
    if a.json:
        print(json.dumps({k: v for k, v in res.items() if k != "curves"}, indent=1))
    else:
        for r in res["rows"]:
            print(f"{r['variant']:<20} bitwise {r['bitwise_equal']!s:<5} first divergent step "
                  f"{r['first_divergent_step']}  max |diff| {r['max_abs_diff']:.3g}")
    return 0 if res["resume_bitwise"] else 1


if __name__ == "__main__":
    sys.exit(main())
