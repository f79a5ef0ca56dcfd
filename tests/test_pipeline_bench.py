"""Pipeline bench: per-layer profile of the heterogeneous model, the bubble measured under torchrun
(2 processes, gloo on the CPU) against (p-1)/(v*m+p-1), GPipe and interleaved runs, and partitions
of the heterogeneous model that must place every layer exactly once."""
from __future__ import annotations

import statistics

import pytest

from preflight.bench import partition, pipeline
from preflight.harness import stages
from preflight.models.pipeline import schedule_timeline

ATTN = ("attn1", "attn2", "attn3", "attn4")          # four identical blocks


def test_layer_times_differ_by_layer():
    # Timings on a 2-core machine another job shares: one layer's median can be 2x off when a burst of
    # load lands on it (head/attn1 of one call: 0.8 to 3.6, the true ratio ~2). Load only ever adds time,
    # so the least of several calls (each the median of 5 after warm-up; the calls interleave the layers'
    # measurements, A B C ... A B C ...) is each layer's estimate, and the head is compared with the
    # median of the four identical attention blocks.
    calls = [stages.layer_times(quick=True, batch=2) for _ in range(7)]
    for rows in calls:
        assert [r["name"] for r in rows] == stages.HETERO_NAMES
        assert all(r["time_s"] > 0 and r["params"] > 0 for r in rows)
    params = {r["name"]: r["params"] for r in calls[0]}
    times = {n: min(c[i]["time_s"] for c in calls) for i, n in enumerate(stages.HETERO_NAMES)}
    # the embedding is a table lookup, the cheapest layer by ~10x (the costliest by 80-470x, under load too)
    assert times["embedding"] == min(times.values()) and max(times.values()) / min(times.values()) > 2
    # the vocab projection is the heavy layer: by size (exact) and in time (~2x a block; >= 1.25x under load)
    assert params["head"] == max(params.values()) > 2 * params["attn1"]
    assert times["head"] > statistics.median(times[n] for n in ATTN)


def test_formula_and_splits():
    assert pipeline.bubble_formula(2, 1) == pytest.approx(0.5)
    assert pipeline.bubble_formula(4, 8) == pytest.approx(3 / 11)            # 27 %, not (p-1)/(m p) = 9 %
    assert pipeline.bubble_formula(4, 8, v=2) == pytest.approx(3 / 19)
    with pytest.raises(ValueError):
        pipeline.measure_bubble(p=2, ms=(3,), schedule="interleaved", v=2)      # m % p != 0: refused at once
    assert stages.check_partition((0, 3, 5), 7, 3) == [0, 3, 5]
    for bad, n_stages in (([0, 3], 3), ([1, 4], 2), ([0, 4, 4], 3), ([0, 7], 2)):  # miscount, gap, empty, past end
        with pytest.raises(ValueError):
            stages.check_partition(bad, 7, n_stages)


@pytest.fixture(scope="module")
def bubble():
    return pipeline.measure_bubble(p=2, ms=(1, 4), schedule="1f1b", quick=True, timeout=120)


def _check_ranks(res, p):
    assert [r["rank"] for r in res["ranks"]] == list(range(p))
    for r in res["ranks"]:
        assert 0 < r["busy_s"] <= r["step_s"] and 0 <= r["idle_share"] < 1
    assert res["measured_bubble"] == pytest.approx(statistics.mean(r["idle_share"] for r in res["ranks"]))


def _ops(res, step):
    """{(kind, stage, micro-batch): (start, end)} of every rank's forwards and backwards in one timed step."""
    ops = {}
    for steps in res["timelines"]:
        for kind, stage, mb, t0, t1 in steps[step]["actions"]:
            if kind != "L":
                assert (kind, stage, mb) not in ops, (kind, stage, mb)          # each op once
                ops[kind, stage, mb] = (t0, t1)
    return ops


def _check_timeline(res):
    """The mechanism, not the stopwatch. In every timed step each (virtual) stage ran the forward and the
    backward of each micro-batch once; each op started only after the ops it needs ended, on whichever rank
    ran them (``perf_counter`` is one clock for the machine's processes), which is what makes ranks wait;
    and a rank's recorded intervals add up to its busy time. None of it depends on how fast anything ran."""
    p, m, v = res["world_size"], res["microbatches"], res["chunks"]
    n = p * v
    assert [len(steps) for steps in res["timelines"]] == [len(res["timelines"][0])] * p
    for k in range(len(res["timelines"][0])):
        ops = _ops(res, k)
        assert sorted(ops) == sorted((kind, s, j) for kind in "FB" for s in range(n) for j in range(m))
        for (kind, s, j), (t0, t1) in ops.items():
            needs = ([("F", s - 1, j)] if s > 0 else []) if kind == "F" else \
                [("F", s, j)] + ([("B", s + 1, j)] if s < n - 1 else [])
            for dep in needs:
                assert ops[dep][1] <= t0 + 1e-6, f"step {k}: {kind}{j} on stage {s} started before {dep} ended"
            assert t0 <= t1
    for r, steps in zip(res["ranks"], res["timelines"], strict=True):
        busy = [sum(a[4] - a[3] for a in st["actions"]) for st in steps]
        assert r["busy_s"] == pytest.approx(statistics.median(busy), rel=1e-4, abs=1e-6)
        assert all(st["start"] <= a[3] <= a[4] <= st["end"] for st in steps for a in st["actions"])


def _union(intervals):
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _length(intervals):
    return sum(b - a for a, b in intervals)


def _overlap(x, y):
    return sum(max(0.0, min(b, d) - max(a, c)) for a, b in x for c, d in y)


def interval_bubble(res, step):
    """The bubble from the recorded intervals: the share of the pipeline's compute span (the union of all
    ranks' busy intervals) in which a rank sits idle while another rank computes, mean over ranks. Time in
    which no rank computes (send/recv, a woken rank waiting for a core that another job holds) counts in
    neither, so load on the machine does not inflate it the way it inflates ``step - busy``."""
    busy = [_union([a[3], a[4]] for a in steps[step]["actions"]) for steps in res["timelines"]]
    span = _length(_union(iv for b in busy for iv in b))
    shares = []
    for r, mine in enumerate(busy):
        others = _union(iv for q, b in enumerate(busy) if q != r for iv in b)
        shares.append((_length(others) - _overlap(others, mine)) / span)
    return statistics.mean(shares)


@pytest.mark.slow
def test_bubble_follows_formula(bubble):
    """Under load (2 CPU hogs on the 2 cores) the stopwatch bubble ``1 - busy/step`` is mostly send/recv
    and scheduling latency: m=4 once idled 54.9 %, m=1 52.9 %. So the ordering is asserted on the
    mechanism: the schedule's op order, the waits (``_check_timeline``), and the bubble from the intervals."""
    df = bubble.set_index("m")
    assert list(df["formula"]) == pytest.approx([0.5, 0.2])
    assert df.loc[1, "schedule"] == "gpipe" and df.loc[4, "schedule"] == "1f1b"   # 1F1B needs m >= p
    recs = {rec["results"]["microbatches"]: rec["results"] for rec in bubble.attrs["records"]}
    for m, res in recs.items():
        _check_ranks(res, 2)
        _check_timeline(res)
        assert res["throughput"] > 0 and res["oversubscribed"] is False
        assert set(res["straggler"]) >= {"step_s_per_rank", "slowest_rank", "excess"}
        # each rank ran its ops in the schedule's order (GPipe: all F, then all B; 1F1B: p-s warm-up forwards,
        # then alternating): the simulated schedule's per-stage order, whatever the timings
        model = schedule_timeline(2, m, res["schedule"])
        for rank, steps in enumerate(res["timelines"]):
            want = [(x.kind, x.microbatch) for x in model[model["stage"] == rank].sort_values("start").itertuples()]
            for st in steps:
                assert [(a[0], a[2]) for a in st["actions"] if a[0] != "L"] == want, (m, rank)
    # m=1: nothing can overlap (F0, F1, loss, B1, B0 wait for each other), so the interval bubble is exactly
    # (p-1)/(m+p-1) = 1/2 in every step, load or not; the stopwatch share is at least 1/2 (step >= both ranks'
    # busy time) plus latency: no upper bound that a loaded machine keeps but 1.
    assert all(interval_bubble(recs[1], k) == pytest.approx(0.5, abs=1e-6) for k in range(len(recs[1]["timelines"][0])))
    assert 0.3 < df.loc[1, "measured_bubble"] < 1
    # m=4: the ranks compute at the same time, so the bubble shrinks towards 1/5. How close it gets is timing:
    # the least disturbed timed step gave 0.19-0.25 unloaded, 0.22-0.39 under 2 hogs, and 0.356 in CI beside
    # the other xdist worker (a rank preempted mid-op keeps the other waiting, which load cannot shrink). So
    # the bound is the mechanism: with two ranks the interval bubble is (L0+L1-2*O) / (2*(L0+L1-O)) for busy
    # lengths L0, L1 and overlap O, exactly 1/2 when the ranks never compute together (m=1 above). A pipeline
    # that stops overlapping fails; the formula's 0.2 is shown by the chapter, not asserted on a shared box.
    best = min(interval_bubble(recs[4], k) for k in range(len(recs[4]["timelines"][0])))
    assert recs[4]["formula"] <= best + 0.05 and best < 0.45, best
    assert 0 < df.loc[4, "measured_bubble"] < 1


@pytest.mark.slow
def test_interleaved_and_gpipe_run(tmp_path):
    inter = pipeline.measure_bubble(p=2, ms=(2,), schedule="interleaved", v=2, quick=True, timeout=120, out=tmp_path)
    res = inter.attrs["records"][0]["results"]
    assert res["schedule"] == "interleaved" and res["chunks"] == 2
    assert [(s["stage"], s["rank"]) for s in res["stages"]] == [(0, 0), (1, 1), (2, 0), (3, 1)]
    assert inter.loc[0, "formula"] == pytest.approx(1 / 5)
    _check_ranks(res, 2)
    _check_timeline(res)                                 # both chunks of each rank, in dependency order
    gpipe = pipeline.measure_bubble(p=2, ms=(2,), schedule="gpipe", quick=True, timeout=120, out=tmp_path)
    _check_ranks(gpipe.attrs["records"][0]["results"], 2)
    _check_timeline(gpipe.attrs["records"][0]["results"])
    assert sorted(p.name for p in tmp_path.glob("pipeline-*.json")) == [
        "pipeline-gpipe-p2-m2-v1-balanced.json", "pipeline-interleaved-p2-m2-v2-balanced.json"]


@pytest.mark.parametrize("boundaries", [(0, 4), (0, 5)])
def test_partition_places_every_layer_once(boundaries):
    res = partition.run_partition(boundaries, p=2, m=2, quick=True, timeout=120)
    placed = [name for stage in res["stages"] for name in stage["layers"]]
    assert placed == stages.HETERO_NAMES                          # each layer once, in order
    assert res["stages"][1]["layers"][0] == stages.HETERO_NAMES[boundaries[1]]
    assert res["throughput"] > 0 and res["model"] == "hetero"
    _check_ranks(res, 2)
    _check_timeline(res)


def test_partition_refused_before_launch():
    with pytest.raises(ValueError, match="partition"):
        partition.run_partition((0, 9), p=2)


@pytest.mark.parametrize("argv", [["--partition", "0,a"], ["--partition", "0,3,5"], ["--chunks", "2"],
                                  ["--schedule", "interleaved", "--chunks", "2", "--microbatches", "3"]])
def test_command_line_refuses_before_any_process_group(argv, tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit) as exc:
        pipeline.main(["--out", str(tmp_path), *argv])
    assert exc.value.code == 2


def test_zero_bubble_runs_in_zb_h1_order(tmp_path):
    """torch's ScheduleInterleavedZeroBubble, one stage per rank, on gloo: every rank runs F, B (input
    gradient) and W (weight gradient) of each micro-batch once, in ZB-H1's order, each op after what it
    needs (W only after its own B); the reference bubble is the simulated ZB-H1's, 1/13 at p=2, m=4."""
    from preflight.models.zerobubble import zb_h1_deps, zb_h1_order

    df = pipeline.measure_bubble(p=2, ms=(4,), schedule="zb-h1", quick=True, timeout=120, out=tmp_path)
    res = df.attrs["records"][0]["results"]
    assert res["schedule"] == "zb-h1" and df.loc[0, "formula"] == pytest.approx(1 / 13)
    _check_ranks(res, 2)
    for k in range(len(res["timelines"][0])):
        ops = {}
        for rank, steps in enumerate(res["timelines"]):
            mine = [(a[0], a[2]) for a in steps[k]["actions"] if a[0] != "L"]
            assert mine == [(kind, j) for kind, j, _ in zb_h1_order(2, 4, rank)], (k, rank)
            ops.update({(a[0], a[1], a[2]): (a[3], a[4]) for a in steps[k]["actions"] if a[0] != "L"})
        for (kind, s, j), (t0, _t1) in ops.items():
            for dep_kind, dep_s, dep_j, _ in zb_h1_deps(kind, s, j, 2):
                assert ops[dep_kind, dep_s, dep_j][1] <= t0 + 1e-6, (k, kind, s, j)
    assert all({"F", "B", "W"} <= set(o) for o in res["op_s"])
    assert df.loc[0, "backward_ms"] > 0 and df.loc[0, "forward_ms"] > 0


@pytest.mark.slow
def test_several_runs_share_one_torchrun(monkeypatch):
    """Chapter 4's seven runs at p = 2 start their processes once (start-up was seconds per run here);
    each keeps its own warm-up and record, in the order asked."""
    from preflight.harness import launch

    calls, real = [], launch.run_torchrun
    monkeypatch.setattr(launch, "run_torchrun", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    recs = pipeline.launch_runs(2, [("1f1b", 1, 1), ("gpipe", 4, 1)], quick=True, timeout=120)
    assert len(calls) == 1 and "--runs" in calls[0]
    assert [(r["results"]["schedule_requested"], r["results"]["microbatches"]) for r in recs] == [("1f1b", 1), ("gpipe", 4)]
    assert all(r["params"]["warmup_steps"] == pipeline.WARMUP_STEPS for r in recs)
