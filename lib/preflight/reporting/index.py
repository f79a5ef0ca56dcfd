"""The audit summary page, ``index.html``, from a validated findings.json (``preflight.reporting.report``).

Read top-down, it answers in order: what was audited (the facts), is it ready and what to fix first
(the overall line and the three fixes that buy the most, ranked as :mod:`preflight.reporting.guidance` says),
which pitfall stands where (one row per chapter: verdict, the deciding number, its threshold, the
fix), and then, per chapter, the findings that decide it (the rest folded in a ``<details>``) and its
charts, each under a title, at a readable size.
"""
from __future__ import annotations

import re
from pathlib import Path

from preflight.core.findings import VERDICT_RANK
from preflight.core.numfmt import fmt_finding, num
from preflight.reporting import guidance
from preflight.reporting.evidence_table import evidence_html
from preflight.reporting.html import (
    chapter_page,
    chapter_pitfall,
    chapter_title,
    chapter_verdict,
    esc,
    facts_table,
    named,
    page,
    scoped_svg,
    table,
    verdict_badge,
)
from preflight.reporting.tables import prose, short_paths
from preflight.reporting.titles import title

# The title above each chart of the report (charts/<chapter>--<key>.svg, written by the notebooks): what
# the chart shows, in words. A key not listed here is shown as its words ("memory_terms": "Memory terms").
CHART_HEADINGS = {
    "step_composition": "Where one training step's time goes",
    "op_categories": "Operator categories (profiler self time)",
    "fusion": "Eager vs torch.compile step time",
    "memory_terms": "Memory per GPU of the plan, against the GPU's memory",
    "scaling_curve": "Scaling efficiency per stage, against the stop rule",
    "amdahl": "Amdahl and Gustafson speedup over the number of GPUs",
    "read_rate": "Reading the same samples: small files vs shards",
    "break_points": "Supply against consumption, per pipeline stage",
    "tuner": "Data loader settings tried",
    "trace": "Data wait and prefetch queue, step by step",
    "allreduce_sweep": "All-reduce time per message size, measured and modelled",
    "overlap_emulated": "DDP step time per configuration (emulated device)",
    "overlap_real": "DDP step time per configuration (real compute)",
    "overlap_workload": "DDP step time per configuration: your model, real compute",
    "overlap_workload_emulated": "DDP step time per configuration: your model, emulated device",
    "padding_waste": "Padding waste per batching strategy",
    "padding_tokens_per_s": "Useful tokens per second per batching strategy",
    "schedule": "Pipeline schedule",
    "bubble_memory": "Activation memory held, per pipeline schedule",
    "measured_bubble": "Pipeline bubble: measured against the formula",
    "failure_probability": "Probability of a node failure over the run",
    "waste_curve": "Expected waste over the checkpoint interval",
    "resume_divergence": "Resuming without the full state: divergence from the uninterrupted run",
    "checkpoint_stall": "Training time lost per checkpoint, per method",
    "trace_timeline": "Your job's traces: one step per rank (compute, communication, copies; white is idle)",
    "trace_ranks": "Your job's traces: across ranks, best, median and worst",
    "plan_vs_trace": "Your job's traces against the plan: the planned step and the traced one, term by term",
    "hang_progress": "Your job's Flight Recorder dumps: how far each rank got in each process group",
}
CHART_SCALE = 1.3          # a chart's own size reads small on a report page: drawn 1.3x, at most
CHART_MAX_PX = 1000        # the page's width


def _fix_cell(c: dict, d: dict | None) -> str:
    """The verdict table's fix: the deciding finding's, unless the chapter passes (nothing to fix then)."""
    if d is None:
        return ""
    if chapter_verdict(c) == "pass":
        return "<span class='meta'>nothing to fix: keep the plan</span>"
    return prose(d["fix"])


def _counts(findings: list[dict]) -> str:
    n = {v: sum(f["verdict"] == v for f in findings) for v in VERDICT_RANK}
    return ", ".join(f"{n[v]} {v}" for v in reversed(VERDICT_RANK) if n[v]) or "no findings"


def findings_table(findings: list[dict]) -> str:
    """Findings as five columns: the finding, its value in its unit, the verdict, the threshold, and
    what it means with the fix and (file names only) where the number comes from."""
    rows = [(f["id"], f"<td>{named(f['id'])}</td><td class='num'>{esc(fmt_finding(f))}</td>"
             f"<td>{verdict_badge(f['verdict'])}</td><td>{esc(f['threshold'])}</td>"
             f"<td>{prose(f['message'])}<br><b>Fix:</b> {prose(f['fix'])}"
             f"<br><span class='src'>Source: {esc(short_paths(f['source']))}</span></td>") for f in findings]
    return table(["Finding", "Value", "Verdict", "Threshold", "What it means, and the fix"], rows, "findings")


def chapter_findings(findings: list[dict]) -> str:
    """The findings that decide the chapter in a table, the others folded below it."""
    first, rest = guidance.grouped(findings)
    html = findings_table(first) if first else ""
    if rest:
        html += (f"<details><summary>{len(rest)} more finding{'s' * (len(rest) > 1)} ({esc(_counts(rest))})"
                 f"</summary>{findings_table(rest)}</details>")
    return html


def scaled_svg(svg: str, scale: float = CHART_SCALE, max_px: int = CHART_MAX_PX) -> str:
    """``svg`` with its root width and height scaled by ``scale`` (at most ``max_px`` wide); the
    viewBox keeps the drawing, CSS (``max-width:100%``, print ``width:100%``) still sizes it."""
    m = re.search(r'<svg\b[^>]*?\bwidth="([\d.]+)"[^>]*?\bheight="([\d.]+)"', svg)
    if not m:
        return svg
    w, h = float(m.group(1)), float(m.group(2))
    k = min(scale, max_px / w)
    head = m.group(0).replace(f'width="{m.group(1)}"', f'width="{w * k:.0f}"', 1)
    head = head.replace(f'height="{m.group(2)}"', f'height="{h * k:.0f}"', 1)
    return svg.replace(m.group(0), head, 1)


def chart_heading(key: str) -> str:
    return CHART_HEADINGS.get(key) or key.replace("_", " ").capitalize()


def chapter_charts(out_dir: Path, chapter: str) -> str:
    """The chapter's key charts (``charts/<chapter>--<key>.svg``, written by the notebook), each a
    figure with its title above it."""
    figs = []
    order = list(CHART_HEADINGS)      # the order the table lists them in: the chapter's story, not the alphabet
    rank = (lambda p: (order.index(k) if (k := p.stem.split("--", 1)[1]) in order else len(order), p.name))
    for svg in sorted((out_dir / "charts").glob(f"{chapter}--*.svg"), key=rank):
        key = svg.stem.split("--", 1)[1]
        figs.append(f"<figure id='{esc(svg.stem)}'><figcaption>{esc(chart_heading(key))}</figcaption>"
                    f"{scaled_svg(scoped_svg(svg.read_text(), svg.stem))}</figure>")
    return f"<div class='charts'>{''.join(figs)}</div>" if figs else ""


def guidance_html(summary: dict) -> str:
    """The overall line ("4 of 5 chapters fail; fix these first:") and the top three fixes, each with
    the number that calls for it and how far it is from passing."""
    line = guidance.overall([chapter_verdict(c) for c in summary["chapters"]])
    fixes = guidance.top_fixes(summary["findings"])
    if not fixes:
        return f"<section class='guidance ok'><p class='overall'>{esc(line)}.</p></section>"
    items = []
    for f in fixes:
        s = guidance.shortfall(f)
        far = f"; {num(s)} times from its pass bound" if s is not None else ""
        why = guidance.CANNOT_START.get(f["id"]) or guidance.CONSEQUENCE_WORDS[guidance.consequence(f)]
        items.append(f"<li><b>{prose(f['fix'])}</b><br><span class='meta'>{esc(why)} · chapter {f['chapter']}, "
                     f"<a href='#{esc(f['id'])}'>{esc(title(f['id']))}</a>: {esc(fmt_finding(f))} "
                     f"({esc(f['threshold'])}){far}</span></li>")
    how = ("Ranked by verdict (fail before warn), then by consequence (a plan that cannot start or finish, then "
           "time lost, then a factor missed); among time lost, by the share of the run it costs where the finding "
           "says it (the step model's bubble and exposed communication, padding, the run's waste); then by how "
           "many times the number misses its pass bound: the factor the fix has to move it by.")
    return (f"<section class='guidance'><p class='overall'>{esc(line)}; fix these first:</p>"
            f"<ol class='fixes'>{''.join(items)}</ol><p class='meta'>{how}</p></section>")


def index_html(summary: dict, out_dir: Path) -> str:
    """The audit summary page; ``summary`` as returned by ``preflight.reporting.report.load_findings``."""
    by_ch = {c["number"]: [f for f in summary["findings"] if f["chapter"] == c["number"]]
             for c in summary["chapters"]}
    rows, sections = [], []
    for c in summary["chapters"]:
        found, d = by_ch[c["number"]], guidance.deciding(by_ch[c["number"]])
        pitfall = f"pitfall: {esc(chapter_pitfall(c))}<br>" if chapter_pitfall(c) else ""
        rows.append(
            f"<td><a href='{esc(chapter_page(c))}'>{esc(chapter_title(c))}</a>"
            f"<br><span class='meta'>{pitfall}{esc(_counts(found))}</span></td>"
            f"<td>{verdict_badge(chapter_verdict(c))}</td><td>{named(d['id']) if d else ''}</td>"
            f"<td class='num'>{esc(fmt_finding(d)) if d else ''}</td>"
            f"<td>{esc(d['threshold']) if d else ''}</td><td>{_fix_cell(c, d)}</td>")
        err = f"<p><b>Error:</b> <code>{esc(c['error'])}</code></p>" if c["error"] else ""
        sections.append(
            f"<section class='chapter' id='ch{c['number']}'><h2>{esc(chapter_title(c))} "
            f"{verdict_badge(chapter_verdict(c))}</h2>"
            f"<p class='meta'>{esc(c['status'])} in {c['elapsed_s']:.1f} s · "
            f"<a href='{esc(chapter_page(c))}'>chapter page</a> · "
            f"<a href='{esc(c['notebook'])}' download>executed notebook (.ipynb, to open in JupyterLab)</a></p>{err}"
            f"{chapter_findings(found)}{chapter_charts(out_dir, c['name'])}</section>")
    notes = f"<p class='notes'>{esc(summary['notes'])}</p>" if summary["notes"] else ""
    body = (f"<h1>Preflight audit: {esc(summary['project'])}</h1>{notes}{facts_table(summary)}"
            + guidance_html(summary)
            + "<h2>Verdicts</h2><p class='meta'>One row per chapter: its worst verdict and the finding that "
              "decided it (the number its threshold judges, furthest from passing).</p>"
            + table(["Chapter", "Verdict", "Deciding finding", "Value", "Threshold", "Fix"], rows, "verdicts")
            + evidence_html(summary)
            + "".join(sections)
            + "<p class='meta'>findings.json holds every number above, machine-readable "
              "(schema: preflight/schema/findings.schema.json).</p>")
    return page(f"Preflight audit: {summary['project']}", body)
