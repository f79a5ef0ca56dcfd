"""The planner as practitioners run it today (preflight.models.activations, .states): flash vs math
attention, SwiGLU, grouped-query attention, dropout, and the deepspeed / megatron / fsdp2 layouts of
the model states with their gathered layers and HSDP."""
import pytest

from preflight.models import activations as A
from preflight.models import memory as M
from preflight.models import memory_fit as MF
from preflight.models import states as S

GiB = 2 ** 30
SEVEN_B = dict(params=7e9, layers=32, hidden=4096, heads=32, vocab=32000, seq_len=4096)
S_, B_, H_, A_ = 4096, 1, 4096, 32
SBH = S_ * B_ * H_


def by_term(plan):
    return M.terms(plan).set_index("term")["bytes"]


# --- activations -------------------------------------------------------------------------------------

def test_flash_keeps_34_sbh_plus_softmax_statistics_and_no_s2():
    flash = M.layer_activation_bytes(S_, B_, H_, A_)                           # the default: flash
    assert flash == 34 * SBH + 4 * A_ * S_ * B_
    math_ = M.layer_activation_bytes(S_, B_, H_, A_, attention="math")
    assert math_ - flash == 5 * A_ * S_ ** 2 * B_ - 4 * A_ * S_ * B_        # the s^2 terms, less the statistics
    # flash + selective: the statistics go too, which is Korthikanti's selective 34 sbh
    assert M.layer_activation_bytes(S_, B_, H_, A_, recompute="selective") == 34 * SBH
    assert M.layer_activation_bytes(S_, B_, H_, A_, attention="math", recompute="selective") == 34 * SBH


def test_example_7b_activations_flash_vs_math():
    flash, math_ = (by_term(M.Plan(**SEVEN_B, attention=a)) for a in ("flash", "math"))
    act = {k: (t["activations"] + t["activations_output"]) / GiB for k, t in (("flash", flash), ("math", math_))}
    assert act["math"] == pytest.approx(97.57, abs=0.01)                    # the 97.6 GiB
    assert 17 < act["flash"] < 18                                           # "about 17-20 GiB"


def test_tensor_and_sequence_parallel_split_of_the_flash_layer():
    f = M.layer_activation_bytes
    assert f(S_, B_, H_, A_, tp=8) == pytest.approx(10 * SBH + (24 * SBH + 4 * A_ * S_ * B_) / 8)
    assert f(S_, B_, H_, A_, tp=8, sequence_parallel=True) == pytest.approx((34 * SBH + 4 * A_ * S_ * B_) / 8)
    assert f(S_, B_, H_, A_, tp=8, sequence_parallel=True, recompute="full") == 2 * SBH / 8


def test_swiglu_gqa_and_no_dropout_term_by_term():
    """Llama-2-70B-like layer: SwiGLU ffn 28672, 8 KV heads of 64, no dropout, bf16."""
    s, b, h, a, kv, f = 4096, 1, 8192, 64, 8, 28672
    sbh, r = s * b * h, kv / a
    flash = M.layer_activation_bytes(s, b, h, a, attention="flash", mlp="swiglu", ffn_hidden=f, kv_heads=kv,
                                     dropout=0.0)
    norms_inputs, qkv, out, stats, mlp = 8 * sbh, 2 * sbh * (1 + 2 * r), 2 * sbh, 4 * a * s * b, 4 * 2 * s * b * f
    assert flash == pytest.approx(norms_inputs + qkv + out + stats + mlp, rel=1e-12)
    # the math path expands K and V to all heads before q k^T: GQA saves no activations there
    math_ = M.layer_activation_bytes(s, b, h, a, attention="math", mlp="swiglu", ffn_hidden=f, kv_heads=kv,
                                     dropout=0.0)
    assert math_ == pytest.approx(norms_inputs + 6 * sbh + out + 2 * a * s * s * b + mlp, rel=1e-12)
    # dropout adds 1-byte masks: 2 sbh per layer on flash; on math also a s^2 b mask + dropped probabilities
    with_d = M.layer_activation_bytes(s, b, h, a, mlp="swiglu", ffn_hidden=f, kv_heads=kv, dropout=0.1)
    assert with_d - flash == 2 * sbh


def test_parts_and_formula_text():
    parts = A.layer_parts(S_, B_, H_, A_, A_, 4 * H_, attention="math")
    assert A.layer_bytes(parts) == 34 * SBH + 5 * A_ * S_ ** 2 * B_
    assert sum(b for _, b, split in parts if split == "sp") == 10 * SBH          # Korthikanti's replicated 10
    assert "4 a s b" in A.formula("flash", "gelu", 0.1, "none")
    assert "a s^2 b" in A.formula("math", "gelu", 0.1, "none") and "a s^2" not in A.formula("math", "gelu", 0.1,
                                                                                         "selective")
    plan = M.Plan(**SEVEN_B)
    assert "flash attention" in M.terms(plan).set_index("term").loc["activations", "formula"]


def test_no_dropout_no_embedding_mask():
    out = by_term(M.Plan(**SEVEN_B, dropout=0.0))["activations_output"]
    assert out == 4 * SBH + 4 * S_ * B_ * 32000                         # norm + head inputs, fp32 logits


# --- parameter count ---------------------------------------------------------------------------------

def test_parameter_count_from_the_shape():
    assert S.layer_params(4096, 32) == 12 * 4096 ** 2                       # GPT: 4 h^2 + 8 h^2
    # Llama-2-7B: 6.738e9, Llama-2-70B (GQA 8 of 64, SwiGLU 28672): 68.98e9 (their model cards)
    assert S.model_params(32, 4096, 32, 32000, ffn_hidden=11008, mlp="swiglu") == pytest.approx(6.738e9, rel=1e-3)
    assert S.model_params(80, 8192, 64, 32000, kv_heads=8, ffn_hidden=28672, mlp="swiglu") == pytest.approx(
        68.98e9, rel=1e-3)
    assert S.layer_params(8192, 64, 8, 28672, "swiglu") == 2 * 8192 ** 2 + 2 * 8192 * 1024 + 3 * 8192 * 28672


# --- framework layouts ---------------------------------------------------------------------------------

def states(plan):
    t = by_term(plan)
    return t["weights"], t["gradients"], t["optimizer"]


def test_megatron_18_bytes_and_distributed_optimizer_6_plus_12_over_d():
    base = dict(**SEVEN_B, dp=64, framework="megatron")
    assert sum(states(M.Plan(**base))) == pytest.approx(18 * 7e9)
    w, g, o = states(M.Plan(**base, zero_stage=1))
    assert (w + g, o) == pytest.approx((6 * 7e9, 12 * 7e9 / 64))
    with pytest.raises(ValueError, match="not available with framework='megatron'"):
        M.Plan(**base, zero_stage=2)


def test_fsdp2_shards_16_bytes_and_gathers_two_layers():
    plan = M.Plan(**SEVEN_B, dp=64, zero_stage=3, framework="fsdp2")
    assert states(plan) == pytest.approx((4 * 7e9 / 64, 4 * 7e9 / 64, 8 * 7e9 / 64))
    gathered = by_term(plan)["gathered_params"]
    assert gathered == 2 * 2 * 12 * 4096 ** 2                               # 2 layers x bf16 x 12 h^2
    assert by_term(M.Plan(**SEVEN_B, dp=64, tp=2, zero_stage=3, framework="fsdp2"))["gathered_params"] == gathered / 2
    with pytest.raises(ValueError, match="fsdp2 shards"):
        M.Plan(**SEVEN_B, dp=64, framework="fsdp2")
    # deepspeed ZeRO-3 gathers its 16-bit layers the same way; nothing to gather on one rank
    assert "gathered_params" in by_term(M.Plan(**SEVEN_B, dp=64, zero_stage=3))
    assert "gathered_params" not in by_term(M.Plan(**SEVEN_B, dp=1, zero_stage=3))


def test_hsdp_shards_inside_the_node():
    hsdp = M.Plan(**SEVEN_B, dp=1024, zero_stage=3, framework="fsdp2", shard_group_gpus=8)
    assert hsdp.shard == 8 and states(hsdp)[2] == pytest.approx(8 * 7e9 / 8)
    assert M.Plan(**SEVEN_B, dp=512, tp=2, zero_stage=3, framework="fsdp2", shard_group_gpus=8).shard == 4


def test_zero_paper_example_unchanged_under_deepspeed():
    for stage, gb in ((0, 120.0), (1, 31.40625), (2, 16.640625), (3, 1.875)):
        plan = M.Plan(params=7.5e9, layers=32, hidden=4096, heads=32, vocab=50000, seq_len=2048, dp=64,
                      zero_stage=stage, framework="deepspeed")
        assert sum(states(plan)) / 1e9 == pytest.approx(gb, rel=1e-12)


def test_cheapest_fit_follows_the_framework_and_attention():
    flash = MF.cheapest_fit(M.Plan(**SEVEN_B, dp=1024), 80, gpus_per_node=8, gpus=1024)
    assert "selective recompute" not in list(flash.change)                  # nothing left to drop with flash
    assert flash[flash.fits].iloc[0].change == "ZeRO-1"
    mega = MF.cheapest_fit(M.Plan(**SEVEN_B, dp=1024, framework="megatron"), 80, gpus_per_node=8, gpus=1024)
    assert "distributed optimizer (ZeRO-1)" in list(mega.change) and "ZeRO-2" not in list(mega.change)
    gqa = MF.cheapest_fit(M.Plan(**SEVEN_B, dp=1024, kv_heads=4), 80, gpus_per_node=8, gpus=1024)
    assert "tp=4" in list(gqa.change) and "tp=8" not in list(gqa.change)   # tp must divide kv_heads


@pytest.mark.parametrize("change, word", [
    (dict(attention="sdpa"), "attention"), (dict(mlp="relu"), "mlp"), (dict(kv_heads=5), "kv_heads must divide"),
    (dict(kv_heads=4, tp=8), "tp must divide"), (dict(dropout=1.0), "dropout"), (dict(dropout=-0.1), "dropout"),
    (dict(ffn_hidden=0), "ffn_hidden"), (dict(framework="jax"), "framework"), (dict(shard_group_gpus=0), "shard")])
def test_bad_new_fields_rejected_naming_the_field(change, word):
    with pytest.raises(ValueError, match=word):
        M.Plan(**{**SEVEN_B, **change})
