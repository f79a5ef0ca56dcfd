"""Pipeline parallelism: the bubble, a schedule simulator, and cutting layers into stages by time.

Notation (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", arXiv 2104.04473): ``p`` stages, ``m`` micro-batches per batch, ``v`` model
chunks per device (interleaved schedule; ``v = 1`` for GPipe and 1F1B), ``t_f``/``t_b`` the forward
and backward time of one micro-batch on one stage. Filling and draining the pipe costs
``(p-1)(t_f+t_b)/v`` of idle time on every stage, against ``m (t_f+t_b)`` of useful work::

    bubble / ideal   = (p-1) / (v m)            (the paper's "bubble time fraction")
    bubble / total   = (p-1) / (v m + p - 1)    (GPipe's form, Huang et al. 2019, arXiv 1811.06965)

For p = 4, m = 8: 3/8 = 37.5 % of the ideal time, 3/11 = 27.3 % of the wall time. The commonly quoted
form is Narayanan et al.'s ``(p-1)/m`` (over the ideal time); the field report's ``(p-1)/(m p)`` = 9.4 %
is wrong for these schedules (see ``wrong_bubble``). The simulator below
reproduces ``(p-1)/(v m + p - 1)`` exactly for balanced stages, for any ratio ``t_b / t_f``.

Stages are rarely balanced: the slowest one sets the pace (pitfalls brief, section 4). Cut layers
into stages by measured time (``partition_by_time``, exact), not by count.
"""
from __future__ import annotations

import pandas as pd

SCHEDULES = ("gpipe", "1f1b", "interleaved")
SCHEDULE_LABELS = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "interleaved 1F1B", "zb-h1": "ZB-H1"}


def _check_pmv(p: int, m: int, v: int = 1) -> None:
    for name, val in (("p (stages)", p), ("m (micro-batches)", m), ("v (chunks per device)", v)):
        if int(val) != val or val < 1:
            raise ValueError(f"{name} must be an integer >= 1 (got {val})")
    if v > 1 and m % p:
        raise ValueError(f"interleaved schedule (v={v}) needs m % p == 0 as in Megatron-LM "
                         f"(got m={m}, p={p})")


def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    """Share of the TOTAL (wall) time each stage sits idle: ``(p-1) / (v m + p - 1)``. 0 when p = 1."""
    _check_pmv(p, m, v)
    return (p - 1) / (v * m + p - 1)


def bubble_over_ideal(p: int, m: int, v: int = 1) -> float:
    """Bubble time divided by ideal (bubble-free) time: ``(p-1) / (v m)`` (Narayanan et al. 2021)."""
    _check_pmv(p, m, v)
    return (p - 1) / (v * m)


def wrong_bubble(p: int, m: int) -> float:
    """The popular but wrong estimate ``(p-1) / (m p)``, kept so the playbook can show the error.

    Why it is wrong: the ``p-1`` idle slots are counted in units of one stage's work on one
    micro-batch, but they are divided by ``p m``, as if the run lasted ``p m`` such slots. That is
    the work of the *whole pipeline* (p stages x m micro-batches), not the wall time of one stage,
    which is ``m + p - 1`` slots. Per-stage idle time over whole-pipeline work: units mixed, bubble
    understated by about a factor ``p``.

    Worked example, p = 4, m = 8, each slot one forward+backward of one micro-batch on one stage:
    every stage works 8 slots and waits 3 (fill and drain), wall time 11 slots. Idle share 3/11 =
    27.3 % (``bubble_fraction``), 3/8 = 37.5 % of the ideal time (``bubble_over_ideal``); the
    formula gives 3/32 = 9.4 %. It happens to equal the interleaved schedule's bubble over ideal
    time with ``v = p`` chunks per device, ``(p-1)/(v m)``, which plain schedules do not get.
    """
    _check_pmv(p, m)
    return (p - 1) / (m * p)


def activation_memory_microbatches(p: int, m: int, schedule: str, stage: int = 0, v: int = 1) -> float:
    """Micro-batches of activations a stage holds at its peak (unit: one micro-batch through the
    stage's whole layer share; an interleaved chunk counts 1/v).

    * GPipe: ``m`` on every stage (all forwards run before any backward).
    * 1F1B: ``min(p - stage, m)``; stage 0 holds ``p``, independent of ``m`` (Narayanan et al. 2021,
      section 2.2.1): ``p - stage - 1`` warm-up forwards, then one forward before each backward.
    * Interleaved (Megatron-LM's warm-up of ``2 (p - stage - 1) + (v-1) p`` chunk forwards, plus one
      in steady state; all ``m v`` forwards first when ``m == p``): ``min(that + 1, m v) / v``. For
      stage 0 with m > p that is ``p + (p-1)/v = p (1 + (p-1)/(p v))``, the factor Korthikanti et
      al. 2022 (arXiv 2205.05198) give for the interleaved schedule: a little more than 1F1B.
    ``schedule_timeline`` reproduces all three (count F minus B done on a stage).
    """
    _check_pmv(p, m, v)
    if not 0 <= stage < p:
        raise ValueError(f"stage must be in [0, {p - 1}] (got {stage})")
    if schedule == "gpipe":
        return float(m)
    if schedule == "1f1b":
        return float(min(p - stage, m))
    if schedule == "interleaved":
        chunks = m * v if m == p else min(2 * (p - stage - 1) + (v - 1) * p + 1, m * v)
        return chunks / v
    raise ValueError(f"schedule must be one of {SCHEDULES} (got {schedule!r})")


# --- schedule simulation -------------------------------------------------------------------------

def _stage_order(p: int, m: int, schedule: str, v: int, s: int) -> list[tuple[str, int, int]]:
    """The (kind, micro-batch, chunk) sequence stage ``s`` executes, in its schedule's order."""
    if schedule == "gpipe":
        return [("F", j, 0) for j in range(m)] + [("B", j, 0) for j in range(m)]
    if schedule == "1f1b":
        w = min(p - s - 1, m)
        order = [("F", j, 0) for j in range(w)]
        for k in range(m - w):
            order += [("F", w + k, 0), ("B", k, 0)]
        return order + [("B", j, 0) for j in range(m - w, m)]
    # interleaved: Megatron-LM forward_backward_pipelining_with_interleaving. Virtual micro-batch k
    # walks chunk-major groups of p micro-batches; backwards visit chunks in reverse.
    total = m * v

    def chunk(k: int, forward: bool) -> int:
        c = (k % (p * v)) // p
        return c if forward else v - 1 - c

    def micro(k: int) -> int:
        return (k // (p * v)) * p + k % p

    w = total if m == p else min(2 * (p - s - 1) + (v - 1) * p, total)
    order = [("F", micro(k), chunk(k, True)) for k in range(w)]
    for k in range(total - w):
        order += [("F", micro(k + w), chunk(k + w, True)), ("B", micro(k), chunk(k, False))]
    return order + [("B", micro(k), chunk(k, False)) for k in range(total - w, total)]


def _deps(kind: str, s: int, j: int, c: int, p: int, v: int) -> list[tuple]:
    """Ops that must finish first. Chunk c on stage s is virtual stage ``c p + s``."""
    if kind == "F":
        if s > 0:
            return [("F", s - 1, j, c)]
        return [("F", p - 1, j, c - 1)] if c > 0 else []
    deps = [("F", s, j, c)]
    if s < p - 1:
        deps.append(("B", s + 1, j, c))
    elif c < v - 1:
        deps.append(("B", 0, j, c + 1))
    return deps


def schedule_timeline(p: int, m: int, schedule: str = "1f1b", v: int = 1, t_fwd: float = 1.0,
                      t_bwd: float = 2.0, stage_scale=None) -> pd.DataFrame:
    """Simulate one batch: a DataFrame with one row per op (stage, microbatch, chunk, kind, start, end).

    ``t_fwd``/``t_bwd``: time of one micro-batch through a stage's whole layer share; an interleaved
    chunk op takes ``t / v``. ``stage_scale``: p multipliers (1.5 = that stage is 1.5x slower).
    Communication is free; ``fractions.Fraction`` times give exact arithmetic. Each stage runs its ops
    one at a time in its schedule's order (GPipe:
    all F then all B; 1F1B: ``p - s - 1`` warm-up forwards, alternate, cool-down; interleaved:
    Megatron-LM's order), each as soon as the stage is free and its dependencies are done: F of
    micro-batch j after F of j on the previous (virtual) stage, B of j after B of j on the next one
    and after its own F. A dependency that can never be met raises RuntimeError.
    """
    _check_pmv(p, m, v)
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES} (got {schedule!r})")
    if (schedule == "interleaved") != (v > 1):
        raise ValueError(f"v > 1 goes with schedule='interleaved' only (got {schedule!r}, v={v})")
    if t_fwd < 0 or t_bwd < 0:
        raise ValueError(f"t_fwd and t_bwd must be >= 0 (got {t_fwd}, {t_bwd})")
    scale = [1] * p if stage_scale is None else list(stage_scale)
    if len(scale) != p or min(scale) <= 0:
        raise ValueError(f"stage_scale needs {p} multipliers > 0 (got {stage_scale})")
    orders = [_stage_order(p, m, schedule, v, s) for s in range(p)]
    df = simulate(orders, lambda kind, s, j, c: _deps(kind, s, j, c, p, v),
                  lambda kind, s: (t_fwd if kind == "F" else t_bwd) / v * scale[s],
                  f"schedule {schedule!r} with p={p}, m={m}, v={v}")
    df.attrs.update(p=p, m=m, v=v, schedule=schedule)
    return df


def simulate(orders, deps, duration, label: str = "schedule") -> pd.DataFrame:
    """Run per-stage op lists against their dependencies: the list scheduler every schedule here uses.

    ``orders[s]``: the (kind, micro-batch, chunk) ops stage ``s`` runs, in order, one at a time.
    ``deps(kind, s, j, c)``: the (kind, stage, micro-batch, chunk) ops that must end first.
    ``duration(kind, s)``: how long the op takes. Each op starts when its stage is free and its last
    dependency has ended (communication is free). A stage whose next op waits on an op that can
    never run (a cycle between stages' orders) raises RuntimeError naming ``label``.
    """
    p = len(orders)
    nxt, free, done, rows = [0] * p, [0] * p, {}, []
    while len(rows) < sum(len(o) for o in orders):
        progress = False
        for s in range(p):
            while nxt[s] < len(orders[s]):
                kind, j, c = orders[s][nxt[s]]
                need = deps(kind, s, j, c)
                if any(d not in done for d in need):
                    break
                start = max([free[s]] + [done[d] for d in need])
                end = start + duration(kind, s)
                done[(kind, s, j, c)] = free[s] = end
                rows.append({"stage": s, "microbatch": j, "chunk": c, "kind": kind,
                             "start": start, "end": end})
                nxt[s] += 1
                progress = True
        if not progress:
            raise RuntimeError(f"{label} deadlocks")
    return pd.DataFrame(rows).sort_values(["start", "stage"], ignore_index=True)


def timeline_bubble(df: pd.DataFrame) -> float:
    """Idle share of a timeline: ``sum_s idle_s / (p * makespan)``, idle within [0, makespan]."""
    p = df.attrs.get("p", int(df["stage"].max()) + 1)
    makespan = df["end"].max()
    busy = (df["end"] - df["start"]).sum()
    return (p * makespan - busy) / (p * makespan) if makespan > 0 else 0.0


# --- cutting layers into stages ------------------------------------------------------------------

def _check_times(times, p: int) -> list[float]:
    t = [float(x) for x in times]
    if not t:
        raise ValueError("times is empty: need one time per layer")
    if any(not x >= 0 or x == float("inf") for x in t):
        raise ValueError("times must be finite and >= 0")
    if int(p) != p or not 1 <= p <= len(t):
        raise ValueError(f"p must be an integer in [1, {len(t)}] (one layer per stage at least; got {p})")
    return t


def _check_parts(parts, n: int) -> None:
    """Every layer 0..n-1 exactly once, each stage a non-empty contiguous run, stages in order."""
    flat = [i for part in parts for i in part]
    if any(len(part) == 0 for part in parts):
        raise ValueError("a stage holds no layer")
    if sorted(flat) != list(range(n)):
        missing = sorted(set(range(n)) - set(flat))
        raise ValueError(f"every layer must be placed exactly once (missing {missing}, "
                         f"{len(flat)} placements for {n} layers)")
    if flat != list(range(n)):
        raise ValueError("stages must be contiguous runs of layers, in order")


def partition_by_count(n: int, p: int) -> list[list[int]]:
    """Equal layer counts; when p does not divide n the first ``n % p`` stages get one more."""
    if int(p) != p or not 1 <= p <= n:
        raise ValueError(f"p must be an integer in [1, n={n}] (got {p})")
    q, r = divmod(n, p)
    bounds = [s * q + min(s, r) for s in range(p + 1)]     # stage s starts after s*q + min(s, r)
    return [list(range(bounds[s], bounds[s + 1])) for s in range(p)]


def partition_by_time(times, p: int) -> list[list[int]]:
    """Contiguous split into exactly p non-empty stages with the smallest bottleneck (max stage sum).

    Exact dynamic programming, O(p n^2): ``best[k][j]`` = smallest bottleneck placing the first j
    layers on k stages = ``min_i max(best[k-1][i], sum(times[i:j]))``. Stage sums are accumulated
    left to right, as ``bottleneck`` does, so ties compare equal. Among equal optima the earliest
    cut is kept. A layer heavier than the rest together gets a stage alone.
    """
    t = _check_times(times, p)
    n = len(t)
    seg = [[0.0] * (n + 1) for _ in range(n + 1)]        # seg[i][j] = t[i] + ... + t[j-1]
    for i in range(n):
        for j in range(i + 1, n + 1):
            seg[i][j] = seg[i][j - 1] + t[j - 1]
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(p + 1)]
    cut = [[0] * (n + 1) for _ in range(p + 1)]
    best[0][0] = 0.0
    for k in range(1, p + 1):
        for j in range(k, n - (p - k) + 1):
            for i in range(k - 1, j):
                cand = max(best[k - 1][i], seg[i][j])
                if cand < best[k][j]:
                    best[k][j], cut[k][j] = cand, i
    parts, j = [], n
    for k in range(p, 0, -1):
        i = cut[k][j]
        parts.append(list(range(i, j)))
        j = i
    parts.reverse()
    _check_parts(parts, n)
    return parts


def bottleneck(times, parts) -> float:
    """Time of the slowest stage (sums accumulated left to right); it sets the pipeline's pace."""
    t = [float(x) for x in times]
    _check_parts(parts, len(t))
    return max(sum(t[i] for i in part) for part in parts)


def partition_table(times, parts, names=None) -> pd.DataFrame:
    """One row per stage: stage, layers (count), first, last (names if given), time, share of total."""
    t = [float(x) for x in times]
    _check_parts(parts, len(t))
    if names is not None and len(names) != len(t):
        raise ValueError(f"{len(names)} names for {len(t)} layers")
    label = (lambda i: names[i]) if names is not None else (lambda i: i)
    total = sum(t)
    rows = []
    for s, part in enumerate(parts):
        st = sum(t[i] for i in part)
        rows.append({"stage": s, "layers": len(part), "first": label(part[0]), "last": label(part[-1]),
                     "time": st, "share": st / total if total > 0 else 0.0})
    return pd.DataFrame(rows)


def predicted_throughput(times, parts, m: int, microbatch_size: int) -> float:
    """Samples/s of a 1F1B pipeline: ``m b / ((m + p - 1) * bottleneck)``.

    ``times``: per-layer forward+backward seconds for one micro-batch. The bottleneck stage runs
    ``m`` micro-batches plus ``p - 1`` slots of fill/drain at its own pace; with balanced stages this
    is exact (``bubble_fraction``), with unequal ones slightly pessimistic (faster stages fill faster).
    """
    _check_pmv(len(parts), m)
    if microbatch_size < 1:
        raise ValueError(f"microbatch_size must be >= 1 (got {microbatch_size})")
    slow = bottleneck(times, parts)
    if slow <= 0:
        raise ValueError("all layer times are 0: no throughput to predict")
    return m * microbatch_size / ((m + len(parts) - 1) * slow)


def partition_gain(times, p: int) -> float:
    """Speed-up of cutting by time over cutting by count: ``bottleneck(count) / bottleneck(time)``."""
    t = _check_times(times, p)
    by_time = bottleneck(t, partition_by_time(t, p))
    by_count = bottleneck(t, partition_by_count(len(t), p))
    return by_count / by_time if by_time > 0 else 1.0
