"""Sliders over the formulas, for JupyterLab.

Each explorer is a few sliders, a readout of the numbers the library computes for the current
position, and a chart, redrawn on every change. The chart is an SVG string (vl-convert) inside an
``HTML`` widget: no CDN, no ``Output`` widget (large outputs inside ``Output`` can hang nbclient),
and a redraw costs tens of milliseconds on a CPU.

The readout marks each number with ``data-key`` so a browser test can read it back.

One module per chapter (``baseline``, ``data``, ``comm``, ``balance``, ``resilience``) over the shared
pattern in ``core``; everything is importable from ``preflight.widgets``.
"""
from preflight.widgets.balance import bubble_explorer  # noqa: F401
from preflight.widgets.baseline import amdahl_explorer, memory_explorer  # noqa: F401
from preflight.widgets.comm import allreduce_explorer  # noqa: F401
from preflight.widgets.core import _log_slider, explorer, readout  # noqa: F401
from preflight.widgets.data import listing_explorer, supply_explorer  # noqa: F401
from preflight.widgets.resilience import failure_explorer, interval_explorer  # noqa: F401
