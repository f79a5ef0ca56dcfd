"""What every chapter notebook starts with: the profile, the device, the findings sink, and the
rule for getting a measurement (take a recorded one, measure live, or skip in plan-only mode).

Notebooks stay thin::

    ch = start("baseline", profile_path, findings_path, plan_only, results_dir, out_dir)
    res = ch.measurement("baseline", lambda: measure_baseline(ch.torch_device, quick=ch.quick))
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from preflight import REPO, charts
from preflight.findings import FindingSink
from preflight.profile import Profile, load_profile
from preflight.records import load_records, make_record, save_record

DEFAULT_PROFILE = REPO / "data" / "profiles" / "example.yaml"


@dataclass
class Measured:
    """A measurement's results and where they come from (for the finding's ``source``)."""
    results: dict
    source: str
    record: dict = field(repr=False, default_factory=dict)


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

    @property
    def device(self):
        """DeviceInfo of this machine (torch imported on first use only)."""
        if self._device is None:
            from preflight.device import probe

            self._device = probe()
        return self._device

    @property
    def torch_device(self):
        from preflight.device import torch_device

        return torch_device(self.device)

    @property
    def gpu_key(self) -> str | None:
        """Hardware-table key of the profile's GPU ('auto' = this machine's)."""
        g = self.profile.cluster.gpu
        return self.device.table_key if g == "auto" else g

    def show(self, name: str, chart) -> None:
        """Display an Altair chart (SVG, offline) and keep it for the report's summary page."""
        from IPython.display import SVG, display

        svg = charts.to_svg(chart)
        if self.out_dir:
            (self.out_dir / "charts").mkdir(parents=True, exist_ok=True)
            (self.out_dir / "charts" / f"{self.name}--{name}.svg").write_text(svg)
        display(SVG(svg))

    def table(self, df, **fmt) -> None:
        """Display a DataFrame (plain HTML table, no styling scripts)."""
        from IPython.display import HTML, display

        table = df.to_html(index=False, float_format=lambda x: f"{x:.4g}", na_rep="", **fmt)
        display(HTML('<div class="pf-table"><style>.pf-table td, .pf-table th { text-align: left !important; }</style>'
                     f"{table}</div>"))

    def note(self, text: str) -> None:
        """A remark in the chapter's prose (Markdown), e.g. what a CPU measurement can and cannot show."""
        from IPython.display import Markdown, display

        display(Markdown(f"> **Note.** {text}"))

    def announce(self) -> None:
        """Say where the live measurements run (or that they do not), and warn when the machine is
        already busy: timings taken then measure the other jobs too."""
        from preflight.timing import busy_warning

        print("live measurement:", "on " + self.device.label if self.measure else "off (plan-only)")
        if self.measure and (busy := busy_warning()):
            self.note(busy)

    def measurement(self, method: str, run: Callable[[], dict], version: int = 1, name: str | None = None,
                    match: Callable[[dict], bool] | None = None) -> Measured | None:
        """A recorded result of ``method`` from ``results_dir`` if there is one (the newest for which
        ``match(record)`` is true, when given), else a live measurement (recorded under
        ``out_dir/records`` as ``<method>[-name].json``) when measuring is allowed, else None."""
        if self.results_dir:
            recs = [r for r in load_records(self.results_dir, method) if match is None or match(r)]
            if recs:
                rec = recs[-1]
                dev = rec.get("device", {}).get("label") or rec.get("device", {}).get("name", "?")
                return Measured(rec["results"], f"recorded on {dev} ({Path(rec['_path']).name}, "
                                                f"{rec['date'][:10]})", rec)
        if not self.measure:
            return None
        results = run()
        rec = make_record(method, version, {"quick": self.quick}, results,
                          self.device.as_dict())
        if self.out_dir:
            save_record(rec, self.out_dir / "records", name=name)
        return Measured(results, f"measured on {self.device.label}", rec)


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
        name=name, profile=profile, findings=FindingSink(findings_path, name),
        measure=not plan_only and profile.measure, quick=quick,
        results_dir=Path(results_dir) if results_dir else None,
        out_dir=Path(out_dir) if out_dir else None,
    )
