"""The audit report: static HTML that opens from disk with no network, and prints.

Everything here reads findings.json through :func:`load_findings`, which checks it against the
published JSON Schema (``preflight/schema/findings.schema.json``, draft 2020-12) before a single
field is used: a report never shows a file that breaks the contract, it names the broken field.

``index.html`` reads like an audit (built in :mod:`preflight.reporting.index`): project, machine, date
and versions; the overall verdict and the three fixes that buy the most (:mod:`preflight.reporting.guidance`
says how they are ranked); a verdict table with one row per chapter (one pitfall each): its worst
verdict, the deciding number, the threshold that number was judged against and the fix; then one
section per chapter with the findings that decide it first, the rest folded, and the chapter's key
charts under real titles, each section linked to its full chapter page (the executed notebook
converted to HTML, :func:`chapter_html`). No script, no external URL: charts are inline SVG, styles
inline, and every string that came from the user (project, notes, paths) goes through :func:`esc`.
Numbers are written by :mod:`preflight.core.numfmt`, one formatter for every page.
"""
from __future__ import annotations

import base64
import functools
import json
import math
import re
from pathlib import Path

from preflight.core.findings import SCHEMA_PATH
from preflight.core.fsutil import atomic_write_text
from preflight.core.numfmt import fmt_finding, fmt_value  # noqa: F401 - one formatter for every page
from preflight.reporting.guidance import deciding  # noqa: F401 - the report's rule, used by tests and callers
from preflight.reporting.html import chapter_page, esc, page, scoped_svg

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


# Printed by a notebook only where it cannot show widgets (the audit runs headless): on a report page
# it reads as an instruction that cannot be followed there.
NOTEBOOK_ONLY = ("Sliders: open this chapter in JupyterLab",)
_ANCHOR = re.compile(r'<a class="anchor-link" href="[^"]*">[^<]*</a>')
# The chapters' closing links, written for JupyterLab (playbook/): on a report page the next chapter is
# its page, the playbook's index is the audit summary, and the glossary (not in the report) is plain text.
_PLAYBOOK_LINKS = ((re.compile(r'href="(\d\d_\w+)\.ipynb"'), r'href="\1.html"'),
                   (re.compile(r'<a href="README\.md">[^<]*</a>'), '<a href="index.html">the audit summary</a>'),
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
    from preflight.reporting.index import scaled_svg

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
    from preflight.reporting.index import index_html

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
