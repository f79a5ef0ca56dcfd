"""The layout advisor in words: one line per layout, the table of chapter 1, the terminal report, and
why the best layout beats the profile's plan (``preflight.chapters.advisor`` ranks; this module says)."""
from __future__ import annotations

from preflight.chapters import memory_plan as MP
from preflight.core.profile import Profile


def label(c: dict) -> str:
    """One layout in one line: ``tp=2 pp=1 dp=512 ZeRO-1 rc=selective sp mbs=1 m=1``."""
    return (f"tp={c['tp']} pp={c['pp']} dp={c['dp']} ZeRO-{c['zero_stage']} rc={c['activation_recompute']}"
            + (" sp" if c["sequence_parallel"] else "") + f" mbs={c['micro_batch_size']} m={c['microbatches']}"
            + (f" v={c['interleave']}" if c["interleave"] > 1 else "") + (f" ep={c['ep']}" if c.get("ep", 1) > 1 else "")
            + (f" cp={c['cp']}" if c.get("cp", 1) > 1 else ""))


def own_plan(profile: Profile, candidates: list[dict]) -> dict | None:
    """The candidate that is the profile's own plan (None if the enumeration does not hold it)."""
    t = profile.training
    mine = (t.tp, t.pp, t.zero_stage, t.activation_recompute, t.sequence_parallel, t.micro_batch_size,
            t.interleave if t.pipeline_schedule == "interleaved" else 1, t.ep, t.cp)
    return next((x for x in candidates if (x["tp"], x["pp"], x["zero_stage"], x["activation_recompute"],
                                           x["sequence_parallel"], x["micro_batch_size"], x["interleave"],
                                           x.get("ep", 1), x.get("cp", 1)) == mine), None)


def table(profile: Profile, candidates: list[dict], top: int = 5):
    """The ``top`` layouts, best first, and the profile's own plan (marked) with their deciding numbers,
    as a DataFrame: rank, layout, memory per GPU (and share of the GPU), bubble, exposed communication,
    step, tokens/s per GPU, MFU."""
    import pandas as pd

    from preflight.core.numfmt import gib

    mine = own_plan(profile, candidates)
    shown = candidates[:top] + ([mine] if mine is not None and mine not in candidates[:top] else [])
    return pd.DataFrame([{
        "rank": f"{candidates.index(c) + 1:,}" if c["fits"] else "— (does not fit)",
        "layout": label(c) + ("  (the profile's plan)" if c is mine else ""),
        "memory per GPU": f"{gib(c['memory_per_gpu_bytes'])} ({c['memory_ratio']:.0%})" + ("" if c["fits"] else ", does not fit"),
        "bubble": f"{c['bubble_fraction']:.1%}",
        "exposed comm (s)": f"{_exposed(c):.3g}",
        "step (s)": f"{c['step_s']:.3g}",
        "tokens/s per GPU": f"{c['tokens_per_s_per_gpu']:,.0f}",
        "MFU": f"{c['mfu']:.1%}"} for c in shown])


def _exposed(c: dict) -> float:
    """Communication a candidate's step waits for: tensor-, pipeline-, data- and context-parallel, all-to-alls."""
    return c["tp_exposed_s"] + c["pp_comm_s"] + c["dp_exposed_s"] + c.get("cp_exposed_s", 0.0) + c.get("a2a_s", 0.0)


def _row(c: dict) -> str:
    from preflight.core.numfmt import gib

    lay = label(c)
    return (f"{lay:<58} {gib(c['memory_per_gpu_bytes']):>10} {c['memory_ratio']:>5.0%} {c['bubble_fraction']:>6.1%} "
            f"{_exposed(c):>8.3g} {c['step_s']:>8.3g} "
            f"{c['tokens_per_s_per_gpu']:>9.4g} {c['mfu']:>5.1%}")


def text_report(profile: Profile, result: dict, top: int) -> str:
    """The ranking for people: one line per layout with its deciding numbers."""
    from preflight.core.numfmt import gib

    c = result["candidates"]
    lines = [f"{profile.project}: {profile.gpus} GPUs, global batch {result['global_batch']} sequences of "
             f"{profile.model.seq_len} tokens; efficiency {result['efficiency']:.0%} ({result['efficiency_source']})",
             f"{len(c)} layouts, {result['fitting']} fit (memory <= {MP.FIT_FAIL:.0%} of {gib(result['capacity'])})",
             f"{'layout':<58} {'memory':>10} {'ratio':>5} {'bubble':>6} {'comm s':>8} {'step s':>8} "
             f"{'tok/s/GPU':>9} {'MFU':>5}"]
    if result["no_fit"]:
        nf = result["no_fit"]
        lines.append("NO LAYOUT FITS. Closest:")
        lines.append(_row(nf["closest"]))
        fixes = [f"a GPU with more memory ({nf['larger_gpu']})" if nf["larger_gpu"] else None,
                 f"{nf['nodes_that_fit']} nodes instead of {profile.cluster.nodes}" if nf["nodes_that_fit"] else None]
        lines.append(f"short by {gib(nf['shortfall_bytes'])} per GPU"
                     + ("" if nf["uses_full_recompute"] else " (full recompute does not close it)")
                     + "; would close it: " + (", or ".join(x for x in fixes if x) or
                                               "nothing in the hardware table, up to 16x the nodes"))
        return "\n".join(lines) + "\n"
    lines += [_row(x) for x in c[:min(top, result["fitting"])]]
    lines += plan_lines(result["plan"])
    lines += [f"not modelled: {x}" for x in result.get("not_modelled", [])]
    return "\n".join(lines) + "\n"


_KNOBS = (("tp", "tp"), ("pp", "pp"), ("dp", "dp"), ("zero_stage", "ZeRO"), ("activation_recompute", "recompute"),
          ("sequence_parallel", "sequence parallelism"), ("micro_batch_size", "micro-batch size"),
          ("microbatches", "micro-batches"), ("interleave", "chunks per stage"), ("ep", "expert parallelism"),
          ("cp", "context parallelism"))
_TERMS = (("compute", "compute"), ("bubble_s", "pipeline bubble"), ("tp_exposed_s", "exposed tensor-parallel comm"),
          ("a2a_s", "expert all-to-alls"), ("cp_exposed_s", "exposed context-parallel K/V ring"),
          ("pp_comm_s", "pipeline send/recv"), ("dp_exposed_s", "exposed data-parallel comm"))


def _per_token(c: dict, key: str) -> float:
    """Seconds per token of one term of a candidate's step (the pipeline's bubble from its share)."""
    tokens = c["tokens_per_s_per_gpu"] * c["step_s"]
    value = {"compute": c["compute_s"], "bubble_s": c["compute_s"] * c["bubble"]}.get(key, c.get(key, 0.0))
    return value / tokens


def why_faster(best: dict, plan: dict) -> str:
    """Why ``best`` beats ``plan``, in the knobs it changes and the terms of the step that shrink (per
    token), largest first: what an engineer checks before believing it."""
    knobs = [f"{label} {plan.get(k, 1)} -> {best.get(k, 1)}" for k, label in _KNOBS if plan.get(k, 1) != best.get(k, 1)]
    gains = sorted(((_per_token(plan, k) - _per_token(best, k), label) for k, label in _TERMS), reverse=True)
    per_plan = 1 / plan["tokens_per_s_per_gpu"]
    terms = [f"{label} -{gain / per_plan:.0%}" for gain, label in gains if gain / per_plan >= 0.02][:3]
    eff = (f"; kernel efficiency {plan['efficiency']:.0%} -> {best['efficiency']:.0%}"
           if abs(best["efficiency"] - plan["efficiency"]) >= 0.01 else "")
    return (", ".join(knobs) or "the same knobs") + ": " + (", ".join(terms) or "no single term") + " of the step" + eff


def plan_lines(p: dict) -> list[str]:
    """The profile's own plan: its rank among the fitting layouts and its gap to the best, or why it
    does not fit; then its row."""
    if not p["fits"]:
        head = f"the profile's own plan does not fit ({p['memory_ratio']:.0%} of the GPU's memory):"
    elif p["rank"] == 1:
        head = f"the profile's own plan is the best of {p['of']:,} fitting layouts:"
    else:
        head = (f"the profile's own plan: rank {p['rank']:,} of {p['of']:,} fitting layouts, the best is "
                f"{p['gap_to_best']:.0%} faster ({p['why_best']}):")
    tight = ["  tight: between 90 and 100 % of the GPU's memory (chapter 1 warns)"] if 0.9 < p["memory_ratio"] <= 1 else []
    return [head, _row(p)] + tight

