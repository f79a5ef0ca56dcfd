"""The explorer pattern every slider panel uses: controls, a readout of the library's numbers
(``data-key`` marked, for browser tests) and an offline SVG chart, redrawn on every change."""
from __future__ import annotations

import html
from collections.abc import Callable

import ipywidgets as W

from preflight.reporting import charts


def readout(values: dict[str, tuple[str, str]]) -> str:
    """HTML table of ``{key: (label, formatted value)}``."""
    rows = "".join(
        f'<tr><td>{html.escape(label)}</td><td><b class="pf-value" data-key="{html.escape(k)}">'
        f"{html.escape(v)}</b></td></tr>" for k, (label, v) in values.items())
    return f'<table class="pf-readout">{rows}</table>'


def explorer(controls: dict[str, W.ValueWidget], compute: Callable[..., tuple[str, object]],
             title: str = "") -> W.VBox:
    """Wire ``controls`` to ``compute(**values) -> (readout_html, altair_chart)``."""
    out_text, out_chart = W.HTML(), W.HTML()

    def redraw(_=None):
        text, chart = compute(**{k: c.value for k, c in controls.items()})
        out_text.value = text
        out_chart.value = charts.to_svg(chart)

    for c in controls.values():
        c.observe(redraw, names="value")
    redraw()
    head = [W.HTML(f"<h4>{html.escape(title)}</h4>")] if title else []
    box = W.VBox(head + [W.VBox(list(controls.values())), out_text, out_chart])
    box.redraw = redraw  # for tests
    return box


def _log_slider(value: float, low: float, high: float, label: str, step: float = 0.01) -> W.FloatLogSlider:
    """A log-scale slider whose grid of exponents passes exactly through ``value`` (so it starts at
    the number the tables show, not at the nearest grid point)."""
    import math

    e = math.log10(value)
    lo = e - step * math.floor((e - math.log10(low)) / step)
    hi = e + step * math.floor((math.log10(high) - e) / step)
    return W.FloatLogSlider(value=value, base=10, min=lo, max=hi, step=step,
                            description=label, readout_format=",.3r", style={"description_width": "170px"},
                            layout=W.Layout(width="520px"))


