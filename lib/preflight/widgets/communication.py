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


def a2a_explorer(profile, gpu_key: str | None = None, label: str = "") -> W.VBox:
    """Chapter 3's MoE explorer: expert-parallel size, node-limited routing, fp8 dispatch, overlap and the NIC
    speed -> a token's network and NVLink copies, the bytes and time of one MoE layer's all-to-alls
    (``preflight.models.moe.a2a_layer``), and per step what they total and what compute leaves exposed (the
    step model). Every number is ``preflight.chapters.moe_tables.a2a_row`` at the sliders' position.
    ``profile`` must have experts (``moe_tables.moe_profile`` gives an example); ``label`` names it."""
    import pandas as pd

    from preflight.chapters import moe_tables as M

    style, layout = {"description_width": "170px"}, W.Layout(width="520px")
    t, c = profile.training, profile.cluster
    eps = [n for n in M.valid_eps(profile) if n > 1] or [t.ep]
    most = max(M.domains(profile, n) for n in eps)
    limits = [("every node", 0)] + [(str(n), n) for n in range(1, max(2, most) + 1)]
    nics = sorted({100.0, 200.0, 400.0, 800.0, float(c.inter_node_Gbps)})
    controls = {
        "ep": W.SelectionSlider(options=eps, value=t.ep if t.ep in eps else eps[-1], description="expert parallel ep",
                                style=style, layout=layout),
        "limit": W.Dropdown(options=limits, value=t.moe_node_limit if (t.moe_node_limit or 0) <= most else 0,
                            description="nodes per token at most", style=style, layout=layout),
        "fp8": W.Checkbox(value=t.moe_dispatch_fp8, description="fp8 dispatch (combine stays bf16)",
                          style={"description_width": "initial"}, layout=layout),
        "overlap": W.Checkbox(value=t.moe_a2a_overlap, description="overlap with another micro-batch (DualPipe)",
                              style={"description_width": "initial"}, layout=layout),
        "nic": W.Dropdown(options=[(f"{g:g} Gb/s", g) for g in nics], value=float(c.inter_node_Gbps),
                          description="NIC speed", style=style, layout=layout),
    }

    def compute(ep, limit, fp8, overlap, nic):
        q = profile.model_copy(update={"cluster": c.model_copy(update={"inter_node_Gbps": nic})})

        def row(n):
            return M.a2a_row(q, ep=n, node_limit=limit or None, fp8_dispatch=fp8, overlap=overlap, gpu_key=gpu_key)

        r = row(ep)
        values = {
            "domains": ("NVLink domains the experts span", f"{r['domains']} ({r['gpus_per_domain']} GPUs each)"),
            "network_copies": ("network copies of a token per all-to-all", f"{r['network_copies']:.3g}"),
            "nvlink_copies": ("NVLink copies of a token per all-to-all", f"{r['nvlink_copies']:.3g}"),
            "count": ("all-to-alls per MoE layer and micro-batch", f"{r['a2a_per_layer']}"),
            "network_MB": ("across the network, per GPU, layer and micro-batch", f"{r['network_MB']:,.4g} MB"),
            "nvlink_MB": ("inside the NVLink domain, per GPU, layer and micro-batch", f"{r['nvlink_MB']:,.4g} MB"),
            "layer_ms": ("one layer's all-to-alls (the slower link sets it)", f"{r['layer_ms']:.3g} ms"),
        }
        if r["step_s"] is not None:
            values.update({
                "a2a_all_s": ("all-to-alls per step, all of them", f"{r['a2a_all_s']:.3g} s"),
                "a2a_exposed_s": ("exposed (compute does not hide it)", f"{r['a2a_exposed_s']:.3g} s"),
                "compute_s": ("compute per step", f"{r['compute_s']:.3g} s"),
                "share": ("exposed all-to-all, share of the step", f"{r['exposed_share']:.1%} of {r['step_s']:.3g} s"),
            })
        y = "seconds per step" if r["step_s"] is not None else "MB per layer"
        series = ({"all-to-all, all": "a2a_all_s", "all-to-all, exposed": "a2a_exposed_s", "compute": "compute_s"}
                  if r["step_s"] is not None else {"network": "network_MB", "NVLink": "nvlink_MB"})
        if r["step_s"] is not None and not overlap:              # blocking: all of it is exposed, one line
            series = {"all-to-all (blocking: all exposed)": "a2a_all_s", "compute": "compute_s"}
        rows = []
        for n in eps:
            rn = row(n)
            rows += [{"ep": n, y: rn[key], "curve": name} for name, key in series.items()]
        chart = charts.curves(pd.DataFrame(rows), "ep", y, "curve", mark_x=ep, log_y=False, x_format="~g",
                              x_title="expert-parallel GPUs ep",
                              title=f"MoE all-to-alls over ep{f' ({label})' if label else ''}: "
                                    f"{'every node' if not limit else f'at most {limit} nodes'}, "
                                    f"{'fp8' if fp8 else 'bf16'} dispatch, {'overlapped' if overlap else 'blocking'}")
        return readout(values), chart

    return explorer(controls, compute, "All-to-all explorer" + (f": {label}" if label else ""))
