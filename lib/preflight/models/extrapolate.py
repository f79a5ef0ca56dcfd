"""The staged scaling curve: 1 -> 8 -> 64 -> 512 -> target GPUs, predicted from the profile.

Data-parallel training keeps the per-GPU batch fixed (weak scaling), so one step on ``N`` GPUs takes

    T(N) = Ts + Tc + exposed_comm(N)        efficiency(N) = T(1) / T(N)

with ``Ts`` serial and ``Tc`` parallel compute per step (profile), and the gradient all-reduce plan of
``preflight.models.comm.allreduce_plan`` over ``dp = N / (tp pp)`` ranks. Inside one node the ring runs
at the NVLink-class bandwidth; as soon as it spans nodes its slowest link, the per-GPU inter-node
bandwidth, sets the pace (flat ring, ``comm.allreduce_link``; hierarchical schemes: chapter 3).

Two bounds are given: *no overlap* (the all-reduce starts after backward: the field report's
arithmetic) and *overlap* (DDP bucketing hides communication behind backward, which is about 2/3 of
compute: ``exposed = max(0, comm - 2/3 Tc)``). Real runs sit between. The stop rule of the staged
method: if the predicted (or measured) efficiency at the target falls under 60 %, fix communication
and serial overhead before buying scale.
"""
from __future__ import annotations

from preflight.models.comm import BACKWARD_SHARE, allreduce_plan  # noqa: F401 (BACKWARD_SHARE: re-export)

STOP_RULE_EFFICIENCY = 0.60     # the staged method's stop rule (pitfalls brief section 1)


def stages(target_gpus: int) -> list[int]:
    """1, 8, 64, 512 ... (x8 per stage) below the target, then the target itself."""
    out, n = [], 1
    while n < target_gpus:
        out.append(n)
        n *= 8
    out.append(target_gpus)
    return out


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
        p = allreduce_plan(params, max(1, n // (tp * pp)), grad_dtype, tp, pp, gpus_per_node=gpus_per_node,
                           intra_node_GBps=intra_node_GBps, inter_node_Gbps=inter_node_Gbps,
                           compute_s=compute_s, serial_s=serial_s)
        m = (measured or {}).get(n)
        rows.append({
            "gpus": n,
            "comm_s": p.flat_s,
            "link": p.link,
            "step_s_no_overlap": t1 + p.flat_s,
            "step_s_overlap": t1 + p.exposed_overlap_s,
            "efficiency_no_overlap": p.efficiency_no_overlap,
            "efficiency_overlap": p.efficiency_full_overlap,
            "efficiency_measured": m,
            "efficiency": m if m is not None else p.efficiency_no_overlap,
            "source": "measured" if m is not None else "model (no overlap)",
        })
    return pd.DataFrame(rows)
