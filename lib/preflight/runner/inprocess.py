"""Plan-only chapters in this process: the notebooks' code cells run in one IPython shell, their outputs
captured into the executed notebook, as papermill would have written it.

Why: a plan-only audit computes formulas. Through papermill, each chapter starts its own kernel and
imports torch, pandas and altair again: five kernels, about 25 s on a 2-core machine, most of it
start-up. Here the libraries load once and each chapter runs in a fresh namespace of the same shell.
The notebooks stay the chapters' source of truth: the same cells run, with the same parameters
injected after the ``parameters`` cell, and the report's pages are rendered from the notebook written
here. The measure-mode audit keeps a kernel per chapter (``preflight.runner.audit``): live measurements start
processes, take minutes, and need the per-cell timeout and Ctrl-C handling a kernel gives.

What a cell shows is kept in order, as a kernel would send it: ``print`` (stream), ``display`` (display
data; a ``display_id`` handle updates its output in place), the value of a last expression (execute
result) and an exception (error output; the chapter then stops, as papermill stops it). A chart
(``Chapter.show``) renders in the chart process (``preflight.reporting.chartproc``) while the next cells run;
its output is filled in when the notebook is written, and a chart that failed to render fails its
chapter. A cell longer
than ``timeout_s`` is stopped by SIGALRM (main thread only). Ctrl-C reaches the audit as
KeyboardInterrupt, not as a chapter error.
"""
from __future__ import annotations

import contextlib
import functools
import io
import os
import signal
import sys
from concurrent.futures import Future
from pathlib import Path

import nbformat


class CellError(Exception):
    """A chapter's cell raised: ``ename`` and ``evalue`` as papermill's error carries them."""

    def __init__(self, ename: str, evalue: str):
        super().__init__(f"{ename}: {evalue}")
        self.ename, self.evalue = ename, evalue


class _Outputs:
    """The outputs of the running cell, in the order they happened. A display whose data is still
    being computed (a ``Future``: a chart ``Chapter.show`` renders in the chart process) gets an empty
    value and goes to ``pending`` (output, mimetype, future), filled in by ``_wait_for_pending``."""

    def __init__(self, pending: list):
        self.items: list = []
        self.by_id: dict[str, dict] = {}
        self.pending = pending

    def stream(self, name: str, text: str) -> None:
        if self.items and self.items[-1].get("output_type") == "stream" and self.items[-1]["name"] == name:
            self.items[-1]["text"] += text
        else:
            self.items.append(nbformat.v4.new_output("stream", name=name, text=text))

    def display(self, data: dict, metadata: dict | None, display_id: str | None, update: bool) -> None:
        if update and display_id in self.by_id:
            self.by_id[display_id].update(data=data, metadata=metadata or {})
            return
        later = {mime: value for mime, value in data.items() if isinstance(value, Future)}
        out = nbformat.v4.new_output("display_data", data={mime: "" if mime in later else value
                                                           for mime, value in data.items()}, metadata=metadata or {})
        self.pending += [(out, mime, future) for mime, future in later.items()]
        self.items.append(out)
        if display_id:
            self.by_id[display_id] = out


class _Stream(io.TextIOBase):
    def __init__(self, outputs: _Outputs, name: str):
        self.outputs, self.name = outputs, name

    def write(self, text: str) -> int:
        if text:
            self.outputs.stream(self.name, text)
        return len(text)

    def writable(self) -> bool:
        return True


@functools.cache
def _shell():
    """The process's one IPython shell with displays, results and tracebacks routed to ``_Outputs``:
    configured once, at the first chapter (each chapter then resets its namespace)."""
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.interactiveshell import InteractiveShell

    class Publisher(DisplayPublisher):
        def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kw):
            self.shell.pf_outputs.display(data, metadata, (transient or {}).get("display_id"), update)

        def clear_output(self, wait=False):
            self.shell.pf_outputs.items.clear()

    class Hook(DisplayHook):
        def start_displayhook(self):
            pass

        def write_output_prompt(self):
            pass

        def write_format_data(self, format_dict, md_dict=None):
            self.shell.pf_outputs.items.append(nbformat.v4.new_output(
                "execute_result", data=format_dict, metadata=md_dict or {},
                execution_count=self.shell.execution_count))

        def finish_displayhook(self):
            pass

    from traitlets.config import Config

    config = Config()
    config.HistoryManager.enabled = False   # the audit's cells stay out of the user's IPython history
    shell = InteractiveShell.instance(config=config, colors="nocolor", autocall=0, automagic=False)
    shell.display_pub = Publisher(shell=shell, parent=shell)
    shell.displayhook = Hook(shell=shell, cache_size=0, parent=shell)
    shell.display_trap.hook = shell.displayhook

    def showtraceback(etype, evalue, stb):
        shell.pf_outputs.items.append(nbformat.v4.new_output(
            "error", ename=etype.__name__, evalue=str(evalue), traceback=list(stb)))
    shell._showtraceback = showtraceback
    return shell


def running() -> bool:
    """Whether a chapter runs in this process's shell now: its displays may then hold a ``Future``
    (``Chapter.show``), which a kernel could not send."""
    return _running


_running = False


def _wait_for_pending(pending: list, timeout_s: float) -> CellError | None:
    """Put each pending display's value in its output, as soon as it is ready (in display order, each
    within ``timeout_s``, the cell limit); the first that failed becomes the chapter's error, its output
    a line that says so. Ctrl-C cancels the charts not yet answered (the chart process drops them)."""
    failed = None
    for out, mime, future in pending:
        try:
            out["data"][mime] = future.result(timeout=timeout_s)
        except KeyboardInterrupt:
            for *_, queued in pending:
                queued.cancel()
            raise
        except Exception as err:  # noqa: BLE001 - a chart that did not render fails its chapter, not the audit
            out["data"] = {"text/plain": f"chart not rendered: {type(err).__name__}: {err}"}
            failed = failed or CellError(type(err).__name__, f"chart not rendered: {err}")
    return failed


def available() -> bool:
    """Whether this process can run chapters itself: not inside an IPython session already (a notebook
    calling ``run_audit`` keeps its own shell; the audit then starts kernels)."""
    from IPython.core.interactiveshell import InteractiveShell

    return not InteractiveShell.initialized() or getattr(InteractiveShell.instance(), "pf_outputs", None) is not None


def parameters_cell(params: dict):
    """The cell papermill injects after the ``parameters`` cell: one assignment per parameter."""
    src = "# Parameters\n" + "".join(f"{k} = {v!r}\n" for k, v in params.items())
    return nbformat.v4.new_code_cell(src, metadata={"tags": ["injected-parameters"]})


def execute_notebook(src: Path, dst: Path, parameters: dict, cwd: Path, timeout_s: int) -> None:
    """Run ``src``'s code cells with ``parameters`` injected, in ``cwd``, and write the executed
    notebook to ``dst`` (also when a cell raised: :class:`CellError` then, after writing)."""
    nb = nbformat.read(src, as_version=4)
    at = next((i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])), -1)
    nb.cells.insert(at + 1, parameters_cell(parameters))
    global _running
    host_main = sys.modules.get("__main__")    # IPython puts its user module there: the cells' while they run,
    shell = _shell()                            # the host's again after (multiprocessing's spawn reads it)
    shell.reset(new_session=False)              # a fresh namespace per chapter, modules kept loaded
    failed = None
    pending: list = []                          # charts still rendering (Chapter.show)
    old_cwd = os.getcwd()
    os.chdir(cwd)
    _running = True
    sys.modules["__main__"] = shell.user_module
    try:
        for count, cell in enumerate((c for c in nb.cells if c.cell_type == "code"), 1):
            shell.pf_outputs = _Outputs(pending)
            shell.execution_count = count
            result = _run_cell(shell, cell.source, timeout_s)
            cell.outputs, cell.execution_count = shell.pf_outputs.items, count
            if isinstance(result.error_in_exec, KeyboardInterrupt):
                raise KeyboardInterrupt
            err = result.error_before_exec or result.error_in_exec
            if err is not None:
                failed = CellError(type(err).__name__, str(err))
                break
    finally:
        _running = False
        sys.modules["__main__"] = host_main
        os.chdir(old_cwd)
        chart_failed = _wait_for_pending(pending, timeout_s)     # every chart in place, also after a failed cell
        failed = failed or chart_failed
        nbformat.write(nb, dst)
    if failed:
        raise failed


def _run_cell(shell, source: str, timeout_s: int):
    def on_alarm(signum, frame):
        raise TimeoutError(f"cell timed out after {timeout_s} s")

    try:
        previous = signal.signal(signal.SIGALRM, on_alarm)
    except ValueError:                          # not the main thread: no timeout
        previous = None
    else:
        signal.alarm(timeout_s)
    try:
        with contextlib.redirect_stdout(_Stream(shell.pf_outputs, "stdout")), \
                contextlib.redirect_stderr(_Stream(shell.pf_outputs, "stderr")):
            return shell.run_cell(source, store_history=False, silent=False)
    finally:
        if previous is not None:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
