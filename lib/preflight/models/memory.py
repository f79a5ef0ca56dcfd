"""Per-GPU memory of LLM training, term by term, and the cheapest change that makes a plan fit.

One GPU holds, for the training step:

- **model states**: weights, gradients and optimizer state, in the layout of the training framework
  (``preflight.models.states``: deepspeed 2 + 2 + 12 bytes per parameter, the ZeRO paper's;
  megatron 2 + 4 + 12; fsdp2 4 + 4 + 8), sharded over data parallelism by ZeRO stage, plus with
  sharded weights the **gathered parameters** of the layers being computed;
- **activations** kept for the backward pass (``preflight.models.activations``: Korthikanti et al.
  2022 generalised to flash / math attention, GELU / SwiGLU, grouped-query attention and dropout),
  per layer, times the layers of a stage, times the micro-batches in flight;
- an **allowance** for the runtime (the ``framework`` row: CUDA context, workspaces, fragmentation).

The cheapest change that makes a plan fit is searched in ``preflight.models.memory_fit``.

Where parameters sit: tp splits every matrix, pp the layers. The input embedding (V h) lives on the
first stage, the output head (another V h unless tied) on the last, both split over tp (Megatron's
vocab-parallel embedding). With pp > 1 and tied embeddings Megatron keeps a copy on the last stage
too, so first and last stage hold the same count::

    (params - E) / (pp tp) + V h / tp       E = V h tied, 2 V h untied; + V h / tp more if pp = 1, untied

Vocabulary padding, biases, position embeddings and the final norm are left out (well under 1 %).

Input/output layers (Korthikanti sec. 4.3): the embedding dropout mask, sbh per micro-batch in
flight on the first stage (the paper's p; none without dropout), and on the last stage the final
norm input and output projection input, 2 e sbh (each / t with sequence parallelism), fp32 logits
4 s b V / t, for one micro-batch (GPipe: m).

Micro-batches in flight on a stage (``pipeline.activation_memory_microbatches``): GPipe m, 1F1B
min(p, m) on the first stage, interleaved p (1 + (p-1)/(p v)) for m > p (Korthikanti section 4.2.3);
pp = 1 runs gradient accumulation one micro-batch at a time: 1. The first stage (most micro-batches)
and the last (logits) are both evaluated; the larger total is reported (``terms(p).attrs``).

Context parallelism (``preflight.models.context``): each of ``cp`` GPUs keeps the activations of
``s / cp`` tokens (every per-token term above, the logits too); the weights are replicated over
``dp x cp`` ranks, so ZeRO shards over all of them.

More tp, ZeRO stage, recompute or sequence parallelism never adds memory, a larger micro-batch
never removes any. More pp usually saves, but not always: GPipe at pp > 1 keeps all m micro-batches
(pp 1 -> 2 can cost m-fold activations), interleaving grows the first stage's share as
L (1 + (p-1)/(p v)), and the p embedding masks in flight can outgrow the weights saved when ZeRO-3
over many ranks leaves little to save (tests/test_memory_models.py bounds each case).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from preflight.core.numfmt import num

from . import activations as A
from . import states as S
from .activations import ATTENTION, MLP, RECOMPUTE
from .moe import Experts
from .pipeline import SCHEDULE_LABELS, SCHEDULES, activation_memory_microbatches

# How a page names each term of the plan (the chart's legend, the chapter's table).
TERM_LABELS = {"weights": "weights", "gradients": "gradients", "optimizer": "optimizer state",
               "activations": "activations (layers)", "activations_output": "activations (embedding, output)",
               "framework": "framework allowance", "fp8_weights": "fp8 weight copies"}

__all__ = ["ATTENTION", "MLP", "RECOMPUTE", "Plan", "fits", "layer_activation_bytes", "terms", "total_bytes"]

GiB = 2 ** 30
# Allowance, not a measurement: a CUDA context takes ~300-500 MiB, cuBLAS/NCCL workspaces a few hundred
# MiB more, and practitioners report 5-20 % lost to the PyTorch caching allocator's fragmentation.
FRAMEWORK_FIXED_BYTES = 1.0 * GiB
FRAMEWORK_FRACTION = 0.10
PRECISIONS = ("mixed", "fp32")
# Bytes per logit at the loss: Megatron's vocab-parallel cross entropy works in one fp32 buffer (the
# logits, reused for their gradient: Korthikanti sec. 4.3's 4 s b V); a plain F.cross_entropy on
# logits.float() (torchtitan, most FSDP2 loops) holds the bf16 logits, the fp32 copy and its fp32
# gradient at the start of the backward: 2 + 4 + 4.
LOGIT_BYTES = {"megatron": 4, "deepspeed": 4, "fsdp2": 10, "ddp": 10}
FP8_WEIGHT_BYTES = 2                # fp8 weight + fp8 transpose per weight held for compute
SRC_ACT = "Korthikanti et al. 2022 (arXiv 2205.05198) sec. 4.1-4.2, Table 2, generalised (models/activations.py)"


@dataclass(frozen=True)
class Plan:
    """Everything the planner needs; checked on construction (ValueError names the field).

    ``ffn_hidden`` None = 4 hidden; ``kv_heads`` None = heads; ``shard_group_gpus`` None = ZeRO/FSDP
    shards over every data-parallel rank, else over the ranks inside that many GPUs (HSDP: a node)."""
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
    attention: str = "flash"
    mlp: str = "gelu"
    ffn_hidden: int | None = None
    kv_heads: int | None = None
    dropout: float = 0.1
    framework: str = "deepspeed"
    shard_group_gpus: int | None = None
    fp8: bool = False               # FP8 GEMMs (Transformer Engine): an fp8 weight copy and its transpose
    moe: Experts | None = None      # mixture-of-experts (``preflight.models.moe``): routed experts over ep
    ep: int = 1
    etp: int | None = None          # expert tensor parallelism; None: tp (Megatron's default)
    cp: int = 1                     # context parallelism: each GPU keeps s / cp tokens' activations
    grad_dtype: str | None = None   # the gradients' dtype (states.layout); None: the framework's default
    bucket_view: bool = False       # DDP's gradient_as_bucket_view (one fp32 gradient copy, not two)
    recompute_modules: tuple[str, ...] | None = None   # with selective, Megatron's --recompute-modules; None: core_attn
    fp8_activation_cache: bool = False   # DeepSeek-V3's fp8 activation storage (FP8_CACHE_BYTES)
    qk_head_dim: int | None = None  # MLA's query/key and value sizes per head (None: hidden / heads)
    v_head_dim: int | None = None
    mla_latent: int | None = None   # MLA's compressed q + kv + rope widths per token (kept under mla_up_proj)

    def __post_init__(self):
        for name in ("layers", "hidden", "heads", "vocab", "seq_len", "micro_batch_size", "tp", "pp",
                     "dp", "microbatches", "interleave", "ffn_hidden", "kv_heads", "shard_group_gpus", "cp"):
            val = getattr(self, name)
            if val is None and name in ("ffn_hidden", "kv_heads", "shard_group_gpus"):
                continue
            if isinstance(val, bool) or int(val) != val or val < 1:
                raise ValueError(f"{name} must be an integer >= 1 (got {val!r})")
        if self.hidden % self.heads:
            raise ValueError(f"heads must divide hidden (hidden={self.hidden}, heads={self.heads})")
        if self.heads % self.kv:
            raise ValueError(f"kv_heads must divide heads (heads={self.heads}, kv_heads={self.kv})")
        if self.kv % self.tp:
            raise ValueError(f"tp must divide heads and kv_heads (heads={self.heads}, kv_heads={self.kv}, "
                             f"tp={self.tp})")
        # uneven stages and chunks are accepted (Megatron's --decoder-first/last-pipeline-num-layers and
        # --account-for-embedding-in-pipeline-split, torchtitan's splits): Llama 3.1 405B's 126 layers on
        # 16 x 4 chunks; the fullest stage holds ceil(layers / pp) of them
        # (Megatron's --account-for-embedding-in-pipeline-split gives the embedding and the loss a slot each:
        # 126 layers + 2 on 16 x 8 chunks)
        if self.pp > self.layers or self.pp * self.interleave > self.layers + 2:
            raise ValueError(f"every stage and chunk needs a layer: pp x interleave <= layers + 2 (the embedding's "
                             f"and the loss's slots; layers={self.layers}, pp={self.pp}, interleave={self.interleave})")
        for name, allowed in (("recompute", RECOMPUTE), ("schedule", SCHEDULES), ("precision", PRECISIONS),
                              ("attention", ATTENTION), ("mlp", MLP)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed} (got {getattr(self, name)!r})")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage must be one of (0, 1, 2, 3) (got {self.zero_stage!r})")
        S.check_stage(self.framework, self.zero_stage)
        if isinstance(self.dropout, bool) or not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be a probability, 0 <= dropout < 1 (got {self.dropout!r})")
        if (self.schedule == "interleaved") != (self.interleave > 1):
            raise ValueError(f"interleave > 1 goes with schedule='interleaved' only (got "
                             f"{self.schedule!r}, interleave={self.interleave})")
        if self.interleave > 1 and (self.pp < 2 or self.microbatches % self.pp):
            raise ValueError(f"interleaved schedule needs pp >= 2 and microbatches % pp == 0 "
                             f"(got pp={self.pp}, microbatches={self.microbatches})")
        if self.grad_dtype not in (None, *S.GRAD_BYTES):
            raise ValueError(f"grad_dtype must be one of {tuple(S.GRAD_BYTES)} or None (got {self.grad_dtype!r})")
        if self.cp > 1 and (self.seq_len % self.cp or self.attention != "flash"):
            raise ValueError(f"context parallelism needs cp dividing seq_len and flash attention (cp={self.cp}, "
                             f"seq_len={self.seq_len}, attention={self.attention!r})")
        for name in ("sequence_parallel", "tied_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False (got {getattr(self, name)!r})")
        emb = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        if not self.params > emb or math.isinf(self.params):
            raise ValueError(f"params must be finite and exceed the embedding parameters "
                             f"{emb:.4g} (vocab * hidden * {1 if self.tied_embeddings else 2}; "
                             f"got {self.params!r})")

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or 4 * self.hidden

    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def local_seq(self) -> int:
        """Tokens of a sequence on one GPU: s / cp."""
        return self.seq_len // self.cp

    @property
    def shard(self) -> int:
        """Ranks of one sharding group: every rank holding the same weights (dp x cp: context-parallel
        ranks hold the same weights as data-parallel ones), or those inside ``shard_group_gpus`` (ranks are
        laid out tp fastest, then cp, then dp: a node of g GPUs holds g / tp of them)."""
        if self.shard_group_gpus is None:
            return self.dp * self.cp
        return math.gcd(self.dp * self.cp, max(1, self.shard_group_gpus // self.tp))


def layer_activation_bytes(seq_len: int, micro_batch_size: int, hidden: int, heads: int, tp: int = 1,
                           sequence_parallel: bool = False, recompute: str = "none",
                           precision: str = "mixed", attention: str = "flash", mlp: str = "gelu",
                           ffn_hidden: int | None = None, kv_heads: int | None = None,
                           dropout: float = 0.1) -> float:
    """Bytes one transformer layer keeps for the backward pass of one micro-batch on one GPU
    (``preflight.models.activations``; attention="math" with the defaults is Korthikanti's Table 2)."""
    plan = Plan(params=1e30, layers=1, hidden=hidden, heads=heads, vocab=1, seq_len=seq_len,
                micro_batch_size=micro_batch_size, tp=tp, recompute=recompute, sequence_parallel=sequence_parallel,
                precision=precision, attention=attention, mlp=mlp, ffn_hidden=ffn_hidden, kv_heads=kv_heads,
                dropout=dropout)
    return _layer(plan)


# Megatron's --recompute-modules (with --recompute-granularity selective; None: ["core_attn"], [] nothing): what
# each drops from a layer's kept tensors (megatron/core/transformer/transformer_config.py, transformer_layer.py,
# multi_latent_attention.py, moe/experts.py). core_attn: the attention's saved state (flash keeps only its
# output and statistics; recomputed, the statistics go). layernorm: the outputs of the norms that are modules
# of their own -- a MoE layer's pre-MLP norm (the router reads it) and MLA's input norm; Transformer Engine
# fuses a dense layer's norms into the next linear layer (LayerNormLinear), where the flag changes nothing.
# mla_up_proj: MLA's q, k, v, recomputed from the compressed latents (kept). moe_act: the routed experts'
# activation output, recomputed from the up projection's (kept; shared experts untouched). mlp: a dense
# layer's MLP; moe: a MoE layer's experts and routed tokens. Their recompute FLOPs are in the step model
# (``throughput.selective_flops``).
# Megatron's fused SwiGLU (weighted_bias_swiglu) keeps the up projection's output (2 f) and the down
# projection's input (f): 3 tensors of s b f, where the unfused PyTorch path (torchtitan) keeps 4.
MEGATRON_SWIGLU_TENSORS = 3
# DeepSeek-V3's low-precision storage (report sec. 3.3.3): the linear layers' inputs cached in fp8 (1 byte),
# the attention output (the output projection's input) in E5M6 (12 bits), the MoE SwiGLU's input in fp8.
# Without it the inputs stay 16-bit: torchao's Float8 saves the high-precision input, and Megatron with
# current scaling tells the output projection to save its bf16 input (attention.py); conservative elsewhere.
FP8_CACHE_BYTES, E5M6_BYTES = 1, 1.5


def _adjust(parts: list[tuple[str, float, str]], p: Plan, moe_layer: bool) -> list[tuple[str, float, str]]:
    """One layer's parts under the plan's recompute modules, attention widths and activation storage."""
    if p.recompute in ("full", "op_selective"):
        return parts
    e, out = A.ELEMENT_BYTES[p.precision], []
    mods = A.recomputed(p.recompute, p.recompute_modules)
    g = FP8_CACHE_BYTES if p.fp8_activation_cache else e          # a linear layer's kept input
    mla = p.qk_head_dim is not None
    sb = p.local_seq * p.micro_batch_size
    d = p.hidden / p.heads
    for name, nbytes, split in parts:
        if name.startswith("norm inputs (2), QKV input, MLP input"):
            out.append(("norm inputs (2)", nbytes / 2, split))
            if not ("layernorm" in mods and mla):
                out.append(("QKV input (input norm output)", nbytes / 4 * g / e, split))
            if not ("layernorm" in mods and moe_layer):       # the router keeps it 16-bit
                out.append(("MLP input (pre-MLP norm output)", nbytes / 4 * (e if moe_layer else g) / e, split))
        elif name.startswith("q, k, v"):
            if "mla_up_proj" in mods and p.mla_latent:
                out.append(("MLA latents (q, kv compressed, rope)", g * sb * p.mla_latent, "sp"))
            elif mla:
                out.append(("q, k, v (MLA widths)", e * sb * p.heads * (2 * p.qk_head_dim + (p.v_head_dim or d)), split))
            else:
                out.append((name, nbytes, split))
        elif name.startswith("attention output"):
            width = p.heads * (p.v_head_dim or d)
            out.append((name, sb * width * (E5M6_BYTES if p.fp8_activation_cache else e), split))
            if p.recompute == "selective" and "core_attn" not in mods and p.attention == "flash":
                out.append(("softmax statistics (fp32 logsumexp)", A.STATS_BYTES * p.heads * sb, "tp"))
        elif name.startswith("MLP ("):
            out += _mlp_parts(nbytes, split, p, moe_layer, mods, e, g)
        else:
            out.append((name, nbytes, split))
    return out


def mlp_tensors(p: Plan) -> int:
    """Tensors of ``s b f`` a layer's MLP keeps: Megatron's fused SwiGLU 3, else ``activations.MLP_TENSORS``."""
    return MEGATRON_SWIGLU_TENSORS if p.framework == "megatron" and p.mlp == "swiglu" else A.MLP_TENSORS[p.mlp]


def _mlp_parts(nbytes: float, split: str, p: Plan, moe_layer: bool, mods: set, e: float, g: float) -> list:
    """The MLP's kept tensors: ``nbytes`` is A.layer_parts' ``N e s b f`` (f = ffn, or (k + s) f_e for MoE)."""
    if ("moe" if moe_layer else "mlp") in mods:
        return []
    n = mlp_tensors(p)
    per_tensor = nbytes / A.MLP_TENSORS[p.mlp] / e                 # s b f elements
    kept = lambda share: per_tensor * share * ((n - 1) * e + g)     # the down projection's input is a linear input
    if not moe_layer:
        return [(f"MLP ({p.mlp}): {n} tensors of s b ffn", kept(1.0), split)]
    k, sh = p.moe.top_k, p.moe.shared
    routed, shared = k / (k + sh), sh / (k + sh)
    out = []
    if "moe_act" in mods:      # the up projection's output kept (2 f for SwiGLU, f for GeLU), fp8 under the cache
        up = 2 if p.mlp == "swiglu" else 1
        out.append(("MoE experts: up projection output kept, activation recomputed (moe_act)",
                    per_tensor * routed * up * g, split))
    else:
        out.append((f"MoE experts ({p.mlp}): {n} tensors of s b k f_e", kept(routed), split))
    if shared:
        out.append((f"shared experts ({p.mlp}): {n} tensors of s b f_e", kept(shared), split))
    return out


def layer_parts(p: Plan) -> list[tuple[str, float, str]]:
    """``activations.layer_parts`` for the plan's layer (before tp), under its recompute modules, attention
    widths and activation storage (``_adjust``). A
    mixture-of-experts layer keeps its MLP's tensors for the ``top_k + shared`` experts each token visits
    (``(k + s) f_e`` in place of ``ffn``), averaged with the dense layers over the stage."""
    dense = _adjust(A.layer_parts(p.local_seq, p.micro_batch_size, p.hidden, p.heads, p.kv, p.ffn, p.mlp,
                                  p.attention, p.dropout, p.recompute, p.precision), p, False)
    if not p.moe:
        return dense
    moe = _adjust(A.layer_parts(p.local_seq, p.micro_batch_size, p.hidden, p.heads, p.kv,
                                (p.moe.top_k + p.moe.shared) * p.moe.expert_ffn, p.mlp, p.attention, p.dropout,
                                p.recompute, p.precision), p, True)
    w = p.moe.moe_layers / p.layers
    a, b = {n: (x, sp) for n, x, sp in dense}, {n: (x, sp) for n, x, sp in moe}
    parts = [(n, (1 - w) * a.get(n, (0.0, ""))[0] + w * b.get(n, (0.0, ""))[0], (a.get(n) or b[n])[1])
             for n in dict.fromkeys([*a, *b])]                  # a part only one kind of layer keeps: weighted
    if "moe" not in A.recomputed(p.recompute, p.recompute_modules):
        # the routed tokens (Megatron's token dispatcher, DeepEP): each token's k copies of h permuted into
        # the experts' inputs (a linear layer's input: fp8 under the fp8 cache). Megatron-Core multiplies the
        # router's probabilities inside the experts' activation (TEGroupedMLP's weighted_bias_swiglu; the
        # legacy GroupedMLP's activation_func_with_probs), so the combine is an unweighted unpermute (every
        # dispatcher: all-gather, all-to-all, DeepEP, HybridEP) and keeps no expert output.
        sbh = p.local_seq * p.micro_batch_size * p.hidden
        g = FP8_CACHE_BYTES if p.fp8_activation_cache else A.ELEMENT_BYTES[p.precision]
        parts.append(("MoE: permuted expert inputs (k sbh)", w * p.moe.top_k * g * sbh, "sp"))
    return parts


def _layer(p: Plan) -> float:
    return A.layer_bytes(layer_parts(p), p.tp, p.sequence_parallel)


def _stage_terms(p: Plan, stage: str) -> list[tuple]:
    e = A.ELEMENT_BYTES[p.precision]
    vh = p.vocab * p.hidden
    emb_total = vh * (1 if p.tied_embeddings else 2)
    extra = 2 if (p.pp == 1 and not p.tied_embeddings) else 1
    routed = p.moe.routed_params(p.hidden) if p.moe else 0.0
    per_gpu = (p.params - routed - emb_total) / (p.pp * p.tp) + extra * vh / p.tp
    where = f"((params - {num(emb_total)}) / (pp tp) + {extra} V h / tp = {num(per_gpu)} params)"
    src = S.SOURCES[p.framework]
    rows = [(t, b, f"{p.framework}: {f}", src)
            for t, b, f in S.state_rows(p.framework, p.precision, p.zero_stage, per_gpu, p.shard, where, p.grad_dtype,
                                        p.bucket_view)]
    if routed:      # the routed experts: split by pp x ep x etp, their states sharded over the ranks holding each
        etp = p.etp or p.tp
        experts_gpu = routed / (p.pp * p.ep * etp)
        e_rows = S.state_rows(p.framework, p.precision, p.zero_stage, experts_gpu, max(1, p.shard * p.tp // (p.ep * etp)),
                              f"{num(experts_gpu)} expert params (routed / (pp ep etp))", p.grad_dtype)
        rows = [(t, b + eb, f"{f}; experts: {ef}", s_) for (t, b, f, s_), (_, eb, ef) in zip(rows, e_rows)]
        per_gpu += experts_gpu
    lps = -(-p.layers // p.pp)          # the fullest stage (uneven splits: 61 layers on 16 stages hold 4)
    gathered = S.gathered_bytes(p.precision, p.zero_stage, p.shard,
                                S.layer_params(p.hidden, p.heads, p.kv, p.ffn, p.mlp), p.tp, lps)
    if gathered:
        rows.append(("gathered_params", *gathered, src + "; prefetch of the next layer"))
    if p.fp8:       # per weight held for compute: the whole share, or (ZeRO-3) the gathered layers only
        held = per_gpu if not gathered else gathered[0] / A.ELEMENT_BYTES[p.precision]
        rows.append(("fp8_weights", FP8_WEIGHT_BYTES * held,
                     f"{FP8_WEIGHT_BYTES} B x {num(held)} weights held (an fp8 copy and its fp8 transpose)",
                     "Transformer Engine: FP8 GEMMs cast each weight to fp8 and keep its transpose for the "
                     "backward (per step, with fp8_model_params off)"))
    k = {"first": 0, "last": p.pp - 1}[stage]
    n = 1.0 if p.pp == 1 else activation_memory_microbatches(p.pp, p.microbatches, p.schedule, k,
                                                             p.interleave)
    per_layer = _layer(p)
    rows.append(("activations", n * lps * per_layer,
                 f"{n:g} micro-batch{'es' * (n != 1)} in flight x {lps} layers x {num(per_layer)} B/layer "
                 f"({p.attention} attention, {p.mlp.upper() if p.mlp == 'gelu' else 'SwiGLU'} MLP, "
                 f"{'no' if p.recompute == 'none' else p.recompute} recompute, "
                 f"{'sequence parallelism' if p.sequence_parallel else 'no sequence parallelism'}, "
                 f"{f'cp={p.cp}: s/cp = {p.local_seq} tokens, ' if p.cp > 1 else ''}"
                 f"{SCHEDULE_LABELS.get(p.schedule, p.schedule)}; "
                 f"per layer {A.formula(p.attention, p.mlp, p.dropout, p.recompute)})",
                 SRC_ACT + "; in flight: sec. 4.2.3, Narayanan et al. 2021 sec. 2.2"))
    sbh, rep = p.local_seq * p.micro_batch_size * p.hidden, p.tp if p.sequence_parallel else 1
    out_b, parts = 0.0, []
    if stage == "first" and p.dropout > 0:
        out_b += n * sbh / rep
        parts.append(f"embedding dropout mask {n:g} x sbh{'/t' * (rep > 1)}")
    if stage == "last" or p.pp == 1:
        m_out = p.microbatches if (p.schedule == "gpipe" and p.pp > 1) else 1
        lb = LOGIT_BYTES[p.framework]
        out_b += m_out * (2 * e * sbh / rep + lb * p.local_seq * p.micro_batch_size * p.vocab / p.tp)
        parts.append(f"{m_out} x (norm + output-projection inputs {2 * e} sbh{'/t' * (rep > 1)} "
                     + ("+ fp32 logits 4 s b V / t)" if lb == 4 else
                        f"+ logits {lb} s b V / t: 16-bit, their fp32 copy and its gradient)"))
    rows.append(("activations_output", out_b, "; ".join(parts) or "nothing kept (no dropout)",
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
    when pp = 1). Terms: weights, gradients, optimizer, gathered_params (only with sharded weights:
    ZeRO-3 / FSDP2 over more than one rank), activations, activations_output, framework. The backward
    pass's transient buffers are not counted, only the ``framework`` allowance covers them.
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

    GB here is 1e9 bytes, as the name says. An H100 "80GB" shows 81,559 MiB (85.5e9 B) in nvidia-smi:
    pass that (``core.hardware.Chip.capacity_bytes / 1e9``), not 80 GiB (85.9e9 B, more than the card has).
    """
    if not gpu_memory_GB > 0:
        raise ValueError(f"gpu_memory_GB must be > 0 (got {gpu_memory_GB})")
    headroom = 1.0 - total_bytes(plan) / (gpu_memory_GB * 1e9)
    return headroom >= 0, headroom
