"""The one atomic-write helper (``preflight.core.fsutil``): content replaced whole, no temporary file left
behind on success or on an exception, the parent folder created, fsync actually called."""
from __future__ import annotations

import os

import pytest

from preflight.core import fsutil


def _leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.parametrize("fsync", [True, False])
def test_replaces_content_and_leaves_no_temp_file(tmp_path, fsync):
    target = tmp_path / "record.json"
    target.write_text("old")
    assert fsutil.atomic_write_text(target, "new ünïcode", fsync=fsync) == target
    assert target.read_text(encoding="utf-8") == "new ünïcode"
    fsutil.atomic_write_bytes(target, b"\x00bytes", fsync=fsync)
    assert target.read_bytes() == b"\x00bytes"
    assert _leftovers(tmp_path) == []


def test_creates_the_parent_folder(tmp_path):
    target = tmp_path / "a" / "b" / "page.html"
    fsutil.atomic_write_text(str(target), "<p>hi</p>")
    assert target.read_text() == "<p>hi</p>"


def test_failed_write_keeps_the_old_file_and_removes_the_temp_file(tmp_path):
    target = tmp_path / "manifest.json"
    target.write_text("old")
    with pytest.raises(TypeError):
        fsutil.atomic_write_bytes(target, "not bytes")          # fails inside the write
    assert target.read_text() == "old" and _leftovers(tmp_path) == []


def test_failed_fsync_keeps_the_old_file_and_removes_the_temp_file(tmp_path, monkeypatch):
    target = tmp_path / "latest"
    target.write_text("step-1")
    seen = []

    def broken_fsync(fd):
        seen.append(fsutil.temp_path(target).exists())          # the temp file is there, written
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="Input/output"):
        fsutil.atomic_write_text(target, "step-2")
    assert seen == [True]
    assert target.read_text() == "step-1" and _leftovers(tmp_path) == []


def test_fsync_flushes_file_and_folder(tmp_path, monkeypatch):
    calls = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(fd) or real(fd))
    fsutil.atomic_write_text(tmp_path / "x", "1")
    assert len(calls) == 2                                      # the file, then its folder
    calls.clear()
    fsutil.atomic_write_text(tmp_path / "x", "2", fsync=False)
    assert calls == []


def test_temp_path_is_hidden_next_to_the_target_and_names_the_process(tmp_path):
    assert fsutil.temp_path(tmp_path / "latest") == tmp_path / f".latest.{os.getpid()}.tmp"
    assert fsutil.temp_path(tmp_path / "latest", pid=42).name == ".latest.42.tmp"
