"""Loader instrumentation on real (small, sleep-based) DataLoaders."""
import math
import pickle
import time
import warnings
from collections import OrderedDict

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from preflight.toolkit import loadmon
from preflight.toolkit.loadmon import COLUMNS, LoaderMonitor, Stamped, bookkeeping_cost_s, overhead, stamped, timed

PREP_S = 0.002      # per-sample transform time
BATCH = 8

SUMMARY_KEYS = {"time/data_wait_median(s)", "time/data_wait_p90(s)", "time/data_wait(%)",
                "loader/queue_depth_median", "loader/queue_depth_min",
                "loader/prep_rate_per_worker(samples/s)", "loader/steps", "loader/throughput(samples/s)"}


def slow_transform(i):
    time.sleep(PREP_S)
    return torch.full((4,), float(i)), i


class SleepDataset(Dataset):
    def __init__(self, n, transform):
        self.n, self.transform = n, transform

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.transform(i)


class SleepStream(IterableDataset):
    def __init__(self, n):
        self.n, self.transform = n, timed(slow_transform)

    def __iter__(self):
        return (self.transform(i) for i in range(self.n))


def run(loader, compute_s=0.0, **kw):
    mon = LoaderMonitor(loader, **kw)
    seen = []
    for x, idx in mon:
        seen.extend(idx.tolist())
        assert x.shape == (len(idx), 4) and torch.equal(x[:, 0], idx.float())
        if compute_s:
            time.sleep(compute_s)
    return mon, seen


def test_starved_loader_in_process():
    # Sleeps end late on a loaded machine (2 ms took ~7 ms with 2 CPU hogs on the 2 cores), so absolute
    # upper bounds on waits and lower bounds on rates do not hold; the bounds here are the ones sleeps
    # keep (never early) and the relation between two measures of the same sleeps.
    ds = SleepDataset(12 * BATCH, timed(slow_transform))
    mon, seen = run(DataLoader(ds, batch_size=BATCH, collate_fn=stamped()))
    assert seen == list(range(12 * BATCH))
    s = mon.summary()
    wait, rate = s["time/data_wait_median(s)"], s["loader/prep_rate_per_worker(samples/s)"]
    assert wait >= BATCH * PREP_S                               # 8 x 2 ms of transforms per batch
    assert s["loader/queue_depth_median"] <= 1 and s["loader/queue_depth_min"] <= 1
    assert s["time/data_wait(%)"] > 90                          # nothing else in the loop
    assert 0 < rate <= 1 / PREP_S                               # a 2 ms sleep per sample
    # in-process, the loop's wait for a batch is its 8 transforms (plus the collate): per sample, the
    # same sleeps timed twice, so they agree whatever the load (a per-batch rate would be 8x off)
    assert rate * wait == pytest.approx(BATCH, rel=0.3)
    df = mon.frame()
    assert (df["worker"] == -1).all() and (df["prep_n"] == BATCH).all()


def test_fed_loader_with_workers():
    # Demand 12.5 batches/s against a supply of ~120/s idle. With 2 CPU hogs on the 2 cores sleeps end
    # ~3.5x late: at 40 ms of 'compute' per step (the old demand) the workers then only just kept up and
    # the median wait was 14 ms; at 80 ms the supply still has ~3x headroom, so the queue stays full.
    ds = SleepDataset(24 * BATCH, timed(slow_transform))
    loader = DataLoader(ds, batch_size=BATCH, num_workers=2, prefetch_factor=4, collate_fn=stamped())
    loadmon._PREP[:] = [100.0, 1000]     # stale parent counter: forked workers must not inherit it
    try:
        mon, seen = run(loader, compute_s=0.080)
    finally:
        loadmon._PREP[:] = [0.0, 0]
    assert sorted(seen) == list(range(24 * BATCH))
    s = mon.summary()
    # fed: each batch was ready before the loop asked for it (after the workers' start-up), so what the loop
    # still waits for is the hand-over of a ready batch, less than preparing one takes (~0.3 ms idle; 5.4 ms
    # once with 2 CPU hogs, when the worker has to be scheduled to pass the tensors' file descriptors)
    df = mon.frame().iloc[2:]
    assert (df["produced_at"] <= df["consumed_at"] - df["wait_s"]).mean() >= 0.9, df
    assert s["time/data_wait_median(s)"] < BATCH * PREP_S
    assert s["loader/queue_depth_median"] >= 2
    rate, throughput = s["loader/prep_rate_per_worker(samples/s)"], s["loader/throughput(samples/s)"]
    assert 0 < rate <= 1 / PREP_S                               # a 2 ms sleep per sample, never shorter
    assert 2 * rate > throughput                                # what was consumed, 2 workers prepared
    assert 8 / 0.080 / 2 < throughput < 8 / 0.080 * 1.1         # the consumer sets the pace
    df = mon.frame()
    assert set(df["worker"]) == {0, 1}
    assert (df["produced_at"] <= df["consumed_at"]).all()
    assert df["prep_n"].sum() == 24 * BATCH


def test_iterable_dataset_and_pin_memory():
    # On a CPU-only torch the DataLoader warns and skips pinning; the batches must still come out right.
    loader = DataLoader(SleepStream(5 * BATCH), batch_size=BATCH, num_workers=1, pin_memory=True,
                        collate_fn=stamped())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        mon, seen = run(loader)
    assert seen == list(range(5 * BATCH))
    assert len(mon.frame()) == 5 and mon.summary()["loader/prep_rate_per_worker(samples/s)"] > 0


def test_stamped_pin_memory_pins_nested_tensors(monkeypatch):
    pinned = []

    def fake_pin(self, device=None):    # real pinning needs an accelerator
        pinned.append(self)
        return self.clone()

    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    a, b, c = torch.zeros(2), torch.ones(2), torch.arange(3)
    st = Stamped(OrderedDict(x=(a, [b]), y=c, meta="text"), 1.0, 3, 0.5, 8, 8)
    out = st.pin_memory()
    assert isinstance(out, Stamped) and len(pinned) == 3
    assert (out.produced_at, out.worker, out.prep_s, out.prep_n, out.samples) == (1.0, 3, 0.5, 8, 8)
    assert type(out.batch) is OrderedDict and isinstance(out.batch["x"], tuple) and isinstance(out.batch["x"][1], list)
    assert out.batch["meta"] == "text" and torch.equal(out.batch["y"], c)
    # the DataLoader's pin-memory thread goes through this helper, which defers to our method
    from torch.utils.data._utils.pin_memory import pin_memory
    assert isinstance(pin_memory(st), Stamped)


def test_stamped_and_timed_pickle():
    st = stamped()([(torch.zeros(2), 0), (torch.ones(2), 1)])
    back = pickle.loads(pickle.dumps(st))
    assert back.samples == 2 and back.worker == -1 and torch.equal(back.batch[0], st.batch[0])
    assert pickle.loads(pickle.dumps(stamped()))([1, 2]).batch.tolist() == [1, 2]
    assert pickle.loads(pickle.dumps(timed(abs)))(-3) == 3


def test_plain_loader_records_waits_only():
    ds = SleepDataset(6 * BATCH, slow_transform)
    mon, seen = run(DataLoader(ds, batch_size=BATCH))
    assert seen == list(range(6 * BATCH))
    df = mon.frame()
    assert df[["worker", "produced_at", "queue_depth", "prep_s", "prep_n"]].isna().all().all()
    assert (df["wait_s"] > 0.01).all() and (df["samples"] == BATCH).all()   # from loader.batch_size
    s = mon.summary()
    assert s["loader/queue_depth_median"] is None and s["loader/prep_rate_per_worker(samples/s)"] is None
    assert s["time/data_wait_median(s)"] > 0.01 and s["loader/throughput(samples/s)"] > 0


def test_frame_and_summary_shape():
    ds = SleepDataset(4 * BATCH, timed(slow_transform))
    mon, _ = run(DataLoader(ds, batch_size=BATCH, collate_fn=stamped()))
    df = mon.frame()
    assert list(df.columns) == COLUMNS and len(df) == 4 and df["step"].tolist() == [0, 1, 2, 3]
    s = mon.summary()
    assert set(s) == SUMMARY_KEYS and s["loader/steps"] == 4
    assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in s.values())
    assert s["time/data_wait_median(s)"] <= s["time/data_wait_p90(s)"]
    empty = LoaderMonitor([]).summary()
    assert set(empty) == SUMMARY_KEYS and empty["loader/steps"] == 0


def test_queue_depth_from_stamps():
    mon = LoaderMonitor([])
    # (produced_at, consumed_at): batch 0 alone; batches 1-3 all ready by the time 1 is consumed
    for p, c in [(0.0, 1.0), (1.5, 2.0), (1.6, 3.0), (1.7, 4.0), (5.0, 5.0)]:
        mon.rows.append((c, 0.0, c, 0, p, 0.0, 0, 1))
    assert mon.frame()["queue_depth"].tolist() == [1, 3, 2, 1, 1]


def test_bookkeeping_cost_is_small_and_leaves_counter_alone():
    loadmon._PREP[:] = [1.25, 7]
    cost = bookkeeping_cost_s(steps=500)
    assert 0 < cost < 1e-3
    assert loadmon._PREP == [1.25, 7]
    loadmon._PREP[:] = [0.0, 0]


def test_overhead_arithmetic(monkeypatch):
    monkeypatch.setattr(loadmon, "bookkeeping_cost_s", lambda: 2e-6)
    calls = []
    with_times, without_times = iter([1.3, 1.1, 1.2]), iter([1.0, 0.9, 1.1])
    out = overhead(lambda: calls.append("w") or next(with_times),
                   lambda: calls.append("o") or next(without_times), repeats=3)
    assert out["with_s"] == 1.2 and out["without_s"] == 1.0
    assert out["overhead_fraction"] == pytest.approx(0.2)
    assert out["bookkeeping_s_per_step"] == 2e-6
    assert calls == ["w", "o", "o", "w", "w", "o"]
