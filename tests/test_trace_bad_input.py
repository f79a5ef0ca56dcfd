"""Malformed traces: each is refused (exit 2, the file, the event's index and the field named) or its bad
events are counted in the trace-quality table; never a traceback, never a share outside 0-100 %.
The property test mutates real traces' events (the embedded example, ../shared/traces) with Hypothesis."""
import gzip
import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import REPO
from preflight.chapters import traces as T
from preflight.diagnose.trace_analysis import analyze
from preflight.diagnose.trace_file import TraceError, read_trace
from preflight.diagnose.trace_job import _assemble, read_job
from preflight.diagnose.trace_rank import summarize
from test_traces import Trace, cli, three_steps

SHARES = ("idle", "compute", "idle_host", "idle_other", "idle_launch", "stream_idle_host", "stream_idle_other_stream",
          "stream_idle_other", "overlap", "exposed_comm", "exposed_wait", "mfu", "loader_share", "wait_share")


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("PREFLIGHT_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def judge_raw(path: Path, raw: bytes):
    """What the command does with one file, in this process: the analysis and every finding."""
    s = summarize(read_trace(path, raw))
    a = analyze(_assemble(path.parent, [s], []))
    return a, T.findings(a)


def assert_sane(a, found):
    for v in a["ranks"].values():
        for k in SHARES:
            x = v.get(k)
            assert x is None or (math.isfinite(x) and -1e-12 <= x <= 1 + 1e-12), (k, x)
    for f in found:
        assert f.value is None or math.isfinite(f.value), f
        if f.unit == "fraction":
            vals = [f.value] + list((f.per_rank or {}).values())
            assert all(x is None or -1e-12 <= x <= 1 + 1e-12 for x in vals), f


# --- each bad input of the issue, by hand ----------------------------------------------------------------

def _with(mutate, n_kernels=3):
    t = three_steps(rank=0, world=2)
    doc = t.doc()
    mutate(doc, [i for i, e in enumerate(doc["traceEvents"]) if e.get("cat") == "kernel"])
    return doc


CASES = {   # name: (mutation, words in the refusal)
    "kernel name not a string": (lambda d, k: d["traceEvents"][k[0]].update(name=7), "field name"),
    "args a list": (lambda d, k: d["traceEvents"][k[0]].update(args=[1, 2]), "field args"),
    "negative duration": (lambda d, k: d["traceEvents"][k[1]].update(dur=-500), "field dur"),
    "NaN time": (lambda d, k: d["traceEvents"][k[1]].update(ts=float("nan")), "field ts"),
    "infinite time": (lambda d, k: d["traceEvents"][k[1]].update(dur=float("inf")), "field dur"),
    "string time": (lambda d, k: d["traceEvents"][k[1]].update(ts="12"), "field ts"),
    "missing time": (lambda d, k: d["traceEvents"][k[1]].pop("ts"), "field ts"),
    "timestamp beyond 2^63": (lambda d, k: d["traceEvents"][k[1]].update(ts=2**64), "field ts"),
    "correlation beyond 2^63": (lambda d, k: d["traceEvents"][k[2]]["args"].update(correlation=2**64),
                                "field args.correlation"),
    "rank 5 of a world of 2": (lambda d, k: d["distributedInfo"].update(rank=5), "distributedInfo.rank"),
    "world size 10^10": (lambda d, k: d["distributedInfo"].update(world_size=10**10), "distributedInfo.world_size"),
    "pg_config.ranks an int": (lambda d, k: d["distributedInfo"].update(
        pg_config=[{"pg_name": "0", "pg_size": 2, "ranks": 2}]), "pg_config[0].ranks"),
    "a malformed ProfilerStep": (lambda d, k: d["traceEvents"][0].update(ts=-1), "ProfilerStep"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_bad_event_is_refused_naming_file_event_and_field(tmp_path, name):
    mutate, words = CASES[name]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(_with(mutate)))
    with pytest.raises(TraceError) as e:
        read_job(tmp_path, jobs=1, use_cache=False)
    msg = str(e.value)
    assert words in msg and str(tmp_path) in msg, msg
    if "distributedInfo" not in msg:
        assert "event #" in msg


def test_the_command_exits_2_on_a_negative_kernel_duration(tmp_path):
    (tmp_path / "rank0.json").write_text(json.dumps(_with(CASES["negative duration"][0])))
    r = cli(tmp_path, env={"PREFLIGHT_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 2 and "Traceback" not in r.stderr and "rank0.json: event #" in r.stderr, r.stderr


def test_a_few_bad_events_among_many_are_counted_in_the_quality_table(tmp_path):
    t = three_steps(rank=0, world=1)
    for i in range(200):                                            # 200 healthy kernels, then one bad one
        t.kernel("vectorized_elementwise_kernel", 700 + i, 1, launch=650)
    doc = t.doc()
    doc["traceEvents"].append({"ph": "X", "cat": "kernel", "name": "gemm", "ts": 1, "dur": -3, "args": {}})
    doc["traceEvents"].append("a string where an event belongs")
    (tmp_path / "rank0.json").write_text(json.dumps(doc))
    a = T.audit_traces(tmp_path, jobs=1)
    limits = " ".join(a["quality"][0]["limits"])
    assert "dropped as malformed: 1 x GPU event, field dur (first: event #" in limits
    assert "dropped as malformed: 1 x entry, field traceEvents[i]" in limits


@pytest.mark.parametrize("name,words", [("shapes of strings", "Input Dims"), ("negative shapes", "Input Dims")])
def test_bad_shapes_are_counted_not_multiplied(tmp_path, name, words):
    t = three_steps(rank=0, world=1)
    dims = [["a", "b"], ["c", "d"]] if name == "shapes of strings" else [[-4096, 4096], [4096, 4096]]
    t.cpu("aten::mm", 110, 10, **{"Input Dims": dims, "Input type": ["c10::BFloat16"] * 2})
    (tmp_path / "rank0.json").write_text(json.dumps(t.doc()))
    a = T.audit_traces(tmp_path, jobs=1)
    assert a["ranks"][0]["mfu"] is None and any(words in x for x in a["quality"][0]["limits"])


def test_absurd_shapes_do_not_make_mfu_pass(tmp_path):
    t = three_steps(rank=0, world=1)
    t.cpu("aten::mm", 110, 10, **{"Input Dims": [[2**30, 2**30], [2**30, 2**30]], "Input type": ["c10::BFloat16"] * 2})
    (tmp_path / "rank0.json").write_text(json.dumps(t.doc()))
    a = T.audit_traces(tmp_path, jobs=1)
    f = {x.id: x for x in T.baseline(a)}["baseline/trace_mfu"]
    assert a["ranks"][0]["mfu"] is None and f.verdict == "info" and "above" in f.message


def test_deep_nesting_and_strings_in_trace_events(tmp_path):
    (tmp_path / "rank0.json").write_text('{"traceEvents": [], "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(TraceError, match="nested deeper"):
        read_job(tmp_path, jobs=1, use_cache=False)


def test_a_file_for_a_folder_and_a_summary_without_its_file(tmp_path):
    path = three_steps().write(tmp_path / "rank0.json")
    with pytest.raises(TraceError, match="is a file: pass its folder"):
        read_job(path, jobs=1)
    d = tmp_path / "sums"
    d.mkdir()
    s = summarize(read_trace(path))
    del s["meta"]["file"]
    (d / "rank0.summary.json").write_text(json.dumps(s))
    r = cli(d)
    assert r.returncode == 2 and "meta.file" in r.stderr and "Traceback" not in r.stderr, r.stderr


# --- the property: real traces' events mutated --------------------------------------------------------------

def _real_traces() -> list[tuple[str, dict]]:
    paths = sorted((REPO / "data/traces/example").glob("*.json.gz"))
    shared = REPO.parent / "shared" / "traces"
    if shared.is_dir():
        paths += sorted(p for p in shared.rglob("*.json*"))
    out = []
    keep = ("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver")
    for p in paths:
        doc = json.loads(gzip.decompress(p.read_bytes()) if p.name.endswith(".gz") else p.read_bytes())
        evs = doc["traceEvents"]
        steps = [e for e in evs if str(e.get("name", "")).startswith("ProfilerStep#")]
        rest = [e for e in evs if e.get("cat") in keep or str(e.get("name", "")).startswith(
            ("nccl:", "gloo:", "record_param_comms", "aten::mm", "aten::addmm", "aten::bmm"))]
        doc["traceEvents"] = steps + rest[:400]            # every step, the first 400 read events: fast to mutate
        out.append((p.parent.name + "/" + p.name, doc))
    return out


REAL = _real_traces()
NASTY = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.sampled_from([2**63, 2**64, -1, 0, 10**10, 10**6 + 1]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6),
    st.lists(st.integers(-5, 2**40), max_size=3),
    st.lists(st.lists(st.one_of(st.integers(-3, 2**33), st.text(max_size=2)), max_size=3), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
FIELDS = ["ts", "dur", "name", "cat", "ph", "args", "tid", "args.stream", "args.correlation", "args.Input Dims",
          "args.Input type", "args.Group size", "args.In msg nelems", "args.bytes", "args.Seq",
          "args.Process Group Name", "args.Collective name", "args.dtype"]
TOP = ["distributedInfo.rank", "distributedInfo.world_size", "distributedInfo.pg_config", "deviceProperties"]


@st.composite
def mutation(draw):
    doc_i = draw(st.integers(0, len(REAL) - 1))
    edits = draw(st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(FIELDS + TOP + ["event", "drop"]), NASTY),
                          min_size=1, max_size=3))
    return doc_i, edits


def _apply(doc: dict, edits) -> dict:
    doc = json.loads(json.dumps(doc))
    evs = doc["traceEvents"]
    for where, fld, value in edits:
        if fld in TOP:
            top, _, key = fld.partition(".")
            if key:
                if not isinstance(doc.get(top), dict):
                    doc[top] = {}
                doc[top][key] = value
            else:
                doc[top] = value
            continue
        i = where % len(evs)
        if fld == "event":
            evs[i] = value
        elif not isinstance(evs[i], dict):
            continue
        elif fld == "drop":
            evs[i].pop(sorted(evs[i])[where % len(evs[i])], None) if evs[i] else None
        elif fld.startswith("args."):
            if not isinstance(evs[i].get("args"), dict):
                evs[i]["args"] = {}
            evs[i]["args"][fld[5:]] = value
        else:
            evs[i][fld] = value
    return doc


@pytest.mark.skipif(not REAL, reason="no real trace to mutate")
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutation())
def test_mutated_real_traces_are_refused_cleanly_or_judged_within_range(tmp_path_factory, m):
    doc_i, edits = m
    name, doc = REAL[doc_i]
    path = Path("/nonexistent-folder") / "rank-0.json"
    raw = json.dumps(_apply(doc, edits)).encode()
    try:
        a, found = judge_raw(path, raw)
    except TraceError as e:
        assert str(path) in str(e) or "/nonexistent-folder" in str(e), (name, edits, str(e))
        return
    assert_sane(a, found)


@pytest.mark.skipif(not REAL, reason="no real trace to mutate")
def test_every_real_trace_unmutated_is_judged_within_range():
    for name, doc in REAL:
        a, found = judge_raw(Path("/x") / "rank-0.json", json.dumps(doc).encode())
        assert_sane(a, found)
        assert not a["quality"][0]["limits"] or not any("malformed" in x for x in a["quality"][0]["limits"]), name


def test_trace_builder_events_are_valid(tmp_path):
    a = T.audit_traces(Trace(rank=0, world=1).step(1, 0, 10).step(2, 10, 10).kernel("gemm", 1, 2).write(
        tmp_path / "rank0.json").parent, jobs=1)
    assert not any("malformed" in x for x in a["quality"][0]["limits"])
