"""Checkpoint stall (``preflight.bench.ckptstall``, helpers in ``ckptstate``): quick live run and the JSON CLI."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from preflight.bench import ckptstall
from preflight.harness import ckptstate

REPO = Path(__file__).resolve().parents[1]
ROW_KEYS = {"method", "description", "stall_s", "stall_p10_s", "stall_p90_s", "stall_steps", "durable_s",
            "inflight_steps", "inflight_step_s", "inflight_slowdown", "hidden_cost_s", "total_cost_s",
            "drain_s", "state_MB", "file_MB"}
REPEATS = 5          # timed rounds: medians of 5 paired rounds hold on a loaded machine (test_async_stalls_less)


def test_mlp_is_sized_to_the_state():
    model, opt, hidden = ckptstate.mlp_for(12.0)
    params = sum(p.numel() for p in model.parameters())
    assert abs(params * 12 / 1e6 - 12.0) < 0.05


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    work, shared = tmp_path_factory.mktemp("local"), tmp_path_factory.mktemp("shared")
    res = ckptstall.measure_stall(work, shared_dir=shared, quick=True, repeats=REPEATS)
    return res, work, shared


def test_async_stalls_less(quick):
    res, _, _ = quick
    by = {r["method"]: r for r in res["rows"]}
    assert set(by) == set(ckptstall.METHODS)
    assert res["async_stall_ratio"] == pytest.approx(by["async two-stage"]["stall_s"] / by["sync ckpt.save"]["stall_s"])
    # The two-stage save's stall is the snapshot (a 20 MB copy) plus the GIL it can wait for while its
    # background write starts: ~0.5 of the synchronous save's on this 2-core machine. With 2 CPU hogs on
    # the cores a single round reached 0.98 and the ratio of medians of 3 rounds 0.63. So the rounds are
    # paired (each saves both ways back to back, and rounds interleave the methods), the statistic is the
    # median of 5 per-round ratios, and the bound is 1: a 1.6x margin over the worst median seen loaded.
    t = res["timings"]
    paired = statistics.median(a / s for a, s in zip(t["async two-stage"]["stall_s"], t["sync ckpt.save"]["stall_s"],
                                                     strict=True))
    assert 0 < paired < 1, t
    assert res["async_stall_ratio"] > 0
    # DCP's own save of 20 MB takes ~30 ms: its async/sync ratio is within timing noise on a busy 2-core
    # machine (1.36 once under load), so only its asynchrony is asserted (durable after the stall, below)
    assert 0 < res["dcp_async_stall_ratio"] < 3, by
    for sync in ("sync ckpt.save", "DCP save"):            # a synchronous save: stall = durable, no in-flight
        assert by[sync]["inflight_steps"] == 0 and by[sync]["hidden_cost_s"] == 0
        # durable is read inside the call, the stall when it has returned: never more, in every round
        assert all(d <= s for d, s in zip(t[sync]["durable_s"], t[sync]["stall_s"], strict=True)), t[sync]
        assert by[sync]["durable_s"] == pytest.approx(by[sync]["stall_s"], rel=0.2, abs=2e-3)
    for name in ckptstall.ASYNC:                            # durable only after the background write
        assert by[name]["durable_s"] > by[name]["stall_s"]


def test_rows_complete_and_json_ready(quick):
    res, work, shared = quick
    assert res["baseline_step_s"] > 0
    for r in res["rows"]:
        assert ROW_KEYS <= set(r), ROW_KEYS - set(r)
        assert r["stall_s"] > 0 and r["durable_s"] > 0 and r["stall_steps"] > 0
        assert r["state_MB"] == pytest.approx(ckptstall.QUICK_MB, rel=0.02)
        assert r["file_MB"] >= r["state_MB"] * 0.99         # what reached the disk
        assert r["stall_p10_s"] <= r["stall_s"] <= r["stall_p90_s"]
    assert res["config"]["state_MB"] == pytest.approx(ckptstall.QUICK_MB, rel=0.02) and res["config"]["repeats"] == REPEATS
    assert all(len(t["stall_s"]) == REPEATS for t in res["timings"].values())
    assert json.loads(json.dumps(res, allow_nan=False)) == res
    assert not list(Path(work).iterdir()) and not list(Path(shared).iterdir())   # cleaned up


def test_json_cli(tmp_path):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-m", "preflight.bench.ckptstall", "--json", "--size-mb", "2",
                           "--repeats", "1", "--workdir", str(tmp_path / "w")],
                          cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(proc.stdout)
    assert [r["method"] for r in res["rows"]] == list(ckptstall.METHODS)
    assert res["config"]["size_mb_requested"] == 2 and res["async_stall_ratio"] > 0
    assert list((tmp_path / "w").iterdir()) == [tmp_path / "w" / "shared"]
    assert not list((tmp_path / "w" / "shared").iterdir())
