"""Charts that render offline.

Altair's default renderer loads vega from a CDN: with no network (a cluster login node, an
air-gapped workshop room, a report opened from disk) the chart shows "Error loading script". Every
chart here is rendered to SVG through vl-convert (no browser, no network), in notebooks, widgets
and the report alike. ``use_offline_renderer()`` switches Altair globally; chapters call it first.
"""
from __future__ import annotations

import math
from concurrent.futures import Future
from pathlib import Path

import altair as alt
import pandas as pd

from preflight.core.numfmt import GiB, factor, num, plural
from preflight.reporting.chartfit import text_px


def use_offline_renderer() -> None:
    alt.renderers.enable("svg")
    alt.data_transformers.disable_max_rows()


# Altair checks every spec against the Vega-Lite JSON schema: ~0.15 s a chart, a quarter of a slider's
# redraw. The specs' structure is fixed by the functions below (only the data changes with a slider), so
# the check runs in the tests (tests/test_slider_ranges.py switches it on), not at every redraw.
VALIDATE = False


def to_svg(chart: alt.TopLevelMixin) -> str:
    """SVG of ``chart``, whatever its row count (a large pipeline schedule has thousands of bars; the
    data is embedded in the SVG's source, not served), fitted by ``preflight.reporting.chartfit.fit_spec`` so no
    text runs off its edge."""
    from preflight.reporting.chartproc import render_here

    return render_here(_spec(chart))


def render_later(chart: alt.TopLevelMixin, path: Path | None = None) -> Future:
    """``to_svg(chart)`` as a Future, rendered in the chart process (``preflight.reporting.chartproc``: vl-convert
    holds the GIL while it renders, so only another process renders while the plan-only audit's next
    cells run); the SVG is also written to ``path`` (before the Future completes) when given.
    ``preflight.runner.inprocess`` waits for the SVG when it writes the notebook. The spec is built here:
    Altair's settings are process-wide."""
    return _renderer().submit(_spec(chart), path)


_RENDERER = None     # the chart process (preflight.reporting.chartproc.ChartProcess), started at the first need


def warm_up():
    """Start the chart process now: its engine's first render costs ~0.7 s (the JavaScript engine
    starts), later ones ~0.05 s. The plan-only audit calls it first, so that start runs on the other
    core while the first chapter loads its libraries, not when its first chart is due. Returns it."""
    return _renderer()


def stop_rendering() -> None:
    """End the chart process (the audit's end, Ctrl-C); the next ``render_later`` starts another."""
    global _RENDERER
    if _RENDERER is not None:
        _RENDERER.close()
        _RENDERER = None


def _renderer():
    global _RENDERER
    if _RENDERER is None:
        from preflight.reporting.chartproc import ChartProcess

        _RENDERER = ChartProcess()
    return _RENDERER


def _spec(chart: alt.TopLevelMixin) -> dict:
    with alt.data_transformers.disable_max_rows():
        return chart.to_dict(validate=VALIDATE)


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
    """Efficiency per stage: the step model's estimate (the verdict's) between its no-overlap and full-overlap
    bounds, measured points, and the stop rule."""
    from preflight.models.extrapolate import STOP_RULE_EFFICIENCY

    stop_rule = STOP_RULE_EFFICIENCY if stop_rule is None else stop_rule
    cols = ["efficiency_no_overlap", "efficiency_overlap"] + (["efficiency_model"] if "efficiency_model" in curve else [])
    df = curve.melt("gpus", value_vars=cols, var_name="bound", value_name="value")
    df["bound"] = df["bound"].map({"efficiency_no_overlap": "model, no overlap (lower bound)",
                                   "efficiency_overlap": "model, full overlap (upper bound)",
                                   "efficiency_model": "step model (the verdict's estimate)"})
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


def loader_bars(df: pd.DataFrame, label: str, best: str, rule: float = 1.2, title: str = "") -> alt.HConcatChart:
    """The loader tuner, one row per setting: the device idle share (the bar the verdict colours, shorter
    is better; "best" is the cheapest setting within a point of the lowest) beside supply / consumption
    (grey, log axis, the ``rule`` dashed red). Colour and length then speak of the same quantity."""
    import math

    d = df.assign(_row=[f"{x}  (best)" if x == best else x for x in df[label]])
    y = alt.Y("_row:N", title=None, sort=None, axis=alt.Axis(labelLimit=420))
    verdict = alt.Color("verdict:N", scale=alt.Scale(domain=["pass", "warn", "fail"],
                                                     range=["#2e7d32", "#f9a825", "#c62828"]), title="verdict")
    idle = alt.Chart(d).mark_bar().encode(y=y, x=alt.X("idle_share:Q", title="device idle (share of the loop)",
                                                       axis=alt.Axis(format="%")), color=verdict)
    idle_text = alt.Chart(d).mark_text(align="left", dx=3).encode(y=y, x="idle_share:Q",
                                                                  text=alt.Text("idle_share:Q", format=".1%"))
    low = min(float(d["headroom"].min()), rule)
    d2 = d.assign(_base=10 ** math.floor(math.log10(low / 2)))
    x = alt.X("headroom:Q", scale=alt.Scale(type="log"), title="supply / consumption (log)")
    supply = alt.Chart(d2).mark_bar(color="#9e9e9e").encode(y=alt.Y("_row:N", sort=None, axis=None), x=x, x2="_base:Q")
    supply_text = alt.Chart(d2).mark_text(align="left", dx=3).encode(y=alt.Y("_row:N", sort=None, axis=None), x=x,
                                                                     text=alt.Text("headroom:Q", format=".3g"))
    line = alt.Chart(pd.DataFrame({"headroom": [rule]})).mark_rule(color="#c62828", strokeDash=[4, 3]).encode(
        x=alt.X("headroom:Q"))
    h = 26 * max(2, len(d))
    return alt.hconcat(alt.layer(idle, idle_text).properties(width=220, height=h),
                       alt.layer(supply, supply_text, line).properties(width=220, height=h)).properties(title=title)


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
           log_y: bool = True, title: str = "", y_format: str | None = None, x_format: str = ".3~s",
           rule_x: float | None = None, x_title: str | None = None,
           y_domain: tuple[float, float] | None = None) -> alt.LayerChart:
    """Lines of ``y`` over ``x`` per ``color`` (log-log by default), a vertical rule at ``mark_x``; with
    their points marked when no series has more than 12 (a series of one point is then still seen).
    ``rule_x``: a threshold the title names (the 1.2x rule), drawn red and dashed as in ``headroom_bars``.
    A log x axis spans the data (not the next powers of ten), its end points drawn whole. ``y_domain``: a
    fixed y range (linear axes: the region that matters, not from zero)."""
    sx = alt.Scale(type="log", nice=False, padding=8) if log_x else alt.Scale()
    sy = alt.Scale(type="log") if log_y else alt.Scale()
    if y_domain is not None:
        sy = alt.Scale(type="log" if log_y else "linear", domain=list(y_domain), zero=False, nice=False)
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


def layouts_chart(rows: list[dict], own: dict | None, efficiency: float | None) -> alt.Chart:
    """Predicted tokens/s per GPU of the advisor's top layouts (``rows``, best first) and of the
    profile's own plan (``own``, highlighted; hatched red when it does not fit), one bar each."""
    from preflight.chapters.advisor import label

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
                 title=f"Fastest layouts that fit{plan} (kernel efficiency "
                       + ("by chip and shape)" if efficiency is None else f"{efficiency:.0%})"))
