"""A chapter's scratch folder for one run, and the sweep that removes the ones nobody owns any more.

Chapter 5 writes checkpoints, logs and an elastic job's files while it measures. Two audits at once
must never share (or clear) each other's, so each run gets its own folder,
``.cache/<chapter>/run-<host>-<pid>-<random>``, which names the process that owns it.

The chapter removes its folder in its last cell, and the process removes it when it exits (``atexit``:
a chapter that failed half-way, whose kernel papermill then shuts down). A process killed outright
(SIGKILL, a node that died) runs no Python at all, so each new run first sweeps the chapter's folder:

- a run folder of *this* host whose process is gone is removed (another host's, on a shared file
  system, is left alone: its process cannot be checked from here);
- a folder that names no owner (``run-<random>`` or the fixed ``resume``, ``stall``, ... of earlier
  versions) is removed once it is a day old.
"""
from __future__ import annotations

import atexit
import os
import re
import shutil
import socket
import tempfile
import time
from pathlib import Path

from preflight import REPO
from preflight.core.fsutil import pid_alive

__all__ = ["STALE_AFTER_S", "owner", "run_folder", "sweep"]

STALE_AFTER_S = 24 * 3600       # a folder that names no owner is left this long (an older version's run)
_OWNED = re.compile(r"run-(?P<host>.+)-(?P<pid>\d+)-[a-z0-9_]+")     # tempfile's names hold no "-"


def owner(folder: Path) -> tuple[str, int] | None:
    """``(host, pid)`` named by a run folder, or None for one that names no owner."""
    m = _OWNED.fullmatch(folder.name)
    return (m["host"], int(m["pid"])) if m else None


def sweep(base: Path, now: float | None = None) -> list[Path]:
    """Remove the folders in ``base`` that nobody owns any more (see the module's docstring);
    returns the ones removed."""
    now = time.time() if now is None else now
    host, removed = socket.gethostname(), []
    for folder in sorted(p for p in Path(base).iterdir() if p.is_dir()):
        who = owner(folder)
        if who is None:
            stale = now - folder.stat().st_mtime > STALE_AFTER_S
        else:
            stale = who[0] == host and who[1] != os.getpid() and not pid_alive(who[1])
        if stale:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def run_folder(chapter: str, root: str | os.PathLike | None = None) -> Path:
    """A new folder for this run of ``chapter`` under ``root`` (default: the checkout's ``.cache/``),
    after sweeping the stale ones; removed when this process exits, if the chapter has not already."""
    base = Path(root) if root else REPO / ".cache"
    base = base / chapter
    base.mkdir(parents=True, exist_ok=True)
    sweep(base)
    work = Path(tempfile.mkdtemp(prefix=f"run-{socket.gethostname()}-{os.getpid()}-", dir=base))
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    return work
