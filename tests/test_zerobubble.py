"""Zero-bubble pipeline schedule ZB-H1 (preflight.models.zerobubble): a simulation with dependencies,
checked against Qi et al. 2023's bubble, against 1F1B, and against torch's own schedule's order."""
import random
from fractions import Fraction as Fr

import pytest

from preflight.models import pipeline as P
from preflight.models import zerobubble as Z

CASES = [(p, m) for p in range(1, 7) for m in range(1, 13)]


def _span(df):
    return df["end"].max()


def test_hand_worked_p2_m2():
    # stage 1: F0 B0 F1 B1 W0 W1 back to back; stage 0: F0 F1, waits for stage 1's B0 (ends at 3), B0 W0,
    # waits for B1 (ends at 5), B1 W1. 7 units against 1F1B's 9 (B and W fused: 3 slots of 3).
    df = Z.zb_h1_timeline(2, 2)
    got = {s: [(r.kind, r.microbatch, r.start, r.end) for r in g.sort_values("start").itertuples()]
           for s, g in df.groupby("stage")}
    assert got[1] == [("F", 0, 1, 2), ("B", 0, 2, 3), ("F", 1, 3, 4), ("B", 1, 4, 5), ("W", 0, 5, 6), ("W", 1, 6, 7)]
    assert got[0] == [("F", 0, 0, 1), ("F", 1, 1, 2), ("B", 0, 3, 4), ("W", 0, 4, 5), ("B", 1, 5, 6), ("W", 1, 6, 7)]
    assert P.timeline_bubble(df) == pytest.approx(1 / 7) == Z.bubble_fraction(2, 2)
    assert _span(P.schedule_timeline(2, 2, "1f1b", t_fwd=1, t_bwd=2)) == 9


def test_simulated_bubble_is_the_papers_for_equal_times():
    """t_F = t_B = t_W (the paper's assumption): idle (p-1) per stage, a third of 1F1B's 3 (p-1)."""
    for p, m in CASES:
        if m < p:
            continue
        df = Z.zb_h1_timeline(p, m, Fr(1), Fr(1), Fr(1))
        assert _span(df) == 3 * m + (p - 1), (p, m)
        assert P.timeline_bubble(df) == Fr(p - 1, 3 * m + p - 1) == Z.bubble_fraction(p, m, Fr(1), Fr(1), Fr(1))
        one = P.schedule_timeline(p, m, "1f1b", t_fwd=Fr(1), t_bwd=Fr(2))
        idle_zb, idle_1f1b = _span(df) - 3 * m, _span(one) - 3 * m        # per stage, balanced stages
        assert idle_1f1b == Z.bubble_time(p, schedule="1f1b") == 3 * (p - 1)
        assert idle_zb == Z.bubble_time(p) == (p - 1)
        if p > 1:
            assert idle_zb / idle_1f1b == Fr(1, 3)
    assert Z.bubble_fraction(4, 8) == pytest.approx(1 / 9)                 # 11.1 % against 1F1B's 27.3 %
    assert Z.bubble_fraction(4, 8, schedule="1f1b") == pytest.approx(P.bubble_fraction(4, 8))


@pytest.mark.parametrize("tf, tb, tw", [(1, 1, 0), (2, 1, 1), (3, 2, 1), (2, 3, 2), (1, 2, 3), (1, 1, 2), (3, 3, 4)])
def test_formula_holds_when_w_is_the_cheapest_and_is_a_lower_bound_otherwise(tf, tb, tw):
    for p, m in CASES:
        df = Z.zb_h1_timeline(p, m, Fr(tf), Fr(tb), Fr(tw))
        formula = m * (tf + tb + tw) + Z.bubble_time(p, tf, tb, tw)
        if m >= p and tw <= min(tf, tb):
            assert _span(df) == formula, (p, m)
        elif m >= p:
            assert _span(df) >= formula, (p, m)
        # never slower than 1F1B running B and W as one backward
        assert _span(df) <= _span(P.schedule_timeline(p, m, "1f1b", t_fwd=Fr(tf), t_bwd=Fr(tb + tw))), (p, m)


def _check(df, p, m):
    assert list(df.columns) == ["stage", "microbatch", "chunk", "kind", "start", "end"]
    assert len(df) == 3 * p * m and not df.duplicated(["stage", "microbatch", "kind"]).any()
    end = {(r.kind, r.stage, r.microbatch, r.chunk): r.end for r in df.itertuples()}
    for r in df.itertuples():
        for dep in Z.zb_h1_deps(r.kind, r.stage, r.microbatch, p):
            assert end[dep] <= r.start, (r, dep)
    for s, g in df.groupby("stage"):
        g = g.sort_values(["start", "end"])
        assert (g["start"].to_numpy()[1:] >= g["end"].to_numpy()[:-1]).all()          # one op at a time
        assert [(r.kind, r.microbatch) for r in g.itertuples()] == \
            [(k, j) for k, j, _ in Z.zb_h1_order(p, m, s)]                             # in ZB-H1's order


def test_never_violates_dependencies_even_unbalanced():
    rng = random.Random(3)
    for _ in range(80):
        p, m = rng.randint(1, 6), rng.randint(1, 10)
        times = [[Fr(rng.randint(1, 8), 4) for _ in range(p)] for _ in range(3)]
        df = Z.zb_h1_timeline(p, m, *times, stage_scale=[Fr(rng.randint(2, 6), 4) for _ in range(p)])
        _check(df, p, m)


def test_peak_memory_is_1f1b_first_stage_on_every_stage():
    for p, m in CASES:
        df = Z.zb_h1_timeline(p, m)
        for s in range(p):
            held = peak = 0
            for kind in df[df.stage == s].sort_values("start")["kind"]:
                held += {"F": 1, "B": 0, "W": -1}[kind]                 # activations go with the W
                peak = max(peak, held)
            assert peak == Z.activation_memory_microbatches(p, m, s) == min(p, m)
        assert max(Z.activation_memory_microbatches(p, m, s) for s in range(p)) == \
            P.activation_memory_microbatches(p, m, "1f1b", 0)


def test_torch_interleaved_zero_bubble_with_one_stage_per_rank_is_zb_h1():
    """torch.distributed.pipelining.ScheduleInterleavedZeroBubble, built without a process group (its
    per-rank action lists are plain Python, a private method): with one stage per rank each rank's
    F / I (input grad) / W order is exactly ``zb_h1_order``. What the bench's ``zb-h1`` runs."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    kinds = {"F": "F", "I": "B", "W": "W"}
    for p, m in [(2, 1), (2, 4), (2, 8), (3, 6), (4, 4), (4, 6), (4, 8), (4, 12)]:
        sched = object.__new__(schedules.ScheduleInterleavedZeroBubble)
        sched.n_local_stages, sched.pp_group_size, sched._n_microbatches = 1, p, m
        sched.number_of_rounds = max(1, m // p)
        sched.microbatches_per_round = m // sched.number_of_rounds
        for rank in range(p):
            ops = [a for a in sched._calculate_single_rank_operations(rank) if a is not None]
            got = [(kinds[a.computation_type.value], a.microbatch_index, 0) for a in ops]
            assert got == Z.zb_h1_order(p, m, rank), (p, m, rank)


def test_validation():
    with pytest.raises(ValueError, match="m >= p"):
        Z.bubble_fraction(4, 2)
    with pytest.raises(ValueError, match="t_w"):
        Z.zb_h1_timeline(2, 2, t_w=-1)
    with pytest.raises(ValueError, match="one per stage"):
        Z.zb_h1_timeline(3, 3, t_f=[1, 2])
    with pytest.raises(ValueError, match="stage"):
        Z.zb_h1_order(2, 2, 2)
    with pytest.raises(ValueError, match="schedule"):
        Z.bubble_time(2, schedule="gpipe")
    with pytest.raises(ValueError, match="kind"):
        Z.zb_h1_deps("X", 0, 0, 2)
