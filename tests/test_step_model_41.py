"""Issue 41's corrections in the one step model, each with its source's numbers."""
import pytest

from preflight.models import moe
from preflight.models import throughput as T

H100 = T.Cluster(peak_tflops=989.5, gpus_per_node=8, intra_node_GBps=450, inter_node_Gbps=400, nics_per_node=8,
                 chip="H100-SXM")
DSV3_EXPERTS = moe.Experts(experts=256, top_k=8, expert_ffn=2048, moe_layers=58, shared=1)


def test_latent_attention_computes_2_9x_plain_attention():
    """DeepSeek-V3 (arXiv 2412.19437 sec. 4.2): 128 heads, query/key 128 + 64 rotary = 192, value 128, on
    hidden 7168: the score and weighted-sum matmuls are 128 x (192 + 128) wide per token, 2.86x the
    2 x 7168 of plain multi-head attention at that hidden size."""
    mla = T.Model(params=671e9, layers=61, hidden=7168, seq_len=4096, heads=128, qk_head_dim=192, v_head_dim=128)
    mha = T.Model(params=671e9, layers=61, hidden=7168, seq_len=4096, heads=128)
    assert mla.attention_width == 128 * 320 and mha.attention_width == 2 * 7168
    assert mla.attention_width / mha.attention_width == pytest.approx(2.857, abs=1e-3)
    (f1, _), (f0, _) = T.layer_flops(mla, 4096, "none"), T.layer_flops(mha, 4096, "none")
    assert f1 - f0 == pytest.approx(2 * (128 * 320 - 2 * 7168) * 4096 * 4096)


def test_expert_tensor_parallelism_defaults_to_tp():
    """Megatron's --expert-tensor-parallel-size defaults to tp: each expert split tp ways, and the experts'
    replicas are dp x cp / ep ranks; with etp = 1 they are tp x dp x cp / ep."""
    lay = T.Layout(tp=2, pp=1, dp=16, zero_stage=1, activation_recompute="none", sequence_parallel=True,
                   micro_batch_size=1, microbatches=1, ep=8)
    assert T.expert_dp(lay) == 2
    assert T.expert_dp(T.Layout(**{**lay.__dict__, "etp": 1})) == 4
    dense, routed = moe.params_per_gpu(671e9, 7168, DSV3_EXPERTS, 2, 1, 8, etp=2)
    assert routed == pytest.approx(DSV3_EXPERTS.routed_params(7168) / 16)


def test_all_to_all_as_deepseek_v3_runs_it():
    """DeepSeek-V3 sec. 3.2.2 / 3.3: dispatch in fp8 (1 B + an fp32 scale per 128 values), combine in bf16;
    each token's experts on at most 4 nodes, sent once per node and forwarded over NVLink; full recompute
    runs dispatch and combine again (6 all-to-alls per layer, not 4)."""
    kw = dict(ep_per_domain=8, nic_GBps=50.0, nvlink_GBps=160.0, nic_latency_s=0.0, nvlink_latency_s=0.0)
    free = moe.a2a_layer(4096, 7168, 8, 64, **kw)
    limited = moe.a2a_layer(4096, 7168, 8, 64, node_limit=4, **kw)
    fp8 = moe.a2a_layer(4096, 7168, 8, 64, node_limit=4, fp8_dispatch=True, **kw)
    again = moe.a2a_layer(4096, 7168, 8, 64, full_recompute=True, **kw)
    assert free.count == 4 and again.count == 6
    # 64 GPUs over 8 domains: 8 x 7/8 = 7 network copies of each token unlimited, 4 x 7/8 = 3.5 limited
    assert free.inter_bytes == pytest.approx(4096 * 7168 * 2 * 4 * 7)
    assert limited.inter_bytes / free.inter_bytes == pytest.approx(0.5)
    # the forward dispatch at 1 + 4/128 B instead of 2: a quarter of the 4 all-to-alls' bytes nearly halved
    assert fp8.inter_bytes / limited.inter_bytes == pytest.approx((1 + 4 / 128 + 6) / 8)
    assert again.inter_bytes / free.inter_bytes == pytest.approx(6 / 4)


def test_overlapped_all_to_alls_show_only_what_exceeds_compute():
    m = dict(params=671e9, layers=61, hidden=7168, seq_len=4096, heads=128, experts=DSV3_EXPERTS, causal_flash=True)
    lay = T.Layout(tp=1, pp=16, dp=128, zero_stage=1, activation_recompute="none", sequence_parallel=False,
                   micro_batch_size=1, microbatches=120, ep=64)
    blocking = T.step_time(lay, model=T.Model(**m), cluster=H100, framework="megatron", grad_dtype="fp32")
    dual = T.step_time(lay, model=T.Model(**m, a2a_overlap=True), cluster=H100, framework="megatron", grad_dtype="fp32")
    assert dual.a2a_comm_s == pytest.approx(blocking.a2a_comm_s)
    assert dual.a2a_s < blocking.a2a_s and dual.step_s < blocking.step_s


def _fsdp(pp: int, shard_gpus=None) -> T.StepTime:
    model = T.Model(params=70e9, layers=80, hidden=8192, seq_len=8192, vocab=128256, heads=64, kv_heads=8,
                    causal_flash=True)
    lay = T.Layout(tp=8, pp=pp, dp=256 // (8 * pp), zero_stage=3, activation_recompute="full", sequence_parallel=True,
                   micro_batch_size=1, microbatches=32, interleave=1)
    return T.step_time(lay, model=model, cluster=H100, framework="fsdp2", shard_gpus=shard_gpus)


def test_fsdp_bytes_per_layer_follow_the_stage_not_the_whole_model():
    """A stage of pp holds layers / pp of them: one layer's bytes do not shrink with pp (they were divided by
    pp twice). Under pipelining torchtitan keeps a stage gathered (reshard_after_forward=False) and
    reduce-scatters on the last micro-batch: one all-gather and one reduce-scatter per layer per step, so a
    doubling of pp halves the stage's bytes (half the layers), not quarters them."""
    two, four = _fsdp(2), _fsdp(4)
    w2 = 70e9 / (8 * 2)
    assert two.dp_bytes == pytest.approx((two.dp_ranks - 1) / two.dp_ranks * w2 * (2 + 2), rel=1e-9)   # bf16 weights and grads
    per_rank = lambda st: st.dp_bytes / ((st.dp_ranks - 1) / st.dp_ranks)
    assert per_rank(two) / per_rank(four) == pytest.approx(2.0)


def test_hsdp_shards_in_the_node_and_reduces_across_nodes():
    full, hsdp = _fsdp(1), _fsdp(1, shard_gpus=8)
    assert hsdp.dp_comm_s != full.dp_comm_s
    # tp 8 fills a node: one rank per node in the shard group, so every byte crosses to the replicas instead
    assert hsdp.dp_bytes == pytest.approx(2 * (32 - 1) / 32 * 70e9 / 8 * 2, rel=1e-9)     # bf16 gradients


def test_an_asynchronous_save_costs_its_blocking_part():
    """Megatron --async-save / DCP async_save: the step waits only for the copy to host memory. 70B with
    DeepSpeed's 14 B/param on 64 GPUs: 15.3 GB each at 25 GB/s, 0.61 s, against 60 s of a synchronous write."""
    from preflight.chapters import fault_tolerance as C5
    from preflight.core.profile import parse_profile
    from preflight.models import resilience as R

    assert R.async_blocking_seconds(70e9, "deepspeed", 64) == pytest.approx(70e9 * 14 / 64 / 25e9)
    base = {"project": "p", "model": {"params": 70e9, "layers": 80, "hidden": 8192, "seq_len": 4096},
            "cluster": {"nodes": 8}}
    sync = parse_profile(base | {"training": {"checkpoint_write_s": 60}})
    asyn = parse_profile(base | {"training": {"checkpoint_write_s": 60, "async_checkpoint": True}})
    c_sync, _ = C5.checkpoint_cost(sync)
    c_async, how = C5.checkpoint_cost(asyn)
    assert c_sync == 60 and c_async == pytest.approx(0.6125) and "blocking part" in how
    assert C5.plan(asyn)["waste_opt"] < C5.plan(sync)["waste_opt"]


def test_moe_parallel_folding_is_accepted():
    """Megatron's MoE parallel folding spreads experts over tp x dp x cp ranks: Qwen3-235B-A22B at TP 2, PP 8,
    EP 32 on 256 H100s (dp 16) with expert tensor parallelism 1 ran; EP must still divide the experts."""
    from preflight.core.profile import ProfileError, parse_profile

    base = {"project": "q", "model": {"params": 235e9, "layers": 94, "hidden": 4096, "seq_len": 4096, "heads": 64,
                                      "kv_heads": 4, "mlp": "swiglu", "experts": 128, "top_k": 8,
                                      "expert_ffn_hidden": 1536},
            "cluster": {"nodes": 32}}
    p = parse_profile(base | {"training": {"tp": 2, "pp": 8, "ep": 32, "etp": 1, "framework": "megatron", "zero_stage": 1}})
    assert p.dp == 16 and T.expert_dp(T.Layout(tp=2, pp=8, dp=16, zero_stage=1, activation_recompute="none",
                                               sequence_parallel=True, micro_batch_size=1, microbatches=8,
                                               ep=32, etp=1)) == 1
    with pytest.raises(ProfileError, match="parallel folding"):
        parse_profile(base | {"training": {"tp": 2, "pp": 8, "ep": 32, "framework": "megatron", "zero_stage": 1}})


def test_a_moe_layer_waits_for_its_busiest_expert_parallel_rank():
    """Uniform routing at DeepSeek-V3's micro-batch (4,096 tokens, top-8, EP 64): 32,768 copies per rank on
    average, the busiest 1 + sqrt(2 ln 64) / sqrt(32768) = 1.016x; a tiny micro-batch (32 tokens, EP 64)
    waits 1.18x; a capacity factor of 1.1 caps the wait there and drops the rest."""
    import math

    big = moe.busiest_rank_load(4096, 64, 8)
    assert big["load"] == pytest.approx(1 + math.sqrt(2 * math.log(64)) / math.sqrt(32768))
    small = moe.busiest_rank_load(32, 64, 8)
    assert small["load"] > 1.15 and small["dropped"] == 0.0
    capped = moe.busiest_rank_load(32, 64, 8, capacity_factor=1.1)
    assert capped["wait"] == 1.1 and capped["dropped"] == pytest.approx(1 - 1.1 / small["load"])
    assert moe.busiest_rank_load(4096, 1, 8)["wait"] == 1.0


def test_chapter_4_judges_the_busiest_rank_of_a_moe_plan():
    from conftest import REPO
    from preflight.chapters import load_balance as C4
    from preflight.core.findings import FindingSink
    from preflight.core.profile import load_profile

    p = load_profile(REPO / "data" / "profiles" / "moe" / "deepseek-v3.yaml")
    sink = FindingSink()
    C4.add_busiest_expert_finding(sink, p)
    f = sink.findings[0]
    assert f.id == "load_balance/busiest_expert" and f.verdict == "pass" and "s per step" in f.message
    small = p.model_copy(update={"model": p.model.model_copy(update={"seq_len": 32})})
    sink = FindingSink()
    C4.add_busiest_expert_finding(sink, small)
    assert sink.findings[0].verdict in ("warn", "fail")


def test_moe_activations_keep_the_routed_tokens():
    """A MoE layer keeps each token's k permuted copies (the experts' inputs, k s b h elements: 16-bit, or fp8
    under DeepSeek-V3's activation cache). The expert outputs are not kept for the combine: Megatron-Core
    multiplies the router's probabilities inside the experts' activation (TEGroupedMLP's weighted_bias_swiglu),
    so every dispatcher's combine is an unweighted unpermute (issue 41's review counted them: its +41-83 % holds
    for an implementation that weights at the combine). DeepSeek-V3's profile, as the report runs it: 58 of 61
    layers MoE, top-8, RMSNorm and MLA up-projections recomputed (so no norm output of a MoE layer and no q, k,
    v: the latents instead), the MoE SwiGLU's output recomputed."""
    from conftest import REPO
    from preflight.chapters import memory_plan as MP
    from preflight.core.profile import load_profile
    from preflight.models import memory as M

    p = load_profile(REPO / "data" / "profiles" / "moe" / "deepseek-v3.yaml")
    assert p.training.fp8_activation_cache
    parts = {name: b for name, b, _ in M.layer_parts(MP.plan_of(p))}
    assert parts["MoE: permuted expert inputs (k sbh)"] == pytest.approx(58 / 61 * 8 * 1 * 4096 * 7168)
    bf16 = {name: b for name, b, _ in M.layer_parts(MP.plan_of(p, fp8_activation_cache=False))}
    assert bf16["MoE: permuted expert inputs (k sbh)"] == pytest.approx(2 * parts["MoE: permuted expert inputs (k sbh)"])
    assert not any(name.startswith("MoE: permuted") for name, _, _ in M.layer_parts(MP.plan_of(p, recompute="full")))
    # layernorm on MLA + MoE layers: both norm outputs recomputed, except the 3 dense layers' fused pre-MLP norm
    assert "QKV input (input norm output)" not in parts
    assert parts["MLP input (pre-MLP norm output)"] == pytest.approx(3 / 61 * 1 * 4096 * 7168)
    assert parts["MLA latents (q, kv compressed, rope)"] == pytest.approx(1 * 4096 * (1536 + 512 + 64))
    assert not any(n.startswith("q, k, v") for n in parts)
    # moe_act: the routed experts keep the up projection's output (2 f_e per copy, fp8 under the cache)
    routed = parts["MoE experts: up projection output kept, activation recomputed (moe_act)"]
    assert routed == pytest.approx(58 / 61 * 4096 * 8 * 2 * 2048 * 1)
    bare = MP.plan_of(p, recompute="none", recompute_modules=None)
    assert M.total_bytes(MP.plan_of(p)) < 0.6 * M.total_bytes(bare)
    # the modules only act under selective recompute
    assert M.layer_parts(MP.plan_of(p, recompute="none")) == M.layer_parts(bare)


def test_recompute_modules_are_validated_and_named():
    """Megatron's --recompute-modules act only under selective recompute; mla_up_proj needs latent attention.
    A bad choice is refused naming the field."""
    from conftest import example_with
    from preflight.core.profile import parse_profile

    with pytest.raises(ValueError, match="training.recompute_modules"):
        parse_profile(example_with(training__recompute_modules=["layernorm"], training__activation_recompute="none"))
    with pytest.raises(ValueError, match="mla_up_proj"):
        parse_profile(example_with(training__recompute_modules=["mla_up_proj"], training__activation_recompute="selective"))
    with pytest.raises(ValueError, match="recompute_modules"):
        parse_profile(example_with(training__recompute_modules=["everything"], training__activation_recompute="selective"))
    with pytest.raises(ValueError, match="moe_act and moe need a mixture-of-experts"):
        parse_profile(example_with(training__recompute_modules=["moe_act"], training__activation_recompute="selective"))
    with pytest.raises(ValueError, match="delayed"):
        parse_profile(example_with(training__recompute_modules=["layernorm"], training__activation_recompute="selective",
                                   training__fp8=True, training__fp8_recipe="delayed", cluster__gpu="H100-SXM"))
    with pytest.raises(ValueError, match="fp8_activation_cache"):
        parse_profile(example_with(training__fp8_activation_cache=True))
    ok = parse_profile(example_with(training__recompute_modules=["layernorm", "mlp"], training__activation_recompute="selective"))
    assert ok.training.recompute_modules == ["layernorm", "mlp"]


def test_activation_storage_follows_the_frameworks():
    """A dense layer (flash, SwiGLU, no dropout): 2 e sbh of norm inputs, 2 e sbh of norm outputs (the QKV and
    MLP inputs), q k v, the projection input e sbh, the MLP's tensors of s b f: 4 in PyTorch's unfused SwiGLU,
    3 in Megatron's fused one. fp8 GEMMs alone keep the inputs 16-bit (torchao saves the high-precision input;
    Megatron under current scaling has the output projection save its bf16 input); DeepSeek-V3's activation cache
    keeps linear inputs at 1 byte and the attention output at 1.5 (E5M6). Megatron's layernorm module does
    nothing on a dense non-MLA layer (Transformer Engine fuses its norms into the next linear layer); mlp drops
    the MLP's tensors; selective without core_attn keeps flash's statistics."""
    from preflight.models import memory as M

    base = dict(params=7e9, layers=32, hidden=4096, heads=32, vocab=32000, seq_len=4096, mlp="swiglu",
                ffn_hidden=11008, dropout=0.0, attention="flash")
    s, h, f = 4096, 4096, 11008

    def parts(**kw):
        return {n: b for n, b, _ in M.layer_parts(M.Plan(**(base | kw)))}

    bf16, fp8 = parts(), parts(fp8=True)
    assert bf16 == fp8
    assert bf16["norm inputs (2)"] == 2 * 2 * s * h
    assert bf16["QKV input (input norm output)"] == bf16["MLP input (pre-MLP norm output)"] == 2 * s * h
    mlp = next(k for k in bf16 if k.startswith("MLP ("))
    assert bf16[mlp] == 4 * 2 * s * f
    meg = parts(framework="megatron")
    assert meg[next(k for k in meg if k.startswith("MLP ("))] == 3 * 2 * s * f
    cache = parts(fp8=True, fp8_activation_cache=True)
    assert cache["QKV input (input norm output)"] == 1 * s * h
    assert cache["attention output (projection input)"] == 1.5 * s * h
    assert cache[mlp] == (3 * 2 + 1) * s * f
    assert parts(recompute="selective", recompute_modules=("core_attn", "layernorm")) == parts(recompute="selective")
    sel = parts(recompute="selective", recompute_modules=("mlp",))
    assert not any(n.startswith("MLP (") for n in sel)
    assert "softmax statistics (fp32 logsumexp)" in sel and "softmax statistics (fp32 logsumexp)" not in parts(
        recompute="selective")
    mla = parts(qk_head_dim=192, v_head_dim=128)
    assert mla["q, k, v (MLA widths)"] == 2 * s * 32 * (2 * 192 + 128)
    assert mla["attention output (projection input)"] == 2 * s * 32 * 128


def _dense(**kw):
    from preflight.models import throughput as T
    return T.Model(**(dict(params=7e9, layers=32, hidden=4096, seq_len=4096, vocab=32000, ffn_hidden=11008,
                           swiglu=True, causal_flash=True) | kw))


def _h100(**kw):
    from preflight.models import throughput as T
    return T.Cluster(**(dict(peak_tflops=989.5, gpus_per_node=8, intra_node_GBps=450, inter_node_Gbps=400,
                             nics_per_node=8, chip="H100-SXM", memory_GBps=3350.0) | kw))


def _lay(**kw):
    from preflight.models import throughput as T
    return T.Layout(**(dict(tp=1, pp=1, dp=1, zero_stage=0, activation_recompute="none", sequence_parallel=False,
                            micro_batch_size=1, microbatches=1) | kw))


def test_fp8_speeds_the_math_not_the_shape_overhead():
    """(1 + H0/h) / (1/g + H0/h): the full peak ratio for an infinitely wide GEMM, nothing for a vanishing one,
    monotone between; no gain without fp8."""
    from preflight.models import throughput as T

    assert T.fp8_gemm_speedup(2.0, 1e12) == pytest.approx(2.0, rel=1e-6)
    assert T.fp8_gemm_speedup(2.0, 1e-6) == pytest.approx(1.0, rel=1e-6)
    gains = [T.fp8_gemm_speedup(2.0, h) for h in (1024, 4096, 16384)]
    assert gains == sorted(gains) and 1.0 < gains[0] < gains[-1] < 2.0
    assert T.fp8_gemm_speedup(1.0, 4096) == 1.0
    h0 = T.GEMM_HIDDEN_HALF
    assert T.fp8_gemm_speedup(2.0, 4096) == pytest.approx((1 + h0 / 4096) / (0.5 + h0 / 4096))


def test_elementwise_passes_are_memory_bound_and_split_as_megatron_splits_them():
    """Elementwise bytes per token and layer at the HBM bandwidth: the norms and residuals split over tp only with
    sequence parallelism, the activation always; the backward twice the forward, full recompute once more; none
    when a measured efficiency is given (it already holds them); MoE rows grow with k."""
    from preflight.models import throughput as T

    rows, act = T.elementwise_elements(4096, 11008, True)
    assert (rows, act) == (10 * 4096, 3 * 11008)
    assert T.elementwise_elements(4096, 11008, False)[1] == 2 * 11008
    assert T.elementwise_elements(2048, 768, True, top_k=8)[0] == 10 * 2048 + 2 * 9 * 2048
    m, c = _dense(), _h100()
    step = lambda **kw: T.step_time(_lay(**kw), model=m, cluster=c).compute_s
    no_mem = lambda **kw: T.step_time(_lay(**kw), model=m, cluster=_h100(memory_GBps=None)).compute_s
    per = 4096 * T.ELEMENT_BYTES / (3350e9 * T.CAST_BANDWIDTH_SHARE)
    el = (rows + act) * per * 32                                       # one micro-batch, 32 layers, fwd
    assert step() - no_mem() == pytest.approx(3 * el, rel=1e-6)        # forward + backward (2x)
    assert step(activation_recompute="full") - no_mem(activation_recompute="full") == pytest.approx(4 * el, rel=1e-6)
    tp_el = (rows + act / 2) * per * 32
    assert step(tp=2) - no_mem(tp=2) == pytest.approx(3 * tp_el, rel=1e-6)
    assert step(tp=2, sequence_parallel=True) - no_mem(tp=2, sequence_parallel=True) == pytest.approx(
        3 * (rows + act) / 2 * per * 32, rel=1e-6)
    measured = T.step_time(_lay(), model=m, cluster=c, efficiency=0.5).compute_s
    assert measured == T.step_time(_lay(), model=m, cluster=_h100(memory_GBps=None), efficiency=0.5).compute_s


def test_selective_recompute_charges_its_modules():
    """Megatron's default (None) recomputes core attention; [] nothing; mlp the dense MLP's forward again;
    mla_up_proj MLA's up projections (DeepSeek-V3: 2 x 128 x (1536 x 192 + 512 x (192 - 64 + 128)) FLOPs a token)."""
    from preflight.models import throughput as T

    m = _dense()
    attn = 2.0 * m.attention_width * 4096 * 0.5
    assert T.selective_flops(m, None) == pytest.approx(attn)
    assert T.selective_flops(m, ()) == 0.0
    assert T.selective_flops(m, ("mlp",)) == pytest.approx(2 * 3 * 4096 * 11008)
    mla = _dense(hidden=7168, heads=128, qk_head_dim=192, v_head_dim=128, q_lora_rank=1536, kv_lora_rank=512,
                 qk_rope_head_dim=64)
    assert T.selective_flops(mla, ("mla_up_proj",)) == pytest.approx(2 * 128 * (1536 * 192 + 512 * (192 - 64 + 128)))
    c = _h100()
    t = lambda mods: T.step_time(_lay(activation_recompute="selective", recompute_modules=mods), model=m,
                                 cluster=c).compute_s
    assert t(()) < t(None) < t(("core_attn", "mlp"))
    assert t(()) == pytest.approx(T.step_time(_lay(), model=m, cluster=c).compute_s)


def test_an_unknown_chip_gets_no_shape_corrections():
    """A chip of no calibrated generation runs at DEFAULT_EFFICIENCY with no shape term: fp8's gain is then the
    peaks' ratio and the experts get no shape correction, exactly as when that efficiency is given."""
    from preflight.models import moe as MOE
    from preflight.models import throughput as T

    m = _dense(matmul_speedup=2.0, experts=MOE.Experts(experts=64, top_k=8, expert_ffn=1024, moe_layers=32),
               params=30e9)
    unknown = _h100(chip=None, memory_GBps=None)
    lay = _lay(ep=8, dp=8)
    assert T.step_time(lay, model=m, cluster=unknown).compute_s == pytest.approx(
        T.step_time(lay, model=m, cluster=unknown, efficiency=T.DEFAULT_EFFICIENCY).compute_s)
    known = _h100(memory_GBps=None)
    assert T.step_time(lay, model=m, cluster=known).compute_s != pytest.approx(
        T.step_time(lay, model=m, cluster=known, efficiency=T.gemm_efficiency("H100-SXM", 4096)).compute_s)
