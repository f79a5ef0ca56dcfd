"""Read one ``torch.profiler`` (Kineto) trace file into the few event columns the verdicts need.

A real trace is 50 MB to 1 GB of Chrome-trace JSON per rank, most of it CPU ops, flow arrows and
Python frames that no verdict reads. The file is parsed once, by the standard library's JSON decoder
with an ``object_hook`` that keeps an event only if it is one of:

- a GPU event: ``kernel``, ``gpu_memcpy``, ``gpu_memset`` (start, duration, stream, ``correlation``);
- a runtime call (``cuda_runtime`` / ``cuda_driver``; HIP's calls carry the same categories on ROCm):
  the launch of a GPU event (same ``correlation``) and the synchronising calls;
- a step (``ProfilerStep#N``), a ``DataLoader`` ``__next__``, a CPU-side collective (``gloo:*``,
  ``nccl:*``, ``record_param_comms``), an op whose FLOPs the shapes give
  (``preflight.diagnose.trace_kernels.FLOP_OPS``);

and drops the rest as it goes, so the parsed tree is never held whole (measured in the README's trace
benchmark). **Times are kept in integer nanoseconds.** Kineto writes ``ts`` in microseconds with three
decimals (nanosecond clocks); a float64 holds only about a quarter of a microsecond at today's epoch
times (1.7e15 us), so large numbers are parsed as ``Decimal`` and converted exactly.

Every kept event is checked first (``preflight.diagnose.trace_validate``): a malformed one is counted
per field (``RankEvents.dropped``, shown in the trace-quality table), and the file is refused when more
than ``MALFORMED_LIMIT`` of its GPU and runtime events, or any ``ProfilerStep``, are malformed.

Errors a user can act on raise :class:`TraceError` naming the file (and the event's index and field):
not gzip or truncated, not JSON, nested too deep, no ``traceEvents``, a bad ``distributedInfo``.
"""
from __future__ import annotations

import gzip
import json
import re
import zlib
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import numpy as np

from preflight.diagnose import trace_validate as V
from preflight.diagnose.trace_kernels import FLOP_OPS

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
# runtime calls that make the host wait for the device: the synchronise calls, and the blocking copies
# (cudaMemcpy, hipMemcpy, hipMemcpyWithStream return when the copy is done). A cudaMemcpyAsync into
# pageable memory blocks too: it is counted from its GPU copy, ``Memcpy DtoH (Device -> Pageable)``.
SYNC_CALLS = re.compile(r"^(cuda|hip)(DeviceSynchronize|StreamSynchronize|EventSynchronize|Memcpy|MemcpyDtoH|MemcpyHtoD"
                        r"|MemcpyWithStream|Memcpy2D)(_v\d+)?$")
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[-_]?(\d+)", re.IGNORECASE)
TRACE_SUFFIXES = (".json", ".json.gz")
MALFORMED_LIMIT = 0.01          # share of GPU + runtime events that may be malformed (dropped, counted)


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file and what is wrong."""


@dataclass
class RankEvents:
    """One file's events, in integer nanoseconds. ``gpu`` and ``runtime`` are numpy columns; the rest
    are short lists of dicts (steps, loader calls, CPU collectives, FLOP ops). ``dropped``: the
    malformed events, per field: {field: {count, first (event index), why, kind}}."""
    path: str
    meta: dict
    gpu: dict = field(default_factory=dict)        # ts, dur, stream, corr (int64); name, cat, args (lists)
    runtime: dict = field(default_factory=dict)    # ts, dur, corr, tid (int64); name (list)
    steps: list = field(default_factory=list)      # {name, num, ts, dur}
    loader: list = field(default_factory=list)     # {ts, dur}
    cpu_comms: list = field(default_factory=list)  # {name, ts, dur, tid, args}
    flop_ops: list = field(default_factory=list)   # {name, ts, dur, tid, dims, types, concrete}
    events: int = 0
    dropped: dict = field(default_factory=dict)


def _num(text: str):
    """Parse a JSON number: exactly (``Decimal``) where a float64 would lose nanoseconds."""
    return Decimal(text) if text.find(".") >= 10 else float(text)


def _keep_cpu(name: str) -> bool:
    return (name.startswith(("ProfilerStep#", "gloo:", "nccl:")) or name == "record_param_comms"
            or ("DataLoader" in name and "__next__" in name) or name in FLOP_OPS)


_GPU_ARGS = ("bytes", "Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype",
             "Process Group Name", "Seq", "Sequence number", "Dst Rank", "Src Rank", "Global rank start",
             "Global rank stride")


def _time(d: dict) -> tuple[int, int]:
    if "ts" not in d:
        raise V.Bad("ts", "missing")
    return V.ns(d["ts"], "ts", V.MAX_TS_NS), V.ns(d.get("dur", 0), "dur", V.MAX_DUR_NS)


def _corr(a: dict) -> int:
    c = a.get("correlation")
    return -1 if c is None else V.integer(c, "args.correlation", -1, V.MAX_ID)


def _event(d: dict, cat, name, kind: str):
    """One kept event checked and reduced to a tuple (see ``_hook``); raises ``trace_validate.Bad``."""
    name = V.text(name, "name")
    ts, dur = _time(d)
    a = V.args_of(d)
    if kind == "G":
        stream = a["stream"] if a.get("stream") is not None else d.get("tid", -1)
        return ("G", cat, name, ts, dur, V.stream_id(stream, "args.stream"), _corr(a), V.gpu_args(a, _GPU_ARGS))
    tid = (V.thread(d.get("pid")), V.thread(d.get("tid")))
    if kind == "R":
        return ("R", name, ts, dur, _corr(a), tid)
    if name.startswith("ProfilerStep#"):
        return ("C", "step", {"name": name, "num": V.step_number(name), "ts": ts, "dur": dur})
    if "DataLoader" in name and "__next__" in name:
        return ("C", "loader", {"ts": ts, "dur": dur})
    if name.startswith(("gloo:", "nccl:")) or name == "record_param_comms":
        args = V.gpu_args(a, _GPU_ARGS)
        if isinstance(a.get("Input Dims"), list):                 # nccl:* annotations: the tensor's size
            shapes = V.dims(a["Input Dims"])
            args["annotation_nelems"] = sum(int(np.prod(s)) if s else 0 for s in shapes)
            types = a.get("Input type")
            if isinstance(types, list) and types and isinstance(types[0], str):
                args.setdefault("dtype", types[0])
        return ("C", "comm", {"name": name, "ts": ts, "dur": dur, "tid": tid, "args": args})
    return ("C", "flop", {"name": name, "ts": ts, "dur": dur, "tid": tid,
                          "dims": V.dims(a["Input Dims"]) if a.get("Input Dims") is not None else None,
                          "types": V.str_list(a["Input type"], "args.Input type") if a.get("Input type") is not None
                          else None,
                          "concrete": V.str_list(a["Concrete Inputs"], "args.Concrete Inputs")
                          if a.get("Concrete Inputs") is not None else None})


def _kind(cat, name) -> str | None:
    """"G" (GPU event), "R" (runtime call), "C" (a CPU event the verdicts read) or None (dropped)."""
    if cat in GPU_CATS:
        return "G"
    if cat in RUNTIME_CATS:
        return "R"
    if isinstance(name, str) and _keep_cpu(name) and not (isinstance(cat, str) and cat.startswith("gpu_")):
        return "C"                  # (gpu_user_annotation: GPU-side copies of annotations, not read)
    return None


def _hook(d: dict):
    """Called for every JSON object, innermost first: drop each event no verdict reads, check the others
    (``trace_validate``) and hold them as short tuples rather than dicts (most of the memory a big trace
    takes); a malformed one becomes ``("D", field, why, kind)``."""
    ph = d.get("ph")
    if ph is None:                  # args, deviceProperties, distributedInfo, the top level
        return d
    if ph != "X":
        return None
    cat, name = d.get("cat"), d.get("name")
    kind = _kind(cat, name)
    if kind is None:
        return None
    try:
        return _event(d, cat, name, kind)
    except V.Bad as b:
        return ("D", b.field, b.why, "step" if kind == "C" and name.startswith("ProfilerStep#") else kind)


def load_json(path: Path, raw: bytes | None = None) -> dict:
    """The trace's top level with only the kept events in ``traceEvents`` (None for the dropped ones);
    ``raw``: the file's bytes when the caller has read them already."""
    try:
        raw = path.read_bytes() if raw is None else raw
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        raw = raw.decode("utf-8")          # decoded once here, the bytes freed (json would decode a copy)
    except UnicodeDecodeError as e:
        raise TraceError(f"{path}: not JSON (not UTF-8 text: {e})") from None
    except (OSError, EOFError, zlib.error) as e:
        raise TraceError(f"{path}: not a readable gzip file ({type(e).__name__}: {e}); a trace is *.json or "
                         "*.json.gz as torch.profiler writes it (a truncated copy?)") from None
    try:
        top = json.loads(raw, object_hook=_hook, parse_float=_num)
    except RecursionError:
        raise TraceError(f"{path}: JSON nested deeper than the reader follows (Python's recursion limit): "
                         "not a torch.profiler / Kineto trace") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: not JSON ({str(e)[:120]})") from None
    if not isinstance(top, dict) or not isinstance(top.get("traceEvents"), list):
        raise TraceError(f"{path}: JSON without a 'traceEvents' list: not a torch.profiler / Kineto trace")
    return top


def rank_from_name(path: Path) -> int | None:
    """'rank-3.json', 'job_rank3.pt.trace.json.gz', 'reference-rank12...' -> the rank; else None."""
    m = _RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m and len(m.group(1)) <= 7 else None


def _meta(path: Path, top: dict) -> dict:
    try:
        info = V.distributed(top.get("distributedInfo"), path)
        devices = V.devices(top.get("deviceProperties"))
    except V.Bad as b:
        raise TraceError(f"{path}: {b.field}: {b.why}") from None
    rank = info.get("rank")
    unit = top.get("displayTimeUnit")
    return {"file": path.name, "path": str(path), "rank": rank,
            "rank_source": "distributedInfo" if rank is not None else None,
            "world_size": info.get("world_size"), "backend": info.get("backend"),
            "nccl_version": info.get("nccl_version"), "groups": info.get("groups", {}), "devices": devices,
            "display_unit": unit if isinstance(unit, str) else None,
            "record_shapes": top.get("record_shapes") if isinstance(top.get("record_shapes"), (bool, int)) else None}


def _drop(dropped: dict, i: int, fld: str, why: str, kind: str) -> None:
    d = dropped.setdefault(f"{kind}: {fld}", {"count": 0, "first": i, "why": why, "kind": kind})
    d["count"] += 1


_KIND_WORDS = {"G": "GPU event", "R": "runtime call", "C": "CPU event", "step": "ProfilerStep", "other": "entry"}


def read_trace(path: str | Path, raw: bytes | None = None) -> RankEvents:
    """Read one trace file (see the module's docstring), from ``raw`` when its bytes are at hand;
    raises :class:`TraceError`."""
    path = Path(path)
    top = load_json(path, raw)
    out = RankEvents(str(path), _meta(path, top))
    evs = top["traceEvents"]
    out.events = len(evs)
    g_ts, g_dur, g_stream, g_corr, g_name, g_cat, g_args = [], [], [], [], [], [], []
    r_ts, r_dur, r_corr, r_tid, r_name = [], [], [], [], []
    tids: dict = {}
    for i, e in enumerate(evs):
        if e is None:
            continue
        if type(e) is not tuple:
            _drop(out.dropped, i, "traceEvents[i]", f"{type(e).__name__}, not an event object with a 'ph'", "entry")
            continue
        k = e[0]
        if k == "G":
            _, cat, name, ts, dur, stream, corr, args = e
            g_ts.append(ts), g_dur.append(dur), g_stream.append(stream), g_corr.append(corr)
            g_name.append(name), g_cat.append(cat), g_args.append(args)
        elif k == "R":
            _, name, ts, dur, corr, tid = e
            r_ts.append(ts), r_dur.append(dur), r_corr.append(corr), r_name.append(name)
            r_tid.append(tids.setdefault(tid, len(tids)))
        elif k == "C":
            _, kind, d = e
            if "tid" in d:
                d["tid"] = tids.setdefault(d["tid"], len(tids))
            {"step": out.steps, "loader": out.loader, "comm": out.cpu_comms, "flop": out.flop_ops}[kind].append(d)
        else:
            _, fld, why, kind = e
            _drop(out.dropped, i, fld, why, _KIND_WORDS[kind])
    _refuse_if_damaged(path, out, len(g_ts) + len(r_ts))
    i64 = (lambda xs: np.asarray(xs, dtype=np.int64))
    out.gpu = {"ts": i64(g_ts), "dur": i64(g_dur), "stream": i64(g_stream), "corr": i64(g_corr), "name": g_name,
               "cat": g_cat, "args": g_args}
    out.runtime = {"ts": i64(r_ts), "dur": i64(r_dur), "corr": i64(r_corr), "tid": i64(r_tid), "name": r_name}
    out.steps.sort(key=lambda s: s["ts"])
    return out


def _refuse_if_damaged(path: Path, out: RankEvents, kept: int) -> None:
    """A malformed ProfilerStep (the window rests on the steps), or more than ``MALFORMED_LIMIT`` of the
    GPU and runtime events malformed (or all of them): the file is refused, naming the first one."""
    bad = {k: d for k, d in out.dropped.items() if d["kind"] in ("GPU event", "runtime call", "ProfilerStep")}
    n = sum(d["count"] for d in bad.values())
    steps = [d for d in bad.values() if d["kind"] == "ProfilerStep"]
    if not n or (not steps and n <= MALFORMED_LIMIT * (kept + n) and kept):
        return
    first = steps[0] if steps else min(bad.values(), key=lambda d: d["first"])
    fld = next(k for k, d in bad.items() if d is first).split(": ", 1)[1]
    raise TraceError(f"{path}: event #{first['first']} ({first['kind']}), field {fld}: {first['why']}; "
                     + ("a ProfilerStep the window rests on is malformed" if steps else
                        f"{n} of {kept + n} GPU and runtime events are malformed (more than "
                        f"{MALFORMED_LIMIT:.0%}): the verdicts would not stand") + " (a damaged or hand-edited trace?)")


def find_traces(folder: Path) -> list[Path]:
    """The trace files of a folder (recursively: ``tensorboard_trace_handler`` may nest per worker),
    sorted; per-rank summaries (``*.summary.json``) are not traces."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name.endswith(TRACE_SUFFIXES)
                  and not p.name.endswith(".summary.json") and not p.name.startswith("."))

