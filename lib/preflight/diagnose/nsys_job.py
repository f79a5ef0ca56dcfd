"""A folder of Nsight Systems exports read as one job: one rank per GPU, the same summaries, job dict
and verdicts as a folder of ``torch.profiler`` traces (``preflight.diagnose.trace_job``).

``DIR`` holds ``*.sqlite`` files written by ``nsys export --type sqlite`` (one per rank, or one per
node holding all its GPUs). An ``.nsys-rep`` (or the older ``.qdrep``) beside its export is skipped;
one without its export is named with the command that makes it. A folder that mixes exports with
Kineto traces is refused: one job, one format.

**Ranks.** An export does not record ``torch.distributed`` ranks. When every export holds one GPU and
every name says ``rank<N>``, that is the rank; otherwise ranks are numbered in the order of the files'
names, then device ids (the quality table says so on each row). The world size is not known.

**The window** (``trace_rank``'s rules, the steps read from NVTX): the ranges named ``ProfilerStep#N``,
or a user's ``step`` / ``iteration N`` ranges, the last one dropped; with fewer than two, the whole
capture. Each export's summaries are cached by content like a trace's.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from preflight.core.fsutil import atomic_write_text
from preflight.diagnose.nsys_file import read_export
from preflight.diagnose.nsys_tables import REPORT_SUFFIXES, SUFFIX, export_command
from preflight.diagnose.trace_file import TraceError, find_traces, rank_from_name
from preflight.diagnose.trace_job import SUMMARY_SUFFIX, _assemble, cache_dir
from preflight.diagnose.trace_rank import SUMMARY_VERSION, summarize

WHOLE = "the whole capture: every GPU event (no NVTX step ranges, ProfilerStep#N or 'step')"
ONE = "the whole capture: every GPU event (one NVTX step range: trace 3 or more steps)"


def _files(folder: Path, suffixes) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name.endswith(suffixes) and not p.name.startswith("."))


def has_exports(folder: Path) -> bool:
    """Whether the folder holds an Nsight Systems export or report (then this module reads it)."""
    return bool(_files(Path(folder), (SUFFIX, *REPORT_SUFFIXES)))


def summarize_export(path: Path, use_cache: bool = True) -> tuple[list[dict], dict]:
    """Each GPU's summary (``trace_rank.summarize``) of one export, with the window said in nsys's words,
    and the export's facts; from the cache when this content was read before."""
    h = hashlib.sha256()
    try:
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError as e:
        raise TraceError(f"{path}: cannot be read ({e.strerror})") from None
    cached = cache_dir() / f"{h.hexdigest()}.nsys.v{SUMMARY_VERSION}.json"
    if use_cache and cached.is_file():
        try:
            got = json.loads(cached.read_text())
            return got["summaries"], got["info"]
        except (OSError, ValueError, KeyError):
            pass                                   # a damaged cache entry: read the export again
    events, info = read_export(path)
    out = []
    for ev in events:
        s = summarize(ev)
        w = s["window"]
        if w["steps_in_trace"] < 2:
            w["basis"] = ONE if w["steps_in_trace"] == 1 else WHOLE
        else:
            w["basis"] = "NVTX step ranges: " + w["basis"]
        s["meta"]["sha256"] = h.hexdigest()
        out.append(s)
    if use_cache:
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(cached, json.dumps({"summaries": out, "info": info}), fsync=False)
        except OSError:
            pass                                   # a read-only home: no cache, same answer
    return out, info


def _number(per_file: list[tuple[Path, list[dict]]]) -> None:
    """Set each summary's rank and where it came from (see the module's docstring)."""
    named = [rank_from_name(p) for p, _ in per_file]
    by_name = all(len(s) == 1 for _, s in per_file) and None not in named and len(set(named)) == len(named)
    r = 0
    for (p, sums), n in zip(per_file, named):
        for s in sums:
            d = s["meta"]["nsys"]["device"]
            if by_name:
                s["meta"]["rank"], s["meta"]["rank_source"] = n, f"the file's name (an Nsight Systems export, GPU {d})"
            else:
                s["meta"]["rank"] = r
                s["meta"]["rank_source"] = (f"GPU {d} of {p.name}, numbered by file name then device id (an Nsight "
                                            "Systems export records no torch.distributed rank)")
                r += 1


def read_job(folder: str | Path, use_cache: bool = True) -> dict:
    """The job dict of ``trace_job.read_job`` from a folder of exports; raises :class:`TraceError` when
    nothing can be read or the folder mixes formats."""
    folder = Path(folder)
    exports, reports = _files(folder, (SUFFIX,)), _files(folder, REPORT_SUFFIXES)
    kineto = find_traces(folder) + _files(folder, (SUMMARY_SUFFIX,))
    if kineto:
        other = (exports or reports)[0]
        raise TraceError(f"{folder}: both torch.profiler traces ({kineto[0].name}) and Nsight Systems files "
                         f"({other.name}): one job's traces in one format per folder; move one set out")
    unreadable, per_file, notes = [], [], []
    have = {p.with_suffix("") for p in exports}
    for rep in reports:
        if rep.with_suffix("") in have:
            notes.append(f"{rep.name}: skipped, its export {rep.with_suffix(SUFFIX).name} is read")
        else:
            unreadable.append({"file": rep.name, "why": f"{rep}: an Nsight Systems report, which only nsys reads: export it "
                                                        f"where it is, `{export_command(rep)}`, then run this again"})
    for p in exports:
        try:
            sums, info = summarize_export(p, use_cache)
        except TraceError as e:
            unreadable.append({"file": p.name, "why": str(e)})
            continue
        except MemoryError:
            unreadable.append({"file": p.name, "why": f"{p}: out of memory while reading it"})
            continue
        per_file.append((p, sums))
        notes.append(f"{p.name}: Nsight Systems export (schema {info['schema']}, nsys {info['product']}), "
                     f"GPUs {', '.join(map(str, info['devices']))}, one rank each"
                     + (f"; a window cut from a longer capture ({info['derived_window']} ns)" if info.get("derived_window")
                        else ""))
        notes += [f"{p.name}: {n}" for n in info["notes"]]
    if not per_file:
        raise TraceError("no Nsight Systems export could be read: " + "; ".join(u["why"] for u in unreadable))
    _number(per_file)
    job = _assemble(folder, [s for _, sums in per_file for s in sums], unreadable)
    job["notes"] = notes + job["notes"]
    return job
