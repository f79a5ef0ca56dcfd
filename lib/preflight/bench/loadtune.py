"""The loader tuner: sweep ``num_workers x prefetch_factor x pin_memory`` on the real shard pipeline
and measure, for each setting, what the device sees.

For every setting two runs, each with fresh workers:

- **supply**: drain the loader with no consumer: samples/s the pipeline can deliver;
- **consume**: a training loop at the device's rate, wrapped in ``preflight.toolkit.loadmon.LoaderMonitor``:
  per-step data wait, the device idle share (wait / loop time), the prefetch queue depth.

headroom = supply / consumption, judged by the 1.2x rule (``preflight.models.data``).

The consumer: on a GPU, the real training step of ``datapipe.consumer_model`` (host-to-device copy
included, synchronised each step so a wait is a real device idle). On the CPU fallback the device is
*emulated*: each step is a ``sleep`` of the measured CPU step time. A GPU leaves the host cores free
for loader workers while it computes; a CPU step would take them (two cores here), which is not the
situation being tuned. Labelled "emulated" wherever it shows.
"""
from __future__ import annotations

import itertools
import os
import time

from preflight.bench import datapipe
from preflight.core.records import Method
from preflight.harness import progress
from preflight.models import data as M
from preflight.toolkit import loadmon

TUNE = Method("loadtune", 1, required=("rows", "best.idle_share", "consumer", "consume_samples_per_s", "traces"))
OVERHEAD = Method("loadmon_overhead", 1, required=("bookkeeping_s_per_step", "bookkeeping_share_of_step",
                                                   "overhead_fraction", "with_s", "without_s"))
SKIP_STEPS = 2          # worker start-up lands in the first steps: not part of the steady state


def grid(cores: int, gpu: bool, quick: bool = False, max_workers: int | None = None) -> list[dict]:
    """The settings to sweep: workers 0 and up to the cores, but not beyond ``max_workers`` (the
    shard count: webdataset hands each worker whole shards, so extra workers sit idle); prefetch 2
    (PyTorch's default), 4, 8 (quick, or on a GPU where pin_memory doubles the grid: 2, 4);
    pin_memory only where there is a device to copy to."""
    top = max(1, min(cores, max_workers)) if max_workers else cores
    workers = sorted({min(w, top) for w in ({0, 1, 2, *M.recommended_workers(cores), cores} if cores <= 4 else
                                            {0, 1, 2, 4, *M.recommended_workers(cores), cores})})
    prefetch = (2, 4) if quick or gpu else (2, 4, 8)
    pins = (False, True) if gpu else (False,)
    out = []
    for w, pf, pin in itertools.product(workers, prefetch, pins):
        if w == 0 and pf != prefetch[0]:
            continue                          # prefetch_factor means nothing without workers
        out.append({"num_workers": w, "prefetch_factor": pf if w else None, "pin_memory": pin})
    return out


def make_loader(shard_dir: str, batch: int, num_workers: int, prefetch_factor: int | None,
                pin_memory: bool, instrumented: bool = True, seed: int = 0):
    """A DataLoader over the shard pipeline (batching inside the pipeline, as webdataset does)."""
    import torch

    from preflight.toolkit import shards

    tf = datapipe.transform
    ds = shards.shard_pipeline(shard_dir, transform=loadmon.timed(tf) if instrumented else tf,
                               batch_size=batch,
                               collate_fn=loadmon.stamped() if instrumented else None,
                               shuffle_buffer=256, seed=seed)
    kw = {"num_workers": num_workers, "pin_memory": pin_memory, "batch_size": None}
    if num_workers:
        kw["prefetch_factor"] = prefetch_factor
    return torch.utils.data.DataLoader(ds, **kw)


def supply_rate(loader, batch: int, steps: int) -> float:
    """Samples/s delivered with no consumer, after the first batches (worker start-up)."""
    it = iter(loader)
    for _ in range(SKIP_STEPS):
        next(it)
    t = time.perf_counter()
    n = 0
    for _ in itertools.islice(it, steps):
        n += batch
    dt = time.perf_counter() - t
    del it
    return n / dt if dt > 0 else float("nan")


def make_consumer(device, batch: int, step_s: float):
    """A callable(batch) doing one step: the real one on a GPU, an emulated wait on the CPU."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return (lambda b: time.sleep(step_s)), "emulated device: a wait of the measured CPU step time"
    model = datapipe.consumer_model().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(b):
        x, y = b
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        torch.cuda.synchronize(dev)
    return step, "real training step on the device"


def consume(loader, consumer, batch: int, steps: int) -> dict:
    """Run ``steps`` training steps through a ``LoaderMonitor``; its summary."""
    mon = loadmon.LoaderMonitor(loader, batch_size=batch)
    for b in itertools.islice(mon, steps + SKIP_STEPS):
        consumer(b)
    return mon.summary(skip_first=SKIP_STEPS)


def sweep(shard_dir: str, device, batch: int, step_s: float, settings: list[dict], steps: int = 40) -> dict:
    """Measure every setting; the rows, the consumer's label, and the chosen best setting."""
    import torch

    consumer, label = make_consumer(device, batch, step_s)
    consume_per_s = batch / step_s
    rows = []
    for s in progress.steps(settings, "loader settings"):       # a bar in the notebook
        pin = s["pin_memory"] and torch.device(device).type == "cuda"
        sup = supply_rate(make_loader(shard_dir, batch, s["num_workers"], s["prefetch_factor"], pin),
                          batch, steps)
        summ = consume(make_loader(shard_dir, batch, s["num_workers"], s["prefetch_factor"], pin),
                       consumer, batch, steps)
        rows.append({**s, "supply_samples_per_s": sup, "consume_samples_per_s": consume_per_s,
                     "headroom": sup / consume_per_s,
                     "idle_share": summ["time/data_wait(%)"] / 100,
                     "wait_median_ms": summ["time/data_wait_median(s)"] * 1e3,
                     "wait_p90_ms": summ["time/data_wait_p90(s)"] * 1e3,
                     "queue_depth_median": summ["loader/queue_depth_median"],
                     "achieved_samples_per_s": summ.get("loader/throughput(samples/s)"),
                     "prep_per_worker_samples_per_s": summ.get("loader/prep_rate_per_worker(samples/s)")})
    return {"rows": rows, "consumer": label, "step_s": step_s, "batch": batch,
            "consume_samples_per_s": consume_per_s, "best": best_setting(rows), "cores": os.cpu_count()}


def best_setting(rows: list[dict], tolerance: float = M.BEST_TOLERANCE) -> dict:
    """The cheapest setting whose idle share is within ``tolerance`` of the lowest measured:
    fewest workers, then smallest prefetch, then no pinning (each costs host memory or cores)."""
    low = min(r["idle_share"] for r in rows)
    ok = [r for r in rows if r["idle_share"] <= low + tolerance]
    return min(ok, key=lambda r: (r["num_workers"], r["prefetch_factor"] or 0, r["pin_memory"]))


def traces(shard_dir: str, device, batch: int, step_s: float, default: dict, best: dict,
           steps: int = 40) -> list[dict]:
    """Per-step monitor rows (wait, queue depth) of the default and the best setting, for a chart."""
    consumer, _ = make_consumer(device, batch, step_s)
    out = []
    for name, s in (("default (num_workers=0)", default), (f"best ({M.setting_label(best)})", best)):
        mon = loadmon.LoaderMonitor(make_loader(shard_dir, batch, s["num_workers"], s["prefetch_factor"],
                                                s["pin_memory"]), batch_size=batch)
        for b in itertools.islice(mon, steps):
            consumer(b)
        df = mon.frame()
        out += [{"run": name, "step": int(r.step), "wait_s": float(r.wait_s),
                 "queue_depth": None if r.queue_depth != r.queue_depth else float(r.queue_depth)}
                for r in df.itertuples()]
    return out


def instrumentation_overhead(shard_dir: str, device, batch: int, step_s: float, setting: dict,
                             steps: int = 30, repeats: int = 3) -> dict:
    """What the monitor costs: the same loop with and without it (end to end, noisy on a shared
    CPU) and the bookkeeping microbenchmark per step, both against the step time."""
    consumer, _ = make_consumer(device, batch, step_s)

    def loop(instrumented: bool) -> float:
        ld = make_loader(shard_dir, batch, setting["num_workers"], setting["prefetch_factor"],
                         False, instrumented=instrumented)
        it = loadmon.LoaderMonitor(ld, batch_size=batch) if instrumented else ld
        it = iter(it)
        for _ in range(SKIP_STEPS):
            consumer(next(it))
        t = time.perf_counter()
        for b in itertools.islice(it, steps):
            consumer(b)
        return time.perf_counter() - t

    o = loadmon.overhead(lambda: loop(True), lambda: loop(False), repeats=repeats)
    o["step_s"] = step_s
    o["bookkeeping_share_of_step"] = o["bookkeeping_s_per_step"] / step_s
    return o


# ------------------------------------------------------------- the two methods, as chapter 2 runs them
def measure_tune(shard_dir: str, device, batch: int, step_s: float, max_workers: int | None = None,
                 gpu: bool = False, quick: bool = False) -> dict:
    """Method ``loadtune``: the grid for this machine's usable cores (no more workers than
    ``max_workers``, the shard count), swept against a consumer of ``step_s`` per step, plus the
    per-step traces of the default (no workers) and the best setting."""
    settings = grid(len(os.sched_getaffinity(0)), gpu, quick=quick, max_workers=max_workers)
    steps = 12 if quick else 40
    res = sweep(shard_dir, device, batch, step_s, settings, steps=steps)
    default = next(r for r in res["rows"] if r["num_workers"] == 0)
    res["traces"] = traces(shard_dir, device, batch, step_s, default, res["best"], steps=steps)
    return res


def measure_overhead(shard_dir: str, device, batch: int, step_s: float, setting: dict,
                     quick: bool = False) -> dict:
    """Method ``loadmon_overhead``: what the loader monitor costs at ``setting`` (the tuner's best)."""
    return instrumentation_overhead(shard_dir, device, batch, step_s, setting,
                                    steps=12 if quick else 30, repeats=2 if quick else 3)


def main(argv=None) -> int:
    """``python -m preflight.bench.loadtune --work DIR --out DIR``: the tuner and the monitor's cost on
    the shards of the test set in DIR (made there as ``bench.datapipe`` makes it, or reused)."""
    import argparse

    from preflight.core import device as D
    from preflight.core.records import save_record
    from preflight.toolkit.shards import parse_size

    ap = argparse.ArgumentParser(prog="python -m preflight.bench.loadtune",
                                 description="DataLoader workers x prefetch x pin_memory against the device's rate.")
    ap.add_argument("--work", required=True, help="scratch folder on the storage to test (as for bench.datapipe)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--quick", action="store_true", help="the small test set, fewer steps")
    ap.add_argument("--out", required=True, help="folder for the JSON records (loadtune, loadmon_overhead)")
    a = ap.parse_args(argv)
    if not 1 <= a.batch <= 65_536:
        ap.error(f"--batch = {a.batch}: accepted range is 1 to 65,536")
    sizes = datapipe.QUICK if a.quick else datapipe.DEFAULT
    info = datapipe.prepare(a.work, sizes["files"], parse_size(sizes["shard_size"]))
    where = D.probe()
    dev = D.torch_device(where)
    step_s = datapipe.consume_rate(dev, a.batch)["step_s"]
    params = {"quick": a.quick, "work": a.work, "batch": a.batch}
    tune = measure_tune(info["shards"], dev, a.batch, step_s, info["shard_count"], where.is_gpu, a.quick)
    print(save_record(TUNE.record(params, tune, where.as_dict()), a.out))
    over = measure_overhead(info["shards"], dev, a.batch, step_s, tune["best"], a.quick)
    print(save_record(OVERHEAD.record(params, over, where.as_dict()), a.out))
    print("best:", M.setting_label(tune["best"]), f"- device idle {tune['best']['idle_share']:.1%}; monitor "
          f"bookkeeping {over['bookkeeping_share_of_step']:.3%} of a step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
