"""Fitting the alpha-beta (latency-bandwidth) ring model to a measured all-reduce sweep.

The model is ``preflight.models.comm.ring_allreduce_time``: ``t = 2(n-1) alpha + 2(n-1)/n * S / B``.
A sweep (``preflight.bench.allreduce``) gives measured times per message size; the fit gives the
latency ``alpha`` and the bus bandwidth ``B`` of that machine, and how far the model is off per size.
"""
from __future__ import annotations

from preflight.models.comm import ring_allreduce_time


def fit_error_by_size(sizes_bytes, times_s, ranks: int, alpha_s: float,
                      bandwidth_GBps: float) -> list[float]:
    """Signed relative error of the ring model at each size: ``predicted / measured - 1``.

    Positive: the model is too pessimistic there (predicts more time than measured).
    Use it to judge a fit on data it was not fitted to, e.g. one cluster's fit against another run.
    """
    return [ring_allreduce_time(s, ranks, bandwidth_GBps, alpha_s) / t - 1.0
            for s, t in zip(sizes_bytes, times_s)]


def fit_alpha_beta(sizes_bytes, times_s, ranks: int) -> dict:
    """Fit ``t = 2(n-1) alpha + 2(n-1)/n * S / B`` to measured all-reduce times (least squares).

    The error minimised is *relative*, ``sum((model_i - t_i) / t_i)^2`` (weights ``1/t``): sizes in a
    sweep span five orders of magnitude, and plain least squares would let the largest message
    decide everything, leaving the latency term (which is what small buckets pay) to chance.

    Constraints: ``alpha >= 0`` and ``B > 0``. When the unconstrained intercept comes out negative
    (times grow faster than linearly, e.g. a cache or protocol switch), ``alpha`` is set to 0 and
    the slope refitted (``constrained: "alpha=0"``); that is the constrained optimum, since the
    objective is a convex quadratic. Times that do not grow with size leave no bandwidth to fit:
    ValueError (measure up to larger messages; from ~16 MB the bandwidth term dominates).

    Returns ``alpha_s``, ``bandwidth_GBps`` (GB = 1e9 B, the "bus" bandwidth ``B`` of the ring
    model, comparable with nccl-tests' busbw), ``ranks``, ``rel_error`` (signed, per size, see
    ``fit_error_by_size``), ``max_rel_error`` and ``median_rel_error`` (of the absolute values),
    ``constrained`` (None or "alpha=0").
    """
    sizes, times = [float(s) for s in sizes_bytes], [float(t) for t in times_s]
    if len(sizes) != len(times):
        raise ValueError(f"{len(sizes)} sizes but {len(times)} times")
    if ranks < 2:
        raise ValueError(f"ranks must be >= 2 to fit a ring all-reduce (got {ranks})")
    if len(set(sizes)) < 2:
        raise ValueError("need at least two distinct message sizes")
    if min(sizes) <= 0 or min(times) <= 0:
        raise ValueError("sizes and times must be > 0")
    c, f = 2.0 * (ranks - 1), 2.0 * (ranks - 1) / ranks
    # rows divided by t_i: [c / t_i, f S_i / t_i] . [alpha, 1/B] ~ 1; columns scaled to unit norm
    # so the 2x2 normal equations stay well conditioned (1/B ~ 1e-9 s/B next to alpha ~ 1e-4 s).
    u = [c / t for t in times]
    v = [f * s / t for s, t in zip(sizes, times)]
    nu, nv = sum(x * x for x in u) ** 0.5, sum(x * x for x in v) ** 0.5
    u, v = [x / nu for x in u], [x / nv for x in v]
    suv, su, sv = sum(a * b for a, b in zip(u, v)), sum(u), sum(v)
    det = 1.0 - suv * suv
    alpha = (su - suv * sv) / det / nu if det > 1e-15 else -1.0
    inv_b = (sv - suv * su) / det / nv if det > 1e-15 else 0.0
    constrained = None
    if alpha < 0:
        alpha, inv_b, constrained = 0.0, sv / nv, "alpha=0"      # unit-norm column: sum(v^2) = 1
    if inv_b <= 0:
        raise ValueError("all-reduce times do not grow with message size: no bandwidth to fit "
                         "(include messages of 16 MB or more)")
    bandwidth = 1.0 / inv_b / 1e9
    rel = fit_error_by_size(sizes, times, ranks, alpha, bandwidth)
    absr = sorted(abs(e) for e in rel)
    mid = len(absr) // 2
    median = absr[mid] if len(absr) % 2 else 0.5 * (absr[mid - 1] + absr[mid])
    return {"alpha_s": alpha, "bandwidth_GBps": bandwidth, "ranks": ranks, "rel_error": rel,
            "max_rel_error": absr[-1], "median_rel_error": median, "constrained": constrained}
