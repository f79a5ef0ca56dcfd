"""The single-device baseline on the CPU: real measurements, checked for internal consistency and
against the formulas they are meant to reproduce."""
from __future__ import annotations

import json
import types

import pytest
import torch

from preflight.bench import baseline as bl
from preflight.core.records import load_records, make_record, save_record
from preflight.harness import categories as cat
from preflight.harness import reference as ref

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CPU_S = {}          # CPU seconds each fixture's measurement used (test_runtimes)


def _cpu_s() -> float:
    """User + system CPU seconds of this process and its reaped children (DataLoader workers)."""
    import resource

    return sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for f in ("ru_utime", "ru_stime"))


def _measured(name, **kw):
    c0 = _cpu_s()
    r = bl.measure_baseline("cpu", **kw)
    CPU_S[name] = _cpu_s() - c0
    return r


@pytest.fixture(scope="module")
def quick():
    return _measured("quick", quick=True)


@pytest.fixture(scope="module")
def full():
    return _measured("full")


# ---------------------------------------------------------------------------- categorize (pure)
@pytest.mark.parametrize("name, category", [
    ("aten::mm", "matmul"), ("aten::addmm", "matmul"), ("aten::bmm", "matmul"), ("aten::linear", "matmul"),
    ("aten::matmul", "matmul"), ("aten::baddbmm", "matmul"), ("AddmmBackward0", "matmul"),
    ("autograd::engine::evaluate_function: MmBackward0", "matmul"), ("aten::_scaled_mm", "matmul"),
    ("aten::scaled_dot_product_attention", "attention"),
    ("aten::_scaled_dot_product_flash_attention", "attention"),
    ("aten::_scaled_dot_product_efficient_attention_backward", "attention"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
    ("aten::_flash_attention_forward", "attention"), ("aten::_efficient_attention_backward", "attention"),
    ("ScaledDotProductFlashAttentionForCpuBackward0", "attention"),
    ("aten::layer_norm", "memory_bound"), ("aten::native_layer_norm", "memory_bound"),
    ("aten::native_layer_norm_backward", "memory_bound"), ("NativeLayerNormBackward0", "memory_bound"),
    ("aten::gelu", "memory_bound"), ("aten::gelu_backward", "memory_bound"), ("aten::add", "memory_bound"),
    ("aten::add_", "memory_bound"), ("aten::mul", "memory_bound"), ("aten::_softmax", "memory_bound"),
    ("aten::_log_softmax", "memory_bound"), ("aten::_log_softmax_backward_data", "memory_bound"),
    ("aten::nll_loss_forward", "memory_bound"), ("aten::nll_loss_backward", "memory_bound"),
    ("aten::cross_entropy_loss", "memory_bound"), ("aten::native_dropout", "memory_bound"),
    ("aten::embedding", "memory_bound"), ("aten::embedding_dense_backward", "memory_bound"),
    ("aten::copy_", "memory_bound"), ("aten::_to_copy", "memory_bound"), ("aten::fill_", "memory_bound"),
    ("aten::_fused_rms_norm", "memory_bound"), ("GeluBackward0", "memory_bound"),
    ("nccl:all_reduce", "communication"), ("c10d::allreduce_", "communication"),
    ("gloo:all_reduce", "communication"), ("record_param_comms", "communication"),
    ("c10d::_allgather_base_", "communication"), ("nccl:reduce_scatter", "communication"),
    ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "data"),
    ("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", "data"), ("data_wait", "data"),
    ("aten::_pin_memory", "data"),
    ("Optimizer.step#AdamW.step", "optimizer"), ("Optimizer.zero_grad#AdamW.zero_grad", "optimizer"),
    ("aten::_foreach_mul_", "optimizer"), ("aten::_foreach_addcdiv_", "optimizer"),
    ("aten::_fused_adamw_", "optimizer"),
    ("aten::view", "other"), ("aten::t", "other"), ("aten::transpose", "other"), ("aten::empty", "other"),
    ("aten::as_strided", "other"), ("aten::broadcast_tensors", "other"), ("forward", "other"),
    ("cudaLaunchKernel", "other"), ("ProfilerStep#3", "other"),
])
def test_categorize(name, category):
    assert cat.categorize(name) == category
    assert category in cat.CATEGORIES


def _evt(name, parent=None):
    return types.SimpleNamespace(name=name, cpu_parent=parent)


def test_event_category_uses_the_call_stack():
    step = _evt("Optimizer.step#AdamW.step", _evt("forward"))
    assert cat.event_category(_evt("aten::mul_", step)) == "optimizer"        # AdamW's mul_, not the model's
    assert cat.event_category(_evt("aten::mul_", _evt("forward"))) == "memory_bound"
    assert cat.event_category(_evt("aten::t", _evt("aten::linear", _evt("forward")))) == "matmul"
    data = _evt("data_wait")
    assert cat.event_category(_evt("aten::copy_", _evt("aten::to", data))) == "data"
    sdpa = _evt("aten::scaled_dot_product_attention")
    assert cat.event_category(_evt("aten::bmm", _evt("aten::_scaled_dot_product_attention_math", sdpa))) \
        == "attention"                                                        # math path stays attention
    assert cat.event_category(_evt("aten::empty")) == "other"


def test_op_table_on_gpu_uses_kernel_time_once():
    """The GPU branch, with stand-in profiler events: kernel time is read from each op's *self*
    device time (never from both a parent and its child), and kernels no op claims are 'other'."""
    from torch.autograd import DeviceType

    def ev(name, parent=None, self_dev=0.0, dev_type=DeviceType.CPU, elapsed=0.0, annotation=False):
        return types.SimpleNamespace(name=name, cpu_parent=parent, device_type=dev_type,
                                     self_device_time_total=self_dev, self_cpu_time_total=999.0,
                                     is_user_annotation=annotation, is_async=False,
                                     time_range=types.SimpleNamespace(elapsed_us=lambda: elapsed))

    fwd = ev("forward")
    linear = ev("aten::linear", fwd)                      # its kernels belong to its child addmm
    events = [fwd, linear, ev("aten::addmm", linear, self_dev=600.0),
              ev("aten::gelu", fwd, self_dev=300.0),
              ev("aten::_foreach_mul_", ev("Optimizer.step#AdamW.step"), self_dev=100.0),
              ev("sm90_gemm_kernel", dev_type=DeviceType.CUDA, elapsed=600.0),
              ev("vectorized_elementwise_kernel", dev_type=DeviceType.CUDA, elapsed=300.0),
              ev("multi_tensor_apply_kernel", dev_type=DeviceType.CUDA, elapsed=100.0),
              ev("ncclDevKernel_AllReduce", dev_type=DeviceType.CUDA, elapsed=200.0),   # no CPU op
              # record_function("forward")'s device-side range spans the kernels: not one itself
              ev("forward", dev_type=DeviceType.CUDA, elapsed=1150.0, annotation=True)]
    ops = cat.op_table(types.SimpleNamespace(events=lambda: events), "cuda")
    cats = cat.category_table(ops).set_index("category")
    assert ops["time_s"].sum() == pytest.approx(1200e-6)                  # each kernel once
    assert cats.loc["matmul", "time_s"] == pytest.approx(600e-6)
    assert cats.loc["memory_bound", "share"] == pytest.approx(0.25)
    assert cats.loc["optimizer", "time_s"] == pytest.approx(100e-6)
    assert cats.loc["other", "time_s"] == pytest.approx(200e-6)           # the unclaimed kernel


# ------------------------------------------------------------------------------------- loader
def test_loader_gives_next_token_targets():
    cfg = ref.CPU_TINY
    x, y = next(iter(bl.make_loader(cfg, "cpu")))
    assert x.shape == y.shape == (cfg.batch, cfg.seq_len)
    assert torch.equal(x[:, 1:], y[:, :-1]) and int(x.max()) < cfg.vocab
    assert torch.equal(ref.SyntheticTokens(cfg)[5][0], ref.SyntheticTokens(cfg)[5][0])   # deterministic


# ------------------------------------------------------------------------------------- FLOPs
def _expected_ratio(cfg: ref.RefConfig) -> float:
    """What FlopCounterMode must give relative to 6N + 12 L h s, derived term by term.

    Counter: 6 FLOPs per token per *matmul weight* (bias adds, LayerNorm and embeddings are not
    matmuls), and for attention torch's fused-kernel convention: forward 4 s h per token per
    layer (QK^T, AV), backward 10 s h (it recomputes QK^T before dP, dV, dQ, dK): 14 L h s in all.
    Formula: N counts biases and LayerNorm weights too, attention 12 L h s (backward = 2x forward).
    """
    with torch.device("meta"):                     # shapes only: the GPU model is 0.5 B params
        m = ref.RefModel(cfg)
    weights = sum(mod.weight.numel() for mod in m.modules() if isinstance(mod, torch.nn.Linear))
    n = ref.count_params(m, exclude_embeddings=True)
    lhs = cfg.layers * cfg.hidden * cfg.seq_len
    return (6 * weights + 14 * lhs) / (6 * n + 12 * lhs)


@pytest.mark.parametrize("cfg", [ref.CPU_TINY, ref.CPU_CONFIG], ids=["tiny", "cpu"])
def test_flop_counter_matches_formula(cfg):
    model = ref.make_model(cfg)
    x, y = ref.synthetic_batch(cfg)
    f = bl.count_flops(model, cfg, x, y, "cpu")
    # The brief's tolerance, and the real figure: the two differ only by the terms above.
    assert 0.75 < f["ratio_counted_to_formula"] < 1.25
    assert f["ratio_counted_to_formula"] == pytest.approx(_expected_ratio(cfg), rel=1e-9)
    assert any("attention_for_cpu" in k for k in f["counted_by_op"])      # CPU attention counted


# ---------------------------------------------------------------------------- the measurement
def test_result_is_plain_json(quick):
    assert json.loads(json.dumps(quick)) == quick                     # no default=str needed
    for key in ("throughput", "composition", "categories", "memory_bound_share", "flops", "mfu",
                "memory", "nvml", "profile", "top_ops"):
        assert key in quick


@pytest.mark.parametrize("which", ["quick", "full"])
def test_throughput_and_shares(which, request):
    r = request.getfixturevalue(which)
    cfg = ref.RefConfig(**r["config"])
    tp = r["throughput"]
    assert tp["step_time_s"] > 0 and tp["step_time_p10_s"] <= tp["step_time_s"] <= tp["step_time_p90_s"]
    assert tp["samples_per_s"] == pytest.approx(cfg.batch / tp["step_time_s"])
    assert tp["tokens_per_s"] == pytest.approx(tp["samples_per_s"] * cfg.seq_len)
    comp = bl.composition_frame(r)
    assert set(comp["phase"]) >= {"data_wait", "forward", "backward", "optimizer", "other"}
    assert comp["share"].sum() == pytest.approx(1.0)
    assert float(comp.set_index("phase").loc["data_wait", "seconds"]) > 0     # a real loader
    cats = bl.categories_frame(r).set_index("category")
    assert list(cats.index) == list(cat.CATEGORIES)
    assert cats["share"].sum() == pytest.approx(1.0)
    for c in ("matmul", "attention", "memory_bound", "optimizer", "data"):
        assert cats.loc[c, "time_s"] > 0, c
    assert cats.loc["communication", "time_s"] == 0                          # one device, no comms
    assert r["memory_bound_share"] == pytest.approx(cats.loc["memory_bound", "share"])
    assert 0 < r["profile"]["coverage"] <= 1.0001
    assert not bl.ops_frame(r).empty


def test_mfu_on_cpu(full):
    m = full["mfu"]
    assert m["datasheet_peak_tflops"] is None and m["mfu_datasheet"] is None
    assert "unknown peak" in m["peak_note"]
    achieved = full["flops"]["formula_per_step"] / full["throughput"]["step_time_s"]
    assert m["achieved_tflops"] == pytest.approx(achieved / 1e12)
    assert m["mfu_measured_ceiling"] == pytest.approx(m["achieved_tflops"] / m["measured_ceiling_tflops"])
    # A small model cannot beat a big matmul; the slack is for a machine shared with other work
    # (model and ceiling are timed seconds apart and a 2-core box under load jumps several-fold).
    assert 0 < m["mfu_measured_ceiling"] < 3


def test_memory_on_cpu_is_a_labelled_estimate(quick):
    mem = quick["memory"]
    assert mem["is_lower_bound"] and "estimate" in mem["method"] and "saved_tensors_hooks" in mem["method"]
    tb = mem["tensor_bytes"]
    assert tb["parameters"] == 4 * quick["params"] == tb["gradients"]
    assert 2 * tb["parameters"] <= tb["optimizer_state"] <= 2 * tb["parameters"] + 4096  # exp_avg(_sq) + steps
    cfg = ref.RefConfig(**quick["config"])
    assert tb["saved_activations"] > 4 * cfg.batch * cfg.seq_len * cfg.hidden * cfg.layers
    assert mem["peak_GB"] == pytest.approx(sum(tb.values()) / 1e9)
    assert mem["reserved_peak_GB"] is None


def test_nvml_absent_on_cpu(quick):
    assert quick["nvml"]["available"] is False and quick["nvml"]["gpu_util_pct_median"] is None


def test_runtimes(quick, full):
    # The brief asks for < ~5 s (quick) and < 40 s (full) on 2 cores. Wall time is no guard on a shared
    # machine: with 2 CPU hogs on the cores quick took 24-30 s and full 160 s. The work done is: CPU
    # seconds (this process and its loader workers), which a second job on the cores barely changes
    # (quick: 3.1 s, 3.9 s with the hogs). The bounds are the brief's wall-clock budgets x 2 cores.
    assert 0 < quick["elapsed_s"] and 0 < full["elapsed_s"]
    assert CPU_S["quick"] < 10 and CPU_S["full"] < 80, CPU_S


def test_record_round_trip_and_cli(tmp_path, monkeypatch, quick, capsys):
    path = save_record(make_record("baseline", 1, {"quick": True}, quick), tmp_path / "a")
    [rec] = load_records(tmp_path / "a", "baseline")
    assert rec["results"] == quick and path.name == "baseline.json"
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("SLURM_PROCID", raising=False)
    assert bl.main(["--out", str(tmp_path / "b"), "--quick", "--device", "cpu"]) == 0
    rec = json.loads((tmp_path / "b" / "baseline.json").read_text())
    assert rec["method"] == "baseline" and rec["method_version"] == 1
    assert rec["results"]["throughput"]["samples_per_s"] > 0
    assert "samples/s" in capsys.readouterr().out


@pytest.mark.gpu
@gpu
def test_gpu_baseline_quick():
    r = bl.measure_baseline("cuda:0", quick=True)
    mem = r["memory"]
    assert "max_memory_allocated" in mem["method"] and not mem["is_lower_bound"]
    assert mem["peak_GB"] >= mem["tensor_bytes"]["parameters"] / 1e9
    assert r["mfu"]["peak_dtype"] == r["config"]["dtype"] or r["config"]["dtype"] == "fp32"
    assert 0.75 < r["flops"]["ratio_counted_to_formula"] < 1.25
    assert r["mfu"]["mfu_measured_ceiling"] > 0
    if not r["profile"]["available"]:          # CUPTI refused (a sandboxed GPU): the rest above holds
        pytest.skip(f"no op categories here: {r['profile']['reason']}")
    assert r["categories"] is not None and r["profile"]["coverage"] <= 1.0001
    cats = {c["category"]: c for c in r["categories"]}
    assert cats["matmul"]["time_s"] > 0
    assert 0.75 < r["flops"]["ratio_counted_to_formula"] < 1.25
    assert r["mfu"]["mfu_measured_ceiling"] > 0


def test_profiler_log_filtered_drops_kineto_lines_only(capfd):
    import os

    with cat.profiler_log_filtered():
        os.write(2, b"USDT:2026-11-30 00:49:06 16217:16217 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        os.write(2, b"a real warning\n")
    err = capfd.readouterr().err
    assert "a real warning" in err and "profiler_start" not in err
