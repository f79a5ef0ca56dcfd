"""Zero-bubble pipeline parallelism, ZB-H1: split the backward in two and fill the drain with the half
nobody waits for.

Qi, Wan, Huang, Lin 2023, "Zero Bubble Pipeline Parallelism" (ICLR 2024, arXiv 2401.10241). A layer's
backward is two computations: **B**, the gradient with respect to its *input* (the previous stage
waits for it), and **W**, the gradient with respect to its *weights* (only the optimizer step
needs it). 1F1B runs them as one op, so the drain waits for W on every stage. ZB-H1, the paper's
first handcrafted schedule, sends B at once and runs W later, in what would have been the bubble.

The schedule (stage ``i`` of ``p``, micro-batches ``0..m-1``; the paper's handcrafted ZB-H1, and the
order torch's ``ScheduleInterleavedZeroBubble`` runs with one stage per rank, op for op, as the tests
check): for ``x = 0, 1, ..., m + p - 2`` stage ``i`` runs, in this order and each only if its
micro-batch exists (``0 <= index < m``)::

    F[x],  B[x - (p - 1 - i)],  W[x - (p - 1)]

so ``p - 1 - i`` warm-up forwards as in 1F1B, then F, B, W in step, with the W of each micro-batch
delayed by ``i`` slots, and ``i`` trailing W's in the drain. Every stage holds at most ``p``
micro-batches of activations (F done, W not yet), the peak of 1F1B's first stage: ZB-H1 costs no
more peak memory than 1F1B (the later stages hold more than under 1F1B, up to that same peak).

Bubble per stage with equal stages (the paper's handcrafted schedules; communication free)::

    1F1B (B and W fused):  (p - 1)(t_F + t_B + t_W)
    ZB-H1:                 (p - 1)(t_F + t_B - t_W)     a third of 1F1B's when t_F = t_B = t_W

``zb_h1_timeline`` is a real simulation (``pipeline.simulate``: each op waits for its stage and its
dependencies); the tests check it reproduces the paper's bubble exactly for t_F = t_B = t_W (the
paper's assumption for its handcrafted schedules) and, more generally, whenever ``t_W <= t_F``,
``t_W <= t_B`` and ``m >= p`` (the pipe fills); outside that the simulation is the answer and the
formula an underestimate. It is never slower than 1F1B in any case tested (p <= 6, m <= 12). ZB-H2
(twice the activation memory, plus the paper's optimizer post-validation) and ZB-V (two chunks per
device in a V) remove the rest of the bubble; they are not simulated here.
"""
from __future__ import annotations

import pandas as pd

from .pipeline import _check_pmv, simulate, timeline_bubble

SCHEDULE = "zb-h1"


def _check_times(t_f, t_b, t_w) -> None:
    if min(t_f, t_b, t_w) < 0:
        raise ValueError(f"t_f, t_b, t_w must be >= 0 (got {t_f}, {t_b}, {t_w})")


def zb_h1_order(p: int, m: int, stage: int) -> list[tuple[str, int, int]]:
    """The (kind, micro-batch, chunk) ops stage ``stage`` runs, in ZB-H1's order (see the module)."""
    _check_pmv(p, m)
    if not 0 <= stage < p:
        raise ValueError(f"stage must be in [0, {p - 1}] (got {stage})")
    order = []
    for x in range(m + p - 1):
        for kind, j in (("F", x), ("B", x - (p - 1 - stage)), ("W", x - (p - 1))):
            if 0 <= j < m:
                order.append((kind, j, 0))
    return order


def zb_h1_deps(kind: str, s: int, j: int, p: int) -> list[tuple]:
    """What an op waits for: F[j] on the previous stage's F[j]; B[j] on its own F[j] and the next
    stage's B[j] (the input gradient it receives); W[j] on its own B[j] only (nothing waits for W)."""
    if kind == "F":
        return [("F", s - 1, j, 0)] if s > 0 else []
    if kind == "B":
        return [("F", s, j, 0)] + ([("B", s + 1, j, 0)] if s < p - 1 else [])
    if kind == "W":
        return [("B", s, j, 0)]
    raise ValueError(f"kind must be F, B or W (got {kind!r})")


def _per_stage(name: str, t, p: int) -> list:
    """A time given once (every stage) or as ``p`` values (one per stage), as a list of p."""
    values = list(t) if isinstance(t, (list, tuple)) else [t] * p
    if len(values) != p or min(values) < 0:
        raise ValueError(f"{name} must be >= 0, one value or {p} (one per stage) (got {t})")
    return values


def zb_h1_timeline(p: int, m: int, t_f=1.0, t_b=1.0, t_w=1.0, stage_scale=None) -> pd.DataFrame:
    """Simulate one batch under ZB-H1: one row per op (stage, microbatch, chunk, kind F/B/W, start, end),
    the columns of ``pipeline.schedule_timeline``. ``t_f``, ``t_b``, ``t_w``: forward, input-gradient
    and weight-gradient time of one micro-batch on one stage (1F1B's backward is ``t_b + t_w``), each
    one number or p of them (measured per stage: the first stage's B is nearly free when its input is
    data, which needs no gradient); ``stage_scale``: p multipliers (1.5 = that stage is 1.5x slower)."""
    _check_pmv(p, m)
    t = {k: _per_stage(name, x, p) for k, name, x in (("F", "t_f", t_f), ("B", "t_b", t_b), ("W", "t_w", t_w))}
    scale = [1] * p if stage_scale is None else list(stage_scale)
    if len(scale) != p or min(scale) <= 0:
        raise ValueError(f"stage_scale needs {p} multipliers > 0 (got {stage_scale})")
    df = simulate([zb_h1_order(p, m, s) for s in range(p)],
                  lambda kind, s, j, c: zb_h1_deps(kind, s, j, p),
                  lambda kind, s: t[kind][s] * scale[s], f"ZB-H1 with p={p}, m={m}")
    df.attrs.update(p=p, m=m, v=1, schedule=SCHEDULE)
    return df


def bubble_time(p: int, t_f: float = 1.0, t_b: float = 1.0, t_w: float = 1.0,
                schedule: str = SCHEDULE) -> float:
    """Idle time per stage in one batch, the paper's formulas: 1F1B ``(p-1)(t_F+t_B+t_W)``, ZB-H1
    ``(p-1)(t_F+t_B-t_W)`` (exact for ``t_W <= min(t_F, t_B)``; see the module)."""
    _check_pmv(p, 1)
    _check_times(t_f, t_b, t_w)
    if schedule == "1f1b":
        return (p - 1) * (t_f + t_b + t_w)
    if schedule == SCHEDULE:
        return (p - 1) * (t_f + t_b - t_w)
    raise ValueError(f"schedule must be '1f1b' or {SCHEDULE!r} (got {schedule!r})")


def bubble_fraction(p: int, m: int, t_f: float = 1.0, t_b: float = 1.0, t_w: float = 1.0,
                    schedule: str = SCHEDULE) -> float:
    """Share of the wall time each stage idles: ``bubble / (m (t_F+t_B+t_W) + bubble)``.

    Equal times: ZB-H1 ``(p-1) / (3m + p-1)`` against 1F1B's ``(p-1) / (m + p-1)``; p=4, m=8: 11.1 %
    against 27.3 %. Needs ``m >= p``: with fewer micro-batches the pipe never fills and the formula
    does not hold (``zb_h1_timeline`` gives the real figure)."""
    _check_pmv(p, m)
    if schedule == SCHEDULE and m < p:
        raise ValueError(f"the formula needs m >= p (got m={m}, p={p}); simulate with zb_h1_timeline")
    idle = bubble_time(p, t_f, t_b, t_w, schedule)
    work = m * (t_f + t_b + t_w)
    return idle / (work + idle) if work + idle > 0 else 0.0


def bubble_equal_times(p: int, m: int) -> float:
    """ZB-H1's idle share with t_F = t_B = t_W: the paper's ``(p-1) / (3m + p-1)`` when the pipe fills
    (m >= p), the simulation otherwise (fewer micro-batches than stages: the formula does not hold)."""
    if m >= p:
        return bubble_fraction(p, m)
    return timeline_bubble(zb_h1_timeline(p, m))


def activation_memory_microbatches(p: int, m: int, stage: int = 0) -> int:
    """Micro-batches of activations stage ``stage`` holds at its peak under ZB-H1 (forwards done whose
    W has not run; a micro-batch whose B ran holds less, counted whole here): ``min(p, m)`` on every
    stage, 1F1B's first-stage peak."""
    _check_pmv(p, m)
    if not 0 <= stage < p:
        raise ValueError(f"stage must be in [0, {p - 1}] (got {stage})")
    return min(p, m)
