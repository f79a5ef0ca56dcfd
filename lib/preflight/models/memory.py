"""Per-GPU memory of LLM training, term by term, and the cheapest change that makes a plan fit.

Model states (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", SC20, section 3): mixed-precision Adam keeps per parameter 2 bytes of 16-bit
weights, 2 of 16-bit gradients and K = 12 of optimizer state (fp32 master copy, momentum, variance):
16 bytes. ZeRO shards them over the ``dp`` data-parallel ranks: stage 1 the optimizer state, stage 2
also the gradients, stage 3 also the weights (their Fig. 1, 7.5B parameters on 64 ranks: 120, 31.4,
16.6, 1.9 GB). ``precision="fp32"``: 4 + 4 + 8, no master copy. Megatron-LM accumulates gradients in
fp32 (18 bytes per parameter); not modelled here, the paper's 16 is.

Where parameters sit: tp splits every matrix, pp the layers. The input embedding (V h) lives on the
first stage, the output head (another V h unless tied) on the last, both split over tp (Megatron's
vocab-parallel embedding). With pp > 1 and tied embeddings Megatron keeps a copy on the last stage
too, so first and last stage hold the same count::

    (params - E) / (pp tp) + V h / tp       E = V h tied, 2 V h untied; + V h / tp more if pp = 1, untied

Vocabulary padding, biases, position embeddings and the final norm are left out (well under 1 %).

Activations (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", arXiv 2205.05198, section 4, Table 2), one GPT layer, s = seq_len, b = micro-batch, h, a
heads, t = tp, in bytes with 16-bit tensors and 1-byte dropout masks::

    no parallelism            sbh (34 + 5 a s / h)
    tensor parallel           sbh (10 + 24/t + 5 a s / (h t))
    tensor + sequence par.    sbh (34/t + 5 a s / (h t))
    selective recompute       the 5 a s / h terms (attention scores, s^2) dropped
    full recompute            2 sbh (the layer input; / t with sequence parallelism)

Kept exact for fp32 by counting elements: 10 = 4 tensors of sbh (2 norm inputs, QKV and MLP inputs)
x 2 bytes + 2 masks; 24 = 12 tensors split by t; 5 a s^2 b = 2 tensors (softmax, its dropout) + 1
mask. fp32 doubles the tensors, not the masks. FlashAttention never stores the s^2 scores: treat it
as "selective" (same memory, no recompute cost). GeLU MLP of 4h with dropout is assumed; SwiGLU and
GQA differ. Input/output layers (section 4.3): embedding dropout mask sbh per micro-batch in flight
on the first stage (the paper's p), and on the last stage final norm input 2 sbh, output projection
input 2 sbh (each / t with sequence parallelism), fp32 logits 4 s b V / t, for one micro-batch
(GPipe: m).

Micro-batches in flight on a stage (``pipeline.activation_memory_microbatches``): GPipe m, 1F1B
min(p, m) on the first stage, interleaved p (1 + (p-1)/(p v)) for m > p (Korthikanti section 4.2.3);
pp = 1 runs gradient accumulation one micro-batch at a time: 1. The first stage (most micro-batches)
and the last (logits) are both evaluated; the larger total is reported (``terms(p).attrs``).

More tp, ZeRO stage, recompute or sequence parallelism never adds memory, a larger micro-batch
never removes any. More pp usually saves, but not always: GPipe at pp > 1 keeps all m micro-batches
(pp 1 -> 2 can cost m-fold activations), interleaving grows the first stage's share as
L (1 + (p-1)/(p v)), and the p embedding masks in flight can outgrow the weights saved when ZeRO-3
over many ranks leaves little to save (tests/test_memory_models.py bounds each case).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import pandas as pd

from .pipeline import SCHEDULES, activation_memory_microbatches, bubble_fraction

GiB = 2 ** 30
# Allowance, not a measurement: a CUDA context takes ~300-500 MiB, cuBLAS/NCCL workspaces a few hundred
# MiB more, and practitioners report 5-20 % lost to the PyTorch caching allocator's fragmentation.
FRAMEWORK_FIXED_BYTES = 1.0 * GiB
FRAMEWORK_FRACTION = 0.10
RECOMPUTE = ("none", "selective", "full")
PRECISION = {"mixed": (2, 2, 12, 2), "fp32": (4, 4, 8, 4)}   # weights, grads, optimizer, activations
SRC_ZERO = "Rajbhandari et al. 2020 (ZeRO, SC20) sec. 3, Fig. 1"
SRC_ACT = "Korthikanti et al. 2022 (arXiv 2205.05198) sec. 4.1-4.2, Table 2"


@dataclass(frozen=True)
class Plan:
    """Everything the planner needs; checked on construction (ValueError names the field)."""
    params: float
    layers: int
    hidden: int
    heads: int
    vocab: int
    seq_len: int
    micro_batch_size: int = 1
    tp: int = 1
    pp: int = 1
    dp: int = 1
    zero_stage: int = 0
    recompute: str = "none"
    sequence_parallel: bool = False
    schedule: str = "1f1b"
    microbatches: int = 1
    interleave: int = 1
    precision: str = "mixed"
    tied_embeddings: bool = False

    def __post_init__(self):
        for name in ("layers", "hidden", "heads", "vocab", "seq_len", "micro_batch_size", "tp", "pp",
                     "dp", "microbatches", "interleave"):
            val = getattr(self, name)
            if isinstance(val, bool) or int(val) != val or val < 1:
                raise ValueError(f"{name} must be an integer >= 1 (got {val!r})")
        if self.hidden % self.heads:
            raise ValueError(f"heads must divide hidden (hidden={self.hidden}, heads={self.heads})")
        if self.heads % self.tp:
            raise ValueError(f"tp must divide heads (heads={self.heads}, tp={self.tp})")
        if self.layers % (self.pp * self.interleave):
            raise ValueError(f"pp * interleave must divide layers (layers={self.layers}, "
                             f"pp={self.pp}, interleave={self.interleave})")
        for name, allowed in (("zero_stage", (0, 1, 2, 3)), ("recompute", RECOMPUTE),
                              ("schedule", SCHEDULES), ("precision", tuple(PRECISION))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed} (got {getattr(self, name)!r})")
        if (self.schedule == "interleaved") != (self.interleave > 1):
            raise ValueError(f"interleave > 1 goes with schedule='interleaved' only (got "
                             f"{self.schedule!r}, interleave={self.interleave})")
        if self.interleave > 1 and (self.pp < 2 or self.microbatches % self.pp):
            raise ValueError(f"interleaved schedule needs pp >= 2 and microbatches % pp == 0 "
                             f"(got pp={self.pp}, microbatches={self.microbatches})")
        for name in ("sequence_parallel", "tied_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False (got {getattr(self, name)!r})")
        emb = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        if not self.params > emb or math.isinf(self.params):
            raise ValueError(f"params must be finite and exceed the embedding parameters "
                             f"{emb:.4g} (vocab * hidden * {1 if self.tied_embeddings else 2}; "
                             f"got {self.params!r})")


def layer_activation_bytes(seq_len: int, micro_batch_size: int, hidden: int, heads: int, tp: int = 1,
                           sequence_parallel: bool = False, recompute: str = "none",
                           precision: str = "mixed") -> float:
    """Bytes one transformer layer keeps for the backward pass of one micro-batch (Table 2 above)."""
    plan = Plan(params=1e30, layers=1, hidden=hidden, heads=heads, vocab=1, seq_len=seq_len,
                micro_batch_size=micro_batch_size, tp=tp, recompute=recompute,
                sequence_parallel=sequence_parallel, precision=precision)
    return _layer(plan)


def _layer(p: Plan) -> float:
    e = PRECISION[p.precision][3]
    sbh, rep = p.seq_len * p.micro_batch_size * p.hidden, p.tp if p.sequence_parallel else 1
    if p.recompute == "full":
        return e * sbh / rep
    out = sbh * ((4 * e + 2) / rep + 12 * e / p.tp)      # 4 tensors + 2 masks, 12 tensors split by t
    if p.recompute == "none":                             # scores: 2 tensors + 1 mask of a s^2 b
        out += p.heads * p.seq_len ** 2 * p.micro_batch_size * (2 * e + 1) / p.tp
    return out


def _stage_terms(p: Plan, stage: str) -> list[dict]:
    wb, gb, ob, e = PRECISION[p.precision]
    vh = p.vocab * p.hidden
    emb_total = vh * (1 if p.tied_embeddings else 2)
    extra = 2 if (p.pp == 1 and not p.tied_embeddings) else 1
    per_gpu = (p.params - emb_total) / (p.pp * p.tp) + extra * vh / p.tp
    shard = {k: (p.dp if p.zero_stage >= s else 1) for k, s in (("w", 3), ("g", 2), ("o", 1))}
    where = f"(params - {emb_total:.4g}) / (pp tp) + {extra} V h / tp = {per_gpu:.4g} params"
    rows = [("weights", wb * per_gpu / shard["w"], f"{wb} B x {where}" + " / dp" * (shard["w"] > 1)),
            ("gradients", gb * per_gpu / shard["g"], f"{gb} B x params" + " / dp" * (shard["g"] > 1)),
            ("optimizer", ob * per_gpu / shard["o"], f"{ob} B x params" + " / dp" * (shard["o"] > 1))]
    rows = [(t, b, f, SRC_ZERO) for t, b, f in rows]
    k = {"first": 0, "last": p.pp - 1}[stage]
    n = 1.0 if p.pp == 1 else activation_memory_microbatches(p.pp, p.microbatches, p.schedule, k,
                                                             p.interleave)
    per_layer, lps = _layer(p), p.layers // p.pp
    rows.append(("activations", n * lps * per_layer,
                 f"{n:g} micro-batches in flight x {lps} layers x {per_layer:.4g} B/layer "
                 f"({p.recompute} recompute, sp={p.sequence_parallel}, {p.schedule})",
                 SRC_ACT + "; in flight: sec. 4.2.3, Narayanan et al. 2021 sec. 2.2"))
    sbh, rep = p.seq_len * p.micro_batch_size * p.hidden, p.tp if p.sequence_parallel else 1
    out_b, parts = 0.0, []
    if stage == "first":
        out_b += n * sbh / rep
        parts.append(f"embedding dropout mask {n:g} x sbh{'/t' * (rep > 1)}")
    if stage == "last" or p.pp == 1:
        m_out = p.microbatches if (p.schedule == "gpipe" and p.pp > 1) else 1
        out_b += m_out * (2 * e * sbh / rep + 4 * p.seq_len * p.micro_batch_size * p.vocab / p.tp)
        parts.append(f"{m_out} x (norm + output-projection inputs {2 * e} sbh{'/t' * (rep > 1)} "
                     f"+ fp32 logits 4 s b V / t)")
    rows.append(("activations_output", out_b, "; ".join(parts),
                 "Korthikanti et al. 2022 sec. 4.3"))
    rest = sum(r[1] for r in rows)
    rows.append(("framework", FRAMEWORK_FIXED_BYTES + FRAMEWORK_FRACTION * rest,
                 f"{FRAMEWORK_FIXED_BYTES / GiB:g} GiB context/workspaces + "
                 f"{FRAMEWORK_FRACTION:.0%} of the rest (fragmentation)",
                 "allowance: typical practitioner figures (module constants)"))
    return rows


def terms(plan: Plan) -> pd.DataFrame:
    """One row per term (term, bytes, GiB, formula, source) for the most loaded GPU.

    That is the first or the last pipeline stage, whichever totals more (``attrs["stage"]``; "only"
    when pp = 1). ZeRO-3's temporarily gathered layer weights and the backward pass's transient
    buffers are not counted, only the ``framework`` allowance covers them.
    """
    stage, rows = _peak(plan)
    df = pd.DataFrame(rows, columns=["term", "bytes", "formula", "source"])
    df.insert(2, "GiB", df["bytes"] / GiB)
    df.attrs["stage"] = stage
    return df


def _peak(plan: Plan) -> tuple[str, list]:
    if plan.pp == 1:
        return "only", _stage_terms(plan, "first")
    return max((("first", _stage_terms(plan, "first")), ("last", _stage_terms(plan, "last"))),
               key=lambda sr: sum(r[1] for r in sr[1]))


def total_bytes(plan: Plan) -> float:
    """Peak bytes on the most loaded GPU: the sum of ``terms``."""
    return float(sum(r[1] for r in _peak(plan)[1]))


def fits(plan: Plan, gpu_memory_GB: float) -> tuple[bool, float]:
    """Does the plan fit, and the headroom ``1 - total / capacity`` (negative: short by that much).

    GB here is 1e9 bytes, as the name says; an "80 GB" card reports ~85.5e9 bytes (81559 MiB) in
    nvidia-smi, so reading it as 80e9 leaves ~6 % of safety on top of the framework allowance.
    """
    if not gpu_memory_GB > 0:
        raise ValueError(f"gpu_memory_GB must be > 0 (got {gpu_memory_GB})")
    headroom = 1.0 - total_bytes(plan) / (gpu_memory_GB * 1e9)
    return headroom >= 0, headroom


def _pow2_multiples(x: int, limit: int) -> list[int]:
    return [x * 2 ** k for k in range(1, 12) if x * 2 ** k <= limit]


def _candidates(p: Plan, gpus_per_node: int, gpus: int) -> list[tuple]:
    """(category, rank, change, cost, transform) for every applicable single change."""
    c = []
    if not p.sequence_parallel:
        c.append(("sp", 0, "sequence parallel", "free: all-reduce becomes reduce-scatter + all-gather, "
                  "same volume; 3 % faster per layer (Korthikanti Table 4)",
                  lambda q: replace(q, sequence_parallel=True)))
    if p.dp > 1:
        for z in range(p.zero_stage + 1, 4):
            cost = ("no extra communication: reduce-scatter + all-gather = one all-reduce "
                    "(Rajbhandari sec. 7.2.1)" if z < 3 else
                    "+50 % data-parallel traffic: weights all-gathered in forward and backward, "
                    "3 psi vs 2 psi (Rajbhandari sec. 7.2.2)")
            c.append(("zero", (1, 2, 5)[z - 1], f"ZeRO-{z}", cost,
                      lambda q, z=z: replace(q, zero_stage=z)))
    if p.recompute == "none":
        c.append(("rc", 3, "selective recompute", "+4-7 % time per layer (Korthikanti Table 4), "
                  "~s/(6h) more FLOPs; free with FlashAttention",
                  lambda q: replace(q, recompute="selective")))
    for i, t in enumerate(x for x in _pow2_multiples(p.tp, gpus_per_node) if p.heads % x == 0):
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
    if gpus % (tp * pp):
        raise ValueError(f"tp * pp = {tp * pp} does not divide gpus = {gpus}")
    dp = gpus // (tp * pp)
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
    if plan.tp * plan.pp * plan.dp != gpus:
        raise ValueError(f"gpus must equal tp * pp * dp = {plan.tp * plan.pp * plan.dp} (got {gpus})")
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
