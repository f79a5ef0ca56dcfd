"""Progress for the cells that take a while: say what is measured and about how long *before* it starts,
show a bar where the work has steps, and say how long it took.

A cell that shows only ``[*]`` for half a minute reads as a hang. Every live measurement of a chapter
goes through ``Chapter.measurement`` (``preflight.runner.chapter``), which calls :func:`started` before and
:func:`finished` after it, so each long cell starts with one line::

    Measuring the loader tuner: every num_workers x prefetch_factor x pin_memory setting against the
    device's rate (about 15 s on a 2-core CPU) ...

and ends with ``... loader tuner: 14 s``. A sweep inside a measurement wraps its loop in
:func:`steps` for a bar (``<progress>`` HTML, updated in place; plain Python and the command line
get none, and the executed notebook keeps only the final line).

The times in ``TYPICAL_S`` are for the default sizes on a 2-core CPU, apportioned from the chapter
times measured in the audit (README, docs/facilitator.md) and the cell times noted in issue 19; they
are an order of magnitude to wait for, not a measurement. ``finished`` prints the real one. On a GPU
the measurements are sized to take seconds; ``quick`` sizes take a few seconds anywhere.
"""
from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

# method name -> (what it measures, typical seconds on a 2-core CPU at the default sizes; None: unknown)
TYPICAL_S: dict[str, tuple[str, float | None]] = {
    "ceilings": ("the machine's ceilings: matmul rate, memory copy, host-to-device copy", 5),
    "baseline": ("one training step on three layers: NVML, torch.profiler op categories, tokens/s", 10),
    "fusion": ("a Linear-GELU-add-LayerNorm block, eager and torch.compile (compiling takes most of it)", 10),
    "scaling": ("DDP under torchrun on 1 and 2 processes, for the staged scaling curve", 15),
    "traces": ("torch.profiler traces of the reference model's training steps, with shapes", 4),
    "memory": ("the memory planner against a reference GPT's measured model states and activations", 5),
    "datapipe": ("the test set as small files and as shards: listing, cold and warm reads, the break points "
                 "(the first run also writes the 20,000 files: +15 s)", 20),
    "loadtune": ("the loader tuner: every num_workers x prefetch_factor x pin_memory against the device's rate", 15),
    "loadmon_overhead": ("the loader monitor's own cost, with and without it", 5),
    "allreduce": ("an all-reduce sweep from KB to hundreds of MB under torchrun", 8),
    "overlap": ("DDP on 2 ranks: manual all-reduce, bucket sizes, compression hooks, PowerSGD, no_sync", 20),
    "padding": ("three padding strategies as useful tokens/s of a Transformer", 8),
    "pipeline_bubble": ("real torch.distributed.pipelining runs, the bubble per rank (2 and 4 stages)", 30),
    "partition": ("per-layer times, then the by-count and the optimal partitions run for real", 12),
    "resume": ("a training run killed with SIGKILL and resumed, then resumed without each part of the state", 12),
    "ckptstall": ("the training stall of synchronous vs asynchronous checkpoint saves", 8),
    "elastic": ("an elastic restart under torchrun --max-restarts: a worker killed, the job back", 20),
}
WORKLOAD_WHAT = "your model (the profile's workload)"


def describe(method: str, quick: bool = False, gpu: bool = False) -> str:
    """The line printed before a measurement: what it measures and about how long."""
    what, typical = TYPICAL_S.get(method, (None, None))
    if what is None:
        what = (f"{method.removeprefix('workload_')} on {WORKLOAD_WHAT}" if method.startswith("workload_")
                else method)
    if quick:
        how_long = "quick sizes: a few seconds"
    elif typical is None:
        how_long = "its time depends on the model" if method.startswith("workload_") else "time not known yet"
    else:
        how_long = f"about {typical:.0f} s on a 2-core CPU" + ("; sized for seconds on one GPU" if gpu else "")
    return f"Measuring {what} ({how_long}) ..."


def announced(method: str) -> bool:
    """Methods that say what they measure: those of ``TYPICAL_S`` and the workload's. Others (a set of
    records read only from ``--results``, e.g. ``pipeline``) measure nothing here, so stay silent."""
    return method in TYPICAL_S or method.startswith("workload_")


def started(method: str, quick: bool = False, gpu: bool = False) -> float | None:
    """Print what is about to be measured and about how long; returns the start time for ``finished``
    (None for a method that is not announced)."""
    if not announced(method):
        return None
    print(describe(method, quick, gpu), flush=True)
    return time.monotonic()


def finished(method: str, t0: float | None) -> float | None:
    """Print how long the measurement took (seconds, returned); nothing when ``t0`` is None."""
    if t0 is None:
        return None
    took = time.monotonic() - t0
    print(f"... {method}: {took:.0f} s", flush=True)
    return took


def _display_handle(html: str):
    """A display handle to update in place, or None outside IPython (no bar there)."""
    try:
        from IPython import get_ipython
        from IPython.display import HTML, display
    except ImportError:
        return None
    if get_ipython() is None:
        return None
    return display(HTML(html), display_id=True)


def bar_html(done: int, total: int, what: str, extra: str = "") -> str:
    """One line: a ``<progress>`` bar, ``what``, ``done/total`` and ``extra`` (no script, prints)."""
    return (f'<div class="pf-progress"><progress value="{done}" max="{max(total, 1)}" style="width: 240px">'
            f"</progress> {what}: {done}/{total}{(' - ' + extra) if extra else ''}</div>")


def steps(items: Iterable, what: str) -> Iterator:
    """Yield ``items`` with a progress bar in the notebook (``what``: "loader settings"); when the
    loop ends, the bar becomes one line with the count and the time."""
    items = list(items)
    n, t0 = len(items), time.monotonic()
    handle = _display_handle(bar_html(0, n, what))
    for i, item in enumerate(items):
        if handle is not None and i:
            handle.update(_html(bar_html(i, n, what, f"{time.monotonic() - t0:.0f} s")))
        yield item
    if handle is not None:
        handle.update(_html(f"<div>{what}: {n} in {time.monotonic() - t0:.0f} s</div>"))


def _html(text: str):
    from IPython.display import HTML

    return HTML(text)
