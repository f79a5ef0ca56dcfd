"""Chapter 3's slider: the AllReduce calculator (flat ring vs hierarchical)."""
from __future__ import annotations

import ipywidgets as W

from preflight import charts
from preflight.widgets.core import _log_slider, explorer, readout


def allreduce_explorer(params: float, dp: int, grad_dtype: str, tier: str, compute_s: float,
                       serial_s: float, gpus_per_node: int, intra_GBps: float) -> W.VBox:
    """Sliders: parameters M, data-parallel size D, gradient dtype, bandwidth tier, compute per step ->
    bytes per rank, flat-ring and hierarchical all-reduce time, comm/compute, efficiency bounds."""
    import pandas as pd

    from preflight.chapters.communication import TIERS_GBps
    from preflight.hardware import INTER_NODE_LATENCY_S, INTRA_NODE_LATENCY_S
    from preflight.models import comm
    from preflight.models.extrapolate import BACKWARD_SHARE

    style, layout = {"description_width": "170px"}, W.Layout(width="520px")
    controls = {
        "params": _log_slider(params, 1e8, 1e12, "parameters M"),
        "log2_dp": W.IntSlider(value=max(0, int(dp).bit_length() - 1), min=0, max=14, description="log2 D (DP ranks)",
                               style=style, layout=layout),
        "dtype": W.Dropdown(options=list(comm.BYTES_PER_ELEMENT), value=grad_dtype, description="gradient dtype",
                            style=style, layout=layout),
        "tier": W.Dropdown(options=list(TIERS_GBps), value=tier, description="inter-node tier", style=style,
                           layout=layout),
        "compute_s": _log_slider(compute_s, 1e-3, 100, "compute per step (s)"),
    }

    def times(m, d, dtype, bw):
        buf = m * comm.BYTES_PER_ELEMENT[dtype]
        inter = d > gpus_per_node       # inside one node the ring runs on NVLink, across nodes on the tier
        flat = (comm.ring_allreduce_time(buf, d, bw, INTER_NODE_LATENCY_S) if inter
                else comm.ring_allreduce_time(buf, d, intra_GBps, INTRA_NODE_LATENCY_S))
        g, nodes = min(d, gpus_per_node), max(1, d // gpus_per_node)
        hier = comm.hierarchical_allreduce_time(buf, g, nodes, intra_GBps, bw, INTRA_NODE_LATENCY_S,
                                                INTER_NODE_LATENCY_S)
        return flat, hier

    def compute(params, log2_dp, dtype, tier, compute_s):
        d, bw = 2 ** log2_dp, TIERS_GBps[tier]
        flat, hier = times(params, d, dtype, bw)
        work = serial_s + compute_s
        eff_no = work / (work + flat)
        eff_ov = work / (work + max(0.0, flat - BACKWARD_SHARE * compute_s))
        text = readout({
            "bytes": ("bytes per rank per step", f"{comm.allreduce_bytes_per_rank(params, d, dtype) / 1e9:.3g} GB"),
            "flat_s": ("flat ring time", f"{flat:.3g} s"),
            "hier_s": ((f"hierarchical ({gpus_per_node} per node over {intra_GBps:g} GB/s, then across nodes)"
                        if d > gpus_per_node else f"hierarchical (one node: the same NVLink ring, {intra_GBps:g} GB/s)"),
                       f"{hier:.3g} s"),
            "ratio": ("communication / compute", f"{flat / compute_s:.2f}x"),
            "eff_no": ("efficiency, no overlap", f"{eff_no:.1%}"),
            "eff_ov": ("efficiency, full overlap", f"{eff_ov:.1%}"),
        })
        rows = []
        for k in range(1, 15):
            f, h = times(params, 2 ** k, dtype, bw)
            rows += [{"D": 2 ** k, "seconds": f, "curve": "flat ring"},
                     {"D": 2 ** k, "seconds": max(h, 1e-6), "curve": "hierarchical"},
                     {"D": 2 ** k, "seconds": compute_s, "curve": "compute per step"}]
        return text, charts.curves(pd.DataFrame(rows), "D", "seconds", "curve", mark_x=d,
                                   title=f"All-reduce per step: {params / 1e9:.3g}B params, {dtype}, {bw:.3g} GB/s")

    return explorer(controls, compute, "AllReduce calculator")
