"""The trace audit (``python -m preflight traces DIR``): small synthetic Kineto traces for each rule and
edge case, the bad inputs (exit 2, nothing written), and real traces recorded here on 2 gloo ranks with
a delayed rank and a sleeping loader (``tests/data/traces/traced_job.py``)."""
import gzip
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO
from preflight.chapters import traces as T
from preflight.diagnose.intervals import union
from preflight.diagnose.trace_file import read_trace
from preflight.diagnose.trace_job import read_job
from preflight.diagnose.trace_kernels import collective_type, kernel_class, op_flops
from preflight.diagnose.trace_rank import summarize

PY = sys.executable
H100 = "NVIDIA H100 80GB HBM3"


# --- a tiny Kineto trace builder -------------------------------------------------------------------------

class Trace:
    """Events in microseconds, as Kineto writes them; ``base`` makes the times epoch-sized."""

    def __init__(self, rank=0, world=2, devices=(H100,), base=1_700_000_000_000_000):
        self.rank, self.world, self.devices, self.base, self.ev, self.corr = rank, world, devices, base, [], 100

    def step(self, n, ts, dur):
        self.ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "ts": self.base + ts,
                        "dur": dur, "pid": 1, "tid": 1})
        return self

    def kernel(self, name, ts, dur, launch=None, stream=7, cat="kernel", **args):
        self.corr += 1
        self.ev.append({"ph": "X", "cat": cat, "name": name, "ts": self.base + ts, "dur": dur, "pid": 0, "tid": stream,
                        "args": {"stream": stream, "correlation": self.corr, "device": 0, **args}})
        lt = ts - 5 if launch is None else launch
        self.ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": self.base + lt, "dur": 2,
                        "pid": 1, "tid": 1, "args": {"correlation": self.corr}})
        return self

    def cpu(self, name, ts, dur, cat="cpu_op", **args):
        self.ev.append({"ph": "X", "cat": cat, "name": name, "ts": self.base + ts, "dur": dur, "pid": 1, "tid": 1,
                        "args": args})
        return self

    def doc(self):
        d = {"schemaVersion": 1, "traceEvents": self.ev + [{"ph": "M", "name": "process_name", "pid": 0}],
             "deviceProperties": [{"id": 0, "name": n} for n in self.devices]}
        if self.rank is not None:
            d["distributedInfo"] = {"backend": "nccl", "rank": self.rank, "world_size": self.world}
        return d

    def write(self, path):
        data = json.dumps(self.doc()).encode()
        path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
        return path


def three_steps(rank=0, **kw):
    """Steps 1-3 of 1000 us; a kernel in each step; the last step's kernel is outside the window."""
    t = Trace(rank=rank, **kw).step(1, 0, 1000).step(2, 1000, 1000).step(3, 2000, 1000)
    t.kernel("sm90_xmma_gemm_bf16", 100, 400).kernel("vectorized_elementwise_kernel", 600, 100)
    t.kernel("sm90_xmma_gemm_bf16", 1100, 400).kernel("vectorized_elementwise_kernel", 1600, 100)
    t.kernel("sm90_xmma_gemm_bf16", 2100, 400)                       # launched in the last step: out
    return t


def summary_of(t, tmp_path, name="rank0.json"):
    return summarize(read_trace(t.write(tmp_path / name)))


# --- one rank ---------------------------------------------------------------------------------------------

def test_window_drops_the_last_step_and_what_it_launched(tmp_path):
    s = summary_of(three_steps(), tmp_path)
    assert s["window"]["steps"] == 2 and s["window"]["gpu_events"] == 4
    g = s["gpu"]
    assert g["span_ns"] == (1700 - 100) * 1000                    # first start to last end, in ns
    assert g["busy_ns"] == 1000 * 1000 and g["idle_ns"] == 600 * 1000
    assert g["classes"]["matmul"]["count"] == 2 and g["classes"]["memory"]["ns"] == 200 * 1000


def test_a_kernel_launched_in_the_window_counts_even_if_it_runs_past_it(tmp_path):
    t = three_steps()
    t.kernel("sm90_xmma_gemm_bf16", 1950, 300, launch=1900)        # launched in step 2, ends in step 3
    s = summary_of(t, tmp_path)
    assert s["window"]["gpu_events"] == 5 and s["gpu"]["span_ns"] == (2250 - 100) * 1000


def test_one_step_or_none_takes_every_gpu_event(tmp_path):
    t = Trace().step(1, 0, 1000).kernel("gemm", 100, 100).kernel("gemm", 5000, 100)
    s = summary_of(t, tmp_path)
    assert s["window"]["gpu_events"] == 2 and "one step" in s["window"]["basis"]


def test_nanoseconds_are_not_rounded_away(tmp_path):
    """Epoch-sized microsecond times with three decimals: a float64 would keep about 0.25 us."""
    t = Trace(base=0)
    for frac in ("131.125", "131.750"):
        t.corr += 1
        t.ev.append({"ph": "X", "cat": "kernel", "name": "gemm", "ts": f"@{frac}", "dur": 0.5,
                     "args": {"stream": 7, "correlation": t.corr}})
    raw = json.dumps(t.doc())
    for frac in ("131.125", "131.750"):                       # write the times as Kineto does: bare numbers
        raw = raw.replace(f'"@{frac}"', f"1712195495521{frac}")
    path = tmp_path / "rank0.json"
    path.write_text(raw)
    ev = read_trace(path)
    assert ev.gpu["ts"].tolist() == [1712195495521131125, 1712195495521131750]
    g = summarize(ev)["gpu"]
    assert g["span_ns"] == 1125 and g["idle_ns"] == 125        # 0.125 us of idle, exactly


def test_idle_split_host_bound_versus_queued(tmp_path):
    t = Trace().kernel("gemm", 0, 100)
    t.kernel("gemm", 300, 100, launch=250)             # launched after the GPU went idle (at 100): host-bound
    t.kernel("gemm", 600, 100, launch=350)             # queued while the previous one ran: waited on something else
    g = summary_of(t, tmp_path)["gpu"]
    assert g["idle_host_ns"] == 200_000 and g["idle_other_ns"] == 200_000


def test_overlap_exposed_and_collectives_on_the_compute_stream(tmp_path):
    t = Trace().kernel("sm90_xmma_gemm_bf16", 0, 1000)
    t.kernel("ncclDevKernel_Generic_4", 500, 1000, stream=20, **{"Collective name": "allreduce", "In msg nelems": 1 << 20,
                                                                "dtype": "BFloat16", "Group size": 8})
    t.kernel("ncclKernel_AllReduce_RING_LL_Sum_bfloat16", 1600, 100, stream=7)   # on the compute stream
    s = summary_of(t, tmp_path)
    g = s["gpu"]
    assert g["comm_ns"] == 1100_000 and g["overlap_ns"] == 500_000
    by = s["comm"]["by_type"]["all_reduce"]
    assert by["count"] == 2 and by["on_compute_stream"] == 1 and by["bytes"] == 2 << 20
    a = {"folder": "x", "world_size": 2, "missing": [], "unreadable": [], "notes": [], "cross": {}, "quality": [],
         "ranks": {0: __import__("preflight.diagnose.trace_analysis", fromlist=["rank_view"]).rank_view(s)}}
    f = {x.id: x for x in T.communication(a)}
    assert f["communication/trace_comm_overlap"].value == pytest.approx(5 / 11)
    assert f["communication/trace_comm_overlap"].verdict == "fail"
    assert "ran on the compute stream" in f["communication/trace_comm_overlap"].message
    assert f["communication/trace_exposed_comm"].value == pytest.approx(0.6 / 1.7)


def test_pageable_and_pinned_copies_and_sync_calls(tmp_path):
    t = three_steps()
    t.kernel("Memcpy HtoD (Pageable -> Device)", 800, 10, cat="gpu_memcpy", bytes=4096)
    t.kernel("Memcpy HtoD (Pinned -> Device)", 820, 10, cat="gpu_memcpy", bytes=1 << 20)
    for ts in (900, 1900, 2900):                             # the last one is in the dropped step
        t.cpu("cudaStreamSynchronize", ts, 5, cat="cuda_runtime", correlation=1)
    s = summary_of(t, tmp_path)
    assert s["data"]["h2d"]["pageable"] == {"count": 1, "bytes": 4096, "ns": 10_000}
    assert s["data"]["h2d"]["pinned"]["bytes"] == 1 << 20
    assert s["data"]["sync_calls"] == {"cudaStreamSynchronize": 2}
    assert kernel_class("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy") == "copy"


def test_flops_from_recorded_shapes_give_mfu_against_the_chips_peak(tmp_path):
    t = three_steps()
    t.cpu("aten::mm", 150, 10, **{"Input Dims": [[4096, 4096], [4096, 4096]], "Input type": ["c10::BFloat16"] * 2})
    t.cpu("aten::linear", 150, 10, **{"Input Dims": [[4096, 4096], [4096, 4096]]})     # not a leaf: not counted
    t.cpu("aten::mm", 2150, 10, **{"Input Dims": [[4096, 4096], [4096, 4096]]})           # the dropped step
    s = summary_of(t, tmp_path)
    assert s["flops"]["total"] == 2 * 4096 ** 3 and s["flops"]["by_peak_dtype"] == {"bf16": 2 * 4096 ** 3}
    from preflight.diagnose.trace_analysis import rank_view

    v = rank_view(s)
    assert v["chip"] == "H100-SXM" and v["peak_dtype"] == "bf16"
    assert v["tflops"] == pytest.approx(2 * 4096 ** 3 / 1.6e-3 / 1e12)
    assert v["mfu"] == pytest.approx(v["tflops"] / 989.5)
    assert rank_view(s, gpu_key="A100-SXM")["chip"] == "H100-SXM"        # the trace's own device first
    s["meta"]["devices"] = []
    assert rank_view(s, gpu_key="A100-SXM")["peak_tflops"] == 312.0       # --gpu where the trace names none


def test_op_flops_follow_torch_flop_counter():
    from torch.utils.flop_counter import conv_flop_count, sdpa_backward_flop_count, sdpa_flop_count

    q, k = [2, 8, 128, 64], [2, 8, 256, 64]
    assert op_flops("aten::_scaled_dot_product_flash_attention", [q, k, k]) == sdpa_flop_count(q, k, k)
    assert op_flops("aten::_scaled_dot_product_flash_attention_backward", [q, q, k, k]) == \
        sdpa_backward_flop_count(q, q, k, k)
    x, w = [8, 3, 32, 32], [16, 3, 3, 3]
    got = op_flops("aten::convolution", [x, w, [16]], [None, None, None, "[1, 1]", "[1, 1]", "[1, 1]"])
    assert got == conv_flop_count(x, w, [8, 16, 32, 32])
    assert op_flops("aten::convolution", [x, w]) is None         # no stride/padding recorded: not guessed


def test_kernel_names_of_today():
    assert kernel_class("ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)") == "comm"
    assert kernel_class("void rccl::ncclKernel_AllReduce_RING") == "comm"
    assert kernel_class("nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNT") == "matmul"
    assert kernel_class("triton_tem_fused_mm_0") == "matmul"
    assert kernel_class("triton_poi_fused_add_mul_0") == "memory"
    assert kernel_class("Cijk_Alik_Bljk_HHS_BH_MT128x128x32") == "matmul"
    assert kernel_class("flash_fwd_kernel<Flash_fwd_kernel_traits>") == "matmul"
    assert kernel_class("void at::native::vectorized_elementwise_kernel<4>") == "memory"
    assert collective_type("ncclKernel_AllGather_RING_LL_Sum_int8_t") == "all_gather"
    assert collective_type("ncclDevKernel_Generic_4") == "unknown"
    assert collective_type("gloo:all_reduce") == "all_reduce"


def test_union_merges_overlaps():
    import numpy as np

    s, e = union(np.array([5, 0, 2, 20]), np.array([8, 3, 4, 30]))
    assert s.tolist() == [0, 5, 20] and e.tolist() == [4, 8, 30]


# --- across ranks -----------------------------------------------------------------------------------------

def _ranks_with_a_late_one(tmp_path, late=1, n=3, seq=True, world=None):
    tmp_path.mkdir(exist_ok=True)
    for r in range(n):
        t = three_steps(rank=r, world=world or n)
        for i, ts in enumerate((300, 1300)):
            dur = 100 if r == late else 400                     # the late rank's copy is the shortest
            args = {"Collective name": "allreduce", "Process Group Name": "0", "Group size": n,
                    "In msg nelems": 1000, "dtype": "Float"} | ({"Seq": i} if seq else {})
            t.kernel("ncclDevKernel_Generic", ts, dur, stream=20, **args)
        t.kernel("ncclKernel_SendRecv", 1400, 50 * (r + 1), stream=21)   # p2p: never matched
        t.write(tmp_path / f"trace_rank{r}.json.gz")
    return tmp_path


@pytest.mark.parametrize("seq", [True, False])
def test_collective_wait_names_the_rank_that_arrives_last(tmp_path, seq):
    a = T.audit_traces(_ranks_with_a_late_one(tmp_path, seq=seq), jobs=1)
    w = a["cross"]["wait"]
    assert w["matched"] == 2 and w["last"] == {0: 0, 1: 2, 2: 0}
    assert w["wait_ns"] == {0: 600_000, 1: 0, 2: 600_000}
    f = {x.id: x for x in T.load_balance(a)}["load_balance/trace_collective_wait"]
    assert "rank 1 arrived last at 2 of 2" in f.message and "rank 1" in f.fix
    assert f.per_rank["1"] == 0 and f.value == pytest.approx(0.6 / 1.6)


def test_the_same_rank_in_two_files_of_different_steps_is_summed(tmp_path):
    three_steps(rank=0, world=1).write(tmp_path / "a.json")
    t = Trace(rank=0, world=1).step(4, 3000, 1000).step(5, 4000, 1000).kernel("gemm", 3100, 100)
    t.write(tmp_path / "b.json")
    job = read_job(tmp_path, jobs=1)
    assert list(job["ranks"]) == [0] and job["ranks"][0]["window"]["steps"] == 3
    assert "2 files of successive steps" in job["notes"][0]


# --- the command: bad input exits 2 and writes nothing ------------------------------------------------------

def cli(*args, cwd=None, env=None):
    return subprocess.run([PY, "-m", "preflight", "traces", *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env={**os.environ, **(env or {})})


def _bad_cases(tmp_path):
    good = three_steps(rank=0, world=2).doc()
    cases = {}
    d = tmp_path / "truncated"
    d.mkdir()
    (d / "rank0.json.gz").write_bytes(gzip.compress(json.dumps(good).encode())[:300])
    cases["truncated"] = (d, "not a readable gzip")
    d = tmp_path / "notjson"
    d.mkdir()
    (d / "rank0.json").write_text("{ this is not json")
    cases["notjson"] = (d, "not JSON")
    d = tmp_path / "noevents"
    d.mkdir()
    (d / "rank0.json").write_text(json.dumps({"schemaVersion": 1, "events": []}))
    cases["noevents"] = (d, "without a 'traceEvents'")
    d = tmp_path / "twojobs"
    d.mkdir()
    three_steps(rank=0, world=2).write(d / "rank0.json")
    three_steps(rank=1, world=4).write(d / "rank1.json")
    cases["twojobs"] = (d, "different jobs")
    d = tmp_path / "twice"
    d.mkdir()
    three_steps(rank=0, world=2).write(d / "a.json")
    three_steps(rank=0, world=2).write(d / "b.json")
    cases["twice"] = (d, "rank 0 twice")
    d = tmp_path / "empty"
    d.mkdir()
    cases["empty"] = (d, "no trace in it")
    cases["missing"] = (tmp_path / "nowhere", "no such folder")
    d = tmp_path / "norank"
    d.mkdir()
    three_steps(rank=None).write(d / "worker_a.json")
    three_steps(rank=None).write(d / "worker_b.json")
    cases["norank"] = (d, "which rank is it?")
    return cases


def test_bad_input_exits_2_naming_the_file(tmp_path):
    for name, (d, words) in _bad_cases(tmp_path).items():
        before = sorted(p.name for p in d.rglob("*")) if d.exists() else None
        r = cli(d)
        assert r.returncode == 2, (name, r.stderr)
        assert words in r.stderr and r.stdout == "", (name, r.stderr)
        assert (sorted(p.name for p in d.rglob("*")) if d.exists() else None) == before, name


def test_bad_options_exit_2(tmp_path):
    r = cli(tmp_path, "--gpu", "H300")
    assert r.returncode == 2 and "not in the hardware table" in r.stderr
    r = cli("--summarize", tmp_path / "nope.json", "--out", tmp_path / "o")
    assert r.returncode == 2 and "no such file" in r.stderr and not (tmp_path / "o").exists()
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    r = cli("--summarize", bad, "--out", tmp_path / "o")
    assert r.returncode == 2 and "not JSON" in r.stderr and not (tmp_path / "o").exists()


def test_one_unreadable_rank_is_named_and_the_others_judged(tmp_path):
    _ranks_with_a_late_one(tmp_path, world=4)
    (tmp_path / "trace_rank3.json.gz").write_bytes(b"\x1f\x8b\x08\x00broken")
    r = cli(tmp_path, "--json", env={"PREFLIGHT_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["ranks_read"] == [0, 1, 2] and out["unreadable"][0]["file"] == "trace_rank3.json.gz"
    assert any("trace_rank3" in q["file"] and q["limits"] for q in out["quality"])
    f = {x["id"]: x for x in out["findings"]}
    assert "1 of 4 ranks missing; 1 file(s) unreadable" in f["load_balance/trace_collective_wait"]["source"]
    assert out["missing"] == [3]
    assert "rank 1 arrived last" in f["load_balance/trace_collective_wait"]["message"]


def test_fail_on_gates_and_summaries_read_like_traces(tmp_path):
    src = _ranks_with_a_late_one(tmp_path / "traces")
    env = {"PREFLIGHT_CACHE": str(tmp_path / "cache")}
    r = cli(src, "--fail-on", "fail", env=env)
    assert r.returncode == 1 and "load_balance/trace_collective_wait" in r.stdout
    for p in sorted(src.iterdir()):                   # what one Slurm task per node does where the traces are
        r = cli("--summarize", p, "--out", tmp_path / "summaries", env=env)
        assert r.returncode == 0, r.stderr
    a = json.loads(cli(src, "--json", env=env).stdout)
    b = json.loads(cli(tmp_path / "summaries", "--json", env=env).stdout)
    strip = (lambda fs: [{k: v for k, v in f.items() if k != "source"} for f in fs])
    assert strip(a["findings"]) == strip(b["findings"])


def test_a_second_read_comes_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFLIGHT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "job").mkdir()
    three_steps().write(tmp_path / "job" / "rank0.json")
    first = read_job(tmp_path / "job", jobs=1)
    import preflight.diagnose.trace_job as J

    monkeypatch.setattr(J, "read_trace", lambda p: (_ for _ in ()).throw(AssertionError("read again")))
    assert read_job(tmp_path / "job", jobs=1)["ranks"][0]["gpu"] == first["ranks"][0]["gpu"]


# --- real traces, recorded here --------------------------------------------------------------------------

@pytest.mark.slow
def test_real_two_rank_job_names_the_late_rank_and_the_slow_loader(tmp_path):
    from preflight.harness.launch import free_ports

    out = tmp_path / "traces"
    r = subprocess.run([PY, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                        "--master-port", str(free_ports(1)[0]), str(REPO / "tests/data/traces/traced_job.py"), str(out)],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "SLOW_RANK": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    r = cli(out, "--json", env={"PREFLIGHT_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    f = {x["id"]: x for x in res["findings"]}
    wait = f["load_balance/trace_collective_wait"]
    assert wait["verdict"] == "fail" and "rank 1 arrived last" in wait["message"]
    assert wait["per_rank"]["0"] > wait["per_rank"]["1"]
    loader = f["data_pipeline/trace_loader_wait"]
    assert loader["verdict"] in ("warn", "fail") and "DataLoader.__next__" in loader["message"]
    assert all(v > 0.05 for v in loader["per_rank"].values())
    assert f["baseline/trace_gpu_idle"]["verdict"] == "info"        # a CPU trace: no GPU verdict, said so
    assert res["quality"][0]["limits"][0].startswith("no GPU events")


# --- the README's commands, as written ------------------------------------------------------------------

def _readme_section() -> str:
    text = (REPO / "README.md").read_text()
    return text.split("## Your job's own traces: `traces`", 1)[1].split("\n## ", 1)[0]


def test_readme_traces_block_as_written(tmp_path):
    import re
    import shlex

    block = re.findall(r"```bash\n(.*?)```", _readme_section(), re.S)[0]
    lines = [re.sub(r"\s+#.*$", "", ln).strip() for ln in block.splitlines() if ln.strip()]
    assert len(lines) == 4
    (tmp_path / "data").symlink_to(REPO / "data")
    env = {**os.environ, "PREFLIGHT_CACHE": str(tmp_path / "cache")}
    codes = []
    for ln in lines:
        cmd, _, redirect = ln.partition(" > ")
        argv = [PY if a == "python" else a for a in shlex.split(cmd)]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
        if redirect:
            (tmp_path / redirect.strip()).write_text(r.stdout)
        codes.append(r.returncode)
        assert r.returncode in (0, 1), (ln, r.stderr[-2000:])
    assert codes == [0, 0, 1, 0]                             # the example job fails: exposed communication
    out = json.loads((tmp_path / "traces.json").read_text())   # the --json line's output, read back
    assert out["ranks_read"] == [0, 1] and out["world_size"] == 128
    assert {f["id"] for f in out["findings"]} >= {"baseline/trace_gpu_idle", "data_pipeline/trace_pageable_h2d",
                                                  "communication/trace_comm_overlap", "communication/trace_exposed_comm"}
    summary = json.loads((tmp_path / "reports/traces-demo/findings.json").read_text())
    ids = {f["id"]: f for f in summary["findings"]}
    assert ids["communication/trace_exposed_comm"]["per_rank"].keys() == {"0", "1"}
    assert ids["communication/trace_exposed_comm"]["value"] == pytest.approx(
        next(f for f in out["findings"] if f["id"] == "communication/trace_exposed_comm")["value"])
    assert [q["file"] for q in summary["traces"]["quality"]] == ["rank-0.json.gz", "rank-1.json.gz"]
    page = (tmp_path / "reports/traces-demo/index.html").read_text()
    assert "Your job's traces" in page and "trace_timeline" in " ".join(
        p.name for p in (tmp_path / "reports/traces-demo/charts").iterdir())


def test_readme_recording_recipe_makes_traces_that_read(tmp_path, monkeypatch):
    import re

    import torch

    code = re.findall(r"```python\n(.*?)```", _readme_section(), re.S)[0]
    model = torch.nn.Linear(32, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def train_step(batch):
        model(batch).square().mean().backward()
        opt.step()
        opt.zero_grad()

    loader = torch.utils.data.DataLoader(torch.randn(64, 32), batch_size=4)
    monkeypatch.chdir(tmp_path)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                  # CUDA activity asked for on a CPU build
        exec(code, {"loader": loader, "train_step": train_step})
    r = cli(tmp_path / "traces", "--json", env={"PREFLIGHT_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["ranks"]["0"]["steps"] == 2                  # active 3, the last one left out
    assert out["quality"][0]["limits"][0].startswith("no GPU events")


def test_advise_takes_the_median_rank_mfu_of_a_trace_audit(tmp_path):
    from preflight.chapters.advisor import measured_efficiency

    rows = [{"id": "baseline/trace_mfu", "value": 0.3, "unit": "fraction", "verdict": "fail",
             "message": "1 TFLOP/s achieved over the window, 30% of ...", "per_rank": {"0": 0.3, "1": 0.5, "2": 0.4}}]
    (tmp_path / "t.json").write_text(json.dumps({"folder": "job/", "findings": rows, "quality": []}))
    eff, source = measured_efficiency(tmp_path / "t.json")
    assert eff == pytest.approx(0.4) and "median of 3 rank(s)" in source and "job/" in source
    rows[0]["per_rank"] = {"0": 0.001}
    (tmp_path / "t.json").write_text(json.dumps({"folder": "job/", "findings": rows, "quality": []}))
    with pytest.raises(ValueError, match="outside the accepted"):
        measured_efficiency(tmp_path / "t.json")


def test_compare_two_trace_audits_before_and_after_a_fix(tmp_path):
    """The late rank fixed: the wait finding passes in the second audit, and compare says so."""
    before = _ranks_with_a_late_one(tmp_path / "before")
    after = tmp_path / "after"
    after.mkdir()
    for r in range(3):
        t = three_steps(rank=r, world=3)
        for i, ts in enumerate((300, 1300)):
            t.kernel("ncclDevKernel_Generic", ts, 100, stream=20, **{"Collective name": "allreduce", "Seq": i,
                                                                      "Process Group Name": "0", "Group size": 3})
        t.write(after / f"trace_rank{r}.json.gz")
    env = {**os.environ, "PREFLIGHT_CACHE": str(tmp_path / "cache")}
    for name, d in (("before", before), ("after", after)):
        r = subprocess.run([PY, "-m", "preflight", "audit", str(REPO / "data/profiles/example.yaml"), "--plan-only",
                            "--chapters", "4", "--traces", str(d), "--out", str(tmp_path / f"rep-{name}")],
                           capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run([PY, "-m", "preflight", "compare", str(tmp_path / "rep-before"), str(tmp_path / "rep-after")],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if "load_balance/trace_collective_wait" in ln)
    assert "fail" in line and "pass" in line


def test_audit_refuses_a_bad_traces_folder_before_writing(tmp_path):
    r = subprocess.run([PY, "-m", "preflight", "audit", str(REPO / "data/profiles/example.yaml"), "--plan-only",
                        "--traces", str(tmp_path / "nowhere"), "--out", str(tmp_path / "rep")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--traces" in r.stderr and "no such folder" in r.stderr
    assert not (tmp_path / "rep").exists()


def test_a_thousand_ranks_stay_readable():
    """Charts draw the best, median and worst rank; the table holds all of them."""
    from preflight.reporting.trace_charts import pick_ranks, strip_frame

    views = {r: {"idle": (r * 37 % 1024) / 1024, "wait_share": None, "loader_share": r / 2048} for r in range(1024)}
    best, med, worst = pick_ranks({r: v["idle"] for r, v in views.items()})
    assert views[best]["idle"] == 0 and views[worst]["idle"] == max(v["idle"] for v in views.values())
    df = strip_frame(views, {"idle": "GPU idle", "wait_share": "wait", "loader_share": "loader"})
    assert len(df) == 6 and set(df["metric"]) == {"GPU idle", "loader"}
    assert df["who"].str.startswith(("best", "median", "worst")).all()
