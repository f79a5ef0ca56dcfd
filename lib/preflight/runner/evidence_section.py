"""Two chapter sections that read a team's own evidence beside its traces:

- chapter 5, "When the job hangs": every rank's Flight Recorder dump (``flight_recorder_dir``, the audit's
  ``--flight-recorder DIR``): where the job stopped, the ranks that hung it, the picture of ranks x process
  groups, and the finding ``fault_tolerance/hang_attribution``;
- chapter 4, "What your stragglers cost": a per-op trace (``stragglers_dir``, ``--stragglers DIR``): the
  what-if slowdown, its attribution to workers, stages and op types, the causes, and the finding
  ``load_balance/straggler_cost``.

    a = show_hang(ch, flight_recorder_dir, example=interactive)
    res = show_stragglers(ch, stragglers_dir, example=interactive)

With a folder, the finding joins the chapter's (and the report). Without one, the shared public case
(``../shared`` beside the clone: the GPU-error hang, the straggling job AR) is shown to teach the reading
when ``example`` is true (JupyterLab) and adds no finding; the headless audit (``example`` False) shows
none, so a team's report never presents another job's evidence as its own. A folder that cannot be read
gets one box naming it, the reason and the command that checks it, not a traceback (the audit has
refused it before any chapter ran).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from preflight.runner import evidence as E


def _inline_chart(chart) -> None:
    """Show a chart in the notebook only: the teaching case's picture never reaches the report's charts."""
    from IPython.display import display

    from preflight.reporting.charts import to_svg

    display({"image/svg+xml": to_svg(chart), "text/plain": "<chart>"}, raw=True)


def _folder(ch, given: str, example: bool, case: Path, option: str, what: str) -> tuple[Path | None, bool]:
    """(the folder to read, whether it is the team's own), or (None, False) when there is nothing to show."""
    if given:
        return Path(given), True
    if not example:
        print(f"No {what} given: `python -m preflight audit PROFILE {option} DIR` puts your job's here.")
        return None, False
    if not case.is_dir():
        ch.note(f"The shared case this section teaches with ({case}) is not beside this clone, and no {what} is "
                f"given: set the parameter above to your job's folder, or run `audit PROFILE {option} DIR`.")
        return None, False
    return case, False


def _finding(ch, f: dict, mine: bool) -> None:
    """Show the section's finding; the team's own evidence adds it to the chapter's findings (a shared case
    teaches only)."""
    from dataclasses import asdict

    if mine:
        f = asdict(ch.findings.add(**f))
    ch.table(pd.DataFrame([f])[["id", "value", "unit", "verdict", "message"]])


def _unreadable(ch, given: str, err: Exception, command: str) -> None:
    where = f" (relative to {Path.cwd()})" if not Path(given).is_absolute() else ""
    ch.note(f"'{given}'{where} could not be read: {err}. Check it with `python -m preflight {command} {given}`.")


def show_hang(ch, flight_recorder_dir: str = "", example: bool = True) -> dict | None:
    """Chapter 5's "when the job hangs" (module doc); returns the analysis, or None when nothing was read."""

    from IPython.display import Markdown, display

    from preflight.diagnose.flight_recorder import finding_of, ranks_text, where_text
    from preflight.diagnose.flight_recorder_dump import DumpError
    from preflight.reporting.hang_charts import progress_grid

    folder, mine = _folder(ch, flight_recorder_dir, example, E.HANG_CASE, "--flight-recorder", "Flight Recorder dumps")
    if folder is None:
        return None
    try:
        a = E.hang(folder)
    except (DumpError, OSError) as err:
        _unreadable(ch, str(folder), err, "hang")
        return None
    who = ("your job" if mine else "the shared case (a 16-rank MoE job, TP4 PP2 EP8, a GPU error injected into ranks "
                                   "9 and 14; not your job: set flight_recorder_dir for yours)")
    s = a["stopped_at"]
    lines = [f"**Flight Recorder dumps of {who}:** {len(a['files'])} ranks read from `{folder}`; state: **{a['state']}**."]
    if s:
        lines += [f"- stopped at {where_text(s)}",
                  f"- never launched by rank(s) **{ranks_text(s['not_enqueued'])}**; launched and waiting in it: "
                  f"{ranks_text(s['not_completed'])}"]
    lines.append(f"- likely faulty ranks: **{ranks_text(a['likely_faulty'])}**")
    if a["missing_dumps"] or a["empty_dumps"]:
        lines.append(f"- no dump: {ranks_text(a['missing_dumps'])}; empty recorder: {ranks_text(a['empty_dumps'])}")
    display(Markdown("\n".join(lines)))
    if a["suspects"]:
        ch.table(pd.DataFrame([{"rank": x["rank"], "confidence": x["confidence"], "why": "; ".join(x["reasons"])}
                               for x in a["suspects"]]))
    hung = [g for g in a["groups"] if g["stuck"] is not None and g["not_enqueued"]]
    if hung:
        ch.table(pd.DataFrame([{"group": g["name"], "kind": g["desc"], "ranks": len(g["ranks"]), "stuck at": g["stuck"],
                                "op": (g["op"] or {}).get("op") or "?", "never launched": ranks_text(g["not_enqueued"]),
                                "waiting": ranks_text(g["not_completed"])} for g in hung[:16]]))
        if len(hung) > 16:
            print(f"... {len(hung) - 16} more groups: `python -m preflight hang {folder}` lists each")
    chart = progress_grid(a)
    if mine:
        ch.show("hang_progress", chart)
    else:
        _inline_chart(chart)
    _finding(ch, finding_of(a), mine)
    return a


def attribution_frame(res: dict, top: int = 5) -> pd.DataFrame:
    """Where the stragglers' cost sits: the workers, stages and op types that cost the most, each with the
    slowdown it causes alone (everything else at its typical duration) and the share of the loss that
    fixing it wins back (it at typical, the rest as recorded)."""
    def row(kind, name, r):
        return {"what": kind, "which": name, "slowdown alone": f"{r['slowdown_alone']:.3f}x",
                "fixing it wins back": f"{r['recovered'] + 0.0:.0%}".replace("-0%", "0%")}
    rows = [row("worker", f"rank {r['rank']} (dp {r['dp_rank']}, stage {r['stage']})", r) for r in res["by_worker"][:top]]
    rows += [row("pipeline stage", f"stage {r['stage']}", r) for r in res["by_stage"][:8]]
    rows += [row("op type", r["optype"], r) for r in res["by_optype"][:top]]
    return pd.DataFrame(rows)


def show_stragglers(ch, stragglers_dir: str = "", example: bool = True) -> dict | None:
    """Chapter 4's "what your stragglers cost" (module doc); returns the what-if, or None when nothing was read."""
    from IPython.display import Markdown, display

    from preflight.diagnose.stragglers_trace import StragglerTraceError

    folder, mine = _folder(ch, stragglers_dir, example, E.STRAGGLER_CASE, "--stragglers", "per-op straggler trace")
    if folder is None:
        return None
    try:
        res = E.stragglers(folder)
    except (StragglerTraceError, OSError) as err:
        _unreadable(ch, str(folder), err, "traces")
        return None
    j = res["job"]
    who = "your job" if mine else "the shared case AR (a 64-GPU job; not your job: set stragglers_dir for yours)"
    display(Markdown(
        f"**Per-op trace of {who}:** `{res['trace']}` in `{folder}`: dp {j['dp_size']} x pp {j['pp_size']} x tp "
        f"{j['tp_size']} x dsp {j['dsp_size']} = {j['world_size']} GPUs, {res['workers_traced']} workers traced, "
        f"{len(res['steps'])} steps. Mean step: **{res['step_time_s']:.4g} s** as recorded (launch gaps removed), "
        f"**{res['step_time_ideal_s']:.4g} s** with every op at its typical duration: **S = {res['slowdown']:.3f}**."))
    ch.table(attribution_frame(res))
    named = res["causes"]["named"]
    if named:
        ch.table(pd.DataFrame([{"cause": c["cause"], "where": "; ".join(c["where"]), "fixing it wins back":
                                f"{c['share']:.0%}", "fix": c["fix"]} for c in named]))
    _finding(ch, res["finding"], mine)
    return res
