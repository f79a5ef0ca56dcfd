"""Chapter 1, baseline before scale: the findings.

Plan findings come from the profile alone (formulas of ``preflight.models``); measured findings
come from the live (or recorded) single-device baseline, ceilings and fusion measurements.
"""
from __future__ import annotations

import pandas as pd

from preflight.chapters import step as S
from preflight.core import hardware
from preflight.core.findings import FindingSink, judge
from preflight.core.numfmt import factor, percent, plural
from preflight.core.profile import Profile
from preflight.models import flops, scaling
from preflight.models.extrapolate import STOP_RULE_EFFICIENCY, scaling_curve

PROFILE_SOURCE = "computed from profile"

# Thresholds (one home). MFU: the field case ran under 30 % on one GPU; well-tuned LLM training
# reaches 40-55 % on H100-class chips. Memory-bound share: the field case had ~45 % in GELU and
# LayerNorm. Efficiency: the staged method's stop rule is 60 %; under 80 % deserves a look.
MFU_WARN, MFU_FAIL = 0.40, 0.30
MEMBOUND_WARN, MEMBOUND_FAIL = 0.25, 0.40
EFFICIENCY_WARN = 0.80
MEMORY_WARN, MEMORY_FAIL = 0.85, 0.95      # peak / device memory: fragmentation and spikes need room
# Amdahl ceiling against the target GPU count N: >= 2N keeps strong-scaling efficiency near 2/3.
AMDAHL_PASS_FACTOR, AMDAHL_FAIL_FACTOR = 2, 1
# Implied MFU of the plan's own step: above 100 % of the dense peak the numbers are impossible; above
# 60 % they are better than published large-scale runs (Llama 3: 38-43 % on H100; MegaScale 55 %).
# Fail above what a matmul really reaches: the best GEMMs run at about 80 % of the dense peak on H100
# (cuBLAS large bf16 GEMMs; chapter 1's measured matmul ceiling is the machine's own figure), so a plan
# implying more is impossible, not only one implying more than 100 %.
IMPLIED_MFU_WARN, IMPLIED_MFU_FAIL = 0.60, 0.80
STATED_RATIO_WARN, STATED_RATIO_FAIL = S.STATED_RATIO_WARN, S.STATED_RATIO_FAIL


def serial_parallel(profile: Profile, gpu_key: str | None = None) -> tuple[float, float]:
    """(serial, parallel work) of the step for Amdahl: one GPU's (weak scaling), or the work all GPUs share
    (strong scaling: the stated figure, or the predicted per-GPU compute times the GPUs)."""
    t = profile.training
    serial, compute, _ = S.gpu_step(profile, gpu_key)
    return serial, compute * (profile.gpus if t.scaling == "strong" else 1)


def plan_curve(profile: Profile, measured: dict[int, float] | None = None, gpu_key: str | None = None) -> pd.DataFrame:
    """The staged scaling curve of the profile: each stage timed by the one step model
    (``preflight.chapters.step.stage_curve``). Where the GPU has no known peak (``gpu: auto`` on a CPU) the
    model cannot time compute: then the ring arithmetic of ``preflight.models.extrapolate`` on the stated
    step, labelled so."""
    curve = S.stage_curve(profile, _key(profile, gpu_key), measured)
    if curve is not None:
        return curve
    t, c = profile.training, profile.cluster
    serial, compute, basis = S.slider_step(profile, gpu_key)    # the stated step (else a nominal one, said)
    out = scaling_curve(serial_s=serial, compute_s=compute * (profile.gpus if t.scaling == "strong" else 1),
                        params=profile.model.params, grad_dtype=t.grad_dtype, tp=t.tp, pp=t.pp,
                        gpus_per_node=c.gpus_per_node, intra_node_GBps=c.intra_node_GBps,
                        inter_node_Gbps=c.inter_node_Gbps, target_gpus=profile.gpus, measured=measured,
                        scaling=t.scaling, nics_per_node=profile.nics_per_node, microbatches=t.microbatches)
    out["source"] = out["source"].where(out["source"] == "measured", f"ring arithmetic on {basis.split(' (')[0]} step "
                                        "(GPU peak unknown)")
    return out


def chart_step(profile: Profile, gpu_key: str | None = None) -> tuple[float, float, str]:
    """(serial, parallel work, basis) the chapter's Amdahl chart and sliders start from: the plan's step
    (:func:`serial_parallel`), else a nominal one, labelled (``step.slider_step``)."""
    serial, compute, basis = S.slider_step(profile, gpu_key)
    return serial, compute * (profile.gpus if profile.training.scaling == "strong" else 1), basis


def _key(profile: Profile, gpu_key: str | None) -> str | None:
    return gpu_key if gpu_key is not None else (None if profile.cluster.gpu == "auto" else profile.cluster.gpu)


def implied_mfu(profile: Profile, gpu_key: str | None) -> dict:
    """The MFU the plan's step implies: one GPU's training FLOPs per step over its compute time.

    ``(6N + 12 L h s) x microbatches x micro_batch_size x seq_len / (tp pp cp)`` FLOPs (``models.flops``)
    in ``compute_s`` (one GPU's: the stated ``training.step_compute_s``, else the step model's prediction;
    ``basis`` says which) against the chip's dense bf16 peak. ``mfu`` is None when the chip has no known
    peak."""
    m, t = profile.model, profile.training
    per_token = flops.train_flops_per_token(m.active_params, m.layers, m.hidden, m.seq_len)   # MoE: active
    tokens = t.microbatches * t.micro_batch_size * m.seq_len
    step_flops = per_token * tokens / (t.tp * t.pp * t.cp)       # cp GPUs share each sequence
    _, compute_s, basis = S.gpu_step(profile, gpu_key)
    peak = hardware.peak_tflops(gpu_key, "bf16")
    # The executed-work reading: N from the layer shapes without the input lookup (an embedding costs no
    # matmul; the output layer does), attention causal (a flash kernel skips the masked half).
    from preflight.models import states as ST

    shape_n = ST.model_params(m.layers, m.hidden, m.n_heads, m.vocab, m.kv_heads, m.ffn_hidden, m.mlp,
                              tied_embeddings=True) if not m.experts else m.active_params - m.vocab * m.hidden
    executed = (6.0 * shape_n + 6.0 * m.layers * m.hidden * m.seq_len) * tokens / (t.tp * t.pp * t.cp)
    return {"flops_per_token": per_token, "tokens_per_replica": tokens, "step_flops": step_flops,
            "compute_s": compute_s, "basis": basis, "peak_tflops": peak, "mfu": flops.mfu(step_flops / compute_s, peak),
            "shape_params": shape_n, "mfu_executed": flops.mfu(executed / compute_s, peak)}


def _times(k: float) -> str:
    return {1: "once", 2: "twice"}.get(k, f"{k:g} times")


def _speedup_judge(speedup: float, n: int) -> tuple[str, str]:
    """A speedup at ``n`` GPUs judged on its efficiency S(N)/N, the bounds written as speedups (the
    number shown is the one the threshold speaks about)."""
    v, words = judge(speedup, warn=EFFICIENCY_WARN * n, fail=STOP_RULE_EFFICIENCY * n, fmt="{:,.4g}x")
    return v, (f"{words} (efficiency S(N)/N {EFFICIENCY_WARN:.0%} and {STOP_RULE_EFFICIENCY:.0%} of the "
               f"{n:,} target GPUs)")


def add_plan_findings(sink: FindingSink, profile: Profile, curve: pd.DataFrame,
                      gpu_key: str | None = None) -> None:
    """Scaling law, implied MFU and the staged curve at the target. ``gpu_key``: the hardware-table key of
    the profile's GPU (``Chapter.gpu_key``); default the profile's, unknown for ``auto``."""
    gpu_key = _key(profile, gpu_key)
    ps = S.plan_step(profile, gpu_key)
    if ps is not None:
        add_step_findings(sink, profile, ps)
    add_defaults_finding(sink, profile)
    try:
        ts, tc = serial_parallel(profile, gpu_key)
    except S.NoStepError as err:
        for fid, unit in (("baseline/amdahl_max_speedup", "x"), ("baseline/amdahl_speedup_at_target", "x"),
                          ("baseline/gustafson_speedup_at_target", "x"), ("baseline/implied_mfu", "fraction"),
                          ("baseline/scaling_efficiency_at_target", "fraction")):
            sink.add(id=fid, value=None, unit=unit, verdict="info", threshold="not judged: no step", message=str(err),
                     fix="Set training.step_compute_s (one GPU's measured compute per step), or name the GPU "
                         "(cluster.gpu) so the step model predicts it.", source=PROFILE_SOURCE)
        return
    n = profile.gpus
    weak = profile.training.scaling == "weak"
    decides = "decides" if not weak else "info: the profile scales weakly (training.scaling: weak)"
    ceiling = scaling.amdahl_ceiling(ts, tc)
    verdict, words = judge(ceiling, warn=AMDAHL_PASS_FACTOR * n, fail=AMDAHL_FAIL_FACTOR * n, fmt="{:g}x")
    bound = "without bound (no serial part)" if ceiling == float("inf") else f"more than {factor(ceiling)} faster"
    sink.add(id="baseline/amdahl_max_speedup", value=ceiling, unit="x", verdict="info" if weak else verdict,
             threshold=f"{words} ({_times(AMDAHL_PASS_FACTOR)} and {_times(AMDAHL_FAIL_FACTOR)} the {n:,} target GPUs); "
                       f"{decides}",
             message=(f"If this step ({ts:g} s serial, {tc:g} s parallel) were a fixed amount of work, no number of "
                      f"GPUs could run it {bound} (Amdahl, 1 + Tc/Ts)."
                      + (" The plan keeps the per-GPU batch instead, so Gustafson's law applies "
                         "(baseline/gustafson_speedup_at_target)." if weak else "")),
             fix="Find the serial points first (data waits, evaluation barriers, logging, sync points) and "
                 "make them parallel or asynchronous before optimising the parallel part.",
             source=PROFILE_SOURCE)

    s = scaling.amdahl_speedup(ts, tc, n)
    v, words = _speedup_judge(s, n)
    sink.add(id="baseline/amdahl_speedup_at_target", value=s, unit="x", verdict="info" if weak else v,
             threshold=f"{words}; {decides}",
             message=f"Strong scaling (fixed global batch) to {n} GPUs gives at most {factor(s)} ({s / n:.1%} "
                     f"efficiency) with this serial share ({scaling.serial_fraction(ts, tc):.1%}).",
             fix="Shrink the serial share per step, or scale the batch with the GPUs (weak scaling, "
                 "Gustafson) so the parallel part grows with N.",
             source=PROFILE_SOURCE)

    gs, gc, basis = S.gpu_step(profile, gpu_key)
    frac = scaling.serial_fraction(gs, gc)
    g = scaling.gustafson_speedup(frac, n)
    v, words = _speedup_judge(g, n)
    sink.add(id="baseline/gustafson_speedup_at_target", value=g, unit="x", verdict=v if weak else "info",
             threshold=f"{words}; " + ("decides (training.scaling: weak)" if weak else
                                                          "info: the profile scales strongly"),
             message=(f"With the per-GPU batch fixed, {n} GPUs do {n}x the work in one step; the serial "
                      f"{gs:g} s of each {gs + gc:.3g} s step ({frac:.1%}) costs the same share at every scale: "
                      f"N - s (N - 1) = {factor(g)} ({g / n:.1%} efficiency, Gustafson)."),
             fix="Make the serial part asynchronous (prefetch, async logging and checkpointing): at a fixed "
                 "per-GPU batch its share of every step is lost at every scale.",
             source=PROFILE_SOURCE)

    im = implied_mfu(profile, gpu_key)
    v, words = judge(im["mfu"], warn=IMPLIED_MFU_WARN, fail=IMPLIED_MFU_FAIL, higher_is_better=False, fmt="{:.0%}")
    stated = profile.training.step_compute_s is not None
    if not stated:          # the model's own prediction: nothing of the team's to check against the peak
        v, words = "info", f"not judged: no stated step (training.step_compute_s), the compute is predicted; {words}"
    t, m = profile.training, profile.model
    what = (f"{t.microbatches} x {t.micro_batch_size} x {m.seq_len} tokens at {im['flops_per_token'] / 1e9:.3g} "
            f"GFLOP per token (6N + 12 L h s) / ({'tp pp cp' if t.cp > 1 else 'tp pp'} = {t.tp * t.pp * t.cp}) = "
            f"{im['step_flops'] / 1e12:.4g} TFLOP in "
            f"{im['compute_s']:.3g} s of compute ({im['basis']})")
    if im["mfu"] is None:
        msg = f"{what}; the chip's dense peak is unknown, so the plan cannot be checked against it."
    else:
        emb = 2 * m.vocab * m.hidden / m.params
        msg = (f"{what} = {im['mfu']:.0%} of the {im['peak_tflops']:g} TFLOP/s dense bf16 peak (convention: N "
               f"counts the input and output embeddings, {emb:.1%} of N, where Megatron's count leaves the input "
               "lookup out; 12 L h s counts attention non-causal, twice what a causal flash kernel runs; a "
               "mixture-of-experts counts its active parameters). Counted as the kernels execute it, N from the "
               f"layer shapes without the input lookup ({im['shape_params'] / 1e9:.3g}B) and attention causal "
               f"(6 L h s): {im['mfu_executed']:.0%}.")
        if v == "fail":
            msg += (" Beyond what any matmul reaches (about 80 % of the dense peak): revisit "
                    "training.step_compute_s (one GPU's compute per step at the target "
                    "layout), training.microbatches, training.micro_batch_size and model.seq_len.")
        elif v == "warn":
            msg += " Better than published large-scale runs reach (~40-55 %): check the step time."
    sink.add(id="baseline/implied_mfu", value=im["mfu"], unit="fraction", verdict=v, threshold=words,
             message=msg,
             fix="Measure one GPU's step at the planned micro-batch (chapter 1's baseline, on your chip) and put "
                 "that time in the profile.", source=PROFILE_SOURCE)

    at = curve[curve["gpus"] == n].iloc[-1]
    eff = float(at["efficiency"])
    v, words = judge(eff, warn=EFFICIENCY_WARN, fail=STOP_RULE_EFFICIENCY, fmt="{:.0%}")
    src = "measured on the cluster (record)" if at["source"] == "measured" else (
        "the plan's step model (preflight.chapters.step)" if ps is not None else PROFILE_SOURCE)
    if ps is not None:
        losses = {"bubble": ps.terms["bubble_s"], "communication": ps.exposed_comm_s}
        msg = (f"At {n:,} GPUs ({profile.training.scaling} scaling) the step model gives {ps.words()}: "
               f"{ps.scaling_efficiency:.0%} of the step is work; the pipeline bubble costs {losses['bubble']:.3g} s and "
               f"exposed communication {losses['communication']:.3g} s (data-parallel {ps.terms['dp_exposed_s']:.3g} s of "
               f"{ps.terms['dp_comm_s']:.3g} s; busbw {at['busbw_GBps']:.3g} GB/s, the field report's flat arithmetic "
               f"{at['flat_comm_s']:.3g} s for the all-reduce).")
        worst_loss = max(losses, key=losses.get)
    else:
        msg = (f"At {n} GPUs ({profile.training.scaling} scaling) a step spends {at['comm_s']:.3g} s in gradient "
               f"all-reduce (busbw {at['busbw_GBps']:.3g} GB/s) against {gs + gc:.3g} s of work per GPU "
               f"({basis}): {at['efficiency_no_overlap']:.0%} efficiency without overlap, "
               f"{at['efficiency_overlap']:.0%} if backward hides it (the GPU's peak is unknown, so the step model "
               "cannot time the other terms).")
        worst_loss = "communication"
    if at["source"] == "measured":
        msg += f" Measured on the cluster: {eff:.0%}, which decides."
    if v == "pass":
        fix = "Keep the staged method: measure each stage (8 -> 64 -> 512 GPUs) and compare with this curve."
    elif worst_loss == "bubble":
        fix = ("The pipeline bubble is the largest loss: more micro-batches per step, an interleaved or zero-bubble "
               "schedule, or fewer stages (chapter 4, load_balance/bubble_fraction).")
    else:
        fix = ("Exposed communication is the largest loss: overlap it with compute (DDP buckets, Megatron's "
               "--overlap-grad-reduce / --overlap-param-gather, FSDP2 prefetch), bf16 gradients, gradient "
               "accumulation, topology-aware groups (chapter 3, communication/exposed_comm_share).")
    sink.add(id="baseline/scaling_efficiency_at_target", value=eff, unit="fraction", verdict=v,
             threshold=words, message=msg, fix=fix, source=src)


def add_defaults_finding(sink: FindingSink, profile: Profile) -> None:
    """``baseline/defaults_used``: every default the plan's verdicts rest on where the profile is silent, and
    what each changes (``step.VERDICT_DEFAULTS``)."""
    used = S.defaults_used(profile)
    sink.add(id="baseline/defaults_used", value=len(used), unit="fields", verdict="info",
             threshold="recorded for reference: state these in the profile where you know better",
             message=("The profile states every field a verdict rests on." if not used else
                      "Defaults used: " + "; ".join(f"{k} = {'empty' if v is None else f'{v:g}'} ({what})"
                                                    for k, v, what in used) + "."),
             fix="State your own figures (measured step, failure rate, checkpoint cost, links, sample lengths): "
                 "`python -m preflight validate PROFILE` prints every field with the defaults filled in.",
             source=PROFILE_SOURCE)


def add_step_findings(sink: FindingSink, profile: Profile, ps: S.PlanStep) -> None:
    """``baseline/step_model``: the one predicted step, term by term (every chapter reads these terms); and
    ``baseline/stated_step_ratio`` where the profile states its compute: the team's figure over the model's."""
    t = profile.training
    sink.add(id="baseline/step_model", value=ps.step_s, unit="s", verdict="info",
             threshold="recorded for reference: the step every plan verdict rests on",
             message=(f"Predicted step of one GPU at tp={t.tp} pp={t.pp} dp={profile.dp}"
                      + (f" cp={t.cp}" if t.cp > 1 else "") + (f" ep={t.ep}" if t.ep > 1 else "")
                      + f": {ps.words()}; {ps.terms['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU, MFU "
                      f"{ps.terms['mfu']:.1%} (kernels at {ps.terms['efficiency']:.0%} of the bf16 peak: "
                      f"{S.EFFICIENCY_MODEL}). `advise` prints the same terms for this plan."),
             fix="Check it against your job: audit --traces DIR sets each term beside the same term measured.",
             source="the plan's step model (preflight.chapters.step)", terms=S.terms_of(ps))
    ratio = S.stated_ratio(ps)
    if ratio is None:
        return
    v, words = judge(ratio, warn=STATED_RATIO_WARN, fail=STATED_RATIO_FAIL, higher_is_better=False, fmt="{:.2g}x")
    low = ratio < 1 / STATED_RATIO_WARN
    if low:
        v = "warn"
    msg = (f"The profile states {ps.stated_compute_s:.3g} s of compute per GPU step; the model predicts "
           f"{ps.predicted_compute_s:.3g} s ({factor(ratio)}).")
    if ratio > STATED_RATIO_WARN:
        msg += " " + S.explain_gap(ps)
    elif low:
        msg += (" Faster than the model's kernels: check the stated figure (one GPU, the planned micro-batch, "
                "all its micro-batches) or measure the efficiency (advise --mfu-from AUDIT).")
    sink.add(id="baseline/stated_step_ratio", value=ratio, unit="x", verdict=v,
             threshold=f"stated / predicted compute: {words}; below {1 / STATED_RATIO_WARN:.2g}x warns",
             message=msg,
             fix=("Measure where the time goes: python -m preflight audit PROFILE --traces DIR (the plan-vs-trace "
                  "table names the term that departs most)." if v != "pass" else
                  "Nothing to do: the stated compute agrees with the model."),
             source="the profile's stated step against the plan's step model")


def measured_serial_parallel(composition: list[dict]) -> tuple[float, float]:
    """Serial and parallelisable seconds of a measured step: forward + backward split across
    data-parallel workers; data wait, optimizer step (replicated on every rank) and the rest do not."""
    by = {r["phase"]: r["seconds"] for r in composition}
    parallel = by.get("forward", 0.0) + by.get("backward", 0.0)
    serial = sum(v for k, v in by.items() if k not in ("forward", "backward"))
    return serial, parallel



CPU_NOT_JUDGED = "CPU fallback, not judged (thresholds are for GPUs); on a GPU: "


def add_measured_findings(sink: FindingSink, base, fusion,
                          why_missing: str = "plan-only mode (no live measurement)") -> None:
    """Findings from the baseline and fusion measurements (``preflight.runner.chapter.Measured`` or None).

    A measurement made on the CPU fallback is recorded with verdict ``info``: MFU and memory-bound
    thresholds are calibrated on GPUs, and a CPU's op mix says little about the project's GPUs."""
    mfu_words = judge(None, warn=MFU_WARN, fail=MFU_FAIL, fmt="{:.0%}")[1]
    mb_words = judge(None, warn=MEMBOUND_WARN, fail=MEMBOUND_FAIL, higher_is_better=False, fmt="{:.0%}")[1]
    fix_mfu = "Profile one device first; fuse memory-bound ops (torch.compile), check the data wait, then scale."
    fix_mb = "Fuse elementwise/normalisation ops (torch.compile, fused kernels) before adding GPUs."
    sink.measured("baseline/throughput", base, "tokens/s", _throughput_finding, why_missing=why_missing,
                  missing_fix="Run the audit in measure mode, or pass --results with a baseline record from your "
                              "cluster.")
    sink.measured("baseline/peak_memory", base, "bytes", lambda r: _peak_memory_finding(r, base.record),
                  why_missing=why_missing, missing_threshold="below the device memory", missing_fix=fix_mfu)
    sink.measured("baseline/mfu", base, "fraction", lambda r: _mfu_finding(r, fix_mfu), why_missing=why_missing,
                  missing_threshold=mfu_words, missing_fix=fix_mfu)
    # the profiler ran but saw no op time (e.g. no CUPTI): not measured, not a pass
    no_op_time = base is not None and base.results["memory_bound_share"] is None
    sink.measured("baseline/memory_bound_share", None if no_op_time else base, "fraction",
                  lambda r: _memory_bound_finding(r, fix_mb), missing_threshold=mb_words, missing_fix=fix_mb,
                  why_missing=((base.results.get("profile") or {}).get("reason", "torch.profiler recorded no op time")
                               if no_op_time else why_missing))
    available = fusion is not None and fusion.results.get("available")
    sink.measured("baseline/fusion_speedup", fusion if available else None, "x", _fusion_finding,
                  why_missing=why_missing if fusion is None else
                  f"torch.compile unavailable ({fusion.results.get('reason')})", missing_fix=fix_mb)


def _throughput_finding(r: dict) -> dict:
    """The single-device throughput every scaling stage is compared to (recorded, not judged)."""
    th, cfg = r["throughput"], r["config"]
    return dict(value=th["tokens_per_s"], verdict="info", noise=step_noise(r),
                threshold="recorded for reference (the business layer of the profile)",
                message=(f"Reference model ({r['params'] / 1e6:.1f} M params, batch {cfg['batch']} x "
                         f"{cfg['seq_len']} tokens, {cfg['dtype']}): {th['samples_per_s']:.3g} samples/s, "
                         + _step_time_words(th)),
                fix="Keep this number: it is the single-device price every scaling stage is compared to.")


def _step_time_words(th: dict) -> str:
    """The step time as it was taken: on a GPU the mean of free-running steps (one synchronisation at
    the end), whose spread is not known; the p10-p90 then come from the synchronised (phase-timed)
    steps, and are said to."""
    p = f"{th['step_time_p10_s'] * 1e3:.1f}-{th['step_time_p90_s'] * 1e3:.1f} ms"
    if str(th.get("step_time_basis", "")).startswith("mean of free-running"):
        return (f"step {th['step_time_s'] * 1e3:.1f} ms, the mean of {th.get('steps', '?')} free-running steps "
                f"(synchronised steps: median {th['step_time_synced_median_s'] * 1e3:.1f} ms, p10-p90 {p}).")
    return f"median step {th['step_time_s'] * 1e3:.1f} ms (p10-p90 {p})."


def _peak_memory_finding(r: dict, record: dict | None) -> dict:
    """Peak memory, judged as a share of the memory of the device the record was measured on."""
    mem = r["memory"]
    peak_b = mem["peak_GB"] * 1e9
    dev = (record or {}).get("device") or {}      # the device the record was measured on
    device_GB = dev.get("memory_GB") if dev.get("kind") == "cuda" else None
    share = peak_b / (device_GB * 1e9) if device_GB and not mem["is_lower_bound"] else None
    verdict, words = judge(share, warn=MEMORY_WARN, fail=MEMORY_FAIL, higher_is_better=False, fmt="{:.0%}")
    return dict(value=peak_b, verdict=verdict, threshold=f"share of device memory: {words}",
                message=(f"Peak memory {mem['peak_GB']:.3g} GB" + (f" ({share:.0%} of the device)" if share else "")
                         + f"; method: {mem['method']}."),
                fix="Peak memory bounds the micro-batch and the parallel plan: measure it before choosing tp/pp.")


def step_noise(r: dict) -> float | None:
    """Relative spread of the measured step times, (p90 - p10) / median: the noise of throughput and MFU."""
    th = r.get("throughput") or {}
    if not th.get("step_time_s") or th.get("step_time_p10_s") is None or th.get("step_time_p90_s") is None:
        return None
    return (th["step_time_p90_s"] - th["step_time_p10_s"]) / th["step_time_s"]


def _mfu_finding(r: dict, fix: str) -> dict:
    """Model FLOPs utilisation against the datasheet peak (and the measured matmul ceiling); not judged
    on the CPU fallback, whose peak is unknown."""
    m = r["mfu"]
    v, words = judge(m["mfu_datasheet"], warn=MFU_WARN, fail=MFU_FAIL, fmt="{:.0%}")
    if r["device"] == "cpu":
        v, words = "info", CPU_NOT_JUDGED + words
    ceil = m["mfu_measured_ceiling"]
    return dict(value=m["mfu_datasheet"], verdict=v, threshold=words, noise=step_noise(r),
                message=(f"{m['achieved_tflops']:.3g} TFLOP/s of model FLOPs; "
                         + (f"MFU {m['mfu_datasheet']:.1%} of the {m['datasheet_peak_tflops']:g} TFLOP/s "
                            f"datasheet peak" if m["mfu_datasheet"] is not None else m["peak_note"])
                         + (f"; {ceil:.1%} of the measured matmul ceiling ({m['measured_ceiling_tflops']:.3g} "
                            f"TFLOP/s)" if ceil is not None else "") + "."),
                fix=fix)


def _memory_bound_finding(r: dict, fix: str) -> dict:
    """The share of step time in memory-bound ops: the part more GPUs replicate instead of speeding up."""
    share_mb, on_cpu = r["memory_bound_share"], r["device"] == "cpu"
    v, words = judge(share_mb, warn=MEMBOUND_WARN, fail=MEMBOUND_FAIL, higher_is_better=False, fmt="{:.0%}")
    if on_cpu:
        v, words = "info", CPU_NOT_JUDGED + words
    return dict(value=share_mb, verdict=v, threshold=words,
                message=("Share of step time in memory-bound ops (elementwise, norms, activations, softmax, "
                         "copies) by torch.profiler self time. More GPUs do not speed these up."
                         + (" On a CPU the op mix differs from a GPU's (vectorised, cache-resident "
                            "elementwise ops; slower matmuls)." if on_cpu else "")),
                fix=fix)


def _fusion_finding(f: dict) -> dict:
    """Eager against torch.compile on one fusable block: what fusion buys before scaling out."""
    return dict(value=f["speedup_fwd_bwd"], verdict="info", threshold="recorded for reference (> 1 means fusion pays)",
                message=(f"A Linear-GELU-add-LayerNorm block, forward+backward: eager "
                         f"{f['eager_fwd_bwd_s'] * 1e3:.2f} ms, torch.compile {f['compiled_fwd_bwd_s'] * 1e3:.2f} ms; "
                         "memory-bound share " + " -> ".join(
                             "n/a" if x is None else f"{x:.0%}"
                             for x in (f["memory_bound_share_eager"], f["memory_bound_share_compiled"])) + "."),
                fix="Compile (or use fused kernels) before scaling out: fusion removes memory traffic that "
                    "more GPUs would only replicate.")


def add_measured_scaling(sink: FindingSink, stages: pd.DataFrame | None, source: str,
                         judged: bool = True) -> None:
    """The staged scaling measured on this machine (1 -> 2 processes on a CPU box). ``judged=False``
    (CPU processes fighting for two cores) records the number without a verdict."""
    if stages is None or len(stages) < 2:
        sink.not_measured("baseline/measured_scaling_efficiency", "fraction", "recorded for reference",
                      "Measure 1 -> 8 GPUs on one node first (torchrun), then 64, 512.",
                      "plan-only mode or a single device")
        return
    last = stages.iloc[-1]
    v, words = judge(float(last["efficiency"]), warn=EFFICIENCY_WARN, fail=STOP_RULE_EFFICIENCY, fmt="{:.0%}")
    if not judged:
        v, words = "info", f"CPU processes share the cores, not judged; on GPUs: {words}"
    nodes = [int(n) if pd.notna(n) else 1 for n in stages["nodes"]]
    where = "on this machine" if max(nodes) <= 1 else f"on {nodes[0]} -> {plural(nodes[-1], 'node')}"
    below = stages[stages["efficiency"] < STOP_RULE_EFFICIENCY]
    rule = (f"stop at {int(below.iloc[0]['world_size'])} and fix communication first" if len(below)
            else "go on to the next stage")
    sink.add(id="baseline/measured_scaling_efficiency", value=float(last["efficiency"]), unit="fraction",
             verdict=v, threshold=words,
             message=(f"Reference model (preflight.harness.reference), data-parallel (DDP) step time at "
                      f"{int(last['world_size'])} vs {int(stages.iloc[0]['world_size'])} "
                      f"{last['unit']} {where}: {stages.iloc[0]['step_s'] * 1e3:.1f} ms -> "
                      f"{last['step_s'] * 1e3:.1f} ms (weak scaling, fixed per-rank batch); efficiency "
                      + " -> ".join(f"{e:.0%}" for e in stages["efficiency"])
                      + f"; the stop rule ({STOP_RULE_EFFICIENCY:.0%}) says: {rule}."),
             fix=f"Record efficiency at every stage (1 -> 8 -> 64 -> 512) and stop when it falls under "
                 f"{STOP_RULE_EFFICIENCY:.0%}.",
             source=source)


def curve_table(curve: pd.DataFrame) -> pd.DataFrame:
    """The staged scaling curve (``plan_curve``) for people: efficiencies in percent, the stop rule in
    words (it speaks about a measured stage only)."""
    pct = lambda x: "—" if x is None or x != x else percent(x)
    return pd.DataFrame({
        "GPUs": curve["gpus"], "link": curve["link"], "all-reduce (NCCL rings, s)": curve["comm_s"],
        "the field report's flat arithmetic (s)": curve["flat_comm_s"], "bus bandwidth (GB/s)": curve["busbw_GBps"],
        "efficiency, no overlap": curve["efficiency_no_overlap"].map(pct),
        "efficiency, full overlap": curve["efficiency_overlap"].map(pct),
        "efficiency, measured": curve["efficiency_measured"].map(pct), "curve from": curve["source"],
        f"stop rule ({STOP_RULE_EFFICIENCY:.0%})": curve["stop_rule"].fillna("— (model only)")})


def layout_advice(profile: Profile, sink: FindingSink, gpu_key: str | None = None,
                  capacity: float | None = None) -> dict | str:
    """The advisor's ranking for the chapter (``preflight.chapters.advisor.advise``), at this chapter's measured
    MFU when ``baseline/mfu`` was measured above (a GPU with a datasheet peak), else at the stated
    default; the reason as a string when it cannot rank (an ``auto`` GPU without a known peak)."""
    from preflight.chapters import advisor

    measured = next((f for f in sink.findings if f.id == "baseline/mfu" and f.value is not None), None)
    eff = float(measured.value) if measured is not None and advisor.usable_efficiency(measured.value) else None
    try:
        return advisor.advise(profile, efficiency=eff, gpu_key=gpu_key, capacity=capacity,
                              efficiency_source="this chapter's measured MFU (section 3)" if eff else None)
    except ValueError as err:
        return str(err)
