"""Chart text that fits: every chart ``preflight.reporting.charts.to_svg`` renders goes through :func:`fit_spec`
first, so that no title, label or legend entry runs off the chart or is cut short with "…".

Vega lays a chart out with the widths it measures for its texts, then the browser draws them in the
font it picks for "sans-serif". When the two fonts differ (vl-convert measured Liberation Sans, Chromium
drew the wider DejaVu Sans), legends and axis labels ran past the chart's edge: 28 texts in the 22 charts
of the example's report, 92 in the sliders' charts at their ends (tests/test_chart_fit.py measures it in
Chromium). So the font is named: Verdana where it exists (macOS, Windows), else DejaVu Sans (Linux),
which have nearly the same widths, and vl-convert measures with the font the browser on the same machine
draws. A report made where neither font exists and read where one does can still be a few pixels off.
"""
from __future__ import annotations

import re

FONT = "Verdana, DejaVu Sans, sans-serif"
CHAR_PX = 0.62           # average advance of a character of these fonts, in em (DejaVu Sans: 0.55-0.65)
TITLE_PX = 13            # Vega's title font size (bold, about 8.5 px per character)
PADDING = 8              # px around every chart (Vega's default: 5)


def text_px(text: str, size: float = 11, bold: bool = False) -> float:
    """Estimated width of ``text`` in px at ``size`` (an upper bound for the fonts of :data:`FONT`)."""
    return len(text) * size * CHAR_PX * (1.1 if bold else 1.0)


def wrap_title(text: str, width: float, size: float = TITLE_PX) -> str | list[str]:
    """``text`` as it fits ``width`` px: unchanged when it does, else a list of lines of about equal
    length (Vega draws a list as a multi-line title), broken at spaces: no last line of one word."""
    import math
    import textwrap

    per_line = max(12, int(width / (size * CHAR_PX * 1.1)))
    if len(text) <= per_line:
        return text
    glued = _UNIT_GAP.sub("\x00", text)                       # "9.89 x", "28 GB": never split at the gap
    lines = textwrap.wrap(glued, per_line, break_long_words=False, break_on_hyphens=False)
    even = textwrap.wrap(glued, math.ceil(len(text) / len(lines)) + 4, break_long_words=False, break_on_hyphens=False)
    return [line.replace("\x00", " ") for line in
            (even if len(even) == len(lines) and max(map(len, even)) <= per_line else lines)]


# The space between a number and its unit (a title line never ends in a bare number).
_UNIT_GAP = re.compile(r"(?<=\d) (?=(?:%|x|s|ms|us|min|h|d|years?|B|kB|MB|GB|GiB|TB|MiB|Gb/s|GB/s|MB/s|TFLOP/s|"
                       r"samples/s|tokens/s|GPUs?|nodes?|ranks?|layers?|stages?|micro-batch(?:es)?)\b)")


def _longest_label(spec: dict) -> str:
    """The longest string value in the chart's inline data (any field may become a label)."""
    longest = ""
    tables = list(spec.get("datasets", {}).values())
    if isinstance(spec.get("data"), dict) and isinstance(spec["data"].get("values"), list):
        tables.append(spec["data"]["values"])
    for rows in tables:
        for row in rows:
            for v in (row.values() if isinstance(row, dict) else ()):
                if isinstance(v, str) and len(v) > len(longest):
                    longest = v
    return longest


def _wrap_titles(node, width=None) -> None:
    """Wrap every chart title (a string, or a title object's ``text``) to the width of its chart."""
    if isinstance(node, list):
        for n in node:
            _wrap_titles(n, width)
        return
    if not isinstance(node, dict):
        return
    width = node["width"] if isinstance(node.get("width"), (int, float)) else width
    t = node.get("title")
    if width and ("mark" in node or "layer" in node or "vconcat" in node or "hconcat" in node):
        if isinstance(t, str):
            node["title"] = wrap_title(t, width)
        elif isinstance(t, dict) and isinstance(t.get("text"), str):
            t["text"] = wrap_title(t["text"], width, t.get("fontSize", TITLE_PX))
    for k in ("layer", "vconcat", "hconcat", "concat", "spec"):
        if k in node:
            _wrap_titles(node[k], width)


def fit_spec(spec: dict) -> dict:
    """A Vega-Lite spec whose texts stay inside the chart (``spec`` is changed and returned):

    - the font named (:data:`FONT`), so the widths Vega lays out with are the widths drawn;
    - label limits from the data: axis and legend labels may be as wide as the longest string in the
      chart's data (never cut to "…" before that);
    - axis labels at least 3 px apart (Vega hides every other one rather than let them touch);
    - titles wrapped to their chart's width, in lines (a long title otherwise runs off both sides);
    - :data:`PADDING` px around the whole chart.
    Settings a chart makes itself (an axis's own ``labelLimit``) win over these defaults."""
    limit = max(180, int(text_px(_longest_label(spec))) + 10)
    config = spec.setdefault("config", {})
    config.setdefault("font", FONT)
    config.setdefault("padding", PADDING)
    for part in ("axis", "legend"):
        config.setdefault(part, {}).setdefault("labelLimit", limit)
    config["axis"].setdefault("labelSeparation", 3)          # axis labels that would touch: every other one
    config.setdefault("title", {}).setdefault("limit", 0)        # titles are wrapped, never cut
    _wrap_titles(spec)
    return spec
