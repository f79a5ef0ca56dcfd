"""Why the stragglers straggle: one what-if per cause, each removing one kind of variation.

The replay (:mod:`preflight.diagnose.stragglers_replay`) says what the stragglers cost; this module says
which of three causes the loss comes from, by replaying the job with that cause taken away and measuring
the share of the loss ``T - T_ideal`` it wins back. Each works on the forward and backward computes,
where all three causes live, with per-worker means ``m_w`` (per op type, over steps and microbatches),
each stage's pace ``m_s`` (its fastest worker's mean: a worker can be slower than its stage's work needs,
not faster, so slow workers, however many, do not move it) and the job's typical ``m_g`` (the mean of the
stages'):

- **a slow worker** (a GPU with low clocks, a bad link, a noisy neighbour): each worker's compute per
  step over its stage's fastest worker's in that step; its *persistent* factor is that ratio in its good
  steps (the 20th percentile over steps: slow in four steps of five). Sequences of unequal length make a
  worker slow in some steps, not in nearly all. The what-if divides each worker's computes by its factor.
  The paper's own measure M_W (set the slowest 3 % of workers, at least one, to typical durations)
  catches a worker slow in communication too; the cause is named from either.
- **stage imbalance** (a pipeline partition that gives one stage more layers, or the loss and embedding
  on the last stage): scale each stage's computes by ``m_g / m_s``.
- **sequence-length imbalance** (microbatches of unequal token counts, attention quadratic in length):
  every microbatch at its worker's mean. Evidence that it is the sequences and not jitter: a long
  microbatch is long both ways, so the forward and backward durations of the same microbatch correlate
  (``fwd_bwd_correlation``); below 0.5 the variation is called jitter instead.

A cause is named when the job straggles (S above :data:`NAMED_FROM`) and its what-if wins back at least
:data:`SHARE` of the loss; shares can add up to more than 1 (causes overlap) or exceed 1 alone (fixing
the heavy stage beats the average the ideal assumed).
"""
from __future__ import annotations

import math

import numpy as np

from preflight.diagnose.stragglers_replay import WhatIf
from preflight.diagnose.stragglers_trace import COMPUTE

NAMED_FROM = 1.05      # S at or below this: nothing straggles worth naming
SHARE = 0.3            # a cause wins back at least this share of the loss
CORRELATED = 0.5       # forward/backward correlation of the same microbatch: the sequences, not jitter
TOP_WORKERS = 0.03     # M_W: the slowest 3 % of workers (at least one)
M_W_NAMES = 0.5        # M_W alone names a slow worker from half the loss (the paper: "large, ~100 %")


def worker_means(w: WhatIf) -> dict[str, np.ndarray]:
    """Per compute type: the mean work of each op's worker, ``[op, 1, dp]`` (broadcast over steps)."""
    out = {}
    for t in COMPUTE:
        rows = w.optype == t
        m = np.zeros((len(w.tr.ops), 1, w.tr.meta.dp_size))
        for s in range(w.tr.meta.pp_size):
            here = rows & (w.stage == s)
            if here.any() and w.tr.typical_per_op:           # each op its own work: its mean over steps
                m[here] = w.work[here].mean(axis=1, keepdims=True)
            elif here.any():
                m[here] = w.work[here].mean(axis=(0, 1))[None, None, :]
        out[t] = m
    return out


def _scaled(w: WhatIf, factor_of) -> np.ndarray:
    work = w.work.copy()
    for t, m in worker_means(w).items():
        rows = w.optype == t
        if rows.any():                 # a type the trace does not have (a profiler trace: only "compute")
            work[rows] *= factor_of(t, m[rows])
    return work


def stage_typical(m: np.ndarray) -> np.ndarray:
    """A stage's pace from its workers' means ``[op, 1, dp]``: the fastest worker's."""
    return m.min(axis=2, keepdims=True)


def persistent_factor(w: WhatIf) -> np.ndarray:
    """``[stage, dp]``: how much slower than its stage's fastest worker a worker computes in four steps of
    five (1.0: not persistently slow)."""
    pp, dp = w.tr.meta.pp_size, w.tr.meta.dp_size
    out = np.ones((pp, dp))
    comp = np.isin(w.optype, COMPUTE)
    for s in range(pp):
        rows = comp & (w.stage == s)
        if rows.any():
            per_step = w.work[rows].sum(axis=0)                       # [step, dp]
            fastest = per_step.min(axis=1, keepdims=True)
            ratio = np.divide(per_step, fastest, out=np.ones_like(per_step), where=fastest > 0)
            out[s] = np.quantile(ratio, 0.2, axis=0)
    return out


def _without_slow_workers(w: WhatIf, factor: np.ndarray) -> np.ndarray:
    work = w.work.copy()
    comp = np.isin(w.optype, COMPUTE)
    for s in range(w.tr.meta.pp_size):
        rows = comp & (w.stage == s)
        work[rows] /= factor[s][None, None, :]
    return work


def fwd_bwd_correlation(w: WhatIf) -> float | None:
    """Pearson correlation of the forward and backward durations of the same microbatch, each taken from
    its worker's mean (so a slow worker or a heavy stage does not count). None without variation."""
    f, b = [], []
    means = worker_means(w)
    for s in range(w.tr.meta.pp_size):
        rows = {t: np.flatnonzero((w.optype == t) & (w.stage == s)) for t in COMPUTE}
        by_seq = {t: sorted(rows[t], key=lambda i: w.tr.ops[i][2]) for t in COMPUTE}
        if not by_seq[COMPUTE[0]] or len(by_seq[COMPUTE[0]]) != len(by_seq[COMPUTE[1]]):
            continue
        for t, out in zip(COMPUTE, (f, b)):
            ix = by_seq[t]
            out.append((w.work[ix] - means[t][ix]).ravel())
    if not f:
        return None
    f, b = np.concatenate(f), np.concatenate(b)
    if f.std() == 0 or b.std() == 0:
        return None
    return float(np.corrcoef(f, b)[0, 1])


def causes(w: WhatIf, by_worker: list[dict]) -> dict:
    """The three what-ifs, M_W and M_S, and the causes named (largest share first)."""
    meta = w.tr.meta
    factor = persistent_factor(w)
    worker_share = w.recovered(_without_slow_workers(w, factor))

    def stage_factor(t, m):
        if w.tr.typical_per_op:        # each op its own work: scale a stage's whole step to the mean stage's
            tot = _stage_totals(w)
            mg = float(np.mean(list(tot.values())))
            return np.array([mg / tot[s] if tot[s] > 0 else 1.0 for s in w.stage[w.optype == t]])[:, None, None]
        ms = stage_typical(m)
        rows = w.optype == t
        per_stage = {s: float(ms[w.stage[rows] == s].mean()) for s in np.unique(w.stage[rows])}
        mg = float(np.mean(list(per_stage.values())))
        return np.divide(mg, ms, out=np.ones_like(ms), where=ms > 0)

    stage_share = w.recovered(_scaled(w, stage_factor))
    seq_work = w.work.copy()
    for t, m in worker_means(w).items():
        rows = w.optype == t
        seq_work[rows] = np.broadcast_to(m[rows], seq_work[rows].shape)
    seq_share = w.recovered(seq_work)
    corr = fwd_bwd_correlation(w)

    n_top = max(1, math.ceil(len(by_worker) * TOP_WORKERS))
    top = sorted(by_worker, key=lambda r: -r["slowdown_alone"])[:n_top]
    mask = np.zeros((len(w.tr.ops), 1, meta.dp_size), dtype=bool)
    for r in top:
        mask |= w.mask(stage=r["stage"], dp=r["dp_rank"])
    m_w = w.fixed(mask)
    m_s = w.fixed(w.mask(stage=meta.pp_size - 1))

    heavy = _stage_load(w)
    slow = [r for r in sorted(by_worker, key=lambda r: -r["slowdown_alone"]) if r["compute_vs_stage"] >= 1.05]
    named = []
    if w.slowdown > NAMED_FROM:
        share = max(worker_share or 0.0, m_w or 0.0)
        if (worker_share or 0.0) >= SHARE or (m_w or 0.0) >= M_W_NAMES:
            who = slow[:3] or top
            named.append({"cause": "slow worker", "share": share, "where": [
                f"rank {r['rank']} = dp {r['dp_rank']}, stage {r['stage']}, computing {r['compute_vs_stage']:.2f}x its "
                f"stage's fastest worker" for r in who],
                "fix": f"Drain the node of rank {', '.join(str(r['rank']) for r in who)} and run its GPU health checks "
                       "(DCGM diagnostics, clocks and throttle reasons, PCIe/NVLink errors), then restart from the last "
                       "checkpoint on a spare node; exclude the node in Slurm until it passes."})
        if stage_share is not None and stage_share >= SHARE:
            s, load = heavy[0]
            unit = "step" if w.tr.typical_per_op else "microbatch"
            named.append({"cause": "stage imbalance", "share": stage_share, "where": [
                f"stage {s}: {load:.2f}x the mean stage's compute per {unit}"],
                "fix": f"Repartition the pipeline: move layers off stage {s} (it computes {load:.2f}x the mean stage "
                       f"per {unit}; count the loss and embedding as layers of the first and last stage, e.g. "
                       "Megatron's --decoder-first/last-pipeline-num-layers) until every stage computes within 5 % of the mean."})
        if seq_share is not None and seq_share >= SHARE and corr is not None and corr >= CORRELATED:
            named.append({"cause": "sequence-length imbalance", "share": seq_share, "where": [
                f"microbatches vary on every worker; forward and backward of the same microbatch correlate "
                f"({corr:.2f})"],
                "fix": "Balance tokens, not sequences: pack sequences to a fixed token budget per microbatch and "
                       "bucket by length so every dp rank and microbatch gets similar attention work."})
    named.sort(key=lambda c: -c["share"])
    return {"named": named, "worker_share": worker_share, "stage_share": stage_share, "sequence_share": seq_share,
            "fwd_bwd_correlation": corr, "m_w": m_w, "m_s": m_s, "m_w_workers": [r["rank"] for r in top],
            "stage_load": {int(s): float(load) for s, load in heavy}}


def _stage_totals(w: WhatIf) -> dict[int, float]:
    """Each stage's typical compute at its fastest worker's pace: per microbatch (one forward and one backward)
    in a Parquet trace; per step (every compute op) where each op is its own work (a profiler trace)."""
    means = worker_means(w)
    per = {}
    for s in range(w.tr.meta.pp_size):
        total = 0.0
        for t in COMPUTE:
            rows = (w.optype == t) & (w.stage == s)
            if rows.any():
                total += float(stage_typical(means[t][rows]).sum() if w.tr.typical_per_op else means[t][rows][0].min())
        per[s] = total
    return per


def _stage_load(w: WhatIf) -> list[tuple[int, float]]:
    """Each stage's typical compute (``_stage_totals``) over the mean stage's, heaviest first."""
    per = _stage_totals(w)
    mean = np.mean(list(per.values()))
    return sorted(((s, v / mean if mean > 0 else 1.0) for s, v in per.items()), key=lambda x: -x[1])


def compute_vs_stage(w: WhatIf, stage: int, dp: int) -> float:
    """A worker's forward + backward compute per step over its stage's fastest worker's, in four steps of five."""
    return float(persistent_factor(w)[stage, dp])
