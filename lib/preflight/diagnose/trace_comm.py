"""One rank's collectives: what each one is, from the CPU call that launched it, and how much of it ran
alone (not under compute).

**What a collective is.** A kernel's name is the weakest witness: NCCL runs an all-to-all as
``ncclKernel_SendRecv`` (send/recv pairs), and since NCCL 2.19 every collective is
``ncclDevKernel_Generic``. PyTorch wraps each call in CPU annotations on the launching thread:
``record_param_comms`` (with ``Collective name``, ``Process Group Name``, ``Group size``, sizes,
``Seq`` in PyTorch >= 2.1) and ``nccl:<op>`` (the ``c10d`` op's name, with the tensor's shape). So a
communication kernel is classified by, in order: the ``record_param_comms`` enclosing its launch, the
``nccl:*`` / ``gloo:*`` annotation enclosing it, the kernel's own ``Collective name`` argument, and
last its name. ``source`` says which one spoke.

**Exposed, and where.** A collective kernel starts when its stream reaches it and ends when every
peer has sent its share: if a peer is late, the first part of the kernel is *waiting*, the rest is the
transfer. How much of each collective ran alone is kept as its cumulative exposed time at ``SPLITS``
equal fractions of its duration, so the analysis, once it knows each rank's wait (the cross-rank
match), can split the exposed time into *waiting for a late peer* (the head) and *transfer*.
"""
from __future__ import annotations

import bisect

import numpy as np

from preflight.diagnose.trace_kernels import collective_type, dtype_bytes

SPLITS = 8


def annotations_by_thread(cpu_comms: list[dict]) -> dict:
    """tid -> (sorted starts, the annotations in that order)."""
    out: dict = {}
    for c in sorted(cpu_comms, key=lambda c: c["ts"]):
        starts, items = out.setdefault(c.get("tid", -1), ([], []))
        starts.append(c["ts"])
        items.append(c)
    return out


def enclosing(by_tid: dict, tid, t: int) -> list[dict]:
    """The annotations on thread ``tid`` that contain time ``t``, innermost first."""
    starts, items = by_tid.get(tid, ((), ()))
    i = bisect.bisect_right(starts, t)
    out = []
    for c in reversed(items[max(0, i - 16):i]):          # nesting is shallow: look at the last few that began
        if c["ts"] <= t <= c["ts"] + c["dur"]:
            out.append(c)
    return out


def _bytes(a: dict, kind: str) -> int | None:
    """Bytes a collective moves as nccl-tests counts them: the input (a reduce-scatter reduces all of it,
    each rank keeping 1/n), the output for an all-gather; else the annotation's tensor size."""
    size = dtype_bytes(a.get("dtype"))
    if size is None:
        return None
    n = a.get("In msg nelems")
    if kind == "all_gather" and isinstance(a.get("Out msg nelems"), int):
        return int(a["Out msg nelems"]) * size
    if isinstance(n, int):
        return n * size
    if isinstance(a.get("annotation_nelems"), int):
        return a["annotation_nelems"] * size
    return None


def describe(name: str, kargs: dict, anns: list[dict]) -> dict:
    """Type, process group, sequence number, group size, bytes and source of one communication kernel
    (see the module's docstring)."""
    rpc = next((c["args"] for c in anns if c["name"] == "record_param_comms"), {})
    op = next((c for c in anns if c["name"].startswith(("nccl:", "gloo:"))), None)
    if rpc.get("Collective name"):
        kind, source = collective_type("", rpc["Collective name"]), "record_param_comms"
    elif op is not None:
        kind, source = collective_type(op["name"]), op["name"]
    elif kargs.get("Collective name"):
        kind, source = collective_type(name, kargs["Collective name"]), "kernel argument"
    else:
        kind, source = collective_type(name), "kernel name"
    merged = {**(op["args"] if op else {}), **rpc, **kargs}
    seq = merged.get("Seq", merged.get("Sequence number"))
    return {"type": kind, "pg": str(merged.get("Process Group Name", "")), "seq": seq,
            "group": merged.get("Group size"), "bytes": _bytes(merged, kind), "source": source, **_p2p(merged)}


def _p2p(a: dict) -> dict:
    """A point-to-point transfer's direction and peer, from PyTorch's ``Dst Rank`` (a send) or ``Src Rank``
    (a recv) argument: the peer's rank in the process group, made global with ``Global rank start`` and
    ``Global rank stride`` where the trace has them. Both None when the trace does not say."""
    for key, direction in (("Dst Rank", "send"), ("Src Rank", "recv")):      # integers, checked by the reader
        peer = a.get(key)
        if peer is not None and peer >= 0:
            start, stride = a.get("Global rank start"), a.get("Global rank stride")
            if start is not None and start >= 0 and stride is not None and stride >= 1:
                peer = start + stride * peer
            return {"direction": direction, "peer": peer}
    return {"direction": None, "peer": None}


def exposed_profile(s: int, e: int, comp) -> list[int]:
    """Cumulative time of [s, e) not under the compute union ``comp``, at SPLITS + 1 equal fractions."""
    cs, ce = comp
    marks = [s + (e - s) * k // SPLITS for k in range(SPLITS + 1)]
    out = []
    i0 = max(0, int(np.searchsorted(ce, s, side="right")))
    for m in marks:
        covered = 0
        j = i0
        while j < len(cs) and cs[j] < m:
            covered += max(0, min(ce[j], m) - max(cs[j], s))
            j += 1
        out.append(int(m - s - covered))
    return out


def exposed_in_head(profile: list[int], dur: int, head: int) -> int:
    """Exposed time in the first ``head`` ns of a collective, from its profile (linear between marks)."""
    if dur <= 0 or head <= 0:
        return 0
    if head >= dur:
        return profile[-1]
    x = head * SPLITS / dur
    k = int(x)
    return int(profile[k] + (profile[k + 1] - profile[k]) * (x - k))
