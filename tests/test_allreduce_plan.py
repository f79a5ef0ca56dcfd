"""The one home of the gradient all-reduce plan: ``preflight.models.comm.allreduce_plan``.

Cases derived by hand from the ring model (Patarasuk & Yuan 2009), nccl-tests' PERFORMANCE.md bus
bandwidth convention (busbw = algbw x 2(n-1)/n: for a bandwidth-bound all-reduce, the per-rank rate of
the slowest part of the ring) and Megatron's rank order (tp fastest, then dp, then pp).
"""
import json
from pathlib import Path

import pytest

from preflight.core import hardware
from preflight.models import comm

FIELD = dict(gpus_per_node=8, intra_node_GBps=450.0, inter_node_Gbps=200.0, compute_s=0.8, serial_s=0.09)
ALPHA_IN, ALPHA_OUT = hardware.INTRA_NODE_LATENCY_S, hardware.INTER_NODE_LATENCY_S
REPO = Path(__file__).resolve().parents[1]


def plan(params=7e9, dp=1024, grad_dtype="fp32", tp=1, pp=1, **kw):
    return comm.allreduce_plan(params, dp, grad_dtype, tp, pp, **{**FIELD, **kw})


def test_field_case_rail_aware_beside_the_flat_arithmetic():
    """7B fp32, dp=1024 on 128 x 8 GPUs, one 200 Gb/s NIC per GPU: V = 55.9 GB per rank."""
    p = plan()
    v = 2 * 7e9 * 4 * 1023 / 1024
    assert p.bytes_per_rank == pytest.approx(v)
    assert (p.ranks_per_node, p.nodes, p.groups_per_node, p.nics_per_group) == (8, 128, 1, 8)
    assert p.link == "inter-node" and p.busbw_GBps == 200.0          # 8 NICs x 25 GB/s
    assert p.time_s == pytest.approx(v / 200e9 + 2 * 1023 * ALPHA_OUT)
    assert f"{p.time_s:.2g}" == "0.3"
    assert p.flat_s == pytest.approx(v / 25e9 + 2 * 1023 * ALPHA_OUT) and f"{p.flat_s:.3g}" == "2.26"
    assert "one 200 Gb/s NIC per node" in p.flat_why
    assert p.ratio == pytest.approx(p.time_s / 0.8)
    assert p.efficiency_no_overlap == pytest.approx(0.89 / (0.89 + p.time_s))
    assert p.exposed_overlap_s == 0 and p.efficiency_full_overlap == 1.0       # 0.3 s under 0.53 s of backward


def test_one_nic_per_node_is_where_the_field_report_holds():
    p = plan(nics_per_node=1)
    assert p.busbw_GBps == 25.0 and p.time_s == pytest.approx(p.flat_s)
    assert f"{p.time_s:.3g}" == "2.26"


def test_four_nics_per_node_halve_the_rail_bandwidth():
    assert plan(nics_per_node=4).busbw_GBps == 100.0
    assert plan(nics_per_node=8).busbw_GBps == plan().busbw_GBps      # the default is one per GPU


def test_published_busbw_order_of_magnitude():
    """nccl-tests on 8 x 400 Gb/s nodes: ~360-430 GB/s busbw. The model gives 8 x 50 = 400 GB/s."""
    p = plan(inter_node_Gbps=400.0, intra_node_GBps=900.0)
    assert 360 <= p.busbw_GBps <= 430


def test_one_node():
    p = plan(dp=8)
    assert (p.link, p.nodes, p.ranks_per_node) == ("intra-node", 1, 8)
    # rings reach 370 GB/s busbw of H100's 450 GB/s line rate (NVIDIA/nccl-tests#212)
    assert p.time_s == pytest.approx(2 * 7 / 8 * 28e9 / 370e9 + 14 * ALPHA_IN) == p.flat_s
    assert p.busbw_GBps == pytest.approx(370.0)


def test_dp_inside_a_node_with_pipeline_stages():
    """tp=1, pp=4, dp=8 on 4 x 8 GPUs: Megatron order puts each dp group inside one node (NVLink)."""
    p = plan(dp=8, tp=1, pp=4)
    assert (p.link, p.nodes, p.ranks_per_node) == ("intra-node", 1, 8)
    buffer = 7e9 / 4 * 4
    assert p.time_s == pytest.approx(2 * 7 / 8 * buffer / 370e9 + 14 * ALPHA_IN)
    assert p.time_s < plan(dp=8, tp=1, pp=4, gpus_per_node=2).time_s / 5      # the same group across 4 nodes


def test_tp8_pp8_leaves_one_rank_per_node_and_no_rail_division():
    """tp=8 x pp=8 on 8-GPU nodes: each dp group has one rank per node; the 8 groups of a node use its
    8 NICs one each, so the busbw is one NIC's, not 8."""
    p = plan(dp=16, tp=8, pp=8)
    assert (p.ranks_per_node, p.nodes, p.groups_per_node, p.nics_per_group) == (1, 16, 8, 1)
    assert p.busbw_GBps == 25.0
    assert p.time_s == pytest.approx(2 * 15 / 16 * 7e9 / 64 * 4 / 25e9 + 30 * ALPHA_OUT)
    shared = plan(dp=16, tp=8, pp=8, nics_per_node=1)       # one NIC for the 8 groups of a node
    assert shared.busbw_GBps == pytest.approx(25.0 / 8)


def test_tp2_spans_nodes_with_four_ranks_per_node():
    p = plan(dp=8, tp=2)
    assert (p.ranks_per_node, p.nodes, p.groups_per_node) == (4, 2, 2) and p.busbw_GBps == 100.0


@pytest.mark.parametrize("dp,tp,pp,gpn", [(8, 1, 1, 8), (16, 1, 1, 8), (4, 2, 1, 8), (8, 2, 1, 8), (2, 2, 2, 8),
                                          (2, 8, 1, 8), (64, 4, 2, 8), (3, 1, 1, 4), (6, 2, 2, 4)])
def test_placement_agrees_with_the_topology_rank_order(dp, tp, pp, gpn):
    """``dp_placement`` (closed form) against ``topology.rank_groups`` (rank by rank)."""
    from preflight.diagnose import topology

    df = topology.rank_groups(dp * tp * pp, gpn, tp, pp)
    g0 = df[df["dp_group"] == 0]
    place = comm.dp_placement(dp, tp, pp, gpn)
    assert place.nodes == g0["node"].nunique()
    assert place.ranks_per_node == g0.groupby("node").size().max()
    assert place.groups_per_node == df[df["node"] == 0]["dp_group"].nunique()


def test_accumulation_hides_only_behind_the_last_micro_batch():
    one, eight = plan(dp=1024, microbatches=1), plan(dp=1024, microbatches=8)
    assert one.hide_window_s == pytest.approx(0.8 * 2 / 3)
    assert eight.hide_window_s == pytest.approx(0.8 * 2 / 3 / 8)
    assert eight.exposed_overlap_s == pytest.approx(eight.time_s - 0.8 * 2 / 3 / 8)
    assert eight.efficiency_full_overlap < one.efficiency_full_overlap


def test_latency_terms_ring_and_tree():
    p = plan()
    assert p.ring_latency_s == pytest.approx(2 * 1023 * ALPHA_OUT)
    assert p.tree_latency_s == pytest.approx(2 * 10 * ALPHA_OUT)


@pytest.mark.parametrize("params,dp,dtype,tp,pp", [(7e9, 1024, "fp32", 1, 1), (7e9, 8, "fp32", 2, 2),
                                                   (1e9, 64, "bf16", 4, 1), (70e9, 32, "fp16", 8, 4)])
def test_bytes_formula(params, dp, dtype, tp, pp):
    b = comm.BYTES_PER_ELEMENT[dtype]
    p = plan(params, dp, dtype, tp, pp)
    assert p.bytes_per_rank == pytest.approx(2 * params / (tp * pp) * (dp - 1) / dp * b)
    assert p.buffer_bytes == pytest.approx(params / (tp * pp) * b)


def test_sharded_data_parallel_moves_one_and_a_half_times_ddp():
    ddp = comm.allreduce_bytes_per_rank(7e9, 64, "bf16")
    assert comm.sharded_bytes_per_rank(7e9, 64, "bf16", "bf16") == pytest.approx(1.5 * ddp)
    assert comm.sharded_bytes_per_rank(7e9, 64, "bf16", "fp32") == pytest.approx(2 * ddp)


@pytest.mark.parametrize("dp,tp,gpn", [(16, 1, 8), (1024, 1, 8), (64, 2, 8), (32, 8, 8), (256, 1, 4)])
@pytest.mark.parametrize("inter", [25.0, 100.0, 400.0])
def test_rail_model_never_slower_than_the_flat_arithmetic(dp, tp, gpn, inter):
    p = plan(dp=dp, tp=tp, gpus_per_node=gpn, inter_node_Gbps=inter)
    assert p.link == "inter-node" and p.time_s <= p.flat_s


def test_nvlink_bounds_the_rails():
    p = plan(inter_node_Gbps=1000.0, intra_node_GBps=450.0)      # 8 x 125 GB/s of NICs, 450 of NVLink (370 rings)
    assert p.busbw_GBps == pytest.approx(370.0) and "NVLink-bound" in p.link_why


def test_one_rank_moves_nothing():
    p = plan(dp=1)
    assert p.bytes_per_rank == 0 and p.flat_s == 0 and p.time_s == 0
    assert p.efficiency_no_overlap == 1.0 and p.efficiency_full_overlap == 1.0 and p.ratio == 0
    assert "nothing to all-reduce" in p.link_why


@pytest.mark.parametrize("kw,name", [
    ({"dp": 0}, "dp"), ({"dp": 2.5}, "dp"), ({"tp": 0}, "tp"), ({"pp": -1}, "pp"),
    ({"gpus_per_node": 0}, "gpus_per_node"), ({"params": 0}, "params"), ({"params": -7e9}, "params"),
    ({"intra_node_GBps": 0}, "intra_node_GBps"), ({"inter_node_Gbps": -1}, "inter_node_Gbps"),
    ({"compute_s": 0}, "compute_s"), ({"serial_s": -0.1}, "serial_s"), ({"grad_dtype": "fp8"}, "grad_dtype"),
    ({"dp": "8"}, "dp"), ({"nics_per_node": 0}, "nics_per_node"), ({"microbatches": 0}, "microbatches"),
])
def test_bad_input_names_the_argument(kw, name):
    with pytest.raises(ValueError, match=rf"^{name} must be"):
        plan(**kw)


def test_tiers_live_in_the_hardware_table():
    t = hardware.LINK_TIERS_GBps
    assert t["InfiniBand HDR 200 Gb/s per NIC"] == 25.0 and t["InfiniBand NDR 400 Gb/s per NIC"] == 50.0
    for gbps in t.values():                      # the widget hands tiers to the plan in Gb/s: exact round trip
        assert comm.gbps_to_GBps(8 * gbps) == gbps


def test_model_against_the_measured_gloo_sweep():
    """The committed 2-rank gloo sweep (a 2-core CPU box like CI's): the plan's one-node ring, given the
    sweep's fitted bandwidth as its 'NVLink', predicts the large messages within the fit's own error."""
    rec = json.loads((REPO / "tests" / "data" / "cpu_records" / "allreduce-n2.json").read_text())["results"]
    fit = rec["fit"]
    errors = []
    for row in rec["rows"]:
        if row["bytes"] < 1e6:               # below ~1 MB the latency term (alpha ~0.2 ms on gloo) decides
            continue
        p = comm.allreduce_plan(row["bytes"] / 4, 2, "fp32", gpus_per_node=2, intra_node_GBps=fit["bandwidth_GBps"],
                                inter_node_Gbps=1.0, compute_s=1.0)
        errors.append(p.time_s / row["time_s"] - 1)
    assert len(errors) >= 3
    assert max(abs(e) for e in errors) <= fit["max_rel_error"] + 0.05, errors
    assert rec["rows"][-1]["busbw_GBps"] == pytest.approx(rec["rows"][-1]["bytes"] / rec["rows"][-1]["time_s"] / 1e9)


def test_every_caller_reads_the_one_plan():
    from conftest import EXAMPLE
    from preflight.chapters import communication as C
    from preflight.chapters import exercises as X
    from preflight.core.profile import load_profile
    from preflight.models.extrapolate import scaling_curve

    prof = load_profile(EXAMPLE)
    p = plan()                                       # the example profile is the field case
    assert {k: v for k, v in C.plan(prof).items() if k in p.as_dict()} == p.as_dict() and C.allreduce_plan(prof) == p
    ex = X.communication(prof)                       # asked about bf16 on twice the ranks (not the one shown)
    q = plan(dp=2048, grad_dtype="bf16")
    assert ex["volume"].answer() == q.bytes_per_rank / 1e9 and ex["time"].answer() == q.time_s
    curve = scaling_curve(serial_s=0.09, compute_s=0.8, params=7e9, grad_dtype="fp32", tp=1, pp=1,
                          gpus_per_node=8, intra_node_GBps=450.0, inter_node_Gbps=200.0, target_gpus=1024)
    for row in curve.itertuples():
        q = plan(dp=row.gpus)
        assert (row.comm_s, row.flat_comm_s, row.link, row.efficiency_no_overlap) == (
            q.time_s, q.flat_s, q.link, q.efficiency_no_overlap)
        assert row.efficiency_overlap == pytest.approx(q.efficiency_full_overlap)


def test_nvls_all_reduce_on_eight_h100s_reaches_the_maintainers_figure():
    """NVIDIA/nccl-tests#212 (S. Jeaugey): rings reach ~370 GB/s busbw of H100's 450 GB/s line rate;
    NVLink SHARP all-reduce on 8 GPUs ~480 GB/s busbw (~30 % more, NVIDIA/nccl#1442); from 5 local GPUs
    up (NVIDIA/nccl#1455)."""
    from preflight.models import comm

    kw = dict(gpus_per_node=8, intra_node_GBps=450, inter_node_Gbps=400, compute_s=1.0)   # the line rate
    ring = comm.allreduce_plan(8e9, 8, "bf16", **kw)
    nvls = comm.allreduce_plan(8e9, 8, "bf16", in_network="nvls", **kw)
    assert ring.busbw_GBps == pytest.approx(370) and nvls.busbw_GBps == pytest.approx(480)      # not 450 x 1.3
    assert nvls.time_s == pytest.approx(ring.time_s * 370 / 480, rel=0.01)
    four = comm.allreduce_plan(8e9, 4, "bf16", tp=2, in_network="nvls", **kw)
    assert four.busbw_GBps == pytest.approx(370)                    # 4 local ranks: no gain measured
    across = comm.allreduce_plan(8e9, 64, "bf16", in_network="nvls", **kw)
    assert across.busbw_GBps == comm.allreduce_plan(8e9, 64, "bf16", **kw).busbw_GBps   # NVLS is in-node only


def test_sharp_sends_the_buffer_once_across_the_network():
    from preflight.models import comm

    kw = dict(gpus_per_node=8, intra_node_GBps=450, inter_node_Gbps=400, compute_s=1.0)
    ring = comm.allreduce_plan(8e9, 1024, "bf16", **kw)
    sharp = comm.allreduce_plan(8e9, 1024, "bf16", in_network="sharp", **kw)
    assert sharp.bytes_per_rank == pytest.approx(8e9 * 2) and ring.bytes_per_rank == pytest.approx(2 * 8e9 * 2 * 1023 / 1024)
    # SHARP's 2x is bounded by the node's own 8 ranks reducing over NVLink first (2 x 7/8 of the buffer at the
    # 370 GB/s ring rate): on H100 nodes with 8 x 400 Gb/s NICs that phase, not the network, sets the time
    assert sharp.time_s < ring.time_s and "SHARP" in sharp.link_why and "NVLink phase" in sharp.link_why
    assert sharp.time_s == pytest.approx(2 * 7 / 8 * 16e9 / 370e9 + sharp.ring_latency_s)
    # with NVLink twice as fast (Blackwell's 900 GB/s) the network's half of the bytes shows: about 2x
    fast = comm.allreduce_plan(8e9, 1024, "bf16", in_network="sharp", **(kw | {"intra_node_GBps": 900}))
    ring900 = comm.allreduce_plan(8e9, 1024, "bf16", **(kw | {"intra_node_GBps": 900}))
    assert fast.time_s < 0.52 * ring900.time_s and "NVLink phase" not in fast.link_why
    with pytest.raises(ValueError, match="in_network"):
        comm.allreduce_plan(8e9, 8, "bf16", in_network="magic", **kw)
