"""What the stragglers cost, and why they straggle: the what-if analysis of a per-op trace.

The method is ByteDance-Seed's (Lin et al., "Understanding Stragglers in Large Model Training Using
What-if Analysis", arXiv 2505.05713; their artifact StragglerAnalysis, Apache-2.0), implemented here
from its description: replay the dependency graph of every recorded step (stream order inside a worker,
pipeline send/recv between stages, data-parallel collectives across replicas) once with every op at its
recorded duration and once with every op at its type's typical duration. The ratio of the mean step
times is the job's straggler slowdown ``S`` (1.0: nothing straggles; 1.97: steps take twice as long as
they would). Replays that keep one worker, one stage or one op type as recorded (everything else
typical) say how much slowdown that group alone causes; replays that set only that group to typical say
what share of the loss fixing it wins back. :mod:`preflight.diagnose.stragglers_cause` names the cause.

``straggler_finding(folder)`` gives the finding ``load_balance/straggler_cost`` (chapter 4), for any
code that wants it; ``python -m preflight traces FOLDER`` prints it with the attribution. Where the
theory of ``preflight.models.stragglers`` says what jitter *would* cost at N ranks, this says what the
job's own stragglers *did* cost.
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from preflight.core.findings import Finding, judge
from preflight.diagnose import stragglers_cause as C
from preflight.diagnose.stragglers_graph import Graph
from preflight.diagnose.stragglers_replay import WhatIf
from preflight.diagnose.stragglers_trace import OpTrace, load

FINDING_ID = "load_balance/straggler_cost"
WARN, FAIL = 1.05, 1.10        # S above 1.05: a twentieth of the job lost to waiting; above 1.10 a tenth
PP_COMM = {"forward-send": "forward-pp-comm", "forward-recv": "forward-pp-comm",
           "backward-send": "backward-pp-comm", "backward-recv": "backward-pp-comm"}


def analyze(folder: str | Path) -> dict:
    """The full what-if of the folder's trace: slowdowns, attribution, causes and the finding."""
    tr = load(folder)
    return analyze_trace(tr, folder=str(folder), trace=tr.path.name)


def analyze_trace(tr: OpTrace, graph: Graph | None = None, *, folder: str, trace: str,
                  source: str | None = None, per_rank: bool = False) -> dict:
    """The what-if of a per-op table ``tr`` (from a Parquet file, or converted from profiler traces by
    :mod:`preflight.diagnose.stragglers_from_trace` with its own ``graph``); ``trace`` names the input in
    the report and ``source`` in the finding; ``per_rank``: the finding carries each rank's slowdown alone."""
    w = WhatIf(tr, graph)
    meta = tr.meta
    by_stage = [{"stage": s, "slowdown_alone": w.alone(m := w.mask(stage=s)), "recovered": w.fixed(m)}
                for s in range(meta.pp_size)]
    by_dp = [{"dp_rank": d, "slowdown_alone": w.alone(m := w.mask(dp=d)), "recovered": w.fixed(m)}
             for d in range(meta.dp_size)]
    by_worker = []
    for d in range(meta.dp_size):
        for s in range(meta.pp_size):
            m = w.mask(stage=s, dp=d)
            by_worker.append({"rank": int(tr.rank[d, s]), "dp_rank": d, "stage": s, "slowdown_alone": w.alone(m),
                              "slowdown_paper": min(by_dp[d]["slowdown_alone"], by_stage[s]["slowdown_alone"]),
                              "recovered": w.fixed(m), "compute_vs_stage": C.compute_vs_stage(w, s, d)})
    groups: dict[str, list[str]] = {}
    for t in sorted(set(w.optype)):
        groups.setdefault(PP_COMM.get(t, t), []).append(t)
    by_optype = [{"optype": name, "slowdown_alone": w.alone(m := w.mask(optypes=types)), "recovered": w.fixed(m)}
                 for name, types in groups.items()]
    res = {
        "folder": folder, "trace": trace, "job": asdict(meta),
        "steps": [int(s) for s in tr.steps], "workers_traced": meta.dp_size * meta.pp_size,
        "ops_per_step": len(tr.ops) * meta.dp_size,
        "step_time_recorded_s": float(w.t_recorded.mean()), "step_time_s": float(w.t_real.mean()),
        "step_time_ideal_s": float(w.t_ideal.mean()),
        "slowdown": w.slowdown, "slowdown_per_step": {int(s): float(a / b) for s, a, b in
                                                     zip(tr.steps, w.t_real, w.t_ideal)},
        "launch_slowdown": w.launch_slowdown,
        "quality": {"replay_error": w.fidelity, "ops_started_before_a_dependency_ended": w.early_starts,
                    "collective_members_ending_before_the_last_arrival": w.clipped_transfers},
        "by_worker": sorted(by_worker, key=lambda r: -r["slowdown_alone"]),
        "by_stage": sorted(by_stage, key=lambda r: -r["slowdown_alone"]),
        "by_dp_rank": sorted(by_dp, key=lambda r: -r["slowdown_alone"]),
        "by_optype": sorted(by_optype, key=lambda r: -r["slowdown_alone"]),
    }
    res["causes"] = C.causes(w, by_worker)
    res["finding"] = _finding(res, source or f"computed from the per-op trace {trace} (what-if replay, arXiv 2505.05713)",
                              per_rank)
    return res


def _finding(res: dict, source: str, per_rank: bool = False) -> dict:
    s = res["slowdown"]
    verdict, words = judge(s, warn=WARN, fail=FAIL, higher_is_better=False, fmt="{:.2f}")
    named = res["causes"]["named"]
    loss = f"{s:.3f}x as long as with every op at its typical duration ({res['step_time_s']:.3g} s vs " \
           f"{res['step_time_ideal_s']:.3g} s, {len(res['steps'])} steps replayed)"
    if named:
        top = named[0]
        why = "; ".join(f"{c['cause']} ({', '.join(c['where'])}): fixing it wins back {c['share']:.0%} of the loss"
                        for c in named)
        message = f"Steps take {loss}. Cause: {why}."
        fix = top["fix"]
    elif s > C.NAMED_FROM:
        message = (f"Steps take {loss}; no single worker, stage or microbatch pattern explains {C.SHARE:.0%} of it "
                   f"(op type that costs most alone: {res['by_optype'][0]['optype']}).")
        fix = f"Look at the op type {res['by_optype'][0]['optype']} first: its variation across steps costs the most."
    else:
        message = f"Steps take {loss}: nothing straggles worth fixing."
        fix = "Nothing to fix; re-run the what-if after a change of layout, data or nodes."
    per = {str(r["rank"]): r["slowdown_alone"] for r in sorted(res["by_worker"], key=lambda r: r["rank"])}
    f = Finding(id=FINDING_ID, value=s, unit="x", verdict=verdict, threshold=words, message=message, fix=fix,
                source=source, per_rank=per if per_rank else None)
    return asdict(f)


def straggler_finding(folder: str | Path) -> dict:
    """``load_balance/straggler_cost`` for the per-op trace in ``folder`` (a ``*.parquet`` and its
    ``meta*.yaml``): value S = mean real / mean ideal step time, 1.0 when nothing straggles. Raises
    :class:`~preflight.diagnose.stragglers_trace.StragglerTraceError` on bad input."""
    return analyze(folder)["finding"]


def text_report(res: dict, top: int = 5) -> str:
    """The finding, then where the loss is: workers, stages, op types, and the causes' what-ifs."""
    j, f, c = res["job"], res["finding"], res["causes"]
    pct = lambda x: "-" if x is None else f"{x + 0.0:.0%}".replace("-0%", "0%")
    lines = [f"{res['folder']}: per-op trace {res['trace']}, job {j['trial_name']} (dp {j['dp_size']} x pp "
             f"{j['pp_size']} x tp {j['tp_size']} x dsp {j['dsp_size']} = {j['world_size']} GPUs; "
             f"{res['workers_traced']} workers traced, {len(res['steps'])} steps)",
             f"step time: recorded {res['step_time_recorded_s']:.4g} s, without launch gaps {res['step_time_s']:.4g} s, "
             f"ideal {res['step_time_ideal_s']:.4g} s; replay error {res['quality']['replay_error']:.2%}",
             f"{f['verdict']:<5} {f['id']} = {f['value']:.4f} {f['unit']}  ({f['threshold']})",
             f"      {f['message']}", f"      fix: {f['fix']}",
             "slowdown when only this keeps its recorded durations / share of the loss won back by fixing it:"]
    for r in res["by_worker"][:top]:
        lines.append(f"  worker rank {r['rank']:>5} (dp {r['dp_rank']}, stage {r['stage']})  {r['slowdown_alone']:.4f}  "
                     f"{pct(r['recovered'])}")
    for r in res["by_stage"]:
        lines.append(f"  stage {r['stage']:<24}  {r['slowdown_alone']:.4f}  {pct(r['recovered'])}")
    for r in res["by_optype"][:top]:
        lines.append(f"  {r['optype']:<30}  {r['slowdown_alone']:.4f}  {pct(r['recovered'])}")
    corr = c["fwd_bwd_correlation"]
    lines.append(f"causes (share won back): slow worker {pct(c['worker_share'])} (M_W {pct(c['m_w'])}), stage imbalance "
                 f"{pct(c['stage_share'])} (M_S {pct(c['m_s'])}), sequence-length {pct(c['sequence_share'])} "
                 f"(fwd/bwd correlation {'-' if corr is None else f'{corr:.2f}'})")
    return "\n".join(lines) + "\n"

