"""Per-GPU memory planner (preflight.models.memory): ZeRO's model states, Korthikanti's activations
(attention="math", the paper's layer), monotonicity over a grid of plans, the cheapest change that
makes a plan fit (models.memory_fit), input checks. Flash attention, SwiGLU, GQA, dropout and the
framework layouts: tests/test_memory_layouts.py."""
import itertools

import pytest

from preflight.models import memory as M
from preflight.models import memory_fit as MF

GPT3 = dict(seq_len=2048, micro_batch_size=1, hidden=12288, heads=96, attention="math")   # Korthikanti Table 3
SBH = 2048 * 1 * 12288
SEVEN_B = dict(params=7e9, layers=32, hidden=4096, heads=32, vocab=32000, seq_len=4096, attention="math")


def model_states(plan):
    t = M.terms(plan).set_index("term")["bytes"]
    return t["weights"] + t["gradients"] + t["optimizer"]


# --- model states: Rajbhandari et al. 2020 ---------------------------------------------------------

def test_sixteen_bytes_per_parameter_without_zero():
    plan = M.Plan(**SEVEN_B)
    assert model_states(plan) == pytest.approx(16 * 7e9, rel=1e-12)      # 112 GB > 80 GB
    assert M.terms(plan).attrs["stage"] == "only"
    fp32 = M.Plan(**SEVEN_B, precision="fp32")
    assert model_states(fp32) == pytest.approx(16 * 7e9, rel=1e-12)      # 4 + 4 + 8: also 16
    t = M.terms(plan).set_index("term")["bytes"]
    assert (t["weights"], t["gradients"], t["optimizer"]) == pytest.approx((2 * 7e9, 2 * 7e9, 12 * 7e9))


def test_parameters_split_over_tp_and_pp_with_embedding_on_its_stage():
    vh = 32000 * 4096
    for tied, tp, pp in itertools.product([False, True], [1, 2, 8], [1, 2, 4]):
        plan = M.Plan(**SEVEN_B, tp=tp, pp=pp, microbatches=8, tied_embeddings=tied)
        body = 7e9 - vh * (1 if tied else 2)
        extra = 2 if (pp == 1 and not tied) else 1                        # head with the embedding
        assert model_states(plan) == pytest.approx(16 * (body / (pp * tp) + extra * vh / tp), rel=1e-12)


@pytest.mark.parametrize("stage, exact, paper", [(0, 120.0, 120), (1, 31.40625, 31.4),
                                                  (2, 16.640625, 16.6), (3, 1.875, 1.9)])
def test_zero_paper_worked_example(stage, exact, paper):
    # Figure 1: psi = 7.5B, Nd = 64, K = 12: 16 psi, 4 psi + 12 psi/Nd, 2 psi + 14 psi/Nd, 16 psi/Nd.
    plan = M.Plan(params=7.5e9, layers=32, hidden=4096, heads=32, vocab=50000, seq_len=2048, dp=64,
                  zero_stage=stage)
    gb = model_states(plan) / 1e9
    assert gb == pytest.approx(exact, rel=1e-12)
    assert gb == pytest.approx(paper, rel=0.01 if stage < 3 else 0.014)   # paper rounds 1.875 to 1.9
    assert abs(gb - paper) < 0.05


# --- activations: Korthikanti et al. 2022 ------------------------------------------------------------

def test_per_layer_activations_are_table_2_for_gpt3():
    f = M.layer_activation_bytes
    a_s_h = 96 * 2048 / 12288                                             # 5as/h = 80
    table = {(1, False, "none"): 34 + 5 * a_s_h,
             (8, False, "none"): 10 + 24 / 8 + 5 * a_s_h / 8,
             (8, True, "none"): 34 / 8 + 5 * a_s_h / 8,
             (8, False, "selective"): 10 + 24 / 8,
             (8, True, "selective"): 34 / 8,
             (8, False, "full"): 2,
             (8, True, "full"): 2 / 8}
    for (t, sp, rc), coef in table.items():
        assert f(**GPT3, tp=t, sequence_parallel=sp, recompute=rc) == pytest.approx(SBH * coef, rel=1e-12)
    assert table[(1, False, "none")] == 114 and table[(8, True, "selective")] == 4.25
    none = f(**GPT3)
    assert 1 - f(**GPT3, recompute="selective") / none == pytest.approx(80 / 114)   # "70 %" saved
    # The abstract's "5x": tensor parallel baseline (23 sbh) over sequence parallel + selective (4.25)
    ratio = f(**GPT3, tp=8) / f(**GPT3, tp=8, sequence_parallel=True, recompute="selective")
    assert ratio == pytest.approx(23 / 4.25) and 5 < ratio < 5.5
    assert none / f(**GPT3, tp=8, sequence_parallel=True, recompute="selective") == pytest.approx(114 / 4.25)


def test_fp32_activations_double_the_tensors_not_the_masks():
    mixed, fp32 = M.layer_activation_bytes(**GPT3), M.layer_activation_bytes(**GPT3, precision="fp32")
    masks = 2 * SBH + 96 * 2048 ** 2                                      # two sbh masks, one a s^2 b
    assert fp32 == pytest.approx(2 * mixed - masks, rel=1e-12)
    assert M.layer_activation_bytes(**GPT3, recompute="full", precision="fp32") == 4 * SBH


def test_input_and_output_layer_activations_are_section_4_3():
    # p = 1: sbh p/t (embedding dropout) + 4 sbh/t (1 + v/h) (norm, projection, fp32 logits)
    plan = M.Plan(params=175e9, layers=96, vocab=51200, tp=8, sequence_parallel=True, **GPT3)
    out = M.terms(plan).set_index("term").loc["activations_output", "bytes"]
    assert out == pytest.approx(SBH / 8 + 4 * SBH / 8 * (1 + 51200 / 12288), rel=1e-12)


@pytest.mark.parametrize("schedule, v, inflight", [("gpipe", 1, 8), ("1f1b", 1, 4),
                                                    ("interleaved", 2, 4 * (1 + 3 / (4 * 2)))])
def test_first_stage_in_flight_micro_batches(schedule, v, inflight):
    plan = M.Plan(**SEVEN_B, pp=4, microbatches=8, schedule=schedule, interleave=v)
    t = M.terms(plan).set_index("term")
    # GPipe: every stage holds all m, so the last one (with the logits) is the peak
    assert M.terms(plan).attrs["stage"] == ("last" if schedule == "gpipe" else "first")
    layer = M.layer_activation_bytes(4096, 1, 4096, 32, attention="math")
    assert t.loc["activations", "bytes"] == pytest.approx(inflight * 8 * layer, rel=1e-12)
    assert f"{inflight:g} micro-batches in flight" in t.loc["activations", "formula"]
    # 1F1B: the first stage keeps L layers' worth whatever p (Korthikanti 4.2.3); pp = 1: one at a time
    one = M.terms(M.Plan(**SEVEN_B, microbatches=8, schedule=schedule if v == 1 else "1f1b"))
    assert "1 micro-batch in flight x 32 layers" in one.set_index("term").loc["activations", "formula"]


def test_terms_table_and_framework_allowance():
    df = M.terms(M.Plan(**SEVEN_B))
    assert list(df.columns) == ["term", "bytes", "GiB", "formula", "source"]
    assert list(df.term) == ["weights", "gradients", "optimizer", "activations", "activations_output",
                             "framework"]
    rest = df.bytes[:-1].sum()
    assert df.bytes.iloc[-1] == pytest.approx(M.FRAMEWORK_FIXED_BYTES + M.FRAMEWORK_FRACTION * rest)
    assert M.total_bytes(M.Plan(**SEVEN_B)) == pytest.approx(df.bytes.sum())
    assert df.GiB.sum() == pytest.approx(df.bytes.sum() / 2 ** 30)


# --- monotonicity ------------------------------------------------------------------------------------

MODELS = [dict(params=1.3e9, layers=24, hidden=2048, heads=16, vocab=50257, seq_len=2048), SEVEN_B]
AXES = dict(tp=[1, 2, 4, 8], pp=[1, 2, 4], zero_stage=[0, 1, 2, 3],
            recompute=["none", "selective", "full"], sequence_parallel=[False, True],
            micro_batch_size=[1, 2, 4], schedule=["gpipe", "1f1b"], dp=[1, 64], microbatches=[1, 8])
KEYS = list(AXES)


@pytest.fixture(scope="module")
def grid():
    return {(i, vals): M.total_bytes(M.Plan(**m, **dict(zip(KEYS, vals))))
            for i, m in enumerate(MODELS) for vals in itertools.product(*AXES.values())}


def _steps(grid, knob):
    """(plan as dict, total, total after one step up the knob's axis) over the whole grid."""
    k = KEYS.index(knob)
    for (i, vals), before in grid.items():
        j = AXES[knob].index(vals[k])
        if j + 1 < len(AXES[knob]):
            up = vals[:k] + (AXES[knob][j + 1],) + vals[k + 1:]
            yield dict(zip(KEYS, vals), model=i), before, grid[(i, up)]


@pytest.mark.parametrize("knob", ["tp", "zero_stage", "recompute", "sequence_parallel"])
def test_more_parallelism_sharding_or_recompute_never_costs_memory(grid, knob):
    steps = list(_steps(grid, knob))
    assert len(steps) > 1000
    assert all(after <= before for _, before, after in steps)
    assert sum(after < before for _, before, after in steps) > len(steps) / 3   # and usually helps


def test_larger_micro_batch_never_saves_memory(grid):
    assert all(after > before for _, before, after in _steps(grid, "micro_batch_size"))


def test_pipeline_depth_monotone_except_two_stated_cases(grid):
    for plan, before, after in _steps(grid, "pp"):
        if after <= before:
            continue
        if plan["schedule"] == "gpipe":            # GPipe keeps all m micro-batches once pp > 1
            assert plan["pp"] == 1 and plan["microbatches"] > 1
            continue
        # 1F1B with ZeRO-3 over many ranks: weights barely shrink, the first stage's embedding-dropout
        # masks (one sbh per micro-batch in flight, p of them) grow. Bounded by exactly that growth.
        assert plan["zero_stage"] == 3 and plan["dp"] > 1
        m, p = MODELS[plan["model"]], plan["pp"]
        sbh = m["seq_len"] * plan["micro_batch_size"] * m["hidden"]
        sbh /= plan["tp"] if plan["sequence_parallel"] else 1
        grow = (min(2 * p, plan["microbatches"]) - min(p, plan["microbatches"])) * sbh
        assert after - before <= (1 + M.FRAMEWORK_FRACTION) * grow
        assert (after - before) / before < 0.015                    # 1.4 % at worst here


def test_interleaving_costs_first_stage_activations():
    base = dict(**SEVEN_B, microbatches=8, schedule="interleaved", interleave=2)
    acts = [M.terms(M.Plan(**base, pp=p)).set_index("term").loc["activations", "bytes"] for p in (2, 4)]
    layer = M.layer_activation_bytes(4096, 1, 4096, 32, attention="math")
    assert acts == pytest.approx([32 * layer * (1 + (p - 1) / (p * 2)) for p in (2, 4)])
    assert M.total_bytes(M.Plan(**base, pp=4)) < M.total_bytes(M.Plan(**base, pp=2))   # weights win


# --- cheapest_fit ------------------------------------------------------------------------------------

def test_7b_without_recompute_needs_zero1_plus_selective():
    plan = M.Plan(**SEVEN_B, dp=1024)
    assert M.fits(plan, 80)[0] is False and 16 * 7e9 > 80e9
    df = MF.cheapest_fit(plan, 80, gpus_per_node=8, gpus=1024)
    assert list(df.columns) == ["change", "plan_bytes", "GiB", "fits", "headroom", "cost", "order"]
    assert list(df.order) == list(range(len(df)))
    singles = [c for c in df.change if "+" not in c]
    assert singles == ["none (as planned)", "ZeRO-1", "ZeRO-2", "selective recompute", "tp=2", "tp=4",
                       "tp=8", "ZeRO-3", "full recompute", "pp=2", "pp=4"]   # no SP at tp=1, no mbs < 1
    first = df[df.fits].iloc[0]
    assert first.change == "ZeRO-1 + selective recompute" and first.order == 4
    assert not df.fits.iloc[:4].any()              # ZeRO-1 alone: the s^2 attention scores, ~104 GB
    z1 = df.set_index("change").loc["ZeRO-1", "plan_bytes"]
    assert z1 > 80e9 and first.plan_bytes < 60e9
    assert df.set_index("change").loc["tp=2", "plan_bytes"] == pytest.approx(
        M.total_bytes(M.Plan(**SEVEN_B, tp=2, dp=512, microbatches=2)))        # dp and m follow tp


def test_7b_with_selective_recompute_fits_with_zero1():
    plan = M.Plan(**SEVEN_B, dp=1024, recompute="selective")                # ~ FlashAttention
    df = MF.cheapest_fit(plan, 80, gpus_per_node=8, gpus=1024)
    assert not df.fits.iloc[0]
    first = df[df.fits].iloc[0]
    assert first.change == "ZeRO-1" and "no extra communication" in first.cost
    assert first.plan_bytes == pytest.approx(M.total_bytes(M.Plan(**{**plan.__dict__, "zero_stage": 1})))


def test_an_uneven_pipeline_split_is_planned_at_its_fullest_stage():
    """61 layers on 16 stages (DeepSeek-V3): the fullest stage holds 4 layers; one stage per layer at most."""
    uneven = M.Plan(**{**SEVEN_B, "layers": 61, "pp": 16, "dp": 1})
    even = M.Plan(**{**SEVEN_B, "layers": 64, "pp": 16, "dp": 1})
    act = (lambda p: float(M.terms(p).set_index("term").loc["activations", "bytes"]))
    assert act(uneven) == pytest.approx(act(even))           # 4 layers each on the fullest stage
    with pytest.raises(ValueError, match="every stage and chunk needs a layer"):
        M.Plan(**{**SEVEN_B, "layers": 8, "pp": 16, "dp": 1})


def test_cheapest_fit_offers_only_valid_changes():
    plan = M.Plan(params=2e9, layers=30, hidden=3072, heads=12, vocab=32000, seq_len=2048, tp=2, dp=8,
                  micro_batch_size=4)
    changes = list(MF.cheapest_fit(plan, 80, gpus_per_node=8, gpus=16).change)
    assert changes[1] == "sequence parallel"                             # tp > 1: free, first
    assert "tp=4" in changes and "tp=8" not in changes                   # 12 heads
    assert "pp=2" in changes and "pp=4" not in changes                   # 30 layers
    assert "micro_batch_size=2" in changes and "micro_batch_size=1" in changes


# --- input checks ------------------------------------------------------------------------------------

@pytest.mark.parametrize("change, word", [
    (dict(heads=30), "heads must divide hidden"), (dict(zero_stage=4), "zero_stage"),
    (dict(recompute="some"), "recompute"), (dict(tp=3), "tp must divide heads"),
    (dict(pp=40), "layers"), (dict(schedule="zb"), "schedule"), (dict(precision="fp8"), "precision"),
    (dict(interleave=2), "interleave"), (dict(micro_batch_size=0), "micro_batch_size"),
    (dict(seq_len=2.5), "seq_len"), (dict(params=1e6), "params"), (dict(dp=-1), "dp"),
    (dict(sequence_parallel="yes"), "sequence_parallel"),
    (dict(schedule="interleaved", interleave=2, pp=2, microbatches=3), "microbatches % pp")])
def test_bad_plans_rejected_naming_the_field(change, word):
    with pytest.raises(ValueError, match=word):
        M.Plan(**{**SEVEN_B, **change})


def test_bad_arguments_rejected():
    plan = M.Plan(**SEVEN_B, dp=8)
    with pytest.raises(ValueError, match="gpu_memory_GB"):
        M.fits(plan, 0)
    with pytest.raises(ValueError, match="gpus"):
        MF.cheapest_fit(plan, 80, gpus_per_node=8, gpus=16)
    with pytest.raises(ValueError, match="gpus_per_node"):
        MF.cheapest_fit(plan, 80, gpus_per_node=0, gpus=8)


def test_published_uneven_interleaving_is_accepted():
    """Llama 3.1 405B in Megatron-Bridge (126 layers, pp 16, 8 chunks: the embedding and the loss take a slot
    each, --account-for-embedding-in-pipeline-split) and DeepSeek-V3 (61 layers, pp 4, 4 chunks) ran: planned,
    at the fullest stage."""
    M.Plan(**{**SEVEN_B, "layers": 126, "pp": 16, "dp": 1, "interleave": 8, "schedule": "interleaved",
              "microbatches": 16})
    M.Plan(**{**SEVEN_B, "layers": 61, "pp": 4, "dp": 1, "interleave": 4, "schedule": "interleaved", "microbatches": 8})
    with pytest.raises(ValueError, match="layers \\+ 2"):
        M.Plan(**{**SEVEN_B, "layers": 126, "pp": 16, "dp": 1, "interleave": 9, "schedule": "interleaved",
                  "microbatches": 16})
