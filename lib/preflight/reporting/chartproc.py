"""Charts rendered in a child process, so that the plan-only audit's cells run meanwhile.

vl-convert holds the GIL for the whole of a render (measured 2026-12-05, vl-convert-python 1.9.0:
while a thread rendered a 200-point line chart twenty times, a busy loop in the main thread stood
still for 15-30 ms at a time, once per render, 0.29 s in all over 0.43 s). A rendering *thread*
therefore runs beside the chapters only in turns; a child process, with its own interpreter, renders
on the other core while they run.

``ChartProcess`` starts ``python -m preflight.reporting.chartproc``, which starts vl-convert's engine at once
(its first render costs ~0.7 s) and then answers one request a line on stdin, ``{"id", "spec"}``
(a Vega-Lite spec, fitted by ``preflight.reporting.chartfit.fit_spec`` there), with one line on stdout,
``{"id", "svg"}`` or ``{"id", "error"}``. ``submit`` gives a ``Future`` of the SVG, written to a
path first when given. A spec that vl-convert rejects fails its own Future with vl-convert's
message; a child that cannot start or dies says so in one line on stderr, and every chart it had
not answered, and every later one, is rendered in the caller's process instead: the SVG is the
same, only the audit is slower. ``close`` ends the child. A chart the audit stopped waiting for
(Ctrl-C cancels its Future) is dropped when its answer comes.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from concurrent.futures import Future
from pathlib import Path

# A one-point chart: what the child renders first, to start the engine (nothing shows it).
WARM_UP_SPEC = {"data": {"values": [{"x": 1}]}, "mark": "point",
                "encoding": {"x": {"field": "x", "type": "quantitative"}}}


def render_here(spec: dict) -> str:
    """The SVG of a Vega-Lite ``spec``, fitted (``chartfit.fit_spec``), rendered in this process."""
    import vl_convert as vlc

    from preflight.reporting.chartfit import fit_spec

    return vlc.vegalite_to_svg(fit_spec(spec))


class ChartProcess:
    """One rendering child and the thread here that reads its answers."""

    def __init__(self):
        import tempfile

        self._lock = threading.Lock()           # guards _pending, _next_id and _failed
        self._write_lock = threading.Lock()     # one request at a time on the pipe; not _lock, which the
        self._pending: dict[int, tuple[Future, dict, Path | None]] = {}    # reader needs while a write waits
        self._next_id = 0
        self._failed: str | None = None
        self._stderr = tempfile.TemporaryFile()     # not a pipe: a child that prints much never blocks on it
        self._reader = None
        try:    # -P: the user's folder first on the path would shadow modules; a session of its own: Ctrl-C
            self._child = subprocess.Popen(        # is the audit's to handle (it stops the child, close)
                [sys.executable, "-P", "-m", "preflight.reporting.chartproc"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=self._stderr, start_new_session=True)
        except OSError as err:
            self._child = None
            self._fail(f"it could not start: {err}")
            return
        self._reader = threading.Thread(target=self._read, name="preflight-chartproc", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int | None:
        return self._child.pid if self._child else None

    def submit(self, spec: dict, path: Path | None = None) -> Future:
        """A Future of ``spec``'s SVG (written to ``path`` before the Future completes, when given)."""
        future: Future = Future()
        try:
            body = json.dumps(spec)
        except (TypeError, ValueError):         # not plain JSON: tried here, where vl-convert says why
            body = None
        with self._lock:
            here = body is None or self._failed is not None
            if not here:
                self._next_id += 1
                request_id = self._next_id
                self._pending[request_id] = (future, spec, path)
        if here:
            _finish_here(future, spec, path)
            return future
        try:
            with self._write_lock:
                self._child.stdin.write(f'{{"id": {request_id}, "spec": {body}}}\n'.encode())
                self._child.stdin.flush()
        except (OSError, ValueError):           # the child is gone: this chart and the unanswered ones render here
            self._fail("it stopped reading its requests")
        return future

    def _read(self) -> None:
        try:
            for raw in self._child.stdout:
                got = json.loads(raw)
                with self._lock:
                    future, _spec, path = self._pending.pop(got["id"])
                _settle(future, lambda got=got, path=path: _reply(got, path))
            code = self._child.wait()
            self._stderr.seek(0)
            last = self._stderr.read().decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
            why = f"it exited with code {code}: {last[0][:200]}"
        except (ValueError, KeyError, TypeError) as bad:        # not the protocol (or closed): stop it
            why = f"its reply was not a chart ({type(bad).__name__})"
            self._child.kill()
            self._child.wait()
        self._fail(why)

    def _fail(self, why: str) -> None:
        """From now on every chart renders here; the ones the child had not answered too."""
        with self._lock:
            if self._failed is not None:
                return
            self._failed = why
            left, self._pending = list(self._pending.values()), {}
        print(f"preflight: the chart process ended ({why}); rendering charts in this process instead",
              file=sys.stderr)
        for future, spec, path in left:
            _finish_here(future, spec, path)

    def close(self) -> None:
        """End the child and release its pipes. The audit waits for its charts first: any still
        unanswered (Ctrl-C) are cancelled."""
        with self._lock:
            self._failed = self._failed or "it was stopped"
            left, self._pending = list(self._pending.values()), {}
        for future, _spec, _path in left:
            future.cancel()
        if self._child is not None:
            if self._child.poll() is None:
                self._child.kill()
            self._child.wait()
            if self._reader is not None:
                self._reader.join(timeout=10)       # it ends at the pipe's end
            for pipe in (self._child.stdin, self._child.stdout):
                try:
                    pipe.close()
                except OSError:                     # a broken pipe's last flush
                    pass
        self._stderr.close()


def _reply(got: dict, path: Path | None) -> str:
    """The SVG of the child's answer ``got`` (written to ``path`` first), or its error raised."""
    if "svg" not in got:
        raise ValueError(got["error"])
    if path is not None:
        path.write_text(got["svg"])
    return got["svg"]


def _finish_here(future: Future, spec: dict, path: Path | None) -> None:
    def svg() -> str:
        out = render_here(spec)
        if path is not None:
            path.write_text(out)
        return out

    _settle(future, svg)


def _settle(future: Future, make) -> None:
    """``future``'s result from ``make()``, or what it raised; nothing for a cancelled Future (the
    audit stopped waiting for it: Ctrl-C)."""
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(make())
    except Exception as err:  # noqa: BLE001 - the Future carries it to whoever waits for the chart
        future.set_exception(err)


def _serve() -> None:
    """The child: start the engine, then one answer a request until stdin closes (the audit ended,
    or was killed)."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)                       # anything else printed to stdout goes to stderr, not into the protocol
    render_here(WARM_UP_SPEC)
    for raw in sys.stdin.buffer:
        req = json.loads(raw)
        try:
            reply = {"id": req["id"], "svg": render_here(req["spec"])}
        except Exception as err:  # noqa: BLE001 - e.g. vl-convert rejects the spec: that chart's own error
            reply = {"id": req["id"], "error": f"{type(err).__name__}: {err}"}
        out.write(json.dumps(reply).encode() + b"\n")
        out.flush()


if __name__ == "__main__":
    _serve()
