"""Findings contract, records, timing correctness."""
import json
import os
import subprocess
import sys
import time

import pytest

from preflight.core import device, records
from preflight.core.findings import Finding, FindingSink, judge, read_findings, worst
from preflight.core.timing import StepTimer, summarize, time_fn


def test_judge_both_directions():
    assert judge(0.5, warn=0.4, fail=0.3)[0] == "pass"
    assert judge(0.35, warn=0.4, fail=0.3)[0] == "warn"
    assert judge(0.2, warn=0.4, fail=0.3)[0] == "fail"
    assert judge(None, warn=0.4, fail=0.3)[0] == "info"
    v, words = judge(0.5, warn=0.25, fail=0.4, higher_is_better=False)
    assert v == "fail" and words == "pass <= 0.25, fail > 0.4"
    assert judge(0.3, warn=0.25, fail=0.4, higher_is_better=False)[0] == "warn"
    assert worst(["pass", "fail", "warn"]) == "fail" and worst([]) == "info"


def test_finding_contract():
    with pytest.raises(ValueError, match="namespaced"):
        Finding(id="mfu", value=1, unit="", verdict="pass", threshold="", message="", fix="", source="")
    with pytest.raises(ValueError, match="verdict"):
        Finding(id="a/b", value=1, unit="", verdict="great", threshold="", message="", fix="", source="")
    assert Finding(id="a/b", value=float("nan"), unit="", verdict="info", threshold="", message="",
                   fix="", source="").value is None


def test_sink_rewrites_file_and_replaces_ids(tmp_path):
    path = tmp_path / "f.json"
    sink = FindingSink(path, "baseline")
    kw = dict(unit="x", verdict="pass", threshold="t", message="m", fix="f", source="s")
    sink.add(id="baseline/a", value=1, **kw)
    sink.add(id="baseline/b", value=2, **kw)
    sink.add(id="baseline/a", value=3, **kw)
    got = read_findings(path)
    assert [(f.id, f.value) for f in got] == [("baseline/b", 2.0), ("baseline/a", 3.0)]
    assert json.loads(path.read_text())["chapter"] == "baseline"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]       # written atomically, no temp left


def test_sink_measured_gives_the_same_row_measured_or_not():
    from preflight.runner.chapter import Measured

    sink = FindingSink(None, "baseline")
    build = lambda r: dict(value=r["x"], verdict="pass", threshold="pass >= 1", message=f"x = {r['x']}", fix="keep")
    missing = sink.measured("baseline/x", None, "x", build, why_missing="plan-only mode", missing_fix="measure it")
    assert (missing.value, missing.verdict, missing.unit, missing.source) == (None, "info", "x", "not measured")
    assert (missing.threshold, missing.fix, missing.message) == ("recorded for reference", "measure it",
                                                                 "not measured: plan-only mode")
    got = sink.measured("baseline/x", Measured({"x": 2}, "measured here"), "x", build,
                        why_missing="plan-only mode", missing_fix="measure it")
    assert (got.value, got.verdict, got.message, got.fix, got.source) == (2.0, "pass", "x = 2", "keep", "measured here")
    assert [f.id for f in sink.findings] == ["baseline/x"]                 # the measured one replaced it
    own = sink.measured("baseline/y", Measured({"x": 3}, "rec"), "x", lambda r: dict(build(r), source="rec; cpu"),
                        why_missing="", missing_fix="")
    assert own.source == "rec; cpu"


def test_record_round_trip(tmp_path):
    dev = {"kind": "cpu", "name": "test-cpu", "label": "test-cpu (CPU fallback)"}
    rec = records.make_record("ceilings", 1, {"n": 64}, {"tflops": 0.1}, device=dev)
    assert {"method", "method_version", "date", "device", "versions", "params", "results"} <= set(rec)
    assert rec["versions"]["python"] and rec["versions"]["torch"]
    p = records.save_record(rec, tmp_path / "r", name="rank0")
    assert p.name == "ceilings-rank0.json"
    (tmp_path / "r" / "junk.json").write_text("{not json")
    loaded = records.load_records(tmp_path / "r", "ceilings")
    assert len(loaded) == 1 and loaded[0]["results"]["tflops"] == 0.1
    assert records.load_records(tmp_path / "r", "other") == []
    df = records.records_frame(loaded)
    assert df.loc[0, "tflops"] == 0.1 and df.loc[0, "param.n"] == 64


def test_time_fn_measures_known_durations():
    t = time_fn(lambda: time.sleep(0.02), warmup=1, repeats=5)
    # a sleep never returns early; load only delays the wake-up (a few ms under 2 CPU hogs), so the upper
    # bound is loose: it still fails a timer that reports the sum of the 5 repeats (0.1 s) or milliseconds
    assert 0.019 < t.median_s < 0.08
    assert t.p10_s <= t.median_s <= t.p90_s and t.repeats == 5
    calls = []
    time_fn(lambda: calls.append(1), warmup=3, repeats=4)
    assert len(calls) == 7          # warm-up calls are made but not timed
    # kept sampling until min_time_s was covered, and stopped then: asserted on the samples, not on how
    # many 5 ms sleeps fit in 50 ms (a loaded machine stretches them to 7-12 ms: 4 to 7 of them)
    t = time_fn(lambda: time.sleep(0.005), warmup=0, repeats=2, min_time_s=0.05)
    assert t.repeats > 2 and sum(t.samples_s) >= 0.05 > sum(t.samples_s[:-1])
    assert len(t.samples_s) == t.repeats and min(t.samples_s) >= 0.005        # a sleep never ends early


def test_summarize_median_resists_outlier():
    t = summarize([0.01] * 9 + [1.0])
    assert t.median_s == pytest.approx(0.01)


def test_step_timer_phases_and_other():
    timer = StepTimer("cpu")
    for _ in range(3):
        with timer.phase("data_wait"):
            time.sleep(0.01)
        with timer.phase("forward"):
            time.sleep(0.02)
        time.sleep(0.015)          # not inside a phase: lands in 'other'
        timer.end_step()
    df = timer.frame(skip=1)
    assert len(df) == 2
    # sleep never returns early; under a loaded machine it overshoots, so bound below and loosely above
    # (the mechanism: time inside a phase lands in it, time between phases in 'other')
    assert 0.019 <= df["forward"].median() < 0.25
    assert 0.014 <= df["other"].median() < 0.25
    assert 0.009 <= df["data_wait"].median() < 0.25
    comp = timer.composition()
    assert comp["share"].sum() == pytest.approx(1.0)
    assert set(comp["phase"]) == {"data_wait", "forward", "other"}


def test_a_cpu_build_of_torch_is_probed_without_importing_it():
    """device.probe reads torch's build file; for a CPU build it answers without importing torch, and
    that answer is the one torch itself gives (probe_with_torch), versions included. Fails when the
    file is read wrongly (a field differs) or when probe imports torch anyway."""
    code = ("import json, sys; from preflight.core import device; "
            "fast = device.probe().as_dict(); v = device.versions(); imported = 'torch' in sys.modules; "
            "slow = device.probe_with_torch().as_dict(); "
            "import torch; v2 = device.versions(); "
            "print(json.dumps([device.torch_build(), imported, fast, slow, v, v2]))")
    env = {k: v for k, v in os.environ.items() if k not in device.PINNING_VARIABLES}
    for pinned in (False, True):
        # OMP_PROC_BIND: loading torch's OpenMP pins the process to fewer cores; then torch is asked
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                           env=env | ({"OMP_PROC_BIND": "true"} if pinned else {}))
        assert r.returncode == 0, r.stderr[-2000:]
        build, imported, fast, slow, v, v2 = json.loads(r.stdout)
        if not device.cpu_only_build(build):
            pytest.skip(f"torch here is built for an accelerator ({build}): probe asks torch itself")
        assert imported is pinned
        assert fast == slow and fast["kind"] == "cpu" and fast["torch"] == build["__version__"]
        assert v == v2 and v["torch"] == fast["torch"] and v["cuda"] is None


def test_which_torch_builds_are_taken_as_cpu_only(tmp_path, monkeypatch):
    """Only a build for no accelerator, off a Mac, skips the import; any other build, or a build file
    that cannot be read, is asked through torch."""
    assert device.cpu_only_build({"__version__": "2.13.0+cpu", "cuda": None, "hip": None, "xpu": None})
    for gpu in ({"cuda": "12.8"}, {"hip": "6.4.1"}, {"xpu": "20250101"}):
        assert not device.cpu_only_build({"__version__": "2.13.0", "cuda": None, "hip": None, "xpu": None} | gpu)
    assert not device.cpu_only_build(None)
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('never imported by torch_build')\n")
    (fake / "version.py").write_text("from typing import Optional\n__version__ = '2.11.0+cu130'\n"
                                     "debug = False\ncuda: Optional[str] = '13.0'\nhip: Optional[str] = None\n")
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    build = device.torch_build()
    assert build == {"__version__": "2.11.0+cu130", "cuda": "13.0", "hip": None, "xpu": None}
    assert not device.cpu_only_build(build)
    (fake / "version.py").write_text("__version__ = compute()\n")        # not a literal: ask torch
    assert device.torch_build() is None
    (fake / "version.py").write_text("__version__ = '2.13.0'\ncuda = None\nhip = None\n")
    monkeypatch.setattr(device.sys, "platform", "darwin")                 # MPS needs no build flag
    assert not device.cpu_only_build(device.torch_build())


def test_background_probe_answers_and_says_why_it_fell_back(capsys, monkeypatch):
    here = device.probe().as_dict()
    bg = device.BackgroundProbe()
    assert (bg._child is None) == device.answers_without_torch(device.torch_build())   # a CPU build: no child
    assert bg.result(timeout_s=120)[0] == here
    monkeypatch.setattr(device, "answers_without_torch", lambda build: False)      # any other build: a child
    bg = device.BackgroundProbe()
    assert bg._child is not None
    machine, vers = bg.result(timeout_s=120)                                # the child's answer
    assert machine == here and vers["torch"] and vers["python"]
    assert capsys.readouterr().err == ""
    for code, says in (("import sys; sys.exit('boom')", "exited with code 1: boom"),
                       ("print('not json')", "not the probe's JSON"),
                       ("import time; time.sleep(30)", "no answer in 0.5 s")):
        bg = device.BackgroundProbe()
        bg.stop()
        bg._child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        assert bg.result(timeout_s=0.5 if "sleep" in code else 60)[0] == here    # probed here: same answer
        err = capsys.readouterr().err
        assert says in err and "probing in this process instead" in err, err
        assert bg._child.poll() is not None                                    # nothing left running


def test_charts_render_in_the_chart_process_not_here(monkeypatch, tmp_path):
    """``charts.warm_up`` starts the chart process (preflight.reporting.chartproc) and ``render_later`` renders
    there: vl-convert holds the GIL while it renders, so a thread would stall the audit's cells. The
    SVG is the one rendered here, written to the path given; this process's vl-convert is never called
    (fails when rendering falls back to this process)."""
    import altair as alt
    import pandas as pd
    import vl_convert as vlc

    from preflight.reporting import chartproc, charts

    chart = alt.Chart(pd.DataFrame({"x": [1, 2]})).mark_point().encode(x="x:Q")
    expected = charts.to_svg(chart)

    def here(*args, **kwargs):
        raise AssertionError("rendered in the audit's process")

    monkeypatch.setattr(vlc, "vegalite_to_svg", here)
    try:
        proc = charts.warm_up()
        assert isinstance(proc, chartproc.ChartProcess) and proc.pid not in (None, os.getpid())
        got = charts.render_later(chart, tmp_path / "c.svg").result(timeout=120)
        assert got == expected and (tmp_path / "c.svg").read_text() == expected
        bad = proc.submit({"data": {"values": [{"x": 1}]}, "mark": "nosuchmark",
                           "encoding": {"x": {"field": "x", "type": "quantitative"}}})
        with pytest.raises(ValueError, match="conversion failed"):      # that chart's own error...
            bad.result(timeout=120)
        assert charts.render_later(chart).result(timeout=120) == expected     # ...and the process goes on
        monkeypatch.undo()                       # not JSON: tried here, where vl-convert rejects it alike
        odd = proc.submit({"data": {"values": [{"x": object()}]}, "mark": "point"})
        with pytest.raises(ValueError, match="JSON"):
            odd.result(timeout=120)
        assert proc.submit(charts._spec(chart)).result(timeout=120) == expected
        child = proc._child
    finally:
        charts.stop_rendering()
    assert child.poll() is not None                                      # stopped: nothing left running
    assert child.stdin.closed and child.stdout.closed                   # its pipes released


def test_a_chart_no_one_waits_for_any_more_is_dropped(monkeypatch):
    """Ctrl-C cancels the Futures of the charts not yet answered (inprocess._wait_for_pending); their
    answers, when they come, are dropped, and the reader goes on answering the others (it died of
    InvalidStateError when it set a cancelled Future's result)."""
    import threading

    import altair as alt
    import pandas as pd

    from preflight.reporting import chartproc, charts

    died = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))
    spec = charts._spec(alt.Chart(pd.DataFrame({"x": [1, 2]})).mark_point().encode(x="x:Q"))
    proc = chartproc.ChartProcess()
    try:
        dropped = proc.submit(spec)
        assert dropped.cancel()                  # before its answer: the child first starts its engine
        assert proc.submit(spec).result(timeout=120).startswith("<svg")
    finally:
        proc.close()
    assert dropped.cancelled() and died == []


def test_a_chart_process_that_dies_or_cannot_start_leaves_the_charts_to_this_process(monkeypatch, capsys):
    """Killed mid-audit: the charts it had not answered and every later one render here, same SVG,
    one stderr line says why. One that cannot start: the same."""
    import signal

    import altair as alt
    import pandas as pd

    from preflight.reporting import chartproc, charts

    spec = charts._spec(alt.Chart(pd.DataFrame({"x": [1, 2, 3]})).mark_line().encode(x="x:Q"))
    expected = chartproc.render_here(spec)
    proc = chartproc.ChartProcess()
    try:
        first = [proc.submit(spec) for _ in range(3)]
        os.kill(proc.pid, signal.SIGKILL)
        later = proc.submit(spec)
        assert all(f.result(timeout=120) == expected for f in [*first, later])   # answered there or here
        deadline = time.monotonic() + 60
        while "chart process ended" not in (err := capsys.readouterr().err) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "rendering charts in this process instead" in err, err
    finally:
        proc.close()
    monkeypatch.setattr(chartproc.sys, "executable", "/nonexistent/python")
    proc = chartproc.ChartProcess()
    assert proc.pid is None and proc.submit(spec).result(timeout=120) == expected
    assert "could not start" in capsys.readouterr().err
    proc.close()
