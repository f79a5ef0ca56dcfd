"""Timing device work correctly.

GPU kernels run asynchronously: a host clock read right after a launch measures the launch, not the
work. So: warm up first (allocator, cuDNN/cuBLAS heuristics, compilation), synchronise before reading
a clock (or use CUDA events), repeat, and report the median (the mean carries the scheduler's tail).

- ``time_fn``  times a callable: warm-up, repeats, median / p10 / p90;
- ``StepTimer`` splits a training step into named phases (data wait, forward, backward, optimizer...)
  and is cheap enough to leave in a real loop.
"""
from __future__ import annotations

import statistics
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass


def synchronize(device) -> None:
    """Wait until all queued work on ``device`` is done (no-op on the CPU)."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


@dataclass
class Timing:
    median_s: float
    p10_s: float
    p90_s: float
    repeats: int
    samples_s: list[float]

    def as_dict(self) -> dict:
        return {"median_s": self.median_s, "p10_s": self.p10_s, "p90_s": self.p90_s,
                "repeats": self.repeats}


def summarize(samples: list[float]) -> Timing:
    if not samples:
        raise ValueError("no timing samples")
    s = sorted(samples)
    q = lambda f: s[min(len(s) - 1, int(round(f * (len(s) - 1))))]  # noqa: E731
    return Timing(statistics.median(s), q(0.1), q(0.9), len(s), list(samples))


def time_fn(fn, *, device="cpu", warmup: int = 2, repeats: int = 5, min_time_s: float = 0.0) -> Timing:
    """Time ``fn()`` on ``device``: ``warmup`` untimed calls, then at least ``repeats`` timed ones
    (more until ``min_time_s`` of samples are gathered). CUDA: events around each call."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        with torch.cuda.device(dev):    # events record on the current device's stream
            return _time_fn(fn, dev, warmup, repeats, min_time_s)
    return _time_fn(fn, dev, warmup, repeats, min_time_s)


def _time_fn(fn, dev, warmup: int, repeats: int, min_time_s: float) -> Timing:
    import torch

    for _ in range(warmup):
        fn()
    synchronize(dev)
    samples: list[float] = []
    while len(samples) < repeats or sum(samples) < min_time_s:
        if dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            synchronize(dev)
            samples.append(time.perf_counter() - t0)
        if len(samples) >= 10_000:
            break
    return summarize(samples)


class StepTimer:
    """Per-phase wall time of each training step, synchronised at phase boundaries.

    Usage in your own loop::

        timer = StepTimer(device)
        for step in range(n):
            with timer.phase("data_wait"):
                batch = next(it)
            with timer.phase("forward"):
                loss = model(batch)
            ...
            timer.end_step()
        timer.frame()       # one row per step, one column per phase, plus 'other' and 'total'

    ``other`` is the step time not covered by any phase. Synchronising costs a little on a GPU
    (the pipeline drains at each boundary); ``sync=False`` leaves it off and measures host time only.
    """

    def __init__(self, device="cpu", sync: bool = True):
        self.device = device
        self.sync = sync
        self.steps: list[dict[str, float]] = []
        self._cur: dict[str, float] = defaultdict(float)
        self._step_start: float | None = None

    @contextmanager
    def phase(self, name: str):
        if self.sync:
            synchronize(self.device)
        t0 = time.perf_counter()
        if self._step_start is None:
            self._step_start = t0
        try:
            yield
        finally:
            if self.sync:
                synchronize(self.device)
            self._cur[name] += time.perf_counter() - t0

    def end_step(self) -> None:
        if self.sync:
            synchronize(self.device)
        now = time.perf_counter()
        start = self._step_start if self._step_start is not None else now
        row = dict(self._cur)
        row["total"] = now - start
        row["other"] = max(0.0, row["total"] - sum(self._cur.values()))
        self.steps.append(row)
        self._cur = defaultdict(float)
        self._step_start = None

    def frame(self, skip: int = 0):
        """Seconds per phase per step (DataFrame), dropping the first ``skip`` (warm-up) steps."""
        import pandas as pd

        return pd.DataFrame(self.steps[skip:]).fillna(0.0)

    def composition(self, skip: int = 0):
        """Median seconds per phase and share of the median step, one row per phase."""
        import pandas as pd

        df = self.frame(skip)
        med = df.median()
        phases = [c for c in df.columns if c != "total"]
        total = float(med[phases].sum())
        return pd.DataFrame({"phase": phases, "seconds": [float(med[p]) for p in phases],
                             "share": [float(med[p]) / total if total else 0.0 for p in phases]})


def busy_warning(threshold: float = 0.5) -> str | None:
    """A warning when this machine is already busy (1-minute load average above ``threshold`` x the
    usable cores): timings taken now measure the other jobs too. None when quiet (or unknown)."""
    import os

    try:
        load = os.getloadavg()[0]
    except OSError:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if load > threshold * cores:
        return (f"this machine is busy (load average {load:.1f} on {cores} cores) before the measurement "
                "starts: other jobs share the cores, so timings will be slower and noisier than on a quiet machine")
    return None
