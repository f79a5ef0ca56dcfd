"""The picture of a hang: ranks x process groups, each cell how far that rank got in that group.

Built from :func:`preflight.diagnose.flight_recorder.analyse`'s output and rendered like every other chart
(``preflight.reporting.charts.to_svg``: offline SVG through vl-convert). A column is a kind of group
(its ``desc``, e.g. ``TENSOR_MODEL_PARALLEL_GROUP``): each rank belongs to one group of each kind, so 16
ranks in 13 kinds of groups make a 16 x 13 grid whatever the number of groups. Where a rank is in
several groups of one kind (or the groups have no desc), the column is the group itself. A cell's number
is how many collectives the rank launched fewer than its group's leader (0: at the front); its colour
says where it stands against the group's stuck collective: never launched it (the cause), launched and
waiting in it, behind with nothing outstanding, at the front, or no dump.
"""
from __future__ import annotations

import altair as alt
import pandas as pd

STATES = {"never launched the stuck collective": "#d62728", "behind, nothing outstanding": "#ff9896",
          "launched it, waiting": "#fdae6b", "at the front": "#c7e9c0", "no dump": "#9e9e9e"}
_SEVERITY = {s: i for i, s in enumerate(["at the front", "launched it, waiting", "behind, nothing outstanding",
                                         "never launched the stuck collective", "no dump"])}


def _column(groups: list[dict]) -> dict[str, str]:
    """pg name -> its column: the desc, unless a rank is in two groups of that desc (then the group)."""
    per_rank = pd.Series([(r, g["desc"]) for g in groups for r in g["ranks"]])
    clash = {desc for (_, desc), n in per_rank.value_counts().items() if n > 1}
    return {g["name"]: g["desc"] if g["desc"] and g["desc"] not in clash else f"pg {g['name']} {g['desc']}".strip()
            for g in groups}


def grid_frame(a: dict) -> pd.DataFrame:
    """One row per (rank, column): the worst of the rank's groups of that column."""
    cols = _column(a["groups"])
    rows = []
    for g in a["groups"]:
        for r in g["ranks"]:
            st = g["status"].get(str(r))
            lag = g["lag"].get(str(r), 0)
            if r in g["no_dump"] or st is None:
                state, label = "no dump", "-"
            elif r in g["not_enqueued"]:
                state, label = "never launched the stuck collective", f"-{lag}"
            elif r in g["not_completed"]:
                state, label = "launched it, waiting", f"-{lag}" if lag else "0"
            elif lag:
                state, label = "behind, nothing outstanding", f"-{lag}"
            else:
                state, label = "at the front", "0"
            rows.append({"rank": r, "column": cols[g["name"]], "group": g["name"], "desc": g["desc"], "state": state,
                         "behind": lag, "label": label, "enqueued": st[0] if st else None,
                         "completed": st[1] if st else None, "severity": _SEVERITY[state]})
    df = pd.DataFrame(rows, columns=["rank", "column", "group", "desc", "state", "behind", "label", "enqueued",
                                     "completed", "severity"])
    if df.empty:
        return df
    return (df.sort_values(["severity", "behind"]).groupby(["rank", "column"], as_index=False).last()
            .sort_values(["rank", "column"]).reset_index(drop=True))


def progress_grid(a: dict, title: str = "") -> alt.LayerChart:
    """Ranks (rows) x kinds of process group (columns); a cell: collectives launched behind the group's
    leader, coloured by where the rank stands (module doc)."""
    df = grid_frame(a)
    s = a["stopped_at"]
    head = title or ("How far each rank got in each process group" +
                     (f": stopped at group {s['group']} {s['desc']}, collective {s['seq']}" if s else ": nothing outstanding"))
    red = set(df.loc[df["state"] == "never launched the stuck collective", "column"])
    order = sorted(set(df["column"]), key=lambda c: (c not in red, c))      # where launches are missing, first
    n_ranks = max(df["rank"].nunique(), 1)
    base = alt.Chart(df, title=alt.Title(head, subtitle="number: collectives launched behind the group's leader "
                                                        "(0: at the front)")).encode(
        x=alt.X("column:N", sort=order, title="process group (kind)", axis=alt.Axis(labelAngle=-40, labelLimit=260)),
        y=alt.Y("rank:O", title="rank", sort="ascending"))
    cells = base.mark_rect(stroke="white", strokeWidth=1).encode(
        color=alt.Color("state:N", scale=alt.Scale(domain=list(STATES), range=list(STATES.values())),
                        legend=alt.Legend(title=None, orient="top", columns=3, labelLimit=260)),
        tooltip=["rank", "group", "desc", "state", "behind", "enqueued", "completed"])
    text = base.mark_text(fontSize=9 if n_ranks <= 64 else 6).encode(text="label:N")
    step = 18 if n_ranks <= 64 else 8
    return (cells + text).properties(width=alt.Step(max(step, 30)), height=alt.Step(step))
