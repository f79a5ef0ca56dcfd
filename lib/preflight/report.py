"""The audit report: static HTML that opens from disk with no network.

``index.html`` reads like an audit (project, machine, date, versions, a verdict per chapter with the
deciding number, threshold and fix, then every finding and the chapters' key charts); each executed
chapter gets its own page converted from the executed notebook. No script, no external URL: charts
are inline SVG, styles are inline, and every string that came from the user is escaped.
"""
from __future__ import annotations

import html
import re
from pathlib import Path

from preflight.findings import VERDICT_RANK

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#1d2430;line-height:1.45}
h1{margin-bottom:.2em} .meta{color:#555;font-size:.92em}
table{border-collapse:collapse;margin:1em 0;width:100%;font-size:.92em}
th,td{border:1px solid #d5d9e0;padding:.35em .55em;text-align:left;vertical-align:top}
th{background:#f1f3f6} td.num{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
.v{font-weight:700;text-transform:uppercase;font-size:.82em;padding:.1em .45em;border-radius:3px;color:#fff}
.v-pass{background:#2e7d32}.v-warn{background:#ef6c00}.v-fail{background:#c62828}.v-info{background:#546e7a}
.v-error{background:#6a1b9a}
.charts{display:flex;flex-wrap:wrap;gap:1em}.charts figure{margin:0}
pre{background:#f6f8fa;padding:.6em;overflow-x:auto;font-size:.85em}
.jp-InputPrompt,.jp-OutputPrompt{display:none}
.jp-RenderedHTMLCommon table{width:auto}
@media print{body{max-width:none;margin:0;font-size:10pt} a{color:inherit;text-decoration:none}
 .charts figure,table,tr{break-inside:avoid} @page{size:A4;margin:14mm}}
"""


def esc(x) -> str:
    return html.escape("" if x is None else str(x))


def fmt_value(value, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "fraction":
        return f"{value:.1%}"
    if unit == "x":
        return f"{value:.3g}x"
    if unit == "bytes":
        return f"{value / 1e9:.3g} GB"
    if abs(value) >= 1000:
        return f"{value:,.0f} {unit}".strip()
    return f"{value:.4g} {unit}".strip()


def verdict_badge(v: str) -> str:
    return f'<span class="v v-{esc(v)}">{esc(v)}</span>'


def page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body>{body}</body></html>\n")


def deciding(findings: list[dict]) -> dict | None:
    """The finding that sets a chapter's verdict: the worst one (first of equals)."""
    if not findings:
        return None
    return max(findings, key=lambda f: VERDICT_RANK[f["verdict"]])


def findings_table(findings: list[dict]) -> str:
    rows = "".join(
        f"<tr><td><code>{esc(f['id'])}</code></td><td class='num'>{esc(fmt_value(f['value'], f['unit']))}</td>"
        f"<td>{verdict_badge(f['verdict'])}</td><td>{esc(f['threshold'])}</td><td>{esc(f['message'])}</td>"
        f"<td>{esc(f['fix'])}</td><td>{esc(f['source'])}</td></tr>" for f in findings)
    return ("<table class='findings'><tr><th>finding</th><th>value</th><th>verdict</th><th>threshold</th>"
            f"<th>what it means</th><th>fix</th><th>source</th></tr>{rows}</table>")


def chapter_charts(out_dir: Path, chapter: str) -> str:
    figs = []
    for svg in sorted((out_dir / "charts").glob(f"{chapter}--*.svg")):
        caption = svg.stem.split("--", 1)[1].replace("_", " ")
        figs.append(f"<figure>{svg.read_text()}<figcaption>{esc(caption)}</figcaption></figure>")
    return f"<div class='charts'>{''.join(figs)}</div>" if figs else ""


def _title(c: dict) -> str:
    t = c["title"]
    return t if t.lower().startswith("chapter") else f"{c['number']}. {t}"


def index_html(summary: dict, out_dir: Path) -> str:
    m, ver = summary["machine"], summary["versions"]
    by_ch = {c["number"]: [f for f in summary["findings"] if f["chapter"] == c["number"]]
             for c in summary["chapters"]}
    rows = []
    for c in summary["chapters"]:
        d = deciding(by_ch[c["number"]])
        page_name = Path(c["notebook"]).stem + ".html"
        rows.append(
            f"<tr><td><a href='{esc(page_name)}'>{esc(_title(c))}</a></td>"
            f"<td>{verdict_badge(c['verdict'] if c['status'] == 'ok' else 'error')}</td>"
            f"<td><code>{esc(d['id']) if d else ''}</code></td>"
            f"<td class='num'>{esc(fmt_value(d['value'], d['unit'])) if d else ''}</td>"
            f"<td>{esc(d['threshold']) if d else ''}</td><td>{esc(d['fix']) if d else ''}</td></tr>")
    sections = []
    for c in summary["chapters"]:
        stem = Path(c["notebook"]).stem
        err = f"<p><b>Error:</b> <code>{esc(c['error'])}</code></p>" if c["error"] else ""
        sections.append(
            f"<section id='ch{c['number']}'><h2>{esc(_title(c))} "
            f"{verdict_badge(c['verdict'] if c['status'] == 'ok' else 'error')}</h2>"
            f"<p class='meta'>{esc(c['status'])} in {c['elapsed_s']:.1f} s · "
            f"<a href='{esc(stem)}.html'>chapter page</a> · "
            f"<a href='{esc(c['notebook'])}'>executed notebook</a></p>{err}"
            f"{findings_table(by_ch[c['number']])}{chapter_charts(out_dir, c['name'])}</section>")
    vers = ", ".join(f"{esc(k)} {esc(v)}" for k, v in ver.items() if v)
    body = (
        f"<h1>Preflight audit: {esc(summary['project'])}</h1>"
        f"<p>{esc(summary.get('notes'))}</p>"
        f"<p class='meta'>Machine: <b>{esc(m.get('label'))}</b> ({esc(m.get('count'))} "
        f"{'devices' if m.get('kind') == 'cuda' else 'cores'}, "
        f"{esc(round(m['memory_GB'], 1) if m.get('memory_GB') else '?')} GB "
        f"{'each' if m.get('kind') == 'cuda' else 'host memory'}) · date {esc(summary['date'])} · "
        f"mode <b>{esc(summary['mode'])}</b> · {esc(summary['elapsed_s'])} s<br>Versions: {vers}<br>"
        f"Profile: <code>{esc(summary['profile_path'])}</code>"
        + (f" · recorded results: <code>{esc(summary['results_dir'])}</code>" if summary.get("results_dir") else "")
        + "</p><h2>Verdicts</h2><table class='verdicts'><tr><th>chapter</th><th>verdict</th>"
          "<th>deciding finding</th><th>value</th><th>threshold</th><th>fix</th></tr>"
        + "".join(rows) + "</table>" + "".join(sections)
        + "<p class='meta'>findings.json holds every number above, machine-readable.</p>")
    return page(f"Preflight audit: {summary['project']}", body)


def chapter_html(notebook: Path, title: str) -> str:
    """A chapter page from its executed notebook: nbconvert's script-free ``basic`` template,
    inputs hidden (the executed notebook keeps the code), wrapped in the report's own page."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(notebook, as_version=4)
    body, _ = HTMLExporter(template_name="basic", exclude_input=True,
                           exclude_input_prompt=True, exclude_output_prompt=True).from_notebook_node(nb)
    nav = "<p class='meta'><a href='index.html'>&larr; audit summary</a></p>"
    return page(title, nav + body)


def write_report(summary: dict, out_dir: Path) -> Path:
    for c in summary["chapters"]:
        nb = out_dir / c["notebook"]
        if nb.exists():
            (out_dir / (Path(c["notebook"]).stem + ".html")).write_text(chapter_html(nb, c["title"]))
    index = out_dir / "index.html"
    index.write_text(index_html(summary, out_dir))
    return index


_REF = re.compile(r"""(?:src|href|xlink:href)\s*=\s*["']?\s*((?:https?:)?//[^"'\s>]+)|url\(\s*["']?((?:https?:)?//[^)"']+)""",
                  re.IGNORECASE)


def external_refs(text: str) -> list[str]:
    """External URLs a page would load (script/style/img/link/iframe sources, CSS url()).
    Plain links to sources in text are allowed; anything that fetches is not."""
    out = []
    for m in _REF.finditer(text):
        url = m.group(1) or m.group(2)
        start = text.rfind("<", 0, m.start())
        tag = text[start:m.start()].split()[0].lower() if start >= 0 else ""
        if tag == "<a" and m.group(1):
            continue            # a hyperlink fetches nothing until clicked
        out.append(url)
    return out
