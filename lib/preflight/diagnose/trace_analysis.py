"""A job's traces analysed: per-rank shares, the cross-rank view, and what each file can support.

Per rank (from its summary, ``preflight.diagnose.trace_rank``): GPU idle share of the window, compute
share, idle split, kernel time by class, achieved TFLOP/s, data-loader time per step, pageable copies,
synchronising calls, communication overlap and exposed communication.

Across ranks, **without trusting the hosts' clocks** (each rank's times are compared only with its own):

- step time spread: (slowest - fastest) / median of the ranks' mean step times;
- compute imbalance: the busiest rank's compute time per step over the mean;
- **collective wait** (``preflight.diagnose.trace_match``): the same collective matched on every rank
  of its group, on the steps all ranks hold; its shortest copy is the transfer, the rest on each rank
  waiting for the last peer. **Exposed communication is the transfer's part only**: the exposed time
  spent waiting for a late peer is ``exposed_wait`` (a load-balance cause, chapter 4), not chapter 3's.

**Step terms** (``step_terms`` in each rank's view, per step, ms): compute, exposed communication per
collective type (the transfer), collective wait, host-bound / launch-bound / queued GPU idle, data
wait, pipeline idle: what a plan's step-time terms are set beside.
"""
from __future__ import annotations

import statistics

from preflight.core import hardware
from preflight.diagnose import trace_match as M

# verdict-free bus bandwidth factors (nccl-tests' PERFORMANCE.md): busbw = algbw x factor, n ranks
BUSBW_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
                "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
                "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0, "send_recv": lambda n: 1.0}


# a CPU-paced critical path with the GPU idle less than this: the GPU's work is near-critical, the step GPU-bound
JUST_IN_TIME_IDLE = 0.05


def _div(a, b):
    return a / b if b else None


def rank_view(s: dict, gpu_key: str | None = None) -> dict:
    """The shares of one rank's summary. The chip is the one the trace's ``deviceProperties`` name,
    else ``gpu_key`` (a hardware-table key: ``traces --gpu``, or the audit profile's GPU)."""
    g, data, comm, fl = s.get("gpu"), s["data"], s["comm"], s["flops"]
    steps = [x["dur_ns"] for x in s["steps"]]
    step_ns = statistics.fmean(steps) if steps else None
    nsteps = max(1, len(steps))
    out = {"rank": s["meta"]["rank"], "file": ", ".join(s["meta"].get("files") or [s["meta"]["file"]]),
           "step_ms": step_ns / 1e6 if step_ns else None, "steps": len(steps), "window": s["window"]["basis"]}
    if g:
        span = g["span_ns"]
        ms = g["main_stream_idle_ns"]
        out |= {"span_ms": span / 1e6, "idle": _div(g["idle_ns"], span), "compute": _div(g["compute_ns"], span),
                "idle_host": _div(g["idle_host_ns"], span), "idle_other": _div(g["idle_other_ns"], span),
                "idle_launch": _div(g.get("idle_launch_ns", 0), span),
                "stream_idle_host": _div(ms["host"], span), "stream_idle_other_stream": _div(ms["other_stream"], span),
                "stream_idle_other": _div(ms["other"], span), "stream_idle_launch": _div(ms.get("launch", 0), span),
                "comm_ms": g["comm_ns"] / 1e6, "overlap": _div(g["overlap_ns"], g["comm_ns"]),
                "exposed_comm": _div(g["comm_ns"] - g["overlap_ns"], span) if g["comm_ns"] else None,
                "exposed_comm_total": _div(g["comm_ns"] - g["overlap_ns"], span) if g["comm_ns"] else None,
                "compute_ms_per_step": g["compute_ns"] / 1e6 / nsteps,
                "class_ms": {c: v["ns"] / 1e6 for c, v in g["classes"].items()}}
    # achieved FLOP/s over the GPU's span, against the dense peak of the dtype carrying most FLOPs
    own = next((hardware.lookup(d).name for d in s["meta"]["devices"] if hardware.lookup(d)), None)
    chip_key = own or gpu_key
    out["chip"] = chip_key
    out["chip_source"] = "trace" if own else ("the one named by --gpu or the profile" if gpu_key else None)
    out["device_names"] = s["meta"]["devices"]
    dtype = max(fl["by_peak_dtype"], key=fl["by_peak_dtype"].get) if fl["by_peak_dtype"] else None
    peak = hardware.peak_tflops(chip_key, dtype) if chip_key and dtype else None
    tflops = fl["total"] / (g["span_ns"] * 1e-9) / 1e12 if g and fl["total"] else None
    mfu = _div(tflops, peak) if tflops else None
    why = _mfu_why(g, fl, chip_key, s["meta"]["devices"], dtype, peak)
    if mfu is not None and mfu > 1:          # more FLOP/s than the chip has: the recorded shapes are not the ops'
        why, mfu = (f"the recorded shapes give {tflops:.4g} TFLOP/s, above {chip_key}'s {dtype} peak of {peak:.4g}: "
                    "shapes that are not the ops' (a hand-edited trace?); MFU not judged"), None
    out |= {"tflops": tflops, "peak_dtype": dtype, "peak_tflops": peak, "mfu": mfu, "mfu_why": why}
    loader = data["loader_ns_per_step"] if data["loader_calls"] else []
    out["loader_ms_per_step"] = statistics.fmean(loader) / 1e6 if loader else None
    out["loader_share"] = _div(statistics.fmean(loader), step_ns) if loader and step_ns else None
    idle0 = data["step_start_idle_ns"]
    out["step_start_idle_ms"] = statistics.fmean(idle0) / 1e6 if idle0 else None
    h2d = data["h2d"]
    out["pageable_h2d"] = h2d.get("pageable", {}).get("count", 0) if g else None
    out["h2d"] = h2d
    out["sync_per_step"] = sum(data["sync_calls"].values()) / nsteps if g or data["sync_calls"] else None
    out["sync_calls"] = data["sync_calls"]
    out["collectives"] = _by_type(comm["by_type"])
    out["comm_on_compute_stream"] = sum(v["on_compute_stream"] for v in comm["by_type"].values())
    out["comm_side"] = next((v["side"] for v in comm["by_type"].values()), None)
    out["send_recv"] = "send_recv" in comm["by_type"]
    out["launch"] = s.get("launch")
    mm = fl.get("matmul_ns")
    out["flop_coverage"] = _div(fl.get("matmul_counted_ns", 0), mm) if mm else None
    pg = h2d.get("pageable", {})
    out["pageable_mb_per_step"] = pg.get("bytes", 0) / 1e6 / nsteps if g else None
    out["pageable_share"] = _div(pg.get("ns", 0), g["span_ns"]) if g else None
    return out


def _mfu_why(g, fl, chip, devices, dtype, peak) -> str | None:
    if not g:
        return "no GPU events in the window"
    if not fl["ops_counted"]:
        return ("the trace recorded no shapes (profile with record_shapes=True)" if fl["ops_without_shapes"]
                else "no matmul, convolution or attention op with shapes in the window")
    if not chip:
        return (f"the chip {devices[0]!r} is not in the hardware table (python -m preflight chips; --gpu KEY names it)"
                if devices else "the trace has no deviceProperties: name the chip with --gpu KEY")
    if peak is None:
        return f"the table has no {dtype} peak for {chip}"
    return None


def _by_type(by: dict) -> dict:
    out = {}
    for kind, v in by.items():
        n = v.get("group") or 0
        algbw = v["bytes"] / (v["ns"] * 1e-9) / 1e9 if v["bytes_known"] == v["count"] and v["ns"] and v["bytes"] else None
        f = BUSBW_FACTOR.get(kind)
        out[kind] = {"count": v["count"], "ms": v["ns"] / 1e6, "bytes": v["bytes"] if v["bytes_known"] else None,
                     "group": v.get("group"), "side": v["side"], "on_compute_stream": v["on_compute_stream"],
                     "busbw_GBps": algbw * f(n) if algbw and f and n and n > 1 else None}
    return out


def collective_wait(ranks: dict, common: set | None = None) -> dict:
    """Matched collectives across ranks (``trace_match.collective_wait``)."""
    return M.collective_wait(ranks, common)


def _split_wait(v: dict, s: dict, cw: dict | None, r) -> None:
    """The exposed communication without the waiting for late peers; the wait's shares; the step terms."""
    g = s.get("gpu")
    span = g["span_ns"] if g else None
    ex_wait = 0
    if g and cw and cw["matched"]:
        ex_wait = min(cw["exposed_wait_ns"][r], g["comm_ns"] - g["overlap_ns"])
        v["exposed_comm"] = _div(g["comm_ns"] - g["overlap_ns"] - ex_wait, span) if g["comm_ns"] else None
    v["exposed_wait"] = _div(ex_wait, span) if g and g["comm_ns"] else None
    by_wait = (cw["exposed_wait_by_type"][r] if cw and cw["matched"] else {})
    v["exposed_ms_by_type"] = {k: max(0, t.get("exposed_ns", 0) - by_wait.get(k, 0)) / 1e6
                               for k, t in s["comm"]["by_type"].items() if t["side"] == "gpu"}
    crit = s.get("critical_path")
    if crit and crit["total_ns"]:
        waits = (cw["wait_by_coll"][r] if cw and cw["matched"] else {})
        on_wait = sum(min(ns, waits.get(j, 0)) for j, ns in crit["comm_on_path"])
        parts = dict(crit["ns"]) | {"comm": crit["ns"]["comm"] - on_wait, "wait": on_wait}
        total = crit["total_ns"]
        bound = max(("cpu", "compute", "communication"), key=lambda k: {"cpu": parts["cpu"], "compute":
                    parts["compute"] + parts["copy"], "communication": parts["comm"] + parts["wait"]}[k])
        note = None
        if bound == "cpu" and v.get("idle") is not None and v["idle"] < JUST_IN_TIME_IDLE:
            # the CPU paces the GPU with almost no slack: the GPU's own work is as long as the path
            note = (f"the CPU launches each kernel just in time, but the GPU was busy {1 - v['idle']:.0%} of the window: "
                    "its own work sets the step within the idle share")
            bound = "compute" if (v.get("compute") or 0) >= (v.get("exposed_comm_total") or 0) else "communication"
        shares = {k: x / total for k, x in parts.items()}
        own = {"cpu": shares["cpu"], "compute": shares["compute"] + shares["copy"],
               "communication": shares["comm"] + shares["wait"]}[bound]
        v["critical"] = {"bound": bound, "shares": shares, "total_ms": total / 1e6, "chain": crit["chain"], "note": note,
                         "bound_share": 1 - v["idle"] if note else own}
    else:
        v["critical"] = None
    n = max(1, v["steps"])
    if g:
        per = (lambda ns: ns / 1e6 / n)
        v["step_terms"] = {
            "step_ms": v.get("step_ms"), "compute_ms": per(g["compute_ns"]),
            "exposed_comm_ms_by_type": {k: x / n for k, x in v["exposed_ms_by_type"].items()},
            "collective_wait_ms": per(cw["wait_ns"][r]) if cw and cw["matched"] else None,
            "host_bound_idle_ms": per(g["idle_host_ns"]), "launch_bound_idle_ms": per(g.get("idle_launch_ns", 0)),
            "queued_idle_ms": per(g["idle_other_ns"]),
            "data_wait_ms": v["loader_ms_per_step"], "pipeline_idle_ms": per(g["idle_other_ns"]) if v["send_recv"] else 0.0}
    else:
        v["step_terms"] = None


def analyze(job: dict, gpu_key: str | None = None) -> dict:
    """Everything the trace verdicts read: {ranks {r: view}, cross {...}, quality [rows], job facts}.
    ``gpu_key``: the chip named for these traces (``traces --gpu``) where a trace names none."""
    ranks = job["ranks"]
    views = {r: rank_view(s, gpu_key) for r, s in ranks.items()}
    cross: dict = {"ranks": len(ranks)}
    common, note = M.aligned(ranks)
    cross["aligned_steps"] = sorted(common) if common is not None else None
    cross["alignment"] = note
    steps = {r: ns / 1e6 for r, ns in M.step_times(ranks, common).items()} if common is None or common else {}
    for r, ms in steps.items():
        views[r]["step_ms_aligned"] = ms
    if len(steps) >= 2:
        med = statistics.median(steps.values())
        cross["step_spread"] = (max(steps.values()) - min(steps.values())) / med if med else None
        cross["slowest_step_rank"] = max(steps, key=steps.get)
    comp = {r: v["compute_ms_per_step"] for r, v in views.items() if v.get("compute_ms_per_step")}
    if len(comp) >= 2:
        mean = statistics.fmean(comp.values())
        cross["compute_imbalance"] = max(comp.values()) / mean
        cross["compute_vs_mean"] = {str(r): c / mean for r, c in comp.items()}
        cross["busiest_rank"] = max(comp, key=comp.get)
    cw = None
    if len(ranks) >= 2:
        cw = M.collective_wait(ranks, common)
        cross["wait"] = {k: cw[k] for k in ("matched", "unmatched", "wait_ns", "last", "exposed_wait_ns")}
        for r, v in views.items():
            base = (v["span_ms"] if v.get("span_ms") else (v["step_ms"] or 0) * v["steps"]) * 1e6
            v["wait_share"] = min(1.0, cw["wait_ns"][r] / base) if base and cw["matched"] else None
            v["arrived_last"] = cw["last"][r] if cw["matched"] else None
    for r, v in views.items():
        _split_wait(v, ranks[r], cw, r)
    notes = list(job["notes"]) + ([note] if note else [])
    return {"folder": job["folder"], "world_size": job["world_size"], "missing": job["missing"],
            "unreadable": job["unreadable"], "notes": notes, "ranks": views, "cross": cross,
            "quality": quality(job), "summaries": ranks}


def quality(job: dict) -> list[dict]:
    """Per file: which verdicts it can support, and why not."""
    rows = []
    for r, s in sorted(job["ranks"].items()):
        m, g = s["meta"], s.get("gpu")
        why = []
        if not g:
            why.append("no GPU events: no idle, overlap or MFU (CPU-side steps, loader and collectives still read)")
        if s["window"]["steps_in_trace"] == 0:
            why.append("no ProfilerStep: no per-step figures (call prof.step() each step)")
        elif s["window"]["steps_in_trace"] == 1:
            why.append("one step: the window is every event (trace 3 or more steps)")
        elif s["window"]["steps"] == 1:
            why.append("one step in the window (the last of the trace's two is dropped): per-step figures and the "
                       "spread rest on a single step (trace 3 or more)")
        for fld, d in sorted((s.get("dropped") or {}).items()):
            why.append(f"dropped as malformed: {d['count']} x {d['kind']}, field {fld.split(': ', 1)[-1]} (first: event "
                       f"#{d['first']}, {d['why']})")
        if s["window"].get("unlaunched_in_window"):
            why.append(f"{s['window']['unlaunched_in_window']} GPU events ran in the window without their launch in the "
                       "trace: left out, as HTA does (the idle share reads higher than the GPU's)")
        fl = s["flops"]
        cov = _div(fl.get("matmul_counted_ns", 0), fl.get("matmul_ns")) if fl.get("matmul_ns") else None
        if g and not fl["ops_counted"]:
            why.append("no shapes: no achieved TFLOP/s (record_shapes=True)")
        elif cov is not None and cov < 0.95:
            why.append(f"FLOPs countable for {cov:.0%} of the matmul / conv / attention kernel time (the rest ran under "
                       "no op with shapes: Triton templates, fused or custom ops): MFU is a lower bound")
        if m.get("rank_source") != "distributedInfo":
            why.append(f"rank from {m.get('rank_source')}, not from distributedInfo")
        if g and not s["comm"]["collectives"] and (job["world_size"] or 1) > 1:
            why.append("no collective kernels in the window")
        gpu_comm = any(c.get("side") == "gpu" for c in s["comm"]["collectives"])
        if s["comm"]["collectives"] and not gpu_comm:
            why.append("CPU-side collectives only (gloo, or no GPU activity): no overlap or exposed communication; "
                       "their wait across ranks is still read")
        supports = [c for c, ok in (("baseline", bool(g)), ("data_pipeline", bool(s["steps"] or g)),
                                    ("communication", gpu_comm),
                                    ("load_balance", len(job["ranks"]) >= 2)) if ok]
        rows.append({"rank": r, "file": ", ".join(m.get("files") or [m["file"]]), "events": s["events"],
                     "gpu_events": s["window"]["gpu_events"], "steps": s["window"]["steps"],
                     "window": s["window"]["basis"], "device": ", ".join(m["devices"]) or None,
                     "world_size": m.get("world_size"), "supports": supports, "limits": why,
                     "flops_countable_share": cov, "dropped": sum(d["count"] for d in (s.get("dropped") or {}).values())})
    for u in job["unreadable"]:
        rows.append({"rank": None, "file": u["file"], "events": None, "gpu_events": None, "steps": None,
                     "window": None, "device": None, "world_size": None, "supports": [], "limits": [u["why"]]})
    return rows
