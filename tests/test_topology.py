"""Topology: placement rules, `nvidia-smi topo -m` and NCCL_DEBUG=INFO parsing (no GPU needed)."""
import pytest

from preflight.core.profile import Profile
from preflight.diagnose import nccl_log
from preflight.diagnose import topology as topo


def _profile(nodes=128, gpus_per_node=8, tp=1, pp=1) -> Profile:
    return Profile.model_validate({
        "project": "t", "model": {"params": 7e9, "layers": 32, "hidden": 4096, "seq_len": 4096},
        "cluster": {"nodes": nodes, "gpus_per_node": gpus_per_node}, "training": {"tp": tp, "pp": pp}})


def _by_rule(rules):
    assert [r["rule"] for r in rules] == ["tp_within_node", "dp_across_nodes", "pp_boundaries", "divisible"]
    for r in rules:
        assert set(r) == {"rule", "ok", "verdict", "detail"} and isinstance(r["ok"], bool) and r["detail"]
    return {r["rule"]: r for r in rules}


# ------------------------------------------------------------------ placement

def test_rank_groups_small_case():
    df = topo.rank_groups(16, 8, tp=2, pp=2)
    assert len(df) == 16 and list(df.columns[:6]) == ["rank", "node", "local_rank", "tp_group", "dp_group",
                                                      "pp_stage"]
    assert df["tp_group"].nunique() == 8 and df["dp_group"].nunique() == 4 and df["pp_stage"].nunique() == 2
    for _, g in df.groupby("tp_group"):       # TP groups: consecutive ranks, one node
        assert list(g["rank"]) == list(range(g["rank"].min(), g["rank"].min() + 2))
        assert g["node"].nunique() == 1
    # dp = 4: ranks 0,2,4,6 form the first DP group (stage 0, tp_rank 0); stage 1 starts at rank 8
    assert list(df[df.dp_group == 0]["rank"]) == [0, 2, 4, 6]
    assert list(df[df.dp_group == 3]["rank"]) == [9, 11, 13, 15]
    assert list(df["pp_stage"]) == [0] * 8 + [1] * 8
    assert list(df["node"]) == [0] * 8 + [1] * 8 and list(df["local_rank"]) == list(range(8)) * 2
    with pytest.raises(ValueError):
        topo.rank_groups(16, 8, tp=3, pp=1)


def test_tp8_on_8gpu_nodes_passes():
    rules = _by_rule(topo.check_layout(8, 128, tp=8, pp=1))
    assert rules["tp_within_node"]["verdict"] == "pass" and rules["tp_within_node"]["ok"]
    dp = rules["dp_across_nodes"]      # dp = 128: one member per node, across 128 nodes
    assert dp["verdict"] == "info" and dp["ok"] and "128 nodes" in dp["detail"] and "One member" in dp["detail"]


def test_tp16_fails():
    rules = _by_rule(topo.check_layout(8, 128, tp=16))
    assert rules["tp_within_node"]["verdict"] == "fail" and not rules["tp_within_node"]["ok"]
    assert "64 of 64" in rules["tp_within_node"]["detail"]
    assert rules["divisible"]["verdict"] == "pass"
    verdict, message = topo.layout_verdict(_profile(tp=16))
    assert verdict == "fail" and "tp=16" in message and "network" in message


def test_tp3_fails_not_dividing():
    rules = _by_rule(topo.check_layout(8, 128, tp=3))
    assert rules["tp_within_node"]["verdict"] == "fail" and "does not divide" in rules["tp_within_node"]["detail"]
    assert rules["divisible"]["verdict"] == "fail" and not rules["divisible"]["ok"]   # 1024 % 3
    assert rules["dp_across_nodes"]["verdict"] == "info" and "not evaluated" in rules["dp_across_nodes"]["detail"]
    rules = _by_rule(topo.check_layout(8, 3, tp=3))                                    # 24 % 3 == 0
    assert rules["tp_within_node"]["verdict"] == "fail" and rules["divisible"]["verdict"] == "pass"
    assert rules["dp_across_nodes"]["verdict"] == "warn"       # DP members spread unevenly over nodes


def test_example_layout_dp_across_128_nodes():
    rules = _by_rule(topo.check_layout(8, 128, tp=1, pp=1))
    assert rules["tp_within_node"]["verdict"] == "pass" and rules["pp_boundaries"]["verdict"] == "pass"
    dp = rules["dp_across_nodes"]
    assert dp["verdict"] == "info" and dp["ok"]
    assert "1 data-parallel group of 1024 ranks" in dp["detail"] and "128 nodes" in dp["detail"]
    assert "one NIC per rank of the group" in dp["detail"]
    verdict, message = topo.layout_verdict(_profile())
    assert verdict == "pass" and "dp=1024" in message and "one NIC per rank" in message


def test_dp_inside_node_and_pipeline_boundaries():
    rules = _by_rule(topo.check_layout(8, 4, tp=2, pp=4))   # dp = 4: stage = one node
    assert rules["dp_across_nodes"]["verdict"] == "pass"
    assert rules["pp_boundaries"]["verdict"] == "pass" and "3 of 3" in rules["pp_boundaries"]["detail"]
    rules = _by_rule(topo.check_layout(8, 1, tp=2, pp=2))   # one node: no boundary crosses
    assert "0 of 1" in rules["pp_boundaries"]["detail"]
    assert topo.layout_verdict(_profile(nodes=4, tp=2, pp=4))[0] == "pass"


# ------------------------------------------------------------------ nvidia-smi topo -m

LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""

# `nvidia-smi topo -m` on an HGX H100 (NVSwitch); "|" stands for the tab the tool prints.
TOPO_NVSWITCH = """\
|GPU0|GPU1|GPU2|GPU3|GPU4|GPU5|GPU6|GPU7|CPU Affinity|NUMA Affinity|GPU NUMA ID
GPU0| X |NV18|NV18|NV18|NV18|NV18|NV18|NV18|0-55,112-167|0||N/A
GPU1|NV18| X |NV18|NV18|NV18|NV18|NV18|NV18|0-55,112-167|0||N/A
GPU2|NV18|NV18| X |NV18|NV18|NV18|NV18|NV18|0-55,112-167|0||N/A
GPU3|NV18|NV18|NV18| X |NV18|NV18|NV18|NV18|0-55,112-167|0||N/A
GPU4|NV18|NV18|NV18|NV18| X |NV18|NV18|NV18|56-111,168-223|1||N/A
GPU5|NV18|NV18|NV18|NV18|NV18| X |NV18|NV18|56-111,168-223|1||N/A
GPU6|NV18|NV18|NV18|NV18|NV18|NV18| X |NV18|56-111,168-223|1||N/A
GPU7|NV18|NV18|NV18|NV18|NV18|NV18|NV18| X |56-111,168-223|1||N/A
""".replace("|", "\t") + LEGEND

# A 2-socket PCIe server: 4 GPUs in pairs behind PCIe switches, one ConnectX NIC per pair.
TOPO_PCIE = """\
|GPU0|GPU1|GPU2|GPU3|NIC0|NIC1|CPU Affinity|NUMA Affinity|GPU NUMA ID
GPU0| X |PIX|SYS|SYS|PXB|SYS|0-31,64-95|0|N/A
GPU1|PIX| X |SYS|SYS|PXB|SYS|0-31,64-95|0|N/A
GPU2|SYS|SYS| X |PIX|SYS|PXB|32-63,96-127|1|N/A
GPU3|SYS|SYS|PIX| X |SYS|PXB|32-63,96-127|1|N/A
NIC0|PXB|PXB|SYS|SYS| X |SYS
NIC1|SYS|SYS|PXB|PXB|SYS| X 
""".replace("|", "\t") + LEGEND + """
NIC Legend:

  NIC0: mlx5_0
  NIC1: mlx5_1
"""


def test_parse_topo_nvswitch():
    df = topo.parse_topo_matrix(TOPO_NVSWITCH)
    assert list(df.index) == [f"GPU{i}" for i in range(8)]
    assert list(df.columns[-3:]) == ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]
    gpus = df[[f"GPU{i}" for i in range(8)]]
    assert all(gpus.loc[f"GPU{i}", f"GPU{i}"] == "X" for i in range(8))
    assert (gpus.values != "X").sum() == 56 and set(gpus.values.ravel()) == {"X", "NV18"}
    assert df.loc["GPU5", "CPU Affinity"] == "56-111,168-223" and df.loc["GPU5", "NUMA Affinity"] == "1"
    assert df.loc["GPU0", "GPU NUMA ID"] == "N/A"
    pairs = topo.gpu_links(df)
    assert len(pairs) == 28 and set(pairs["link"]) == {"NV18"} and "18 NVLinks" in pairs["meaning"][0]
    # the colours nvidia-smi prints to a terminal do not matter
    assert topo.parse_topo_matrix("\x1b[4m" + TOPO_NVSWITCH.replace("\n", "\x1b[0m\n", 1)).equals(df)


def test_parse_topo_pcie_with_nics():
    df = topo.parse_topo_matrix(TOPO_PCIE)
    assert list(df.index) == ["GPU0", "GPU1", "GPU2", "GPU3", "NIC0", "NIC1"]
    assert df.loc["GPU0", "GPU1"] == "PIX" and df.loc["GPU0", "GPU2"] == "SYS"
    assert df.loc["GPU3", "NIC1"] == "PXB" and df.loc["NIC1", "NIC1"] == "X"
    assert df.loc["NIC0", "CPU Affinity"] == "" and df.loc["GPU2", "NUMA Affinity"] == "1"
    assert df.attrs["nic_names"] == {"NIC0": "mlx5_0", "NIC1": "mlx5_1"}
    assert set(topo.gpu_links(df)["link"]) == {"PIX", "SYS"}
    for code in ("X", "PIX", "PXB", "PHB", "NODE", "SYS", "NV#"):
        assert code in topo.LINK_MEANING
    assert "CPU-socket" in topo.link_meaning("SYS")
    with pytest.raises(ValueError):
        topo.parse_topo_matrix("no GPUs here")


def test_nvidia_smi_topo_absent(monkeypatch):
    assert topo.nvidia_smi_topo(run=False) is None
    monkeypatch.setattr(topo.shutil, "which", lambda name: None)
    assert topo.nvidia_smi_topo() is None


# ------------------------------------------------------------------ NCCL_DEBUG=INFO

# NCCL 2.21, one node, 2 GPUs, one process per GPU (torchrun): NVLink through cuMem handles.
LOG_P2P = """\
gpu-a01:1201:1201 [0] NCCL INFO Bootstrap : Using eth0:10.1.0.11<0>
gpu-a01:1201:1201 [0] NCCL INFO NET/Plugin: No plugin found (libnccl-net.so)
gpu-a01:1201:1201 [0] NCCL INFO NET/Plugin: Using internal network plugin.
gpu-a01:1201:1201 [0] NCCL INFO cudaDriverVersion 12040
gpu-a01:1201:1201 [0] NCCL INFO NCCL version 2.21.5+cuda12.4
gpu-a01:1201:1290 [0] NCCL INFO Failed to open libibverbs.so[.1]
gpu-a01:1201:1290 [0] NCCL INFO NET/Socket : Using [0]eth0:10.1.0.11<0>
gpu-a01:1201:1290 [0] NCCL INFO Using non-device net plugin version 0
gpu-a01:1201:1290 [0] NCCL INFO Using network Socket
gpu-a01:1201:1290 [0] NCCL INFO ncclCommInitRank comm 0x5581c3d0e2a0 rank 0 nranks 2 cudaDev 0 nvmlDev 0 \
busId 18000 commId 0x6b1a2f3c8d9e0f12 - Init START
gpu-a01:1201:1290 [0] NCCL INFO Setting affinity for GPU 0 to ffff,ffffffff
gpu-a01:1201:1290 [0] NCCL INFO NVLS multicast support is not available on dev 0
gpu-a01:1201:1290 [0] NCCL INFO comm 0x5581c3d0e2a0 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0
gpu-a01:1201:1290 [0] NCCL INFO Channel 00/04 :    0   1
gpu-a01:1201:1290 [0] NCCL INFO Channel 01/04 :    0   1
gpu-a01:1201:1290 [0] NCCL INFO Channel 02/04 :    0   1
gpu-a01:1201:1290 [0] NCCL INFO Channel 03/04 :    0   1
gpu-a01:1201:1290 [0] NCCL INFO Trees [0] 1/-1/-1->0->-1 [1] 1/-1/-1->0->-1 [2] 1/-1/-1->0->-1 [3] 1/-1/-1->0->-1
gpu-a01:1201:1290 [0] NCCL INFO P2P Chunksize set to 524288
gpu-a01:1201:1290 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
gpu-a01:1201:1290 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM/read
gpu-a01:1202:1291 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM/read
gpu-a01:1202:1291 [1] NCCL INFO Channel 01/0 : 1[1] -> 0[0] via P2P/CUMEM/read
gpu-a01:1201:1290 [0] NCCL INFO Connected all rings
gpu-a01:1201:1290 [0] NCCL INFO Connected all trees
gpu-a01:1201:1290 [0] NCCL INFO threadThresholds 8/8/64 | 16/8/64 | 512 | 512
gpu-a01:1201:1290 [0] NCCL INFO 4 coll channels, 4 collnet channels, 0 nvls channels, 4 p2p channels, \
2 p2p channels per peer
gpu-a01:1201:1290 [0] NCCL INFO ncclCommInitRank comm 0x5581c3d0e2a0 rank 0 nranks 2 cudaDev 0 nvmlDev 0 \
busId 18000 commId 0x6b1a2f3c8d9e0f12 - Init COMPLETE
gpu-a01:1201:1201 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x7f2a3c000000 recvbuff 0x7f2a3c000000 \
count 1048576 datatype 7 op 0 root 0 comm 0x5581c3d0e2a0 [nranks=2] stream 0x5581c2a0b0f0
gpu-a01:1201:1201 [0] NCCL INFO AllReduce: 4194304 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..3}
"""

# NCCL 2.18, 2 nodes x 8 GPUs on InfiniBand with GPUDirect RDMA (rank 0's and rank 7's lines).
LOG_IB = """\
NCCL version 2.18.5+cuda12.2
node001:48211:48211 [0] NCCL INFO Bootstrap : Using ib0:10.10.0.1<0>
node001:48211:48211 [0] NCCL INFO NET/Plugin : Plugin load (libnccl-net.so) returned 2 : libnccl-net.so: \
cannot open shared object file: No such file or directory
node001:48211:48211 [0] NCCL INFO NET/Plugin : No plugin found, using internal implementation
node001:48211:48305 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/IB [3]mlx5_3:1/IB ; \
OOB ib0:10.10.0.1<0>
node001:48211:48305 [0] NCCL INFO Using network IB
node001:48211:48305 [0] NCCL INFO comm 0x55d0c8a0e4f0 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0
node001:48211:48305 [0] NCCL INFO Channel 00/02 :    0   1   2   3   4   5   6   7   8   9  10  11  12  13  14  15
node001:48211:48305 [0] NCCL INFO Channel 01/02 :    0   1   2   3   4   5   6   7   8   9  10  11  12  13  14  15
node001:48211:48305 [0] NCCL INFO Trees [0] 1/8/-1->0->-1 [1] 1/-1/-1->0->8
node001:48211:48305 [0] NCCL INFO Channel 00/0 : 15[7] -> 0[0] [receive] via NET/IB/0/GDRDMA
node001:48211:48305 [0] NCCL INFO GPU Direct RDMA Enabled for GPU 18000 / HCA 0 (distance 4 <= 5), read 1
node001:48211:48305 [0] NCCL INFO Channel 01/0 : 15[7] -> 0[0] [receive] via NET/IB/0/GDRDMA
node001:48211:48305 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read
node001:48211:48305 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/IPC/read
node001:48218:48311 [7] NCCL INFO Channel 00/0 : 7[7] -> 8[0] [send] via NET/IB/3/GDRDMA
node001:48218:48311 [7] NCCL INFO Channel 01/0 : 7[7] -> 8[0] [send] via NET/IB/3(6)/GDRDMA
node001:48211:48305 [0] NCCL INFO Connected all rings
node001:48211:48305 [0] NCCL INFO Connected all trees
node001:48211:48305 [0] NCCL INFO NVLS multicast support is not available on dev 0
node001:48211:48305 [0] NCCL INFO 2 coll channels, 2 collnet channels, 0 nvls channels, 2 p2p channels, \
2 p2p channels per peer
node001:48211:48305 [0] NCCL INFO Algorithm   |            Tree |            Ring |   CollNetDirect |
node001:48211:48211 [0] NCCL INFO AllReduce: 4096 Bytes -> Algo 0 proto 0 time 12.510000
node001:48211:48211 [0] NCCL INFO AllReduce: 268435456 Bytes -> Algo 1 proto 2 time 11046.320312
"""

# NCCL 2.20, 2 nodes x 2 GPUs, no usable HCA: TCP between nodes and SHM inside (P2P disabled).
LOG_SOCKET = """\
0: gpu-b01:2207:2207 [0] NCCL INFO NCCL version 2.20.5+cuda12.4
0: gpu-b01:2207:2260 [0] NCCL INFO NET/IB : No device found.
0: gpu-b01:2207:2260 [0] misc/ibvwrap.cc:190 NCCL WARN Call to ibv_open_device failed
0: gpu-b01:2207:2260 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0> [1]eth1:192.168.1.1<0>
0: gpu-b01:2207:2260 [0] NCCL INFO Using network Socket
0: gpu-b01:2207:2260 [0] NCCL INFO comm 0x5611e2b4a010 rank 0 nRanks 4 nNodes 2 localRanks 2 localRank 0 MNNVL 0
0: gpu-b01:2207:2260 [0] NCCL INFO Channel 00/02 :    0   1   2   3
0: gpu-b01:2207:2260 [0] NCCL INFO Channel 01/02 :    0   1   2   3
0: gpu-b01:2207:2260 [0] NCCL INFO Trees [0] 1/2/-1->0->-1 [1] 1/-1/-1->0->2
0: gpu-b01:2207:2260 [0] NCCL INFO Channel 00/0 : 3[1] -> 0[0] [receive] via NET/Socket/0
0: gpu-b01:2207:2260 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct
1: gpu-b01:2208:2261 [1] NCCL INFO Channel 00/0 : 1[1] -> 2[0] [send] via NET/Socket/1
0: gpu-b01:2207:2260 [0] NCCL INFO 2 coll channels, 2 collnet channels, 0 nvls channels, 2 p2p channels, \
1 p2p channels per peer
"""


def test_nccl_single_node_p2p():
    p = nccl_log.parse_nccl_log(LOG_P2P)
    assert p["version"] == "2.21.5+cuda12.4" and p["hosts"] == ["gpu-a01"]
    assert (p["nranks"], p["nnodes"]) == (2, 1)
    assert p["transports"] == ["P2P/CUMEM"]            # "NVLS multicast ... not available" is not NVLS
    assert p["network"] == "Socket" and p["net_plugin"] == "internal"
    assert p["net_interfaces"] == ["Socket [0]eth0:10.1.0.11<0>"]
    assert p["channels"] == {"coll": 4, "collnet": 4, "nvls": 0, "p2p": 4, "p2p_per_peer": 2, "ring_lines": 4}
    assert p["rings"] == [[0, 1]] * 4
    assert len(p["trees"]) == 4 and p["trees"][0] == {"channel": 0, "down": [1], "rank": 0, "up": -1}
    assert p["algorithms"] == ["Ring"]
    assert len(p["peers"]) == 4
    assert p["peers"][2] == {"channel": 0, "src_rank": 1, "src_dev": 1, "dst_rank": 0, "dst_dev": 0,
                             "direction": "", "via": "P2P/CUMEM/read", "transport": "P2P/CUMEM", "gdr": False}
    df = nccl_log.nccl_summary(p)
    assert set(df["link"]) == {"NVLink/P2P"} and len(df) == 4
    text = nccl_log.nccl_findings_text(p)
    assert "2.21.5" in text and "P2P/CUMEM" in text and "Warning" not in text


def test_nccl_two_nodes_ib_gdrdma():
    p = nccl_log.parse_nccl_log(LOG_IB)
    assert p["version"] == "2.18.5+cuda12.2" and (p["nranks"], p["nnodes"]) == (16, 2)
    assert p["transports"] == ["NET/IB", "P2P/IPC"]
    assert p["network"] == "IB"
    assert p["net_interfaces"] == [f"IB [{i}]mlx5_{i}:1/IB" for i in range(4)]
    assert p["rings"] == [list(range(16))] * 2 and p["channels"]["coll"] == 2
    assert p["trees"][0] == {"channel": 0, "down": [1, 8], "rank": 0, "up": -1}
    assert p["trees"][1] == {"channel": 1, "down": [1], "rank": 0, "up": 8}
    assert p["algorithms"] == ["Ring", "Tree"]         # the tuning table header names no choice
    recv = p["peers"][0]
    assert (recv["src_rank"], recv["src_dev"], recv["dst_rank"], recv["direction"]) == (15, 7, 0, "receive")
    assert recv["via"] == "NET/IB/0/GDRDMA" and recv["gdr"]
    pxn = p["peers"][-1]
    assert pxn["via"] == "NET/IB/3(6)/GDRDMA" and pxn["transport"] == "NET/IB" and pxn["direction"] == "send"
    df = nccl_log.nccl_summary(p)
    assert df["link"].value_counts().to_dict() == {"InfiniBand (GPUDirect RDMA)": 4, "NVLink/P2P": 2}
    text = nccl_log.nccl_findings_text(p)
    assert "16 ranks / 2 nodes" in text and "GPUDirect RDMA, as it should" in text and "Warning" not in text


def test_nccl_socket_fallback_and_shm():
    p = nccl_log.parse_nccl_log(LOG_SOCKET)
    assert p["version"] == "2.20.5+cuda12.4" and p["hosts"] == ["gpu-b01"]
    assert p["transports"] == ["NET/Socket", "SHM"] and p["network"] == "Socket"
    assert p["net_interfaces"] == ["Socket [0]eth0:10.0.0.1<0>", "Socket [1]eth1:192.168.1.1<0>"]
    assert p["warnings"] == ["Call to ibv_open_device failed"]
    shm = p["peers"][1]
    assert (shm["channel"], shm["src_rank"], shm["dst_rank"], shm["transport"]) == (0, 0, 1, "SHM")
    assert [x["transport"] for x in p["peers"]] == ["NET/Socket", "SHM", "NET/Socket"]
    df = nccl_log.nccl_summary(p)
    assert list(df["link"]) == ["TCP socket", "shared memory (through the host)", "TCP socket"]
    text = nccl_log.nccl_findings_text(p)
    assert "TCP sockets (NET/Socket), not InfiniBand" in text and "shared memory (SHM)" in text
    assert "1 NCCL WARN" in text


def test_nccl_other_formats():
    p = nccl_log.parse_nccl_log(
        "h:1:2 [0] NCCL INFO Channel 00/0 : 3[3] -> 8[0] [send] via NET/IB/0(1)/GDRDMA\n"
        "h:1:2 [0] NCCL INFO Channel 01/0 : 0[0] -> 2[2] via P2P/indirect/1[1]\n"
        "h:1:2 [0] NCCL INFO Channel 00/0 : 1[81000] -> 0[81000] [receive] via NET/IB/1\n"
        "h:1:2 [0] NCCL INFO 24 coll channels, 24 collnet channels, 16 nvls channels, 32 p2p channels, "
        "32 p2p channels per peer\n"
        "h:1:2 [0] NCCL INFO AllReduce: 268435456 Bytes -> Algo NVLS proto Simple channel{Lo..Hi}={0..15}\n")
    assert [x["transport"] for x in p["peers"]] == ["NET/IB", "P2P/indirect", "NET/IB"]
    assert p["peers"][2]["src_dev"] == 81000 and p["algorithms"] == ["NVLS"] and "NVLS" in p["transports"]
    assert list(nccl_log.nccl_summary(p)["link"]) == ["InfiniBand (GPUDirect RDMA)", "NVLink/P2P through another GPU",
                                                  "InfiniBand (through host memory)"]
    empty = nccl_log.parse_nccl_log("plain training output\nloss 2.31\n")
    assert empty["peers"] == [] and empty["version"] is None and nccl_log.nccl_summary(empty).empty
    assert "NCCL_DEBUG=INFO" in nccl_log.nccl_findings_text(empty)


def test_layout_table_names_each_rule_in_words():
    df = topo.layout_table(8, 128, tp=8, pp=1)
    assert list(df.columns) == ["rule", "verdict", "detail"]
    assert list(df["rule"]) == [topo.RULE_LABELS[r] for r in topo.RULES]
    assert not df["rule"].str.contains("_").any() and df["verdict"].iloc[0] == "pass"
