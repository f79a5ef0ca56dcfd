"""Measure-mode chapters in a kernel each: papermill executes the notebook in a fresh ``preflight``
kernel (the project's venv), over Unix sockets, with a per-cell timeout; Ctrl-C kills the running kernel
at once. (Plan-only chapters run in the audit's own process instead: ``preflight.runner.inprocess``.)
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

KERNEL = "preflight"          # registered by `make setup` into the project's venv; python3 otherwise


def execute_notebook(src: Path, dst: Path, parameters: dict, cwd: Path, timeout_s: int, km_class) -> None:
    """Run ``src`` with papermill in a kernel of ``km_class`` (:func:`manager_class`), ``parameters``
    injected, and write the executed notebook to ``dst`` (papermill raises when a cell fails)."""
    import papermill as pm

    pm.execute_notebook(str(src), str(dst), kernel_name=kernel_name(), language="python", parameters=parameters,
                        execution_timeout=timeout_s, progress_bar=False, cwd=str(cwd), log_output=False,
                        request_save_on_cell_execute=False, kernel_manager_class=km_class)


def manager_class(socket_dir: str, started: list):
    """Kernels talk to the audit over Unix sockets in ``socket_dir`` (ipc), not TCP: nothing
    listens on a port, and ipykernel has nothing to warn about. Each manager is appended to
    ``started`` so that an interrupted audit can stop its kernel (:func:`stop`)."""
    from jupyter_client.manager import AsyncKernelManager  # nbclient needs the async one for timeouts

    class IPCKernelManager(AsyncKernelManager):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.transport = "ipc"
            self.ip = str(Path(socket_dir) / "kernel")
            started.append(self)

    return IPCKernelManager


def stop(managers: list, wait: bool = True) -> None:
    """Kill the kernels still running (and what they started: torchrun, loader workers) of a stopped
    audit. Kernels run in their own session, so Ctrl-C in the terminal never reaches them. Only a
    kernel not yet reaped is signalled: its process group cannot belong to anyone else."""
    for km in managers:
        prov = getattr(km, "provisioner", None)
        proc = getattr(prov, "process", None)
        if proc is None or proc.poll() is not None:
            continue
        try:
            os.killpg(getattr(prov, "pgid", None) or proc.pid, signal.SIGKILL)
            if wait:
                proc.wait(timeout=10)       # reap it: no zombie while the audit winds down
        except (OSError, subprocess.TimeoutExpired):
            pass


def trap_sigint(kernels: list):
    """Ctrl-C: kill the running kernel at once, ignore further Ctrl-C during the cleanup, raise
    KeyboardInterrupt. (Left to itself, nbclient's cleanup would ask the busy kernel to shut down, and
    ipykernel prints a traceback on stderr.) Logging is turned off: nbclient's cleanup runs the event
    loop once more, and its kernel-alive poll, when due then, logs "Kernel died while waiting for
    execute reply." of the kernel killed here; ``audit.run_audit`` turns it back on when it has
    cleaned up. Returns the previous handler, None off the main thread."""
    def on_sigint(signum, frame):
        import logging

        ignore_sigint()
        logging.disable(logging.CRITICAL)
        stop(kernels, wait=False)
        raise KeyboardInterrupt

    try:
        return signal.signal(signal.SIGINT, on_sigint)
    except ValueError:
        return None


def ignore_sigint() -> None:
    """A second Ctrl-C while an interrupted audit cleans up would print a traceback: ignore it."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:                      # not the main thread
        pass


def settle_event_loop(timeout_s: float = 15) -> None:
    """Ctrl-C inside papermill leaves nbclient's tasks pending on this thread's event loop; at exit they
    would run and print tracebacks ("Task exception was never retrieved"). Cancel them now, quietly."""
    import asyncio
    import logging
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            loop = asyncio.get_event_loop_policy().get_event_loop()     # the one jupyter_core's run_sync set
        except RuntimeError:
            return
    if loop.is_closed() or loop.is_running():
        return
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in pending:
        t.cancel()
    logging.disable(logging.CRITICAL)
    try:
        if pending:
            loop.run_until_complete(asyncio.wait(pending, timeout=timeout_s))
        for t in pending:
            if t.done() and not t.cancelled():
                t.exception()               # retrieved: nothing is logged when it is collected
    except BaseException:  # noqa: BLE001 - best effort on the way out
        pass
    finally:
        logging.disable(logging.NOTSET)


def kernel_name() -> str:
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        spec = KernelSpecManager().get_kernel_spec(KERNEL)
        if Path(spec.argv[0]).resolve() == Path(sys.executable).resolve():
            return KERNEL
    except (NoSuchKernel, OSError, IndexError):
        pass
    return "python3"    # the native kernel of the running interpreter
