"""Issue 41's playbook layer: the all-to-all (chapter 3), the busiest expert (chapter 4) and fp8's real gain
(chapter 1) as tables, explorers and predict-first exercises, each number read from the library's one home
(``moe.a2a_layer``, ``moe.busiest_rank_load``, the step model) and checked here against hand arithmetic."""
import json
import math
import re

import pytest

from conftest import EXAMPLE, REPO
from preflight.chapters import exercises as X
from preflight.chapters import fp8_recipes as F
from preflight.chapters import moe_tables as M
from preflight.chapters import step as S
from preflight.core.profile import load_profile

DEEPSEEK = REPO / "data" / "profiles" / "moe" / "deepseek-v3.yaml"
# DeepSeek-V3 as the report runs it: 4,096 tokens per GPU per micro-batch, h = 7,168, top-8, ep = 64 on 8-GPU nodes
VALUES = 4096 * 7168


@pytest.fixture(scope="module")
def ds():
    return load_profile(DEEPSEEK)


@pytest.fixture(scope="module")
def example():
    return load_profile(EXAMPLE)


def _training(p, **kw):
    return p.model_copy(update={"training": p.training.model_copy(update=kw)})


# -- the all-to-all ----------------------------------------------------------------------------------------------

def test_node_limit_cuts_network_copies_from_8x7_8_to_4x7_8(ds):
    free = M.a2a_row(ds, node_limit=None, fp8_dispatch=False)
    four = M.a2a_row(ds, node_limit=4, fp8_dispatch=False)
    assert free["domains"] == 8 and free["gpus_per_domain"] == 8
    assert free["network_copies"] == pytest.approx(8 * 7 / 8)
    assert four["network_copies"] == pytest.approx(4 * 7 / 8)
    assert free["nvlink_copies"] == pytest.approx(8 * 7 / 64)                            # k (ep/d - 1) / ep
    # node-limited: the remote copies not sent over the network are forwarded over NVLink at the receiving node
    assert four["nvlink_copies"] == pytest.approx(8 * 7 / 64 + (8 - 4) * 7 / 8)
    # four all-to-alls of tokens x h values at 2 bytes each
    assert free["a2a_per_layer"] == 4
    assert free["network_MB"] == pytest.approx(4 * 2 * VALUES * 7 / 1e6)
    assert four["network_MB"] == pytest.approx(4 * 2 * VALUES * 3.5 / 1e6)


def test_fp8_dispatch_and_recompute_bytes(ds):
    fp8 = M.a2a_row(ds, node_limit=4, fp8_dispatch=True)
    assert fp8["network_MB"] == pytest.approx((1 + 4 / 128 + 3 * 2) * VALUES * 3.5 / 1e6)
    full = M.a2a_row(_training(ds, activation_recompute="full"), node_limit=4, fp8_dispatch=True)
    assert full["a2a_per_layer"] == 6                      # the forward dispatch and combine again
    assert full["network_MB"] == pytest.approx((2 * (1 + 4 / 128) + 4 * 2) * VALUES * 3.5 / 1e6)


def test_a2a_row_is_the_step_models_term(ds):
    """One layer's seconds times the MoE layers a stage runs per step are the step model's all-to-all term."""
    for kw in ({}, {"node_limit": None}, {"fp8_dispatch": False, "overlap": False}):
        r = M.a2a_row(ds, **kw)
        t = ds.training
        per_step = r["layer_ms"] / 1e3 * t.microbatches * ds.model.moe_layers / t.pp
        assert r["a2a_all_s"] == pytest.approx(per_step, rel=1e-9)
    own = S.plan_step(ds)
    assert M.a2a_row(ds)["a2a_exposed_s"] == pytest.approx(own.terms["a2a_s"])


def test_overlap_hides_time_not_bytes(ds):
    blocking, hidden = M.a2a_row(ds, overlap=False), M.a2a_row(ds, overlap=True)
    assert blocking["network_MB"] == hidden["network_MB"] and blocking["a2a_all_s"] == hidden["a2a_all_s"]
    assert blocking["a2a_exposed_s"] == pytest.approx(blocking["a2a_all_s"])
    assert hidden["a2a_exposed_s"] < blocking["a2a_exposed_s"] and hidden["step_s"] < blocking["step_s"]


def test_experts_inside_one_domain_cross_no_network(ds):
    r = M.a2a_row(ds, ep=8)
    assert r["domains"] == 1 and r["network_MB"] == 0 and r["network_copies"] == 0
    assert r["nvlink_copies"] == pytest.approx(8 * 7 / 8)


def test_ladder_each_lever_helps(ds):
    lad = M.a2a_ladder(ds)
    assert len(lad) == 4 and lad["ep"].eq(64).all()
    assert list(lad["network_copies"]) == pytest.approx([7, 3.5, 3.5, 3.5])
    assert lad["network_MB"].is_monotonic_decreasing and lad["network_MB"].iloc[2] < lad["network_MB"].iloc[1]
    assert lad["a2a_exposed_s"].is_monotonic_decreasing and lad["a2a_exposed_s"].iloc[3] < lad["a2a_exposed_s"].iloc[2]


def test_a2a_table_over_ep(ds):
    eps = M.valid_eps(ds)
    assert eps == [1, 2, 4, 8, 16, 32, 64, 128]              # divisors of 256 dividing dp = 128
    t = M.a2a_table(ds)
    assert list(t["ep"]) == eps[1:]
    assert (t[t["ep"] <= 8]["network_MB"] == 0).all() and (t[t["ep"] > 8]["network_MB"] > 0).all()


@pytest.mark.parametrize("kw,field", [({"ep": 3}, "training.ep"), ({"ep": 256}, "training.ep"),
                                      ({"node_limit": 0}, "training.moe_node_limit"),
                                      ({"node_limit": 2.5}, "training.moe_node_limit"),
                                      ({"fp8_dispatch": "yes"}, "training.moe_dispatch_fp8"),
                                      ({"overlap": 1}, "training.moe_a2a_overlap")])
def test_a2a_bad_input(ds, kw, field):
    with pytest.raises(ValueError, match=re.escape(field) + ".*accepted"):
        M.a2a_row(ds, **kw)


def test_dense_plan_is_told_and_gets_the_example(example):
    with pytest.raises(ValueError, match="model.experts = 0"):
        M.a2a_row(example)
    with pytest.raises(ValueError, match="model.experts = 0"):
        M.busiest_table(example)
    subject, words = M.moe_profile(example)
    assert subject.project == "deepseek-v3" and "no experts" in words and "deepseek-v3.yaml" in words


# -- the busiest expert-parallel rank ---------------------------------------------------------------------------

def test_busiest_load_hand_arithmetic():
    b = M.busiest_row(16, 64, 8)
    assert b["mean_tokens"] == 128
    assert b["load"] == pytest.approx(1 + math.sqrt(2 * math.log(64)) / math.sqrt(128))
    capped = M.busiest_row(16, 64, 8, 1.1)
    assert capped["wait"] == 1.1 and capped["dropped"] == pytest.approx(1 - 1.1 / b["load"])
    assert M.busiest_row(16, 64, 8, 2.0)["dropped"] == 0 and M.busiest_row(16, 64, 8, 2.0)["wait"] == b["load"]


def test_busiest_grows_as_tokens_fall_and_the_cap_holds(ds):
    wide = M.busiest_wide(ds)
    assert wide["tokens per rank"].is_monotonic_increasing
    assert wide["busiest / mean (dropless wait)"].is_monotonic_decreasing
    long = M.busiest_table(ds)
    capped = long[long["capacity_factor"].notna()]
    assert (capped["wait"] <= capped["capacity_factor"] + 1e-12).all()
    assert (capped["dropped"] > 0).any() and (capped["dropped"] == 0).any()     # the grid shows both
    assert wide["tokens per rank"].max() == M.tokens_per_rank(ds) == 4096


def test_busiest_row_is_the_chapter_4_finding(ds):
    from preflight.chapters import load_balance as C
    from preflight.core.findings import FindingSink

    sink = FindingSink()
    C.add_busiest_expert_finding(sink, ds)
    f = next(x for x in sink.findings if x.id == "load_balance/busiest_expert")
    assert f.value == pytest.approx(M.busiest_row(M.tokens_per_rank(ds), ds.training.ep, 8)["wait"])


def test_tokens_for_load_inverts_the_load():
    for c, ep, k in ((1.1, 64, 8), (1.25, 8, 2), (1.5, 1024, 1)):
        n = M.tokens_for_load(c, ep, k)
        assert n == pytest.approx(2 * math.log(ep) / (k * (c - 1) ** 2), rel=1e-6)
        assert M.busiest_row(n * 1.01, ep, k, c)["dropped"] == 0 < M.busiest_row(n * 0.99, ep, k, c)["dropped"]


@pytest.mark.parametrize("args,field", [((0, 64, 8), "tokens per rank"), ((float("nan"), 64, 8), "tokens per rank"),
                                        ((16, 0, 8), "training.ep"), ((16, 64, 0), "model.top_k"),
                                        ((16, 64, 8, 0.5), "training.moe_capacity_factor"),
                                        ((16, 64, 8, 101), "training.moe_capacity_factor")])
def test_busiest_bad_input(args, field):
    with pytest.raises(ValueError, match=re.escape(field) + ".*accepted"):
        M.busiest_row(*args)


def test_tokens_for_load_bad_input():
    with pytest.raises(ValueError, match="load = 1.0"):
        M.tokens_for_load(1.0, 64, 8)
    with pytest.raises(ValueError, match="training.ep = 1"):
        M.tokens_for_load(1.1, 1, 8)


# -- fp8 by recipe ----------------------------------------------------------------------------------------------

def test_fp8_gain_on_h100_is_between_1_and_2_and_differs_by_recipe(example):
    t = F.recipe_table(example).set_index("recipe")
    ok = t[t["why_not"].isna()]
    assert list(ok.index) == ["delayed", "tensorwise", "rowwise", "blockwise"]
    assert ((ok["gain"] > 1.0) & (ok["gain"] < 2.0)).all()
    assert (ok["gemm_gain"] == 2.0).all()                       # H100 SXM: 1,979 / 989.5
    assert (ok["gain"] <= ok["gain_no_casts"]).all() and (ok["casts_s"] > 0).all()
    assert ok.loc["tensorwise", "gain"] < ok.loc["delayed", "gain"]        # current scaling reads the tensor again
    assert ok.loc["rowwise", "gain"] == ok.loc["tensorwise", "gain"]      # the same bytes per element
    assert "Blackwell" in t.loc["mxfp8", "why_not"] and math.isnan(t.loc["mxfp8", "gain"])


def test_fp8_gain_is_the_step_models_ratio(ds):
    r = F.recipe_row(ds, "blockwise")                           # the profile's own fp8 recipe
    assert r["fp8_step_s"] == pytest.approx(S.plan_step(ds).step_s)
    bf16 = S.plan_step(_training(ds, fp8=False)).step_s
    assert r["gain"] == pytest.approx(bf16 / S.plan_step(ds).step_s)
    assert F.gain(ds, "blockwise") == r["gain"]


def test_mxfp8_runs_on_blackwell_only(example):
    gb = example.model_copy(update={"cluster": example.cluster.model_copy(update={"gpu": "GB200"})})
    assert F.why_not("GB200", "mxfp8") is None and 1.0 < F.gain(gb, "mxfp8") < F.recipe_row(gb, "mxfp8")["gemm_gain"]
    assert F.gain(example, "mxfp8") is None


def test_no_fp8_chip_says_why(example):
    a100 = example.model_copy(update={"cluster": example.cluster.model_copy(update={"gpu": "A100-SXM"})})
    t = F.recipe_table(a100)
    assert t["gain"].isna().all() and t["why_not"].str.contains("no fp8 tensor cores").all()
    subject, words = F.fp8_subject(a100)
    assert subject.cluster.gpu == "H100-SXM" and "A100-SXM has no fp8" in words
    with pytest.raises(ValueError, match="training.fp8_recipe = 'fp4': accepted delayed"):
        F.recipe_row(example, "fp4")


def test_measured_gains_hand_arithmetic():
    m = F.measured_table()
    assert list(m["gain"]) == pytest.approx([8532 / 6667, 8380 / 6514, 4357 / 3848])
    assert all(1.12 < g < 1.30 for g in m["gain"])              # +13-29 %, nowhere near 2x


# -- the explorers ----------------------------------------------------------------------------------------------

def _readout(box) -> dict:
    return dict(re.findall(r'data-key="(\w+)">([^<]+)<', box.children[2].value))


def _controls(box) -> dict:
    return {c.description: c for c in box.children[1].children}


def _explorers(ds, example):
    from preflight import widgets

    return {"a2a": lambda: widgets.a2a_explorer(ds, label="DeepSeek-V3"),
            "busiest": lambda: widgets.busiest_explorer(4096, 64, 8),
            "busiest_capped": lambda: widgets.busiest_explorer(16, 64, 8, 1.1),
            "fp8": lambda: widgets.fp8_explorer(example)}


@pytest.mark.parametrize("name", ["a2a", "busiest", "busiest_capped", "fp8"])
def test_explorers_at_every_end(name, ds, example):
    """Each control at each end of its range (test_slider_ranges' rule) redraws without an error, NaN or inf."""
    from test_slider_ranges import _check, _ends

    box = _explorers(ds, example)[name]()
    _check(box, name, "start")
    for c in box.children[1].children:
        start = c.value
        for v in _ends(c):
            c.value = v
            _check(box, name, {c.description: v})
        c.value = start


def test_a2a_explorer_follows_the_library(ds):
    from preflight import widgets

    box = widgets.a2a_explorer(ds)
    assert _readout(box)["network_copies"] == "3.5"
    c = _controls(box)
    c["nodes per token at most"].value = 0                      # every node
    r = _readout(box)
    assert r["network_copies"] == "7" and r["network_MB"] == f"{M.a2a_row(ds, node_limit=None)['network_MB']:,.4g} MB"
    c["expert parallel ep"].value = 8
    assert _readout(box)["network_MB"] == "0 MB"


def test_busiest_and_fp8_explorers_follow_the_library(example):
    from preflight import widgets

    box = widgets.busiest_explorer(16, 64, 8, 1.1)
    r = _readout(box)
    assert r["dropped"] == f"{M.busiest_row(16, 64, 8, 1.1)['dropped']:.1%}"
    assert r["no_drop"] == f"{M.tokens_for_load(1.1, 64, 8):,.0f}" == "104"
    box = widgets.fp8_explorer(example)
    assert _readout(box)["gain"] == f"{F.gain(example, example.training.fp8_recipe):.3f}x"
    _controls(box)["fp8 recipe"].value = "mxfp8"
    assert "Blackwell" in _readout(box)["why_not"]
    _controls(box)["GPU"].value = "B200"
    assert "gain" in _readout(box)


# -- the exercises ----------------------------------------------------------------------------------------------

def test_exercise_answers_hand_arithmetic(ds, example):
    for prof in (ds, example):                                  # the dense example asks about DeepSeek-V3
        a2a = X.communication(prof)["a2a"]
        assert "2 nodes per token (the plan: 4)" in a2a.question
        assert a2a.answer() == pytest.approx((1 + 4 / 128 + 3 * 2) * VALUES * 2 * 7 / 8 / 1e6)
        busy = X.load_balance(prof)["busiest"]
        assert busy.answer() == pytest.approx(2 * math.log(64) / (8 * 0.1 ** 2))
    assert "no experts" in X.communication(example)["a2a"].question
    assert X.baseline(example)["fp8"].answer() == pytest.approx(F.gain(example, "delayed"))
    assert X.baseline(ds)["fp8"].answer() == pytest.approx(F.gain(ds, "blockwise"))


def test_exercises_do_not_ask_what_the_chapter_shows(ds):
    """The all-to-all question's limit is neither the plan's nor the ladder's; the busiest question asks the
    tokens a load allows, which the table (load at given tokens) does not print."""
    ex = X.communication(ds)["a2a"]
    shown = list(M.a2a_ladder(ds)["network_MB"]) + list(M.a2a_table(ds)["network_MB"])
    assert all(abs(ex.answer() - s) > 0.01 * s for s in shown if s)
    tokens = list(M.busiest_wide(ds)["tokens per rank"])
    assert all(abs(X.load_balance(ds)["busiest"].answer() - s) > 0.05 * s for s in tokens)


def test_a_plan_with_experts_in_one_domain_asks_about_deepseek(ds):
    inside = _training(ds, ep=8)
    assert X.asked_node_limit(inside) is None
    ex = X.communication(inside)["a2a"]
    assert "its experts stay in one domain" in ex.question and ex.answer() > 0


@pytest.mark.parametrize("stem,key,explorer", [("01_baseline", "fp8", "fp8_explorer("),
                                               ("03_communication", "a2a", "a2a_explorer("),
                                               ("04_load_balance", "busiest", "busiest_explorer(")])
def test_notebooks_ask_before_the_explorer_and_check_after(stem, key, explorer):
    nb = json.loads((REPO / "playbook" / f"{stem}.ipynb").read_text())
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    ask = next(i for i, c in enumerate(code) if f'ask(EX["{key}"])' in c)
    shown = next(i for i, c in enumerate(code) if explorer in c and "display(" in c)
    check = next(i for i, c in enumerate(code) if f'check(EX["{key}"]' in c)
    assert ask < shown < check
    assert re.search(rf"^prediction_{key} = None", code[ask], re.M)


@pytest.mark.parametrize("name", ["a2a", "busiest_capped", "fp8"])
def test_explorer_charts_pass_the_vega_lite_schema(name, ds, example, monkeypatch):
    from preflight.reporting import charts
    from test_slider_ranges import _check, _ends

    monkeypatch.setattr(charts, "VALIDATE", True)
    box = _explorers(ds, example)[name]()
    for c in box.children[1].children:
        c.value = _ends(c)[-1]
    _check(box, name, "far ends")


def test_the_notebooks_explorer_calls_run_on_a_dense_plan(example):
    """The chapters' display cells, as written, on the example (dense: the DeepSeek-V3 profile stands in)."""
    from preflight import widgets

    moe_plan, _ = M.moe_profile(example)
    for box in (widgets.a2a_explorer(moe_plan, None, label=moe_plan.project),
                widgets.busiest_explorer(M.tokens_per_rank(moe_plan), moe_plan.training.ep, moe_plan.model.top_k,
                                         moe_plan.training.moe_capacity_factor, label=moe_plan.project),
                widgets.fp8_explorer(F.fp8_subject(example, "H100-SXM")[0], "H100-SXM")):
        assert box.children[3].value.startswith("<svg") and "Error" not in box.children[2].value


def test_node_limit_cannot_exceed_the_domains(ds):
    """At ep = 16 over 8-GPU domains (d = 2) a token reaches at most one remote domain: min(k, M, d) (d-1)/d = 1
    network copy, not min(k, M) (d-1)/d = 2 (the browser check's finding)."""
    from preflight.models import moe

    x = moe.a2a_layer(4096, 7168, 8, 16, ep_per_domain=8, nic_GBps=50, nvlink_GBps=160, nic_latency_s=0,
                      nvlink_latency_s=0, node_limit=4)
    assert x.inter_bytes == pytest.approx(4 * 2 * 4096 * 7168 * 1.0)


def test_why_names_the_communication_fp8_uncovers():
    """On a plan bound by its gradient reduction, the sentence says the exposed communication grew."""
    from preflight.core.profile import load_profile

    p, _ = F.fp8_subject(load_profile(REPO / "data" / "profiles" / "example.yaml"))
    r = F.recipe_row(p, "delayed")
    assert r["fp8_compute_s"] < r["bf16_compute_s"] and r["fp8_exposed_s"] >= r["bf16_exposed_s"]
    text = F.why(r)
    assert "shortens compute" in text and "ms" in text
    if r["fp8_exposed_s"] - r["bf16_exposed_s"] > 0.1 * (r["bf16_compute_s"] - r["fp8_compute_s"]):
        assert "communication-bound" in text
    table = F.display_table(p)
    assert {"compute (s)", "exposed comm (s)", "casts (ms)", "the real gain"} <= set(table.columns)
    assert table["the real gain"].iloc[0].endswith("x")
