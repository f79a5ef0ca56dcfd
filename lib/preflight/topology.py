"""Who talks to whom, and over which wire (pitfalls brief, section 3).

Inside a node GPUs talk over NVLink (hundreds of GB/s); between nodes over InfiniBand or Ethernet
(25-200 Gb/s per GPU): two orders of magnitude apart. So the first question about a parallel layout
is which traffic crosses nodes. Three tools here:

1. **Placement rules** on the profile's layout. Megatron-LM's default rank order puts tensor
   parallelism fastest, then data parallelism, then pipeline stages, and the launcher fills a node
   before the next::

       rank = tp_rank + tp * (dp_rank + dp * pp_stage)        node = rank // gpus_per_node

   Tensor parallelism all-reduces activations in every layer, so a TP group must sit inside one
   node. Data-parallel groups all-reduce gradients once per step; crossing nodes is normal, and NCCL
   makes it hierarchical (NVLink inside the node first, then the network). Pipeline stages only send
   activations point-to-point, which the network carries well.
2. **``nvidia-smi topo -m``**, read into a table: the link between every pair of GPUs and NICs.
3. **``NCCL_DEBUG=INFO`` logs**, parsed: the NCCL version, the transport each connection really
   took (NVLink P2P, shared memory, InfiniBand with GPUDirect RDMA, or a TCP-socket fallback), the
   rings, trees, channels and algorithms. Read this before touching NCCL_P2P_DISABLE and friends.
"""
from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pandas as pd

from preflight.findings import worst

# ---------------------------------------------------------------- 1. placement rules


def _check_sizes(gpus: int, gpus_per_node: int, tp: int, pp: int) -> None:
    if min(gpus, gpus_per_node, tp, pp) < 1:
        raise ValueError(f"gpus, gpus_per_node, tp, pp must be >= 1 (got {gpus}, {gpus_per_node}, {tp}, {pp})")


def rank_groups(gpus: int, gpus_per_node: int, tp: int = 1, pp: int = 1) -> pd.DataFrame:
    """One row per rank: rank, node, local_rank, tp_group, dp_group, pp_stage (and tp_rank, dp_rank).

    Megatron order (TP fastest, then DP, then PP); groups are numbered from 0. A TP group is ``tp``
    consecutive ranks; a DP group is the ranks with the same pipeline stage and TP rank.
    """
    _check_sizes(gpus, gpus_per_node, tp, pp)
    if gpus % (tp * pp):
        raise ValueError(f"tp * pp = {tp * pp} must divide the GPU count {gpus}")
    dp = gpus // (tp * pp)
    r = np.arange(gpus)
    tp_rank, stage = r % tp, r // (tp * dp)
    return pd.DataFrame({"rank": r, "node": r // gpus_per_node, "local_rank": r % gpus_per_node,
                         "tp_group": r // tp, "dp_group": stage * tp + tp_rank, "pp_stage": stage,
                         "tp_rank": tp_rank, "dp_rank": (r // tp) % dp})


RULES = ("tp_within_node", "dp_across_nodes", "pp_boundaries", "divisible")


def check_layout(gpus_per_node: int, nodes: int, tp: int = 1, pp: int = 1) -> list[dict]:
    """The four placement rules, each ``{rule, ok, verdict, detail}`` (verdict: pass|warn|fail|info).

    ``tp_within_node`` (fail if a TP group straddles nodes), ``dp_across_nodes`` (how many nodes a
    DP group spans), ``pp_boundaries`` (stage boundaries that cross nodes: fine), ``divisible``
    (tp * pp divides the GPU count). Computed on rank arithmetic, so it scales to any cluster.
    """
    gpus, gpn = gpus_per_node * nodes, gpus_per_node
    _check_sizes(gpus, gpn, tp, pp)
    # (a) tensor parallelism all-reduces activations in every layer: NVLink only.
    if tp == 1:
        a = True, "pass", "tp=1: no tensor-parallel traffic."
    elif tp <= gpn and gpn % tp == 0:
        a = True, "pass", (f"each of the {gpus // tp} tensor-parallel groups ({tp} GPUs) sits inside one node: "
                           "its per-layer all-reduces stay on NVLink.")
    else:
        starts = np.arange(0, gpus - tp + 1, tp)
        crossing = int(np.count_nonzero(starts // gpn != (starts + tp - 1) // gpn))
        why = f"tp={tp} > {gpn} GPUs per node" if tp > gpn else f"tp={tp} does not divide {gpn} GPUs per node"
        a = False, "fail", (f"{why}: {crossing} of {len(starts)} tensor-parallel groups straddle nodes, so every "
                            "layer's all-reduce goes over the network (~100x slower than NVLink). Use tp in "
                            f"{[d for d in range(1, gpn + 1) if gpn % d == 0]}; scale across nodes with pp, dp.")
    # (d) the layout must tile the machine; (b) and (c) need it.
    divisible = gpus % (tp * pp) == 0
    dp = gpus // (tp * pp) if divisible else 0
    d = (True, "pass", f"tp * pp = {tp * pp} divides {gpus} GPUs: dp = {dp}.") if divisible else \
        (False, "fail", f"tp * pp = {tp * pp} does not divide {gpus} GPUs ({nodes} x {gpn}).")
    b = c = False, "info", "not evaluated: tp * pp does not divide the GPU count (see rule 'divisible')."
    if divisible:
        b, c = _dp_rule(gpn, nodes, tp, pp, dp), _pp_rule(gpn, pp, tp * dp)
    return [{"rule": n, "ok": bool(r[0]), "verdict": r[1], "detail": r[2]} for n, r in zip(RULES, (a, b, c, d))]


def _dp_rule(gpn: int, nodes: int, tp: int, pp: int, dp: int) -> tuple:
    """(b) one gradient all-reduce per step over each DP group: how many nodes, how many GPUs each."""
    if dp == 1:
        return True, "pass", "dp=1: no gradient all-reduce."
    members = np.arange(tp)[None, :, None] + tp * (np.arange(dp)[None, None, :] + dp * np.arange(pp)[:, None, None])
    node = (members // gpn).reshape(tp * pp, dp)                 # one row per DP group, sorted along dp
    span = 1 + int(np.count_nonzero(np.diff(node, axis=1), axis=1).max())
    per_node = np.unique(node + (nodes + 1) * np.arange(tp * pp)[:, None], return_counts=True)[1]
    lo, hi = int(per_node.min()), int(per_node.max())
    head = f"{tp * pp} data-parallel group{'s' * (tp * pp > 1)} of {dp} ranks"
    if span == 1:
        return True, "pass", f"{head}, each inside one node: the gradient all-reduce stays on NVLink."
    if lo != hi:
        return False, "warn", (f"{head} span up to {span} nodes with {lo} to {hi} members per node: uneven, the "
                               f"busiest node sets the pace. Make tp divide {gpn} and tp * dp a multiple of it.")
    alone = (" One member per node: no NVLink stage, every byte crosses the network, and the "
             f"{gpn} groups of a node share its NICs.") if hi == 1 else ""
    return True, "info", (f"{head}, each spanning {span} nodes ({hi} GPU{'s' * (hi > 1)} per node): the gradient "
                          "all-reduce crosses nodes. NCCL does it hierarchically (reduce inside the node over "
                          "NVLink first, then across nodes), so the per-GPU inter-node bandwidth sets its time "
                          f"(models/comm.py).{alone}")


def _pp_rule(gpn: int, pp: int, block: int) -> tuple:
    """(c) stage s sends activations to stage s+1 (``block`` = tp * dp ranks later): which cross nodes."""
    if pp == 1:
        return True, "pass", "pp=1: no pipeline stages."
    r = np.arange((pp - 1) * block)
    cross = int(np.count_nonzero((r // gpn != (r + block) // gpn).reshape(pp - 1, block).any(axis=1)))
    return True, "pass", (f"{cross} of {pp - 1} stage boundaries cross nodes: point-to-point sends of one "
                          "micro-batch's activations, small next to TP/DP traffic; the network is fine.")


def layout_verdict(profile) -> tuple[str, str]:
    """Worst verdict of :func:`check_layout` on a Profile, and one message naming what matters."""
    c, t = profile.cluster, profile.training
    rules = check_layout(c.gpus_per_node, c.nodes, t.tp, t.pp)
    verdict = worst(r["verdict"] for r in rules)
    head = f"tp={t.tp} x pp={t.pp} x dp={profile.dp} on {c.nodes} nodes x {c.gpus_per_node} GPUs"
    # the worst rules if something is wrong, else the informative ones (e.g. DP crossing nodes)
    notes = [r["detail"] for r in rules if r["verdict"] == (verdict if verdict in ("warn", "fail") else "info")]
    return verdict, f"{head}: " + (" ".join(notes) if notes else "every rule passes.")


# ---------------------------------------------------------------- 2. nvidia-smi topo -m

LINK_MEANING = {
    "X": "self",
    "NV#": "NVLink: a bonded set of # NVLinks (through NVSwitch on HGX/DGX nodes); the fast path",
    "PIX": "PCIe, at most one PCIe bridge (same switch): good for P2P and GPUDirect RDMA",
    "PXB": "PCIe, several bridges but not the host bridge: P2P and GPUDirect RDMA usually fine",
    "PHB": "PCIe through a host bridge (the CPU): P2P often slower or off",
    "NODE": "PCIe plus the link between host bridges inside one NUMA node: P2P usually off",
    "SYS": "PCIe plus the CPU-socket interconnect (QPI/UPI/xGMI): slowest; traffic goes via host memory",
    "SOC": "old name for SYS",
}


def link_meaning(code: str) -> str:
    """LINK_MEANING for one cell, e.g. 'NV18' -> the NV# text with 18 links."""
    m = re.fullmatch(r"NV(\d+)", code.strip())
    if m:
        return LINK_MEANING["NV#"].replace("#", m.group(1))
    return LINK_MEANING.get(code.strip(), "unknown")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ATTR = ("Affinity", "NUMA ID")   # header cells that are properties, not devices


def parse_topo_matrix(text: str) -> pd.DataFrame:
    """The matrix of ``nvidia-smi topo -m``: index and device columns GPU0.., NIC0.. holding link codes
    (X, NV#, PIX, PXB, PHB, NODE, SYS), then the 'CPU Affinity', 'NUMA Affinity', 'GPU NUMA ID' columns
    as printed ('' where a row has none, e.g. NICs). ``df.attrs['nic_names']`` maps NIC0 -> mlx5_0."""
    lines = [_ANSI.sub("", line) for line in text.splitlines()]
    for i, line in enumerate(lines):
        header = [c.strip() for c in line.split("\t")]
        if "GPU0" in header:
            break
    else:
        raise ValueError("no header with GPU0: not `nvidia-smi topo -m` output")
    cols = [c for c in header if c]
    ndev = sum(1 for c in cols if not any(a in c for a in _ATTR))
    labels, rows = [], []
    for line in lines[i + 1:]:
        if not line.strip():
            break
        cells = [c.strip() for c in line.split("\t")]
        links = (cells[1:ndev + 1] + [""] * ndev)[:ndev]
        attrs = [c for c in cells[ndev + 1:] if c]          # some versions print an empty cell here
        attrs = (attrs + [""] * len(cols))[:len(cols) - ndev]
        labels.append(cells[0])
        rows.append(links + attrs)
    df = pd.DataFrame(rows, index=pd.Index(labels, name="device"), columns=cols)
    df.attrs["nic_names"] = dict(re.findall(r"^\s*(NIC\d+)\s*:\s*(\S+)", "\n".join(lines[i:]), re.MULTILINE))
    return df


def gpu_links(df: pd.DataFrame) -> pd.DataFrame:
    """Each GPU pair once: gpu_a, gpu_b, link code and its meaning."""
    gpus = [g for g in df.index if g.startswith("GPU")]
    rows = [(a, b, df.loc[a, b], link_meaning(df.loc[a, b])) for i, a in enumerate(gpus) for b in gpus[i + 1:]]
    return pd.DataFrame(rows, columns=["gpu_a", "gpu_b", "link", "meaning"])


def nvidia_smi_topo(run: bool = True) -> pd.DataFrame | None:
    """``nvidia-smi topo -m`` on this machine, parsed; None without the binary, on error, or run=False."""
    exe = shutil.which("nvidia-smi") if run else None
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "topo", "-m"], check=False, capture_output=True, text=True, timeout=10)
        return parse_topo_matrix(out.stdout) if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


# ---------------------------------------------------------------- 3. NCCL_DEBUG=INFO logs

# Each line: "host:pid:tid [dev] NCCL INFO message"; WARN lines put "file.cc:123" before "NCCL WARN";
# srun --label or torchrun may add their own prefix.
_PREFIX = re.compile(r"(?P<host>[^\s:]+):\d+:\d+ \[\d+\] (?:.*? )?NCCL (?P<level>INFO|WARN|TRACE) (?P<msg>.*)")
_PEER = re.compile(r"Channel\s+(\d+)(?:/\d+)?\s*:\s*(\d+)\[(\w+)\]\s*->\s*(\d+)\[(\w+)\]\s*"
                   r"(?:\[(send|receive)\]\s*)?via\s+(.+?)\s*$")
_RING = re.compile(r"Channel\s+(\d+)/(\d+)\s*:((?:\s+\d+)+)\s*$")
_TREE = re.compile(r"\[(\d+)\]\s+(-?\d+)/(-?\d+)/(-?\d+)->(-?\d+)->(-?\d+)")
_CHANNELS = re.compile(r"(\d+) coll channels, (\d+) collnet channels, (\d+) nvls channels, "
                       r"(\d+) p2p channels, (\d+) p2p channels per peer")
_ALGO = re.compile(r"\balgo(?:rithm)?\b\s*[:=]?\s*([A-Za-z_]+|\d+)\b", re.IGNORECASE)
# NCCL's algorithm enum (2.21: Tree, Ring, CollNetDirect, CollNetChain, NVLS, NVLSTree; 2.23 adds PAT)
_ALGO_IDS = ["Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT"]
_ALGO_NAMES = {a.upper(): a for a in _ALGO_IDS} | {"NVLS_TREE": "NVLSTree", "COLLNET_DIRECT": "CollNetDirect",
                                                    "COLLNET_CHAIN": "CollNetChain", "COLLNET": "CollNet"}


def _dev(s: str) -> int | str:
    return int(s) if s.isdigit() else s        # nvmlDev (2.12+) or PCI busId (older)


def _transport(via: str) -> str:
    """'P2P/CUMEM/read' -> 'P2P/CUMEM', 'SHM/direct/direct' -> 'SHM', 'NET/IB/0(1)/GDRDMA' -> 'NET/IB'."""
    kind, _, rest = via.partition("/")
    if kind == "P2P" and rest:
        return f"P2P/{re.split(r'[/ ]', rest)[0]}"      # CUMEM, IPC, direct (pointer), indirect
    return f"NET/{rest.split('/')[0]}" if kind == "NET" and rest else kind.split()[0]


def parse_nccl_log(text: str) -> dict:
    """What NCCL chose, from an ``NCCL_DEBUG=INFO`` log (one rank's, or several concatenated).

    Keys: version, hosts, nranks, nnodes, transports (sorted list), network ('IB', 'Socket', a plugin
    name), net_plugin, net_interfaces (e.g. 'IB [0]mlx5_0:1/IB'), channels {coll, collnet, nvls, p2p,
    p2p_per_peer, ring_lines} (the last communicator's counts), rings (rank orders), trees,
    algorithms, peers [{channel, src_rank, src_dev, dst_rank, dst_dev, direction, via, transport,
    gdr}], warnings (NCCL WARN lines).
    """
    out = {"version": None, "hosts": set(), "nranks": None, "nnodes": None, "transports": set(),
           "network": None, "net_plugin": None, "net_interfaces": [], "channels": {"ring_lines": 0},
           "rings": [], "trees": [], "algorithms": set(), "peers": [], "warnings": []}
    for line in text.splitlines():
        m = _PREFIX.search(line)
        msg = m.group("msg").strip() if m else line.strip()
        if m:
            out["hosts"].add(m.group("host"))
            if m.group("level") == "WARN":
                out["warnings"].append(msg)
        if v := re.search(r"NCCL version (\S+)", msg):
            out["version"] = v.group(1)
        if v := re.search(r"\bnRanks (\d+) nNodes (\d+)", msg):          # 2.18+; older: nranks only
            out["nranks"], out["nnodes"] = int(v.group(1)), int(v.group(2))
        elif (v := re.search(r"\bnranks[ =](\d+)", msg)) and out["nranks"] is None:
            out["nranks"] = int(v.group(1))
        if v := re.match(r"NET/(\S+)\s*: Using (.+?)\s*$", msg):
            out["net_interfaces"] += [f"{v.group(1)} {i}" for i in re.findall(r"\[\d+\]\S+", v.group(2))]
        if v := re.match(r"Using network (.+?)\s*$", msg):
            out["network"] = v.group(1)
        if v := re.match(r"NET/Plugin\s*: (?:Using (internal) network|Loaded (?:net|coll) plugin (.+?)\s*$)", msg):
            out["net_plugin"] = v.group(1) or v.group(2)
        if v := _CHANNELS.search(msg):
            keys = ("coll", "collnet", "nvls", "p2p", "p2p_per_peer")
            out["channels"].update(dict(zip(keys, map(int, v.groups()))))
            if int(v.group(3)):
                out["transports"].add("NVLS")
        if re.search(r"\bNVLS comm\b|\bconnected\s+(?:all\s+)?nvls", msg, re.IGNORECASE):
            out["transports"].add("NVLS")
        if re.search(r"\bconnected\s+(?:all\s+)?collnet|\bcollnet\s+(?:chains|direct)\b", msg, re.IGNORECASE):
            out["transports"].add("CollNet")
        if p := _PEER.search(msg):
            ch, sr, sd, dr, dd, direction, via = p.groups()
            t = _transport(via)
            out["transports"].add(t)
            out["peers"].append({"channel": int(ch), "src_rank": int(sr), "src_dev": _dev(sd), "dst_rank": int(dr),
                                 "dst_dev": _dev(dd), "direction": direction or "", "via": via, "transport": t,
                                 "gdr": "GDRDMA" in via})
        elif r := _RING.search(msg):
            out["rings"].append([int(x) for x in r.group(3).split()])
            out["channels"]["ring_lines"] += 1
        elif msg.startswith("Trees"):
            out["trees"] += [{"channel": int(c), "down": [int(x) for x in (d0, d1, d2) if x != "-1"],
                              "rank": int(me), "up": int(up)} for c, d0, d1, d2, me, up in _TREE.findall(msg)]
        for a in _ALGO.findall(msg):
            name = _ALGO_IDS[int(a)] if a.isdigit() and int(a) < len(_ALGO_IDS) else _ALGO_NAMES.get(a.upper())
            if name:
                out["algorithms"].add(name)
                if name.startswith("CollNet"):
                    out["transports"].add("CollNet")
    for k in ("hosts", "transports", "algorithms"):
        out[k] = sorted(out[k])
    return out


_LINKS = {"P2P/indirect": "NVLink/P2P through another GPU", "SHM": "shared memory (through the host)",
          "NET/Socket": "TCP socket", "COLLNET": "CollNet (in-network reduction)"}


def _link(t: str, gdr: bool) -> str:
    rdma = " (GPUDirect RDMA)" if gdr else " (through host memory)"
    if t in _LINKS:
        return _LINKS[t]
    if t.startswith("P2P"):
        return "NVLink/P2P"
    if t.startswith("NET/"):      # NET/IB covers RoCE too (same verbs); other names are net plugins
        return ("InfiniBand" if t.startswith("NET/IB") else f"network plugin {t[4:]}") + rdma
    return t


def nccl_summary(parsed: dict) -> pd.DataFrame:
    """The peers of :func:`parse_nccl_log` as a table, with a plain-words ``link`` column."""
    cols = ["channel", "src_rank", "src_dev", "dst_rank", "dst_dev", "direction", "via", "transport", "gdr"]
    df = pd.DataFrame(parsed["peers"], columns=cols)
    df["link"] = [_link(t, g) for t, g in zip(df["transport"], df["gdr"])]
    return df


def nccl_findings_text(parsed: dict) -> str:
    """One paragraph: what NCCL used, and what looks wrong (TCP between nodes, SHM inside a node...)."""
    if not (parsed["version"] or parsed["peers"] or parsed["rings"]):
        return ("No NCCL INFO lines found: run with NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS=INIT,NET) and pass "
                "the log of at least rank 0.")
    t, ch = set(parsed["transports"]), parsed["channels"]
    where = (f" on {parsed['nranks']} ranks" if parsed["nranks"] else "") + (
        f" / {parsed['nnodes']} nodes" if parsed["nnodes"] else "")
    head = (f"NCCL {parsed['version'] or '(version not in log)'}{where} used "
            f"{', '.join(sorted(t)) or 'no logged transport'}"
            + (f" with {ch['coll']} collective channels" if "coll" in ch else "")
            + (f"; algorithms seen: {', '.join(parsed['algorithms'])}" if parsed["algorithms"] else ""))
    s = [head + "."]
    if "NET/Socket" in t:
        s.append("Warning: inter-node traffic goes over TCP sockets (NET/Socket), not InfiniBand: expect a "
                 "fraction of the network's bandwidth. Check NCCL_IB_DISABLE, NCCL_IB_HCA, that libibverbs and "
                 "the IB driver load in the job, and NCCL_SOCKET_IFNAME.")
    ib = [p for p in parsed["peers"] if p["transport"].startswith("NET/IB")]
    if ib and not any(p["gdr"] for p in ib):
        s.append("InfiniBand runs without GPUDirect RDMA (no /GDRDMA): data is staged through host memory; "
                 "check the nvidia_peermem module and NCCL_NET_GDR_LEVEL.")
    elif ib:
        s.append("Inter-node traffic uses InfiniBand with GPUDirect RDMA, as it should.")
    if "SHM" in t:
        s.append("Warning: some GPUs on one node talk through shared memory (SHM), not P2P: expected only "
                 "across CPU sockets without NVLink; on an NVLink node look for NCCL_P2P_DISABLE, a container "
                 "without IPC access, or a GPU count split over processes that cannot map each other.")
    if parsed["warnings"]:
        s.append(f"{len(parsed['warnings'])} NCCL WARN line(s), first: {parsed['warnings'][0]}")
    return " ".join(s)
