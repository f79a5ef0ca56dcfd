"""The memory side of the plan (chapters 1 and 4): per-GPU bytes of the profile's parallel plan from
``preflight.models.memory``, judged against the GPU's memory, the cheapest change that makes an
over-budget plan fit, and the planner checked against a live measurement on this machine.
"""
from __future__ import annotations

import pandas as pd

from preflight.core.findings import FindingSink, judge
from preflight.core.hardware import CHIPS
from preflight.core.numfmt import gib, num
from preflight.core.profile import Profile
from preflight.models import memory as M
from preflight.models import memory_fit as MF
from preflight.models import states as S
from preflight.models.pipeline import SCHEDULE_LABELS

PROFILE_SOURCE = "computed from profile"
GiB = 2 ** 30
# Plan / GPU memory: above 90 % the allocator's spikes and a longer batch leave no room; above 100 % the
# run dies with an out-of-memory error at its first step.
FIT_WARN, FIT_FAIL = 0.90, 1.00
# Planner vs measurement on this machine: the formulas count tensors, so a few percent is expected.
ERROR_WARN, ERROR_FAIL = 0.10, 0.25


def plan_of(profile: Profile, **changes) -> M.Plan:
    """The planner's input for the profile (``changes`` override fields, e.g. for the sliders).
    Raises ``ValueError`` where the planner cannot represent the plan (e.g. pp not dividing layers)."""
    m, t = profile.model, profile.training
    fields = dict(params=m.params, layers=m.layers, hidden=m.hidden, heads=m.n_heads, vocab=m.vocab,
                  seq_len=m.seq_len, micro_batch_size=t.micro_batch_size, tp=t.tp, pp=t.pp, dp=profile.dp,
                  zero_stage=t.zero_stage, recompute=t.activation_recompute, sequence_parallel=t.sequence_parallel,
                  schedule=t.pipeline_schedule if t.pp > 1 else "1f1b", microbatches=t.microbatches,
                  interleave=t.interleave if t.pp > 1 else 1, attention=m.attention, mlp=m.mlp,
                  ffn_hidden=m.ffn_hidden, kv_heads=m.kv_heads, dropout=m.dropout, framework=t.framework,
                  shard_group_gpus=profile.cluster.gpus_per_node if t.shard_group == "node" else None,
                  fp8=t.fp8, moe=m.expert_spec, ep=t.ep, etp=t.etp, cp=t.cp, grad_dtype=t.grad_dtype,
                  bucket_view=t.gradient_as_bucket_view,
                  recompute_modules=None if t.recompute_modules is None else tuple(t.recompute_modules),
                  fp8_activation_cache=t.fp8_activation_cache, qk_head_dim=m.qk_head_dim, v_head_dim=m.v_head_dim,
                  mla_latent=(m.q_lora_rank + m.kv_lora_rank + (m.qk_rope_head_dim or 0)) if m.q_lora_rank and
                  m.kv_lora_rank else None)
    fields.update(changes)
    return M.Plan(**fields)


def capacity_bytes(profile: Profile, device=None) -> tuple[float | None, str]:
    """Memory of one GPU in bytes and where the figure comes from: ``cluster.gpu_memory_GB`` as 1e9 bytes
    (decimal, as named), else the hardware table's ``capacity_bytes`` (nvidia-smi's total where recorded:
    81,559 MiB for an H100 "80GB", not 80 GiB), else under ``auto`` this machine's device (torch's exact
    byte count)."""
    c = profile.cluster
    if c.gpu_memory_GB:
        return c.gpu_memory_GB * 1e9, "cluster.gpu_memory_GB"
    if c.gpu != "auto":
        chip = CHIPS[c.gpu]
        what = f"{chip.smi_MiB:,} MiB in nvidia-smi" if chip.smi_MiB else f"{chip.memory_GB:g} GB as 1e9 bytes"
        return chip.capacity_bytes, f"{c.gpu} in the hardware table, {what}"
    if device is not None and device.memory_GB:
        return device.memory_GB * 1e9, f"this machine ({device.label})"
    return None, "unknown (gpu: auto without a device)"


def add_plan_findings(sink: FindingSink, profile: Profile, device=None) -> dict:
    """The plan's memory per GPU, its terms, the verdict against the GPU's memory and the cheapest
    change that fits. Returns {"terms", "cheapest", "capacity", "plan"} (terms None if not plannable)."""
    t = profile.training
    cap, cap_src = capacity_bytes(profile, device)
    try:
        plan = plan_of(profile)
    except ValueError as err:
        for fid, unit in (("memory_per_gpu", "bytes"), ("memory_weights", "bytes"), ("memory_grads", "bytes"),
                          ("memory_optimizer", "bytes"), ("memory_activations", "bytes"), ("memory_fits", "ratio")):
            sink.add(id=f"baseline/{fid}", value=None, unit=unit, verdict="info", threshold="not computed",
                     message=f"The memory planner cannot represent this plan: {err}.",
                     fix="Use a plan whose stages hold whole layers (pp dividing layers).", source=PROFILE_SOURCE)
        return {"terms": None, "cheapest": None, "capacity": cap, "plan": None}
    terms = M.terms(plan)
    by = dict(zip(terms["term"], terms["bytes"]))
    formula = dict(zip(terms["term"], terms["formula"]))
    total = float(terms["bytes"].sum())
    act = sum(v for k, v in by.items() if k.startswith("activations"))
    where = {"only": "", "first": " (first pipeline stage, the fullest)", "last": " (last pipeline stage, the fullest)"}[
        terms.attrs.get("stage", "only")]
    m = profile.model
    attn_words = {"flash": "flash attention (no s x s scores kept)", "math": "math attention (s x s scores kept)"}
    plan_words = (f"tp={t.tp}, pp={t.pp}, dp={profile.dp}" + (f", cp={t.cp}" if t.cp > 1 else "")
                  + f", {t.framework} ZeRO-{t.zero_stage}, "
                  f"recompute {t.activation_recompute}, {attn_words[m.attention]}, "
                  f"micro-batch {t.micro_batch_size} x {m.seq_len} tokens"
                  + (", sequence parallel" if t.sequence_parallel else ""))
    gathered = by.get("gathered_params", 0.0)
    sink.add(id="baseline/memory_per_gpu", value=total, unit="bytes", verdict="info",
             threshold="recorded for reference (the sum of the terms)",
             message=(f"{plan_words}: {gib(total)} per GPU{where}: weights {gib(by['weights'])}, gradients "
                      f"{gib(by['gradients'])}, optimizer {gib(by['optimizer'])}, "
                      + (f"gathered layer parameters {gib(gathered)}, " if gathered else "")
                      + f"activations {gib(act)}, framework allowance {gib(by['framework'])}."),
             fix="See baseline/memory_fits.", source=PROFILE_SOURCE)
    reps = f"dp={profile.dp}" + (f" x cp={t.cp}" if t.cp > 1 else "")
    shard_words = (f"{t.framework}, ZeRO-{t.zero_stage}, sharded over {plan.shard} of the {reps} ranks"
                   + (" (HSDP: inside a node)" if t.shard_group == "node" else "") if t.zero_stage else
                   f"{t.framework}, no ZeRO: a full copy on each of the {reps} ranks")
    shape_params = S.model_params(m.layers, m.hidden, m.n_heads, m.vocab, m.kv_heads, m.ffn_hidden, m.mlp)
    for fid, key in (("memory_weights", "weights"), ("memory_grads", "gradients"), ("memory_optimizer", "optimizer")):
        extra = (f" model.params = {num(m.params)}; the layer shapes give {num(shape_params)} "
                 f"({S.params_formula(m.mlp)})." if key == "weights" else "")
        sink.add(id=f"baseline/{fid}", value=by[key], unit="bytes", verdict="info", threshold="recorded for reference",
                 message=(f"{S.describe(t.framework, key, t.grad_dtype)}: {gib(by[key])} per GPU = {formula[key]} "
                          f"({shard_words}).{extra}"),
                 fix=("ZeRO shards optimizer state (1), gradients (2) and weights (3) over data parallelism; "
                      "megatron's distributed optimizer is stage 1, FSDP2 is stage 3."),
                 source=PROFILE_SOURCE)
    if gathered:
        sink.add(id="baseline/memory_gathered_params", value=gathered, unit="bytes", verdict="info",
                 threshold="recorded for reference",
                 message=(f"Unsharded parameters of the layers being gathered (weights sharded over {plan.shard} "
                          f"ranks): {gib(gathered)} per GPU = {formula['gathered_params']}."),
                 fix="Fewer layers prefetched, or tp (each GPU gathers 1/tp of a layer).", source=PROFILE_SOURCE)
    act_fix = ("Flash attention (model.attention: flash) or selective recompute removes the s^2 attention scores; "
               if m.attention == "math" else "The s^2 attention scores are already gone (flash attention); ")
    sink.add(id="baseline/memory_activations", value=act, unit="bytes", verdict="info",
             threshold="recorded for reference",
             message=f"Activations kept for the backward pass: {gib(act)} per GPU ({formula['activations']}).",
             fix=act_fix + "sequence parallelism splits the rest over tp; full recompute keeps only each layer's "
                           "input (+33 % compute).", source=PROFILE_SOURCE)

    cheapest = None
    if cap is None:
        sink.add(id="baseline/memory_fits", value=None, unit="ratio", verdict="info", threshold="not judged",
                 message=f"The plan needs {gib(total)} per GPU; the GPU's memory is {cap_src}.",
                 fix="Set cluster.gpu or cluster.gpu_memory_GB.", source=PROFILE_SOURCE)
        return {"terms": terms, "cheapest": None, "capacity": None, "plan": plan}
    ratio = total / cap
    v, words = judge(ratio, warn=FIT_WARN, fail=FIT_FAIL, higher_is_better=False, fmt="{:.0%}")
    cheapest = MF.cheapest_fit(plan, cap / 1e9, profile.cluster.gpus_per_node, profile.gpus)
    fix_row = cheapest[cheapest["fits"] & (cheapest["order"] > 0)].head(1)
    if ratio <= FIT_FAIL:
        fix = "Fits; keep 10 % free for allocator spikes and longer batches."
    elif len(fix_row):
        r = fix_row.iloc[0]
        fix = f"Cheapest change that fits: {r['change']} ({gib(r['plan_bytes'])} per GPU; cost: {r['cost']})."
    else:
        fix = "No single or paired change fits: a larger pipeline (pp) with ZeRO-3 and full recompute, or larger GPUs."
    sink.add(id="baseline/memory_fits", value=ratio, unit="ratio", verdict=v,
             threshold="plan / GPU memory: " + words,
             message=(f"The plan needs {gib(total)} per GPU of {gib(cap)} ({cap_src}): {ratio:.0%}"
                      + (" - out of memory at the first step." if ratio > FIT_FAIL else ".")),
             fix=fix, source=PROFILE_SOURCE)
    return {"terms": terms, "cheapest": cheapest, "capacity": cap, "plan": plan}


def add_validation_finding(sink: FindingSink, measured, why_missing: str = "plan-only mode (no live measurement)") -> None:
    """``baseline/memory_model_error``: the planner against the live measurement (``bench.memory``)."""
    sink.measured("baseline/memory_model_error", measured, "fraction", _validation_finding,
                  why_missing=why_missing, missing_fix="Compare the planner with a measured step.")


def _validation_finding(r: dict) -> dict:
    """The planner's terms against a measured step of the reference model (``bench.memory``): judged on
    the activations (the term the planner estimates rather than counts), the largest error over the
    flash and math attention paths."""
    act = r["activations"]
    states = "; ".join(f"{s['term']} {s['error']:+.1%}" for s in r["states"])
    peak = r.get("peak") or {}
    peak_words = (f" Whole step on the GPU: measured peak {gib(peak['measured_peak_bytes'])} vs planned "
                  f"{gib(peak['predicted_bytes'])} ({peak['error']:+.1%})." if peak.get("measured") else
                  " The whole-step peak needs a GPU (torch.cuda.max_memory_allocated).")
    measured_layer = max(act["per_layer_measured"]) if isinstance(act["per_layer_measured"], list) else act["per_layer_measured"]
    paths = r.get("paths") or {}
    worst = max([act["error"], *(x["error"] for x in paths.values())], key=abs)
    path_words = (" Per layer, by attention path and layer shape: " + ", ".join(
        f"{name.replace('_', ' ')} {x['error']:+.2%}" for name, x in paths.items()) + "." if paths else "")
    v, words = judge(abs(worst), warn=ERROR_WARN, fail=ERROR_FAIL, higher_is_better=False, fmt="{:.0%}")
    return dict(value=worst, verdict=v, threshold="|activation error|, largest over the paths: " + words,
                message=(f"Reference model on this machine: model states measured vs planned: {states}; activations per "
                         f"layer measured {measured_layer / 2**20:.3f} MiB vs planned "
                         f"{act['per_layer_predicted'] / 2**20:.3f} MiB ({act['error']:+.2%}).{path_words}{peak_words}"),
                fix="Trust the planner to this accuracy; measure your own model the same way (preflight.bench.memory).")


def bubble_memory_table(profile: Profile, p: int, ms=(4, 8, 16, 32)) -> pd.DataFrame:
    """Chapter 4's trade-off: per micro-batch count and schedule, the bubble and the first stage's
    activation memory (the planner with the profile's model at pipeline depth ``p``)."""
    from preflight.models.pipeline import bubble_fraction

    rows = []
    for m in ms:
        for schedule, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2)):
            if schedule == "interleaved" and (m % p or profile.model.layers % (p * v)):
                continue
            try:
                plan = plan_of(profile, pp=p, schedule=schedule, interleave=v, microbatches=m,
                               dp=max(1, profile.gpus // (profile.training.tp * p)))
            except ValueError:
                continue
            terms = M.terms(plan)
            act = float(terms.loc[terms["term"].str.startswith("activations"), "bytes"].sum())
            rows.append({"schedule": SCHEDULE_LABELS[schedule] + (f" v={v}" if v > 1 else ""), "p": p, "m": m,
                         "bubble": bubble_fraction(p, m, v), "activations (GiB)": act / GiB,
                         "total (GiB)": float(terms["bytes"].sum()) / GiB})
    return pd.DataFrame(rows)
