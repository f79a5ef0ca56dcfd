"""Chapter 3's slider: the AllReduce calculator (flat ring vs hierarchical)."""
from __future__ import annotations

import ipywidgets as W

from preflight import charts
from preflight.numfmt import gb
from preflight.widgets.core import _log_slider, explorer, readout


def allreduce_explorer(params: float, dp: int, grad_dtype: str, tier: str, compute_s: float,
                       serial_s: float, gpus_per_node: int, intra_GBps: float, tp: int = 1, pp: int = 1) -> W.VBox:
    """Sliders: parameters M, data-parallel size D, gradient dtype, bandwidth tier, compute per step ->
    bytes per rank, link, flat-ring and hierarchical all-reduce time, comm/compute, efficiency bounds:
    every number is ``preflight.models.comm.allreduce_plan`` at the sliders' position (tp and pp fixed)."""
    import pandas as pd

    from preflight.hardware import LINK_TIERS_GBps
    from preflight.models import comm

    style, layout = {"description_width": "170px"}, W.Layout(width="520px")
    controls = {
        "params": _log_slider(params, 1e8, 1e12, "parameters M"),
        "log2_dp": W.IntSlider(value=max(0, int(dp).bit_length() - 1), min=0, max=14, description="log2 D (DP ranks)",
                               style=style, layout=layout),
        "dtype": W.Dropdown(options=list(comm.BYTES_PER_ELEMENT), value=grad_dtype, description="gradient dtype",
                            style=style, layout=layout),
        "tier": W.Dropdown(options=list(LINK_TIERS_GBps), value=tier, description="inter-node tier", style=style,
                           layout=layout),
        "compute_s": _log_slider(compute_s, 1e-3, 100, "compute per step (s)"),
    }

    def plan(m, d, dtype, tier, compute_s):
        # tiers are per-GPU GB/s; the plan takes the network's Gb/s (x 8 then / 8: exact in binary)
        return comm.allreduce_plan(m, d, dtype, tp, pp, gpus_per_node=gpus_per_node, intra_node_GBps=intra_GBps,
                                   inter_node_Gbps=8 * LINK_TIERS_GBps[tier], compute_s=compute_s,
                                   serial_s=serial_s)

    def compute(params, log2_dp, dtype, tier, compute_s):
        d, bw = 2 ** log2_dp, LINK_TIERS_GBps[tier]
        p = plan(params, d, dtype, tier, compute_s)
        text = readout({
            "bytes": ("bytes per rank per step", gb(p.bytes_per_rank)),
            "link": ("link of the flat ring", p.link_why),
            "flat_s": ("flat ring time", f"{p.flat_s:.3g} s"),
            "hier_s": ((f"hierarchical ({p.dp_per_node} per node over {intra_GBps:g} GB/s, then across nodes)"
                        if p.link == "inter-node" else
                        f"hierarchical (one node: the same NVLink ring, {intra_GBps:g} GB/s)"),
                       f"{p.hierarchical_s:.3g} s"),
            "ratio": ("communication / compute", f"{p.ratio:.2f}x"),
            "eff_no": ("efficiency, no overlap", f"{p.efficiency_no_overlap:.1%}"),
            "eff_ov": ("efficiency, full overlap", f"{p.efficiency_full_overlap:.1%}"),
        })
        rows = []
        for k in range(1, 15):
            q = plan(params, 2 ** k, dtype, tier, compute_s)
            rows += [{"D": 2 ** k, "seconds": q.flat_s, "curve": "flat ring"},
                     {"D": 2 ** k, "seconds": max(q.hierarchical_s, 1e-6), "curve": "hierarchical"},
                     {"D": 2 ** k, "seconds": compute_s, "curve": "compute per step"}]
        return text, charts.curves(pd.DataFrame(rows), "D", "seconds", "curve", mark_x=d,
                                   title=f"All-reduce per step: {params / 1e9:.3g}B params, {dtype}, {bw:.3g} GB/s")

    return explorer(controls, compute, "AllReduce calculator")
