"""Pictures of a job's traces, where people would rather look than read.

- :func:`step_timeline`: one step per rank as lanes (compute, communication, copies; idle is what
  is left white), from each rank's first window step. Many ranks: the best, median and worst by GPU
  idle are drawn (the per-rank table lists all of them).
- :func:`critical_path`: each picked rank's critical path through its window, stretch by stretch,
  coloured by what set it (compute, communication, copies, CPU, idle);
- :func:`rank_strip`: per-rank shares (GPU idle, collective wait, loader) as bars for the best,
  median and worst rank of each, so 1,024 ranks stay readable; the full table goes beside it.
"""
from __future__ import annotations

import altair as alt
import pandas as pd

LANE_COLOURS = {"compute": "#4c78a8", "communication": "#e45756", "copies": "#f58518"}


def pick_ranks(values: dict, limit: int = 3) -> list:
    """Best, median and worst rank by ``values`` (rank -> number; higher is worse); all of them when
    there are at most ``limit``."""
    have = sorted((v, r) for r, v in values.items() if v is not None)
    if len(have) <= limit:
        return [r for _, r in have]
    return [have[0][1], have[len(have) // 2][1], have[-1][1]]


def timeline_frame(summaries: dict, ranks: list) -> pd.DataFrame:
    rows = []
    for r in ranks:
        tl = summaries[r].get("timeline")
        if not tl:
            continue
        for lane, ivs in tl["lanes"].items():
            for a, b in ivs:
                rows.append({"rank": f"rank {r}", "lane": lane, "start_ms": a / 1e6, "end_ms": b / 1e6,
                             "step": tl["step"]})
    return pd.DataFrame(rows, columns=["rank", "lane", "start_ms", "end_ms", "step"])


def step_timeline(summaries: dict, idle: dict, title: str = "") -> alt.Chart | None:
    """One step per rank (best / median / worst by GPU idle among many), lanes by kind of work."""
    ranks = pick_ranks(idle) or sorted(summaries)[:3]
    df = timeline_frame(summaries, ranks)
    if df.empty:
        return None
    order = [f"rank {r}" for r in ranks]
    return alt.Chart(df, title=title or "One step per rank: what the GPU ran (white: idle)").mark_bar(height=7).encode(
        x=alt.X("start_ms:Q", title="time from the step's first GPU event (ms)"), x2="end_ms:Q",
        y=alt.Y("lane:N", title=None, sort=list(LANE_COLOURS)),
        row=alt.Row("rank:N", sort=order, title=None, header=alt.Header(labelAngle=0, labelAlign="left")),
        color=alt.Color("lane:N", scale=alt.Scale(domain=list(LANE_COLOURS), range=list(LANE_COLOURS.values())),
                        legend=alt.Legend(title=None, orient="top")),
        tooltip=["rank", "lane", alt.Tooltip("start_ms:Q", format=",.3f"), alt.Tooltip("end_ms:Q", format=",.3f"),
                 "step"],
    ).properties(width=560, height=40)


PATH_COLOURS = {"compute": "#4c78a8", "comm": "#e45756", "copy": "#f58518", "cpu": "#54a24b", "idle": "#bab0ac"}


def critical_frame(summaries: dict, ranks: list) -> pd.DataFrame:
    rows = []
    for r in ranks:
        cp = summaries[r].get("critical_path")
        for a, b, kind in (cp or {}).get("segments", []):
            rows.append({"rank": f"rank {r}", "kind": kind, "start_ms": a / 1e6, "end_ms": b / 1e6})
    return pd.DataFrame(rows, columns=["rank", "kind", "start_ms", "end_ms"])


def critical_path(summaries: dict, views: dict, title: str = "") -> alt.Chart | None:
    """The critical path of the best / median / worst rank by compute share of it (``trace_critical``)."""
    share = {r: 1 - (v.get("critical") or {}).get("shares", {}).get("compute", 0) for r, v in views.items()
             if v.get("critical")}
    ranks = pick_ranks(share)
    df = critical_frame(summaries, ranks)
    if df.empty:
        return None
    return alt.Chart(df, title=title or "The critical path of the window: what set its length").mark_bar(height=14).encode(
        x=alt.X("start_ms:Q", title="time from the window's first GPU event (ms)"), x2="end_ms:Q",
        y=alt.Y("rank:N", title=None, sort=[f"rank {r}" for r in ranks]),
        color=alt.Color("kind:N", scale=alt.Scale(domain=list(PATH_COLOURS), range=list(PATH_COLOURS.values())),
                        legend=alt.Legend(title=None, orient="top")),
        tooltip=["rank", "kind", alt.Tooltip("start_ms:Q", format=",.3f"), alt.Tooltip("end_ms:Q", format=",.3f")],
    ).properties(width=560, height=alt.Step(22))


def strip_frame(views: dict, metrics: dict) -> pd.DataFrame:
    rows = []
    for key, label in metrics.items():
        vals = {r: v.get(key) for r, v in views.items()}
        picked = pick_ranks(vals)
        names = ["best", "median", "worst"] if len(picked) == 3 and len(vals) > 3 else [f"rank {r}" for r in picked]
        for r, who in zip(picked, names):
            rows.append({"metric": label, "rank": r, "who": f"{who} (rank {r})" if who.startswith(("best", "median", "worst"))
                         else who, "share": vals[r]})
    return pd.DataFrame(rows, columns=["metric", "rank", "who", "share"])


def rank_strip(views: dict, title: str = "") -> alt.Chart | None:
    """Per-rank GPU idle, collective wait and loader share: best, median and worst rank of each."""
    df = strip_frame(views, {"idle": "GPU idle", "wait_share": "waiting in collectives",
                             "loader_share": "waiting on the loader"})
    if df.empty:
        return None
    n = len(views)
    head = f"Across {n} rank{'s' if n != 1 else ''}" + (": best, median, worst" if n > 3 else "")
    return alt.Chart(df, title=title or head).mark_bar().encode(
        x=alt.X("share:Q", title="share of the window (step for the loader)", axis=alt.Axis(format="%"),
                scale=alt.Scale(domain=[0, 1])),
        y=alt.Y("who:N", title=None, sort=None),
        row=alt.Row("metric:N", title=None, header=alt.Header(labelAngle=0, labelAlign="left")),
        color=alt.value("#4c78a8"),
        tooltip=["metric", "rank", alt.Tooltip("share:Q", format=".1%")],
    ).properties(width=420, height=alt.Step(16))
