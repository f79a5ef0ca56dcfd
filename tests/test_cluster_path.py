"""The README's "Measure on a real cluster" path, run as written, then fed to the audit.

The commands are read from README.md (one list, one home), not restated here. The only changes a
CPU box needs: ``--nproc_per_node=2`` (two cores) and ``--quick`` appended (smoke sizes). ``python``
and ``torchrun`` are this venv's (PATH), ``$SCRATCH`` a temporary folder, the working folder another.
Then the documented ``python -m preflight audit my.yaml --results results/`` runs on a profile that
says ``gpu: auto`` (the records were measured on this machine), and per chapter: it ran ok, nothing
was measured live, every measured finding names its record. A second audit on deliberately broken
records must say why each one is refused and fall back to "not measured" (``--plan-only``), without
an error.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, example_with

pytestmark = pytest.mark.slow
CHAPTERS = ["baseline", "data_pipeline", "communication", "load_balance", "fault_tolerance"]
PROFILE_SOURCES = ("computed from profile", "not measured", "audit")


def readme_blocks() -> list[list[str]]:
    """The bash blocks of the README's cluster section: their command lines, comments removed."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Measure on a real cluster", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    return [[re.sub(r"\s+#.*$", "", ln).strip() for ln in b.splitlines() if ln.strip() and not ln.startswith("#")]
            for b in blocks]


def as_on_this_box(cmd: str) -> str:
    """A documented command at this machine's size: 2 ranks, smoke sizes."""
    return re.sub(r"--nproc_per_node=\d+", "--nproc_per_node=2", cmd) + " --quick"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(tmp: Path) -> dict:
    env = dict(os.environ, SCRATCH=str(tmp / "scratch"), PYTHONUNBUFFERED="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(REPO / ".pytest_cache" / "inductor"))
    env.pop("PREFLIGHT_QUICK", None)
    return env


def run_shell(cmd: str, cwd: Path, env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(env, PET_MASTER_PORT=str(_free_port()))     # torchrun's --master_port, never a fixed one
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def my_profile(path: Path) -> Path:
    path.write_text(yaml.safe_dump(example_with(cluster__gpu="auto", project="cluster-path")))
    return path


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cluster")
    env = _env(tmp)
    measure, audit = readme_blocks()[:2]
    assert len(measure) >= 15 and all(c.startswith(("python -m preflight.bench.", "torchrun ")) for c in measure)
    assert audit == ["python -m preflight audit my.yaml --results results/"]
    my_profile(tmp / "my.yaml")
    for cmd in measure:
        r = run_shell(as_on_this_box(cmd), tmp, env)
        assert r.returncode == 0, f"{cmd}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    shutil.copytree(tmp / "results", tmp / "results-as-measured")      # the audit must not add to them
    r = run_shell(audit[0], tmp, env, timeout=1500)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return tmp, env, tmp / "reports" / "cluster-path"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_reads_the_documented_records(cluster_run, chapter):
    tmp, _, out = cluster_run
    summary = json.loads((out / "findings.json").read_text())
    ch = next(c for c in summary["chapters"] if c["name"] == chapter)
    assert ch["status"] == "ok", ch.get("error")
    log = json.loads((out / "measurements" / f"{chapter}.json").read_text())
    assert log, "the chapter took no measurement"
    live = [m for m in log if m["origin"] != "recorded"]
    assert not live, f"measured live or missing although the README's commands ran: {live}"
    assert not list((out / "records").rglob("*.json")), "a live measurement was recorded"
    for f in (f for f in summary["findings"] if f["chapter"] == ch["number"]):
        if not f["source"].startswith(PROFILE_SOURCES):
            assert f["source"].startswith("recorded") and ".json" in f["source"], (f["id"], f["source"])
    assert sorted(p.name for p in (tmp / "results").rglob("*")) == \
        sorted(p.name for p in (tmp / "results-as-measured").rglob("*"))


def _edit(path: Path, change) -> None:
    rec = json.loads(path.read_text())
    change(rec)
    path.write_text(json.dumps(rec))


def test_broken_records_are_named_and_not_used(cluster_run):
    tmp, env, _ = cluster_run
    broken = tmp / "broken"
    shutil.copytree(tmp / "results-as-measured", broken)
    _edit(broken / "baseline.json", lambda r: r.update(method_version=99))
    _edit(broken / "datapipe.json", lambda r: r["results"].pop("cores"))
    _edit(broken / "elastic.json", lambda r: r.update(device={"kind": "cuda", "name": "NVIDIA H100 80GB HBM3",
                                                              "table_key": "H100-SXM", "label": "NVIDIA H100 (GPU)"}))
    (broken / "resume.json").write_text('{"method": "resume", "results": ')          # not JSON at all
    r = run_shell("python -m preflight audit my.yaml --results broken/ --plan-only --chapters 1,2,5 --out broken-report",
                  tmp, env, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = tmp / "broken-report"
    summary = json.loads((out / "findings.json").read_text())
    assert all(c["status"] == "ok" for c in summary["chapters"]), summary["chapters"]

    def entry(chapter, method):
        return next(m for m in json.loads((out / "measurements" / f"{chapter}.json").read_text())
                    if m["method"] == method)

    for chapter, method, why in (("baseline", "baseline", "method version 99, this Preflight reads version 1"),
                                 ("data_pipeline", "datapipe", "missing result field(s) results.cores"),
                                 ("fault_tolerance", "elastic", "measured on NVIDIA H100 (GPU), this machine is")):
        e = entry(chapter, method)
        assert e["origin"] == "not measured" and any(why in p for p in e["refused"]), e
        nb = (out / "notebooks").glob(f"*_{chapter}.ipynb")
        assert why in next(nb).read_text(), f"the chapter does not say why the {method} record was refused"
    torn = entry("fault_tolerance", "resume")                                  # unreadable: named, no crash
    assert torn["origin"] == "not measured" and any(p.startswith("resume.json: not a readable record (JSONDecodeError")
                                                    for p in torn["refused"]), torn
    assert entry("fault_tolerance", "ckptstall")["origin"] == "recorded"       # the intact ones still count
