"""Staged DDP scaling: real torchrun runs at 1 and 2 processes on the CPU, records from a cluster read
back, and the sbatch template (the Slurm environment derivation: test_launch.py)."""
from __future__ import annotations

import json
import subprocess

import pytest

from conftest import REPO
from preflight.bench import scaling
from preflight.core.records import make_record, save_record
from preflight.models.extrapolate import scaling_curve

SBATCH = REPO / "slurm" / "scaling_stages.sbatch"


# ---------------------------------------------------------------------------- records from a cluster
def _stage_record(n, step_s, date, nodes=None):
    results = {"world_size": n, "nodes": nodes or max(1, n // 8), "unit": "GPUs (nccl)", "step_s": step_s,
               "per_rank_batch": 8, "samples_per_s": 8 * n / step_s, "tokens_per_s": 8 * n * 2048 / step_s,
               "step_s_per_rank": [step_s] * n}
    rec = make_record("scaling", 1, {"steps": 30}, results, device={"name": "NVIDIA H100 80GB HBM3"})
    rec["date"] = date
    return rec


def test_load_stage_records(tmp_path):
    save_record(_stage_record(1, 0.100, "2026-01-01T00:00:00+00:00"), tmp_path, "n1")
    save_record(_stage_record(8, 0.999, "2026-01-01T01:00:00+00:00"), tmp_path / "old", "n8")  # superseded
    save_record(_stage_record(8, 0.105, "2026-01-02T00:00:00+00:00"), tmp_path, "n8")
    save_record(_stage_record(64, 0.125, "2026-01-02T01:00:00+00:00"), tmp_path, "n64")
    save_record(_stage_record(512, 0.200, "2026-01-02T02:00:00+00:00"), tmp_path, "n512")
    (tmp_path / "other.json").write_text(json.dumps({"method": "baseline", "results": {}}))
    df = scaling.load_stage_records(tmp_path)
    assert list(df.columns) == scaling.COLUMNS
    assert df["world_size"].tolist() == [1, 8, 64, 512]
    assert df["nodes"].tolist() == [1, 1, 8, 64]
    assert df["efficiency"].tolist() == pytest.approx([1.0, 0.100 / 0.105, 0.8, 0.5])
    assert df["speedup"].tolist() == pytest.approx([1.0, 8 * 0.100 / 0.105, 64 * 0.8, 512 * 0.5])
    assert df.attrs["notes"] == []
    eff = scaling.measured_efficiencies(df)
    assert eff == pytest.approx({1: 1.0, 8: 0.100 / 0.105, 64: 0.8, 512: 0.5})
    curve = scaling_curve(serial_s=0.01, compute_s=0.09, params=1e9, grad_dtype="bf16", tp=1, pp=1,
                          gpus_per_node=8, intra_node_GBps=450, inter_node_Gbps=200, target_gpus=512,
                          measured=eff)
    assert curve.set_index("gpus")["efficiency"].to_dict() == pytest.approx(eff)


def test_load_stage_records_without_one_gpu_is_relative(tmp_path):
    save_record(_stage_record(8, 0.1, "2026-01-01T00:00:00+00:00"), tmp_path, "n8")
    save_record(_stage_record(64, 0.2, "2026-01-01T01:00:00+00:00"), tmp_path, "n64")
    df = scaling.load_stage_records(tmp_path)
    assert df["efficiency"].tolist() == pytest.approx([1.0, 0.5])
    assert any("relative to 8" in n for n in df.attrs["notes"])
    assert scaling.load_stage_records(tmp_path / "empty").empty


def test_run_stages_drops_what_the_machine_cannot_run(monkeypatch, tmp_path):
    monkeypatch.setattr(scaling, "max_processes", lambda: (1, "processes (CPU, gloo)"))
    with pytest.warns(UserWarning, match="at most 1"):
        df = scaling.run_stages((4,), out=tmp_path)
    assert df.empty and "skipped" in df.attrs["notes"][0]


# ---------------------------------------------------------------------------- live: torchrun on the CPU
@pytest.mark.slow
def test_run_stages_one_and_two_processes(tmp_path):
    df = scaling.run_stages((1, 2), out=tmp_path, quick=True, timeout=240)
    assert df["world_size"].tolist() == [1, 2]
    assert set(df["unit"]) == {"processes (CPU, gloo)"} or set(df["unit"]) == {"GPUs (nccl)"}
    assert (df["step_s"] > 0).all()
    assert df["efficiency"].iloc[0] == 1.0
    assert 0 < df["efficiency"].iloc[1] <= 1.5
    assert df["speedup"].iloc[1] == pytest.approx(2 * df["efficiency"].iloc[1])
    for n in (1, 2):
        rec = json.loads((tmp_path / f"scaling-n{n}.json").read_text())
        r = rec["results"]
        assert rec["method"] == "scaling" and rec["method_version"] == 1
        assert r["world_size"] == n and r["launcher"] == "torchrun" and r["nodes"] == 1
        assert len(r["step_s_per_rank"]) == n and r["step_s"] == max(r["step_s_per_rank"])
        if r["device_kind"] == "cpu":
            assert r["backend"] == "gloo" and r["omp_num_threads"] == 1
    again = scaling.load_stage_records(tmp_path)
    assert again["efficiency"].tolist() == pytest.approx(df["efficiency"].tolist())


# ---------------------------------------------------------------------------- the Slurm template
def test_sbatch_launches_one_torchrun_per_node(tmp_path):
    """Run the job script with stand-ins for srun, scontrol and python: what it would start on a
    2-node allocation of 8 GPUs each (bash -n and the documented commands are checked on the way)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "srun.args"
    stubs = {"scontrol": "#!/bin/bash\nprintf 'gpu007\\ngpu008\\n'\n",
             "srun": f"#!/bin/bash\nprintf '%s\\n' \"$@\" > {calls}\n",
             "fakepython": "#!/bin/bash\nexit 0\n"}
    for name, text in stubs.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHON": "fakepython", "RESULTS": str(tmp_path / "res"),
           "SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS_ON_NODE": "8", "SLURM_JOB_NODELIST": "gpu[007-008]",
           "SLURM_JOB_ID": "77", "STEPS": "12"}
    r = subprocess.run(["bash", str(SBATCH)], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    args = calls.read_text().split("\n")
    assert "--nodes=2" in args and "--ntasks-per-node=1" in args          # one torchrun per node
    for want in ("--nnodes=2", "--nproc_per_node=8", "--rdzv_backend=c10d", "--rdzv_endpoint=gpu007:29500",
                 "--rdzv_id=preflight-77", "preflight.bench.scaling", str(tmp_path / "res"), "12"):
        assert want in args, want
    assert "scaling-n16.json" in r.stdout
    assert "--nodes=64 --gpus-per-node=8" in SBATCH.read_text()           # the 512-GPU stage is documented
