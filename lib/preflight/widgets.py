"""Sliders over the formulas, for JupyterLab.

Each explorer is a few sliders, a readout of the numbers the library computes for the current
position, and a chart, redrawn on every change. The chart is an SVG string (vl-convert) inside an
``HTML`` widget: no CDN, no ``Output`` widget (large outputs inside ``Output`` can hang nbclient),
and a redraw costs tens of milliseconds on a CPU.

The readout marks each number with ``data-key`` so a browser test can read it back.
"""
from __future__ import annotations

import html
from typing import Callable

import ipywidgets as W

from preflight import charts
from preflight.models import scaling


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


def amdahl_explorer(ts: float, tc: float, n: int, n_max: int = 16384) -> W.VBox:
    """Sliders: serial time Ts, parallel time Tc (s), workers N (powers of two)."""
    style = {"description_width": "170px"}
    layout = W.Layout(width="520px")
    hi = max(ts, tc) * 4 or 1.0

    def seconds(value: float, label: str, low: float) -> W.FloatSlider:
        # the step divides the start value exactly, so the browser starts where Python does
        step = value / 100 if value > 0 else hi / 1000
        return W.FloatSlider(value=value, min=low * step, max=step * round(hi / step), step=step,
                             description=label, readout_format=".4g", style=style, layout=layout)

    controls = {
        "ts": seconds(ts, "serial Ts (s)", 0),
        "tc": seconds(tc, "parallel Tc (s)", 1),
        "n": W.IntSlider(value=max(0, int(n).bit_length() - 1), min=0, max=n_max.bit_length() - 1,
                         description="log2 N (workers)", style=style, layout=layout),
    }

    def compute(ts, tc, n):
        n_workers = 2 ** n
        s = scaling.amdahl_speedup(ts, tc, n_workers)
        ceil = scaling.amdahl_ceiling(ts, tc)
        text = readout({
            "n": ("N workers", f"{n_workers}"),
            "speedup": ("Amdahl speedup S(N)", f"{s:.2f}x"),
            "efficiency": ("efficiency S(N)/N", f"{s / n_workers:.1%}"),
            "ceiling": ("ceiling 1 + Tc/Ts", "unbounded" if ceil == float("inf") else f"{ceil:.2f}x"),
            "gustafson": ("Gustafson scaled speedup", f"{scaling.gustafson_speedup(scaling.serial_fraction(ts, tc), n_workers):.1f}x"),
        })
        return text, charts.amdahl_chart(ts, tc, n_max=max(n_workers, 1024), n_mark=n_workers)

    return explorer(controls, compute, "Amdahl / Gustafson explorer")
