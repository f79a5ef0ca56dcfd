"""Activation memory of one Transformer layer: the bytes autograd keeps for the backward pass.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", arXiv
2205.05198, sec. 4, Table 2) count a Megatron GPT layer in 16-bit with 1-byte dropout masks as
``sbh (34 + 5 a s / h)`` bytes (s sequence, b micro-batch, h hidden, a heads). That layer is one
choice of four; this module counts the layer tensor by tensor so that each choice shows:

- **attention** ``math`` (``softmax(q k^T) v`` written out, the paper's case) keeps the softmax
  output of a s^2 b elements, and with dropout its 1-byte mask and the dropped probabilities:
  the ``5 a s^2 b`` bytes. ``flash`` (FlashAttention, ``F.scaled_dot_product_attention``'s fused
  kernels, cuDNN / Transformer Engine) never stores an s x s matrix: it keeps q, k, v, the output
  and the softmax statistics (logsumexp, fp32, a s b values) and recomputes the scores in backward.
  Its attention dropout is regenerated from the RNG seed, so no mask is kept either.
- **mlp** ``gelu``: ``h -> ffn -> h``; GELU keeps its input and fc2 its input (2 tensors of s b ffn).
  ``swiglu`` (Llama): gate and up projections, ``silu(gate) * up``, down projection: SiLU keeps the
  gate, the product keeps silu(gate) and up, the down projection keeps the product: 4 tensors.
- **kv_heads** (grouped-query attention, GQA): K and V have ``kv_heads`` heads, ``r = kv_heads /
  heads`` of Q's size. Flash kernels take them as they are; the math path (Megatron's unfused
  attention, Hugging Face's eager one) expands them to all heads before ``q k^T`` and saves the
  expanded copies, so there GQA saves parameters, not activations.
- **dropout** ``p > 0`` keeps a 1-byte mask per dropped element (two residual branches per layer,
  the attention probabilities on the math path); ``p = 0`` (Llama-style) keeps none.

One layer, e bytes per element (2 in mixed precision, 4 in fp32), d = 1 with dropout else 0, f =
ffn hidden size, t = tp. Parts marked (sp) are replicated over tensor parallelism and split by t
only with sequence parallelism; the rest is split by t::

    norm inputs (2), QKV input, MLP input           4 e sbh                      (sp)
    dropout masks after attention and MLP           2 d sbh                      (sp)
    q, k, v                                         e sbh (1 + 2 r)   flash, or any selective
                                                    3 e sbh           math (K, V expanded)
    attention output (projection input)             e sbh
    softmax statistics (flash)                      4 a s b           fp32 logsumexp
    scores (math)                                   a s^2 b (e + d (e + 1))
    MLP                                             2 e s b f (gelu)  |  4 e s b f (swiglu)

Korthikanti's layer (math, gelu, f = 4h, r = 1, dropout, e = 2): 10 sbh replicated + 24 sbh split
+ 5 a s^2 b: ``sbh (10 + 24/t + 5 a s / (h t))``, their Table 2. Recompute: ``selective``
checkpoints the core attention (scores or flash kernel): only its q, k, v inputs stay, no s^2 and
no statistics; ``full`` keeps the layer input, e sbh (/t with sequence parallelism); ``op_selective``
(torchtitan's op-level policy) keeps the block input, the flash output and statistics and every other
matmul's output (``_op_selective``). With flash,
selective recompute saves only the statistics: FlashAttention already is the selective recompute.

Left out, as the paper does: LayerNorm's mean and rstd (s b values each, two per norm: about
8 / (34 h) of a layer), RNG states (a few bytes). The reference model
(``preflight.harness.gptref``) saves exactly these parts; ``preflight.bench.memory`` counts them.
"""
from __future__ import annotations

ATTENTION = ("flash", "math")
MLP = ("gelu", "swiglu")
RECOMPUTE = ("none", "selective", "op_selective", "full")
MLP_MATMULS = {"gelu": 1, "swiglu": 2}    # projections h -> ffn (fc1; gate and up)
ELEMENT_BYTES = {"mixed": 2, "fp32": 4}   # activations: 16-bit in mixed precision; masks are 1 byte
STATS_BYTES = 4                           # flash's logsumexp is fp32 in every kernel
MLP_TENSORS = {"gelu": 2, "swiglu": 4}    # tensors of s b ffn kept by the MLP
# Megatron's --recompute-modules, what its selective recompute can run again (transformer_config.py); the
# memory model (``memory._adjust``) and the step model (``throughput.selective_flops``) read them through
# :func:`recomputed`.
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "moe_act", "mlp", "moe")


def recomputed(recompute: str, modules: tuple[str, ...] | None) -> frozenset[str]:
    """The modules a layer runs again: under selective recompute ``modules`` (None: Megatron's default,
    core_attn; (): nothing), under full every one of them, else none."""
    if recompute == "full":
        return frozenset(RECOMPUTE_MODULES)
    if recompute == "selective":
        return frozenset(("core_attn",) if modules is None else modules)
    return frozenset()


def layer_parts(seq_len: int, micro_batch_size: int, hidden: int, heads: int, kv_heads: int,
                ffn_hidden: int, mlp: str = "gelu", attention: str = "flash", dropout: float = 0.1,
                recompute: str = "none", precision: str = "mixed") -> list[tuple[str, float, str]]:
    """The parts one layer keeps for one micro-batch without parallelism: (part, bytes, split),
    split = "sp" (replicated over tp; split by t only with sequence parallelism) or "tp" (split by t).
    Inputs are trusted: ``preflight.models.memory.Plan`` validates them."""
    e, d = ELEMENT_BYTES[precision], 1 if dropout > 0 else 0
    s, b, h, a = seq_len, micro_batch_size, hidden, heads
    sbh, r = s * b * h, kv_heads / heads
    if recompute == "full":
        return [("layer input (full recompute)", e * sbh, "sp")]
    if recompute == "op_selective":
        return _op_selective(e, s, b, h, a, r, ffn_hidden, mlp)
    parts = [("norm inputs (2), QKV input, MLP input", 4 * e * sbh, "sp")]
    if d:
        parts.append(("dropout masks after attention and MLP (1 byte)", 2 * sbh, "sp"))
    expanded = attention == "math" and recompute == "none"
    parts.append(("q, k, v" + (" (k, v expanded to all heads)" if expanded else ""),
                  e * sbh * (3 if expanded else 1 + 2 * r), "tp"))
    parts.append(("attention output (projection input)", e * sbh, "tp"))
    if recompute == "none" and attention == "flash":
        parts.append(("softmax statistics (fp32 logsumexp)", STATS_BYTES * a * s * b, "tp"))
    if recompute == "none" and attention == "math":
        parts.append(("scores: softmax output" + (", its dropout mask, dropped probabilities" if d else ""),
                      a * s * s * b * (e + d * (e + 1)), "tp"))
    parts.append((f"MLP ({mlp}): {MLP_TENSORS[mlp]} tensors of s b ffn", MLP_TENSORS[mlp] * e * s * b * ffn_hidden,
                  "tp"))
    return parts


def _op_selective(e, s, b, h, a, r, f, mlp) -> list[tuple[str, float, str]]:
    """torchtitan's op-level selective checkpointing (``selective_ac_option: op``, its
    ``_apply_ac_to_transformer_block``): inside each block, only the outputs of the ops on its save list
    are kept, the flash attention's (output and logsumexp) and **every other matmul's** (the policy skips
    each second ``aten.mm``); the rest is recomputed. Counted as half of the block's matmul outputs (q,
    k, v, output projection, the MLP's projections up and down) plus the block input and the attention's
    output and statistics."""
    sbh = s * b * h
    mm = h * (1 + 2 * r) + h + MLP_MATMULS[mlp] * f + h          # per token: q k v, o, up (and gate), down
    return [("block input (op-level selective)", e * sbh, "sp"),
            ("attention output and statistics (flash, saved)", e * sbh + STATS_BYTES * a * s * b, "tp"),
            ("every other matmul output (saved)", e * s * b * mm / 2, "tp")]


def layer_bytes(parts: list[tuple[str, float, str]], tp: int = 1, sequence_parallel: bool = False) -> float:
    """Bytes of ``layer_parts`` on one GPU of a tensor-parallel group."""
    rep = tp if sequence_parallel else 1
    return sum(nbytes / (rep if split == "sp" else tp) for _, nbytes, split in parts)


def formula(attention: str, mlp: str, dropout: float, recompute: str) -> str:
    """The per-layer formula in the docstring's symbols, for messages and tables."""
    if recompute == "full":
        return "e sbh (/t with sp)"
    if recompute == "op_selective":
        return "e sbh [/t with sp] + [e sbh + 4 a s b + e s b (matmul outputs) / 2] / t"
    d = dropout > 0
    rep = "(4 e" + (" + 2" if d else "") + ") sbh"
    qkv = "3 e sbh" if attention == "math" and recompute == "none" else "e sbh (1 + 2 r)"
    out = f"{rep} [/t with sp] + [{qkv} + e sbh"
    if recompute == "none":
        out += " + 4 a s b" if attention == "flash" else (" + (2 e + 1) a s^2 b" if d else " + e a s^2 b")
    return out + f" + {MLP_TENSORS[mlp]} e s b f] / t"
