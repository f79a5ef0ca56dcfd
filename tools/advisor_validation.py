"""The layout advisor against published runs: where it ranks each published layout, and its predicted
MFU (or HFU, as the paper counts) against the published one. Prints the Markdown table of
docs/advisor-validation.md.

    python tools/advisor_validation.py [--efficiency E]

Each run is a profile in data/profiles/published/ with its published numbers in published.yaml.
The published layout is matched on tp, pp (hence dp) and micro-batch size; the choices a paper does
not state (ZeRO stage, recompute, sequence parallelism, interleaving) are the advisor's best within it.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from preflight.chapters import advisor
from preflight.core.profile import load_profile

FOLDER = Path(__file__).resolve().parents[1] / "data" / "profiles" / "published"


def validate(efficiency: float | None = None) -> list[dict]:
    """One row per published run: rank of its layout among the fitting ones, predicted vs published."""
    published = yaml.safe_load((FOLDER / "published.yaml").read_text())
    rows = []
    for name, pub in published.items():
        profile = load_profile(FOLDER / f"{name}.yaml")
        r = advisor.advise(profile, efficiency=efficiency)
        fit = r["candidates"][:r["fitting"]]
        mine = [i for i, c in enumerate(fit) if (c["tp"], c["pp"], c["micro_batch_size"]) ==
                (pub["tp"], pub["pp"], pub["micro_batch_size"])]
        best = fit[mine[0]] if mine else None
        key = pub["counts"]                                     # "hfu" or "mfu", as the paper counts
        t = profile.training                                    # the published layout in full
        exact = advisor.evaluate(profile, advisor.T.Layout(
            tp=t.tp, pp=t.pp, dp=profile.dp, zero_stage=t.zero_stage, activation_recompute=t.activation_recompute,
            sequence_parallel=t.sequence_parallel, micro_batch_size=t.micro_batch_size, microbatches=t.microbatches,
            interleave=t.interleave), r["capacity"], advisor._cluster(profile, profile.cluster.gpu), r["efficiency"])
        faster = sum(c["tokens_per_s_per_gpu"] > exact["tokens_per_s_per_gpu"] for c in fit)
        rows.append({"run": name, "gpus": profile.gpus, "layouts": len(r["candidates"]), "fitting": len(fit),
                     "rank": mine[0] + 1 if mine else None, "published": pub, "predicted": best[key] if best else None,
                     "counts": key, "layout": best, "top": fit[0] if fit else None,
                     "error": (best[key] - pub["percent_of_peak"]) if best else None,
                     "exact": exact, "exact_rank": faster + 1 if exact["fits"] else None,
                     "exact_error": exact[key] - pub["percent_of_peak"]})
    return rows


def _lay(c: dict) -> str:
    return (f"tp {c['tp']} pp {c['pp']} dp {c['dp']}, ZeRO-{c['zero_stage']}, rc {c['activation_recompute']}"
            + (", sp" if c["sequence_parallel"] else "") + f", mbs {c['micro_batch_size']}, m {c['microbatches']}"
            + (f", v {c['interleave']}" if c["interleave"] > 1 else ""))


def markdown(rows: list[dict]) -> str:
    out = ["| run | GPUs | layouts (fit) | published % of peak | published layout as run: rank, predicted (error) "
           "| best with the published tp/pp/mbs: rank, predicted (error), choice | advisor's top layout (its figure) |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r["published"]
        top = r["top"]
        e = r["exact"]
        rank = r["exact_rank"] or f"does not fit ({e['memory_ratio']:.0%} of memory)"
        out.append(f"| {r['run']} | {r['gpus']} | {r['layouts']} ({r['fitting']}) | "
                   f"{p['percent_of_peak']:.0%} ({r['counts'].upper()}, {p['tflops_per_gpu']} TFLOP/s) | "
                   f"{rank}: {_lay(e)}; {e[r['counts']]:.1%} ({r['exact_error'] * 100:+.1f} pp) | "
                   f"{r['rank']}: {r['predicted']:.1%} ({r['error'] * 100:+.1f} pp), {_lay(r['layout'])} | "
                   f"{_lay(top)} ({top[r['counts']]:.1%}) |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--efficiency", type=float)
    print(markdown(validate(ap.parse_args().efficiency)), end="")
