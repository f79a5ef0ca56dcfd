"""Records and the rule a chapter applies to them: a record is used only when it fits."""
from __future__ import annotations

import json

import pytest

from conftest import REPO
from preflight.core.records import Method, device_mismatch, load_records, read_records, save_record
from preflight.runner.chapter import start

CPU = {"kind": "cpu", "name": "Some CPU", "table_key": None, "label": "Some CPU (CPU fallback)"}
H100 = {"kind": "cuda", "name": "NVIDIA H100 80GB HBM3", "table_key": "H100-SXM", "label": "NVIDIA H100 (GPU)"}
M = Method("demo", 2, required=("a", "b.c"))


def rec(**kw):
    r = M.record({"quick": True}, {"a": 1, "b": {"c": 2}}, device=CPU)
    r.update(kw)
    return r


def test_a_fitting_record_has_no_problem():
    assert M.check(rec()) == []
    assert M.check(rec(), device=CPU) == []


@pytest.mark.parametrize("change, why", [
    ({"method_version": 1}, "method version 1, this Preflight reads version 2"),
    ({"method": "other"}, "method 'other', expected 'demo'"),
    ({"results": {"a": 1}}, "missing result field(s) results.b.c"),
    ({"results": {"b": {"c": 1}}}, "missing result field(s) results.a"),
    ({"results": None}, "no results object"),
])
def test_each_misfit_is_named(change, why):
    assert any(why in p for p in M.check(rec(**change)))


def test_device_rules():
    # a chip named in the profile: matched by hardware-table key
    assert device_mismatch(H100, {"kind": None, "table_key": "H100-SXM"}) is None
    assert "the profile says H100-SXM" in device_mismatch(CPU, {"kind": None, "table_key": "H100-SXM"})
    # gpu: auto: this machine, by kind and name
    assert device_mismatch(CPU, CPU) is None
    assert "this machine is Some CPU" in device_mismatch(H100, CPU)
    assert device_mismatch(dict(CPU, name="Another CPU"), CPU) is not None


def test_every_bench_method_is_declared_once():
    """One Method per measurement, each name used once, each next to its function in bench/."""
    import importlib
    import pkgutil

    import preflight.bench as bench

    seen = {}
    for info in pkgutil.iter_modules(bench.__path__):
        mod = importlib.import_module(f"preflight.bench.{info.name}")
        for value in vars(mod).values():
            if isinstance(value, Method) and value.name not in seen:
                seen[value.name] = info.name
            elif isinstance(value, Method):
                assert seen[value.name] == info.name, f"{value.name} declared in {seen[value.name]} and {info.name}"
    expected = {"allreduce", "baseline", "ceilings", "ckptstall", "datapipe", "elastic", "fusion", "loadtune",
                "loadmon_overhead", "memory", "overlap", "padding", "pipeline", "pipeline_bubble", "partition",
                "resume", "scaling"}
    assert expected <= set(seen), expected - set(seen)


def test_chapter_takes_a_fitting_record_and_names_it(tmp_path, capsys):
    results = tmp_path / "results"
    save_record(rec(device=dict(CPU)), results)
    ch = start("baseline", REPO / "data" / "profiles" / "example.yaml", plan_only=True, results_dir=str(results),
               out_dir=str(tmp_path / "out"))
    ch._device = type("D", (), {"as_dict": lambda self: CPU, "label": CPU["label"], "is_gpu": False})()
    ch.profile = ch.profile.model_copy(update={"cluster": ch.profile.cluster.model_copy(update={"gpu": "auto"})})
    m = ch.measurement(M, run=lambda: pytest.fail("must not measure"))
    assert m.origin == "recorded" and "demo.json" in m.source and m.results == {"a": 1, "b": {"c": 2}}
    log = json.loads((tmp_path / "out" / "measurements" / "baseline.json").read_text())
    assert log[0]["origin"] == "recorded" and log[0]["record"].endswith("demo.json")


def test_chapter_refuses_a_misfit_says_why_then_measures_or_skips(tmp_path, capsys):
    results = tmp_path / "results"
    save_record(rec(method_version=1), results)
    ch = start("baseline", REPO / "data" / "profiles" / "example.yaml", plan_only=True, results_dir=str(results))
    assert ch.measurement(M, run=lambda: pytest.fail("plan-only must not measure")) is None
    out = capsys.readouterr().out
    assert "record not used: demo.json: method version 1, this Preflight reads version 2" in out
    assert ch.measurements[-1]["origin"] == "not measured" and ch.measurements[-1]["refused"]

    ch.measure = True
    ch._device = type("D", (), {"as_dict": lambda self: CPU, "label": CPU["label"], "is_gpu": False})()
    m = ch.measurement(M, run=lambda: {"a": 3, "b": {"c": 4}})
    assert m.origin == "live" and m.results["a"] == 3 and "measuring live" in capsys.readouterr().out


def test_unreadable_files_are_skipped(tmp_path):
    (tmp_path / "torn.json").write_text('{"method": "demo", "results": ')
    save_record(rec(), tmp_path)
    assert [r["method"] for r in load_records(tmp_path, "demo")] == ["demo"]


def test_a_torn_record_is_named_in_the_chapter(tmp_path, capsys):
    """A file named as a record of the method (``demo-new.json``) that does not parse is skipped by
    load_records and named by the chapter, with the parser's reason; a file of another method's name
    (``demo_other.json``: not ``demo`` nor ``demo-*``) is not this method's concern."""
    results = tmp_path / "results"
    save_record(rec(date="2026-01-01T00:00:00+00:00", device=H100), results, name="old")
    (results / "demo-new.json").write_text('{"method": "demo", "results": ')
    (results / "demo_other.json").write_text("not json")
    (results / "demo-list.json").write_text("[1, 2]")
    assert read_records(results, "demo")[1] == [
        "demo-list.json: not a record (JSON without 'method' and 'results')",
        "demo-new.json: not a readable record (JSONDecodeError: Expecting value: line 1 column 31 (char 30))"]
    ch = start("baseline", REPO / "data" / "profiles" / "example.yaml", plan_only=True, results_dir=str(results))
    m = ch.measurement(M, run=lambda: pytest.fail("must not measure"))
    assert m.origin == "recorded" and "demo-old.json" in m.source             # the intact one is still used
    assert "record not used: demo-new.json: not a readable record (JSONDecodeError" in capsys.readouterr().out
    assert [p.split(":")[0] for p in ch.measurements[-1]["refused"]] == ["demo-list.json", "demo-new.json"]

    (results / "demo-old.json").unlink()                                       # only unreadable ones left
    assert ch.recorded(M) is None
    assert ch.measurements[-1]["origin"] == "not measured" and len(ch.measurements[-1]["refused"]) == 2


def test_a_newer_misfit_is_named_while_an_older_record_is_used(tmp_path, capsys):
    results = tmp_path / "results"
    save_record(rec(date="2026-01-01T00:00:00+00:00", device=H100), results, name="old")     # the profile: H100-SXM
    save_record(rec(date="2026-02-01T00:00:00+00:00", device=H100, method_version=1), results, name="new")
    ch = start("baseline", REPO / "data" / "profiles" / "example.yaml", plan_only=True, results_dir=str(results))
    m = ch.measurement(M, run=lambda: pytest.fail("must not measure"))
    assert m.origin == "recorded" and "demo-old.json" in m.source
    assert "record not used: demo-new.json: method version 1" in capsys.readouterr().out
    assert ch.measurements[-1]["refused"] == ["demo-new.json: method version 1, this Preflight reads version 2"]
