"""The memory side of the plan (chapters 1 and 4): per-GPU bytes of the profile's parallel plan from
``preflight.models.memory``, judged against the GPU's memory, the cheapest change that makes an
over-budget plan fit, and the planner checked against a live measurement on this machine.
"""
from __future__ import annotations

import pandas as pd

from preflight.findings import FindingSink, judge
from preflight.hardware import CHIPS
from preflight.models import memory as M
from preflight.numfmt import gib
from preflight.profile import Profile

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
                  interleave=t.interleave if t.pp > 1 else 1)
    fields.update(changes)
    return M.Plan(**fields)


def capacity_bytes(profile: Profile, device=None) -> tuple[float | None, str]:
    """Memory of one GPU in bytes and where the figure comes from. Marketed "80GB" HBM is 80 GiB, so
    the table's and the profile's GB are read as GiB; ``auto`` takes this machine's device, whose
    ``memory_GB`` is torch's exact byte count / 1e9 (decimal GB)."""
    c = profile.cluster
    if c.gpu_memory_GB:
        return c.gpu_memory_GB * GiB, "cluster.gpu_memory_GB"
    if c.gpu != "auto":
        return CHIPS[c.gpu].memory_GB * GiB, f"{c.gpu} in the hardware table"
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
    total = float(terms["bytes"].sum())
    act = sum(v for k, v in by.items() if k.startswith("activations"))
    where = {"only": "", "first": " (first pipeline stage, the fullest)", "last": " (last pipeline stage, the fullest)"}[
        terms.attrs.get("stage", "only")]
    plan_words = (f"tp={t.tp}, pp={t.pp}, dp={profile.dp}, ZeRO-{t.zero_stage}, recompute {t.activation_recompute}, "
                  f"micro-batch {t.micro_batch_size} x {profile.model.seq_len} tokens"
                  + (", sequence parallel" if t.sequence_parallel else ""))
    sink.add(id="baseline/memory_per_gpu", value=total, unit="bytes", verdict="info",
             threshold="recorded for reference (the sum of the terms)",
             message=(f"{plan_words}: {gib(total)} per GPU{where}: weights {gib(by['weights'])}, gradients "
                      f"{gib(by['gradients'])}, optimizer {gib(by['optimizer'])}, activations {gib(act)}, "
                      f"framework allowance {gib(by['framework'])}."),
             fix="See baseline/memory_fits.", source=PROFILE_SOURCE)
    for fid, key, words in (("memory_weights", "weights", "16-bit weights (2 bytes per parameter on this GPU)"),
                            ("memory_grads", "gradients", "16-bit gradients"),
                            ("memory_optimizer", "optimizer", "fp32 master weights, Adam momentum and variance "
                                                              "(12 bytes per parameter)")):
        sink.add(id=f"baseline/{fid}", value=by[key], unit="bytes", verdict="info", threshold="recorded for reference",
                 message=f"{words}: {gib(by[key])} per GPU (ZeRO-{t.zero_stage} over dp={profile.dp}).",
                 fix="ZeRO shards optimizer state (1), gradients (2) and weights (3) over data parallelism.",
                 source=PROFILE_SOURCE)
    sink.add(id="baseline/memory_activations", value=act, unit="bytes", verdict="info",
             threshold="recorded for reference",
             message=(f"Activations kept for the backward pass: {gib(act)} per GPU "
                      f"({terms.loc[terms['term'] == 'activations', 'formula'].iloc[0]})."),
             fix="Selective recompute (or FlashAttention) removes the s^2 attention terms; sequence parallelism "
                 "splits the rest over tp.", source=PROFILE_SOURCE)

    cheapest = None
    if cap is None:
        sink.add(id="baseline/memory_fits", value=None, unit="ratio", verdict="info", threshold="not judged",
                 message=f"The plan needs {gib(total)} per GPU; the GPU's memory is {cap_src}.",
                 fix="Set cluster.gpu or cluster.gpu_memory_GB.", source=PROFILE_SOURCE)
        return {"terms": terms, "cheapest": None, "capacity": None, "plan": plan}
    ratio = total / cap
    v, words = judge(ratio, warn=FIT_WARN, fail=FIT_FAIL, higher_is_better=False, fmt="{:.0%}")
    cheapest = M.cheapest_fit(plan, cap / 1e9, profile.cluster.gpus_per_node, profile.gpus)
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
    the activations, the term the planner estimates rather than counts."""
    act = r["activations"]
    err = abs(act["error"])
    states = "; ".join(f"{s['term']} {s['error']:+.1%}" for s in r["states"])
    peak = r.get("peak") or {}
    peak_words = (f" Whole step on the GPU: measured peak {gib(peak['measured_peak_bytes'])} vs planned "
                  f"{gib(peak['predicted_bytes'])} ({peak['error']:+.1%})." if peak.get("measured") else
                  " The whole-step peak needs a GPU (torch.cuda.max_memory_allocated).")
    measured_layer = max(act["per_layer_measured"]) if isinstance(act["per_layer_measured"], list) else act["per_layer_measured"]
    v, words = judge(err, warn=ERROR_WARN, fail=ERROR_FAIL, higher_is_better=False, fmt="{:.0%}")
    return dict(value=act["error"], verdict=v, threshold="|activation error|: " + words,
                message=(f"Reference model on this machine: model states measured vs planned: {states}; activations per "
                         f"layer measured {measured_layer / 2**20:.3f} MiB vs planned "
                         f"{act['per_layer_predicted'] / 2**20:.3f} MiB ({act['error']:+.2%}).{peak_words}"),
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
            rows.append({"schedule": schedule + (f" v={v}" if v > 1 else ""), "p": p, "m": m,
                         "bubble": bubble_fraction(p, m, v), "activations (GiB)": act / GiB,
                         "total (GiB)": float(terms["bytes"].sum()) / GiB})
    return pd.DataFrame(rows)
