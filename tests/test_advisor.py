"""The layout advisor: the step-time model term by term, the enumeration's rules, the ranking, the
no-fit advice, the CLI's validation and ``--write-profile`` (its audit's memory verdict passes)."""
from __future__ import annotations

import json

import pytest
import yaml

from conftest import EXAMPLE, cli_cpu_seconds, example_with, run_cli
from preflight.chapters import advisor
from preflight.core.profile import load_profile, parse_profile
from preflight.models import throughput as T

H100 = T.Cluster(peak_tflops=989.5, gpus_per_node=8, intra_node_GBps=450, inter_node_Gbps=200, nics_per_node=8)
SHAPE = dict(params=7e9, layers=32, hidden=4096, seq_len=4096)


def lay(**kw):
    base = dict(tp=1, pp=1, dp=1, zero_stage=0, activation_recompute="none", sequence_parallel=False,
                micro_batch_size=1, microbatches=1)
    return T.Layout(**(base | kw))


def test_compute_is_flops_over_peak_times_efficiency():
    st = T.step_time(lay(), cluster=H100, efficiency=0.5, **SHAPE)
    flops = (6 * 7e9 + 12 * 32 * 4096 * 4096) * 4096
    assert st.compute_s == pytest.approx(flops / (989.5e12 * 0.5))
    assert st.step_s == st.compute_s and st.mfu == pytest.approx(0.5) and st.hfu == st.mfu
    with pytest.raises(ValueError, match="efficiency"):
        T.step_time(lay(), cluster=H100, efficiency=1.5, **SHAPE)


def test_recompute_costs_a_forward_and_counts_in_hfu_not_mfu():
    none, full = (T.step_time(lay(activation_recompute=r), cluster=H100, **SHAPE) for r in ("none", "full"))
    f = T.recompute_factor("full", **SHAPE)
    assert 1.3 < f < 1.34                          # one more forward: about +1/3
    assert full.compute_s == pytest.approx(none.compute_s * f)
    assert full.hfu == pytest.approx(none.hfu) and full.mfu == pytest.approx(none.mfu / f)
    assert 1 < T.recompute_factor("selective", **SHAPE) < 1.05


def test_bubble_tp_and_pp_communication():
    one = T.step_time(lay(pp=4, microbatches=8), cluster=H100, **SHAPE)
    assert one.bubble == pytest.approx(3 / 8) and one.pp_comm_s > 0
    v2 = T.step_time(lay(pp=4, microbatches=8, interleave=2), cluster=H100, **SHAPE)
    assert v2.bubble == pytest.approx(3 / 16) and v2.pp_comm_s == pytest.approx(2 * one.pp_comm_s)
    tp = T.step_time(lay(tp=8), cluster=H100, **SHAPE)
    base = T.step_time(lay(), cluster=H100, **SHAPE)
    assert tp.tp_comm_s > 0 and tp.compute_s == pytest.approx(base.compute_s / 8)      # 1/tp of the work
    assert one.compute_s == pytest.approx(base.compute_s * 8 / 4)                     # m=8 over pp=4
    full = T.step_time(lay(tp=8, activation_recompute="full"), cluster=H100, **SHAPE)
    assert full.tp_comm_s == pytest.approx(tp.tp_comm_s * 6 / 4)


def test_dp_exposed_and_zero3():
    z0 = T.step_time(lay(dp=1024), cluster=H100, grad_dtype="fp32", **SHAPE)
    assert z0.dp_comm_s == pytest.approx(0.30, abs=0.01)          # the field case's rail-aware 0.30 s
    assert z0.dp_exposed_s == pytest.approx(max(0, z0.dp_comm_s - 2 / 3 * z0.compute_s))
    z3 = T.step_time(lay(dp=1024, zero_stage=3, microbatches=4), cluster=H100, grad_dtype="fp32", **SHAPE)
    assert z3.dp_comm_s == pytest.approx(1.5 * 4 * z0.dp_comm_s)


def test_enumeration_rules():
    p = parse_profile(example_with(model__kv_heads=8))
    seen = list(advisor.layouts(p, 1024))
    assert seen and all(8 % x.tp == 0 and 32 % x.pp == 0 and x.tp * x.pp * x.dp == 1024 for x in seen)
    assert all(x.micro_batch_size * x.microbatches * x.dp == 1024 for x in seen)
    assert not any(x.sequence_parallel and x.tp == 1 for x in seen)
    assert all(x.pp > 1 and x.microbatches % x.pp == 0 and 32 % (x.pp * x.interleave) == 0
               for x in seen if x.interleave > 1)
    assert {x.zero_stage for x in seen} == {0, 1, 2, 3}
    fsdp = list(advisor.layouts(parse_profile(example_with(training__framework="fsdp2", training__zero_stage=3)), 1024))
    assert {x.zero_stage for x in fsdp} == {3}


def test_ranking_and_fit():
    r = advisor.advise(load_profile(EXAMPLE))
    c = r["candidates"]
    fit = c[:r["fitting"]]
    assert fit and all(x["fits"] and x["memory_ratio"] <= 0.90 for x in fit)
    assert all(a["tokens_per_s_per_gpu"] >= b["tokens_per_s_per_gpu"] * (1 - 1e-3) for a, b in zip(fit, fit[1:]))
    assert not any(x["fits"] for x in c[r["fitting"]:])
    # the example's own plan (ZeRO-0, 135 GiB) does not fit; its ZeRO-1 twin is the top layout
    top = c[0]
    assert (top["tp"], top["pp"], top["zero_stage"]) == (1, 1, 1)
    assert r["no_fit"] is None and r["efficiency"] == T.DEFAULT_EFFICIENCY


def test_no_layout_fits_says_by_how_much_and_what_closes_it():
    p = parse_profile(example_with(model__params=175e9, model__layers=96, model__hidden=12288, model__heads=96,
                                   cluster__nodes=1, training__microbatches=8))
    r = advisor.advise(p)
    nf = r["no_fit"]
    assert r["fitting"] == 0 and nf["shortfall_bytes"] > 0
    assert nf["nodes_that_fit"] in (2, 4, 8, 16) and nf["uses_full_recompute"]
    text = advisor.text_report(p, r, 5)
    assert "NO LAYOUT FITS" in text and "short by" in text and "nodes instead of 1" in text


def test_cli_json_write_profile_and_its_audit_memory_verdict(tmp_path):
    out = tmp_path / "best.yaml"
    r, cpu_s = cli_cpu_seconds("advise", EXAMPLE, "--json", "--top", "5", "--write-profile", out)
    assert cpu_s < 10, f"advise used {cpu_s:.1f} CPU-s (budget 10 s)"     # CPU seconds: see cli_cpu_seconds
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout.split("\nprofile:")[0])
    assert len(rows) == 5
    need = {"tp", "pp", "dp", "zero_stage", "activation_recompute", "sequence_parallel", "micro_batch_size",
            "microbatches", "interleave", "memory_per_gpu_bytes", "step_s", "tokens_per_s_per_gpu", "mfu", "fits"}
    assert need <= set(rows[0])
    written = load_profile(out)
    assert (written.training.tp, written.training.zero_stage) == (rows[0]["tp"], rows[0]["zero_stage"])
    c = run_cli("check", out, "--json")
    verdicts = {f["id"]: f["verdict"] for f in json.loads(c.stdout)["findings"]}
    assert verdicts["baseline/memory_fits"] == "pass"


@pytest.mark.parametrize("args, words", [
    (["--top", "0"], "--top = 0: accepted range is 1 to 1,000"),
    (["--top", "x"], "--top = 'x': expected a whole number"),
    (["--global-batch", "0"], "--global-batch = 0: accepted range is 1 to 10,000,000"),
    (["--global-batch", "7"], "global batch (--global-batch"),
    (["--efficiency", "2"], "--efficiency = 2: accepted range"),
])
def test_cli_bad_arguments_exit_2(args, words, tmp_path):
    r = run_cli("advise", EXAMPLE, *args, "--write-profile", tmp_path / "x.yaml")
    assert r.returncode == 2 and words in r.stderr, r.stderr
    assert not (tmp_path / "x.yaml").exists()


def test_cli_bad_profile_and_output(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(example_with(training__pp=3)))
    r = run_cli("advise", bad)
    assert r.returncode == 2 and "training.tp * training.pp" in r.stderr
    r = run_cli("advise", EXAMPLE, "--write-profile", tmp_path / "no" / "x.yaml")
    assert r.returncode == 2 and "folder does not exist" in r.stderr


def _audit(tmp_path, mfu, machine=None, name="gpu-audit"):
    """A findings.json as the audit writes it, reduced to what --mfu-from reads."""
    d = tmp_path / name
    d.mkdir()
    machine = machine or {"kind": "cuda", "label": "NVIDIA H100 80GB HBM3", "table_key": "H100-SXM"}
    (d / "findings.json").write_text(json.dumps({
        "date": "2026-11-30T10:00:00+00:00", "machine": machine, "workload": None,
        "findings": [{"id": "baseline/mfu", "value": mfu, "unit": "fraction", "verdict": "warn",
                      "message": "not measured: plan-only mode (no live measurement)" if mfu is None else "MFU"}]}))
    return d


def test_mfu_from_an_audit_sets_the_efficiency_and_says_where_from(tmp_path):
    d = _audit(tmp_path, 0.42)
    value, source = advisor.measured_efficiency(d, load_profile(EXAMPLE))
    assert value == 0.42 and "reference model on NVIDIA H100" in source and "planned for" not in source
    a100 = _audit(tmp_path, 0.5, {"label": "NVIDIA A100", "table_key": "A100-SXM"}, "a100")
    assert "measured on A100-SXM, planned for H100-SXM" in advisor.measured_efficiency(a100, load_profile(EXAMPLE))[1]
    r = run_cli("advise", EXAMPLE, "--mfu-from", d / "findings.json", "--json", "--top", "3")
    assert r.returncode == 0, r.stderr
    top = json.loads(r.stdout)
    assert all(c["mfu"] <= 0.42 + 1e-9 for c in top) and top[0]["mfu"] > 0.3   # at 42 % of peak, not 60 %
    text = run_cli("advise", EXAMPLE, "--mfu-from", d).stdout
    assert "efficiency 42% (chapter 1's measured MFU of the reference model on NVIDIA H100" in text


@pytest.mark.parametrize("case, words", [
    ("plan-only", "no MFU from chapter 1 there (not measured: plan-only mode"),
    ("missing", "not an audit's findings.json"),
    ("above 1", "outside the accepted 0.01-1"),
    ("both flags", "not allowed with argument"),
])
def test_mfu_from_refuses_what_it_cannot_use(tmp_path, case, words):
    path = {"plan-only": lambda: _audit(tmp_path, None), "missing": lambda: tmp_path / "nothing",
            "above 1": lambda: _audit(tmp_path, 1.5), "both flags": lambda: _audit(tmp_path, 0.4)}[case]()
    extra = ["--efficiency", "0.5"] if case == "both flags" else []
    r = run_cli("advise", EXAMPLE, "--mfu-from", path, *extra)
    assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_efficiency_gap_names_the_direction_and_the_factor():
    # ranked at 50 % while the step implies 25 %: compute times twice too short; the other way, too long
    from preflight.chapters.advisor import efficiency_gap

    assert "2x too short" in efficiency_gap(0.25, 0.50) and "--efficiency 0.25" in efficiency_gap(0.25, 0.50)
    assert "2x too long" in efficiency_gap(0.60, 0.30)
    assert efficiency_gap(0.42, 0.40) is None and efficiency_gap(None, 0.40) is None
