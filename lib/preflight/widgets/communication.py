"""Chapter 3's slider: the AllReduce calculator (NCCL's rail-aware rings vs the flat arithmetic)."""
from __future__ import annotations

import ipywidgets as W

from preflight.core.numfmt import gb
from preflight.reporting import charts
from preflight.widgets.core import _log_slider, explorer, readout


def allreduce_explorer(params: float, dp: int, grad_dtype: str, tier: str, compute_s: float,
                       serial_s: float, gpus_per_node: int, intra_GBps: float, tp: int = 1, pp: int = 1,
                       nics_per_node: int | None = None, microbatches: int = 1) -> W.VBox:
    """Sliders: parameter count, data-parallel size D, gradient dtype, bandwidth tier, NICs per node, compute
    per step -> bytes per rank, placement and bus bandwidth, all-reduce time (rail-aware) beside the flat
    arithmetic, comm/compute, efficiency bounds: every number is ``preflight.models.comm.allreduce_plan``
    at the sliders' position (tp, pp and micro-batches fixed)."""
    import pandas as pd

    from preflight.core.hardware import LINK_TIERS_GBps
    from preflight.models import comm

    style, layout = {"description_width": "170px"}, W.Layout(width="520px")
    nics_default = nics_per_node or gpus_per_node
    nic_options = sorted({1, 2, 4, gpus_per_node, nics_default})
    controls = {
        "params": _log_slider(params, 1e8, 1e12, "parameters (count)"),
        "log2_dp": W.IntSlider(value=max(0, int(dp).bit_length() - 1), min=0, max=14, description="log2 D (DP ranks)",
                               style=style, layout=layout),
        "dtype": W.Dropdown(options=list(comm.BYTES_PER_ELEMENT), value=grad_dtype, description="gradient dtype",
                            style=style, layout=layout),
        "tier": W.Dropdown(options=list(LINK_TIERS_GBps), value=tier, description="inter-node tier", style=style,
                           layout=layout),
        "nics": W.Dropdown(options=nic_options, value=nics_default, description="NICs per node",
                           style=style, layout=layout),
        "compute_s": _log_slider(compute_s, 1e-3, 100, "compute per step (s)"),
    }

    def plan(m, d, dtype, tier, nics, compute_s):
        # tiers are per-NIC GB/s; the plan takes the network's Gb/s (x 8 then / 8: exact in binary)
        return comm.allreduce_plan(m, d, dtype, tp, pp, gpus_per_node=gpus_per_node, intra_node_GBps=intra_GBps,
                                   inter_node_Gbps=8 * LINK_TIERS_GBps[tier], nics_per_node=nics,
                                   microbatches=microbatches, compute_s=compute_s, serial_s=serial_s)

    def compute(params, log2_dp, dtype, tier, nics, compute_s):
        d, bw = 2 ** log2_dp, LINK_TIERS_GBps[tier]
        p = plan(params, d, dtype, tier, nics, compute_s)
        text = readout({
            "dp": ("data-parallel ranks D", f"{d:,}"),
            "bytes": ("bytes per rank per step", gb(p.bytes_per_rank)),
            "link": ("placement and bus bandwidth", p.link_why),
            "time_s": ("all-reduce time (NCCL rings on the rails)", f"{p.time_s:.3g} s"),
            "flat_s": ("flat arithmetic (one NIC carries it all)", f"{p.flat_s:.3g} s"),
            "ratio": ("communication / compute", f"{p.ratio:.2f}x"),
            "eff_no": ("efficiency, no overlap", f"{p.efficiency_no_overlap:.1%}"),
            "eff_ov": ("efficiency, full overlap", f"{p.efficiency_full_overlap:.1%}"),
        })
        rows = []
        for k in range(1, 15):
            q = plan(params, 2 ** k, dtype, tier, nics, compute_s)
            rows += [{"D": 2 ** k, "seconds": q.time_s, "curve": "NCCL rings (rail-aware)"},
                     {"D": 2 ** k, "seconds": q.flat_s, "curve": "flat arithmetic (one NIC)"},
                     {"D": 2 ** k, "seconds": compute_s, "curve": "compute per step"}]
        return text, charts.curves(pd.DataFrame(rows), "D", "seconds", "curve", mark_x=d,
                                   title=f"All-reduce per step: {params / 1e9:.3g}B params, {dtype}, {bw:.3g} GB/s per NIC, "
                                         f"{nics} NIC{'s' * (nics > 1)} per node")

    return explorer(controls, compute, "AllReduce calculator")
