"""The report's contract: findings.json against its JSON Schema (real audits pass, broken files are
refused with the JSON path of the problem), and index.html as an audit: facts, verdict table,
chapter sections, print styles, offline, every user string escaped."""
import copy
import json
import shutil

import pytest

from conftest import EXAMPLE, run_cli
from preflight import report
from preflight.chapters.registry import CHAPTERS
from preflight.report import FindingsError, external_refs, load_findings, validate_findings


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
    for text in (data["project"], data["machine"]["label"], data["date"], "plan-only",
                 f"torch {data['versions']['torch']}"):
        assert report.esc(text) in html, text
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
        assert report.fid(d["id"]) in verdicts and report.esc(report.fmt_value(d["value"], d["unit"])) in verdicts
        assert report.esc(d["threshold"]) in verdicts and report.esc(d["fix"]) in verdicts
        assert f"href='{report.chapter_page(c)}'" in verdicts and (plan / report.chapter_page(c)).exists()
    # the example's chapter 1 fails on a number, not on an unmeasured finding
    assert "baseline/<wbr>amdahl_<wbr>max_<wbr>speedup" in verdicts
    # chapter sections (each starting a printed page), every finding addressable, charts inline
    assert html.count("<section class='chapter'") == len(CHAPTERS)
    for f in data["findings"]:
        assert f"<tr id='{f['id']}'>" in html
    assert html.count("<svg") >= 3
    # printable: page size and margins, page breaks, repeated table heads, scaled charts, link targets
    for css in ("@page{size:A4", "@media print", "section.chapter{break-before:page}",
                "thead{display:table-header-group}", "break-inside:avoid", "svg{width:100%",
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
    assert report.fmt_value(5000, "s") == "5,000 s"


def test_svg_ids_are_scoped_per_chart():
    svg = '<svg><clipPath id="clip1"/><clipPath id="clip10"/><g clip-path="url(#clip1)"/><use href="#clip10"/></svg>'
    out = report.scoped_svg(svg, "c--a")
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
