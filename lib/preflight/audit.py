"""The audit: run the chapter notebooks headlessly on a profile and collect their findings.

papermill executes each chapter with the profile injected through its ``parameters`` cell, always
with an execution timeout (a large widget output can hang nbclient). A chapter that raises is marked
``error`` and the others still run. Outputs, in ``out_dir`` (default ``reports/<project>/``)::

    index.html            the audit summary (preflight.report)
    <chapter>.html        one page per executed chapter
    findings.json         every finding + machine + versions + timings
    notebooks/*.ipynb     the executed notebooks
    records/*.json        the measurements taken during this run
    chapters/*.json       each chapter's raw findings
"""
from __future__ import annotations

import datetime as _dt
import json
import re
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from preflight import REPO
from preflight.findings import VERDICT_RANK, Finding, read_findings, worst
from preflight.profile import Profile

PLAYBOOK = REPO / "playbook"
KERNEL = "preflight"          # registered by `make setup` into the project's venv; python3 otherwise
DEFAULT_TIMEOUT_S = 600       # per cell
_NB = re.compile(r"^(\d\d)_([a-z0-9_]+)\.ipynb$")


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


def discover(playbook: Path = PLAYBOOK) -> dict[int, tuple[str, Path]]:
    """Chapter number -> (name, notebook path) for every ``NN_name.ipynb`` in the playbook."""
    out = {}
    for p in sorted(playbook.glob("*.ipynb")):
        m = _NB.match(p.name)
        if m:
            out[int(m.group(1))] = (m.group(2), p)
    return out


def notebook_title(path: Path) -> str:
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


def _kernel_manager_class(socket_dir: str):
    """Kernels talk to the audit over Unix sockets in ``socket_dir`` (ipc), not TCP: nothing
    listens on a port, and ipykernel has nothing to warn about."""
    from jupyter_client.manager import AsyncKernelManager   # nbclient needs the async one for timeouts

    class IPCKernelManager(AsyncKernelManager):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.transport = "ipc"
            self.ip = str(Path(socket_dir) / "kernel")

    return IPCKernelManager


def _kernel_name() -> str:
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        spec = KernelSpecManager().get_kernel_spec(KERNEL)
        if Path(spec.argv[0]).resolve() == Path(sys.executable).resolve():
            return KERNEL
    except (NoSuchKernel, OSError, IndexError):
        pass
    return "python3"    # the native kernel of the running interpreter


def run_audit(profile: Profile, profile_path: Path, out_dir: Path, *, chapters: list[int],
              playbook: Path = PLAYBOOK, plan_only: bool = False, results_dir: Path | None = None,
              timeout_s: int = DEFAULT_TIMEOUT_S, quick: bool = False, log=print) -> dict:
    """Execute the chosen chapters, write findings.json and the HTML report; return the summary.
    Paths must be absolute: the notebooks run with the playbook folder as working directory."""
    from preflight import report
    from preflight.device import probe
    from preflight.records import versions

    available = discover(playbook)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "notebooks").mkdir(exist_ok=True)
    params = {"profile_path": str(profile_path), "plan_only": plan_only,
              "results_dir": str(results_dir) if results_dir else "", "out_dir": str(out_dir),
              "quick": quick, "interactive": False}
    started = time.perf_counter()
    runs: list[ChapterRun] = []
    with tempfile.TemporaryDirectory(prefix="preflight-kernels-") as sockets:
        for i, num in enumerate(chapters, 1):
            name, nb_path = available[num]
            log(f"[{i}/{len(chapters)}] chapter {num} {name}: running "
                f"(elapsed {time.perf_counter() - started:.0f} s)", flush=True)
            run = _run_chapter(num, name, nb_path, out_dir, params, playbook, timeout_s, sockets)
            log(f"[{i}/{len(chapters)}] chapter {num} {name}: {run.status} in {run.elapsed_s:.1f} s, "
                f"{len(run.findings)} findings, worst: {worst(f['verdict'] for f in run.findings)}", flush=True)
            runs.append(run)

    summary = {
        "schema": "preflight-findings/1",
        "project": profile.project,
        "notes": profile.notes,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "mode": "plan-only" if plan_only or not profile.measure else "measure",
        "profile": profile.model_dump(),
        "profile_path": str(profile_path),
        "results_dir": str(results_dir) if results_dir else None,
        "machine": probe().as_dict(),
        "versions": versions(),
        "elapsed_s": round(time.perf_counter() - started, 1),
        "chapters": [{k: v for k, v in asdict(r).items() if k != "findings"} | {
            "verdict": worst(f["verdict"] for f in r.findings)} for r in runs],
        "findings": [f | {"chapter": r.number} for r in runs for f in r.findings],
    }
    (out_dir / "findings.json").write_text(json.dumps(summary, indent=1, default=str, allow_nan=False))
    report.write_report(summary, out_dir)
    return summary


def _run_chapter(num: int, name: str, nb_path: Path, out_dir: Path, params: dict, playbook: Path,
                 timeout_s: int, socket_dir: str) -> ChapterRun:
    """Execute one chapter notebook with papermill; its findings, plus one ``error`` finding if it raised."""
    import papermill as pm

    run = ChapterRun(num, name, notebook_title(nb_path), f"notebooks/{nb_path.name}")
    findings_path = out_dir / "chapters" / f"{nb_path.stem}.json"
    findings_path.unlink(missing_ok=True)
    for old in (out_dir / "charts").glob(f"{name}--*.svg"):   # no stale charts from an earlier run
        old.unlink()
    t0 = time.perf_counter()
    try:
        pm.execute_notebook(
            str(nb_path), str(out_dir / run.notebook), kernel_name=_kernel_name(), language="python",
            parameters=params | {"findings_path": str(findings_path)},
            execution_timeout=timeout_s, progress_bar=False, cwd=str(playbook),
            log_output=False, request_save_on_cell_execute=False,
            kernel_manager_class=_kernel_manager_class(socket_dir))
        run.status = "ok"
    except Exception as err:  # noqa: BLE001 - any chapter failure is reported, the rest still run
        run.status = "error"
        run.error = _short_error(err)
    run.elapsed_s = round(time.perf_counter() - t0, 1)
    found = read_findings(findings_path) if findings_path.exists() else []
    if run.status == "error":
        found.append(Finding(id=f"{name}/error", value=None, unit="", verdict="error",
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
