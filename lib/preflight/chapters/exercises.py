"""The predict-then-measure exercises of each chapter (``preflight.chapters.predict``), on the learner's own
profile. Answers are computed by the library when checked: formulas of ``preflight.models`` or, where
a chapter passes its measurement, the number measured on this machine.

**No spoilers.** A question the chapter has already answered teaches nothing: the learner copies the
number. So each question is either asked before its answer appears (the fusion speedup is predicted
before it is measured), or asks about a configuration *next to* the profile's, one the chapter does
not show: a different file budget, gradient dtype and data-parallel size, pipeline depth, time span
or node count. The learner has to apply the formula the chapter taught, not read its result.
"""
from __future__ import annotations

import math

from preflight.chapters.predict import Exercise
from preflight.core.numfmt import factor, plural, sci
from preflight.core.profile import Profile, load_profile

GiB = 2 ** 30


def baseline(profile: Profile, fusion_speedup: float | None = None) -> dict[str, Exercise]:
    """Amdahl at 256 GPUs with half the profile's serial work (the chapter charts the profile's own), the
    model states under a sharding the profile does not use, and (when measured) the torch.compile speedup."""
    from preflight.chapters import step as S
    from preflight.models import scaling
    from preflight.models.states import STAGES, layout, state_rows

    t, c = profile.training, profile.cluster
    n, ts = 256, t.step_serial_s / 2          # the chapter shows the profile's Ts: ask about half of it
    _, tc, _ = S.slider_step(profile)         # the stated compute, else the step model's
    stage = 1 if 1 in STAGES[t.framework] else max(STAGES[t.framework])   # fsdp2 offers only ZeRO-3, ddp 0
    shard = c.gpus_per_node if c.gpus_per_node > 1 else 8
    if (t.zero_stage, t.shard_group) == (stage, "node"):   # the chapter shows that one: ask about two nodes
        shard *= 2
    rows = state_rows(t.framework, "mixed", stage, profile.model.params, shard, "params", t.grad_dtype,
                      t.gradient_as_bucket_view)
    per_param = layout(t.framework, "mixed", t.grad_dtype, t.gradient_as_bucket_view)
    sharded = [term for term, _, formula in rows if "sharded" in formula]
    ex = {
        "amdahl": Exercise(
            "amdahl", f"Each step has {t.step_serial_s:g} s of serial work and {tc:.3g} s that "
            f"parallelises. The team halves the serial work (to {ts:g} s). How many times faster than one GPU "
            f"can {n} GPUs then run it (strong scaling)?", "x",
            lambda: scaling.amdahl_speedup(ts, tc, n),
            f"Amdahl: (Ts + Tc) / (Ts + Tc/N). The serial part caps the speedup at 1 + Tc/Ts: halving Ts moves "
            f"the cap from {factor(scaling.amdahl_ceiling(t.step_serial_s, tc))} to "
            f"{factor(scaling.amdahl_ceiling(ts, tc))}. Removing serial work buys more than adding GPUs.",
            rel_tol=0.2, log=True),
        "model_states": Exercise(
            "model_states", f"A {profile.model.params / 1e9:g}B-parameter model trained with mixed-precision Adam "
            f"in the {t.framework} layout, no tensor or pipeline parallelism, with ZeRO stage {stage} sharding over "
            f"{shard} GPUs: how many GiB do weights + gradients + optimizer state take on each GPU?", "GiB",
            lambda: sum(b for _, b, _ in rows) / GiB,
            f"{t.framework}: {per_param[0]} bytes of weights + {per_param[1]} of gradients ({t.grad_dtype}) + "
            f"{per_param[2]} of optimizer state per parameter ({sum(per_param)} in all); ZeRO-{stage} divides the "
            f"{' and '.join(sharded)} by {shard}: " + " + ".join(f"{b / profile.model.params:.3g}" for _, b, _ in rows)
            + " bytes per parameter (preflight.models.states).", rel_tol=0.15),
    }
    ex["fp8"] = fp8(profile)
    if fusion_speedup:
        ex["fusion"] = fusion(fusion_speedup)
    return ex


def fp8(profile: Profile) -> Exercise:
    """fp8's real gain on the plan (chapter 1 asks it before its recipe table shows it), with the profile's
    recipe where the chip runs it, else Transformer Engine's delayed scaling; on H100 SXM where the plan's
    GPU has no fp8 (said in the question)."""
    from preflight.chapters import fp8_recipes as F

    subject, words = F.fp8_subject(profile)
    chip = F.chip_key(subject)
    recipe = profile.training.fp8_recipe if F.why_not(chip, profile.training.fp8_recipe) is None else "delayed"
    return Exercise(
        "fp8", f"The saying: fp8 doubles throughput (the fp8 peak is twice the bf16 one). Take {words}, one step in bf16 "
        f"and one with fp8 GEMMs ({recipe}: {F.RECIPE_WORDS[recipe]}). How many times faster is the fp8 step "
        "(step bf16 / step fp8)?", "x", lambda: F.gain(subject, recipe),
        "Only the linear layers' GEMMs run at the fp8 peak; attention's matmuls, norms, activations, communication "
        "and the serial part stay as they were (Amdahl on the GEMMs' share), and every GEMM operand is first cast "
        "to fp8, a memory-bound pass whose bytes depend on the recipe. torchtitan measured +28-29 % on Llama 3.1 8B "
        f"(H100); Megatron-Bridge {F.BRIDGE_DEEPSEEK[0]:g}-{F.BRIDGE_DEEPSEEK[1]:g}x on DeepSeek-V3. 2x holds for "
        "GEMMs alone, at large shapes, with their inputs already in fp8.", rel_tol=0.1, log=True)


def fusion(speedup: float | None = None, on_workload: bool = False) -> Exercise:
    """The torch.compile speedup of chapter 1: asked *before* it is measured (``speedup`` None: the
    question only), checked with the measured number. ``on_workload``: the profile's own model is
    measured instead of the reference block."""
    def answer() -> float:
        if not speedup:
            raise ValueError("the fusion speedup was not measured on this machine")
        return speedup
    what = ("your model's forward + backward" if on_workload else
            "a Linear-GELU-add-LayerNorm block's forward + backward")
    return Exercise(
        "fusion", f"torch.compile fuses the elementwise ops of {what} into fewer kernels. How many times "
        "faster than eager will the compiled version run on this machine?", "x", answer,
        "Memory-bound ops gain from fusion by not writing intermediates to memory; the gain is larger on a "
        "GPU, where those ops are a bigger share of the step.", rel_tol=0.2, log=True)


def files_within(seconds: float, storage: str) -> int:
    """The most files whose start-up listing on ``storage`` takes at most ``seconds`` (bisection over
    ``preflight.models.data.listing_time_s``, which is monotone in the file count)."""
    from preflight.models import data as D

    lo, hi = 0, 10 ** 13
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if D.listing_time_s(mid, storage) <= seconds:
            lo = mid
        else:
            hi = mid - 1
    return lo


LISTING_BUDGET_S = 60.0          # the start-up budget of chapter 2's listing question


def data_pipeline(profile: Profile) -> dict[str, Exercise]:
    """The file budget of one minute of listing (chapter 2 shows the listing time of the profile's
    count, not the count a time allows), and the workers for the 1.2x rule at given rates."""
    from preflight.models import data as D

    d = profile.data
    return {
        "listing": Exercise(
            "listing", f"Your start-up may spend at most {LISTING_BUDGET_S / 60:g} minute listing the dataset on "
            f"{D.storage_label(d.storage)} (one metadata operation per file, one client). How many files can the dataset have at "
            f"most (yours has {d.files:,})?", "files",
            lambda: float(files_within(LISTING_BUDGET_S, d.storage)),
            f"Per-file metadata latency on {D.storage_label(d.storage)} is {D.latency(d.storage).stat_s * 1e3:g} ms, "
            f"paid once per file by every process that lists them: {LISTING_BUDGET_S:g} s buys that many files, whatever their "
            "size. Shards of 256 MB hold tens of thousands of small samples each: the budget then counts shards.",
            rel_tol=0.5, log=True),
        "workers": Exercise(
            "workers", "The GPU consumes 2,000 samples/s and one loader worker preprocesses 600 samples/s. How "
            "many workers give the 1.2x supply headroom?", "workers", lambda: D.workers_needed(2000, 600),
            "ceil(1.2 x 2000 / 600) = 4: headroom absorbs jitter; fewer workers leave the GPU waiting.",
            rel_tol=0.01),
    }


OTHER_DTYPE = {"fp32": "bf16", "bf16": "fp32", "fp16": "fp32"}


def communication(profile: Profile) -> dict[str, Exercise]:
    """The profile's all-reduce with the other gradient dtype on twice the data-parallel ranks (the
    chapter shows the profile's own): bytes per rank, then the time."""
    from preflight.models import comm

    m, c, t = profile.model, profile.cluster, profile.training
    dtype, dp = OTHER_DTYPE[t.grad_dtype], 2 * profile.replicas
    from preflight.chapters import step as S

    serial_s, compute_s, _ = S.slider_step(profile)
    p = comm.allreduce_plan(m.params, dp, dtype, t.tp, t.pp, gpus_per_node=c.gpus_per_node,
                            intra_node_GBps=c.intra_node_GBps, inter_node_Gbps=c.inter_node_Gbps,
                            nics_per_node=profile.nics_per_node, microbatches=t.microbatches,
                            compute_s=compute_s, serial_s=serial_s)
    link = (f"With {plural(p.nics_per_node, 'NIC')} of {c.inter_node_Gbps:g} Gb/s per node and "
            f"{plural(p.ranks_per_node, 'rank')} of the group per node" if p.link == "inter-node" else
            f"Inside one node, at {c.intra_node_GBps:g} GB/s per GPU over NVLink")
    return {
        "a2a": a2a(profile),
        "volume": Exercise(
            "volume", f"Your plan with {dtype} gradients instead of {t.grad_dtype}, on twice the data-parallel "
            f"ranks (dp={dp} instead of {profile.replicas}): ring AllReduce of the {m.params / 1e9:g}B gradients. How many "
            "GB does each GPU send per step?", "GB", lambda: p.bytes_per_rank / 1e9,
            "2 (D-1)/D x the gradient bytes: every byte goes out twice (reduce-scatter, all-gather), nearly "
            f"independent of D; {comm.BYTES_PER_ELEMENT[dtype]} bytes per {dtype} gradient instead of "
            f"{comm.BYTES_PER_ELEMENT[t.grad_dtype]}.", rel_tol=0.2, log=True),
        "time": Exercise(
            "time", f"{link}, how many seconds does that AllReduce take if nothing overlaps it?", "s",
            lambda: p.time_s,
            "Gb/s are bits: divide by 8 for GB/s. NCCL's rings leave each node through one NIC per rank of the "
            "group there, so the bus bandwidth is that many NICs (bounded by NVLink); the ring also pays "
            "2 (D-1) latency steps. Dividing by one NIC (the flat arithmetic) holds only for one NIC per node. "
            "Compare the time with the compute per step: that ratio decides whether overlap matters.",
            rel_tol=0.3, log=True),
    }


def asked_node_limit(profile: Profile) -> int | None:
    """A node limit next to the plan's: the first of 2, 1, 3, ... that changes the network bytes (fewer than
    the top-k and the domains the experts span) and is neither the plan's nor the ladder's. None: none does
    (the experts sit inside one NVLink domain)."""
    from preflight.chapters import moe_tables as M

    t, k = profile.training, profile.model.expert_spec.top_k
    d = M.domains(profile, t.ep)
    shown = {t.moe_node_limit, M.ladder_limit(profile)}
    return next((n for n in (2, 1, *range(3, d)) if n < min(k, d) and n not in shown), None)


def a2a(profile: Profile) -> Exercise:
    """Chapter 3's all-to-all question: the network bytes of one MoE layer at a node limit the chapter does not
    show (:func:`asked_node_limit`), on the plan, or on DeepSeek-V3's where the plan has no experts across
    NVLink domains (said in the question)."""
    from preflight.chapters import moe_tables as M

    subject, words = M.moe_profile(profile)
    if asked_node_limit(subject) is None:
        subject = load_profile(M.EXAMPLE_MOE)
        words = f"DeepSeek-V3's pre-training (data/profiles/moe/deepseek-v3.yaml; {words}: its experts stay in one domain)"
    m, t = subject.model, subject.training
    lim, d = asked_node_limit(subject), M.domains(subject, t.ep)
    dispatch = "the forward dispatch in fp8, the rest bf16" if t.moe_dispatch_fp8 else "bf16 throughout"
    return Exercise(
        "a2a", f"Take {words}: ep={t.ep} expert-parallel GPUs over {d} NVLink domains, top-{m.expert_spec.top_k}, "
        f"{M.tokens_per_rank(subject):,.0f} tokens per GPU per micro-batch, hidden {m.hidden:,}, {dispatch}. With "
        f"node-limited routing at {lim} node{'s' * (lim > 1)} per token (the plan: "
        f"{t.moe_node_limit or 'no limit'}), how many MB does each GPU send across the network in one MoE layer's "
        "all-to-alls of one micro-batch (dispatch and combine, forward and backward)?", "MB",
        lambda: M.a2a_row(subject, node_limit=lim)["network_MB"],
        f"A token's copies leave its domain with probability (d-1)/d = {d - 1}/{d}; node-limited routing sends it "
        f"once to each of at most min(k, M) remote domains and forwards it there over NVLink: min(k, M) (d-1)/d "
        "network copies. Each all-to-all moves tokens x h x copies x bytes per value (fp8 dispatch 1 + 4/128, bf16 2); "
        "four per layer, six with full recompute (preflight.models.moe.a2a_layer).", rel_tol=0.3, log=True)


GRID_P, GRID_M = (2, 4, 8), (4, 8, 16, 32)       # the (p, m) of chapter 4's bubble table


def asked_pipeline(profile: Profile) -> tuple[int, int]:
    """``(p, m)`` of chapter 4's bubble questions: a pipeline the chapter does not show. Its Gantt chart
    draws the profile's ``(pp, microbatches)`` when pp > 1, else p=4, m=8, and its table every p in
    ``GRID_P`` with every m in ``GRID_M``. The question keeps the chart's m and takes the first depth
    from two stages more whose bubble (p-1)/(m+p-1) is none of those shown (5/20 would repeat the
    table's 1/5)."""
    from preflight.models import pipeline as P

    t = profile.training
    p, m = (t.pp, t.microbatches) if t.pp > 1 else (4, 8)
    shown = {round(P.bubble_fraction(a, b), 3) for a in GRID_P for b in GRID_M} | {round(P.bubble_fraction(p, m), 3)}
    q = p + 2
    while q in GRID_P or round(P.bubble_fraction(q, m), 3) in shown:
        q += 1
    return q, m


def load_balance(profile: Profile) -> dict[str, Exercise]:
    from preflight.models import pipeline as P

    p, m = asked_pipeline(profile)
    under = next(k for k in range(1, 1_000_000) if P.bubble_fraction(p, k) < 0.10)
    return {
        "busiest": busiest(profile),
        "bubble": Exercise(
            "bubble", f"A pipeline of p={p} stages runs m={m} micro-batches per step (1F1B). What share of the step "
            "does each GPU sit idle in the bubble?", "%", lambda: 100 * P.bubble_fraction(p, m),
            f"(p-1)/(m+p-1) = {p - 1}/{m + p - 1}: the field report's (p-1)/(m p) = {100 * P.wrong_bubble(p, m):.3g} % "
            "divides the fill and drain by the wrong length. More micro-batches or interleaving shrink it.",
            rel_tol=0.15),
        "bubble_m": Exercise(
            "bubble_m", "Same pipeline: how many micro-batches m bring the bubble under 10 %?", "micro-batches",
            lambda: float(under),
            f"(p-1)/(m+p-1) < 0.1 needs m > 9(p-1) = {9 * (p - 1)}: GPipe's rule of thumb m >= 4p ({4 * p} here) "
            f"still leaves {p - 1}/{5 * p - 1} = {100 * P.bubble_fraction(p, 4 * p):.3g} %, and (p-1)/(5p-1) tends "
            "to 20 % for deep pipelines.", rel_tol=0.15),
    }


def busiest(profile: Profile) -> Exercise:
    """Chapter 4's capacity-factor question: the fewest tokens per rank at which a capacity factor drops nothing
    (the chapter shows the load at given tokens, not the tokens a load allows), on the plan or DeepSeek-V3's."""
    from preflight.chapters import moe_tables as M

    subject, words = M.moe_profile(profile)
    t, e = subject.training, subject.model.expert_spec
    c = 1.2 if t.moe_capacity_factor == 1.1 else 1.1
    return Exercise(
        "busiest", f"Take {words}: {t.ep} expert-parallel ranks, top-{e.top_k}, routing balanced on average, "
        f"{M.tokens_per_rank(subject):,.0f} tokens per rank per micro-batch. A capacity factor of {c:g} drops what a "
        f"rank receives beyond {c:g}x the mean. Down to how few tokens per rank does the busiest rank drop nothing?",
        "tokens", lambda: M.tokens_for_load(c, t.ep, e.top_k),
        f"The busiest of ep ranks receives 1 + sqrt(2 ln ep) / sqrt(tokens x k) times the mean (a binomial maximum; "
        f"a balanced router balances the mean, not this spread): it stays under {c:g} while tokens >= 2 ln ep / "
        f"(k ({c:g} - 1)^2). The spread falls as 1/sqrt(tokens): small micro-batches (or many ranks) make the "
        "busiest rank wait, or drop.", rel_tol=0.3, log=True)


WEEK_DAYS = 7
FIELD_P_NODE_DAY = 1e-4       # the field report's rate, asked about when the profile assumes no failures


def week_nodes(rate: float) -> int:
    """Nodes whose week holds about half an expected failure at ``rate`` (the answer lands near 40 %, far
    from the chapter's own day and run figures, and from 0 or 100 %)."""
    return max(1, round(0.5 / (rate * WEEK_DAYS)))


def fault_tolerance(profile: Profile) -> dict[str, Exercise]:
    """Failure odds over a week (the chapter shows a day and the whole run), and the checkpoint interval
    on twice the nodes (the chapter shows the profile's)."""
    from preflight.models import resilience as R

    c, t = profile.cluster, profile.training
    rate = c.node_failure_per_day or FIELD_P_NODE_DAY
    nodes = 2 * c.nodes
    mtbf_s = R.system_mtbf_h(c.node_failure_per_day, nodes) * 3600
    small = week_nodes(rate)
    ex = {
        "day": Exercise(
            "day", f"A team reserves {small:,} nodes for a week ({WEEK_DAYS} days); each fails with probability "
            f"{sci(rate)} on a given day. What is the probability that at least one fails within the week?", "%",
            lambda: 100 * R.failure_prob(rate, small, WEEK_DAYS),
            f"1 - (1 - p)^(N days): what counts is node-days ({small * WEEK_DAYS:,} here), so small per-node "
            "odds add up over nodes and days alike.", rel_tol=0.2, log=True),
    }
    if math.isfinite(mtbf_s):
        ex["interval"] = Exercise(
            "interval", f"Writing a checkpoint takes {t.checkpoint_write_s:g} s. The run grows to twice the nodes "
            f"({nodes:,} instead of {c.nodes:,}), same failure rate per node. How many hours between checkpoints "
            "minimise the expected waste?", "h",
            lambda: R.daly_interval(t.checkpoint_write_s, mtbf_s) / 3600,
            f"Twice the nodes halve the system MTBF (to {mtbf_s / 3600:,.0f} h); Young's sqrt(2 C M) then shrinks "
            "by sqrt(2), not by 2. Daly refines it when C is not small against M. The waste curve is flat near "
            "its minimum, so anything within a factor of ~1.5 costs little.", rel_tol=0.5, log=True)
    return ex
