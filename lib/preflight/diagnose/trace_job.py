"""A job's traces: the folder read, one summary per rank, checked to be one job.

``DIR`` holds ``torch.profiler`` output (``*.json``, ``*.json.gz``, ``tensorboard_trace_handler``
names, nested or not), one or more files per rank, and/or per-rank summaries (``*.summary.json``)
written where the traces are by ``python -m preflight traces --summarize FILE --out DIR`` (one Slurm
task per node or rank: the terabyte stays on the nodes, a few kilobytes per rank come back).

**Which rank a file is:** ``distributedInfo.rank`` (Kineto writes it under ``torch.distributed``),
else a ``rank<N>`` / ``rank-<N>`` / ``rank_<N>`` in its name; a lone file with neither is a
single-process job (rank 0, said so in the trace-quality table); among several files, one with
neither is refused with its name.

**One job:** every ``world_size`` must agree; the same rank twice is refused unless the files hold
different steps (successive profiling cycles of one run, summed). A file that cannot be read is named;
the other ranks are still judged, and the job's verdicts say which ranks are missing. Nothing readable
at all, or an inconsistent job, raises :class:`TraceError` (the command exits 2, writing nothing).

Each file is read in its own process (``jobs`` at a time; in this one when the folder holds less than
32 MB of traces and ``jobs`` is not given) and its summary cached by the file's content
(SHA-256) under ``$PREFLIGHT_CACHE`` (default ``~/.cache/preflight/traces``): a second audit of the same
traces reads kilobytes.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from preflight.core.fsutil import atomic_write_text
from preflight.diagnose.trace_file import TraceError, find_traces, rank_from_name, read_trace
from preflight.diagnose.trace_identity import check_one_job
from preflight.diagnose.trace_rank import SUMMARY_VERSION, merge, summarize

SUMMARY_SUFFIX = ".summary.json"
SMALL_BYTES = 32 * 1024 * 1024     # compressed trace bytes read in this process when --jobs is not given


def cache_dir() -> Path:
    return Path(os.environ.get("PREFLIGHT_CACHE") or Path.home() / ".cache" / "preflight") / "traces"


def summarize_file(path: str | Path, use_cache: bool = True) -> dict:
    """The summary of one trace file (``preflight.diagnose.trace_rank.summarize``), from the cache
    when this content was read before; raises :class:`TraceError`."""
    path = Path(path)
    try:
        raw = path.read_bytes()                     # read once: hashed for the cache, parsed below
    except OSError as e:
        raise TraceError(f"{path}: cannot be read ({e.strerror})") from None
    sha = hashlib.sha256(raw).hexdigest()
    cached = cache_dir() / f"{sha}.v{SUMMARY_VERSION}.json"
    if use_cache and cached.is_file():
        try:
            out = json.loads(cached.read_text())
            out["meta"].update(file=path.name, path=str(path))
            return out
        except (OSError, ValueError, KeyError):
            pass                                   # a damaged cache entry: read the trace again
    out = summarize(read_trace(path, raw))
    out["meta"]["sha256"] = sha
    if use_cache:
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(cached, json.dumps(out), fsync=False)
        except OSError:
            pass                                   # a read-only home: no cache, same answer
    return out


def _one(path: str, use_cache: bool) -> tuple[str, dict | None, str | None]:
    try:
        return path, summarize_file(path, use_cache), None
    except TraceError as e:
        return path, None, str(e)
    except MemoryError:
        return path, None, f"{path}: out of memory while reading it (read it where it is: traces --summarize)"


def read_summary(path: Path) -> dict:
    try:
        s = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise TraceError(f"{path}: not a readable summary ({e})") from None
    if not isinstance(s, dict) or s.get("version") != SUMMARY_VERSION or "meta" not in s:
        raise TraceError(f"{path}: not a trace summary of version {SUMMARY_VERSION} (written by another "
                         "Preflight version? summarise the trace again)")
    why = summary_problem(s)
    if why:
        raise TraceError(f"{path}: not a complete trace summary: {why} (summarise the trace again)")
    return s


def summary_problem(s: dict) -> str | None:
    """What is missing or of the wrong type in a summary read from disk (a hand-edited or truncated
    one), or None: the fields the analysis reads, checked before it reads them."""
    m = s.get("meta")
    checks = [(m, dict, "meta"), ((m or {}).get("file") if isinstance(m, dict) else None, str, "meta.file"),
              (s.get("window"), dict, "window"), (s.get("steps"), list, "steps"), (s.get("data"), dict, "data"),
              (s.get("comm"), dict, "comm"), (s.get("flops"), dict, "flops")]
    for v, t, name in checks:
        if not isinstance(v, t):
            return f"{name} is {type(v).__name__}, not {t.__name__}"
    rank, world = m.get("rank"), m.get("world_size")
    for v, name, hi in ((world, "meta.world_size", 10**6), (rank, "meta.rank", (world or 10**6) - 1)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= hi):
            return f"{name} {v!r} is not an integer in 0..{hi}"
    if not isinstance(m.get("devices", []), list):
        return "meta.devices is not a list"
    g = s.get("gpu")
    if g is not None and not (isinstance(g, dict) and all(isinstance(g.get(k), int) and g[k] >= 0
                                                          for k in ("span_ns", "busy_ns", "idle_ns", "comm_ns"))):
        return "gpu's times are not non-negative integers"
    colls = s["comm"].get("collectives")
    for c in colls if isinstance(colls, list) else [None]:
        if not isinstance(c, dict) or not isinstance(c.get("dur_ns"), int) or c["dur_ns"] < 0:
            return "comm.collectives holds an entry without a non-negative dur_ns"
    for st in s["steps"]:
        if not isinstance(st, dict) or not isinstance(st.get("dur_ns"), int) or st["dur_ns"] < 0:
            return "steps holds an entry without a non-negative dur_ns"
    return None


def _progress(done: int, total: int) -> None:
    if sys.stderr.isatty() and total > 1:
        print(f"\rreading traces: {done}/{total} files", end="" if done < total else "\n", file=sys.stderr)


def read_job(folder: str | Path, jobs: int | None = None, use_cache: bool = True) -> dict:
    """Every rank's summary and what could not be read: {folder, ranks {rank: summary}, unreadable
    [{file, why}], world_size, notes}. Raises :class:`TraceError` for an unusable folder (see the
    module's docstring)."""
    folder = Path(folder)
    if folder.is_file():
        raise TraceError(f"{folder}: is a file: pass its folder ({folder.parent}); every rank's trace is read from it")
    if not folder.is_dir():
        raise TraceError(f"{folder}: no such folder (the traces folder: torch.profiler's output, one file per rank)")
    files = find_traces(folder)
    summaries = sorted(p for p in folder.rglob(f"*{SUMMARY_SUFFIX}") if p.is_file())
    if not files and not summaries:
        raise TraceError(f"{folder}: no trace in it (expected *.json or *.json.gz as torch.profiler writes them, "
                         f"or per-rank *{SUMMARY_SUFFIX})")
    got, unreadable = [read_summary(p) for p in summaries], []
    small = sum(p.stat().st_size for p in files) < SMALL_BYTES        # a process costs more than reading them
    jobs = max(1, min(jobs or (1 if small else os.cpu_count() or 1), len(files)))
    if jobs == 1 or len(files) == 1:
        results = [_one(str(p), use_cache) for p in files]
        _progress(len(files), len(files))
    else:
        results = []
        with ProcessPoolExecutor(jobs) as pool:
            futs = [pool.submit(_one, str(p), use_cache) for p in files]
            for k, f in enumerate(as_completed(futs), 1):
                results.append(f.result())
                _progress(k, len(files))
    for path, s, err in sorted(results):
        if err:
            unreadable.append({"file": Path(path).name, "why": err})
        else:
            got.append(s)
    if not got:
        raise TraceError("no trace could be read: " + "; ".join(u["why"] for u in unreadable))
    return _assemble(folder, got, unreadable)


def _assemble(folder: Path, got: list[dict], unreadable: list[dict]) -> dict:
    notes = []
    for s in got:
        m = s["meta"]
        if m.get("rank") is None:
            r = rank_from_name(Path(m["file"]))
            if r is not None:
                m["rank"], m["rank_source"] = r, "file name"
            elif len(got) == 1 and not unreadable:
                m["rank"], m["rank_source"] = 0, "a lone file (no distributedInfo, no rank in its name): rank 0 assumed"
            else:
                raise TraceError(f"{m['path']}: which rank is it? The trace has no distributedInfo and its name no "
                                 "'rank<N>': rename it (e.g. rank3.json.gz) or trace under torch.distributed")
    sizes = {s["meta"]["world_size"]: s["meta"]["file"] for s in got if s["meta"].get("world_size")}
    if len(sizes) > 1:
        (a, fa), (b, fb) = list(sizes.items())[:2]
        raise TraceError(f"{folder}: traces of different jobs: {fa} says world_size {a}, {fb} says {b}")
    by_rank: dict[int, list[dict]] = {}
    for s in got:
        by_rank.setdefault(s["meta"]["rank"], []).append(s)
    ranks = {}
    for r, parts in sorted(by_rank.items()):
        if len(parts) > 1:
            seen: dict[str, str] = {}
            for p in parts:
                for n in p.get("step_names") or ["(no steps)"]:
                    if n in seen and seen[n] != p["meta"]["file"]:
                        raise TraceError(f"{folder}: rank {r} twice: {seen[n]} and {p['meta']['file']} both hold {n} "
                                         "(copies of one trace? keep one)")
                    seen[n] = p["meta"]["file"]
            notes.append(f"rank {r}: {len(parts)} files of successive steps, summed")
        ranks[r] = merge(parts) if len(parts) > 1 else parts[0]
    check_one_job(folder, by_rank)
    world = next(iter(sizes), None)
    beyond = [r for r in by_rank if world and r >= world]
    if beyond:
        f = by_rank[beyond[0]][0]["meta"]
        raise TraceError(f"{f['path']}: rank {beyond[0]} (from {f.get('rank_source')}) is not in a world of size {world} "
                         f"(0..{world - 1}): a trace of another job?")
    missing = sorted(set(range(world)) - set(ranks)) if world else []
    return {"folder": str(folder), "ranks": ranks, "unreadable": unreadable, "world_size": world,
            "missing": missing, "notes": notes}
