"""Writing a file whole or not at all: a temporary file, a rename, and (when it matters) fsync.

A program killed half-way through ``path.write_text(...)`` leaves half a file, and the next reader
(a resumed job, the report, a notebook) takes it for the real thing. The cure is the same everywhere
(records, the report's pages, findings, the shard manifest, a checkpoint's ``latest``):

1. write the new content into a temporary file **in the same folder** (a rename is only atomic
   within one file system);
2. optionally ``fsync`` it: the bytes are on the disk, not only in the page cache;
3. ``os.replace`` it over the target: POSIX guarantees a reader sees the old file or the new one;
4. optionally ``fsync`` the folder: the rename itself survives a power loss (a folder is a file
   holding names; until it is synced the new name may exist only in memory).

Steps 2 and 4 cost a disk flush each (milliseconds, far more on a network file system). They buy
durability against a crash of the *machine*; atomicity against a killed *process* comes from the
rename alone. So ``fsync=True`` (the default) for what is expensive to redo (a measurement record,
a checkpoint pointer, a shard manifest), ``fsync=False`` for what the next run rewrites anyway (report
pages, findings written after every finding).

The temporary file is ``.<name>.<pid>.tmp`` (:func:`temp_path`): hidden, next to its target, and
naming the process that wrote it, so a cleanup can tell a stale one (its process is gone) from one
being written right now. On an exception it is removed; after a kill (no Python code runs) it stays
and the next cleanup removes it.
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["atomic_write_bytes", "atomic_write_text", "fsync_dir", "pid_alive", "temp_path"]


def temp_path(path: str | os.PathLike, pid: int | None = None) -> Path:
    """The temporary file that :func:`atomic_write_bytes` writes before the rename onto ``path``:
    ``.<name>.<pid>.tmp`` in the same folder (``pid``: this process unless given)."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid() if pid is None else pid}.tmp")


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (signal 0 checks without sending anything; a
    process of another user counts as alive). What tells a stale temporary name from a live one."""
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def fsync_dir(path: str | os.PathLike) -> None:
    """fsync a folder, so that a rename or a new entry in it survives a power loss."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write(path, mode: str, data, fsync: bool, encoding: str | None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        with open(tmp, mode, encoding=encoding) as f:
            f.write(data)
            if fsync:
                f.flush()                   # Python's buffer -> the kernel
                os.fsync(f.fileno())        # the kernel's page cache -> the disk
        os.replace(tmp, path)
    except BaseException:                   # KeyboardInterrupt too: never leave the temporary file
        tmp.unlink(missing_ok=True)
        raise
    if fsync:
        fsync_dir(path.parent)
    return path


def atomic_write_bytes(path: str | os.PathLike, data: bytes, fsync: bool = True) -> Path:
    """Replace ``path`` with ``data`` atomically (readers see the old or the new content, never a
    mix); with ``fsync`` also durably (file and folder flushed to disk). Creates the parent folder.
    Returns ``path`` as a Path."""
    return _atomic_write(path, "wb", data, fsync, None)


def atomic_write_text(path: str | os.PathLike, text: str, fsync: bool = True,
                      encoding: str = "utf-8") -> Path:
    """:func:`atomic_write_bytes` for text (encoded with ``encoding``, UTF-8 by default)."""
    return _atomic_write(path, "w", text, fsync, encoding)
