"""Why the GPU was idle: each gap between GPU work, given the cause the trace shows.

For each gap (the GPU ran nothing, or on one stream: that stream ran nothing), the event that ends it
and the runtime call that launched that event say why (Holistic Trace Analysis's idle-time breakdown,
with its thresholds, so the numbers compare):

- **host-bound** (HTA's *host wait*): the launch began after the gap began: the CPU had not yet asked
  for the work (Python, the data loader, a synchronising call on the host...);
- **launch-bound** (HTA's *kernel wait*): the launch began before the gap, and the gap is shorter than
  ``KERNEL_WAIT_NS`` (30 us): the GPU finished each kernel before the next launch reached it. Many
  tiny kernels do this: the fix is fewer launches (CUDA graphs, ``torch.compile``, fusion, a larger
  micro-batch), not removing synchronisation;
- **queued** (HTA's *other*): the work was launched long before and still waited: on another
  stream (an event), a synchronisation, another device.

Launch statistics (per rank, for the launch-bound verdict): kernels per step, the median kernel
duration, the median launch call (``cudaLaunchKernel``) and the median launch-to-start delay (the
kernel's start minus its launch call's end).
"""
from __future__ import annotations

import numpy as np

from preflight.diagnose.intervals import before, union

KERNEL_WAIT_NS = 30_000


def _split(gap_s, gap_e, launch_s) -> dict:
    """Host-bound / launch-bound / queued time of gaps [gap_s, gap_e) ended by events launched at launch_s."""
    d = gap_e - gap_s
    host = launch_s >= gap_s
    launch = ~host & (d < KERNEL_WAIT_NS)
    return {"host": int(d[host].sum()), "launch": int(d[launch].sum()), "queued": int(d[~host & ~launch].sum())}


def gpu_idle(ts, end, launch) -> dict:
    """The whole GPU's idle gaps (its busy union's gaps), split (see the module's docstring)."""
    busy = union(ts, end)
    gs, ge = busy[1][:-1], busy[0][1:]
    if not len(gs):
        return {"host": 0, "launch": 0, "queued": 0}
    order = np.argsort(ts, kind="stable")
    first = np.searchsorted(ts[order], ge)                  # the events that start when each gap ends
    starter = order[np.clip(first, 0, len(ts) - 1)]
    return _split(gs, ge, launch[starter])


def stream_idle(ts, end, streams, launch, main) -> dict:
    """One stream's gaps (HTA works per stream): host-bound, launch-bound, covered by another stream
    (``other_stream``), and the rest (``other``)."""
    out = {"host": 0, "launch": 0, "other_stream": 0, "other": 0}
    if main is None:
        return out
    on = np.flatnonzero(streams == main)
    on = on[np.argsort(ts[on], kind="stable")]
    reach = np.maximum.accumulate(end[on])
    gap_s, gap_e, nxt = reach[:-1], ts[on][1:], on[1:]
    pos = gap_e > gap_s
    a, b, k = gap_s[pos], gap_e[pos], nxt[pos]
    rest = union(ts[streams != main], end[streams != main])
    host = launch[k] >= a
    short = ~host & ((b - a) < KERNEL_WAIT_NS)
    cov = before(rest, b) - before(rest, a)
    longer = ~host & ~short
    out.update(host=int((b - a)[host].sum()), launch=int((b - a)[short].sum()),
               other_stream=int(cov[longer].sum()), other=int((b - a - cov)[longer].sum()))
    return out


def launch_stats(ts, end, launch, launch_end, known, cats, nsteps: int) -> dict:
    """Kernels per step, median kernel, median launch call and launch-to-start delay (ns)."""
    k = np.array([c == "kernel" for c in cats], bool) if len(cats) else np.zeros(0, bool)
    kl = k & known
    med = (lambda x: int(np.median(x)) if len(x) else None)
    return {"kernels": int(k.sum()), "kernels_per_step": float(k.sum()) / max(1, nsteps),
            "median_kernel_ns": med((end - ts)[k]), "median_launch_call_ns": med((launch_end - launch)[kl]),
            "median_launch_to_start_ns": med(np.clip(ts[kl] - launch_end[kl], 0, None))}
