"""A job's profiler traces in the terminal: ``python -m preflight traces DIR`` (a CI gate like ``check``).

First the trace-quality table (per file: rank, events, steps, what it can support and why not), then
the five chapters' trace findings (``preflight.chapters.traces``), the same the audit's report shows
with ``--traces DIR``. ``--json`` prints both as one JSON document; ``--fail-on`` exits 1 when a
verdict reaches that level. ``--summarize FILE --out DIR`` writes one file's summary
(``<name>.summary.json``, kilobytes) for reading a job's traces where they are (a Slurm task per
node); ``traces DIR`` then reads the summaries as it reads traces.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from preflight.chapters import traces as T
from preflight.chapters.registry import CHAPTERS
from preflight.core.findings import worst
from preflight.core.fsutil import atomic_write_text
from preflight.core.numfmt import num
from preflight.diagnose.trace_job import SUMMARY_SUFFIX, summarize_file
from preflight.runner.check import finding_lines, gate, overall_line


def by_chapter(a: dict) -> dict[int, list[dict]]:
    """Chapter number -> its trace findings (dicts of the findings contract)."""
    return {c.number: [asdict(f) for f in T.findings(a, c.name)] for c in CHAPTERS}


def summarize_many(traces: list[Path], out: Path, jobs: int | None = None) -> list[Path]:
    """``traces --summarize``: each trace's summary as ``out/<name>.summary.json``, ``jobs`` files read at
    once. Every file is read before anything is written: one bad file exits 2 with nothing written."""
    import os
    from concurrent.futures import ProcessPoolExecutor

    jobs = max(1, min(jobs or os.cpu_count() or 1, len(traces)))
    if jobs == 1:
        got = [summarize_file(p) for p in traces]
    else:
        with ProcessPoolExecutor(jobs) as pool:
            got = list(pool.map(summarize_file, traces))
    out.mkdir(parents=True, exist_ok=True)
    paths, used = [], set()
    for trace, s in zip(traces, got):
        stem = trace.name.removesuffix(".gz").removesuffix(".json")
        if stem in used:                      # the same name in two folders (node1/rank0.json, node2/...)
            stem = f"{stem}.{s['meta']['sha256'][:12]}"
        used.add(stem)
        paths.append(atomic_write_text(out / f"{stem}{SUMMARY_SUFFIX}", json.dumps(s), fsync=False))
    return paths


def as_json(a: dict, findings: dict[int, list[dict]], fail_on: str | None) -> str:
    rows = [f | {"chapter": n} for n, fs in findings.items() for f in fs]
    return json.dumps({"folder": a["folder"], "world_size": a["world_size"], "ranks_read": sorted(a["ranks"]),
                       "missing": a["missing"], "unreadable": a["unreadable"], "notes": a["notes"],
                       "quality": a["quality"], "ranks": {str(r): v for r, v in sorted(a["ranks"].items())},
                       "cross": a["cross"], "fail_on": fail_on, "exit_code": gate(findings, fail_on),
                       "findings": rows}, indent=1, default=str)


def quality_lines(a: dict, limit: int = 8) -> list[str]:
    rows = a["quality"]
    lines = [f"trace quality ({len(a['ranks'])} rank(s) read"
             + (f" of world size {a['world_size']}" if a["world_size"] else "")
             + (f", {len(a['unreadable'])} unreadable" if a["unreadable"] else "") + "):"]
    shown = rows if len(rows) <= limit else rows[: limit - 1] + [r for r in rows if r["rank"] is None][:1]
    for r in shown:
        rank = "-" if r["rank"] is None else r["rank"]
        lines.append(f"  rank {rank:>4}  {r['file']}: {num(r['events'] or 0)} events, "
                     f"{r['gpu_events'] or 0} GPU events, {r['steps'] or 0} steps in the window; "
                     f"supports {', '.join(r['supports']) or 'nothing'}")
        for why in r["limits"]:
            lines.append(f"             - {why}")
    if len(rows) > len(shown):
        lines.append(f"  ... {len(rows) - len(shown)} more (--json lists every file)")
    if a["missing"]:
        m = a["missing"]
        lines.append(f"  ranks with no trace: {len(m)} of {a['world_size']}"
                     + (f" ({', '.join(map(str, m[:10]))}{', ...' if len(m) > 10 else ''})"))
    lines += [f"  note: {n}" for n in a["notes"]]
    return lines


def text_report(a: dict, findings: dict[int, list[dict]]) -> str:
    names = {c.number: c for c in CHAPTERS}
    lines = [f"traces in {a['folder']}"] + quality_lines(a)
    for n, fs in findings.items():
        lines.append(f"chapter {n} {names[n].name:<16} {worst(f['verdict'] for f in fs)}")
        for f in fs:
            lines += finding_lines(f)
    lines.append(overall_line(findings))
    return "\n".join(lines) + "\n"
