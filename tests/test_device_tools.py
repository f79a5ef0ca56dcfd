"""tools/device: the GPU run's result kept as reference data, and nothing else."""
import json
import subprocess
import sys
import tarfile

from conftest import REPO

KEEP = REPO / "tools" / "device" / "keep_reference.py"


def _device_run(tmp_path, kind="cuda", name="NVIDIA H200"):
    """A device run's folder as tools/device/audit.sh leaves it (reference.tgz + side files)."""
    report = tmp_path / "report"
    (report / "records").mkdir(parents=True)
    findings = {"date": "2026-11-30T10:00:00+00:00", "mode": "measure", "elapsed_s": 300.0,
                "profile_path": "/repo/data/profiles/example.yaml",
                "machine": {"kind": kind, "name": name, "count": 1, "memory_GB": 150.0, "driver": "580.1",
                            "capability": [9, 0], "label": name},
                "versions": {"python": "3.12.3", "torch": "2.11.0+cu130", "cuda": "13.0", "preflight": "0.1.0"},
                "chapters": [{"number": 1, "status": "ok", "elapsed_s": 60.0}], "findings": []}
    (report / "findings.json").write_text(json.dumps(findings))
    (report / "records" / "ceilings.json").write_text(json.dumps({"method": "ceilings", "results": {}}))
    run = tmp_path / "run"
    run.mkdir()
    with tarfile.open(run / "reference.tgz", "w:gz") as tar:
        tar.add(report, arcname=".")
    (run / "versions.txt").write_text("torch 2.11.0+cu130\n")
    (run / "gpu-tests.log").write_text("4 passed\n")
    return run


def _keep(*args):
    return subprocess.run([sys.executable, str(KEEP), *map(str, args)], capture_output=True, text=True)


def test_gpu_run_is_kept_with_chip_versions_and_date(tmp_path):
    run = _device_run(tmp_path)
    r = _keep(run, "--dest", tmp_path / "ref")
    assert r.returncode == 0, r.stderr
    dest = tmp_path / "ref" / "nvidia-h200-2026-11-30"
    assert sorted(p.name for p in dest.iterdir()) == ["README.md", "findings.json", "gpu-tests.log", "records",
                                                      "versions.txt"]
    assert (dest / "records" / "ceilings.json").is_file()
    readme = (dest / "README.md").read_text()
    assert "NVIDIA H200" in readme and "torch 2.11.0+cu130" in readme and "2026-11-30" in readme
    assert "--results" in readme
    again = _keep(run, "--dest", tmp_path / "ref")          # the same chip and date: not silently replaced
    assert again.returncode == 2 and "--force" in again.stderr
    assert _keep(run, "--dest", tmp_path / "ref", "--force").returncode == 0


def test_cpu_run_and_missing_report_are_refused(tmp_path):
    r = _keep(_device_run(tmp_path, kind="cpu", name="AMD EPYC"), "--dest", tmp_path / "ref")
    assert r.returncode == 2 and "not reference data" in r.stderr
    assert not (tmp_path / "ref").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    r = _keep(empty, "--dest", tmp_path / "ref")
    assert r.returncode == 2 and "reference.tgz" in r.stderr and "Traceback" not in r.stderr
