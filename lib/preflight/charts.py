"""Charts that render offline.

Altair's default renderer loads vega from a CDN: with no network (a cluster login node, an
air-gapped workshop room, a report opened from disk) the chart shows "Error loading script". Every
chart here is rendered to SVG through vl-convert (no browser, no network), in notebooks, widgets
and the report alike. ``use_offline_renderer()`` switches Altair globally; chapters call it first.
"""
from __future__ import annotations

import math
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import altair as alt
import pandas as pd

from preflight.chartfit import fit_spec, text_px
from preflight.numfmt import GiB, factor, num, plural, sci


def use_offline_renderer() -> None:
    alt.renderers.enable("svg")
    alt.data_transformers.disable_max_rows()


# Altair checks every spec against the Vega-Lite JSON schema: ~0.15 s a chart, a quarter of a slider's
# redraw. The specs' structure is fixed by the functions below (only the data changes with a slider), so
# the check runs in the tests (tests/test_slider_ranges.py switches it on), not at every redraw.
VALIDATE = False


def to_svg(chart: alt.TopLevelMixin) -> str:
    """SVG of ``chart``, whatever its row count (a large pipeline schedule has thousands of bars; the
    data is embedded in the SVG's source, not served), fitted by ``preflight.chartfit.fit_spec`` so no
    text runs off its edge."""
    return _render(_spec(chart))


def render_later(chart: alt.TopLevelMixin, path: Path | None = None) -> Future:
    """``to_svg(chart)`` in a worker thread, as a Future; the SVG is also written to ``path`` (before
    the Future completes) when given. vl-convert releases the GIL while it renders, so the plan-only
    audit's next cells run meanwhile on the other core (``preflight.inprocess`` waits for the SVG
    when it writes the notebook). The spec is built here: Altair's settings are process-wide."""
    global _RENDERER
    spec = _spec(chart)
    if _RENDERER is None:
        _RENDERER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="preflight-charts")
    return _RENDERER.submit(_render, spec, path)


_RENDERER: ThreadPoolExecutor | None = None     # one thread: vl-convert has one rendering engine anyway


def _spec(chart: alt.TopLevelMixin) -> dict:
    with alt.data_transformers.disable_max_rows():
        return chart.to_dict(validate=VALIDATE)


def _render(spec: dict, path: Path | None = None) -> str:
    import vl_convert as vlc

    svg = vlc.vegalite_to_svg(fit_spec(spec))
    if path is not None:
        path.write_text(svg)
    return svg


# Legend labels for people, from the models' column names.
SPEEDUP_LABELS = {"amdahl_speedup": "Amdahl (fixed problem)", "gustafson_speedup": "Gustafson (scaled problem)",
                  "ideal": "ideal (linear)"}


def amdahl_chart(ts: float, tc: float, n_max: int = 1024, n_mark: int | None = None,
                 source: str = "") -> alt.LayerChart:
    """Amdahl speedup, Gustafson scaled speedup and the ideal line over N (log-log), with the
    Amdahl ceiling ``1 + Tc/Ts`` as a rule and the profile's target N marked. ``source`` says whose
    Ts and Tc these are ("the profile's step", "this machine's measured step"): chapter 1 shows both,
    and two ceilings without their source read as a contradiction."""
    from preflight.models.scaling import amdahl_ceiling, speedup_table

    ns = sorted({int(round(2 ** (k / 4))) for k in range(0, 4 * max(1, n_max.bit_length()) + 1)
                 if 2 ** (k / 4) <= n_max} | {n_max})
    df = speedup_table(ts, tc, ns).rename(columns=SPEEDUP_LABELS).melt("N", var_name="model", value_name="speedup")
    base = alt.Chart(df).mark_line(point=False).encode(
        x=alt.X("N:Q", scale=alt.Scale(type="log", base=2), title="GPUs N",
                axis=alt.Axis(labelOverlap="greedy")),
        y=alt.Y("speedup:Q", scale=alt.Scale(type="log", base=2), title="speedup"),
        color=alt.Color("model:N", title=None),
    )
    layers = [base]
    ceiling = amdahl_ceiling(ts, tc)
    if ceiling != float("inf"):
        c = pd.DataFrame({"y": [ceiling], "N": [1], "label": [f"Amdahl ceiling {factor(ceiling)}"]})
        layers += [alt.Chart(c).mark_rule(color="black", strokeDash=[6, 3]).encode(y="y:Q"),
                   alt.Chart(c).mark_text(align="left", baseline="bottom", dx=3, dy=-2, fontSize=10).encode(
                       x="N:Q", y="y:Q", text="label:N")]
    if n_mark:
        # the label at the top, on the side of the rule with room (log scale: compare exponents)
        right_half = math.log2(max(n_mark, 1)) > math.log2(max(ns[-1], 2)) / 2
        t = pd.DataFrame({"N": [n_mark], "speedup": [float(df["speedup"].max())],
                          "label": [f"target: {plural(n_mark, 'GPU')}"]})
        layers += [alt.Chart(t).mark_rule(color="#546e7a", strokeDash=[2, 2]).encode(x="N:Q"),
                   alt.Chart(t).mark_text(align="right" if right_half else "left", baseline="top",
                                          dx=-3 if right_half else 3, dy=2, fontSize=10, color="#37474f").encode(
                       x="N:Q", y="speedup:Q", text="label:N")]
    title = f"Amdahl{f' ({source})' if source else ''}: Ts={ts:.3g} s, Tc={tc:.3g} s, ceiling {factor(ceiling)}"
    return alt.layer(*layers).properties(width=420, height=260, title=title)


def scaling_curve_chart(curve: pd.DataFrame, measured: pd.DataFrame | None = None,
                        stop_rule: float | None = None) -> alt.LayerChart:
    """Efficiency per stage (no overlap / overlap bounds), measured points, and the stop rule."""
    from preflight.models.extrapolate import STOP_RULE_EFFICIENCY

    stop_rule = STOP_RULE_EFFICIENCY if stop_rule is None else stop_rule
    df = curve.melt("gpus", value_vars=["efficiency_no_overlap", "efficiency_overlap"],
                    var_name="bound", value_name="value")
    df["bound"] = df["bound"].map({"efficiency_no_overlap": "model, no overlap (lower bound)",
                                   "efficiency_overlap": "model, full overlap (upper bound)"})
    layers = [alt.Chart(df).mark_line(point=True).encode(
        x=alt.X("gpus:Q", scale=alt.Scale(type="log", base=2), title="GPUs"),
        y=alt.Y("value:Q", scale=alt.Scale(domain=[0, 1.05]), axis=alt.Axis(format="%"),
                title="scaling efficiency"),
        color=alt.Color("bound:N", title=None))]
    if measured is not None and len(measured):
        layers.append(alt.Chart(measured[["gpus", "efficiency_measured"]]).mark_point(
            size=90, filled=True, color="black").encode(x="gpus:Q", y="efficiency_measured:Q"))
    layers.append(alt.Chart(pd.DataFrame({"y": [stop_rule]})).mark_rule(
        color="#c62828", strokeDash=[4, 3]).encode(y="y:Q"))
    return alt.layer(*layers).properties(width=420, height=260,
                                         title=f"Staged scaling curve (stop rule: {stop_rule:.0%})")


def share_bar(df: pd.DataFrame, category: str, value: str = "share", title: str = "") -> alt.Chart:
    """One horizontal stacked bar of shares (step composition, op categories)."""
    return alt.Chart(df).mark_bar().encode(
        x=alt.X(f"{value}:Q", stack="normalize", axis=alt.Axis(format="%"), title=None),
        color=alt.Color(f"{category}:N", title=None),
        tooltip=[category, alt.Tooltip(f"{value}:Q", format=".1%")],
    ).properties(width=420, height=40, title=title)


def bars(df: pd.DataFrame, x: str, y: str, title: str = "", fmt: str = ".3g") -> alt.Chart:
    """Plain labelled bars (e.g. eager vs compiled step time)."""
    base = alt.Chart(df).encode(y=alt.Y(f"{y}:N", title=None, sort=None, axis=alt.Axis(labelLimit=420)),
                                x=alt.X(f"{x}:Q"))
    return (base.mark_bar() + base.mark_text(align="left", dx=3).encode(
        text=alt.Text(f"{x}:Q", format=fmt))).properties(width=380, height=30 * max(2, len(df)), title=title)


def stacked_bars(df: pd.DataFrame, x: str, y: str, color: str, title: str = "") -> alt.Chart:
    """Horizontal bars of ``x`` per ``y``, stacked by ``color`` (e.g. stall + hidden cost per method)."""
    return alt.Chart(df).mark_bar().encode(
        y=alt.Y(f"{y}:N", title=None, sort=None, axis=alt.Axis(labelLimit=420)),
        x=alt.X(f"sum({x}):Q", title=x), color=alt.Color(f"{color}:N", title=None, sort=None),
        order=alt.Order(f"{color}:N")).properties(width=380, height=30 * max(2, df[y].nunique()), title=title)


def headroom_bars(df: pd.DataFrame, label: str, value: str = "headroom", rule: float = 1.2,
                  title: str = "") -> alt.LayerChart:
    """Horizontal bars of supply/consumption on a log axis, the ``rule`` (1.2x) as a red line.

    A log axis has no zero: the bars start at a power of ten below the smallest value."""
    import math

    low = min(float(df[value].min()), rule)
    d = df.assign(_base=10 ** math.floor(math.log10(low / 2)))
    x = alt.X(f"{value}:Q", scale=alt.Scale(type="log"), title="supply / consumption (log)")
    y = alt.Y(f"{label}:N", title=None, sort=None, axis=alt.Axis(labelLimit=420))
    bars_ = alt.Chart(d).mark_bar().encode(y=y, x=x, x2="_base:Q", color=alt.Color("verdict:N", scale=alt.Scale(
        domain=["pass", "warn", "fail"], range=["#2e7d32", "#f9a825", "#c62828"]), title=None))
    text = alt.Chart(d).mark_text(align="left", dx=3).encode(y=y, x=x, text=alt.Text(f"{value}:Q", format=".3g"))
    line = alt.Chart(pd.DataFrame({value: [rule]})).mark_rule(color="#c62828", strokeDash=[4, 3]).encode(
        x=alt.X(f"{value}:Q"))
    return alt.layer(bars_, text, line).properties(width=360, height=26 * max(2, len(df)), title=title)


def step_trace(df: pd.DataFrame, title: str = "") -> alt.VConcatChart:
    """Per-step data wait (ms) and prefetch queue depth of loader runs (column ``run``)."""
    legend = alt.Legend(orient="bottom", labelLimit=500, direction="vertical")
    wait = alt.Chart(df).mark_line(point=True).encode(
        x=alt.X("step:Q"), y=alt.Y("wait_ms:Q", title="data wait (ms)"), color=alt.Color("run:N", title=None, legend=legend))
    depth = alt.Chart(df).mark_line(point=True).encode(
        x=alt.X("step:Q"), y=alt.Y("queue_depth:Q", title="queue depth"), color=alt.Color("run:N", title=None,
                                                                                         legend=legend))
    return alt.vconcat(wait.properties(width=420, height=140, title=title), depth.properties(width=420, height=90))


def curves(df: pd.DataFrame, x: str, y: str, color: str, mark_x: float | None = None, log_x: bool = True,
           log_y: bool = True, title: str = "", y_format: str | None = None, x_format: str = "~s",
           rule_x: float | None = None, x_title: str | None = None) -> alt.LayerChart:
    """Lines of ``y`` over ``x`` per ``color`` (log-log by default), a vertical rule at ``mark_x``; with
    their points marked when no series has more than 12 (a series of one point is then still seen).
    ``rule_x``: a threshold the title names (the 1.2x rule), drawn red and dashed as in ``headroom_bars``.
    A log x axis spans the data (not the next powers of ten), its end points drawn whole."""
    sx = alt.Scale(type="log", nice=False, padding=8) if log_x else alt.Scale()
    sy = alt.Scale(type="log") if log_y else alt.Scale()
    axis = alt.Axis(format=y_format) if y_format else alt.Axis()
    xs = sorted(set(df[x])) if len(df) else []
    xaxis = (alt.Axis(format=x_format, labelOverlap="greedy", values=xs if len(xs) <= 12 else alt.Undefined)
             if log_x else alt.Axis())                                   # few x values: a tick at each
    few = int(df.groupby(color).size().max()) <= 12 if len(df) else False     # a one-point series is a dot
    layers = [alt.Chart(df).mark_line(point=few).encode(x=alt.X(f"{x}:Q", scale=sx, axis=xaxis, title=x_title or x),
                                               y=alt.Y(f"{y}:Q", scale=sy, axis=axis),
                                               color=alt.Color(f"{color}:N", title=None))]
    if mark_x is not None:      # same field name as the axis: the axis title stays clean
        layers.append(alt.Chart(pd.DataFrame({x: [mark_x]})).mark_rule(color="#546e7a", strokeDash=[2, 2])
                      .encode(x=alt.X(f"{x}:Q")))
    if rule_x is not None:
        layers.append(alt.Chart(pd.DataFrame({x: [rule_x]})).mark_rule(color="#c62828", strokeDash=[4, 3])
                      .encode(x=alt.X(f"{x}:Q")))
    return alt.layer(*layers).properties(width=420, height=240, title=title)


def gantt(timeline: pd.DataFrame, title: str = "") -> alt.LayerChart:
    """A pipeline schedule: one row per stage, a bar per forward (F) / backward (B) of a micro-batch
    (columns stage, microbatch, chunk, kind, start, end; ``preflight.models.pipeline``); zero-bubble
    schedules add W, the weight gradient split off the backward (``preflight.models.zerobubble``)."""
    d = timeline.assign(label=timeline["microbatch"].astype(str))
    kinds = ["F", "B", "W"] if (d["kind"] == "W").any() else ["F", "B"]
    # wider for long schedules (16 px per bar of the busiest stage, 520 to 900 px); a bar shows its
    # micro-batch number only where the number fits inside it (else the numbers run into each other)
    width = int(min(900, max(520, 16 * d.groupby("stage").size().max())))
    px_per_unit = width / max(float(d["end"].max() - d["start"].min()), 1e-9)
    fits = (d["end"] - d["start"]) * px_per_unit >= d["label"].str.len() * text_px("0", 9) + 3
    y = alt.Y("stage:O", title=None, axis=alt.Axis(labelExpr="'stage ' + datum.value"))   # numeric order
    base = alt.Chart(d).encode(y=y, x=alt.X("start:Q", title="time (units of one forward)"), x2="end:Q")
    bars_ = base.mark_bar(stroke="white", strokeWidth=0.5).encode(
        color=alt.Color("kind:N", scale=alt.Scale(domain=kinds, range=["#1e88e5", "#fb8c00", "#43a047"][:len(kinds)]),
                        title=None),
        opacity=alt.condition("datum.chunk % 2 == 0", alt.value(1.0), alt.value(0.6)))
    text = alt.Chart(d[fits]).mark_text(color="white", fontSize=9).encode(
        y=y, x=alt.X("mid:Q"), text="label:N").transform_calculate(mid="(datum.start + datum.end) / 2")
    return alt.layer(bars_, text).properties(width=width, height=28 * d["stage"].nunique() + 20, title=title)


_DURATION_LABEL = ("datum.value < 1/60 ? format(datum.value * 3600, '~g') + ' s' : datum.value < 1 ? "
                   "format(datum.value * 60, '~g') + ' min' : datum.value < 48 ? format(datum.value, '~g') + ' h' : "
                   "datum.value < 17532 ? format(datum.value / 24, '~g') + ' d' : "
                   "format(datum.value / 8766, '~g') + ' years'")
_DURATION_TICKS_H = ([s / 3600 for s in (1, 10, 60, 300, 900, 1800)] + [1, 2, 6, 12, 24, 72, 168, 720, 8760]
                     + [8766 * y for y in (10, 100, 1000)])
_WASTE_SERIES = {"daly": ("Daly model (exact, exponential failures)", "#1e88e5"),
                 "first_order": ("first order (Young)", "#fb8c00"),
                 "simulated": ("Monte Carlo, 95% interval", "black")}


def waste_curve_chart(curve: pd.DataFrame, marks: dict[str, float], title: str = "", *,
                      sim_range: bool | tuple[float, float] | None = True,
                      walltime_s: float | None = None) -> alt.LayerChart:
    """Waste over the checkpoint interval (log axis, labelled in s / min / h / d / years): Daly's model
    and the first-order formula as lines, the simulation as points with 95 % bars
    (``checkpoint_sim.waste_curve``), and a labelled vertical rule plus a point on Daly's curve per entry of
    ``marks`` (``{label: interval in seconds}``, e.g. Young, Daly, the plan's interval).

    ``sim_range``: a shaded band over the intervals whose simulated waste cannot be told from the
    minimum (``True``: ``checkpoint_sim.optimal_range_simulated(curve)``; ``(lo, hi)`` in seconds: that
    band; ``None``/``False``: none); the band replaces a rule at the noisy lowest point.
    ``walltime_s``: a solid red rule "walltime" (intervals beyond it end with the allocation).

    The y axis spans 0 to the larger of 5 %, 4x the lowest waste and the waste at every mark (so the
    plan's point is on the chart), at most 100 %; everything is clipped to it. The waste at a mark is
    Daly's model at that interval (from ``curve.attrs`` C, R, M, which ``waste_curve`` sets; without
    them, read off the curve by log interpolation, the end value beyond its ends). The first-order formula
    can exceed 100 % (it counts per unit of work and ignores failures during recovery): it is capped at
    100 % and the legend says it is invalid there."""
    import numpy as np

    from preflight.models.checkpoint_sim import optimal_range_simulated
    from preflight.models.resilience import daly_waste

    d = curve.sort_values("interval_s").assign(hours=lambda f: f["interval_s"] / 3600.0)
    invalid = bool((d["first_order"] > 1).any())
    d["first_order"] = d["first_order"].clip(upper=1.0)
    names = {k: v[0] for k, v in _WASTE_SERIES.items()}
    if invalid:
        names["first_order"] += ": invalid above 100 %, capped"
    lines = d.melt("hours", value_vars=["daly", "first_order"], var_name="series", value_name="waste")
    lines["series"] = lines["series"].map(names)
    sim = d.rename(columns={"simulated": "waste"}).assign(series=names["simulated"])
    marks = {k: float(v) for k, v in (marks or {}).items() if v is not None and 0 < v < float("inf")}
    if marks and {"C", "R", "M"} <= set(curve.attrs):
        at_marks = np.array([daly_waste(v, curve.attrs["C"], curve.attrs["R"], curve.attrs["M"])
                             for v in marks.values()])
    else:
        at_marks = (np.interp(np.log(list(marks.values())), np.log(d["interval_s"]), d["daly"])
                    if marks else np.array([]))
    low = float(np.nanmin(d[["daly", "simulated"]].to_numpy()))
    top = float(min(1.0, max(0.05, 4 * low, *(1.15 * at_marks))))
    band = None
    if sim_range is True:
        band = optimal_range_simulated(curve)[:2]
    elif sim_range:
        band = tuple(sim_range)[:2]
    extra_h = [v / 3600.0 for v in [*marks.values(), *(band or ()), *([walltime_s] if walltime_s else [])]]
    span = [*d["hours"], *extra_h]
    ticks = [h for h in _DURATION_TICKS_H if min(span) <= h <= max(span)]
    x_title = "checkpoint interval (compute time between checkpoints)"
    x_scale = alt.Scale(type="log", nice=False, padding=6)     # the end points drawn whole, not cut at the edge
    x = alt.X("hours:Q", scale=x_scale, title=x_title,
              axis=alt.Axis(values=ticks, labelExpr=_DURATION_LABEL, labelOverlap="greedy", grid=True))
    y_scale, y_title = alt.Scale(domain=[0, top]), "waste (share of wall time)"
    y = alt.Y("waste:Q", scale=y_scale, axis=alt.Axis(format="%"), title=y_title)
    color = alt.Color("series:N", title=None, scale=alt.Scale(domain=[names[k] for k in _WASTE_SERIES],
                                                              range=[v[1] for v in _WASTE_SERIES.values()]),
                      legend=alt.Legend(orient="bottom", direction="vertical", labelLimit=400))
    layers = []
    rule_hi = top * (0.94 if band else 1.0)     # vertical rules stop below the band's label, never cross it
    y_rule = alt.Y("rule_lo:Q", scale=y_scale, title=y_title)      # from 0 to rule_hi, on the same axis
    if band:
        b = pd.DataFrame({"hours": [band[0] / 3600.0], "hours_hi": [band[1] / 3600.0],
                          "mid": [(band[0] * band[1]) ** 0.5 / 3600.0], "waste": [top],
                          "label": ["simulated optimum ± simulation error"]})
        layers += [alt.Chart(b).mark_rect(color="#43a047", opacity=0.15, clip=True).encode(x=x, x2="hours_hi:Q"),
                   alt.Chart(b).mark_text(baseline="top", dy=3, fontSize=9, color="#2e7d32", clip=True).encode(
                       x=alt.X("mid:Q", scale=x_scale, title=x_title), y=y, text="label:N")]
    layers += [alt.Chart(lines).mark_line(clip=True).encode(x=x, y=y, color=color),
               alt.Chart(sim).mark_rule(clip=True).encode(x=x, y=alt.Y("simulated_lo:Q"), y2="simulated_hi:Q",
                                                          color=color),
               alt.Chart(sim).mark_point(filled=True, size=18, clip=True).encode(
                   x=x, y=y, color=color, tooltip=[alt.Tooltip("interval_s:Q", format=",.0f"),
                                                   alt.Tooltip("waste:Q", format=".3p")])]
    if marks:
        m = pd.DataFrame({"hours": [v / 3600.0 for v in marks.values()], "label": list(marks),
                          "at": np.minimum(at_marks, top)})
        m["waste"] = [top * (0.88 - 0.08 * i) for i in range(len(m))]     # staggered: close rules stay legible
        m["rule_lo"], m["rule_hi"] = 0.0, rule_hi
        layers += [alt.Chart(m).mark_rule(color="#546e7a", strokeDash=[3, 3], clip=True).encode(
                       x=x, y=y_rule, y2="rule_hi:Q"),
                   alt.Chart(m).mark_text(align="left", dx=3, fontSize=10, color="#37474f", clip=True).encode(
                       x=x, y=y, text="label:N"),
                   alt.Chart(m).mark_point(shape="diamond", size=50, filled=True, color="#37474f", clip=True).encode(
                       x=x, y=alt.Y("at:Q"), tooltip=["label:N", alt.Tooltip("at:Q", format=".3p", title="waste")])]
    if walltime_s:
        w = pd.DataFrame({"hours": [walltime_s / 3600.0], "waste": [0.0], "label": ["walltime"],
                          "rule_lo": [0.0], "rule_hi": [rule_hi]})
        layers += [alt.Chart(w).mark_rule(color="#e53935", strokeWidth=1.5, clip=True).encode(
                       x=x, y=y_rule, y2="rule_hi:Q"),
                   alt.Chart(w).mark_text(align="right", baseline="bottom", dx=-3, dy=-3, fontSize=10,
                                          color="#c62828", clip=True).encode(x=x, y=y, text="label:N")]
    return alt.layer(*layers).properties(width=460, height=260, title=title)


_FAILURE_COLOURS = ("#1e88e5", "#fb8c00", "#43a047")      # your input, field report, Llama 3


def failure_prob_chart(p_node_day: float, nodes: int, days_max: int) -> alt.LayerChart:
    """Probability of at least one node failure within 1..``days_max`` days on ``nodes`` nodes, for the
    given per-node daily probability and, on the same nodes, the two public reference points
    (``resilience.reference_points``: the field report's 1e-4 and Llama 3's implied rate). Each
    series keeps its colour whatever the inputs (your input blue, field report orange, Llama 3 green);
    a reference point equal to the input is named in the input's label instead of drawn twice."""
    from preflight.models.resilience import failure_prob, reference_points

    p_col = "per-node daily failure probability"
    days = list(range(1, max(1, int(days_max)) + 1))
    ref = reference_points()
    same = [r["case"] for _, r in ref.iterrows() if abs(r[p_col] - p_node_day) <= 0.01 * p_node_day]
    series = [(f"your input: p = {sci(p_node_day)} per node-day" + (f" (= {same[0]})" if same else ""),
               p_node_day, _FAILURE_COLOURS[0])]
    for (_, r), colour in zip(ref.iterrows(), _FAILURE_COLOURS[1:]):
        if r["case"] not in same:
            series.append((f"{r['case']}: p = {sci(r[p_col])} per node-day", r[p_col], colour))
    df = pd.DataFrame([{"days": d, "P(>=1 failure)": failure_prob(p, nodes, d), "curve": k}
                       for k, p, _ in series for d in days])
    line = alt.Chart(df).mark_line().encode(
        x=alt.X("days:Q", title="run length (days)"),
        y=alt.Y("P(>=1 failure):Q", scale=alt.Scale(domain=[0, 1]), axis=alt.Axis(format="%"),
                title="P(at least one node failure)"),
        color=alt.Color("curve:N", title=None, sort=[s[0] for s in series],
                        scale=alt.Scale(domain=[s[0] for s in series], range=[s[2] for s in series]),
                        legend=alt.Legend(orient="bottom", direction="vertical", labelLimit=400)))
    half = alt.Chart(pd.DataFrame({"y": [0.5]})).mark_rule(color="#9e9e9e", strokeDash=[2, 2]).encode(y="y:Q")
    n = int(nodes)
    return alt.layer(line, half).properties(width=420, height=220,
                                            title=f"Failure risk on {n:,} node{'' if n == 1 else 's'}")


def memory_bars(terms: pd.DataFrame | None, capacity_bytes: float | None = None, title: str = "") -> alt.LayerChart:
    """One horizontal bar of per-GPU memory stacked by term (GiB), the GPU's memory as a rule."""
    from preflight.models.memory import TERM_LABELS

    df = (pd.DataFrame({"plan": "per GPU", "term": terms["term"].map(lambda t: TERM_LABELS.get(t, t)),
                        "GiB": terms["bytes"] / GiB})
          if terms is not None else pd.DataFrame({"plan": ["per GPU"], "term": ["(no valid plan)"], "GiB": [0.0]}))
    order = list(TERM_LABELS.values())
    top = max(float(df["GiB"].sum()), (capacity_bytes or 0) / GiB) * 1.05 or 1.0
    bars = alt.Chart(df).mark_bar(size=26).encode(
        y=alt.Y("plan:N", title=None), x=alt.X("sum(GiB):Q", title="GiB", scale=alt.Scale(domain=[0, top])),
        color=alt.Color("term:N", title=None, sort=None, scale=alt.Scale(domain=order)),
        order=alt.Order("order:Q"), tooltip=["term", alt.Tooltip("GiB:Q", format=".2f")]
    ).transform_calculate(order=f"indexof({order!r}, datum.term)")
    layers = [bars]
    if capacity_bytes:
        # the label sits above the bar (the bar is 26 px in a 64 px row), on the side of the rule with room
        cap = pd.DataFrame({"GiB": [capacity_bytes / GiB], "label": [f"GPU memory {num(capacity_bytes / GiB)} GiB"]})
        right_half = capacity_bytes / GiB > top / 2
        layers += [alt.Chart(cap).mark_rule(color="#b71c1c", strokeWidth=2).encode(x="GiB:Q"),
                   alt.Chart(cap).mark_text(align="right" if right_half else "left", dx=-4 if right_half else 4,
                                            baseline="top", color="#b71c1c").encode(
                       x="GiB:Q", y=alt.value(2), text="label:N")]
    return alt.layer(*layers).properties(width=480, height=64, title=title)


def layouts_chart(rows: list[dict], own: dict | None, efficiency: float) -> alt.Chart:
    """Predicted tokens/s per GPU of the advisor's top layouts (``rows``, best first) and of the
    profile's own plan (``own``, highlighted; hatched red when it does not fit), one bar each."""
    from preflight.advisor import label

    data = [{"layout": f"{i}. {label(c)}", "tokens/s per GPU": c["tokens_per_s_per_gpu"], "MFU": c["mfu"],
             "who": "advisor"} for i, c in enumerate(rows, 1)]
    if own is not None and own not in rows:
        data.append({"layout": f"plan: {label(own)}", "tokens/s per GPU": own["tokens_per_s_per_gpu"],
                     "MFU": own["mfu"], "who": "the profile's plan" + ("" if own["fits"] else " (does not fit)")})
    elif own is not None:
        data[rows.index(own)]["who"] = "the profile's plan"
    df = pd.DataFrame(data)
    colours = {"advisor": "#546e7a", "the profile's plan": "#1565c0", "the profile's plan (does not fit)": "#b71c1c"}
    shown = [k for k in colours if k in set(df["who"])]          # a legend entry only for what is drawn
    plan = "" if own is None else " and the profile's plan" + ("" if own["fits"] else " (which does not fit)")
    return alt.Chart(df).mark_bar().encode(
        y=alt.Y("layout:N", sort=None, title=None, axis=alt.Axis(labelLimit=420)),
        x=alt.X("tokens/s per GPU:Q", title="predicted tokens/s per GPU"),
        color=alt.Color("who:N", title=None, scale=alt.Scale(domain=shown, range=[colours[k] for k in shown])),
        tooltip=["layout", alt.Tooltip("tokens/s per GPU:Q", format=",.0f"), alt.Tooltip("MFU:Q", format=".1%")],
    ).properties(width=300, height=alt.Step(18),
                 title=f"Fastest layouts that fit{plan} (kernel efficiency {efficiency:.0%})")
