"""Read one Nsight Systems export (``nsys export --type sqlite``) into the events the Kineto reader
produces (:class:`preflight.diagnose.trace_file.RankEvents`), **one per GPU** of the capture, so every
verdict of ``preflight traces`` reads it unchanged.

The export is opened read-only with the standard library's ``sqlite3``; first the checks, each a
:class:`TraceError` naming the file and what is wrong: an SQLite file at all, not truncated (its size
against the page count its header records), ``META_DATA_EXPORT`` with an ``EXPORT_SCHEMA_VERSION`` of a
major this reader knows (:data:`SCHEMA_MAJORS`), a kernel table and ``StringIds`` with the columns read.
The other tables are optional; each one missing is a note of what it costs. Table names may carry a
``_V<n>`` suffix in other exports: the highest one is read.

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
import sqlite3
from pathlib import Path

import numpy as np

from preflight.diagnose.trace_file import RankEvents, TraceError
from preflight.diagnose.trace_kernels import FLOP_OPS, collective_type, kernel_class

SUFFIX = ".sqlite"
REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
SCHEMA_MAJORS = (3,)                       # read and tested: 3.24.14 (nsys 2026.1), 3.25.0 (nsys 2026.2)
STEP = re.compile(r"^(ProfilerStep#\d+|(train[_ ]?)?(step|iteration|iter)([ _#:-]*\d+)?)$", re.IGNORECASE)
_SUFFIXES = re.compile(r", (seq|op_id|sizes|input_op_ids|stream) = .*$", re.DOTALL)
_KEEP = re.compile(r"^(ProfilerStep#|nccl:|gloo:|c10d::|record_param_comms$)|DataLoader|^aten::")
# CUPTI's enums, used where the export has no ENUM_* table (the synthetic ones)
COPY_KIND = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD", 9: "HtoH",
             10: "PtoP", 11: "HtoD", 12: "DtoH", 13: "DtoD"}
MEM_KIND = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static",
            6: "Managed Static", 7: "Unknown"}
_DTYPE_IN_NAME = (("bf16", ("bfloat16", "bf16")), ("fp8", ("e4m3", "e5m2", "fp8")), ("fp16", ("half", "fp16", "f16")),
                  ("fp32", ("float", "tf32", "f32")))
_TYPE_NAME = {"bf16": "c10::BFloat16", "fp16": "c10::Half", "fp8": "c10::Float8_e4m3fn", "fp32": "float"}


def export_command(report: Path) -> str:
    return f"nsys export --type sqlite --output {report.with_suffix(SUFFIX).name} {report.name}"


class Export:
    """An open export: its tables (suffix resolved), their columns, queries that name the file on error."""

    def __init__(self, path: Path):
        self.path = path
        _check_header(path)
        try:
            self.db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
            names = [r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")]
        except sqlite3.Error as e:
            raise TraceError(f"{path}: not a readable SQLite database ({e})") from None
        self.tables = {}
        for n in sorted(names, key=lambda n: int(m.group(1)) if (m := re.search(r"_V(\d+)$", n)) else 0):
            self.tables[re.sub(r"_V\d+$", "", n)] = n           # the highest _V<n> wins
        self.cols = {}

    def table(self, name: str) -> str | None:
        return self.tables.get(name)

    def columns(self, name: str) -> set[str]:
        t = self.tables.get(name)
        if t and t not in self.cols:
            self.cols[t] = {r[1] for r in self.q(f'PRAGMA table_info("{t}")')}
        return self.cols.get(t, set()) if t else set()

    def q(self, sql: str, params=()) -> list:
        try:
            return self.db.execute(sql, params).fetchall()
        except sqlite3.Error as e:
            raise TraceError(f"{self.path}: a damaged export ({e}) while reading it; export it again "
                             "(nsys export --type sqlite)") from None

    def strings(self, table: str, col: str) -> dict[int, str]:
        return dict(self.q(f'SELECT id, value FROM StringIds WHERE id IN (SELECT DISTINCT "{col}" FROM "{table}")'))


def _check_header(path: Path) -> None:
    """An SQLite file, whole: the header's page size x page count against the file's size."""
    try:
        with path.open("rb") as f:
            head = f.read(100)
        size = path.stat().st_size
    except OSError as e:
        raise TraceError(f"{path}: cannot be read ({e.strerror})") from None
    if len(head) < 100 or not head.startswith(b"SQLite format 3\x00"):
        raise TraceError(f"{path}: not an SQLite file (an Nsight Systems export is written by "
                         "`nsys export --type sqlite REPORT.nsys-rep`)")
    page = int.from_bytes(head[16:18], "big")
    page = 65536 if page == 1 else page
    pages = int.from_bytes(head[28:32], "big")
    if pages and size < page * pages:
        raise TraceError(f"{path}: truncated: {size:,} bytes where its header records {pages:,} pages of {page:,} "
                         f"({page * pages:,} bytes); copy or export it again")


def check_schema(ex: Export) -> dict:
    """The export's versions and the tables read; raises :class:`TraceError` with the reason."""
    p = ex.path
    if not ex.table("META_DATA_EXPORT"):
        raise TraceError(f"{p}: no META_DATA_EXPORT table: not an Nsight Systems export (nsys export --type sqlite)")
    meta = {k: v for k, v in ex.q(f'SELECT name, value FROM "{ex.table("META_DATA_EXPORT")}"')}
    version = str(meta.get("EXPORT_SCHEMA_VERSION") or "")
    major = int(version.split(".")[0]) if re.match(r"^\d+(\.\d+)*$", version) else None
    if major not in SCHEMA_MAJORS:
        raise TraceError(f"{p}: META_DATA_EXPORT.EXPORT_SCHEMA_VERSION = {version or 'missing'!r}: this reader knows "
                         f"schema {', '.join(f'{m}.x' for m in SCHEMA_MAJORS)} (Nsight Systems 2024 and later)")
    need = {"CUPTI_ACTIVITY_KIND_KERNEL": {"start", "end", "deviceId", "streamId", "correlationId"},
            "StringIds": {"id", "value"}}
    for t, cols in need.items():
        if not ex.table(t):
            raise TraceError(f"{p}: no {t} table: nothing to read (was CUDA traced? nsys profile --trace cuda,nvtx)")
        miss = cols - ex.columns(t)
        if miss:
            raise TraceError(f"{p}: {ex.table(t)} has no column {', '.join(sorted(miss))} (schema {version})")
    if not {"demangledName", "shortName"} & ex.columns("CUPTI_ACTIVITY_KIND_KERNEL"):
        raise TraceError(f"{p}: CUPTI_ACTIVITY_KIND_KERNEL has neither demangledName nor shortName (schema {version})")
    return {"schema": version, "product": meta.get("EXPORT_PRODUCT_VERSION"), "derived_window": meta.get("DERIVED_WINDOW_NS")}


def _enum(ex: Export, table: str, default: dict) -> dict:
    if not ex.table(table) or not {"id", "label"} <= ex.columns(table):
        return default
    return {int(i): str(lab) for i, lab in ex.q(f'SELECT id, label FROM "{ex.table(table)}"') if i is not None}


def _col(ex, t, c, default="NULL"):
    return f'"{c}"' if c in ex.columns(t) else default


def _gpu_rows(ex: Export, notes: list) -> list[tuple]:
    """(start, end, device, stream, corr, pid, name, cat, args) of every kernel, copy and memset."""
    out = []
    k = "CUPTI_ACTIVITY_KIND_KERNEL"
    kc = ex.columns(k)
    ncol = "demangledName" if "demangledName" in kc else "shortName"
    pid = '("globalPid" >> 24)'                     # a GlobalId: the process in bits 24 and up, as in globalTid
    valid = '"start" IS NOT NULL AND "end" IS NOT NULL AND "end" >= "start" AND "deviceId" IS NOT NULL'
    for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        if not ex.table(t):
            if t != k:
                notes.append(f"no {t}: no {'copies' if 'MEMCPY' in t else 'memsets'} in the GPU's time")
            continue
        tn = ex.table(t)
        bad = ex.q(f'SELECT count(*) FROM "{tn}" WHERE NOT ({valid})')[0][0]
        if bad:
            notes.append(f"{bad} rows of {tn} without a start, an end or a device, or ending before they start: left out")
        base = f'"start", "end", "deviceId", {_col(ex, t, "streamId", "-1")}, {_col(ex, t, "correlationId")}, ' \
               f'{pid if "globalPid" in ex.columns(t) else "NULL"}'
        if t == k:
            names = ex.strings(tn, ncol)
            for *r, n in ex.q(f'SELECT {base}, "{ncol}" FROM "{tn}" WHERE {valid}'):
                out.append((*r, names.get(n, f"<string {n}>"), "kernel", {}))
        elif "MEMCPY" in t:
            mem = _enum(ex, "ENUM_CUDA_MEM_KIND", MEM_KIND)
            for *r, b, ck, sk, dk in ex.q(f'SELECT {base}, {_col(ex, t, "bytes", "0")}, {_col(ex, t, "copyKind")}, '
                                          f'{_col(ex, t, "srcKind")}, {_col(ex, t, "dstKind")} FROM "{tn}" WHERE {valid}'):
                name = f"Memcpy {COPY_KIND.get(ck, 'unknown kind')} ({mem.get(sk, 'Unknown')} -> {mem.get(dk, 'Unknown')})"
                out.append((*r, name, "gpu_memcpy", {"bytes": int(b or 0)}))
        else:
            mem = _enum(ex, "ENUM_CUDA_MEM_KIND", MEM_KIND)
            for *r, b, mk in ex.q(f'SELECT {base}, {_col(ex, t, "bytes", "0")}, {_col(ex, t, "memKind")} '
                                  f'FROM "{tn}" WHERE {valid}'):
                out.append((*r, f"Memset ({mem.get(mk, 'Unknown')})", "gpu_memset", {"bytes": int(b or 0)}))
    return out


def _runtime_rows(ex: Export, same_pid: bool, notes: list) -> list[tuple]:
    """(start, end, corr, pid, tid, name) of every runtime call."""
    t = "CUPTI_ACTIVITY_KIND_RUNTIME"
    if not ex.table(t) or not {"start", "end", "correlationId", "nameId"} <= ex.columns(t):
        notes.append(f"no {t} (or not its start, end, correlationId, nameId): no launch times, so idle cannot be told "
                     "host-bound from queued, and no synchronising calls")
        return []
    tn = ex.table(t)
    names = ex.strings(tn, "nameId")
    tid = _col(ex, t, "globalTid")
    pid = f"({tid} >> 24)" if same_pid and tid != "NULL" else "NULL"
    return [(*r, names.get(n, "")) for *r, n in ex.q(f'SELECT "start", "end", "correlationId", {pid}, {tid}, "nameId" '
                                                    f'FROM "{tn}" WHERE "start" IS NOT NULL AND "end" >= "start"')]


def _nvtx_rows(ex: Export, notes: list) -> list[tuple]:
    """(start, end, name, tid, text) of the NVTX ranges a verdict reads (:data:`_KEEP`)."""
    t = "NVTX_EVENTS"
    if not ex.table(t):
        notes.append("no NVTX_EVENTS: no steps (the window is the whole capture), no DataLoader, no collective names")
        return []
    c = ex.columns(t)
    text = '"text"' if "text" in c else "NULL"
    if "textId" in c:
        text = f'coalesce({text}, (SELECT value FROM StringIds s WHERE s.id = n."textId"))'
    out = []
    for s, e, tid, txt in ex.q(f'SELECT "start", "end", {_col(ex, t, "globalTid")}, {text} FROM "{ex.table(t)}" n '
                               'WHERE "end" IS NOT NULL AND "end" >= "start"'):
        if txt and _KEEP.search(txt):
            out.append((s, e, _SUFFIXES.sub("", txt), tid, txt))
    return out


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


def _gpu_names(ex: Export, notes: list) -> dict[int, str]:
    t = "TARGET_INFO_GPU"
    if not ex.table(t) or not {"id", "name"} <= ex.columns(t):
        notes.append("no TARGET_INFO_GPU: the GPU model is not recorded (name it: traces --gpu KEY)")
        return {}
    return {int(i): str(n) for i, n in ex.q(f'SELECT id, name FROM "{ex.table(t)}"') if i is not None and n}


def _owner(devices, votes_t, votes_p):
    """A thread -> the GPU most of its launches (else its process's) went to; None when it launched nothing."""
    def own(tid):
        if len(devices) == 1:
            return devices[0]
        v = votes_t.get(tid) or (votes_p.get(tid >> 24) if tid is not None else None)
        return max(v, key=v.get) if v else None
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
            out.append({"name": name, "ts": int(s), "dur": int(e - s)})
            reach = max(reach, e)
    return out


def _matmul_dtype(names, durs) -> str | None:
    """The dtype most matmul kernel time names (``cutlass::bfloat16_t``, ``..._bf16_...``), for FLOPs whose
    op ranges record shapes but no types."""
    t: dict[str, int] = {}
    for n, d in zip(names, durs):
        if kernel_class(n) == "matmul":
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
    info = check_schema(ex)
    notes: list[str] = []
    gpu = _gpu_rows(ex, notes)
    if not gpu:
        raise TraceError(f"{path}: no kernel, copy or memset in the export: nothing ran on a GPU in the capture")
    same_pid = any(g[5] is not None for g in gpu)
    rt = _runtime_rows(ex, same_pid, notes)
    nvtx = _nvtx_rows(ex, notes)
    gpu_names = _gpu_names(ex, notes)
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
    out = []
    for d in devices:
        ev = RankEvents(str(path), {"file": f"{path.name} GPU {d}", "path": str(path), "rank": None, "rank_source": None,
                                    "world_size": None, "backend": None, "nccl_version": None, "groups": {},
                                    "devices": [gpu_names[d]] if d in gpu_names else [], "display_unit": "ns",
                                    "record_shapes": False, "nsys": {**info, "device": d}})
        mine = [(g, i) for g, i in zip(gpu, g_launch) if g[2] == d]
        rows = {i for i, o in enumerate(rt_dev) if o == d} | {i for _, i in mine if i is not None}
        rows = sorted(rows)
        args = []
        for g, i in mine:
            a = dict(g[8])
            if g[7] == "kernel" and i is not None and kernel_class(g[6]) == "comm":
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
                      "corr": i64([key(rt[i][3], rt[i][2]) for i in rows]), "name": [rt[i][5] for i in rows]}
        ranges = [r for r, o in zip(nvtx, nv_dev) if o == d]
        ev.steps = _steps(ranges)
        dtype = None
        for s, e, name, tid, text in ranges:
            if "DataLoader" in name and "__next__" in name:
                ev.loader.append({"ts": int(s), "dur": int(e - s)})
            elif name.startswith(("gloo:", "nccl:")) or name == "record_param_comms":
                ev.cpu_comms.append({"name": name, "ts": int(s), "dur": int(e - s), "tid": tid, "args": {}})
            elif name in FLOP_OPS:
                dims = _sizes(text)
                if dims is not None and dtype is None:
                    dtype = _matmul_dtype(ev.gpu["name"], ev.gpu["dur"]) or ""
                ev.meta["record_shapes"] |= dims is not None
                ev.flop_ops.append({"name": name, "ts": int(s), "dims": dims, "types": [_TYPE_NAME[dtype]] if dtype else None,
                                    "concrete": None})
        ev.meta["nsys"]["flop_dtype_from_kernel_names"] = dtype or None
        ev.events = len(mine) + len(rows) + len(ranges)
        out.append(ev)
    info["notes"] = notes
    info["devices"] = devices
    return out, info
