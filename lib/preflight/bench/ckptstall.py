"""How long training waits for a checkpoint: synchronous vs asynchronous saves, measured.

A checkpoint costs a training run twice. The *stall* is the time the training loop stops to save;
it is paid at every checkpoint and is the ``C`` of Young's interval ``sqrt(2 C MTBF)``: a shorter
stall allows more frequent checkpoints, and so less work lost at a failure. The *durable time* is how
long until the checkpoint would survive a crash (on disk, ``fsync``-ed, published as ``latest``):
a failure before that falls back to the previous one.

This module trains a small MLP whose model + AdamW state is ``S`` MB (quick: ~20 MB, full: ~200 MB)
and checkpoints it four ways, to real folders:

- ``sync ckpt.save``: ``preflight.toolkit.ckpt.save`` straight to the *shared* folder, in the training
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

This module is the protocol and the statistics; the trained state, the four save methods and the
timing of a single save are in ``preflight.harness.ckptstate``.

    measure_stall(workdir, shared_dir=..., quick=True)     # JSON-ready dict
    python -m preflight.bench.ckptstall --json [--quick] [--size-mb S] [--workdir D] [--shared-dir D]
    python -m preflight.bench.ckptstall --out DIR            # a versioned record (method "ckptstall")
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from preflight.core.records import Method
from preflight.harness.ckptstate import (
    ASYNC,
    BATCH,
    DESCRIPTIONS,
    DIN,
    METHODS,
    Methods,
    Trainer,
    mlp_for,
    one_checkpoint,
    quiet_dcp,
    state_bytes,
)

__all__ = ["ASYNC", "DESCRIPTIONS", "FULL_MB", "METHOD", "METHODS", "QUICK_MB", "main",
           "measure_stall", "mlp_for", "state_bytes", "summary"]

METHOD = Method("ckptstall", 1, required=("rows", "config"), runs_on="cpu")
QUICK_MB, FULL_MB = 20.0, 200.0
BASELINE_STEPS = 5           # plain training steps timed per round


def _median(xs):
    return statistics.median(xs) if xs else None


def measure_stall(workdir: str | os.PathLike | None = None, *, shared_dir: str | os.PathLike | None = None,
                  quick: bool = False, size_mb: float | None = None, repeats: int | None = None,
                  methods: tuple[str, ...] = METHODS, trainer=None) -> dict:
    """Stall and durable time of each checkpoint method for an ``size_mb`` MB training state.

    ``trainer``: the training loop to checkpoint instead of the sized MLP (``ckptstate.Trainer``'s
    interface: ``model``, ``step()`` -> seconds, ``state()``, ``step_no``): a workload's own model
    and optimizer (``preflight.bench.workload_resume``), whose state has its real size.

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
    - ``async_total_ratio``: two-stage total cost (its stall plus the in-flight steps' extra time) / sync
      total cost, what chapter 5 judges;
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
        with quiet_dcp():
            return _measure(size_mb, repeats, quick, methods, base, shared_base, local, shared, trainer)
    finally:
        shutil.rmtree(local, ignore_errors=True)
        shutil.rmtree(shared, ignore_errors=True)
        if own_tmp:
            shutil.rmtree(base, ignore_errors=True)


def _measure(size_mb, repeats, quick, methods, base, shared_base, local, shared, trainer=None) -> dict:
    import torch

    trainer = trainer if trainer is not None else Trainer(size_mb)
    runner = Methods(trainer, local, shared)
    state_mb = state_bytes(trainer.state()) / 1e6
    for _ in range(3):
        trainer.step()
    baseline: list[float] = []
    per: dict[str, list[dict]] = {m: [] for m in methods}
    for rnd in range(repeats + 1):                 # round 0: warm-up, discarded
        steps = [trainer.step() for _ in range(BASELINE_STEPS)]
        results = {m: one_checkpoint(runner, m, trainer) for m in methods}
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
        "async_total_ratio": (by["async two-stage"]["total_cost_s"] / by["sync ckpt.save"]["total_cost_s"]
                              if "async two-stage" in by and "sync ckpt.save" in by
                              and by["sync ckpt.save"]["total_cost_s"] > 0 else None),
        "dcp_async_stall_ratio": ratio("DCP async_save", "DCP save"),
        "timings": {m: {"stall_s": [r["stall_s"] for r in per[m]],
                        "durable_s": [r["durable_s"] for r in per[m]]} for m in methods},
        "config": {"size_mb_requested": size_mb, "state_MB": round(state_mb, 3), "din": DIN,
                   "hidden": getattr(trainer, "hidden", None), "batch": BATCH,
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
        from preflight.core.records import save_record

        rec = METHOD.record({"quick": args.quick, "config": res["config"]}, res)
        path = save_record(rec, args.out)
        print(f"record -> {path}", file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        print(summary(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
