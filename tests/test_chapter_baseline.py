"""Chapter 1's audit logic on recorded data (tests/data/cpu_records: a real quick run on a 2-core
CPU) and on the profile, without running the notebook."""
import pytest

from conftest import EXAMPLE, REPO
from preflight.chapters import baseline as B
from preflight.core.findings import FindingSink
from preflight.core.profile import load_profile, parse_profile
from preflight.core.records import load_records
from preflight.runner.chapter import Measured

RECORDS = REPO / "tests" / "data" / "cpu_records"


def _measured(method):
    rec = load_records(RECORDS, method)[-1]
    return Measured(rec["results"], "recorded", rec)


def _ids(sink):
    return {f.id: f for f in sink.findings}


def test_plan_findings_of_the_example():
    p = load_profile(EXAMPLE)
    sink = FindingSink()
    B.add_plan_findings(sink, p, B.plan_curve(p))
    f = _ids(sink)
    # weak scaling (the example's policy): Gustafson decides, Amdahl's values stay as info
    assert f["baseline/amdahl_max_speedup"].value == pytest.approx(1 + 0.8 / 0.09)
    assert f["baseline/amdahl_max_speedup"].verdict == "info"
    assert f["baseline/amdahl_speedup_at_target"].value == pytest.approx(0.89 / (0.09 + 0.8 / 1024))
    assert f["baseline/amdahl_speedup_at_target"].verdict == "info"
    g = f["baseline/gustafson_speedup_at_target"]
    assert g.value == pytest.approx(1024 - 0.09 / 0.89 * 1023) and g.verdict == "pass"       # ~920x, 90 %
    assert f"{g.value:.0f}" == "921"
    # the one step model judges the efficiency: 0.734 s = 0.09 serial + 0.406 compute + 0.238 s of the DDP
    # all-reduce that the backward leaves exposed (the 25 MB buckets' latency included): 68 %, a warning, and
    # the fix names the largest loss (communication), not a fix for a passing plan
    eff = f["baseline/scaling_efficiency_at_target"]
    step = f["baseline/step_model"]
    assert eff.verdict == "warn" and eff.value == pytest.approx((0.09 + step.terms["compute_s"]) / step.value)
    assert 0.6 < eff.value < 0.8 and "flat arithmetic 2.26 s" in eff.message and "chapter 3" in eff.fix
    assert sum(step.terms[k] for k in ("serial_s", "compute_s", "bubble_s", "tp_exposed_s", "cp_exposed_s", "a2a_s",
                                       "pp_comm_s", "dp_exposed_s")) == pytest.approx(step.value)
    # the stated 0.8 s of compute is 1.97x the model's 0.406 s: judged, and the terms that could explain it said
    ratio = f["baseline/stated_step_ratio"]
    assert ratio.value == pytest.approx(0.8 / step.terms["compute_s"]) and ratio.verdict == "warn"
    assert "data-parallel" in ratio.message and "--traces" in ratio.message
    # one 4096-token sequence of a 7B model in 0.8 s on an H100: 25 % of the dense bf16 peak
    mfu = f["baseline/implied_mfu"]
    assert mfu.value == pytest.approx((6 * 7e9 + 12 * 32 * 4096 * 4096) * 4096 / 0.8 / 989.5e12, rel=1e-3)
    assert mfu.verdict == "pass" and 0.24 < mfu.value < 0.26


def test_the_old_example_plan_is_physically_impossible():
    """8 micro-batches of 4096 tokens in 0.8 s: ~200 % of an H100's dense bf16 peak."""
    p = load_profile(EXAMPLE)
    old = p.model_copy(update={"training": p.training.model_copy(update={"microbatches": 8})})
    sink = FindingSink()
    B.add_plan_findings(sink, old, B.plan_curve(old))
    mfu = _ids(sink)["baseline/implied_mfu"]
    assert mfu.verdict == "fail" and 1.95 < mfu.value < 2.05
    assert "Beyond what any matmul reaches" in mfu.message and "training.step_compute_s" in mfu.message
    # a chip without a known peak: not judged, said so
    sink = FindingSink()
    B.add_plan_findings(sink, old, B.plan_curve(old), gpu_key="some unknown chip")
    mfu = _ids(sink)["baseline/implied_mfu"]
    assert mfu.verdict == "info" and mfu.value is None and "unknown" in mfu.message


def test_implied_mfu_fails_above_what_a_matmul_reaches():
    """85 % of the dense peak is below 100 % but above the ~80 % the best GEMMs reach: fail, not warn."""
    p = load_profile(EXAMPLE)
    mfu = B.implied_mfu(p, "H100-SXM")["mfu"]
    fast = p.model_copy(update={"training": p.training.model_copy(update={"step_compute_s": 0.8 * mfu / 0.85})})
    sink = FindingSink()
    B.add_plan_findings(sink, fast, B.plan_curve(fast))
    f = _ids(sink)["baseline/implied_mfu"]
    assert 0.84 < f.value < 0.86 and f.verdict == "fail" and B.IMPLIED_MFU_FAIL == 0.80


def test_strong_scaling_lets_amdahl_decide():
    p = load_profile(EXAMPLE)
    strong = p.model_copy(update={"training": p.training.model_copy(update={"scaling": "strong"})})
    sink = FindingSink()
    B.add_plan_findings(sink, strong, B.plan_curve(strong))
    f = _ids(sink)
    assert f["baseline/amdahl_max_speedup"].verdict == "fail"            # 9.9x against 1024 GPUs
    assert f["baseline/amdahl_speedup_at_target"].verdict == "fail"
    assert f["baseline/gustafson_speedup_at_target"].verdict == "info"
    # the step is the work all GPUs share: 0.8 s / 1024 of compute each, FLOPs of the whole global batch
    assert f["baseline/implied_mfu"].verdict == "fail"


def test_a_healthy_plan_passes():
    p = parse_profile({"project": "small", "model": {"params": 1e8, "layers": 12, "hidden": 768, "seq_len": 1024},
                       "cluster": {"nodes": 1, "gpus_per_node": 8},
                       "training": {"step_serial_s": 0.001, "step_compute_s": 1.0, "grad_dtype": "bf16"}})
    sink = FindingSink()
    B.add_plan_findings(sink, p, B.plan_curve(p))
    f = _ids(sink)
    assert f["baseline/amdahl_max_speedup"].value == pytest.approx(1001)          # >= 2 x 8, info (weak)
    assert f["baseline/gustafson_speedup_at_target"].verdict == "pass"
    assert f["baseline/scaling_efficiency_at_target"].verdict == "pass"


def test_measured_findings_replay_cpu_records():
    base, fus = _measured("baseline"), _measured("fusion")
    sink = FindingSink()
    B.add_measured_findings(sink, base, fus)
    f = _ids(sink)
    r = base.results
    assert f["baseline/throughput"].value == pytest.approx(r["throughput"]["tokens_per_s"])
    assert f["baseline/memory_bound_share"].value == pytest.approx(r["memory_bound_share"])
    # CPU fallback: recorded, not judged against GPU thresholds; MFU left empty (unknown peak)
    assert f["baseline/memory_bound_share"].verdict == "info"
    assert f["baseline/mfu"].value is None and "unknown peak" in f["baseline/mfu"].message
    assert f["baseline/fusion_speedup"].value == pytest.approx(fus.results["speedup_fwd_bwd"])
    assert f["baseline/peak_memory"].value == pytest.approx(r["memory"]["peak_GB"] * 1e9)


def test_gpu_results_are_judged():
    rec = load_records(RECORDS, "baseline")[-1]
    r = dict(rec["results"], device="cuda:0", memory_bound_share=0.45)
    r["mfu"] = dict(r["mfu"], mfu_datasheet=0.28, datasheet_peak_tflops=989.4)
    sink = FindingSink()
    B.add_measured_findings(sink, Measured(r, "measured on GPU"), None)
    f = _ids(sink)
    assert f["baseline/memory_bound_share"].verdict == "fail"     # the field case: ~45 %
    assert f["baseline/mfu"].verdict == "fail"                    # under 30 %
    assert f["baseline/fusion_speedup"].value is None


def test_gpu_profile_without_op_time_is_not_a_pass():
    """A sandboxed GPU without CUPTI: the profiler runs but sees no kernels. The share is unknown,
    not 0 % (which would pass), and the fusion line says n/a instead of nan %."""
    rec = load_records(RECORDS, "baseline")[-1]
    reason = "torch.profiler recorded no op time (no CUDA kernel events: CUPTI unavailable here?)"
    r = dict(rec["results"], device="cuda:0", memory_bound_share=None,
             profile={"available": False, "reason": reason})
    fus = dict(_measured("fusion").results, memory_bound_share_eager=None, memory_bound_share_compiled=None)
    sink = FindingSink()
    B.add_measured_findings(sink, Measured(r, "measured on GPU"), Measured(fus, "measured on GPU"))
    f = _ids(sink)
    assert f["baseline/memory_bound_share"].value is None and f["baseline/memory_bound_share"].verdict == "info"
    assert "CUPTI" in f["baseline/memory_bound_share"].message
    assert "memory-bound share n/a -> n/a" in f["baseline/fusion_speedup"].message


def test_measured_serial_parallel_split():
    comp = [{"phase": "data_wait", "seconds": 0.01}, {"phase": "forward", "seconds": 0.03},
            {"phase": "backward", "seconds": 0.06}, {"phase": "optimizer", "seconds": 0.02},
            {"phase": "other", "seconds": 0.005}]
    ts, tc = B.measured_serial_parallel(comp)
    assert ts == pytest.approx(0.035) and tc == pytest.approx(0.09)


def test_not_measured_findings_in_plan_only():
    sink = FindingSink()
    B.add_measured_findings(sink, None, None)
    B.add_measured_scaling(sink, None, "")
    for f in sink.findings:
        assert f.value is None and f.verdict == "info" and f.message.startswith("not measured")


def test_curve_table_reads_as_percent_and_words():
    t = B.curve_table(B.plan_curve(load_profile(EXAMPLE), None))
    assert list(t["GPUs"]) == [1, 8, 64, 512, 1024]
    assert t["efficiency, no overlap"].iloc[-1].endswith("%") and t["efficiency, measured"].iloc[-1] == "—"
    assert set(t["stop rule (60%)"]) == {"— (model only)"}
    assert not any("_" in c for c in t.columns)


def test_messages_restate_speedups_as_the_value_column_shows_them():
    # one rounding per number: the message says 921x where the value column says 921x (not 920.6x)
    from preflight.core.numfmt import fmt_value

    p = load_profile(EXAMPLE)
    sink = FindingSink()
    B.add_plan_findings(sink, p, B.plan_curve(p))
    by_id = {f.id: f for f in sink.findings}
    for fid in ("baseline/amdahl_max_speedup", "baseline/amdahl_speedup_at_target",
                "baseline/gustafson_speedup_at_target"):
        f = by_id[fid]
        assert fmt_value(f.value, f.unit) in f.message, (fid, f.value, f.message)


@pytest.mark.parametrize("scaling", ["weak", "strong"])
def test_the_amdahl_chart_shows_the_numbers_its_findings_judge(scaling):
    """Chapter 1's chart is drawn from the profile's step (the sliders start there too): at the target N
    its Amdahl and Gustafson lines are the findings' values, and the judged one follows training.scaling."""
    from preflight.reporting import charts

    d = load_profile(EXAMPLE).model_dump()
    d["training"]["scaling"] = scaling
    p = parse_profile(d)
    sink = FindingSink()
    B.add_plan_findings(sink, p, B.plan_curve(p))
    f = _ids(sink)
    ts, tc = B.serial_parallel(p)
    spec = charts.amdahl_chart(ts, tc, n_max=max(1024, p.gpus), n_mark=p.gpus).to_dict()
    rows = next(v for v in spec["datasets"].values() if v and "model" in v[0])
    at = {r["model"]: r["speedup"] for r in rows if r["N"] == p.gpus}
    assert at[charts.SPEEDUP_LABELS["amdahl_speedup"]] == pytest.approx(f["baseline/amdahl_speedup_at_target"].value)
    if scaling == "weak":       # under strong scaling the info finding takes Gustafson's s at N (the chart's at 1)
        assert at[charts.SPEEDUP_LABELS["gustafson_speedup"]] == pytest.approx(
            f["baseline/gustafson_speedup_at_target"].value)
    judged, ref = (("gustafson", "amdahl") if scaling == "weak" else ("amdahl", "gustafson"))
    assert f[f"baseline/{judged}_speedup_at_target"].verdict != "info"
    assert f[f"baseline/{ref}_speedup_at_target"].verdict == "info"
