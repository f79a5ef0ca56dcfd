"""Who talks to whom, and over which wire (pitfalls brief, section 3).

Inside a node GPUs talk over NVLink (hundreds of GB/s: 450 GB/s on H100); between nodes over
InfiniBand or Ethernet, 200-400 Gb/s = 25-50 GB/s per NIC: about 9-18x apart (the "two orders of
magnitude" of the saying holds only for a slow NIC shared by the node). So the first question about a parallel layout
is which traffic crosses nodes. Three tools here:

1. **Placement rules** on the profile's layout. Megatron-LM's default rank order puts tensor
   parallelism fastest, then data parallelism, then pipeline stages, and the launcher fills a node
   before the next::

       rank = tp_rank + tp * (dp_rank + dp * pp_stage)        node = rank // gpus_per_node

   Tensor parallelism all-reduces activations in every layer, so a TP group must sit inside one
   NVLink domain (the node; 72 GPUs on an NVL72 rack). Data-parallel groups all-reduce gradients once
   per step; crossing nodes is normal: NCCL's rings enter and leave each node once, one NIC per rank of
   the group (``preflight.models.comm``). Pipeline stages only send
   activations point-to-point, which the network carries well.
2. **``nvidia-smi topo -m``**, read into a table: the link between every pair of GPUs and NICs.
3. What NCCL really chose, from its ``NCCL_DEBUG=INFO`` log: ``preflight.diagnose.nccl_log``.
"""
from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pandas as pd

from preflight.core.findings import worst

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
RULE_LABELS = {"tp_within_node": "tensor-parallel groups inside a node", "dp_across_nodes": "data-parallel groups "
               "across nodes", "pp_boundaries": "pipeline stage boundaries", "divisible": "tp x pp divides the GPUs"}


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
                            "layer's all-reduce goes over the network (~9-18x less bandwidth than NVLink, and on the critical "
                            "path of every layer). Use tp in "
                            f"{[d for d in range(1, gpn + 1) if gpn % d == 0]}; scale across nodes with pp, dp.")
    # (d) the layout must tile the machine; (b) and (c) need it.
    divisible = gpus % (tp * pp) == 0
    dp = gpus // (tp * pp) if divisible else 0
    d = (True, "pass", f"tp * pp = {tp * pp} divides {gpus} GPUs: dp = {dp}.") if divisible else \
        (False, "fail", f"tp * pp = {tp * pp} does not divide {gpus} GPUs ({nodes} x {gpn}).")
    b = c = False, "info", "not evaluated: tp * pp does not divide the GPU count (see 'tp x pp divides the GPUs')."
    if divisible:
        b, c = _dp_rule(gpn, nodes, tp, pp, dp), _pp_rule(gpn, pp, tp * dp)
    return [{"rule": n, "ok": bool(r[0]), "verdict": r[1], "detail": r[2]} for n, r in zip(RULES, (a, b, c, d))]


def layout_table(gpus_per_node: int, nodes: int, tp: int = 1, pp: int = 1):
    """:func:`check_layout` as a table for people: the rule in words, its verdict and why."""
    import pandas as pd

    rows = check_layout(gpus_per_node, nodes, tp, pp)
    return pd.DataFrame([{"rule": RULE_LABELS[r["rule"]], "verdict": r["verdict"], "detail": r["detail"]} for r in rows])


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
                          "all-reduce crosses nodes. NCCL's rings enter and leave each node once, through one NIC per "
                          f"rank of the group in that node ({hi} here), so the NICs' bandwidth sets its time "
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
    head = (f"tp={t.tp} x pp={t.pp} x dp={profile.dp}" + (f" x cp={t.cp} (the gradients reduce over dp x cp = "
            f"{profile.replicas} ranks)" if t.cp > 1 else "") + f" on {c.nodes} nodes x {c.gpus_per_node} GPUs")
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
    for i, line in enumerate(lines):  # noqa: B007 - i is read after the loop
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
