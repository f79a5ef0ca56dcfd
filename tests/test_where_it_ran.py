"""Records say where a bench really ran; MFU uses the peak of the precision allowed; one GPU per rank."""
import gzip
import json
import subprocess
import sys

import pytest

from conftest import REPO
from preflight.core import hardware
from preflight.core.device import gpu_index, torch_fp32_precision
from preflight.core.records import Method, ran_on

GPU_BOX = {"kind": "cuda", "name": "NVIDIA H200", "count": 1, "memory_GB": 150.0, "table_key": "H200-SXM",
           "label": "NVIDIA H200 (GPU)"}


@pytest.mark.parametrize("runs_on, results, kind", [
    ("ranks", {"backend": "gloo", "rows": []}, "cpu"),                   # 2 ranks, 1 GPU: gloo on the CPU
    ("ranks", {"backend": "nccl"}, "cuda"),
    ("ranks", {"rows": [{"ranks on": "cpu"}]}, "cpu"),                    # pipeline_bubble's rows
    ("ranks", {"rows": [{"p": 2}]}, "cpu"),                               # no backend recorded: not a GPU figure
    ("cpu", {}, "cpu"),                                                   # resume, elastic: CPU processes
    ("device", {"device": "cuda:0"}, "cuda"),
    ("device", {"device": "cpu"}, "cpu"),                                 # a GPU box, a bench told --device cpu
    ("device", {}, "cuda"),                                               # the chapter's device
])
def test_ran_on_from_the_method_and_its_results(runs_on, results, kind):
    assert ran_on(Method("m", 1, runs_on=runs_on), results, GPU_BOX)["kind"] == kind


def test_a_cpu_run_on_a_gpu_machine_says_it_ran_on_the_cpu():
    rec = Method("overlap", 1, runs_on="ranks").record({}, {"backend": "gloo"}, GPU_BOX)
    where = rec["ran_on"]
    assert (where["kind"], where["backend"], where["basis"]) == ("cpu", "gloo", "the run's process group backend")
    assert "(CPU, gloo) of a NVIDIA H200 machine" in where["label"]
    assert rec["device"] == GPU_BOX         # the machine: what the audit matches against the profile's GPU
    rec = Method("ceilings", 1).record({}, {"device": "cuda:0"}, GPU_BOX)
    assert rec["device"] == GPU_BOX and rec["ran_on"]["kind"] == "cuda" and rec["ran_on"]["label"] == GPU_BOX["label"]


def test_every_bench_method_says_where_it_runs():
    """Methods measured on CPU processes whatever the machine (gloo ranks with one GPU, a loop kept
    on the CPU) must not default to the chapter's device."""
    from preflight.bench import ckptstall, elastic, overlap, pipeline, resume, scaling, workload_resume

    for m in (overlap.METHOD, pipeline.METHOD, pipeline.BUBBLES, scaling.METHOD):
        assert m.runs_on == "ranks", m.name
    for m in (resume.METHOD, elastic.METHOD, elastic.SHRINK, ckptstall.METHOD, workload_resume.METHOD,
              workload_resume.STALL):
        assert m.runs_on == "cpu", m.name


@pytest.mark.parametrize("precision, conv_tf32, has_conv, dtype", [
    ("highest", True, False, "fp32"), ("high", False, False, "tf32"), ("medium", False, False, "bf16"),
    ("highest", True, True, "tf32"),          # cuDNN convolutions run in TF32 by default
    ("highest", False, True, "fp32")])
def test_fp32_work_is_judged_against_the_peak_of_the_precision_allowed(precision, conv_tf32, has_conv, dtype):
    assert hardware.fp32_compute_dtype(precision, conv_tf32, has_conv) == dtype


def test_tf32_peak_is_the_one_an_fp32_cnn_is_read_against():
    import torch

    cnn = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU())
    got = torch_fp32_precision(cnn)
    assert got["has_conv"] and got["peak_dtype"] == ("tf32" if torch.backends.cudnn.allow_tf32 else "fp32")
    # the ~7x the issue saw: H100 SXM TF32 494.5 vs CUDA-core FP32 67 TFLOP/s
    assert hardware.peak_tflops("H100-SXM", "tf32") / hardware.peak_tflops("H100-SXM", "fp32") > 7


def test_more_ranks_than_gpus_is_refused_not_shared():
    assert gpu_index(1, 2) == 1
    with pytest.raises(RuntimeError, match=r"local rank 1 has no GPU of its own.*nproc-per-node 1"):
        gpu_index(1, 1)


@pytest.mark.slow
def test_traces_command_writes_a_kineto_trace_with_steps_and_shapes(tmp_path):
    r = subprocess.run([sys.executable, "-m", "preflight.bench.traces", "--out", tmp_path, "--quick", "--steps", "2"],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    rec = json.loads((tmp_path / "traces-reference.json").read_text())
    assert rec["method"] == "traces" and rec["ran_on"]["kind"] == "cpu" and rec["results"]["steps"] == 2
    with gzip.open(tmp_path / rec["results"]["files"][0]) as f:
        trace = json.load(f)
    names = [e.get("name", "") for e in trace["traceEvents"]]
    steps = sorted({n for n in names if n.startswith("ProfilerStep#")})
    assert len(steps) == 2                                  # wait 1, warm-up 1: the first steps are not traced
    durs = [e["dur"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#") and "dur" in e]
    mean_s = sum(durs) / len(durs) / 1e6                    # Kineto's microseconds
    assert 0.5 < mean_s / rec["results"]["step_time_s"] < 2  # the record's step time is the traced steps'
    assert any("Input Dims" in (e.get("args") or {}) for e in trace["traceEvents"])     # record_shapes
    bad = subprocess.run([sys.executable, "-m", "preflight.bench.traces", "--out", tmp_path, "--steps", "0"],
                         capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 2 and "--steps 0" in bad.stderr and "1 to 50" in bad.stderr
