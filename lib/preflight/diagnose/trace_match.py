"""Ranks compared with each other, without trusting the hosts' clocks: which steps they share, how their
step times spread, and who waited in collectives for whom.

**Steps first.** Each rank's profiler window may start at a different step (``schedule(wait=...)``
counted per process, a rank that joined late): comparing "the first collective" of each would match
collectives of different steps. Ranks are compared on the ``ProfilerStep`` numbers they all hold
(``aligned``); when the windows differ, the analysis says so, and with no step in common nothing is
matched.

**Step-time spread** on the aligned steps: each rank's median step time, the first aligned step left
out when two or more remain (a rank's first step may begin well before the first synchronisation,
which makes it long on one rank only), then (slowest - fastest) / median across ranks.

**Collective wait.** The same collective is found on every rank of its group: by process group and
sequence number where the trace has them, else by step, process group, type and order within the
step. Its shortest duration is the transfer; the rest, on each rank, is waiting for the slowest peer
(the head of the kernel: it starts, then waits). The rank whose copy is the shortest arrived last.
Per rank: the wait (the union of the waiting heads, so never more than the window), the part of it
that ran alone (not under compute: ``trace_comm.exposed_in_head``), per collective type, and per
collective (for the critical path). Point-to-point send/recv is not matched (its peer is one rank).
"""
from __future__ import annotations

import statistics

import numpy as np

from preflight.diagnose.intervals import length, union
from preflight.diagnose.trace_comm import exposed_in_head


def _span(nums: list[int]) -> str:
    return f"{min(nums)}-{max(nums)}" if nums else "none"


def aligned(ranks: dict) -> tuple[set | None, str | None]:
    """The step numbers every rank with steps holds, and a note when the windows differ."""
    nums = {r: sorted({st["num"] for st in s["steps"] if isinstance(st.get("num"), int)}) for r, s in ranks.items()}
    nums = {r: v for r, v in nums.items() if v}
    if len(nums) < 2:
        return None, None
    common = set.intersection(*(set(v) for v in nums.values()))
    if all(set(v) == common for v in nums.values()):
        return common, None
    held = "; ".join(f"rank {r}: steps {_span(v)}" for r, v in sorted(nums.items())[:6])
    if not common:
        return common, (f"the ranks' profiler windows share no step ({held}): collectives are not matched and the "
                        "step spread is not judged (profile the same steps on every rank)")
    return common, (f"the ranks' profiler windows do not align ({held}): compared on the {len(common)} step(s) "
                    f"they share ({_span(sorted(common))})")


def step_times(ranks: dict, common: set | None) -> dict:
    """Rank -> median step time (ns) on the aligned steps (see the module's docstring)."""
    out = {}
    for r, s in ranks.items():
        steps = [st for st in s["steps"] if common is None or st.get("num") in common]
        if len(steps) >= 3:
            steps = steps[1:]
        if steps:
            out[r] = statistics.median(st["dur_ns"] for st in steps)
    return out


def _keys(colls: list[dict], common: set | None) -> list[tuple | None]:
    count: dict[tuple, int] = {}
    out = []
    for c in colls:
        if common is not None and c.get("step") not in common:
            out.append(None)
        elif c["seq"] is not None:
            out.append((c["pg"], "seq", c["seq"]))
        else:
            k = (c.get("step"), c["pg"], c["type"])
            count[k] = count.get(k, 0) + 1
            out.append(k + (count[k],))
    return out


def collective_wait(ranks: dict, common: set | None = None) -> dict:
    """Matched collectives across ranks (see the module's docstring): {matched, unmatched, wait_ns,
    exposed_wait_ns, exposed_wait_by_type, wait_by_coll, last}."""
    table: dict[tuple, dict] = {}
    for r, s in ranks.items():
        colls = [(j, c) for j, c in enumerate(s["comm"]["collectives"]) if c["type"] != "send_recv"]
        for key, (j, c) in zip(_keys([c for _, c in colls], common), colls):
            if key is not None:
                table.setdefault(key, {})[r] = (j, c)
    heads: dict = {r: ([], []) for r in ranks}
    exposed = {r: 0 for r in ranks}
    by_type: dict = {r: {} for r in ranks}
    by_coll: dict = {r: {} for r in ranks}
    last = {r: 0 for r in ranks}
    matched = 0
    for per in table.values():
        if len(per) < 2:
            continue
        matched += 1
        low = min(c["dur_ns"] for _, c in per.values())
        for r, (j, c) in per.items():
            w = c["dur_ns"] - low
            if w <= 0:
                continue
            t0 = c.get("t0_ns") or 0
            heads[r][0].append(t0)
            heads[r][1].append(t0 + w)
            ex = exposed_in_head(c["exposed"], c["dur_ns"], w) if c.get("side") == "gpu" and c.get("exposed") else 0
            exposed[r] += ex
            by_type[r][c["type"]] = by_type[r].get(c["type"], 0) + ex
            by_coll[r][j] = w
        if max(c["dur_ns"] for _, c in per.values()) > low:      # someone waited: the shortest copy came last
            last[min(per, key=lambda r: per[r][1]["dur_ns"])] += 1
    wait = {r: length(union(np.array(h[0], np.int64), np.array(h[1], np.int64))) for r, h in heads.items()}
    return {"matched": matched, "unmatched": sum(1 for p in table.values() if len(p) < 2), "wait_ns": wait,
            "exposed_wait_ns": exposed, "exposed_wait_by_type": by_type, "wait_by_coll": by_coll, "last": last}
