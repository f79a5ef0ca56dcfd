"""Sliders over the formulas, for JupyterLab.

Each explorer is a few sliders, a readout of the numbers the library computes for the current
position, and a chart, redrawn on every change. The chart is an SVG string (vl-convert) inside an
``HTML`` widget: no CDN, no ``Output`` widget (large outputs inside ``Output`` can hang nbclient),
and a redraw costs tens of milliseconds on a CPU.

The readout marks each number with ``data-key`` so a browser test can read it back.
"""
from __future__ import annotations

import html
from typing import Callable

import ipywidgets as W

from preflight import charts
from preflight.models import scaling


def readout(values: dict[str, tuple[str, str]]) -> str:
    """HTML table of ``{key: (label, formatted value)}``."""
    rows = "".join(
        f'<tr><td>{html.escape(label)}</td><td><b class="pf-value" data-key="{html.escape(k)}">'
        f"{html.escape(v)}</b></td></tr>" for k, (label, v) in values.items())
    return f'<table class="pf-readout">{rows}</table>'


def explorer(controls: dict[str, W.ValueWidget], compute: Callable[..., tuple[str, object]],
             title: str = "") -> W.VBox:
    """Wire ``controls`` to ``compute(**values) -> (readout_html, altair_chart)``."""
    out_text, out_chart = W.HTML(), W.HTML()

    def redraw(_=None):
        text, chart = compute(**{k: c.value for k, c in controls.items()})
        out_text.value = text
        out_chart.value = charts.to_svg(chart)

    for c in controls.values():
        c.observe(redraw, names="value")
    redraw()
    head = [W.HTML(f"<h4>{html.escape(title)}</h4>")] if title else []
    box = W.VBox(head + [W.VBox(list(controls.values())), out_text, out_chart])
    box.redraw = redraw  # for tests
    return box


def amdahl_explorer(ts: float, tc: float, n: int, n_max: int = 16384) -> W.VBox:
    """Sliders: serial time Ts, parallel time Tc (s), workers N (powers of two)."""
    style = {"description_width": "170px"}
    layout = W.Layout(width="520px")
    hi = max(ts, tc) * 4 or 1.0

    def seconds(value: float, label: str, low: float) -> W.FloatSlider:
        # the step divides the start value exactly, so the browser starts where Python does
        step = value / 100 if value > 0 else hi / 1000
        return W.FloatSlider(value=value, min=low * step, max=step * round(hi / step), step=step,
                             description=label, readout_format=".4g", style=style, layout=layout)

    controls = {
        "ts": seconds(ts, "serial Ts (s)", 0),
        "tc": seconds(tc, "parallel Tc (s)", 1),
        "n": W.IntSlider(value=max(0, int(n).bit_length() - 1), min=0, max=n_max.bit_length() - 1,
                         description="log2 N (workers)", style=style, layout=layout),
    }

    def compute(ts, tc, n):
        n_workers = 2 ** n
        s = scaling.amdahl_speedup(ts, tc, n_workers)
        ceil = scaling.amdahl_ceiling(ts, tc)
        text = readout({
            "n": ("N workers", f"{n_workers}"),
            "speedup": ("Amdahl speedup S(N)", f"{s:.2f}x"),
            "efficiency": ("efficiency S(N)/N", f"{s / n_workers:.1%}"),
            "ceiling": ("ceiling 1 + Tc/Ts", "unbounded" if ceil == float("inf") else f"{ceil:.2f}x"),
            "gustafson": ("Gustafson scaled speedup", f"{scaling.gustafson_speedup(scaling.serial_fraction(ts, tc), n_workers):.1f}x"),
        })
        return text, charts.amdahl_chart(ts, tc, n_max=max(n_workers, 1024), n_mark=n_workers)

    return explorer(controls, compute, "Amdahl / Gustafson explorer")


def _log_slider(value: float, low: float, high: float, label: str, step: float = 0.01) -> W.FloatLogSlider:
    """A log-scale slider whose grid of exponents passes exactly through ``value`` (so it starts at
    the number the tables show, not at the nearest grid point)."""
    import math

    e = math.log10(value)
    lo = e - step * math.floor((e - math.log10(low)) / step)
    hi = e + step * math.floor((math.log10(high) - e) / step)
    return W.FloatLogSlider(value=value, base=10, min=lo, max=hi, step=step,
                            description=label, readout_format=".3g", style={"description_width": "170px"},
                            layout=W.Layout(width="520px"))


def listing_explorer(files: int, per_file_ms: float, mean_file_kB: float) -> W.VBox:
    """Sliders: file count x per-file metadata latency -> start-up listing time, vs shards."""
    from preflight.models import data as M

    controls = {"files": _log_slider(files, 1e3, 1e10, "files"),
                "per_file_ms": _log_slider(per_file_ms, 1e-3, 100, "stat per file (ms)"),
                "shard_MB": W.IntSlider(value=256, min=16, max=1024, step=16, description="shard size (MB)",
                                        style={"description_width": "170px"}, layout=W.Layout(width="520px"))}

    def compute(files, per_file_ms, shard_MB):
        n = int(files)
        t = M.listing_time_s(n, "lustre", per_file_ms / 1e3)
        shards = M.shard_count(n, mean_file_kB, shard_MB)
        ts = M.listing_time_s(shards, "lustre", per_file_ms / 1e3)
        text = readout({"listing_s": ("listing, small files", f"{t:,.1f} s ({t / 60:,.1f} min)"),
                        "shards": (f"shards of {shard_MB} MB", f"{shards:,}"),
                        "listing_shards_s": ("listing, shards", f"{ts:,.3g} s")})
        import pandas as pd

        xs = [10 ** (k / 4) for k in range(12, 41)]
        # gpfs is assumed equal to lustre and object stores list in pages: drawn lines would hide each other
        df = pd.DataFrame([{"files": x, "listing (s)": M.listing_time_s(int(x), "lustre", lat.stat_s if s != "slider"
                                                                          else per_file_ms / 1e3), "storage": s}
                           for x in xs for s, lat in [*M.METADATA_LATENCY.items(), ("slider", None)]
                           if s not in ("object", "gpfs")])
        df["storage"] = df["storage"].replace({"lustre": "lustre / gpfs", "slider": "your latency (slider)"})
        return text, charts.curves(df, "files", "listing (s)", "storage", mark_x=n,
                                   title="Start-up listing time (one client, serial)")

    return explorer(controls, compute, "Small files: listing time explorer")


def supply_explorer(supply: float, consume: float, measured_idle: float | None = None) -> W.VBox:
    """Sliders: supply vs consumption rate (samples/s) -> headroom, device idle share, verdict."""
    from preflight.findings import judge
    from preflight.models import data as M

    hi = max(supply, consume) * 10
    controls = {"supply": _log_slider(supply, hi / 1e4, hi, "supply (samples/s)"),
                "consume": _log_slider(consume, hi / 1e4, hi, "consumption (samples/s)")}

    def compute(supply, consume):
        import pandas as pd

        h = M.headroom(supply, consume)
        text = readout({"headroom": ("headroom supply/consumption", f"{h:.2f}x"),
                        "idle": ("device idle (steady state, lower bound)", f"{M.idle_share(supply, consume):.1%}"),
                        "verdict": ("1.2x rule", judge(h, warn=M.HEADROOM_RULE, fail=M.HEADROOM_FAIL)[0]),
                        **({"measured_idle": ("measured idle at the starting point (jitter, transfer)",
                                              f"{measured_idle:.1%}")} if measured_idle is not None else {})})
        ratios = [10 ** (k / 20) for k in range(-20, 21)]
        df = pd.DataFrame([{"supply / consumption": r, "device idle": M.idle_share(r, 1.0), "curve": "idle share"}
                           for r in ratios])
        return text, charts.curves(df, "supply / consumption", "device idle", "curve", mark_x=h, log_y=False,
                                   title="Device idle share vs headroom (rule: 1.2x)", y_format="%", x_format="~g")

    return explorer(controls, compute, "Supply vs consumption explorer")


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


def bubble_explorer(p: int, m: int, schedule: str, v: int = 1) -> W.VBox:
    """Sliders: stages p, micro-batches m, schedule, chunks v, one slow stage -> bubble share of total
    time (p-1)/(v m + p-1), bubble over ideal (p-1)/(v m), the popular (wrong) (p-1)/(m p), the share
    simulated from the schedule, activation memory of the first stage; the Gantt chart redrawn."""
    from preflight.models import pipeline as P

    style, layout = {"description_width": "170px"}, W.Layout(width="520px")
    controls = {
        "p": W.IntSlider(value=max(1, p), min=1, max=16, description="stages p", style=style, layout=layout),
        "m": W.IntSlider(value=max(1, m), min=1, max=64, description="micro-batches m", style=style, layout=layout),
        "schedule": W.Dropdown(options=["gpipe", "1f1b", "interleaved"], value=schedule, description="schedule",
                               style=style, layout=layout),
        "v": W.IntSlider(value=max(1, v), min=1, max=4, description="chunks v (interleaved)", style=style,
                         layout=layout),
        "slow": W.FloatSlider(value=1.0, min=1.0, max=3.0, step=0.1, description="last stage slower (x)",
                              style=style, layout=layout),
    }

    def compute(p, m, schedule, v, slow):
        v = max(2, v) if schedule == "interleaved" else 1      # interleaving means v >= 2 chunks
        if schedule == "interleaved" and m % p:          # Megatron's interleaved schedule needs it
            m = p * -(-m // p)
        note = {"m_used": ("simulated (interleaved: m a multiple of p, v >= 2)", f"m={m}, v={v}")} \
            if schedule == "interleaved" else {}
        scale = [1.0] * (p - 1) + [slow]
        tl = P.schedule_timeline(p, m, schedule, v=v, stage_scale=scale)
        text = readout({
            "bubble": ("bubble share of total time (p-1)/(v m + p-1)", f"{P.bubble_fraction(p, m, v):.1%}"),
            "over_ideal": ("bubble over ideal time (p-1)/(v m)", f"{P.bubble_over_ideal(p, m, v):.1%}"),
            "wrong": ("popular estimate (p-1)/(m p): wrong", f"{P.wrong_bubble(p, m):.1%}"),
            "simulated": ("idle share of this schedule (simulated, with the slow stage)",
                          f"{P.timeline_bubble(tl):.1%}"),
            "activations": ("micro-batches held by stage 0 (activation memory)",
                            f"{P.activation_memory_microbatches(p, m, schedule, 0, v=v):.3g}"),
            **note,
        })
        return text, charts.gantt(tl, title=f"{schedule}, p={p}, m={m}" + (f", v={v}" if v > 1 else ""))

    return explorer(controls, compute, "Pipeline bubble explorer")
