"""The five chapters' verdicts on a job's own profiler traces (``python -m preflight traces DIR``,
``audit PROFILE --traces DIR``, each notebook's "your job's traces" section).

The finding ids below are a contract: a CI gate keys on them (``--fail-on``). A finding computed per
rank carries every rank's value in ``per_rank`` and the worst rank's as its ``value``. Thresholds are
this module's, beside the chapter's own where they judge the same thing (chapter 2's idle share, the
baseline's MFU).
"""
from __future__ import annotations

from preflight.chapters.baseline import MFU_FAIL, MFU_WARN
from preflight.chapters.data_pipeline import IDLE_FAIL, IDLE_WARN
from preflight.core.findings import Finding, judge
from preflight.core.numfmt import num, pct
from preflight.diagnose.trace_analysis import analyze
from preflight.diagnose.trace_job import read_job

GPU_IDLE_WARN, GPU_IDLE_FAIL = 0.10, 0.25
LOADER_WARN, LOADER_FAIL = IDLE_WARN, IDLE_FAIL             # share of the step spent waiting on the loader
OVERLAP_WARN, OVERLAP_FAIL = 0.80, 0.50
EXPOSED_WARN, EXPOSED_FAIL = 0.05, 0.15
SPREAD_WARN, SPREAD_FAIL = 0.05, 0.15
IMBALANCE_WARN, IMBALANCE_FAIL = 1.05, 1.15
WAIT_WARN, WAIT_FAIL = 0.05, 0.15
SYNC_WARN = 1.0                                                # synchronising calls per step
LAUNCH_WARN, LAUNCH_FAIL = 0.05, 0.15                          # share of the window the GPU waited on launches
PAGEABLE_MB_WARN, PAGEABLE_SHARE_WARN = 1.0, 0.01              # pageable copies worth a warning: per step, of window

IDS = {"baseline": ["baseline/trace_gpu_idle", "baseline/trace_launch_bound", "baseline/trace_mfu",
                    "baseline/trace_critical_path"],
       "data_pipeline": ["data_pipeline/trace_loader_wait", "data_pipeline/trace_pageable_h2d",
                         "data_pipeline/trace_sync_per_step"],
       "communication": ["communication/trace_comm_overlap", "communication/trace_exposed_comm"],
       "load_balance": ["load_balance/trace_step_spread", "load_balance/trace_compute_imbalance",
                        "load_balance/trace_collective_wait", "load_balance/straggler_cost"],
       "fault_tolerance": ["fault_tolerance/trace_evidence"]}


def audit_traces(folder, gpu_key: str | None = None, jobs: int | None = None) -> dict:
    """Read the folder and analyse it (``preflight.diagnose.trace_analysis.analyze``); raises
    ``TraceError`` for unusable input. ``gpu_key``: the chip these traces ran on where they name none
    (``traces --gpu``); MFU is judged only against the trace's chip or this one.

    Each rank's view (``result["ranks"][r]``) carries the measured step terms a plan is set beside, in
    ``step_terms`` (ms per step: compute, exposed communication per collective type, collective wait,
    host-bound / launch-bound / queued idle, data wait, pipeline idle).

    ``result["stragglers"]``: the straggler what-if of the job (``stragglers_from_trace.what_if``: the
    analysis under ``result``, or ``why`` it cannot be made from these traces, then said in ``notes``)."""
    from preflight.diagnose.stragglers_from_trace import what_if

    job = read_any_job(folder, jobs)
    a = analyze(job, gpu_key)
    a["stragglers"] = w = what_if(job, str(job["folder"]))
    if "why" in w:
        a["notes"].append(f"{STRAGGLER_COST} not computed from these {w['source']}: {w['why']}")
    return a


def read_any_job(folder, jobs: int | None = None) -> dict:
    """The job in ``folder``: Nsight Systems exports (``*.sqlite``) through their own reader
    (``preflight.diagnose.nsys_job``), else torch.profiler traces (``trace_job.read_job``). The choice is made
    here, above both readers, so neither imports the other."""
    from pathlib import Path

    from preflight.diagnose import nsys_job

    p = Path(folder)
    if p.is_dir() and nsys_job.has_exports(p):
        return nsys_job.read_job(p)
    return read_job(folder, jobs=jobs)


def _per_rank(a: dict, key: str) -> dict:
    return {str(r): v.get(key) for r, v in sorted(a["ranks"].items())}


def _worst(per: dict, higher_is_better: bool):
    vals = {r: v for r, v in per.items() if v is not None}
    if not vals:
        return None, None
    r = (min if higher_is_better else max)(vals, key=vals.get)
    return vals[r], int(r)


def _source(a: dict) -> str:
    n = len(a["ranks"])
    miss, bad = len(a["missing"]), len(a["unreadable"])
    extra = f"; {miss} of {a['world_size']} ranks missing" if a["world_size"] and miss else ""
    extra += f"; {bad} file(s) unreadable" if bad else ""
    return f"traces of {n} rank{'s' if n != 1 else ''} in {a['folder']}{extra}"


def _judged(fid, a, key, unit, warn, fail, hib, fmt, what, fix, why_none, extra=None, words=None):
    per = _per_rank(a, key)
    value, rank = _worst(per, hib)
    verdict, default_words = judge(value, warn=warn, fail=fail, higher_is_better=hib, fmt=fmt)
    words = words or default_words
    if value is None:
        return Finding(id=fid, value=None, unit=unit, verdict="info", threshold=words, message=f"not read: {why_none}",
                       fix=fix, source=_source(a), per_rank=per or None)
    many = len([v for v in per.values() if v is not None]) > 1
    msg = what(value, rank) + (f" (worst rank {rank} of {len(per)})" if many else "") + (extra(rank) if extra else "")
    return Finding(id=fid, value=value, unit=unit, verdict=verdict, threshold=words, message=msg,
                   fix=fix if verdict in ("warn", "fail") else "Nothing to fix here.", source=_source(a), per_rank=per)


def baseline(a: dict) -> list[Finding]:
    v = a["ranks"]

    def idle_words(x, r):
        w = v[r]
        return (f"the GPU ran nothing {pct(x)} of the window ({w['window']}): "
                f"{pct(w['idle_host'] or 0)} waiting for the host to launch work, {pct(w.get('idle_launch') or 0)} "
                f"waiting on kernel launches (gaps under 30 us between launched kernels), {pct(w['idle_other'] or 0)} "
                f"with work queued (synchronisation, other streams or devices); compute kernels ran "
                f"{pct(w['compute'] or 0)}")
    out = [_judged("baseline/trace_gpu_idle", a, "idle", "fraction", GPU_IDLE_WARN, GPU_IDLE_FAIL, False, "{:.0%}",
                   idle_words, _idle_fix(a), "no GPU events in the window (a CPU-only trace)")]

    def launch_words(x, r):
        st = v[r].get("launch") or {}
        us = (lambda ns: "n/a" if ns is None else f"{ns / 1e3:.3g} us")
        return (f"the GPU waited on kernel launches {pct(x)} of the window: {num(st.get('kernels_per_step') or 0)} "
                f"kernels per step, median kernel {us(st.get('median_kernel_ns'))}, median launch call "
                f"{us(st.get('median_launch_call_ns'))}, median launch-to-start {us(st.get('median_launch_to_start_ns'))}"
                + ("; launch-bound: the kernels finish faster than the CPU launches them" if x > LAUNCH_WARN else ""))
    out.append(_judged("baseline/trace_launch_bound", a, "idle_launch", "fraction", LAUNCH_WARN, LAUNCH_FAIL, False,
                       "{:.0%}", launch_words, LAUNCH_FIX, "no GPU events in the window (a CPU-only trace)"))
    out.append(_judged("baseline/trace_mfu", a, "mfu", "fraction", MFU_WARN, MFU_FAIL, True, "{:.0%}",
                       lambda x, r: (f"{num(v[r]['tflops'])} TFLOP/s achieved over the window, {pct(x)} of "
                                     f"{v[r]['chip']}'s dense {v[r]['peak_dtype']} peak ({num(v[r]['peak_tflops'])} "
                                     "TFLOP/s), counted from the recorded shapes of matmul, conv and attention ops"
                                     + ("" if v[r]["chip_source"] == "trace" else
                                        f"; the chip is {v[r]['chip_source']}, the trace does not name it")),
                       "Profile the largest kernels (chapter 1's op table); raise the matmul share before scaling.",
                       next((x["mfu_why"] for x in v.values() if x.get("mfu_why")), "no FLOPs"),
                       extra=lambda r: (f"; FLOPs were countable for {pct(v[r]['flop_coverage'])} of the matmul / conv / "
                                        "attention kernel time (the rest reads as zero: MFU is a lower bound)"
                                        if v[r].get("flop_coverage") is not None and v[r]["flop_coverage"] < 0.95
                                        else "")))
    out.append(critical_path_finding(a))
    return out


LAUNCH_FIX = ("Fewer, larger launches: CUDA graphs (torch.compile(mode='reduce-overhead') or torch.cuda.graphs), "
              "torch.compile to fuse elementwise kernels, a larger micro-batch per launch.")


def _idle_fix(a: dict) -> str:
    """The fix for the worst rank's largest idle cause."""
    v = [x for x in a["ranks"].values() if x.get("idle") is not None]
    if not v:
        return ""
    w = max(v, key=lambda x: x["idle"])
    parts = {"host": w.get("idle_host") or 0, "launch": w.get("idle_launch") or 0, "queued": w.get("idle_other") or 0}
    return {"host": "Host-bound gaps: find what the CPU does between launches (the data loader, Python overhead, a "
                    "blocking copy); keep the GPU fed ahead of time (prefetch, non_blocking copies).",
            "launch": "Launch-bound gaps: " + LAUNCH_FIX,
            "queued": "Queued gaps: remove synchronising calls (.item(), .cpu(), printing losses each step) and "
                      "cross-stream waits between compute and communication."}[max(parts, key=parts.get)]


def critical_path_finding(a: dict) -> Finding:
    """What bounds each rank's window: the kind of work with the most time on its critical path."""
    v = {r: x["critical"] for r, x in a["ranks"].items() if x.get("critical")}
    per = {str(r): c["bound_share"] for r, c in sorted(v.items())}
    words = ("pass when the GPU's compute bounds the window; warn when the CPU or communication does (value: the "
             "bounding kind's share of the critical path)")
    if not v:
        return Finding(id="baseline/trace_critical_path", value=None, unit="fraction", verdict="info", threshold=words,
                       message="not read: no GPU events in the window", fix="", source=_source(a))
    off = [r for r in per if v[int(r)]["bound"] != "compute"]
    r = max(off, key=per.get) if off else min(per, key=per.get)
    c = v[int(r)]
    sh = c["shares"]
    chain = ", ".join(f"{x['name'][:60]} ({num(x['ns'] / 1e6)} ms)" for x in c["chain"][:4])
    msg = (f"rank {r}'s window is {c['bound']}-bound: of its {num(c['total_ms'])} ms critical path, compute "
           f"{pct(sh['compute'])}, copies {pct(sh['copy'])}, communication {pct(sh['comm'])}, waiting for a late peer "
           f"{pct(sh['wait'])}, CPU (launches, host work) {pct(sh['cpu'])}, unexplained idle {pct(sh['idle'])}; "
           f"the chain: {chain or 'CPU work only'}" + (f" ({c['note']})" if c.get("note") else ""))
    fix = {"compute": "Nothing to fix here: the GPU's own work sets the step; faster kernels (chapter 1) shorten it.",
           "cpu": "The CPU sets the step: " + LAUNCH_FIX + " Move host work (logging, .item()) off the step.",
           "communication": ("A late peer sets the step: see load_balance/trace_collective_wait."
                             if sh["wait"] > sh["comm"] else
                             "Communication sets the step: overlap it with compute (DDP buckets, FSDP prefetch), "
                             "fewer, larger messages.")}[c["bound"]]
    return Finding(id="baseline/trace_critical_path", value=per[r], unit="fraction",
                   verdict="pass" if c["bound"] == "compute" else "warn", threshold=words, message=msg, fix=fix,
                   source=_source(a), per_rank=per)


def data_pipeline(a: dict) -> list[Finding]:
    v = a["ranks"]
    out = [_judged("data_pipeline/trace_loader_wait", a, "loader_share", "fraction", LOADER_WARN, LOADER_FAIL, False,
                   "{:.0%}", lambda x, r: (f"each step spent {num(v[r]['loader_ms_per_step'])} ms in DataLoader.__next__, "
                                           f"{pct(x)} of the step ({num(v[r]['step_ms'])} ms): the loader did not keep up"
                                           if x > LOADER_WARN else
                                           f"DataLoader.__next__ took {pct(x)} of the step"),
                   "Raise num_workers (chapter 2's sweep), pack small files into shards, keep 1.2x headroom.",
                   "no DataLoader.__next__ in the window (an iterator of your own is not annotated)")]
    per = _per_rank(a, "pageable_h2d")
    worst, rank = _worst(per, False)
    if worst is None:
        out.append(Finding(id="data_pipeline/trace_pageable_h2d", value=None, unit="count", verdict="info",
                           threshold="pass <= 0", message="not read: no GPU events", fix="", source=_source(a)))
    else:
        h = v[rank]["h2d"]
        parts = ", ".join(f"{d['count']} {k} ({num(d['bytes'] / 1e6)} MB, {num(d['ns'] / 1e6)} ms)" for k, d in h.items())
        heavy = any((x.get("pageable_mb_per_step") or 0) >= PAGEABLE_MB_WARN
                    or (x.get("pageable_share") or 0) >= PAGEABLE_SHARE_WARN for x in v.values())
        out.append(Finding(id="data_pipeline/trace_pageable_h2d", value=worst, unit="count",
                           verdict="warn" if heavy else "pass",
                           threshold=f"warn when pageable copies move >= {PAGEABLE_MB_WARN:g} MB per step or take >= "
                                     f"{PAGEABLE_SHARE_WARN:.0%} of the window",
                           message=(f"host-to-device copies in the window on rank {rank}: {parts or 'none'}; a pageable "
                                    "copy is staged through a pinned buffer and blocks the host"),
                           fix=("DataLoader(pin_memory=True) and .to(device, non_blocking=True)" if heavy
                                else "Nothing to fix here."), source=_source(a), per_rank=per))
    out.append(_judged("data_pipeline/trace_sync_per_step", a, "sync_per_step", "calls/step", SYNC_WARN, 1e9, False,
                       "{:g}", lambda x, r: (f"{num(x)} synchronising runtime calls per step on rank {r} ("
                                             + ", ".join(f"{k} x{n}" for k, n in v[r]["sync_calls"].items())
                                             + "): each stalls the host until the GPU drains"),
                       "Drop per-step .item() / .cpu() / torch.cuda.synchronize(); log every N steps.",
                       "no GPU events in the window", words=f"pass <= {SYNC_WARN:g} per step, warn above"))
    return out


def communication(a: dict) -> list[Finding]:
    v = a["ranks"]

    def types(r):
        parts = []
        for k, c in v[r]["collectives"].items():
            bw = f", busbw >= {num(c['busbw_GBps'])} GB/s" if c["busbw_GBps"] else ""
            size = f", {num(c['bytes'] / 1e6)} MB" if c["bytes"] else ""
            parts.append(f"{k} x{c['count']} ({num(c['ms'])} ms{size}, group {c['group'] or '?'}{bw})")
        flag = (f"; {v[r]['comm_on_compute_stream']} collective(s) ran on the compute stream, which serialises them "
                "with compute" if v[r]["comm_on_compute_stream"] else "")
        return (": " + "; ".join(parts) if parts else "") + flag
    out = [_judged("communication/trace_comm_overlap", a, "overlap", "fraction", OVERLAP_WARN, OVERLAP_FAIL, True,
                   "{:.0%}", lambda x, r: f"{pct(x)} of the communication kernels' time ran under compute kernels",
                   "Overlap the gradient reduction with backward: DDP buckets (bucket_cap_mb), FSDP prefetch, "
                   "no collective on the compute stream, no synchronisation between backward and the optimizer.",
                   "no communication kernels in the window (one rank, or CPU-side collectives only)", extra=types)]
    out.append(_judged("communication/trace_exposed_comm", a, "exposed_comm", "fraction", EXPOSED_WARN, EXPOSED_FAIL,
                       False, "{:.0%}", lambda x, r: (f"communication transfers ran alone (not under compute) {pct(x)} "
                                                    "of the window"
                                                    + (f"; a further {pct(v[r]['exposed_wait'])} was collectives waiting "
                                                       "for a late peer, counted in load_balance/trace_collective_wait"
                                                       if v[r].get("exposed_wait") else "")),
                       "Overlap it (above); fewer, larger messages (bucketing); bf16 gradients halve the bytes.",
                       "no communication kernels in the window"))
    return out


def load_balance(a: dict) -> list[Finding]:
    c, v = a["cross"], a["ranks"]
    src = _source(a)
    out = []
    if "step_spread" in c:
        val = c["step_spread"]
        verdict, words = judge(val, warn=SPREAD_WARN, fail=SPREAD_FAIL, higher_is_better=False, fmt="{:.0%}")
        out.append(Finding(id="load_balance/trace_step_spread", value=val, unit="fraction", verdict=verdict,
                           threshold=words, source=src,
                           message=f"the median step time differs by {pct(val)} across ranks on the steps they share, "
                                   "the first left out (slowest: rank "
                                   f"{c['slowest_step_rank']}, {num(v[c['slowest_step_rank']]['step_ms_aligned'])} ms)"
                                   + (f"; {c['alignment']}" if c.get("alignment") else ""),
                           fix="Nothing to fix here." if verdict == "pass" else
                           "Find what the slow rank does more: its data shard, its pipeline stage, its node."))
    if "compute_imbalance" in c:
        val = c["compute_imbalance"]
        verdict, words = judge(val, warn=IMBALANCE_WARN, fail=IMBALANCE_FAIL, higher_is_better=False, fmt="{:.2f}x")
        out.append(Finding(id="load_balance/trace_compute_imbalance", value=val, unit="x", verdict=verdict,
                           threshold=words, source=src, per_rank=c["compute_vs_mean"],
                           message=f"the busiest rank ({c['busiest_rank']}) computes {num(val)}x the mean per step",
                           fix="Nothing to fix here." if verdict == "pass" else
                           "Balance the work: length bucketing (padding), stage partition by profiled layer time."))
    w = c.get("wait")
    if w and w["matched"]:
        last = max(w["last"], key=w["last"].get)
        out.append(_judged("load_balance/trace_collective_wait", a, "wait_share", "fraction", WAIT_WARN, WAIT_FAIL, False,
                           "{:.0%}", lambda x, r: (f"rank {r} spent {pct(x)} of its window in collectives waiting for "
                                                   f"the last peer; rank {last} arrived last at {w['last'][last]} of "
                                                   f"{w['matched']} matched collectives"),
                           f"Look at rank {last}: what makes it late (its data, its stage, its GPU or node: a "
                           "straggler); the others wait for it at every collective.", "no matched collectives"))
    else:                           # always present: a CI gate keys on it
        why = ("one rank's trace cannot show waiting across ranks" if len(v) < 2 else
               c.get("alignment") if c.get("aligned_steps") == [] else
               "no collective was found on two ranks (different process groups, send/recv only, or no collectives)")
        out.append(Finding(id="load_balance/trace_collective_wait", value=None, unit="fraction", verdict="info",
                           threshold=f"pass <= {WAIT_WARN:.0%}, fail > {WAIT_FAIL:.0%}", source=src,
                           fix="Trace every rank (or several) of the job, the same steps on each.",
                           message=f"not read: {why}"))
    cost = straggler_cost(a)
    return out + ([cost] if cost else [])


STRAGGLER_COST = "load_balance/straggler_cost"


def straggler_cost(a: dict) -> Finding | None:
    """``load_balance/straggler_cost`` from the job's traces: S = real / ideal step time of the what-if replay
    (``stragglers_from_trace``), with the cause named. None where the traces cannot give its dependency
    graph: no guess, the reason is in ``a["notes"]`` (and a per-op trace given beside, ``audit --stragglers``,
    keeps its finding of this id)."""
    from preflight.diagnose.stragglers_from_trace import what_if

    w = a.get("stragglers") or what_if({"ranks": a["summaries"], "world_size": a["world_size"]}, str(a["folder"]))
    return Finding(**w["result"]["finding"]) if "result" in w else None


def fault_tolerance(a: dict) -> list[Finding]:
    return [Finding(id="fault_tolerance/trace_evidence", value=None, unit="", verdict="info",
                    threshold="not judged from traces", source=_source(a), fix="Run chapter 5 on the profile.",
                    message="a trace of a few steps cannot show checkpointing, resume or failure handling: "
                            "this chapter's verdicts come from the profile and its measurements")]


CHAPTERS = {"baseline": baseline, "data_pipeline": data_pipeline, "communication": communication,
            "load_balance": load_balance, "fault_tolerance": fault_tolerance}


def findings(a: dict, chapter: str | None = None) -> list[Finding]:
    """The trace findings of one chapter (by its registry name), or of all five."""
    names = [chapter] if chapter else list(CHAPTERS)
    return [f for n in names for f in CHAPTERS[n](a)]
