"""Context parallelism: the memory it saves, the K/V exchange it costs, and Llama 3 405B's 128K stage.

Source of the case: The Llama 3 Herd of Models (arXiv 2407.21783), Table 4's 128K row: 16,384 H100s,
TP 8, CP 16, PP 16, DP 8, sequences of 131,072 tokens, 16 per DP rank, 380 TFLOPs/GPU; sec. 3.3.2: an
all-gather CP whose communication is "much smaller than attention computation" thanks to GQA.
"""
from pathlib import Path

import pytest

from preflight.chapters import advisor as A
from preflight.chapters import communication as C3
from preflight.chapters import memory_plan as MP
from preflight.core.findings import FindingSink
from preflight.core.profile import ProfileError, load_profile, parse_profile
from preflight.models import context as CX
from preflight.models import memory as M
from preflight.models import throughput as T

ROOT = Path(__file__).resolve().parents[1]
LLAMA3 = ROOT / "data/profiles/long-context/llama3-405b-128k.yaml"
H, HEADS, KV, TP = 16384, 128, 8, 8              # Llama 3 405B (Table 3)
RATE = 989.5e12 * 0.55                           # H100 bf16 peak at the GEMM model's 55 %
NIC_GBps = 50.0                                  # 400 Gb/s per GPU (sec. 3.3.1)


def _with(profile, **training):
    d = profile.model_dump()
    d["training"].update(training)
    return parse_profile(d)


def test_kv_chunk_is_two_tensors_of_the_local_tokens_kv_heads_wide():
    # 2 (K, V) x 1 x 8192 tokens x 16384 x 8/128 / 8 x 2 B = 4.19 MB
    assert CX.kv_chunk_bytes(1, 131072, H, HEADS, KV, TP, 16) == 2 * 8192 * 1024 / 8 * 2
    assert CX.exchange(1, 131072, H, HEADS, KV, TP, 1, NIC_GBps, 1e-5, RATE).comm_s == 0.0


def test_ring_hides_at_128k_and_not_at_8k_with_the_same_cp():
    """The ratio grows as cp / s: Llama 3's 128K with cp 16 hides the ring; 8K with cp 16 does not."""
    long = CX.exchange(1, 131072, H, HEADS, KV, TP, 16, NIC_GBps, 1e-5, RATE)
    short = CX.exchange(1, 8192, H, HEADS, KV, TP, 16, NIC_GBps, 1e-5, RATE)
    assert long.ratio < 0.25 and long.ring_exposed_s == 0.0
    assert short.ratio > 1 and short.ring_exposed_s > 0
    # doubling s at a fixed cp doubles attention per byte: the bandwidth part of the ratio halves
    half, full = (CX.exchange(1, s, H, HEADS, KV, TP, 16, NIC_GBps, 0.0, RATE) for s in (65536, 131072))
    assert half.ratio == pytest.approx(2 * full.ratio)


def test_llama3_all_gather_costs_a_fraction_of_attention():
    """Llama 3 sec. 3.3.2: with GQA the all-gathered K/V are small against the quadratic attention."""
    x = CX.exchange(1, 131072, H, HEADS, KV, TP, 16, NIC_GBps, 1e-5, RATE)
    attention = CX.attention_forward_flops(1, 131072, H, TP, 16) * (1 + CX.CP_BACKWARD) / RATE
    assert x.allgather_s < 0.25 * attention


def test_llama3_128k_needs_cp_to_fit_on_80gb():
    """CP 16 fits (the published layout); without CP the 131,072-token activations do not, even with
    full recompute: why Llama 3 used it."""
    p = load_profile(LLAMA3)
    cap, _ = MP.capacity_bytes(p)
    with_cp = M.total_bytes(MP.plan_of(p))
    without = M.total_bytes(MP.plan_of(p, cp=1, dp=p.gpus // (TP * 16)))
    assert with_cp / cap < 0.5
    assert without / cap > 1.0
    plan = MP.plan_of(p)
    act = dict(zip(M.terms(plan)["term"], M.terms(plan)["bytes"]))["activations"]
    act1 = dict(zip(M.terms(MP.plan_of(p, cp=1, dp=128))["term"], M.terms(MP.plan_of(p, cp=1, dp=128))["bytes"]))[
        "activations"]
    assert act == pytest.approx(act1 / 16)         # every per-token term divides by cp


def test_llama3_published_throughput_lies_inside_what_the_unstated_choices_span():
    """The paper states neither the recompute policy nor the interleaving: the published 380 TFLOPs/GPU
    (66.9 tokens/s per GPU in the 6N + 12 L h s convention, 93.7 in the causal one) must lie between the
    model's most and least favourable readings of them."""
    p = load_profile(LLAMA3)
    from preflight.chapters import step as S

    cluster, model = S.cluster_of(p, "H100-SXM"), S.model_of(p)
    tok = []
    for v, rc in ((1, "full"), (8, "none")):
        lay = T.Layout(tp=8, pp=16, dp=8, zero_stage=1, activation_recompute=rc, sequence_parallel=True,
                       micro_batch_size=1, microbatches=16, interleave=v, cp=16)
        st = T.step_time(lay, model=model, cluster=cluster, overlap=S.overlap_of(p), framework="megatron")
        assert st.cp_exposed_s == 0.0 and st.cp_comm_s > 0
        tok.append(st.tokens_per_s_per_gpu)
    L, s, N = 126, 131072, 405e9
    published = [380e12 / (6 * N + 12 * L * H * s), 380e12 / (6 * N + 6 * L * H * s)]
    # since the 53-run calibration and NVLink rings at 370 of 450 GB/s the most favourable reading is 92.5
    # tokens/s against the causal convention's 93.7: 1.3 % short, inside the held-out error (10.6 %)
    assert tok[0] < min(published) and max(published) < tok[1] * 1.02


def test_cp_tokens_per_gpu_and_gradient_group():
    """cp GPUs share each sequence: tokens/s per GPU counts each token once; dp x cp ranks reduce."""
    model = T.Model(params=8e9, layers=32, hidden=4096, seq_len=65536, vocab=128256, causal_flash=True,
                    heads=32, kv_heads=8)
    cl = T.Cluster(peak_tflops=989.5, gpus_per_node=8, intra_node_GBps=370, inter_node_Gbps=400, nics_per_node=8)
    base = dict(tp=1, pp=1, zero_stage=1, activation_recompute="none", sequence_parallel=False, micro_batch_size=1,
                microbatches=1)
    one = T.step_time(T.Layout(dp=8, cp=1, **base), model=model, cluster=cl, efficiency=0.5)
    four = T.step_time(T.Layout(dp=2, cp=4, **base), model=model, cluster=cl, efficiency=0.5)
    assert four.compute_s == pytest.approx(one.compute_s / 4)
    assert four.tokens_per_s_per_gpu == pytest.approx(65536 / four.step_s / 4)
    assert four.dp_comm_s == pytest.approx(one.dp_comm_s)     # the same 8 replicas of the weights


def test_advisor_searches_cp_only_where_it_can_hide():
    p = load_profile(LLAMA3)
    res = A.advise(p)
    assert any(c["cp"] > 1 for c in res["candidates"][:20] if c["fits"])
    assert all(131072 // c["cp"] >= A.CP_MIN_TOKENS for c in res["candidates"])
    assert res["plan"]["cp"] == 16 and res["plan"]["fits"]
    example = load_profile(ROOT / "data/profiles/example.yaml")
    assert all(c["cp"] == 1 for c in A.advise(example)["candidates"])


def test_cp_exchange_finding_passes_at_128k_and_fails_at_8k():
    p = load_profile(LLAMA3)
    sink = FindingSink()
    C3.add_plan_findings(sink, p)
    f = {x.id: x.__dict__ for x in sink.findings}["communication/cp_exchange"]
    assert f["verdict"] == "pass" and "cp=16" in f["message"]
    short = parse_profile(p.model_dump() | {"model": p.model.model_dump() | {"seq_len": 8192}})
    sink = FindingSink()
    C3.add_plan_findings(sink, short)
    assert {x.id: x.__dict__ for x in sink.findings}["communication/cp_exchange"]["verdict"] == "fail"
    table = C3.cp_table(p)
    assert table[(table.seq_len == 131072) & (table.cp == 16)]["hides"].item()
    assert not table[(table.seq_len == 8192) & (table.cp == 16)]["hides"].item()


@pytest.mark.parametrize("change, words", [
    ({"training": {"cp": 3}}, "must divide the GPU"),
    ({"training": {"cp": 16}, "model": {"seq_len": 4112}}, "multiple of 2 x cp"),
    ({"training": {"cp": 2}, "model": {"attention": "math"}}, "model.attention = flash"),
    ({"training": {"cp": 2, "framework": "deepspeed", "zero_stage": 1}}, "Ulysses"),
])
def test_bad_cp_is_refused_naming_the_fields(change, words):
    d = load_profile(LLAMA3).model_dump()
    for section, fields in change.items():
        d[section].update(fields)
    with pytest.raises(ProfileError, match=words):
        parse_profile(d)
