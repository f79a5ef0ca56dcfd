"""The audit: run the chapter notebooks headlessly on a profile and collect their findings.

The chapters (number, name, title) are those of ``preflight.chapters.registry``, one notebook
``playbook/NN_<name>.ipynb`` each, run with the profile injected after its ``parameters`` cell. A
measure-mode audit executes each chapter with papermill in a kernel of its own, always with an execution
timeout (a large widget output can hang nbclient). A plan-only audit (no live measurement) runs the same
cells in this process instead (``preflight.runner.inprocess``: one shell, libraries loaded once), which takes
seconds, not the ~25 s of five kernel start-ups. A chapter that raises is marked ``error`` and the
others still run. Outputs, in ``out_dir``
(default ``reports/<project>/``)::

    index.html            the audit summary (preflight.reporting.report)
    <chapter>.html        one page per executed chapter
    findings.json         every finding + machine + versions + timings
    notebooks/*.ipynb     the executed notebooks
    records/*.json        the measurements taken during this run
    chapters/*.json       each chapter's raw findings
    measurements/*.json   per chapter, where each measurement came from (recorded, live, not measured)

A run first replaces ``index.html`` by a page marked INCOMPLETE and removes what an earlier run left
(pages, findings, notebooks, charts; measurement records are kept); ``findings.json`` (atomically:
temporary file + rename) and the report pages, ``index.html`` last, are written only at the end. So a
folder never presents an unfinished run as a report. Ctrl-C (SIGINT) stops the running kernel, marks
the page "interrupted", removes findings.json and exits with code 130 and one line on stderr; two
audits into different folders share nothing (own kernel sockets, own files).
"""
from __future__ import annotations

import datetime as _dt
import json
import logging
import re
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from preflight import REPO
from preflight.chapters.registry import BY_NAME, CHAPTERS
from preflight.core.findings import VERDICT_RANK, Finding, read_findings, worst
from preflight.core.fsutil import atomic_write_text
from preflight.core.numfmt import duration
from preflight.core.profile import Profile
from preflight.runner import kernels

PLAYBOOK = REPO / "playbook"
DEFAULT_TIMEOUT_S = 600       # per cell
INTERRUPTED_EXIT = 130        # 128 + SIGINT, as a shell reports Ctrl-C
# A measuring audit's chapter times on the reference 2-core CPU (docs/timings.md): the progress line's
# estimate of the time left scales them by how fast this run has gone so far.
TYPICAL_CHAPTER_S = {1: 45.0, 2: 45.0, 3: 40.0, 4: 45.0, 5: 58.0}
_NB = re.compile(r"^(\d\d)_([a-z0-9_]+)\.ipynb$")
_PAGE = re.compile(r"^\d\d_[a-z0-9_]+\.html$")


class AuditInputError(ValueError):
    """Bad audit arguments (the CLI exits 2 and writes nothing)."""


@dataclass
class ChapterRun:
    number: int
    name: str
    title: str
    notebook: str
    status: str = "pending"        # ok | error
    elapsed_s: float = 0.0
    error: str | None = None
    findings: list[dict] = field(default_factory=list)


def time_left(done: list[int], todo: list[int], elapsed_s: float) -> float | None:
    """Seconds a measuring audit still needs for the chapters ``todo``: their typical times
    (:data:`TYPICAL_CHAPTER_S`) scaled by this run's pace on the chapters ``done`` (1 before any);
    None for a chapter without a typical time."""
    if any(n not in TYPICAL_CHAPTER_S for n in [*done, *todo]):
        return None
    typical = sum(TYPICAL_CHAPTER_S[n] for n in done)
    pace = elapsed_s / typical if typical > 0 and elapsed_s > 0 else 1.0
    return pace * sum(TYPICAL_CHAPTER_S[n] for n in todo)


def discover(playbook: Path = PLAYBOOK) -> dict[int, tuple[str, Path]]:
    """Chapter number -> (name, notebook path): the chapters of the registry
    (``preflight.chapters.registry``) in the playbook; in another folder (tests' ``--playbook``)
    every ``NN_name.ipynb`` there."""
    if Path(playbook).resolve() == PLAYBOOK.resolve():
        missing = [c.notebook for c in CHAPTERS if not (playbook / Path(c.notebook).name).is_file()]
        if missing:
            raise AuditInputError(f"{', '.join(missing)} missing: python tools/nbgen.py writes the playbook "
                                  "from tools/notebooks/")
        return {c.number: (c.name, playbook / Path(c.notebook).name) for c in CHAPTERS}
    out = {}
    for p in sorted(playbook.glob("*.ipynb")):
        m = _NB.match(p.name)
        if m:
            out[int(m.group(1))] = (m.group(2), p)
    return out


def notebook_title(path: Path) -> str:
    """The notebook's first heading (tests/test_registry.py: the registry's heading, for a chapter)."""
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            for line in "".join(cell["source"]).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return path.stem


def select_chapters(spec: str | None, available: dict[int, tuple[str, Path]]) -> list[int]:
    if not available:
        raise AuditInputError("no chapter notebooks found in the playbook folder")
    if not spec:
        return sorted(available)
    try:
        wanted = sorted({int(x) for x in spec.split(",") if x.strip()})
    except ValueError:
        raise AuditInputError(f"--chapters = {spec!r}: expected comma-separated chapter numbers, "
                              f"e.g. 1,3 (available: {','.join(map(str, available))})") from None
    missing = [n for n in wanted if n not in available]
    if missing or not wanted:
        raise AuditInputError(f"--chapters = {spec!r}: chapter(s) {missing or spec} not available; "
                              f"available: {','.join(map(str, sorted(available)))}")
    return wanted


def check_workload(profile: Profile, profile_path: Path, *, plan_only: bool = False,
                   results_dir: Path | None = None) -> dict | None:
    """The profile's workload, checked before any chapter runs: import, ``build()``, the contract's
    types, one forward/backward and optimizer step on one batch, in a subprocess with a timeout
    (``preflight.core.workload.preflight_check``), so a broken or hanging workload costs seconds, not a
    chapter. Returns what the check saw (entry, class, parameters...), None without a workload or
    when nothing is measured nor recorded (plan-only: the workload is not imported at all). A bad
    workload raises ``AuditInputError`` naming it and what is wrong (exit 2, nothing written)."""
    w = profile.workload
    if w is None or ((plan_only or not profile.measure) and results_dir is None):
        return None
    from preflight.core.workload import WorkloadError
    from preflight.runner.workload_check import preflight_check

    try:
        return preflight_check(w.entry, Path(profile_path).parent)
    except WorkloadError as err:
        raise AuditInputError(f"{err} (profile {profile_path}, field workload.entry)") from None


def _traces_summary(traces_dir: Path, profile: Profile) -> dict:
    """The report's trace-quality table and the job's facts (the traces are cached: read once by the CLI)."""
    from preflight.chapters.traces import audit_traces

    a = audit_traces(traces_dir, None if profile.cluster.gpu == "auto" else profile.cluster.gpu)
    return {"folder": a["folder"], "world_size": a["world_size"], "ranks": sorted(a["ranks"]),
            "missing": a["missing"], "unreadable": a["unreadable"], "notes": a["notes"], "quality": a["quality"]}


def _evidence_summary(flight_recorder_dir: Path | None, stragglers_dir: Path | None) -> list[dict]:
    """The report's quality rows for the Flight Recorder dumps and the per-op trace (read once: cached)."""
    from preflight.runner import evidence

    return ([evidence.flight_recorder_row(evidence.hang(flight_recorder_dir))] if flight_recorder_dir else []) + \
        ([evidence.stragglers_row(evidence.stragglers(stragglers_dir))] if stragglers_dir else [])


def run_audit(profile: Profile, profile_path: Path, out_dir: Path, *, chapters: list[int],
              playbook: Path = PLAYBOOK, plan_only: bool = False, results_dir: Path | None = None,
              timeout_s: int = DEFAULT_TIMEOUT_S, quick: bool = False, log=print,
              workload: dict | None = None, executor: str = "auto", traces_dir: Path | None = None,
              flight_recorder_dir: Path | None = None, stragglers_dir: Path | None = None) -> dict:
    """Execute the chosen chapters, write findings.json and the HTML report; return the summary.
    Paths must be absolute: the notebooks run with the playbook folder as working directory.
    ``workload``: what ``check_workload`` saw (the report's header names it). ``executor``: ``auto``
    (in this process when nothing is measured live, else a kernel per chapter), ``kernel`` or
    ``inprocess`` (plan-only audits only, refused otherwise). ``traces_dir``: the job's profiler traces,
    whose findings each chapter adds (its "your job's traces" section) and whose quality table the
    report shows. ``flight_recorder_dir`` (chapter 5's parameter) and ``stragglers_dir`` (chapter 4's): the
    job's Flight Recorder dumps and per-op trace (``preflight.runner.evidence``), each a finding in its
    chapter and a row of that table."""
    from preflight.core.device import BackgroundProbe, probe, versions
    from preflight.runner import inprocess

    if executor not in ("auto", "kernel", "inprocess"):
        raise AuditInputError(f"executor = {executor!r}: accepted: auto, kernel, inprocess")
    measuring = not plan_only and profile.measure
    if executor == "inprocess" and measuring:
        raise AuditInputError("executor = 'inprocess' runs plan-only audits only: a measuring audit runs each chapter "
                              "in a kernel of its own (one chapter's threads, device memory and compiled code must "
                              "not reach the next); accepted here: auto, kernel")
    if executor == "inprocess" and not inprocess.available():
        raise AuditInputError("executor = 'inprocess' cannot run inside an IPython session (this notebook's shell "
                              "is not the audit's); accepted here: auto, kernel")
    in_process = executor == "inprocess" or (executor == "auto" and not measuring and inprocess.available())

    available = discover(playbook)
    out_dir.mkdir(parents=True, exist_ok=True)
    started_at = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    atomic_write_text(out_dir / "index.html", _incomplete_page(
        profile.project, f"Audit in progress since {started_at} (chapters {', '.join(map(str, chapters))}). If no "
        "audit is running, it was stopped before the end (killed, machine down): run it again."), fsync=False)
    _clear_previous(out_dir)
    (out_dir / "notebooks").mkdir(exist_ok=True)
    params = {"profile_path": str(profile_path), "plan_only": plan_only,
              "results_dir": str(results_dir) if results_dir else "", "out_dir": str(out_dir),
              "quick": quick, "interactive": False} | ({"traces_dir": str(traces_dir)} if traces_dir else {})
    only = {"fault_tolerance": {"flight_recorder_dir": str(flight_recorder_dir)} if flight_recorder_dir else {},
            "load_balance": {"stragglers_dir": str(stragglers_dir)} if stragglers_dir else {}}   # one chapter's parameter
    started = time.perf_counter()
    runs: list[ChapterRun] = []
    started_kernels: list = []   # managers of the kernels started (kernels.stop ends them)
    published = interrupted = False
    background = rendering = None
    logging_off = logging.root.manager.disable     # kernels.trap_sigint's Ctrl-C changes it; restored below
    previous_handler = kernels.trap_sigint(started_kernels)
    try:
        # in this process nothing imports torch; the machine is probed in a child meanwhile, unless torch
        # is a CPU build (device.BackgroundProbe)
        background = BackgroundProbe() if in_process and not measuring else None
        if in_process:              # the chart process starts on the other core meanwhile (charts.warm_up)
            from preflight.reporting import charts as rendering

            rendering.warm_up()
        with tempfile.TemporaryDirectory(prefix="preflight-kernels-") as sockets:
            km_class = None if in_process else kernels.manager_class(sockets, started_kernels)    # jupyter_client: 0.3 s
            try:
                for i, num in enumerate(chapters, 1):
                    name, nb_path = available[num]
                    elapsed = time.perf_counter() - started
                    left = time_left(chapters[:i - 1], chapters[i - 1:], elapsed) if measuring else None
                    log(f"[{i}/{len(chapters)}] chapter {num} {name}: running (elapsed {elapsed:.0f} s"
                        + (f", about {duration(left)} left)" if left is not None else ")"), flush=True)
                    run = _run_chapter(num, name, nb_path, out_dir, params | only.get(name, {}), playbook, timeout_s,
                                       km_class)
                    log(f"[{i}/{len(chapters)}] chapter {num} {name}: {run.status} in {run.elapsed_s:.1f} s, "
                        f"{len(run.findings)} findings, worst: {worst(f['verdict'] for f in run.findings)}",
                        flush=True)
                    runs.append(run)
            except BaseException:       # Ctrl-C mid-chapter: no kernel left, no task pending
                kernels.stop(started_kernels)
                kernels.settle_event_loop()
                raise

        machine, library_versions = background.result() if background else (probe().as_dict(), versions())
        summary = {
            "schema": "preflight-findings/1",
            "project": profile.project,
            "notes": profile.notes,
            "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "mode": "plan-only" if plan_only or not profile.measure else "measure",
            "profile": profile.model_dump(),
            "profile_path": str(profile_path),
            "workload": workload,
            "results_dir": str(results_dir) if results_dir else None,
            "machine": machine,
            "versions": library_versions,
            "elapsed_s": round(time.perf_counter() - started, 1),
            "chapters": [{k: v for k, v in asdict(r).items() if k != "findings"} | {
                "verdict": worst(f["verdict"] for f in r.findings)} for r in runs],
            "findings": [f | {"chapter": r.number} for r in runs for f in r.findings],
            "traces": _traces_summary(traces_dir, profile) if traces_dir else None,
            "evidence": _evidence_summary(flight_recorder_dir, stragglers_dir),
        }
        _publish(summary, out_dir)
        published = True
    except KeyboardInterrupt:
        interrupted = True
        kernels.ignore_sigint()
        if not published:
            for cut in [out_dir / "findings.json", *(h for h in out_dir.glob("*.html") if _PAGE.match(h.name))]:
                cut.unlink(missing_ok=True)     # written by a publish step the interrupt cut short
            atomic_write_text(out_dir / "index.html", _incomplete_page(
                profile.project, f"Audit interrupted (Ctrl-C) after {len(runs)} of {len(chapters)} chapters "
                f"(started {started_at}). Run it again for a report.", runs), fsync=False)
        print(f"error: audit interrupted (Ctrl-C) after {len(runs)} of {len(chapters)} chapters; "
              + ("the report was already complete" if published else
                 f"{out_dir / 'index.html'} is marked INCOMPLETE and findings.json was not written"),
              file=sys.stderr, flush=True)
        raise SystemExit(INTERRUPTED_EXIT) from None
    except Exception as err:
        atomic_write_text(out_dir / "index.html", _incomplete_page(
            profile.project, f"Audit stopped by an error after {len(runs)} of {len(chapters)} chapters: "
            f"{_short_error(err)}", runs), fsync=False)
        raise
    finally:
        logging.disable(logging_off)        # off since Ctrl-C for nbclient's cleanup (kernels.trap_sigint): over now
        if background:
            background.stop()
        if rendering:
            rendering.stop_rendering()
        if previous_handler is not None and not interrupted:
            signal.signal(signal.SIGINT, previous_handler)
    return summary


def _clear_previous(out_dir: Path) -> None:
    """Remove what an earlier audit wrote in ``out_dir`` (index.html excepted: already replaced), so
    that nothing of it passes for this run's. Measurement records stay: --results may point at them."""
    stale = [out_dir / "findings.json", *(p for p in out_dir.glob("*.html") if _PAGE.match(p.name)),
             *(p for p in (out_dir / "notebooks").glob("*.ipynb") if _NB.match(p.name)),
             *(out_dir / "chapters").glob("*.json"), *(out_dir / "chapters").glob("*.tmp"),
             *(out_dir / "charts").glob("*--*.svg"), *(out_dir / "measurements").glob("*.json"),
             *out_dir.glob(".*.tmp")]
    for p in stale:
        p.unlink(missing_ok=True)


def _incomplete_page(project: str, state: str, runs: list[ChapterRun] = ()) -> str:
    from preflight.reporting.html import esc, page

    done = "".join(f"<li>{esc(r.title)}: {esc(r.status)} ({len(r.findings)} findings)</li>" for r in runs)
    return page(f"INCOMPLETE - Preflight audit: {project}", (
        f"<h1>Preflight audit: {esc(project)} <span class='v v-error'>INCOMPLETE</span></h1>"
        f"<p><b>This is not an audit report.</b> {esc(state)}</p>"
        + (f"<p>Chapters that ran before the stop (their notebooks are in notebooks/):</p><ul>{done}</ul>" if done else "")
        + "<p class='meta'>findings.json and the report are written only when every chapter has run.</p>"))


def _publish(summary: dict, out_dir: Path) -> None:
    """findings.json (whole or not at all), then the pages ``report.write_report`` builds from it after
    checking it against the schema; index.html comes last and replaces the INCOMPLETE page."""
    from preflight.reporting import report

    atomic_write_text(out_dir / "findings.json", json.dumps(summary, indent=1, default=str, allow_nan=False),
                      fsync=False)
    report.write_report(summary, out_dir)


def _run_chapter(num: int, name: str, nb_path: Path, out_dir: Path, params: dict, playbook: Path,
                 timeout_s: int, km_class) -> ChapterRun:
    """Execute one chapter notebook, with papermill in a kernel (``km_class``) or, when ``km_class`` is
    None, in this process; its findings, plus one ``error`` finding if it raised."""

    registered = BY_NAME.get(name)
    title = registered.heading if registered and registered.number == num else notebook_title(nb_path)
    run = ChapterRun(num, name, title, f"notebooks/{nb_path.name}")
    findings_path = out_dir / "chapters" / f"{nb_path.stem}.json"
    findings_path.unlink(missing_ok=True)
    for old in (out_dir / "charts").glob(f"{name}--*.svg"):   # no stale charts from an earlier run
        old.unlink()
    t0 = time.perf_counter()
    try:
        if km_class is None:
            from preflight.runner import inprocess

            inprocess.execute_notebook(nb_path, out_dir / run.notebook, params | {"findings_path": str(findings_path)},
                                       playbook, timeout_s)
        else:
            kernels.execute_notebook(nb_path, out_dir / run.notebook, params | {"findings_path": str(findings_path)},
                                     playbook, timeout_s, km_class)
        run.status = "ok"
    except Exception as err:  # noqa: BLE001 - any chapter failure is reported, the rest still run
        run.status = "error"
        run.error = _short_error(err)
    run.elapsed_s = round(time.perf_counter() - t0, 1)
    found = read_findings(findings_path) if findings_path.exists() else []
    if run.status == "error":
        prefix = BY_NAME[name].prefix if name in BY_NAME else name
        found.append(Finding(id=f"{prefix}/error", value=None, unit="", verdict="error",
                             threshold="chapter ran to the end", message=run.error or "error",
                             fix=f"Open {run.notebook} to see the failing cell.", source="audit"))
    run.findings = [asdict(f) for f in found]
    return run


def exit_code(summary: dict, fail_on: str | None) -> int:
    """1 if a chapter errored or (with ``fail_on``) a verdict reached that level, else 0."""
    if any(c["status"] == "error" for c in summary["chapters"]):
        return 1
    if fail_on and any(VERDICT_RANK[f["verdict"]] >= VERDICT_RANK[fail_on] for f in summary["findings"]):
        return 1
    return 0


def _short_error(err: Exception) -> str:
    name = getattr(err, "ename", type(err).__name__)
    value = getattr(err, "evalue", str(err))
    text = f"{name}: {value}".strip()
    return re.sub(r"\x1b\[[0-9;]*m", "", text)[:500]
