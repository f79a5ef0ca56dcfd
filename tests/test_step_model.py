"""One model of the step behind every verdict (issue 40): `check`, `audit --plan-only` and `advise` print the
same terms for the same plan; no verdict from an invented step; MoE gradients over their expert-data-parallel
groups; the reports do not contradict themselves; the plan set beside the job's traces."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import EXAMPLE, REPO
from preflight.chapters import step as S
from preflight.core.profile import load_profile

INDEXES = {"published.yaml", "bridge.yaml", "heldout.yaml"}
ALL_PROFILES = sorted(p for p in (REPO / "data" / "profiles").rglob("*.yaml")
                      if p.name not in INDEXES and "pending" not in p.parts)
# the 113 held-out runs (data/profiles/heldout/) are compared in the slow tier; every other profile here
PROFILES = [p for p in ALL_PROFILES if "heldout" not in p.parts]
HELDOUT = [p for p in ALL_PROFILES if "heldout" in p.parts]
DEEPSEEK = REPO / "data" / "profiles" / "moe" / "deepseek-v3.yaml"
LLAMA_128K = REPO / "data" / "profiles" / "long-context" / "llama3-405b-128k.yaml"
TERMS = ("serial_s", "compute_s", "bubble_s", "tp_exposed_s", "cp_exposed_s", "a2a_s", "pp_comm_s", "dp_exposed_s",
         "step_s", "dp_comm_s", "mfu", "tokens_per_s_per_gpu")


def _cli(capsys, *argv) -> tuple[int, str]:
    from preflight.cli import main

    code = main(list(argv))
    return code, capsys.readouterr().out


def _check(capsys, path) -> dict:
    code, out = _cli(capsys, "check", str(path), "--json", "--all")
    assert code == 0, out
    return {f["id"]: f for f in json.loads(out)["findings"]}


def _advise_plan(capsys, path) -> dict:
    code, out = _cli(capsys, "advise", str(path), "--json")
    assert code in (0, 1), out                      # 1: no layout fits; the plan is still placed
    return json.loads(out)["plan"]


def _agree(a: float, b: float) -> bool:
    return a == pytest.approx(b, rel=1e-3, abs=1e-12)


def test_every_profile_is_in_the_list():
    assert len(PROFILES) >= 56 and DEEPSEEK in PROFILES and LLAMA_128K in PROFILES and len(HELDOUT) >= 100


@pytest.mark.parametrize("path", PROFILES + [pytest.param(p, marks=pytest.mark.slow) for p in HELDOUT],
                         ids=lambda p: p.stem)
def test_check_and_advise_print_the_same_step(capsys, path):
    """The step terms of `check --json --all` (baseline/step_model) and `advise --json`'s plan agree to 0.1 %;
    chapter 3's data-parallel figures are the same model's, and chapter 1's efficiency is its work share."""
    f = _check(capsys, path)
    plan = _advise_plan(capsys, path)
    terms = f["baseline/step_model"]["terms"]
    assert f["baseline/step_model"]["value"] == pytest.approx(plan["step_s"], rel=1e-3)
    for k in TERMS:
        assert _agree(terms[k], plan[k]), (path.stem, k, terms[k], plan[k])
    assert _agree(f["communication/allreduce_s"]["value"], plan["dp_comm_s"])
    assert _agree(f["communication/allreduce_bytes_per_rank"]["value"], plan["dp_bytes"])
    eff = f["baseline/scaling_efficiency_at_target"]["value"]
    assert _agree(eff, (plan["serial_s"] + plan["compute_s"]) / plan["step_s"])
    share = f["communication/exposed_comm_share"]["value"]
    exposed = sum(plan[k] for k in ("tp_exposed_s", "cp_exposed_s", "a2a_s", "pp_comm_s", "dp_exposed_s"))
    assert _agree(share, exposed / plan["step_s"])
    # the terms add up to the step
    assert sum(terms[k] for k in TERMS[:8]) == pytest.approx(terms["step_s"], rel=1e-9)


@pytest.mark.slow
def test_audit_plan_only_writes_the_same_step_for_every_profile(tmp_path, capsys):
    """`audit --plan-only` (chapters 1 and 3, as the notebooks run them) writes the same terms into findings.json,
    on every profile but the calibration and held-out sets (their `check` and `advise` agree above; 169 audits
    would take 11 minutes of CI)."""
    for path in [p for p in PROFILES if "bridge" not in p.parts]:
        out = tmp_path / path.stem
        r = subprocess.run([sys.executable, "-m", "preflight", "audit", str(path), "--plan-only", "--chapters", "1,3",
                            "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=REPO)
        assert r.returncode == 0, (path, r.stdout[-2000:], r.stderr[-2000:])
        audited = {x["id"]: x for x in json.loads((out / "findings.json").read_text())["findings"]}
        checked = _check(capsys, path)
        for fid in ("baseline/step_model", "baseline/scaling_efficiency_at_target", "communication/allreduce_s",
                    "communication/allreduce_bytes_per_rank", "communication/exposed_comm_share"):
            assert audited[fid]["value"] == pytest.approx(checked[fid]["value"], rel=1e-3), (path.stem, fid)
            assert audited[fid]["verdict"] == checked[fid]["verdict"], (path.stem, fid)
        for k in TERMS:
            assert _agree(audited["baseline/step_model"]["terms"][k], checked["baseline/step_model"]["terms"][k])


@pytest.mark.parametrize("path", [DEEPSEEK, LLAMA_128K], ids=lambda p: p.stem)
def test_no_impossible_verdict_from_a_default(capsys, path):
    """A profile that states no step is judged on the predicted one and says so; no MFU above what any
    matmul reaches follows from a default (DeepSeek-V3 read 957 % with the old 0.8 s default)."""
    f = _check(capsys, path)
    mfu = f["baseline/implied_mfu"]
    assert mfu["value"] is None or mfu["value"] < 0.8
    assert mfu["verdict"] != "fail"
    if load_profile(path).training.step_compute_s is None:
        assert "predicted" in mfu["message"] and mfu["verdict"] == "info"
        assert "baseline/stated_step_ratio" not in f
    comm = f["communication/allreduce_bytes_per_rank"]["value"]
    assert comm < 50e9                                   # DeepSeek-V3 was 333 GB per rank


def test_deepseek_v3_gradients_follow_the_expert_data_parallel_groups():
    """DeepSeek-V3 (arXiv 2412.19437 sec. 3.2, 4.2): 61 layers, the first 3 dense, 58 MoE layers of 256 routed
    experts (SwiGLU, intermediate 2048) on hidden 7168; 2048 GPUs as PP 16 x EP 64, so dp = 128 and each
    expert's replicas, its expert-data-parallel group, = dp / ep = 2. Megatron's distributed optimizer
    (ZeRO-1): a reduce-scatter of the fp32 gradients and an all-gather of the 16-bit weights, (D-1)/D of each,
    dense parameters over 128 ranks and routed experts over 2."""
    routed = 58 * 256 * 3 * 7168 * 2048                  # 6.54e11 of the 671e9
    dense = 671e9 - routed
    per_gpu_dense = dense / 16                           # tp 1 x pp 16
    per_gpu_routed = routed / (16 * 64)                  # pp 16 x ep 64
    expected = (127 / 128) * (4 + 2) * per_gpu_dense + (1 / 2) * (4 + 2) * per_gpu_routed
    ps = S.plan_step(load_profile(DEEPSEEK))
    assert ps.terms["dp_ranks"] == 128 and ps.terms["edp_ranks"] == 2
    assert ps.terms["dp_bytes"] == pytest.approx(expected, rel=1e-6)
    assert 7e9 < expected < 9e9                          # ~8.3 GB per rank, not 333 GB
    old = 2 * 671e9 / 16 * 127 / 128 * 4                 # the old formula: every parameter over every dp rank
    assert old / expected > 30


@pytest.mark.parametrize("path", [EXAMPLE, LLAMA_128K], ids=["example", "llama3-405b-128k"])
def test_the_report_does_not_contradict_itself(capsys, path):
    """The contradictions issue 40 found, each checked: efficiency against exposed communication and bubble,
    fixes that follow their verdict, triage by the model's time lost, check against advise."""
    from preflight.reporting.guidance import time_lost, top_fixes

    f = _check(capsys, path)
    plan = _advise_plan(capsys, path)
    eff = f["baseline/scaling_efficiency_at_target"]
    share = f["communication/exposed_comm_share"]
    bubble = f["load_balance/bubble_fraction"]
    # chapter 1 cannot pass while chapter 3 or 4 fails on a term of the same step
    if "fail" in (share["verdict"], bubble["verdict"]):
        assert eff["verdict"] != "pass"
    assert eff["value"] <= 1 - share["value"] + 1e-9
    # a fix text follows its verdict: a passing finding does not tell the team to stop scaling
    for x in f.values():
        if x["verdict"] == "pass":
            assert "Stop scaling" not in x["fix"], x["id"]
    # check and advise agree on the MFU of the same layout
    assert f["baseline/step_model"]["terms"]["mfu"] == pytest.approx(plan["mfu"], rel=1e-3)
    # triage ranks by time lost: the largest share lost among the judged time-lost findings comes first
    ranked = [x for x in top_fixes(list(f.values()), n=10) if time_lost(x) is not None and x["verdict"] == "fail"]
    losses = [time_lost(x) for x in ranked]
    assert losses == sorted(losses, reverse=True)


def test_llama3_405b_bubble_ranks_above_the_checkpoint_waste(capsys):
    from preflight.reporting.guidance import top_fixes

    f = _check(capsys, LLAMA_128K)
    order = [x["id"] for x in top_fixes(list(f.values()), n=10)]
    assert order.index("baseline/scaling_efficiency_at_target") < order.index("fault_tolerance/checkpoint_interval_extra_waste")
    assert "bubble" in f["baseline/scaling_efficiency_at_target"]["fix"]


def test_a_stated_step_far_from_the_model_says_which_terms_could_explain_it(capsys):
    f = _check(capsys, EXAMPLE)
    r = f["baseline/stated_step_ratio"]
    assert r["verdict"] == "warn" and "data-parallel" in r["message"] and "--traces" in r["fix"]


def test_no_step_at_all_is_said_not_judged():
    """gpu: auto on a machine without a known peak and no stated step: nothing to judge, said in each finding."""
    from preflight.chapters import baseline as B
    from preflight.chapters import communication as C
    from preflight.core.findings import FindingSink

    p = load_profile(EXAMPLE)
    p = p.model_copy(update={"training": p.training.model_copy(update={"step_compute_s": None})})
    sink = FindingSink()
    B.add_plan_findings(sink, p, B.plan_curve(p, None, "no such chip"), gpu_key="no such chip")
    C.add_plan_findings(sink, p, gpu_key="no such chip")
    by = {x.id: x for x in sink.findings}
    for fid in ("baseline/implied_mfu", "baseline/scaling_efficiency_at_target", "communication/exposed_comm_share"):
        assert by[fid].verdict == "info" and by[fid].value is None and "no step" in by[fid].threshold


def test_plan_vs_trace_on_the_embedded_example(tmp_path):
    """`audit PROFILE --traces DIR`: the plan's terms beside the traces', the largest departure named with its
    chapter, the traced job's difference said (128 ranks traced, 1,024 GPUs planned), and the chart written."""
    out = tmp_path / "audit"
    r = subprocess.run([sys.executable, "-m", "preflight", "audit", str(EXAMPLE), "--plan-only", "--chapters", "1",
                        "--traces", str(REPO / "data" / "traces" / "example"), "--out", str(out)],
                       capture_output=True, text=True, timeout=600, cwd=REPO)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    f = {x["id"]: x for x in json.loads((out / "findings.json").read_text())["findings"]}
    pvt = f["baseline/plan_vs_trace"]
    assert "128 ranks" in pvt["message"] and "1,024 GPUs" in pvt["message"] and "chapter" in pvt["message"]
    assert pvt["terms"]["compute_plan_s"] == pytest.approx(f["baseline/step_model"]["terms"]["compute_s"])
    assert pvt["terms"]["compute_trace_s"] > 0 and pvt["value"] > 0
    assert (out / "charts" / "baseline--plan_vs_trace.svg").exists()
    assert "against the plan" in (out / "index.html").read_text()


def test_plan_vs_trace_names_the_term_that_departs_most():
    from preflight.chapters import plan_vs_trace as PVT
    from preflight.chapters.traces import audit_traces

    a = audit_traces(REPO / "data" / "traces" / "example")
    c = PVT.compare(load_profile(EXAMPLE), a)
    top = [r for r in c["rows"] if r["term"] in PVT.TOP_LEVEL and r["departure_s"] is not None]
    assert c["worst"] is max(top, key=lambda r: abs(r["departure_s"]))
    table = PVT.table(c)
    assert list(table["term of the step"])[-1] == "the step" and set(table["chapter"]) >= {"baseline", "communication"}


def test_make_plan_writes_beside_the_measured_report(tmp_path):
    """A plan-only audit without --out goes to reports/<project>-plan, never over reports/<project>."""
    r = subprocess.run([sys.executable, "-m", "preflight", "audit", str(EXAMPLE), "--plan-only", "--chapters", "5"],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "reports" / "llm-7b-pretrain-plan" / "findings.json").exists()
    assert not Path(tmp_path / "reports" / "llm-7b-pretrain").exists()


def test_a_cpu_measurement_does_not_decide_a_gpu_plan():
    """Measured on this machine's CPU for a plan on H100s: shown, labelled, but the verdict is the plan's
    alone (the headline no longer moves with the laptop); on ``gpu: auto`` (the plan is this machine) judged."""
    from preflight.core.findings import FindingSink
    from preflight.runner.chapter import Measured

    build = lambda r: dict(value=3.0, verdict="fail", threshold="pass <= 1.1x, fail > 1.5x", message="m", fix="f")
    cpu = Measured({}, "measured on CPU", {"ran_on": {"kind": "cpu"}})
    gpu = Measured({}, "recorded on H100", {"ran_on": {"kind": "cuda"}})
    plan = FindingSink(None, "fault_tolerance", plan_gpu="H100-SXM")
    f = plan.measured("fault_tolerance/async_stall_ratio", cpu, "ratio", build, why_missing="", missing_fix="")
    assert f.verdict == "info" and "unlike the plan's H100-SXM" in f.threshold and "fail" in f.threshold
    assert plan.measured("fault_tolerance/async_stall_ratio", gpu, "ratio", build, why_missing="",
                         missing_fix="").verdict == "fail"
    here = FindingSink(None, "fault_tolerance", plan_gpu=None)
    assert here.measured("fault_tolerance/async_stall_ratio", cpu, "ratio", build, why_missing="",
                         missing_fix="").verdict == "fail"


def test_a_correctness_check_on_a_cpu_still_decides():
    """A resume bit for bit (unit bool) is a property of the code, not of the device: judged on a CPU too."""
    from preflight.core.findings import FindingSink
    from preflight.runner.chapter import Measured

    build = lambda r: dict(value=1.0, verdict="pass", threshold="pass = bitwise equal", message="m", fix="f")
    sink = FindingSink(None, "fault_tolerance", plan_gpu="H100-SXM")
    f = sink.measured("fault_tolerance/resume_bitwise", Measured({}, "measured on CPU", {"ran_on": {"kind": "cpu"}}),
                      "bool", build, why_missing="", missing_fix="")
    assert f.verdict == "pass"
