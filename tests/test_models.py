"""Pure formulas against published values (pitfalls brief, papers)."""
import math

import pytest

from preflight.core import hardware
from preflight.models import comm, extrapolate, flops, scaling


def test_amdahl_published_caps():
    # 10 % serial caps the speedup at 10x, 5 % at 20x (pitfalls brief, section 1)
    assert scaling.amdahl_ceiling(0.1, 0.9) == pytest.approx(10.0)
    assert scaling.amdahl_ceiling(0.05, 0.95) == pytest.approx(20.0)
    assert scaling.amdahl_speedup(0.1, 0.9, 10**9) == pytest.approx(10.0, rel=1e-6)
    assert scaling.amdahl_speedup(0.1, 0.9, 1) == pytest.approx(1.0)
    # hand-computed: (0.09 + 0.8) / (0.09 + 0.8 / 1024)
    assert scaling.amdahl_speedup(0.09, 0.8, 1024) == pytest.approx(0.89 / (0.09 + 0.8 / 1024))
    assert scaling.amdahl_ceiling(0.0, 1.0) == math.inf


def test_gustafson():
    assert scaling.gustafson_speedup(0.1, 100) == pytest.approx(100 - 0.1 * 99)
    assert scaling.gustafson_speedup(0.0, 64) == 64
    with pytest.raises(ValueError):
        scaling.gustafson_speedup(1.5, 4)


@pytest.mark.parametrize("ts,tc,n", [(-1, 1, 2), (1, -1, 2), (0, 0, 2), (1, 1, 0)])
def test_amdahl_rejects_bad_input(ts, tc, n):
    with pytest.raises(ValueError):
        scaling.amdahl_speedup(ts, tc, n)


def test_allreduce_field_case():
    # 7e9 params, FP32, large D: ~56 GB per rank per step; at 200 Gb/s = 25 GB/s over 2 s
    b = comm.allreduce_bytes_per_rank(7e9, 1024, "fp32")
    assert b == pytest.approx(56e9 * 1023 / 1024)
    t = comm.ring_allreduce_time(7e9 * 4, 1024, comm.gbps_to_GBps(200))
    assert 2.0 < t < 2.3
    assert comm.allreduce_bytes_per_rank(7e9, 1024, "bf16") == pytest.approx(b / 2)
    assert comm.allreduce_bytes_per_rank(7e9, 8, "fp32", tp=2, pp=2) == pytest.approx(2 * 7e9 / 4 * 7 / 8 * 4)
    assert comm.ring_allreduce_time(1e9, 1, 10.0) == 0.0
    assert comm.busbw_factor(2) == 1.0 and comm.busbw_factor(8) == pytest.approx(1.75)


def test_ring_latency_term():
    assert comm.ring_allreduce_time(0, 4, 10.0, latency_s=1e-5) == pytest.approx(6e-5)


def test_flops_per_token():
    # 7B, 32 layers, h 4096, s 4096: 6N dominates, attention adds 12*L*h*s
    f = flops.train_flops_per_token(7e9, 32, 4096, 4096)
    assert f == pytest.approx(6 * 7e9 + 12 * 32 * 4096 * 4096)
    assert flops.mfu(400e12, 989.4) == pytest.approx(400 / 989.4)
    assert flops.mfu(1e12, None) is None


def test_hardware_table_and_lookup():
    assert hardware.peak_tflops("NVIDIA H100 80GB HBM3") == pytest.approx(989.5)   # 1,979 sparse / 2
    assert hardware.lookup("NVIDIA H200").name == "H200-SXM"
    assert hardware.lookup("NVIDIA H100 PCIe").name == "H100-PCIe"
    assert hardware.lookup("NVIDIA A100-SXM4-80GB").name == "A100-SXM"
    assert hardware.lookup("AMD Instinct MI300X").name == "MI300X"
    assert hardware.lookup("Intel(R) Xeon(R) CPU") is None
    assert hardware.peak_tflops("some unknown chip") is None
    for key in ("A100-SXM", "H100-SXM", "H200-SXM", "B200", "L40S", "MI300X"):
        chip = hardware.CHIPS[key]
        assert chip.bf16_tflops > chip.fp32_tflops > 0 and chip.source
    assert list(hardware.table().index) == list(hardware.CHIPS)


def test_stages_and_field_curve():
    assert extrapolate.stages(1024) == [1, 8, 64, 512, 1024]
    assert extrapolate.stages(512) == [1, 8, 64, 512]
    assert extrapolate.stages(1) == [1]
    curve = extrapolate.scaling_curve(serial_s=0.09, compute_s=0.8, params=7e9, grad_dtype="fp32", tp=1, pp=1,
                                      gpus_per_node=8, intra_node_GBps=450, inter_node_Gbps=200,
                                      target_gpus=1024)
    row = curve.set_index("gpus")
    assert row.loc[1, "efficiency"] == 1.0
    # inside a node: 2*7/8*28e9 B / 450 GB/s = 0.109 s of comm
    assert row.loc[8, "comm_s"] == pytest.approx(2 * 7 / 8 * 28e9 / 370e9 + 14 * 5e-6)
    # across nodes, one 25 GB/s NIC per GPU: NCCL's rings use all 8 NICs of a node (busbw 200 GB/s):
    # ~0.3 s; the field report's flat arithmetic (one NIC carries it all) > 2 s, under 30 % efficiency
    assert row.loc[1024, "comm_s"] == pytest.approx(2 * 1023 / 1024 * 28e9 / 200e9 + 2 * 1023 * 10e-6)
    assert row.loc[1024, "flat_comm_s"] > 2.0 and 0.89 / (0.89 + row.loc[1024, "flat_comm_s"]) < 0.30
    assert 0.70 < row.loc[1024, "efficiency_no_overlap"] < 0.80
    assert row.loc[1024, "efficiency_overlap"] > row.loc[1024, "efficiency_no_overlap"]
    # bf16 halves the bytes: better efficiency
    bf = extrapolate.scaling_curve(serial_s=0.09, compute_s=0.8, params=7e9, grad_dtype="bf16", tp=1, pp=1,
                                   gpus_per_node=8, intra_node_GBps=450, inter_node_Gbps=200, target_gpus=1024)
    assert bf.iloc[-1]["efficiency_no_overlap"] > curve.iloc[-1]["efficiency_no_overlap"]
    assert curve.iloc[-1]["efficiency"] == curve.iloc[-1]["efficiency_overlap"]          # the verdict's estimate


def test_strong_scaling_curve_is_amdahl_plus_communication():
    kw = dict(serial_s=0.09, compute_s=0.8, params=7e9, grad_dtype="fp32", tp=1, pp=1, gpus_per_node=8,
              intra_node_GBps=450, inter_node_Gbps=200, target_gpus=1024)
    strong = extrapolate.scaling_curve(**kw, scaling="strong").set_index("gpus")
    for n in (8, 64, 1024):              # (Ts + Tc) / (n (Ts + Tc/n + comm)): Amdahl's efficiency, then comm
        t = 0.09 + 0.8 / n + strong.loc[n, "comm_s"]
        assert strong.loc[n, "efficiency_no_overlap"] == pytest.approx(0.89 / (n * t))
        assert strong.loc[n, "efficiency_no_overlap"] < scaling.amdahl_speedup(0.09, 0.8, n) / n
    with pytest.raises(ValueError, match="scaling must be one of"):
        extrapolate.scaling_curve(**kw, scaling="sideways")


def test_measured_points_replace_model():
    curve = extrapolate.scaling_curve(serial_s=0.1, compute_s=1.0, params=1e9, grad_dtype="bf16", tp=1, pp=1,
                                      gpus_per_node=8, intra_node_GBps=450, inter_node_Gbps=200,
                                      target_gpus=64, measured={8: 0.93})
    r = curve.set_index("gpus")
    assert r.loc[8, "efficiency"] == 0.93 and r.loc[8, "source"] == "measured"
    assert r.loc[64, "source"].startswith("model")
