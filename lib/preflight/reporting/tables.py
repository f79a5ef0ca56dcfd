"""Tables for people: a DataFrame as a plain HTML table (no script, no styling library) whose every
cell went through :mod:`preflight.core.numfmt`, for the chapters' notebooks and so for the report's chapter
pages.

What changes on the way from the frame to the page:

- **column names** read as words: ``supply_samples_per_s`` becomes ``supply samples per s``;
- **numbers** by :func:`preflight.core.numfmt.num` (three significant digits, thousands separators, no
  ``3.087e+05``, also where a notebook already printed a number that way); whole numbers with separators;
- **True/False** become yes/no; missing values an empty cell;
- **paths** shrink to their file name (the whole path stays in the cell's tooltip): a temporary folder
  says nothing and runs off the cell;
- a **findings** frame (columns ``value`` and ``unit``) shows each value in its unit
  (:func:`preflight.core.numfmt.fmt_finding`: 68.4%, 5,000 s (83.3 min), 223.1 GiB) and drops ``unit``;
  a ``verdict`` column, or any cell that is exactly a verdict word (pass, warn, fail, info, error),
  becomes a coloured badge (:func:`badge`).
"""
from __future__ import annotations

import html
import math
import re
from numbers import Integral, Real

from preflight.core.numfmt import fmt_finding, num

VERDICT_COLOURS = {"pass": "#2e7d32", "warn": "#ef6c00", "fail": "#c62828", "info": "#546e7a", "error": "#6a1b9a"}
_PATH = re.compile(r"(?<![\w.:/])(?:/[\w.+-]+){2,}")      # /tmp/abc/x.json: two or more components
_SCI = re.compile(r"^\s*[-+]?\d+(?:\.\d+)?e[-+]?\d+\s*$", re.IGNORECASE)


def prose(text) -> str:
    """A finding's message or fix as HTML: escaped, with its `backticked` commands and names as
    ``<code>`` (the texts are written in Markdown's inline style, as the notebooks render them), and
    command-line options (``--results``, ``--plan-only``) kept on one line."""
    out = re.sub(r"`([^`<>]+)`", r"<code>\1</code>", html.escape("" if text is None else str(text)))
    return _OPTION.sub(r'<span style="white-space:nowrap">\1</span>', out)


_OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def badge(verdict: str) -> str:
    """A verdict as a coloured, capitalised badge (inline styles: it reads the same in JupyterLab, in
    the report, and in the report's print CSS, which overrides them through the ``v`` classes)."""
    v = str(verdict)
    colour = VERDICT_COLOURS.get(v, "#546e7a")
    return (f'<span class="v v-{html.escape(v)}" style="background:{colour};color:#fff;font-weight:700;'
            f'font-size:.82em;padding:.1em .45em;border-radius:3px;white-space:nowrap">'
            f"{html.escape(v.upper())}</span>")


def short_paths(text: str) -> str:
    """Every absolute path in ``text`` as its file name: ``recorded (/tmp/x/scaling-n1.json)`` reads
    ``recorded (scaling-n1.json)``."""
    return _PATH.sub(lambda m: m.group().rstrip("/").rsplit("/", 1)[-1], text)


def column_name(name) -> str:
    """``supply_samples_per_s`` -> ``supply samples per s`` (names with spaces stay as they are)."""
    return str(name).replace("_", " ")


def cell(x) -> str:
    """One value as text (not yet HTML-escaped): numbers by ``num``, booleans yes/no, paths shortened."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    if isinstance(x, bool) or type(x).__name__ == "bool_":
        return "yes" if x else "no"
    if isinstance(x, Integral):
        return f"{int(x):,}"
    if isinstance(x, Real):
        return num(float(x))
    if _SCI.match(str(x)):                  # a number already printed as "6.658e+07": printed again
        return num(float(x))
    return short_paths(str(x))


def _td(text: str, raw: str | None = None, numeric: bool = False) -> str:
    """A cell: ``raw`` markup when given, else ``text`` escaped; numbers right-aligned."""
    return f"<td{' class=num' if numeric else ''}>{raw if raw is not None else html.escape(text)}</td>"


def frame_html(df) -> str:
    """``df`` as an HTML ``<table>`` for people (see the module's docstring); the index is left out."""
    findings = {"value", "unit"} <= set(df.columns)
    cols = [c for c in df.columns if not (findings and c == "unit")]
    head = "".join(f"<th>{html.escape(column_name(c))}</th>" for c in cols)
    rows = []
    for rec in df.to_dict("records"):
        tds = []
        for c in cols:
            x = rec[c]
            if findings and c == "value":
                v = None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)
                tds.append(_td(fmt_finding({"id": str(rec.get("id", "")), "value": v, "unit": rec["unit"],
                                            "threshold": rec.get("threshold")}), numeric=True))
            elif isinstance(x, str) and (c == "verdict" or x in VERDICT_COLOURS):   # a verdict row, too
                tds.append(_td(x, raw=badge(x)))
            elif isinstance(x, str) and short_paths(x) != x:          # the whole path in the tooltip
                tds.append(_td("", raw=f"<span title='{html.escape(x)}'>{html.escape(short_paths(x))}</span>"))
            elif isinstance(x, str):                                   # messages, fixes: as the report writes them
                tds.append(_td(x, raw=prose(x)))
            else:
                tds.append(_td(cell(x), numeric=isinstance(x, Real) and not isinstance(x, bool)))
        rows.append("<tr>" + "".join(tds) + "</tr>")
    return f"<table class='pf-frame'><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
