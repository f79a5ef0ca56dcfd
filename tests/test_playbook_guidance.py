"""What guides a learner through the playbook: the kernel, folded code, a closing cell per chapter with
the next step, the index (playbook/README.md) and the glossary."""
import json
import re

import pytest

from conftest import REPO
from preflight.chapters.registry import CHAPTERS

STEMS = [c.stem for c in CHAPTERS]          # 01_baseline, ...


def _nb(stem):
    return json.loads((REPO / "playbook" / f"{stem}.ipynb").read_text())


@pytest.mark.parametrize("stem", STEMS)
def test_kernel_and_folded_code(stem):
    nb = _nb(stem)
    assert nb["metadata"]["kernelspec"] == {"name": "preflight", "display_name": "Python (preflight)",
                                            "language": "python"}
    make = (REPO / "Makefile").read_text()
    assert '--name preflight --display-name "Python (preflight)"' in make       # the kernel make setup installs
    for c in nb["cells"]:
        if c["cell_type"] != "code":
            continue
        src = "".join(c["source"])
        hidden = c["metadata"].get("jupyter", {}).get("source_hidden", False)
        edited = src.startswith("# parameters") or re.search(r"^prediction\w* = None", src, re.M) is not None
        assert hidden is not edited, src[:80]          # folded, except what the learner edits


PLAYBOOK_ORDER = (0, 2, 1, 3, 4)       # playbook/README.md: chapters 1, 3, 2, 4, 5


@pytest.mark.parametrize("i", range(len(STEMS)))
def test_each_chapter_closes_with_what_to_change_and_the_next_step(i):
    cells = _nb(STEMS[i])["cells"]
    text = ["".join(c["source"]) for c in cells]
    at = max(k for k, t in enumerate(text) if "## Findings of this chapter" in t)
    tail = text[at:]
    assert any(t.startswith("## What you learned") for t in tail)
    assert any(t.strip() == "ch.next_steps()" for t in tail)
    last = tail[-1]
    assert "](glossary.md)" in last and "](README.md)" in last
    order = [STEMS[k] for k in PLAYBOOK_ORDER]                 # 1 -> 3 -> 2 -> 4 -> 5
    at = order.index(STEMS[i])
    if at + 1 < len(order):
        assert f"]({order[at + 1]}.ipynb)" in last and "1 → 3 → 2 → 4 → 5" in last
    else:
        assert "python -m preflight audit" in last


def test_playbook_index_lists_every_chapter_in_order_with_the_facilitator_times():
    index = (REPO / "playbook" / "README.md").read_text()
    at = [index.index(f"]({s}.ipynb)") for s in STEMS]
    assert at == sorted(at)
    facilitator = (REPO / "docs" / "facilitator.md").read_text()
    for n, stem in enumerate(STEMS, 1):
        row = next(r for r in facilitator.splitlines() if r.startswith(f"| {n} "))
        runs, teach = [x.strip() for x in row.split("|")[2:4]]
        line = next(r for r in index.splitlines() if f"]({stem}.ipynb)" in r)
        assert teach in line and runs.replace("-", "–") in line, (stem, runs, teach)
    assert "Python (preflight)" in index and "](glossary.md)" in index


def test_glossary_defines_the_terms_and_is_reachable_from_jupyterlab():
    glossary = (REPO / "docs" / "glossary.md").read_text()
    for term in ("MFU", "algbw / busbw", "ZeRO", "FSDP", "HSDP", "1F1B", "Bubble", "MTBF", "Young's interval",
                 "Daly's interval", "Amdahl's law", "Gustafson's law", "NVLink", "Rails"):
        assert re.search(rf"\*\*{re.escape(term)}[^*]*\*\*", glossary), term
    link = REPO / "playbook" / "glossary.md"          # JupyterLab serves playbook/ only
    assert link.is_symlink() and link.resolve() == (REPO / "docs" / "glossary.md").resolve()


def test_next_steps_rank_the_fixes_and_say_when_nothing_is_left():
    from preflight.runner.chapter import next_steps_html

    f = dict(value=1.0, unit="x", threshold="pass >= 2x, fail < 1.5x", message="m", source="s")
    findings = [dict(f, id="c/a", verdict="warn", fix="fix <a>"), dict(f, id="c/b", verdict="fail", fix="fix b"),
                dict(f, id="c/c", verdict="pass", fix="fix c")]
    html = next_steps_html(findings)
    assert html.index("fix b") < html.index("fix &lt;a&gt;") and "fix c" not in html
    assert "nothing in your plan fails or warns" in next_steps_html(findings[2:])
    assert "embedded example job" in next_steps_html(findings[2:], example_shown=True)


def test_report_pages_point_the_closing_links_at_report_pages():
    from preflight.reporting.report import playbook_links

    body = playbook_links('<a href="02_data_pipeline.ipynb">next</a> <a href="README.md">all</a> '
                          '<a href="glossary.md">glossary</a>')
    assert 'href="02_data_pipeline.html"' in body and '<a href="index.html">the audit summary</a>' in body
    assert "glossary.md\"" not in body and "glossary (docs/glossary.md)" in body
