"""Read one Nsight Systems export (``nsys export --type sqlite``) into the events the Kineto reader
produces (:class:`preflight.diagnose.trace_file.RankEvents`), **one per GPU** of the capture, so every
verdict of ``preflight traces`` reads it unchanged. The file is opened and checked, and its rows read,
by ``preflight.diagnose.nsys_tables``.

What each table becomes (times are integer nanoseconds already):

- ``CUPTI_ACTIVITY_KIND_KERNEL``: GPU events, named by ``demangledName`` (the full name, as Kineto
  writes it), else ``shortName``; ``MEMCPY`` / ``MEMSET``: copies named as Kineto names them
  (``Memcpy HtoD (Pageable -> Device)``), so pageable and pinned copies are told apart the same way;
- ``CUPTI_ACTIVITY_KIND_RUNTIME``: the runtime calls: launches (joined to GPU events by process and
  ``correlationId``) and the synchronising calls (``cudaStreamSynchronize_v3020``...);
- ``NVTX_EVENTS`` ranges (PyTorch's ``emit_nvtx`` names, ``", op_id = N"`` and such suffixes dropped):
  the steps (:data:`STEP`), ``DataLoader ... __next__``, the CPU side of collectives (``nccl:*``,
  ``gloo:*``, ``record_param_comms``) and the FLOP ops (shapes from ``sizes = [...]`` when
  ``emit_nvtx(record_shapes=True)`` recorded them).

**Which GPU a CPU event belongs to.** A runtime call or an NVTX range has a thread, not a GPU: each
thread goes to the GPU most of its launches went to (else its process's), so one process per GPU, as
``torchrun`` runs them, splits exactly. **A collective's type** comes from the ``nccl:<op>`` range its
kernel was launched in (NCCL >= 2.19 runs an all-to-all as ``ncclDevKernel_SendRecv``), else from
the kernel's name.
"""
from __future__ import annotations

import bisect
import json
import re
from pathlib import Path

import numpy as np

from preflight.diagnose.nsys_tables import STEP, Export, check_schema, gpu_names, gpu_rows, nvtx_rows, runtime_rows
from preflight.diagnose.trace_file import RankEvents, TraceError
from preflight.diagnose.trace_kernels import FLOP_OPS, collective_type, kernel_class

_DTYPE_IN_NAME = (("bf16", ("bfloat16", "bf16")), ("fp8", ("e4m3", "e5m2", "fp8")), ("fp16", ("half", "fp16", "f16")),
                  ("fp32", ("float", "tf32", "f32")))
_TYPE_NAME = {"bf16": "c10::BFloat16", "fp16": "c10::Half", "fp8": "c10::Float8_e4m3fn", "fp32": "float"}


def _sizes(text: str):
    """The ``sizes = [[...], ...]`` list of an ``emit_nvtx(record_shapes=True)`` range, or None."""
    i = text.find("sizes = [")
    if i < 0:
        return None
    depth, j = 0, i + 8
    for j in range(i + 8, len(text)):
        depth += {"[": 1, "]": -1}.get(text[j], 0)
        if depth == 0:
            break
    try:
        dims = json.loads(text[i + 8:j + 1])
    except ValueError:
        return None
    return dims if isinstance(dims, list) else None


def _owner(devices, votes_t, votes_p):
    """A thread -> the GPU most of its launches (else its process's) went to; None when it launched nothing."""
    seen: dict = {}

    def own(tid):
        if tid not in seen:
            v = votes_t.get(tid) or (votes_p.get(tid >> 24) if tid is not None else None)
            seen[tid] = devices[0] if len(devices) == 1 else max(v, key=v.get) if v else None
        return seen[tid]
    return own


def _innermost(ranges: list, starts: list, t: int):
    """The type of the innermost collective range [start, end] holding t (ranges sorted by start)."""
    for i in range(bisect.bisect_right(starts, t) - 1, -1, -1):
        if ranges[i][1] >= t:
            return ranges[i][2]
    return None


def _steps(nvtx: list) -> list[dict]:
    """ProfilerStep#N ranges when there are any, else the outermost ranges named like a step (:data:`STEP`)."""
    steps = [r for r in nvtx if STEP.match(r[2])]
    prof = [r for r in steps if r[2].startswith("ProfilerStep#")]
    steps = sorted(prof or steps)
    out, reach = [], -1
    for s, e, name, *_ in steps:
        if s >= reach or prof:
            num = re.search(r"(\d+)$", name)
            out.append({"name": name, "num": int(num.group(1)) if num else len(out), "ts": int(s), "dur": int(e - s)})
            reach = max(reach, e)
    return out


_CLASS: dict[str, str] = {}                        # kernel name -> class: a capture repeats a few hundred names


def _class(name: str) -> str:
    if name not in _CLASS:
        _CLASS[name] = kernel_class(name)
    return _CLASS[name]


def _matmul_dtype(names, durs) -> str | None:
    """The dtype most matmul kernel time names (``cutlass::bfloat16_t``, ``..._bf16_...``), for FLOPs whose
    op ranges record shapes but no types."""
    t: dict[str, int] = {}
    for n, d in zip(names, durs):
        if _class(n) == "matmul":
            low = n.lower()
            dt = next((k for k, words in _DTYPE_IN_NAME if any(w in low for w in words)), None)
            if dt:
                t[dt] = t.get(dt, 0) + int(d)
    return max(t, key=t.get) if t else None


def read_export(path: str | Path) -> tuple[list[RankEvents], dict]:
    """One :class:`RankEvents` per GPU of the export (sorted by device id) and the export's facts
    {schema, product, derived_window, notes}; raises :class:`TraceError` (see the module's docstring)."""
    path = Path(path)
    ex = Export(path)
    notes: list[str] = []
    try:
        info = check_schema(ex)
        gpu = gpu_rows(ex, notes)
        if not gpu:
            raise TraceError(f"{path}: no kernel, copy or memset in the export: nothing ran on a GPU in the capture")
        same_pid = any(g[5] is not None for g in gpu)
        rt = runtime_rows(ex, same_pid, notes)
        nvtx = nvtx_rows(ex, notes)
        names = gpu_names(ex, notes)
    finally:
        ex.db.close()
    pids = {p: i for i, p in enumerate(sorted({g[5] for g in gpu} | {r[3] for r in rt}, key=lambda p: (p is None, p or 0)))}

    def key(pid, corr):
        return (pids[pid] << 32) | (corr & 0xFFFFFFFF) if corr is not None and corr >= 0 else -1
    launch = {key(r[3], r[2]): i for i, r in enumerate(rt)}
    launch.pop(-1, None)
    devices = sorted({g[2] for g in gpu})
    votes_t: dict = {}
    votes_p: dict = {}
    g_launch = [launch.get(key(g[5], g[4])) for g in gpu]
    for g, i in zip(gpu, g_launch):
        if i is not None and rt[i][4] is not None:
            for votes, who in ((votes_t, rt[i][4]), (votes_p, rt[i][4] >> 24)):
                v = votes.setdefault(who, {})
                v[g[2]] = v.get(g[2], 0) + 1
    own = _owner(devices, votes_t, votes_p)
    rt_dev = [own(r[4]) for r in rt]
    nv_dev = [own(r[3]) for r in nvtx]
    lost = rt_dev.count(None), nv_dev.count(None)
    if any(lost):
        notes.append(f"{lost[0]} runtime calls and {lost[1]} NVTX ranges of threads that launched nothing on a GPU: "
                     "left out (no GPU is theirs)")
    colls: dict = {}
    for s, e, name, tid, _ in nvtx:
        if name.startswith(("nccl:", "gloo:", "c10d::")) and collective_type(name) != "unknown":
            colls.setdefault(tid, []).append((s, e, collective_type(name)))
    for v in colls.values():
        v.sort()
    starts = {t: [r[0] for r in v] for t, v in colls.items()}
    tids: dict = {}                                # a thread -> a small integer, as the Kineto reader numbers them
    out = []
    for d in devices:
        ev = RankEvents(str(path), {"file": f"{path.name} GPU {d}", "path": str(path), "rank": None, "rank_source": None,
                                    "world_size": None, "backend": None, "nccl_version": None, "groups": {},
                                    "devices": [names[d]] if d in names else [], "display_unit": "ns",
                                    "record_shapes": False, "nsys": {**info, "device": d}})
        mine = [(g, i) for g, i in zip(gpu, g_launch) if g[2] == d]
        rows = {i for i, o in enumerate(rt_dev) if o == d} | {i for _, i in mine if i is not None}
        rows = sorted(rows)
        args = []
        for g, i in mine:
            a = dict(g[8])
            if g[7] == "kernel" and i is not None and _class(g[6]) == "comm":
                tid, t = rt[i][4], rt[i][0]
                kind = _innermost(colls[tid], starts[tid], t) if tid in colls else None
                if kind:
                    a["Collective name"] = kind
            args.append(a)
        i64 = (lambda xs: np.asarray(xs, dtype=np.int64))
        ev.gpu = {"ts": i64([g[0] for g, _ in mine]), "dur": i64([g[1] - g[0] for g, _ in mine]),
                  "stream": i64([g[3] if g[3] is not None else -1 for g, _ in mine]),
                  "corr": i64([key(g[5], g[4]) for g, _ in mine]), "name": [g[6] for g, _ in mine],
                  "cat": [g[7] for g, _ in mine], "args": args}
        ev.runtime = {"ts": i64([rt[i][0] for i in rows]), "dur": i64([rt[i][1] - rt[i][0] for i in rows]),
                      "corr": i64([key(rt[i][3], rt[i][2]) for i in rows]), "name": [rt[i][5] for i in rows],
                      "tid": i64([tids.setdefault(rt[i][4], len(tids)) for i in rows])}
        ranges = [r for r, o in zip(nvtx, nv_dev) if o == d]
        ev.steps = _steps(ranges)
        dtype = None
        for s, e, name, tid, text in ranges:
            if "DataLoader" in name and "__next__" in name:
                ev.loader.append({"ts": int(s), "dur": int(e - s)})
            elif name.startswith(("gloo:", "nccl:")) or name == "record_param_comms":
                ev.cpu_comms.append({"name": name, "ts": int(s), "dur": int(e - s), "tid": tids.setdefault(tid, len(tids)),
                                     "args": {}})
            elif name in FLOP_OPS:
                dims = _sizes(text)
                if dims is not None and dtype is None:
                    dtype = _matmul_dtype(ev.gpu["name"], ev.gpu["dur"]) or ""
                ev.meta["record_shapes"] |= dims is not None
                ev.flop_ops.append({"name": name, "ts": int(s), "dur": int(e - s), "tid": tids.setdefault(tid, len(tids)),
                                    "dims": dims, "types": [_TYPE_NAME[dtype]] if dtype else None, "concrete": None})
        ev.meta["nsys"]["flop_dtype_from_kernel_names"] = dtype or None
        ev.events = len(mine) + len(rows) + len(ranges)
        out.append(ev)
    info["notes"] = notes
    info["devices"] = devices
    return out, info
