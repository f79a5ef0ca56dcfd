"""Fault tolerance formulas: failure odds at scale, checkpoint intervals, and the waste model checked
against a Monte Carlo simulation of the failure/restart process."""
import math
import re
import time

import numpy as np
import pytest

from preflight.core.numfmt import pct
from preflight.models import checkpoint_sim as S
from preflight.models import resilience as F

HOUR, DAY = 3600.0, 86400.0


# -- how often ---------------------------------------------------------------------------------------

def test_field_report_per_day_and_per_month():
    assert F.failure_prob(1e-4, 1000) == pytest.approx(0.0952, abs=5e-4)
    assert F.failure_prob(1e-4, 1000, 30) > 0.94
    assert F.system_mtbf_h(1e-4, 1000) == pytest.approx(240.0, rel=1e-3)
    assert F.run_failures(1e-4, 1000, 30) == pytest.approx(3.0, rel=1e-3)
    assert F.node_rate_per_day(1e-4) == pytest.approx(1e-4, rel=1e-4)


def test_llama3_reference():
    assert F.mtbf_from_interruptions(419, 54) == pytest.approx(3.09, abs=0.01)
    ref = F.reference_points().set_index("case")
    llama = ref.loc["Llama 3 405B"]
    p = llama["per-node daily failure probability"]
    assert llama["nodes"] == 2048
    assert llama["MTBF (h)"] == pytest.approx(3.093, abs=1e-3)
    assert p == pytest.approx(0.00378, abs=1e-5)
    # the implied per-node probability reproduces the observed interruption rate and MTBF
    assert F.run_failures(p, 2048, 54) == pytest.approx(419, rel=1e-9)
    assert llama["failures per day"] == pytest.approx(419 / 54)
    assert F.system_mtbf_h(p, 2048) == pytest.approx(llama["MTBF (h)"], rel=1e-9)
    assert llama["P(failure per day)"] > 0.999
    assert ref.loc["field report", "P(failure per day)"] == pytest.approx(0.0952, abs=5e-4)


def test_reference_points_read_as_a_table():
    ref = F.reference_points()
    assert list(ref.columns) == ["case", "nodes", "per-node daily failure probability", "failures per day",
                                 "P(failure per day)", "MTBF (h)", "source"] == list(F.REFERENCE_COLUMNS)
    src = ref.set_index("case")["source"]
    assert src["field report"] == "field report: 1.0e-4 failures per node-day, 1,000 nodes"     # no internal document cited
    assert "Llama 3 Herd of Models" in src["Llama 3 405B"] and "2407.21783" in src["Llama 3 405B"]
    assert not any("pitfalls" in s or "section 5" in s for s in src)


def test_monotone_in_nodes_and_edges():
    nodes = np.array([1, 10, 100, 1000, 10000])
    p = F.failure_prob(1e-4, nodes)
    mtbf = F.system_mtbf_h(1e-4, nodes)
    assert np.all(np.diff(p) > 0) and np.all(np.diff(mtbf) < 0)
    assert np.all(np.diff(F.failure_prob(1e-4, 1000, np.arange(1, 31))) > 0)
    assert F.system_mtbf_h(0.0, 1000) == math.inf
    assert F.failure_prob(0.0, 1000, 30) == 0.0 and F.run_failures(0.0, 1000, 30) == 0.0
    assert F.failure_prob(1.0, 1) == 1.0 and F.node_rate_per_day(1.0) == math.inf
    assert F.system_mtbf_h(1.0, 4) == 0.0 and F.failure_prob(1.0, 4, 0) == 0.0
    assert F.mtbf_from_interruptions(0, 10) == math.inf
    assert F.failure_prob(1e-12, 1) == pytest.approx(1e-12, rel=1e-6)       # no cancellation


# -- intervals ---------------------------------------------------------------------------------------

def test_young_and_daly():
    assert F.young_interval(60, DAY) == pytest.approx(3219.9, abs=0.1)     # 53.7 min
    assert F.daly_interval(60, DAY) == pytest.approx(3180.1, abs=0.1)
    for C, M in [(1, 1e6), (60, DAY), (600, 7200), (720, 3600), (3000, 3600)]:
        y, d = F.young_interval(C, M), F.daly_interval(C, M)
        assert d >= y - C
        s = math.sqrt(C / (2 * M))
        assert d == pytest.approx(2 * M * s * (1 - s / 3) ** 2)
    assert F.daly_interval(1, 1e6) == pytest.approx(F.young_interval(1, 1e6), rel=1e-3)   # C << M
    assert F.daly_interval(7200, 3600) == 3600                                            # C >= 2M: M


def test_daly_interval_is_near_the_exact_optimum_of_daly_waste():
    for C, M in [(60, DAY), (720, 3600), (600, 600)]:
        taus = np.geomspace(F.young_interval(C, M) / 20, F.young_interval(C, M) * 5, 20001)
        w = F.daly_waste(taus, C, 300, M)
        assert F.daly_waste(F.daly_interval(C, M), C, 300, M) - w.min() < 2e-3


def test_waste_limits():
    assert F.daly_waste(3600, 60, 300, math.inf) == pytest.approx(60 / 3660)
    assert F.daly_waste(3600, 60, 300, 1e15) == pytest.approx(60 / 3660, rel=1e-6)
    assert F.first_order_waste(3600, 60, 300, math.inf) == pytest.approx(60 / 3600)
    assert F.daly_waste(1e6, 60, 300, 3600) == 1.0                         # e^277: no overflow, no NaN
    assert S.simulate_waste(3600, 60, 300, math.inf)["waste"] == pytest.approx(60 / 3660)
    assert S.simulate_waste(1e6, 60, 300, 3600)["waste"] == 1.0
    # small C/M: first order and the exact model agree to a fraction of a point
    assert abs(F.first_order_waste(3220, 60, 0, DAY) - F.daly_waste(3220, 60, 0, DAY)) < 2e-3


# -- Monte Carlo against the model -------------------------------------------------------------------

CASES = [  # tau, C, R, M
    (3600, 60, 300, DAY),            # C/M small: a few percent of waste
    (1800, 600, 600, 2 * HOUR),
    (2277, 720, 0, HOUR),            # C/M = 0.2, no restart cost
    (2277, 720, 720, HOUR),          # C/M = 0.2, restarts that can fail too
    (20000, 720, 300, HOUR),         # ~340 failures per segment: the normal branch of the sums
    (100, 720, 300, HOUR),
]


@pytest.mark.parametrize("tau,C,R,M", CASES)
def test_simulation_agrees_with_daly_model(tau, C, R, M):
    sim = S.simulate_waste(tau, C, R, M, segments=20000, seed=1)
    model = F.daly_waste(tau, C, R, M)
    assert abs(sim["waste"] - model) <= max(3 * sim["se"], 0.05 * model)
    assert abs(sim["waste"] - model) <= 3 * sim["se"] + 1e-4
    assert sim["lo"] < sim["waste"] < sim["hi"]
    expected_failures = math.expm1((tau + C) / M) * math.exp(R / M)      # work and restart failures
    assert sim["failures_per_segment"] == pytest.approx(expected_failures, rel=0.05)


def test_first_order_is_visibly_off_at_c_over_m_of_a_fifth():
    tau, C, R, M = F.young_interval(720, HOUR), 720, 0, HOUR
    sim = S.simulate_waste(tau, C, R, M, segments=20000, seed=2)
    fo = F.first_order_waste(tau, C, R, M)
    assert sim["waste"] == pytest.approx(0.513, abs=0.006)
    assert fo == pytest.approx(0.7325, abs=1e-3)
    assert fo - sim["waste"] > 10 * sim["se"]
    assert abs(fo / (1 + fo) - sim["waste"]) > 10 * sim["se"]  # read as a share of wall time: too low


def test_simulation_is_deterministic_and_fast():
    a = S.simulate_waste(1800, 600, 600, 7200, seed=3)
    assert a == S.simulate_waste(1800, 600, 600, 7200, seed=3)
    assert a != S.simulate_waste(1800, 600, 600, 7200, seed=4)
    t0 = time.process_time()       # CPU seconds of this process: other jobs on the cores do not count
    curve = S.waste_curve(720, 720, HOUR, segments=20000)
    assert time.process_time() - t0 < 1.0                     # ~30 intervals x 20k segments
    assert len(curve) >= 30


@pytest.mark.parametrize("C,R,M", [(60, 300, DAY), (720, 720, HOUR), (60, 300, 1875 * HOUR)])
def test_waste_curve_minimum_near_daly(C, R, M):
    curve = S.waste_curve(C, R, M)
    assert list(curve.columns[:6]) == ["interval_s", "daly", "first_order", "simulated", "simulated_lo",
                                       "simulated_hi"]
    young, daly = F.young_interval(C, M), F.daly_interval(C, M)
    assert {young, daly} <= set(curve["interval_s"])
    assert curve["interval_s"].is_monotonic_increasing
    lo, hi, best = S.optimal_range_simulated(curve)
    assert lo <= best <= hi and S.optimal_interval_simulated(curve) == best
    argmin = curve["interval_s"].iloc[int(curve["simulated"].argmin())]
    assert lo <= argmin <= hi and lo <= daly <= hi             # the model's optimum is in the flat range
    assert daly / 1.5 < best < daly * 1.5
    at_daly = S.simulate_waste(daly, C, R, M)                  # same draws as the curve: the same value
    assert at_daly["waste"] == curve.loc[curve["interval_s"] == daly, "simulated"].iloc[0]
    at_best = S.simulate_waste(best, C, R, M)
    assert abs(at_best["waste"] - at_daly["waste"]) <= 2 * at_daly["se"]
    assert np.all(np.abs(curve["simulated"] - curve["daly"]) <= 4 * curve["simulated_se"] + 1e-4)


def test_simulated_range_is_flat_at_small_c_over_m_and_narrow_when_it_is_not():
    lo, hi, _ = S.optimal_range_simulated(S.waste_curve(60, 300, 1875 * HOUR))
    assert hi / lo > 3                                         # 4-20 h: all within the simulation's error
    lo, hi, best = S.optimal_range_simulated(S.waste_curve(720, 720, HOUR))
    assert hi / lo < 2 and lo < F.daly_interval(720, HOUR) < hi


@pytest.mark.parametrize("C,R,M", [(60, 300, 1875 * HOUR), (720, 720, HOUR)])
def test_common_random_numbers_make_the_simulated_curve_smooth(C, R, M):
    """One set of draws for every interval: neighbouring points share their noise, so the curve's error
    against the model changes little from point to point (independent draws: about one se a step)."""
    curve = S.waste_curve(C, R, M, segments=5000)
    err = (curve["simulated"] - curve["daly"]).to_numpy()
    assert np.mean(np.abs(np.diff(err))) < 0.5 * curve["simulated_se"].mean()
    d = S._draws(5000, 0)
    with pytest.raises(ValueError):                            # the shared draws are read-only
        d.col("u_work")[0] = 0.5
    # a column is the same whichever others were drawn first, and independent of the parameters
    assert np.array_equal(S._Draws(5000, 0).col("v_work", 3), d.col("v_work", 3))
    assert not np.array_equal(d.col("v_work", 2), d.col("v_work", 3))


SLIDER_C = [55, 60, 65]        # the C slider's round values around the example's 60 s


def test_simulated_optimum_is_stable_to_small_changes_of_c():
    M = 1875 * HOUR
    for segments in (5000, 20000):
        bests = [S.optimal_range_simulated(S.waste_curve(C, 300, M, segments=segments))[2]
                 for C in [*SLIDER_C, 58.6, 61.4, 62.8]]     # the browser check's 60 -> 61.4 -> 62.8 too
        for a, b in zip(bests, bests[1:]):
            assert abs(b / a - 1) < 0.2, bests
        for C, best in zip(SLIDER_C, bests):
            assert F.daly_interval(C, M) / 1.5 < best < 1.5 * F.daly_interval(C, M)


def test_walltime_fit():
    assert F.walltime_fit(3600, 24) == pytest.approx(1 / 24)
    assert F.walltime_fit(48 * HOUR, 24) == 2.0               # > 1: the job can end before its first checkpoint


@pytest.mark.parametrize("call,name", [
    (lambda: F.failure_prob(1.5, 10), "p_node_day"),
    (lambda: F.failure_prob(-0.1, 10), "p_node_day"),
    (lambda: F.failure_prob(1e-4, 0), "nodes"),
    (lambda: F.system_mtbf_h(1e-4, 0.5), "nodes"),
    (lambda: F.young_interval(-1, 3600), "C"),
    (lambda: F.daly_interval(60, 0), "M"),
    (lambda: F.daly_waste(0, 60, 0, 3600), "tau"),
    (lambda: F.daly_waste(100, 60, -1, 3600), "R"),
    (lambda: F.first_order_waste(100, 60, 0, -5), "M"),
    (lambda: S.simulate_waste(-5, 60, 0, 3600), "tau"),
    (lambda: S.simulate_waste(5, 60, 0, 3600, segments=1), "segments"),
    (lambda: F.mtbf_from_interruptions(10, 0), "days"),
    (lambda: F.walltime_fit(3600, 0), "walltime_h"),
    (lambda: S.waste_curve(0, 0, 3600), "waste_curve"),
])
def test_input_validation_names_the_argument(call, name):
    with pytest.raises(ValueError, match=rf"^{name} "):
        call()


def test_validation_message_gives_the_range():
    with pytest.raises(ValueError, match=r"p_node_day must be a probability in \[0, 1\] \(got 2\)"):
        F.failure_prob(2, 10)
    with pytest.raises(ValueError, match=r"nodes must be >= 1"):
        F.failure_prob(0.1, 0)
    with pytest.raises(ValueError, match=r"M must be > 0 \(inf allowed\)"):
        F.young_interval(60, 0)


# -- charts and widgets ------------------------------------------------------------------------------

def _readout(box) -> dict:
    import html

    return {k: html.unescape(v) for k, v in re.findall(r'data-key="(\w+)">([^<]+)<', box.children[2].value)}


def _controls(box) -> dict:
    return {c.description: c for c in box.children[1].children}


def _seconds(text: str) -> float:
    """The seconds of an interval readout, ``7.91 h (28,460 s)`` -> 28460."""
    m = re.search(r"\(([\d,]+) s\)", text) or re.match(r"([\d.,]+) s$", text)
    return float(m.group(1).replace(",", ""))


def _step(slider, k: int = 1):
    slider.index = slider.index + k


def _near(slider, value):
    return min((v for _, v in slider.options), key=lambda v: abs(v - value) / value)


def test_charts_render():
    from preflight.reporting import charts, failure_charts

    curve = S.waste_curve(60, 300, DAY, segments=2000)
    svg = charts.to_svg(failure_charts.waste_curve_chart(curve, {"Young": 3220, "plan": 1800}, "t"))
    assert svg.startswith("<svg") and "Young" in svg and "plan" in svg and "30 min" in svg
    assert "simulated optimum" in svg                          # the shaded range, not a rule
    svg = charts.to_svg(failure_charts.failure_prob_chart(1e-4, 1000, 60))
    assert "field report" in svg and "Llama 3" in svg and "1.0e-4" in svg and "e-04" not in svg


def test_waste_chart_shades_the_range_and_marks_the_walltime():
    from preflight.reporting import charts, failure_charts

    curve = S.waste_curve(60, 300, 1875 * HOUR)
    lo, hi, _ = S.optimal_range_simulated(curve)
    spec = failure_charts.waste_curve_chart(curve, {"Young": 28460}, sim_range=(lo, hi), walltime_s=48 * HOUR).to_dict()
    rects = [layer for layer in spec["layer"] if layer["mark"]["type"] == "rect"]
    assert len(rects) == 1
    band = spec["datasets"][rects[0]["data"]["name"]][0]
    assert band["hours"] == pytest.approx(lo / HOUR) and band["hours_hi"] == pytest.approx(hi / HOUR)
    assert "walltime" in charts.to_svg(failure_charts.waste_curve_chart(curve, {}, walltime_s=48 * HOUR))
    spec = failure_charts.waste_curve_chart(curve, {"Young": 28460}, sim_range=None).to_dict()
    assert not [layer for layer in spec["layer"] if layer["mark"]["type"] == "rect"]


def test_waste_chart_y_range_includes_the_marks_and_caps_first_order():
    from preflight.reporting import failure_charts

    curve = S.waste_curve(60, 300, 1875 * HOUR)
    plan = 1800.0                                              # 30 min: 3.4 %, inside the default 5 %
    w_plan = F.daly_waste(plan, 60, 300, 1875 * HOUR)
    spec = failure_charts.waste_curve_chart(curve, {"plan": plan}).to_dict()
    top = spec["layer"][1]["encoding"]["y"]["scale"]["domain"][1]
    assert top == 0.05                                         # the old fixed 0-5 % still when all fits
    assert min(curve["interval_s"]) > 120                     # outside the curve: the model's value still
    spec = failure_charts.waste_curve_chart(curve, {"plan": 120.0}).to_dict()      # 2 min: a third lost
    top = max(layer["encoding"]["y"]["scale"]["domain"][1] for layer in spec["layer"]
              if "scale" in layer.get("encoding", {}).get("y", {}))
    assert F.daly_waste(120.0, 60, 300, 1875 * HOUR) < top <= 1.0 and w_plan < top
    assert all(layer["mark"].get("clip") for layer in spec["layer"])       # error bars and marks clipped
    stuck = S.waste_curve(3530, 300, 0.101 * HOUR)
    spec = failure_charts.waste_curve_chart(stuck, {"Young": F.young_interval(3530, 0.101 * HOUR)}, sim_range=None).to_dict()
    lines = [d for rows in spec["datasets"].values() for d in rows if "first order" in d.get("series", "")]
    assert lines and max(d["waste"] for d in lines) == 1.0 and "invalid" in lines[0]["series"]
    top = max(layer["encoding"]["y"]["scale"]["domain"][1] for layer in spec["layer"]
              if "scale" in layer.get("encoding", {}).get("y", {}))
    assert top == 1.0                                          # capped at 100 %


def test_failure_chart_keeps_each_series_colour():
    from preflight.reporting import charts, failure_charts

    def colours(p):
        enc = failure_charts.failure_prob_chart(p, 128, 30).to_dict()["layer"][0]["encoding"]["color"]["scale"]
        return {label.split(":")[0].split(" (")[0]: c for label, c in zip(enc["domain"], enc["range"])}

    a, b, c = colours(3e-5), colours(1e-4), colours(0.00378)
    assert a["field report"] == c["field report"] == "#fb8c00" and a["Llama 3 405B"] == b["Llama 3 405B"]
    assert a["your input"] == b["your input"] == c["your input"] == "#1e88e5"
    assert "field report" not in b and "Llama 3 405B" not in c   # the same p is not drawn twice
    assert "on 1 node" in charts.to_svg(failure_charts.failure_prob_chart(1e-4, 1, 30))


def test_failure_explorer_follows_sliders():
    from preflight.widgets import failure_explorer
    from preflight.widgets import fault_tolerance as Wd

    box = failure_explorer(1e-4, 1000, 30)
    c = _controls(box)
    assert c["failure prob. per node-day"].value == 1e-4 and c["failure prob. per node-day"].label == "1.0e-4"
    assert c["nodes"].value == 1000 and c["nodes"].label == "1,000"
    r = _readout(box)
    assert r["p_day"] == "9.52%" and r["mtbf_h"] == "240 h (10 d)" and r["failures_run"] == "3"
    assert r["p"] == "1.0e-4 (1 in 10,000)"
    assert r["p_run"] == pct(F.failure_prob(1e-4, 1000, 30)) == "95.0%"
    svg = box.children[3].value
    c["nodes"].value = _near(c["nodes"], 2048)
    c["run length (days)"].value = 54
    r = _readout(box)
    n = c["nodes"].value
    assert r["nodes"] == f"{n:,}"
    assert r["p_run"] == pct(F.failure_prob(1e-4, n, 54)) == ">99.9%"
    assert r["mtbf_h"] == Wd._hours(F.system_mtbf_h(1e-4, n)) == "120 h (5 d)"
    assert box.children[3].value != svg


def test_failure_explorer_nodes_are_whole_numbers_and_ranges_are_round():
    from preflight.widgets import failure_explorer

    for nodes in (128, 1000, 2048, 99_360, 250_000):
        c = _controls(failure_explorer(3.78e-3, nodes, 30))
        s = c["nodes"]
        assert s.value == nodes and isinstance(s.value, int)
        assert all(isinstance(v, int) and "." not in lab and "e" not in lab for lab, v in s.options)
        assert s.options[0] == ("1", 1) and s.options[-1][1] == max(100_000, nodes)
        assert s.options[-1][1] % 10_000 == 0                  # a round end, not 99,360
        p = c["failure prob. per node-day"]
        assert p.value == 3.78e-3 and p.label == "3.78e-3"
        assert p.options[0] == ("1.0e-6", 1e-6) and p.options[-1] == ("1.0e-1", 0.1)
        assert all(re.fullmatch(r"\d\.\d+e-\d", lab) for lab, _ in p.options)
    # every step is a real change: no two options with the same label
    labels = [lab for lab, _ in c["nodes"].options]
    assert len(labels) == len(set(labels))


def test_failure_explorer_tiny_and_huge_values_read_naturally():
    from preflight.widgets import failure_explorer

    r = _readout(failure_explorer(1e-6, 1, 1))
    assert r["nodes"] == "1" and r["p"] == "1.0e-6 (1 in 1,000,000)"
    assert r["p_day"] == "<0.001% (1 in 1,000,000 days)" and r["p_run"] == "<0.001%"
    assert r["mtbf_h"] == "23,999,988 h (2,738 years)"
    box = failure_explorer(1e-6, 1, 1)
    assert "in 1 day" in box.children[2].value and "1 days" not in box.children[2].value
    r = _readout(failure_explorer(0.1, 100_000, 30))
    assert r["p_day"] == "100%" and r["mtbf_h"] == "8.2 s" and r["failures_run"] == "316,082"
    for text in r.values():
        assert "e+" not in text


def test_interval_explorer_follows_sliders():
    from preflight.widgets import interval_explorer

    box = interval_explorer(60, 300, 24, plan_interval_s=1800)
    r = _readout(box)
    assert r["young_s"] == "53.7 min (3,220 s)"
    assert r["daly_s"] == "53 min (3,180 s)"
    assert r["waste_daly"] == pct(F.daly_waste(F.daly_interval(60, DAY), 60, 300, DAY)) == "4.01%"
    assert r["waste_plan"] == pct(F.daly_waste(1800, 60, 300, DAY)) == "4.60%"
    assert "walltime" not in r
    c = _controls(box)
    t0 = time.process_time()       # CPU seconds: a redraw's work, whatever else shares the cores
    c["checkpoint write C (s)"].value = _near(c["checkpoint write C (s)"], 720)
    c["system MTBF (h)"].value = 1.0
    assert (time.process_time() - t0) / 2 < 1.0               # one redraw (~0.3 s on 2 CPU cores)
    C, M = c["checkpoint write C (s)"].value, c["system MTBF (h)"].value * HOUR
    R = c["restart R (s)"].value
    r = _readout(box)
    assert r["young_s"].endswith(f"({F.young_interval(C, M):,.0f} s)")
    assert r["daly_s"].endswith(f"({F.daly_interval(C, M):,.0f} s)")
    curve = S.waste_curve(C, R, M, segments=20000, seed=0)
    lo, hi, best = S.optimal_range_simulated(curve)
    assert _seconds(r["sim_opt_s"]) == pytest.approx(best, abs=0.5)
    assert best == S.optimal_interval_simulated(curve)        # the notebook's table: the same number
    error = F.first_order_waste(F.young_interval(C, M), C, R, M) - F.daly_waste(F.young_interval(C, M), C, R, M)
    assert r["first_order_error"] == f"{100 * error:+.3g} points"
    assert C == 700 and error > 0.2                            # C/M = 0.2: first order is far off
    assert r["regime"].startswith("the checkpoint write or restart is not small")


def test_interval_explorer_sim_optimum_is_a_stable_range():
    from preflight.widgets import interval_explorer

    box = interval_explorer(60, 300, 1875, 10800)
    r = _readout(box)
    assert re.fullmatch(r"[\d.]+–[\d.]+ h \(flat: within the simulation's error\)", r["sim_range"])
    lo, hi = (float(x) for x in re.findall(r"[\d.]+", r["sim_range"])[:2])
    mid = _seconds(r["sim_opt_s"])
    assert lo * 3600 <= mid <= hi * 3600
    assert lo * 3600 <= F.daly_interval(60, 1875 * HOUR) <= hi * 3600
    slider = _controls(box)["checkpoint write C (s)"]
    for k in (-1, 1):                                          # one slider step each way
        _step(slider, k)
        moved = _seconds(_readout(box)["sim_opt_s"])
        assert abs(moved / mid - 1) < 0.2, (slider.value, moved, mid)
        _step(slider, -k)
    assert _seconds(_readout(box)["sim_opt_s"]) == mid
    assert "simulated optimum" in box.children[3].value       # the chart's shaded range


def test_interval_explorer_says_no_progress_when_c_exceeds_the_mtbf():
    from preflight.widgets import interval_explorer

    box = interval_explorer(3530, 300, 0.101, 10800)
    r = _readout(box)
    assert r["regime"].startswith("no progress: a checkpoint takes longer than the mean time between failures")
    for key in ("young_s", "daly_s", "sim_opt_s", "sim_range"):
        assert r[key].startswith("—")
    assert r["first_order_error"].startswith("— (first order invalid")
    assert r["waste_first_order"].startswith("100% (capped")
    for key in ("waste_young", "waste_daly", "waste_sim", "waste_plan"):
        assert r[key] in (">99.9%", "100%")
    assert "points" not in box.children[2].value
    r = _readout(interval_explorer(60, 1000, 0.25))            # the restart alone is as long as the MTBF
    assert r["regime"].startswith("no progress: a restart takes longer")


def test_interval_explorer_r_slider_moves_the_readout():
    from preflight.widgets import interval_explorer

    box = interval_explorer(60, 300, 1875)
    before = _readout(box)
    assert re.fullmatch(r"0\.\d{3}%", before["waste_young"])   # three significant digits: 0.425%
    assert before["restart_share"].startswith(f"{100 * F.restart_share(300, 1875 * HOUR):.3g}%")
    assert "5 min per failure" in before["restart_share"]
    _step(_controls(box)["restart R (s)"])
    after = _readout(box)
    R = _controls(box)["restart R (s)"].value
    assert R == 330 and after["restart_share"] != before["restart_share"]
    assert after["restart_share"].startswith(f"{100 * F.restart_share(R, 1875 * HOUR):.3g}%")
    assert F.restart_share(R, 1875 * HOUR) == pytest.approx(R / (1875 * HOUR), rel=1e-4)


def test_interval_explorer_warns_when_the_optimum_exceeds_the_walltime():
    from preflight.widgets import interval_explorer

    box = interval_explorer(60, 300, 1875, 10800, walltime_h=4)
    r = _readout(box)
    assert "checkpoint at the walltime signal instead" in r["walltime"]
    assert "walltime" in box.children[3].value                 # the rule on the chart
    r = _readout(interval_explorer(60, 300, 1875, 10800, walltime_h=48))
    assert r["walltime"].startswith("48 h: 6.08 checkpoints per allocation")
    assert "signal" not in r["walltime"]


def test_interval_explorer_sliders_read_naturally_and_start_exactly():
    from preflight.widgets import interval_explorer

    box = interval_explorer(60, 300, 1875.0, 10800)
    c = _controls(box)
    for name, start, ends in [("checkpoint write C (s)", 60, (1, 3600)), ("restart R (s)", 300, (1, 7200)),
                              ("system MTBF (h)", 1875.0, (0.1, 100_000))]:
        s = c[name]
        assert s.value == start and (s.options[0][1], s.options[-1][1]) == ends
        assert all("e" not in lab for lab, _ in s.options)
    assert c["system MTBF (h)"].label == "1,875" and c["checkpoint write C (s)"].options[-1][0] == "3,600"
    text = box.children[2].value
    assert "√(2·C·M)" in text and "sqrt" not in text
    assert "MTBF 1,875 h (78.1 d)" in box.children[3].value and "e+03" not in box.children[3].value
    box = interval_explorer(5000, 0, 1e6)                      # outside the default ranges: widened, not clamped
    c = _controls(box)
    assert c["checkpoint write C (s)"].value == 5000 and c["restart R (s)"].value == 0
    assert c["system MTBF (h)"].value == 1e6


def test_readable_numbers():
    """The sliders' own compositions (the shared formatters: test_numfmt.py)."""
    from preflight.widgets import fault_tolerance as Wd

    assert Wd._hours(1875) == "1,875 h (78.1 d)" and Wd._hours(0.00229) == "8.24 s" and Wd._hours(3.09) == "3.09 h"
    assert Wd._points(0.331) == "+33.1 points" and Wd._points(3e-12) == "≈0 (<0.001 points)"
    assert Wd.plural(1, "day") == "1 day" and Wd.plural(2, "node") == "2 nodes"


def test_rare_failures_leave_the_simulation_blind_and_the_readout_says_so():
    from preflight.widgets import interval_explorer

    curve = S.waste_curve(60, 300, 1875 * HOUR)
    assert S.simulation_resolves_optimum(curve)               # ~80 failures drawn near the optimum
    assert "simulated_failures" in curve and curve.attrs["M"] == 1875 * HOUR
    rare = S.waste_curve(60, 300, 187_500 * HOUR)              # an MTBF of 21 years: < 1 failure drawn
    assert not S.simulation_resolves_optimum(rare)
    assert math.isfinite(S.optimal_interval_simulated(rare))  # still a number for callers that need one
    r = _readout(interval_explorer(60, 300, 187_500))
    assert r["sim_opt_s"] == "— (too few simulated failures)" and "too rare" in r["sim_range"]
    assert r["young_s"] == f"{F.young_interval(60, 187_500 * HOUR) / 86400:.3g} d (284,605 s)"


def test_llama3_rate_is_computed_from_the_published_counts():
    # 419 unexpected interruptions, 54 days, 16,384 H100s in nodes of 8 (Llama 3 paper, section 3.3.4)
    assert F.LLAMA3_NODES == 2048
    assert F.LLAMA3_RATE_PER_NODE_DAY == pytest.approx(419 / 54 / 2048) == pytest.approx(3.79e-3, abs=1e-5)
    assert F.node_rate_per_day(F.LLAMA3_P_NODE_DAY) == pytest.approx(F.LLAMA3_RATE_PER_NODE_DAY, rel=1e-12)
    assert F.LLAMA3_RATE_PER_NODE_DAY / 1e-4 == pytest.approx(37.9, abs=0.05)      # 38x the field report


def test_128_nodes_under_both_rates():
    # the issue's example: MTBF ~1,875 h at 1e-4 and ~49 h at Llama 3's rate; optimum ~8 h vs ~1.3 h (C = 60 s)
    field, llama = F.system_mtbf_h(1e-4, 128), F.system_mtbf_h(F.LLAMA3_P_NODE_DAY, 128)
    assert field == pytest.approx(1874.9, abs=0.1) and llama == pytest.approx(49.49, abs=0.01)
    assert F.daly_interval(60, field * 3600) / 3600 == pytest.approx(7.89, abs=0.01)
    assert F.daly_interval(60, llama * 3600) / 3600 == pytest.approx(1.27, abs=0.01)


def test_failure_prob_docstring_states_what_the_formula_gives():
    assert F.failure_prob(1e-4, 1000, 30) == pytest.approx(0.950, abs=5e-4)      # not 94.3 %
    assert "95.0 % over a 30-day run" in F.failure_prob.__doc__
    assert F.failure_prob(1e-4, 1000) == pytest.approx(0.0952, abs=5e-5)


def test_the_memoryless_assumption_is_stated_where_young_and_daly_are():
    for doc in (F.__doc__, F.young_interval.__doc__, F.daly_interval.__doc__):
        assert "exponential (memoryless)" in " ".join(doc.split())
