"""Pipeline parallelism, measured: what each rank of a real pipeline does with its time.

A pipeline splits the model's layers into ``p`` stages, one per rank, and the batch into ``m``
micro-batches. A rank can only work on a micro-batch once the previous stage has sent it, so while the
pipe fills and drains some ranks wait. With equal stages, GPipe and 1F1B leave each rank idle for
``p-1`` of ``m+p-1`` slots; interleaving ``v`` non-adjacent chunks per rank makes the slots ``v`` times
shorter (Narayanan et al. 2021, arXiv 2104.04473)::

    bubble (share of the step) = (p-1) / (v*m + p-1)        # p=2, m=1: 1/2;  p=4, m=8: 27 %

Every rank times its own compute: ``forward_one_chunk`` / ``backward_one_chunk`` of its
``PipelineStage`` (the schedule waits for the incoming activation or gradient *before* calling them,
so they hold compute only) plus the loss on the last stage. A step runs from a barrier to a barrier,
so every rank's ``step_s`` is the pipeline's, and ``idle = step - busy`` is its bubble plus send/recv
and schedule overhead. The measured bubble is the mean idle share over ranks. The models split are
``bench.stages``' (balanced blocks by default; the heterogeneous one with ``--partition``), and the
partition measurement built on these runs is ``bench.partition``.

Ways in: the worker ``torchrun --nproc_per_node=P -m preflight.bench.pipeline --out DIR --schedule
gpipe|1f1b|interleaved|zb-h1 --microbatches M [--chunks V] [--partition 0,4 | --balanced-blocks] [--steps K]
[--quick]`` (rank 0 writes the record, method "pipeline"); ``launch_run`` launches it from Python, and
``--measure bubbles`` (``measure_bubbles``) makes chapter 4's bubble measurement, a torchrun per run.
On 2 CPU cores p=4 is oversubscribed: it runs, but measures the OS scheduler.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from preflight.core.records import Method
from preflight.core.timing import synchronize
from preflight.harness.launch import exit_worker
from preflight.harness.stages import BALANCED, HETERO, HETERO_NAMES, balanced_layers, check_partition, hetero_layers

# One run (the torchrun worker) and the bubble measurement chapter 4 makes of such runs.
METHOD = Method("pipeline", 1, required=("world_size", "microbatches", "measured_bubble", "formula", "ranks"), runs_on="ranks")
BUBBLES = Method("pipeline_bubble", 1, required=("rows",), runs_on="ranks")
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")     # zb-h1: ScheduleInterleavedZeroBubble, 1 stage per rank
WARMUP_STEPS = 2


def bubble_formula(p: int, m: int, v: int = 1, schedule: str = "1f1b") -> float:
    """Idle share of a step with equal stages, ``(p-1) / (v*m + p-1)``: the playbook's model. For
    ``zb-h1`` the simulated ZB-H1 schedule with t_F = t_B = t_W (``(p-1) / (3m + p-1)`` when m >= p)."""
    from preflight.models.pipeline import bubble_fraction, timeline_bubble

    if schedule == "zb-h1":
        from preflight.models.zerobubble import zb_h1_timeline

        return timeline_bubble(zb_h1_timeline(p, m))
    return bubble_fraction(p, m, v)


# --- the worker ---------------------------------------------------------------------------------------

def _timed(fn, clock: list, device, kind: str = "", stage: int | None = None):
    """``fn``, adding its own duration to ``clock[0]`` and its interval ``[kind, stage, chunk, start,
    end]`` to the list ``clock[1]`` (chunk: the micro-batch, ``fn``'s first argument when it is an int;
    start, end: ``time.perf_counter()``, one monotonic clock for all processes of a Linux machine, so
    the ranks' timelines compare). On a GPU the device is synchronised at both ends: a kernel launch
    returns at once, and busy time must be the kernels' time, not the launches'."""
    def wrapper(*args, **kwargs):
        synchronize(device)
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            synchronize(device)
            t1 = time.perf_counter()
            clock[0] += t1 - t0
            chunk = args[0] if args and isinstance(args[0], int) else None
            clock[1].append([kind, stage, chunk, round(t0, 7), round(t1, 7)])
    return wrapper


def op_medians(timelines) -> list[dict]:
    """Per rank, the median duration (s) of each op kind over its timed steps: F, B (input gradient
    only under ``zb-h1``, the whole backward otherwise), W (``zb-h1``'s weight gradient), L (loss)."""
    out = []
    for steps in timelines:
        kinds: dict[str, list[float]] = {}
        for step in steps:
            for kind, _stage, _mb, t0, t1 in step["actions"]:
                kinds.setdefault(kind, []).append(t1 - t0)
        out.append({k: statistics.median(v) for k, v in sorted(kinds.items())})
    return out


def _run_pipeline(dist, device, rank, p, schedule, m, v, partition, steps, quick) -> dict:
    """Build this rank's stages and run warm-up + ``steps`` steps; this rank's medians and stages."""
    import torch
    from torch import nn
    from torch.distributed import pipelining as pp

    torch.manual_seed(0)                       # every rank builds the same model and keeps its slice
    layers = hetero_layers(quick) if partition else balanced_layers(quick)
    n_stages, sizes = p * v, (HETERO if partition else BALANCED)[quick]
    if not partition:                          # even split; check_partition refuses a remainder
        partition = list(range(0, len(layers), max(1, len(layers) // n_stages)))
    bounds, mb = [*check_partition(partition, len(layers), n_stages), len(layers)], sizes["mb"]
    if "vocab" in sizes:                       # inputs on the stage's device: pipelining does not move them
        x, target = (torch.randint(0, sizes["vocab"], (m * mb, sizes["seq"]), device=device) for _ in range(2))
        example = lambda i: x[:mb] if i == 0 else torch.zeros(mb, sizes["seq"], sizes["d"], device=device)
        loss = lambda out, y: nn.functional.cross_entropy(out.flatten(0, 1), y.flatten())
    else:
        x, target = torch.randn(m * mb, sizes["d"], device=device), torch.randn(m * mb, sizes["d"], device=device)
        example = lambda i: torch.zeros(mb, sizes["d"], device=device)
        loss = nn.functional.mse_loss
    clock, stages, placement = [0.0, []], [], []
    stage_ids = [rank + k * p for k in range(v)]             # v non-adjacent stages on this rank
    for i in stage_ids:
        part = layers[bounds[i]:bounds[i + 1]]
        stage = pp.PipelineStage(nn.Sequential(*[mod for _, mod in part]).to(device), i, n_stages, device,
                                 input_args=example(i))
        stage.forward_one_chunk = _timed(stage.forward_one_chunk, clock, device, "F", i)
        stage.backward_one_chunk = _timed(stage.backward_one_chunk, clock, device, "B", i)
        # zero-bubble schedules split the backward: backward_one_chunk(full_backward=False) is then the
        # input gradient only (B) and this one the weight gradient (W); other schedules never call it
        stage.backward_weight_one_chunk = _timed(stage.backward_weight_one_chunk, clock, device, "W", i)
        stages.append(stage)
        placement.append({"stage": i, "rank": rank, "layers": [name for name, _ in part]})
    notes = []
    if schedule == "1f1b" and m < n_stages:
        schedule = "gpipe"
        notes.append(f"1F1B needs m >= stages (torch raises); m={m} ran GPipe, whose bubble is the same")
    loss_fn = _timed(loss, clock, device, "L", n_stages - 1)
    if schedule == "interleaved":
        sched = pp.ScheduleInterleaved1F1B(stages, m, loss_fn=loss_fn)
    elif schedule == "zb-h1":                  # one stage per rank: exactly ZB-H1's order (models.zerobubble)
        sched = pp.ScheduleInterleavedZeroBubble(stages, m, loss_fn=loss_fn)
    else:
        sched = (pp.ScheduleGPipe if schedule == "gpipe" else pp.Schedule1F1B)(stages[0], m, loss_fn=loss_fn)
    first, last, samples, timeline = 0 in stage_ids, n_stages - 1 in stage_ids, [], []
    for k in range(WARMUP_STEPS + steps):
        for stage in stages:
            stage.submod.zero_grad(set_to_none=True)
        dist.barrier()
        clock[0], clock[1], t0 = 0.0, [], time.perf_counter()
        sched.step(*([x] if first else []), target=target if last else None)
        synchronize(device)
        own = time.perf_counter() - t0              # this rank's part done
        dist.barrier()
        synchronize(device)
        step = time.perf_counter() - t0             # the pipeline's step: every rank done
        if k >= WARMUP_STEPS:
            samples.append((step, own, clock[0]))
            timeline.append({"start": round(t0, 7), "end": round(t0 + step, 7), "actions": clock[1]})
    step, own, busy = ([sample[i] for sample in samples] for i in range(3))
    median = statistics.median
    return {"rank": rank, "step_s": median(step), "own_step_s": median(own), "busy_s": median(busy),
            "idle_s": median(s - b for s, b in zip(step, busy, strict=True)),
            "idle_share": median(1 - b / s for s, b in zip(step, busy, strict=True)),
            "placement": placement, "notes": notes, "schedule": schedule, "batch": m * mb, "timeline": timeline}


def worker(out, schedule: str = "1f1b", m: int = 4, v: int = 1, partition: list[int] | None = None,
           steps: int = 10, quick: bool = False) -> dict | None:
    """One rank; rank 0 gathers every rank's medians, writes and returns the record (None elsewhere)."""
    return worker_runs(out, [(schedule, m, v)], partition, steps, quick)[-1]


def worker_runs(out, runs: list[tuple], partition: list[int] | None = None, steps: int = 10,
                quick: bool = False) -> list[dict | None]:
    """Several runs (schedule, m, v[, partition]) in one process group, one after the other, each with its
    own warm-up and record: the processes start, import torch and rendezvous once (chapter 4's bubbles at
    p = 2 are seven runs, its partition two; a torchrun each cost seconds of start-up per run on a small
    machine). A run without its own partition takes ``partition``."""
    import torch.distributed as dist

    from preflight.harness.launch import init_distributed

    de, device = init_distributed()
    try:
        return [_record_run(dist, device, de, out, r[0], r[1], r[2], _part(r, partition), steps, quick)
                for r in runs]
    finally:
        dist.destroy_process_group()


def _record_run(dist, device, de, out, schedule, m, v, partition, steps, quick) -> dict | None:
    """One run of :func:`worker_runs`: every rank's medians gathered, rank 0 writes the record."""
    import torch

    from preflight.core.records import save_record

    p = de["world_size"]
    mine = _run_pipeline(dist, device, de["rank"], p, schedule, m, v, partition, steps, quick)
    every = [None] * p
    dist.all_gather_object(every, mine)
    record = None
    if de["rank"] == 0:
        keys = ("rank", "step_s", "own_step_s", "busy_s", "idle_s", "idle_share")
        rows = [{k: r[k] for k in keys} for r in every]
        notes, cores = mine["notes"], len(os.sched_getaffinity(0))
        over = device.type == "cpu" and p > cores
        if over:
            notes.append(f"oversubscribed: {p} ranks on {cores} cores; only functional (measures the OS scheduler)")
        if partition:
            notes.append("unequal stages: the formula assumes equal ones; the slowest stage sets the pace")
        # Straggler view: with the closing barrier every rank's step is the pipeline's, so load shows in
        # busy time; the busiest rank paces every micro-batch slot.
        busy = [r["busy_s"] for r in rows]
        slowest = max(rows, key=lambda r: r["busy_s"])
        measured, formula = statistics.mean(r["idle_share"] for r in rows), bubble_formula(p, m, v, schedule)
        step_s = max(r["step_s"] for r in rows)
        results = {"world_size": p, "schedule": mine["schedule"], "schedule_requested": schedule,
                   "microbatches": m, "chunks": v, "model": "hetero" if partition else "balanced",
                   "batch": mine["batch"], "ranks": rows, "measured_bubble": measured, "formula": formula,
                   "error": measured - formula, "step_s": step_s, "throughput": mine["batch"] / step_s,
                   "stages": sorted((s for r in every for s in r["placement"]), key=lambda s: s["stage"]),
                   "straggler": {"step_s_per_rank": [r["own_step_s"] for r in rows],
                                 "busy_s_per_rank": busy, "slowest_rank": slowest["rank"],
                                 "excess": slowest["busy_s"] / statistics.median(busy) - 1},
                   "oversubscribed": over, "notes": notes, "load_average_1m": os.getloadavg()[0],
                   "timelines": [r["timeline"] for r in every],        # per rank, per timed step
                   "op_s": op_medians([r["timeline"] for r in every]),
                   "device_kind": device.type, "backend": dist.get_backend()}
        params = {"schedule": schedule, "microbatches": m, "chunks": v, "partition": partition, "steps": steps,
                  "warmup_steps": WARMUP_STEPS, "quick": quick, "omp_num_threads": torch.get_num_threads(),
                  "sizes": (HETERO if partition else BALANCED)[quick]}
        record = METHOD.record(params, results)
        save_record(record, out, name=_name(schedule, p, m, v, partition))
    dist.barrier()                # field notes: without it some runs aborted at exit
    return record


def _name(schedule, p, m, v, partition) -> str:
    return f"{schedule}-p{p}-m{m}-v{v}-" + ("part" + "_".join(map(str, partition)) if partition else "balanced")


# --- from Python: launch here ---------------------------------------------------------------------------

def launch_run(p, schedule, m, v=1, partition=None, quick=False, timeout=300.0, out=None) -> dict:
    """Run the worker under ``torchrun --standalone``, one thread per process; its record."""
    return launch_runs(p, [(schedule, m, v)], partition, quick, timeout, out)[0]


def _part(run: tuple, default):
    """A run's own partition (its fourth field), else ``default``."""
    return list(run[3]) if len(run) > 3 and run[3] else default


def launch_runs(p, runs: list[tuple], partition=None, quick=False, timeout=300.0, out=None) -> list[dict]:
    """Several runs (schedule, m, v[, partition]) in one ``torchrun --standalone`` (:func:`worker_runs`);
    their records, in order. ``timeout`` is per run."""
    from preflight.harness.launch import run_torchrun, torchrun_cmd

    spec = [f"{r[0]}:{r[1]}:{r[2]}" + (":" + "_".join(map(str, r[3])) if len(r) > 3 and r[3] else "") for r in runs]
    args = ["--runs", ",".join(spec)] + (["--quick"] if quick else [])
    args += ["--partition", ",".join(map(str, partition))] if partition else []
    with tempfile.TemporaryDirectory(prefix="preflight-pipeline-") as tmp:
        out_dir = Path(out) if out is not None else Path(tmp) / "records"
        run_torchrun(torchrun_cmd(p, "preflight.bench.pipeline", "--out", out_dir, *args),
                     dict(os.environ, TMPDIR=tmp, OMP_NUM_THREADS="1"), timeout * len(runs))
        records = []
        for r in runs:
            path = out_dir / f"{METHOD.name}-{_name(r[0], p, r[1], r[2], _part(r, partition))}.json"
            record = json.loads(path.read_text())
            if out is not None:
                record["_path"] = str(path)
            records.append(record)
    return records


def measure_bubble(p: int = 2, ms=(1, 2, 4, 8), schedule: str = "1f1b", quick: bool = False,
                   timeout: float = 300.0, v: int = 1, out=None):
    """The balanced model, one torchrun for every m (:func:`launch_runs`): columns p, m, v, schedule (as run),
    measured_bubble, formula, error, step_s. ``df.attrs["records"]``: the records (per-rank rows, notes,
    oversubscribed)."""
    return bubble_frame(p, v, launch_runs(p, _checked(p, [(schedule, m, v) for m in ms]), quick=quick,
                                          timeout=timeout, out=out))


def _checked(p: int, runs: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    for schedule, m, v in runs:
        bubble_formula(p, m, v, schedule)   # refuses a bad (p, m, v) before any process starts
    return runs


def bubble_frame(p: int, v: int, records: list[dict]):
    """The rows of :func:`measure_bubble` from its records."""
    import pandas as pd

    cols = ("schedule", "measured_bubble", "formula", "error", "step_s", "oversubscribed")

    def per_mb(res, kinds):                 # mean over ranks of the median op times, in ms
        ops = res.get("op_s", [])
        return 1e3 * sum(sum(o.get(k, 0.0) for k in kinds) for o in ops) / max(1, len(ops))

    df = pd.DataFrame([{"p": p, "m": r["results"]["microbatches"], "v": v, **{k: r["results"][k] for k in cols},
                        "forward_ms": per_mb(r["results"], "F"), "backward_ms": per_mb(r["results"], "BW"),
                        "ranks on": r["results"].get("device_kind", "?")} for r in records])
    df.attrs["records"] = records
    return df


def runs_frame(records: list[dict]):
    """One row per pipeline run (``pipeline`` records, e.g. from your cluster under torchrun): the
    layout, the measured idle share beside the formula's, the step time and throughput."""
    import pandas as pd

    cols = ("world_size", "schedule", "microbatches", "chunks", "model", "measured_bubble", "formula", "error",
            "step_s", "throughput", "device_kind", "oversubscribed")
    return pd.DataFrame([{k: r["results"].get(k) for k in cols} | {"record": Path(r.get("_path", "?")).name}
                         for r in records])


def measure_bubbles(quick: bool = False) -> dict:
    """Method ``pipeline_bubble``: the balanced model at p=2 over m (and GPipe at m=8, p=4 at m=4, 8 where
    the machine runs 4 ranks, ZB-H1 at p=2, m=4, 8; quick: p=2, m=1 and 4), one torchrun per pipeline depth;
    a row per run with the schedule requested, its per-micro-batch forward and backward (B + W) time, mean
    over ranks; ``notes``: what was not run, and why."""
    import pandas as pd

    from preflight.harness.launch import max_processes

    plan = ({2: [("1f1b", 1, 1), ("1f1b", 4, 1)]} if quick else
            {2: [("1f1b", m, 1) for m in (1, 2, 4, 8)] + [("gpipe", 8, 1), ("zb-h1", 4, 1), ("zb-h1", 8, 1)],
             4: [("1f1b", 4, 1), ("1f1b", 8, 1)]})
    notes = []
    ranks, unit = max_processes()
    if 4 in plan and ranks < 4:         # 4 stages on fewer cores time the OS scheduler, not the schedule
        del plan[4]
        notes.append(f"p=4 not run: this machine runs {ranks} {unit} meaningfully, and 4 stages on it would time "
                     "the OS scheduler, not the pipeline")
    frames = []
    for p, runs in plan.items():            # one torchrun per pipeline depth, its runs one after the other
        records = launch_runs(p, _checked(p, runs), quick=quick)
        for (schedule, _m, v), rec in zip(runs, records, strict=True):
            frames.append(bubble_frame(p, v, [rec]).assign(requested=schedule))
    order = {("1f1b", 2): 0, ("gpipe", 2): 1, ("1f1b", 4): 2, ("zb-h1", 2): 3}     # the rows' order as before
    rows = pd.concat(frames, ignore_index=True)
    rows = rows.iloc[sorted(range(len(rows)), key=lambda i: (order[(rows["requested"][i], rows["p"][i])], i))]
    return {"rows": rows.reset_index(drop=True).to_dict("records"), "notes": notes}


# --- command line -----------------------------------------------------------------------------------

def _parse_run(text: str) -> tuple:
    """``SCHEDULE:M:V`` or ``SCHEDULE:M:V:B0_B1...`` (a partition) -> a run tuple; ValueError otherwise."""
    parts = text.split(":")
    if len(parts) not in (3, 4):
        raise ValueError(text)
    run = (parts[0], int(parts[1]), int(parts[2]))
    return run + (([int(b) for b in parts[3].split("_")],) if len(parts) == 4 else ())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m preflight.bench.pipeline",
                                 description="one rank of a pipeline-parallel run (start it under torchrun)")
    ap.add_argument("--out", required=True, help="results folder (rank 0 writes pipeline-<name>.json)")
    ap.add_argument("--schedule", choices=SCHEDULES, default="1f1b")
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--chunks", type=int, default=1, help="stages per rank (interleaved only)")
    ap.add_argument("--runs", default=None, help="several runs in one process group, one after the other: "
                    "SCHEDULE:M:V,... (e.g. 1f1b:1:1,1f1b:4:1,gpipe:8:1); replaces --schedule, --microbatches, "
                    "--chunks")
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--partition", help="heterogeneous model: first layer index of each stage, e.g. 0,4")
    group.add_argument("--balanced-blocks", action="store_true", help="identical MLP blocks (the default)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 10, 5 with --quick)")
    ap.add_argument("--quick", action="store_true", help="smaller sizes, fewer steps")
    ap.add_argument("--measure", choices=("bubbles",), default=None,
                    help="instead of being one rank: launch chapter 4's bubble measurement here (one torchrun "
                         "per pipeline depth) and write pipeline_bubble.json")
    args = ap.parse_args(argv)
    if args.measure:
        from preflight.core.records import save_record

        print(save_record(BUBBLES.record({"quick": args.quick}, measure_bubbles(quick=args.quick)), args.out))
        return 0
    try:
        runs = ([_parse_run(r) for r in args.runs.split(",")] if args.runs
                else [(args.schedule, args.microbatches, args.chunks)])
    except ValueError:
        ap.error(f"argument --runs {args.runs!r}: expected SCHEDULE:M:V[:B0_B1...][,...], e.g. 1f1b:4:1 or "
                 "1f1b:8:1:0_5 (a partition: the first layer of each stage)")
    from preflight.harness.launch import dist_env

    world = dist_env()["world_size"]
    for schedule, m, v, *own in runs:
        if own:
            try:
                check_partition(own[0], len(HETERO_NAMES), world * v)
            except ValueError as exc:
                ap.error(f"argument --runs: partition {own[0]}: {exc}")
        if schedule not in SCHEDULES:
            ap.error(f"schedule {schedule!r}: accepted {', '.join(SCHEDULES)}")
        if m < 1 or v < 1 or (v > 1 and schedule != "interleaved"):
            ap.error("need microbatches >= 1, chunks >= 1, and chunks > 1 only with the interleaved schedule")
        if schedule == "interleaved" and m % world:    # as Megatron-LM and the model
            ap.error(f"the interleaved schedule needs microbatches a multiple of the {world} ranks (got {m})")
    try:
        partition = [int(t) for t in args.partition.split(",")] if args.partition else None
        if partition:
            check_partition(partition, len(HETERO_NAMES), world * args.chunks)
    except ValueError as exc:
        ap.error(f"argument --partition {args.partition!r}: {exc}")
    recs = worker_runs(args.out, runs, partition, args.steps or (5 if args.quick else 10), args.quick)
    for rec in (r for r in recs if r is not None):
        res = rec["results"]
        print(*(f"rank {r['rank']}: step {r['step_s']:.4f} s, busy {r['busy_s']:.4f} s" for r in res["ranks"]),
              f"bubble {res['measured_bubble']:.3f} (formula {res['formula']:.3f}), {res['throughput']:.1f} samples/s",
              *res["notes"], sep="\n")
    return 0


if __name__ == "__main__":
    exit_worker(main)
