"""A chapter's scratch folder per run: named by its owner, removed when the owner exits, and swept by the
next run when the owner was killed (no Python ran) or when an earlier version left it without an owner."""
import os
import socket
import subprocess
import sys
import time

from preflight.core.fsutil import pid_alive
from preflight.runner import scratch


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert not pid_alive(p.pid)
    return p.pid


def test_run_folders_are_distinct_and_name_their_owner(tmp_path):
    a, b = scratch.run_folder("fault_tolerance", tmp_path), scratch.run_folder("fault_tolerance", tmp_path)
    assert a != b and a.parent == b.parent == tmp_path / "fault_tolerance"
    assert scratch.owner(a) == scratch.owner(b) == (socket.gethostname(), os.getpid())
    assert scratch.owner(tmp_path / "run-abc_12xy") is None                 # an earlier version's name


def test_sweep_removes_what_nobody_owns_and_keeps_the_rest(tmp_path):
    host, day = socket.gethostname(), scratch.STALE_AFTER_S
    keep = [tmp_path / f"run-{host}-{os.getpid()}-live1",                 # this process
            tmp_path / f"run-{host}-1-init1",                              # a live process (init)
            tmp_path / "run-other-node-7-abc",                             # another host (dead pid there or not)
            tmp_path / "run-fresh123",                                     # no owner, not a day old
            tmp_path / "resume"]                                           # no owner, not a day old
    gone = [tmp_path / f"run-{host}-{_dead_pid()}-dead1",                 # its process is gone
            tmp_path / "run-old12345", tmp_path / "stall"]                 # no owner, older than a day
    for d in keep + gone:
        (d / "sub").mkdir(parents=True)
        (d / "sub" / "ckpt.pt").write_bytes(b"x")
    now = time.time()
    for d in gone[1:]:
        os.utime(d, (now - day - 60, now - day - 60))
    assert sorted(scratch.sweep(tmp_path, now=now)) == sorted(gone)
    assert all(d.is_dir() for d in keep) and not any(d.exists() for d in gone)
    assert scratch.owner(keep[2]) == ("other-node", 7)                     # another host's: not checkable here


def test_a_run_that_fails_or_is_killed_leaves_nothing_behind(tmp_path):
    code = ("import sys; from preflight.runner import scratch; w = scratch.run_folder('fault_tolerance', sys.argv[1]); "
            "(w / 'f').write_text('x'); print(w, flush=True); {}")
    failed = subprocess.run([sys.executable, "-c", code.format("raise RuntimeError('cell failed')"), str(tmp_path)],
                            capture_output=True, text=True, timeout=60)
    assert failed.returncode == 1 and "cell failed" in failed.stderr
    assert not os.path.exists(failed.stdout.strip())                       # removed at exit (atexit)
    killed = subprocess.Popen([sys.executable, "-c", code.format("import time; time.sleep(60)"), str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)
    left = killed.stdout.readline().strip()
    killed.kill()
    killed.wait()
    killed.stdout.close()
    assert os.path.isdir(left)                                             # SIGKILL: no Python code ran
    new = scratch.run_folder("fault_tolerance", tmp_path)                  # the next run sweeps it
    assert not os.path.exists(left) and new.is_dir()


def test_a_chapter_that_fails_in_its_kernel_leaves_no_folder(tmp_path):
    """What papermill does with a chapter whose cell raises: it shuts the kernel down, which exits and
    removes the folder (the chapter's own clean-up cell never ran)."""
    import nbformat
    import papermill as pm
    import pytest

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("from preflight.runner import scratch\n"
                                          f"w = scratch.run_folder('ch', {str(tmp_path)!r})"),
                nbformat.v4.new_code_cell("(w / 'ckpt').write_text('x')\nraise RuntimeError('boom')")]
    nbformat.write(nb, tmp_path / "in.ipynb")
    with pytest.raises(pm.PapermillExecutionError, match="boom"):
        pm.execute_notebook(tmp_path / "in.ipynb", tmp_path / "out.ipynb", kernel_name="preflight", progress_bar=False)
    deadline = time.monotonic() + 30                   # the kernel exits after papermill returns
    while list((tmp_path / "ch").iterdir()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert list((tmp_path / "ch").iterdir()) == []
