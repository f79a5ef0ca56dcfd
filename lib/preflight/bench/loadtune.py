"""The loader tuner: sweep ``num_workers x prefetch_factor x pin_memory`` on the real shard pipeline
and measure, for each setting, what the device sees.

For every setting two runs, each with fresh workers:

- **supply**: drain the loader with no consumer: samples/s the pipeline can deliver;
- **consume**: a training loop at the device's rate, wrapped in ``preflight.loadmon.LoaderMonitor``:
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

from preflight import loadmon
from preflight.bench import datapipe
from preflight.models import data as M

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

    from preflight import shards

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
    for b in itertools.islice(it, steps):
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
    for s in settings:
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
