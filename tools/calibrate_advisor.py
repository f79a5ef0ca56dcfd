"""Fit the step model's few free constants on published runs, and say how it does on runs it was not fitted on.

    python tools/calibrate_advisor.py [--quick] [--out data/reference/advisor-calibration.json]

The free constants (``preflight.models.throughput``): the GEMM efficiency ceiling per chip generation
(``GEMM_CEILING``: ampere, hopper, blackwell) and the shape constant of ``gemm_efficiency``
(``GEMM_HIDDEN_HALF``). Everything else in the model is physics or a framework's documented behaviour. Two
more were tried and went (they helped no held-out family): a tokens-per-micro-batch term, and a share of the
fp8 peak's 2x that fp8 GEMMs reach. The loss is the mean over families of each family's mean |log(predicted / published)|, so a
family of 11 rows weighs what a family of 1 does.

Fit set: data/profiles/published/ (34 runs) and data/profiles/bridge/ (Megatron-Bridge 26.08, 26.06.01, 26.06).
Evaluation only, never fitted: data/profiles/heldout/ (older Bridge releases, torchtitan's tables,
DeepSeek-V3's report). Reported:

- in-sample: the fit on every fit row, each row's error;
- leave one family out: each family of the fit set predicted by constants fitted without it (a family is
  source x chip x precision, ``tools/published_runs.py``);
- held-out: the evaluation set under the constants fitted on the whole fit set.

The fitted constants are copied by hand into throughput.py (their one home); ``--out`` writes the record
(JSON first: constants, errors per row and per family, method version, date) that
tests/test_advisor_calibration.py checks the code against.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "lib"))
sys.path.insert(0, str(REPO / "tools"))

from published_runs import runs  # noqa: E402

from preflight.chapters import step as S  # noqa: E402
from preflight.core.profile import load_profile  # noqa: E402
from preflight.models import throughput as T  # noqa: E402

METHOD_VERSION = 1
# (name, low, high): the search box of each free constant
PARAMS = (("ampere", 0.30, 0.95), ("hopper", 0.30, 0.95), ("blackwell", 0.15, 0.95), ("hidden_half", 0.0, 6000.0))


def current() -> dict:
    """The constants as throughput.py holds them now."""
    return {"ampere": T.GEMM_CEILING["ampere"], "hopper": T.GEMM_CEILING["hopper"],
            "blackwell": T.GEMM_CEILING["blackwell"], "hidden_half": T.GEMM_HIDDEN_HALF}


def apply(c: dict) -> None:
    """Set the model's constants (for the search; the committed values live in throughput.py)."""
    T.GEMM_CEILING.update(ampere=c["ampere"], hopper=c["hopper"], blackwell=c["blackwell"])
    T.GEMM_HIDDEN_HALF = c["hidden_half"]


def load(sets: tuple[str, ...]) -> list[dict]:
    rows = []
    for s in sets:
        for r in runs(s):
            rows.append(r | {"loaded": load_profile(r["profile"])})
    return rows


def predict(rows: list[dict], c: dict) -> list[float]:
    apply(c)
    return [S.plan_step(r["loaded"]).terms["tokens_per_s_per_gpu"] for r in rows]


def loss(rows: list[dict], c: dict) -> float:
    fams: dict[str, list[float]] = {}
    for r, p in zip(rows, predict(rows, c)):
        fams.setdefault(r["family"], []).append(abs(math.log(p / r["pub_tok_s_gpu"])))
    return statistics.mean(statistics.mean(v) for v in fams.values())


def fit(rows: list[dict], start: dict, sweeps: int = 3, steps: int = 14, free: tuple[str, ...] | None = None) -> dict:
    """Coordinate descent (a golden-section search per constant inside its box, ``sweeps`` times), then a
    Nelder-Mead simplex from there: the ceilings and ``H0`` trade off along a shallow valley (a larger H0 with
    larger ceilings gives the same large-model efficiency), which coordinate steps only creep along. Only the
    ``free`` constants move (default: all of ``PARAMS``)."""
    c = _coordinates(rows, start, sweeps, steps, free)
    return _simplex(rows, c, free, iterations=60 * sweeps)


def _simplex(rows: list[dict], start: dict, free: tuple[str, ...] | None, iterations: int) -> dict:
    """Nelder-Mead (reflection 1, expansion 2, contraction 1/2, shrink 1/2) over the free constants, each
    kept inside its box; the initial simplex steps 5 % of each box."""
    names = [n for n, _, _ in PARAMS if free is None or n in free]
    box = {n: (lo, hi) for n, lo, hi in PARAMS}

    def point(x: list[float]) -> dict:
        return start | {n: min(max(v, box[n][0]), box[n][1]) for n, v in zip(names, x)}

    def f(x: list[float]) -> float:
        return loss(rows, point(x))

    x0 = [start[n] for n in names]
    simplex = [x0] + [[v + (0.05 * (box[n][1] - box[n][0]) if i == j else 0.0) for j, (n, v) in enumerate(zip(names, x0))]
                      for i in range(len(names))]
    scored = sorted(((f(x), x) for x in simplex), key=lambda t: t[0])
    for _ in range(iterations):
        (fb, best), (fw, worst), (fs, _) = scored[0], scored[-1], scored[-2]
        centre = [sum(x[i] for _, x in scored[:-1]) / (len(scored) - 1) for i in range(len(names))]
        refl = [c + (c - w) for c, w in zip(centre, worst)]
        fr = f(refl)
        if fr < fb:
            exp = [c + 2 * (c - w) for c, w in zip(centre, worst)]
            fe = f(exp)
            scored[-1] = (fe, exp) if fe < fr else (fr, refl)
        elif fr < fs:
            scored[-1] = (fr, refl)
        else:
            con = [c + 0.5 * (w - c) for c, w in zip(centre, worst)]
            fc = f(con)
            if fc < fw:
                scored[-1] = (fc, con)
            else:
                scored = [scored[0]] + [(f(y), y) for y in ([b + 0.5 * (x[i] - b) for i, b in enumerate(best)]
                                                             for _, x in scored[1:])]
        scored.sort(key=lambda t: t[0])
    return point(scored[0][1])


def _coordinates(rows: list[dict], start: dict, sweeps: int, steps: int, free: tuple[str, ...] | None) -> dict:
    c = dict(start)
    g = (math.sqrt(5) - 1) / 2
    for _ in range(sweeps):
        for name, lo, hi in PARAMS:
            if free is not None and name not in free:
                continue
            a, b = lo, hi
            x1, x2 = b - g * (b - a), a + g * (b - a)
            f1, f2 = loss(rows, c | {name: x1}), loss(rows, c | {name: x2})
            for _ in range(steps):
                if f1 < f2:
                    b, x2, f2 = x2, x1, f1
                    x1 = b - g * (b - a)
                    f1 = loss(rows, c | {name: x1})
                else:
                    a, x1, f1 = x1, x2, f2
                    x2 = a + g * (b - a)
                    f2 = loss(rows, c | {name: x2})
            best = (x1 + x2) / 2
            if loss(rows, c | {name: best}) < loss(rows, c):
                c[name] = best
    return c


def errors(rows: list[dict], preds: list[float]) -> list[dict]:
    return [{"run": r["name"], "family": r["family"], "published": r["pub_tok_s_gpu"], "predicted": p,
             "ratio": p / r["pub_tok_s_gpu"]} for r, p in zip(rows, preds)]


def summary(errs: list[dict]) -> dict:
    e = [abs(x["ratio"] - 1) for x in errs]
    return {"rows": len(e), "median_abs_error": statistics.median(e) if e else None,
            "within_20": sum(x <= 0.2 for x in e) / len(e) if e else None,
            "median_ratio": statistics.median(x["ratio"] for x in errs) if errs else None}


def _family_rows(rows: list[dict]) -> dict[str, list[float]]:
    fams: dict[str, list[float]] = {}
    for r in rows:
        fams.setdefault(r["family"], []).append(r["ratio"])
    return fams


def markdown(record: dict) -> str:
    """The doc's tables from a record: the summary (in-sample, leave one family out, held out) and the error
    of each fit family predicted by constants fitted without it, beside its in-sample error."""
    pct = lambda x: f"{x * 100:.1f} %"
    lines = ["| | rows | median \\|predicted / published - 1\\| | within +-20 % | median ratio |", "|---|---|---|---|---|"]
    n_fit = record["in_sample"]["summary"]["rows"]
    for key, words in (("in_sample", f"in-sample (fit on all {n_fit})"), ("leave_one_family_out", "**leave one family out**"),
                       ("held_out", "held out (never fitted: older Bridge, torchtitan, DeepSeek-V3)")):
        sm = record[key]["summary"]
        lines.append(f"| {words} | {sm['rows']} | {pct(sm['median_abs_error'])} | {pct(sm['within_20'])} | "
                     f"{sm['median_ratio']:.2f} |")
    lines += ["", "| family (source / chip / precision) | rows | in-sample median ratio | held out: median ratio | "
                  "held out: worst |", "|---|---|---|---|---|"]
    ins, out = _family_rows(record["in_sample"]["rows"]), _family_rows(record["leave_one_family_out"]["rows"])
    for fam in sorted(out, key=lambda f: -statistics.median(abs(x - 1) for x in out[f])):
        worst = max(out[fam], key=lambda x: abs(x - 1))
        lines.append(f"| {fam} | {len(out[fam])} | {statistics.median(ins[fam]):.2f} | {statistics.median(out[fam]):.2f} | "
                     f"{worst:.2f} |")
    c, opt = record["constants"], record["search_optimum"]
    lines += ["", "Constants (throughput.py): " + ", ".join(f"`{k}` = {v:.4g}" for k, v in c.items())
              + "; the search's optimum from there: " + ", ".join(f"{k} {v:.4g}" for k, v in opt["constants"].items())
              + f" (in-sample {pct(opt['in_sample']['median_abs_error'])})."]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer search steps (a smoke run)")
    ap.add_argument("--markdown", metavar="RECORD", help="print the doc's tables from a record and exit")
    ap.add_argument("--out", help="write the calibration record (JSON) here")
    ap.add_argument("--free", help="comma-separated constants to fit (default: all); the others keep their "
                                   "values in throughput.py")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="start a constant at VALUE (e.g. --set tokens_half=0 with --free leaving it out)")
    args = ap.parse_args()
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())), end="")
        return 0
    free = tuple(args.free.split(",")) if args.free else None
    sweeps, steps = (1, 6) if args.quick else (3, 14)
    fit_rows, held = load(("published", "bridge")), load(("heldout",))
    current_before = current()
    start = current() | {k: float(v) for k, v in (x.split("=", 1) for x in args.set)}
    best = fit(fit_rows, start, sweeps, steps, free)
    searched = summary(errors(fit_rows, predict(fit_rows, best)))
    # what ships: the constants throughput.py holds (the search's, to 3 digits)
    in_sample = errors(fit_rows, predict(fit_rows, current_before))
    held_out = errors(held, predict(held, current_before))
    lofo = []
    for fam in sorted({r["family"] for r in fit_rows}):
        train = [r for r in fit_rows if r["family"] != fam]
        test = [r for r in fit_rows if r["family"] == fam]
        c = fit(train, current_before, max(1, sweeps - 1), steps, free)
        lofo += errors(test, predict(test, c))
    apply(current_before)
    record = {"method": "tools/calibrate_advisor.py", "method_version": METHOD_VERSION, "date": date.today().isoformat(),
              "constants": current_before, "free": list(free or [p[0] for p in PARAMS]),
              "search_optimum": {"constants": best, "in_sample": searched},
              "in_sample": {"summary": summary(in_sample), "rows": in_sample},
              "leave_one_family_out": {"summary": summary(lofo), "rows": lofo},
              "held_out": {"summary": summary(held_out), "rows": held_out}}
    print(json.dumps({"constants": record["constants"], "search_optimum": record["search_optimum"]}
                     | {k: record[k]["summary"] for k in ("in_sample", "leave_one_family_out", "held_out")}, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
