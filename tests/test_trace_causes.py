"""The right cause for each idle microsecond: small hand-built Kineto traces whose answers are known, one
per wrong verdict of issue 42 (each failed on the reader before it), with healthy negatives beside them."""
import json
from types import SimpleNamespace

import pytest

from conftest import REPO
from preflight.chapters import traces as T
from preflight.diagnose.trace_file import TraceError
from preflight.diagnose.trace_kernels import collective_type, kernel_class, op_flops
from test_traces import Trace, three_steps

AR = {"Collective name": "allreduce", "Process Group Name": "0", "Group size": 2, "In msg nelems": 1000,
      "dtype": "Float"}


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFLIGHT_CACHE", str(tmp_path / "cache"))


def audit(folder, **kw):
    a = T.audit_traces(folder, jobs=1, **kw)
    return a, {f.id: f for f in T.findings(a)}


# --- a late peer is waiting, not exposed transfer --------------------------------------------------------

def _late_peer(tmp_path):
    for r, dur in ((0, 1000), (1, 200)):                 # rank 1 arrives last: its copy is the transfer alone
        t = Trace(rank=r).step(1, 0, 2000).step(2, 2000, 2000).step(3, 4000, 1000)
        t.kernel("sm90_xmma_gemm_bf16", 100, 300)
        t.kernel("ncclDevKernel_Generic", 500, dur, stream=20, Seq=0, **AR)
        t.kernel("sm90_xmma_gemm_bf16", 2100, 300)
        t.write(tmp_path / f"rank{r}.json")
    return tmp_path


def test_waiting_for_a_late_peer_is_not_exposed_communication(tmp_path):
    a, f = audit(_late_peer(tmp_path))
    v = a["ranks"][0]
    span = 2400 - 100
    assert v["exposed_comm"] == pytest.approx(200 / span)          # the transfer's part only
    assert v["exposed_wait"] == pytest.approx(800 / span) and v["wait_share"] == pytest.approx(800 / span)
    assert v["exposed_comm_total"] == pytest.approx(1000 / span)  # HTA's definition, kept beside it
    assert v["step_terms"]["collective_wait_ms"] == pytest.approx(0.8 / 2)
    assert v["step_terms"]["exposed_comm_ms_by_type"]["all_reduce"] == pytest.approx(0.2 / 2)
    assert "waiting for a late peer" in f["communication/trace_exposed_comm"].message
    assert f["load_balance/trace_collective_wait"].verdict == "fail"


def test_collective_wait_is_always_in_the_findings(tmp_path):
    for r in (0, 1):
        three_steps(rank=r).write(tmp_path / f"rank{r}.json")       # two ranks, no collective at all
    a, f = audit(tmp_path)
    w = f["load_balance/trace_collective_wait"]
    assert w.verdict == "info" and "no collective was found on two ranks" in w.message


# --- launch-bound: the GPU waits on kernel launches ------------------------------------------------------

def test_tiny_kernels_are_launch_bound_not_queued(tmp_path):
    t = Trace(rank=0, world=1).step(1, 0, 1200).step(2, 1200, 1200).step(3, 2400, 100)
    for k in range(400):                                # 2 us kernels every 6 us, each launched 5 us ahead
        t.kernel("vectorized_elementwise_kernel", 10 + 6 * k, 2)
    t.write(tmp_path / "rank0.json")
    a, f = audit(tmp_path)
    v = a["ranks"][0]
    assert v["idle_launch"] == pytest.approx(4 * 399 / (6 * 399 + 2)) and v["idle_other"] == 0
    lb = f["baseline/trace_launch_bound"]
    assert lb.verdict == "fail" and "200 kernels per step, median kernel 2 us" in lb.message
    assert "CUDA graphs" in lb.fix and f["baseline/trace_gpu_idle"].fix.startswith("Launch-bound")


def test_large_kernels_are_not_launch_bound(tmp_path):
    three_steps(rank=0, world=1).write(tmp_path / "rank0.json")
    _, f = audit(tmp_path)
    assert f["baseline/trace_launch_bound"].verdict == "pass" and f["baseline/trace_launch_bound"].value == 0


# --- blocking copies are synchronising calls ---------------------------------------------------------------

def _runtime(t, name, ts, dur=5):
    t.corr += 1
    t.ev.append({"ph": "X", "cat": "cuda_runtime", "name": name, "ts": t.base + ts, "dur": dur, "pid": 1, "tid": 1,
                 "args": {"correlation": t.corr}})


def test_blocking_device_to_host_copies_count_as_synchronising(tmp_path):
    t = three_steps(rank=0, world=1)
    t.kernel("Memcpy DtoH (Device -> Pageable)", 520, 3, cat="gpu_memcpy", bytes=4)     # .item(): cudaMemcpyAsync
    _runtime(t, "hipMemcpyWithStream", 700)
    _runtime(t, "cudaMemcpy", 1700)
    t.write(tmp_path / "rank0.json")
    a, f = audit(tmp_path)
    assert a["ranks"][0]["sync_calls"] == {"Memcpy DtoH (Device -> Pageable)": 1, "hipMemcpyWithStream": 1,
                                           "cudaMemcpy": 1}
    assert f["data_pipeline/trace_sync_per_step"].value == 1.5


def test_the_real_two_rank_traces_show_their_blocking_copies():
    a, f = audit(REPO / "data/traces/example")
    assert a["ranks"][0]["sync_calls"].get("Memcpy DtoH (Device -> Pageable)", 0) > 0


# --- ranks matched by step; another run refused ------------------------------------------------------------

def _shifted_windows(tmp_path):
    for r, first in ((0, 1), (1, 2)):                   # rank 1's profiler window starts one step later
        t = Trace(rank=r)
        for k in range(first, first + 4):
            t.step(k, (k - 1) * 1000, 1000)
        for k in range(first, first + 3):
            t.kernel("sm90_xmma_gemm_bf16", (k - 1) * 1000 + 100, 150)
            t.kernel("ncclDevKernel_Generic", (k - 1) * 1000 + 300, 100 * k, stream=20, **AR)   # no Seq: by order
        t.write(tmp_path / f"rank{r}.json")
    return tmp_path


def test_windows_one_step_apart_are_matched_by_step(tmp_path):
    a, f = audit(_shifted_windows(tmp_path))
    w = a["cross"]["wait"]
    assert w["matched"] == 2 and w["wait_ns"] == {0: 0, 1: 0} and w["last"] == {0: 0, 1: 0}
    assert a["cross"]["aligned_steps"] == [2, 3]
    assert any("do not align" in n for n in a["notes"]) and f["load_balance/trace_collective_wait"].verdict == "pass"


def test_a_rank_from_another_run_is_refused(tmp_path):
    three_steps(rank=0).write(tmp_path / "rank0.json")
    three_steps(rank=1, base=1_700_000_000_000_000 + 10 * 86400 * 10**6).write(tmp_path / "rank1.json")
    with pytest.raises(TraceError, match="10.0 days apart"):
        T.audit_traces(tmp_path, jobs=1)


def test_ranks_running_other_kernels_are_refused(tmp_path):
    for r in (0, 1):
        t = three_steps(rank=r)
        for i in range(8):
            t.kernel(f"kernel_of_program_{r}_{i}", 800 + i, 1)
        t.ev = [e for e in t.ev if e["name"] not in ("sm90_xmma_gemm_bf16", "vectorized_elementwise_kernel")]
        t.write(tmp_path / f"rank{r}.json")
    with pytest.raises(TraceError, match="share no kernel name"):
        T.audit_traces(tmp_path, jobs=1)


def test_step_spread_is_robust_to_a_long_first_step(tmp_path):
    for r in (0, 1):
        t = Trace(rank=r)
        t.step(1, -6000 if r == 0 else 0, 7000 if r == 0 else 1000)   # rank 0 began 6 ms before the first sync
        for k in (2, 3, 4):
            t.step(k, (k - 1) * 1000, 1000)
        for k in (1, 2, 3):
            t.kernel("sm90_xmma_gemm_bf16", (k - 1) * 1000 + 100, 400)
        t.write(tmp_path / f"rank{r}.json")
    a, f = audit(tmp_path)
    assert f["load_balance/trace_step_spread"].value == 0 and f["load_balance/trace_step_spread"].verdict == "pass"


# --- a collective is what its launching annotation says ----------------------------------------------------

def test_send_recv_kernels_under_an_all_reduce_annotation_are_an_all_reduce(tmp_path):
    for r, dur in ((0, 300), (1, 100)):
        t = three_steps(rank=r)
        t.cpu("record_param_comms", 480, 50, **{"Collective name": "allreduce", "Process Group Name": "0",
                                                "Group size": 2})
        t.cpu("nccl:all_reduce", 490, 30, cat="user_annotation", **{"Input Dims": [[1000]], "Input type": ["float"]})
        t.kernel("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", 505, dur, stream=20)     # launched at 500
        t.write(tmp_path / f"rank{r}.json")
    a, f = audit(tmp_path)
    v = a["ranks"][0]
    assert list(v["collectives"]) == ["all_reduce"] and v["collectives"]["all_reduce"]["group"] == 2
    assert v["collectives"]["all_reduce"]["bytes"] == 4000 and not v["send_recv"]
    assert a["cross"]["wait"]["matched"] == 1 and a["cross"]["wait"]["last"][1] == 1


def test_the_embedded_example_has_no_send_recv():
    a, _ = audit(REPO / "data/traces/example")
    assert set(a["ranks"][0]["collectives"]) == {"all_to_all", "all_reduce", "all_gather"}


# --- MFU's chip, the one-step window, CPU-only traces, small pageable copies --------------------------------

def _with_shapes(tmp_path, devices=()):
    t = three_steps(rank=0, world=1, devices=devices)
    t.cpu("aten::mm", 90, 20, **{"Input Dims": [[4096, 4096], [4096, 4096]], "Input type": ["c10::BFloat16"] * 2})
    t.write(tmp_path / "rank0.json")
    return tmp_path


def test_mfu_is_judged_only_against_the_traces_chip_or_gpu(tmp_path):
    a, f = audit(_with_shapes(tmp_path))
    assert a["ranks"][0]["mfu"] is None and "--gpu KEY" in f["baseline/trace_mfu"].message
    a, _ = audit(tmp_path, gpu_key="A100-SXM")
    assert a["ranks"][0]["mfu"] is not None and a["ranks"][0]["chip_source"] != "trace"


def test_the_audits_trace_section_does_not_use_the_profiles_chip(tmp_path):
    from preflight.runner.trace_section import show_traces

    added = []
    ch = SimpleNamespace(name="baseline", profile=SimpleNamespace(cluster=SimpleNamespace(gpu="H100-SXM")),
                         findings=SimpleNamespace(add=lambda **f: added.append(f)), note=print,
                         show=lambda *a: None, table=lambda *a: None)
    show_traces(ch, str(_with_shapes(tmp_path)))
    mfu = next(f for f in added if f["id"] == "baseline/trace_mfu")
    assert mfu["value"] is None and mfu["verdict"] == "info"


def test_a_one_step_window_is_a_limit(tmp_path):
    Trace(rank=0, world=1).step(1, 0, 1000).step(2, 1000, 1000).kernel("gemm", 100, 100).write(tmp_path / "rank0.json")
    a, _ = audit(tmp_path)
    assert any("one step in the window" in x for x in a["quality"][0]["limits"])


def test_cpu_only_traces_do_not_support_communication(tmp_path):
    t = Trace(rank=0, world=2, devices=()).step(1, 0, 1000).step(2, 1000, 1000).step(3, 2000, 10)
    t.cpu("gloo:all_reduce", 100, 300).cpu("gloo:all_reduce", 1100, 300)
    t.write(tmp_path / "rank0.json")
    a, _ = audit(tmp_path)
    q = a["quality"][0]
    assert "communication" not in q["supports"] and any("CPU-side collectives only" in x for x in q["limits"])


@pytest.mark.parametrize("nbytes,verdict", [(8 * 1024, "pass"), (4 * 1024 * 1024, "warn")])
def test_a_small_pageable_copy_does_not_warn(tmp_path, nbytes, verdict):
    t = three_steps(rank=0, world=1)
    t.kernel("Memcpy HtoD (Pageable -> Device)", 50, 2, cat="gpu_memcpy", bytes=nbytes)
    t.write(tmp_path / "rank0.json")
    _, f = audit(tmp_path)
    assert f["data_pipeline/trace_pageable_h2d"].verdict == verdict and f["data_pipeline/trace_pageable_h2d"].value == 1


# --- coverage: fp8, grouped GEMMs, Transformer Engine, DeepEP / NVSHMEM -------------------------------------

def test_flops_of_fp8_grouped_and_transformer_engine_gemms():
    assert op_flops("aten::_scaled_mm", [[64, 128], [128, 32], [], []]) == 2 * 64 * 128 * 32
    assert op_flops("aten::_grouped_mm", [[512, 128], [8, 128, 256], [8]]) == 2 * 512 * 128 * 256   # MoE experts
    assert op_flops("aten::_grouped_mm", [[8, 64, 128], [8, 128, 256]]) == 2 * 8 * 64 * 128 * 256
    # te_gemm_ts(A [N, K] (weight), scale_inv, ..., B [M, K], ..., D [M, N], ...): K from the three shapes
    assert op_flops("tex_ts::te_gemm_ts", [[256, 128], [1], [], [], [], [64, 128], [1], [], [], [], [64, 256]]) == \
        2 * 64 * 256 * 128
    assert op_flops("tex_ts::te_gemm_ts", [[3, 5], [7, 11], [13, 17]]) is None           # shapes of no GEMM
    from preflight.diagnose.trace_kernels import short_dtype
    assert short_dtype("c10::Float8_e4m3fn") == "fp8"


def test_deepep_and_nvshmem_kernels_are_communication():
    assert kernel_class("void deep_ep::intranode::dispatch<8, 768>(int4*, float*)") == "comm"
    assert collective_type("void deep_ep::internode::combine<true>(...)") == "all_to_all"
    assert kernel_class("nvshmemi_proxy_kernel") == "comm"


def test_the_quality_table_says_what_share_of_matmul_time_has_flops(tmp_path):
    t = three_steps(rank=0, world=1)
    t.cpu("aten::mm", 90, 20, **{"Input Dims": [[4096, 4096], [4096, 4096]], "Input type": ["c10::BFloat16"] * 2})
    t.kernel("triton_tem_fused_mm_0", 1100, 400, launch=1050)          # a Triton template: no op, no shapes
    t.write(tmp_path / "rank0.json")
    a, f = audit(tmp_path)
    q = a["quality"][0]
    assert q["flops_countable_share"] == pytest.approx(400 / 1200)      # 1 of the 3 matmul kernels (400 us each)
    assert any("FLOPs countable for 33%" in x for x in q["limits"])


# --- the critical path ----------------------------------------------------------------------------------------

def test_critical_path_of_a_compute_bound_window(tmp_path):
    t = Trace(rank=0, world=1).step(1, 0, 1000).step(2, 1000, 1000).step(3, 2000, 10)
    for k in range(10):                                 # queued at once, back to back on one stream
        t.kernel("sm90_xmma_gemm_bf16", 50 + 150 * k, 150, launch=10 + k)
    t.write(tmp_path / "rank0.json")
    a, f = audit(tmp_path)
    c = a["ranks"][0]["critical"]
    assert c["bound"] == "compute" and c["shares"]["compute"] > 0.9 and c["chain"][0]["name"] == "sm90_xmma_gemm_bf16"
    assert f["baseline/trace_critical_path"].verdict == "pass"


def test_critical_path_of_a_cpu_bound_window(tmp_path):
    t = Trace(rank=0, world=1).step(1, 0, 1000).step(2, 1000, 1000).step(3, 2000, 10)
    for k in range(10):                                 # each launched long after the last one finished
        t.kernel("vectorized_elementwise_kernel", 100 + 180 * k, 10, launch=95 + 180 * k)
    t.write(tmp_path / "rank0.json")
    a, f = audit(tmp_path)
    c = a["ranks"][0]["critical"]
    assert c["bound"] == "cpu" and c["shares"]["cpu"] > 0.8
    assert f["baseline/trace_critical_path"].verdict == "warn" and "cpu-bound" in f["baseline/trace_critical_path"].message


def test_critical_path_through_a_late_peer(tmp_path):
    for r, dur in ((0, 1000), (1, 200)):
        t = Trace(rank=r).step(1, 0, 2000).step(2, 2000, 2000).step(3, 4000, 10)
        t.kernel("sm90_xmma_gemm_bf16", 100, 300)
        t.kernel("ncclDevKernel_Generic", 500, dur, stream=7, Seq=0, **AR)     # on the compute stream
        t.kernel("sm90_xmma_gemm_bf16", 500 + dur, 300, launch=450)           # queued behind it
        t.write(tmp_path / f"rank{r}.json")
    a, f = audit(tmp_path)
    c = a["ranks"][0]["critical"]
    assert c["bound"] == "communication" and c["shares"]["wait"] == pytest.approx(800 / c["total_ms"] / 1e3)
    cp = f["baseline/trace_critical_path"]
    assert cp.verdict == "warn" and "load_balance/trace_collective_wait" in cp.fix
    assert a["ranks"][1]["critical"]["shares"]["wait"] == 0 and "trace_critical_path" in json.dumps(T.IDS)


def test_a_gpu_busy_job_launched_just_in_time_is_not_called_cpu_bound(tmp_path):
    t = Trace(rank=0, world=1).step(1, 0, 5000).step(2, 5000, 5000).step(3, 10000, 10)
    for k in range(9):                                  # 1 ms kernels, each launched 3 us after the last one ended
        t.kernel("sm90_xmma_gemm_bf16", 10 + 1005 * k, 1000, launch=10 + 1005 * k - 2)
    t.write(tmp_path / "rank0.json")
    a, f = audit(tmp_path)
    c = a["ranks"][0]["critical"]
    assert c["shares"]["cpu"] > 0.5 and c["bound"] == "compute" and "just in time" in c["note"]
    assert f["baseline/trace_critical_path"].verdict == "pass"
