"""Replay a step's dependency graph with chosen op durations: the engine of the straggler what-if.

Every op ends ``work`` seconds after it can start. A local op (a compute, the optimizer) starts when the
ops it waits for have ended. A collective cannot move data before its last member arrives, so each
member ends ``work`` after the *latest* start in its group (across the dp ranks too for a data-parallel
collective); its ``work`` is what the recording shows it spent after that last arrival, the *transfer*
time, not its recorded duration, which includes the wait for the others. That one rule is how one slow
worker delays everyone: the others wait in the next collective.

Replayed with the recorded durations and the recorded launch gaps (the time an op started after its
dependencies ended: CPU work the trace does not show), the replay gives back the recorded step times
(:attr:`WhatIf.fidelity` says how closely). Replayed with zero gaps it gives the job as recorded minus
launch delays, ``T``; with every op at its type's typical duration (mean for computes, median for
communication, over all steps and workers) it gives the job without stragglers, ``T_ideal``. The job's
straggler slowdown is ``S = mean(T) / mean(T_ideal)`` (paper Eq. 1). Replays with one group of ops
(a worker, a stage, an op type) kept as recorded or set to typical attribute the slowdown.
"""
from __future__ import annotations

import numpy as np

from preflight.diagnose.stragglers_graph import Graph, build
from preflight.diagnose.stragglers_trace import COMPUTE, OpTrace

# types judged by their mean (the work itself varies); the rest are communication, judged by the median
MEAN_TYPES = (*COMPUTE, "gc", "optimizer")
GAP_TOLERANCE_S = 0.01      # an op starting this much before a dependency ended: the model does not fit


def replay(g: Graph, work: np.ndarray, delay: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of every op, ``[op, step, dp]``, from each op's ``work`` and launch ``delay``."""
    start = np.zeros_like(work)
    end = np.zeros_like(work)
    for members, collective, across in zip(g.order, g.collective, g.across_dp):
        for m in members:
            d = g.deps[m]
            if len(d) == 1:
                start[m] = end[d[0]]
            elif d:
                start[m] = end[d].max(axis=0)
            if delay is not None:
                start[m] += delay[m]
        if collective:
            last = start[members].max(axis=0)
            if across:
                last = last.max(axis=1, keepdims=True)
            end[members] = last + work[members]
        else:
            m = members[0]
            end[m] = start[m] + work[m]
    return start, end


def step_times(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per step: last op's end minus first op's start, over every worker."""
    return end.max(axis=(0, 2)) - start.min(axis=(0, 2))


class WhatIf:
    """A trace with its graph, the recorded and the typical work of every op, and the replays on them."""

    def __init__(self, tr: OpTrace, graph: Graph | None = None):
        self.tr = tr
        self.g = graph or build(tr)          # a profiler trace's own graph (stragglers_from_trace), else Megatron's
        self.optype = tr.optype
        self.stage = tr.stage
        end = tr.start + tr.dur
        self.work = tr.dur.copy()                  # recorded: duration, or transfer after the last arrival
        self.clipped_transfers = 0
        for members, collective, across in zip(self.g.order, self.g.collective, self.g.across_dp):
            if collective:
                last = tr.start[members].max(axis=0)
                if across:
                    last = last.max(axis=1, keepdims=True)
                transfer = end[members] - last
                self.clipped_transfers += int((transfer < -GAP_TOLERANCE_S).sum())
                self.work[members] = np.maximum(transfer, 0.0)
        self.delay = np.empty_like(tr.dur)         # launch gaps, as recorded (negative: started early)
        for n, d in enumerate(self.g.deps):
            self.delay[n] = tr.start[n] - (end[d].max(axis=0) if d else 0.0)
        self.early_starts = int((self.delay < -GAP_TOLERANCE_S).sum())
        self.typical = np.empty_like(self.work)
        for t in np.unique(self.optype):
            rows = self.optype == t
            w = self.work[rows]
            if tr.typical_per_op:                  # each op its own work: typical over steps and dp ranks
                self.typical[rows] = (w.mean(axis=(1, 2), keepdims=True) if t in MEAN_TYPES
                                      else np.median(w, axis=(1, 2), keepdims=True))
            else:
                self.typical[rows] = w.mean() if t in MEAN_TYPES else np.median(w)
        self.t_recorded = step_times(tr.start, end)
        self.t_replayed = self.run(self.work, self.delay)
        self.t_real = self.run(self.work)
        self.t_ideal = self.run(self.typical)

    def run(self, work: np.ndarray, delay: np.ndarray | None = None) -> np.ndarray:
        return step_times(*replay(self.g, work, delay))

    # --- the figures ---------------------------------------------------------------------------------
    @property
    def slowdown(self) -> float:
        return float(self.t_real.mean() / self.t_ideal.mean())

    @property
    def launch_slowdown(self) -> float:
        return float(self.t_recorded.mean() / self.t_real.mean())

    @property
    def fidelity(self) -> float:
        """Mean |replayed - recorded| step time over the recorded mean: 0 when the graph explains every start."""
        return float(np.abs(self.t_replayed - self.t_recorded).mean() / self.t_recorded.mean())

    def mask(self, *, stage: int | None = None, dp: int | None = None, optypes=None) -> np.ndarray:
        """Boolean ``[op, 1, dp]`` selecting the ops of a stage, a dp rank, some op types (all given must hold)."""
        m = np.ones((len(self.tr.ops), 1, self.tr.meta.dp_size), dtype=bool)
        if stage is not None:
            m &= (self.stage == stage)[:, None, None]
        if dp is not None:
            m[:, :, np.arange(self.tr.meta.dp_size) != dp] = False
        if optypes is not None:
            m &= np.isin(self.optype, list(optypes))[:, None, None]
        return m

    def alone(self, mask: np.ndarray) -> float:
        """Slowdown left when only the ops in ``mask`` keep their recorded work (paper Eq. 2)."""
        return float(self.run(np.where(mask, self.work, self.typical)).mean() / self.t_ideal.mean())

    def recovered(self, work: np.ndarray) -> float | None:
        """Share of the straggler loss ``T - T_ideal`` a replay with ``work`` wins back (1 = all of it)."""
        loss = self.t_real.mean() - self.t_ideal.mean()
        if loss <= 1e-6 * self.t_ideal.mean():      # nothing to win back: no share
            return None
        return float((self.t_real.mean() - self.run(work).mean()) / loss)

    def fixed(self, mask: np.ndarray) -> float | None:
        """Share recovered by setting the ops in ``mask`` to typical, every other op as recorded."""
        return self.recovered(np.where(mask, self.typical, self.work))
