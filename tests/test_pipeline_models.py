"""Pipeline bubble, schedule simulation, stage partitioning (preflight.models.pipeline) and padding
waste / length bucketing (preflight.models.padding)."""
import itertools
import random
from fractions import Fraction as Fr

import numpy as np
import pytest

from preflight.models import padding as P
from preflight.models import pipeline as M

# --- bubble formulas ---------------------------------------------------------------------------

def test_bubble_numbers_for_p4_m8():
    assert M.bubble_fraction(4, 8) == pytest.approx(3 / 11)      # 27.3 % of wall time
    assert M.bubble_over_ideal(4, 8) == pytest.approx(3 / 8)     # 37.5 % of ideal time
    assert M.wrong_bubble(4, 8) == pytest.approx(3 / 32)         # 9.4 %: understated ~p times
    assert M.bubble_fraction(4, 8, v=2) == pytest.approx(3 / 19)
    assert M.bubble_over_ideal(4, 8, v=2) == pytest.approx(3 / 16)


def test_one_stage_has_no_bubble_and_bubble_shrinks_with_m_and_v():
    assert M.bubble_fraction(1, 5) == M.bubble_over_ideal(1, 5) == M.wrong_bubble(1, 5) == 0
    assert M.bubble_fraction(4, 32) < M.bubble_fraction(4, 8) < M.bubble_fraction(8, 8)
    assert M.bubble_fraction(4, 8, v=4) < M.bubble_fraction(4, 8, v=2) < M.bubble_fraction(4, 8)


def test_wrong_bubble_is_interleaved_bubble_over_ideal_with_v_equal_p():
    for p, m in [(2, 4), (4, 8), (8, 16)]:
        assert M.wrong_bubble(p, m) == pytest.approx(M.bubble_over_ideal(p, m, v=p))


@pytest.mark.parametrize("args, word", [((0, 4), "p"), ((4, 0), "m"), ((4, 8, 0), "v"),
                                        ((2.5, 4), "p"), ((4, 6, 2), "m % p")])
def test_bubble_validation(args, word):
    with pytest.raises(ValueError, match=word):
        M.bubble_fraction(*args)


# --- schedule simulation -----------------------------------------------------------------------

CASES = [(p, m) for p in range(1, 7) for m in range(1, 13)]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("tf, tb", [(1, 2), (1, 1), (3, 1)])
def test_simulated_bubble_equals_formula_exactly(schedule, tf, tb):
    # Fractions: exact arithmetic, so "equal" means equal. Holds for any t_b / t_f: fill and drain
    # cost (p-1) t_f and (p-1) t_b, the work m (t_f + t_b); the ratio does not depend on t_b / t_f.
    for p, m in CASES:
        df = M.schedule_timeline(p, m, schedule, t_fwd=Fr(tf), t_bwd=Fr(tb))
        assert M.timeline_bubble(df) == Fr(p - 1, m + p - 1), (p, m)
        assert df["end"].max() == (m + p - 1) * (tf + tb)


@pytest.mark.parametrize("v", [2, 3, 4])
def test_simulated_interleaved_bubble_equals_formula_exactly(v):
    for p in range(1, 6):
        for m in range(p, 4 * p + 1, p):                          # m % p == 0, m == p included
            for tf, tb in [(1, 2), (1, 1), (2, 1)]:
                df = M.schedule_timeline(p, m, "interleaved", v=v, t_fwd=Fr(tf), t_bwd=Fr(tb))
                assert M.timeline_bubble(df) == Fr(p - 1, v * m + p - 1), (p, m, v, tf, tb)


def test_float_times_agree_with_formula():
    df = M.schedule_timeline(4, 8, "1f1b")
    assert M.timeline_bubble(df) == pytest.approx(M.bubble_fraction(4, 8), abs=1e-12)
    df = M.schedule_timeline(4, 8, "interleaved", v=3)
    assert M.timeline_bubble(df) == pytest.approx(M.bubble_fraction(4, 8, 3), abs=1e-12)


def _check_dependencies(df, p, v):
    end = {(r.kind, r.stage, r.microbatch, r.chunk): r.end for r in df.itertuples()}
    for r in df.itertuples():
        for d in M._deps(r.kind, r.stage, r.microbatch, r.chunk, p, v):
            assert end[d] <= r.start
    for _, g in df.groupby("stage"):                                 # one op at a time per stage
        g = g.sort_values("start")
        assert (g["start"].to_numpy()[1:] >= g["end"].to_numpy()[:-1] - 1e-12).all()


@pytest.mark.parametrize("schedule, v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)])
def test_timeline_has_every_op_once_and_respects_dependencies(schedule, v):
    p, m = 4, 8
    df = M.schedule_timeline(p, m, schedule, v=v, stage_scale=[1, 1.5, 1, 0.7])
    assert len(df) == 2 * p * m * v
    assert not df.duplicated(["stage", "microbatch", "chunk", "kind"]).any()
    assert list(df.columns) == ["stage", "microbatch", "chunk", "kind", "start", "end"]
    _check_dependencies(df, p, v)


def _peak_in_flight(df, stage, v):
    g = df[df.stage == stage].sort_values("start")
    held = peak = 0
    for kind in g["kind"]:
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    return peak / v


@pytest.mark.parametrize("schedule, v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2),
                                         ("interleaved", 3)])
def test_activation_memory_matches_the_timeline(schedule, v):
    for p, m in [(1, 3), (2, 2), (4, 4), (4, 8), (4, 12), (3, 3), (5, 10), (3, 2)]:
        if v > 1 and m % p:
            continue
        df = M.schedule_timeline(p, m, schedule, v=v)
        for s in range(p):
            want = M.activation_memory_microbatches(p, m, schedule, stage=s, v=v)
            assert _peak_in_flight(df, s, v) == pytest.approx(want), (p, m, s)


def test_activation_memory_first_stage():
    assert M.activation_memory_microbatches(4, 32, "gpipe") == 32
    assert M.activation_memory_microbatches(4, 32, "1f1b") == 4
    assert M.activation_memory_microbatches(4, 32, "1f1b", stage=3) == 1
    # interleaved: p (1 + (p-1)/(p v)) = 4 + 3/2
    assert M.activation_memory_microbatches(4, 32, "interleaved", v=2) == pytest.approx(5.5)
    with pytest.raises(ValueError, match="stage"):
        M.activation_memory_microbatches(4, 8, "1f1b", stage=4)
    with pytest.raises(ValueError, match="schedule"):
        M.activation_memory_microbatches(4, 8, "zb")


def test_imbalanced_stages_slowest_sets_the_pace():
    rng = random.Random(1)
    for _ in range(60):
        p, m = rng.randint(1, 6), rng.randint(1, 12)
        c = [Fr(rng.randint(2, 6), 4) for _ in range(p)]
        flow_shop = (sum(c) + (m - 1) * max(c)) * 3                # GPipe: exact (t_f + t_b = 3)
        assert M.schedule_timeline(p, m, "gpipe", stage_scale=c, t_fwd=Fr(1),
                                   t_bwd=Fr(2))["end"].max() == flow_shop
        span = M.schedule_timeline(p, m, "1f1b", stage_scale=c, t_fwd=Fr(1),
                                   t_bwd=Fr(2))["end"].max()
        lower = max(m * c[k] + sum(c[:k]) for k in range(p)) * 3   # stage k's work + its fill/drain
        assert lower <= span <= flow_shop
    # one stage 1.5x slower: more idle than the balanced pipe, whatever its position
    for s in range(4):
        scale = [1.0] * 4
        scale[s] = 1.5
        df = M.schedule_timeline(4, 8, "1f1b", stage_scale=scale)
        assert M.timeline_bubble(df) > M.bubble_fraction(4, 8)


def test_schedule_validation():
    with pytest.raises(ValueError, match="interleaved"):
        M.schedule_timeline(4, 8, "1f1b", v=2)
    with pytest.raises(ValueError, match="v > 1"):
        M.schedule_timeline(4, 8, "interleaved", v=1)
    with pytest.raises(ValueError, match="stage_scale"):
        M.schedule_timeline(4, 8, stage_scale=[1, 1])
    with pytest.raises(ValueError, match="schedule"):
        M.schedule_timeline(4, 8, "pipedream")


# --- partitioning ------------------------------------------------------------------------------

def _brute_force(times, p):
    n = len(times)
    best = None
    for cuts in itertools.combinations(range(1, n), p - 1):
        bounds = (0, *cuts, n)
        b = max(sum(times[bounds[i]:bounds[i + 1]]) for i in range(p))
        best = b if best is None else min(best, b)
    return best


def test_partition_by_time_is_exact_against_brute_force():
    rng = random.Random(0)
    for _ in range(400):
        n = rng.randint(1, 9)
        p = rng.randint(1, min(4, n))
        times = [rng.choice([rng.random(), rng.randint(1, 5), 0.1, 0.2, 0.3]) for _ in range(n)]
        parts = M.partition_by_time(times, p)
        assert len(parts) == p and all(parts)
        assert [i for part in parts for i in part] == list(range(n))
        assert M.bottleneck(times, parts) == _brute_force(times, p)


def test_partition_by_count_uneven_and_edge_cases():
    assert M.partition_by_count(10, 4) == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    assert M.partition_by_count(3, 3) == [[0], [1], [2]]
    assert M.partition_by_time([1, 2, 3], 3) == [[0], [1], [2]]
    with pytest.raises(ValueError, match="p must be"):
        M.partition_by_count(3, 4)
    with pytest.raises(ValueError, match="p must be"):
        M.partition_by_time([1, 2, 3], 4)
    with pytest.raises(ValueError, match="times"):
        M.partition_by_time([1, -2, 3], 2)


def test_dominant_layer_gets_a_stage_alone_and_time_beats_count():
    times = [1, 1, 1, 10, 1, 1, 1, 1]                       # e.g. an output layer over a big vocab
    parts = M.partition_by_time(times, 4)
    assert [3] in parts
    assert M.bottleneck(times, parts) == 10
    assert M.bottleneck(times, M.partition_by_count(8, 4)) == 11
    assert M.partition_gain(times, 4) == pytest.approx(1.1)
    assert M.partition_gain([1.0] * 8, 4) == 1.0


def test_parts_must_place_every_layer_once_contiguously():
    with pytest.raises(ValueError, match="exactly once"):
        M.bottleneck([1, 1, 1], [[0], [1]])                       # layer 2 silently dropped
    with pytest.raises(ValueError, match="exactly once"):
        M.bottleneck([1, 1, 1], [[0, 1], [1, 2]])
    with pytest.raises(ValueError, match="contiguous"):
        M.bottleneck([1, 1, 1], [[0, 2], [1]])
    with pytest.raises(ValueError, match="no layer"):
        M.partition_table([1, 1], [[0, 1], []])


def test_partition_table_and_throughput():
    times = [2.0, 1.0, 1.0, 4.0]
    parts = M.partition_by_time(times, 2)
    assert parts == [[0, 1, 2], [3]]
    t = M.partition_table(times, parts, names=["emb", "b1", "b2", "head"])
    assert list(t.columns) == ["stage", "layers", "first", "last", "time", "share"]
    assert t["first"].tolist() == ["emb", "head"] and t["layers"].tolist() == [3, 1]
    assert t["time"].tolist() == [4.0, 4.0] and t["share"].sum() == pytest.approx(1.0)
    # 1F1B, m = 8 micro-batches of 4 samples: (8 + 2 - 1) slots of 4 s
    assert M.predicted_throughput(times, parts, m=8, microbatch_size=4) == pytest.approx(32 / 36)
    count = M.predicted_throughput(times, M.partition_by_count(4, 2), m=8, microbatch_size=4)
    assert count == pytest.approx(32 / (9 * 5))


# --- padding -----------------------------------------------------------------------------------

def test_lognormal_lengths_long_tail_and_clipped():
    a = P.lognormal_lengths(20000, median=512, sigma=0.8, max_len=4096, seed=0)
    assert a.dtype.kind == "i" and a.min() >= 1 and a.max() <= 4096
    assert np.median(a) == pytest.approx(512, rel=0.05)
    assert np.percentile(a, 95) / np.percentile(a, 5) > 10
    assert (P.lognormal_lengths(10, seed=3) == P.lognormal_lengths(10, seed=3)).all()


@pytest.mark.parametrize("kw", [{}, {"n_buckets": 1}, {"n_buckets": 7}, {"n_buckets": 1000},
                                {"bucket_width": 256}, {"shuffle": False}])
def test_bucket_batches_every_index_exactly_once(kw):
    lengths = P.lognormal_lengths(1003, seed=1)
    batches = P.bucket_batches(lengths, 16, seed=5, **kw)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(1003))
    assert all(1 <= len(b) <= 16 for b in batches)
    kept = P.bucket_batches(lengths, 16, seed=5, drop_last=True, **kw)
    assert all(len(b) == 16 for b in kept)
    assert len({i for b in kept for i in b}) == 16 * len(kept)


def test_bucket_batches_group_similar_lengths_and_shuffle_order():
    lengths = [5, 1, 9, 3, 7, 2, 8, 4, 6, 10]
    batches = P.bucket_batches(lengths, 2, shuffle=False)
    assert [sorted(lengths[i] for i in b) for b in batches] == [[1, 2], [3, 4], [5, 6], [7, 8],
                                                               [9, 10]]
    a = P.bucket_batches(lengths, 2, seed=0)
    b = P.bucket_batches(lengths, 2, seed=1)
    assert sorted(map(sorted, a)) == sorted(map(sorted, b))        # same buckets, new order
    assert P.bucket_batches(lengths, 2, seed=0) == a                  # deterministic per seed
    with pytest.raises(ValueError, match="not both"):
        P.bucket_batches(lengths, 2, n_buckets=2, bucket_width=4)


def test_padding_waste_hand_computed():
    lengths = [1, 2, 3, 4, 10, 10]                                    # 30 real tokens
    d = P.pad_to_longest_in_dataset(lengths, 2)
    assert (d["real_tokens"], d["padded_tokens"], d["waste"], d["relative_cost"]) == (30, 30, 0.5, 2.0)
    b = P.length_bucketing(lengths, 2)                              # [1,2] [3,4] [10,10]: 1+1+0
    assert (b["padded_tokens"], b["waste"]) == (2, pytest.approx(2 / 32))
    assert b["relative_cost"] == pytest.approx(32 / 30)
    assert P.pad_to_longest_in_batch(lengths, 1)["padded_tokens"] == 0
    assert P.pad_to_longest_in_batch(lengths, 6)["padded_tokens"] == 30


def test_waste_ordering_on_a_long_tail():
    lengths = P.lognormal_lengths(20000, seed=0)
    t = P.padding_table(lengths, 32)
    assert list(t.columns) == ["strategy", "real_tokens", "padded_tokens", "waste", "relative_cost"]
    w = t["waste"].tolist()
    assert w[0] >= w[1] >= w[2]
    assert w[0] > 0.8 and w[2] < 0.01 and w[1] > 0.3
    assert (t["real_tokens"] == int(lengths.sum())).all()
    coarse = P.length_bucketing(lengths, 32, n_buckets=8)["waste"]
    assert w[2] <= coarse <= w[1]                                   # fewer buckets: more padding


def test_load_lengths(tmp_path):
    f = tmp_path / "lens.txt"
    f.write_text("12\n\n7\n300\n")
    assert P.load_lengths(f).tolist() == [12, 7, 300]
    c = tmp_path / "lens.csv"
    c.write_text("id,length\na,5\nb,9\n")
    assert P.load_lengths(c).tolist() == [5, 9]
    f.write_text("12\n7\nabc\n")
    with pytest.raises(ValueError, match=r":3: 'abc'"):
        P.load_lengths(f)
    f.write_text("4\n0\n")
    with pytest.raises(ValueError, match=r":2: length must be >= 1"):
        P.load_lengths(f)
    c.write_text("id,length\na,5\nb\n")
    with pytest.raises(ValueError, match=r":3: no 'length' column"):
        P.load_lengths(c)
    f.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        P.load_lengths(f)


# --- packing -----------------------------------------------------------------------------------

@pytest.mark.parametrize("policy", sorted(P.PACKING))
def test_pack_rows_place_every_token_once(policy):
    lengths = P.lognormal_lengths(3001, median=300, sigma=1.0, max_len=5000, seed=2)   # some longer than a row
    rows = P.pack_rows(lengths, 1024, policy=policy, seed=4)
    placed = np.zeros(lengths.size, dtype=np.int64)
    for row in rows:
        assert 1 <= sum(n for _, n in row) <= 1024
        for i, n in row:
            placed[i] += n
    assert (placed == lengths).all()                                  # every token of every sample, once
    if policy == "split":
        assert all(sum(n for _, n in row) == 1024 for row in rows[:-1])   # only the last row has a tail
    else:                                                             # whole: a sample is in one row ...
        rows_of = {}
        for r, row in enumerate(rows):
            for i, _ in row:
                rows_of.setdefault(i, []).append(r)
        assert all(len(rs) == 1 for i, rs in rows_of.items() if lengths[i] <= 1024)
        assert all(len(rs) == -(-int(lengths[i]) // 1024) for i, rs in rows_of.items())   # ... or whole rows


def test_split_packing_counts_equal_the_built_rows():
    """packing(policy="split") counts rows, samples per batch and cut samples without building the rows;
    the counts must equal those of pack_rows' rows (the reference), also with samples longer than a row."""
    rng = np.random.default_rng(7)
    for seq_len, batch, hi in [(5, 1, 4), (64, 3, 300), (1024, 16, 5000), (1, 2, 3)]:
        lengths = rng.integers(1, hi + 1, size=int(rng.integers(1, 400)))
        rows = P.pack_rows(lengths, seq_len, policy="split", seed=3)
        per_batch = [len({i for row in rows[k:k + batch] for i, _ in row}) for k in range(0, len(rows), batch)]
        pieces = np.bincount([i for row in rows for i, _ in row], minlength=lengths.size)
        got = P.packing(lengths, seq_len, batch, policy="split", seed=3)
        assert got["rows"] == len(rows)
        assert (got["samples_per_batch_min"], got["samples_per_batch_max"]) == (min(per_batch), max(per_batch))
        assert got["samples_per_batch_mean"] == pytest.approx(np.mean(per_batch))
        assert got["split_samples"] == int((pieces > 1).sum())


def test_packing_hand_computed():
    three = [3, 3, 3]                                                 # 9 tokens, rows of 5
    split = P.packing(three, 5, batch=1, policy="split")
    assert (split["rows"], split["padded_tokens"], split["split_samples"]) == (2, 1, 1)   # 5 + 4
    nf = P.packing(three, 5, batch=1, policy="next_fit")              # 3 | 3 | 3: 2 padding tokens each
    assert (nf["rows"], nf["padded_tokens"], nf["waste"]) == (3, 6, pytest.approx(6 / 15))
    bf = P.packing([4, 1, 3, 2], 5, batch=1, policy="best_fit")       # {4, 1} {3, 2}: no padding at all
    assert (bf["rows"], bf["padded_tokens"]) == (2, 0)
    assert sorted(sorted(n for _, n in row) for row in P.pack_rows([4, 1, 3, 2], 5, "best_fit")) == [[1, 4], [2, 3]]
    assert P.pack_rows([12], 5, "next_fit") == [[(0, 5)], [(0, 5)], [(0, 2)]]
    ones = P.packing([1] * 20, 4, batch=2)                            # batch statistics: 8 samples per batch
    assert (ones["samples_per_batch_min"], ones["samples_per_batch_max"]) == (4, 8)   # last batch: one row
    with pytest.raises(ValueError, match="policy"):
        P.pack_rows([3], 5, policy="first_fit")
    with pytest.raises(ValueError, match="seq_len"):
        P.pack_rows([3], 0)


def test_packing_against_padding_on_a_long_tail():
    lengths = P.lognormal_lengths(20000, seed=0)                      # median 512, rows of 4096
    t = P.padding_table(lengths, 16, n_buckets=16, seq_len=4096).set_index("strategy")
    assert list(t.columns) == ["real_tokens", "padded_tokens", "waste", "relative_cost"]
    split, nf, bf = (t.loc[P.PACKING[k], "waste"] for k in ("split", "next_fit", "best_fit"))
    assert split < 4096 / lengths.sum()                               # at most one row's tail
    assert bf < 0.01 < nf < t.loc["pad to longest in batch", "waste"]  # next fit leaves ~15 %: a poor packer
    assert bf < t.loc["length bucketing", "waste"]
    assert len(P.padding_table(lengths, 16)) == 3                     # without seq_len: the padding strategies
    r = P.packing(lengths, 4096, batch=16)
    assert r["samples_per_batch_min"] < r["samples_per_batch_mean"] < r["samples_per_batch_max"]
