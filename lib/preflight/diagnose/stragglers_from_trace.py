"""Profiler traces as a per-op table: the straggler what-if for ``torch.profiler`` and Nsight Systems jobs.

The what-if (:mod:`preflight.diagnose.stragglers_whatif`) replays a step's dependency graph. A Parquet
per-op trace names its ops; a profiler trace has kernels, and this module turns each rank's window into
the same table (rank, dp rank, stage, step, op type, start, duration), per step on every rank:

- **compute ops** (type ``compute``): the compute kernels between two communication kernels
  (``trace_rank``'s ``comm.segments``: segment j ended by the time collective j began); start = its first
  kernel's start, duration = to its last kernel's end;
- **sync ops** (typed as the collective: ``all_reduce``...): each collective, one member per rank of its
  data-parallel group, which ends for all once the last has arrived;
- **p2p ops** (``forward-send``... as in the Parquet format): each send/recv whose peer rank the trace
  names (PyTorch's ``Dst Rank`` / ``Src Rank``), paired with its peer's op; the ranks linked by them form
  the pipelines, stage 0 at the lower rank.

**The graph** (per stage, the same in every step and replica): computes in order; each communication
op after the compute before it; sync ops in order, each direction of p2p in order; and a compute waits
for the communication op before it only where it began after that op ended in *every* recorded step on
every rank (a real wait always holds; an overlapped collective breaks it somewhere).

**Clocks** are not trusted across hosts: each step's times on a rank are shifted so its collectives end
when the reference rank's do (the members of a collective finish together); the median shift is used
and the largest disagreement is reported (``clock_spread_s``).

Where the traces cannot give the graph (one rank, ranks missing, no steps, collectives that differ
between ranks, groups that are not data-parallel, send/recv without a peer) :class:`NoGraph` says why:
the finding is then not computed, not guessed.
"""
from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np

from preflight.diagnose.stragglers_graph import Graph, _topological
from preflight.diagnose.stragglers_trace import Meta, OpTrace, StragglerTraceError

TOL_NS = 2_000          # a compute starting this close before a collective's end still counts as waiting for it


class NoGraph(ValueError):
    """The traces cannot give the what-if's dependency graph; the message says why."""


def _ranks(job: dict) -> dict:
    return job["ranks"] if "ranks" in job and isinstance(job["ranks"], dict) else job


def _steps(ranks: dict) -> list[int]:
    nums = {}
    for r, s in ranks.items():
        have = {x["step"] for x in s["comm"].get("segments", []) if isinstance(x.get("step"), int)}
        if not have:
            where = "NVTX step range" if s["meta"].get("nsys") else "ProfilerStep (prof.step() each step)"
            raise NoGraph(f"rank {r}'s trace has no numbered step in its window (no {where}): the ops of one step "
                          "cannot be told from the next")
        nums[r] = have
    common = sorted(set.intersection(*nums.values()))
    if not common:
        raise NoGraph("the ranks' windows share no step: profile the same steps on every rank")
    return common


def _step_ops(s: dict, step: int) -> tuple[list, list]:
    """A rank's communication kernels and compute segments in one step."""
    seg = next(x["segments"] for x in s["comm"]["segments"] if x["step"] == step)
    comm = sorted((c for c in s["comm"]["collectives"] if c["side"] == "gpu" and c["step"] == step),
                  key=lambda c: c["t0_ns"])
    return comm, seg


def _layout(ranks: dict, steps: list[int]) -> tuple[dict, int, int]:
    """rank -> (dp rank, stage), dp size, pp size: one pipeline per chain of ranks linked by send/recv."""
    links: dict = {r: set() for r in ranks}
    for r, s in ranks.items():
        for st in steps:
            for c in _step_ops(s, st)[0]:
                if c["type"] != "send_recv":
                    continue
                if c.get("peer") is None:
                    raise NoGraph(f"rank {r} has send/recv kernels without the peer rank (PyTorch's 'Dst Rank' / 'Src "
                                  "Rank' arguments; an Nsight Systems export has none): pipeline stages cannot be told "
                                  "apart")
                if c["peer"] not in ranks:
                    raise NoGraph(f"rank {r} exchanges with rank {c['peer']}, which is not traced")
                links[r].add(c["peer"])
                links[c["peer"]].add(r)
    seen, chains = set(), []
    for r in sorted(ranks):
        if r in seen:
            continue
        chain, todo = [], [r]
        while todo:
            x = todo.pop()
            if x not in seen:
                seen.add(x)
                chain.append(x)
                todo += sorted(links[x] - seen)
        ends = [x for x in chain if len(links[x]) <= 1]
        if len(chain) > 1 and (len(ends) != 2 or any(len(links[x]) > 2 for x in chain)):
            raise NoGraph(f"ranks {sorted(chain)} exchange send/recv in a pattern that is not a pipeline (a chain of "
                          "stages)")
        order, prev = [min(ends) if len(chain) > 1 else r], None
        while len(order) < len(chain):
            nxt = next(x for x in sorted(links[order[-1]]) if x != prev)
            prev = order[-1]
            order.append(nxt)
        chains.append(order)
    pp = len(chains[0])
    if any(len(c) != pp for c in chains):
        raise NoGraph(f"pipelines of different lengths ({sorted({len(c) for c in chains})} stages)")
    where = {r: (d, s) for d, c in enumerate(chains) for s, r in enumerate(c)}
    return where, len(chains), pp


def _kinds(comm: list, stage_of, stage: int) -> list[str]:
    out = []
    for c in comm:
        if c["type"] != "send_recv":
            out.append(c["type"])
            continue
        up = stage_of[c["peer"]] > stage
        out.append({("send", True): "forward-send", ("recv", False): "forward-recv", ("send", False): "backward-send",
                    ("recv", True): "backward-recv"}[(c["direction"], up)])
    return out


def convert(job: dict, name: str = "") -> tuple[OpTrace, Graph, dict]:
    """The per-op table, its graph and the clock alignment of a read job (``read_any_job``'s dict, or the
    summaries by rank); raises :class:`NoGraph` with the reason where the traces cannot give them."""
    ranks = _ranks(job)
    world = job.get("world_size") if "ranks" in job else None
    if len(ranks) < 2:
        raise NoGraph("one rank's trace: a straggler shows only across the ranks of a collective")
    if world and world > len(ranks):
        raise NoGraph(f"{len(ranks)} of {world} ranks traced: the collectives wait for ranks whose arrival is not "
                      "in the traces (trace every rank of the job)")
    steps = _steps(ranks)
    where, dp, pp = _layout(ranks, steps)
    stage_of = {r: w[1] for r, w in where.items()}
    by_cell = {w: r for r, w in where.items()}
    kinds = {}                                      # stage -> the template's communication kinds
    for r in sorted(ranks):
        st = stage_of[r]
        for step in steps:
            comm, seg = _step_ops(ranks[r], step)
            k = _kinds(comm, stage_of, st)
            for c in comm:
                if c["type"] != "send_recv" and isinstance(c.get("group"), int) and c["group"] != dp:
                    raise NoGraph(f"rank {r}'s {c['type']} runs on a process group of {c['group']} ranks, not the {dp} "
                                  "data-parallel ranks of its stage: tensor- or expert-parallel groups are not modelled")
            ref = kinds.setdefault(st, (k, r, step))
            if k != ref[0]:
                raise NoGraph(f"rank {r} step {step} runs {len(k)} communication ops ({', '.join(k[:4])}...) where rank "
                              f"{ref[1]} step {ref[2]} runs {len(ref[0])} ({', '.join(ref[0][:4])}...): the ranks of a "
                              "stage must run the same collectives in each step")
            if len(seg) != len(k) + 1:
                raise NoGraph(f"rank {r} step {step}: {len(seg)} compute segments for {len(k)} collectives")
    ops, op_of = [], {}                             # (stage, position) -> op index; position 2j compute, 2j+1 comm
    for st in range(pp):
        count: dict[str, int] = {}
        for j, kind in enumerate(["compute"] + [x for k in kinds[st][0] for x in (k, "compute")]):
            op_of[(st, j)] = len(ops)
            ops.append((st, kind, count.get(kind, 0)))
            count[kind] = count.get(kind, 0) + 1
    n, ns, nd = len(ops), len(steps), dp
    start, end = np.zeros((n, ns, nd)), np.zeros((n, ns, nd))
    for r, s in ranks.items():
        d, st = where[r]
        for si, step in enumerate(steps):
            comm, seg = _step_ops(s, step)
            prev = None
            for j, part in enumerate(seg):          # an empty segment: zero long, where the last one ended
                if part:
                    a, b = part[0], part[1]
                else:
                    a = b = prev if prev is not None else (comm[0]["t0_ns"] if comm else 0)
                start[op_of[(st, 2 * j)], si, d], end[op_of[(st, 2 * j)], si, d] = a, b
                prev = b
                if j < len(comm):
                    c = comm[j]
                    start[op_of[(st, 2 * j + 1)], si, d] = c["t0_ns"]
                    end[op_of[(st, 2 * j + 1)], si, d] = c["t0_ns"] + c["dur_ns"]
    deps, groups = _graph(ops, op_of, kinds, start, end, pp)
    shift, spread = _align(ops, groups, start, end, where, by_cell, pp)
    start, end = (start - shift) / 1e9, (end - shift) / 1e9
    base = start.min(axis=(0, 2), keepdims=True)
    rank = np.array([[by_cell[(d, st)] for st in range(pp)] for d in range(dp)])
    meta = Meta(trial_name=name or "traces", run_id=0, dp_size=dp, pp_size=pp, tp_size=1, dsp_size=1, vpp_size=1,
                world_size=dp * pp, file="")
    tr = OpTrace(path=Path(name or "traces"), meta=meta, ops=ops, steps=np.array(steps), start=start - base,
                 dur=end - start, rank=rank, typical_per_op=True)
    try:
        graph = Graph(deps=deps, **_topological(tr, deps, groups))
    except StragglerTraceError as err:
        raise NoGraph(str(err)) from None
    return tr, graph, {"clock_spread_s": spread, "steps": steps}


def _graph(ops, op_of, kinds, start, end, pp) -> tuple[list[list[int]], list[tuple[list[int], bool]]]:
    """The edges and collectives described in the module's docstring."""
    deps: list[list[int]] = [[] for _ in ops]
    groups: list[tuple[list[int], bool]] = []
    for st in range(pp):
        k = len(kinds[st][0])
        comp = [op_of[(st, 2 * j)] for j in range(k + 1)]
        comm = [op_of[(st, 2 * j + 1)] for j in range(k)]
        for a, b in zip(comp, comp[1:]):
            deps[b].append(a)
        for j, c in enumerate(comm):
            deps[c].append(comp[j])
            after = comp[j + 1]
            if (end[after] > start[after]).all() and (start[after] >= end[c] - TOL_NS).all():
                deps[after].append(c)                # began after the collective ended, every time: it waits
        for kind in set(kinds[st][0]):               # each kind of communication its own stream, in order
            same = [c for c in comm if ops[c][1] == kind]
            for a, b in zip(same, same[1:]):
                deps[b].append(a)
        for c in comm:
            t = ops[c][1]
            if t in ("forward-send", "backward-send"):
                peer = st + (1 if t == "forward-send" else -1)
                recv = "forward-recv" if t == "forward-send" else "backward-recv"
                mate = [i for i, o in enumerate(ops) if o == (peer, recv, ops[c][2])]
                if not mate:
                    raise NoGraph(f"stage {st} {t} #{ops[c][2]} has no matching {recv} on stage {peer}")
                groups.append(([c, mate[0]], False))
            elif t not in ("forward-recv", "backward-recv"):
                groups.append(([c], True))
    paired = {i for g, _ in groups for i in g}
    lone = [o for i, o in enumerate(ops) if o[1].endswith("-recv") and i not in paired]
    if lone:
        raise NoGraph(f"stage {lone[0][0]} {lone[0][1]} #{lone[0][2]} has no matching send")
    return deps, groups


def _align(ops, groups, start, end, where, by_cell, pp) -> tuple[np.ndarray, float | None]:
    """Per step and rank, the shift (ns) that makes each collective end when the reference rank's does."""
    n, ns, nd = start.shape
    shift = np.zeros((n, ns, nd))
    spread = 0.0
    for si in range(ns):
        diffs: dict = {}                                     # (cell a, cell b) -> end differences b - a
        for members, across in groups:
            cells = [(d, ops[m][0], m) for m in members for d in range(nd)] if across else \
                [(d, ops[m][0], m) for d in range(nd) for m in members]
            for (d0, s0, m0), (d1, s1, m1) in zip(cells, cells[1:]):
                if across or d0 == d1:
                    diffs.setdefault(((d0, s0), (d1, s1)), []).append(end[m1, si, d1] - end[m0, si, d0])
        off = {(0, 0): 0.0}
        todo = [(0, 0)]
        while todo:
            a = todo.pop()
            for (x, y), v in diffs.items():
                for p, q, sign in ((x, y, 1), (y, x, -1)):
                    if p == a and q not in off:
                        off[q] = off[a] + sign * statistics.median(v)
                        todo.append(q)
        if len(off) < nd * pp:
            raise NoGraph("the ranks share no collective in a step: their clocks cannot be lined up")
        for (d, st), o in off.items():
            rows = [i for i, op in enumerate(ops) if op[0] == st]
            shift[rows, si, d] = o
        for (x, y), v in diffs.items():
            spread = max(spread, max(abs(e - (off[y] - off[x])) for e in v))
    return shift, float(spread) / 1e9


def what_if(job: dict, name: str = "") -> dict:
    """``{"result": the what-if (stragglers_whatif.analyze_trace)}`` of a read job, or ``{"why": the reason}``
    where the traces cannot give its graph."""
    from preflight.diagnose.stragglers_whatif import analyze_trace

    ranks = _ranks(job)
    kind = "Nsight Systems exports" if any(s["meta"].get("nsys") for s in ranks.values()) else "torch.profiler traces"
    try:
        tr, graph, info = convert(job, name)
    except NoGraph as err:
        return {"why": str(err), "source": kind}
    what = f"{kind} of {len(ranks)} ranks"
    res = analyze_trace(tr, graph, folder=name, trace=what, per_rank=True,
                        source=f"computed from the {what} in {name} (compute between collectives, collectives and "
                               "send/recv as ops; what-if replay, arXiv 2505.05713)")
    res["quality"]["clock_spread_s"] = info["clock_spread_s"]
    return {"result": res, "source": kind}
