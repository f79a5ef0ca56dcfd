"""Fusion with torch.compile on the memory-bound block: real eager and compiled runs on the CPU, the
compiled kernels found and counted in a real profile, and the 'not available' path."""
from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from preflight.bench import fusion
from preflight.core.records import load_records


# ---------------------------------------------------------------------------- op_category (pure)
@pytest.mark.parametrize("name, category", [
    ("triton_poi_fused_add_gelu_0", "memory_bound"),
    ("triton_red_fused_add_native_layer_norm_1", "memory_bound"),
    ("triton_per_fused_native_layer_norm_backward_2", "memory_bound"),
    ("triton_poi_fused_addmm_gelu_0", "memory_bound"),         # epilogue of a library matmul
    ("triton_tem_fused_mm_0", "matmul"),                       # a Triton matmul template
    ("triton_tem_fused_addmm_gelu_1", "matmul"),
    ("cpp_fused_add_gelu_native_layer_norm_0", "memory_bound"),
    ("## Call CompiledFxGraph fabcd1234 ##", "memory_bound"),  # CPU: C++ kernels run inline in it
    ("Torch-Compiled Region: 0/0", "other"),
    ("CompiledFunction", "other"),
    ("CompiledFunctionBackward", "other"),
    ("TorchDynamo Cache Lookup", "other"),
    ("aten::mm", "matmul"),
    ("aten::gelu", "memory_bound"),
    ("aten::native_layer_norm_backward", "memory_bound"),
])
def test_op_category(name, category):
    assert fusion.op_category(name) == category


def test_op_category_keeps_phases_the_name_tells():
    # a compiled optimizer kernel stays optimizer time; a compiled all-reduce stays communication
    assert fusion.op_category("triton_poi_fused__foreach_addcdiv_0", base="optimizer") == "optimizer"
    assert fusion.op_category("triton_poi_fused_all_reduce_0", base="communication") == "communication"


def test_block_is_linear_gelu_residual_layernorm():
    cfg = fusion.CPU_QUICK
    stack = fusion.make_stack(cfg, "cpu")
    assert len(stack) == cfg.layers
    blk = stack[0]
    x = torch.randn(4, cfg.hidden)
    expect = torch.nn.functional.layer_norm(x + torch.nn.functional.gelu(blk.fc(x)), (cfg.hidden,),
                                            blk.norm.weight, blk.norm.bias)
    torch.testing.assert_close(blk(x), expect)


# ---------------------------------------------------------------------------- live (CPU)
@pytest.fixture(scope="module")
def record(tmp_path_factory):
    """One quick measurement through the CLI entry point (compiles once: ~3 s warm, ~15 s cold)."""
    out = tmp_path_factory.mktemp("fusion")
    assert fusion.main(["--out", str(out), "--quick"]) == 0
    recs = load_records(out, "fusion")
    assert len(recs) == 1
    return recs[0]


@pytest.mark.slow
def test_record_and_speedup(record):
    assert record["method"] == "fusion" and record["method_version"] == 1
    r = record["results"]
    json.dumps(r, allow_nan=False)     # strict JSON: no NaN or inf in a record
    if shutil.which("g++") or shutil.which("clang++"):
        assert r["available"], r["reason"]
    if not r["available"]:
        pytest.skip(f"torch.compile not available here: {r['reason']}")
    for key in ("eager_fwd_bwd_s", "eager_fwd_s", "compiled_fwd_bwd_s", "compiled_fwd_s"):
        assert 0 < r[key] < 5, key
    for key in ("speedup_fwd_bwd", "speedup_fwd"):
        assert math.isfinite(r[key]) and r[key] > 0, key
    assert r["speedup_fwd_bwd"] == pytest.approx(r["eager_fwd_bwd_s"] / r["compiled_fwd_bwd_s"])
    assert r["compile_s"]["fwd_bwd"] > 0


@pytest.mark.slow
def test_memory_bound_share_from_real_profiles(record):
    r = record["results"]
    if not r["available"]:
        pytest.skip(r["reason"])
    eager, compiled = r["categories"]["eager"], r["categories"]["compiled"]
    # eager: matmuls and the separate GELU / add / LayerNorm kernels, forward and backward
    assert eager["matmul"] > 0 and eager["memory_bound"] > 0
    assert 0 < r["memory_bound_share_eager"] < 1
    assert r["memory_bound_share_eager"] == pytest.approx(eager["memory_bound"] / sum(eager.values()))
    # compiled: the fused kernels were seen in the profile and counted as memory-bound
    fused = [o for o in r["top_ops"]["compiled"]
             if o["op"].startswith(("## Call CompiledFxGraph", "cpp_fused", "triton_"))]
    assert fused and all(o["category"] == "memory_bound" for o in fused)
    assert not any(o["op"] in ("aten::gelu", "aten::native_layer_norm") for o in r["top_ops"]["compiled"])
    assert compiled["matmul"] > 0 and compiled["memory_bound"] > 0
    assert 0 < r["memory_bound_share_compiled"] < 1
    frame = fusion.categories_frame(r)
    assert set(frame["version"]) == {"eager", "compiled"}
    assert frame.groupby("version")["share"].sum().tolist() == pytest.approx([1.0, 1.0])


def test_compile_failure_is_reported_not_raised(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no backend here\nsecond line")

    monkeypatch.setattr(torch, "compile", broken)
    r = fusion.measure_fusion("cpu", quick=True)
    assert r["available"] is False
    assert "torch.compile failed" in r["reason"] and "no backend here" in r["reason"]
    assert r["eager_fwd_bwd_s"] > 0 and r["memory_bound_share_eager"] > 0
    assert r["compiled_fwd_bwd_s"] is None and r["speedup_fwd_bwd"] is None


def test_missing_compiler_is_reported(monkeypatch):
    monkeypatch.setattr(fusion.shutil, "which", lambda name: None)
    monkeypatch.delenv("CXX", raising=False)
    assert "compiler" in fusion.compile_unavailable_reason("cpu")
    r = fusion.measure_fusion("cpu", quick=True)
    assert r["available"] is False and "compiler" in r["reason"]
