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

Errors a user can act on raise :class:`TraceError` naming the file: not gzip or truncated, not JSON,
no ``traceEvents``.
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

from preflight.diagnose.trace_kernels import FLOP_OPS

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
# runtime calls that make the host wait for the device (a blocking cudaMemcpy counts: it returns when done)
SYNC_CALLS = re.compile(r"^(cuda|hip)(DeviceSynchronize|StreamSynchronize|EventSynchronize|Memcpy|MemcpyDtoH|MemcpyHtoD)"
                        r"(_v\d+)?$")
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[-_]?(\d+)", re.IGNORECASE)
TRACE_SUFFIXES = (".json", ".json.gz")


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file and what is wrong."""


@dataclass
class RankEvents:
    """One file's events, in integer nanoseconds. ``gpu`` and ``runtime`` are numpy columns; the rest
    are short lists of dicts (steps, loader calls, CPU collectives, FLOP ops)."""
    path: str
    meta: dict
    gpu: dict = field(default_factory=dict)        # ts, dur, stream, corr (int64); name, cat, args (lists)
    runtime: dict = field(default_factory=dict)    # ts, dur, corr (int64); name (list)
    steps: list = field(default_factory=list)      # {name, ts, dur}
    loader: list = field(default_factory=list)     # {ts, dur}
    cpu_comms: list = field(default_factory=list)  # {name, ts, dur, tid, args}
    flop_ops: list = field(default_factory=list)   # {name, ts, dims, types, concrete, flops}
    events: int = 0


def _num(text: str):
    """Parse a JSON number: exactly (``Decimal``) where a float64 would lose nanoseconds."""
    return Decimal(text) if text.find(".") >= 10 else float(text)


def _ns(v) -> int:
    """A time in microseconds (int, float or Decimal) -> integer nanoseconds."""
    if isinstance(v, int):
        return v * 1000
    if isinstance(v, Decimal):
        return int((v * 1000).to_integral_value())
    return int(round(float(v) * 1000))


def _keep(e: dict) -> bool:
    cat = e.get("cat")
    if cat in GPU_CATS or cat in RUNTIME_CATS:
        return True
    name = e.get("name", "")
    return (name.startswith(("ProfilerStep#", "gloo:", "nccl:")) or name == "record_param_comms"
            or ("DataLoader" in name and "__next__" in name) or name in FLOP_OPS)


_GPU_ARGS = ("bytes", "Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype",
             "Process Group Name", "Seq", "Sequence number")


def _hook(d: dict):
    """Called for every JSON object, innermost first: drop each event no verdict reads, and hold the many
    GPU and runtime events as short tuples rather than dicts (most of the memory a big trace takes)."""
    ph = d.get("ph")
    if ph is None:                  # args, deviceProperties, distributedInfo, the top level
        return d
    if ph != "X" or not _keep(d):
        return None
    cat = d.get("cat")
    args = d.get("args") or {}
    if cat in RUNTIME_CATS:
        return ("R", d.get("name", ""), d.get("ts"), d.get("dur", 0), args.get("correlation", -1))
    if cat in GPU_CATS:
        return ("G", cat, d.get("name", ""), d.get("ts"), d.get("dur", 0), args.get("stream", d.get("tid", -1)),
                args.get("correlation", -1), {k: args[k] for k in _GPU_ARGS if k in args})
    return d


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
    except (ValueError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: not JSON ({str(e)[:120]})") from None
    if not isinstance(top, dict) or not isinstance(top.get("traceEvents"), list):
        raise TraceError(f"{path}: JSON without a 'traceEvents' list: not a torch.profiler / Kineto trace")
    return top


def _int(v) -> int:
    """A stream or correlation id: an int, or -1 where it is not one (ROCm writes streams as "0x0")."""
    try:
        return int(v)
    except (TypeError, ValueError):
        return int(v, 16) if isinstance(v, str) and v.startswith("0x") else -1


def _trim(*cols) -> None:
    """Columns appended in step: cut back to the shortest (an event that failed half-way)."""
    n = min(len(c) for c in cols)
    for c in cols:
        del c[n:]


def rank_from_name(path: Path) -> int | None:
    """'rank-3.json', 'job_rank3.pt.trace.json.gz', 'reference-rank12...' -> the rank; else None."""
    m = _RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m else None


def _meta(path: Path, top: dict) -> dict:
    info = top.get("distributedInfo") if isinstance(top.get("distributedInfo"), dict) else {}
    props = top.get("deviceProperties") if isinstance(top.get("deviceProperties"), list) else []
    groups = {}
    for pg in info.get("pg_config") or []:
        if isinstance(pg, dict) and "pg_name" in pg:
            groups[str(pg["pg_name"])] = {"size": pg.get("pg_size"), "desc": pg.get("pg_desc"),
                                          "ranks_head": list(pg.get("ranks") or [])[:8]}
    rank = info.get("rank")
    return {"file": path.name, "path": str(path), "rank": int(rank) if isinstance(rank, int) else None,
            "rank_source": "distributedInfo" if isinstance(rank, int) else None,
            "world_size": info.get("world_size") if isinstance(info.get("world_size"), int) else None,
            "backend": info.get("backend"), "nccl_version": info.get("nccl_version"), "groups": groups,
            "devices": sorted({str(p.get("name")) for p in props if isinstance(p, dict) and p.get("name")}),
            "display_unit": top.get("displayTimeUnit"), "record_shapes": top.get("record_shapes")}


def read_trace(path: str | Path, raw: bytes | None = None) -> RankEvents:
    """Read one trace file (see the module's docstring), from ``raw`` when its bytes are at hand;
    raises :class:`TraceError`."""
    path = Path(path)
    top = load_json(path, raw)
    out = RankEvents(str(path), _meta(path, top))
    evs = top["traceEvents"]
    out.events = len(evs)
    g_ts, g_dur, g_stream, g_corr, g_name, g_cat, g_args = [], [], [], [], [], [], []
    r_ts, r_dur, r_corr, r_name = [], [], [], []
    for e in evs:
        if e is None:
            continue
        try:
            if type(e) is tuple:
                if e[0] == "G":
                    _, cat, name, ts, dur, stream, corr, args = e
                    g_ts.append(_ns(ts)), g_dur.append(_ns(dur)), g_stream.append(_int(stream))
                    g_corr.append(_int(corr)), g_name.append(name), g_cat.append(cat), g_args.append(args)
                else:
                    _, name, ts, dur, corr = e
                    r_ts.append(_ns(ts)), r_dur.append(_ns(dur)), r_corr.append(_int(corr)), r_name.append(name)
                continue
            cat, name, args = e.get("cat"), e.get("name", ""), e.get("args") or {}
            ts, dur = _ns(e["ts"]), _ns(e.get("dur", 0))
        except (KeyError, TypeError, ValueError, ArithmeticError):
            _trim(g_ts, g_dur, g_stream, g_corr, g_name, g_cat, g_args)
            _trim(r_ts, r_dur, r_corr, r_name)
            continue                                   # an event without a time says nothing we can use
        if str(cat).startswith("gpu_"):
            continue                                   # GPU-side copies of annotations (gpu_user_annotation)
        elif name.startswith("ProfilerStep#"):
            out.steps.append({"name": name, "ts": ts, "dur": dur})
        elif "DataLoader" in name:
            out.loader.append({"ts": ts, "dur": dur})
        elif name.startswith(("gloo:", "nccl:")) or name == "record_param_comms":
            out.cpu_comms.append({"name": name, "ts": ts, "dur": dur, "tid": e.get("tid"),
                                  "args": {k: v for k, v in args.items() if k not in ("Input Dims", "Input type")}})
        elif name in FLOP_OPS:
            out.flop_ops.append({"name": name, "ts": ts, "dims": args.get("Input Dims"),
                                 "types": args.get("Input type"), "concrete": args.get("Concrete Inputs")})
    i64 = (lambda xs: np.asarray(xs, dtype=np.int64))
    out.gpu = {"ts": i64(g_ts), "dur": i64(g_dur), "stream": i64(g_stream), "corr": i64(g_corr), "name": g_name,
               "cat": g_cat, "args": g_args}
    out.runtime = {"ts": i64(r_ts), "dur": i64(r_dur), "corr": i64(r_corr), "name": r_name}
    out.steps.sort(key=lambda s: s["ts"])
    return out


def find_traces(folder: Path) -> list[Path]:
    """The trace files of a folder (recursively: ``tensorboard_trace_handler`` may nest per worker),
    sorted; per-rank summaries (``*.summary.json``) are not traces."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name.endswith(TRACE_SUFFIXES)
                  and not p.name.endswith(".summary.json") and not p.name.startswith("."))
