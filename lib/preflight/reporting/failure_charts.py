"""Chapter 5's two charts: waste over the checkpoint interval, and the risk of a failure over the run.

Both are Altair charts rendered like every other (``preflight.reporting.charts.to_svg``, offline). The waste
chart puts three answers to "how often should I checkpoint?" on one log axis: Daly's model, the
first-order (Young) formula and a Monte Carlo simulation with its 95 % interval
(``models.checkpoint_sim``), so a reader sees where the first-order formula stops holding (short MTBF,
where it can pass 100 %) and how flat the optimum is. The risk chart sets the learner's per-node
failure rate beside the field report's and Llama 3's on the same number of nodes.
"""
from __future__ import annotations

import altair as alt
import pandas as pd

from preflight.core.numfmt import sci

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
