"""Chapter 3 plan arithmetic against hand computations of the field report's case, and the findings."""
import pytest

from conftest import EXAMPLE
from preflight.chapters import communication as C
from preflight.findings import FindingSink
from preflight.models import comm
from preflight.profile import load_profile


def test_field_case_56_GB_and_over_2_s():
    p = C.plan(load_profile(EXAMPLE))
    # 2 x 7e9 x 1023/1024 x 4 B
    assert p["bytes_per_rank"] == pytest.approx(2 * 7e9 * 1023 / 1024 * 4)
    assert 55e9 < p["bytes_per_rank"] < 57e9
    # 2 x 1023/1024 x 28 GB / 25 GB/s + 2 x 1023 x 10 us
    assert p["flat_s"] == pytest.approx(2 * 1023 / 1024 * 28e9 / 25e9 + 2 * 1023 * 10e-6)
    assert p["flat_s"] > 2
    assert p["ratio"] == pytest.approx(p["flat_s"] / 0.8)
    assert p["efficiency_no_overlap"] == pytest.approx(0.89 / (0.89 + p["flat_s"]))
    assert p["efficiency_full_overlap"] == pytest.approx(0.89 / (0.89 + p["flat_s"] - 0.8 * 2 / 3))


def test_hierarchical_moves_one_shard_per_gpu_across_nodes():
    # 28 GB over 8 GPUs x 128 nodes: NVLink ring of 8, then a ring of 128 on 28/8 GB
    t = comm.hierarchical_allreduce_time(28e9, 8, 128, 450, 25, 5e-6, 10e-6)
    intra = 2 * 7 / 8 * 28e9 / 450e9 + 2 * 7 * 5e-6
    inter = 2 * 127 / 128 * 3.5e9 / 25e9 + 2 * 127 * 10e-6
    assert t == pytest.approx(intra + inter)
    assert comm.hierarchical_allreduce_time(28e9, 8, 1, 450, 25) == pytest.approx(2 * 7 / 8 * 28e9 / 450e9)
    p = C.plan(load_profile(EXAMPLE))
    assert p["hierarchical_s"] == pytest.approx(t)
    assert p["hierarchical_s"] < p["flat_s"] / 4


def test_plan_findings_fail_the_field_case():
    sink = FindingSink(None, "communication")
    C.add_plan_findings(sink, load_profile(EXAMPLE))
    C.add_topology_finding(sink, load_profile(EXAMPLE))
    f = {x.id: x for x in sink.findings}
    assert f["communication/comm_compute_ratio"].verdict == "fail"
    assert f["communication/efficiency_no_overlap"].verdict == "fail"
    assert f["communication/efficiency_full_overlap"].verdict == "fail"
    assert f["communication/allreduce_bytes_per_rank"].value == pytest.approx(2 * 7e9 * 1023 / 1024 * 4)
    assert f["communication/topology"].verdict == "pass"
    assert "hierarchical" in f["communication/allreduce_s"].message


def test_bf16_on_one_node_passes():
    prof = load_profile(EXAMPLE)
    small = prof.model_copy(update={
        "cluster": prof.cluster.model_copy(update={"nodes": 1}),
        "training": prof.training.model_copy(update={"grad_dtype": "bf16"}),
        "model": prof.model.model_copy(update={"params": 1e9})})
    p = C.plan(small)
    assert p["link"] == "intra-node"
    assert p["bytes_per_rank"] == pytest.approx(2 * 1e9 * 7 / 8 * 2)
    sink = FindingSink(None, "communication")
    C.add_plan_findings(sink, small)
    assert {x.id: x for x in sink.findings}["communication/comm_compute_ratio"].verdict == "pass"


def test_plan_only_measured_findings_are_info():
    sink = FindingSink(None, "communication")
    C.add_sweep_findings(sink, load_profile(EXAMPLE), None)
    C.add_overlap_findings(sink, None, None)
    assert {x.id for x in sink.findings} == {"communication/measured_busbw", "communication/alpha_beta_fit_error",
                                             "communication/overlap_saving", "communication/bf16_saving"}
    assert all(x.verdict == "info" and x.value is None for x in sink.findings)


def _measured(name):
    import json

    from conftest import REPO
    from preflight.chapter import Measured
    rec = json.loads((REPO / "tests" / "data" / "cpu_records" / f"{name}.json").read_text())
    return Measured(rec["results"], "recorded on test CPU", rec)


def test_recorded_sweep_and_overlap_findings():
    sink = FindingSink(None, "communication")
    sweep = _measured("allreduce-n2")
    C.add_sweep_findings(sink, load_profile(EXAMPLE), sweep)
    C.add_overlap_findings(sink, _measured("overlap-emulated"), _measured("overlap-real"))
    f = {x.id: x for x in sink.findings}
    rows = sweep.results["rows"]
    assert f["communication/measured_busbw"].value == max(r["busbw_GBps"] for r in rows)
    assert f["communication/measured_busbw"].verdict == "info"            # gloo processes are not judged
    assert f["communication/alpha_beta_fit_error"].value == sweep.results["fit"]["median_rel_error"]
    emu = {r["config"]: r for r in _measured("overlap-emulated").results["rows"]}
    best = min(emu[k]["step_s"] for k in emu if k.startswith("ddp_bucket_"))
    assert f["communication/overlap_saving"].value == pytest.approx(1 - best / emu["manual_allreduce"]["step_s"])
    assert "emulated device" in f["communication/overlap_saving"].message
    assert "Numerics (real run)" in f["communication/bf16_saving"].message


def test_overlap_table_units():
    t = C.overlap_table(_measured("overlap-real").results["rows"])
    assert {"configuration", "step (ms)", "MB per step per rank", "loss vs fp32 (rel.)"} <= set(t.columns)
    bf = t[t["configuration"] == "ddp_bf16_hook"].iloc[0]
    fp = t[t["configuration"] == "ddp_bucket_default"].iloc[0]
    assert bf["MB per step per rank"] == pytest.approx(fp["MB per step per rank"] / 2)
