"""Chapter 2 measurements on a real small dataset made here: directions and modest bounds, never
hard-coded figures (the sizes are small, the machine is shared)."""
import json
from pathlib import Path

import pytest

from preflight.bench import datapipe, loadtune
from preflight.harness import samples as S

FILES = 400


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return datapipe.prepare(tmp_path_factory.mktemp("dp"), FILES, 64_000, seed=1)


def test_prepare_writes_both_layouts_and_reuses_them(dataset, tmp_path):
    assert len(datapipe.layout_files(dataset["small"], "small_files")) == FILES
    assert dataset["shard_count"] >= 4                      # 400 x ~5 kB in 64 kB shards
    assert len(datapipe.layout_files(dataset["shards"], "shards")) == dataset["shard_count"]
    work = Path(dataset["small"]).parents[1]                 # work/<set>/small
    again = datapipe.prepare(work, FILES, 64_000, seed=1)
    assert again["reused"] and not dataset["reused"]          # read from dataset.json, nothing rewritten
    assert {k: v for k, v in again.items() if k != "reused"} == {k: v for k, v in dataset.items() if k != "reused"}


def _prepare_in_child(work, files, queue):
    queue.put(datapipe.prepare(work, files, 16_000, seed=2)["reused"])


def test_concurrent_prepares_build_once_and_other_sets_do_not_clobber(tmp_path):
    """Two processes preparing one set at once (two audits on one machine): one builds, the other waits
    for the lock and reuses it. A set of other parameters in the same folder leaves the first intact
    (each has its own folder), and the layout of format 1 (small/ and shards/ in work/) is removed."""
    import multiprocessing as mp

    (tmp_path / "small").mkdir()
    (tmp_path / "dataset.json").write_text("{}")                      # a format-1 leftover
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_prepare_in_child, args=(tmp_path, 60, queue)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    assert sorted(queue.get(timeout=5) for _ in procs) == [False, True]    # built once, reused once
    assert not (tmp_path / "small").exists() and not (tmp_path / "dataset.json").exists()
    first = datapipe.prepare(tmp_path, 60, 16_000, seed=2)
    other = datapipe.prepare(tmp_path, 30, 16_000, seed=2)
    assert first["reused"] and not other["reused"] and first["small"] != other["small"]
    assert len(datapipe.layout_files(first["small"], "small_files")) == 60     # untouched by the other set
    assert datapipe.prepare(tmp_path, 60, 16_000, seed=2)["reused"]


def test_prepare_runs_unlocked_where_flock_is_refused(tmp_path, monkeypatch):
    """A file system mounted without flock (some parallel file systems) raises ENOLCK: prepare then
    builds without the lock, as before the lock existed, instead of failing the chapter."""
    import errno
    import fcntl

    calls = []

    def refuse(fd, op):
        calls.append(op)
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", refuse)
    got = datapipe.prepare(tmp_path, 20, 16_000, seed=3)
    assert calls, "prepare did not try to lock"
    assert not got["reused"] and len(datapipe.layout_files(got["small"], "small_files")) == 20
    assert datapipe.layout_files(got["shards"], "shards")
    assert datapipe.prepare(tmp_path, 20, 16_000, seed=3)["reused"]       # the stamp was written unlocked too


def test_small_files_are_slower_than_shards(dataset):
    # Ratios of two timings, margins measured with 2 CPU hogs on the 2 cores (medians of 5 repeats): cold
    # reads 4.2-12.9x (bound 1.5), listing 8.3-28x (bound 5: 400 stats against ~30), a stat ~5-15 us.
    st = datapipe.measure_storage(dataset["small"], dataset["shards"], FILES, repeats=5)
    sf, sh = st["small_files"], st["shards"]
    assert sh["bytes"] > sf["bytes"]              # tar headers add bytes
    assert sf["files"] == FILES and sh["files"] == dataset["shard_count"]
    assert st["slowdown_read_cold"] > 1.5       # one open per sample vs one per shard
    assert st["slowdown_list_warm"] > 5          # 400 stats vs a handful
    assert 0 < sf["stat_per_file_s"] < 1e-3
    assert st["filesystem"]
    json.dumps(st)                                # a JSON record


def test_break_point_rates(dataset):
    prep = datapipe.preprocessing_rate(dataset["shards"], samples=200)
    assert prep["samples"] == 200
    assert 10 < prep["per_sample_us"] < 20_000
    asm = datapipe.batch_assembly(dataset["small"], dataset["shards"], FILES, buffer=100)
    assert asm["global_shuffle_samples_per_s"] > 0 and asm["buffer_shuffle_samples_per_s"] > 0
    c = datapipe.consume_rate("cpu", 16)
    assert c["step_s"] > 0 and c["samples_per_s"] == pytest.approx(16 / c["step_s"])
    assert datapipe.h2d_copy("cpu", 16)["available"] is False


def test_transform_gives_cropped_normalised_image(dataset):
    from preflight.toolkit import shards

    s = next(iter(shards.shard_pipeline(dataset["shards"])))
    x, y = datapipe.transform(s)
    assert tuple(x.shape) == (3, S.CROP, S.CROP)
    assert y == S.label_of(s["__key__"])
    assert -3 < float(x.mean()) < 3


def test_tuner_workers_beat_in_process_loading(dataset):
    """An emulated device at 8 ms per step of 16 samples: loading in the loop (num_workers=0) prepares
    each batch while the device idles; one worker prepares the next batches while it 'computes'.

    Which of the two then idles less is a stopwatch ordering that a loaded machine breaks: with 2 CPU
    hogs on the 2 cores the worker has no spare core and each hand-over waits for it to be scheduled;
    3 paired sweeps of 30 steps measured 0.62 against 0.60 in-process, and at 10 steps the two were
    within best_setting's 1 point. So the sweep is checked for what it records, and the overlap on the
    mechanism: where each batch was prepared, and whether its preparation began before the loop asked."""
    import itertools

    from preflight.toolkit import loadmon

    settings = [{"num_workers": 0, "prefetch_factor": None, "pin_memory": False},
                {"num_workers": 1, "prefetch_factor": 4, "pin_memory": False}]
    res = loadtune.sweep(dataset["shards"], "cpu", 16, 0.008, settings, steps=10)
    rows = {r["num_workers"]: r for r in res["rows"]}
    # 16 decodes per step in the loop are not free: >= 0.38 of the step even idle (5 ms against 8 ms of
    # 'compute'); load only makes them slower
    assert rows[0]["idle_share"] > 0.05
    assert res["best"] == loadtune.best_setting(res["rows"])     # its rule: test_grid_and_best_setting
    assert res["consumer"].startswith("emulated")
    for r in res["rows"]:
        assert r["headroom"] == pytest.approx(r["supply_samples_per_s"] / r["consume_samples_per_s"])
        assert r["queue_depth_median"] is not None
    consumer, _ = loadtune.make_consumer("cpu", 16, 0.008)
    early = {}
    for s in settings:
        mon = loadmon.LoaderMonitor(loadtune.make_loader(dataset["shards"], 16, s["num_workers"],
                                                         s["prefetch_factor"], False), batch_size=16)
        for b in itertools.islice(mon, 12):
            consumer(b)
        df = mon.frame().iloc[2:]                          # after the worker's start-up
        assert set(df["worker"]) == ({-1} if s["num_workers"] == 0 else {0})
        asked = df["consumed_at"] - df["wait_s"]           # when the loop called next()
        early[s["num_workers"]] = float((df["produced_at"] - df["prep_s"] < asked - 1e-4).mean())
    # in the loop, a batch's transforms run inside next(): never before it was asked for; the worker
    # starts the next batch as soon as it has handed one over, i.e. while the loop still 'computes'. Idle it
    # held the former bound of 0.9 (every earlier run); beside a CPU hog and a second test process, 0.7 of them (the worker
    # is not always scheduled in time): the bound is the mechanism (some, not none), not the share
    assert early[0] == 0 and early[1] >= 0.3, early


def test_grid_and_best_setting():
    g = loadtune.grid(2, gpu=False)
    assert {"num_workers": 0, "prefetch_factor": None, "pin_memory": False} in g
    assert all(s["pin_memory"] is False for s in g)
    assert max(s["num_workers"] for s in g) == 2
    assert any(s["pin_memory"] for s in loadtune.grid(16, gpu=True))
    # 16 cores, 3 shards: more than 3 workers would sit idle (whole shards per worker)
    capped = loadtune.grid(16, gpu=True, max_workers=3)
    assert sorted({s["num_workers"] for s in capped}) == [0, 1, 2, 3]
    assert len(capped) == 1 * 2 + 3 * 2 * 2          # w=0: one prefetch; GPU: prefetch 2, 4 x pin on/off
    rows = [{"num_workers": 2, "prefetch_factor": 2, "pin_memory": False, "idle_share": 0.004},
            {"num_workers": 1, "prefetch_factor": 8, "pin_memory": False, "idle_share": 0.012},
            {"num_workers": 0, "prefetch_factor": None, "pin_memory": False, "idle_share": 0.3}]
    assert loadtune.best_setting(rows)["num_workers"] == 1      # within 1 point, fewer workers


def test_instrumentation_overhead_is_small(dataset):
    o = loadtune.instrumentation_overhead(dataset["shards"], "cpu", 16, 0.005,
                                          {"num_workers": 1, "prefetch_factor": 2, "pin_memory": False},
                                          steps=8, repeats=2)
    # the monitor's bookkeeping per step against a 5 ms step: 0.03-0.12 % measured, under 2 CPU hogs too
    assert 0 < o["bookkeeping_share_of_step"] < 0.01
    assert o["with_s"] > 0 and o["without_s"] > 0


def test_runs_alone_and_writes_a_record(tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "preflight.bench.datapipe", "--work", str(tmp_path / "w"),
                        "--files", "200", "--shard-size", "64kB", "--batch", "8", "--out", str(tmp_path / "rec")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rec = json.loads((tmp_path / "rec" / "datapipe.json").read_text())
    assert rec["method"] == "datapipe" and rec["method_version"] == datapipe.METHOD.version
    assert rec["results"]["storage"]["small_files"]["files"] == 200
    bad = subprocess.run([sys.executable, "-m", "preflight.bench.datapipe", "--work", str(tmp_path / "x"),
                          "--shard-size", "lots"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--shard-size = 'lots'" in bad.stderr
    assert not (tmp_path / "x").exists()
