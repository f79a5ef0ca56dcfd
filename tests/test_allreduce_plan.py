"""The one home of the gradient all-reduce plan: ``preflight.models.comm.allreduce_plan``."""
import pytest

from preflight import hardware
from preflight.models import comm

FIELD = dict(gpus_per_node=8, intra_node_GBps=450.0, inter_node_Gbps=200.0, compute_s=0.8, serial_s=0.09)


def plan(params=7e9, dp=1024, grad_dtype="fp32", tp=1, pp=1, **kw):
    return comm.allreduce_plan(params, dp, grad_dtype, tp, pp, **{**FIELD, **kw})


def test_field_case():
    p = plan()
    assert p.bytes_per_rank == pytest.approx(2 * 7e9 * 1023 / 1024 * 4)
    assert p.link == "inter-node" and p.link_GBps == 25.0 and p.link_latency_s == hardware.INTER_NODE_LATENCY_S
    assert p.flat_s == pytest.approx(2 * 1023 / 1024 * 28e9 / 25e9 + 2 * 1023 * 10e-6)
    assert f"{p.flat_s:.3g}" == "2.26"
    assert p.ratio == pytest.approx(p.flat_s / 0.8)
    assert p.efficiency_no_overlap == pytest.approx(0.89 / (0.89 + p.flat_s))
    assert p.efficiency_full_overlap == pytest.approx(0.89 / (0.89 + p.flat_s - 0.8 * 2 / 3))
    assert p.as_dict()["flat_s"] == p.flat_s and "128 nodes" in p.link_why


@pytest.mark.parametrize("dp,tp,pp,gpn,link", [
    (8, 1, 1, 8, "intra-node"), (16, 1, 1, 8, "inter-node"),      # 8 GPUs fill the node; 16 spill over
    (4, 2, 1, 8, "intra-node"), (8, 2, 1, 8, "inter-node"),       # dp x tp x pp against the node
    (2, 2, 2, 8, "intra-node"), (2, 8, 1, 8, "inter-node"),       # tp = a whole node: dp spans nodes
    (3, 1, 1, 4, "intra-node"), (5, 1, 1, 4, "inter-node"),
])
def test_link_at_the_node_boundary(dp, tp, pp, gpn, link):
    p = plan(dp=dp, tp=tp, pp=pp, gpus_per_node=gpn)
    assert p.link == link
    expect = comm.allreduce_link(comm.dp_group_nodes(dp, tp, pp, gpn), 450.0, 200.0)
    assert (p.link_GBps, p.link_latency_s) == (expect.GBps, expect.latency_s)
    assert p.link_GBps == (450.0 if link == "intra-node" else 25.0)


def test_allreduce_link_is_the_one_rule():
    one, two = comm.allreduce_link(1, 450.0, 200.0), comm.allreduce_link(2, 450.0, 200.0)
    assert (one.name, one.GBps, one.latency_s) == ("intra-node", 450.0, hardware.INTRA_NODE_LATENCY_S)
    assert (two.name, two.GBps, two.latency_s) == ("inter-node", 25.0, hardware.INTER_NODE_LATENCY_S)
    assert comm.dp_group_nodes(1024, 1, 1, 8) == 128 and comm.dp_group_nodes(3, 2, 1, 8) == 1


@pytest.mark.parametrize("params,dp,dtype,tp,pp", [(7e9, 1024, "fp32", 1, 1), (7e9, 8, "fp32", 2, 2),
                                                   (1e9, 64, "bf16", 4, 1), (70e9, 32, "fp16", 8, 4)])
def test_bytes_formula(params, dp, dtype, tp, pp):
    b = comm.BYTES_PER_ELEMENT[dtype]
    p = plan(params, dp, dtype, tp, pp)
    assert p.bytes_per_rank == pytest.approx(2 * params / (tp * pp) * (dp - 1) / dp * b)
    assert p.buffer_bytes == pytest.approx(params / (tp * pp) * b)


@pytest.mark.parametrize("dp,tp,gpn", [(16, 1, 8), (1024, 1, 8), (64, 2, 8), (32, 8, 8), (256, 1, 4)])
@pytest.mark.parametrize("inter", [25.0, 100.0, 400.0])
def test_hierarchical_not_slower_than_flat_across_nodes(dp, tp, gpn, inter):
    p = plan(dp=dp, tp=tp, gpus_per_node=gpn, inter_node_Gbps=inter)
    assert p.link == "inter-node"
    assert p.hierarchical_s <= p.flat_s
    assert p.dp_per_node == min(dp, max(1, gpn // tp)) and p.dp_nodes == dp // p.dp_per_node


def test_one_node_hierarchical_is_the_flat_ring():
    p = plan(dp=8)
    assert p.link == "intra-node" and p.hierarchical_s == pytest.approx(p.flat_s)
    assert p.flat_s == pytest.approx(2 * 7 / 8 * 28e9 / 450e9 + 14 * hardware.INTRA_NODE_LATENCY_S)


def test_one_rank_moves_nothing():
    p = plan(dp=1)
    assert p.bytes_per_rank == 0 and p.flat_s == 0 and p.hierarchical_s == 0
    assert p.efficiency_no_overlap == 1.0 and p.efficiency_full_overlap == 1.0 and p.ratio == 0
    assert "nothing to all-reduce" in p.link_why


def test_overlap_bound_hides_up_to_two_thirds_of_compute():
    p = plan(dp=8, compute_s=10.0)               # 0.11 s of comm under 6.7 s of backward: all hidden
    assert p.exposed_overlap_s == 0 and p.efficiency_full_overlap == 1.0
    assert p.efficiency_no_overlap < 1.0


@pytest.mark.parametrize("kw,name", [
    ({"dp": 0}, "dp"), ({"dp": 2.5}, "dp"), ({"tp": 0}, "tp"), ({"pp": -1}, "pp"),
    ({"gpus_per_node": 0}, "gpus_per_node"), ({"params": 0}, "params"), ({"params": -7e9}, "params"),
    ({"intra_node_GBps": 0}, "intra_node_GBps"), ({"inter_node_Gbps": -1}, "inter_node_Gbps"),
    ({"compute_s": 0}, "compute_s"), ({"serial_s": -0.1}, "serial_s"), ({"grad_dtype": "fp8"}, "grad_dtype"),
    ({"dp": "8"}, "dp"),
])
def test_bad_input_names_the_argument(kw, name):
    with pytest.raises(ValueError, match=rf"^{name} must be"):
        plan(**kw)


def test_tiers_live_in_the_hardware_table():
    t = hardware.LINK_TIERS_GBps
    assert t["InfiniBand HDR 200 Gb/s per GPU"] == 25.0 and t["InfiniBand NDR 400 Gb/s per GPU"] == 50.0
    assert t["25 GbE per node shared by 8 GPUs"] == pytest.approx(25 / 8 / 8)
    for gbps in t.values():                      # the widget hands tiers to the plan in Gb/s: exact round trip
        assert comm.gbps_to_GBps(8 * gbps) == gbps


def test_every_caller_reads_the_one_plan():
    from conftest import EXAMPLE
    from preflight.chapters import communication as C
    from preflight.chapters import exercises as X
    from preflight.models.extrapolate import scaling_curve
    from preflight.profile import load_profile

    prof = load_profile(EXAMPLE)
    p = plan()                                       # the example profile is the field case
    assert C.plan(prof) == p.as_dict() and C.allreduce_plan(prof) == p
    ex = X.communication(prof)
    assert ex["volume"].answer() == p.bytes_per_rank / 1e9 and ex["time"].answer() == p.flat_s
    curve = scaling_curve(serial_s=0.09, compute_s=0.8, params=7e9, grad_dtype="fp32", tp=1, pp=1,
                          gpus_per_node=8, intra_node_GBps=450.0, inter_node_Gbps=200.0, target_gpus=1024)
    for row in curve.itertuples():
        q = plan(dp=row.gpus)
        assert (row.comm_s, row.link, row.efficiency_no_overlap, row.efficiency_overlap) == (
            q.flat_s, q.link, q.efficiency_no_overlap, q.efficiency_full_overlap)
