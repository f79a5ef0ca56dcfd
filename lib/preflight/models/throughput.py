"""The step time of one parallel layout, term by term: what the layout advisor ranks layouts by.

One GPU of a ``tp x pp x dp`` layout runs, per optimizer step, ``m`` micro-batches of ``b`` sequences
of ``s`` tokens through its ``L / pp`` layers (split ``tp`` ways); the last stage also runs the output
layer. Per micro-batch the slowest stage takes ``t_stage`` (compute and what communication it cannot
hide), and 1F1B / interleaved pipelining takes ``m + (p - 1) / v`` of them::

    step = serial + (m + (p-1)/v) t_stage + pp_comm + dp_exposed

**Compute** counts the FLOPs the kernels really execute (the executed-work convention, so the
efficiency means the same on every model): per token and layer ``6 N_layer`` for the matrices and
``12 h s`` for attention's two batched matmuls, halved by a causal flash kernel (it skips the masked
half; the unfused ``math`` path computes all of it); the output layer ``6 V h`` on the last stage; the
input embedding is a lookup (no FLOPs). Recompute adds its forward again: ``full`` the whole layer's,
Megatron's ``selective`` the core attention's, torchtitan's ``op_selective`` every other matmul
(``preflight.models.activations``). Each FLOP runs at ``peak x efficiency``, the efficiency from
:func:`gemm_efficiency` (chip and shapes) unless a measured one is given.

**GEMM efficiency** rises with the matrix sizes and saturates: ``E_chip / ((1 + H0/h) (1 + T0/(b s)))``
(the shape of NVIDIA's "Matrix Multiplication Background" guide: small dimensions leave SMs idle and
tiles partly empty). ``E_chip``, ``H0`` and ``T0`` are calibrated on the 34 published runs of
``data/profiles/published/`` (docs/advisor-validation.md): the same model on A100 reaches a larger
share of its peak than on H100 (MosaicML's tables: 0.71 vs 0.57), and the share rises with the hidden
size (Narayanan et al. 2021 Table 1: 44 % at h = 2304 to 52 % at h = 25600 of peak, as HFU).

**Tensor parallelism** (Narayanan et al. 2021 sec. 3.3, Korthikanti et al. 2022): per layer and
micro-batch two all-reduces of the ``b s h`` activations forward and two backward (two more with full
recompute; sequence parallelism turns each into a reduce-scatter + all-gather of the same volume), ring
over NVLink. Blocking, unless ``tp_comm_overlap`` (Megatron-Core's ``--tp-comm-overlap``, Transformer
Engine's userbuffers): then it pipelines with the adjacent GEMMs and only what exceeds them shows.

**Data parallelism and ZeRO** (rail-aware bus bandwidth and latency of ``preflight.models.comm``):

- ZeRO-0 (DDP): all-reduce of the gradients in buckets (``BUCKET_BYTES``, PyTorch DDP's 25 MB), each
  paying its latency; with ``overlap_grad_reduce`` it hides behind the last micro-batch's backward;
- ZeRO-1 (Megatron's distributed optimizer, DeepSpeed stage 1): reduce-scatter of the gradients
  (hidden behind the last backward with ``overlap_grad_reduce``) and all-gather of the updated
  16-bit weights (hidden behind the next first forward with Megatron's ``--overlap-param-gather``;
  DeepSpeed gathers inside ``optimizer.step()``: exposed);
- ZeRO-2 (DeepSpeed): a reduce-scatter on **every** micro-batch (DeepSpeed's engine refuses
  ``no_sync`` under ZeRO-2), each hidden behind that micro-batch's backward when overlapped, then the
  weights' all-gather: about ``(m + 1) (D - 1) / D`` times the gradients;
- ZeRO-3 / FSDP: **per layer** and micro-batch, an all-gather of its 16-bit weights before the forward
  and again before the backward, and a reduce-scatter of its gradients after it (2 + 2 + grad bytes per
  parameter: ``comm.sharded_bytes_per_rank``); each pays a ring latency ``(D - 1) alpha`` (all-gather and
  reduce-scatter have no tree). Prefetch (``overlap_param_gather``) overlaps a layer's collectives with
  its neighbour's compute: only what exceeds it shows. At large D with little compute per GPU this is
  what makes ZeRO-3 fall (175B on 384 -> 1536 A100s: 144 -> 44 TFLOP/s per GPU, Narayanan et al. 2021
  Table 2).

**Context parallelism** (``preflight.models.context``): each of ``cp`` GPUs computes ``b s / cp`` tokens
of every sequence (their attention against all ``s`` keys); per layer the K/V ring's transfers show
where one exceeds a ring step's attention; the gradients reduce over ``dp x cp`` ranks.

**Pipeline**: the 1F1B bubble ``(p-1)/(v m)`` of the slowest stage (the output layer makes the last one
the slowest); each stage sends a micro-batch's activations and receives their gradient (``b s h / tp``
16-bit values, ``v`` times per micro-batch), across nodes on the GPU's share of the NICs, blocking.

MFU = model FLOPs / (step x peak) with the model FLOPs ``6 N + 12 L h s`` per token (PaLM's
convention: embedding included, attention non-causal); HFU adds recompute. Published MFUs use other
conventions (Megatron's ``96 B s l h^2 (1 + s/6h + V/16lh)`` counts recompute: an HFU): compare tokens/s.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from . import context as CP
from .activations import recomputed
from .comm import (
    BYTES_PER_ELEMENT,
    NVLS_GAIN,
    NVLS_MIN_LOCAL,
    RING_NVLINK_SHARE,
    allreduce_link,
    dp_placement,
    gbps_to_GBps,
    ring_allreduce_time,
    sharp_nvlink_phase_s,
)
from .flops import train_flops_per_token
from .moe import Experts, active_params, params_per_gpu
from .moe import a2a_layer as a2a_layer_of

# Share of the dense peak the kernels reach when the layout gives no measured one (--efficiency,
# --mfu-from): the ceiling per chip generation, calibrated on the published runs (module docstring).
# Fitted by tools/calibrate_advisor.py on 73 published runs (data/reference/advisor-calibration.json): the
# four constants below, nothing else. A tokens-per-micro-batch term (T0) and an fp8 kernel share were tried
# and went: the fit put T0 near 0 and the share at 1 (they helped no held-out family). What the shape term
# does not carry is physics with no free constant: fp8 divides only the math (``fp8_gemm_speedup``), and the
# elementwise passes stream at the HBM bandwidth (``elementwise_elements``); with them the leave-one-family-
# out error fell from 10.6 % (53 runs) to 7.4 % (73 runs; docs/advisor-validation.md).
GEMM_CEILING = {"ampere": 0.700, "hopper": 0.578, "blackwell": 0.702}
GEMM_HIDDEN_HALF = 1013.0         # H0: the GEMM's smaller dimension at which the shape costs a factor 2
DEFAULT_EFFICIENCY = 0.60         # the sliders' starting point, and where a chip's generation is unknown
ACTIVATION_BYTES = 2              # bf16 activations on the wire (tp all-reduces, pp send/recv)
TP_ALLREDUCES = {"none": 4, "selective": 4, "op_selective": 4, "full": 6}      # per layer per micro-batch
GEMM_SHARE = 0.8                  # of a layer's compute, the GEMMs a tensor-parallel collective can overlap
BUCKET_BYTES = 25e6               # PyTorch DDP's bucket_cap_mb = 25
# ZeRO-3 collectives per layer: DeepSpeed gathers in prefetch buckets of stage3_prefetch_bucket_size = 5e7
# elements and reduces in reduce_bucket_size = 5e8 (its config defaults); FSDP2 one of each per layer
# (a layer is its unit). Each pays a ring's (D - 1) hops at ZERO3_HOP_LATENCY_S.
ZERO3_BUCKETS = {"deepspeed": (5e7, 5e8)}
ZERO3_HOP_LATENCY_S = 5e-6
NVLINK_LATENCY_S, NIC_LATENCY_S = 5e-6, 10e-6
MFU_CONVENTION = "6N + 12 L h s per token (embedding included, attention non-causal)"


# FP8 training (Transformer Engine, torchao Float8, DeepSeek-V3): the linear layers' three GEMMs (forward,
# input gradient, weight gradient) run in fp8; attention's batched matmuls, norms, activations and the
# optimizer stay in bf16 / fp32. Each GEMM operand is quantised first, a memory-bound pass per element:
# read bf16 (2 B), write fp8 (1 B) and its transposed copy for the backward (1 B); current scaling
# (torchao's tensorwise and rowwise) reads the tensor once more for its amax (2 B); delayed scaling
# (Transformer Engine's DelayedScaling) takes the amax from history, fused into the cast; blockwise
# (DeepSeek-V3: 1x128 / 128x128) and MXFP8 (Blackwell: blocks of 32 with an 8-bit scale) write a scale per
# block in the same pass.
FP8_CAST_BYTES = {"delayed": 4.0, "tensorwise": 6.0, "rowwise": 6.0, "blockwise": 4.0 + 4 / 128, "mxfp8": 4.0 + 1 / 32}
CAST_BANDWIDTH_SHARE = 0.8        # of the HBM bandwidth a cast kernel streams at


def fp8_gain(chip: str | None, fp8_peak: float | None, bf16_peak: float) -> float:
    """How much faster the linear layers' GEMMs run in fp8 than in bf16: the peaks' ratio (2x on Hopper and
    Blackwell). What keeps the end-to-end gain far below 2x (torchtitan's Float8 +28 %, Megatron-Bridge's
    DeepSeek-V3 1.13-1.28x) is the rest of the step, which stays in bf16, and the casts (``FP8_CAST_BYTES``)."""
    return fp8_peak / bf16_peak if fp8_peak else 1.0


def fp8_gemm_speedup(gain: float, shape: float) -> float:
    """How much faster a GEMM of smaller dimension ``shape`` runs in fp8, when its time is the math at the
    peak plus the shape's overhead (:func:`gemm_efficiency`: ``t = F / (P E) (1 + H0 / h)``): fp8 divides the
    math by ``gain`` (the peaks' ratio) and leaves the overhead -- the operands' and outputs' memory traffic
    and the tiles' edges, which is what ``H0 / h`` measures -- as it is: ``(1 + H0/h) / (1/gain + H0/h)``.
    1.67x at h = 4096 and 1.89x at h = 16384 on a 2x peak with H0 = 1013: small layers gain least (NVIDIA's
    Transformer Engine guidance: fp8 pays off on large GEMMs)."""
    if gain <= 1.0:
        return 1.0
    over = GEMM_HIDDEN_HALF / shape
    return (1 + over) / (1 / gain + over)


# The elementwise passes of a layer (norms, residual adds, the MLP's activation, MoE's permutation and
# combine) read and write their tensors once each in bf16 and compute almost nothing: memory-bound, at
# CAST_BANDWIDTH_SHARE of the HBM bandwidth like fp8's casts. Elements per token and layer, forward: two
# norms (read h, write h), two residual adds (read 2h, write h), the activation (SwiGLU: read 2f, write f;
# GeLU: read f, write f), and under MoE the permutation (read h, write k h copies) and the combine (read
# k h, write h). The backward reads the saved input and the incoming gradient and writes a gradient: twice
# the forward. Rotary embeddings and the loss's softmax are left out (small beside these).
ELEMENT_BYTES = 2


def elementwise_elements(hidden: int, ffn: int, swiglu: bool, top_k: int = 0) -> tuple[float, float]:
    """(norms and residuals incl. MoE permutation, activation) elements per token and layer, forward; ``ffn``
    the width the activation runs on (``k f_e`` plus shared experts under MoE), ``top_k`` 0 for a dense MLP."""
    rows = 10 * hidden + (2 * (top_k + 1) * hidden if top_k else 0)
    return float(rows), float((3 if swiglu else 2) * ffn)


def fp8_cast_elements(hidden: int, ffn: int, swiglu: bool) -> tuple[float, float]:
    """Elements quantised per token and layer, (forward, backward): forward, the inputs of the GEMMs (qkv and
    output projection h each, the MLP's up and down projections h and ffn); backward, the output gradients
    feeding the input- and weight-gradient GEMMs (qkv 3h, output projection h, the MLP's up (and gate) and
    down outputs)."""
    forward = 2 * hidden + hidden + ffn
    backward = 3 * hidden + hidden + (2 if swiglu else 1) * ffn + hidden
    return forward, backward


def chip_generation(chip: str | None) -> str | None:
    """'A100-SXM' -> 'ampere', 'H100-SXM' / 'H200-SXM' / 'GH200' -> 'hopper'; None where not calibrated."""
    if not chip:
        return None
    if chip.startswith("A100"):
        return "ampere"
    if chip.startswith(("H100", "H200", "GH200")):
        return "hopper"
    if chip.startswith(("B200", "GB200", "B300", "GB300")):
        return "blackwell"
    return None


def gemm_efficiency(chip: str | None, hidden: int) -> float:
    """The share of the dense peak a Transformer layer's kernels reach (module docstring): ``E_chip / (1 +
    H0 / h)``, ``h`` the GEMMs' smaller dimension (a tokens-per-micro-batch term did not survive calibration:
    docs/advisor-validation.md)."""
    ceiling = GEMM_CEILING.get(chip_generation(chip) or "", None)
    if ceiling is None:
        return DEFAULT_EFFICIENCY
    return ceiling / (1 + GEMM_HIDDEN_HALF / hidden)


@dataclass(frozen=True)
class Layout:
    """One parallel layout: sizes, memory options and batch shape (``microbatches`` per step)."""
    tp: int
    pp: int
    dp: int
    zero_stage: int
    activation_recompute: str
    sequence_parallel: bool
    micro_batch_size: int
    microbatches: int
    interleave: int = 1
    ep: int = 1                     # expert parallelism (MoE), carved out of dp
    cp: int = 1                     # context parallelism: the sequence split over cp GPUs (``models.context``)
    etp: int | None = None          # expert tensor parallelism (MoE); None: tp, Megatron's default
    recompute_modules: tuple[str, ...] | None = None   # with selective: Megatron's --recompute-modules; None: core_attn


@dataclass(frozen=True)
class Overlap:
    """Which communication hides behind compute (the profile's switches, else the framework's defaults)."""
    tp_comm: bool = False
    grad_reduce: bool = True
    param_gather: bool = True


def framework_overlap(framework: str) -> Overlap:
    """Each framework's defaults: Megatron-LM's ``--tp-comm-overlap``, ``--overlap-grad-reduce`` and
    ``--overlap-param-gather`` are off unless given (megatron/training/arguments.py, store_true);
    DeepSpeed reduces gradients in buckets during the backward (``overlap_comm``, on by default for
    ZeRO-3, and the engine's bucketed reduction otherwise) and prefetches ZeRO-3 weights; FSDP2
    reduce-scatters during the backward and prefetches the next layer's weights (implicit prefetch)."""
    return {"megatron": Overlap(tp_comm=False, grad_reduce=False, param_gather=False),
            "deepspeed": Overlap(tp_comm=False, grad_reduce=True, param_gather=True),
            "fsdp2": Overlap(tp_comm=False, grad_reduce=True, param_gather=True),
            "ddp": Overlap(tp_comm=False, grad_reduce=True, param_gather=True)}[framework]


@dataclass(frozen=True)
class Model:
    params: float
    layers: int
    hidden: int
    seq_len: int
    vocab: int = 0
    ffn_hidden: int | None = None
    causal_flash: bool = False        # a causal flash kernel executes half of attention's FLOPs
    matmul_speedup: float = 1.0       # fp8 GEMMs: how much faster than bf16 (``fp8_gain``; attention stays bf16)
    fp8_recipe: str | None = None     # fp8 scaling recipe (``FP8_CAST_BYTES``); None: bf16
    swiglu: bool = False              # the MLP's three matrices (gate, up, down)
    experts: Experts | None = None    # mixture-of-experts (``preflight.models.moe``); None: dense
    heads: int | None = None          # attention heads (context parallelism's K/V bytes); None: h / 128
    kv_heads: int | None = None       # key/value heads (grouped-query attention); None: heads
    qk_head_dim: int | None = None    # query/key size per head (MLA: 192); None: h / heads
    v_head_dim: int | None = None     # value size per head (MLA: 128); None: h / heads
    a2a_overlap: bool = False         # MoE all-to-alls overlapped with another micro-batch's compute (DualPipe)
    dispatch_fp8: bool = False        # MoE dispatch in fp8 (``moe.FP8_DISPATCH_BYTES``)
    node_limit: int | None = None     # node-limited routing: NVLink domains a token's experts may span
    q_lora_rank: int | None = None    # MLA's compressed query and key/value widths and rotary size (DeepSeek-V3:
    kv_lora_rank: int | None = None   # 1536, 512, 64): what ``mla_up_proj`` recompute projects up again
    qk_rope_head_dim: int | None = None

    @property
    def attention_width(self) -> float:
        """``heads (d_qk + d_v)``: attention's two batched matmuls per token and key, ``2 h`` for plain
        multi-head attention, 2.9x that for DeepSeek-V3's latent attention (128 x (192 + 128) over 2 x 7168)."""
        heads = self.heads or max(1, self.hidden // 128)
        d = self.hidden / heads
        return heads * ((self.qk_head_dim or d) + (self.v_head_dim or d))

    @property
    def active(self) -> float:
        """Parameters a token computes with (all of them for a dense model)."""
        return active_params(self.params, self.hidden, self.experts)


@dataclass(frozen=True)
class Cluster:
    """What the step model needs of the cluster: peak, links, node size, the chip (for its efficiency)."""
    peak_tflops: float
    gpus_per_node: int
    intra_node_GBps: float
    inter_node_Gbps: float
    nics_per_node: int
    chip: str | None = None
    in_network: str = "none"        # comm.IN_NETWORK: NVLink SHARP in a node, InfiniBand SHARP across nodes
    nvlink_domain: int | None = None  # GPUs on one NVLink fabric (NVL72: 72); None: a node
    memory_GBps: float | None = None  # HBM bandwidth (fp8's casts stream at it); None: casts not timed

    @property
    def domain(self) -> int:
        return self.nvlink_domain or self.gpus_per_node


@dataclass(frozen=True)
class StepTime:
    compute_s: float                # all compute of the step on this GPU's slowest stage
    efficiency: float
    bubble: float                   # (p-1)/(v m): bubble over ideal time
    bubble_s: float                 # the pipeline's idle slots: (p-1)/v of the slowest stage's micro-batch
    tp_comm_s: float                # tensor-parallel communication, all of it
    tp_exposed_s: float
    pp_comm_s: float
    a2a_s: float                    # MoE all-to-alls (dispatch, combine; forward and backward), the exposed part
    a2a_comm_s: float               # MoE all-to-alls, all of them
    cp_comm_s: float                # context parallelism's key/value ring, all of it
    cp_exposed_s: float             # the part of it attention does not hide
    dp_comm_s: float                # the data-parallel traffic's time
    dp_exposed_s: float             # the part not hidden behind compute
    dp_bytes: float                 # data-parallel bytes each rank sends per step (gradients, gathered weights)
    dp_ranks: int                   # the dense weights' replicas: dp x cp
    edp_ranks: int                  # the routed experts' replicas (expert data parallelism); 1 for a dense model
    serial_s: float
    step_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    hfu: float

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def layer_flops(m: Model, tokens: float, recompute: str, modules: tuple[str, ...] | None = None) -> tuple[float, float]:
    """Executed FLOPs of one layer (not split by tp) for ``tokens``: (forward, backward incl. recompute),
    in bf16-equivalent FLOPs (fp8 matmuls count 1 / ``matmul_speedup``). ``modules``: what Megatron's
    selective recompute runs again (:func:`selective_flops`)."""
    n_layer = max(0.0, m.active - 2.0 * m.vocab * m.hidden) / m.layers / m.matmul_speedup   # bf16-equivalent
    attn = 2.0 * m.attention_width * m.seq_len * (0.5 if m.causal_flash else 1.0)  # forward, per token (4 h s for MHA)
    fwd = (2.0 * n_layer + attn) * tokens
    again = {"none": 0.0, "selective": selective_flops(m, modules) * tokens, "op_selective": n_layer * tokens,
             "full": fwd}[recompute]
    return fwd, 2.0 * fwd + again


def selective_flops(m: Model, modules: tuple[str, ...] | None) -> float:
    """Forward FLOPs per token and layer (averaged over the stack) that Megatron's selective recompute runs
    again, by module (megatron/core/transformer/transformer_config.py ``recompute_modules``; None: its
    default ``["core_attn"]``): core_attn the attention's two batched matmuls; mla_up_proj MLA's query and
    key/value up projections (``q_lora x heads x d_qk`` and ``kv_lora x heads x (d_qk - rope + d_v)``); mlp a
    dense layer's MLP; moe a MoE layer's experts (``k + shared`` expert MLPs). layernorm and moe_act recompute
    elementwise passes only (not counted: a few microseconds a layer)."""
    mods = recomputed("selective", modules)
    out = 0.0
    if "core_attn" in mods:
        out += 2.0 * m.attention_width * m.seq_len * (0.5 if m.causal_flash else 1.0)
    if "mla_up_proj" in mods and m.q_lora_rank and m.kv_lora_rank:
        heads = m.heads or max(1, m.hidden // 128)
        qk, v = m.qk_head_dim or m.hidden / heads, m.v_head_dim or m.hidden / heads
        out += 2.0 * heads * (m.q_lora_rank * qk + m.kv_lora_rank * (qk - (m.qk_rope_head_dim or 0) + v)) / m.matmul_speedup
    e = m.experts
    share = e.moe_layers / m.layers if e is not None else 0.0
    if "mlp" in mods:
        out += (1 - share) * 2.0 * (3 if m.swiglu else 2) * m.hidden * (m.ffn_hidden or 4 * m.hidden) / m.matmul_speedup
    if "moe" in mods and e is not None:
        out += share * 2.0 * (e.top_k + e.shared) * e.mlp_params(m.hidden) / m.matmul_speedup
    return out


def recompute_factor(recompute: str, params: float, layers: int, hidden: int, seq_len: int) -> float:
    """Hardware FLOPs over model FLOPs in the model-FLOPs convention: 1 (none), ``1 + 4 L h s / F``
    (selective: the core attention forward again), ``1 + N / F`` (op_selective: every other matmul),
    ``1 + (2 N + 4 L h s) / F`` (full: one more forward), ``F = 6 N + 12 L h s``."""
    f = train_flops_per_token(params, layers, hidden, seq_len)
    extra = {"none": 0.0, "selective": 4.0 * layers * hidden * seq_len, "op_selective": 1.0 * params,
             "full": 2.0 * params + 4.0 * layers * hidden * seq_len}[recompute]
    return 1.0 + extra / f


def neighbour_link(cluster: Cluster, span: int) -> tuple[float, float]:
    """(GB/s, latency) between neighbours ``span`` ranks apart in rank order: NVLink inside a node, else the
    GPU's share of the node's NICs."""
    if span <= cluster.domain:
        return cluster.intra_node_GBps, NVLINK_LATENCY_S
    return gbps_to_GBps(cluster.inter_node_Gbps) * min(1.0, cluster.nics_per_node / cluster.gpus_per_node), NIC_LATENCY_S


def _ring(buffer: float, ranks: int, bw_GBps: float, alpha: float) -> float:
    """Ring reduce-scatter or all-gather of a ``buffer`` (the whole, gathered size) over ``ranks``."""
    if ranks <= 1 or buffer <= 0:
        return 0.0
    return (ranks - 1) / ranks * buffer / (bw_GBps * 1e9) + (ranks - 1) * alpha


def expert_tp(lay: Layout) -> int:
    return lay.etp or lay.tp


def expert_dp(lay: Layout) -> int:
    """Ranks that hold the same routed experts, over which their gradients reduce (Megatron's expert-data-
    parallel group): ``tp x dp x cp / (ep x etp)``; with Megatron's default ``etp = tp``, ``dp x cp / ep``."""
    return max(1, lay.tp * lay.dp * lay.cp // (lay.ep * expert_tp(lay)))


def _dp_link(cluster: Cluster, ranks: int, stride: int, pp: int):
    """The rail-aware ring of a gradient group of ``ranks`` members ``stride`` ranks apart, whether the
    network reduces its all-reduce, and SHARP's NVLink phase per byte: ``(link, "nvls" | "sharp" | None,
    s/B)`` (``comm.allreduce_plan``'s rules: NVLink SHARP with 5 or more local ranks inside a node,
    InfiniBand SHARP across nodes, bounded by the node's own ranks reducing over NVLink first)."""
    place = dp_placement(ranks, stride, pp, cluster.gpus_per_node)
    link = allreduce_link(place, intra_node_GBps=cluster.intra_node_GBps, inter_node_Gbps=cluster.inter_node_Gbps,
                          nics_per_node=cluster.nics_per_node, gpus_per_node=cluster.gpus_per_node)
    net = cluster.in_network
    if "nvls" in net and link.name == "intra-node" and place.ranks_per_node >= NVLS_MIN_LOCAL:
        return replace(link, busbw_GBps=link.busbw_GBps * NVLS_GAIN), "nvls", 0.0
    if "sharp" in net and link.name == "inter-node":
        return link, "sharp", sharp_nvlink_phase_s(1.0, place.ranks_per_node, cluster.intra_node_GBps)
    return link, None, 0.0


def _dp_collectives(zero_stage: int, g_bytes: float, w_bytes: float, ranks: int, link_net) -> tuple[float, float, float]:
    """One gradient group's collectives per step: (reduction s, weight gather s, bytes each rank sends).

    ZeRO-0 (DDP): a ring all-reduce of the gradients in ``BUCKET_BYTES`` buckets, each paying NCCL's tree
    latency ``2 log2(D) alpha``: ``2 (D-1)/D`` of the gradient bytes. ZeRO-1/2 (Megatron's distributed
    optimizer, DeepSpeed): a reduce-scatter of the gradients, then an all-gather of the updated 16-bit
    weights: ``(D-1)/D`` of each. InfiniBand SHARP reduces an all-reduce in the switches: each rank sends
    its buffer once, at the tree's latency."""
    link, net, nvl_per_byte = link_net
    nvl_phase = nvl_per_byte * g_bytes
    bw, alpha = link.busbw_GBps, link.latency_s
    if zero_stage == 0 and net == "sharp":           # bounded by the NVLink phase of the node's ranks (comm)
        return max(g_bytes / (bw * 1e9), nvl_phase) + 2 * math.ceil(math.log2(ranks)) * alpha, 0.0, g_bytes
    if zero_stage == 0:
        buckets = max(1, math.ceil(g_bytes / BUCKET_BYTES))
        tree = 2 * math.ceil(math.log2(ranks)) * alpha
        return 2 * (ranks - 1) / ranks * g_bytes / (bw * 1e9) + buckets * tree, 0.0, 2 * (ranks - 1) / ranks * g_bytes
    return _ring(g_bytes, ranks, bw, alpha), _ring(w_bytes, ranks, bw, alpha), (ranks - 1) / ranks * (g_bytes + w_bytes)


def red_bytes(zero_stage: int, groups, grad_dtype: str) -> float:
    """Bytes of one reduce-scatter of every group's gradients (what ZeRO-2 repeats on each micro-batch)."""
    if zero_stage != 2:
        return 0.0
    return sum((r - 1) / r * p * BYTES_PER_ELEMENT[grad_dtype] for p, r, _ in groups if r > 1)


def step_time(lay: Layout, *, model: Model, cluster: Cluster, efficiency: float | None = None,
              grad_dtype: str = "bf16", serial_s: float = 0.0, overlap: Overlap = Overlap(),
              framework: str = "fsdp2", shard_gpus: int | None = None) -> StepTime:
    """The step of one GPU under ``lay`` (the module's formula). ``efficiency`` None: :func:`gemm_efficiency`.
    ``shard_gpus``: HSDP, ZeRO-3 / FSDP sharding inside that many GPUs (a node), replicated across them.
    ValueError on a bad efficiency."""
    tp, pp, dp, m, b, v = lay.tp, lay.pp, lay.dp, lay.microbatches, lay.micro_batch_size, lay.interleave
    cp = lay.cp
    s, h = model.seq_len, model.hidden
    tokens_mb = b * s // cp                                    # one GPU's tokens of a micro-batch
    eff = gemm_efficiency(cluster.chip, h) if efficiency is None else efficiency
    if not 0 < eff <= 1:
        raise ValueError(f"efficiency must be in (0, 1] (got {efficiency!r})")
    rate = cluster.peak_tflops * 1e12 * eff
    ceiling = GEMM_CEILING.get(chip_generation(cluster.chip) or "")     # None: no shape term (DEFAULT_EFFICIENCY)
    timed = model
    if efficiency is None and ceiling is not None and model.matmul_speedup > 1:   # fp8: the math, not the overhead
        timed = replace(model, matmul_speedup=fp8_gemm_speedup(model.matmul_speedup, h))
    fwd, bwd = layer_flops(timed, tokens_mb, lay.activation_recompute, lay.recompute_modules)
    t_fwd, t_bwd = fwd / tp / rate, bwd / tp / rate            # one layer, one micro-batch
    moe_again = "moe" in recomputed(lay.activation_recompute, lay.recompute_modules)   # the experts' forward again
    if model.experts is not None and efficiency is None and ceiling is not None:   # experts' GEMMs at their shapes
        e = model.experts
        e_fwd = 2.0 * (e.top_k + e.shared) * e.mlp_params(h) * e.moe_layers / model.layers * tokens_mb
        extra = e_fwd / tp / (cluster.peak_tflops * 1e12 * ceiling) * GEMM_HIDDEN_HALF * (1 / min(h, e.expert_ffn) - 1 / h)
        again = 1.0 if moe_again or lay.activation_recompute == "op_selective" else 0.0
        t_fwd, t_bwd = t_fwd + extra, t_bwd + (2.0 + again) * extra
    if cluster.memory_GBps and efficiency is None:              # the elementwise passes, memory-bound (a measured
        # efficiency is the whole step's share of the peak: it already holds them)
        e, dense_ffn = model.experts, model.ffn_hidden or 4 * h
        rows, act = elementwise_elements(h, dense_ffn, model.swiglu)
        if e is not None:                                       # the MoE layers' share of the stack
            share = e.moe_layers / model.layers
            rows_e, act_e = elementwise_elements(h, (e.top_k + e.shared) * e.expert_ffn, model.swiglu, e.top_k)
            rows, act = rows + share * (rows_e - rows), act + share * (act_e - act)
        per = tokens_mb * ELEMENT_BYTES / (cluster.memory_GBps * 1e9 * CAST_BANDWIDTH_SHARE)
        el = (rows / (tp if lay.sequence_parallel else 1) + act / tp) * per   # without SP each tp rank repeats the norms
        again = 1.0 if lay.activation_recompute in ("full", "op_selective") else 0.0   # torchtitan's op policy too
        t_fwd, t_bwd = t_fwd + el, t_bwd + (2.0 + again) * el
    if model.fp8_recipe and cluster.memory_GBps:               # fp8's quantisation passes, memory-bound
        e = model.experts
        ffn = (e.top_k + e.shared) * e.expert_ffn if e is not None else (model.ffn_hidden or 4 * h)
        per_element = (tokens_mb * FP8_CAST_BYTES[model.fp8_recipe] / tp
                       / (cluster.memory_GBps * 1e9 * CAST_BANDWIDTH_SHARE))
        cast_fwd, cast_bwd = fp8_cast_elements(h, ffn, model.swiglu)
        t_fwd, t_bwd = t_fwd + cast_fwd * per_element, t_bwd + cast_bwd * per_element
    out_layer = 6.0 * model.vocab * h * tokens_mb / tp / rate  # the output layer, on the last stage
    layers_stage = model.layers / pp

    tp_layer = tp_exposed_layer = 0.0
    if tp > 1:
        one = ring_allreduce_time(ACTIVATION_BYTES * tokens_mb * h, tp, cluster.intra_node_GBps * RING_NVLINK_SHARE,
                                  NVLINK_LATENCY_S)
        tp_layer = TP_ALLREDUCES[lay.activation_recompute] * one
        tp_exposed_layer = max(0.0, tp_layer - GEMM_SHARE * (t_fwd + t_bwd)) if overlap.tp_comm else tp_layer

    cp_x = CP.exchange(b, s, h, model.heads or max(1, h // 128), model.kv_heads or model.heads or max(1, h // 128),
                       tp, cp, *neighbour_link(cluster, tp * cp), rate, causal=model.causal_flash)

    # data parallelism: the weights' replicas are dp x cp ranks (CP ranks hold the same weights); the
    # rail-aware bandwidth and per-hop latency of that group. Routed experts reduce over their own
    # expert-data-parallel group instead (Megatron's expert_data_parallel group): tp x dp x cp / (ep x etp)
    # ranks, ep x etp apart in rank order.
    dp = dp * cp
    etp = expert_tp(lay)
    dense, routed = params_per_gpu(model.params, h, model.experts, tp, pp, lay.ep, etp)
    edp = expert_dp(lay) if model.experts is not None else 1
    groups = [(dense, dp, tp)] + ([(routed, edp, etp * lay.ep)] if routed > 0 else [])
    links = {(ranks, stride): _dp_link(cluster, ranks, stride, pp) for _, ranks, stride in groups if ranks > 1}
    per_rank = dense + routed
    g_bytes, w_bytes = per_rank * BYTES_PER_ELEMENT[grad_dtype], per_rank * 2.0
    # ZeRO-3 / FSDP: one layer's share of this stage's weights (the stage holds layers / pp of them)
    shard = min(dp, max(1, shard_gpus // tp)) if shard_gpus else dp          # HSDP: inside a node
    z3_layer = ag = rs = 0.0
    if dp > 1 and lay.zero_stage >= 3:
        link = _dp_link(cluster, shard, tp, pp)[0] if shard > 1 else None
        layer_w, layer_g = w_bytes / layers_stage, g_bytes / layers_stage
        n_ag, n_rs = ((math.ceil(per_rank / layers_stage / ZERO3_BUCKETS[framework][0]),
                       math.ceil(per_rank / layers_stage / ZERO3_BUCKETS[framework][1]))
                      if framework in ZERO3_BUCKETS else (1, 1))
        if link is not None:
            ag = _ring(layer_w, shard, link.busbw_GBps, 0.0) + n_ag * (shard - 1) * ZERO3_HOP_LATENCY_S
            rs = _ring(layer_g, shard, link.busbw_GBps, 0.0) + n_rs * (shard - 1) * ZERO3_HOP_LATENCY_S
        if overlap.param_gather:
            z3_layer = max(0.0, ag - t_fwd) + max(0.0, ag + rs - t_bwd)
        else:
            z3_layer = ag + ag + (max(0.0, rs - t_bwd) if overlap.grad_reduce else rs)
    # torchtitan under pipelining keeps a stage's weights gathered (reshard_after_forward=False) and
    # reduce-scatters once, on the last micro-batch (torch.distributed.pipelining's backward_maybe_with_nosync)
    pp_fsdp = lay.zero_stage >= 3 and pp > 1 and framework == "fsdp2"
    per_slot_z3 = 0.0 if pp_fsdp else z3_layer
    a2a_layer = a2a_exposed_layer = 0.0                          # per MoE layer and micro-batch
    if model.experts is not None and lay.ep > 1:
        nic = gbps_to_GBps(cluster.inter_node_Gbps) * min(1.0, cluster.nics_per_node / cluster.gpus_per_node)
        x = a2a_layer_of(tokens_mb, h, model.experts.top_k, lay.ep, ep_per_domain=max(1, min(lay.ep, cluster.domain // etp)),
                         nic_GBps=nic, nvlink_GBps=cluster.intra_node_GBps, nic_latency_s=NIC_LATENCY_S,
                         nvlink_latency_s=NVLINK_LATENCY_S, fp8_dispatch=model.dispatch_fp8, node_limit=model.node_limit,
                         full_recompute=moe_again)
        a2a_layer = x.seconds
        # DualPipe / Megatron's overlap_moe_expert_parallel_comm: one micro-batch's all-to-alls run under
        # another's attention and MLP compute; only what exceeds that compute shows
        a2a_exposed_layer = max(0.0, a2a_layer - (t_fwd + t_bwd)) if model.a2a_overlap else a2a_layer
    moe_stage = (model.experts.moe_layers / pp) if model.experts is not None else 0.0
    t_stage = (layers_stage * (t_fwd + t_bwd + tp_exposed_layer + per_slot_z3 + cp_x.ring_exposed_s)
               + moe_stage * a2a_exposed_layer + out_layer)
    compute = m * (layers_stage * (t_fwd + t_bwd) + out_layer)
    pipe = (m + (pp - 1) / v) * t_stage if pp > 1 else m * t_stage

    pp_comm = 0.0
    if pp > 1:
        across = tp * dp >= cluster.gpus_per_node               # stage neighbours tp*cp*dp ranks apart
        bw = (gbps_to_GBps(cluster.inter_node_Gbps) * min(1.0, cluster.nics_per_node / cluster.gpus_per_node)
              if across else cluster.intra_node_GBps)
        one = ACTIVATION_BYTES * tokens_mb * h / tp / (bw * 1e9) + (NIC_LATENCY_S if across else NVLINK_LATENCY_S)
        pp_comm = 2 * v * m * one

    dp_time = dp_exposed = dp_bytes = 0.0
    last_bwd = layers_stage * t_bwd                              # the last micro-batch's backward
    first_fwd = layers_stage * t_fwd
    if lay.zero_stage >= 3 and dp > 1 and pp_fsdp:
        dp_time = layers_stage * (ag + rs)                       # once per step, not per micro-batch
        dp_bytes = (shard - 1) / shard * (w_bytes + g_bytes)
        dp_exposed = ((max(0.0, layers_stage * ag - first_fwd) if overlap.param_gather else layers_stage * ag)
                      + (max(0.0, layers_stage * rs - last_bwd) if overlap.grad_reduce else layers_stage * rs))
    elif lay.zero_stage >= 3 and dp > 1:
        dp_time = m * layers_stage * (2 * ag + rs)
        dp_bytes = m * (shard - 1) / shard * (2 * w_bytes + g_bytes)
        dp_exposed = (m + (pp - 1) / v if pp > 1 else m) * layers_stage * z3_layer
        pipe -= dp_exposed                                       # counted once, as data-parallel time
    elif dp > 1:
        red = gat = 0.0                                          # dense over dp x cp, experts over edp
        for params, ranks, stride in groups:
            if ranks > 1 and params > 0:
                r_, g_, b_ = _dp_collectives(lay.zero_stage, params * BYTES_PER_ELEMENT[grad_dtype], params * 2.0,
                                             ranks, links[(ranks, stride)])
                red, gat, dp_bytes = red + r_, gat + g_, dp_bytes + b_
        rs_n = m if lay.zero_stage == 2 else 1                   # ZeRO-2 reduce-scatters every micro-batch
        dp_time = rs_n * red + gat
        dp_bytes += (rs_n - 1) * red_bytes(lay.zero_stage, groups, grad_dtype)
        hid_rs = max(0.0, red - last_bwd) if overlap.grad_reduce else red
        # Megatron's --overlap-param-gather hides it behind the next step's first forward; DeepSpeed
        # gathers inside optimizer.step(), before the next forward can start
        hid_ag = max(0.0, gat - first_fwd) if overlap.param_gather and framework != "deepspeed" else gat
        dp_exposed = rs_n * hid_rs + hid_ag
    if lay.zero_stage >= 3 and dp > shard:                       # HSDP: the shards' gradients across the replicas
        rep = dp // shard
        ar_link = _dp_link(cluster, rep, tp * shard, pp)[0]
        ar = 2 * (rep - 1) / rep * (g_bytes / shard) / (ar_link.busbw_GBps * 1e9) + 2 * (rep - 1) * ar_link.latency_s
        dp_time += ar
        dp_bytes += 2 * (rep - 1) / rep * g_bytes / shard
        dp_exposed += max(0.0, ar - last_bwd) if overlap.grad_reduce else ar
    step = serial_s + pipe + pp_comm + dp_exposed
    tp_exposed, cp_exposed, a2a = (m * layers_stage * tp_exposed_layer, m * layers_stage * cp_x.ring_exposed_s,
                                   m * moe_stage * a2a_exposed_layer)
    bubble_s = max(0.0, pipe - compute - tp_exposed - cp_exposed - a2a)       # (p-1)/v slots of the slowest stage
    tokens = m * b * s                                           # one replica's tokens (cp GPUs share each sequence)
    model_flops = train_flops_per_token(model.active, model.layers, h, s) * tokens / (tp * pp * cp)
    hw = model_flops * recompute_factor(lay.activation_recompute, model.active, model.layers, h, s)
    peak = cluster.peak_tflops * 1e12
    tp_all = m * layers_stage * tp_layer
    return StepTime(compute_s=compute, efficiency=eff, bubble=(pp - 1) / (v * m) if pp > 1 else 0.0,
                    bubble_s=bubble_s, tp_comm_s=tp_all, tp_exposed_s=tp_exposed, pp_comm_s=pp_comm,
                    a2a_s=a2a, a2a_comm_s=m * moe_stage * a2a_layer,
                    cp_comm_s=m * layers_stage * cp_x.comm_s, cp_exposed_s=cp_exposed,
                    dp_comm_s=dp_time, dp_exposed_s=dp_exposed, dp_bytes=dp_bytes, dp_ranks=dp, edp_ranks=edp,
                    serial_s=serial_s, step_s=step,
                    tokens_per_s_per_gpu=tokens / step / (tp * pp * cp), mfu=model_flops / step / peak,
                    hfu=hw / step / peak)
