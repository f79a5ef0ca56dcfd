"""Each chapter notebook's "your job's traces" section: the job's own ``torch.profiler`` traces read
into this chapter's verdicts, with the per-rank table and the pictures.

    tr = show_traces(ch, traces_dir)       # traces_dir "" -> the embedded example (data/traces/example)

With ``traces_dir`` given (the audit's ``--traces DIR``), the chapter's trace findings join its
findings (and the report); the embedded example is shown for learning only and adds none. A folder
that cannot be read gets one clear box naming it and the command that checks it, not a traceback.
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pandas as pd

from preflight import REPO
from preflight.chapters import traces as T
from preflight.core.numfmt import num, pct
from preflight.diagnose.trace_file import TraceError
from preflight.reporting import trace_charts

EXAMPLE_TRACES = REPO / "data" / "traces" / "example"


def _share(x):
    return "n/a" if x is None else pct(x)


def _ms(x):
    return "n/a" if x is None else num(x)


def _rows(a: dict, chapter: str) -> pd.DataFrame:
    rows = []
    for r, v in sorted(a["ranks"].items()):
        base = {"rank": r}
        if chapter == "baseline":
            cm = v.get("class_ms") or {}
            rows.append(base | {"GPU idle": _share(v.get("idle")), "host-bound": _share(v.get("idle_host")),
                                "queued": _share(v.get("idle_other")), "compute": _share(v.get("compute")),
                                "matmul ms": _ms(cm.get("matmul")), "memory-bound ms": _ms(cm.get("memory")),
                                "communication ms": _ms(cm.get("comm")), "copies ms": _ms(cm.get("copy")),
                                "TFLOP/s": _ms(v.get("tflops")), "MFU": _share(v.get("mfu")),
                                "launch-bound": _share(v.get("idle_launch")),
                                "bound by": (v.get("critical") or {}).get("bound", "n/a")})
        elif chapter == "data_pipeline":
            h = v.get("h2d") or {}
            rows.append(base | {"step ms": _ms(v.get("step_ms")), "loader ms/step": _ms(v.get("loader_ms_per_step")),
                                "loader share": _share(v.get("loader_share")),
                                "GPU idle at step start ms": _ms(v.get("step_start_idle_ms")),
                                "pageable H2D": h.get("pageable", {}).get("count", 0),
                                "pinned H2D": h.get("pinned", {}).get("count", 0),
                                "syncs/step": _ms(v.get("sync_per_step"))})
        elif chapter == "communication":
            kinds = ", ".join(f"{k} x{c['count']}" for k, c in (v.get("collectives") or {}).items())
            rows.append(base | {"communication ms": _ms(v.get("comm_ms")), "overlapped": _share(v.get("overlap")),
                                "exposed (of window)": _share(v.get("exposed_comm")), "collectives": kinds or "none",
                                "on compute stream": v.get("comm_on_compute_stream", 0)})
        elif chapter == "load_balance":
            rows.append(base | {"step ms": _ms(v.get("step_ms")), "compute ms/step": _ms(v.get("compute_ms_per_step")),
                                "waiting in collectives": _share(v.get("wait_share")),
                                "arrived last": v.get("arrived_last", "n/a")})
    return pd.DataFrame(rows)


def _scroll_table(df: pd.DataFrame) -> None:
    from IPython.display import HTML, display

    from preflight.reporting.tables import frame_html

    display(HTML(f"<div style='max-height:360px; overflow:auto'>{frame_html(df)}</div>"))


def quality_frame(a: dict) -> pd.DataFrame:
    return pd.DataFrame([{"rank": "?" if q["rank"] is None else q["rank"], "file": q["file"],
                          "GPU events": q["gpu_events"], "steps": q["steps"],
                          "supports": ", ".join(q["supports"]) or "nothing",
                          "limits": "; ".join(q["limits"]) or "none"} for q in a["quality"]])


def _pipeline_note(ch, a: dict) -> None:
    """Ranks that send and receive between pipeline stages: their GPU idle beside the bubble the
    profile's schedule predicts, (p - 1) / (v m + p - 1)."""
    from preflight.models.pipeline import bubble_fraction

    stages = {r: v.get("idle") for r, v in a["ranks"].items() if v.get("send_recv")}
    if not stages:
        return
    t = ch.profile.training
    v = t.interleave if t.pipeline_schedule == "interleaved" else 1
    idle = ", ".join(f"rank {r}: {_share(x)}" for r, x in sorted(stages.items())[:16])
    formula = (f"the profile's pp = {t.pp}, m = {t.microbatches}{f', v = {v}' if v > 1 else ''} predicts a bubble "
               f"of {pct(bubble_fraction(t.pp, t.microbatches, v))}" if t.pp > 1 else "the profile plans no pipeline")
    ch.note(f"Ranks that send/receive between stages (pipeline parallelism): GPU idle {idle}"
            f"{' ...' if len(stages) > 16 else ''}; {formula}. Idle well above the formula is time the schedule "
            "does not explain: stage imbalance (partition by profiled layer time) or waiting on data.")


def show_traces(ch, traces_dir: str = "", example: bool = True, jobs: int | None = None) -> dict | None:
    """This chapter's view of the traces in ``traces_dir`` (see the module's docstring); returns the
    analysis (``preflight.diagnose.trace_analysis.analyze``), or None when the folder cannot be read.
    ``example`` False (the headless audit): with no ``traces_dir`` nothing is read, so a team's report
    never shows the example job's traces as its own."""
    from IPython.display import Markdown, display

    if not traces_dir and not example:
        print("No traces given: `python -m preflight audit PROFILE --traces DIR` puts your job's here.")
        return None
    folder = Path(traces_dir) if traces_dir else EXAMPLE_TRACES
    mine = bool(traces_dir)
    try:        # the chip MFU is judged against is the trace's own (or traces --gpu), never the profile's guess
        a = T.audit_traces(folder, gpu_key=None, jobs=jobs)
    except TraceError as e:
        where = f" (relative to {Path.cwd()})" if not folder.is_absolute() else ""
        ch.note(f"traces_dir = '{traces_dir}'{where} could not be read: {e}. Check the folder with "
                f"`python -m preflight traces {folder}`.")
        return None
    who = "your job" if mine else "the embedded example job (two ranks of a 128-GPU job; set traces_dir for yours)"
    display(Markdown(f"**Traces of {who}:** {len(a['ranks'])} rank(s) read from `{folder}`"
                     + (f" of world size {a['world_size']}" if a["world_size"] else "") + "."))
    if ch.name == "baseline":
        display(Markdown("Trace quality: what each file can support, and why not."))
        _scroll_table(quality_frame(a))
    table = _rows(a, ch.name)
    if not table.empty:
        _scroll_table(table)
    summaries = a.get("summaries") or {}
    if ch.name == "baseline" and summaries:
        chart = trace_charts.step_timeline(summaries, {r: v.get("idle") for r, v in a["ranks"].items()})
        if chart is not None:
            ch.show("trace_timeline", chart)
        chart = trace_charts.critical_path(summaries, a["ranks"])
        if chart is not None:
            ch.show("trace_critical_path", chart)
    if ch.name == "load_balance":
        _pipeline_note(ch, a)
    if ch.name == "load_balance" and len(a["ranks"]) > 1:
        chart = trace_charts.rank_strip(a["ranks"])
        if chart is not None:
            ch.show("trace_ranks", chart)
    found = T.findings(a, ch.name)
    ch.example_traces_shown = not mine          # the chapter's summary says whose verdicts these are
    if mine:
        for f in found:
            ch.findings.add(**asdict(f))
    ch.table(pd.DataFrame([asdict(f) for f in found])[["id", "value", "unit", "verdict", "message"]])
    return a
