"""Chapter 5's sliders: failure probability, and the checkpoint interval against a simulation."""
from __future__ import annotations

from collections.abc import Callable

import ipywidgets as W

from preflight.core.numfmt import duration, num, pct, plural, sci
from preflight.reporting import failure_charts
from preflight.widgets.core import explorer, readout

_YEAR_S = 365.25 * 86400
_MANTISSAS = (1, 1.1, 1.2, 1.3, 1.5, 1.6, 1.8, 2, 2.2, 2.5, 2.8, 3, 3.3, 3.6, 4, 4.5, 5, 5.5, 6, 6.5, 7, 7.5, 8, 9)


def _interval(seconds: float) -> str:
    """``7.91 h (28,460 s)``: readable, then the seconds a configuration file wants."""
    text = duration(seconds)
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
        return duration(h * 3600)
    return f"{num(h)} h" + (f" ({duration(h * 3600)})" if h >= 48 else "")


def _points(x: float) -> str:
    """A difference of shares in percentage points: ``+0.924 points``, ``≈0 (<0.001 points)``."""
    return f"{100 * x:+.3g} points" if abs(x) >= 1e-5 else "≈0 (<0.001 points)"


def _one_in(x: float, per: str = "") -> str:
    """``1 in 10,500 days``: a small probability as odds."""
    return f"1 in {float(f'{1 / x:.3g}'):,.0f}{per}"


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
                                    lambda v: sci(v, 2) if v == float(f"{v:.2g}") else sci(v, 3)),
                "nodes": _choice_slider(max(1, int(round(nodes))), 1, 100_000, "nodes", _count_label, integer=True),
                "days": W.IntSlider(value=d0, min=1, max=max(365, d0), description="run length (days)",
                                    style={"description_width": "170px"}, layout=W.Layout(width="520px"))}

    def compute(p, nodes, days):
        n = int(nodes)
        mtbf = F.system_mtbf_h(p, n)
        p_day, p_run = F.failure_prob(p, n), F.failure_prob(p, n, days)
        text = readout({
            "p": ("per-node daily failure probability",
                  (sci(p, 3) + (f" ({_one_in(p)})" if p > 0 else "")) if p < 0.01 else pct(p)),
            "nodes": ("nodes", f"{n:,}"),
            "p_day": ("P(at least one node failure per day)",
                      pct(p_day) + (f" ({_one_in(p_day, ' days')})" if 0 < p_day < 0.01 else "")),
            "p_run": (f"P(at least one failure in {plural(days, 'day')})", pct(p_run)),
            "mtbf_h": ("system MTBF", _hours(mtbf)),
            "failures_run": ("expected failures per run", num(F.run_failures(p, n, days))),
        })
        return text, failure_charts.failure_prob_chart(p, n, max(days, 30))

    return explorer(controls, compute, "Node failures explorer")


def interval_explorer(C: float, R: float, M_h: float, plan_interval_s: float | None = None,
                      segments: int = 20000, walltime_h: float | None = None) -> W.VBox:
    """Sliders: checkpoint write cost C, restart cost R, system MTBF -> Young's and Daly's intervals,
    the simulated optimum (a stable number and the range of intervals the simulation cannot tell from
    it), the waste at each, the first-order formula's error, the restart share; the waste curve redrawn
    (``models.checkpoint_sim.waste_curve`` with ``segments`` per interval and seed 0, as the chapter's
    table: the same numbers; about 0.1 s a redraw). ``walltime_h``: drawn on the chart, and the readout
    warns when the optimum is longer. When C + R reaches the MTBF the readout says there is no
    progress and shows no intervals."""
    from preflight.models import checkpoint_sim as S
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
        curve = S.waste_curve(C, R, M, segments=segments, seed=0)
        young, daly = F.young_interval(C, M), F.daly_interval(C, M)
        lo, hi, best = S.optimal_range_simulated(curve)
        blind = not stuck and not S.simulation_resolves_optimum(curve)     # too few failures drawn
        sim = S.simulate_waste(best, C, R, M, segments=segments, seed=0)
        sim_young = S.simulate_waste(young, C, R, M, segments=segments, seed=0)   # same draws: comparable
        w_young, w_daly = F.daly_waste(young, C, R, M), F.daly_waste(daly, C, R, M)
        fo = F.first_order_waste(young, C, R, M)
        if stuck:
            why += f" ({pct(w_daly)} of the time lost even at the best interval)"
        plan = {}
        if plan_interval_s:
            plan = {"plan_s": ("plan's interval", _interval(plan_interval_s)),
                    "waste_plan": ("waste at the plan's interval (Daly model)",
                                   pct(F.daly_waste(plan_interval_s, C, R, M)))}
        wall = {}
        if walltime_s:
            if stuck:
                words = duration(walltime_s)
            elif daly > walltime_s:
                words = (f"the optimum ({duration(daly)}) is longer than the {duration(walltime_s)} walltime: "
                         "checkpoint at the walltime signal instead")
            else:
                words = (f"{duration(walltime_s)}: {walltime_s / daly:.3g} checkpoints per allocation at "
                         "Daly's interval")
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
                          f"— (the simulation drew fewer than {S.MIN_FAILURES} failures near the optimum: "
                          "failures are too rare for it; the formulas hold)" if blind else
                          f"{_span(lo, hi)} (" + ("flat: " if flat else "") + "within the simulation's error)"),
            "waste_young": ("waste at Young (Daly model)", pct(w_young)),
            "waste_daly": ("waste at Daly (Daly model)", pct(w_daly)),
            "waste_sim": ("waste at the simulated optimum (simulation, 95 % interval)",
                          pct(sim["waste"]) + ("" if stuck or sim["se"] == 0 else
                                                f" ({pct(max(sim['lo'], 0.0))} – {pct(min(sim['hi'], 1.0))}; "
                                                f"at Young, same simulation: {pct(sim_young['waste'])})")),
            "waste_first_order": ("first-order waste at Young (C/τ + (τ+C)/2M + R/M)",
                                  "100% (capped: the formula exceeds 100 %, invalid here)" if fo >= 1 else pct(fo)),
            "first_order_error": ("first-order formula minus Daly model, at Young",
                                  "— (first order invalid: above 100 %)" if fo >= 1
                                  else _points(fo - w_young)),
            "restart_share": ("restart share of wall time (1 − e^(−R/M))",
                              f"{pct(F.restart_share(R, M))} ({duration(R)} per failure, a failure every "
                              f"{duration(M)})"),
            **plan,
            **wall,
        })
        marks = {"Young": young, "Daly": daly, **({"plan": plan_interval_s} if plan_interval_s else {})}
        chart = failure_charts.waste_curve_chart(curve, marks, f"Checkpoint waste: C {duration(C)}, R {duration(R)}, "
                                                       f"MTBF {_hours(M_h)}",
                                         sim_range=None if stuck or blind else (lo, hi), walltime_s=walltime_s)
        return text, chart

    return explorer(controls, compute, "Checkpoint interval explorer")
