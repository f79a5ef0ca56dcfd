"""A job's traces analysed: per-rank shares, the cross-rank view, and what each file can support.

Per rank (from its summary, ``preflight.diagnose.trace_rank``): GPU idle share of the window, compute
share, idle split, kernel time by class, achieved TFLOP/s, data-loader time per step, pageable copies,
synchronising calls, communication overlap and exposed communication.

Across ranks, **without trusting the hosts' clocks** (each rank's times are compared only with its own):

- step time spread: (slowest - fastest) / median of the ranks' mean step times;
- compute imbalance: the busiest rank's compute time per step over the mean;
- **collective wait**: the same collective is found on every rank of its group (process group and
  sequence number where the trace has them, else process group, collective type and order), its
  shortest duration is the transfer, and the rest, on each rank, is time spent waiting for the slowest
  peer to arrive. The rank whose copy is the shortest arrived last: counted per rank, it names the
  straggler. Point-to-point send/recv is not matched (its peer is one rank, not a group).
"""
from __future__ import annotations

import statistics

from preflight.core import hardware

# verdict-free bus bandwidth factors (nccl-tests' PERFORMANCE.md): busbw = algbw x factor, n ranks
BUSBW_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
                "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
                "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0, "send_recv": lambda n: 1.0}


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
                "stream_idle_host": _div(ms["host"], span), "stream_idle_other_stream": _div(ms["other_stream"], span),
                "stream_idle_other": _div(ms["other"], span),
                "comm_ms": g["comm_ns"] / 1e6, "overlap": _div(g["overlap_ns"], g["comm_ns"]),
                "exposed_comm": _div(g["comm_ns"] - g["overlap_ns"], span) if g["comm_ns"] else None,
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


def _keys(colls: list[dict]) -> list[tuple]:
    """A cross-rank identity for each collective: (group, seq) when the trace has sequence numbers,
    else (group, type, k-th of that type in the group)."""
    count: dict[tuple, int] = {}
    out = []
    for c in colls:
        if c["seq"] is not None:
            out.append((c["pg"], "seq", c["seq"]))
        else:
            k = (c["pg"], c["type"])
            count[k] = count.get(k, 0) + 1
            out.append((c["pg"], c["type"], count[k]))
    return out


def collective_wait(ranks: dict) -> dict:
    """Matched collectives across ranks: per rank, time waiting for the slowest peer and how often it
    arrived last (see the module's docstring)."""
    table: dict[tuple, dict] = {}
    for r, s in ranks.items():
        colls = [c for c in s["comm"]["collectives"] if c["type"] != "send_recv"]
        for key, c in zip(_keys(colls), colls):
            table.setdefault(key, {})[r] = c["dur_ns"]
    wait = {r: 0 for r in ranks}
    last = {r: 0 for r in ranks}
    matched = 0
    for per in table.values():
        if len(per) < 2:
            continue
        matched += 1
        low = min(per.values())
        for r, d in per.items():
            wait[r] += d - low
        last[min(per, key=per.get)] += 1
    return {"matched": matched, "unmatched": sum(1 for p in table.values() if len(p) < 2), "wait_ns": wait,
            "last": last}


def analyze(job: dict, gpu_key: str | None = None) -> dict:
    """Everything the trace verdicts read: {ranks {r: view}, cross {...}, quality [rows], job facts}."""
    ranks = job["ranks"]
    views = {r: rank_view(s, gpu_key) for r, s in ranks.items()}
    cross: dict = {"ranks": len(ranks)}
    steps = {r: v["step_ms"] for r, v in views.items() if v["step_ms"]}
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
    if len(ranks) >= 2:
        cw = collective_wait(ranks)
        cross["wait"] = cw
        for r, v in views.items():
            base = (v["span_ms"] if v.get("span_ms") else (v["step_ms"] or 0) * v["steps"]) * 1e6
            v["wait_share"] = cw["wait_ns"][r] / base if base and cw["matched"] else None
            v["arrived_last"] = cw["last"][r] if cw["matched"] else None
    return {"folder": job["folder"], "world_size": job["world_size"], "missing": job["missing"],
            "unreadable": job["unreadable"], "notes": job["notes"], "ranks": views, "cross": cross,
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
        if g and not s["flops"]["ops_counted"]:
            why.append("no shapes: no achieved TFLOP/s (record_shapes=True)")
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
                     "world_size": m.get("world_size"), "supports": supports, "limits": why})
    for u in job["unreadable"]:
        rows.append({"rank": None, "file": u["file"], "events": None, "gpu_events": None, "steps": None,
                     "window": None, "device": None, "world_size": None, "supports": [], "limits": [u["why"]]})
    return rows
