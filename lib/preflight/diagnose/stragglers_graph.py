"""The dependency graph of one training step, built from the ops one worker of each stage runs.

A step of Megatron-style 3D-parallel training is a graph of operations. Inside a worker, each op waits
for the ops before it on its stream; across workers, a collective completes only once every member has
reached it. The edges modelled here (one-forward-one-backward pipeline schedule, no interleaving):

- **compute stream**: the forward and backward computes run one after another, in the order the
  template worker ran them;
- **pipeline send/recv**: each of forward-send, forward-recv, backward-send, backward-recv is its own
  stream; send k follows compute k of its direction; recv k precedes compute k and follows compute k-1
  (it is posted once the previous microbatch is done); the first backward recv is posted after the
  forward compute just before the first backward. Send k on stage s and recv k on its peer stage are one
  transfer (**pair group**);
- **data-parallel stream**: params-all-gather and grads-reduce-scatter in their recorded order; the first
  forward compute waits for the last all-gather (its parameters). Each is a collective over the dp ranks
  of its stage (**dp group**);
- **step tail**: gc after the last compute, then layernorm-grads-all-reduce, embedding-grads-all-reduce
  (first and last stage, one group per dp rank), the grads reduce-scatters, optimizer-clip-main-grad (the
  gradient norm: one group over every stage and dp rank) and the optimizer.

The graph is built once from the first recorded step of dp rank 0 and holds for every step and replica
(they share the program); :func:`build` refuses a trace the model does not fit (a send with no peer, a
cycle) with the reason.
"""
from __future__ import annotations

from dataclasses import dataclass

from preflight.diagnose.stragglers_trace import COMPUTE, DP_COMM, P2P, OpTrace, StragglerTraceError

PEER = {"forward-send": ("forward-recv", +1), "backward-send": ("backward-recv", -1)}


@dataclass
class Graph:
    """``deps[n]``: the ops (same worker, same step) op n waits for. ``groups``: the collectives, each a list
    of ops that complete together; ``across_dp[g]`` says group g also spans the data-parallel ranks.
    ``order``: the groups and single ops (as 1-lists, ``across_dp`` False, ``collective`` False) in an
    order where every op comes after what it waits for."""
    deps: list[list[int]]
    order: list[list[int]]
    collective: list[bool]
    across_dp: list[bool]


def _chain(deps: list[list[int]], ops: list[int]) -> None:
    for a, b in zip(ops, ops[1:]):
        deps[b].append(a)


def build(tr: OpTrace) -> Graph:
    n = len(tr.ops)
    where = {op: i for i, op in enumerate(tr.ops)}
    t0 = tr.start[:, 0, 0]               # the template worker: first step, dp rank 0
    pp = tr.meta.pp_size
    deps: list[list[int]] = [[] for _ in range(n)]
    groups: list[tuple[list[int], bool]] = []          # (members, across dp)

    def of(stage: int, optype: str) -> list[int]:
        """This stage's ops of one type, in seq_id order."""
        return sorted((i for i, (s, t, _) in enumerate(tr.ops) if s == stage and t == optype), key=lambda i: tr.ops[i][2])

    for s in range(pp):
        comp = sorted((i for i, (st, t, _) in enumerate(tr.ops) if st == s and t in COMPUTE), key=lambda i: (t0[i], i))
        _chain(deps, comp)
        for kind in ("forward", "backward"):
            c = of(s, f"{kind}-compute")
            for p2p in ("send", "recv"):
                comm = of(s, f"{kind}-{p2p}")
                _chain(deps, comm)
                if comm and len(comm) != len(c):
                    raise StragglerTraceError(
                        f"{tr.path}: stage {s} has {len(comm)} {kind}-{p2p} for {len(c)} {kind}-compute; Preflight "
                        "models one pipeline transfer per microbatch (one-forward-one-backward, no interleaving)")
                for k, op in enumerate(comm):
                    if p2p == "send":
                        deps[op].append(c[k])
                    else:
                        deps[c[k]].append(op)
                        if k:
                            deps[op].append(c[k - 1])
        first_b = next((j for j, i in enumerate(comp) if tr.ops[i][1] == "backward-compute"), None)
        recv = of(s, "backward-recv")
        if recv and first_b:                               # posted after the last forward before it
            deps[recv[0]].append(comp[first_b - 1])
        dp_stream = sorted((i for t in DP_COMM for i in of(s, t)), key=lambda i: (t0[i], i))
        _chain(deps, dp_stream)
        gather = of(s, "params-all-gather")
        fwd = of(s, "forward-compute")
        if gather and fwd:
            deps[fwd[0]].append(gather[-1])
        tail = [i for t in ("gc", "layernorm-grads-all-reduce", "embedding-grads-all-reduce") for i in of(s, t)]
        tail += of(s, "grads-reduce-scatter") + of(s, "optimizer-clip-main-grad") + of(s, "optimizer")
        if comp and tail:
            deps[tail[0]].append(max(comp, key=lambda i: (t0[i] + tr.dur[i, 0, 0], i)))
        _chain(deps, tail)
        groups += [([i], True) for t in DP_COMM for i in of(s, t)]
        for send, (recv_type, step) in PEER.items():
            for op in of(s, send):
                peer = (s + step, recv_type, tr.ops[op][2])
                if peer not in where:
                    raise StragglerTraceError(f"{tr.path}: stage {s} {send} #{tr.ops[op][2]} has no {recv_type} on "
                                              f"stage {s + step}; a pipeline transfer needs both ends")
                groups.append(([op, where[peer]], False))
    for t, across in (("embedding-grads-all-reduce", False), ("optimizer-clip-main-grad", True)):
        members = [i for s in range(pp) for i in of(s, t)]
        if members:
            groups.append((members, across))
    paired = {i for members, _ in groups for i in members}
    unpaired = [i for i, (_, t, _) in enumerate(tr.ops) if t in P2P and i not in paired]
    if unpaired:
        s, t, q = tr.ops[unpaired[0]]
        raise StragglerTraceError(f"{tr.path}: stage {s} {t} #{q} has no peer op on the neighbouring stage")
    return Graph(deps=deps, **_topological(tr, deps, groups))


def _topological(tr: OpTrace, deps: list[list[int]], groups: list[tuple[list[int], bool]]) -> dict:
    """Kahn's algorithm on the graph with each collective contracted to one node."""
    n = len(deps)
    node_of = list(range(n))
    units: list[tuple[list[int], bool, bool]] = [([i], False, False) for i in range(n)]
    for members, across in groups:
        u = len(units)
        units.append((members, True, across))
        for i in members:
            node_of[i] = u
    live = sorted(set(node_of))
    succ: dict[int, set[int]] = {u: set() for u in live}
    indeg = {u: 0 for u in live}
    for b in range(n):
        for a in deps[b]:
            ua, ub = node_of[a], node_of[b]
            if ua == ub:
                raise StragglerTraceError(f"{tr.path}: {tr.ops[b]} waits for {tr.ops[a]} of its own collective")
            if ub not in succ[ua]:
                succ[ua].add(ub)
                indeg[ub] += 1
    ready = [u for u in live if indeg[u] == 0]
    order = []
    while ready:
        u = ready.pop()
        order.append(u)
        for v in sorted(succ[u]):
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    if len(order) != len(live):
        stuck = [tr.ops[units[u][0][0]] for u in live if indeg[u] > 0][:3]
        raise StragglerTraceError(f"{tr.path}: the ops' order has a cycle (e.g. {stuck}); the recorded schedule is "
                                  "not a one-forward-one-backward pipeline Preflight can replay")
    return {"order": [units[u][0] for u in order], "collective": [units[u][1] for u in order],
            "across_dp": [units[u][2] for u in order]}
