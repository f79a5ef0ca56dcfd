"""Before/after: what changed between two audits of a project (``python -m preflight compare``).

Typical use: audit, change the plan or the code (ZeRO-1, shards, bf16 gradients...), audit again
into another folder, then compare the two folders. Both findings.json files are read through
:func:`preflight.reporting.report.load_findings` (so both are schema-checked) and matched by finding id:

- ``change``: new - old in the finding's unit (fractions in percentage points), and ``relative``:
  (new - old) / |old|, when both values are numbers (and old is not 0 for the relative one);
- ``verdict``: old -> new, marked ``improved`` or ``worse`` when both are judged verdicts
  (pass < warn < fail < error), ``same`` when equal, and ``changed`` when one side is ``info``
  (recorded, not judged: e.g. a plan-only audit against a measured one), which is neither;
- findings present on one side only (a chapter not run, a finding added) are listed apart.

Ids are matched as this version names them: an older findings.json's ids are renamed through the
registry's alias table first (``preflight.chapters.registry.current_id``: ``comm/allreduce_s`` is
``communication/allreduce_s``), so an audit from before a prefix rename still pairs finding by finding.

The result prints as a terminal table and is written as ``compare.html``: the report's page style,
printable, offline, every string escaped.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from preflight.chapters.registry import current_id
from preflight.core.findings import VERDICT_RANK
from preflight.core.numfmt import fmt_delta, fmt_finding, fmt_rel, is_memory
from preflight.reporting.html import esc, facts_table, fid, page, table, verdict_badge

MARKS = ("improved", "worse", "changed", "same")


@dataclass
class Row:
    """One finding id on both sides (``old``/``new``: the finding dicts; None on a missing side)."""
    id: str
    old: dict | None
    new: dict | None

    @property
    def unit(self) -> str:
        return (self.new or self.old)["unit"]

    def _numbers(self):
        if self.old and self.new and self.old["unit"] == self.new["unit"]:
            a, b = self.old["value"], self.new["value"]
            if a is not None and b is not None:
                return a, b
        return None

    @property
    def delta(self) -> float | None:
        ab = self._numbers()
        return None if ab is None else ab[1] - ab[0]

    @property
    def relative(self) -> float | None:
        ab = self._numbers()
        return None if ab is None or ab[0] == 0 else (ab[1] - ab[0]) / abs(ab[0])

    @property
    def mark(self) -> str:
        """improved / worse / same / changed (see the module docstring); '' on a missing side."""
        return mark(self.old["verdict"], self.new["verdict"]) if self.old and self.new else ""



def mark(a: str | None, b: str | None) -> str:
    """How verdict ``a`` (old) -> ``b`` (new) reads: improved / worse / same / changed; '' if one is missing."""
    if a is None or b is None:
        return ""
    if a == b:
        return "same"
    if "info" in (a, b):
        return "changed"
    return "improved" if VERDICT_RANK[b] < VERDICT_RANK[a] else "worse"


def current_findings(summary: dict) -> dict[str, dict]:
    """An audit's findings by id, each id as this version names it (old prefixes renamed)."""
    return {current_id(f["id"]): f | {"id": current_id(f["id"])} for f in summary["findings"]}


def match(old: dict, new: dict) -> tuple[list[Row], list[dict], list[dict]]:
    """Pair the findings by (current) id: (rows in NEW's order, only in OLD, only in NEW)."""
    o, n = current_findings(old), current_findings(new)
    rows = [Row(i, o[i], f) for i, f in n.items() if i in o]
    return rows, [f for i, f in o.items() if i not in n], [f for i, f in n.items() if i not in o]


def chapter_rows(old: dict, new: dict) -> list[tuple[str, str | None, str | None]]:
    """(chapter name, old verdict, new verdict) for every chapter on either side, matched by name."""
    def verdicts(s):
        return {c["name"]: (c["verdict"] if c["status"] == "ok" else "error") for c in s["chapters"]}
    o, n = verdicts(old), verdicts(new)
    return [(name, o.get(name), n.get(name)) for name in list(n) + [x for x in o if x not in n]]


def warnings(old: dict, new: dict) -> list[str]:
    """What makes the two audits less comparable; shown, never fatal."""
    out = []
    if old["project"] != new["project"]:
        out.append(f"different projects: OLD is {old['project']!r}, NEW is {new['project']!r}")
    if old["mode"] != new["mode"]:
        out.append(f"different modes: OLD {old['mode']}, NEW {new['mode']} (measured findings are info in plan-only)")
    if old["machine"]["label"] != new["machine"]["label"]:
        out.append(f"different machines: OLD {old['machine']['label']}, NEW {new['machine']['label']}")
    return out


UNMEASURED = ("computed from profile", "not measured", "audit")


def _measured(f: dict) -> bool:
    return not any(f["source"].startswith(x) for x in UNMEASURED)


def regressions(old: dict, new: dict) -> list[tuple[str, str]]:
    """(finding id, why) for each regression from OLD to NEW (``compare --fail-on-regression``):

    * a verdict that got worse (pass -> warn, warn -> fail, ...), whatever the source;
    * a measured value (both sides measured, a judged threshold giving its direction) that moved the
      wrong way by more than its noise: ``|new - old| > noise x |old|``, with ``noise`` the larger of
      the two findings' recorded spreads ((p90 - p10) / median of the repeats behind the value). A
      value without a recorded spread is judged on its verdict only: no fixed percentage stands in.
    """
    from preflight.reporting.guidance import threshold_of

    out = []
    rows, _, _ = match(old, new)
    for r in rows:
        if r.mark == "worse":
            out.append((r.id, f"verdict {r.old['verdict']} -> {r.new['verdict']}"))
            continue
        t = threshold_of(r.new) or threshold_of(r.old)
        noises = [x for x in (r.old.get("noise"), r.new.get("noise")) if x is not None]
        if r.delta is None or t is None or not noises or not (_measured(r.old) and _measured(r.new)):
            continue
        worse = r.delta < 0 if t.higher_is_better else r.delta > 0
        noise = max(noises)
        if worse and abs(r.delta) > noise * abs(r.old["value"]):
            out.append((r.id, f"{fmt_finding(r.old)} -> {fmt_finding(r.new)} "
                              f"({fmt_rel(r.relative)}), beyond its noise of {noise:.1%} (p10-p90 of the repeats)"))
    return out


def counts(rows: list[Row]) -> dict[str, int]:
    return {m: sum(r.mark == m for r in rows) for m in MARKS}


def text_report(old: dict, new: dict, old_name: str = "OLD", new_name: str = "NEW") -> str:
    """The comparison as a plain-text table for the terminal (no colour: it goes to logs and CI)."""
    rows, only_old, only_new = match(old, new)
    lines = [f"OLD  {old_name}: {old['project']}, {old['mode']}, {old['date']}",
             f"NEW  {new_name}: {new['project']}, {new['mode']}, {new['date']}", "",
             "chapter verdicts:"]
    for name, a, b in chapter_rows(old, new):
        lines.append(f"  {name:<20} {a or '-':>5} -> {b or '-':<5}  {mark(a, b)}".rstrip())
    head = ("finding", "old", "new", "change", "relative", "verdict", "")
    cells = [(r.id, fmt_finding(r.old), fmt_finding(r.new),
              fmt_delta(r.delta, r.unit, is_memory(r.id)), fmt_rel(r.relative),
              f"{r.old['verdict']} -> {r.new['verdict']}", r.mark) for r in rows]
    width = [max(len(str(x)) for x in col) for col in zip(head, *cells)]
    fmt = lambda row: "  ".join(str(x).rjust(w) if 0 < i < 5 else str(x).ljust(w)  # noqa: E731
                                for i, (x, w) in enumerate(zip(row, width))).rstrip()
    lines += ["", fmt(head), fmt(["-" * w for w in width])] + [fmt(c) for c in cells]
    for side, only in (("OLD", only_old), ("NEW", only_new)):
        if only:
            lines += ["", f"only in {side} ({len(only)}):"]
            w = max(len(f["id"]) for f in only), max(len(fmt_finding(f)) for f in only)
            lines += [f"  {f['id']:<{w[0]}}  {fmt_finding(f):>{w[1]}}  {f['verdict']}" for f in only]
    n = counts(rows)
    lines += ["", ", ".join(f"{n[m]} {m}" for m in MARKS)
              + f"; {len(only_old)} only in OLD, {len(only_new)} only in NEW"]
    return "\n".join(lines) + "\n"


def _link(target: Path, out_dir: Path, text: str) -> str:
    """A relative link from the compare page to an audit's index.html, plain text if there is none."""
    if not target.is_file():
        return esc(text)
    return f"<a href='{esc(Path(os.path.relpath(target, out_dir)).as_posix())}'>{esc(text)}</a>"


def compare_html(old: dict, new: dict, old_dir: Path, new_dir: Path, out_dir: Path) -> str:
    """The comparison page: both audits' facts, chapter verdicts, every finding old vs new."""
    rows, only_old, only_new = match(old, new)

    def side(s, d, name):
        return f"<h3>{_link(d / 'index.html', out_dir, f'{name}: {d}')}</h3>{facts_table(s, notes=True)}"

    warn = "".join(f"<p><b>Warning:</b> {esc(w)}</p>" for w in warnings(old, new))
    chap = [f"<td>{esc(name)}</td><td>{verdict_badge(a) if a else '-'}</td><td>{verdict_badge(b) if b else '-'}</td>"
            f"<td class='ch-{mark(a, b)}'>{mark(a, b)}</td>" for name, a, b in chapter_rows(old, new)]
    cells = [(r.id, f"<td>{fid(r.id)}</td><td class='num'>{esc(fmt_finding(r.old))}</td>"
              f"<td class='num'>{esc(fmt_finding(r.new))}</td>"
              f"<td class='num'>{esc(fmt_delta(r.delta, r.unit, is_memory(r.id)))}</td>"
              f"<td class='num'>{esc(fmt_rel(r.relative))}</td>"
              f"<td>{verdict_badge(r.old['verdict'])} &rarr; {verdict_badge(r.new['verdict'])}</td>"
              f"<td class='ch-{esc(r.mark)}'>{esc(r.mark)}</td>") for r in rows]
    only = ""
    for name, fs in (("OLD", only_old), ("NEW", only_new)):
        if fs:
            only += f"<h2>Only in {name} ({len(fs)})</h2>" + table(
                ["finding", "value", "verdict", "threshold"],
                [f"<td>{fid(f['id'])}</td><td class='num'>{esc(fmt_finding(f))}</td>"
                 f"<td>{verdict_badge(f['verdict'])}</td><td>{esc(f['threshold'])}</td>" for f in fs], "findings")
    n = counts(rows)
    title = (f"Preflight compare: {old['project']}" if old["project"] == new["project"]
             else f"Preflight compare: {old['project']} vs {new['project']}")
    body = (f"<h1>{esc(title)}</h1>{warn}<p class='meta'>"
            + esc(", ".join(f"{n[m]} {m}" for m in MARKS) + f"; {len(only_old)} only in OLD, {len(only_new)} only in NEW")
            + "</p>" + side(old, old_dir, "OLD") + side(new, new_dir, "NEW")
            + "<h2>Chapter verdicts</h2>" + table(["chapter", "OLD", "NEW", ""], chap, "verdicts")
            + "<h2>Findings</h2>"
            + table(["finding", "OLD", "NEW", "change", "relative", "verdict", ""], cells, "findings")
            + only)
    return page(title, body)


def audit_folder(path) -> Path:
    """The audit folder of a path given as the folder or as its findings.json."""
    p = Path(path)
    return p if p.is_dir() else p.parent


def write_compare(old: dict, new: dict, old_dir, new_dir, out_dir=None) -> Path:
    """Write ``compare.html`` into ``out_dir`` (default: NEW's folder) and return its path.
    ``old``/``new``: audits already read with :func:`~preflight.reporting.report.load_findings`."""
    old_dir, new_dir = audit_folder(old_dir).resolve(), audit_folder(new_dir).resolve()
    out_dir = Path(out_dir) if out_dir else new_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "compare.html"
    path.write_text(compare_html(old, new, old_dir, new_dir, out_dir.resolve()))
    return path
