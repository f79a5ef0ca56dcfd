"""The README's "Audit your own model" commands, run as written, and what their reports must say.

The commands are read from README.md (one home), in a temporary folder holding a copy of
``examples/``; the only change: ``--quick`` appended to each audit (smoke sizes on a 2-core CPU). Each
audit must run all five chapters ok; every finding measured on the workload names it (class and
parameter count, exact); the report's header names it; the SIGKILL-and-resume of each example is
bitwise; ``compare`` works between the two, and between a reference audit and a workload audit.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import EXAMPLE, REPO, run_cli
from preflight import workload as W

pytestmark = pytest.mark.slow
# the findings measured on the workload (chapters/workload.py); the rest are the profile's or the reference's
WORKLOAD_IDS = {"baseline/params", "baseline/flops_per_sample", "baseline/throughput", "baseline/peak_memory",
                "baseline/model_states", "baseline/mfu", "baseline/memory_bound_share", "baseline/fusion_speedup",
                "communication/gradient_bytes", "communication/overlap_saving", "communication/bf16_saving",
                "load_balance/partition_gain", "fault_tolerance/resume_bitwise", "fault_tolerance/async_stall_ratio"}
EXAMPLES = {"tiny-lm": ("tiny_lm.py:build", "TinyLM"), "small-cnn": ("small_cnn.py:build", "SmallCNN")}


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split("## Audit your own model", 1)[1].split("\n## ", 1)[0]
    return [re.sub(r"\s+#.*$", "", ln).strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)
            for ln in block.splitlines() if ln.strip() and not ln.startswith("#")]


@pytest.fixture(scope="module")
def audited(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("workloads")
    shutil.copytree(REPO / "examples", tmp / "examples")
    env = dict(os.environ, PYTHONUNBUFFERED="1", PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(REPO / ".pytest_cache" / "inductor"))
    env.pop("PREFLIGHT_QUICK", None)
    cmds = readme_commands()
    assert cmds == ["python -m preflight validate examples/tiny_lm.yaml", "python -m preflight audit examples/tiny_lm.yaml",
                    "python -m preflight audit examples/small_cnn.yaml",
                    "python -m preflight compare reports/tiny-lm reports/small-cnn"]
    for cmd in cmds:
        run = cmd + " --quick" if " audit " in cmd else cmd
        r = subprocess.run(["bash", "-c", run], cwd=tmp, env=env, capture_output=True, text=True, timeout=2400)
        assert r.returncode == 0, f"{run}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        if " validate " in cmd:
            assert "entry: tiny_lm.py:build" in r.stdout
    return tmp / "reports"


@pytest.mark.parametrize("project", list(EXAMPLES))
def test_example_audit_measures_the_workload(audited, project):
    entry, cls = EXAMPLES[project]
    s = json.loads((audited / project / "findings.json").read_text())
    assert [c["status"] for c in s["chapters"]] == ["ok"] * 5, s["chapters"]
    params = W.load(entry, REPO / "examples").params
    assert s["workload"]["class"] == cls and s["workload"]["params"] == params
    f = {x["id"]: x for x in s["findings"]}
    name = f"workload {cls} ({params:,} parameters): "
    assert WORKLOAD_IDS <= set(f)
    for fid in WORKLOAD_IDS:
        if f[fid]["source"] != "not measured":
            assert f[fid]["message"].startswith(name), (fid, f[fid]["message"])
            assert "reference model" not in f[fid]["message"].lower(), fid
    assert f["baseline/params"]["value"] == params
    assert f["baseline/flops_per_sample"]["value"] > 0 and f["baseline/throughput"]["value"] > 0
    assert f["fault_tolerance/resume_bitwise"]["verdict"] == "pass", f["fault_tolerance/resume_bitwise"]["message"]
    assert f["communication/gradient_bytes"]["value"] == 4 * params               # fp32 gradients, all trainable
    assert f["load_balance/partition_gain"]["value"] > 0
    assert "measured with torch.distributed.pipelining" in f["load_balance/partition_gain"]["message"]
    records = {p.stem.split("-")[0] for p in (audited / project / "records").glob("*.json")}
    assert {"workload_baseline", "workload_fusion", "workload_overlap", "workload_partition", "workload_resume",
            "workload_ckptstall"} <= records
    page = (audited / project / "index.html").read_text()
    assert f"<th>Workload</th><td>{cls} ({params:,} parameters) from {entry}</td>" in page


def test_compare_reference_and_workload(audited, tmp_path):
    assert (audited / "small-cnn" / "compare.html").is_file()          # the README's compare ran
    ref = tmp_path / "reference"
    r = run_cli("audit", EXAMPLE, "--out", ref, "--plan-only")
    assert r.returncode in (0, 1), r.stderr
    r = run_cli("compare", ref, audited / "tiny-lm", "--out", tmp_path / "cmp")
    assert r.returncode == 0, r.stderr
    assert "baseline/throughput" in r.stdout and (tmp_path / "cmp" / "compare.html").is_file()
