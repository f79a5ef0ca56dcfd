"""What to fix first: how the report reads the findings to pick each chapter's deciding finding, order
a chapter's findings, and rank the fixes of the whole audit.

Two rules, both from the findings' own data (``verdict``, ``value``, ``threshold``):

1. **A number decides only if its threshold speaks about it.** A threshold written as chapters write
   it (``judge`` in ``preflight.core.findings``: "pass <= 10%, fail > 30%") is read back into its two
   bounds; the finding's number *decides* when those bounds, applied to it, give its verdict. An
   interval in seconds (28,420 s) judged on the extra waste it costs ("pass <= +1%") would not (so
   chapter 5 reports that extra waste, +0.21 %, as the number); the expected waste (0.64 %,
   "pass <= 5%") does. Thresholds with two conditions, or in words only
   ("pass = bitwise equal"), are not read: their number does not decide.

2. **What a fix buys** is ranked by the verdict first (fail, then warn), then by its **consequence**
   (:data:`CONSEQUENCE`): a plan that cannot start or finish (out of memory at the first step, a
   checkpoint interval longer than the walltime) before time lost on every step, before a factor
   missed (a speedup, a ratio); among time lost, by the share of the run lost where the finding says it
   (:data:`TIME_LOST`: the step model's bubble and exposed communication, the run's waste); then by how many times the
   deciding number misses its pass bound: ``value / bound`` when lower is better, ``bound / value``
   when higher is better. That factor is what the fix has to move the number by: Amdahl's 9.89x
   against "pass >= 2048x" is 207 times short; padding waste of 68.4 % against "pass <= 10%" is 6.8
   times over. For a passing finding the factor is below 1 (its margin): the closest to failing comes
   first. A finding whose number does not decide ranks after those that do, with the same verdict.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from preflight.core.findings import VERDICT_RANK

# Consequence classes, largest first: 3 the run cannot start or cannot finish; 2 time lost (a share of
# each step, seconds per start, GPU-hours); 1 a factor missed. Findings not named here: 2 when their unit
# is a fraction or seconds, else 1.
CANNOT_START = {"baseline/memory_fits": "out of memory at the first step",
                "fault_tolerance/walltime_fit": "no checkpoint before the walltime ends the job"}
CONSEQUENCE_WORDS = {3: "cannot start or finish", 2: "time lost", 1: "a factor missed"}


def consequence(finding: dict) -> int:
    """3 (cannot start or finish), 2 (time lost) or 1 (a factor missed): see :data:`CANNOT_START`."""
    if finding["id"] in CANNOT_START:
        return 3
    return 2 if finding.get("unit") in ("fraction", "s", "bytes") else 1


_BOUND = re.compile(r"\b(pass|fail)\s*(<=|>=|<|>)\s*([+-]?\d[\d,]*(?:\.\d+)?)\s*(%?)")


@dataclass(frozen=True)
class Threshold:
    """The two bounds of a threshold, in the finding's unit (percentages as fractions)."""
    pass_bound: float
    fail_bound: float
    higher_is_better: bool

    def verdict(self, value: float) -> str:
        """The verdict ``judge`` gives ``value`` against these bounds."""
        if self.higher_is_better:
            return "pass" if value >= self.pass_bound else "warn" if value >= self.fail_bound else "fail"
        return "pass" if value <= self.pass_bound else "warn" if value <= self.fail_bound else "fail"


def threshold_of(finding: dict) -> Threshold | None:
    """The bounds in a finding's threshold words ("pass >= 80%, fail < 60%"); None when they hold not
    exactly one pass and one fail bound, or when the two point different ways."""
    hits = _BOUND.findall(finding.get("threshold") or "")
    passes, fails = [h for h in hits if h[0] == "pass"], [h for h in hits if h[0] == "fail"]
    if len(passes) != 1 or len(fails) != 1:
        return None
    (_, p_op, p_num, p_pct), (_, f_op, f_num, f_pct) = passes[0], fails[0]
    higher = p_op.startswith(">")
    if higher == f_op.startswith(">"):
        return None
    value = lambda n, pct: float(n.replace(",", "")) / (100 if pct else 1)  # noqa: E731
    return Threshold(value(p_num, p_pct), value(f_num, f_pct), higher)


def decides(finding: dict) -> bool:
    """The finding's number is the quantity its threshold judges (rule 1 of the module)."""
    t = threshold_of(finding)
    return t is not None and finding.get("value") is not None and t.verdict(finding["value"]) == finding["verdict"]


def shortfall(finding: dict) -> float | None:
    """How many times the deciding number misses its pass bound (rule 2): above 1 short of passing,
    below 1 inside it; None when the number does not decide, or a bound or the value is not positive."""
    if not decides(finding):
        return None
    t, v = threshold_of(finding), finding["value"]
    if v <= 0 or t.pass_bound <= 0:
        return None
    return t.pass_bound / v if t.higher_is_better else v / t.pass_bound


# The share of the run's time a finding says is lost, read from its value: the one step model's terms
# (bubble, exposed communication, what the step is not work) and the run's waste. Time lost ranks the fixes
# that buy time before a threshold's shortfall does (2 % of the run lost ranks below 40 %, whatever bounds
# each was judged on).
TIME_LOST = {"baseline/scaling_efficiency_at_target": lambda v: 1.0 - v,
             "communication/exposed_comm_share": lambda v: v,
             "load_balance/bubble_fraction": lambda v: v,
             "load_balance/padding_waste": lambda v: v,
             "load_balance/straggler_slowdown": lambda v: v / (1.0 + v),
             "fault_tolerance/expected_waste": lambda v: v,
             "fault_tolerance/checkpoint_interval_extra_waste": lambda v: v}


def time_lost(finding: dict) -> float | None:
    """The share of the run's time the finding says is lost (:data:`TIME_LOST`), None where it says none."""
    f, v = TIME_LOST.get(finding["id"]), finding.get("value")
    return None if f is None or v is None else max(0.0, min(1.0, f(v)))


def rank_key(finding: dict) -> tuple:
    """Sort key, largest first: verdict, consequence, the share of time lost where the finding says it,
    then a deciding number, its shortfall, any number."""
    s = shortfall(finding)
    judged = VERDICT_RANK[finding["verdict"]] >= VERDICT_RANK["warn"]      # among passes: the closest to failing
    lost = time_lost(finding) if judged else None
    return (VERDICT_RANK[finding["verdict"]], consequence(finding) if judged else 0,
            lost is not None, lost or 0.0, decides(finding), s if s is not None else 0.0,
            finding.get("value") is not None)


def deciding(findings: list[dict]) -> dict | None:
    """The finding that sets a chapter's verdict: the worst one; among equals the one whose number its
    threshold judges and that is furthest from passing (:func:`rank_key`); among full ties the first."""
    return max(findings, key=rank_key) if findings else None


def grouped(findings: list[dict]) -> tuple[list[dict], list[dict]]:
    """(first, rest): the findings that decide the chapter (fail, warn, error; ranked by
    :func:`rank_key`), or the deciding one alone when all pass; the rest in the chapter's order."""
    first = sorted((f for f in findings if VERDICT_RANK[f["verdict"]] >= VERDICT_RANK["warn"]),
                   key=rank_key, reverse=True)
    if not first and findings:
        first = [deciding(findings)]
    return first, [f for f in findings if f not in first]


def top_fixes(findings: list[dict], n: int = 3) -> list[dict]:
    """The ``n`` failing or warning findings whose fixes buy the most (:func:`rank_key`), one per fix
    text (two findings with the same fix are one fix)."""
    seen, out = set(), []
    for f in sorted((f for f in findings if f["verdict"] in ("fail", "warn") and f.get("fix")),
                    key=rank_key, reverse=True):
        if f["fix"] not in seen:
            seen.add(f["fix"])
            out.append(f)
    return out[:n]


def overall(chapter_verdicts: list[str]) -> str:
    """"4 of 5 chapters fail", "No chapter fails; 1 of 5 warns", "All 5 chapters pass", with the chapters
    that could not run named too."""
    n = len(chapter_verdicts)
    count = {v: chapter_verdicts.count(v) for v in VERDICT_RANK}
    parts = []
    if count["error"]:
        parts.append(f"{count['error']} of {n} chapter{'s' * (count['error'] > 1)} could not run")
    if count["fail"]:
        parts.append(f"{count['fail']} of {n} chapter{'s' * (n > 1)} fail" + ("s" if count["fail"] == 1 else ""))
    if count["warn"]:
        parts.append(f"{count['warn']} of {n} warn" + ("s" if count["warn"] == 1 else ""))
    if not parts:
        return f"All {n} chapters pass" if count["pass"] == n else f"No chapter fails or warns ({count['pass']} of {n} pass)"
    return "; ".join(parts)
