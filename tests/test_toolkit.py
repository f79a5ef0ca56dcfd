"""The public toolkit: its promised names, and the README's training loop run as written."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import preflight.toolkit as T
from conftest import REPO


def readme_loop() -> str:
    """The python block of the README's "Use it in your own training" section."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Use it in your own training"):].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1
    return blocks[0]


def test_every_promised_name_is_there_and_documented():
    for name in T.__all__:
        assert getattr(T, name) is not None
        assert f"``{name}" in T.__doc__, f"{name} is public but not in preflight.toolkit's docstring"
    with pytest.raises(AttributeError, match="public names"):
        T.trainloop                    # noqa: B018 - the audit's machinery is not the toolkit


def test_importing_the_toolkit_loads_neither_torch_nor_webdataset():
    code = "import sys, preflight.toolkit; print('torch' in sys.modules, 'webdataset' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.split() == ["False", "False"]


def _run(cmd, cwd: Path) -> str:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r.stdout


@pytest.mark.slow
def test_readme_training_loop_runs_stops_and_resumes(tmp_path):
    (tmp_path / "loop.py").write_text(readme_loop())
    first = _run([sys.executable, "loop.py"], tmp_path)
    assert "rank 0 started at step 0" in first
    stopped = int(re.search(r"stopped after step (\d+).*saved step (\d+)", first).group(1))
    assert stopped >= 50 and f"saved step {stopped}" in first              # the stop file, then a final save
    assert "loader/queue_depth_median" in first
    second = _run([sys.executable, "loop.py"], tmp_path)
    assert f"rank 0 started at step {stopped}" in second                   # resumed from the checkpoint


@pytest.mark.slow
def test_readme_training_loop_under_torchrun(tmp_path):
    (tmp_path / "loop.py").write_text(readme_loop())
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    from preflight.harness.launch import free_ports

    port = str(free_ports(1)[0])
    out = _run([torchrun, "--nproc-per-node", "2", "--master-port", port, "loop.py"], tmp_path)
    steps = re.findall(r"rank (\d) stopped after step (\d+)", out)
    assert sorted(r for r, _ in steps) == ["0", "1"] and len({s for _, s in steps}) == 1   # one decision
