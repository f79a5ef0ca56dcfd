"""Instrumenting the input pipeline, cheaply enough to leave on.

Jumpy GPU utilisation usually means a starved data pipeline: look upstream first. Three numbers
tell the story, and this module records all three from inside your own training loop:

- the **data wait** the device sees: time the loop is blocked in ``next(loader)``;
- the **queue depth**: how many batches were already produced when the loop asked for one. A starved
  loader reads 1 (only the batch being handed over), a well-fed one reads close to
  ``num_workers * prefetch_factor``;
- the **CPU preprocessing rate**: samples per second one worker process gets through its transforms.
  Compare it with the rate the device consumes to know how many workers you need.

Usage, with any ``torch.utils.data.DataLoader`` (public APIs only)::

    ds = MyDataset(transform=timed(my_transform))           # seconds spent per sample, per process
    loader = DataLoader(ds, batch_size=64, num_workers=8, collate_fn=stamped())
    mon = LoaderMonitor(loader)
    for batch in mon:                                        # plain batches come out
        train_step(batch)
    mon.summary()                                            # median/p90 wait, depth, prep rate...

``stamped`` wraps the collate function, which runs in the worker process: it tags each batch with the
time it was finished (``time.monotonic()``: CLOCK_MONOTONIC is system-wide on Linux, so worker and
main-process stamps compare) and with the worker's preprocessing counter. ``LoaderMonitor`` unwraps
the tags and times each ``next()``. A loader without ``stamped`` still works: only waits are recorded.

The per-step cost is a few clock reads and small object allocations: microseconds against steps of
tens to hundreds of milliseconds. ``bookkeeping_cost_s`` measures it on your machine.
"""
from __future__ import annotations

import copy
import math
import os
import statistics
import time

from preflight.core.timing import summarize

# Per-process preprocessing counter: [seconds, samples]. Module-level, so each DataLoader worker has
# its own. A forked worker inherits the parent's values, hence the reset in the child after a fork.
_PREP = [0.0, 0]


def _reset_prep() -> None:
    _PREP[0], _PREP[1] = 0.0, 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_prep)


class timed:  # lower case: used like a function, ``timed(transform)``
    """Wrap a per-sample transform: each call adds its seconds and one sample to this process's
    counter, which ``stamped`` reads and resets at each batch. A class rather than a closure so the
    wrapped transform stays picklable (spawn / forkserver workers pickle the dataset)."""

    def __init__(self, transform):
        self.transform = transform

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return self.transform(*args, **kwargs)
        finally:
            _PREP[0] += time.perf_counter() - t0
            _PREP[1] += 1


def _pin(x):
    """Pin the tensors inside ``x``, recursing through tuples (named ones too), lists and dicts."""
    import torch

    if isinstance(x, torch.Tensor):
        return x.pin_memory()
    if isinstance(x, dict):     # a copy keeps the dict's type (OrderedDict, defaultdict...)
        out = copy.copy(x)
        out.update((k, _pin(v)) for k, v in x.items())
        return out
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(_pin(v) for v in x))
    if isinstance(x, (tuple, list)):
        return type(x)(_pin(v) for v in x)
    if hasattr(x, "pin_memory"):
        return x.pin_memory()
    return x


class Stamped:
    """A collated batch plus where and when it was made. Picklable (it crosses the worker queue) and
    pinnable: with ``pin_memory=True`` the DataLoader's pin thread calls ``.pin_memory()`` on it."""

    __slots__ = ("batch", "prep_n", "prep_s", "produced_at", "samples", "worker")

    def __init__(self, batch, produced_at: float, worker: int, prep_s: float, prep_n: int,
                 samples: int | None):
        self.batch = batch
        self.produced_at = produced_at    # time.monotonic() when collate finished
        self.worker = worker              # worker id, -1 for the main process
        self.prep_s = prep_s              # `timed` seconds in this process since its last batch
        self.prep_n = prep_n              # `timed` calls in this process since its last batch
        self.samples = samples            # batch size, None if unknown

    def pin_memory(self, device=None) -> Stamped:
        return Stamped(_pin(self.batch), self.produced_at, self.worker, self.prep_s, self.prep_n,
                       self.samples)


class stamped:  # lower case: used like a function, ``collate_fn=stamped()``
    """Wrap a collate function (default ``torch.utils.data.default_collate``) so it returns a
    ``Stamped``. ``samples`` is the number of items handed to collate (the batch size under the
    DataLoader's automatic batching). Picklable when ``collate_fn`` is."""

    def __init__(self, collate_fn=None):
        from torch.utils.data import default_collate, get_worker_info

        self.collate_fn = default_collate if collate_fn is None else collate_fn
        self.worker_info = get_worker_info      # looked up once, not per batch

    def __call__(self, items) -> Stamped:
        batch = self.collate_fn(items)
        now = time.monotonic()
        info = self.worker_info()
        prep_s, prep_n = _PREP
        _PREP[0], _PREP[1] = 0.0, 0
        try:
            n = len(items)
        except TypeError:
            n = None
        return Stamped(batch, now, -1 if info is None else info.id, prep_s, prep_n, n)


COLUMNS = ["step", "wait_s", "worker", "produced_at", "consumed_at", "queue_depth", "prep_s",
           "prep_n", "samples"]


class LoaderMonitor:
    """Iterate a loader, recording per step the time blocked in ``next()`` and the batch's stamps.

    ``for batch in LoaderMonitor(loader)`` yields plain batches. Nothing else is needed in the loop:
    the gap between two yields is your step's compute. ``batch_size`` (else ``loader.batch_size``)
    gives the throughput for loaders without ``stamped``. Iterating again (next epoch) appends to the
    same record, which keeps one row per step, a few hundred bytes each; use one monitor per epoch
    if you want epochs apart.
    """

    def __init__(self, loader, batch_size: int | None = None):
        self.loader = loader
        bs = batch_size if batch_size is not None else getattr(loader, "batch_size", None)
        self.batch_size = bs if isinstance(bs, int) else None
        # (perf_counter at the next() call, wait_s, consumed_at, worker, produced_at, prep_s,
        #  prep_n, samples)
        self.rows: list[tuple] = []

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        it = iter(self.loader)
        rows, bs = self.rows, self.batch_size
        while True:
            t0 = time.perf_counter()
            try:
                item = next(it)
            except StopIteration:
                return
            wait = time.perf_counter() - t0
            now = time.monotonic()
            if isinstance(item, Stamped):
                rows.append((t0, wait, now, item.worker, item.produced_at, item.prep_s, item.prep_n,
                             item.samples))
                yield item.batch
            else:
                rows.append((t0, wait, now, None, None, None, None, bs))
                yield item

    def _depths(self) -> list[float]:
        """Queue depth per step, from the stamps. At step i: the batches i, i+1, ... already produced
        when batch i was consumed. Every earlier batch was produced before batch i was consumed, so
        this is (all stamped batches with produced_at <= consumed_at_i) - (stamped batches before i):
        one sort and a binary search per step instead of comparing every pair."""
        import numpy as np

        produced = np.array([r[4] if r[4] is not None else np.nan for r in self.rows], dtype=float)
        consumed = np.array([r[2] for r in self.rows], dtype=float)
        known = ~np.isnan(produced)
        before = np.cumsum(known) - known
        depth = np.searchsorted(np.sort(produced[known]), consumed, side="right") - before
        return np.where(known, np.maximum(depth, 0), np.nan).tolist()

    def frame(self):
        """One row per step: ``COLUMNS``. Stamp columns are NaN for batches without stamps."""
        import pandas as pd

        depth = self._depths()
        return pd.DataFrame(
            [(i, r[1], r[3], r[4], r[2], depth[i], r[5], r[6], r[7]) for i, r in enumerate(self.rows)],
            columns=COLUMNS)

    def summary(self, skip_first: int = 1) -> dict:
        """Headline numbers, the first ``skip_first`` steps (worker start-up) left out of the waits,
        depths and throughput. ``time/data_wait(%)`` is total wait over the wall time from the
        ``next()`` call of step ``skip_first`` to the last yield. The prep rate uses every report."""
        rows = self.rows[skip_first:]
        out: dict = {"loader/steps": len(self.rows)}
        waits = [r[1] for r in rows]
        wall = rows[-1][0] + rows[-1][1] - rows[0][0] if rows else 0.0
        t = summarize(waits) if waits else None
        out["time/data_wait_median(s)"] = t.median_s if t else None
        out["time/data_wait_p90(s)"] = t.p90_s if t else None
        out["time/data_wait(%)"] = 100.0 * sum(waits) / wall if wall > 0 else None
        depths = [d for d in self._depths()[skip_first:] if not math.isnan(d)]
        out["loader/queue_depth_median"] = statistics.median(depths) if depths else None
        out["loader/queue_depth_min"] = min(depths) if depths else None
        prep_s = sum(r[5] for r in self.rows if r[5] is not None)
        prep_n = sum(r[6] for r in self.rows if r[6] is not None)
        out["loader/prep_rate_per_worker(samples/s)"] = prep_n / prep_s if prep_s > 0 else None
        samples = [r[7] for r in rows]
        known = bool(rows) and wall > 0 and all(s is not None for s in samples)
        out["loader/throughput(samples/s)"] = sum(samples) / wall if known else None
        return out


def bookkeeping_cost_s(steps: int = 2000, rounds: int = 5) -> float:
    """Median seconds per step the instrumentation adds: one ``timed`` call, the ``stamped`` wrapper
    around a collate (minus the collate itself) and one ``LoaderMonitor`` step (minus a plain
    iteration), each timed over ``steps`` calls, median over ``rounds``. ``timed`` runs once per
    sample and, with ``num_workers > 0``, it and ``stamped`` run in the workers, off the loop's path.
    Leaves this process's preprocessing counter as it found it."""
    saved = list(_PREP)

    def ident(x):
        return x

    items = list(range(8))
    t_fn, s_fn = timed(ident), stamped(ident)
    batches = [s_fn(items) for _ in range(steps)]
    per_step = []
    try:
        for _ in range(rounds):
            clock = time.perf_counter
            t0 = clock()
            for _ in range(steps):
                ident(items)
            t1 = clock()
            for _ in range(steps):
                t_fn(items)
            t2 = clock()
            for _ in range(steps):
                s_fn(items)
            t3 = clock()
            for _ in batches:
                pass
            t4 = clock()
            for _ in LoaderMonitor(batches):
                pass
            t5 = clock()
            added = (t2 - t1) + (t3 - t2) - 2 * (t1 - t0) + (t5 - t4) - (t4 - t3)
            per_step.append(added / steps)
    finally:
        _PREP[0], _PREP[1] = saved
    return statistics.median(per_step)


def overhead(loop_with, loop_without, repeats: int = 5) -> dict:
    """End-to-end cost of the instrumentation: ``loop_with`` and ``loop_without`` each run the same
    loader loop (wrapped / plain) and return elapsed seconds; they alternate, ``repeats`` times each.

    On a shared CPU the difference between two loader loops is noisy (worker scheduling, page cache,
    other jobs), often larger than the instrumentation itself, and can come out negative. That is why
    the bookkeeping microbenchmark (``bookkeeping_cost_s``) is reported beside it: compare it with
    your step time."""
    with_s, without_s = [], []
    for i in range(repeats):
        if i % 2:   # alternate the order so drift (warm caches, clock boost) favours neither
            without_s.append(loop_without())
            with_s.append(loop_with())
        else:
            with_s.append(loop_with())
            without_s.append(loop_without())
    w, wo = statistics.median(with_s), statistics.median(without_s)
    return {"with_s": w, "without_s": wo, "overhead_fraction": w / wo - 1.0,
            "bookkeeping_s_per_step": bookkeeping_cost_s()}
