"""An Nsight Systems export (``nsys export --type sqlite``) opened and checked, and the rows of the
tables the trace verdicts read (``preflight.diagnose.nsys_file`` turns them into one rank per GPU).

The export is opened read-only with the standard library's ``sqlite3``. First the checks, each a
:class:`TraceError` naming the file and what is wrong: an SQLite file at all, not truncated (its size
against the page count its header records), ``META_DATA_EXPORT`` with an ``EXPORT_SCHEMA_VERSION`` of a
major this reader knows (:data:`SCHEMA_MAJORS`), ``CUPTI_ACTIVITY_KIND_KERNEL`` and ``StringIds`` with
the columns read. Every other table is optional: each one missing is a note saying what it costs
(no ``CUPTI_ACTIVITY_KIND_RUNTIME``: no launch times; no ``NVTX_EVENTS``: no steps...). Table names may
carry a ``_V<n>`` suffix in other exports: the highest one is read. A query that fails half-way (a
damaged page) names the file too. Rows with no start, no end or an end before their start are left
out and counted in a note.

Copies are named as Kineto names them (``Memcpy HtoD (Pageable -> Device)``, from ``copyKind``,
``srcKind``, ``dstKind`` and the export's ``ENUM_*`` labels, CUPTI's values where it has none), so
pageable and pinned copies are told apart by the same rule for both readers.
"""
from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from preflight.diagnose.trace_file import TraceError
from preflight.diagnose.trace_kernels import FLOP_OPS

SUFFIX = ".sqlite"
REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
SCHEMA_MAJORS = (3,)                       # read and tested: 3.24.14 (nsys 2026.1), 3.25.0 (nsys 2026.2)
_SUFFIXES = re.compile(r", (seq|op_id|sizes|input_op_ids|stream) = .*$", re.DOTALL)
STEP = re.compile(r"^(ProfilerStep#\d+|(train[_ ]?)?(step|iteration|iter)([ _#:-]*\d+)?)$", re.IGNORECASE)
_KEEP = re.compile(r"^(ProfilerStep#|nccl:|gloo:|c10d::|record_param_comms$)|DataLoader")
# the same, as LIKE patterns (a superset: SQLite's LIKE ignores ASCII case, '_' matches any character), so the
# millions of other ranges an emit_nvtx capture holds (aten::view, aten::empty...) are never fetched
_LIKE = ("ProfilerStep#%", "nccl:%", "gloo:%", "c10d::%", "record_param_comms%", "%DataLoader%", "%step%", "%iter%",
         *FLOP_OPS, *(f"{op},%" for op in FLOP_OPS))
# CUPTI's enums, used where the export has no ENUM_* table (the synthetic ones)
COPY_KIND = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD", 9: "HtoH",
             10: "PtoP", 11: "HtoD", 12: "DtoH", 13: "DtoD"}
MEM_KIND = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static",
            6: "Managed Static", 7: "Unknown"}


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


def gpu_rows(ex: Export, notes: list) -> list[tuple]:
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


def runtime_rows(ex: Export, same_pid: bool, notes: list) -> list[tuple]:
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


def nvtx_rows(ex: Export, notes: list) -> list[tuple]:
    """(start, end, name, tid, text) of the NVTX ranges a verdict reads (:data:`_KEEP`, :data:`STEP`, the FLOP
    ops); the name without PyTorch's suffixes, the text whole."""
    t = "NVTX_EVENTS"
    if not ex.table(t):
        notes.append("no NVTX_EVENTS: no steps (the window is the whole capture), no DataLoader, no collective names")
        return []
    c = ex.columns(t)
    text = '"text"' if "text" in c else "NULL"
    if "textId" in c:
        text = f'coalesce({text}, (SELECT value FROM StringIds s WHERE s.id = n."textId"))'
    out = []
    like = " OR ".join(["txt LIKE ?"] * len(_LIKE))
    for s, e, tid, txt in ex.q(f'SELECT * FROM (SELECT "start", "end", {_col(ex, t, "globalTid")}, {text} AS txt '
                               f'FROM "{ex.table(t)}" n WHERE "end" IS NOT NULL AND "end" >= "start") WHERE {like}', _LIKE):
        name = _SUFFIXES.sub("", txt) if isinstance(txt, str) else ""
        if name and (_KEEP.search(name) or STEP.match(name) or name in FLOP_OPS):
            out.append((s, e, name, tid, txt))
    return out


def gpu_names(ex: Export, notes: list) -> dict[int, str]:
    t = "TARGET_INFO_GPU"
    if not ex.table(t) or not {"id", "name"} <= ex.columns(t):
        notes.append("no TARGET_INFO_GPU: the GPU model is not recorded (name it: traces --gpu KEY)")
        return {}
    return {int(i): str(n) for i, n in ex.q(f'SELECT id, name FROM "{ex.table(t)}"') if i is not None and n}
