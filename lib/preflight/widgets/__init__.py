"""Sliders over the formulas, for JupyterLab.

Each explorer is a few sliders, a readout of the numbers the library computes for the current
position, and a chart, redrawn on every change. The chart is an SVG string (vl-convert) inside an
``HTML`` widget: no CDN, no ``Output`` widget (large outputs inside ``Output`` can hang nbclient),
and a redraw costs tens of milliseconds on a CPU.

The readout marks each number with ``data-key`` so a browser test can read it back.

One module per chapter, named as the chapter (``preflight.chapters.registry``: ``baseline``,
``data_pipeline``, ``communication``, ``load_balance``, ``fault_tolerance``)
over the shared pattern in ``core``; everything is importable from ``preflight.widgets``.
"""
from preflight.widgets.baseline import amdahl_explorer, fp8_explorer, layout_explorer, memory_explorer  # noqa: F401
from preflight.widgets.communication import a2a_explorer, allreduce_explorer  # noqa: F401
from preflight.widgets.core import _log_slider, explorer, readout  # noqa: F401
from preflight.widgets.data_pipeline import listing_explorer, supply_explorer  # noqa: F401
from preflight.widgets.fault_tolerance import failure_explorer, interval_explorer  # noqa: F401
from preflight.widgets.load_balance import bubble_explorer, busiest_explorer, straggler_explorer  # noqa: F401
