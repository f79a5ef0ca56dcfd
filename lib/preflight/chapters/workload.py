"""The findings of the live measurements when the profile names a workload (your own model).

The ids are the reference model's (``baseline/throughput``, ``fault_tolerance/resume_bitwise``...),
so that ``preflight compare`` sets a workload audit beside a reference one, plus what only a
workload has (``baseline/params``, ``baseline/flops_per_sample``, ``baseline/model_states``). Every
message starts with the workload it measured, ``workload TinyLM (234,880 parameters)``, taken from
the record (``results["workload"]``), so a recorded measurement names its model too. Thresholds are
the chapters' own (``preflight.chapters.baseline`` ...): one home each.
"""
from __future__ import annotations

import math

from preflight.chapters import baseline as B
from preflight.chapters import fault_tolerance as C
from preflight.core.findings import FindingSink
from preflight.core.numfmt import factor, plural
from preflight.core.profile import Profile
from preflight.core.workload import label
from preflight.models import states as S

NOT_MEASURED = "plan-only mode (the workload is not imported)"


def _named(build):
    """``build(results)``'s finding with the workload's label in front of its message."""
    def named(r: dict) -> dict:
        f = build(r)
        return f | {"message": f"{label(r['workload'])}: {f['message']}"}
    return named


# --- chapter 1 ---------------------------------------------------------------------------------------

def add_baseline_findings(sink: FindingSink, profile: Profile, base, fusion, why_missing: str = NOT_MEASURED) -> None:
    """Chapter 1 on the workload: ``base`` (method ``workload_baseline``) and ``fusion``
    (``workload_fusion``), each a ``preflight.runner.chapter.Measured`` or None."""
    fix_mfu = "Profile one device first; fuse memory-bound ops (torch.compile), check the data wait, then scale."
    fix_mb = "Fuse elementwise/normalisation ops (torch.compile, fused kernels) before adding GPUs."
    missing = dict(why_missing=why_missing, missing_fix="Run the audit in measure mode on the workload.")
    sink.measured("baseline/params", base, "params", _named(_params_finding), **missing)
    sink.measured("baseline/flops_per_sample", base, "FLOP", _named(_flops_finding), **missing)
    unit = "tokens/s" if base is not None and base.results.get("tokens_per_s") else "samples/s"
    sink.measured("baseline/throughput", base, unit, _named(_throughput_finding), **missing)
    sink.measured("baseline/peak_memory", base, "bytes",
                  _named(lambda r: B._peak_memory_finding(r, base.record)), **missing)
    sink.measured("baseline/model_states", base, "bytes", _named(lambda r: _states_finding(r, profile)), **missing)
    sink.measured("baseline/mfu", base, "fraction", _named(lambda r: _mfu_finding(r, fix_mfu)), **missing)
    no_op_time = base is not None and base.results["memory_bound_share"] is None
    sink.measured("baseline/memory_bound_share", None if no_op_time else base, "fraction",
                  _named(lambda r: B._memory_bound_finding(r, fix_mb)), missing_fix=fix_mb,
                  why_missing=base.results["profile"]["reason"] if no_op_time else why_missing)
    available = fusion is not None and fusion.results.get("available")
    sink.measured("baseline/fusion_speedup", fusion if available else None, "x", _named(_fusion_finding),
                  why_missing=why_missing if fusion is None else
                  f"torch.compile unavailable on {label(fusion.results['workload'])} ({fusion.results.get('reason')})",
                  missing_fix=fix_mb)


def _params_finding(r: dict) -> dict:
    return dict(value=r["params"], verdict="info", threshold="counted exactly (model.parameters(), shared tensors once)",
                message=(f"{r['params']:,} parameters, {r['params_trainable']:,} of them trainable; one batch is "
                         f"{r['samples_per_step']} samples" + (f" of {r['tokens_per_sample']} tokens" if
                                                               r["tokens_per_sample"] else "") + "."),
                fix="Put this count in the profile's model.params when the plan is this model at scale.")


def _flops_finding(r: dict) -> dict:
    f = r["flops"]
    ops = ", ".join(f"{k.removeprefix('aten.')} {v / f['counted_per_step']:.0%}"
                    for k, v in sorted(f["counted_by_op"].items(), key=lambda kv: -kv[1]))
    beside = ""
    if f["formula_per_sample"]:
        t = f["transformer"]
        beside = (f" A Transformer ({t['layers']} attention layers, hidden {t['hidden']}, {t['seq_len']} tokens): "
                  f"6N + 12 L h s gives {f['formula_per_sample']:.4g}, counted / formula "
                  f"{f['ratio_counted_to_formula']:.3f}.")
    return dict(value=f["per_sample"], verdict="info",
                threshold="counted by torch.utils.flop_counter.FlopCounterMode (forward + backward)",
                message=(f"One training step (forward + backward) costs {f['per_sample']:.4g} FLOPs per sample, "
                         f"counted op by op ({ops})." + beside),
                fix="Use the counted FLOPs for MFU: a formula fits only the architecture it was derived for.")


def _throughput_finding(r: dict) -> dict:
    th = r["throughput"]
    value = th["tokens_per_s"] if th["tokens_per_s"] else th["samples_per_s"]
    return dict(value=value, verdict="info", threshold="recorded for reference (the business layer)",
                message=(f"{th['samples_per_s']:.4g} samples/s" + (f", {th['tokens_per_s']:.4g} tokens/s" if
                                                                    th["tokens_per_s"] else "")
                         + f" on one device, batch of {r['samples_per_step']}; median step "
                         f"{th['step_time_s'] * 1e3:.1f} ms (p10-p90 {th['step_time_p10_s'] * 1e3:.1f}-"
                         f"{th['step_time_p90_s'] * 1e3:.1f} ms)."),
                fix="Keep this number: it is the single-device price every scaling stage is compared to.")


def _mfu_finding(r: dict, fix: str) -> dict:
    f = B._mfu_finding(r, fix)
    return f | {"message": f["message"].replace("of model FLOPs", "of counted FLOPs (FlopCounterMode, fp32)")}


def _states_finding(r: dict, profile: Profile) -> dict:
    """Weights, gradients and optimizer state measured after a step, against the planner's fp32 Adam
    layout for the same parameters, and what the profile's layout would hold per GPU."""
    tb, n, t = r["memory"]["tensor_bytes"], r["params"], profile.training
    planned_fp32 = sum(b for _, b, _ in S.state_rows(t.framework, "fp32", 0, n, 1, "params"))
    tp_pp = t.tp * t.pp
    node_ranks = max(1, profile.cluster.gpus_per_node // t.tp)
    shard = profile.replicas if t.shard_group == "dp" else math.gcd(profile.replicas, node_ranks)
    layout = sum(b for _, b, _ in S.state_rows(t.framework, "mixed", t.zero_stage, n / tp_pp, shard, "params / (tp pp)"))
    return dict(value=tb["model_states"], verdict="info",
                threshold="measured (tensor bytes after one optimizer step) against the planner (preflight.models.states)",
                message=(f"weights {tb['weights'] / 1e6:.3g} MB + gradients {tb['gradients'] / 1e6:.3g} MB + optimizer "
                         f"state {tb['optimizer_state'] / 1e6:.3g} MB = {tb['bytes_per_param']:.2f} B per parameter "
                         f"with its own optimizer, fp32; the planner's fp32 Adam layout: {planned_fp32 / n:.0f} B per "
                         f"parameter ({planned_fp32 / 1e6:.3g} MB). At the profile's layout ({t.framework}, mixed "
                         f"precision, ZeRO {t.zero_stage}, tp x pp = {tp_pp}, sharded over {shard}) these states take "
                         f"{layout / 1e6:.3g} MB per GPU. Activations saved for backward: "
                         f"{tb['activations_per_sample'] / 1e6:.3g} MB per sample."),
                fix="Size the micro-batch from the activations per sample and the memory left after the states.")


def _fusion_finding(f: dict) -> dict:
    shares = " -> ".join("n/a" if x is None else f"{x:.0%}"
                         for x in (f["memory_bound_share_eager"], f["memory_bound_share_compiled"]))
    return dict(value=f["speedup_fwd_bwd"], verdict="info", threshold="recorded for reference (> 1 means fusion pays)",
                message=(f"its own forward + backward: eager {f['eager_fwd_bwd_s'] * 1e3:.2f} ms, torch.compile "
                         f"{f['compiled_fwd_bwd_s'] * 1e3:.2f} ms ({factor(f['speedup_fwd_bwd'])}; first call "
                         f"{f['compile_s']:.1f} s with compilation); memory-bound share {shares}."),
                fix="Compile (or use fused kernels) where it pays on your model, before scaling out.")


# --- chapter 3 ---------------------------------------------------------------------------------------

def add_communication_findings(sink: FindingSink, run, emulated=None, why_missing: str = NOT_MEASURED) -> None:
    """Chapter 3 on the workload: ``run`` (``workload_overlap``, real compute, DDP on 2 ranks) or None;
    ``emulated`` (the same method in emulated-device mode, on a CPU) or None. The overlap saving comes
    from a real run on NCCL (GPUs), else from the emulated run where there is one (on a CPU real compute
    cannot overlap), else from the real run; gradient bytes from the real run (else the emulated one:
    the same shapes) and the bf16 drift of the workload's own loss from the real run only."""
    fix = "Keep DDP's bucketing on, accumulate with no_sync() where the batch allows, compress only after checking the loss."
    missing = dict(why_missing=why_missing, missing_fix=fix)
    real_overlap = run is not None and run.results.get("backend") == "nccl"       # GPUs: the real thing
    sink.measured("communication/gradient_bytes", run or emulated, "bytes", _named(_grad_bytes_finding), **missing)
    sink.measured("communication/overlap_saving", run if real_overlap else (emulated or run), "fraction",
                  _named(_overlap_finding), **missing)
    sink.measured("communication/bf16_saving", run, "fraction", _named(_bf16_finding), **missing)


def _by(r: dict) -> dict:
    return {x["config"]: x for x in r["rows"]}


def _grad_bytes_finding(r: dict) -> dict:
    by, world = _by(r), r["world_size"]
    ring = by["ddp_bucket_default"]["bytes_per_step_per_rank"]
    sizes = "; ".join(f"{k.removeprefix('ddp_bucket_')} cap: {plural(len(v), 'bucket')} of "
                      + ", ".join(f"{b / 1e6:.3g}" for b in v) + " MB" for k, v in r["buckets"].items())
    return dict(value=r["grad_bytes"], verdict="info", threshold="measured (DDP's own buckets, recorded by a comm hook)",
                message=(f"{r['grad_bytes'] / 1e6:.4g} MB of gradients per step ({r['params']:,} trainable parameters); "
                         f"a ring all-reduce over {world} ranks moves {ring / 1e6:.4g} MB per rank per step. "
                         f"DDP's buckets: {sizes}."),
                fix="Feed these bytes to the all-reduce calculator above; at scale, a bucket size that makes "
                    "several buckets lets backward hide all but the last.")


def _overlap_finding(r: dict) -> dict:
    by = _by(r)
    ref = by["manual_allreduce"]
    buckets = {k: v for k, v in by.items() if k.startswith("ddp_bucket_")}
    best = min(buckets, key=lambda k: buckets[k]["step_s"])
    saving = (ref["step_s"] - buckets[best]["step_s"]) / ref["step_s"]
    if r["mode"] == "emulated":
        small = by["ddp_bucket_small"]
        why = (f" Emulated device: each block waits its measured time, the cores stay free, the gradients are "
               f"real. With the small cap {small['launched_in_backward']} of {plural(small['buckets'], 'bucket')} "
               "started their all-reduce while backward still ran (the last one of backward never can); one "
               "bucket starts only when backward ends. Differences under ~10 % are noise on a shared CPU.")
    elif r["device_kind"] == "cpu":
        why = (" On a CPU backward keeps the cores busy and the all-reduce cannot hide behind it: differences of a "
               "few percent are noise here; on GPUs with NCCL this is the real overlap.")
    else:
        why = ""
    return dict(value=saving, verdict="info", threshold="recorded for reference (> 0: overlap pays)",
                message=(f"DDP, {r['label']}, {r['world_size']} ranks: all-reduce after backward "
                         f"{ref['step_s'] * 1e3:.1f} ms per step; best bucketing ({best}) {buckets[best]['step_s'] * 1e3:.1f} "
                         f"ms ({saving:.0%}); small / default / one huge bucket "
                         + " / ".join(f"{by[k]['step_s'] * 1e3:.1f}" for k in ("ddp_bucket_small", "ddp_bucket_default",
                                                                               "ddp_bucket_huge"))
                         + f" ms; no_sync over 4 micro-batches {by['ddp_no_sync_k4']['step_s'] * 1e3:.1f} ms per micro-batch "
                           "(a quarter of the bytes)." + why),
                fix="Keep DDP's bucketing on (bucket_cap_mb ~25), accumulate with no_sync() where the batch allows.")


def _bf16_finding(r: dict) -> dict:
    by = _by(r)
    ovl, bf, fp = by["ddp_bucket_default"], by["ddp_bf16_hook"], by["ddp_fp16_hook"]
    saving = (ovl["step_s"] - bf["step_s"]) / ovl["step_s"]
    return dict(value=saving, verdict="info", threshold="recorded for reference (> 0: bf16 pays)",
                message=(f"bf16 gradients move {bf['bytes_per_step_per_rank'] / 1e6:.3g} MB instead of "
                         f"{ovl['bytes_per_step_per_rank'] / 1e6:.3g} MB per step per rank; step {ovl['step_s'] * 1e3:.1f} -> "
                         f"{bf['step_s'] * 1e3:.1f} ms ({saving:.0%}). Its own loss after {bf['updates']} updates, against the "
                         f"fp32 average: bf16 {bf['loss_rel_diff_vs_fp32']:.2e}, fp16 {fp['loss_rel_diff_vs_fp32']:.2e} "
                         "(relative)."),
                fix="Register a bf16 compression hook (preflight.toolkit.hooks.bf16_compress_hook) if the drift is acceptable.")


# --- chapter 4 ---------------------------------------------------------------------------------------

def add_load_balance_findings(sink: FindingSink, part, why_missing: str = NOT_MEASURED) -> None:
    """Chapter 4 on the workload: ``part`` (``workload_partition``) or None."""
    sink.measured("load_balance/partition_gain", part, "x", _named(_partition_finding), why_missing=why_missing,
                  missing_fix="Partition stages by profiled block time, not by block count.")


def _partition_finding(r: dict) -> dict:
    fix = "Profile every block, then split at the exact optimal contiguous boundaries."
    if not r.get("by_time"):
        return dict(value=None, verdict="info", threshold="recorded for reference", fix=fix,
                    message=f"{plural(len(r['blocks']), 'block')}, {plural(r['p'], 'stage')}: nothing to partition.")
    names = [b["name"] for b in r["blocks"]]

    def cut(parts):
        return " | ".join(f"{names[s[0]]}..{names[s[-1]]}" if len(s) > 1 else names[s[0]] for s in parts)
    head = (f"{len(names)} blocks into {r['p']} stages: by count [{cut(r['by_count'])}] bottleneck "
            f"{r['bottleneck_count_s'] * 1e3:.2f} ms, by time [{cut(r['by_time'])}] {r['bottleneck_time_s'] * 1e3:.2f} ms "
            f"per micro-batch (forward + backward): predicted gain {factor(r['predicted_gain'])}")
    if r["measured_gain"] is None:
        return dict(value=r["predicted_gain"], verdict="info", fix=fix,
                    threshold="predicted only (the blocks cannot run as pipeline stages)",
                    message=f"{head}. Not measured as a pipeline: {r['in_sequence_reason']}.")
    same = " (the same partition: one run)" if r.get("same_partition") else ""
    return dict(value=r["measured_gain"], verdict="info", fix=fix,
                threshold="recorded for reference (> 1: partitioning by time pays)",
                message=(f"{head}; measured with torch.distributed.pipelining ({r['schedule']}, {r['p']} ranks, "
                         f"m = {r['m']}, {r['backend']}): {r['throughput_count']:.1f} -> {r['throughput_time']:.1f} "
                         f"samples/s ({factor(r['measured_gain'])}){same}."))


# --- chapter 5 ---------------------------------------------------------------------------------------

def add_fault_tolerance_findings(sink: FindingSink, resume, stall, why_missing: str = NOT_MEASURED) -> None:
    """Chapter 5 on the workload: ``resume`` (``workload_resume``) and ``stall`` (``workload_ckptstall``)."""
    sink.measured("fault_tolerance/resume_bitwise", resume, "bool", _named(_resume_finding), why_missing=why_missing,
                  missing_threshold="pass = bitwise equal",
                  missing_fix="Checkpoint model, optimizer, every generator and the position in the batch stream.")
    sink.measured("fault_tolerance/async_stall_ratio", stall, "ratio", _named(C._stall_finding),
                  why_missing=why_missing, missing_fix="Snapshot to host memory, write in the background.")


def _resume_finding(r: dict) -> dict:
    head = (f"killed with SIGKILL after step {r['killed_after_step']}, resumed from the step {r['checkpoint_step']} "
            f"checkpoint (model, optimizer, generators; the batch stream replayed to step {r['checkpoint_step']}; "
            f"{plural(r['steps_lost'], 'step')} recomputed): ")
    if r["resume_bitwise"]:
        body = f"the {r['rows'][0]['steps_compared']} losses are bit-for-bit those of the uninterrupted run."
    else:
        body = (f"the losses depart from the uninterrupted run's at step {r['first_divergent_step']}; missing: "
                f"{r['missing_state']}.")
    broken = [x for x in r["rows"][1:] if not x["bitwise_equal"]]
    if broken:
        body += " Leaving out " + ", ".join(f"{x['variant'].removeprefix('without ')} (from step "
                                            f"{x['first_divergent_step']}, max |diff| {x['max_abs_diff']:.2g})"
                                            for x in broken) + " breaks it too."
    return dict(value=float(r["resume_bitwise"]), verdict="pass" if r["resume_bitwise"] else "fail",
                threshold="pass = bitwise equal", message=head + body,
                fix=("Keep every piece of state in what you checkpoint: draw random numbers from the global "
                     "generators (or save your own generators' states), register state as persistent buffers, "
                     "save the data position."))
