"""Chapter 1's sliders: Amdahl / Gustafson, and the memory planner."""
from __future__ import annotations

import ipywidgets as W

from preflight.core.numfmt import gib
from preflight.models import scaling
from preflight.reporting import charts
from preflight.widgets.core import explorer, readout


def amdahl_explorer(ts: float, tc: float, n: int, n_max: int = 16384, source: str = "") -> W.VBox:
    """Sliders: serial time Ts, parallel time Tc (s), workers N (powers of two). ``source``: where the
    starting Ts and Tc come from, named in the chart title and the explorer's heading."""
    style = {"description_width": "170px"}
    layout = W.Layout(width="520px")
    hi = max(ts, tc) * 4 or 1.0

    def seconds(value: float, label: str, low: float) -> W.FloatSlider:
        # the step divides the start value exactly, so the browser starts where Python does
        step = value / 100 if value > 0 else hi / 1000
        return W.FloatSlider(value=value, min=low * step, max=step * round(hi / step), step=step,
                             description=label, readout_format=".4g", style=style, layout=layout)

    controls = {
        "ts": seconds(ts, "serial Ts (s)", 0),
        "tc": seconds(tc, "parallel Tc (s)", 1),
        "n": W.IntSlider(value=max(0, int(n).bit_length() - 1), min=0, max=n_max.bit_length() - 1,
                         description="log2 N (workers)", style=style, layout=layout),
    }

    def compute(ts, tc, n):
        n_workers = 2 ** n
        s = scaling.amdahl_speedup(ts, tc, n_workers)
        ceil = scaling.amdahl_ceiling(ts, tc)
        g = scaling.gustafson_speedup(scaling.serial_fraction(ts, tc), n_workers)
        text = readout({
            "n": ("N workers", f"{n_workers}"),
            "speedup": ("Amdahl S(N), the work fixed (strong)", f"{s:.2f}x"),
            "efficiency": ("efficiency S(N)/N", f"{s / n_workers:.1%}"),
            "ceiling": ("ceiling 1 + Tc/Ts", "unbounded" if ceil == float("inf") else f"{ceil:.2f}x"),
            "gustafson": ("Gustafson N - s(N-1), per-GPU batch fixed (weak)", f"{g:.1f}x"),
            "gustafson_eff": ("Gustafson efficiency", f"{g / n_workers:.1%}"),
        })
        return text, charts.amdahl_chart(ts, tc, n_max=max(n_workers, 1024), n_mark=n_workers,
                                         source="sliders" if source else "")

    return explorer(controls, compute, "Amdahl / Gustafson explorer" + (f" (starts from {source})" if source else ""))


def memory_explorer(plan, capacity_bytes: float | None, gpus_per_node: int, gpus: int) -> W.VBox:
    """Sliders over the memory plan: tp, pp, ZeRO stage, activation recompute, micro-batch size and
    sequence parallelism -> per-GPU bytes term by term (``preflight.models.memory``) against the GPU's
    memory. Changing tp or pp keeps the GPU count: dp = gpus / (tp pp)."""
    from dataclasses import replace

    from preflight.models import memory as M
    from preflight.models.states import STAGES

    style, layout = {"description_width": "170px"}, W.Layout(width="520px")
    tps = [t for t in (1, 2, 4, 8, 16, 32, 64)
           if t <= max(gpus_per_node, plan.tp) and plan.kv % t == 0 and gpus % t == 0]
    pps = [p for p in range(1, min(plan.layers, 128) + 1) if plan.layers % p == 0 and gpus % p == 0]
    mbs = sorted({1, 2, 4, 8, 16, 32, 64, plan.micro_batch_size})
    controls = {
        "tp": W.SelectionSlider(options=sorted(set(tps) | {plan.tp}), value=plan.tp,
                                description="tensor parallel tp", style=style, layout=layout),
        "pp": W.SelectionSlider(options=sorted(set(pps) | {plan.pp}), value=plan.pp,
                                description="pipeline stages pp", style=style, layout=layout),
        "zero": W.IntSlider(value=plan.zero_stage, min=min(STAGES[plan.framework]), max=max(STAGES[plan.framework]),
                            description="ZeRO stage", style=style, layout=layout),
        "recompute": W.ToggleButtons(options=["none", "selective", "full"], value=plan.recompute,
                                     description="recompute", style=style),
        "mbs": W.SelectionSlider(options=mbs, value=plan.micro_batch_size, description="micro-batch size",
                                 style=style, layout=layout),
        "sp": W.Checkbox(value=plan.sequence_parallel, description="sequence parallel (tp > 1)",
                         style={"description_width": "initial"}, layout=W.Layout(width="520px")),
    }

    def compute(tp, pp, zero, recompute, mbs, sp):
        if gpus % (tp * pp):
            return readout({"total": ("memory per GPU", f"tp x pp = {tp * pp} does not divide {gpus} GPUs")}), \
                charts.memory_bars(None, capacity_bytes)
        schedule = plan.schedule if pp > 1 else "1f1b"
        inter = plan.interleave if pp > 1 and schedule == "interleaved" and plan.microbatches % pp == 0 else 1
        try:
            new = replace(plan, tp=tp, pp=pp, dp=gpus // (tp * pp), zero_stage=zero, recompute=recompute,
                          micro_batch_size=mbs, sequence_parallel=bool(sp and tp > 1),
                          schedule=schedule if inter > 1 or schedule != "interleaved" else "1f1b", interleave=inter)
        except ValueError as err:
            return (readout({"total": ("memory per GPU", f"not a valid plan: {err}")}),
                    charts.memory_bars(None, capacity_bytes))
        terms = M.terms(new)
        by = dict(zip(terms["term"], terms["bytes"]))
        total = float(terms["bytes"].sum())
        act = sum(v for k, v in by.items() if k.startswith("activations"))
        values = {
            "total": ("memory per GPU", gib(total)),
            "states": ("weights + gradients + optimizer", gib(by["weights"] + by["gradients"] + by["optimizer"])),
            "activations": ("activations", gib(act)),
            "dp": ("data parallel dp", f"{new.dp}"),
        }
        if capacity_bytes:
            ratio = total / capacity_bytes
            values["fits"] = ("of the GPU's memory", f"{ratio:.0%} " + ("fits" if ratio <= 1 else "OUT OF MEMORY"))
        return readout(values), charts.memory_bars(terms, capacity_bytes)

    return explorer(controls, compute, "Memory planner")


def layout_explorer(profile, result: dict, top: int = 8) -> W.VBox:
    """The advisor's ranking (``preflight.chapters.advisor.advise``'s ``result``) under three choices worth
    exploring: the kernels' efficiency (the advisor's own, by chip and shape, or one share of the peak
    for every layout: re-times and re-ranks the fitting layouts with the same step model,
    ``advisor.at_efficiency``), the largest pipeline depth the team will run, and whether ZeRO-3 /
    FSDP full sharding is allowed. Memory does not change with them, so no layout is re-planned."""
    from preflight.chapters import advisor

    style, layout = {"description_width": "170px"}, W.Layout(width="520px")
    fitting = [c for c in result["candidates"] if c["fits"]]
    pps = sorted({c["pp"] for c in fitting}) or [1]
    effs = sorted({round(0.05 * k, 2) for k in range(4, 17)} | {round(result["efficiency"], 2)})
    # 0: the advisor's own efficiency, by chip and shape (a slider's value cannot be None)
    options = ([("by chip and shape", 0.0)] if result.get("efficiency_modelled") else []) + [(f"{e:.0%}", e) for e in effs]
    controls = {
        "efficiency": W.SelectionSlider(options=options, value=0.0 if result.get("efficiency_modelled")
                                        else round(result["efficiency"], 2),
                                        description="kernel efficiency (of peak)", style=style, layout=layout),
        "max_pp": W.SelectionSlider(options=pps, value=pps[-1], description="pipeline stages at most",
                                    style=style, layout=layout),
        "zero3": W.Checkbox(value=True, description="ZeRO-3 / FSDP full sharding allowed",
                            style={"description_width": "initial"}, layout=layout),
    }
    cache: dict[float, list[dict]] = {}
    own_all = advisor.own_plan(profile, result["candidates"])

    def compute(efficiency, max_pp, zero3):
        efficiency = efficiency or None
        if efficiency not in cache:
            cache[efficiency] = advisor.at_efficiency(profile, result, efficiency)
        ranked = [c for c in cache[efficiency] if c["pp"] <= max_pp and (zero3 or c["zero_stage"] < 3)]
        own = advisor.own_plan(profile, cache[efficiency])
        if own is None and own_all is not None:          # the plan does not fit: shown, re-timed, not ranked
            own = advisor.retime(profile, own_all, efficiency)
        if not ranked:
            return readout({"best": ("best layout", "none fits under these limits")}), \
                charts.layouts_chart([], own, efficiency)
        best = ranked[0]
        values = {"best": ("best layout", advisor.label(best)),
                  "tokens": ("predicted tokens/s per GPU", f"{best['tokens_per_s_per_gpu']:,.0f}"),
                  "mfu": ("predicted MFU (below the kernels' efficiency: bubble, exposed communication, recompute)",
                          f"{best['mfu']:.1%} at {best['efficiency']:.0%} kernel efficiency"),
                  "step": ("step", f"{best['step_s']:.3g} s"),
                  "count": ("layouts that fit these limits", f"{len(ranked)}")}
        if own is not None:
            where = (f"rank {ranked.index(own) + 1}, " if own in ranked else
                     "outside these limits, " if own["fits"] else "does not fit its memory; it would give ")
            values["own"] = ("the profile's plan", where
                             + f"{own['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU "
                             f"({own['tokens_per_s_per_gpu'] / best['tokens_per_s_per_gpu']:.0%} of the best)")
        return readout(values), charts.layouts_chart(ranked[:top], own, efficiency)

    return explorer(controls, compute, title="Layout advisor: which tp x pp x dp, ZeRO stage and recompute")


def fp8_explorer(profile, gpu_key: str | None = None) -> W.VBox:
    """Chapter 1's fp8 explorer: the chip, the scaling recipe and the sequence length -> the step in bf16, with
    fp8 GEMMs but no casts, and with the recipe's casts; their ratios beside the GEMMs' own 2x (the peaks'
    ratio). Every number is ``preflight.chapters.fp8_recipes.recipe_row`` (the step model) on the profile's
    plan with those three changed; a recipe the chip cannot run says why."""
    import pandas as pd

    from preflight.chapters import fp8_recipes as F
    from preflight.core import hardware

    style, layout = {"description_width": "170px"}, W.Layout(width="520px")
    chips = [k for k, c in hardware.CHIPS.items() if c.fp8_tflops and c.bf16_tflops]
    start = F.chip_key(profile, gpu_key)
    start = start if start in chips else "H100-SXM"
    seqs = sorted({2 ** k for k in range(10, 18)} | {profile.model.seq_len})
    controls = {
        "chip": W.Dropdown(options=chips, value=start, description="GPU", style=style, layout=layout),
        "recipe": W.Dropdown(options=list(F.RECIPES), value=profile.training.fp8_recipe, description="fp8 recipe",
                             style=style, layout=layout),
        "seq_len": W.SelectionSlider(options=seqs, value=profile.model.seq_len, description="sequence length",
                                     style=style, layout=layout),
    }

    def compute(chip, recipe, seq_len):
        q = profile.model_copy(update={"cluster": profile.cluster.model_copy(update={"gpu": chip}),
                                       "model": profile.model.model_copy(update={"seq_len": seq_len})})
        rows = [F.recipe_row(q, x) for x in F.RECIPES]
        r = next(x for x in rows if x["recipe"] == recipe)
        if r["why_not"]:
            values = {"why_not": (f"{recipe} on {chip}", r["why_not"])}
        else:
            values = {
                "gemm_gain": ("a GEMM alone: the fp8 peak over the bf16 peak", f"{r['gemm_gain']:.2f}x"),
                "bf16_step": ("step in bf16", f"{r['bf16_step_s']:.3f} s"),
                "no_casts": ("step with fp8 GEMMs, no casts (the rest stays bf16)", f"{r['fp8_no_casts_s']:.3f} s"),
                "fp8_step": (f"step in fp8, {recipe} casts included", f"{r['fp8_step_s']:.3f} s"),
                "compute": ("compute, bf16 -> fp8", f"{r['bf16_compute_s']:.3f} -> {r['fp8_compute_s']:.3f} s"),
                "exposed": ("exposed communication, bf16 -> fp8", f"{r['bf16_exposed_s']:.3f} -> {r['fp8_exposed_s']:.3f} s"),
                "casts": ("the casts' time per step", f"{r['casts_s'] * 1e3:.1f} ms"),
                "gain_no_casts": ("gain without casts", f"{r['gain_no_casts']:.3f}x"),
                "gain": ("the real gain: step bf16 / step fp8", f"{r['gain']:.3f}x"),
                "why": ("why not 2x", F.why(r)),
            }
        ok = [x for x in rows if not x["why_not"]]          # the chips offered all run the delayed recipe
        bars = pd.DataFrame([{"configuration": "a GEMM alone (peak ratio)", "step bf16 / step fp8": ok[0]["gemm_gain"]},
                             {"configuration": "whole step, no casts", "step bf16 / step fp8": ok[0]["gain_no_casts"]}]
                            + [{"configuration": f"whole step, {x['recipe']}", "step bf16 / step fp8": x["gain"]}
                               for x in ok])
        return readout(values), charts.bars(bars, "step bf16 / step fp8", "configuration", fmt=".2f",
                                            title=f"fp8's gain on {chip}, sequence {seq_len:,}")

    return explorer(controls, compute, "fp8 by recipe: the real gain")
