"""``preflight compare OLD_DIR NEW_DIR``: before/after of two real audits, its refusals (exit 2,
nothing written), escaping; and the command line's typo suggestions."""
import json
import shutil

import pytest
import yaml

from conftest import EXAMPLE, run_cli
from preflight.reporting import compare
from preflight.reporting.report import external_refs, load_findings


@pytest.fixture(scope="module")
def audits(tmp_path_factory):
    """OLD: the example plan, chapters 1-2. NEW: ZeRO-1 + selective recompute (the memory plan now
    fits), notes with markup, chapters 1 and 5. So: changed findings, one verdict fail -> pass,
    chapter 2's findings only in OLD, chapter 5's only in NEW."""
    tmp = tmp_path_factory.mktemp("compare")
    d = yaml.safe_load(EXAMPLE.read_text())
    d["training"]["zero_stage"] = 1
    d["training"]["activation_recompute"] = "selective"
    d["notes"] = "<script>alert('x')</script> & <b>after</b>"
    prof = tmp / "zero1.yaml"
    prof.write_text(yaml.safe_dump(d))
    old, new = tmp / "old", tmp / "new"
    for profile, out, chapters in ((EXAMPLE, old, "1,2"), (prof, new, "1,5")):
        r = run_cli("audit", profile, "--out", out, "--plan-only", "--chapters", chapters)
        assert r.returncode == 0, r.stdout + r.stderr
    return old, new


def _copy(src, dst, **changes):
    """A copy of an audit folder with top-level findings.json fields replaced."""
    shutil.copytree(src, dst)
    d = json.loads((dst / "findings.json").read_text())
    d.update(changes)
    (dst / "findings.json").write_text(json.dumps(d))
    return dst


def test_compare_two_real_audits(audits):
    old, new = audits
    (new / "compare.html").unlink(missing_ok=True)
    r = run_cli("compare", old, new)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stderr == ""                             # same project, mode, machine: no warning
    lines = {ln.split()[0]: ln for ln in r.stdout.splitlines() if ln.strip()}
    fits = lines["baseline/memory_fits"].split()
    assert fits[-4:] == ["fail", "->", "pass", "improved"]
    # the number: the per-GPU memory shrinks, shown absolute (GiB, as the report's memory plan) and relative
    per_gpu = lines["baseline/memory_per_gpu"].split()
    assert per_gpu[2::2][:3] == ["GiB"] * 3 and per_gpu[5].startswith("-") and per_gpu[7].endswith("%"), per_gpu
    assert lines["baseline/amdahl_max_speedup"].split()[-1] == "same"
    assert "only in OLD" in r.stdout and "data_pipeline/listing_s_at_profile" in lines
    assert "only in NEW" in r.stdout and "fault_tolerance/mtbf_h" in lines
    assert "baseline" in lines and f"compare: {new / 'compare.html'}" in r.stdout
    html = (new / "compare.html").read_text()
    assert "<tr id='baseline/memory_fits'>" in html and "ch-improved" in html
    assert "Only in OLD" in html and "Only in NEW" in html
    assert "href='index.html'" in html and "href='../old/index.html'" in html
    assert external_refs(html) == [] and "<script" not in html.lower()
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &lt;b&gt;after&lt;/b&gt;" in html
    assert "@media print" in html


def test_compare_out_folder_and_different_projects(tmp_path, audits):
    old, new = audits
    other = _copy(new, tmp_path / "other", project="another-project")
    (other / "compare.html").unlink(missing_ok=True)
    r = run_cli("compare", old, other, "--out", tmp_path / "cmp" / "deep")
    assert r.returncode == 0, r.stderr
    assert "warning: different projects" in r.stderr and "'another-project'" in r.stderr
    assert (tmp_path / "cmp" / "deep" / "compare.html").exists() and not (other / "compare.html").exists()
    html = (tmp_path / "cmp" / "deep" / "compare.html").read_text()
    assert "Warning:</b> different projects" in html and "llm-7b-pretrain vs another-project" in html


def test_bad_input_exits_2_and_writes_nothing(tmp_path, audits):
    old, new = audits
    broken = tmp_path / "broken"
    shutil.copytree(new, broken)
    (broken / "compare.html").unlink(missing_ok=True)
    d = json.loads((broken / "findings.json").read_text())
    d["findings"][3]["verdict"] = "great"
    (broken / "findings.json").write_text(json.dumps(d))
    (tmp_path / "empty").mkdir()
    (tmp_path / "afile").write_text("x")
    cases = [
        ((old, tmp_path / "missing"), ["NEW_DIR", "missing", "no such file or folder"]),
        ((tmp_path / "empty", new), ["OLD_DIR", "no findings.json"]),
        ((old, broken), ["NEW_DIR", "$.findings[3].verdict", "'great'"]),
        ((old, new, "--out", tmp_path / "afile"), ["--out", "not a folder"]),
    ]
    for args, names in cases:
        r = run_cli("compare", *args, "--out", tmp_path / "o") if "--out" not in args else run_cli("compare", *args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr and r.stdout == ""
        for part in names:
            assert part in r.stderr, (part, r.stderr)
    assert not (tmp_path / "o").exists() and not (broken / "compare.html").exists()


def test_rows_changes_and_marks():
    f = lambda v, verdict, unit="s": {"id": "a/x", "value": v, "verdict": verdict, "unit": unit}  # noqa: E731
    r = compare.Row("a/x", f(10.0, "fail"), f(4.0, "pass"))
    assert r.delta == -6 and r.relative == pytest.approx(-0.6) and r.mark == "improved"
    assert compare.Row("a/x", f(0.0, "pass"), f(1.0, "warn")).relative is None          # from 0: no ratio
    assert compare.Row("a/x", f(None, "info"), f(1.0, "fail")).delta is None
    assert compare.Row("a/x", f(1.0, "info"), f(1.0, "fail")).mark == "changed"          # newly judged
    assert compare.Row("a/x", f(1.0, "warn"), f(2.0, "warn")).mark == "same"
    assert compare.Row("a/x", f(1.0, "s"), f(1.0, "s", "bytes")).delta is None           # unit changed
    assert compare.mark("pass", "error") == "worse" and compare.mark(None, "pass") == ""
    assert compare.fmt_delta(-0.05, "fraction") == "-5.0 pp" and compare.fmt_delta(2e9, "bytes") == "+2 GB"
    assert compare.fmt_delta(0.0, "x") == "0" and compare.fmt_rel(0.25) == "+25.0%"


def test_old_id_prefixes_match_the_current_ones():
    """An audit with the ids of before the prefix rename (comm/, data/, ...; tests/data/findings-v0-ids.json)
    pairs with the same audit under today's ids (tests/test_registry.py: against a fresh audit)."""
    from conftest import REPO
    from preflight.chapters.registry import current_id

    old = load_findings(REPO / "tests" / "data" / "findings-v0-ids.json")
    new = old | {"findings": [f | {"id": current_id(f["id"])} for f in old["findings"]]}
    assert any(f["id"].startswith("comm/") for f in old["findings"])
    rows, only_old, only_new = compare.match(old, new)
    assert only_old == only_new == [] and len(rows) == len(old["findings"])
    assert all(r.mark == "same" and r.old["id"] == r.new["id"] == r.id for r in rows)
    assert "communication/allreduce_s" in {r.id for r in rows}
    assert "0 only in OLD, 0 only in NEW" in compare.text_report(old, new)


def test_compare_page_escapes_user_strings(tmp_path, audits):
    old, new = audits
    a, b = load_findings(old), load_findings(new)
    b["project"] = "<img src=x onerror=alert(1)>"
    b["notes"] = "</td><script>alert(2)</script>"
    html = compare.compare_html(a, b, old, new, tmp_path)
    assert "<img" not in html and "<script" not in html.lower()
    assert "&lt;img src=x onerror=alert(1)&gt;" in html and "&lt;/td&gt;&lt;script&gt;alert(2)" in html


# --- the command line: a typo gets a suggestion, exit 2, no traceback -------------------------------

@pytest.mark.parametrize("args, hint", [
    (["audti", str(EXAMPLE)], "did you mean 'audit'?"),
    (["audit", str(EXAMPLE), "--plan-onyl"], "did you mean '--plan-only'?"),
    (["audit", "--plan-onyl", str(EXAMPLE)], "did you mean '--plan-only'?"),
    (["audit", str(EXAMPLE), "--fail-on", "fial"], "did you mean 'fail'?"),
    (["compaer", "a", "b"], "did you mean 'compare'?"),
    (["compare", "a", "b", "--ot", "c"], "did you mean '--out'?"),
])
def test_typos_get_a_suggestion(tmp_path, args, hint):
    r = run_cli(*args, cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert hint in r.stderr and "Traceback" not in r.stderr
    assert not list(tmp_path.iterdir()), "nothing written on bad input"


def test_no_suggestion_when_nothing_is_close():
    r = run_cli("xyzzy")
    assert r.returncode == 2 and "invalid choice" in r.stderr and "did you mean" not in r.stderr


def _summary(*findings):
    return {"findings": [{"id": i, "value": v, "unit": "fraction", "verdict": verdict, "source": src,
                          "threshold": "pass >= 40%, fail < 30%", "noise": noise}
                         for i, v, verdict, src, noise in findings]}


def test_regressions_verdicts_and_noise_from_the_repeats():
    m = "measured on NVIDIA H100"
    old = _summary(("baseline/mfu", 0.45, "pass", m, 0.04), ("baseline/x", 0.45, "pass", m, None),
                   ("baseline/y", 0.50, "pass", "computed from profile", None),
                   ("baseline/z", 0.45, "pass", m, 0.02))
    # mfu -3 % (inside its 4 % noise): not a regression; x -10 % without recorded noise: verdict only;
    # y pass -> fail: a regression whatever its source; z -5 % beyond its noise (2 %, 3 % new): regression
    new = _summary(("baseline/mfu", 0.4365, "pass", m, 0.03), ("baseline/x", 0.405, "pass", m, None),
                   ("baseline/y", 0.20, "fail", "computed from profile", None),
                   ("baseline/z", 0.4275, "pass", m, 0.03))
    found = dict(compare.regressions(old, new))
    assert set(found) == {"baseline/y", "baseline/z"}
    assert "pass -> fail" in found["baseline/y"] and "noise of 3.0%" in found["baseline/z"]
    assert compare.regressions(new, new) == []
    better = _summary(("baseline/z", 0.60, "pass", m, 0.01))     # the right way: never a regression
    assert compare.regressions(_summary(("baseline/z", 0.45, "pass", m, 0.01)), better) == []


def test_fail_on_regression_exit_codes(audits, tmp_path):
    old, new = audits
    r = run_cli("compare", old, new, "--out", tmp_path / "a", "--fail-on-regression")
    assert r.returncode == 0, r.stdout + r.stderr           # memory fail -> pass: better, nothing worse
    r = run_cli("compare", new, old, "--out", tmp_path / "b", "--fail-on-regression")
    assert r.returncode == 1 and "regression: baseline/memory_fits: verdict pass -> fail" in r.stdout


def test_memory_in_gib_as_the_report_writes_it():
    """compare writes each value as the report does: memory in GiB (the memory plan's unit), other bytes
    in GB, a ratio judged in percent as a percentage."""
    mem = lambda v: {"id": "baseline/peak_memory", "value": v, "unit": "bytes", "verdict": "pass",  # noqa: E731
                     "source": "measured", "threshold": "below the device memory"}
    head = {"project": "p", "mode": "measure", "date": "2026-12-01", "chapters": []}
    old, new = head | {"findings": [mem(40 * 2 ** 30)]}, head | {"findings": [mem(42 * 2 ** 30)]}
    text = compare.text_report(old, new)
    assert "40.0 GiB" in text and "42.0 GiB" in text and "+2.0 GiB" in text and " GB" not in text
    assert compare.fmt_delta(2e9, "bytes") == "+2 GB"                 # other bytes: decimal GB
