"""Preflight's trace numbers against Holistic Trace Analysis's on the real traces of ../shared/traces
(HTA's numbers computed in a scratch venv by tools/hta/hta_numbers.py, committed as
tools/hta/hta-numbers.json; docs/traces-vs-hta.md explains each difference)."""
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "tools" / "hta"))
import compare  # noqa: E402

pytestmark = pytest.mark.skipif(not compare.TRACES.is_dir(), reason="../shared/traces is not beside the project")


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    import os

    os.environ["PREFLIGHT_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    return compare.rows()


def test_every_shared_trace_is_read(rows):
    assert {r["folder"] for r in rows} == {p.name for p in compare.TRACES.iterdir() if p.is_dir()}
    assert not any("error" in r for r in rows)


def test_within_half_a_point_of_hta_where_it_runs(rows):
    checked = 0
    for r in rows:
        h = r["hta"]
        for ours, theirs in (("idle", h.get("idle_unrounded", h.get("idle"))),
                             ("overlap", h.get("overlap_unrounded", h.get("overlap"))), ("exposed", h.get("exposed"))):
            if theirs is None or r[ours] is None:
                continue
            assert abs(r[ours] - theirs) <= 0.5, (r["folder"], r["rank"], ours, r[ours], theirs)
            checked += 1
    assert checked >= 14          # idle 6, overlap 4, exposed 4 (ranks with GPU events, with communication)


def test_where_hta_rounds_to_whole_microseconds_the_gap_is_its_rounding(rows):
    ns = next(r for r in rows if r["folder"] == "v100-ns-clock")
    assert ns["hta"]["idle"] - ns["idle"] > 0.5                     # HTA's default: ceil(start), floor(end)
    assert ns["idle"] == pytest.approx(ns["hta"]["idle_unrounded"], abs=0.01)


def test_where_hta_crashes_we_say_what_the_trace_cannot_support(rows):
    for name in ("cpu-only", "no-gpu-events", "no-distributed-info"):
        r = next(x for x in rows if x["folder"] == name)
        assert r["hta"]["errors"] and r["idle"] is None
        assert any(lim.startswith("no GPU events") for lim in r["limits"])
