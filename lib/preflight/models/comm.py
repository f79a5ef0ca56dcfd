"""What data-parallel gradients cost to move, as NCCL moves them.

Ring all-reduce (Patarasuk & Yuan 2009; the NCCL convention): each of ``D`` ranks sends and
receives ``V = 2 (D-1)/D`` times the buffer ``S`` (reduce-scatter, then all-gather), in ``2 (D-1)``
latency-bound steps::

    t = V / busbw  +  2 (D-1) * alpha          V = 2 (D-1)/D * S

``busbw`` is nccl-tests' bus bandwidth (``algbw = S / t``, ``busbw = algbw * 2 (D-1)/D``: PERFORMANCE.md
of nccl-tests), the per-rank rate the slowest part of the ring sustains. Which part that is depends on
where the group's ranks sit, and this is what the field report gets wrong:

* **inside one node** every hop is NVLink-class: ``busbw = B_nvlink``;
* **across nodes, rail-optimised** (one NIC per GPU, HGX/DGX-class clusters): NCCL runs several rings
  (channels), each entering and leaving a node once, over different NICs. A node holding ``k`` ranks of
  the group carries ``V`` per ring in total, spread over ``k`` NICs: ``busbw = k * B_nic`` (bounded by
  NVLink). nccl-tests on 8 x 400 Gb/s nodes report about 370-385 GB/s with rings (8 x 50 GB/s of
  line rate, less the protocol), more only with in-network reduction (SHARP);
* a node's NICs are shared by every group with ranks in it (``groups_per_node``, all reducing at the same
  time): with ``nics_per_node`` NICs each group gets ``nics_per_node * k / gpus_per_node`` of them.

The field report's "56 GB at 200 Gb/s takes over 2 s" is ``V / B_nic``: true with one 200 Gb/s NIC per
node (or a ring that crosses the network at every hop), not with one per GPU. The plan keeps it beside
the rail-aware figure as ``flat_s``.

With tensor (tp) and pipeline (pp) parallelism each data-parallel rank holds ``M / (tp pp)``
parameters, and the data-parallel group is placed by Megatron's rank order (``preflight.diagnose.topology``: tp
fastest, then dp, then pp), so tp = 8 on 8-GPU nodes leaves one rank of each group per node.

``allreduce_plan`` is the one home of a plan's gradient all-reduce (bytes, placement, rail-aware and flat
time, predicted busbw, latency terms, efficiency bounds): chapters 1 and 3, the scaling curve, the
calculator widget, the exercises and the report all read it; ``allreduce_link`` is the one place that
decides the bandwidth a ring gets.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from numbers import Real

from preflight.core.hardware import INTER_NODE_LATENCY_S, INTRA_NODE_LATENCY_S

BYTES_PER_ELEMENT = {"fp32": 4, "bf16": 2, "fp16": 2}

# In-network reduction: the switches add the gradients, so a rank sends its buffer once and receives the
# sum once, instead of a ring's 2 (D-1)/D.
# - NVLS (NVLink SHARP, NVSwitch 3 on H100 / H200 / B200 HGX): an 8-GPU all-reduce reaches ~480 GB/s
#   "busbw" (nccl-tests' ring formula) where rings reach ~370 GB/s of the 450 GB/s line rate, about 30 %
#   more (S. Jeaugey, NCCL maintainer, NVIDIA/nccl-tests#212 and NVIDIA/nccl#1442); measured: the gain
#   appears from 5 local GPUs up (370 -> 420, 440, 460, 480 GB/s at 5-8 GPUs, NVIDIA/nccl#1455).
# - SHARP on InfiniBand (CollNet / NVLS+SHARP across nodes): the inter-node all-reduce crosses each NIC
#   once instead of 2 (D-1)/D times (nccl-tests' PERFORMANCE.md: busbw then no longer measures the wire).
IN_NETWORK = ("none", "nvls", "sharp", "nvls+sharp")
NVLS_GAIN, NVLS_MIN_LOCAL = 480.0 / 370.0, 5
# A ring all-reduce inside an NVLink domain reaches ~82 % of the line rate as bus bandwidth: ~370 GB/s of
# H100's 450 (S. Jeaugey, NVIDIA/nccl-tests#212). ``intra_node_GBps`` is the line rate; the rings get this
# share of it, NVLS its gain on top (480 GB/s measured, not 450 x 1.3 = 584).
RING_NVLINK_SHARE = 370.0 / 450.0


def sharp_nvlink_phase_s(buffer: float, ranks_per_node: int, intra_node_GBps: float) -> float:
    """InfiniBand SHARP reduces across nodes in the switches, but a node's own ``k`` ranks still reduce and
    gather the buffer over NVLink first: ``2 (k - 1) / k`` of it at the NVLink ring rate. SHARP's all-reduce
    takes at least this long."""
    k = ranks_per_node
    return 2 * (k - 1) / k * buffer / (intra_node_GBps * RING_NVLINK_SHARE * 1e9) if k > 1 else 0.0


def gbps_to_GBps(gbit_per_s: float) -> float:
    """Network links are quoted in Gb/s (bits); memory and buses in GB/s (bytes)."""
    return gbit_per_s / 8.0


def allreduce_bytes_per_rank(params: float, dp: int, grad_dtype: str = "fp32",
                             tp: int = 1, pp: int = 1) -> float:
    """Bytes each data-parallel rank sends (and receives) per step: ``2 M/(tp pp) (D-1)/D b``."""
    if dp < 1 or tp < 1 or pp < 1:
        raise ValueError(f"dp, tp, pp must be >= 1 (got {dp}, {tp}, {pp})")
    b = BYTES_PER_ELEMENT[grad_dtype]
    return 2.0 * params / (tp * pp) * (dp - 1) / dp * b


def sharded_bytes_per_rank(params: float, dp: int, param_dtype: str = "bf16", reduce_dtype: str = "fp32",
                           tp: int = 1, pp: int = 1) -> float:
    """Bytes per rank per step of fully sharded data parallelism (ZeRO-3, PyTorch FSDP2).

    Forward all-gathers every layer's parameters, backward all-gathers them again (they were freed)
    and reduce-scatters the gradients; each moves ``(D-1)/D`` of the tensor per rank::

        (D-1)/D x M/(tp pp) x (2 b_param + b_reduce)

    With one dtype throughout that is ``3 (D-1)/D S``: 1.5x DDP's ``2 (D-1)/D S``. FSDP2 with a bf16
    ``MixedPrecisionPolicy`` gathers bf16 parameters and reduces in ``reduce_dtype``; left unset it
    reduces in ``param_dtype``, bf16 (the policy's docstring: "If this is None but param_dtype is not
    None, then the reduction uses the compute dtype"): fp32 needs ``reduce_dtype=torch.float32``.
    The gathers of the next layer are prefetched while this one computes, so they overlap too.
    """
    if dp < 1 or tp < 1 or pp < 1:
        raise ValueError(f"dp, tp, pp must be >= 1 (got {dp}, {tp}, {pp})")
    return (dp - 1) / dp * params / (tp * pp) * (2 * BYTES_PER_ELEMENT[param_dtype] + BYTES_PER_ELEMENT[reduce_dtype])


def ring_allreduce_time(buffer_bytes: float, ranks: int, bandwidth_GBps: float,
                        latency_s: float = 0.0) -> float:
    """Seconds for a ring all-reduce of ``buffer_bytes`` over ``ranks`` at ``bandwidth_GBps``."""
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1 (got {ranks})")
    if ranks == 1:
        return 0.0
    if bandwidth_GBps <= 0:
        raise ValueError(f"bandwidth must be > 0 (got {bandwidth_GBps})")
    return 2 * (ranks - 1) / ranks * buffer_bytes / (bandwidth_GBps * 1e9) + 2 * (ranks - 1) * latency_s


def busbw_factor(ranks: int) -> float:
    """nccl-tests bus-bandwidth factor for all-reduce, ``2 (n-1)/n``."""
    return 2 * (ranks - 1) / ranks


# --- the gradient all-reduce plan: the one home of bytes, placement, times and efficiency bounds -----

BACKWARD_SHARE = 2.0 / 3.0      # backward ~ 2x forward: the part of compute that can hide an all-reduce


@dataclass(frozen=True)
class Placement:
    """Where one data-parallel group's ranks sit (Megatron order: tp fastest, then dp, then pp)."""
    ranks_per_node: int     # k: ranks of the group inside one node
    nodes: int              # nodes the group spans
    groups_per_node: int    # groups with ranks in one node: they all reduce at once and share its NICs


def dp_placement(dp: int, tp: int, pp: int, gpus_per_node: int) -> Placement:
    """Place a data-parallel group by the rank order of ``preflight.diagnose.topology.rank_groups``.

    Group members are ``tp`` ranks apart (``rank = tp_rank + tp (dp_rank + dp pp_stage)``), so a node of
    ``g`` GPUs holds ``k = min(dp, ceil(g / tp))`` of them and the group spans ``tp (dp-1) // g + 1``
    nodes; pp does not change it (stages are whole blocks of ``tp dp`` ranks). Every GPU of a node
    belongs to one group, so ``g / k`` groups share the node. Assumes tp divides g or g divides tp
    (the topology rules fail any other layout).
    """
    k = min(dp, -(-gpus_per_node // tp))
    return Placement(ranks_per_node=k, nodes=tp * (dp - 1) // gpus_per_node + 1,
                     groups_per_node=max(1, gpus_per_node // k))


@dataclass(frozen=True)
class Link:
    """The bandwidth a ring gets: name, predicted bus bandwidth (GB/s), per-step latency, NICs, why."""
    name: str               # "intra-node" | "inter-node"
    busbw_GBps: float
    latency_s: float
    nics_per_group: float   # NICs of each node the group's rings use (0 inside one node)
    why: str


def allreduce_link(placement: Placement, *, intra_node_GBps: float, inter_node_Gbps: float,
                   gpus_per_node: int, nics_per_node: int | None = None) -> Link:
    """THE one rule for the bus bandwidth of a ring all-reduce (plan, sweep check, widget).

    Inside one node: ``RING_NVLINK_SHARE`` of the NVLink line rate ``intra_node_GBps`` (370 of H100's 450).
    Across nodes, ``inter_node_Gbps`` per NIC: the group's rings use ``min(k, nics_per_node * k /
    gpus_per_node)`` NICs per node (its ``k`` ranks, each on its own rail, or its share of fewer NICs when
    groups share them), bounded by NVLink's ring rate::

        busbw = min(0.82 B_nvlink, nics_per_group * B_nic)

    ``nics_per_node`` defaults to ``gpus_per_node`` (rail-optimised); 1 = one NIC per node.
    """
    nics = gpus_per_node if nics_per_node is None else nics_per_node
    k = placement.ranks_per_node
    ring = intra_node_GBps * RING_NVLINK_SHARE
    if placement.nodes <= 1:
        return Link("intra-node", ring, INTRA_NODE_LATENCY_S, 0.0,
                    f"fits inside one node: NVLink rings at {ring:.3g} GB/s busbw ({RING_NVLINK_SHARE:.0%} of the "
                    f"{intra_node_GBps:g} GB/s line rate)")
    nic = gbps_to_GBps(inter_node_Gbps)
    used = min(float(k), nics * k / gpus_per_node)
    bw = min(ring, used * nic)
    share = (f"{k} rank{'s' * (k > 1)} per node on {used:g} NIC{'s' * (used != 1)}" if used >= 1 else
             f"{placement.groups_per_node} groups share each node's {nics} NIC{'s' * (nics > 1)}")
    return Link("inter-node", bw, INTER_NODE_LATENCY_S, used,
                f"spans {placement.nodes} nodes, {share} of {inter_node_Gbps:g} Gb/s = {nic:g} GB/s: "
                f"busbw {bw:.3g} GB/s" + (" (NVLink-bound)" if bw == ring else ""))


@dataclass(frozen=True)
class AllreducePlan:
    """One step's gradient all-reduce (see ``allreduce_plan``). ``as_dict()`` for tables and notebooks."""
    dp: int
    tp: int
    pp: int
    grad_dtype: str
    buffer_bytes: float             # S = M/(tp pp) x b: the gradient buffer of one rank
    bytes_per_rank: float           # V = 2 S (D-1)/D: sent (and received) per rank per step
    ranks_per_node: int             # placement (``dp_placement``)
    nodes: int
    groups_per_node: int
    nics_per_node: int
    nics_per_group: float
    link: str                       # "intra-node" | "inter-node" (``allreduce_link``)
    link_why: str
    busbw_GBps: float               # predicted nccl-tests bus bandwidth of this group
    latency_s: float                # alpha per ring step
    ring_latency_s: float           # 2 (D-1) alpha
    tree_latency_s: float           # 2 ceil(log2 D) alpha: NCCL's tree, chosen for small messages
    time_s: float                   # THE model: V / busbw + ring latency
    flat_s: float                   # the field report's arithmetic: V over one NIC (+ ring latency)
    flat_why: str
    compute_s: float                # one GPU's compute per step at the target layout
    work_s: float                   # serial + compute: one GPU's step
    microbatches: int
    hide_window_s: float            # backward that can hide the all-reduce: the last micro-batch's
    ratio: float                    # time_s / compute_s
    exposed_overlap_s: float        # max(0, time_s - hide_window_s)
    efficiency_no_overlap: float
    efficiency_full_overlap: float

    def as_dict(self) -> dict:
        return asdict(self)


def _check(name: str, value, ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(f"{name} must be {what} (got {value!r})")


def allreduce_plan(params: float, dp: int, grad_dtype: str = "fp32", tp: int = 1, pp: int = 1, *,
                   gpus_per_node: int, intra_node_GBps: float, inter_node_Gbps: float,
                   compute_s: float, serial_s: float = 0.0, nics_per_node: int | None = None,
                   microbatches: int = 1, in_network: str = "none") -> AllreducePlan:
    """The gradient all-reduce of one data-parallel step: bytes, placement, time, busbw, bounds.

    With ``M`` parameters, ``D = dp`` ranks, ``b`` bytes per gradient element and ``S = M/(tp pp) b``:

    * bytes per rank ``V = 2 S (D-1)/D`` (ring: reduce-scatter then all-gather);
    * placement ``dp_placement`` and bus bandwidth ``allreduce_link`` (rail-aware, see the module);
    * ``time_s = V / busbw + 2 (D-1) alpha``. NCCL uses its tree instead of the ring for small messages
      at many ranks (latency ``2 log2(D) alpha``, ``tree_latency_s``); for a step's gradients the
      bandwidth term decides and both algorithms reach about the same busbw;
    * ``flat_s``: the field report's ``V / B_nic``: what one NIC per node (or a ring crossing the network
      at every hop) would take. Equal to ``time_s`` inside one node;
    * overlap: DDP buckets hide the all-reduce behind backward (~2/3 of compute). With gradient
      accumulation (``microbatches`` > 1, ``no_sync`` on all but the last) the one all-reduce per step
      can start only in the last micro-batch's backward: ``hide_window = 2/3 compute / microbatches``
      (with pp the drain can hide more; this bound is the conservative one);
    * efficiency (per-GPU batch fixed, ``W = serial_s + compute_s``): no overlap ``W / (W + t)``; full
      overlap ``W / (W + max(0, t - hide_window))``;
    * ``in_network`` (``IN_NETWORK``): NVLS inside a node (busbw x ``NVLS_GAIN`` with 5 or more local
      ranks), SHARP across nodes (the volume is ``S``, not ``2 (D-1)/D S``).

    Field case: 7e9 fp32 parameters, D = 1024 on 8-GPU nodes, one 200 Gb/s NIC per GPU: V = 55.9 GB per
    rank, busbw 8 x 25 = 200 GB/s, 0.30 s (flat: 2.26 s). ``D = 1`` moves nothing and takes no time.
    Bad input raises ValueError naming the argument.
    """
    for name, v in (("dp", dp), ("tp", tp), ("pp", pp), ("gpus_per_node", gpus_per_node),
                    ("microbatches", microbatches)):
        _check(name, v, isinstance(v, Real) and v >= 1 and v == int(v), "a whole number >= 1")
    if nics_per_node is not None:
        _check("nics_per_node", nics_per_node, isinstance(nics_per_node, Real) and nics_per_node >= 1
               and nics_per_node == int(nics_per_node), "a whole number >= 1")
    for name, v in (("params", params), ("intra_node_GBps", intra_node_GBps),
                    ("inter_node_Gbps", inter_node_Gbps), ("compute_s", compute_s)):
        _check(name, v, isinstance(v, Real) and v > 0, "> 0")
    _check("serial_s", serial_s, isinstance(serial_s, Real) and serial_s >= 0, ">= 0")
    _check("grad_dtype", grad_dtype, grad_dtype in BYTES_PER_ELEMENT, f"one of {sorted(BYTES_PER_ELEMENT)}")
    _check("in_network", in_network, in_network in IN_NETWORK, f"one of {IN_NETWORK}")
    dp, tp, pp, gpn, m = int(dp), int(tp), int(pp), int(gpus_per_node), int(microbatches)
    nics = gpn if nics_per_node is None else int(nics_per_node)

    buffer = params / (tp * pp) * BYTES_PER_ELEMENT[grad_dtype]
    volume = allreduce_bytes_per_rank(params, dp, grad_dtype, tp, pp)
    place = dp_placement(dp, tp, pp, gpn)
    link = allreduce_link(place, intra_node_GBps=intra_node_GBps, inter_node_Gbps=inter_node_Gbps,
                          gpus_per_node=gpn, nics_per_node=nics)
    why = ("one data-parallel rank: nothing to all-reduce" if dp == 1 else
           f"dp={dp} ranks (tp={tp}, pp={pp}, {gpn}-GPU nodes): {link.why}")
    ring_lat = 2 * (dp - 1) * link.latency_s
    tree_lat = 2 * math.ceil(math.log2(dp)) * link.latency_s if dp > 1 else 0.0
    busbw = link.busbw_GBps
    if in_network in ("nvls", "nvls+sharp") and link.name == "intra-node" and place.ranks_per_node >= NVLS_MIN_LOCAL:
        busbw *= NVLS_GAIN
        why += f"; NVLink SHARP: busbw x {NVLS_GAIN:.2f}"
    if in_network in ("sharp", "nvls+sharp") and link.name == "inter-node" and dp > 1:
        volume = buffer                        # each rank sends its buffer once; the switches add
        ring_lat = tree_lat
        why += "; SHARP: the network reduces, each NIC carries the buffer once"
    t = volume / (busbw * 1e9) + ring_lat if dp > 1 else 0.0
    if in_network in ("sharp", "nvls+sharp") and link.name == "inter-node" and dp > 1 and place.ranks_per_node > 1:
        # the switches reduce across nodes, but the node's own ranks still reduce and gather over NVLink first:
        # SHARP's 2x is bounded by that phase
        nvl = sharp_nvlink_phase_s(buffer, place.ranks_per_node, intra_node_GBps)
        if nvl > t - ring_lat:
            t = nvl + ring_lat
            why += f"; bounded by the NVLink phase among the node's {place.ranks_per_node} ranks"
    nic = gbps_to_GBps(inter_node_Gbps)
    if link.name == "inter-node":
        flat = volume / (nic * 1e9) + ring_lat
        flat_why = (f"the field report's V / B_nic = {volume / 1e9:.3g} GB / {nic:g} GB/s: it holds with one "
                    f"{inter_node_Gbps:g} Gb/s NIC per node (or a ring that crosses the network at every hop); "
                    f"NCCL on {nics} NIC{'s' * (nics > 1)} per node spreads it over {link.nics_per_group:g}")
    else:
        flat, flat_why = t, "inside one node the flat ring is the NVLink ring: the same figure"
    work = serial_s + compute_s
    window = BACKWARD_SHARE * compute_s / m
    exposed = max(0.0, t - window)
    return AllreducePlan(
        dp=dp, tp=tp, pp=pp, grad_dtype=grad_dtype, buffer_bytes=buffer, bytes_per_rank=volume,
        ranks_per_node=place.ranks_per_node, nodes=place.nodes, groups_per_node=place.groups_per_node,
        nics_per_node=nics, nics_per_group=link.nics_per_group, link=link.name, link_why=why,
        busbw_GBps=busbw, latency_s=link.latency_s, ring_latency_s=ring_lat, tree_latency_s=tree_lat,
        time_s=t, flat_s=flat, flat_why=flat_why, compute_s=compute_s, work_s=work, microbatches=m,
        hide_window_s=window, ratio=t / compute_s, exposed_overlap_s=exposed,
        efficiency_no_overlap=work / (work + t), efficiency_full_overlap=work / (work + exposed))
