# %% [markdown]
# # Chapter 2: The starved data pipeline
#
# **Pitfall:** low or jumpy device utilisation blamed on compute or on the parallel plan, when the
# device is waiting for data. The chain is storage -> network -> host memory -> preprocessing ->
# batch assembly -> host-to-device copy -> device, and it breaks in four usual places:
#
# 1. **storage**: millions of small files on a parallel file system (metadata, not bandwidth);
# 2. **CPU preprocessing**: too few loader workers, decode/augment saturating the cores;
# 3. **batch assembly**: a global shuffle means random access to every sample;
# 4. **host-to-device**: synchronous copies from pageable memory inside the loop.
#
# **Rule:** every stage must supply at least **1.2x** what the device consumes, or any jitter idles it.
# "Jumpy utilisation: look upstream first."
#
# What it measures, live on this machine: the same dataset as 20,000 small files and as tar shards
# (listing and reading, cold and warm); each break point against the device's consumption rate; a
# loader tuner over `num_workers x prefetch_factor x pin_memory`; the cost of the instrumentation you
# should keep on.
#
# **Time:** about 1 minute on a 2-core CPU (measured: 59 s in the audit; writing the 20,000 files the
# first time is 15 s of it; the dataset is kept for the next run). On a GPU node: not timed yet; it
# depends mostly on the storage tested. `plan_only = True`: the listing estimate of your profile only
# (seconds).

# %%
# parameters: the audit (papermill) overrides these; in JupyterLab edit them here.
profile_path = "../data/profiles/example.yaml"
findings_path = ""      # where the audit collects findings; empty: keep them in memory
plan_only = False       # True: formulas on the profile only, no live measurement
results_dir = ""        # folder of recorded measurements (e.g. from your cluster) to use instead
out_dir = ""            # the audit's output folder (records, charts)
quick = False           # smallest sizes (smoke test)
interactive = True      # show the sliders (the headless audit turns them off)
traces_dir = ""         # your job's torch.profiler traces (a folder, one file or more per rank); empty: the example
data_dir = ""           # folder ON THE STORAGE TO TEST (default: the profile's data.scratch_dir, else .cache/)
files = 20000           # small files to generate (quick: 2,000)
shard_size = "8MB"      # shard size of the demo (the advice for real data: 200-500 MB)
batch = 64              # samples per batch

# %%
print("Loading the chapter's libraries (a few seconds) ..." if plan_only else
      "Loading the chapter's libraries, then PyTorch to probe the device (about 10 s) ...")

import os

import pandas as pd

from preflight import REPO
from preflight.bench import datapipe
from preflight.chapters import data_pipeline as C
from preflight.core.numfmt import plural
from preflight.models import data as M
from preflight.reporting import charts
from preflight.runner.chapter import start

ch = start("data_pipeline", profile_path, findings_path or None, plan_only, results_dir or None,
           out_dir or None, quick=quick)
prof = ch.profile
if ch.quick:
    files, shard_size = min(files, datapipe.QUICK["files"]), datapipe.QUICK["shard_size"]
scratch = data_dir or prof.data.scratch_dir      # the storage to test: the profile's, or this repository's disk
work = os.path.join(scratch, "preflight-chapter2") if scratch else str(REPO / ".cache" / "data_pipeline")
print(f"project {prof.project}: {prof.data.files:,} files of {prof.data.mean_file_kB:g} kB "
      f"on {M.storage_label(prof.data.storage)}")
ch.announce()
if ch.measure:
    print(f"test dataset in {work}")

# %% [markdown]
# ## 1. Your dataset at start-up: the metadata bill
#
# A parallel file system streams large files at tens of GB/s, but each file costs a round trip to a
# metadata server to find and to open. The field case: 10 million files of a few kB on Lustre; listing
# them took 20+ minutes at every start, worse when many nodes started at once; repacked into
# 200-500 MB WebDataset shards, the scan took about ten seconds without touching model code.
#
# Below: the profile's dataset listed serially from one client, with per-file latencies from published
# measurements (sources in the table; GPFS has no public single-client figure and is assumed equal to
# Lustre). Measure your own with this chapter on the cluster (`data_dir` on the parallel file system).

# %%
C.add_listing_finding(ch.findings, prof)
ch.table(C.listing_table(prof))

# %% [markdown]
# ## 2. Small files vs shards, measured here
#
# The same samples (64x64 images, PNG-style filter + zlib, a few kB each) written as one file each in
# class folders, then packed into tar shards with `python -m preflight shards SRC DST --shard-size ...`
# (webdataset's tar format; resumable, verified). Here the shards are small (`shard_size`) so that
# every loader worker gets several; on a cluster use 200-500 MB and no file under 64 MB.
#
# **Cold** reads empty the page cache for the files first (`posix_fadvise(DONTNEED)`, no root needed).
# The kernel keeps directory and inode metadata cached (dropping it needs root), so the cold *listing*
# on a local disk is a lower bound: the metadata round trips of a parallel file system are what the
# table above adds.

# %%
from preflight.toolkit.shards import parse_size

pipe = ch.measurement(datapipe.METHOD, lambda: datapipe.measure(work, files, parse_size(shard_size), ch.torch_device,
                                                                  batch, quick=ch.quick))
if pipe:
    r = pipe.results
    st = r["storage"]
    made = "were made earlier: writing" if r["dataset"].get("reused") else "writing"
    print(pipe.source, f"- file system: {st['filesystem']}; the {r['dataset']['params']['files']:,} small files {made} "
          f"them took {r['dataset']['write_small_files_s']:.1f} s, packing them into {r['dataset']['shard_count']} "
          f"shards {r['dataset']['convert_s']:.1f} s")
    rows = []
    for layout in ("small_files", "shards"):
        x = st[layout]
        rows.append({"layout": layout, "files": x["files"], "MB": x["bytes"] / 1e6,
                     "listing, metadata cached (ms)": x["list_warm_s"] * 1e3,
                     "read cold (MB/s)": x["read_cold_MBps"], "read warm (MB/s)": x["read_warm_MBps"]})
    ch.table(pd.DataFrame(rows))
    print(f"small files / shards: cold read {st['slowdown_read_cold']:.1f}x slower, warm {st['slowdown_read_warm']:.1f}x, "
          f"listing {st['slowdown_list_warm']:.0f}x")
    ch.show("read_rate", charts.bars(pd.DataFrame(
        [{"read": f"{lay}, {c}", "MB/s": st[lay][f"read_{c}_MBps"]} for lay in ("small_files", "shards")
         for c in ("cold", "warm")]), "MB/s", "read", title="Full read of the same samples (MB/s)", fmt=",.0f"))
    print("The profile's dataset with this machine's measured stat latency:")
    ch.table(C.listing_table(prof, st["small_files"]["stat_per_file_s"]).tail(1))

# %% [markdown]
# ## 3. The four break points, each against what the device consumes
#
# Consumption: one real training step of a small CNN on the device (a batch already in device memory),
# as samples/s. Each stage is measured alone: storage read, decode + augment on **one** core (what one
# loader worker delivers), batch assembly with a global shuffle (random access over small files) vs
# sequential shards through a shuffle buffer, and the host-to-device copy (GPU only). A stage under
# 1.2x is a break point; the CPU line "all cores" is an upper bound, since the training process needs
# cores too.

# %%
if pipe:
    c = r["consume"]
    print(f"device consumption: {c['samples_per_s']:,.0f} samples/s (batch {c['batch']}, step {c['step_s'] * 1e3:.2f} ms "
          f"on {c['device']}); one worker preprocesses {r['preprocessing']['per_worker_samples_per_s']:,.0f} samples/s "
          f"({r['preprocessing']['per_sample_us']:.0f} us per sample) -> "
          f"{plural(M.workers_needed(c['samples_per_s'], r['preprocessing']['per_worker_samples_per_s']), 'worker')} "
          "for 1.2x")
    bp = C.break_points(st, r["preprocessing"], r["assembly"], c, r["h2d"], r["cores"])
    ch.table(bp)
    ch.show("break_points", charts.headroom_bars(bp, "stage", title="Supply / consumption per stage (rule 1.2x)"))
    if not r["h2d"].get("available"):
        ch.note(f"Host-to-device copy: not applicable on the CPU ({r['h2d']['reason']}). On a GPU, pinned "
                "memory + `non_blocking=True` lets the copy overlap with compute; pageable memory is staged "
                "through a pinned buffer by the driver, synchronously.")
else:
    ch.not_measured(datapipe.METHOD)

# %% [markdown]
# ## 4. The loader tuner
#
# The sweep runs the real shard pipeline (webdataset, buffer shuffle, decode + augment in the workers)
# under a training loop at the device's rate, for every `num_workers x prefetch_factor x pin_memory`,
# with fresh workers each time. Measured per setting: supply (the loader drained alone), the device idle
# share and the median wait per step (`preflight.toolkit.loadmon.LoaderMonitor`), the prefetch queue depth.
# The rule of thumb to check: workers ~70-80 % of the cores, prefetch 4-8. The cores are the node's,
# shared by its training processes: per rank that is 0.7-0.8 x cores / local ranks (8 GPUs on a 64-core
# node: 5-6 workers per rank, not 45).
#
# Even with a full queue the wait does not reach zero: each batch crosses a process boundary (shared
# memory, then unpickling in the training process), about a millisecond for a 2.4 MB batch here.
#
# On the CPU fallback the device is **emulated**: each step waits for the measured CPU step time, leaving
# the cores free as a GPU does while it computes (a real CPU step would take both cores from the workers).

# %%
from preflight.bench import loadtune


def shards_dir():
    """The shards to tune on: the measured test set where it is on this machine, else made here."""
    d = pipe.results["dataset"].get("shards")
    return d if d and os.path.isdir(d) else datapipe.prepare(work, files, parse_size(shard_size))["shards"]

tune = ch.measurement(loadtune.TUNE, lambda: loadtune.measure_tune(
    shards_dir(), ch.torch_device, batch, pipe.results["consume"]["step_s"], pipe.results["dataset"]["shard_count"],
    ch.device.is_gpu, quick=ch.quick)) if pipe or not ch.measure else None      # plan-only: says "not measured"
if tune:
    t = tune.results
    print(f"{tune.source}; consumer: {t['consumer']}")
    rows = C.tuner_rows(t)                  # the verdict on supply 1.2x and device idle, as the findings
    ch.table(pd.DataFrame({"setting": rows["setting"], "supply (samples/s)": rows["supply_samples_per_s"],
                           "headroom": rows["headroom"], "device idle": rows["idle_share"].map("{:.1%}".format),
                           "verdict": rows["verdict"],
                           "median wait (ms)": rows["wait_median_ms"], "p90 wait (ms)": rows["wait_p90_ms"],
                           "queue depth (median)": rows["queue_depth_median"]}))
    ch.show("tuner", charts.loader_bars(rows, "setting", M.setting_label(t["best"]),
                                        title="Loader settings: device idle (colour: the verdict on supply and idle) "
                                              "and supply / consumption"))
    print("best:", M.setting_label(t["best"]), f"- device idle {t['best']['idle_share']:.1%}, the cheapest setting "
          "within 1 point of the lowest idle share (more supply than that buys nothing the device sees)")

# %% [markdown]
# ## 5. Instrumentation to keep
#
# `preflight.toolkit.loadmon` wraps any DataLoader: `timed(transform)` in the dataset, `stamped(collate)` as the
# collate function, `LoaderMonitor(loader)` around the loop. Per step it records the data wait the
# device sees, the prefetch queue depth (batches ready when the step asked) and each worker's
# preprocessing rate. A starved loader shows waits and a queue depth of 0-1; a healthy one, near-zero
# waits and a full queue. Its cost is measured below, against the step time.

# %%
if tune:
    tr = pd.DataFrame(tune.results["traces"])
    tr["wait_ms"] = tr["wait_s"] * 1e3
    ch.show("trace", charts.step_trace(tr, title="Per-step data wait and queue depth"))

overhead = (ch.measurement(loadtune.OVERHEAD, lambda: loadtune.measure_overhead(
    shards_dir(), ch.torch_device, batch, pipe.results["consume"]["step_s"], tune.results["best"], quick=ch.quick))
    if tune or not ch.measure else None)
if overhead:
    o = overhead.results
    print(f"bookkeeping {o['bookkeeping_s_per_step'] * 1e6:.1f} us per step = {o['bookkeeping_share_of_step']:.3%} "
          f"of a step; end to end {o['overhead_fraction']:+.1%} ({o['with_s']:.3f} s vs {o['without_s']:.3f} s)")
C.add_measured_findings(ch.findings, prof, pipe, tune, overhead)

# %% [markdown]
# ## 6. Explore the formulas (sliders in JupyterLab)
#
# Listing time = files x per-file metadata latency (one client, serial); the shards line shows what
# packing buys. Then supply vs consumption: the steady-state idle share 1 - S/C is a lower bound, since
# jitter idles the device even above 1.0x; hence the 1.2x rule.

# %% [markdown]
# **Predict first.** Before the sliders: the questions below are on your own plan, each changed a little
# so that the chapter has not shown the answer. Write your prediction after `prediction_... =` and run
# the cell; the sliders then test your reasoning, and the end of the chapter computes the answer.

# %%
from preflight.chapters import exercises as X
from preflight.chapters.predict import ask, check

EX = X.data_pipeline(prof)

# %%
ask(EX["listing"])
prediction_listing = None       # your answer

# %%
ask(EX["workers"])
prediction_workers = None       # your answer

# %%
if interactive:
    from IPython.display import display

    from preflight.widgets import listing_explorer, supply_explorer
    display(listing_explorer(prof.data.files, M.latency(prof.data.storage).stat_s * 1e3, prof.data.mean_file_kB))
    s0 = tune.results["best"]["supply_samples_per_s"] if tune else 1200.0
    c0 = tune.results["consume_samples_per_s"] if tune else 1000.0
    display(supply_explorer(s0, c0, tune.results["best"]["idle_share"] if tune else None))
else:
    print("Sliders: open this chapter in JupyterLab (make lab).")

# %% [markdown]
# ## Check your predictions
#
# The questions you answered before the sliders, computed with the library on your plan: how far off
# were you? The answer stays hidden until you predict (the headless audit shows it).

# %%
check(EX["listing"], prediction_listing, reveal=not interactive)

# %%
check(EX["workers"], prediction_workers, reveal=not interactive)

# %% [markdown]
# ## Your job's traces
#
# In a real job's trace, a starved pipeline shows as time in `DataLoader.__next__` inside each step
# (the training loop waiting for the next batch), as GPU idle at the start of each step, and as
# **pageable** host-to-device copies (`Memcpy HtoD (Pageable -> Device)`: the batch was not in pinned
# memory, so the copy is staged and blocks the host). Synchronising calls per step
# (`cudaStreamSynchronize`, `cudaDeviceSynchronize`: `.item()`, `.cpu()`, printing a loss) stall the
# host until the GPU drains. Set `traces_dir` (chapter 1 explains how to record the traces); empty shows
# the embedded example job.

# %%
from preflight.runner.trace_section import show_traces

job_traces = show_traces(ch, traces_dir, example=interactive)

# %% [markdown]
# ## Findings of this chapter

# %%
ch.table(ch.findings.frame()[["id", "value", "unit", "verdict", "threshold", "message"]])

# %% [markdown]
# ## What you learned
#
# - **Listing costs files × metadata latency**, at every start: millions of small files on a parallel
#   file system cost minutes; 200–500 MB shards cut it to seconds.
# - **Every stage must supply 1.2x what the device consumes**: storage, decode + augment per worker,
#   batch assembly, host-to-device copy. A stage under it is a break point.
# - **`num_workers=0` loads inside the step**: however fast, it never overlaps. The tuner's verdict counts
#   both the supply and the device's idle share.
# - **Keep the loader monitor on**: data wait and queue depth per step show a starving loader at once.

# %%
ch.next_steps()

# %% [markdown]
# Levers: pack the dataset into shards and read them with a shuffle buffer; set `num_workers` from the
# measured per-worker rate (1.2x the consumption) and prefetch 4–8; on a GPU, pinned memory with
# `non_blocking=True`.
#
# **Next chapter** (the playbook's order, 1 → 3 → 2 → 4 → 5): [Chapter 4: load balance →](04_load_balance.ipynb).
# All chapters: [README](README.md); terms: [glossary](glossary.md).
