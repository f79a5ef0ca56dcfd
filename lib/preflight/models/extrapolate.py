"""The staged scaling curve: 1 -> 8 -> 64 -> 512 -> target GPUs, predicted from the profile.

Data-parallel training keeps the per-GPU batch fixed (weak scaling), so one step on ``N`` GPUs takes

    T(N) = Ts + Tc + exposed_comm(N)        efficiency(N) = T(1) / T(N)

with ``Ts`` serial and ``Tc`` parallel compute per step (profile), and the gradient all-reduce of
``preflight.models.comm`` over ``dp = N / (tp pp)`` ranks. Inside one node the ring runs at the
NVLink-class bandwidth; as soon as it spans nodes its slowest link, the per-GPU inter-node bandwidth,
sets the pace (flat ring; hierarchical schemes are compared in chapter 3).

Two bounds are given: *no overlap* (the all-reduce starts after backward: the field report's
arithmetic) and *overlap* (DDP bucketing hides communication behind backward, which is about 2/3 of
compute: ``exposed = max(0, comm - 2/3 Tc)``). Real runs sit between. The stop rule of the staged
method: if the predicted (or measured) efficiency at the target falls under 60 %, fix communication
and serial overhead before buying scale.
"""
from __future__ import annotations

from preflight.hardware import INTER_NODE_LATENCY_S, INTRA_NODE_LATENCY_S
from preflight.models.comm import BYTES_PER_ELEMENT, gbps_to_GBps, ring_allreduce_time

STOP_RULE_EFFICIENCY = 0.60     # the staged method's stop rule (pitfalls brief section 1)
BACKWARD_SHARE = 2.0 / 3.0      # backward ~ 2x forward: the part of compute that can hide an all-reduce


def stages(target_gpus: int) -> list[int]:
    """1, 8, 64, 512 ... (x8 per stage) below the target, then the target itself."""
    out, n = [], 1
    while n < target_gpus:
        out.append(n)
        n *= 8
    out.append(target_gpus)
    return out


def comm_time(n_gpus: int, *, params: float, grad_dtype: str, tp: int, pp: int,
              gpus_per_node: int, intra_node_GBps: float, inter_node_Gbps: float) -> float:
    """Seconds of gradient all-reduce per step on ``n_gpus`` (flat ring, slowest link)."""
    dp = max(1, n_gpus // (tp * pp))
    if dp == 1:
        return 0.0
    buffer = params / (tp * pp) * BYTES_PER_ELEMENT[grad_dtype]     # gradient bytes per rank
    if n_gpus <= gpus_per_node:
        return ring_allreduce_time(buffer, dp, intra_node_GBps, INTRA_NODE_LATENCY_S)
    return ring_allreduce_time(buffer, dp, gbps_to_GBps(inter_node_Gbps), INTER_NODE_LATENCY_S)


def scaling_curve(*, serial_s: float, compute_s: float, params: float, grad_dtype: str,
                  tp: int, pp: int, gpus_per_node: int, intra_node_GBps: float,
                  inter_node_Gbps: float, target_gpus: int, ns: list[int] | None = None,
                  measured: dict[int, float] | None = None):
    """Predicted step time and efficiency per stage, as a DataFrame.

    ``measured`` maps GPU counts to measured efficiencies (records from ``preflight.bench.scaling``
    run on the real cluster); where present they are shown next to the prediction and are what the
    ``efficiency`` column (the one the verdict reads) uses.
    """
    import pandas as pd

    ns = ns or stages(target_gpus)
    t1 = serial_s + compute_s
    rows = []
    for n in ns:
        c = comm_time(n, params=params, grad_dtype=grad_dtype, tp=tp, pp=pp,
                      gpus_per_node=gpus_per_node, intra_node_GBps=intra_node_GBps,
                      inter_node_Gbps=inter_node_Gbps)
        no_overlap = t1 + c
        overlap = t1 + max(0.0, c - BACKWARD_SHARE * compute_s)
        m = (measured or {}).get(n)
        rows.append({
            "gpus": n,
            "comm_s": c,
            "step_s_no_overlap": no_overlap,
            "step_s_overlap": overlap,
            "efficiency_no_overlap": t1 / no_overlap,
            "efficiency_overlap": t1 / overlap,
            "efficiency_measured": m,
            "efficiency": m if m is not None else t1 / no_overlap,
            "source": "measured" if m is not None else "model (no overlap)",
        })
    return pd.DataFrame(rows)
