"""The audit report: static HTML that opens from disk with no network, and prints.

Everything here reads findings.json through :func:`load_findings`, which checks it against the
published JSON Schema (``preflight/schema/findings.schema.json``, draft 2020-12) before a single
field is used: a report never shows a file that breaks the contract, it names the broken field.

``index.html`` reads like an audit (built in :mod:`preflight.report_index`): project, machine, date
and versions; the overall verdict and the three fixes that buy the most (:mod:`preflight.guidance`
says how they are ranked); a verdict table with one row per chapter (one pitfall each): its worst
verdict, the deciding number, the threshold that number was judged against and the fix; then one
section per chapter with the findings that decide it first, the rest folded, and the chapter's key
charts under real titles, each section linked to its full chapter page (the executed notebook
converted to HTML, :func:`chapter_html`). No script, no external URL: charts are inline SVG, styles
inline, and every string that came from the user (project, notes, paths) goes through :func:`esc`.
Numbers are written by :mod:`preflight.numfmt`, one formatter for every page.
"""
from __future__ import annotations

import base64
import functools
import html
import json
import math
import re
from pathlib import Path

from preflight.chapters.registry import BY_NAME
from preflight.findings import SCHEMA_PATH
from preflight.fsutil import atomic_write_text
from preflight.guidance import deciding  # noqa: F401 - the report's rule, used by tests and callers
from preflight.numfmt import fmt_finding, fmt_value  # noqa: F401 - one formatter for every page

SCHEMA_TAG = "preflight-findings/1"


class FindingsError(ValueError):
    """findings.json is missing, not JSON, or breaks the schema; the message names file, JSON path
    (``$.findings[3].verdict``) and problem."""


@functools.cache
def _validator():
    from jsonschema import Draft202012Validator

    return Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))


def _non_finite(node, where="$"):
    """JSON path of the first NaN/Infinity: Python's json reads them, the JSON standard has none."""
    if isinstance(node, float) and not math.isfinite(node):
        return where
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        hit = _non_finite(v, f"{where}[{k}]" if isinstance(k, int) else f"{where}.{k}")
        if hit:
            return hit
    return None


def validate_findings(data, name: str = "findings.json") -> dict:
    """Check an already-parsed findings.json; return it unchanged or raise :class:`FindingsError`.

    Order matters for a useful message: the format tag first (a file of another version fails on
    everything else too), then NaN, then the schema (the most relevant of its errors, and how many
    more), then what a schema cannot say: ids unique, each finding's chapter among ``chapters``."""
    if not isinstance(data, dict):
        raise FindingsError(f"{name}: $: expected a JSON object, got {type(data).__name__}")
    if data.get("schema") != SCHEMA_TAG:
        raise FindingsError(f"{name}: $.schema: {data.get('schema')!r} is not a format this version "
                            f"reads (expected {SCHEMA_TAG!r})")
    bad = _non_finite(data)
    if bad:
        raise FindingsError(f"{name}: {bad}: NaN/Infinity is not valid JSON (a missing number is null)")
    from jsonschema.exceptions import best_match

    errors = list(_validator().iter_errors(data))
    if errors:
        e = best_match(errors)
        more = f" (and {len(errors) - 1} more problem{'s' * (len(errors) > 2)})" if len(errors) > 1 else ""
        raise FindingsError(f"{name}: {e.json_path}: {e.message}{more}")
    seen, numbers = {}, {c["number"] for c in data["chapters"]}
    for i, f in enumerate(data["findings"]):
        if f["id"] in seen:
            raise FindingsError(f"{name}: $.findings[{i}].id: {f['id']!r} appears twice "
                                f"(also $.findings[{seen[f['id']]}])")
        seen[f["id"]] = i
        if f["chapter"] not in numbers:
            raise FindingsError(f"{name}: $.findings[{i}].chapter: {f['chapter']} is not the number "
                                f"of any chapter in $.chapters")
    return data


def load_findings(path) -> dict:
    """Read and validate an audit's findings.json (``path``: the file, or the audit folder holding
    it). The one way the report and ``preflight compare`` read an audit."""
    p = Path(path) / "findings.json" if Path(path).is_dir() else Path(path)
    if not p.is_file():
        where = p.parent if p.name == "findings.json" else p
        raise FindingsError(f"{where}: {'no findings.json in this folder' if where.is_dir() else 'no such file or folder'}"
                            " (expected an audit folder: python -m preflight audit ... --out DIR)")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise FindingsError(f"{p}: cannot read ({err})") from None
    except json.JSONDecodeError as err:
        raise FindingsError(f"{p}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})") from None
    return validate_findings(data, str(p))


CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#1d2430;line-height:1.45}
h1{margin-bottom:.2em} .meta{color:#555;font-size:.92em} .notes{white-space:pre-wrap}
table{border-collapse:collapse;margin:1em 0;width:100%;font-size:.92em}
th,td{border:1px solid #d5d9e0;padding:.35em .55em;text-align:left;vertical-align:top}
th{background:#f1f3f6} td.num{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
table.facts{width:auto} table.facts th{font-weight:600;white-space:nowrap} table.facts td{overflow-wrap:anywhere}
table.findings td:first-child{width:17%} table.findings td:nth-child(4){width:20%} .src{color:#555;font-size:.88em}
.v{white-space:nowrap;font-weight:700;text-transform:uppercase;font-size:.82em;padding:.1em .45em;border-radius:3px;color:#fff}
.v-pass{background:#2e7d32}.v-warn{background:#ef6c00}.v-fail{background:#c62828}.v-info{background:#546e7a}
.v-error{background:#6a1b9a}.ch-improved{color:#2e7d32;font-weight:700}.ch-worse{color:#c62828;font-weight:700}
.guidance{border-left:4px solid #c62828;background:#fbf3f3;padding:.6em 1em;margin:1.2em 0}
.guidance.ok{border-color:#2e7d32;background:#f2f8f2} .overall{font-size:1.15em;font-weight:700;margin:.2em 0}
ol.fixes{margin:.4em 0 .4em 1.2em;padding:0} ol.fixes li{margin:.35em 0}
details{margin:.2em 0 1em} summary{cursor:pointer;color:#37474f;font-weight:600}
.charts figure{margin:1.4em 0} figcaption{font-weight:700;font-size:1.05em;margin:0 0 .3em}
svg{max-width:100%;height:auto} pre{background:#f6f8fa;padding:.6em;overflow-x:auto;font-size:.85em}
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
 .charts figure{margin:0 0 .8em} svg{width:100%;max-height:120mm}
 .guidance{background:none}
 .v{border:1px solid #000;color:#000!important;background:none!important}}
"""


def esc(x) -> str:
    """HTML-escape anything for text or a quoted attribute (None becomes empty)."""
    return html.escape("" if x is None else str(x))


def fid(finding_id: str) -> str:
    """A finding id in ``<code>``, breakable after '/' and '_' so narrow (printed) tables wrap it."""
    return "<code>" + esc(finding_id).replace("/", "/<wbr>").replace("_", "_<wbr>") + "</code>"


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


# Printed by a notebook only where it cannot show widgets (the audit runs headless): on a report page
# it reads as an instruction that cannot be followed there.
NOTEBOOK_ONLY = ("Sliders: open this chapter in JupyterLab",)
_ANCHOR = re.compile(r'<a class="anchor-link" href="[^"]*">[^<]*</a>')
# The chapters' closing links, written for JupyterLab (playbook/): on a report page the next chapter is
# its page, the playbook's index is the audit summary, and the glossary (not in the report) is plain text.
_PLAYBOOK_LINKS = ((re.compile(r'href="(\d\d_\w+)\.ipynb"'), r'href="\1.html"'),
                   (re.compile(r'href="README\.md"'), 'href="index.html"'),
                   (re.compile(r'<a href="glossary\.md">([^<]*)</a>'), r"\1 (docs/glossary.md)"))


def playbook_links(body: str) -> str:
    """``body`` with the playbook's relative links pointed at the report's pages (:data:`_PLAYBOOK_LINKS`)."""
    for pattern, repl in _PLAYBOOK_LINKS:
        body = pattern.sub(repl, body)
    return body


def drop_notebook_only(nb) -> None:
    """Remove the lines of :data:`NOTEBOOK_ONLY` from the printed output of ``nb`` (in place); an
    output left empty goes too."""
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        kept = []
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                lines = [ln for ln in out["text"].splitlines(keepends=True)
                         if not ln.lstrip().startswith(NOTEBOOK_ONLY)]
                if not lines:
                    continue
                out["text"] = "".join(lines)
            kept.append(out)
        cell["outputs"] = kept


# nbconvert writes an SVG output as an <img> of a base64 data URI, drawn at its own (small) size.
_SVG_IMG = re.compile(r'<img\b[^>]*?\bsrc="data:image/svg\+xml;base64,([A-Za-z0-9+/=\s]+)"[^>]*>')


def _inline_svg(match: re.Match, prefix: str) -> str:
    """An SVG output inlined at the summary's scale, its ids scoped (``prefix``)."""
    from preflight.report_index import scaled_svg

    return scaled_svg(scoped_svg(base64.b64decode(match.group(1)).decode(), prefix))


@functools.cache
def _exporter():
    """One exporter for every page: its templates are compiled once (five exporters compiled them five
    times, ~0.3 s each)."""
    from nbconvert import HTMLExporter

    return HTMLExporter(template_name="basic", exclude_input=True, exclude_input_prompt=True,
                        exclude_output_prompt=True)


def chapter_html(notebook: Path, title: str) -> str:
    """A chapter page from its executed notebook: nbconvert's script-free ``basic`` template,
    inputs hidden (the executed notebook keeps the code), wrapped in the report's own page; without
    the notebook-only lines (:func:`drop_notebook_only`) and the "¶" link nbconvert puts after
    every heading; its charts inlined at the summary's scale (``report_index.scaled_svg``), their
    ids scoped per chart."""
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    drop_notebook_only(nb)
    body, _ = _exporter().from_notebook_node(nb)
    n = iter(range(1, 10 ** 6))
    body = _SVG_IMG.sub(lambda m: _inline_svg(m, f"out{next(n)}"), body)
    nav = "<p class='meta'><a href='index.html'>&larr; audit summary</a></p>"
    return page(title, nav + playbook_links(_ANCHOR.sub("", body)))


def write_report(summary: dict | None, out_dir: Path) -> Path:
    """Write ``index.html`` and one page per executed chapter into the audit folder ``out_dir``.

    The pages are built from ``out_dir/findings.json`` read through :func:`load_findings`, so they
    show exactly what the file holds and a file that breaks the schema raises
    :class:`FindingsError` here. ``summary`` (the audit's in-memory copy) is not read."""
    out_dir = Path(out_dir)
    data = load_findings(out_dir / "findings.json")
    for c in data["chapters"]:
        nb = out_dir / c["notebook"]
        if nb.exists():
            try:
                html = chapter_html(nb, c["title"])
            except Exception as err:  # noqa: BLE001 - e.g. nbconvert's templates missing: keep the audit
                html = page(c["title"], (
                    "<p class='meta'><a href='index.html'>&larr; audit summary</a></p>"
                    f"<p>This page could not be rendered ({esc(type(err).__name__)}: {esc(str(err)[:300])}). "
                    f"The chapter ran: its findings are in the summary, its outputs in the executed notebook "
                    f"<a href='{esc(c['notebook'])}'>{esc(c['notebook'])}</a>.</p>"))
            atomic_write_text(out_dir / chapter_page(c), html, fsync=False)
    from preflight.report_index import index_html

    index = out_dir / "index.html"
    atomic_write_text(index, index_html(data, out_dir), fsync=False)   # last: its presence means the report is complete
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
