"""The report's quality table: what each source of evidence the audit read could tell.

One table, one row per source file or folder: the job's ``torch.profiler`` traces and Nsight Systems
exports (``audit --traces DIR``: one row per rank's file, from ``summary["traces"]["quality"]``), its
Flight Recorder dumps (``--flight-recorder DIR``) and its per-op straggler trace (``--stragglers DIR``),
one row per folder (``summary["evidence"]``, :mod:`preflight.runner.evidence`). Each row says what the
source holds, which chapters it can support, what it could not say (its limits), and what it told.
"""
from __future__ import annotations

from preflight.reporting.html import esc, table
from preflight.reporting.tables import short_paths

MAX_TRACE_ROWS = 64


def trace_source(file: str) -> str:
    """The kind of a traces row, from its file's name (an export's rows read ``node0.sqlite GPU 1``)."""
    if ".sqlite" in file:
        return "Nsight Systems export"
    if file.endswith(".summary.json"):
        return "torch.profiler trace (summary)"
    return "torch.profiler trace"


def _trace_row(q: dict) -> str:
    held = [f"{q['events']:,} events" if q.get("events") is not None else "",
            f"{q['gpu_events']:,} GPU events" if q.get("gpu_events") is not None else "",
            f"{q['steps']} steps in the window" if q.get("steps") is not None else ""]
    holds = ", ".join(x for x in held if x) + (f"; window: {q['window']}" if q.get("window") else "")
    return (f"<td>{esc(trace_source(q['file']))}</td><td class='num'>{'?' if q['rank'] is None else q['rank']}</td>"
            f"<td>{esc(q['file'])}</td><td>{esc(holds)}</td><td>{esc(', '.join(q['supports']) or 'nothing')}</td>"
            f"<td>{esc('; '.join(q['limits']) or 'none')}</td><td>its findings (<code>*/trace_*</code>) in each "
            "chapter below</td>")


def _evidence_row(e: dict) -> str:
    file = e.get("file") or f"{e['files']} files"
    return (f"<td>{esc(e['source'])}</td><td>{esc(e['ranks'])}</td>"
            f"<td>{esc(file)}<br><span class='meta'>in {esc(short_paths(e['folder']))}</span></td>"
            f"<td>{esc(e['holds'])}</td><td>{esc(', '.join(e['supports']))}</td>"
            f"<td>{esc('; '.join(e['limits']) or 'none')}</td><td>{esc(e['told'])}</td>")


def evidence_html(summary: dict) -> str:
    """The section "What each source could tell" (nothing when the audit read no evidence of the job's)."""
    t, ev = summary.get("traces"), summary.get("evidence") or []
    if not t and not ev:
        return ""
    intro, rows = [], []
    if t:
        miss = f" {len(t['missing'])} of {t['world_size']} ranks have no trace." if t.get("missing") else ""
        intro.append(f"Your job's traces: {len(t['ranks'])} rank(s) read from <code>{esc(short_paths(t['folder']))}</code>"
                     + (f", world size {t['world_size']}" if t["world_size"] else "") + f".{esc(miss)}")
        rows += [_trace_row(q) for q in t["quality"][:MAX_TRACE_ROWS]]
    rows += [_evidence_row(e) for e in ev]
    more = (f"<p class='meta'>{len(t['quality']) - MAX_TRACE_ROWS} more trace files: <code>python -m preflight traces "
            f"{esc(t['folder'])} --json</code> lists each.</p>" if t and len(t["quality"]) > MAX_TRACE_ROWS else "")
    return ("<h2>What each source could tell</h2>"
            f"<p class='meta'>{' '.join(intro)} Per source: what it holds, which chapters it can support, what it "
            "could not say, and what it told (the findings are in their chapters below).</p>"
            + table(["Source", "Ranks", "File", "What it holds", "Supports", "Limits", "What it told"], rows,
                    "trace-quality") + more)
