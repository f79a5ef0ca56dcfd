"""One rank's trace, summarised: the sums the five chapters' trace verdicts are made of.

**The window** (Holistic Trace Analysis's convention, so the numbers compare): every
``ProfilerStep#N`` but the last (the profiler's stop often cuts it), and the GPU events whose
launching runtime call began in those steps (a GPU event without a launch record counts by its own
start); a trace with no step or one step: every GPU event. A share "of the window" is of the GPU's
span in it: from its first GPU event's start to its last one's end.

Every time here is integer nanoseconds, and every number is a **sum** (time, count, bytes, FLOPs) or
a list: the summaries of several files of one rank add up (:func:`merge`), and a share is computed
only when a verdict is made (``preflight.chapters.traces``). Intervals are merged into their union
before they are measured, so two streams busy at once count once: ``|A and B| = |A| + |B| - |A or B|``.
"""
from __future__ import annotations

import numpy as np

from preflight.diagnose import trace_comm as C
from preflight.diagnose import trace_launch as L
from preflight.diagnose.intervals import both, length, union
from preflight.diagnose.trace_critical import critical_path
from preflight.diagnose.trace_file import SYNC_CALLS, RankEvents
from preflight.diagnose.trace_kernels import CLASSES, PEAK_DTYPE, kernel_class, op_flops, short_dtype

SUMMARY_VERSION = 7
_H2D_KIND = (("Pageable", "pageable"), ("Pinned", "pinned"), ("Host", "host (pageable or pinned: not said)"))
BLOCKING_COPY = "Memcpy DtoH (Device -> Pageable)"       # the host waits for it: a synchronising copy


# --- the window --------------------------------------------------------------------------------------------

def window(ev: RankEvents) -> dict:
    """The window's steps, CPU range and the mask of the GPU events in it (see the module's docstring)."""
    steps = ev.steps
    g = ev.gpu
    lz = launches(ev)
    launch, known = lz["ts"], lz["known"]
    unlaunched = 0
    if len(steps) >= 2:
        lo, hi = steps[0]["ts"], steps[-1]["ts"]
        mask = known & (launch >= lo) & (launch < hi)
        unlaunched = int((~known & (g["ts"] >= lo) & (g["ts"] < hi)).sum())
        kept = steps[:-1]
        basis = f"{len(kept)} of {len(steps)} steps ({kept[0]['name']}..{kept[-1]['name']}; the last one is dropped)"
    else:
        lo, hi = (steps[0]["ts"], steps[0]["ts"] + steps[0]["dur"]) if steps else (None, None)
        mask = np.ones(len(g["ts"]), bool)
        kept = steps
        basis = "every GPU event (" + ("one step" if steps else "no ProfilerStep") + " in the trace)"
    return {"steps": kept, "cpu_lo": lo, "cpu_hi": hi, "mask": mask, "launch": launch, "launches": lz,
            "basis": basis, "unlaunched": unlaunched}


def launches(ev: RankEvents) -> dict:
    """For each GPU event, the runtime call that launched it (same ``correlation``): its start (else the
    event's own start), end, thread and name, and whether that launch is in the trace."""
    g, r = ev.gpu, ev.runtime
    n = len(g["ts"])
    out = {"ts": g["ts"].copy(), "end": g["ts"].copy(), "tid": np.full(n, -1, np.int64), "known": np.zeros(n, bool),
           "row": np.full(n, -1, np.int64)}
    if len(r["corr"]) and n:
        o = np.argsort(r["corr"], kind="stable")
        rc = r["corr"][o]
        i = np.clip(np.searchsorted(rc, g["corr"]), 0, len(rc) - 1)
        hit = (rc[i] == g["corr"]) & (g["corr"] >= 0)
        row = o[i[hit]]
        out["ts"][hit] = r["ts"][row]
        out["end"][hit] = r["ts"][row] + r["dur"][row]
        if "tid" in r and len(r["tid"]) == len(r["ts"]):
            out["tid"][hit] = r["tid"][row]
        out["known"], out["row"][hit] = hit, row
    return out


def step_number(s: dict) -> int | None:
    if isinstance(s.get("num"), int):
        return s["num"]
    tail = str(s.get("name", "")).rpartition("#")[2]
    return int(tail) if tail.isdigit() else None


# --- the summary -------------------------------------------------------------------------------------------

def summarize(ev: RankEvents) -> dict:
    """The sums of one file (see the module's docstring): JSON-ready, small (kilobytes) whatever the
    trace's size."""
    w = window(ev)
    g = ev.gpu
    m = w["mask"]
    lz = {k: v[m] for k, v in w["launches"].items()}
    ts, end = g["ts"][m], g["ts"][m] + g["dur"][m]
    names = [n for n, k in zip(g["name"], m) if k]
    cats = [c for c, k in zip(g["cat"], m) if k]
    args = [a for a, k in zip(g["args"], m) if k]
    streams, launch = g["stream"][m], lz["ts"]
    seen: dict[tuple, str] = {}
    cls = np.array([seen.get((n, c)) or seen.setdefault((n, c), kernel_class(n, c)) for n, c in zip(names, cats)],
                   dtype=object)
    meta = dict(ev.meta)
    meta["start_ns"] = int(ev.steps[0]["ts"]) if ev.steps else (int(g["ts"].min()) if len(g["ts"]) else None)
    comm = _comm(ts, end, cls, streams, names, args, lz, ev, w)
    comm["segments"] = _segments(ts, end, cls, lz["ts"], w, comm["collectives"])
    out = {"version": SUMMARY_VERSION, "meta": meta, "events": ev.events, "dropped": dict(ev.dropped),
           "kernel_names": _kernel_names(g),
           "window": {"basis": w["basis"], "steps": len(w["steps"]), "steps_in_trace": len(ev.steps),
                      "gpu_events": int(m.sum()), "unlaunched_in_window": w["unlaunched"]},
           "steps": [{"name": s["name"], "num": step_number(s), "dur_ns": s["dur"]} for s in w["steps"]],
           "step_names": [s["name"] for s in ev.steps],
           "gpu": _gpu(ts, end, cls, streams, launch, names) if len(ts) else None,
           "launch": L.launch_stats(ts, end, launch, lz["end"], lz["known"], cats, len(w["steps"])) if len(ts) else None,
           "flops": _flops(ev, w, ts, end, cls, lz),
           "data": _data(ev, w, ts, end, names, cats, args, lz),
           "comm": comm,
           "timeline": _timeline(w, ts, end, cls, launch),
           "critical_path": critical_path(ev, w, ts, end, cls, streams, names, lz, comm) if len(ts) else None}
    return out


def _kernel_names(g: dict, limit: int = 64) -> list[str]:
    """The names of the kernels that took the most time (the whole trace): one job's ranks share them."""
    tot: dict[str, int] = {}
    for n, c, d in zip(g["name"], g["cat"], g["dur"].tolist()):
        if c == "kernel":
            tot[n] = tot.get(n, 0) + d
    return [n[:160] for n, _ in sorted(tot.items(), key=lambda kv: -kv[1])[:limit]]


TIMELINE_INTERVALS = 300          # per lane: enough for a picture, kilobytes in the summary


def _timeline(w, ts, end, cls, launch) -> dict | None:
    """The first step of the window as lanes of busy intervals (ns from the step's first GPU event):
    compute (matmul and memory-bound kernels), communication, copies; the smallest gaps merged so each
    lane keeps at most ``TIMELINE_INTERVALS`` intervals."""
    if not len(ts):
        return None
    sel = np.ones(len(ts), bool)
    name = "window"
    if w["steps"]:
        s = w["steps"][0]
        sel = (launch >= s["ts"]) & (launch < s["ts"] + s["dur"])
        name = s["name"]
    if not sel.any():
        return None
    t0, t1 = int(ts[sel].min()), int(end[sel].max())
    lanes = {}
    for lane, pick in (("compute", (cls == "matmul") | (cls == "memory")), ("communication", cls == "comm"),
                       ("copies", cls == "copy")):
        u0, u1 = union(ts[sel & pick] - t0, end[sel & pick] - t0)
        if len(u0) > TIMELINE_INTERVALS:
            gaps = u0[1:] - u1[:-1]
            cut = np.partition(gaps, -(TIMELINE_INTERVALS - 1))[-(TIMELINE_INTERVALS - 1)]
            keep = np.concatenate([[True], gaps >= cut])
            idx = np.flatnonzero(keep)
            u0, u1 = u0[idx], np.maximum.reduceat(u1, idx)
        lanes[lane] = [[int(a), int(b)] for a, b in zip(u0, u1)]
    return {"step": name, "span_ns": t1 - t0, "lanes": lanes}


def _gpu(ts, end, cls, streams, launch, names) -> dict:
    busy = union(ts, end)
    span = int(end.max() - ts.min())
    comp = (cls == "matmul") | (cls == "memory")
    u_comp, u_comm = union(ts[comp], end[comp]), union(ts[cls == "comm"], end[cls == "comm"])
    idle = L.gpu_idle(ts, end, launch)
    main = main_stream(ts, end, comp, streams)
    by = {c: {"ns": int((end - ts)[cls == c].sum()), "count": int((cls == c).sum())} for c in CLASSES}
    top: dict[str, list] = {}
    for n, c, d in zip(names, cls, end - ts):
        t = top.setdefault(n, [c, 0, 0])
        t[1] += int(d)
        t[2] += 1
    top_k = sorted(top.items(), key=lambda kv: -kv[1][1])[:12]
    return {"span_ns": span, "busy_ns": length(busy), "idle_ns": span - length(busy), "idle_host_ns": idle["host"],
            "idle_launch_ns": idle["launch"], "idle_other_ns": idle["queued"], "compute_ns": length(u_comp),
            "comm_ns": length(u_comm), "overlap_ns": both(u_comm, u_comp), "main_stream": main,
            "main_stream_idle_ns": L.stream_idle(ts, end, streams, launch, main), "classes": by,
            "top_kernels": [{"name": n[:160], "class": c, "ns": t, "count": k} for n, (c, t, k) in top_k]}


def main_stream(ts, end, comp, streams):
    """The stream that ran the most compute time (None without compute)."""
    if not comp.any():
        return None
    ids, inv = np.unique(streams[comp], return_inverse=True)
    return int(ids[np.argmax(np.bincount(inv, weights=(end - ts)[comp]))])


def _in_cpu_window(t, w) -> bool:
    return w["cpu_lo"] is None or w["cpu_lo"] <= t < w["cpu_hi"]


def _flops(ev: RankEvents, w, ts, end, cls, lz) -> dict:
    """FLOPs of the ops with shapes in the window, and how much of the matmul-class kernel time ran
    under an op whose FLOPs were counted (the share MFU rests on)."""
    total, by_dtype, counted, skipped, ops = 0, {}, 0, 0, []
    for op in ev.flop_ops:
        if not _in_cpu_window(op["ts"], w):
            continue
        f = op_flops(op["name"], op["dims"] or [], op["concrete"]) if op["dims"] else None
        if f is None:
            skipped += 1
            continue
        counted += 1
        total += f
        ops.append(op)
        dt = next((short_dtype(t) for t in (op["types"] or []) if short_dtype(str(t))), None)
        key = PEAK_DTYPE.get(dt or "", "unknown")
        by_dtype[key] = by_dtype.get(key, 0) + f
    mm = np.flatnonzero(cls == "matmul") if len(ts) else np.zeros(0, int)
    by_tid = C.annotations_by_thread([{"ts": o["ts"], "dur": o.get("dur", 0), "tid": o.get("tid", -1)} for o in ops])
    under = [i for i in mm if lz["known"][i] and C.enclosing(by_tid, int(lz["tid"][i]), int(lz["ts"][i]))]
    return {"total": total, "by_peak_dtype": by_dtype, "ops_counted": counted, "ops_without_shapes": skipped,
            "matmul_ns": int((end - ts)[mm].sum()), "matmul_counted_ns": int((end - ts)[under].sum()) if under else 0}


def _data(ev, w, ts, end, names, cats, args, lz) -> dict:
    steps = w["steps"]
    loader = [_clipped(ev.loader, s["ts"], s["ts"] + s["dur"]) for s in steps]
    if not steps:
        loader = [sum(c["dur"] for c in ev.loader)] if ev.loader else []
    # GPU idle when each step starts: before the first GPU event it launched
    start_idle = []
    launch = lz["ts"]
    if len(ts):
        order = np.argsort(ts, kind="stable")
        reach = np.maximum.accumulate(end[order])
        for s in steps:
            mine = np.flatnonzero(launch[order] >= s["ts"])
            if len(mine) and mine[0] > 0:
                start_idle.append(max(0, int(ts[order][mine[0]] - reach[mine[0] - 1])))
    h2d = {}
    sync: dict[str, int] = {}
    r = ev.runtime
    for i, (n, c, a, t0, t1) in enumerate(zip(names, cats, args, ts, end)):
        if c != "gpu_memcpy":
            continue
        if "HtoD" in n:
            kind = next((v for k, v in _H2D_KIND if f"({k}" in n), "other")
            d = h2d.setdefault(kind, {"count": 0, "bytes": 0, "ns": 0})
            d["count"] += 1
            d["bytes"] += int(a.get("bytes", 0) or 0)
            d["ns"] += int(t1 - t0)
        elif n.startswith(BLOCKING_COPY):       # unless its launch is a synchronising call, counted below
            row = int(lz["row"][i])
            if row < 0 or not SYNC_CALLS.match(r["name"][row]):
                sync[BLOCKING_COPY] = sync.get(BLOCKING_COPY, 0) + 1
    for name, t in zip(r["name"], r["ts"]):
        if SYNC_CALLS.match(name) and _in_cpu_window(int(t), w):
            sync[name] = sync.get(name, 0) + 1
    return {"loader_ns_per_step": loader, "loader_calls": len(ev.loader),
            "step_start_idle_ns": start_idle, "h2d": h2d, "sync_calls": sync}


def _clipped(calls: list[dict], lo: int, hi: int) -> int:
    """Time of the calls that start in [lo, hi), cut at hi, overlapping calls counted once."""
    s = np.array([c["ts"] for c in calls if lo <= c["ts"] < hi], dtype=np.int64)
    e = np.array([min(c["ts"] + c["dur"], hi) for c in calls if lo <= c["ts"] < hi], dtype=np.int64)
    return length(union(s, e))


def _step_of(t: int, steps: list[dict]):
    for s in steps:
        if s["ts"] <= t < s["ts"] + s["dur"]:
            return step_number(s)
    return None


def _comm(ts, end, cls, streams, names, args, lz, ev, w) -> dict:
    """Per collective type: count, time, exposed time, bytes; the collectives in order, each with its
    step, start in the window and exposed profile (for matching across ranks: ``trace_comm``)."""
    colls = []
    comm = np.flatnonzero(cls == "comm") if len(ts) else np.array([], int)
    comp = (cls == "matmul") | (cls == "memory") if len(ts) else np.zeros(0, bool)
    main = main_stream(ts, end, comp, streams) if len(ts) else None
    u_comp = union(ts[comp], end[comp]) if len(ts) else None
    t_lo = int(ts.min()) if len(ts) else 0
    by_tid = C.annotations_by_thread(ev.cpu_comms)
    for i in comm[np.argsort(ts[comm], kind="stable")] if len(comm) else []:
        anns = C.enclosing(by_tid, int(lz["tid"][i]), int(lz["ts"][i])) if lz["known"][i] else []
        d = C.describe(names[i], args[i], anns)
        colls.append(d | {"dur_ns": int(end[i] - ts[i]), "on_compute_stream": bool(main is not None and streams[i] == main),
                          "side": "gpu", "step": _step_of(int(lz["ts"][i]), w["steps"]), "t0_ns": int(ts[i]) - t_lo,
                          "exposed": C.exposed_profile(int(ts[i]), int(end[i]), u_comp)})
    if not len(ts):                 # no GPU activity at all: the CPU side's collectives (gloo, a CPU-only trace)
        for c in sorted(ev.cpu_comms, key=lambda c: c["ts"]):
            if c["name"] == "record_param_comms" or not _in_cpu_window(c["ts"], w):
                continue
            d = C.describe(c["name"], {}, [c])
            colls.append(d | {"dur_ns": int(c["dur"]), "bytes": None, "on_compute_stream": False, "side": "cpu",
                              "step": _step_of(c["ts"], w["steps"]), "t0_ns": int(c["ts"] - (w["cpu_lo"] or 0)),
                              "exposed": [int(c["dur"]) * k // C.SPLITS for k in range(C.SPLITS + 1)]})
    by: dict[str, dict] = {}
    for c in colls:
        d = by.setdefault(c["type"], {"count": 0, "ns": 0, "exposed_ns": 0, "bytes": 0, "bytes_known": 0,
                                      "group": c["group"], "on_compute_stream": 0, "side": c["side"]})
        d["count"] += 1
        d["ns"] += c["dur_ns"]
        d["exposed_ns"] += c["exposed"][-1] if c["side"] == "gpu" else 0
        d["on_compute_stream"] += int(c["on_compute_stream"])
        if c["bytes"] is not None:
            d["bytes"] += c["bytes"]
            d["bytes_known"] += 1
    return {"by_type": by, "collectives": colls}


SEGMENT_SLACK_NS = 1_000


def _segments(ts, end, cls, launch, w, colls) -> list[dict]:
    """Per step of the window, its compute kernels (matmul and memory-bound) split at the start of each of
    the step's communication kernels: segment j holds the kernels that ended after collective j-1 began and
    by the time collective j began, or up to ``SEGMENT_SLACK_NS`` later (a tie: the collective waited for
    that kernel); the last segment, those that ended later. Each segment is ``[first start,
    last end, busy]`` in ns on the collectives' clock (``t0_ns``), None when empty: the compute between
    collectives that the straggler what-if replays (``stragglers_from_trace``)."""
    if not len(ts) or not w["steps"]:
        return []
    comp = (cls == "matmul") | (cls == "memory")
    t_lo = int(ts.min())
    out = []
    for s in w["steps"]:
        num = step_number(s)
        cuts = np.array(sorted(c["t0_ns"] for c in colls if c["side"] == "gpu" and c["step"] == num), np.int64)
        mine = np.flatnonzero(comp & (launch >= s["ts"]) & (launch < s["ts"] + s["dur"]))
        seg = np.searchsorted(cuts, end[mine] - t_lo - SEGMENT_SLACK_NS, side="left")
        parts = []
        for j in range(len(cuts) + 1):
            k = mine[seg == j]
            parts.append([int(ts[k].min()) - t_lo, int(end[k].max()) - t_lo, length(union(ts[k], end[k]))]
                         if len(k) else None)
        out.append({"step": num, "segments": parts})
    return out


_DESCRIPTIVE = {"main_stream", "group", "basis", "side", "version", "timeline", "first", "why", "kind",
                "kernel_names"}


def merge(parts: list[dict]) -> dict:
    """One rank's summary from the summaries of its files (successive profiling cycles): sums add,
    lists join, the first file's descriptions stay."""
    def add(a, b, key=""):
        if key in _DESCRIPTIVE:
            return a
        if isinstance(a, dict) and isinstance(b, dict):
            return {k: add(a[k], b[k], k) if k in a and k in b else a.get(k, b.get(k)) for k in a.keys() | b.keys()}
        if isinstance(a, list) and isinstance(b, list):
            return a + b
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
            return a + b
        return a if a is not None else b
    out = parts[0]
    for p in parts[1:]:
        out = add(out, {k: v for k, v in p.items() if k not in ("meta", "version")})
    out["meta"] = {**parts[0]["meta"], "files": [p["meta"]["file"] for p in parts]}
    return out
