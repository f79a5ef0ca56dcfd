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
MODEL = T.Model(params=7e9, layers=32, hidden=4096, seq_len=4096)
SHAPE = dict(params=7e9, layers=32, hidden=4096, seq_len=4096)


def lay(**kw):
    base = dict(tp=1, pp=1, dp=1, zero_stage=0, activation_recompute="none", sequence_parallel=False,
                micro_batch_size=1, microbatches=1)
    return T.Layout(**(base | kw))


def step(layout=None, **kw):
    return T.step_time(layout or lay(), model=kw.pop("model", MODEL), cluster=kw.pop("cluster", H100), **kw)


def test_compute_is_executed_flops_over_peak_times_efficiency():
    st = step(efficiency=0.5)
    fwd, bwd = T.layer_flops(MODEL, 4096, "none")
    assert fwd == pytest.approx((2 * 7e9 / 32 + 4 * 4096 * 4096) * 4096)      # 2 N_layer + 4 h s per token
    assert st.compute_s == pytest.approx(32 * (fwd + bwd) / (989.5e12 * 0.5))
    assert st.step_s == st.compute_s and st.hfu == st.mfu
    with pytest.raises(ValueError, match="efficiency"):
        step(efficiency=1.5)
    flash = step(model=T.Model(**SHAPE, causal_flash=True), efficiency=0.5)
    assert flash.compute_s < st.compute_s                    # a causal flash kernel skips the masked half


def test_gemm_efficiency_rises_with_size_and_differs_by_chip():
    e = T.gemm_efficiency
    assert e("A100-SXM", 2048) < e("A100-SXM", 12288) < T.GEMM_CEILING["ampere"]
    assert e("H100-SXM", 8192) < e("A100-SXM", 8192)     # the same model reaches less of H100's peak
    assert e("B200", 8192) == T.GEMM_CEILING["blackwell"] / (1 + T.GEMM_HIDDEN_HALF / 8192)   # calibrated now
    assert e("MI300X", 8192) == T.DEFAULT_EFFICIENCY              # not calibrated: the stated default
    st = step()
    assert st.efficiency == pytest.approx(e(None, 4096))


def test_recompute_costs_its_forward_and_counts_in_hfu_not_mfu():
    none, full, sel, op = (step(lay(activation_recompute=r), efficiency=0.5) for r in
                           ("none", "full", "selective", "op_selective"))
    assert full.compute_s == pytest.approx(none.compute_s * 4 / 3)       # one more forward of every layer
    assert none.compute_s < sel.compute_s < op.compute_s < full.compute_s
    assert full.mfu == pytest.approx(none.mfu * 3 / 4, rel=0.02) and full.hfu > full.mfu


def test_bubble_output_layer_tp_and_pp_communication():
    one = step(lay(pp=4, microbatches=8), efficiency=0.5)
    assert one.bubble == pytest.approx(3 / 8) and one.pp_comm_s > 0
    v2 = step(lay(pp=4, microbatches=8, interleave=2), efficiency=0.5)
    assert v2.bubble == pytest.approx(3 / 16) and v2.pp_comm_s == pytest.approx(2 * one.pp_comm_s)
    assert v2.step_s < one.step_s
    tp = step(lay(tp=8), efficiency=0.5)
    base = step(efficiency=0.5)
    assert tp.tp_comm_s > 0 and tp.tp_exposed_s == tp.tp_comm_s and tp.compute_s == pytest.approx(base.compute_s / 8)
    hidden = step(lay(tp=8), efficiency=0.5, overlap=T.Overlap(tp_comm=True))
    assert hidden.tp_exposed_s < tp.tp_exposed_s and hidden.step_s < tp.step_s
    full = step(lay(tp=8, activation_recompute="full"), efficiency=0.5)
    assert full.tp_comm_s == pytest.approx(tp.tp_comm_s * 6 / 4)
    big_v = T.Model(**SHAPE, vocab=128_000)
    assert step(lay(pp=4, microbatches=8), model=big_v, efficiency=0.5).step_s > one.step_s   # the output layer


def test_data_parallel_terms_per_zero_stage():
    m = 4
    z0 = step(lay(dp=1024, microbatches=m), grad_dtype="fp32")
    assert z0.dp_exposed_s == pytest.approx(max(0.0, z0.dp_comm_s - z0.compute_s / m * 2 / 3), rel=0.02)
    z0_blocking = step(lay(dp=1024, microbatches=m), grad_dtype="fp32", overlap=T.Overlap(grad_reduce=False))
    assert z0_blocking.dp_exposed_s == pytest.approx(z0_blocking.dp_comm_s)
    z1, z2 = (step(lay(dp=1024, zero_stage=z, microbatches=m), grad_dtype="fp32") for z in (1, 2))
    rs_plus_ag = z1.dp_comm_s
    assert z2.dp_comm_s > 3 * rs_plus_ag * 0.9          # ZeRO-2: a reduce-scatter on every micro-batch
    # Megatron's --overlap-param-gather hides the weights' all-gather; DeepSpeed gathers in step()
    meg = step(lay(dp=1024, zero_stage=1, microbatches=m), grad_dtype="fp32", framework="megatron",
               overlap=T.Overlap(grad_reduce=True, param_gather=True))
    ds = step(lay(dp=1024, zero_stage=1, microbatches=m), grad_dtype="fp32", framework="deepspeed",
              overlap=T.Overlap(grad_reduce=True, param_gather=True))
    assert meg.dp_exposed_s < ds.dp_exposed_s


def test_zero3_pays_per_layer_collectives_that_grow_with_the_group():
    """175B on A100s (Narayanan et al. 2021 Table 2's ZeRO-3 rows): 384 -> 1536 GPUs at a fixed global
    batch leaves a quarter of the compute per GPU while each layer's collectives cost as much or more:
    the exposed part grows and tokens/s per GPU falls (measured 144 -> 44 TFLOP/s)."""
    a100 = T.Cluster(peak_tflops=312, gpus_per_node=8, intra_node_GBps=300, inter_node_Gbps=200, nics_per_node=8,
                     chip="A100-SXM")
    gpt3 = T.Model(params=174.6e9, layers=96, hidden=12288, seq_len=2048, vocab=51200)
    at = {dp: step(lay(dp=dp, zero_stage=3, activation_recompute="full", micro_batch_size=1536 // dp), model=gpt3,
                   cluster=a100, grad_dtype="fp32", framework="deepspeed") for dp in (384, 1536)}
    assert at[1536].dp_exposed_s > 2 * at[1536].compute_s
    assert at[1536].tokens_per_s_per_gpu < 0.5 * at[384].tokens_per_s_per_gpu
    fsdp = step(lay(dp=1536, zero_stage=3, activation_recompute="full"), model=gpt3, cluster=a100,
                grad_dtype="fp32", framework="fsdp2")
    assert fsdp.dp_exposed_s < at[1536].dp_exposed_s            # one collective per layer, not DeepSpeed's buckets


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
    assert fit and all(x["fits"] and x["memory_ratio"] <= 1.0 for x in fit)
    # fastest first, in 1 % bands; inside a band the one with more memory left first
    assert all(a["tokens_per_s_per_gpu"] >= b["tokens_per_s_per_gpu"] * (1 - advisor.TIE_BAND) for a, b in zip(fit, fit[1:]))
    assert not any(x["fits"] for x in c[r["fitting"]:])
    tied = [x for x in fit if x["tokens_per_s_per_gpu"] >= fit[0]["tokens_per_s_per_gpu"] * (1 - advisor.TIE_BAND / 2)]
    assert fit[0]["memory_ratio"] <= min(x["memory_ratio"] for x in tied) + 0.01
    # the example's own plan (ZeRO-0, 135 GiB) does not fit; it is still evaluated and said
    p = r["plan"]
    assert (p["tp"], p["zero_stage"], p["fits"], p["rank"]) == (1, 0, False, None)
    assert r["no_fit"] is None and r["efficiency_modelled"] and "for the top layout" in r["efficiency_source"]
    assert "the profile's own plan does not fit (188%" in advisor.text_report(load_profile(EXAMPLE), r, 3)


def test_the_plan_is_ranked_with_the_reason_the_best_wins():
    prof = parse_profile(example_with(training__zero_stage=1, training__tp=2, training__micro_batch_size=2,
                                      training__microbatches=1))
    r = advisor.advise(prof)
    p = r["plan"]
    assert p["fits"] and p["rank"] > 1 and p["gap_to_best"] > 0
    assert p["why_best"] and "->" in p["why_best"] and "of the step" in p["why_best"]
    assert f"rank {p['rank']:,} of {p['of']:,} fitting layouts" in advisor.text_report(prof, r, 3)


def test_framework_rules_in_the_enumeration():
    meg = parse_profile(example_with(training__framework="megatron", training__zero_stage=1, model__attention="math"))
    assert {x.activation_recompute for x in advisor.layouts(meg, 1024)} == {"none", "selective", "full"}
    flash = parse_profile(example_with(training__framework="megatron", training__zero_stage=1))
    # Megatron checkpoints core_attn whatever the backend (recompute_modules): a choice with flash attention too
    assert "selective" in {x.activation_recompute for x in advisor.layouts(flash, 1024)}
    ds = list(advisor.layouts(load_profile(EXAMPLE), 1024))
    assert not any(x.pp > 1 and x.zero_stage >= 2 for x in ds)          # DeepSpeed's pipeline engine: ZeRO-1
    assert {x.activation_recompute for x in ds} == {"none", "full"}
    fsdp = parse_profile(example_with(training__framework="fsdp2", training__zero_stage=3))
    assert "op_selective" in {x.activation_recompute for x in advisor.layouts(fsdp, 1024)}
    assert {x.micro_batch_size for x in ds} >= {1, 2, 4, 8, 16} and max(x.interleave for x in ds) > 4


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
    doc = json.loads(r.stdout.split("\nprofile:")[0])
    rows = doc["candidates"]
    assert len(rows) == 5 and doc["plan"]["tp"] == 1 and doc["plan"]["fits"] is False
    assert set(rows[0]) <= set(doc["plan"]) and "mfu_convention" in doc
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
    top = json.loads(r.stdout)["candidates"]
    assert all(c["mfu"] <= 0.42 + 1e-9 for c in top) and top[0]["mfu"] > 0.3   # at 42 % of peak
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


def test_fp8_run_speeds_the_matmuls_only_and_holds_its_weight_copies():
    """fp8 on H100 SXM: dense FP8 1,979 TFLOP/s against 989.5 bf16 (NVIDIA H100 datasheet, half of the
    3,958* sparse figure): the matmuls run up to 2x faster, attention and communication do not; Transformer
    Engine holds an fp8 copy and an fp8 transpose of each weight (2 bytes per weight held); the activations
    kept for the backward do not change (training.fp8_activation_cache is DeepSeek-V3's way to shrink them); MFU
    stays against the bf16 peak."""
    from preflight.core import hardware
    from preflight.core.profile import ProfileError

    assert hardware.peak_tflops("H100-SXM", "fp8") == 1979.0 and hardware.peak_tflops("A100-SXM", "fp8") is None
    base = load_profile(EXAMPLE)
    fp8 = parse_profile(example_with(training__fp8=True, training__zero_stage=1))
    bf16 = parse_profile(example_with(training__zero_stage=1))
    a, b = advisor.evaluate_plan(bf16), advisor.evaluate_plan(fp8)
    assert 1.0 < a["step_s"] / b["step_s"] < 2.0 and b["mfu"] > a["mfu"]
    from preflight.chapters import memory_plan as MP
    from preflight.models import memory as M

    ta, tb = (M.terms(MP.plan_of(x)).set_index("term")["bytes"] for x in (bf16, fp8))
    assert "fp8_weights" not in ta and tb["fp8_weights"] == pytest.approx(2 * 7e9, rel=0.15)
    assert tb["activations"] == ta["activations"]         # the kept inputs stay 16-bit without an fp8 cache
    assert b["memory_per_gpu_bytes"] > a["memory_per_gpu_bytes"]
    assert any("fp8" in x for x in advisor.not_modelled(fp8)) and base.training.fp8 is False
    with pytest.raises(ProfileError, match="training.fp8"):
        parse_profile(example_with(training__fp8=True, cluster__gpu="A100-SXM"))
