"""``audit --flight-recorder DIR`` and ``audit --stragglers DIR``: the team's own evidence in chapters 5 and 4
and in the report's one quality table.

Fast: the folders are read and checked by the CLI before anything is written (bad ones exit 2, the file
named, an earlier report left as it was); the chapter sections (``preflight.runner.evidence_section``) on
a stub chapter: a team's folder adds its finding, the shared teaching case adds none, a healthy job is
not called broken; the quality rows and the report's table with all four sources; the in-process cache.
Slow (whole notebooks, plan-only): the audit on the shared cases, without folders, and the README's
commands as written."""
import json
import os
import pickle
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest

from conftest import EXAMPLE, REPO
from preflight.cli import main
from preflight.core.findings import Finding, FindingSink
from preflight.runner import evidence as E
from preflight.runner import evidence_section as S
from test_flight_recorder import Job, _Evil
from test_stragglers_whatif import synth

PY = sys.executable
SHARED = REPO.parent / "shared"
GPU_ERROR = SHARED / "flight-recorder" / "gpu_error_2nd"
LOCK_GIL = SHARED / "flight-recorder" / "lock_gil_1st"
ST, AR = SHARED / "stragglers" / "ST", SHARED / "stragglers" / "AR"
needs_shared = pytest.mark.skipif(not (GPU_ERROR.is_dir() and (ST / "trace-ST.parquet").is_file()),
                                  reason="../shared (flight-recorder, stragglers) is not beside the clone")


@pytest.fixture(autouse=True)
def _own_trace_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFLIGHT_CACHE", str(tmp_path / "cache"))
    E._CACHE.clear()


@pytest.fixture
def displayed(monkeypatch) -> list[str]:
    """The text of what the sections display (Markdown's source; a chart's SVG)."""
    import IPython.display

    seen = []
    monkeypatch.setattr(IPython.display, "display", lambda *objs, **kw: seen.extend(
        str(getattr(o, "data", None) or o) for o in objs))
    return seen


def _audit(capsys, *args) -> tuple[int, str]:
    """``python -m preflight audit ...`` in this process (exit code, stderr): the checks before anything runs."""
    try:
        code = main(["audit", str(EXAMPLE), "--plan-only", *map(str, args)])
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def _earlier_report(tmp_path):
    out = tmp_path / "rep"
    out.mkdir()
    (out / "index.html").write_text("an earlier report")
    return out


def _unchanged(out) -> bool:
    return sorted(p.name for p in out.iterdir()) == ["index.html"] and (out / "index.html").read_text() == "an earlier report"


def _faulty_job(folder):
    """A TP2 x PP2 x DP2 job whose rank 5 stops launching half-way (simulated dumps, PyTorch 2.10's shape)."""
    job = Job(tp=2, pp=2, dp=2)
    return job.run(stop_launch={5: len(job.program[5]) // 2}).write(folder)


# --- the CLI: read and checked before anything is written --------------------------------------------------

def test_bad_flight_recorder_folders_exit_2_naming_the_file_and_write_nothing(tmp_path, capsys):
    out = _earlier_report(tmp_path)
    code, err = _audit(capsys, "--flight-recorder", tmp_path / "nowhere", "--out", out)
    assert code == 2 and "--flight-recorder" in err and "nowhere: no such folder" in err and _unchanged(out)
    dumps = Job(tp=2).run().write(tmp_path / "dumps")
    (dumps / "_dump_1").write_bytes((dumps / "_dump_1").read_bytes()[:200])          # truncated
    code, err = _audit(capsys, "--flight-recorder", dumps, "--out", out)
    assert code == 2 and "_dump_1" in err and "truncated" in err and _unchanged(out)
    marker = tmp_path / "executed"
    data = Job(tp=2).run().dump(1)
    data["entries"][0]["frames"] = _Evil(marker)                                       # a pickle that asks for os.system
    (dumps / "_dump_1").write_bytes(pickle.dumps(data, protocol=2))
    code, err = _audit(capsys, "--flight-recorder", dumps, "--out", out)
    assert code == 2 and "_dump_1" in err and "asks for the global" in err and not marker.exists() and _unchanged(out)


def test_bad_stragglers_folders_exit_2_naming_the_file_and_write_nothing(tmp_path, capsys):
    out = _earlier_report(tmp_path)
    code, err = _audit(capsys, "--stragglers", tmp_path / "nowhere", "--out", out)
    assert code == 2 and "--stragglers" in err and "nowhere" in err and _unchanged(out)
    folder = synth(tmp_path / "job", lambda k, *_: 0.01, steps=2)
    import pandas as pd

    pd.read_parquet(folder / "trace-synth.parquet").drop(columns=["duration"]).to_parquet(folder / "trace-synth.parquet")
    code, err = _audit(capsys, "--stragglers", folder, "--out", out)
    assert code == 2 and "trace-synth.parquet" in err and "duration" in err and _unchanged(out)
    (folder / "trace-synth.parquet").unlink()
    code, err = _audit(capsys, "--stragglers", folder, "--out", out)
    assert code == 2 and "expected one per-op trace (*.parquet), found 0" in err and _unchanged(out)


def test_a_folder_for_a_chapter_the_audit_leaves_out_is_refused(tmp_path, capsys):
    dumps = _faulty_job(tmp_path / "dumps")
    out = _earlier_report(tmp_path)
    code, err = _audit(capsys, "--chapters", "4", "--flight-recorder", dumps, "--out", out)
    assert code == 2 and "chapter 5 (fault_tolerance)" in err and "add 5 to --chapters" in err and _unchanged(out)
    code, err = _audit(capsys, "--chapters", "5", "--stragglers", tmp_path, "--out", out)
    assert code == 2 and "chapter 4 (load_balance)" in err and _unchanged(out)


# --- the chapter sections, on a stub chapter ------------------------------------------------------------------

class _Chapter:
    """What the sections use of ``preflight.runner.chapter.Chapter``: findings, show, table, note."""

    def __init__(self, name):
        self.name, self.findings = name, FindingSink(chapter=name)
        self.shown, self.tables, self.notes = [], [], []

    def show(self, key, chart):
        self.shown.append(key)

    def table(self, df):
        self.tables.append(df)

    def note(self, text):
        self.notes.append(text)


def test_hang_section_adds_the_finding_of_the_teams_dumps(tmp_path):
    ch = _Chapter("fault_tolerance")
    a = S.show_hang(ch, str(_faulty_job(tmp_path / "dumps")), example=False)
    (f,) = ch.findings.findings
    assert f.id == "fault_tolerance/hang_attribution" and f.verdict == "fail" and a["likely_faulty"] == [5]
    assert f.per_rank.keys() == {"5"} and "rank 5 hung the job" in f.message
    assert ch.shown == ["hang_progress"]                          # the picture goes to the report


def test_hang_section_calls_a_healthy_job_healthy(tmp_path):
    ch = _Chapter("fault_tolerance")
    S.show_hang(ch, str(Job(tp=2, pp=2, dp=2).run().write(tmp_path / "dumps")), example=False)
    (f,) = ch.findings.findings
    assert f.verdict == "pass" and f.value == 0 and f.per_rank is None


@needs_shared
def test_hang_section_teaches_with_the_shared_case_and_adds_no_finding(capsys, displayed):
    ch = _Chapter("fault_tolerance")
    a = S.show_hang(ch, "", example=True)
    assert a["likely_faulty"] == [9, 14] and ch.findings.findings == [] and ch.shown == []    # not in the report
    assert "the shared case" in displayed[0] and any("<svg" in x for x in displayed)        # its picture, inline
    assert S.show_hang(_Chapter("fault_tolerance"), "", example=False) is None               # the headless audit
    assert "--flight-recorder DIR" in capsys.readouterr().out


def test_unreadable_folder_in_the_notebook_is_a_note_not_a_traceback(tmp_path):
    ch = _Chapter("fault_tolerance")
    assert S.show_hang(ch, str(tmp_path / "nowhere")) is None
    assert "could not be read" in ch.notes[0] and "python -m preflight hang" in ch.notes[0]
    assert S.show_stragglers(ch, str(tmp_path)) is None and "python -m preflight traces" in ch.notes[1]
    assert ch.findings.findings == []


def test_stragglers_section_adds_the_finding_and_the_attribution(tmp_path):
    ch = _Chapter("load_balance")
    slow = lambda k, step, d, s, mb: (0.010 if k == "F" else 0.020) * (1.6 if (d, s) == (1, 2) else 1.0)  # noqa: E731
    res = S.show_stragglers(ch, str(synth(tmp_path / "slow", slow)), example=False)
    (f,) = ch.findings.findings
    assert f.id == "load_balance/straggler_cost" and f.verdict == "fail" and f.value == pytest.approx(res["slowdown"])
    table = ch.tables[0]
    assert list(table.columns) == ["what", "which", "slowdown alone", "fixing it wins back"]
    assert table.iloc[0]["which"] == f"rank {2 * (1 + 2 * 2)} (dp 1, stage 2)"       # synth: rank = tp (d + dp s)
    assert "slow worker" in set(ch.tables[1]["cause"])


def test_stragglers_section_calls_a_healthy_job_healthy(tmp_path):
    rng = np.random.default_rng(0)
    ch = _Chapter("load_balance")
    res = S.show_stragglers(ch, str(synth(tmp_path / "ok", lambda k, *_: 0.01 * (1 + 0.005 * rng.standard_normal()))),
                            example=False)
    (f,) = ch.findings.findings
    assert f.verdict == "pass" and res["causes"]["named"] == []
    assert E.stragglers_row(res)["told"].startswith("S = 1.0") and "no single cause named" in E.stragglers_row(res)["told"]


@needs_shared
def test_stragglers_section_teaches_with_the_shared_case_and_adds_no_finding(displayed):
    ch = _Chapter("load_balance")
    res = S.show_stragglers(ch, "", example=True)
    assert res["slowdown"] == pytest.approx(1.973, abs=0.001) and ch.findings.findings == []
    assert "the shared case AR" in displayed[0]


# --- the quality rows and the report's one table ------------------------------------------------------------------

@needs_shared
def test_quality_rows_say_what_each_source_held_and_could_not_say():
    row = E.flight_recorder_row(E.hang(GPU_ERROR))
    assert row["ranks"] == "0-15" and row["files"] == 16 and "59 process groups" in row["holds"]
    assert any("fault_injection.log" in x for x in row["limits"]) and "9, 14" in row["told"]
    gil = E.flight_recorder_row(E.hang(LOCK_GIL))
    assert any(x.startswith("empty recorder on rank(s) 9, 14") for x in gil["limits"])
    st = E.stragglers_row(E.stragglers(ST))
    assert st["ranks"] == "8 workers of 8 GPUs" and "32 steps" in st["holds"] and "stage imbalance" in st["told"]
    ar = E.stragglers_row(E.stragglers(AR))
    assert ar["limits"][0].startswith("one worker traced per group of 4 GPUs")       # AR: tp 4


@needs_shared
def test_one_quality_table_for_every_source(tmp_path):
    from preflight.chapters.traces import audit_traces
    from preflight.reporting.evidence_table import evidence_html
    from preflight.runner.audit import _evidence_summary

    def traces(folder):
        a = audit_traces(folder)
        return {"folder": a["folder"], "world_size": a["world_size"], "ranks": sorted(a["ranks"]),
                "missing": a["missing"], "quality": a["quality"]}

    (tmp_path / "nsys").mkdir()
    (tmp_path / "nsys" / "mock.sqlite").symlink_to(SHARED / "nsys" / "mock.sqlite")
    kineto, nsys = traces(REPO / "data" / "traces" / "example"), traces(tmp_path / "nsys")
    html = evidence_html({"traces": kineto | {"quality": kineto["quality"] + nsys["quality"]},
                          "evidence": _evidence_summary(GPU_ERROR, ST)})
    table = html.split("<tbody>", 1)[1]
    sources = re.findall(r"<tr><td>([^<]+)</td>", table)
    assert sources == ["torch.profiler trace", "torch.profiler trace", "Nsight Systems export", "Flight Recorder dumps",
                       "per-op straggler trace"]
    assert html.count("<table") == 1 and "What each source could tell" in html
    assert evidence_html({"traces": None, "evidence": []}) == ""


def test_a_folder_is_read_once_until_a_file_changes(tmp_path):
    dumps = _faulty_job(tmp_path / "dumps")
    first = E.hang(dumps)
    assert E.hang(dumps) is first
    (dumps / "_dump_0").write_bytes(pickle.dumps(Job(tp=2, pp=2, dp=2).run().dump(0), protocol=2))
    os.utime(dumps / "_dump_0", ns=(1, 1))
    assert E.hang(dumps) is not first


# --- whole notebooks: the audit, and the README's commands ---------------------------------------------------

def _run(*args, cwd=REPO):
    return subprocess.run([PY, "-m", "preflight", *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          timeout=600, env={**os.environ, "PYTHONPATH": str(REPO / "lib")})


@pytest.mark.slow
@needs_shared
def test_audit_with_every_source_on_the_shared_cases(tmp_path):
    (tmp_path / "nsys").mkdir()
    (tmp_path / "nsys" / "mock.sqlite").symlink_to(SHARED / "nsys" / "mock.sqlite")
    out = tmp_path / "rep"
    r = _run("audit", EXAMPLE, "--plan-only", "--chapters", "4,5", "--flight-recorder", GPU_ERROR, "--stragglers", ST,
             "--traces", tmp_path / "nsys", "--out", out)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((out / "findings.json").read_text())
    by_id = {f["id"]: f for f in summary["findings"]}
    hang = by_id["fault_tolerance/hang_attribution"]
    assert hang["chapter"] == 5 and hang["verdict"] == "fail" and hang["value"] == 2
    assert hang["per_rank"].keys() == {"9", "14"} and hang["message"].startswith("ranks 9, 14 hung the job")
    Finding(**{k: v for k, v in hang.items() if k != "chapter"})
    cost = by_id["load_balance/straggler_cost"]
    assert cost["chapter"] == 4 and cost["value"] == pytest.approx(1.1787, abs=1e-3) and "stage 3" in cost["fix"]
    assert [e["source"] for e in summary["evidence"]] == ["Flight Recorder dumps", "per-op straggler trace"]
    assert (out / "charts" / "fault_tolerance--hang_progress.svg").is_file()
    page = (out / "index.html").read_text()
    for words in ("What each source could tell", "Nsight Systems export", "Flight Recorder dumps", "per-op straggler trace",
                  "Which ranks hung the job (Flight Recorder)"):
        assert words in page, words
    nb = (out / "notebooks" / "05_fault_tolerance.ipynb").read_text()
    assert "When the job hangs" in nb and "TORCH_NCCL_TRACE_BUFFER_SIZE" in nb and "TORCH_NCCL_DUMP_ON_TIMEOUT" in nb


@pytest.mark.slow
def test_audit_without_folders_adds_neither_finding(tmp_path):
    out = tmp_path / "rep"
    r = _run("audit", EXAMPLE, "--plan-only", "--chapters", "4,5", "--out", out)
    assert r.returncode in (0, 1), r.stderr[-3000:]
    summary = json.loads((out / "findings.json").read_text())
    ids = {f["id"] for f in summary["findings"]}
    assert not ids & {"fault_tolerance/hang_attribution", "load_balance/straggler_cost"}
    assert summary["evidence"] == [] and "What each source could tell" not in (out / "index.html").read_text()
    assert not (out / "charts" / "fault_tolerance--hang_progress.svg").exists()


def _readme_audit_line(section: str) -> str:
    text = (REPO / "README.md").read_text().split(section, 1)[1].split("\n## ", 1)[0]
    lines = [re.sub(r"\s+#.*$", "", ln).strip() for block in re.findall(r"```bash\n(.*?)```", text, re.S)
             for ln in block.splitlines()]
    (line,) = [ln for ln in lines if ln.startswith("python -m preflight audit ")]
    return line


@pytest.mark.slow
@needs_shared
@pytest.mark.parametrize("section, finding", [
    ("## Which rank hung the job: `hang`", "fault_tolerance/hang_attribution"),
    ("### What your stragglers cost: `traces` on a per-op trace", "load_balance/straggler_cost")])
def test_readme_audit_commands_as_written(tmp_path, section, finding):
    """Run from a clone with ../shared beside it (links to this repo's data and the shared cases)."""
    line = _readme_audit_line(section)
    work = tmp_path / "clone"
    work.mkdir()
    (work / "data").symlink_to(REPO / "data")
    (tmp_path / "shared").symlink_to(SHARED)
    r = subprocess.run([PY if a == "python" else a for a in shlex.split(line)], capture_output=True, text=True, cwd=work,
                       timeout=600, env={**os.environ, "PYTHONPATH": str(REPO / "lib")})
    assert r.returncode in (0, 1), (line, r.stderr[-3000:])
    argv = shlex.split(line)
    summary = json.loads((work / argv[argv.index("--out") + 1] / "findings.json").read_text())
    f = next(f for f in summary["findings"] if f["id"] == finding)
    assert f["verdict"] == "fail"
    if finding == "fault_tolerance/hang_attribution":
        assert f["per_rank"].keys() == {"9", "14"}
    else:
        assert f["value"] == pytest.approx(1.973, abs=1e-3) and "rank 0" in f["fix"]
