"""Chapter 4's slider: the pipeline bubble explorer."""
from __future__ import annotations

import ipywidgets as W

from preflight.reporting import charts
from preflight.widgets.core import explorer, readout


def interleaved_settings(p: int, m: int, v: int) -> tuple[int, int, str]:
    """``(m, v, why)`` the interleaved schedule can run for the sliders' p, m, v, and a sentence saying
    what was changed and why ("" when nothing was). Interleaving needs v >= 2 model chunks per GPU (one
    chunk is plain 1F1B) and, in Megatron-LM's schedule, m a multiple of p (micro-batches advance in
    groups of p): m goes up to the next multiple, never down. The explorer shows the sentence instead
    of changing the learner's values silently."""
    m_used, v_used = p * -(-m // p), max(2, v)
    changes = []
    if v_used != v:
        changes.append(f"v={v_used} chunks, not {v} (one chunk per GPU is plain 1F1B)")
    if m_used != m:
        changes.append(f"m={m_used}, not {m} (Megatron's interleaved schedule needs m a multiple of p={p})")
    return m_used, v_used, ("simulated with " + " and ".join(changes)) if changes else ""


def bubble_explorer(p: int, m: int, schedule: str, v: int = 1) -> W.VBox:
    """Sliders: stages p, micro-batches m, schedule, chunks v, one slow stage -> bubble share of total
    time (p-1)/(v m + p-1), bubble over ideal (p-1)/(v m), the popular (wrong) (p-1)/(m p), the share
    simulated from the schedule, activation memory of the first stage; the Gantt chart redrawn.
    ``zb-h1``: the zero-bubble schedule (``preflight.models.zerobubble``, t_F = t_B = t_W)."""
    from preflight.models import pipeline as P
    from preflight.models import zerobubble as Z

    style, layout = {"description_width": "170px"}, W.Layout(width="520px")
    controls = {
        "p": W.IntSlider(value=max(1, p), min=1, max=16, description="stages p", style=style, layout=layout),
        "m": W.IntSlider(value=max(1, m), min=1, max=64, description="micro-batches m", style=style, layout=layout),
        "schedule": W.Dropdown(options=["gpipe", "1f1b", "interleaved", Z.SCHEDULE], value=schedule, description="schedule",
                               style=style, layout=layout),
        "v": W.IntSlider(value=max(1, v), min=1, max=4, description="chunks v (interleaved)", style=style,
                         layout=layout),
        "slow": W.FloatSlider(value=1.0, min=1.0, max=3.0, step=0.1, description="last stage slower (x)",
                              style=style, layout=layout),
    }

    def compute(p, m, schedule, v, slow):
        why = ""
        if schedule == "interleaved":
            m, v, why = interleaved_settings(p, m, v)
        elif v > 1:
            why, v = f"chunks v={v} ignored: only the interleaved schedule splits a GPU's layers into chunks", 1
        note = {"adjusted": ("adjusted", why)} if why else {}
        scale = [1.0] * (p - 1) + [slow]
        zb = schedule == Z.SCHEDULE
        tl = Z.zb_h1_timeline(p, m, stage_scale=scale) if zb else P.schedule_timeline(p, m, schedule, v=v,
                                                                                       stage_scale=scale)
        held = Z.activation_memory_microbatches(p, m) if zb else P.activation_memory_microbatches(p, m, schedule, 0, v=v)
        text = readout({
            **({"zero_bubble": ("ZB-H1 bubble share, equal stages (p-1)/(3m + p-1) when m >= p",
                                f"{Z.bubble_equal_times(p, m):.1%}")} if zb else {}),
            "bubble": ("bubble share of total time (p-1)/(v m + p-1)" + (" (1F1B)" if zb else ""),
                       f"{P.bubble_fraction(p, m, v):.1%}"),
            "over_ideal": ("bubble over ideal time (p-1)/(v m)" + (" (1F1B)" if zb else ""),
                           f"{P.bubble_over_ideal(p, m, v):.1%}"),
            "wrong": ("popular estimate (p-1)/(m p): wrong", f"{P.wrong_bubble(p, m):.1%}"),
            "simulated": ("idle share of this schedule (simulated, with the slow stage)",
                          f"{P.timeline_bubble(tl):.1%}"),
            # interleaved chunks hold 1/v of a micro-batch's layers each: count chunks, never half micro-batches
            "activations": (("chunk activations held by stage 0 (each 1/v of the stage's layers)",
                             f"{held * v:.0f} (memory {held / min(p, m):.2f}x 1F1B's)") if v > 1 else
                            ("micro-batches held by stage 0 (activation memory)", f"{held:.0f}")),
            **note,
        })
        return text, charts.gantt(tl, title=f"{schedule}, p={p}, m={m}" + (f", v={v}" if v > 1 else "")
                                  + (" (adjusted: see above)" if why else ""))

    return explorer(controls, compute, "Pipeline bubble explorer")


def straggler_explorer(gpus: int, cv: float = 0.02) -> W.VBox:
    """Sliders: ranks N (log2) and per-rank step-time jitter cv -> the expected step over the mean rank's,
    ``1 + cv E[max of N normals]`` (``preflight.models.stragglers``), Blom's approximation and the
    large-N ``sqrt(2 ln N)`` beside it, a Monte Carlo check; the curve over N redrawn."""
    import math

    import pandas as pd

    from preflight.models import stragglers as S

    style, layout = {"description_width": "170px"}, W.Layout(width="520px")
    top = max(14, math.ceil(math.log2(max(gpus, 2))))
    controls = {
        "log2_n": W.IntSlider(value=max(1, round(math.log2(max(gpus, 2)))), min=1, max=top,
                              description="log2 N (ranks)", style=style, layout=layout),
        "cv": W.FloatSlider(value=min(0.1, max(0.0, cv)), min=0.0, max=0.1, step=0.005, readout_format=".1%",
                            description="per-rank jitter cv", style=style, layout=layout),
    }

    def compute(log2_n, cv):
        n = 2 ** log2_n
        e = S.expected_max_normal(n)
        sim = S.simulate_slowdown(n, cv, steps=max(50, 200_000 // n), seed=1) if n <= 16384 else None
        text = readout({
            "n": ("ranks N", f"{n:,}"),
            "slowdown": ("expected step / mean rank's step, 1 + cv E[max]", f"{1 + cv * e:.3f}x"),
            "lost": ("time lost to waiting for the slowest", f"{cv * e / (1 + cv * e):.1%} of the step"),
            "emax": ("E[max of N normals] (integrated)", f"{e:.3f}"),
            "blom": ("Blom's approximation", f"{S.blom(n):.3f}"),
            "asymptote": ("large-N sqrt(2 ln N) (overstates)", f"{S.large_n(n):.3f}"),
            **({"simulated": ("Monte Carlo check", f"{sim:.3f}x")} if sim is not None else {}),
        })
        df = pd.DataFrame([{"ranks": 2 ** k, "slowdown": 1 + c * S.expected_max_normal(2 ** k), "jitter": f"cv {c:.1%}"}
                           for c in sorted({0.01, 0.02, 0.05, round(cv, 4)}) if c > 0 for k in range(1, top + 1)])
        if df.empty:
            df = pd.DataFrame([{"ranks": 2 ** k, "slowdown": 1.0, "jitter": "cv 0%"} for k in range(1, top + 1)])
        return text, charts.curves(df, "ranks", "slowdown", "jitter", mark_x=n, log_y=False,
                                   title="Expected step time over the mean rank's: the slowest of N sets the pace",
                                   y_format=".2f", x_title="ranks N")

    return explorer(controls, compute, "Straggler explorer: a synchronous step waits for the slowest rank")



def busiest_explorer(tokens: float, ep: int, top_k: int, capacity_factor: float | None = None, label: str = "") -> W.VBox:
    """Chapter 4's MoE explorer: tokens per rank (``b s / cp``), expert-parallel ranks, top-k and the capacity
    factor -> the mean copies a rank receives, the busiest rank's load over that mean, what every rank waits
    for, the share the busiest drops, and the fewest tokens at which the cap drops nothing. Every number is
    ``preflight.models.moe.busiest_rank_load`` (through ``preflight.chapters.moe_tables``); the chart draws
    the load over tokens per rank, dropless and capped."""
    import pandas as pd

    from preflight.chapters import moe_tables as M
    from preflight.widgets.core import _log_slider

    style, layout = {"description_width": "170px"}, W.Layout(width="520px")
    eps = sorted({2 ** k for k in range(1, 11)} | {ep})
    ks = sorted({1, 2, 4, 6, 8, 16} | {top_k})
    caps = [("dropless", 0.0)] + [(f"{c:g}", c) for c in sorted({1.0, 1.1, 1.25, 1.5, 2.0} | {capacity_factor or 1.25})]
    controls = {
        "tokens": _log_slider(tokens, 1, 1e6, "tokens per rank (b s / cp)"),     # whole tokens: readout below
        "ep": W.SelectionSlider(options=eps, value=ep, description="expert-parallel ranks", style=style, layout=layout),
        "top_k": W.SelectionSlider(options=ks, value=top_k, description="experts per token k", style=style,
                                   layout=layout),
        "cap": W.Dropdown(options=caps, value=capacity_factor or 0.0, description="capacity factor", style=style,
                          layout=layout),
    }

    controls["tokens"].readout_format = ",.0f"

    def compute(tokens, ep, top_k, cap):
        c, tokens = cap or None, max(1, round(tokens))          # a rank receives whole tokens
        b = M.busiest_row(tokens, ep, top_k, c)
        values = {
            "mean": ("token copies a rank receives on average (tokens x k)", f"{b['mean_tokens']:,.0f}"),
            "load": ("the busiest rank's, over the mean", f"{b['load']:.3f}x"),
            "wait": ("what every rank waits for (capped at c)", f"{b['wait']:.3f}x"),
            "dropped": ("share the busiest rank drops", "none (dropless)" if c is None else f"{b['dropped']:.1%}"),
        }
        if c is not None and c > 1:
            values["no_drop"] = (f"fewest tokens per rank at which c = {c:g} drops nothing",
                                 f"{M.tokens_for_load(c, ep, top_k):,.0f}")
        grid = [10 ** (k / 4) for k in range(0, 25)]
        rows = [{"tokens per rank": n, "busiest / mean": M.busiest_row(n, ep, top_k)["load"], "curve": "dropless: load"}
                for n in grid]
        if c is not None:
            rows += [{"tokens per rank": n, "busiest / mean": M.busiest_row(n, ep, top_k, c)["wait"],
                      "curve": f"capacity {c:g}: wait"} for n in grid]
        top = max(r["busiest / mean"] for r in rows)
        chart = charts.curves(pd.DataFrame(rows), "tokens per rank", "busiest / mean", "curve", mark_x=tokens,
                              log_y=False, y_format=".2f", y_domain=(1.0, max(1.05, 1.02 * top)),
                              title=f"The busiest of {ep} expert-parallel ranks, top-{top_k}"
                                    + (f" ({label})" if label else ""))
        return readout(values), chart

    return explorer(controls, compute, "Busiest expert explorer" + (f": {label}" if label else ""))

# -- chapter 5: failures and checkpoint intervals ----------------------------------------------------
# Numbers are written the way people read them: three significant digits, thousands separators, no
# scientific notation except for probabilities per node-day (1.0e-4), durations in the unit that fits.
