"""Chapter 5 on your own model: killed with SIGKILL, resumed, compared bit for bit.

Preflight's loop trains the workload (``preflight.core.workload``: its model, its optimizer, its batches)
in a child process and checkpoints, every ``every`` steps (``preflight.toolkit.ckpt``: fsync, manifest,
atomic rename), everything Preflight can see of its state:

- the step, ``model.state_dict()`` (parameters and persistent buffers, e.g. batch-norm statistics),
  ``optimizer.state_dict()``, the training generators (Python, NumPy, torch: dropout);
- the **position in the batch stream**. ``batch()`` always runs under generators of its own,
  swapped in around each call, so the stream does not depend on what the model draws in between.
  A resume rebuilds the workload and *replays* the stream to the saved position (``batch()`` called
  that many times): the one way that works whatever state ``batch()`` keeps (a generator in a
  closure, an iterator, a counter), at the cost of the replay's time.

The protocol is ``preflight.bench.resume``'s: an uninterrupted run, a run killed at a random step
between two checkpoints (the parent watches its log), the same command again, every step's loss
compared as ``float.hex`` and every batch by a fingerprint. When the resume is not bitwise: the
first step that differs and **which state was missing**, from what the child probed at start:
batches that differ after the replay (``batch()`` depends on state outside its generators); a forward
that is not a function of the weights, the batch and the global generators (an unseeded random op:
a ``torch.Generator`` of its own, a counter kept between calls); buffers left out of
``state_dict()`` (``persistent=False``); else state outside all three.

``measure_stall``: the checkpoint stall (``preflight.bench.ckptstall``) of the workload's own model
and optimizer, at their real state size. The runs are on the CPU, as the reference's (what is
tested is the machinery; GPU kernels add their own non-determinism).

    python -m preflight.bench.workload_resume --entry my_workload.py:build --base DIR --ckpt-dir CK \\
        --losses L.jsonl --steps 40 --ckpt-every 10          # one training run (what the parent starts)
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from preflight.core.records import Method

METHOD = Method("workload_resume", 1, required=("workload", "killed_after_step", "checkpoint_step", "steps_lost",
                                                "resume_bitwise", "first_divergent_step", "missing_state", "rows"), runs_on="cpu")
STALL = Method("workload_ckptstall", 1, required=("workload", "rows", "config"), runs_on="cpu")
PARTS = ("rng", "optimizer", "data")          # what a broken resume may leave out (full mode)


class Trainer:
    """The workload's training loop as the checkpoint benches drive it: ``step()`` (seconds),
    ``state()`` / ``load()``, and a batch stream under its own generators."""

    def __init__(self, entry: str, base: str | os.PathLike, seed: int = 0):
        import torch

        from preflight.core.workload import load, seed_all
        from preflight.harness.trainloop import rng_state

        self.wl = load(entry, base, seed=seed)            # seeded: the same initial weights every run
        self.model, self.opt, self.step_no = self.wl.model.cpu().train(), self.wl.make_optimizer(), 0
        self.data_rng = rng_state()                      # the stream's generators start here
        seed_all(seed + 1)                               # the training generators (dropout) start here
        self._torch = torch

    def next_batch(self):
        from preflight.harness.trainloop import rng_state, set_rng_state

        training = rng_state()
        set_rng_state(self.data_rng)
        try:
            return self.wl.batch()
        finally:
            self.data_rng = rng_state()
            set_rng_state(training)

    def train_step(self):
        """One step; (loss, fingerprint of the batch)."""
        inputs, targets = self.next_batch()
        loss = self.wl.step_loss(inputs, targets)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.step_no += 1
        return float(loss.detach()), fingerprint(inputs, targets)

    def step(self) -> float:                             # ckptstall's interface
        t0 = time.perf_counter()
        self.train_step()
        return time.perf_counter() - t0

    def state(self) -> dict:
        from preflight.harness.trainloop import rng_state

        return {"step": self.step_no, "model": self.model.state_dict(), "optim": self.opt.state_dict(),
                "rng": rng_state(), "data": {"position": self.step_no}}

    def load(self, state: dict, omit=frozenset()) -> None:
        from preflight.harness.trainloop import set_rng_state

        self.step_no = state["step"]
        self.model.load_state_dict(state["model"])
        if "optimizer" not in omit:
            self.opt.load_state_dict(state["optim"])
        if "data" not in omit:                           # replay the stream to the saved position
            for _ in range(state["data"]["position"]):
                self.next_batch()
        if "rng" not in omit:
            set_rng_state(state["rng"])


def fingerprint(*tensors) -> str:
    """A short hash of a batch's bytes (inputs and targets, tuples included)."""
    import torch

    h = hashlib.sha1()
    for t in tensors:
        for x in (t if isinstance(t, (tuple, list)) else [t]):
            h.update(x.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def probe(tr: Trainer) -> dict:
    """What a checkpoint cannot hold: buffers outside ``state_dict()``, and whether the forward is a
    function of (weights, batch, global generators): two forwards from the same generator state must
    agree bit for bit. The model's state_dict and every generator are put back afterwards."""
    import torch

    from preflight.harness.trainloop import rng_state, set_rng_state

    keys = set(tr.model.state_dict())
    hidden = [n for n, _ in tr.model.named_buffers() if n not in keys]
    saved_data, saved, weights = tr.data_rng, rng_state(), copy.deepcopy(tr.model.state_dict())
    inputs, targets = tr.next_batch()
    tr.data_rng = saved_data                             # the probe does not move the stream
    outs = []
    try:
        for _ in range(2):
            set_rng_state(saved)
            with torch.no_grad():
                outs.append(tr.wl.step_loss(inputs, targets).detach())
        reproducible = bool(torch.equal(outs[0], outs[1]))
    finally:
        tr.model.load_state_dict(weights)               # e.g. batch-norm statistics the probe moved
        set_rng_state(saved)
    return {"forward_reproducible": reproducible, "non_persistent_buffers": hidden}


def _log(path: Path, row: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def run(args) -> int:
    """One training run (the child): resume from the newest checkpoint, train, checkpoint, log."""
    import torch

    from preflight.toolkit import ckpt

    torch.set_num_threads(1)
    omit = frozenset(p for p in (args.omit or "").split(",") if p)
    tr = Trainer(args.entry, args.base)
    ckdir, log = Path(args.ckpt_dir), Path(args.losses)
    found = ckpt.load_latest(ckdir)
    if found:
        tr.load(found[1], omit)
    _log(log, {"event": "start", "resumed_from": found[0] if found else 0, "omit": sorted(omit), **probe(tr)})
    while tr.step_no < args.steps:
        loss, fp = tr.train_step()
        _log(log, {"step": tr.step_no, "loss": loss, "loss_hex": loss.hex(), "batch": fp})
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if tr.step_no % args.ckpt_every == 0 or tr.step_no == args.steps:
            ckpt.save(tr.state(), ckdir, tr.step_no, keep=2)
    return 0


def _cmd(entry, base, ckpt_dir, log, steps, every, *extra) -> list[str]:
    return [sys.executable, "-m", "preflight.bench.workload_resume", "--entry", entry, "--base", str(base),
            "--ckpt-dir", str(ckpt_dir), "--losses", str(log), "--steps", str(steps), "--ckpt-every", str(every),
            *extra]


def _events(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip() and '"event"' in ln]


def missing_state(ref, run, start: dict) -> str | None:
    """Which state a resume that is not bitwise was missing, from the batches and the child's probe."""
    m = ref[["step", "batch"]].merge(run[["step", "batch"]], on="step", suffixes=("_ref", "_run"))
    bad = m[m["batch_ref"] != m["batch_run"]]
    if len(bad):
        return (f"the batch stream: replayed to the checkpoint, batch() gave other batches from step "
                f"{int(bad['step'].iloc[0])} (it depends on state outside the Python / NumPy / torch generators)")
    if start.get("forward_reproducible") is False:
        return ("state inside the model that no checkpoint holds: its forward is not a function of its weights, its "
                "batch and the global generators (an unseeded random op: a torch.Generator of its own, or a "
                "counter kept between calls)")
    if start.get("non_persistent_buffers"):
        return "buffers left out of state_dict() (persistent=False): " + ", ".join(start["non_persistent_buffers"])
    return ("state outside model.state_dict(), optimizer.state_dict(), the Python / NumPy / torch generators and "
            "the batch stream")


def measure_resume(wl, workdir: str | os.PathLike | None = None, quick: bool = False, seed: int = 0,
                   step_sleep: float = 0.01) -> dict:
    """Reference run, killed run, full resume (and, unless ``quick``, one resume per left-out part) of
    the workload ``wl`` (a ``preflight.core.workload.Workload``: its entry is loaded again in each child)."""
    from preflight.bench import resume as R
    from preflight.harness.trainloop import read_log

    entry, base = wl.entry, wl.base_dir
    steps, every = (30, 10) if quick else (60, 10)
    own = workdir is None
    work = Path(workdir or tempfile.mkdtemp(prefix="preflight-wlresume-"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        R.run_to_end(_cmd(entry, base, work / "ref", work / "ref.jsonl", steps, every))
        ref, _ = read_log(work / "ref.jsonl")
        rng = random.Random(seed)
        kill_step = rng.choice([s for s in range(steps // 4, 3 * steps // 4) if s % every not in (0, every - 1)])
        killed, log = work / "killed", work / "run.jsonl"
        kill = R.run_and_kill(_cmd(entry, base, killed, log, steps, every, "--step-sleep", str(step_sleep)),
                              log, kill_step)
        ckpt_step = int((killed / "latest").read_text().strip().split("-")[1])
        for part in () if quick else PARTS:
            shutil.copytree(killed, work / f"omit-{part}")
        t0 = time.perf_counter()
        R.run_to_end(_cmd(entry, base, killed, log, steps, every))
        resume_s = time.perf_counter() - t0
        full, _ = read_log(log)
        start = _events(log)[-1]
        c = R.compare(ref, full)
        bitwise = bool(c["equal"].all()) and len(c) == steps
        rows = [{"variant": "full state", "steps_compared": len(c), "bitwise_equal": bitwise,
                 "first_divergent_step": R._first_divergent(c), "max_abs_diff": float(c["abs_diff"].max())}]
        for part in () if quick else PARTS:
            plog = work / f"omit-{part}.jsonl"
            R.run_to_end(_cmd(entry, base, work / f"omit-{part}", plog, steps, every, "--omit", part))
            other, _ = read_log(plog)
            cp = R.compare(ref, other, from_step=ckpt_step)
            rows.append({"variant": f"without {part}", "steps_compared": len(cp),
                         "bitwise_equal": bool(cp["equal"].all()), "first_divergent_step": R._first_divergent(cp),
                         "max_abs_diff": float(cp["abs_diff"].max())})
        return {"workload": wl.describe(), "config": {"steps": steps, "ckpt_every": every,
                                                              "step_sleep_s": step_sleep, "seed": seed},
                "kill_step": kill_step, "killed_after_step": kill["killed_after_step"], "checkpoint_step": ckpt_step,
                "steps_lost": kill["killed_after_step"] - ckpt_step, "resume_bitwise": bitwise,
                "first_divergent_step": rows[0]["first_divergent_step"],
                "missing_state": None if bitwise else missing_state(ref, full, start),
                "probe": {k: start.get(k) for k in ("forward_reproducible", "non_persistent_buffers")},
                "resume_s": round(resume_s, 2), "rows": rows}
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)


def measure_stall(wl, workdir=None, shared_dir=None, quick: bool = False) -> dict:
    """The checkpoint stall of the workload's own model and optimizer (``ckptstall``), real state size
    (built again from its entry: a fresh model, not the one other measurements trained)."""
    from preflight.bench import ckptstall

    tr = Trainer(wl.entry, wl.base_dir)
    tr.step()                                        # the optimizer allocates its state on the first step
    res = ckptstall.measure_stall(workdir, shared_dir=shared_dir, quick=quick, trainer=tr)
    res["config"].update(size_mb_requested=None, din=None, batch=None)
    return {**res, "workload": tr.wl.describe()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m preflight.bench.workload_resume", description=__doc__.split("\n")[0])
    ap.add_argument("--entry", required=True)
    ap.add_argument("--base", default=".", help="folder a file entry is relative to (the profile's)")
    ap.add_argument("--ckpt-dir", required=True)
    ap.add_argument("--losses", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--ckpt-every", type=int, default=10)
    ap.add_argument("--step-sleep", type=float, default=0.0)
    ap.add_argument("--omit", default="", help=f"comma-separated parts not restored: {','.join(PARTS)}")
    with contextlib.suppress(BrokenPipeError):
        return run(ap.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
