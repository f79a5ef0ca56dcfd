"""``python -m preflight traces DIR`` on a per-op straggler trace (a ``*.parquet`` and its ``meta*.yaml``).

The trace folder of the what-if analysis (:mod:`preflight.diagnose.stragglers_whatif`) is told apart from
a folder of ``torch.profiler`` traces by its Parquet file; it prints the finding
``load_balance/straggler_cost`` with the attribution (text, or ``--json``), and gates like every
``traces`` run: exit 1 when ``--fail-on`` is reached, 2 on bad input (the file and field named).
"""
from __future__ import annotations

import json
from pathlib import Path

CHAPTER = 4      # load_balance


def is_per_op_folder(folder: str | Path | None) -> bool:
    """A folder holding a Parquet file: the per-op trace format, not Kineto JSON."""
    return folder is not None and Path(folder).is_dir() and any(Path(folder).glob("*.parquet"))


def run(folder: str | Path, as_json: bool, fail_on: str | None) -> int:
    """Print the what-if of ``folder`` and return the exit code; bad input raises StragglerTraceError."""
    from preflight.core.findings import VERDICT_RANK
    from preflight.diagnose.stragglers_whatif import analyze, text_report

    res = analyze(folder)
    f = res["finding"]
    code = int(fail_on is not None and VERDICT_RANK[f["verdict"]] >= VERDICT_RANK[fail_on])
    if as_json:
        print(json.dumps({**res, "fail_on": fail_on, "exit_code": code, "findings": [f | {"chapter": CHAPTER}]},
                         indent=1, default=float))
    else:
        print(text_report(res), end="")
    return code
