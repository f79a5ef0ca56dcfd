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


# -- chapter 5: failures and checkpoint intervals ----------------------------------------------------
# Numbers are written the way people read them: three significant digits, thousands separators, no
# scientific notation except for probabilities per node-day (1.0e-4), durations in the unit that fits.

_YEAR_S = 365.25 * 86400
_MANTISSAS = (1, 1.1, 1.2, 1.3, 1.5, 1.6, 1.8, 2, 2.2, 2.5, 2.8, 3, 3.3, 3.6, 4, 4.5, 5, 5.5, 6, 6.5, 7, 7.5, 8, 9)


def _num(x: float) -> str:
    """``1,875``, ``78.1``, ``0.426``: three significant digits below 100, whole numbers with commas
    above, short scientific notation only below 0.001."""
    if x != x:
        return "—"
    if x == float("inf"):
        return "unbounded"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return "0" if x == 0 else f"{x:.3g}" if abs(x) >= 1e-3 else _sci(x)


def _sci(p: float, digits: int = 2) -> str:
    """``1.0e-4``, ``3.78e-3``: short scientific notation (no padded exponent, no ``+``)."""
    if p == 0:
        return "0"
    m, e = f"{p:.{digits - 1}e}".split("e")
    if digits > 2:
        m = m.rstrip("0")
        m = m + "0" if m.endswith(".") else m
    return f"{m}e{int(e)}"


def _duration(seconds: float) -> str:
    """``45 s``, ``53.7 min``, ``7.91 h``, ``78.1 d``, ``2,740 years``: the unit that fits."""
    if seconds != seconds:
        return "—"
    if seconds == float("inf"):
        return "unbounded"
    for limit, div, unit in ((120, 1, "s"), (7200, 60, "min"), (172801, 3600, "h"), (2 * _YEAR_S, 86400, "d")):
        if seconds < limit:                                   # up to 48 h in hours: walltimes read so
            return f"{_num(seconds / div)} {unit}"
    return f"{_num(seconds / _YEAR_S)} years"


def _interval(seconds: float) -> str:
    """``7.91 h (28,460 s)``: readable, then the seconds a configuration file wants."""
    text = _duration(seconds)
    return text + (f" ({seconds:,.0f} s)" if 120 <= seconds < float("inf") else "")


def _span(lo: float, hi: float) -> str:
    """``3.8–20 h``: two durations in one unit (the one that fits their geometric middle)."""
    mid = (lo * hi) ** 0.5
    for limit, div, unit in ((120, 1, "s"), (7200, 60, "min"), (172801, 3600, "h"), (2 * _YEAR_S, 86400, "d"),
                             (float("inf"), _YEAR_S, "years")):
        if mid < limit:
            two = [f"{v / div:,.0f}" if v / div >= 100 else f"{v / div:.2g}" for v in (lo, hi)]
            return f"{two[0]}–{two[1]} {unit}"


def _hours(h: float) -> str:
    """MTBF: ``1,875 h (78.1 d)``, ``3.09 h``, ``49 min``, ``24,038,462 h (2,742 years)``."""
    if h == float("inf"):
        return "unbounded (no failures)"
    if h < 1:
        return _duration(h * 3600)
    return f"{_num(h)} h" + (f" ({_duration(h * 3600)})" if h >= 48 else "")


def _pct(x: float) -> str:
    """A share or probability in percent, three significant digits: ``0.426%``, ``9.52%``, ``<0.001%``,
    ``>99.9%``."""
    if x != x:
        return "—"
    if x <= 0:
        return "0%"
    if x >= 1:
        return "100%"
    if x > 0.999:
        return ">99.9%"
    return "<0.001%" if x < 1e-5 else f"{100 * x:#.3g}".rstrip(".") + "%"      # 0.270%: digits kept


def _points(x: float) -> str:
    """A difference of shares in percentage points: ``+0.924 points``, ``≈0 (<0.001 points)``."""
    return f"{100 * x:+.3g} points" if abs(x) >= 1e-5 else "≈0 (<0.001 points)"


def _one_in(x: float, per: str = "") -> str:
    """``1 in 10,500 days``: a small probability as odds."""
    return f"1 in {float(f'{1 / x:.3g}'):,.0f}{per}"


def _plural(n: float, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def _round_end(value: float, up: bool) -> float:
    """The nearest round value (``_MANTISSAS`` x a power of ten) at or above (``up``) / below ``value``."""
    import math

    e = math.floor(math.log10(value))
    grid = [float(f"{m}e{k}") for k in (e - 1, e, e + 1) for m in _MANTISSAS]
    return min(g for g in grid if g >= value * (1 - 1e-12)) if up else max(g for g in grid if g <= value * (1 + 1e-12))


def _round_grid(value: float, low: float, high: float, integer: bool = False) -> list[float]:
    """Round values from ``low`` to ``high`` (themselves round), about 24 a decade evenly spread on a
    log scale, containing ``value`` exactly: it replaces a grid value within 3 % of it, or is inserted.
    A ``value`` outside the ends widens them to the next round value; 0 is kept as the first option."""
    import math

    if value > 0:
        low, high = min(low, _round_end(value, up=False)), max(high, _round_end(value, up=True))
    grid = {float(round(v)) if integer else v
            for k in range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1)
            for v in (float(f"{m}e{k}") for m in _MANTISSAS) if low * (1 - 1e-12) <= v <= high * (1 + 1e-12)}
    low, high = float(low), float(high)
    grid |= {low, high}
    if value > 0:
        grid = {g for g in grid if g in (low, high) or abs(g - value) > 0.03 * value} | {value}
    return ([0.0] if value == 0 else []) + sorted(grid)


def _choice_slider(value: float, low: float, high: float, label: str, fmt: Callable[[float], str],
                   integer: bool = False) -> W.SelectionSlider:
    """A slider over round values (``_round_grid``) that starts exactly at ``value`` and reads naturally
    (``fmt`` writes each option); its ``value`` is the number itself."""
    value = float(int(round(value)) if integer else value)
    grid = _round_grid(value, low, high, integer)
    options = [(fmt(v), int(v) if integer else v) for v in grid]
    return W.SelectionSlider(options=options, value=int(value) if integer else value, description=label,
                             style={"description_width": "170px"}, layout=W.Layout(width="520px"))


def _count_label(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:g}" if v == float(f"{v:.2g}") else f"{v:.3g}"


def failure_explorer(p_node_day: float, nodes: int, days: int) -> W.VBox:
    """Sliders: per-node daily failure probability, nodes (whole numbers), run length -> probability of
    at least one failure per day and per run, the system MTBF, expected failures per run
    (``models.resilience``). The sliders step through round values (1.0e-4, 1.2e-4, ...; 1, 2, ...,
    1,000, 1,100, ...) and start exactly at the given numbers."""
    from preflight.models import resilience as F

    p0 = min(max(float(p_node_day), 0.0), 1.0)
    d0 = max(1, int(round(days)))
    controls = {"p": _choice_slider(p0 if p0 == 0 else min(max(p0, 1e-7), 0.9), 1e-6, 1e-1,
                                    "failure prob. per node-day",
                                    lambda v: _sci(v, 2) if v == float(f"{v:.2g}") else _sci(v, 3)),
                "nodes": _choice_slider(max(1, int(round(nodes))), 1, 100_000, "nodes", _count_label, integer=True),
                "days": W.IntSlider(value=d0, min=1, max=max(365, d0), description="run length (days)",
                                    style={"description_width": "170px"}, layout=W.Layout(width="520px"))}

    def compute(p, nodes, days):
        n = int(nodes)
        mtbf = F.system_mtbf_h(p, n)
        p_day, p_run = F.failure_prob(p, n), F.failure_prob(p, n, days)
        text = readout({
            "p": ("per-node daily failure probability",
                  (_sci(p, 3) + (f" ({_one_in(p)})" if p > 0 else "")) if p < 0.01 else _pct(p)),
            "nodes": ("nodes", f"{n:,}"),
            "p_day": ("P(at least one node failure per day)",
                      _pct(p_day) + (f" ({_one_in(p_day, ' days')})" if 0 < p_day < 0.01 else "")),
            "p_run": (f"P(at least one failure in {_plural(days, 'day')})", _pct(p_run)),
            "mtbf_h": ("system MTBF", _hours(mtbf)),
            "failures_run": ("expected failures per run", _num(F.run_failures(p, n, days))),
        })
        return text, charts.failure_prob_chart(p, n, max(days, 30))

    return explorer(controls, compute, "Node failures explorer")


def interval_explorer(C: float, R: float, M_h: float, plan_interval_s: float | None = None,
                      segments: int = 20000, walltime_h: float | None = None) -> W.VBox:
    """Sliders: checkpoint write cost C, restart cost R, system MTBF -> Young's and Daly's intervals,
    the simulated optimum (a stable number and the range of intervals the simulation cannot tell from
    it), the waste at each, the first-order formula's error, the restart share; the waste curve redrawn
    (``models.resilience.waste_curve`` with ``segments`` per interval and seed 0, as the chapter's
    table: the same numbers; about 0.1 s a redraw). ``walltime_h``: drawn on the chart, and the readout
    warns when the optimum is longer. When C + R reaches the MTBF the readout says there is no
    progress and shows no intervals."""
    from preflight.models import resilience as F

    controls = {"C": _choice_slider(max(C, 1e-3), 1, 3600, "checkpoint write C (s)", _count_label),
                "R": _choice_slider(max(R, 0.0), 1, 7200, "restart R (s)", _count_label),
                "M_h": _choice_slider(max(M_h, 1e-3) if M_h < float("inf") else 1e5, 0.1, 1e5, "system MTBF (h)",
                                      _count_label)}
    walltime_s = walltime_h * 3600.0 if walltime_h else None

    def compute(C, R, M_h):
        M = M_h * 3600.0
        kind, why = F.regime(C, R, M)
        stuck = kind == "no_progress"
        curve = F.waste_curve(C, R, M, segments=segments, seed=0)
        young, daly = F.young_interval(C, M), F.daly_interval(C, M)
        lo, hi, best = F.optimal_range_simulated(curve)
        blind = not stuck and not F.simulation_resolves_optimum(curve)     # too few failures drawn
        sim = F.simulate_waste(best, C, R, M, segments=segments, seed=0)
        sim_young = F.simulate_waste(young, C, R, M, segments=segments, seed=0)   # same draws: comparable
        w_young, w_daly = F.daly_waste(young, C, R, M), F.daly_waste(daly, C, R, M)
        fo = F.first_order_waste(young, C, R, M)
        if stuck:
            why += f" ({_pct(w_daly)} of the time lost even at the best interval)"
        plan = {}
        if plan_interval_s:
            plan = {"plan_s": ("plan's interval", _interval(plan_interval_s)),
                    "waste_plan": ("waste at the plan's interval (Daly model)",
                                   _pct(F.daly_waste(plan_interval_s, C, R, M)))}
        wall = {}
        if walltime_s:
            if stuck:
                words = _duration(walltime_s)
            elif daly > walltime_s:
                words = (f"the optimum ({_duration(daly)}) is longer than the {_duration(walltime_s)} walltime: "
                         "checkpoint at the walltime signal instead")
            else:
                words = f"{_duration(walltime_s)}: {walltime_s / daly:.3g} checkpoints per allocation at Daly's interval"
            if plan_interval_s and plan_interval_s > walltime_s:
                words += "; the plan's interval is longer than the walltime too"
            wall = {"walltime": ("walltime per allocation", words)}
        flat = hi / lo >= 1.5
        text = readout({
            "regime": ("checkpoint and restart against the MTBF", why),
            "young_s": ("Young √(2·C·M)", "— (no progress)" if stuck else _interval(young)),
            "daly_s": ("Daly (higher order)", "— (no progress)" if stuck else _interval(daly)),
            "sim_opt_s": ("simulated optimum (Monte Carlo, smoothed)",
                          "— (no progress)" if stuck else "— (too few simulated failures)" if blind
                          else _interval(best)),
            "sim_range": ("intervals as good as the simulated optimum",
                          "—" if stuck else
                          f"— (the simulation drew fewer than {F.MIN_FAILURES} failures near the optimum: "
                          "failures are too rare for it; the formulas hold)" if blind else
                          f"{_span(lo, hi)} (" + ("flat: " if flat else "") + "within the simulation's error)"),
            "waste_young": ("waste at Young (Daly model)", _pct(w_young)),
            "waste_daly": ("waste at Daly (Daly model)", _pct(w_daly)),
            "waste_sim": ("waste at the simulated optimum (simulation, 95 % interval)",
                          _pct(sim["waste"]) + ("" if stuck or sim["se"] == 0 else
                                                f" ({_pct(max(sim['lo'], 0.0))} – {_pct(min(sim['hi'], 1.0))}; "
                                                f"at Young, same simulation: {_pct(sim_young['waste'])})")),
            "waste_first_order": ("first-order waste at Young (C/τ + (τ+C)/2M + R/M)",
                                  "100% (capped: the formula exceeds 100 %, invalid here)" if fo >= 1 else _pct(fo)),
            "first_order_error": ("first-order formula minus Daly model, at Young",
                                  "— (first order invalid: above 100 %)" if fo >= 1
                                  else _points(fo - w_young)),
            "restart_share": ("restart share of wall time (1 − e^(−R/M))",
                              f"{_pct(F.restart_share(R, M))} ({_duration(R)} per failure, a failure every "
                              f"{_duration(M)})"),
            **plan,
            **wall,
        })
        marks = {"Young": young, "Daly": daly, **({"plan": plan_interval_s} if plan_interval_s else {})}
        chart = charts.waste_curve_chart(curve, marks, f"Checkpoint waste: C {_duration(C)}, R {_duration(R)}, "
                                                       f"MTBF {_hours(M_h)}",
                                         sim_range=None if stuck or blind else (lo, hi), walltime_s=walltime_s)
        return text, chart

    return explorer(controls, compute, "Checkpoint interval explorer")
