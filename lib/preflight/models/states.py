"""Model states per GPU: weights, gradients and optimizer state, as each training framework keeps them.

Bytes per parameter with Adam, (weights, gradients, optimizer state)::

    deepspeed  mixed  2 + 2 + 12 = 16   ZeRO paper (Rajbhandari et al. 2020, sec. 3): 16-bit weights and
                                        gradients; fp32 master copy, momentum, variance (K = 12);
                                        2 + 4 + 12 with fp32 gradients (grad_accum_dtype, grad_dtype fp32)
    megatron   mixed  2 + 4 + 12 = 18   Megatron-LM accumulates gradients in fp32 "main grads"
                                        (docs/source/api-guide/dist_optimizer.md: 18 bytes; with
                                        --use-distributed-optimizer 6 + 12/d; 2 + 2 + 12 with
                                        --grad-reduce-in-bf16)
    fsdp2      mixed  4 + 4 +  8 = 16   PyTorch FSDP2 ``fully_shard`` with MixedPrecisionPolicy(
                                        param_dtype=bf16, reduce_dtype=fp32; without reduce_dtype the
                                        reduction runs in bf16, the policy's docstring): the sharded parameters
                                        are the fp32 ones (no separate master copy), fp32 gradients,
                                        Adam's m and v; bf16 copies exist only for gathered layers
    ddp        mixed  4 + 8 +  8 = 20   PyTorch DDP with torch.autocast (AMP): fp32 parameters, their fp32
                                        .grad and DDP's fp32 bucket copy of it, Adam's m and v; 4 + 4 + 8
                                        = 16 with gradient_as_bucket_view=True (.grad is a view of the bucket)
    any        fp32   4 + 4 +  8 = 16

Sharding over the d data-parallel ranks of a sharding group (``zero_stage``): 1 the optimizer
state, 2 also the gradients, 3 also the weights. What each framework offers: deepspeed ZeRO 0-3;
megatron 0 or 1 (1 = the distributed optimizer: the 12 bytes sharded, the 2 + 4 not: 6 + 12/d);
fsdp2 only 3 (``fully_shard`` shards all three). The sharding group is every data-parallel rank,
or with HSDP (FSDP2's 2-D device mesh; DeepSpeed's hpZ / MiCS) the ranks inside one node,
replicated across nodes: d = the data-parallel ranks per node.

**Gathered parameters.** With sharded weights (stage 3), each layer's parameters are all-gathered,
unsharded and in compute precision (bf16), just before its forward and again before its backward,
and freed after. With prefetching the next layer is gathered while the current one computes: two
layers' worth, ``2 x 2 B x params_per_layer / tp`` (FSDP2's default prefetch of one layer;
DeepSpeed prefetches by bucket size, ``stage3_prefetch_bucket_size``, of the same order for
billion-parameter layers). The unsharded gradients of the layer in backward (bf16, then an fp32
copy for the fp32 reduce-scatter) are transients of the same size, left to the framework allowance.

**Parameters per layer** (matrices only; biases and norms are under 0.1 %)::

    attention   Q and O: h x h each;  K and V: h x (h kv_heads / heads) each   (GQA: smaller K, V)
    MLP         gelu: 2 matrices h x ffn;  swiglu: 3 (gate, up, down)

Whole model: ``layers x per layer + V h`` (tied embeddings) or ``+ 2 V h`` (untied output head).
"""
from __future__ import annotations

FRAMEWORKS = ("deepspeed", "megatron", "fsdp2", "ddp")
# (weights, gradients, optimizer) bytes per parameter, by framework and precision
LAYOUT = {("deepspeed", "mixed"): (2, 2, 12), ("megatron", "mixed"): (2, 4, 12), ("fsdp2", "mixed"): (4, 4, 8),
          ("ddp", "mixed"): (4, 8, 8),
          ("deepspeed", "fp32"): (4, 4, 8), ("megatron", "fp32"): (4, 4, 8), ("fsdp2", "fp32"): (4, 4, 8),
          ("ddp", "fp32"): (4, 8, 8)}
DDP_BUCKET_VIEW_SAVES = 4                # B/param: gradient_as_bucket_view=True makes .grad a view of the bucket
STAGES = {"deepspeed": (0, 1, 2, 3), "megatron": (0, 1), "fsdp2": (3,), "ddp": (0,)}
GRAD_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def layout(framework: str, precision: str = "mixed", grad_dtype: str | None = None,
           bucket_view: bool = False) -> tuple[int, int, int]:
    """(weights, gradients, optimizer) bytes per parameter, the gradients held in the dtype they are reduced
    in (``training.grad_dtype``) where the framework keeps them so: DeepSpeed's gradients follow the model
    dtype unless ``data_types.grad_accum_dtype: fp32`` (then fp32 on the wire too); Megatron's main grads
    are fp32 unless ``--grad-reduce-in-bf16``. FSDP2's sharded gradients follow its fp32 parameters
    whatever ``reduce_dtype`` puts on the wire. ``grad_dtype`` None: the table's default."""
    w, g, o = LAYOUT[framework, precision]
    if framework == "ddp" and bucket_view:
        g -= DDP_BUCKET_VIEW_SAVES
    if grad_dtype is not None and precision == "mixed" and framework in ("deepspeed", "megatron"):
        g = GRAD_BYTES[grad_dtype]
    return w, g, o
SHARDED_FROM = {"weights": 3, "gradients": 2, "optimizer": 1}    # ZeRO stage that shards each term
GATHERED_LAYERS = 2                      # the layer computing and the one being prefetched
COMPUTE_BYTES = {"mixed": 2, "fp32": 4}  # a gathered (unsharded) parameter in compute precision
SOURCES = {"deepspeed": "Rajbhandari et al. 2020 (ZeRO, SC20) sec. 3, Fig. 1",
           "megatron": "Megatron-LM distributed optimizer docs (dist_optimizer.md): 18 B/param, 6 + 12/d",
           "fsdp2": "PyTorch FSDP2 docs (fully_shard, MixedPrecisionPolicy)",
           "ddp": "PyTorch DDP docs (DistributedDataParallel: gradient buckets, gradient_as_bucket_view) with "
                  "torch.autocast: fp32 parameters"}


def layer_params(hidden: int, heads: int, kv_heads: int | None = None, ffn_hidden: int | None = None,
                 mlp: str = "gelu") -> int:
    """Weights of one Transformer layer (the table above): ``2 h^2 (1 + r) + (2 | 3) h ffn``."""
    kv, ffn = kv_heads or heads, ffn_hidden or 4 * hidden
    return 2 * hidden * hidden + 2 * hidden * (hidden // heads) * kv + (3 if mlp == "swiglu" else 2) * hidden * ffn


def model_params(layers: int, hidden: int, heads: int, vocab: int, kv_heads: int | None = None,
                 ffn_hidden: int | None = None, mlp: str = "gelu", tied_embeddings: bool = False) -> int:
    """Parameters of the whole model from its shape (the count ``model.params`` should be close to)."""
    return layers * layer_params(hidden, heads, kv_heads, ffn_hidden, mlp) + vocab * hidden * (1 if tied_embeddings else 2)


def params_formula(mlp: str = "gelu", tied_embeddings: bool = False) -> str:
    """``model_params`` in symbols, for messages."""
    return (f"layers x (2 h^2 (1 + kv_heads/heads) + {3 if mlp == 'swiglu' else 2} h ffn) + "
            f"{1 if tied_embeddings else 2} V h")


def check_stage(framework: str, zero_stage: int) -> None:
    """ValueError naming both fields unless the framework offers that stage."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {FRAMEWORKS} (got {framework!r})")
    if zero_stage not in STAGES[framework]:
        raise ValueError(f"zero_stage={zero_stage} is not available with framework={framework!r}: accepted "
                         f"{STAGES[framework]} (megatron: 1 = --use-distributed-optimizer; fsdp2 shards "
                         "weights, gradients and optimizer state: 3)")


def state_rows(framework: str, precision: str, zero_stage: int, params_per_gpu: float, shard: int,
               where: str, grad_dtype: str | None = None, bucket_view: bool = False) -> list[tuple[str, float, str]]:
    """(term, bytes, formula) for weights, gradients and optimizer on one GPU; ``params_per_gpu``
    after tp and pp, ``shard`` the sharding group's data-parallel size, ``where`` how params was split;
    ``grad_dtype`` the gradients' dtype (:func:`layout`)."""
    rows = []
    for term, nbytes in zip(("weights", "gradients", "optimizer"), layout(framework, precision, grad_dtype, bucket_view)):
        div = shard if zero_stage >= SHARDED_FROM[term] else 1
        text = f"{nbytes} B x " + (where if term == "weights" else "params") + (f" / {div} (sharded)" if div > 1 else "")
        rows.append((term, nbytes * params_per_gpu / div, text))
    return rows


def gathered_bytes(precision: str, zero_stage: int, shard: int, per_layer_params: float, tp: int,
                   layers_per_stage: int) -> tuple[float, str] | None:
    """The unsharded parameters of the gathered layers (stage 3 with a sharding group > 1), or None."""
    if zero_stage < 3 or shard <= 1:
        return None
    n = min(GATHERED_LAYERS, layers_per_stage)
    e = COMPUTE_BYTES[precision]
    return (n * e * per_layer_params / tp,
            f"{n} layers (current + prefetched) x {e} B x {per_layer_params:.4g} params per layer / tp")


def describe(framework: str, term: str, grad_dtype: str | None = None) -> str:
    """What the bytes of ``term`` are under ``framework`` in mixed precision, in words."""
    fp32_opt = "fp32 master weights, Adam momentum and variance"
    if term == "gradients" and framework in ("deepspeed", "megatron") and grad_dtype is not None:
        main = "main " if framework == "megatron" else ""
        return {4: f"fp32 {main}gradients", 2: f"16-bit {main}gradients"}[GRAD_BYTES[grad_dtype]] + \
            f" (training.grad_dtype {grad_dtype})"
    return {("deepspeed", "weights"): "16-bit weights", ("deepspeed", "gradients"): "16-bit gradients",
            ("deepspeed", "optimizer"): fp32_opt, ("megatron", "weights"): "16-bit weights",
            ("megatron", "gradients"): "fp32 main gradients", ("megatron", "optimizer"): fp32_opt,
            ("fsdp2", "weights"): "fp32 sharded parameters (also the optimizer's master copy)",
            ("fsdp2", "gradients"): "fp32 sharded gradients",
            ("fsdp2", "optimizer"): "Adam momentum and variance (fp32)",
            ("ddp", "weights"): "fp32 parameters (torch.autocast casts copies to bf16 per op)",
            ("ddp", "gradients"): "fp32 .grad and DDP's fp32 bucket copy of it (one, with gradient_as_bucket_view)",
            ("ddp", "optimizer"): "Adam momentum and variance (fp32)"}[framework, term]
