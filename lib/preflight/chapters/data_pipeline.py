"""Chapter 2, the starved data pipeline: tables and findings from the measurements of
``preflight.bench.datapipe`` / ``loadtune`` and the formulas of ``preflight.models.data``.
"""
from __future__ import annotations

import pandas as pd

from preflight.core.findings import FindingSink, judge, worst
from preflight.core.numfmt import plural, seconds
from preflight.core.profile import Profile
from preflight.models import data as M

PROFILE_SOURCE = "computed from profile"

# Thresholds (one home). Listing at start-up: a minute is tolerable, ten minutes at every (re)start
# is the field case. Idle share: the device waiting 5 % of the time is worth a look, 15 % is a
# starved pipeline. Instrumentation: left on, it must cost under 1 % of a step.
LISTING_WARN_S, LISTING_FAIL_S = 60.0, 600.0
IDLE_WARN, IDLE_FAIL = 0.05, 0.15
OVERHEAD_WARN, OVERHEAD_FAIL = 0.01, 0.05
SHARD_MB = 256                                   # the converter's default shard size


def listing_table(profile: Profile, measured_stat_s: float | None = None) -> pd.DataFrame:
    """Start-up listing of the profile's dataset on every storage type, as small files and as
    256 MB shards (the metadata latency table with its sources); the profile's storage marked."""
    d = profile.data
    n_shards = M.shard_count(d.files, d.mean_file_kB, SHARD_MB)
    rows = []
    for storage, lat in M.METADATA_LATENCY.items():
        rows.append({"storage": M.storage_label(storage) + (" (profile)" if storage == d.storage else ""),
                     "stat per file (ms)": lat.stat_s * 1e3,
                     "small files: listing (s)": M.listing_time_s(d.files, storage),
                     f"{SHARD_MB} MB shards: listing (s)": M.listing_time_s(n_shards, storage),
                     "source": lat.source})
    if measured_stat_s:
        rows.append({"storage": "this machine (measured, metadata cached)",
                     "stat per file (ms)": measured_stat_s * 1e3,
                     "small files: listing (s)": M.listing_time_s(d.files, d.storage, measured_stat_s),
                     f"{SHARD_MB} MB shards: listing (s)": M.listing_time_s(n_shards, d.storage, measured_stat_s),
                     "source": "measured here: os.walk + stat, warm"})
    return pd.DataFrame(rows)


def add_listing_finding(sink: FindingSink, profile: Profile) -> None:
    d = profile.data
    s = M.listing_time_s(d.files, d.storage)
    n_shards = M.shard_count(d.files, d.mean_file_kB, SHARD_MB)
    v, words = judge(s, warn=LISTING_WARN_S, fail=LISTING_FAIL_S, higher_is_better=False, fmt="{:g} s")
    small = d.mean_file_kB / 1e3 < M.MIN_FILE_MB_PARALLEL_FS
    sink.add(id="data_pipeline/listing_s_at_profile", value=s, unit="s", verdict=v, threshold=words,
             message=(f"Listing {d.files:,} files on {M.storage_label(d.storage)} costs about {seconds(s)} at "
                      f"every start from one client, before a byte is read; as {n_shards:,} shards of "
                      f"{SHARD_MB} MB: {M.listing_time_s(n_shards, d.storage):,.2g} s. Mean file "
                      f"{d.mean_file_kB:g} kB" + (f", under the {M.MIN_FILE_MB_PARALLEL_FS} MB advised on a "
                                                 "parallel file system." if small else ".")),
             fix=(f"Pack the samples into {M.SHARD_MB_ADVICE[0]}-{M.SHARD_MB_ADVICE[1]} MB tar shards "
                  f"(`python -m preflight shards SRC DST --shard-size {SHARD_MB}MB`) and read them with "
                  "webdataset."),
             source=PROFILE_SOURCE + f" ({M.latency(d.storage).source})")


def break_points(storage: dict, prep: dict, assembly: dict, consume: dict, h2d: dict,
                 cores: int) -> pd.DataFrame:
    """Each stage's supply (samples/s) against the device's consumption, and the 1.2x verdict."""
    c = consume["samples_per_s"]
    rows = [
        ("storage: shards, cold read", storage["shards"]["read_cold_samples_per_s"]),
        ("storage: small files, cold read", storage["small_files"]["read_cold_samples_per_s"]),
        ("CPU preprocessing: 1 worker", prep["per_worker_samples_per_s"]),
        (f"CPU preprocessing: all {cores} cores (upper bound)", prep["per_worker_samples_per_s"] * cores),
        ("batch assembly: shards + buffer shuffle (cold)", assembly["buffer_shuffle_samples_per_s"]),
        ("batch assembly: global shuffle of small files (cold)", assembly["global_shuffle_samples_per_s"]),
    ]
    if h2d.get("available"):
        per_batch = consume["batch"]
        rows += [("host-to-device: pageable, blocking", per_batch / h2d["pageable_s"]),
                 ("host-to-device: pinned, non_blocking", per_batch / h2d["pinned_s"])]
    df = pd.DataFrame(rows, columns=["stage", "supply (samples/s)"])
    df["consumption (samples/s)"] = c
    df["headroom"] = df["supply (samples/s)"] / c
    df["verdict"] = [judge(h, warn=M.HEADROOM_RULE, fail=M.HEADROOM_FAIL)[0] for h in df["headroom"]]
    return df



HEADROOM_WORDS = judge(None, warn=M.HEADROOM_RULE, fail=M.HEADROOM_FAIL, fmt="{:g}x")[1]
IDLE_WORDS = judge(None, warn=IDLE_WARN, fail=IDLE_FAIL, higher_is_better=False, fmt="{:.0%}")[1]
FIX_LOADER = (f"Use DataLoader workers per rank of ~{M.WORKER_SHARE[0]:.0%}-{M.WORKER_SHARE[1]:.0%} of the node's "
              "cores divided by its local ranks (8 ranks on a 64-core node: 5-6 workers each, not 45-51: every rank "
              "starts its own), "
              f"prefetch_factor {M.PREFETCH_ADVICE[0]}-{M.PREFETCH_ADVICE[1]}, pinned memory and non_blocking "
              "copies; keep every stage at >= 1.2x the device's rate.")


def loader_verdict(row: dict) -> str:
    """The verdict of one loader setting (a row of the tuner): the worse of its supply/consumption
    against the 1.2x rule and of the device idle share it measured. Supply alone can pass while the
    device waits (num_workers=0 loads inside the step: fast, but never overlapped), so the tuner's
    chart, its table and the findings all use this one rule."""
    vh, _ = judge(row["headroom"], warn=M.HEADROOM_RULE, fail=M.HEADROOM_FAIL)
    vi, _ = judge(row["idle_share"], warn=IDLE_WARN, fail=IDLE_FAIL, higher_is_better=False)
    return worst([vh, vi])


def tuner_rows(results: dict) -> pd.DataFrame:
    """The tuner's settings (a ``loadtune`` record's results) with their label and the verdict the findings
    give each (:func:`loader_verdict`): the table and the chart of chapter 2 read this one frame."""
    rows = pd.DataFrame(results["rows"])
    rows["setting"] = [M.setting_label(x) for x in results["rows"]]
    rows["verdict"] = [loader_verdict(x) for x in results["rows"]]
    rows["best"] = rows["setting"] == M.setting_label(results["best"])
    return rows


def _headroom_finding(sink, fid, row: dict, label: str, source: str) -> None:
    inproc = (" With num_workers=0 the loader runs inside the training loop: however fast it is, its "
              "supply never overlaps with the step." if row["num_workers"] == 0 else "")
    sink.add(id=fid, value=row["headroom"], unit="x", verdict=loader_verdict(row),
             threshold=f"supply/consumption {HEADROOM_WORDS}; and device idle {IDLE_WORDS}",
             message=(f"{label}: supply {row['supply_samples_per_s']:,.0f} samples/s against consumption "
                      f"{row['consume_samples_per_s']:,.0f} samples/s = {row['headroom']:.2f}x; the device "
                      f"waited {row['idle_share']:.1%} of the loop (median wait {row['wait_median_ms']:.2f} ms "
                      f"per step)." + inproc),
             fix=FIX_LOADER, source=source)


def add_measured_findings(sink: FindingSink, profile: Profile, pipe, tune, overhead,
                          why_missing: str = "plan-only mode (no live measurement)") -> None:
    """Findings from the storage/break-point measurement (``pipe``), the tuner (``tune``) and the
    instrumentation overhead (``overhead``): ``preflight.runner.chapter.Measured`` objects or None."""
    sink.measured("data_pipeline/small_file_slowdown", pipe, "x", _small_file_finding, why_missing=why_missing,
                  missing_fix="Pack small files into shards.")
    if pipe is None:
        sink.not_measured("data_pipeline/h2d_pinned_speedup", "x", "recorded for reference",
                      "Pin host memory and copy with non_blocking=True.", why_missing)
    else:
        h = pipe.results["h2d"]
        if h.get("available"):
            sink.add(id="data_pipeline/h2d_pinned_speedup", value=h["pinned_speedup"], unit="x", verdict="info",
                     threshold="recorded for reference (> 1: pinning pays)",
                     message=(f"One batch ({h['bytes'] / 1e6:.1f} MB) host-to-device: pageable blocking "
                              f"{h['pageable_s'] * 1e3:.3g} ms ({h['pageable_GBps']:.1f} GB/s), pinned non_blocking "
                              f"{h['pinned_s'] * 1e3:.3g} ms ({h['pinned_GBps']:.1f} GB/s)."),
                     fix="DataLoader(pin_memory=True) and .to(device, non_blocking=True).", source=pipe.source)
        else:
            sink.not_measured("data_pipeline/h2d_pinned_speedup", "x", "recorded for reference",
                          "On a GPU: DataLoader(pin_memory=True) and .to(device, non_blocking=True).",
                          h.get("reason", "no GPU"))
    if tune is None:
        for fid, unit in (("data_pipeline/headroom", "x"), ("data_pipeline/headroom_default", "x"),
                          ("data_pipeline/best_loader_setting", "workers")):
            sink.not_measured(fid, unit, HEADROOM_WORDS if unit == "x" else "recorded for reference",
                          FIX_LOADER, why_missing)
    else:
        t = tune.results
        best = t["best"]
        src = f"{tune.source}; consumer: {t['consumer']}"
        _headroom_finding(sink, "data_pipeline/headroom", best, f"Best loader setting ({M.setting_label(best)})", src)
        default = next(r for r in t["rows"] if r["num_workers"] == 0)
        _headroom_finding(sink, "data_pipeline/headroom_default", default, "PyTorch's default (num_workers=0)", src)
        low, high = M.recommended_workers(t["cores"])
        need = (M.workers_needed(t["consume_samples_per_s"], pipe.results["preprocessing"]["per_worker_samples_per_s"])
                if pipe else None)
        # The rule agrees when a setting inside it did as well as the best measured (the best itself is
        # the cheapest such setting, so comparing settings would call a tie a disagreement).
        lowest = min(r["idle_share"] for r in t["rows"])
        in_rule = [r for r in t["rows"] if low <= r["num_workers"] <= high
                   and M.PREFETCH_ADVICE[0] <= (r["prefetch_factor"] or 0) <= M.PREFETCH_ADVICE[1]]
        agree = any(r["idle_share"] <= lowest + M.BEST_TOLERANCE for r in in_rule)
        sink.add(id="data_pipeline/best_loader_setting", value=best["num_workers"], unit="workers", verdict="info",
                 threshold="recorded for reference",
                 message=(f"Measured best: {M.setting_label(best)} (the cheapest within 1 point of the lowest idle share). "
                          f"Rule of thumb for {t['cores']} cores: {low if low == high else f'{low}-{high}'} "
                          f"worker{'s' if high > 1 else ''}, prefetch "
                          f"{M.PREFETCH_ADVICE[0]}-{M.PREFETCH_ADVICE[1]}: the measurement "
                          + ("agrees (a setting inside it is as good as the best)" if agree else
                             "differs (no setting inside it reached the best idle share" + ("" if in_rule else
                                                                                     ": none was measured")
                             + "; the rule sizes for the cores, the measurement for this consumer: trust "
                               "the measurement)")
                          + (f"; one worker preprocesses {pipe.results['preprocessing']['per_worker_samples_per_s']:,.0f} "
                             f"samples/s, so 1.2x the consumption needs {plural(need, 'worker')}." if need else ".")),
                 fix=FIX_LOADER, source=src)
    sink.measured("data_pipeline/instrumentation_overhead", overhead, "fraction", _overhead_finding,
                  why_missing=why_missing,
                  missing_threshold=judge(None, warn=OVERHEAD_WARN, fail=OVERHEAD_FAIL, higher_is_better=False,
                                          fmt="{:.0%}")[1],
                  missing_fix="Wrap the loader in preflight.toolkit.loadmon.LoaderMonitor and keep it on.")


def _small_file_finding(r: dict) -> dict:
    """The same samples read from small files and from shards (``bench.datapipe``'s storage part)."""
    st = r["storage"]
    sf, sh = st["small_files"], st["shards"]
    return dict(value=st["slowdown_read_cold"], verdict="info",
                threshold="recorded for reference (> 1: small files are slower)",
                message=(f"The same {sf['samples']:,} samples ({sf['bytes'] / 1e6:.0f} MB) read cold from "
                         f"{sf['files']:,} small files took {sf['read_cold_s']:.3g} s ({sf['read_cold_MBps']:.0f} MB/s), "
                         f"from {sh['files']} shards {sh['read_cold_s']:.3g} s ({sh['read_cold_MBps']:.0f} MB/s): "
                         f"{st['slowdown_read_cold']:.1f}x; warm {st['slowdown_read_warm']:.1f}x; listing "
                         f"{st['slowdown_list_warm']:.0f}x ({st['filesystem']}, local disk: a parallel file "
                         "system's metadata round trips make the gap far larger)."),
                fix="Pack the samples into tar shards (webdataset) of 200-500 MB.")


def _overhead_finding(o: dict) -> dict:
    """What the loader monitor's bookkeeping costs per step (``loadmon`` overhead record)."""
    v, words = judge(o["bookkeeping_share_of_step"], warn=OVERHEAD_WARN, fail=OVERHEAD_FAIL,
                     higher_is_better=False, fmt="{:.0%}")
    return dict(value=o["bookkeeping_share_of_step"], verdict=v, threshold=words + " of a step",
                message=(f"The loader monitor's bookkeeping costs {o['bookkeeping_s_per_step'] * 1e6:.1f} us per "
                         f"step, {o['bookkeeping_share_of_step']:.3%} of a {o['step_s'] * 1e3:.1f} ms step; end to "
                         f"end the loop ran {o['overhead_fraction']:+.1%} with it (noise on a shared CPU)."),
                fix="Keep per-step wait, queue depth and preprocessing rate on in every run.")

