"""The step time of one parallel layout, term by term: what the layout advisor ranks layouts by.

One GPU of a ``tp x pp x dp`` layout runs, per optimizer step, ``m`` micro-batches of ``b`` sequences
of ``s`` tokens through its ``L / pp`` layers (split ``tp`` ways)::

    step = serial + (1 + (p-1)/(v m)) (compute + tp_comm) + pp_comm + dp_exposed

* **compute** = hardware FLOPs / (peak x efficiency). Model FLOPs per token are ``6 N + 12 L h s``
  (``preflight.models.flops``); recompute adds FLOPs the model does not count: full recompute one
  more forward (``2 N + 4 L h s``: +1/3), selective only the core attention's forward (``4 L h s``).
  ``efficiency`` is the share of the dense peak the GPU's kernels reach on that work: a measured MFU
  of a single-device step (chapter 1's baseline record) when there is one, else ``DEFAULT_EFFICIENCY``.
* **bubble**: 1F1B / interleaved fill and drain, ``(p-1)/(v m)`` of the ideal time
  (``preflight.models.pipeline.bubble_over_ideal``), applied to compute and to tensor-parallel
  communication, which happens inside each stage's forward and backward.
* **tp_comm** (Megatron, Narayanan et al. 2021 sec. 3.3 / Korthikanti et al. 2022): per layer and
  micro-batch, two all-reduces of the ``b s h`` activations (16-bit) in forward and two in backward,
  two more with full recompute (sequence parallelism turns each into a reduce-scatter + all-gather of
  the same volume); ring time over NVLink (``intra_node_GBps``), blocking: not overlapped.
* **pp_comm**: each stage sends a micro-batch's activations forward and receives its gradient back,
  ``b s h / tp`` 16-bit values each (Megatron's scatter-gather over the tp ranks), ``v`` times per
  micro-batch; across nodes on the GPU's share of the NICs. Counted blocking (an upper bound:
  Megatron overlaps part of it).
* **dp_exposed**: the gradient all-reduce of ``preflight.models.comm.allreduce_plan`` (rail-aware
  busbw) minus what the last micro-batch's backward hides (``exposed_overlap_s``). ZeRO-1/2 move the
  same volume (reduce-scatter + all-gather). ZeRO-3 (weights sharded, FSDP2) gathers the weights in
  forward and again in backward and reduce-scatters gradients on every micro-batch: 1.5x the volume,
  ``m`` times, hidden behind the whole compute by prefetching.

MFU = model FLOPs / (step x peak); HFU counts the recompute FLOPs too (what Megatron-LM's paper
reports as "% of peak").
"""
from __future__ import annotations

from dataclasses import dataclass

from .comm import allreduce_plan, gbps_to_GBps, ring_allreduce_time
from .flops import train_flops_per_token
from .pipeline import bubble_over_ideal

# Share of the dense peak the kernels reach on a large Transformer's step without parallel overheads
# (GEMMs at 70-80 % of peak, attention and the memory-bound rest lower). A stated default: a measured
# single-device MFU replaces it. docs/advisor-validation.md shows what it gives on published runs.
DEFAULT_EFFICIENCY = 0.60
ACTIVATION_BYTES = 2                # bf16 activations on the wire (tp all-reduces, pp send/recv)
TP_ALLREDUCES = {"none": 4, "selective": 4, "full": 6}      # per layer per micro-batch
NVLINK_LATENCY_S, NIC_LATENCY_S = 5e-6, 10e-6


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


@dataclass(frozen=True)
class Cluster:
    """What the step model needs of the cluster: peak, links, node size."""
    peak_tflops: float
    gpus_per_node: int
    intra_node_GBps: float
    inter_node_Gbps: float
    nics_per_node: int


@dataclass(frozen=True)
class StepTime:
    compute_s: float
    bubble: float                   # (p-1)/(v m): bubble over ideal time
    tp_comm_s: float
    pp_comm_s: float
    dp_comm_s: float                # the data-parallel traffic's time
    dp_exposed_s: float             # the part not hidden behind backward (or, ZeRO-3, all compute)
    serial_s: float
    step_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    hfu: float

    def as_dict(self) -> dict:
        return dict(self.__dict__)           # flat floats: dataclasses.asdict's deep copy costs 3x


def recompute_factor(recompute: str, params: float, layers: int, hidden: int, seq_len: int) -> float:
    """Hardware FLOPs over model FLOPs: 1 (none), ``1 + 4 L h s / F`` (selective: the core attention
    forward again), ``1 + (2 N + 4 L h s) / F`` (full: one more forward), ``F = 6 N + 12 L h s``."""
    f = train_flops_per_token(params, layers, hidden, seq_len)
    extra = {"none": 0.0, "selective": 4.0 * layers * hidden * seq_len,
             "full": 2.0 * params + 4.0 * layers * hidden * seq_len}[recompute]
    return 1.0 + extra / f


def step_time(lay: Layout, *, params: float, layers: int, hidden: int, seq_len: int, cluster: Cluster,
              efficiency: float = DEFAULT_EFFICIENCY, grad_dtype: str = "bf16", serial_s: float = 0.0) -> StepTime:
    """The step of one GPU under ``lay`` (the module's formula). ValueError on a bad efficiency."""
    if not 0 < efficiency <= 1:
        raise ValueError(f"efficiency must be in (0, 1] (got {efficiency!r})")
    tp, pp, dp, m, b, v = lay.tp, lay.pp, lay.dp, lay.microbatches, lay.micro_batch_size, lay.interleave
    tokens = m * b * seq_len                                   # one replica's tokens per step
    model_flops = train_flops_per_token(params, layers, hidden, seq_len) * tokens / (tp * pp)
    hw_flops = model_flops * recompute_factor(lay.activation_recompute, params, layers, hidden, seq_len)
    peak = cluster.peak_tflops * 1e12
    compute = hw_flops / (peak * efficiency)

    act = ACTIVATION_BYTES * b * seq_len * hidden
    tp_comm = 0.0
    if tp > 1:
        one = ring_allreduce_time(act, tp, cluster.intra_node_GBps, NVLINK_LATENCY_S)
        tp_comm = TP_ALLREDUCES[lay.activation_recompute] * (layers // pp) * m * one

    pp_comm = 0.0
    if pp > 1:
        across = tp * dp >= cluster.gpus_per_node               # stage neighbours tp*dp ranks apart
        bw = (gbps_to_GBps(cluster.inter_node_Gbps) * min(1.0, cluster.nics_per_node / cluster.gpus_per_node)
              if across else cluster.intra_node_GBps)
        one = act / tp / (bw * 1e9) + (NIC_LATENCY_S if across else NVLINK_LATENCY_S)
        pp_comm = 2 * v * m * one

    bubble = bubble_over_ideal(pp, m, v)
    pipe = (1 + bubble) * (compute + tp_comm) + pp_comm
    dp_time = dp_exposed = 0.0
    if dp > 1:
        plan = allreduce_plan(params, dp, grad_dtype, tp, pp, gpus_per_node=cluster.gpus_per_node,
                              intra_node_GBps=cluster.intra_node_GBps, inter_node_Gbps=cluster.inter_node_Gbps,
                              nics_per_node=cluster.nics_per_node, compute_s=compute, microbatches=m)
        if lay.zero_stage >= 3:
            dp_time = 1.5 * m * plan.time_s
            dp_exposed = max(0.0, dp_time - compute)
        else:
            dp_time, dp_exposed = plan.time_s, plan.exposed_overlap_s
    step = serial_s + pipe + dp_exposed
    return StepTime(compute_s=compute, bubble=bubble, tp_comm_s=tp_comm, pp_comm_s=pp_comm, dp_comm_s=dp_time,
                    dp_exposed_s=dp_exposed, serial_s=serial_s, step_s=step,
                    tokens_per_s_per_gpu=tokens * dp / step / (tp * pp * dp),
                    mfu=model_flops / step / peak, hfu=hw_flops / step / peak)
