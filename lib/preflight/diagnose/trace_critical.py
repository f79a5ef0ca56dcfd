"""The critical path of one rank's window: the chain of work that set how long it took.

Walked backwards from the GPU event that ends last. At each GPU event, what it waited for is the
predecessor that finished **last** among:

- the event before it on the **same stream** (stream order: a stream runs its work one at a time);
- the **runtime call that launched it** (launch -> kernel: the CPU had to ask first);
- the latest event that ended before it on **another stream** (a cross-stream dependency: the trace
  has no event-record edges, so the last one to finish is taken, as a cross-stream wait would show).

When the launch is the last to finish, the path goes to the CPU: the launch call, and the host's work
before it on that thread, back to the **synchronising call** (``cudaStreamSynchronize``, ``cudaMemcpy``, the launch of a
copy into pageable host memory...) it last returned from; that call ended when the GPU event before it ended, so the path goes
back to the GPU there (or stops at the window's start). Gaps no predecessor explains are ``idle``.

Each stretch of the path is one kind: ``compute`` (matmul and memory-bound kernels), ``comm``
(collective kernels: the analysis splits each into waiting for a late peer and transfer, with the
cross-rank match, ``trace_analysis``), ``copy``, ``cpu`` (launches and host work), ``idle``. The
kind with the most time says whether the window was CPU-, compute- or communication-bound; the ops
with the most time on the path are the chain to shorten. A path the CPU paces while the GPU idles
less than 5 % of the window (each kernel launched just in time) is called GPU-bound by the analysis:
with so little slack, the GPU's own work is as long as the path (``trace_analysis.JUST_IN_TIME_IDLE``).
HTA builds the same graph with CUDA event edges and per-op CPU nodes
(``hta.analyzers.critical_path_analysis``); ``docs/traces-vs-hta.md`` compares the two.
"""
from __future__ import annotations

import numpy as np

from preflight.diagnose.trace_file import SYNC_CALLS

BLOCKING_COPY = "Memcpy DtoH (Device -> Pageable)"
SEGMENTS = 400            # stretches kept for the picture (the first ones in time)
KIND_OF = {"matmul": "compute", "memory": "compute", "comm": "comm", "copy": "copy"}


def _syncs(ev, names, lz) -> dict:
    """tid -> (ends sorted, starts) of the calls that made the host wait for the GPU: the synchronising
    runtime calls, and the launches of blocking copies (device to pageable host memory)."""
    r = ev.runtime
    tids = r.get("tid") if isinstance(r.get("tid"), np.ndarray) and len(r["tid"]) == len(r["ts"]) else None
    out: dict = {}
    for i, name in enumerate(r["name"]):
        if SYNC_CALLS.match(name):
            tid = int(tids[i]) if tids is not None else -1
            out.setdefault(tid, []).append((int(r["ts"][i] + r["dur"][i]), int(r["ts"][i])))
    for i, name in enumerate(names):
        if lz["known"][i] and name.startswith(BLOCKING_COPY):
            out.setdefault(int(lz["tid"][i]), []).append((int(lz["end"][i]), int(lz["ts"][i])))
    return {t: (np.array([e for e, _ in v]), np.array([s for _, s in v])) for t, v in
            ((t, sorted(v)) for t, v in out.items())}


def critical_path(ev, w, ts, end, cls, streams, names, lz, comm) -> dict | None:
    n = len(ts)
    if not n:
        return None
    lo = int(w["cpu_lo"]) if w["cpu_lo"] is not None else int(ts.min())
    by_end = np.argsort(end, kind="stable")
    end_sorted = end[by_end]
    prev_same = np.full(n, -1, np.int64)
    for s in np.unique(streams):
        on = np.flatnonzero(streams == s)
        on = on[np.argsort(ts[on], kind="stable")]
        prev_same[on[1:]] = on[:-1]
    comm_idx = np.flatnonzero(cls == "comm")
    coll_of = {int(i): j for j, i in enumerate(comm_idx[np.argsort(ts[comm_idx], kind="stable")])}
    syncs = _syncs(ev, names, lz)
    segs: list[tuple[int, int, str, int]] = []          # (start, end, kind, event or -1)
    cur = int(by_end[-1])
    seen: set[int] = set()
    while cur >= 0 and cur not in seen:                 # every step goes to an event that ended no later
        seen.add(cur)
        s0 = int(ts[cur])
        segs.append((s0, int(end[cur]), KIND_OF[cls[cur]], cur))
        if s0 <= lo:
            break
        cands = []
        p = int(prev_same[cur])
        if p >= 0:
            cands.append((min(int(end[p]), s0), "stream", p))
        k = int(np.searchsorted(end_sorted, s0, side="right")) - 1          # latest end <= start, any stream
        while k >= 0 and int(by_end[k]) == cur:
            k -= 1
        if k >= 0:
            cands.append((int(end_sorted[k]), "other", int(by_end[k])))
        if lz["known"][cur]:
            cands.append((min(int(lz["end"][cur]), s0), "launch", cur))
        if not cands:
            break
        t, how, nxt = max(cands, key=lambda c: (c[0], c[1] == "launch"))
        if how != "launch":
            if t < s0:
                segs.append((t, s0, "idle", -1))
            cur = nxt
            continue
        ls = int(lz["ts"][cur])
        segs.append((ls, s0, "cpu", -1))               # the launch call and its latency to the GPU
        cur, stop = _back_through_cpu(syncs, int(lz["tid"][cur]), ls, lo, end_sorted, by_end, segs)
        if stop:
            break
    return _summarise(segs, names, coll_of, lo, int(ts.min()))


def _back_through_cpu(syncs, tid, t, lo, end_sorted, by_end, segs):
    """From CPU time t on a thread, back to the sync call it last returned from (then to the GPU event
    that call waited for), else to the window's start. Returns (next GPU event or -1, stop)."""
    ends, starts = syncs.get(tid, (np.zeros(0, np.int64), np.zeros(0, np.int64)))
    i = int(np.searchsorted(ends, t, side="right")) - 1
    if i < 0 or ends[i] <= lo:
        segs.append((lo, t, "cpu", -1))
        return -1, True
    segs.append((int(ends[i]), t, "cpu", -1))
    k = int(np.searchsorted(end_sorted, ends[i], side="right")) - 1       # the GPU work the call waited for
    if k < 0 or end_sorted[k] < starts[i]:
        segs.append((int(starts[i]), int(ends[i]), "cpu", -1))         # it waited for nothing we saw
        return _back_through_cpu(syncs, tid, int(starts[i]), lo, end_sorted, by_end, segs)
    segs.append((int(end_sorted[k]), int(ends[i]), "cpu", -1))
    return int(by_end[k]), False


def _summarise(segs, names, coll_of, lo, t_lo) -> dict:
    ns = {"compute": 0, "comm": 0, "copy": 0, "cpu": 0, "idle": 0}
    top: dict[tuple, int] = {}
    on_path: dict[int, int] = {}
    last = None
    for a, b, kind, i in segs:                       # walked backwards: clip each stretch to what is left
        if last is not None:
            b = min(b, last)
        if b <= a:
            continue
        ns[kind] += b - a
        last = a
        if i >= 0:
            key = (names[i][:120], kind)
            top[key] = top.get(key, 0) + (b - a)
            if i in coll_of:
                on_path[coll_of[i]] = on_path.get(coll_of[i], 0) + (b - a)
    total = sum(ns.values())
    chain = sorted(top.items(), key=lambda kv: -kv[1])[:8]
    pic = sorted((a - t_lo, b - t_lo, k) for a, b, k, _ in segs if b > a)[:SEGMENTS]
    return {"ns": ns, "total_ns": total, "chain": [{"name": n, "kind": k, "ns": v} for (n, k), v in chain],
            "comm_on_path": [[j, v] for j, v in sorted(on_path.items())],
            "segments": [[int(a), int(b), k] for a, b, k in pic]}
