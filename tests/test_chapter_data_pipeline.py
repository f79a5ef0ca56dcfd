"""Chapter 2 findings replayed from real records of a quick CPU run (tests/data/cpu_records)."""
import pytest

from conftest import EXAMPLE, REPO
from preflight.chapters import data_pipeline as C
from preflight.core.findings import FindingSink
from preflight.core.profile import load_profile
from preflight.core.records import load_records
from preflight.models import data as M
from preflight.runner.chapter import Measured

RECORDS = REPO / "tests" / "data" / "cpu_records"


def _measured(method):
    rec = load_records(RECORDS, method)[-1]
    return Measured(rec["results"], "recorded on test CPU", rec)


@pytest.fixture(scope="module")
def findings():
    sink = FindingSink(None, "data_pipeline")
    C.add_measured_findings(sink, load_profile(EXAMPLE), _measured("datapipe"), _measured("loadtune"),
                            _measured("loadmon_overhead"))
    return {f.id: f for f in sink.findings}


def test_recorded_run_gives_every_measured_finding(findings):
    assert set(findings) == {"data_pipeline/small_file_slowdown", "data_pipeline/h2d_pinned_speedup", "data_pipeline/headroom",
                             "data_pipeline/headroom_default", "data_pipeline/best_loader_setting",
                             "data_pipeline/instrumentation_overhead"}
    tune = _measured("loadtune").results
    best = tune["best"]
    assert findings["data_pipeline/headroom"].value == pytest.approx(best["headroom"])
    assert findings["data_pipeline/best_loader_setting"].value == best["num_workers"]
    assert M.setting_label(best) in findings["data_pipeline/best_loader_setting"].message


def test_in_process_loading_fails_on_idle_share_whatever_its_headroom(findings):
    """num_workers=0 can 'supply' more than the device consumes and still idle it every step:
    the verdict takes the worse of the headroom and the measured idle share."""
    default = next(r for r in _measured("loadtune").results["rows"] if r["num_workers"] == 0)
    f = findings["data_pipeline/headroom_default"]
    assert default["idle_share"] > C.IDLE_FAIL
    assert f.verdict == "fail"
    assert "inside the training loop" in f.message


def test_small_files_slower_and_overhead_tiny(findings):
    assert findings["data_pipeline/small_file_slowdown"].value > 1
    assert findings["data_pipeline/instrumentation_overhead"].verdict == "pass"
    assert findings["data_pipeline/h2d_pinned_speedup"].value is None        # a CPU has no copy to measure


def test_break_points_table_has_every_stage_and_the_rule():
    r = _measured("datapipe").results
    df = C.break_points(r["storage"], r["preprocessing"], r["assembly"], r["consume"], r["h2d"], r["cores"])
    stages = " ".join(df["stage"])
    for word in ("storage", "CPU preprocessing", "batch assembly"):
        assert word in stages
    assert (df["headroom"] == df["supply (samples/s)"] / df["consumption (samples/s)"]).all()
    assert set(df["verdict"]) <= {"pass", "warn", "fail"}
    assert df.loc[df["headroom"] >= M.HEADROOM_RULE, "verdict"].eq("pass").all()


def test_gpu_copy_rows_when_measured():
    r = _measured("datapipe").results
    h2d = {"available": True, "bytes": 2_408_448, "pageable_s": 0.8e-3, "pinned_s": 0.2e-3,
           "pageable_GBps": 3.0, "pinned_GBps": 12.0, "pinned_speedup": 4.0}
    df = C.break_points(r["storage"], r["preprocessing"], r["assembly"], r["consume"], h2d, r["cores"])
    assert df["stage"].str.startswith("host-to-device").sum() == 2
    sink = FindingSink(None, "data_pipeline")
    pipe = Measured({**r, "h2d": h2d}, "recorded on test GPU", {})
    C.add_measured_findings(sink, load_profile(EXAMPLE), pipe, None, None)
    f = {x.id: x for x in sink.findings}["data_pipeline/h2d_pinned_speedup"]
    assert f.value == 4.0 and "pinned non_blocking" in f.message


def test_rule_of_thumb_agrees_when_a_setting_inside_it_ties_the_best():
    """The best setting is the cheapest tie (prefetch 2); the rule (prefetch 4-8) still agrees when one
    of its settings reached the same idle share, and differs when none did."""
    tune = _measured("loadtune")
    rows = [dict(r) for r in tune.results["rows"]]
    best = min(r["idle_share"] for r in rows)
    def finding(rows):
        res = dict(tune.results, rows=rows)
        sink = FindingSink(None, "data_pipeline")
        C.add_measured_findings(sink, load_profile(EXAMPLE), _measured("datapipe"),
                                Measured(res, "recorded", {}), None)
        return {f.id: f for f in sink.findings}["data_pipeline/best_loader_setting"].message
    for r in rows:                       # every 1-worker setting with prefetch 4-8 ties the best
        if r["num_workers"] == 1 and (r["prefetch_factor"] or 0) >= 4:
            r["idle_share"] = best
    assert "agrees" in finding(rows)
    for r in rows:                       # now none inside the rule does
        if r["num_workers"] == 1 and (r["prefetch_factor"] or 0) >= 4:
            r["idle_share"] = best + 0.05
    assert "differs" in finding(rows)


def test_tuner_chart_and_findings_share_one_verdict(findings):
    """The tuner's bars are coloured by ``loader_verdict``, the rule its findings use: num_workers=0 with a
    passing headroom but a device idle 44 % of the loop is a red bar, not a green one (issue 19)."""
    assert C.loader_verdict({"headroom": 1.84, "idle_share": 0.44}) == "fail"
    assert C.loader_verdict({"headroom": 1.84, "idle_share": 0.01}) == "pass"
    assert C.loader_verdict({"headroom": 1.1, "idle_share": 0.01}) == "warn"
    rows = _measured("loadtune").results["rows"]
    default = next(r for r in rows if r["num_workers"] == 0)
    assert C.loader_verdict(default) == findings["data_pipeline/headroom_default"].verdict


def test_tuner_chart_colours_the_quantity_its_findings_judge(findings):
    """The chart's bars: device idle coloured by the findings' verdict, the best marked; so the best row's
    colour is data_pipeline/headroom's verdict and num_workers=0's is headroom_default's, whatever their
    supply (a long supply bar can be a failing setting)."""
    from preflight.reporting import charts

    t = _measured("loadtune").results
    rows = C.tuner_rows(t)
    assert rows.loc[rows["best"], "verdict"].item() == findings["data_pipeline/headroom"].verdict
    assert rows.loc[rows["num_workers"] == 0, "verdict"].iloc[0] == findings["data_pipeline/headroom_default"].verdict
    spec = charts.loader_bars(rows, "setting", M.setting_label(t["best"])).to_dict()
    idle_panel = spec["hconcat"][0]["layer"][0]
    assert idle_panel["encoding"]["x"]["field"] == "idle_share" and idle_panel["encoding"]["color"]["field"] == "verdict"
    best = min(r["idle_share"] for r in t["rows"])
    assert t["best"]["idle_share"] <= best + M.BEST_TOLERANCE
