"""``python -m preflight hang DIR``: the Flight Recorder analysis (``preflight.diagnose.flight_recorder``)
in the terminal, as JSON, or as a picture (``--svg``)."""
from __future__ import annotations

import json

from preflight.diagnose.flight_recorder import finding_of, ranks_text, where_text


def as_json(a: dict) -> str:
    return json.dumps({**a, "finding": finding_of(a)}, indent=1)


def text_report(a: dict) -> str:
    s, lines = a["stopped_at"], []
    skipped = f"; skipped: {', '.join(a['skipped'])}" if a["skipped"] else ""
    lines.append(f"Flight Recorder: {len(a['files'])} dumps in {a['folder']} (version {', '.join(a['versions'])}){skipped}")
    lines.append(f"ranks: {len(a['world'])}; no dump: {ranks_text(a['missing_dumps'])}; "
                 f"empty recorder: {ranks_text(a['empty_dumps'])}")
    lines.append(f"state: {a['state']}")
    if s:
        lines.append(f"stopped at: {where_text(s)}")
        lines.append(f"  never launched by: {ranks_text(s['not_enqueued'])}")
        lines.append(f"  launched, not completed by: {ranks_text(s['not_completed'])}"
                     f" (waiting in it first: {ranks_text(s['waiting'])})")
    lines.append(f"likely faulty ranks: {ranks_text(a['likely_faulty'])}")
    for x in a["suspects"]:
        lines.append(f"  rank {x['rank']} ({x['confidence']}): " + "; ".join(x["reasons"]))
    hung = [g for g in a["groups"] if g["stuck"] is not None and g["not_enqueued"]]
    rest = sum(g["stuck"] is not None and not g["not_enqueued"] for g in a["groups"])
    if hung:
        lines.append(f"groups where a member never launched the collective the others wait in ({len(hung)} of "
                     f"{len(a['groups'])}; {rest} more have one every member launched and none completed):")
        lines.append(f"  {'group':>6}  {'desc':<40} {'ranks':>5}  {'stuck at':>9}  {'op':<22} {'never launched':<16} waiting")
        for g in hung:
            op = (g["op"] or {}).get("op") or "?"
            lines.append(f"  {g['name']:>6}  {g['desc'][:40]:<40} {len(g['ranks']):>5}  {g['stuck']:>9}  {op[:22]:<22} "
                         f"{ranks_text(g['not_enqueued']):<16} {ranks_text(g['not_completed'])}")
    elif rest:
        lines.append(f"{rest} of {len(a['groups'])} groups have a collective every member launched and none completed")
    mism = [m for g in a["groups"] for m in g["mismatches"]]
    lines.append(f"mismatched collectives (same sequence id, different op, dtype or size): {len(mism) or 'none'}")
    for m in mism[:20]:
        vals = ", ".join(f"rank {r}: {v}" for r, v in m["values"].items())
        lines.append(f"  group {m['group']} collective {m['seq']} {m['field']}: {vals}")
    f = finding_of(a)
    lines.append(f"finding {f['id']}: {f['verdict']}: {f['message']}")
    if f["verdict"] != "pass":
        lines.append(f"fix: {f['fix']}")
    return "\n".join(lines) + "\n"
