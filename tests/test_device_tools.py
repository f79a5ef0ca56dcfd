"""tools/device: a device run always packs what it measured, and only what ran on the GPU is kept."""
import json
import os
import subprocess
import sys
import tarfile

import pytest

from conftest import REPO

KEEP = REPO / "tools" / "device" / "keep_reference.py"
H200 = {"kind": "cuda", "name": "NVIDIA H200", "count": 1, "memory_GB": 150.0, "driver": "580.1",
        "capability": "9.0", "table_key": "H200-SXM", "label": "NVIDIA H200 (GPU)"}
CPU = {"kind": "cpu", "name": "AMD EPYC", "count": 16, "memory_GB": 128.0, "table_key": None,
       "label": "AMD EPYC (CPU fallback)"}
VERSIONS = {"python": "3.12.3", "torch": "2.11.0+cu130", "cuda": "13.0", "preflight": "0.1.0"}


def _record(method, device, kind, date="2026-11-30T10:00:00+00:00", results=None):
    return {"method": method, "method_version": 1, "date": date, "device": device, "versions": VERSIONS,
            "ran_on": {"kind": kind, "backend": "gloo" if kind == "cpu" else None, "basis": "test"},
            "params": {}, "results": results or {}}


def _device_run(tmp_path, records: dict, findings=True, traces=()):
    """A device run's folder as tools/device/audit.sh leaves it: reference.tgz of its work folder
    (records/, traces/, report/), and side files."""
    work = tmp_path / "work"
    for rel, rec in records.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(json.dumps(rec))
    for name in traces:
        (work / "traces").mkdir(parents=True, exist_ok=True)
        (work / "traces" / name).write_bytes(b"\x1f\x8b")
    if findings:
        (work / "report").mkdir(parents=True, exist_ok=True)
        (work / "report" / "findings.json").write_text(json.dumps({"findings": []}))
    run = tmp_path / "run"
    run.mkdir()
    with tarfile.open(run / "reference.tgz", "w:gz") as tar:
        tar.add(work, arcname=".")
    (run / "versions.txt").write_text("torch 2.11.0+cu130\n")
    (run / "phases.log").write_text("[ 10 s] ceilings: ok\n")
    return run


def _keep(*args):
    return subprocess.run([sys.executable, str(KEEP), *map(str, args)], capture_output=True, text=True)


def test_gpu_records_are_kept_and_cpu_records_named_and_dropped(tmp_path):
    run = _device_run(tmp_path, {
        "records/ceilings.json": _record("ceilings", H200, "cuda"),
        "traces/traces-reference.json": _record("traces", H200, "cuda",
                                                results={"files": ["reference-rank0.pt.trace.json.gz"]}),
        "report/records/overlap-real.json": _record("overlap", CPU, "cpu"),       # gloo ranks on the GPU box
        "report/records/resume.json": _record("resume", H200, "cpu")},            # stamped GPU, ran on the CPU
        traces=["reference-rank0.pt.trace.json.gz"])
    r = _keep(run, "--dest", tmp_path / "ref")
    assert r.returncode == 0, r.stderr
    dest = tmp_path / "ref" / "nvidia-h200-2026-11-30"
    assert sorted(p.name for p in (dest / "records").iterdir()) == ["ceilings.json", "traces-reference.json"]
    assert (dest / "traces" / "reference-rank0.pt.trace.json.gz").is_file()
    assert {"findings.json", "profile.yaml", "README.md", "versions.txt", "phases.log"} <= {p.name for p in dest.iterdir()}
    assert "dropped: report/records/overlap-real.json (overlap): ran on cpu" in r.stdout
    assert "report/records/resume.json (resume): ran on cpu" in r.stdout
    readme = (dest / "README.md").read_text()
    assert "NVIDIA H200" in readme and "torch 2.11.0+cu130" in readme and "2026-11-30" in readme
    assert "resume.json" in readme and f"{dest}/profile.yaml --plan-only --results {dest}/records" in readme
    assert "  gpu: H200-SXM" in (dest / "profile.yaml").read_text()
    again = _keep(run, "--dest", tmp_path / "ref")          # the same chip and date: not silently replaced
    assert again.returncode == 2 and "--force" in again.stderr
    assert _keep(run, "--dest", tmp_path / "ref", "--force").returncode == 0


def test_a_run_stopped_half_way_keeps_its_gpu_records(tmp_path):
    run = _device_run(tmp_path, {"records/baseline.json": _record("baseline", H200, "cuda")}, findings=False)
    r = _keep(run, "--dest", tmp_path / "ref")
    assert r.returncode == 0, r.stderr
    dest = tmp_path / "ref" / "nvidia-h200-2026-11-30"
    assert (dest / "records" / "baseline.json").is_file() and not (dest / "findings.json").exists()
    assert "did not finish" in (dest / "README.md").read_text()


def test_cpu_run_and_missing_tarball_are_refused_with_the_reason(tmp_path):
    r = _keep(_device_run(tmp_path, {"records/ceilings.json": _record("ceilings", CPU, "cpu")}), "--dest", tmp_path / "ref")
    assert r.returncode == 2 and "no record ran on a GPU" in r.stderr and "records/ceilings.json" in r.stderr
    assert not (tmp_path / "ref").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    r = _keep(empty, "--dest", tmp_path / "ref")
    assert r.returncode == 2 and "reference.tgz" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_replay_uses_the_kept_gpu_record_and_measures_nothing(tmp_path):
    """The documented replay: a real ceilings record (measured here, quick) relabelled as an H200's,
    kept, then the audit of the kept profile.yaml with --results: the record is used, nothing is
    measured live, and the example's own profile (H100-SXM) would refuse it."""
    rec_dir = tmp_path / "measured"
    r = subprocess.run([sys.executable, "-m", "preflight.bench.ceilings", "--out", rec_dir, "--quick"],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    rec = json.loads((rec_dir / "ceilings.json").read_text())
    rec["device"], rec["ran_on"] = H200, {"kind": "cuda", "backend": None, "basis": "test"}
    run = _device_run(tmp_path, {"records/ceilings.json": rec})
    assert _keep(run, "--dest", tmp_path / "ref").returncode == 0
    dest = next((tmp_path / "ref").iterdir())
    out = tmp_path / "replay"
    r = subprocess.run([sys.executable, "-m", "preflight", "audit", dest / "profile.yaml", "--plan-only",
                        "--results", dest / "records", "--chapters", "1", "--out", out],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    used = json.loads((out / "measurements" / "baseline.json").read_text())
    ceil = [m for m in used if m["method"] == "ceilings"]
    assert ceil and ceil[0]["origin"] == "recorded" and "NVIDIA H200" in ceil[0]["source"]
    assert not [m for m in used if m["origin"] == "live"]


@pytest.mark.slow
def test_rehearsal_stopped_half_way_packs_what_it_made(tmp_path):
    """tools/device/audit.sh on the CPU, its budget cutting the audit half-way: reference.tgz holds the
    records made so far, and keep_reference.py reads it and refuses it with the reason (CPU)."""
    out = tmp_path / "out"
    env = dict(os.environ, PY=sys.executable, WHEELS="none", QUICK="1", BUDGET="60", PHASES="ceilings audit",
               OUT=str(out), WORK=str(tmp_path / "work"))
    r = subprocess.run(["bash", "tools/device/audit.sh"], capture_output=True, text=True, cwd=REPO, env=env,
                       timeout=150)
    log = (out / "phases.log").read_text()
    assert r.returncode == 4, r.stdout + r.stderr
    assert "smoke: ok" in log and "ceilings: ok" in log and "audit: TIMED OUT" in log
    with tarfile.open(out / "reference.tgz") as tar:
        names = tar.getnames()
    assert "./records/ceilings.json" in names and any(n.startswith("./report/records/") for n in names)
    assert len(list(out.iterdir())) <= 8                   # the device tool brings back at most 8 files
    k = _keep(out, "--dest", tmp_path / "ref")
    assert k.returncode == 2 and "no record ran on a GPU" in k.stderr and "records/ceilings.json" in k.stderr
