"""Charts that render offline.

Altair's default renderer loads vega from a CDN: with no network (a cluster login node, an
air-gapped workshop room, a report opened from disk) the chart shows "Error loading script". Every
chart here is rendered to SVG through vl-convert (no browser, no network), in notebooks, widgets
and the report alike. ``use_offline_renderer()`` switches Altair globally; chapters call it first.
"""
from __future__ import annotations

import altair as alt
import pandas as pd

def use_offline_renderer() -> None:
    alt.renderers.enable("svg")
    alt.data_transformers.disable_max_rows()


def to_svg(chart: alt.TopLevelMixin) -> str:
    import vl_convert as vlc

    return vlc.vegalite_to_svg(chart.to_dict())


def amdahl_chart(ts: float, tc: float, n_max: int = 1024, n_mark: int | None = None) -> alt.LayerChart:
    """Amdahl speedup, Gustafson scaled speedup and the ideal line over N (log-log), with the
    Amdahl ceiling ``1 + Tc/Ts`` as a rule and the profile's target N marked."""
    from preflight.models.scaling import amdahl_ceiling, speedup_table

    ns = sorted({int(round(2 ** (k / 4))) for k in range(0, 4 * max(1, n_max.bit_length()) + 1)
                 if 2 ** (k / 4) <= n_max} | {n_max})
    df = speedup_table(ts, tc, ns).melt("N", var_name="model", value_name="speedup")
    base = alt.Chart(df).mark_line(point=False).encode(
        x=alt.X("N:Q", scale=alt.Scale(type="log", base=2), title="workers N",
                axis=alt.Axis(labelOverlap="greedy")),
        y=alt.Y("speedup:Q", scale=alt.Scale(type="log", base=2), title="speedup"),
        color=alt.Color("model:N", title=None),
    )
    layers = [base]
    ceiling = amdahl_ceiling(ts, tc)
    if ceiling != float("inf"):
        layers.append(alt.Chart(pd.DataFrame({"y": [ceiling]})).mark_rule(color="black", strokeDash=[6, 3])
                      .encode(y="y:Q"))
    if n_mark:
        layers.append(alt.Chart(pd.DataFrame({"N": [n_mark]})).mark_rule(color="#546e7a",
                                                                          strokeDash=[2, 2]).encode(x="N:Q"))
    title = f"Amdahl: Ts={ts:.3g} s, Tc={tc:.3g} s, ceiling {ceiling:.3g}x"
    return alt.layer(*layers).properties(width=420, height=260, title=title)


def scaling_curve_chart(curve: pd.DataFrame, measured: pd.DataFrame | None = None,
                        stop_rule: float | None = None) -> alt.LayerChart:
    """Efficiency per stage (no overlap / overlap bounds), measured points, and the stop rule."""
    from preflight.models.extrapolate import STOP_RULE_EFFICIENCY

    stop_rule = STOP_RULE_EFFICIENCY if stop_rule is None else stop_rule
    df = curve.melt("gpus", value_vars=["efficiency_no_overlap", "efficiency_overlap"],
                    var_name="bound", value_name="value")
    df["bound"] = df["bound"].str.replace("efficiency_", "model, ")
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
           log_y: bool = True, title: str = "", y_format: str | None = None, x_format: str = "~s") -> alt.LayerChart:
    """Lines of ``y`` over ``x`` per ``color`` (log-log by default), a vertical rule at ``mark_x``."""
    sx = alt.Scale(type="log") if log_x else alt.Scale()
    sy = alt.Scale(type="log") if log_y else alt.Scale()
    axis = alt.Axis(format=y_format) if y_format else alt.Axis()
    xaxis = alt.Axis(format=x_format, labelOverlap="greedy") if log_x else alt.Axis()
    layers = [alt.Chart(df).mark_line().encode(x=alt.X(f"{x}:Q", scale=sx, axis=xaxis),
                                               y=alt.Y(f"{y}:Q", scale=sy, axis=axis),
                                               color=alt.Color(f"{color}:N", title=None))]
    if mark_x is not None:      # same field name as the axis: the axis title stays clean
        layers.append(alt.Chart(pd.DataFrame({x: [mark_x]})).mark_rule(color="#546e7a", strokeDash=[2, 2])
                      .encode(x=alt.X(f"{x}:Q")))
    return alt.layer(*layers).properties(width=420, height=240, title=title)


def gantt(timeline: pd.DataFrame, title: str = "") -> alt.LayerChart:
    """A pipeline schedule: one row per stage, a bar per forward (F) / backward (B) of a micro-batch
    (columns stage, microbatch, chunk, kind, start, end; ``preflight.models.pipeline``)."""
    d = timeline.assign(label=timeline["microbatch"].astype(str))
    y = alt.Y("stage:O", title=None, axis=alt.Axis(labelExpr="'stage ' + datum.value"))   # numeric order
    base = alt.Chart(d).encode(y=y, x=alt.X("start:Q", title="time (units of one forward)"), x2="end:Q")
    bars_ = base.mark_bar(stroke="white", strokeWidth=0.5).encode(
        color=alt.Color("kind:N", scale=alt.Scale(domain=["F", "B"], range=["#1e88e5", "#fb8c00"]),
                        title=None),
        opacity=alt.condition("datum.chunk % 2 == 0", alt.value(1.0), alt.value(0.6)))
    text = alt.Chart(d).mark_text(color="white", fontSize=9).encode(
        y=y, x=alt.X("mid:Q"), text="label:N").transform_calculate(mid="(datum.start + datum.end) / 2")
    return alt.layer(bars_, text).properties(width=520, height=28 * d["stage"].nunique() + 20, title=title)
