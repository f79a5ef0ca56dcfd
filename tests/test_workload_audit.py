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
from preflight.core import workload as W

pytestmark = pytest.mark.slow
# the findings measured on the workload (chapters/workload.py); the rest are the profile's or the reference's
WORKLOAD_IDS = {"baseline/params", "baseline/flops_per_sample", "baseline/throughput", "baseline/peak_memory",
                "baseline/model_states", "baseline/mfu", "baseline/memory_bound_share", "baseline/fusion_speedup",
                "communication/gradient_bytes", "communication/overlap_saving", "communication/bf16_saving",
                "load_balance/partition_gain", "fault_tolerance/resume_bitwise", "fault_tolerance/async_stall_ratio"}
EXAMPLES = {"tiny-lm": ("tiny_lm.py:build", "TinyLM"), "small-cnn": ("small_cnn.py:build", "SmallCNN")}


def readme_commands(block: int = 0) -> list[str]:
    """The command lines of the ``block``-th bash block of README's "Audit your own model", comments removed."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Audit your own model", 1)[1].split("\n## ", 1)[0]
    code = re.findall(r"```bash\n(.*?)```", section, re.S)[block]
    return [re.sub(r"\s+#.*$", "", ln).strip() for ln in code.splitlines() if ln.strip() and not ln.startswith("#")]


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


def test_cluster_workflow_reads_the_records_back_and_advises(audited):
    """README's cluster workflow for a workload: the GPU node's audit (here the CPU audit of the same
    profile above stands in: no srun, no GPU), then the last two lines as written, on a copy of the
    profile that says ``gpu: auto`` (its records were measured on this CPU, not on the H100 it names).
    The read-back audit measures nothing: every workload finding is the record's, same value, naming
    the record; advise --mfu-from refuses a CPU audit (no datasheet peak, so no MFU) with exit 2."""
    gpu_run, read_back, advise = readme_commands(1)
    assert gpu_run.startswith("srun ") and gpu_run.endswith("audit examples/tiny_lm.yaml --out reports/tiny-lm-gpu")
    work = audited.parent
    shutil.copytree(audited / "tiny-lm", audited / "tiny-lm-gpu")
    profile = work / "examples" / "tiny_lm.yaml"
    text = profile.read_text()
    assert "  gpu: H100-SXM\n" in text
    profile.write_text(text.replace("  gpu: H100-SXM\n", "  gpu: auto\n"))
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    env.pop("PREFLIGHT_QUICK", None)
    r = subprocess.run(["bash", "-c", read_back], cwd=work, env=env, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, f"{read_back}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    measured = {f["id"]: f for f in json.loads((audited / "tiny-lm" / "findings.json").read_text())["findings"]}
    s = json.loads((audited / "tiny-lm-read" / "findings.json").read_text())
    assert [c["status"] for c in s["chapters"]] == ["ok"] * 5, s["chapters"]
    read = {f["id"]: f for f in s["findings"]}
    logs = [m for p in (audited / "tiny-lm-read" / "measurements").glob("*.json") for m in json.loads(p.read_text())]
    assert logs and not [m["method"] for m in logs if m["origin"] == "live"], logs
    replayed = [fid for fid in WORKLOAD_IDS if measured[fid]["source"] != "not measured"]
    assert len(replayed) >= 10, replayed
    for fid in replayed:
        assert read[fid]["value"] == measured[fid]["value"], fid
        assert read[fid]["source"].startswith("recorded on ") and ".json" in read[fid]["source"], \
            (fid, read[fid]["source"])
        assert read[fid]["message"].startswith("workload TinyLM"), fid
    r = subprocess.run(["bash", "-c", advise], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "--mfu-from = 'reports/tiny-lm-gpu': no MFU from chapter 1 there" in r.stderr, \
        r.stdout + r.stderr
