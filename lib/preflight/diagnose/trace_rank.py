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

from preflight.diagnose.intervals import before, both, length, union
from preflight.diagnose.trace_file import SYNC_CALLS, RankEvents
from preflight.diagnose.trace_kernels import (
    CLASSES,
    PEAK_DTYPE,
    collective_type,
    dtype_bytes,
    kernel_class,
    op_flops,
    short_dtype,
)

SUMMARY_VERSION = 5
_H2D_KIND = (("Pageable", "pageable"), ("Pinned", "pinned"), ("Host", "host (pageable or pinned: not said)"))


# --- the window --------------------------------------------------------------------------------------------

def window(ev: RankEvents) -> dict:
    """The window's steps, CPU range and the mask of the GPU events in it (see the module's docstring)."""
    steps = ev.steps
    g = ev.gpu
    launch, known = _launch_ts(ev)
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
    return {"steps": kept, "cpu_lo": lo, "cpu_hi": hi, "mask": mask, "launch": launch, "basis": basis,
            "unlaunched": unlaunched}



def _launch_ts(ev: RankEvents) -> tuple[np.ndarray, np.ndarray]:
    """For each GPU event, the start of the runtime call that launched it (same ``correlation``), else
    its own start; and whether that launch is in the trace."""
    g, r = ev.gpu, ev.runtime
    out = g["ts"].copy()
    hit = np.zeros(len(out), bool)
    if len(r["corr"]) and len(g["corr"]):
        o = np.argsort(r["corr"], kind="stable")
        rc, rts = r["corr"][o], r["ts"][o]
        i = np.clip(np.searchsorted(rc, g["corr"]), 0, len(rc) - 1)
        hit = (rc[i] == g["corr"]) & (g["corr"] >= 0)
        out[hit] = rts[i[hit]]
    return out, hit


# --- the summary -------------------------------------------------------------------------------------------

def summarize(ev: RankEvents) -> dict:
    """The sums of one file (see the module's docstring): JSON-ready, small (kilobytes) whatever the
    trace's size."""
    w = window(ev)
    g = ev.gpu
    m = w["mask"]
    ts, end = g["ts"][m], g["ts"][m] + g["dur"][m]
    names = [n for n, k in zip(g["name"], m) if k]
    cats = [c for c, k in zip(g["cat"], m) if k]
    args = [a for a, k in zip(g["args"], m) if k]
    streams, launch = g["stream"][m], w["launch"][m]
    seen: dict[tuple, str] = {}
    cls = np.array([seen.get((n, c)) or seen.setdefault((n, c), kernel_class(n, c)) for n, c in zip(names, cats)],
                   dtype=object)
    meta = dict(ev.meta)
    meta["start_ns"] = int(ev.steps[0]["ts"]) if ev.steps else (int(g["ts"].min()) if len(g["ts"]) else None)
    out = {"version": SUMMARY_VERSION, "meta": meta, "events": ev.events, "dropped": dict(ev.dropped),
           "kernel_names": _kernel_names(g),
           "window": {"basis": w["basis"], "steps": len(w["steps"]), "steps_in_trace": len(ev.steps),
                      "gpu_events": int(m.sum()), "unlaunched_in_window": w["unlaunched"]},
           "steps": [{"name": s["name"], "dur_ns": s["dur"]} for s in w["steps"]],
           "step_names": [s["name"] for s in ev.steps],
           "gpu": _gpu(ts, end, cls, streams, launch, names) if len(ts) else None,
           "flops": _flops(ev, w),
           "data": _data(ev, w, ts, end, names, cats, args, launch),
           "comm": _comm(ts, end, cls, streams, names, args, ev, w),
           "timeline": _timeline(w, ts, end, cls, launch)}
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
    comp = cls == "matmul"
    comp |= cls == "memory"
    u_comp, u_comm = union(ts[comp], end[comp]), union(ts[cls == "comm"], end[cls == "comm"])
    # idle gaps of the whole GPU: host-bound when the event that ends the gap was launched after it began
    host = other = 0
    gs, ge = busy[1][:-1], busy[0][1:]
    if len(gs):
        order = np.argsort(ts, kind="stable")
        first = np.searchsorted(ts[order], ge)          # the events that start when each gap ends
        starter = order[np.clip(first, 0, len(ts) - 1)]
        hb = launch[starter] >= gs
        host, other = int((ge - gs)[hb].sum()), int((ge - gs)[~hb].sum())
    # the compute stream (most compute time): its gaps, split host-bound / another stream running / other
    main = _main_stream(ts, end, comp, streams)
    sidle = {"host": 0, "other_stream": 0, "other": 0}
    if main is not None:
        on = np.flatnonzero(streams == main)
        on = on[np.argsort(ts[on], kind="stable")]
        reach = np.maximum.accumulate(end[on])
        gap_s, gap_e, nxt = reach[:-1], ts[on][1:], on[1:]
        pos = gap_e > gap_s
        rest = union(ts[streams != main], end[streams != main])
        a, b, k = gap_s[pos], gap_e[pos], nxt[pos]
        hb = launch[k] >= a
        cov = before(rest, b) - before(rest, a)
        sidle = {"host": int((b - a)[hb].sum()), "other_stream": int(cov[~hb].sum()),
                 "other": int((b - a - cov)[~hb].sum())}
    by = {c: {"ns": int((end - ts)[cls == c].sum()), "count": int((cls == c).sum())} for c in CLASSES}
    top: dict[str, list] = {}
    for n, c, d in zip(names, cls, end - ts):
        t = top.setdefault(n, [c, 0, 0])
        t[1] += int(d)
        t[2] += 1
    top_k = sorted(top.items(), key=lambda kv: -kv[1][1])[:12]
    return {"span_ns": span, "busy_ns": length(busy), "idle_ns": span - length(busy), "idle_host_ns": host,
            "idle_other_ns": other, "compute_ns": length(u_comp), "comm_ns": length(u_comm),
            "overlap_ns": both(u_comm, u_comp), "main_stream": main, "main_stream_idle_ns": sidle,
            "classes": by, "top_kernels": [{"name": n[:160], "class": c, "ns": t, "count": k}
                                           for n, (c, t, k) in top_k]}


def _main_stream(ts, end, comp, streams):
    if not comp.any():
        return None
    ids, inv = np.unique(streams[comp], return_inverse=True)
    return int(ids[np.argmax(np.bincount(inv, weights=(end - ts)[comp]))])


def _in_cpu_window(t, w) -> bool:
    return w["cpu_lo"] is None or w["cpu_lo"] <= t < w["cpu_hi"]


def _flops(ev: RankEvents, w) -> dict:
    total, by_dtype, counted, skipped = 0, {}, 0, 0
    for op in ev.flop_ops:
        if not _in_cpu_window(op["ts"], w):
            continue
        f = op_flops(op["name"], op["dims"] or [], op["concrete"]) if op["dims"] else None
        if f is None:
            skipped += 1
            continue
        counted += 1
        total += f
        dt = next((short_dtype(t) for t in (op["types"] or []) if short_dtype(str(t))), None)
        key = PEAK_DTYPE.get(dt or "", "unknown")
        by_dtype[key] = by_dtype.get(key, 0) + f
    return {"total": total, "by_peak_dtype": by_dtype, "ops_counted": counted, "ops_without_shapes": skipped}


def _data(ev, w, ts, end, names, cats, args, launch) -> dict:
    steps = w["steps"]
    loader = [_clipped(ev.loader, s["ts"], s["ts"] + s["dur"]) for s in steps]
    if not steps:
        loader = [sum(c["dur"] for c in ev.loader)] if ev.loader else []
    # GPU idle when each step starts: before the first GPU event it launched
    start_idle = []
    if len(ts):
        order = np.argsort(ts, kind="stable")
        reach = np.maximum.accumulate(end[order])
        for s in steps:
            mine = np.flatnonzero(launch[order] >= s["ts"])
            if len(mine) and mine[0] > 0:
                start_idle.append(max(0, int(ts[order][mine[0]] - reach[mine[0] - 1])))
    h2d = {}
    for n, c, a, t0, t1 in zip(names, cats, args, ts, end):
        if c == "gpu_memcpy" and "HtoD" in n:
            kind = next((v for k, v in _H2D_KIND if f"({k}" in n), "other")
            d = h2d.setdefault(kind, {"count": 0, "bytes": 0, "ns": 0})
            d["count"] += 1
            d["bytes"] += int(a.get("bytes", 0) or 0)
            d["ns"] += int(t1 - t0)
    sync: dict[str, int] = {}
    r = ev.runtime
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


def _coll_bytes(a: dict, kind: str) -> int | None:
    """Bytes a collective moves as nccl-tests counts them: the input (a reduce-scatter reduces all of it,
    each rank keeping 1/n), the output for an all-gather."""
    size = dtype_bytes(a.get("dtype"))
    n = a.get("In msg nelems")
    if size is None or not isinstance(n, int):
        return None
    if kind == "all_gather" and isinstance(a.get("Out msg nelems"), int):
        return int(a["Out msg nelems"]) * size
    return n * size


def _comm(ts, end, cls, streams, names, args, ev, w) -> dict:
    """Per collective type: count, time, bytes; the collectives in order (for matching across ranks)."""
    colls = []
    comm = np.flatnonzero(cls == "comm") if len(ts) else np.array([], int)
    main = _main_stream(ts, end, (cls == "matmul") | (cls == "memory"), streams) if len(ts) else None
    for i in comm[np.argsort(ts[comm], kind="stable")] if len(comm) else []:
        a = args[i]
        kind = collective_type(names[i], a.get("Collective name"))
        seq = a.get("Seq", a.get("Sequence number"))
        colls.append({"type": kind, "pg": str(a.get("Process Group Name", "")), "seq": seq,
                      "dur_ns": int(end[i] - ts[i]), "bytes": _coll_bytes(a, kind),
                      "group": a.get("Group size"), "on_compute_stream": bool(main is not None and streams[i] == main),
                      "side": "gpu"})
    if not len(ts):                 # no GPU activity at all: the CPU side's collectives (gloo, a CPU-only trace)
        for c in sorted(ev.cpu_comms, key=lambda c: c["ts"]):
            if c["name"] == "record_param_comms" or not _in_cpu_window(c["ts"], w):
                continue
            colls.append({"type": collective_type(c["name"]), "pg": str(c["args"].get("Process Group Name", "")),
                          "seq": c["args"].get("Seq"), "dur_ns": int(c["dur"]), "bytes": None, "group": None,
                          "on_compute_stream": False, "side": "cpu"})
    by: dict[str, dict] = {}
    for c in colls:
        d = by.setdefault(c["type"], {"count": 0, "ns": 0, "bytes": 0, "bytes_known": 0, "group": c["group"],
                                      "on_compute_stream": 0, "side": c["side"]})
        d["count"] += 1
        d["ns"] += c["dur_ns"]
        d["on_compute_stream"] += int(c["on_compute_stream"])
        if c["bytes"] is not None:
            d["bytes"] += c["bytes"]
            d["bytes_known"] += 1
    return {"by_type": by, "collectives": colls}


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
