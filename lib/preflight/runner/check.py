"""The plan-only audit in the terminal: ``python -m preflight check PROFILE`` (a pre-commit / CI gate).

The chapters' plan findings are pure formulas on the profile (``preflight.models``); the notebooks
call the same ``add_plan_findings`` functions, in the same order, so ``check`` prints exactly the
plan findings (ids, values, verdicts) that a ``--plan-only`` audit writes, without a kernel, a
notebook or HTML. What it leaves out are the measured findings, which a plan-only audit reports as
"not measured" (verdict info) and which can therefore never trip a gate.

No torch import, except for ``cluster.gpu: auto``: then the GPU is this machine's, and its memory
and peak come from probing it (``preflight.core.device.probe``, which imports torch unless torch is a CPU
build).

Cost on a 2-core machine with a warm file cache: about 0.8 s of imports (pandas and numpy, used by
the chapters' tables, dominate; pydantic for the profile), then tens of milliseconds of formulas
(``tests/test_check.py`` bounds the whole command at 2 s).
"""
from __future__ import annotations

from pathlib import Path

from preflight.chapters.registry import CHAPTERS
from preflight.core.findings import VERDICT_RANK, FindingSink, worst
from preflight.core.profile import Profile


def plan_findings(profile: Profile, profile_path: str | Path | None = None, device=None) -> dict[int, list[dict]]:
    """Chapter number -> its plan findings (dicts of the findings contract), as the notebooks emit them.

    ``device``: a ``preflight.core.device.DeviceInfo`` for ``cluster.gpu: auto`` (probed when None and needed).
    """
    from dataclasses import asdict

    from preflight.chapters import baseline as B
    from preflight.chapters import communication as C3
    from preflight.chapters import data_pipeline as C2
    from preflight.chapters import fault_tolerance as C5
    from preflight.chapters import load_balance as C4
    from preflight.chapters import memory_plan as MP

    gpu_key = profile.cluster.gpu
    if gpu_key == "auto":
        if device is None:
            from preflight.core.device import probe

            device = probe()
        gpu_key = device.table_key
    else:
        device = None

    sinks = {c.number: FindingSink(chapter=c.name) for c in CHAPTERS}
    B.add_plan_findings(sinks[1], profile, B.plan_curve(profile, None, gpu_key), gpu_key)      # 01_baseline's order
    MP.add_plan_findings(sinks[1], profile, device)
    C2.add_listing_finding(sinks[2], profile)
    C3.add_plan_findings(sinks[3], profile, gpu_key)
    C3.add_topology_finding(sinks[3], profile)
    C4.add_plan_findings(sinks[4], profile, profile_path, gpu_key)
    C5.add_plan_findings(sinks[5], profile, gpu_key)
    return {n: [asdict(f) for f in s.findings] for n, s in sinks.items()}


def gate(findings: dict[int, list[dict]], fail_on: str | None) -> int:
    """Exit code of the gate: 1 if any verdict reaches ``fail_on`` ("warn" or "fail"), else 0."""
    if fail_on is None:
        return 0
    return int(any(VERDICT_RANK[f["verdict"]] >= VERDICT_RANK[fail_on] for fs in findings.values() for f in fs))


def text_report(profile: Profile, findings: dict[int, list[dict]], show_info: bool = False) -> str:
    """Per chapter its worst verdict, then each judged finding: verdict, id, value, message, threshold, fix.
    Findings recorded for reference (verdict info) are counted, and listed with ``show_info``."""
    names = {c.number: c for c in CHAPTERS}
    lines = [f"{profile.project}: plan-only check, {profile.gpus} GPUs (tp={profile.training.tp}, "
             f"pp={profile.training.pp}, dp={profile.dp}"
             + (f", cp={profile.training.cp}" if profile.training.cp > 1 else "") + ")"]
    for n, fs in findings.items():
        c = names[n]
        judged = [f for f in fs if f["verdict"] != "info"]
        lines.append(f"chapter {n} {c.name:<16} {worst(f['verdict'] for f in fs):<5} "
                     f"({len(judged)} judged, {len(fs) - len(judged)} for reference)")
        for f in sorted(fs, key=lambda f: -VERDICT_RANK[f["verdict"]]):
            if f["verdict"] != "info" or show_info:
                lines += finding_lines(f)
    lines.append(overall_line(findings))
    return "\n".join(lines) + "\n"


def finding_lines(f: dict) -> list[str]:
    """One finding in the terminal: verdict, id, value, message; threshold and fix where it warns or fails."""
    from preflight.core.numfmt import fmt_finding

    out = [f"  {f['verdict'].upper():<5} {f['id']} = {fmt_finding(f)}", f"        {f['message']}"]
    if f["verdict"] in ("warn", "fail"):
        out += [f"        threshold: {f['threshold']}", f"        fix: {f['fix']}"]
    return out


def overall_line(findings: dict[int, list[dict]]) -> str:
    every = [f["verdict"] for fs in findings.values() for f in fs]
    return (f"overall: {worst(every)} ({sum(v == 'fail' for v in every)} fail, "
            f"{sum(v == 'warn' for v in every)} warn, {sum(v == 'pass' for v in every)} pass)")
