"""Partition by profiled layer time, measured: the heterogeneous model split by count and by time.

A pipeline runs at the pace of its slowest stage: every micro-batch slot lasts as long as the busiest
rank needs. Splitting the layers by *count* (the same number per stage) is what a config file does
when nobody profiled; splitting by *time* puts the boundaries where the measured per-layer times are
balanced (the exact optimal contiguous partition, ``models.pipeline.partition_by_time``). Here both
splits of ``bench.stages``' heterogeneous model run through the real pipeline (``bench.pipeline``'s
worker under torchrun) and the gain predicted from the layer profile, ``bottleneck(by count) /
bottleneck(by time)``, is set beside the measured one, ``throughput(by time) / throughput(by count)``.

The layers are profiled where the stages will run (``stages.stage_device``): one GPU per rank when
there are enough, else the CPU with one thread per rank.

Way in: ``python -m preflight.bench.partition --out DIR [--quick]`` (writes ``partition.json``).
"""
from __future__ import annotations

import argparse
import sys

from preflight.bench.pipeline import launch_run, launch_runs
from preflight.core.records import Method
from preflight.harness.stages import HETERO_NAMES, check_partition, layer_times, stage_device

METHOD = Method("partition", 1, required=("p", "m", "layers", "by_count", "by_time", "predicted_gain",
                                          "measured_gain", "throughput_count", "throughput_time", "ranks"), runs_on="ranks")


def run_partition(boundaries, p: int = 2, schedule: str = "1f1b", m: int = 4, quick: bool = False,
                  timeout: float = 300.0, out=None) -> dict:
    """One partition of the heterogeneous model (``boundaries``: first layer of each stage): the record's
    results (throughput, per-rank busy/idle, the stages with their layers)."""
    boundaries = check_partition(boundaries, len(HETERO_NAMES), p)     # refuse before starting processes
    return launch_run(p, schedule, m, partition=boundaries, quick=quick, timeout=timeout, out=out)["results"]


def measure_partition(p: int = 2, m: int = 8, quick: bool = False) -> dict:
    """Method ``partition``: the heterogeneous model's layers timed alone, split into ``p`` stages by
    count and by time (the exact optimal contiguous partition), both run through the real pipeline;
    predicted (ratio of bottlenecks) and measured (ratio of throughputs) gain."""
    from preflight.models import pipeline as P

    layers = layer_times(stage_device(p), quick=quick)          # where the stages will run
    times = [x["time_s"] for x in layers]
    by_count, by_time = P.partition_by_count(len(times), p), P.partition_by_time(times, p)
    bounds = {name: check_partition([part[0] for part in parts], len(HETERO_NAMES), p)
              for name, parts in (("count", by_count), ("time", by_time))}
    # both partitions in one torchrun (the processes start once), each run with its warm-up and record
    same = bounds["count"] == bounds["time"]           # equal layers: one split, run once
    recs = launch_runs(p, [("1f1b", m, 1, bounds["count"])] + ([] if same else [("1f1b", m, 1, bounds["time"])]),
                       quick=quick)
    runs = {"count": recs[0]["results"], "time": recs[-1]["results"]}
    return {"p": p, "m": m, "layers": layers, "by_count": by_count, "by_time": by_time,
            "bottleneck_count_s": P.bottleneck(times, by_count), "bottleneck_time_s": P.bottleneck(times, by_time),
            "predicted_gain": P.partition_gain(times, p),
            "throughput_count": runs["count"]["throughput"], "throughput_time": runs["time"]["throughput"],
            "measured_gain": runs["time"]["throughput"] / runs["count"]["throughput"],
            "ranks": {k: v.get("ranks", []) for k, v in runs.items()}}


def main(argv: list[str] | None = None) -> int:
    from preflight.core.records import save_record

    ap = argparse.ArgumentParser(prog="python -m preflight.bench.partition", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="results folder (writes partition.json)")
    ap.add_argument("--quick", action="store_true", help="smaller sizes, fewer steps")
    args = ap.parse_args(argv)
    res = measure_partition(quick=args.quick)
    print(f"by count {res['by_count']}: {res['throughput_count']:.1f} samples/s; "
          f"by time {res['by_time']}: {res['throughput_time']:.1f} samples/s; "
          f"gain measured {res['measured_gain']:.2f}x, predicted {res['predicted_gain']:.2f}x")
    print(f"-> {save_record(METHOD.record({'quick': args.quick}, res), args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
