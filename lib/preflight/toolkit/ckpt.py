"""Durable checkpoints: a crash at any instant still leaves a loadable, verified checkpoint.

A checkpoint is a folder with the serialised state and a manifest of checksums::

    <dir>/step-00000120/state.pt          torch.save of the full training state
    <dir>/step-00000120/MANIFEST.json     {"step": 120, "files": {"state.pt": {"sha256", "bytes"}}}
    <dir>/latest                          "step-00000120": the published one, replaced atomically

Writing follows the only order that survives a crash (SIGKILL, node loss, walltime) at any point:

1. write every file into a temporary folder ``.tmp-step-...`` and ``fsync`` it (data on disk, not in
   the page cache);
2. write the manifest (sha256 per file), fsync it and the folder;
3. ``rename`` the folder to ``step-...`` (atomic on POSIX file systems) and fsync the parent;
4. only then publish: write ``.latest.<pid>.tmp``, fsync, rename over ``latest``, fsync the parent
   (``fsutil.atomic_write_bytes``, the one helper for a single file written whole);
5. prune old checkpoints (never the published one).

A crash before 3 leaves a ``.tmp-`` folder that is ignored (and cleaned up on the next save); a crash
between 3 and 4 leaves ``latest`` on the previous checkpoint, which is still complete.

Loading (``load_latest``) starts at ``latest``, verifies every checksum, and unpickles with
``torch.load(weights_only=True)``, which refuses arbitrary Python objects: a checkpoint is data, not
code, and a tampered or malicious file must never run. Any problem (missing, truncated, tampered,
refused) is reported and the next older checkpoint that verifies is used instead.

``TwoStageCheckpointer`` adds the two stages of pitfalls.md §5: snapshot the state to host memory
(the only part training waits for), then in a background thread write it durably to fast local disk
and copy it to the shared file system, publishing ``latest`` there only once the copy is durable.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shutil
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from preflight.core.fsutil import atomic_write_bytes, fsync_dir, pid_alive

STATE_FILE = "state.pt"
MANIFEST = "MANIFEST.json"
LATEST = "latest"
_STEP = re.compile(r"^step-(\d{8,})$")
CHUNK = 1 << 20


class CheckpointWarning(UserWarning):
    """A checkpoint was skipped on load (corrupt, tampered, refused); an older one is used."""


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _write_durable(path: Path, write: Callable) -> None:
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def _publish(directory: Path, name: str) -> None:
    """Point ``latest`` at ``name`` atomically and durably (write + fsync a temporary file, rename
    over, fsync the folder)."""
    atomic_write_bytes(directory / LATEST, name.encode())


def _manifest(folder: Path, step: int, files: dict[str, str]) -> None:
    entries = {n: {"sha256": digest, "bytes": (folder / n).stat().st_size} for n, digest in files.items()}
    text = json.dumps({"step": step, "files": entries, "created": time.time()}, indent=1)
    _write_durable(folder / MANIFEST, lambda f: f.write(text.encode()))


def _install(tmp: Path, directory: Path, step: int) -> Path:
    """Rename the finished temporary folder into place (replacing an older copy of the same step)."""
    final = directory / step_name(step)
    fsync_dir(tmp)
    if final.exists():      # the same step saved again (e.g. after a resume): the old copy goes first
        shutil.rmtree(final)
    os.rename(tmp, final)
    fsync_dir(directory)
    return final


def list_checkpoints(directory: str | os.PathLike) -> list[tuple[int, Path]]:
    """``(step, folder)`` of every installed checkpoint, newest first (unverified)."""
    d = Path(directory)
    found = [(int(m.group(1)), p) for p in d.glob("step-*") if (m := _STEP.match(p.name)) and p.is_dir()]
    return sorted(found, reverse=True)


def prune(directory: Path, keep: int) -> None:
    """Remove stale temporary folders and all but the ``keep`` newest checkpoints (never ``latest``)."""
    published = (directory / LATEST).read_text().strip() if (directory / LATEST).exists() else None
    for tmp in directory.glob(".tmp-*"):
        if tmp.is_dir() and not _owned_by_live_process(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    for tmp in directory.glob(f".{LATEST}.*.tmp"):       # a publish killed before its rename (temp_path)
        if tmp.is_file() and not _owned_by_live_process(tmp):
            tmp.unlink(missing_ok=True)
    for _, folder in list_checkpoints(directory)[keep:]:
        if folder.name != published:
            shutil.rmtree(folder, ignore_errors=True)


def _owned_by_live_process(tmp: Path) -> bool:
    """Whether the process named in a temporary name still runs: ``.tmp-step-00000120-<pid>`` (a
    folder) or ``.latest.<pid>.tmp`` (``fsutil.temp_path``)."""
    pid = re.split(r"[-.]", tmp.name.removesuffix(".tmp"))[-1]
    return pid.isdigit() and int(pid) != os.getpid() and pid_alive(int(pid))


def save(state: dict, directory: str | os.PathLike, step: int, *, keep: int = 3,
         on_stage: Callable[[str], None] | None = None) -> Path:
    """Write ``state`` as checkpoint ``step`` in ``directory`` durably and publish it as ``latest``.

    ``on_stage(name)`` is called after each stage (``written``, ``manifest``, ``installed``,
    ``published``, ``pruned``): the crash tests kill the process there."""
    import torch

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    stage = on_stage or (lambda _name: None)
    tmp = directory / f".tmp-{step_name(step)}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    _write_durable(tmp / STATE_FILE, lambda f: torch.save(state, f))
    stage("written")
    _manifest(tmp, step, {STATE_FILE: sha256_file(tmp / STATE_FILE)})
    stage("manifest")
    final = _install(tmp, directory, step)
    stage("installed")
    _publish(directory, final.name)
    stage("published")
    prune(directory, keep)
    stage("pruned")
    return final


def copy_checkpoint(src: Path, directory: Path, *, on_stage: Callable[[str], None] | None = None) -> Path:
    """Copy an installed checkpoint folder into ``directory`` (the shared file system) with the same
    protocol: temporary folder, fsync, checksums compared with the source manifest, rename, publish."""
    stage = on_stage or (lambda _name: None)
    manifest = json.loads((src / MANIFEST).read_text())
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".tmp-{src.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for name, meta in manifest["files"].items():
        h = hashlib.sha256()
        with open(src / name, "rb") as fin, open(tmp / name, "wb") as fout:
            while chunk := fin.read(CHUNK):
                h.update(chunk)
                fout.write(chunk)
            fout.flush()
            os.fsync(fout.fileno())
        if h.hexdigest() != meta["sha256"]:
            shutil.rmtree(tmp, ignore_errors=True)
            raise OSError(f"copy of {src / name} does not match its manifest checksum")
    _write_durable(tmp / MANIFEST, lambda f: f.write((src / MANIFEST).read_bytes()))
    stage("copied")
    final = _install(tmp, directory, manifest["step"])
    _publish(directory, final.name)
    stage("published")
    return final


def verify(folder: str | os.PathLike) -> str | None:
    """None if every file of the checkpoint matches its manifest, else what is wrong."""
    folder = Path(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        files = manifest["files"]
        if not isinstance(files, dict) or not all(
                isinstance(m, dict) and isinstance(m.get("bytes"), int) and isinstance(m.get("sha256"), str)
                for m in files.values()):
            raise TypeError("'files' must map each file name to {'sha256': str, 'bytes': int}")
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"no readable manifest ({type(err).__name__}: {err})"
    if STATE_FILE not in files:
        return f"the manifest does not list {STATE_FILE}"
    try:
        for name, meta in files.items():
            if Path(name).name != name or name in (".", "..", MANIFEST):
                return f"the manifest names {name!r}, not a plain file of the folder"
            path = folder / name
            if not path.is_file():
                return f"{name} is missing"
            if path.stat().st_size != meta["bytes"]:
                return f"{name} has {path.stat().st_size} bytes, the manifest says {meta['bytes']} (truncated?)"
            if sha256_file(path) != meta["sha256"]:
                return f"{name} does not match its sha256 (corrupt or tampered)"
    except OSError as err:          # unreadable, or removed while being checked
        return f"cannot read {name} ({type(err).__name__}: {err})"
    return None


def load(folder: str | os.PathLike, map_location="cpu") -> dict:
    """Verify and load one checkpoint folder; ``ValueError`` saying why when it cannot be used."""
    import torch

    folder = Path(folder)
    if problem := verify(folder):
        raise ValueError(f"checkpoint {folder}: {problem}")
    try:
        return torch.load(folder / STATE_FILE, map_location=map_location, weights_only=True)
    except Exception as err:  # noqa: BLE001 - a file that verifies yet fails to unpickle (tampered, crafted)
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"checkpoint {folder}: refused by torch.load(weights_only=True): {first}") from None


def load_latest(*directories: str | os.PathLike, map_location="cpu") -> tuple[int, dict, Path] | None:
    """The newest checkpoint that verifies and loads, across ``directories`` (e.g. local, then
    shared): ``(step, state, folder)``, or None if there is none. The published ``latest`` of each
    folder is tried first; a bad one is reported (``CheckpointWarning``) and skipped."""
    candidates: list[tuple[int, int, Path]] = []
    for d in map(Path, directories):
        if not d.is_dir():
            continue
        try:
            published = (d / LATEST).read_text().strip()
        except (OSError, UnicodeDecodeError):         # none yet, or unreadable: only a tie-break
            published = ""
        for step, folder in list_checkpoints(d):
            # published first among equal steps; unpublished newer ones are complete too (installed)
            candidates.append((step, int(folder.name == published), folder))
    for step, _, folder in sorted(candidates, key=lambda c: (c[0], c[1]), reverse=True):
        try:
            return step, load(folder, map_location), folder
        except ValueError as err:
            warnings.warn(f"{err}; falling back to an older checkpoint", CheckpointWarning, stacklevel=2)
    return None


def snapshot(state):
    """A copy of ``state`` in host memory that training may overwrite freely afterwards: tensors are
    cloned to the CPU, everything else deep-copied. This is the part of an asynchronous save that
    training waits for."""
    import torch

    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return type(state)((k, snapshot(v)) for k, v in state.items())
    if isinstance(state, tuple) and hasattr(state, "_fields"):         # a namedtuple
        return type(state)(*(snapshot(v) for v in state))
    if isinstance(state, (list, tuple)):
        return type(state)(snapshot(v) for v in state)
    return copy.deepcopy(state)


class TwoStageCheckpointer:
    """Snapshot in the training thread, then write to ``local_dir`` and copy to ``shared_dir`` in a
    background thread; ``latest`` in the shared folder is published only after the copy is durable.

    One save is in flight at a time: a new ``save`` first waits for the previous one (that wait is
    training stall too, and is counted). ``wait()`` joins and re-raises a background failure."""

    def __init__(self, local_dir: str | os.PathLike, shared_dir: str | os.PathLike | None = None, keep: int = 3):
        self.local_dir = Path(local_dir)
        self.shared_dir = Path(shared_dir) if shared_dir else None
        self.keep = keep
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.last_durable_s = 0.0

    def save(self, state: dict, step: int, *, blocking: bool = False) -> float:
        """Checkpoint ``state`` as ``step``; returns the seconds training was stalled."""
        t0 = time.perf_counter()
        self.wait()
        if blocking:
            self._write(state, step)
            return time.perf_counter() - t0
        snap = snapshot(state)
        self._thread = threading.Thread(target=self._background, args=(snap, step), daemon=False,
                                        name=f"checkpoint-{step}")
        self._thread.start()
        return time.perf_counter() - t0

    def _write(self, state: dict, step: int) -> None:
        t0 = time.perf_counter()
        folder = save(state, self.local_dir, step, keep=self.keep)
        if self.shared_dir:
            copy_checkpoint(folder, self.shared_dir)
            prune(self.shared_dir, self.keep)
        self.last_durable_s = time.perf_counter() - t0

    def _background(self, state: dict, step: int) -> None:
        try:
            self._write(state, step)
        except BaseException as err:  # noqa: BLE001 - handed to the training thread by wait()
            self._error = err

    @property
    def in_flight(self) -> bool:
        """True while a background save is still writing or copying."""
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise RuntimeError(f"background checkpoint failed: {err}") from err

    def load_latest(self, map_location="cpu"):
        """Newest valid checkpoint, local (fast, same node) or shared (after a move to other nodes)."""
        return load_latest(*(d for d in (self.local_dir, self.shared_dir) if d), map_location=map_location)
