"""What NCCL really chose, read from an ``NCCL_DEBUG=INFO`` log (pitfalls brief, section 3).

The NCCL version, the transport each connection took (NVLink P2P, shared memory, InfiniBand with
GPUDirect RDMA, or a TCP-socket fallback), the rings, trees, channels and algorithms. Read this before
touching NCCL_P2P_DISABLE and friends: a job whose inter-node traffic fell back to ``NET/Socket`` runs
at a fraction of the fabric's speed and says so only here.
"""
from __future__ import annotations

import re

import pandas as pd

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
