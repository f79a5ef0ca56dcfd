"""Data-pipeline arithmetic (pure, no torch): metadata cost of small files, supply vs consumption.

Two ideas carry the chapter:

1. **Metadata, not bandwidth, kills small files on a parallel file system.** Lustre and GPFS stream
   large files at tens of GB/s, but every file costs a round trip to a metadata server to find (stat)
   and to open. Ten million files of a few kB cost minutes to hours before a byte is read, at every
   start, and worse when a thousand nodes start at once (lock contention on the metadata server).
   Packing the samples into tar shards of 200-500 MB (no file under 64 MB) turns ten million
   metadata operations into a few hundred.

2. **Every stage must supply at least 1.2x what the device consumes.** With supply S and consumption
   C (samples/s), a steady pipeline idles the device ``1 - S/C`` of the time when S < C; with S just
   above C any jitter (a slow file, a GC pause, a busy core) still idles it. The 1.2x headroom is the
   rule of thumb (pitfalls brief, section 2).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

HEADROOM_RULE = 1.2              # supply / consumption at every stage
HEADROOM_FAIL = 1.0              # below: the device waits every step
SHARD_MB_ADVICE = (200, 500)     # advised shard size on a parallel file system, MB
MIN_FILE_MB_PARALLEL_FS = 64     # no file under this on Lustre/GPFS
WORKER_SHARE = (0.70, 0.80)      # loader workers as a share of the CPU cores (field report's rule)
PREFETCH_ADVICE = (4, 8)         # prefetch_factor (batches per worker)
BEST_TOLERANCE = 0.01            # loader settings within 1 point of the lowest idle share count as "best"
LIST_PAGE_KEYS = 1000            # object stores list keys in pages of 1,000 (S3 ListObjectsV2)


@dataclass(frozen=True)
class StorageLatency:
    stat_s: float      # one metadata lookup (stat) per file, one client, serial
    open_s: float      # open + first read of one small file
    source: str


# Per-file metadata latency by storage type (single client, serial, an idle system). Orders of
# magnitude, not promises: measure your own with this chapter's listing measurement on the cluster.
METADATA_LATENCY: dict[str, StorageLatency] = {
    "local_nvme": StorageLatency(
        11e-6, 11e-6,
        "~11 us to open a small file on local NVMe (a figure quoted in the field without its original "
        "source: an order of magnitude); stat taken as the same upper bound"),
    "lustre": StorageLatency(
        0.5e-3, 2.3e-3,
        "stat: ~2,000 stat/s from one thread with mdtest on Lustre 2.5 (Dell HPC Lustre storage white "
        "paper); open: ~2.3 ms per small file (a figure quoted in the field without its original source: an "
        "order of magnitude)"),
    "gpfs": StorageLatency(
        0.5e-3, 2.3e-3,
        "assumed equal to Lustre (same design: one network round trip to a metadata service per file); "
        "no single-client figure found"),
    "nfs": StorageLatency(
        0.6e-3, 0.6e-3,
        "`ls -lU` of 1,000,000 files over NFSv4 took 9 min 59 s without READDIRPLUS, one LOOKUP RPC "
        "per file (~0.6 ms each; Linux kernel commit 'NFS: Readdir plus in v4', NetApp)"),
    "object": StorageLatency(
        30e-3, 30e-3,
        "median latency of small S3 requests (< 512 kB) is 'in the tens of milliseconds' (AWS, Best "
        "practices design patterns: optimizing Amazon S3 performance); listing is one request per "
        f"{LIST_PAGE_KEYS:,} keys"),
}


# How a page names each storage type (the profile's ``data.storage`` values are the keys).
STORAGE_LABELS = {"local_nvme": "local NVMe", "lustre": "Lustre", "gpfs": "GPFS", "nfs": "NFS",
                  "object": "object storage"}


def storage_label(storage: str) -> str:
    """``local_nvme`` -> ``local NVMe``: the profile's storage key as a reader knows it."""
    return STORAGE_LABELS.get(storage, storage)


def latency(storage: str) -> StorageLatency:
    if storage not in METADATA_LATENCY:
        raise ValueError(f"storage = {storage!r}: accepted: {', '.join(METADATA_LATENCY)}")
    return METADATA_LATENCY[storage]


def listing_time_s(files: int, storage: str, per_file_s: float | None = None) -> float:
    """Seconds to list a dataset and stat every file, serially from one client (the start-up scan).

    ``per_file_s`` overrides the table (e.g. a latency measured on your cluster). Object stores list
    keys in pages (one request per 1,000 keys), so there the cost is per page."""
    if files < 0:
        raise ValueError(f"files = {files}: must be >= 0")
    lat = latency(storage).stat_s if per_file_s is None else per_file_s
    if storage == "object" and per_file_s is None:
        return math.ceil(files / LIST_PAGE_KEYS) * lat
    return files * lat


def open_time_s(files: int, storage: str, readers: int = 1) -> float:
    """Seconds spent opening every file once (one epoch), spread over ``readers`` parallel readers
    (assumes the metadata service scales with them, which it does not without bound)."""
    if readers < 1:
        raise ValueError(f"readers = {readers}: must be >= 1")
    return files * latency(storage).open_s / readers


def shard_count(files: int, mean_file_kB: float, shard_MB: float) -> int:
    """How many shards of ``shard_MB`` hold ``files`` samples of ``mean_file_kB`` (at least 1)."""
    if shard_MB <= 0:
        raise ValueError(f"shard_MB = {shard_MB}: must be > 0")
    return max(1, math.ceil(files * mean_file_kB / 1e3 / shard_MB))


def headroom(supply_per_s: float, consume_per_s: float) -> float:
    """Supply over consumption (samples/s over samples/s); >= 1.2 passes the rule."""
    if consume_per_s <= 0:
        raise ValueError(f"consume rate = {consume_per_s}: must be > 0")
    return supply_per_s / consume_per_s


def idle_share(supply_per_s: float, consume_per_s: float) -> float:
    """Steady-state share of time the device waits for data: 1 - S/C when supply S < consumption C.

    A lower bound: it assumes a perfectly smooth supply; jitter adds waits even when S > C."""
    return max(0.0, 1.0 - headroom(supply_per_s, consume_per_s))


def workers_needed(consume_per_s: float, per_worker_per_s: float, rule: float = HEADROOM_RULE) -> int:
    """Loader workers for ``rule`` x the consumption, from one worker's preprocessing rate."""
    if per_worker_per_s <= 0:
        raise ValueError(f"per-worker rate = {per_worker_per_s}: must be > 0")
    return max(1, math.ceil(rule * consume_per_s / per_worker_per_s))


def recommended_workers(cores: int, local_ranks: int = 1) -> tuple[int, int]:
    """The rule of thumb's worker range **per rank**: 70-80 % of the node's ``cores`` shared by its
    ``local_ranks`` training processes (8 ranks on a 64-core node: 5-6 workers each, not 45-51), at
    least 1."""
    if cores < 1:
        raise ValueError(f"cores = {cores}: must be >= 1")
    if local_ranks < 1:
        raise ValueError(f"local_ranks = {local_ranks}: must be >= 1")
    low = max(1, math.floor(WORKER_SHARE[0] * cores / local_ranks))
    return low, max(low, math.floor(WORKER_SHARE[1] * cores / local_ranks))


def setting_label(r: dict) -> str:
    """'num_workers=2, prefetch_factor=4, pin_memory=False' for a loader setting dict."""
    s = f"num_workers={r['num_workers']}"
    if r["num_workers"]:
        s += f", prefetch_factor={r['prefetch_factor']}"
    return s + f", pin_memory={r['pin_memory']}"
