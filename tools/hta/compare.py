"""Preflight's trace numbers beside Holistic Trace Analysis's, on every trace of ``../shared/traces``.

    python tools/hta/compare.py [TRACES_DIR] [HTA_NUMBERS_JSON]     # prints the Markdown table

HTA's numbers come from ``tools/hta/hta_numbers.py`` (run in a scratch venv: HTA is not a dependency);
ours from ``preflight.chapters.traces.audit_traces``, as ``python -m preflight traces DIR --json``
prints them. ``rows()`` is what ``tests/test_traces_vs_hta.py`` checks (within 0.5 points).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lib"))

from preflight.chapters.traces import audit_traces  # noqa: E402
from preflight.diagnose.trace_file import TraceError  # noqa: E402

TRACES = REPO.parent / "shared" / "traces"
HTA = Path(__file__).with_name("hta-numbers.json")


def _pct(x):
    return None if x is None else round(100 * x, 2)


def _hta_rank(entry: dict, rank: int) -> dict:
    """HTA's idle, overlap and exposed communication (%) for one rank: its default run, and the run with
    its nanosecond rounding switched off where the trace has fractional microseconds."""
    r = next((x for x in entry["ranks"] if x["rank"] == rank), None)
    if r is None:
        return {}
    out = {"errors": r.get("errors") or {}}
    t = r.get("temporal") or {}
    out["idle"] = t.get("idle_time_pctg")
    out["overlap"] = (r.get("overlap") or {}).get("comp_comm_overlap_pctg")
    cats = (r.get("kernel_breakdown") or {}).get("union_time_by_category_us") or {}
    span = t.get("kernel_time(us)")
    alone = cats.get("COMMUNICATION", 0) + cats.get("COMMUNICATION overlapping MEMORY", 0)
    out["exposed"] = round(100 * alone / span, 2) if span and cats else None
    nr = (entry.get("variants") or {}).get("no_ns_rounding")
    if isinstance(nr, dict) and str(rank) in nr:
        v = nr[str(rank)]
        out["idle_unrounded"] = (v.get("temporal") or {}).get("idle_time_pctg")
        out["overlap_unrounded"] = (v.get("overlap") or {}).get("comp_comm_overlap_pctg")
    return out


def rows(traces: Path = TRACES, hta_json: Path = HTA) -> list[dict]:
    hta = {e["folder"]: e for e in json.loads(hta_json.read_text())["traces"]}
    out = []
    for folder in sorted(p for p in traces.iterdir() if p.is_dir()):
        try:
            a = audit_traces(folder, jobs=1)
        except TraceError as e:
            out.append({"folder": folder.name, "rank": None, "error": str(e)})
            continue
        for r, v in sorted(a["ranks"].items()):
            h = _hta_rank(hta.get(folder.name, {"ranks": []}), r)
            q = next(x for x in a["quality"] if x["rank"] == r)
            out.append({"folder": folder.name, "rank": r, "idle": _pct(v.get("idle")), "overlap": _pct(v.get("overlap")),
                        "exposed": _pct(v.get("exposed_comm_total")), "hta": h, "limits": q["limits"]})
    return out


def _cell(x):
    return "n/a" if x is None else f"{x:.2f}"


def markdown(rs: list[dict]) -> str:
    lines = ["| trace | rank | idle % (ours) | idle % (HTA, default / unrounded) | overlap % (ours) | overlap % (HTA) "
             "| exposed comm % (ours) | exposed % (HTA's breakdown) | HTA errors |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rs:
        h = r.get("hta", {})
        idle_h = _cell(h.get("idle")) + (f" / {_cell(h['idle_unrounded'])}" if h.get("idle_unrounded") is not None else "")
        ov_h = _cell(h.get("overlap")) + (f" / {_cell(h['overlap_unrounded'])}"
                                          if h.get("overlap_unrounded") is not None else "")
        errs = "; ".join(f"{k}: {v.split(':')[0]}" for k, v in (h.get("errors") or {}).items()) or "-"
        lines.append(f"| {r['folder']} | {r['rank']} | {_cell(r.get('idle'))} | {idle_h} | {_cell(r.get('overlap'))} | "
                     f"{ov_h} | {_cell(r.get('exposed'))} | {_cell(h.get('exposed'))} | {errs} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    args = sys.argv[1:]
    print(markdown(rows(Path(args[0]) if args else TRACES, Path(args[1]) if len(args) > 1 else HTA)), end="")
