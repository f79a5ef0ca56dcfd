"""What every chapter notebook starts with: the profile, the device, the findings sink, and the
rule for getting a measurement (take a recorded one, measure live, or skip in plan-only mode).

Notebooks stay thin::

    ch = start("baseline", profile_path, findings_path, plan_only, results_dir, out_dir)
    res = ch.measurement(bench_baseline.METHOD, lambda: bench_baseline.measure_baseline(ch.torch_device, quick=ch.quick))
"""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from preflight import REPO
from preflight.core.findings import FindingSink
from preflight.core.fsutil import atomic_write_text
from preflight.core.profile import Profile, load_profile
from preflight.core.records import Method, read_records, save_record
from preflight.harness import progress
from preflight.reporting import charts

DEFAULT_PROFILE = REPO / "data" / "profiles" / "example.yaml"


def _where_label(rec: dict) -> str:
    """Where a record's bench ran (``ran_on``: the CPU of a GPU machine for gloo ranks), else its device."""
    dev = rec.get("device") or {}
    return (rec.get("ran_on") or {}).get("label") or dev.get("label") or dev.get("name", "?")


@dataclass
class Measured:
    """A measurement's results and where they come from (for the finding's ``source``)."""
    results: dict
    source: str
    record: dict = field(repr=False, default_factory=dict)
    origin: str = "live"           # "recorded" (from --results) or "live" (measured in this run)


@dataclass
class Chapter:
    name: str
    profile: Profile
    findings: FindingSink
    measure: bool                  # live measurement allowed (not plan-only, profile.measure true)
    quick: bool                    # smallest sizes (tests, smoke runs)
    results_dir: Path | None       # recorded measurements to use instead of measuring
    out_dir: Path | None           # where this run's records go
    _device: object = None
    measurements: list = field(default_factory=list)   # where each measurement came from (``_log``)
    _not_measured_said: list = field(default_factory=list)  # methods whose "not measured" note is shown, in order
    profile_path: Path | None = None   # a workload's file entry is relative to it
    _workload: object = None
    example_traces_shown: bool = False  # the embedded example job's traces were shown (their verdicts are not the plan's)

    @property
    def device(self):
        """DeviceInfo of this machine (torch imported on first use only)."""
        if self._device is None:
            from preflight.core.device import probe

            self._device = probe()
        return self._device

    @property
    def torch_device(self):
        from preflight.core.device import torch_device

        return torch_device(self.device)

    @property
    def gpu_key(self) -> str | None:
        """Hardware-table key of the profile's GPU ('auto' = this machine's)."""
        g = self.profile.cluster.gpu
        return self.device.table_key if g == "auto" else g

    @property
    def workload(self):
        """The profile's own model (``preflight.core.workload.Workload``, built on first use), or None: the
        chapters then measure the reference model. None too when nothing is measured nor recorded
        (plan-only without ``--results``): the workload is then not imported at all."""
        if self._workload is None and self.profile.workload is not None and (self.measure or self.results_dir):
            from preflight.core.workload import load

            self._workload = load(self.profile.workload.entry, self.profile_path.parent if self.profile_path else None)
        return self._workload

    def workload_measurement(self, method: Method, run: Callable[[], dict], name: str | None = None,
                             match: Callable[[dict], bool] | None = None) -> Measured | None:
        """``measurement`` of the workload: its description (entry, class, parameters) goes into the
        record's params, and only a record of that same workload fits (never one of the reference
        model, nor of another workload), and for which ``match(record)`` is true, when given."""
        w = self.workload.describe()
        return self.measurement(method, run, name, params={"workload": w},
                                match=lambda r: (r.get("params") or {}).get("workload") == w and (match is None or match(r)))

    def show(self, name: str, chart) -> None:
        """Display an Altair chart (SVG, offline) and keep it for the report's summary page. In the
        plan-only audit's shell (``preflight.runner.inprocess``) the SVG renders in the chart process and the
        output waits for it until the notebook is written: the chapter's next cells run meanwhile."""
        from IPython.display import display

        shell = sys.modules.get("preflight.runner.inprocess")      # loaded only by the plan-only audit
        path = None
        if self.out_dir:
            (self.out_dir / "charts").mkdir(parents=True, exist_ok=True)
            path = self.out_dir / "charts" / f"{self.name}--{name}.svg"
        if shell is not None and shell.running():
            display({"image/svg+xml": charts.render_later(chart, path),      # the same keys as below
                     "text/plain": f"<chart {name}>"}, raw=True)
        else:
            svg = charts.to_svg(chart)
            if path:
                path.write_text(svg)
            display({"image/svg+xml": svg, "text/plain": f"<chart {name}>"}, raw=True)

    def table(self, df) -> None:
        """Display a DataFrame as a plain HTML table for people (``preflight.reporting.tables.frame_html``: numbers
        by ``preflight.core.numfmt``, readable column names, yes/no, short paths, verdict badges)."""
        from IPython.display import HTML, display

        from preflight.reporting.tables import frame_html

        display(HTML('<div class="pf-table"><style>.pf-table td, .pf-table th { text-align: left !important; }'
                     ".pf-table td.num { text-align: right !important; font-variant-numeric: tabular-nums; }</style>"
                     f"{frame_html(df)}</div>"))

    def note(self, text: str) -> None:
        """A remark in the chapter's prose (Markdown), e.g. what a CPU measurement can and cannot show."""
        from IPython.display import Markdown, display

        display(Markdown(f"> **Note.** {text}"))

    def next_steps(self, n: int = 3) -> None:
        """What to change in the plan, from this chapter's findings (:func:`next_steps_html`): shown by
        each chapter's closing cell, before its "what you learned, next chapter" text."""
        from dataclasses import asdict

        from IPython.display import HTML, display

        display(HTML(next_steps_html([asdict(f) for f in self.findings.findings], n,
                                     example_shown=self.example_traces_shown)))

    def announce(self) -> None:
        """Say where the live measurements run (or that they do not), and warn when the machine is
        already busy: timings taken then measure the other jobs too."""
        from preflight.core.timing import busy_warning

        print("live measurement:", "on " + self.device.label if self.measure else "off (plan-only)")
        if self.measure and (busy := busy_warning()):
            self.note(busy)

    @property
    def expected_device(self) -> dict:
        """The device a record must come from: the profile's GPU (by hardware-table key), or this
        machine when the profile says ``gpu: auto``."""
        g = self.profile.cluster.gpu
        return self.device.as_dict() if g == "auto" else {"kind": None, "table_key": g}

    def measurement(self, method: Method, run: Callable[[], dict], name: str | None = None,
                    match: Callable[[dict], bool] | None = None, params: dict | None = None) -> Measured | None:
        """The measurement of ``method`` for this chapter, from one of three places, in this order:

        1. ``results_dir`` (``--results``): the newest record of that method (for which
           ``match(record)`` is true, when given) that fits: same method version, every field the
           chapter reads, the device the profile describes. A record that does not fit is named, with
           why, in the chapter, and is not used;
        2. a live measurement, ``run()``, when measuring is allowed (recorded under
           ``out_dir/records`` as ``<method>[-name].json``, the same record its command line writes);
        3. None (plan-only, or the method cannot run here): the chapter reports "not measured".

        ``params`` go into a live record's params beside ``quick`` (``workload_measurement`` puts the
        workload there). Every call is logged (``out_dir/measurements/<chapter>.json``: method, where it came from,
        the record's file, what was wrong with the ones refused)."""
        fit, problems = self._recorded(method, match)
        if fit:
            rec = fit[-1]                                                    # the newest that fits
            dev = _where_label(rec)
            m = Measured(rec["results"], f"recorded on {dev} ({Path(rec['_path']).name}, "
                                         f"{str(rec.get('date', '?'))[:10]})", rec, "recorded")
            self._log(method, name, "recorded", m.source, problems, rec["_path"])
            return m
        if not self.measure:
            self._log(method, name, "not measured", "not measured", problems)
            self.not_measured(method)
            return None
        if self.results_dir:
            print(f"{method.name}: measuring live on {self.device.label} instead")
        t0 = progress.started(method.name, self.quick, self.device.is_gpu)     # what, and about how long
        results = run()
        progress.finished(method.name, t0)
        rec = method.record({"quick": self.quick, **(params or {})}, results, self.device.as_dict())
        path = save_record(rec, self.out_dir / "records", name=name) if self.out_dir else None
        m = Measured(results, f"measured on {rec['ran_on']['label']}", rec)
        self._log(method, name, "live", m.source, problems, str(path) if path else None)
        return m

    def recorded(self, method: Method, match: Callable[[dict], bool] | None = None) -> Measured | None:
        """Only a recorded measurement, never a live one: for what this machine cannot measure by
        itself (a sweep across Slurm nodes, a node lost under torchrun). The newest fitting record of
        ``method`` (``match`` as in ``measurement``) in ``results_dir``, else None. Logged when a
        record is used or refused; when ``results_dir`` holds none, nothing is logged (it was not
        asked for)."""
        if not self.results_dir:
            return None
        recs, unreadable = read_records(self.results_dir, method.name)
        if not ([r for r in recs if match is None or match(r)] or unreadable):
            return None
        fit, problems = self._recorded(method, match, (recs, unreadable))
        if not fit:
            self._log(method, None, "not measured", "not measured", problems)
            return None
        rec = fit[-1]
        dev = _where_label(rec)
        m = Measured(rec["results"], f"recorded on {dev} ({Path(rec['_path']).name}, {str(rec.get('date', '?'))[:10]})",
                     rec, "recorded")
        self._log(method, None, "recorded", m.source, problems, rec["_path"])
        return m

    def measurement_set(self, method: Method, run: Callable[[], list[dict]],
                        match: Callable[[dict], bool] | None = None) -> Measured | None:
        """Like ``measurement`` for a method measured as several records (one per scaling stage, one
        per pipeline run): every fitting record of ``method`` in ``results_dir``, else the records
        ``run()`` returns (live), else None. ``results["records"]``: the records, oldest first."""
        fit, problems = self._recorded(method, match)
        if fit:
            names = ", ".join(Path(r["_path"]).name for r in fit)
            m = Measured({"records": fit}, f"recorded ({names})", {}, "recorded")
            self._log(method, None, "recorded", m.source, problems, [r["_path"] for r in fit])
            return m
        if not self.measure:
            self._log(method, None, "not measured", "not measured", problems)
            self.not_measured(method)
            return None
        t0 = progress.started(method.name, self.quick, self.device.is_gpu)
        recs = run()
        progress.finished(method.name, t0)
        if not recs:
            self._log(method, None, "not measured", "not measured", problems)
            return None
        m = Measured({"records": recs}, f"measured on {self.device.label}", {})
        self._log(method, None, "live", m.source, problems, [r.get("_path") for r in recs])
        return m

    def not_measured(self, method: Method, why: str | None = None) -> None:
        """Say, where a section's tables and charts would be, that ``method`` was not measured: in a
        plan-only audit (``why`` None) where the measurement comes from; else ``why``. In full once per
        method and chapter, then as a short back-reference."""
        if method.name in self._not_measured_said:
            if self._not_measured_said[-1] != method.name:        # not twice in a row
                self.note(f"Not measured here either (method `{method.name}`, see above).")
                self._not_measured_said.append(method.name)
            return
        self._not_measured_said.append(method.name)
        if why:
            self.note(f"**Not measured** (method `{method.name}`): {why}")
            return
        self.note(f"**Not measured in this plan-only audit** (method `{method.name}`). The measured part of this "
                  "section comes from a live run (`make report`) or from a record of the README's standalone command "
                  "(`audit --results DIR`); what is shown here is computed from the profile, and the measured "
                  "finding reads \"not measured\".")

    def _recorded(self, method: Method, match: Callable[[dict], bool] | None,
                  found: tuple[list[dict], list[str]] | None = None) -> tuple[list[dict], list[str]]:
        """The records of ``method`` in ``results_dir`` that fit (oldest first), and one line per record
        that does not (printed in the chapter: file, and why), a file named as its record but unreadable
        included. ``found``: what ``records.read_records`` returned, when the caller has read it."""
        if not self.results_dir:
            return [], []
        recs, unreadable = found or read_records(self.results_dir, method.name)
        fit, problems = [], list(unreadable)
        for rec in recs:
            if match is not None and not match(rec):
                continue
            why = method.check(rec, self.expected_device)
            if why:
                problems.append(f"{Path(rec['_path']).name}: " + "; ".join(why))
            else:
                fit.append(rec)
        for p in problems:
            print(f"record not used: {p}")
        if not fit:
            print(f"no usable {method.name} record in {self.results_dir}")
        return fit, problems

    def _log(self, method: Method, name, origin: str, source: str, problems: list[str], path=None) -> None:
        self.measurements.append({"method": method.name, "method_version": method.version, "name": name,
                                  "origin": origin, "source": source, "record": path, "refused": problems})
        if self.out_dir:
            atomic_write_text(self.out_dir / "measurements" / f"{self.name}.json",
                              json.dumps(self.measurements, indent=1), fsync=False)


def next_steps_html(findings: list[dict], n: int = 3, example_shown: bool = False) -> str:
    """The ``n`` fixes that buy the most among ``findings`` (``preflight.reporting.guidance.top_fixes``: failures
    first, then by how far the deciding number misses its pass bound), as a short numbered list with
    verdict badges; or one line saying that nothing fails or warns. ``example_shown``: the chapter showed the
    embedded example job's traces (whose verdicts are the example's, not the plan's): said, so the summary
    agrees with the badges above it."""
    from html import escape

    from preflight.reporting.guidance import top_fixes
    from preflight.reporting.tables import badge, prose

    fixes = top_fixes(findings, n)
    head = "<p><b>What to change in your plan</b> (this chapter's findings on your profile"
    example = (" The trace verdicts above are the embedded example job's, shown to teach the reading: they are not "
               "your plan's (audit --traces DIR puts your job's here)." if example_shown else "")
    if not fixes:
        return (head + "): nothing in your plan fails or warns. Keep the plan; re-run this chapter when it changes."
                + example + "</p>")
    items = "".join(f"<li>{badge(f['verdict'])} <code>{escape(f['id'])}</code>: {prose(f['fix'])}</li>" for f in fixes)
    return head + ", the fix that buys the most first):" + example + "</p><ol>" + items + "</ol>"


def start(name: str, profile_path: str | os.PathLike | None = None, findings_path: str | None = None,
          plan_only: bool = False, results_dir: str | None = None, out_dir: str | None = None,
          quick: bool | None = None) -> Chapter:
    """Load and validate the profile, switch charts to the offline renderer, open the sink.

    ``quick`` (smallest measurement sizes) is on when asked for, or whenever the environment sets
    ``PREFLIGHT_QUICK=1``: that turns it on even where a notebook passes ``quick=False``, so a smoke
    test (e.g. JupyterLab in tests/test_browser.py) can run the real notebooks quickly. The environment
    cannot turn quick off."""
    charts.use_offline_renderer()
    profile = load_profile(profile_path or DEFAULT_PROFILE)
    quick = bool(quick) or os.environ.get("PREFLIGHT_QUICK", "") == "1"
    return Chapter(
        name=name, profile=profile,
        findings=FindingSink(findings_path, name, plan_gpu=None if profile.cluster.gpu == "auto" else profile.cluster.gpu),
        measure=not plan_only and profile.measure, quick=quick,
        results_dir=Path(results_dir) if results_dir else None,
        out_dir=Path(out_dir) if out_dir else None,
        profile_path=Path(profile_path or DEFAULT_PROFILE).resolve(),
    )
