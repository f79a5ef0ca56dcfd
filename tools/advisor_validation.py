"""The layout advisor against 34 published training runs: each run's published layout predicted
(tokens/s per GPU against the published figure), where the advisor ranks it, and its own top layout.
Prints the Markdown table of docs/advisor-validation.md.

    python tools/advisor_validation.py [--efficiency E] [--summary]

Each run is a profile in data/profiles/published/ (its ``training:`` block is the published layout;
what the source does not state is marked in its header) with the published figures in
published.yaml: ``pub_tok_s_gpu`` is computed with each source's own FLOP convention (or measured step
time), so predicted / published does not depend on conventions. ``rows()`` is what
tests/test_advisor_validation.py bounds.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "lib"))

from preflight.chapters import advisor  # noqa: E402
from preflight.core.profile import load_profile  # noqa: E402

FOLDER = REPO / "data" / "profiles" / "published"


def published() -> dict:
    return yaml.safe_load((FOLDER / "published.yaml").read_text())


def rows(efficiency: float | None = None, search: bool = True) -> list[dict]:
    """One row per run: the published layout's prediction and memory; with ``search``, its rank among the
    fitting layouts and the advisor's top."""
    out = []
    for name, pub in published().items():
        profile = load_profile(FOLDER / f"{name}.yaml")
        plan = advisor.evaluate_plan(profile, efficiency=efficiency)
        row = {"run": name, "gpus": profile.gpus, "gpu": profile.cluster.gpu, "published": pub["pub_tok_s_gpu"],
               "metric": pub["metric"], "plan": plan, "ratio": plan["tokens_per_s_per_gpu"] / pub["pub_tok_s_gpu"],
               "zero3": name.startswith("zero3-"), "sharded": profile.training.zero_stage == 3}
        if search:
            r = advisor.advise(profile, efficiency=efficiency)
            fit = r["candidates"][:r["fitting"]]
            row |= {"layouts": len(r["candidates"]), "fitting": len(fit), "top": fit[0] if fit else None,
                    "rank": r["plan"]["rank"], "why": r["plan"]["why_best"], "gap": r["plan"]["gap_to_best"]}
        out.append(row)
    return out


def summary(rs: list[dict]) -> dict:
    err = [abs(r["ratio"] - 1) for r in rs]
    z3 = [abs(r["ratio"] - 1) for r in rs if r["zero3"]]
    sharded = [abs(r["ratio"] - 1) for r in rs if r["sharded"]]
    return {"runs": len(rs), "median_abs_error": statistics.median(err),
            "within_20": sum(e <= 0.20 for e in err) / len(err), "fit": sum(r["plan"]["fits"] for r in rs),
            "zero3_max_abs_error": max(z3) if z3 else None, "sharded_max_abs_error": max(sharded) if sharded else None,
            "median_ratio": statistics.median(r["ratio"] for r in rs)}


def _lay(c: dict) -> str:
    return advisor.label(c)


def markdown(rs: list[dict]) -> str:
    out = ["| run | GPUs | published tok/s/GPU | predicted | ratio | memory | rank of the published layout "
           "(fitting layouts) | the advisor's top (tok/s/GPU) | why it predicts the top faster |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rs:
        p, top = r["plan"], r.get("top")
        rank = f"{r['rank']:,} ({r['fitting']:,})" if r.get("rank") else f"- ({r.get('fitting', 0):,})"
        why = "it is the published layout" if r.get("rank") == 1 else (
            f"+{r['gap']:.0%}: {r['why']}" if r.get("why") else "-")
        out.append(f"| {r['run']} | {r['gpus']:,} {r['gpu']} | {r['published']:,.0f} | {p['tokens_per_s_per_gpu']:,.0f} | "
                   f"{r['ratio']:.2f} | {p['memory_ratio']:.0%} | {rank} | "
                   + (f"{_lay(top)} ({top['tokens_per_s_per_gpu']:,.0f})" if top else "-") + f" | {why} |")
    s = summary(rs)
    out.append("")
    out.append(f"Median |predicted / published - 1| = {s['median_abs_error']:.1%}; within +-20 %: "
               f"{s['within_20']:.0%} of {s['runs']}; published layouts that fit: {s['fit']} of {s['runs']}; "
               f"the ZeRO-3 rows (zero3-*): worst {s['zero3_max_abs_error']:.0%}; every ZeRO-3 / FSDP run: worst "
               f"{s['sharded_max_abs_error']:.0%}; median ratio {s['median_ratio']:.2f}.")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--efficiency", type=float)
    ap.add_argument("--summary", action="store_true", help="only the summary line (no layout search)")
    a = ap.parse_args()
    rs = rows(a.efficiency, search=not a.summary)
    print(summary(rs) if a.summary else markdown(rs), end="\n" if a.summary else "")
