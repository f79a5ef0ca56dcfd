"""The report's contract: findings.json against its JSON Schema (real audits pass, broken files are
refused with the JSON path of the problem), and index.html as an audit: facts, the overall verdict and
the fixes that buy the most, verdict table, chapter sections (deciding findings first, the rest
folded, charts titled), print styles, offline, every user string escaped; chapter pages without
heading anchors or notebook-only lines."""
import copy
import json
import re
import shutil

import pytest

from conftest import EXAMPLE, run_cli
from preflight.chapters.registry import CHAPTERS
from preflight.reporting import guidance, report
from preflight.reporting import html as H
from preflight.reporting.report import FindingsError, external_refs, load_findings, validate_findings
from preflight.reporting.tables import prose


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    """A real plan-only audit of the example profile (all chapters, ~30-50 s)."""
    out = tmp_path_factory.mktemp("plan") / "audit"
    r = run_cli("audit", EXAMPLE, "--out", out, "--plan-only")
    assert r.returncode == 0, r.stdout + r.stderr
    return out


@pytest.fixture
def data(plan):
    return json.loads((plan / "findings.json").read_text())


def test_schema_is_valid_draft_2020_12():
    from jsonschema import Draft202012Validator

    schema = json.loads(report.SCHEMA_PATH.read_text())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)
    assert schema["properties"]["schema"]["const"] == report.SCHEMA_TAG


def test_real_plan_only_findings_validate(plan):
    s = load_findings(plan)                          # the folder ...
    assert s == load_findings(plan / "findings.json")  # ... or the file
    assert s["schema"] == "preflight-findings/1" and s["mode"] == "plan-only"
    assert len(s["chapters"]) == len(CHAPTERS) and len(s["findings"]) > 40
    assert any(f["value"] is None for f in s["findings"])    # null is a valid value


def _break(d, how):
    f0 = d["findings"][0]
    if how == "missing field":
        del f0["fix"]
    elif how == "bad verdict":
        f0["verdict"] = "great"
    elif how == "NaN as value string":
        f0["value"] = "NaN"
    elif how == "wrong schema tag":
        d["schema"] = "preflight-findings/0"
    elif how == "id not namespaced":
        f0["id"] = "mfu"
    elif how == "missing machine":
        del d["machine"]
    elif how == "bad mode":
        d["mode"] = "measured"
    elif how == "bad status":
        d["chapters"][1]["status"] = "pending"
    elif how == "unknown finding field":
        f0["details"] = 1
    elif how == "duplicate id":
        d["findings"][1]["id"] = f0["id"]
    elif how == "dangling chapter":
        f0["chapter"] = 42
    return d


@pytest.mark.parametrize("how, names", [
    ("missing field", ["$.findings[0]", "'fix'", "required"]),
    ("bad verdict", ["$.findings[0].verdict", "'great'"]),
    ("NaN as value string", ["$.findings[0].value", "'NaN'", "number"]),
    ("wrong schema tag", ["$.schema", "preflight-findings/0", "preflight-findings/1"]),
    ("id not namespaced", ["$.findings[0].id", "'mfu'"]),
    ("missing machine", ["'machine'", "required"]),
    ("bad mode", ["$.mode", "'measured'"]),
    ("bad status", ["$.chapters[1].status", "'pending'"]),
    ("unknown finding field", ["$.findings[0]", "'details'"]),
    ("duplicate id", ["$.findings[1].id", "appears twice"]),
    ("dangling chapter", ["$.findings[0].chapter", "42"]),
])
def test_malformed_findings_are_refused_naming_the_field(tmp_path, data, how, names):
    bad = tmp_path / "findings.json"
    bad.write_text(json.dumps(_break(copy.deepcopy(data), how)))
    with pytest.raises(FindingsError) as e:
        load_findings(tmp_path)
    msg = str(e.value)
    assert str(bad) in msg
    for part in names:
        assert part in msg, (part, msg)


def test_bare_nan_and_broken_json_are_refused(tmp_path, data):
    d = copy.deepcopy(data)
    d["findings"][2]["value"] = float("nan")         # Python writes NaN; JSON has none
    (tmp_path / "findings.json").write_text(json.dumps(d))
    with pytest.raises(FindingsError, match=r"\$\.findings\[2\]\.value: NaN"):
        load_findings(tmp_path)
    (tmp_path / "findings.json").write_text('{"schema": ')
    with pytest.raises(FindingsError, match="not valid JSON"):
        load_findings(tmp_path)
    with pytest.raises(FindingsError, match="no findings.json in this folder"):
        load_findings(tmp_path / "..")
    with pytest.raises(FindingsError, match="no such file or folder"):
        load_findings(tmp_path / "missing")
    with pytest.raises(FindingsError, match=r"\$: expected a JSON object"):
        validate_findings([1, 2])


def test_report_reads_only_through_the_loader(tmp_path, plan, data):
    """write_report builds the pages from findings.json on disk, so a broken file stops it."""
    out = tmp_path / "copy"
    shutil.copytree(plan, out)
    (out / "findings.json").write_text(json.dumps(_break(copy.deepcopy(data), "bad verdict")))
    (out / "index.html").unlink()
    with pytest.raises(FindingsError, match=r"verdict"):
        report.write_report(data, out)          # the in-memory summary is not what is shown
    assert not (out / "index.html").exists()


def test_index_reads_like_an_audit(plan, data):
    html = (plan / "index.html").read_text()
    # the head: project, machine, date, mode, versions
    for text in (data["project"], data["machine"]["label"], H._when(data["date"]), "plan-only",
                 f"torch {data['versions']['torch']}"):
        assert H.esc(text) in html, text
    assert "<th>Machine</th>" in html and "<th>Versions</th>" in html
    # the verdict table: one row per chapter with the deciding finding, its number, threshold, fix
    verdicts = html[html.index("<table class='verdicts'>"):]
    verdicts = verdicts[:verdicts.index("</table>")]
    assert verdicts.count("<tr>") == 1 + len(CHAPTERS)
    by_ch = {}
    for f in data["findings"]:
        by_ch.setdefault(f["chapter"], []).append(f)
    for c in data["chapters"]:
        d = report.deciding(by_ch[c["number"]])
        assert d["verdict"] == c["verdict"]
        assert H.fid(d["id"]) in verdicts and H.esc(report.fmt_finding(d)) in verdicts
        assert H.esc(d["threshold"]) in verdicts
        # a passing chapter has nothing to fix; the others show the deciding finding's fix
        assert (prose(d["fix"]) in verdicts) == (c["verdict"] != "pass")
        assert f"href='{H.chapter_page(c)}'" in verdicts and (plan / H.chapter_page(c)).exists()
        # a failing chapter's row shows the number its threshold judges (not, say, an interval in s
        # beside a threshold in % of waste)
        if d["verdict"] in ("fail", "warn"):
            assert guidance.decides(d), d
    assert ("nothing to fix: keep the plan" in verdicts) == any(c["verdict"] == "pass" for c in data["chapters"])
    # chapter sections (each starting a printed page), every finding addressable, charts inline
    assert html.count("<section class='chapter'") == len(CHAPTERS)
    for f in data["findings"]:
        assert f"<tr id='{f['id']}'>" in html
    assert html.count("<svg") >= 3
    # printable: page size and margins, page breaks, repeated table heads, scaled charts, link targets
    for css in ("@page{size:A4", "@media print", "section.chapter{break-before:page}",
                "thead{display:table-header-group}", "break-inside:avoid", "svg{max-width:100%;width:auto",
                'attr(href)'):
        assert css in html, css
    assert external_refs(html) == [] and "<script" not in html.lower()


def test_deciding_finding_and_number_formats():
    f = lambda i, v, verdict: {"id": i, "value": v, "verdict": verdict, "unit": "s"}  # noqa: E731
    assert report.deciding([]) is None
    assert report.deciding([f("a/x", 1, "pass"), f("a/y", 2, "warn")])["id"] == "a/y"
    # among equally bad findings, the first with a number decides
    assert report.deciding([f("a/x", None, "fail"), f("a/y", 3, "fail"), f("a/z", 4, "fail")])["id"] == "a/y"
    assert report.deciding([f("a/x", None, "info")])["id"] == "a/x"
    assert report.fmt_value(None, "s") == "n/a"
    assert report.fmt_value(0.684, "fraction") == "68.4%"
    assert report.fmt_value(55.9e9, "bytes") == "55.9 GB"
    assert report.fmt_value(1.0, "bool") == "yes" and report.fmt_value(0.0, "bool") == "no"
    assert report.fmt_value(5000, "s") == "5,000 s (83.3 min)"


def test_svg_ids_are_scoped_per_chart():
    svg = '<svg><clipPath id="clip1"/><clipPath id="clip10"/><g clip-path="url(#clip1)"/><use href="#clip10"/></svg>'
    out = H.scoped_svg(svg, "c--a")
    assert 'id="c--a-clip1"' in out and 'id="c--a-clip10"' in out
    assert "url(#c--a-clip1)" in out and 'href="#c--a-clip10"' in out and "#clip1" not in out


def test_user_strings_are_escaped_everywhere(tmp_path, plan, data):
    """Notes and project name (and paths) as the user typed them: text, never markup."""
    out = tmp_path / "esc"
    shutil.copytree(plan, out)
    d = copy.deepcopy(data)
    d["notes"] = "<script>alert('notes')</script> & <b>bold</b>"
    d["project"] = "<img src=x onerror=alert(1)>"
    d["profile_path"] = "/tmp/<svg onload=alert(2)>.yaml"
    (out / "findings.json").write_text(json.dumps(d))
    report.write_report(None, out)
    html = (out / "index.html").read_text()
    assert "<script" not in html.lower() and "<img" not in html and "<b>bold" not in html
    assert "<svg onload" not in html
    assert "&lt;script&gt;alert(&#x27;notes&#x27;)&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;" in html
    assert "<title>Preflight audit: &lt;img src=x onerror=alert(1)&gt;</title>" in html
    assert "<h1>Preflight audit: &lt;img src=x onerror=alert(1)&gt;</h1>" in html


def test_a_chapter_page_that_cannot_render_does_not_stop_the_report(tmp_path, plan, monkeypatch):
    """nbconvert broken on this machine (templates missing, as with pip --target and no JUPYTER_PATH):
    each chapter page says so and links its executed notebook; the index is written as usual."""
    out = tmp_path / "norender"
    shutil.copytree(plan, out)
    for p in [out / "index.html", *out.glob("0[1-5]_*.html")]:
        p.unlink()

    def broken(notebook, title):
        raise ValueError("No template sub-directory with name 'basic' found <in> these paths")

    monkeypatch.setattr(report, "chapter_html", broken)
    report.write_report(None, out)
    assert (out / "index.html").is_file()
    pages = sorted(out.glob("0[1-5]_*.html"))
    assert len(pages) == len(CHAPTERS)
    html = pages[0].read_text()
    assert "could not be rendered (ValueError: No template sub-directory" in html
    assert "&lt;in&gt;" in html and "href='notebooks/01_baseline.ipynb'" in html


# -- guidance: the deciding number, what a fix buys, the overall line --------------------------------

def _f(fid, value, verdict, threshold, fix="", unit="fraction", chapter=1):
    return {"id": fid, "value": value, "verdict": verdict, "threshold": threshold, "fix": fix, "unit": unit,
            "chapter": chapter}


def test_a_number_decides_only_if_its_threshold_judges_it():
    """Chapter 5's case: the optimal interval (28,420 s) judged on the extra waste it costs (in %)."""
    interval = _f("ft/checkpoint_interval_s", 28420, "pass",
                  "extra waste of the plan's interval vs the optimum: pass <= +1%, fail > +5%", unit="s")
    waste = _f("ft/expected_waste", 0.0064, "pass", "pass <= 5%, fail > 15%")
    stall = _f("ft/async_stall_ratio", 0.22, "pass", "async stall / sync stall: pass <= 0.5, fail > 1", unit="ratio")
    two = _f("dp/headroom_default", 1.82, "fail", "supply/consumption pass >= 1.2x, fail < 1x; and device idle "
             "pass <= 5%, fail > 15%", unit="x")
    words = _f("ft/resume_bitwise", 1.0, "pass", "pass = bitwise equal", unit="bool")
    assert not guidance.decides(interval) and guidance.decides(waste) and guidance.decides(stall)
    assert not guidance.decides(two) and not guidance.decides(words)
    assert guidance.threshold_of(waste) == guidance.Threshold(0.05, 0.15, higher_is_better=False)
    # all pass: the row shows the number closest to failing among those that decide (0.22/0.5 > 0.0064/0.05)
    assert guidance.deciding([interval, waste, stall, words])["id"] == "ft/async_stall_ratio"
    assert guidance.deciding([interval, words, waste])["id"] == "ft/expected_waste"


def test_fixes_are_ranked_by_verdict_then_consequence_then_by_how_far_the_number_is_from_passing():
    amdahl = _f("b/amdahl", 9.89, "fail", "pass >= 2048x, fail < 1024x", "serial first", unit="x")     # 207x
    listing = _f("d/listing", 5000, "fail", "pass <= 60 s, fail > 600 s", "shards", unit="s")          # 83x
    padding = _f("l/padding", 0.684, "fail", "pass <= 10%, fail > 30%", "bucketing")                   # 6.8x
    twin = _f("b/amdahl_at_target", 0.05, "fail", "pass >= 80%, fail < 60%", "serial first")           # same fix
    warn = _f("c/ratio", 0.9, "warn", "pass <= 0.67, fail > 1", "overlap", unit="x")
    ok = _f("f/waste", 0.006, "pass", "pass <= 5%, fail > 15%", "faster checkpoints")
    assert guidance.shortfall(amdahl) == pytest.approx(2048 / 9.89) and guidance.shortfall(padding) == pytest.approx(6.84)
    top = guidance.top_fixes([ok, warn, padding, listing, twin, amdahl])
    # time lost (seconds per start, a share of each step) before a factor missed, however far the factor;
    # one per fix text (the twin's efficiency, 16x short, stands for Amdahl's)
    assert [f["id"] for f in top] == ["d/listing", "b/amdahl_at_target", "l/padding"]
    assert [f["id"] for f in guidance.top_fixes([padding, amdahl])] == ["l/padding", "b/amdahl"]
    # a plan that cannot start comes first, though it misses its bound by the least (1.88x)
    oom = _f("baseline/memory_fits", 1.88, "fail", "pass <= 90%, fail > 100%", "ZeRO-1", unit="ratio")
    assert [f["id"] for f in guidance.top_fixes([padding, listing, amdahl, oom])][0] == "baseline/memory_fits"
    assert [f["id"] for f in guidance.top_fixes([ok, warn, padding], n=3)] == ["l/padding", "c/ratio"]
    assert guidance.top_fixes([ok]) == []
    assert guidance.overall(["fail", "fail", "warn", "pass", "fail"]) == "3 of 5 chapters fail; 1 of 5 warns"
    assert guidance.overall(["fail", "pass"]) == "1 of 2 chapters fails"
    assert guidance.overall(["pass"] * 5) == "All 5 chapters pass"
    assert guidance.overall(["error", "pass"]).startswith("1 of 2 chapter could not run")
    first, rest = guidance.grouped([ok, padding, warn, amdahl])
    assert [f["id"] for f in first] == ["l/padding", "b/amdahl", "c/ratio"] and rest == [ok]
    assert guidance.grouped([ok]) == ([ok], [])


def test_index_says_what_to_fix_first_and_folds_the_rest(plan, data):
    html = (plan / "index.html").read_text()
    fails = sum(c["verdict"] == "fail" for c in data["chapters"])
    head = html[html.index("<section class='guidance"):html.index("<h2>Verdicts")]
    assert f"{fails} of {len(CHAPTERS)} chapters fail" in head
    top = guidance.top_fixes(data["findings"])
    assert head.count("<li>") == len(top) == 3, head
    for f in top:                           # each fix, the number that calls for it, a link to its row
        assert prose(f["fix"]) in head and f"href='#{f['id']}'" in head and H.esc(report.fmt_finding(f)) in head
    assert head.index(prose(top[0]["fix"])) < head.index(prose(top[1]["fix"]))
    assert "how many times the number misses its pass bound" in head
    for c in data["chapters"]:
        sec = html[html.index(f"<section class='chapter' id='ch{c['number']}'>"):]
        sec = sec[:sec.index("</section>")]
        found = [f for f in data["findings"] if f["chapter"] == c["number"]]
        first, rest = guidance.grouped(found)
        folded = sec[sec.index("<details>"):] if rest else ""
        for f in first:
            assert f"<tr id='{f['id']}'>" in sec and f"<tr id='{f['id']}'>" not in folded
        for f in rest:
            assert f"<tr id='{f['id']}'>" in folded
        # every chart under a title in words, drawn larger than its own size
        for fig in re.findall(r"<figure id='[^']+'>(.*?)</figure>", sec, re.S):
            caption = re.match(r"<figcaption>([^<]+)</figcaption><svg", fig)
            assert caption and "_" not in caption.group(1), fig[:200]
    assert "<th>What it means, and the fix</th>" in html and "<th>source</th>" not in html
    assert "details::details-content{content-visibility:visible" in html        # folded rows print
    assert 'class="v v-fail">FAIL</span>' in html


def test_chapter_pages_have_no_heading_anchors_or_notebook_only_lines(plan):
    pages = sorted(plan.glob("0[1-5]_*.html"))
    assert len(pages) == len(CHAPTERS)
    for p in pages:
        html = p.read_text()
        assert "¶" not in html and "anchor-link" not in html, p.name
        assert "open this chapter in JupyterLab" not in html, p.name
        assert re.search(r'class="v v-(pass|warn|fail|info)"[^>]*>(PASS|WARN|FAIL|INFO)</span>', html), p.name
        assert "True</td>" not in html and "False</td>" not in html, p.name


def test_figures_are_scaled_and_keep_their_viewbox():
    from preflight.reporting.index import chart_heading, scaled_svg

    svg = '<svg xmlns="http://www.w3.org/2000/svg" width="600" height="300" viewBox="0 0 600 300"><g/></svg>'
    out = scaled_svg(svg)
    assert 'width="780" height="390" viewBox="0 0 600 300"' in out
    assert 'width="1000"' in scaled_svg(svg.replace('width="600"', 'width="900"'))          # at most the page
    assert chart_heading("memory_terms").startswith("Memory per GPU") and chart_heading("new_chart") == "New chart"


def test_prose_turns_backticks_into_code_and_escapes_the_rest():
    from preflight.reporting.tables import frame_html

    assert prose("Run `make plan` & <b>") == "Run <code>make plan</code> &amp; &lt;b&gt;"
    assert prose("a `<script>` b") == "a <code>&lt;script&gt;</code> b"      # escaped first: no tag in code
    import pandas as pd
    cells = frame_html(pd.DataFrame({"quantity": ["waste verdict"], "rate": ["pass"]}))
    assert "PASS" in cells and ">pass<" not in cells                           # a verdict row is badged


def test_the_date_reads_as_a_date():
    assert H._when("2026-12-01T15:56:28+00:00") == "2026-12-01 15:56 UTC"
    assert H._when("2026-12-01T17:56:28+02:00") == "2026-12-01 15:56 UTC"
    assert H._when("not a date") == "not a date"
