"""Chapter 4, load balance: padding waste of the profile's sample lengths, the pipeline bubble of its
plan (``preflight.models.pipeline`` / ``padding``), and the measured bucketing speedup, pipeline
bubble and partition gain, as findings.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from preflight.chapters import step as S
from preflight.core.findings import FindingSink, judge
from preflight.core.numfmt import factor, percent
from preflight.core.profile import Profile
from preflight.models import padding as PAD
from preflight.models import pipeline as P
from preflight.models import zerobubble as Z

PROFILE_SOURCE = "computed from profile"

# Thresholds (one home). Padding: a tenth of the tokens wasted is worth fixing, a third is the field
# case's order. Bubble: under 10 % of the step passes, which needs (p-1)/(m+p-1) < 0.1, i.e. m > 9 (p-1)
# micro-batches (or interleaving); GPipe's rule of thumb m >= 4 p leaves (p-1)/(5p-1) = 16-20 % (a warn);
# over 25 % wastes a quarter of every GPU in the pipeline.
PADDING_WARN, PADDING_FAIL = 0.10, 0.30
BUBBLE_WARN, BUBBLE_FAIL = 0.10, 0.25
PADDING_BATCH = 16               # samples per batch for the padding estimate
PADDING_SAMPLES = 20_000         # lognormal sample drawn from the profile's median / sigma
N_BUCKETS = 16                   # length buckets, as preflight.toolkit.sampling.LengthBucketSampler's default


def lengths(profile: Profile, profile_path: str | Path | None = None):
    """The profile's sample lengths: its lengths_file (relative to the profile) or a lognormal draw
    with its median and sigma, clipped to model.seq_len."""
    d = profile.data
    if d.lengths_file:
        path = Path(d.lengths_file)
        if not path.is_absolute() and profile_path:
            path = Path(profile_path).resolve().parent / path
        return PAD.load_lengths(path)
    return PAD.lognormal_lengths(PADDING_SAMPLES, median=d.length_median, sigma=d.length_sigma,
                                 max_len=profile.model.seq_len, seed=0)


STRAGGLER_WARN, STRAGGLER_FAIL = 0.05, 0.15     # expected step time lost to the slowest rank
JITTER_SCENARIOS = (0.01, 0.02, 0.05)


def add_straggler_finding(sink: FindingSink, profile: Profile, gpu_key: str | None = None) -> None:
    """``load_balance/straggler_slowdown``: a synchronous step lasts as long as its slowest rank
    (``preflight.models.stragglers``): ``1 + cv E[max of N]`` with the profile's per-rank jitter, judged;
    without it, what 1, 2 and 5 % would cost at this many GPUs (info)."""
    from preflight.models import stragglers as ST

    n, cv = profile.gpus, profile.training.step_jitter_cv
    e = ST.expected_max_normal(n)
    scen = ", ".join(f"{c:.0%} -> +{ST.slowdown(n, c) - 1:.1%}" for c in JITTER_SCENARIOS)
    words = judge(None, warn=STRAGGLER_WARN, fail=STRAGGLER_FAIL, higher_is_better=False, fmt="{:.0%}")[1]
    if cv is None:
        sink.add(id="load_balance/straggler_slowdown", value=None, unit="fraction", verdict="info", threshold=words,
                 message=("Not judged: one GPU waits for no other rank." if n == 1 else
                           f"Not judged (training.step_jitter_cv is not set). Each step waits for the slowest of {n:,} "
                           f"ranks: per-rank jitter cv costs cv x {e:.2f} (the expected maximum of {n:,} normals); "
                           f"{scen}."),
                 fix="Measure the jitter: the traces' step spread (python -m preflight traces), or per-rank step times.",
                 source=PROFILE_SOURCE)
        return
    lost = ST.slowdown(n, cv) - 1
    v, words = judge(lost, warn=STRAGGLER_WARN, fail=STRAGGLER_FAIL, higher_is_better=False, fmt="{:.0%}")
    step_s, basis = S.step_seconds(profile, gpu_key)
    cost = f" On {basis}'s {step_s:.3g} s step that is {lost * step_s:.3g} s per step." if step_s else ""
    sink.add(id="load_balance/straggler_slowdown", value=lost, unit="fraction", verdict=v, threshold=words,
             message=(f"With {cv:.1%} per-rank step-time jitter each step waits for the slowest of {n:,} ranks: "
                      f"+{lost:.1%} (1 + cv x {e:.2f}); the same jitter on 8 ranks costs +{ST.slowdown(8, cv) - 1:.1%}."
                      + cost),
             fix=("Nothing to fix here." if v == "pass" else
                  "Find and fix the noisy ranks (trace audit: who arrives last; pin CPU threads, check clocks and "
                  "thermals), or shrink the barrier's reach (fewer synchronous points per step)."),
             source=PROFILE_SOURCE)


BUSIEST_WARN, BUSIEST_FAIL = 1.10, 1.25     # the busiest expert-parallel rank's wait over the mean


def add_busiest_expert_finding(sink: FindingSink, profile: Profile, gpu_key: str | None = None) -> None:
    """``load_balance/busiest_expert``: a MoE layer waits for its busiest expert-parallel rank
    (``preflight.models.moe.busiest_rank_load``), with the capacity factor's cap and drops; its cost on the
    plan's step model (the experts' share of compute, slowed by that factor)."""
    from preflight.models import moe

    m, t = profile.model, profile.training
    e = m.expert_spec
    if e is None or t.ep <= 1:
        return
    tokens = t.micro_batch_size * m.seq_len / t.cp
    b = moe.busiest_rank_load(tokens, t.ep, e.top_k, t.moe_capacity_factor)
    v, words = judge(b["wait"], warn=BUSIEST_WARN, fail=BUSIEST_FAIL, higher_is_better=False, fmt="{:.3g}x")
    ps = S.plan_step(profile, gpu_key)
    share = e.top_k * e.mlp_params(m.hidden) * e.moe_layers / max(1.0, m.active_params - 2 * m.vocab * m.hidden)
    cost = "" if ps is None else (f" On the plan's step model the experts are about {share:.0%} of the compute "
                                   f"({ps.terms['compute_s']:.3g} s): the wait costs about "
                                   f"{(b['wait'] - 1) * share * ps.terms['compute_s']:.3g} s per step.")
    cap = ("dropless (no capacity factor)" if t.moe_capacity_factor is None else
           f"capacity factor {t.moe_capacity_factor:g}: the busiest rank drops {b['dropped']:.1%} of its tokens")
    sink.add(id="load_balance/busiest_expert", value=b["wait"], unit="x", verdict=v,
             threshold=f"the busiest expert-parallel rank's work over the mean: {words}",
             message=(f"Each of the {t.ep} expert-parallel ranks receives {b['mean_tokens']:,.0f} token copies per layer "
                      f"and micro-batch on average (b s / cp x top-{e.top_k}); with routing balanced on average the "
                      f"busiest receives {b['load']:.3g}x that, and every rank waits for it ({cap}).{cost}"),
             fix=("Nothing to fix here." if v == "pass" else
                  "More tokens per rank (a larger micro-batch: the spread falls as 1/sqrt(tokens)), fewer "
                  "expert-parallel ranks, or a capacity factor that drops the excess (a quality cost); a balancing "
                  "loss or DeepSeek-V3's bias balances the mean, not this spread."),
             source="preflight.models.moe.busiest_rank_load on the profile")


def add_plan_findings(sink: FindingSink, profile: Profile, profile_path: str | Path | None = None,
                      gpu_key: str | None = None) -> pd.DataFrame:
    """Padding waste and pipeline bubble of the plan; returns the padding table."""
    lens = lengths(profile, profile_path)
    seq_len = profile.model.seq_len
    table = PAD.padding_table(lens, PADDING_BATCH, n_buckets=N_BUCKETS, seq_len=seq_len)
    table.attrs["packing"] = pack = PAD.packing(lens, seq_len, PADDING_BATCH, policy="split")
    by = dict(zip(table["strategy"], table["waste"]))
    in_batch = next(k for k in by if "batch" in k)
    in_dataset = next(k for k in by if "dataset" in k)
    bucket = next(k for k in by if "bucket" in k)
    batching = profile.data.batching
    mine = {"pad": in_batch, "bucket": bucket, "pack": PAD.PACKING["split"]}[batching]
    v, words = judge(by[mine], warn=PADDING_WARN, fail=PADDING_FAIL, higher_is_better=False, fmt="{:.0%}")
    src = "profile's lengths_file" if profile.data.lengths_file else (
        f"lognormal lengths, median {profile.data.length_median}, sigma {profile.data.length_sigma:g}, "
        f"max {profile.model.seq_len}")
    plan_words = {"pad": f"padding to the longest sample of each batch of {PADDING_BATCH}",
                  "bucket": f"length bucketing ({N_BUCKETS} buckets)",
                  "pack": f"packing into rows of {seq_len} tokens"}[batching]
    sink.add(id="load_balance/padding_waste", value=by[mine], unit="fraction", verdict=v, threshold=words,
             message=(f"The plan's batching (data.batching = {batching}), {plan_words}, wastes {percent(by[mine])} of "
                      f"the tokens computed ({src}). Padding to the longest sample of each batch of {PADDING_BATCH} "
                      f"wastes {percent(by[in_batch])}; padding to the longest in the dataset {percent(by[in_dataset])}; "
                      f"length bucketing ({N_BUCKETS} buckets) {percent(by[bucket])}. Packing into rows of {seq_len} "
                      f"tokens: {percent(by[PAD.PACKING['split']])} (samples cut at row ends), "
                      f"{percent(by[PAD.PACKING['best_fit']])} (whole samples, best fit), {percent(by[PAD.PACKING['next_fit']])} "
                      f"(whole samples, next fit); but a batch of {PADDING_BATCH} rows then holds "
                      f"{pack['samples_per_batch_min']}-{pack['samples_per_batch_max']} samples, not {PADDING_BATCH}, "
                      "and tokens attend across documents unless attention is masked per document (Llama 3 found such "
                      "masks of limited impact in standard pre-training, important for very long sequences)."),
             fix=("Nothing to fix here." if v == "pass" else
                  "Batch by length (preflight.toolkit.sampling.LengthBucketSampler) or pack sequences (data.batching: "
                  "pack) with document masks where cross-document attention matters (varlen / FlexAttention kernels; "
                  "Llama 3 found such masks of limited impact in standard pre-training; restart positions only with "
                  "absolute position embeddings); never pad to the dataset's maximum."), source=PROFILE_SOURCE)

    t = profile.training
    v_chunks = t.interleave if t.pipeline_schedule == "interleaved" else 1
    frac = P.bubble_fraction(t.pp, t.microbatches, v_chunks)
    over = P.bubble_over_ideal(t.pp, t.microbatches, v_chunks)
    wrong = P.wrong_bubble(t.pp, t.microbatches)
    zb = Z.bubble_equal_times(t.pp, t.microbatches)
    v, words = judge(frac, warn=BUBBLE_WARN, fail=BUBBLE_FAIL, higher_is_better=False, fmt="{:.0%}")
    ps = S.plan_step(profile, gpu_key)
    in_step = ("" if ps is None or t.pp == 1 else
               f" In the plan's step model the bubble is {ps.terms['bubble_s']:.3g} s of the {ps.step_s:.3g} s step "
               f"({ps.terms['bubble_s'] / ps.step_s:.1%}: the slowest stage, the one with the output layer, sets each "
               "slot, and exposed communication per slot idles with it).")
    plan = f"pp={t.pp}, m={t.microbatches}, {t.pipeline_schedule}" + (f", v={v_chunks}" if v_chunks > 1 else "")
    sink.add(id="load_balance/bubble_fraction", value=frac, unit="fraction", verdict=v, threshold=words,
             message=(f"{plan}: the pipeline idles (p-1)/(v m + p-1) = {frac:.1%} of the step"
                      + (" (no pipeline parallelism)." if t.pp == 1 else
                         f"; the field report's (p-1)/(m p) would say {wrong:.1%}, wrong: it divides the p-1 fill and "
                         "drain slots by p m, as if the step lasted p m slots of one stage. A zero-bubble "
                         f"schedule (ZB-H1, 1F1B's peak memory) would idle {zb:.1%} with equal forward, input- and "
                         "weight-gradient times, if splitting the backward costs nothing extra.")) + in_step,
             fix=("More micro-batches (under 10 % needs m > 9 (p-1); GPipe's m >= 4 p still leaves 16-20 %), an "
                  "interleaved schedule (v chunks per GPU divide the bubble by v), a zero-bubble schedule (ZB-H1: "
                  "about a third of 1F1B's bubble), or fewer stages."),
             source=PROFILE_SOURCE, terms=None if ps is None else {"bubble_s": ps.terms["bubble_s"], "step_s": ps.step_s})
    sink.add(id="load_balance/bubble_over_ideal", value=over, unit="fraction", verdict="info",
             threshold="recorded for reference (Narayanan et al. 2021's bubble time fraction)",
             message=f"{plan}: bubble time over ideal compute time (p-1)/(v m) = {over:.1%}.",
             fix="More micro-batches or interleaving.", source=PROFILE_SOURCE)
    add_straggler_finding(sink, profile, gpu_key)
    add_busiest_expert_finding(sink, profile, gpu_key)
    return table


def add_measured_findings(sink: FindingSink, padding, bubble, partition,
                          why_missing: str = "plan-only mode (no live measurement)") -> None:
    """``padding``: measured tokens/s per strategy; ``bubble``: measured vs formula bubble rows;
    ``partition``: predicted and measured gains (``preflight.runner.chapter.Measured`` or None each)."""
    sink.measured("load_balance/bucketing_speedup", padding, "x", lambda r: dict(
        value=r["bucketing_speedup"], verdict="info", threshold="recorded for reference (> 1: bucketing pays)",
        message=(f"Useful tokens/s of the reference Transformer's forward+backward (preflight.bench.padding): "
                 f"length bucketing is "
                 f"{factor(r['bucketing_speedup'])} pad-to-longest-in-batch and "
                 f"{factor(r['bucketing_speedup_vs_dataset'])} pad-to-longest-in-dataset."),
        fix="preflight.toolkit.sampling.LengthBucketSampler as the DataLoader's batch_sampler."),
        why_missing=why_missing, missing_fix="Batch by length.")
    sink.measured("load_balance/measured_bubble", bubble, "fraction", _bubble_finding,
                  why_missing=why_missing, missing_fix="Measure the pipeline's idle share per rank.")
    sink.measured("load_balance/partition_gain", partition, "x", lambda r: dict(
        value=r["measured_gain"], verdict="info", threshold="recorded for reference (> 1: partitioning by time pays)",
        message=(f"{r['p']} stages of the heterogeneous model: bottleneck by layer count "
                 f"{r['bottleneck_count_s'] * 1e3:.2f} ms vs by time {r['bottleneck_time_s'] * 1e3:.2f} ms, "
                 f"predicted gain {factor(r['predicted_gain'])}; measured throughput "
                 f"{r['throughput_count']:.1f} -> {r['throughput_time']:.1f} samples/s "
                 f"({factor(r['measured_gain'])})."),
        fix="Profile every layer, then split at the exact optimal contiguous boundaries."),
        why_missing=why_missing, missing_fix="Partition stages by profiled layer time, not by layer count.")


def _bubble_finding(results: dict) -> dict:
    """The measured bubble against the formula, at 1F1B's largest m that ran without oversubscription."""
    rows = pd.DataFrame(results["rows"])
    ok = rows[~rows["oversubscribed"].astype(bool)] if "oversubscribed" in rows else rows
    ok = ok if len(ok) else rows
    # the reference point: 1F1B (the schedule in use) at the largest m that ran without oversubscription
    pref = ok[ok["schedule"] == "1f1b"] if (ok["schedule"] == "1f1b").any() else ok
    ref = pref.sort_values(["p", "m"]).iloc[-1]
    parts = "; ".join(f"{x.schedule} p={int(x.p)} m={int(x.m)}: {x.measured_bubble:.1%} vs {x.formula:.1%}"
                      + (" (oversubscribed)" if bool(getattr(x, "oversubscribed", False)) else "")
                      for x in rows.itertuples())
    return dict(value=float(ref["measured_bubble"]), verdict="info",
                threshold="recorded for reference (against (p-1)/(v m + p-1))",
                message=(f"Measured idle share per rank of the reference pipeline (preflight.bench.pipeline; "
                         f"measured vs formula): {parts}. "
                         f"Error at p={int(ref['p'])}, m={int(ref['m'])}: {ref['measured_bubble'] - ref['formula']:+.1%}; "
                         "at large m the send/recv latency sets a floor the formula does not have."),
                fix="Trust the formula for small m; measure at large m.")
