"""Every layer names a chapter as the registry does (preflight.chapters.registry): the files it lists
exist, the playbook and its sources are the registry's chapters under the registry's titles, every
finding id of a plan-only audit starts with its chapter's prefix, an audit with the ids of before the
prefix rename still compares finding by finding, and README / docs name every chapter and module."""
import json
import re
import shutil

import pytest

from conftest import EXAMPLE, REPO, run_cli
from preflight.chapters import registry as R
from preflight.runner.audit import discover, notebook_title

# Renames another change makes: the registry's target -> the file that still stands in for it.
# Delete the line once the rename is done (the test then fails while the line stays).
PENDING: dict[str, str] = {}
OLD_IDS = REPO / "tests" / "data" / "findings-v0-ids.json"     # a plan-only audit before the rename


def _path(module: str) -> str:
    """``preflight.bench.datapipe`` -> ``lib/preflight/bench/datapipe.py``."""
    return "lib/" + module.replace(".", "/") + ".py"


def _short(path: str) -> str:
    """How the README's Layout names a file: relative to lib/preflight/ or to tools/."""
    return path.removeprefix("lib/preflight/").removeprefix("tools/")


def _files(c: R.Chapter) -> list[str]:
    return [c.source, c.notebook, *map(_path, c.modules), *c.tests]


@pytest.mark.parametrize("c", R.CHAPTERS, ids=lambda c: c.name)
def test_every_listed_file_exists(c):
    missing = []
    for f in _files(c):
        if (REPO / f).is_file():
            assert f not in PENDING, f"{f} exists: remove it from PENDING (and {PENDING[f]} if still there)"
        elif not (f in PENDING and (REPO / PENDING[f]).is_file()):
            missing.append(f)
    assert not missing, f"chapter {c.number} {c.name}: listed in the registry but missing: {missing}"


def test_numbers_names_and_prefixes():
    assert [c.number for c in R.CHAPTERS] == list(range(1, len(R.CHAPTERS) + 1))
    names = [c.name for c in R.CHAPTERS]
    assert len(set(names)) == len(names) and all(re.fullmatch(r"[a-z][a-z0-9_]*", n) for n in names)
    for c in R.CHAPTERS:          # one name in every layer
        assert c.prefix == c.name
        assert c.audit[0] == f"preflight.chapters.{c.name}"
        assert c.widgets in (None, f"preflight.widgets.{c.name}")
        assert f"tests/test_chapter_{c.name}.py" in c.tests
        assert c.title and c.pitfall and not c.title.lower().startswith("chapter")
    assert R.BY_NUMBER == {c.number: c for c in R.CHAPTERS} and R.BY_NAME == {c.name: c for c in R.CHAPTERS}


def test_exercises_per_chapter():
    from preflight.chapters import exercises as X

    for c in R.CHAPTERS:
        module, _, fn = c.exercises.rpartition(".")
        assert module == X.__name__ and callable(getattr(X, fn, None)), c.exercises


def test_widgets_package_exports_every_chapter_module():
    """preflight.widgets imports each chapter's sliders module (the notebooks import from the package)."""
    text = (REPO / "lib" / "preflight" / "widgets" / "__init__.py").read_text()
    for c in R.CHAPTERS:
        if c.widgets:
            old = PENDING.get(_path(c.widgets), "").removeprefix("lib/").removesuffix(".py").replace("/", ".")
            assert f"from {c.widgets} import" in text or (old and f"from {old} import" in text), c.widgets


def test_playbook_and_sources_are_the_registry():
    nbs = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "playbook").glob("*.ipynb"))
    assert nbs == sorted(c.notebook for c in R.CHAPTERS)
    srcs = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "tools" / "notebooks").glob("*.py"))
    assert srcs == sorted(c.source for c in R.CHAPTERS)
    for c in R.CHAPTERS:
        assert notebook_title(REPO / c.notebook) == c.heading, c.notebook
        src = (REPO / c.source).read_text()
        assert re.search(r"^# # (.+)$", src, re.M).group(1) == c.heading, c.source
        assert re.search(rf"""\bstart\(\s*["']{c.name}["']""", src), f"{c.source} must call start({c.name!r}, ...)"
    assert discover() == {c.number: (c.name, REPO / c.notebook) for c in R.CHAPTERS}


def test_id_aliases():
    current = {c.prefix for c in R.CHAPTERS}
    assert not current & set(R.ID_PREFIX_ALIASES), "an old prefix may not be a current one"
    assert R.ID_PREFIX_ALIASES == {"data": "data_pipeline", "comm": "communication", "balance": "load_balance",
                                   "resilience": "fault_tolerance"}
    assert R.current_id("comm/allreduce_s") == "communication/allreduce_s"
    assert R.current_id("resilience/mtbf_h") == "fault_tolerance/mtbf_h"
    assert R.current_id("baseline/mfu") == "baseline/mfu"
    assert R.current_id("communication/topology") == "communication/topology"
    assert R.current_id("datapipe/x") == "datapipe/x" and R.current_id("data") == "data"


def _layout_section() -> str:
    readme = (REPO / "README.md").read_text()
    return readme[readme.index("## Layout"):].split("\n## ", 1)[0]


def _layout_chapters() -> dict[str, set[str]]:
    """The Layout's per-chapter lines: ``    N name   dir/a.py b.py dir2/c.py ...`` and continuation
    lines; a bare ``b.py`` is in the folder of the token before it on its line (top level if first)."""
    out, cur = {}, None
    for line in _layout_section().splitlines():
        m = re.match(r"^\s+(\d+) ([a-z0-9_]+)\s+(.*)$", line)
        if m:
            cur = out.setdefault(f"{m.group(1)} {m.group(2)}", set())
            rest = m.group(3)
        elif cur is not None and re.match(r"^\s{6,}\S+\.py\b", line):
            rest = line
        else:
            cur = None
            continue
        folder = ""
        for tok in rest.split():
            tok = tok.strip(",;:()")
            if not tok.endswith(".py"):
                continue
            if "/" in tok:
                folder = tok.rsplit("/", 1)[0] + "/"
                cur.add(tok)
            else:
                cur.add(folder + tok)
    return out


def test_readme_layout_names_every_chapter_module():
    listed = _layout_chapters()
    assert set(listed) == {f"{c.number} {c.name}" for c in R.CHAPTERS}, sorted(listed)
    for c in R.CHAPTERS:
        want = {_short(c.source)} | {_short(_path(m)) for m in c.modules}
        got = listed[f"{c.number} {c.name}"]
        assert got == want, (f"README Layout, chapter {c.number} {c.name}: missing {sorted(want - got)}, "
                             f"not in the registry {sorted(got - want)}")
    assert "chapters/registry.py" in _layout_section()


def test_readme_and_facilitator_name_every_chapter():
    readme = (REPO / "README.md").read_text()
    rows = re.findall(r"^\| (\d+) \| ([^|]+?) \| `(\d\d_[a-z0-9_]+)\.ipynb`", readme, re.M)
    assert rows == [(str(c.number), c.pitfall, c.stem) for c in R.CHAPTERS]
    guide = (REPO / "docs" / "facilitator.md").read_text()
    timing = re.findall(r"^\| (\d+) ([a-z ]+) \|", guide, re.M)
    assert timing == [(str(c.number), c.name.replace("_", " ")) for c in R.CHAPTERS]


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    """A plan-only audit of the example profile, all chapters (~30-50 s on 2 cores)."""
    out = tmp_path_factory.mktemp("registry") / "audit"
    r = run_cli("audit", EXAMPLE, "--out", out, "--plan-only")
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def test_plan_only_audit_ids_start_with_their_chapters_prefix(plan):
    s = json.loads((plan / "findings.json").read_text())
    assert [(c["number"], c["name"], c["title"]) for c in s["chapters"]] == [
        (c.number, c.name, c.heading) for c in R.CHAPTERS]
    wrong = [(f["chapter"], f["id"]) for f in s["findings"]
             if f["id"].split("/", 1)[0] != R.BY_NUMBER[f["chapter"]].prefix]
    assert not wrong, f"finding ids outside their chapter's prefix: {wrong}"
    assert {f["chapter"] for f in s["findings"]} == set(R.BY_NUMBER)
    index = (plan / "index.html").read_text()
    assert all(f"pitfall: {c.pitfall}" in index for c in R.CHAPTERS)


def test_check_prints_the_plan_only_audits_findings(plan):
    """``preflight check`` calls the chapters' plan functions directly: the same (chapter, id, verdict,
    value) as the notebooks of a plan-only audit emit, every finding that is not "not measured"."""
    from preflight.core.profile import load_profile
    from preflight.runner import check

    s = json.loads((plan / "findings.json").read_text())
    audited = {(f["chapter"], f["id"]): (f["verdict"], f["value"]) for f in s["findings"]
               if f["source"] != "not measured"}
    checked = {(n, f["id"]): (f["verdict"], f["value"])
               for n, fs in check.plan_findings(load_profile(EXAMPLE), EXAMPLE).items() for f in fs}
    assert checked == audited


def test_compare_matches_every_old_id(plan, tmp_path):
    """An audit written with the old prefixes (data/, comm/, balance/, resilience/) against today's:
    every old finding has its partner, nothing is only in OLD."""
    from preflight.reporting import compare
    from preflight.reporting.report import load_findings

    old = load_findings(OLD_IDS)
    assert {f["id"].split("/")[0] for f in old["findings"]} == {"baseline", *R.ID_PREFIX_ALIASES}
    new = load_findings(plan)
    rows, only_old, only_new = compare.match(old, new)
    assert only_old == []
    assert len(rows) == len(old["findings"])
    assert {r.id for r in rows} == {R.current_id(f["id"]) for f in old["findings"]}
    assert all(r.id.split("/")[0] in R.BY_NAME for r in rows)
    assert sum(r.mark == "same" for r in rows) > len(rows) // 2      # the same plan: mostly unchanged
    old_dir = tmp_path / "old"
    old_dir.mkdir()
    shutil.copy(OLD_IDS, old_dir / "findings.json")
    r = run_cli("compare", old_dir, plan, "--out", tmp_path / "cmp")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "only in OLD (" not in r.stdout and "; 0 only in OLD," in r.stdout
    assert "communication/allreduce_s" in r.stdout and "comm/allreduce_s" not in r.stdout
