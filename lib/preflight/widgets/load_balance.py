"""Chapter 4's slider: the pipeline bubble explorer."""
from __future__ import annotations

import ipywidgets as W

from preflight import charts
from preflight.widgets.core import explorer, readout


def bubble_explorer(p: int, m: int, schedule: str, v: int = 1) -> W.VBox:
    """Sliders: stages p, micro-batches m, schedule, chunks v, one slow stage -> bubble share of total
    time (p-1)/(v m + p-1), bubble over ideal (p-1)/(v m), the popular (wrong) (p-1)/(m p), the share
    simulated from the schedule, activation memory of the first stage; the Gantt chart redrawn."""
    from preflight.models import pipeline as P

    style, layout = {"description_width": "170px"}, W.Layout(width="520px")
    controls = {
        "p": W.IntSlider(value=max(1, p), min=1, max=16, description="stages p", style=style, layout=layout),
        "m": W.IntSlider(value=max(1, m), min=1, max=64, description="micro-batches m", style=style, layout=layout),
        "schedule": W.Dropdown(options=["gpipe", "1f1b", "interleaved"], value=schedule, description="schedule",
                               style=style, layout=layout),
        "v": W.IntSlider(value=max(1, v), min=1, max=4, description="chunks v (interleaved)", style=style,
                         layout=layout),
        "slow": W.FloatSlider(value=1.0, min=1.0, max=3.0, step=0.1, description="last stage slower (x)",
                              style=style, layout=layout),
    }

    def compute(p, m, schedule, v, slow):
        v = max(2, v) if schedule == "interleaved" else 1      # interleaving means v >= 2 chunks
        if schedule == "interleaved" and m % p:          # Megatron's interleaved schedule needs it
            m = p * -(-m // p)
        note = {"m_used": ("simulated (interleaved: m a multiple of p, v >= 2)", f"m={m}, v={v}")} \
            if schedule == "interleaved" else {}
        scale = [1.0] * (p - 1) + [slow]
        tl = P.schedule_timeline(p, m, schedule, v=v, stage_scale=scale)
        text = readout({
            "bubble": ("bubble share of total time (p-1)/(v m + p-1)", f"{P.bubble_fraction(p, m, v):.1%}"),
            "over_ideal": ("bubble over ideal time (p-1)/(v m)", f"{P.bubble_over_ideal(p, m, v):.1%}"),
            "wrong": ("popular estimate (p-1)/(m p): wrong", f"{P.wrong_bubble(p, m):.1%}"),
            "simulated": ("idle share of this schedule (simulated, with the slow stage)",
                          f"{P.timeline_bubble(tl):.1%}"),
            "activations": ("micro-batches held by stage 0 (activation memory)",
                            f"{P.activation_memory_microbatches(p, m, schedule, 0, v=v):.3g}"),
            **note,
        })
        return text, charts.gantt(tl, title=f"{schedule}, p={p}, m={m}" + (f", v={v}" if v > 1 else ""))

    return explorer(controls, compute, "Pipeline bubble explorer")


# -- chapter 5: failures and checkpoint intervals ----------------------------------------------------
# Numbers are written the way people read them: three significant digits, thousands separators, no
# scientific notation except for probabilities per node-day (1.0e-4), durations in the unit that fits.
