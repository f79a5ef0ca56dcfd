"""The report's HTML building blocks: one stylesheet, escaping, anchors, badges, pages, tables and the
headings of a chapter, shared by the summary page (``index``), the chapter pages (``report``) and the
comparison (``compare``)."""
from __future__ import annotations

import html
import re
from pathlib import Path

from preflight.chapters.registry import BY_NAME

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#1d2430;line-height:1.45}
h1{margin-bottom:.2em} .meta{color:#555;font-size:.92em} .notes{white-space:pre-wrap}
table{border-collapse:collapse;margin:1em 0;width:100%;font-size:.92em}
th,td{border:1px solid #d5d9e0;padding:.35em .55em;text-align:left;vertical-align:top}
th{background:#f1f3f6} td.num{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
table.facts{width:auto} table.facts th{font-weight:600;white-space:nowrap} table.facts td{overflow-wrap:anywhere}
table.findings td:first-child{width:17%} table.findings td:nth-child(4){width:20%} .src{color:#555;font-size:.88em}
.fid{color:#666;font-size:.82em}
.v{white-space:nowrap;font-weight:700;text-transform:uppercase;font-size:.82em;padding:.1em .45em;border-radius:3px;color:#fff}
.v-pass{background:#2e7d32}.v-warn{background:#ef6c00}.v-fail{background:#c62828}.v-info{background:#546e7a}
.v-error{background:#6a1b9a}.ch-improved{color:#2e7d32;font-weight:700}.ch-worse{color:#c62828;font-weight:700}
.guidance{border-left:4px solid #c62828;background:#fbf3f3;padding:.6em 1em;margin:1.2em 0}
.guidance.ok{border-color:#2e7d32;background:#f2f8f2} .overall{font-size:1.15em;font-weight:700;margin:.2em 0}
ol.fixes{margin:.4em 0 .4em 1.2em;padding:0} ol.fixes li{margin:.35em 0}
details{margin:.2em 0 1em} summary{cursor:pointer;color:#37474f;font-weight:600}
.charts figure{margin:1.4em 0} figcaption{font-weight:700;font-size:1.05em;margin:0 0 .3em}
svg{max-width:100%;height:auto} pre{background:#f6f8fa;padding:.6em;overflow-x:auto;font-size:.85em;
white-space:pre-wrap;overflow-wrap:anywhere}
.jp-InputPrompt,.jp-OutputPrompt{display:none} .jp-RenderedHTMLCommon table{width:auto}
@page{size:A4;margin:16mm 14mm}
@media print{
 body{max-width:none;margin:0;padding:0;font-size:9.5pt;line-height:1.3}
 a{color:inherit;text-decoration:none} a[href]:not([href^='#'])::after{content:" (" attr(href) ")";
  font-size:.85em;color:#555;overflow-wrap:anywhere}
 section.chapter{break-before:page} h1,h2,h3{break-after:avoid} thead{display:table-header-group}
 tr,figure,.charts figure,table.verdicts,table.facts,.guidance{break-inside:avoid} pre{white-space:pre-wrap}
 table{font-size:8.5pt} td,th{padding:.25em .4em}
 details::details-content{content-visibility:visible;display:block} summary{list-style:none}
 .charts figure{margin:0 0 .8em} svg{max-width:100%;width:auto;height:auto;max-height:120mm}
 table.verdicts{table-layout:fixed} table.verdicts td,table.findings td{overflow-wrap:anywhere}
 table.verdicts th:nth-child(1){width:18%} table.verdicts th:nth-child(2){width:8%}
 table.verdicts th:nth-child(3){width:17%} table.verdicts th:nth-child(4){width:9%}
 table.verdicts th:nth-child(5){width:16%} td.num{white-space:normal}
 .guidance{background:none}
 .v{border:1px solid #000;color:#000!important;background:none!important}}
"""


def esc(x) -> str:
    """HTML-escape anything for text or a quoted attribute (None becomes empty)."""
    return html.escape("" if x is None else str(x))


def fid(finding_id: str) -> str:
    """A finding id in ``<code>``, breakable after '/' and '_' so narrow (printed) tables wrap it."""
    return "<code>" + esc(finding_id).replace("/", "/<wbr>").replace("_", "_<wbr>") + "</code>"


def named(finding_id: str) -> str:
    """A finding as a reader names it: its title in words, its id small below (``reporting.titles``)."""
    from preflight.reporting.titles import title

    return f"{esc(title(finding_id))}<br><span class='fid'>{fid(finding_id)}</span>"


def verdict_badge(v: str) -> str:
    """A verdict as a coloured badge, capitalised (FAIL, PASS...); print CSS draws it black on white."""
    return f'<span class="v v-{esc(v)}">{esc(str(v).upper())}</span>'


def page(title: str, body: str) -> str:
    """A complete, self-contained HTML page with the report's styles (screen and print)."""
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body>{body}</body></html>\n")


def table(head: list[str], rows: list, cls: str = "") -> str:
    """``head``: plain header texts; ``rows``: ready ``<td>`` markup (already escaped), or
    ``(anchor, markup)`` pairs: the row gets ``id=anchor`` (a finding id: ``index.html#baseline/mfu``)."""
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    trs = "".join(f"<tr id='{esc(r[0])}'>{r[1]}</tr>" if isinstance(r, tuple) else f"<tr>{r}</tr>" for r in rows)
    return f"<table class='{cls}'><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>"


def scoped_svg(text: str, prefix: str) -> str:
    """Prefix an SVG's element ids (``clip1`` ...) and their ``#`` references: several inline SVGs in
    one page share one id space, and a repeated id would clip a chart with another chart's shape."""
    for i in set(re.findall(r'\bid="([^"]+)"', text)):
        text = re.sub(rf'(\bid="|#){re.escape(i)}(?=["\)])', rf"\g<1>{prefix}-{i}", text)
    return text


def chapter_title(c: dict) -> str:
    return c["title"] if c["title"].lower().startswith("chapter") else f"{c['number']}. {c['title']}"


def chapter_pitfall(c: dict) -> str:
    """The pitfall a chapter is about (``preflight.chapters.registry``); '' for a chapter it does not list."""
    registered = BY_NAME.get(c["name"])
    return registered.pitfall if registered and registered.number == c["number"] else ""


def chapter_page(c: dict) -> str:
    return Path(c["notebook"]).stem + ".html"


def chapter_verdict(c: dict) -> str:
    return c["verdict"] if c["status"] == "ok" else "error"


def machine_text(m: dict) -> str:
    gpu = m["kind"] == "cuda"
    mem = f"{m['memory_GB']:.1f} GB" if m.get("memory_GB") else "? GB"
    return f"{m['label']}: {m['count']} {'devices' if gpu else 'cores'}, {mem} {'each' if gpu else 'host memory'}"


def _when(iso: str) -> str:
    """An ISO timestamp for people, in UTC: ``2026-12-01 15:56 UTC`` (as written when it does not parse)."""
    import datetime as dt

    try:
        return dt.datetime.fromisoformat(str(iso)).astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    except ValueError:
        return str(iso)


def facts_table(s: dict, notes: bool = False) -> str:
    """Who, where, when, with what: the head of an audit (and of each side of a comparison)."""
    vers = ", ".join(f"{k} {v}" for k, v in s["versions"].items() if v)
    facts = [("Project", s["project"])] + ([("Notes", s["notes"])] if notes and s["notes"] else []) + [
             ("Machine", machine_text(s["machine"])), ("Date", _when(s["date"])),
             ("Mode", s["mode"]), ("Duration", f"{s['elapsed_s']:.1f} s"), ("Versions", vers),
             ("Profile", s["profile_path"])] + ([("Recorded results", s["results_dir"])] if s["results_dir"] else [])
    if w := s.get("workload"):          # the team's own model, measured instead of the reference model
        facts.insert(1, ("Workload", f"{w['class']} ({w['params']:,} parameters) from {w['entry']}"))
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in facts)
    return f"<table class='facts'>{rows}</table>"
