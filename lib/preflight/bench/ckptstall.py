"""How long training waits for a checkpoint: synchronous vs asynchronous saves, measured.

A checkpoint costs a training run twice. The *stall* is the time the training loop stops to save;
it is paid at every checkpoint and is the ``C`` of Young's interval ``sqrt(2 C MTBF)``: a shorter
stall allows more frequent checkpoints, and so less work lost at a failure. The *durable time* is how
long until the checkpoint would survive a crash (on disk, ``fsync``-ed, published as ``latest``):
a failure before that falls back to the previous one.

This module trains a small MLP whose model + AdamW state is ``S`` MB (quick: ~20 MB, full: ~200 MB)
and checkpoints it four ways, to real folders:

- ``sync ckpt.save``: ``preflight.ckpt.save`` straight to the *shared* folder, in the training
  thread: ``torch.save``, ``fsync``, sha256 manifest, atomic ``rename``, publish ``latest``. Training
  waits for all of it: stall = durable time.
- ``async two-stage``: ``TwoStageCheckpointer(local, shared).save``: training waits only for the
  snapshot (every tensor copied to host memory) plus any previous save still in flight; a background
  thread then writes the snapshot durably to the *local* folder and copies it to the shared one,
  publishing ``latest`` there last.
- ``DCP save`` / ``DCP async_save``: ``torch.distributed.checkpoint`` to the shared folder, the
  format of sharded (FSDP) training. ``async_save`` (thread mode, the default) stages the state to
  CPU memory in the call and writes in a thread. On one process no process group is needed
  (``no_dist=True``; DCP assumes a single process when none is initialised). DCP fsyncs its files
  but writes no checksums: its ``.metadata`` file, written last, marks a complete checkpoint.

Protocol: warm-up steps, then rounds; each round times a few plain training steps (the baseline
step) and then one checkpoint of every method in turn (interleaved, so a drifting background load
hits all alike). After an asynchronous save the loop keeps training until the background write is
done; those steps are timed too. The first round is a warm-up and is discarded; figures are medians
over the remaining ``repeats`` rounds.

The hidden cost, reported honestly: an asynchronous save moves the write out of the training
thread, not off the machine. The background thread pickles, hashes, writes and copies while
training runs, and competes for the same cores, memory bandwidth and disk: on a 2-core CPU the steps
that run while a save is in flight are visibly slower (``inflight_slowdown``), and
``hidden_cost_s`` (the sum of their extra time over the baseline step, per checkpoint) is training
time lost anyway, only spread out. On a GPU node the training runs on the accelerator and the host
cores are mostly idle, so that cost is far smaller; the stall (snapshot = device-to-host copy) is
what remains. Here the "local" and "shared" folders are usually on the same disk
(``config["same_filesystem"]``): the two-stage copy then doubles the I/O instead of moving it to
faster storage, and ``durable_s`` of the two-stage save is longer than the synchronous one.

    measure_stall(workdir, shared_dir=..., quick=True)     # JSON-ready dict
    python -m preflight.bench.ckptstall --json [--quick] [--size-mb S] [--workdir D] [--shared-dir D]
    python -m preflight.bench.ckptstall --out DIR            # a versioned record (method "ckptstall")
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

METHOD, METHOD_VERSION = "ckptstall", 1
METHODS = ("sync ckpt.save", "async two-stage", "DCP save", "DCP async_save")
DESCRIPTIONS = {
    "sync ckpt.save": "torch.save + fsync + manifest + rename + publish to shared, in the training thread",
    "async two-stage": "snapshot to host memory; background: local durable write, copy to shared, publish",
    "DCP save": "torch.distributed.checkpoint.save to shared, in the training thread",
    "DCP async_save": "torch.distributed.checkpoint.async_save (thread): stage to CPU, write in a thread",
}
ASYNC = {"async two-stage": "sync ckpt.save", "DCP async_save": "DCP save"}     # async -> its sync pair
QUICK_MB, FULL_MB = 20.0, 200.0
DIN, BATCH = 512, 64
BASELINE_STEPS = 5           # plain training steps timed per round
MAX_INFLIGHT_S = 60.0        # keep training at most this long while a background save runs


def mlp_for(size_mb: float, din: int = DIN):
    """A ``din -> hidden -> din`` MLP whose parameters plus AdamW's two moments take ``size_mb`` MB
    (fp32: 12 bytes per parameter); returns ``(model, optimizer, hidden)``."""
    import torch
    from torch import nn

    params = size_mb * 1e6 / 12
    hidden = max(8, round((params - din) / (2 * din + 1)))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(din, hidden), nn.GELU(), nn.Linear(hidden, din))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4), hidden


def state_bytes(state) -> int:
    """Bytes of every tensor in a nested state."""
    import torch

    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_bytes(v) for v in state)
    return 0


def _folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _median(xs):
    return statistics.median(xs) if xs else None


class _Trainer:
    """The training loop being checkpointed: fixed data, one AdamW step per call."""

    def __init__(self, size_mb: float):
        import torch

        self.model, self.opt, self.hidden = mlp_for(size_mb)
        gen = torch.Generator().manual_seed(1)
        self.x = torch.randn(BATCH, DIN, generator=gen)
        self.y = torch.randn(BATCH, DIN, generator=gen)
        self.step_no = 0
        self.step()                      # AdamW allocates its moments on the first step

    def step(self) -> float:
        import torch

        t0 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(self.model(self.x), self.y).backward()
        self.opt.step()
        self.step_no += 1
        return time.perf_counter() - t0

    def state(self) -> dict:
        return {"model": self.model.state_dict(), "optim": self.opt.state_dict(), "step": self.step_no}


class _Methods:
    """Start one checkpoint of a method: ``start(name, t0)`` returns ``(done, finish)``: ``done()`` is
    True once the checkpoint is durable, ``finish()`` waits for it (re-raising a failure) and returns
    the seconds from ``t0`` (the call) to durable."""

    def __init__(self, trainer: _Trainer, local: Path, shared: Path):
        from preflight import ckpt

        self.trainer, self.local, self.shared = trainer, local, shared
        self.two_stage = ckpt.TwoStageCheckpointer(local / "two_stage", shared / "two_stage", keep=2)
        self.file_bytes: dict[str, int] = {}

    def start(self, name: str, t0: float):
        import torch.distributed.checkpoint as dcp

        from preflight import ckpt

        state, step = self.trainer.state(), self.trainer.step_no
        if name == "sync ckpt.save":
            folder = ckpt.save(state, self.shared / "sync", step, keep=2)
            durable = time.perf_counter() - t0
            self.file_bytes[name] = _folder_bytes(folder)
            return (lambda: True), (lambda: durable)
        if name == "async two-stage":
            cp = self.two_stage
            cp.save(state, step)
            returned = time.perf_counter() - t0

            def finish():
                cp.wait()
                self.file_bytes[name] = _folder_bytes(self.shared / "two_stage" / ckpt.step_name(step))
                # last_durable_s runs from the start of the background write (after the snapshot)
                return returned + cp.last_durable_s
            # the checkpointer has no public "in flight" flag: its background thread is it
            return (lambda: not cp.in_flight), finish
        target = self.shared / name.replace(" ", "_").replace(".", "_") / f"step-{step:08d}"
        if name == "DCP save":
            dcp.save(state, checkpoint_id=target, no_dist=True)
            durable = time.perf_counter() - t0

            def finish_sync():
                self._dcp_done(name, target)          # bookkeeping, not timed
                return durable

            return (lambda: True), finish_sync
        fut = dcp.async_save(state, checkpoint_id=target, no_dist=True)
        done_at: list[float] = []
        fut.add_done_callback(lambda _f: done_at.append(time.perf_counter()))

        def finish():
            fut.result()
            self._dcp_done(name, target)
            return (done_at[0] if done_at else time.perf_counter()) - t0

        return fut.done, finish

    def _dcp_done(self, name: str, target: Path) -> None:
        """Record the size on disk and remove the older DCP checkpoints (outside the timed part;
        ``ckpt.save`` prunes inside it, as a training loop calling it would)."""
        self.file_bytes[name] = _folder_bytes(target)
        for old in target.parent.iterdir():
            if old != target:
                shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def _quiet_dcp():
    """DCP warns on every call without a process group that it assumes a single process: we know."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        yield


def _one_checkpoint(methods: _Methods, name: str, trainer: _Trainer) -> dict:
    t0 = time.perf_counter()
    done, finish = methods.start(name, t0)
    stall = time.perf_counter() - t0
    inflight: list[float] = []
    while not done() and time.perf_counter() - t0 < MAX_INFLIGHT_S:
        inflight.append(trainer.step())
    t1 = time.perf_counter()
    durable = finish()
    return {"stall_s": stall, "durable_s": durable, "inflight": inflight, "drain_s": time.perf_counter() - t1}


def measure_stall(workdir: str | os.PathLike | None = None, *, shared_dir: str | os.PathLike | None = None,
                  quick: bool = False, size_mb: float | None = None, repeats: int | None = None,
                  methods: tuple[str, ...] = METHODS) -> dict:
    """Stall and durable time of each checkpoint method for an ``size_mb`` MB training state.

    ``workdir``: the fast local folder (default: a temporary folder); ``shared_dir``: the shared file
    system (default ``workdir/shared``). Each run writes into fresh subfolders of both and removes
    them afterwards. Returns a JSON-ready dict:

    - ``rows``: per method ``method``, ``description``, ``stall_s`` (median seconds training waited),
      ``stall_steps`` (the same in baseline steps), ``durable_s`` (call -> durable and published),
      ``inflight_steps`` (training steps run while it was in flight), ``inflight_step_s``,
      ``inflight_slowdown`` (in-flight step / baseline step), ``hidden_cost_s`` (their extra time
      over the baseline, per checkpoint), ``state_MB`` (tensor bytes), ``file_MB`` (on disk),
      ``stall_p10_s`` / ``stall_p90_s``;
    - ``baseline_step_s``: the median training step without checkpointing;
    - ``async_stall_ratio``: two-stage stall / sync stall; ``dcp_async_stall_ratio``: DCP async /
      DCP sync (None if a method was left out);
    - ``timings``: every repeat's stall and durable time per method; ``config``; ``notes``.
    """
    size_mb = float(size_mb or (QUICK_MB if quick else FULL_MB))
    repeats = int(repeats or (3 if quick else 5))
    own_tmp = workdir is None
    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="preflight-ckptstall-"))
    base.mkdir(parents=True, exist_ok=True)
    shared_base = Path(shared_dir) if shared_dir else base / "shared"
    shared_base.mkdir(parents=True, exist_ok=True)
    local = Path(tempfile.mkdtemp(prefix="ckptstall-local-", dir=base))
    shared = Path(tempfile.mkdtemp(prefix="ckptstall-shared-", dir=shared_base))
    try:
        with _quiet_dcp():
            return _measure(size_mb, repeats, quick, methods, base, shared_base, local, shared)
    finally:
        shutil.rmtree(local, ignore_errors=True)
        shutil.rmtree(shared, ignore_errors=True)
        if own_tmp:
            shutil.rmtree(base, ignore_errors=True)


def _measure(size_mb, repeats, quick, methods, base, shared_base, local, shared) -> dict:
    import torch

    trainer = _Trainer(size_mb)
    runner = _Methods(trainer, local, shared)
    state_mb = state_bytes(trainer.state()) / 1e6
    for _ in range(3):
        trainer.step()
    baseline: list[float] = []
    per: dict[str, list[dict]] = {m: [] for m in methods}
    for rnd in range(repeats + 1):                 # round 0: warm-up, discarded
        steps = [trainer.step() for _ in range(BASELINE_STEPS)]
        results = {m: _one_checkpoint(runner, m, trainer) for m in methods}
        if rnd:
            baseline += steps
            for m, r in results.items():
                per[m].append(r)
    base_step = statistics.median(baseline)
    rows = [_row(m, per[m], base_step, state_mb, runner.file_bytes.get(m)) for m in methods]
    by = {r["method"]: r for r in rows}

    def ratio(a, b):
        return by[a]["stall_s"] / by[b]["stall_s"] if a in by and b in by and by[b]["stall_s"] else None

    same_fs = os.stat(local).st_dev == os.stat(shared).st_dev
    notes = [f"{torch.get_num_threads()} training threads on {os.cpu_count()} cores: the background write "
             "competes with them (inflight_slowdown, hidden_cost_s)"]
    for a, s in ASYNC.items():
        if a in by and s in by and by[a]["hidden_cost_s"] > by[s]["stall_s"] - by[a]["stall_s"]:
            notes.append(f"{a}: the in-flight steps lost {by[a]['hidden_cost_s'] * 1e3:.1f} ms per checkpoint, "
                         f"more than the {(by[s]['stall_s'] - by[a]['stall_s']) * 1e3:.1f} ms of stall it saved "
                         f"over {s}: on this machine the background write costs more training time than it "
                         "hides (total_cost_s)")
    if same_fs:
        notes.append("local and shared folders are on the same file system: the two-stage copy doubles "
                     "the I/O instead of moving it to faster storage, so its durable_s exceeds the "
                     "synchronous save's")
    return {
        "rows": rows,
        "baseline_step_s": base_step,
        "async_stall_ratio": ratio("async two-stage", "sync ckpt.save"),
        "dcp_async_stall_ratio": ratio("DCP async_save", "DCP save"),
        "timings": {m: {"stall_s": [r["stall_s"] for r in per[m]],
                        "durable_s": [r["durable_s"] for r in per[m]]} for m in methods},
        "config": {"size_mb_requested": size_mb, "state_MB": round(state_mb, 3), "din": DIN,
                   "hidden": trainer.hidden, "batch": BATCH,
                   "params": sum(p.numel() for p in trainer.model.parameters()),
                   "repeats": repeats, "warmup_rounds": 1, "baseline_steps_per_round": BASELINE_STEPS,
                   "threads": torch.get_num_threads(), "quick": quick, "local_dir": str(base),
                   "shared_dir": str(shared_base), "same_filesystem": same_fs,
                   "dcp_process_group": False, "torch": torch.__version__},
        "notes": notes,
    }


def _row(method: str, runs: list[dict], base_step: float, state_mb: float, file_bytes: int | None) -> dict:
    stalls = sorted(r["stall_s"] for r in runs)
    inflight = [s for r in runs for s in r["inflight"]]
    inflight_step = _median(inflight)

    def pct(q):
        return stalls[min(len(stalls) - 1, max(0, math.ceil(q * len(stalls)) - 1))]

    return {
        "method": method,
        "description": DESCRIPTIONS.get(method, ""),
        "stall_s": statistics.median(stalls),
        "stall_p10_s": pct(0.1),
        "stall_p90_s": pct(0.9),
        "stall_steps": statistics.median(stalls) / base_step,
        "durable_s": statistics.median(r["durable_s"] for r in runs),
        "inflight_steps": statistics.median(len(r["inflight"]) for r in runs),
        "inflight_step_s": inflight_step,
        "inflight_slowdown": inflight_step / base_step if inflight_step else None,
        "hidden_cost_s": statistics.median(sum(s - base_step for s in r["inflight"]) for r in runs),
        "total_cost_s": statistics.median(r["stall_s"] + sum(s - base_step for s in r["inflight"]) for r in runs),
        "drain_s": statistics.median(r["drain_s"] for r in runs),
        "state_MB": round(state_mb, 3),
        "file_MB": round(file_bytes / 1e6, 3) if file_bytes else None,
    }


def summary(res: dict) -> str:
    lines = [f"checkpoint stall, {res['config']['state_MB']:.0f} MB state, baseline step "
             f"{res['baseline_step_s'] * 1e3:.1f} ms:"]
    for r in res["rows"]:
        slow = f", in-flight steps x{r['inflight_slowdown']:.2f}" if r["inflight_slowdown"] else ""
        lines.append(f"  {r['method']:<16} stall {r['stall_s'] * 1e3:8.1f} ms  durable {r['durable_s'] * 1e3:8.1f} ms"
                     f"  hidden {r['hidden_cost_s'] * 1e3:7.1f} ms{slow}")
    for key in ("async_stall_ratio", "dcp_async_stall_ratio"):
        if res[key] is not None:
            lines.append(f"  {key}: {res[key]:.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m preflight.bench.ckptstall", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_MB:g} MB state, 3 repeats (default {FULL_MB:g} MB, 5)")
    ap.add_argument("--size-mb", type=float, help="state size in MB (model + AdamW moments)")
    ap.add_argument("--repeats", type=int, help="timed rounds after the warm-up round")
    ap.add_argument("--workdir", help="fast local folder (default: a temporary folder)")
    ap.add_argument("--shared-dir", help="shared file system folder (default: WORKDIR/shared)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    ap.add_argument("--out", help="results folder for a versioned record")
    args = ap.parse_args(argv)
    res = measure_stall(args.workdir, shared_dir=args.shared_dir, quick=args.quick, size_mb=args.size_mb,
                        repeats=args.repeats)
    if args.out:
        from preflight.records import make_record, save_record

        rec = make_record(METHOD, METHOD_VERSION, {"quick": args.quick, "config": res["config"]}, res)
        path = save_record(rec, args.out)
        print(f"record -> {path}", file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        print(summary(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
