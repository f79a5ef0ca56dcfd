"""The plan's step beside the job's traces, term by term: where the real job leaves its own plan.

The step model (``preflight.chapters.step``) predicts one GPU's step as a sum of terms; the trace reader
(``preflight.chapters.traces.audit_traces``) measures a step of each traced rank as a sum of the same kinds
of time (``step_terms``: compute, exposed communication by collective, waiting in collectives for a late
peer, host- and launch-bound idle, queued idle, data wait, pipeline idle). This module pairs them:

=============================  ==========================  ===================================  =========
term                           plan (step model)           trace (median rank)                  chapter
=============================  ==========================  ===================================  =========
compute                        ``compute_s``               ``compute_ms``                       1
exposed communication          tp + cp + a2a + pp + dp     every collective's exposed part      3
  of it, all-to-all            ``a2a_s``                   ``all_to_all``                       3
  of it, pipeline send/recv    ``pp_comm_s``               ``send_recv``                        4
pipeline bubble                ``bubble_s``                ``pipeline_idle_ms``                 4
waiting for the last rank      0 (a balanced job)          ``collective_wait_ms``               4
host- / launch-bound idle      0                           host-bound + launch-bound idle       1
queued idle (synchronisation)  0                           ``queued_idle_ms``                   2
serial / data wait             ``serial_s``                ``data_wait_ms``                     2
=============================  ==========================  ===================================  =========

The term that departs most (measured minus planned, in seconds per step) is named first, with the
chapter that explains and fixes it. Where the traced job is not the planned one (another world size,
another chip, only some ranks traced) the comparison says so: the plan's terms are for the profile's
layout, the trace's for the job that ran.
"""
from __future__ import annotations

import statistics

import pandas as pd

from preflight.chapters import step as S
from preflight.core.findings import FindingSink
from preflight.core.profile import Profile

# (key, words, chapter, the plan's seconds from a PlanStep, the trace's ms from one rank's step_terms)
ROWS = (
    ("compute", "compute", "baseline", lambda ps: ps.terms["compute_s"], lambda t: t.get("compute_ms")),
    ("exposed_comm", "exposed communication", "communication", lambda ps: ps.exposed_comm_s,
     lambda t: _sum((t.get("exposed_comm_ms_by_type") or {}).values())),
    ("all_to_all", "  of it: all-to-all (experts)", "communication", lambda ps: ps.terms["a2a_s"],
     lambda t: (t.get("exposed_comm_ms_by_type") or {}).get("all_to_all", 0.0)),
    ("send_recv", "  of it: pipeline send/recv", "load_balance", lambda ps: ps.terms["pp_comm_s"],
     lambda t: (t.get("exposed_comm_ms_by_type") or {}).get("send_recv", 0.0)),
    ("bubble", "pipeline bubble / idle", "load_balance", lambda ps: ps.terms["bubble_s"],
     lambda t: t.get("pipeline_idle_ms")),
    ("collective_wait", "waiting for the last rank", "load_balance", lambda ps: 0.0,
     lambda t: t.get("collective_wait_ms")),
    ("host_bound", "host- / launch-bound idle", "baseline", lambda ps: 0.0,
     lambda t: _sum([t.get("host_bound_idle_ms"), t.get("launch_bound_idle_ms")])),
    ("queued", "queued idle (synchronisation)", "data_pipeline", lambda ps: 0.0, lambda t: t.get("queued_idle_ms")),
    ("data_wait", "serial / data wait", "data_pipeline", lambda ps: ps.terms["serial_s"], lambda t: t.get("data_wait_ms")),
)
TOP_LEVEL = ("compute", "exposed_comm", "bubble", "collective_wait", "host_bound", "queued", "data_wait")


def _sum(values) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) if vals else None


def _median(values) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def differences(profile: Profile, a: dict) -> list[str]:
    """Where the traced job is not the planned one, in words (empty when nothing differs that we can see)."""
    out = []
    traced, world = len(a["ranks"]), a.get("world_size")
    if world and world != profile.gpus:
        out.append(f"the traces come from a job of {world:,} ranks; the profile plans {profile.gpus:,} GPUs")
    if world and traced < world:
        out.append(f"{traced} of its {world:,} ranks were traced")
    chips = {v.get("chip") for v in a["ranks"].values() if v.get("chip")}
    if chips and profile.cluster.gpu not in chips and profile.cluster.gpu != "auto":
        out.append(f"the traces ran on {', '.join(sorted(chips))}; the profile plans {profile.cluster.gpu}")
    if not chips:
        out.append("the traces name no chip (no deviceProperties): the plan's chip is assumed")
    return out


def compare(profile: Profile, a: dict, gpu_key: str | None = None) -> dict | None:
    """The plan's terms beside the traces' (median over the traced ranks), in seconds per step; None when
    the plan has no step model (the GPU's peak unknown) or no traced rank has step terms."""
    ps = S.plan_step(profile, gpu_key)
    terms = [v.get("step_terms") for v in a["ranks"].values() if v.get("step_terms")]
    if ps is None or not terms:
        return None
    rows = []
    for key, words, chapter, plan_of, trace_of in ROWS:
        measured_ms = _median(trace_of(t) for t in terms)
        planned = float(plan_of(ps))
        measured = None if measured_ms is None else measured_ms / 1e3
        rows.append({"term": key, "words": words, "chapter": chapter, "plan_s": planned, "trace_s": measured,
                     "departure_s": None if measured is None else measured - planned})
    step_trace = _median(t.get("step_ms") for t in terms)
    top = [r for r in rows if r["term"] in TOP_LEVEL and r["departure_s"] is not None]
    worst = max(top, key=lambda r: abs(r["departure_s"])) if top else None
    return {"rows": rows, "plan_step_s": ps.step_s, "trace_step_s": None if step_trace is None else step_trace / 1e3,
            "ranks": len(terms), "worst": worst, "differences": differences(profile, a), "step": ps}


def table(c: dict) -> pd.DataFrame:
    """The comparison for people: planned and measured ms per step, their difference, the chapter."""
    ms = lambda x: None if x is None else round(x * 1e3, 3)
    rows = [{"term of the step": r["words"], "plan (ms)": ms(r["plan_s"]), "traces (ms)": ms(r["trace_s"]),
             "traces - plan (ms)": ms(r["departure_s"]), "chapter": r["chapter"]} for r in c["rows"]]
    rows.append({"term of the step": "the step", "plan (ms)": ms(c["plan_step_s"]), "traces (ms)": ms(c["trace_step_s"]),
                 "traces - plan (ms)": None if c["trace_step_s"] is None else ms(c["trace_step_s"] - c["plan_step_s"]),
                 "chapter": ""})
    return pd.DataFrame(rows)


def chart_frame(c: dict) -> pd.DataFrame:
    """Long form for the two stacked steps (plan, traces): one row per top-level term and side."""
    rows = []
    for r in c["rows"]:
        if r["term"] not in TOP_LEVEL:
            continue
        k = TOP_LEVEL.index(r["term"])            # stacked in the legend's order
        rows.append({"step": "plan (step model)", "term": r["words"], "seconds": r["plan_s"], "order": k})
        rows.append({"step": f"traces (median of {c['ranks']} rank(s))", "term": r["words"], "seconds": r["trace_s"] or 0.0,
                     "order": k})
    return pd.DataFrame(rows)


def chart(c: dict):
    """Two horizontal stacked bars, the planned step and the traced one, coloured by term."""
    import altair as alt

    return alt.Chart(chart_frame(c)).mark_bar().encode(
        y=alt.Y("step:N", title=None, sort=None, axis=alt.Axis(labelLimit=300)),
        x=alt.X("seconds:Q", title="seconds per step"),
        color=alt.Color("term:N", title=None, sort=[w for k, w, *_ in ROWS if k in TOP_LEVEL]),
        order=alt.Order("order:Q"),
        tooltip=["step", "term", alt.Tooltip("seconds:Q", format=".3g")],
    ).properties(width=460, height=90, title="The plan's step and the traced step, term by term")


def add_finding(sink: FindingSink, c: dict, source: str) -> None:
    """``baseline/plan_vs_trace``: the traced step over the planned one, the term that departs most named
    with its chapter (info: each chapter's trace findings judge their own term)."""
    w = c["worst"]
    ratio = None if not c["trace_step_s"] else c["trace_step_s"] / c["plan_step_s"]
    msg = (f"Planned step {c['plan_step_s']:.3g} s (the step model), traced step "
           + (f"{c['trace_step_s']:.3g} s (median of {c['ranks']} rank(s))" if c["trace_step_s"] else "n/a") + ". ")
    if w is not None:
        way = "more" if w["departure_s"] > 0 else "less"
        msg += (f"The term that departs most: {w['words']}, {abs(w['departure_s']):.3g} s {way} than planned "
                f"({w['trace_s']:.3g} s traced against {w['plan_s']:.3g} s): chapter {w['chapter']}.")
    if c["differences"]:
        msg += " The traced job is not the planned one: " + "; ".join(c["differences"]) + "."
    terms = {f"{r['term']}_plan_s": r["plan_s"] for r in c["rows"]}
    terms |= {f"{r['term']}_trace_s": r["trace_s"] for r in c["rows"]}
    sink.add(id="baseline/plan_vs_trace", value=ratio, unit="x", verdict="info",
             threshold="recorded for reference: each chapter's trace findings judge their own term",
             message=msg,
             fix=(f"Start with {w['words'].strip()} (chapter {w['chapter']}); re-plan with the measured efficiency "
                  "(python -m preflight advise PROFILE --mfu-from AUDIT)." if w is not None else
                  "Trace a few steps with torch.profiler on every rank and pass the folder with --traces."),
             source=source, terms=terms)
