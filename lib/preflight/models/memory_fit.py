"""The cheapest change that makes a memory plan fit: every single change (and pairs of different
kinds), each with what it costs in throughput, ranked cheapest first (``cheapest_fit``).

The planner itself is ``preflight.models.memory``; this module only searches over its ``Plan``.
"""
from __future__ import annotations

import itertools
from dataclasses import replace

import pandas as pd

from . import states as S
from .memory import GiB, Plan, fits, total_bytes
from .pipeline import bubble_fraction
from .throughput import recompute_factor


def _pow2_multiples(x: int, limit: int) -> list[int]:
    return [x * 2 ** k for k in range(1, 12) if x * 2 ** k <= limit]


def _candidates(p: Plan, gpus_per_node: int, gpus: int) -> list[tuple]:
    """(category, rank, change, cost, transform) for every applicable single change."""
    c = []
    if not p.sequence_parallel:
        c.append(("sp", 0, "sequence parallel", "free: all-reduce becomes reduce-scatter + all-gather, "
                  "same volume; 3 % faster per layer (Korthikanti Table 4)",
                  lambda q: replace(q, sequence_parallel=True)))
    if p.dp * p.cp > 1:
        for z in (z for z in S.STAGES[p.framework] if z > p.zero_stage):
            cost = ("no extra communication: reduce-scatter + all-gather = one all-reduce "
                    "(Rajbhandari sec. 7.2.1)" if z < 3 else
                    "+50 % data-parallel traffic: weights all-gathered in forward and backward, "
                    "3 psi vs 2 psi (Rajbhandari sec. 7.2.2)")
            name = "distributed optimizer (ZeRO-1)" if p.framework == "megatron" else f"ZeRO-{z}"
            c.append(("zero", (1, 2, 5)[z - 1], name, cost,
                      lambda q, z=z: replace(q, zero_stage=z)))
    if p.recompute == "none" and p.attention == "math":   # flash: selective would drop only the statistics
        extra = recompute_factor("selective", p.params, p.layers, p.hidden, p.seq_len) - 1
        c.append(("rc", 3, "selective recompute", "+4-7 % time per layer (Korthikanti Table 4); the core "
                  f"attention's forward again, 4 L h s / (6 N + 12 L h s) = {extra:.1%} more FLOPs "
                  "(FlashAttention keeps no scores at all: model.attention flash)",
                  lambda q: replace(q, recompute="selective")))
    if p.framework == "ddp":      # plain DDP replicates the model: no tp or pp; sharding means another wrapper
        if p.dp * p.cp > 1:
            c.append(("zero", 5, "FSDP2 full sharding (framework fsdp2, ZeRO-3)", "+50 % data-parallel traffic: "
                      "weights all-gathered in forward and backward (Rajbhandari sec. 7.2.2); fp32 sharded states",
                      lambda q: replace(q, framework="fsdp2", zero_stage=3, bucket_view=False)))
        if p.recompute != "full":
            c.append(("rc", 7, "full recompute", "+33 % compute (one extra forward); measured +39 % per layer "
                      "(Korthikanti Table 4)", lambda q: replace(q, recompute="full")))
        return c
    for i, t in enumerate(x for x in _pow2_multiples(p.tp, gpus_per_node) if p.kv % x == 0):
        c.append(("tp", 4 + i / 10, f"tp={t}", "tensor-parallel all-reduces inside the node every "
                  "layer, smaller GEMMs; dp shrinks", lambda q, t=t: _regrid(q, gpus, tp=t)))
    mbs = p.micro_batch_size
    for i, b in enumerate(sorted({b for b in (mbs // 2, 1) if 1 <= b < mbs and mbs % b == 0}, reverse=True)):
        c.append(("mbs", 6 + i / 10, f"micro_batch_size={b}", f"{p.micro_batch_size // b}x more "
                  "accumulation steps with smaller GEMMs: lower GPU efficiency",
                  lambda q, b=b: replace(q, micro_batch_size=b,
                                         microbatches=q.microbatches * q.micro_batch_size // b)))
    if p.recompute != "full":
        c.append(("rc", 7, "full recompute", "+33 % compute (one extra forward); measured +39 % "
                  "per layer (Korthikanti Table 4)", lambda q: replace(q, recompute="full")))
    for i, s in enumerate(_pow2_multiples(p.pp, 4 * p.pp)):
        if p.layers % s:                  # propose balanced stages only (the planner also takes uneven ones)
            continue
        try:
            q = _regrid(p, gpus, pp=s)
        except ValueError:
            continue
        was, now = (bubble_fraction(x.pp, x.microbatches, x.interleave) for x in (p, q))
        c.append(("pp", 8 + i / 10, f"pp={s}", f"pipeline bubble (p-1)/(v m + p - 1) {was:.0%} -> "
                  f"{now:.0%} of wall time, plus send/recv", lambda q, s=s: _regrid(q, gpus, pp=s)))
    return c


def _regrid(q: Plan, gpus: int, tp: int | None = None, pp: int | None = None) -> Plan:
    """Change tp or pp on a fixed number of GPUs: dp follows, and m so the global batch stays."""
    tp, pp = tp or q.tp, pp or q.pp
    if gpus % (tp * pp * q.cp):
        raise ValueError(f"tp * pp * cp = {tp * pp * q.cp} does not divide gpus = {gpus}")
    dp = gpus // (tp * pp * q.cp)
    if (q.microbatches * q.dp) % dp:
        raise ValueError("global batch not divisible by the new dp")
    return replace(q, tp=tp, pp=pp, dp=dp, microbatches=q.microbatches * q.dp // dp)


def cheapest_fit(plan: Plan, gpu_memory_GB: float, gpus_per_node: int, gpus: int,
                 max_changes: int = 2) -> pd.DataFrame:
    """Candidate changes (one, or up to ``max_changes`` from different kinds) cheapest first.

    Columns: change, plan_bytes, GiB, fits, headroom, cost, order. The first row is the plan as it
    is (order 0); the first row with ``fits`` is the cheapest fix. Cost ranks, cheapest first:
    sequence parallelism, ZeRO-1, ZeRO-2 (free), selective recompute (+4-7 %), more tp within the
    node, ZeRO-3 (+50 % DP traffic), smaller micro-batch, full recompute (+33 %), more pp (bubble).
    A combination ranks by its dearest change, then the next (it costs about as much as its dearest
    change when the others are free). tp and pp change on the same ``gpus``: dp = gpus / (tp pp),
    micro-batches per step scaled to keep the global batch. Invalid or redundant ones are left out.
    """
    for name, val in (("gpus_per_node", gpus_per_node), ("gpus", gpus), ("max_changes", max_changes)):
        if isinstance(val, bool) or int(val) != val or val < 1:
            raise ValueError(f"{name} must be an integer >= 1 (got {val!r})")
    if plan.tp * plan.pp * plan.dp * plan.cp != gpus:
        raise ValueError(f"gpus must equal tp * pp * dp * cp = {plan.tp * plan.pp * plan.dp * plan.cp} (got {gpus})")
    cands = _candidates(plan, gpus_per_node, gpus)
    rows = [((), "none (as planned)", "-", plan)]
    for k in range(1, max_changes + 1):
        for combo in itertools.combinations(cands, k):
            if len({c[0] for c in combo}) < k:
                continue
            try:
                new = _apply(plan, combo)
                if new == _apply(plan, ()) or any(_apply(plan, [c for c in combo if c is not d]) == new
                                                  for d in combo):
                    continue                                   # a change that does nothing here
            except ValueError:
                continue
            rows.append((tuple(sorted((c[1] for c in combo), reverse=True)),
                         " + ".join(c[2] for c in combo), "; ".join(c[3] for c in combo), new))
    rows.sort(key=lambda r: r[0])
    out = []
    for i, (_, change, cost, q) in enumerate(rows):
        ok, head = fits(q, gpu_memory_GB)
        b = total_bytes(q)
        out.append({"change": change, "plan_bytes": b, "GiB": b / GiB, "fits": ok, "headroom": head,
                    "cost": cost, "order": i})
    return pd.DataFrame(out)


def _apply(plan: Plan, combo) -> Plan:
    q = plan
    for c in sorted(combo, key=lambda c: c[0] not in ("tp", "pp")):   # regrid first, then the rest
        q = c[4](q)
    return replace(q, sequence_parallel=q.sequence_parallel and q.tp > 1)   # no effect at tp = 1
