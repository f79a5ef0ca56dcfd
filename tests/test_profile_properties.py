"""Property-based tests of the profile schema (hypothesis): every malformed profile gives exit 2 from
``validate`` and ``audit --plan-only``, one ``error:`` message that names the field, no traceback, and
nothing written to ``--out``. The bulk runs ``preflight.cli.main`` in-process; a fixed sample of 20
runs as real subprocesses. The number of distinct malformed files tried is printed at the end."""
import contextlib
import copy
import hashlib
import io
import re
import subprocess
import sys
import tempfile
import typing
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from conftest import EXAMPLE, REPO
from preflight import cli
from preflight.core.hardware import CHIPS
from preflight.core.profile import Profile

BASE = yaml.safe_load(EXAMPLE.read_text())
CFG = settings(deadline=None, derandomize=True, database=None,     # same examples each run: counts are stable
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])


def cfg(n: int) -> settings:
    return settings(CFG, max_examples=n)


TRIED: set[str] = set()        # sha1 of each malformed file run in-process
SUBPROCESS: set[str] = set()   # ... and through real subprocesses
BOOL_WORDS = {"true", "false", "yes", "no", "on", "off", "t", "f", "y", "n", "1", "0"}


def _is_section(info) -> bool:
    return isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)


SECTIONS = {n: i.annotation for n, i in Profile.model_fields.items() if _is_section(i)}
LEAVES = {f"{s}.{k}": i for s, m in SECTIONS.items() for k, i in m.model_fields.items()} | {
    n: i for n, i in Profile.model_fields.items() if not _is_section(i)}


def _kind(info):
    ann = info.annotation
    if typing.get_origin(ann) is typing.Literal:
        return "literal"
    args = [a for a in typing.get_args(ann) if a is not type(None)]
    return (args[0] if args else ann).__name__          # int | float | str | bool


def _bounds(info) -> dict:
    return {a: getattr(m, a) for m in info.metadata for a in ("ge", "gt", "le", "lt", "max_length", "pattern")
            if getattr(m, a, None) is not None}


WORDS = st.text("abcdefghijklmnopqrstuvwxyzXYZ_ .", min_size=1, max_size=20).filter(   # never a number, bool, auto
    lambda s: s.strip().lower() not in BOOL_WORDS | {"auto", "nan", "inf", "infinity"})
NON_FINITE = st.sampled_from([float("nan"), float("inf"), float("-inf"), "nan", "-Infinity"])
CONTAINERS = st.one_of(st.lists(st.integers(), max_size=3), st.dictionaries(WORDS, st.integers(), min_size=1, max_size=2))
HUGE_STR = st.integers(10_001, 200_000).map(lambda n: "x" * n)


def bad_value(path: str) -> st.SearchStrategy:
    """Values that ``path`` must refuse, from its type and bounds in the schema."""
    info = LEAVES[path]
    kind, b = _kind(info), _bounds(info)
    if kind in ("int", "float"):
        num = st.integers if kind == "int" else (lambda **kw: st.floats(allow_nan=False, allow_infinity=False, **kw))
        opts = [NON_FINITE, WORDS, CONTAINERS, st.booleans(), HUGE_STR, st.just(10 ** 400), st.just(-(10 ** 400))]
        lo, hi = b.get("ge", b.get("gt")), b.get("le", b.get("lt"))
        opts.append(num(max_value=lo).filter(lambda x: x < lo or ("gt" in b and x == lo)))
        opts.append(num(min_value=hi).filter(lambda x: x > hi or ("lt" in b and x == hi)))
        if kind == "int":
            opts.append(st.floats(lo, min(hi, 1e15)).filter(lambda x: x != int(x)))     # 2.5 GPUs
        return st.one_of(opts)
    if kind == "bool":
        return st.one_of(WORDS, st.integers().filter(lambda x: x not in (0, 1)), CONTAINERS, NON_FINITE)
    if kind == "literal":
        return st.one_of(WORDS.filter(lambda s: s not in typing.get_args(info.annotation)), st.integers(), CONTAINERS)
    opts = [st.integers(), st.floats(allow_nan=False), CONTAINERS, st.booleans()]          # str fields
    if "max_length" in b:
        opts.append(st.integers(b["max_length"] + 1, b["max_length"] + 100_000).map(lambda n: "y" * n))
    if path == "project":
        opts += [st.just(""), st.text(min_size=65, max_size=300, alphabet="ab"),
                 st.text(min_size=1, max_size=30).filter(lambda s: not re.fullmatch(b["pattern"], s))]
    if path == "cluster.gpu":
        opts.append(WORDS.filter(lambda s: s not in CHIPS))
    if path == "data.scratch_dir":
        opts.append(WORDS.filter(lambda s: not s.startswith("/")))
    return st.one_of(opts)


def _set(data: dict, path: str | None = None, value=None, **changes) -> dict:
    """A copy of ``data`` with ``path`` (or each ``section__field`` of ``changes``) set; KeyError deletes."""
    d = copy.deepcopy(data)
    changes = ({path: value} if path else {}) | {k.replace("__", "."): v for k, v in changes.items()}
    for p, v in changes.items():
        *parents, last = p.split(".")
        node = d
        for k in parents:
            node = node.setdefault(k, {})
        if v is KeyError:
            node.pop(last, None)
        else:
            node[last] = v
    return d


def _dump(data) -> bytes:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True).encode("utf-8")


def _main(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


def _assert_clear(code, stdout: str, stderr: str, expect: tuple[str, ...], what: str) -> None:
    assert code == 2, (what, code, stderr[-2000:])
    assert "Traceback" not in stderr, (what, stderr[-2000:])
    assert [ln for ln in stderr.splitlines() if ln.startswith("error:")] == [stderr.splitlines()[0]], (what, stderr)
    assert any(e in stderr for e in expect), (what, expect, stderr)
    assert len(stderr) < 4000, (what, "message too long", len(stderr))     # huge values are cut
    assert stdout == "", (what, stdout)


def check(raw: bytes, *expect: str) -> str:
    """Both commands, in-process: exit 2, one clear message naming one of ``expect``, nothing written.
    Returns the message."""
    TRIED.add(hashlib.sha1(raw).hexdigest())
    with tempfile.TemporaryDirectory() as d:
        prof, out = Path(d) / "p.yaml", Path(d) / "out"
        prof.write_bytes(raw)
        for argv in (["validate", str(prof)], ["audit", str(prof), "--plan-only", "--out", str(out)]):
            code, stdout, stderr = _main(argv)
            _assert_clear(code, stdout, stderr, expect, argv[0])
            assert not out.exists(), "nothing may be written for a bad profile"
    return stderr


@cfg(300)
@given(data=st.data())
def test_bad_field_value_is_named(data):
    path = data.draw(st.sampled_from(sorted(LEAVES)), label="field")
    value = data.draw(bad_value(path), label="value")
    check(_dump(_set(BASE, path, value)), path)


FLOATS = sorted(p for p, i in LEAVES.items() if _kind(i) == "float")


@cfg(60)
@given(path=st.sampled_from(FLOATS), value=st.sampled_from([float("nan"), float("inf"), float("-inf"), ".nan", "inf"]))
def test_nan_and_inf_are_refused_as_not_finite(path, value):
    raw = _dump(_set(BASE, path, value)).replace(b"'.nan'", b".nan")          # YAML's own .nan too
    assert "should be a finite number" in check(raw, f"{path} = ")


@cfg(10)
@given(path=st.sampled_from(["project", "model", "model.params", "model.layers", "model.hidden", "model.seq_len"]))
def test_missing_required_field_is_named(path):
    check(_dump(_set(BASE, path, KeyError)), f"{path} = (missing)")


@cfg(40)
@given(section=st.sampled_from(["", *SECTIONS]),
       key=st.from_regex(r"[a-z][a-z0-9_]{0,30}", fullmatch=True))
def test_unknown_key_is_named(section, key):
    path = f"{section}.{key}" if section else key
    assume(path not in LEAVES and key not in SECTIONS)
    check(_dump(_set(BASE, path, 1)), f"{path} = 1: unknown field")


@cfg(40)
@given(leaf=st.sampled_from(sorted(p for p in LEAVES if "." in p)), to=st.sampled_from(["", *SECTIONS]))
def test_field_in_the_wrong_section_is_named(leaf, to):
    section, key = leaf.split(".")
    new = f"{to}.{key}" if to else key
    assume(to != section and key not in SECTIONS and new not in LEAVES)
    check(_dump(_set(_set(BASE, leaf, KeyError), new, BASE[section].get(key, 1))), f"{new} = ")


@cfg(30)
@given(section=st.sampled_from(sorted(SECTIONS)),
       value=st.one_of(WORDS, st.integers(), st.lists(st.integers(), min_size=1, max_size=3)))
def test_section_that_is_not_a_mapping(section, value):
    check(_dump(_set(BASE, section, value)), f"{section} = ")


@cfg(25)
@given(doc=st.one_of(st.lists(st.integers(), min_size=1), WORDS, st.integers(), st.floats(), st.booleans()))
def test_top_level_that_is_not_a_mapping(doc):
    check(_dump(doc), "at the top level")


BREAKERS = ["key: [unclosed", 'notes: "unterminated', "\tmodel: {", "}: ]", "- [a, b\n: c", "%YAML 9.9\n---"]


@cfg(40)
@given(line=st.integers(0, 60), breaker=st.sampled_from(BREAKERS))
def test_invalid_yaml_text(line, breaker):
    lines = EXAMPLE.read_text().splitlines()
    lines.insert(min(line, len(lines)), breaker)
    text = "\n".join(lines)
    try:
        yaml.safe_load(text)
        assume(False)                   # still readable: another test's case
    except yaml.YAMLError:
        pass
    check(text.encode(), "not readable YAML")


@cfg(30)
@given(at=st.integers(0, 2000), junk=st.binary(min_size=1, max_size=8))
def test_non_utf8_bytes(at, junk):
    raw = EXAMPLE.read_bytes()
    raw = raw[:at] + b"\xff" + junk + raw[at:]
    check(raw, "not UTF-8")


@cfg(10)
@given(section=st.sampled_from(sorted(SECTIONS)))
def test_duplicate_key(section):
    text = EXAMPLE.read_text() + f"\n{section}:\n  {next(iter(SECTIONS[section].model_fields))}: 1\n"
    check(text.encode(), f"key '{section}' appears twice")


@pytest.mark.parametrize("raw,expect", [(b"", "empty"), (b"# only a comment\n", "empty"),
                                        (b"[" * 50_000, "nested too deeply"), (b"a: 1\n---\nb: 2\n", "not readable YAML"),
                                        (b"project: x\x00\nmodel: {}\n", "not readable YAML")])
def test_edge_files(raw, expect):
    check(raw, expect)


# -- rules across fields: each value in range, the combination impossible -----------------------------

@cfg(40)
@given(gpn=st.integers(1, 64), nodes=st.integers(1, 64), tp=st.integers(1, 1024), pp=st.integers(1, 1024))
def test_tp_pp_not_dividing_gpus(gpn, nodes, tp, pp):
    assume((gpn * nodes) % (tp * pp))
    check(_dump(_set(BASE, cluster__gpus_per_node=gpn, cluster__nodes=nodes, training__tp=tp, training__pp=pp)),
          "training.tp * training.pp")


@cfg(40)
@given(hidden=st.integers(8, 1_000_000), heads=st.integers(1, 100_000))
def test_heads_not_dividing_hidden(hidden, heads):
    assume(hidden % heads)
    check(_dump(_set(BASE, model__hidden=hidden, model__heads=heads)), f"model.heads = {heads} must divide")


@cfg(30)
@given(heads=st.integers(0, 500).map(lambda k: 2 * k + 1), k=st.integers(1, 100), tp_log2=st.integers(1, 10))
def test_tp_not_dividing_heads(heads, k, tp_log2):
    assume(8 <= heads * k <= 1_000_000)
    check(_dump(_set(BASE, model__hidden=heads * k, model__heads=heads, training__tp=2 ** tp_log2)), "training.tp = ")


@cfg(20)
@given(schedule=st.sampled_from(["gpipe", "1f1b"]), v=st.integers(2, 128))
def test_interleave_without_interleaved_schedule(schedule, v):
    check(_dump(_set(BASE, training__pipeline_schedule=schedule, training__interleave=v)), "training.interleave")


@cfg(20)
@given(pp_log2=st.integers(1, 10), m=st.integers(1, 100_000))
def test_interleaved_microbatches_not_multiple_of_pp(pp_log2, m):
    assume(m % 2 ** pp_log2)
    d = _set(BASE, training__pipeline_schedule="interleaved", training__pp=2 ** pp_log2, training__microbatches=m,
             training__interleave=2)
    check(_dump(d), "training.microbatches")


# -- a fixed sample through real subprocesses: the CLI as a user runs it --------------------------------

SAMPLE = [(_dump(_set(BASE, p, v)), p) for p, v in [
    ("model.params", float("nan")), ("cluster.walltime_h", float("inf")), ("training.step_serial_s", -1.0),
    ("cluster.nodes", "many"), ("cluster.nodes", True), ("training.tp", 2.5), ("model.layers", 10 ** 400),
    ("notes", "n" * 50_000), ("model.vocab", [1, 2]), ("data.storage", "tape"), ("measure", "sometimes"),
    ("model.hidden", KeyError), ("cluster.colour", "red"), ("training", "fast"),
    ("cluster.node_failure_per_day", 1.0), ("training.checkpoint_interval_s", "-inf")]] + [
    (_dump([1, 2]), "top level"), (b"model: [unclosed\n", "not readable YAML"), (b"\xff\xfeproject: x\n", "not UTF-8"),
    (_dump(_set(BASE, "training.tp", 3)), "training.tp * training.pp")]


def _subprocess(raw: bytes, expect: str, d: Path) -> None:
    prof, out = d / "p.yaml", d / "out"
    prof.write_bytes(raw)
    for argv in (["validate", prof], ["audit", prof, "--plan-only", "--out", out]):
        r = subprocess.run([sys.executable, "-m", "preflight", *map(str, argv)], cwd=REPO, capture_output=True,
                           text=True, timeout=300)
        _assert_clear(r.returncode, r.stdout, r.stderr, (expect,), f"subprocess {argv[0]}")
        assert not out.exists()


def test_sample_through_subprocesses(tmp_path):
    assert len(SAMPLE) == 20
    dirs = [tmp_path / str(i) for i in range(len(SAMPLE))]
    [d.mkdir() for d in dirs]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(_subprocess, *zip(*SAMPLE), dirs))
    SUBPROCESS.update(hashlib.sha1(raw).hexdigest() for raw, _ in SAMPLE)


@pytest.fixture(scope="module", autouse=True)
def _report_counts(request):
    yield
    line = (f"malformed profiles tried: {len(TRIED)} distinct in-process (validate + audit --plan-only each), "
            f"{len(SUBPROCESS)} through subprocesses; all exit 2 with one clear message")
    capman = request.config.pluginmanager.get_plugin("capturemanager")
    with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
        print(f"\n{line}")
