"""What data-parallel gradients cost to move.

Ring all-reduce (Patarasuk & Yuan 2009; the NCCL convention): each of ``D`` ranks sends and
receives ``2 (D-1)/D`` times the buffer ``S`` (reduce-scatter, then all-gather), in ``2 (D-1)``
latency-bound steps::

    t = 2 (D-1)/D * S / B  +  2 (D-1) * alpha

With tensor (tp) and pipeline (pp) parallelism each data-parallel rank holds ``M / (tp pp)``
parameters. Example (pitfalls brief): 7e9 parameters in FP32, large D: about 2 * 7e9 * 4 B = 56 GB
per rank per step; at 200 Gb/s = 25 GB/s that is over 2 s, against 0.8 s of compute.

Measured bandwidths follow nccl-tests: ``algbw = S / t`` and ``busbw = algbw * 2 (D-1)/D``.

``allreduce_plan`` is the one home of a plan's gradient all-reduce (bytes, link, flat and hierarchical
time, efficiency bounds): chapters 1 and 3, the scaling curve, the calculator widget and the exercises
all read it, and ``allreduce_link`` is the one place that decides which link a ring runs on.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from numbers import Real

from preflight.hardware import INTER_NODE_LATENCY_S, INTRA_NODE_LATENCY_S

BYTES_PER_ELEMENT = {"fp32": 4, "bf16": 2, "fp16": 2}


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


def hierarchical_allreduce_time(buffer_bytes: float, gpus_per_node: int, nodes: int, intra_GBps: float,
                                inter_GBps: float, intra_latency_s: float = 0.0,
                                inter_latency_s: float = 0.0) -> float:
    """Two-level all-reduce: inside the node first, then one shard per GPU across nodes.

    1. reduce-scatter over NVLink among the ``g`` GPUs of a node: each holds 1/g of the node's sum;
    2. all-reduce of that 1/g shard across the ``N`` nodes, every GPU on its own NIC, all in parallel;
    3. all-gather over NVLink. Steps 1 + 3 cost one ring all-reduce inside the node::

        t = 2 (g-1)/g * S / B_intra + 2 (N-1)/N * (S/g) / B_inter  (+ latency terms)

    The inter-node bytes drop by ``g`` against a flat ring bound by its slowest link. Assumes one NIC
    per GPU (per-GPU inter-node bandwidth, as on HGX H100/H200 nodes); NCCL's multi-channel rings
    and trees approach it, hierarchical all-reduce in Horovod and NCCL's NVLS/CollNet implement it.
    """
    if gpus_per_node < 1 or nodes < 1:
        raise ValueError(f"gpus_per_node and nodes must be >= 1 (got {gpus_per_node}, {nodes})")
    return (ring_allreduce_time(buffer_bytes, gpus_per_node, intra_GBps, intra_latency_s)
            + ring_allreduce_time(buffer_bytes / gpus_per_node, nodes, inter_GBps, inter_latency_s))


def busbw_factor(ranks: int) -> float:
    """nccl-tests bus-bandwidth factor for all-reduce, ``2 (n-1)/n``."""
    return 2 * (ranks - 1) / ranks


# --- the gradient all-reduce plan: the one home of bytes, link, times and efficiency bounds ----------

BACKWARD_SHARE = 2.0 / 3.0      # backward ~ 2x forward: the part of compute that can hide an all-reduce


@dataclass(frozen=True)
class Link:
    """The link that paces a flat ring: its name, per-GPU bandwidth (GB/s), per-step latency and why."""
    name: str               # "intra-node" | "inter-node"
    GBps: float
    latency_s: float
    why: str


def dp_group_nodes(dp: int, tp: int, pp: int, gpus_per_node: int) -> int:
    """Nodes the data-parallel group's replicas occupy: ``ceil(dp tp pp / gpus_per_node)``.

    The placement model of the plan: the ``dp`` replicas, each ``tp x pp`` GPUs, packed onto nodes of
    ``gpus_per_node``. One node means the data-parallel group fits inside it.
    """
    return -(-dp * tp * pp // gpus_per_node)


def allreduce_link(nodes: int, intra_node_GBps: float, inter_node_Gbps: float) -> Link:
    """Which link a flat ring runs on: THE one rule of the plan (and of the sweep's assumed bandwidth).

    Inside one node every hop is NVLink-class (``intra_node_GBps``); as soon as the ring spans nodes its
    slowest hop, the per-GPU inter-node link (``inter_node_Gbps``, bits: divided by 8), sets the pace of
    every step. Latencies (alpha) come from the hardware table (``preflight.hardware``).
    """
    if nodes <= 1:
        return Link("intra-node", intra_node_GBps, INTRA_NODE_LATENCY_S,
                    f"fits inside one node: NVLink-class {intra_node_GBps:g} GB/s")
    bw = gbps_to_GBps(inter_node_Gbps)
    return Link("inter-node", bw, INTER_NODE_LATENCY_S,
                f"spans {nodes} nodes: paced by the inter-node {inter_node_Gbps:g} Gb/s = {bw:g} GB/s per GPU")


@dataclass(frozen=True)
class AllreducePlan:
    """One step's gradient all-reduce (see ``allreduce_plan``). ``as_dict()`` for tables and notebooks."""
    dp: int
    tp: int
    pp: int
    grad_dtype: str
    buffer_bytes: float             # S = M/(tp pp) x b: the gradient buffer of one rank
    bytes_per_rank: float           # 2 S (D-1)/D: sent (and received) per rank per step
    link: str                       # "intra-node" | "inter-node" (``allreduce_link``)
    link_why: str
    link_GBps: float
    link_latency_s: float
    flat_s: float                   # flat ring over ``link``
    dp_per_node: int                # hierarchical: ranks of the group inside one node ...
    dp_nodes: int                   # ... and the nodes the second stage spans
    hierarchical_s: float
    compute_s: float
    work_s: float                   # serial + compute: one GPU's step
    ratio: float                    # flat_s / compute_s
    exposed_overlap_s: float        # max(0, flat_s - BACKWARD_SHARE compute_s)
    efficiency_no_overlap: float
    efficiency_full_overlap: float

    def as_dict(self) -> dict:
        return asdict(self)


def _check(name: str, value, ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(f"{name} must be {what} (got {value!r})")


def allreduce_plan(params: float, dp: int, grad_dtype: str = "fp32", tp: int = 1, pp: int = 1, *,
                   gpus_per_node: int, intra_node_GBps: float, inter_node_Gbps: float,
                   compute_s: float, serial_s: float = 0.0) -> AllreducePlan:
    """The gradient all-reduce of one data-parallel step: bytes, link, flat and hierarchical time, bounds.

    With ``M`` parameters, ``D = dp`` ranks, ``b`` bytes per gradient element and ``S = M/(tp pp) b``:

    * bytes per rank ``2 S (D-1)/D`` (ring: reduce-scatter then all-gather, Patarasuk & Yuan 2009);
    * the link: ``allreduce_link(dp_group_nodes(dp, tp, pp, gpus_per_node))``: NVLink-class when the
      group fits inside one node, the inter-node link as soon as it spans nodes;
    * flat ring ``t = 2 (D-1)/D S / B_link + 2 (D-1) alpha_link`` (``ring_allreduce_time``);
    * hierarchical: a ring of the group's ``min(D, gpus_per_node // (tp pp))`` ranks inside a node, then
      one shard per GPU across the nodes (``hierarchical_allreduce_time``);
    * efficiency (weak scaling, ``W = serial_s + compute_s``): no overlap ``W / (W + t)``; full overlap
      ``W / (W + max(0, t - 2/3 compute_s))``: DDP buckets can hide it behind backward, ~2/3 of compute.

    Field case (pitfalls brief): 7e9 fp32 parameters, D = 1024 on 8-GPU nodes at 200 Gb/s: 56 GB per
    rank, 2.26 s flat against 0.8 s of compute. ``D = 1`` moves nothing and takes no time.
    Bad input raises ValueError naming the argument.
    """
    for name, v in (("dp", dp), ("tp", tp), ("pp", pp), ("gpus_per_node", gpus_per_node)):
        _check(name, v, isinstance(v, Real) and v >= 1 and v == int(v), "a whole number >= 1")
    for name, v in (("params", params), ("intra_node_GBps", intra_node_GBps),
                    ("inter_node_Gbps", inter_node_Gbps), ("compute_s", compute_s)):
        _check(name, v, isinstance(v, Real) and v > 0, "> 0")
    _check("serial_s", serial_s, isinstance(serial_s, Real) and serial_s >= 0, ">= 0")
    _check("grad_dtype", grad_dtype, grad_dtype in BYTES_PER_ELEMENT, f"one of {sorted(BYTES_PER_ELEMENT)}")
    dp, tp, pp, gpus_per_node = int(dp), int(tp), int(pp), int(gpus_per_node)

    buffer = params / (tp * pp) * BYTES_PER_ELEMENT[grad_dtype]
    link = allreduce_link(dp_group_nodes(dp, tp, pp, gpus_per_node), intra_node_GBps, inter_node_Gbps)
    why = ("one data-parallel rank: nothing to all-reduce" if dp == 1 else
           f"dp x tp x pp = {dp * tp * pp} GPUs on {gpus_per_node}-GPU nodes {link.why}")
    flat = ring_allreduce_time(buffer, dp, link.GBps, link.latency_s)
    per_node = min(dp, max(1, gpus_per_node // (tp * pp)))
    nodes = max(1, dp // per_node)
    hier = hierarchical_allreduce_time(buffer, per_node, nodes, intra_node_GBps, gbps_to_GBps(inter_node_Gbps),
                                       INTRA_NODE_LATENCY_S, INTER_NODE_LATENCY_S)
    work = serial_s + compute_s
    exposed = max(0.0, flat - BACKWARD_SHARE * compute_s)
    return AllreducePlan(
        dp=dp, tp=tp, pp=pp, grad_dtype=grad_dtype, buffer_bytes=buffer,
        bytes_per_rank=allreduce_bytes_per_rank(params, dp, grad_dtype, tp, pp),
        link=link.name, link_why=why, link_GBps=link.GBps, link_latency_s=link.latency_s, flat_s=flat,
        dp_per_node=per_node, dp_nodes=nodes, hierarchical_s=hier, compute_s=compute_s, work_s=work,
        ratio=flat / compute_s, exposed_overlap_s=exposed, efficiency_no_overlap=work / (work + flat),
        efficiency_full_overlap=work / (work + exposed))


# --- fitting the alpha-beta model to a measured sweep ------------------------------------------------

def fit_error_by_size(sizes_bytes, times_s, ranks: int, alpha_s: float,
                      bandwidth_GBps: float) -> list[float]:
    """Signed relative error of the ring model at each size: ``predicted / measured - 1``.

    Positive: the model is too pessimistic there (predicts more time than measured).
    Use it to judge a fit on data it was not fitted to, e.g. one cluster's fit against another run.
    """
    return [ring_allreduce_time(s, ranks, bandwidth_GBps, alpha_s) / t - 1.0
            for s, t in zip(sizes_bytes, times_s)]


def fit_alpha_beta(sizes_bytes, times_s, ranks: int) -> dict:
    """Fit ``t = 2(n-1) alpha + 2(n-1)/n * S / B`` to measured all-reduce times (least squares).

    The error minimised is *relative*, ``sum((model_i - t_i) / t_i)^2`` (weights ``1/t``): sizes in a
    sweep span five orders of magnitude, and plain least squares would let the largest message
    decide everything, leaving the latency term (which is what small buckets pay) to chance.

    Constraints: ``alpha >= 0`` and ``B > 0``. When the unconstrained intercept comes out negative
    (times grow faster than linearly, e.g. a cache or protocol switch), ``alpha`` is set to 0 and
    the slope refitted (``constrained: "alpha=0"``); that is the constrained optimum, since the
    objective is a convex quadratic. Times that do not grow with size leave no bandwidth to fit:
    ValueError (measure up to larger messages; from ~16 MB the bandwidth term dominates).

    Returns ``alpha_s``, ``bandwidth_GBps`` (GB = 1e9 B, the "bus" bandwidth ``B`` of the ring
    model, comparable with nccl-tests' busbw), ``ranks``, ``rel_error`` (signed, per size, see
    ``fit_error_by_size``), ``max_rel_error`` and ``median_rel_error`` (of the absolute values),
    ``constrained`` (None or "alpha=0").
    """
    sizes, times = [float(s) for s in sizes_bytes], [float(t) for t in times_s]
    if len(sizes) != len(times):
        raise ValueError(f"{len(sizes)} sizes but {len(times)} times")
    if ranks < 2:
        raise ValueError(f"ranks must be >= 2 to fit a ring all-reduce (got {ranks})")
    if len(set(sizes)) < 2:
        raise ValueError("need at least two distinct message sizes")
    if min(sizes) <= 0 or min(times) <= 0:
        raise ValueError("sizes and times must be > 0")
    c, f = 2.0 * (ranks - 1), 2.0 * (ranks - 1) / ranks
    # rows divided by t_i: [c / t_i, f S_i / t_i] . [alpha, 1/B] ~ 1; columns scaled to unit norm
    # so the 2x2 normal equations stay well conditioned (1/B ~ 1e-9 s/B next to alpha ~ 1e-4 s).
    u = [c / t for t in times]
    v = [f * s / t for s, t in zip(sizes, times)]
    nu, nv = sum(x * x for x in u) ** 0.5, sum(x * x for x in v) ** 0.5
    u, v = [x / nu for x in u], [x / nv for x in v]
    suv, su, sv = sum(a * b for a, b in zip(u, v)), sum(u), sum(v)
    det = 1.0 - suv * suv
    alpha = (su - suv * sv) / det / nu if det > 1e-15 else -1.0
    inv_b = (sv - suv * su) / det / nv if det > 1e-15 else 0.0
    constrained = None
    if alpha < 0:
        alpha, inv_b, constrained = 0.0, sv / nv, "alpha=0"      # unit-norm column: sum(v^2) = 1
    if inv_b <= 0:
        raise ValueError("all-reduce times do not grow with message size: no bandwidth to fit "
                         "(include messages of 16 MB or more)")
    bandwidth = 1.0 / inv_b / 1e9
    rel = fit_error_by_size(sizes, times, ranks, alpha, bandwidth)
    absr = sorted(abs(e) for e in rel)
    mid = len(absr) // 2
    median = absr[mid] if len(absr) % 2 else 0.5 * (absr[mid - 1] + absr[mid])
    return {"alpha_s": alpha, "bandwidth_GBps": bandwidth, "ranks": ranks, "rel_error": rel,
            "max_rel_error": absr[-1], "median_rel_error": median, "constrained": constrained}
