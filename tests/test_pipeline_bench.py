"""Pipeline bench: per-layer profile of the heterogeneous model, the bubble measured under torchrun
(2 processes, gloo on the CPU) against (p-1)/(v*m+p-1), GPipe and interleaved runs, and partitions
of the heterogeneous model that must place every layer exactly once."""
from __future__ import annotations

import pytest
from preflight.bench import pipeline


def test_layer_times_differ_by_layer():
    rows = pipeline.layer_times(quick=True, batch=2)
    assert [r["name"] for r in rows] == pipeline.HETERO_NAMES
    assert all(r["time_s"] > 0 and r["params"] > 0 for r in rows)
    times = {r["name"]: r["time_s"] for r in rows}
    assert max(times.values()) / min(times.values()) > 2
    assert times["head"] > 1.5 * times["attn1"]         # the vocab projection is the heavy layer


def test_formula_and_splits():
    assert pipeline.bubble_formula(2, 1) == pytest.approx(0.5)
    assert pipeline.bubble_formula(4, 8) == pytest.approx(3 / 11)            # 27 %, not (p-1)/(m p) = 9 %
    assert pipeline.bubble_formula(4, 8, v=2) == pytest.approx(3 / 19)
    with pytest.raises(ValueError):
        pipeline.measure_bubble(p=2, ms=(3,), schedule="interleaved", v=2)      # m % p != 0: refused at once
    assert pipeline.check_partition((0, 3, 5), 7, 3) == [0, 3, 5]
    for bad, stages in (([0, 3], 3), ([1, 4], 2), ([0, 4, 4], 3), ([0, 7], 2)):  # miscount, gap, empty, past end
        with pytest.raises(ValueError):
            pipeline.check_partition(bad, 7, stages)


@pytest.fixture(scope="module")
def bubble():
    return pipeline.measure_bubble(p=2, ms=(1, 4), schedule="1f1b", quick=True, timeout=120)


def _check_ranks(res, p):
    assert [r["rank"] for r in res["ranks"]] == list(range(p))
    for r in res["ranks"]:
        assert 0 < r["busy_s"] <= r["step_s"] and 0 <= r["idle_share"] < 1


def test_bubble_follows_formula(bubble):
    df = bubble.set_index("m")
    assert list(df["formula"]) == pytest.approx([0.5, 0.2])
    assert 0.3 < df.loc[1, "measured_bubble"] < 0.7                # (p-1)/(m+p-1) = 1/2
    assert df.loc[4, "measured_bubble"] < df.loc[1, "measured_bubble"]
    assert df.loc[1, "schedule"] == "gpipe" and df.loc[4, "schedule"] == "1f1b"   # 1F1B needs m >= p
    for rec in bubble.attrs["records"]:
        res = rec["results"]
        _check_ranks(res, 2)
        assert res["throughput"] > 0 and res["oversubscribed"] is False
        assert set(res["straggler"]) >= {"step_s_per_rank", "slowest_rank", "excess"}


def test_interleaved_and_gpipe_run(tmp_path):
    inter = pipeline.measure_bubble(p=2, ms=(2,), schedule="interleaved", v=2, quick=True, timeout=120, out=tmp_path)
    res = inter.attrs["records"][0]["results"]
    assert res["schedule"] == "interleaved" and res["chunks"] == 2
    assert [(s["stage"], s["rank"]) for s in res["stages"]] == [(0, 0), (1, 1), (2, 0), (3, 1)]
    assert inter.loc[0, "formula"] == pytest.approx(1 / 5)
    _check_ranks(res, 2)
    gpipe = pipeline.measure_bubble(p=2, ms=(2,), schedule="gpipe", quick=True, timeout=120, out=tmp_path)
    _check_ranks(gpipe.attrs["records"][0]["results"], 2)
    assert sorted(p.name for p in tmp_path.glob("pipeline-*.json")) == [
        "pipeline-gpipe-p2-m2-v1-balanced.json", "pipeline-interleaved-p2-m2-v2-balanced.json"]


@pytest.mark.parametrize("boundaries", [(0, 4), (0, 5)])
def test_partition_places_every_layer_once(boundaries):
    res = pipeline.run_partition(boundaries, p=2, m=2, quick=True, timeout=120)
    placed = [name for stage in res["stages"] for name in stage["layers"]]
    assert placed == pipeline.HETERO_NAMES                          # each layer once, in order
    assert res["stages"][1]["layers"][0] == pipeline.HETERO_NAMES[boundaries[1]]
    assert res["throughput"] > 0 and res["model"] == "hetero"
    _check_ranks(res, 2)


def test_partition_refused_before_launch():
    with pytest.raises(ValueError, match="partition"):
        pipeline.run_partition((0, 9), p=2)


@pytest.mark.parametrize("argv", [["--partition", "0,a"], ["--partition", "0,3,5"], ["--chunks", "2"],
                                  ["--schedule", "interleaved", "--chunks", "2", "--microbatches", "3"]])
def test_command_line_refuses_before_any_process_group(argv, tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit) as exc:
        pipeline.main(["--out", str(tmp_path), *argv])
    assert exc.value.code == 2
