"""The advisor against 34 published runs (data/profiles/published/, docs/advisor-validation.md): the
published layouts predicted within the bounds the issue set, every one predicted to fit, and the doc's
table is the tool's output. A change that makes the model worse on published runs fails here."""
from __future__ import annotations

import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "tools"))
import advisor_validation as V  # noqa: E402


@pytest.fixture(scope="module")
def rows():
    return V.rows()


def test_published_runs_are_predicted_within_the_bounds(rows):
    s = V.summary(rows)
    assert s["runs"] == 34
    # The constants are fitted jointly on these 34 and 39 Megatron-Bridge runs (tools/calibrate_advisor.py):
    # 5.1 % here (9.1 % before fp8's math-only gain and the elementwise passes, issue 41).
    assert s["median_abs_error"] <= 0.07, s
    assert s["within_20"] >= 0.85, s
    assert s["fit"] == 34, [r["run"] for r in rows if not r["plan"]["fits"]]
    assert s["zero3_max_abs_error"] <= 0.45, s
    assert 0.9 <= s["median_ratio"] <= 1.1, s            # no systematic bias either way


def test_every_layout_the_advisor_prefers_says_why(rows):
    for r in rows:
        assert r["rank"] is not None, r["run"]
        if r["rank"] > 1:
            assert r["why"] and "->" in r["why"], r["run"]


def test_doc_table_is_the_tool_output(rows):
    text = (REPO / "docs" / "advisor-validation.md").read_text()
    assert V.markdown(rows) in text
