"""Mixture-of-experts: active parameters against the published counts, expert parallelism's placement
and all-to-alls, and a published MoE layout through the memory planner and the advisor."""
import pytest

from preflight.models import moe as E

DEEPSEEK_V3 = E.Experts(experts=256, top_k=8, expert_ffn=2048, moe_layers=58, shared=1)
MIXTRAL = E.Experts(experts=8, top_k=2, expert_ffn=14336, moe_layers=32)


def test_active_parameters_reproduce_the_published_counts():
    # DeepSeek-V3 technical report (arXiv 2412.19437) sec. 4.2: 671B total, 37B activated per token
    assert E.active_params(671e9, 7168, DEEPSEEK_V3) == pytest.approx(37e9, rel=0.02)
    # Mixtral 8x7B (Mistral AI, arXiv 2401.04088): 46.7B total, 12.9B active
    assert E.active_params(46.7e9, 4096, MIXTRAL) == pytest.approx(12.9e9, rel=0.01)
    assert E.active_params(7e9, 4096, None) == 7e9


def test_expert_parallelism_spreads_the_experts_not_the_dense_part():
    dense, routed = E.params_per_gpu(671e9, 7168, DEEPSEEK_V3, tp=1, pp=16, ep=64)
    assert routed == pytest.approx(DEEPSEEK_V3.routed_params(7168) / (16 * 64))
    assert dense == pytest.approx((671e9 - DEEPSEEK_V3.routed_params(7168)) / 16)
    assert dense + routed < 671e9 / 16 / 8                  # EP 64 leaves each GPU a fraction of a stage


def test_all_to_all_bytes_and_time():
    # 4096 tokens x 7168 x top-8 x 2 B, 63/64 of it leaves the GPU
    b = E.all_to_all_bytes(4096, 7168, 8, 64)
    assert b == pytest.approx(4096 * 7168 * 8 * 2 * 63 / 64)
    assert E.all_to_all_s(4096, 7168, 8, 1, 50, 1e-5) == 0.0
    assert E.all_to_all_s(4096, 7168, 8, 64, 50, 1e-5) == pytest.approx(b / 50e9 + 63e-5)


def test_the_busiest_expert_waits_above_the_mean():
    assert E.busiest_expert_load(4096, 256, 8) > 1.2                 # 128 tokens per expert on average
    assert E.busiest_expert_load(4096 * 64, 256, 8) < E.busiest_expert_load(4096, 256, 8)
