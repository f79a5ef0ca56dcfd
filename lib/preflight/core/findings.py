"""The finding: the audit's unit of output, with a fixed contract.

Each chapter notebook emits findings; the audit merges them into findings.json and the report reads
only that. Fields:

- ``id``        namespaced, ``chapter/metric`` (e.g. ``baseline/mfu``): the chapter's prefix is its name
                (``preflight.chapters.registry``, which also maps the prefixes of older files);
- ``value``     a number (or None when it could not be obtained), in ``unit``;
- ``verdict``   pass | warn | fail | info (``error`` is set by the audit for a chapter that raised);
- ``threshold`` what the value was judged against, in words (e.g. ">= 0.40 pass, < 0.25 fail");
- ``message``   what it means, one sentence; ``fix`` what to do, one sentence;
- ``source``    where the number comes from: ``measured on <device>`` or ``computed from profile``;
- ``noise``     optional, measured values only: the relative spread of the repeats the value was taken
                from, ``(p90 - p10) / median`` (``preflight compare --fail-on-regression`` ignores a move
                smaller than it);
- ``per_rank``  optional, a finding computed on each rank of a job (its traces): every rank's value,
                ``{"0": 0.12, "1": 0.31, ...}``; ``value`` is then the worst rank's;
- ``terms``     optional, the named parts of a value (the step model's terms in seconds), for a reader
                that sets them beside another source's (the plan-vs-trace table).
"""
from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from preflight.core.fsutil import atomic_write_text

SCHEMA_PATH = Path(__file__).parents[1] / "schema" / "findings.schema.json"
# a finding id's pattern has one home: the published schema
_ID = re.compile(json.loads(SCHEMA_PATH.read_text())["$defs"]["finding"]["properties"]["id"]["pattern"])
Verdict = Literal["pass", "warn", "fail", "info", "error"]
VERDICT_RANK = {"info": 0, "pass": 1, "warn": 2, "fail": 3, "error": 4}


@dataclass
class Finding:
    id: str
    value: float | None
    unit: str
    verdict: Verdict
    threshold: str
    message: str
    fix: str
    source: str
    noise: float | None = None
    per_rank: dict[str, float | None] | None = None
    terms: dict[str, float | None] | None = None

    def __post_init__(self) -> None:
        if not _ID.match(self.id):
            raise ValueError(f"finding id must be namespaced 'chapter/metric' in lower case (letters, digits, _), "
                             f"got {self.id!r}")
        if self.verdict not in VERDICT_RANK:
            raise ValueError(f"verdict must be one of {list(VERDICT_RANK)}, got {self.verdict!r}")
        if self.value is not None:
            self.value = float(self.value)
            if not math.isfinite(self.value):    # JSON has no inf/nan: the message says "unbounded"
                self.value = None
        if self.terms is not None:
            self.terms = _finite_map(self.terms)
        if self.per_rank is not None:
            self.per_rank = _finite_map(self.per_rank)


def _finite_map(values: dict) -> dict[str, float | None]:
    """``{str key: float}``, a non-finite number as None (JSON has no inf or nan)."""
    return {str(k): (None if v is None or not math.isfinite(float(v)) else float(v)) for k, v in values.items()}


def judge(value: float | None, *, warn: float, fail: float, higher_is_better: bool = True,
          fmt: str = "{:g}") -> tuple[Verdict, str]:
    """Verdict for ``value`` against two thresholds, and the threshold in words.

    ``higher_is_better``: pass at >= warn, warn between, fail below ``fail``; otherwise mirrored.
    None (not measured) gives ``info``.
    """
    if higher_is_better:
        words = f"pass >= {fmt.format(warn)}, fail < {fmt.format(fail)}"
        if value is None:
            return "info", words
        return ("pass" if value >= warn else "warn" if value >= fail else "fail"), words
    words = f"pass <= {fmt.format(warn)}, fail > {fmt.format(fail)}"
    if value is None:
        return "info", words
    return ("pass" if value <= warn else "warn" if value <= fail else "fail"), words


def worst(verdicts) -> Verdict:
    vs = list(verdicts)
    return max(vs, key=VERDICT_RANK.__getitem__) if vs else "info"


class FindingSink:
    """Collects a chapter's findings and rewrites its JSON file after each one.

    Writing as we go means a chapter that raises half-way still leaves the findings it made.
    ``path=None`` (interactive use) keeps them in memory only.
    """

    def __init__(self, path: str | os.PathLike | None = None, chapter: str = "", plan_gpu: str | None = None):
        self.path = Path(path) if path else None
        self.chapter = chapter
        # The GPU the plan names (None: ``gpu: auto``, the plan is this machine). A measurement whose record
        # ran on a CPU is then shown, labelled, but does not decide the plan's verdict (:meth:`measured`).
        self.plan_gpu = plan_gpu
        self.findings: list[Finding] = []

    def add(self, **kw) -> Finding:
        f = Finding(**kw)
        self.findings = [x for x in self.findings if x.id != f.id] + [f]
        if self.path:      # rewritten after every finding: atomic (a kill leaves the last whole file)
            atomic_write_text(self.path, json.dumps({"chapter": self.chapter,
                                                     "findings": [asdict(x) for x in self.findings]}, indent=1),
                              fsync=False)
        return f

    def not_measured(self, fid: str, unit: str, threshold: str, fix: str, why: str) -> Finding:
        """A finding that could not be measured here (plan-only, no GPU...): value None, verdict info."""
        return self.add(id=fid, value=None, unit=unit, verdict="info", threshold=threshold,
                        message=f"not measured: {why}", fix=fix, source="not measured")

    def measured(self, fid: str, measured, unit: str, build: Callable[[dict], dict], *, why_missing: str,
                 missing_fix: str, missing_threshold: str = "recorded for reference") -> Finding:
        """The finding ``fid`` of a measurement that may be missing: one call for both cases.

        ``measured`` is a ``preflight.runner.chapter.Measured`` (``.results``, ``.source``) or None. None
        (plan-only mode, no GPU, no record) gives :meth:`not_measured` with ``missing_threshold``,
        ``missing_fix`` and ``why_missing``. Otherwise ``build(measured.results)`` returns the measured
        finding's ``value``, ``verdict``, ``threshold``, ``message`` and ``fix`` (and ``source`` where
        it is more than ``measured.source``); id and unit are the same in both cases, so a report
        always has the row, measured or not::

            sink.measured("load_balance/partition_gain", partition, "x", lambda r: dict(
                value=r["measured_gain"], verdict="info", threshold="recorded for reference", ...),
                why_missing=why_missing, missing_fix="Partition stages by profiled layer time.")
        """
        if measured is None:
            return self.not_measured(fid, unit, missing_threshold, missing_fix, why_missing)
        kw = {"id": fid, "unit": unit, "source": measured.source, **build(measured.results)}
        rec = getattr(measured, "record", None) or {}
        kind = (rec.get("ran_on") or {}).get("kind") or (rec.get("device") or {}).get("kind")
        # a correctness check (unit "bool": a resume bit for bit) holds on any device; a rate or a time does not
        if self.plan_gpu and kind == "cpu" and kw["verdict"] in ("pass", "warn", "fail") and unit != "bool":
            kw["threshold"] = (f"measured on a CPU, unlike the plan's {self.plan_gpu}: shown to teach, not judged "
                               f"(it would read {kw['verdict']} against: {kw['threshold']})")
            kw["verdict"] = "info"
        return self.add(**kw)

    def frame(self):
        import pandas as pd

        return pd.DataFrame([asdict(f) for f in self.findings])


def read_findings(path: str | os.PathLike) -> list[Finding]:
    data = json.loads(Path(path).read_text())
    return [Finding(**f) for f in data["findings"]]
