"""Chapter 2 measurements: the same samples as small files and as shards, and each break point of
the chain storage -> preprocessing -> batch assembly -> host-to-device copy, against what the device
consumes.

Each function returns plain dicts (JSON records); ``preflight.chapters.data_pipeline`` turns them into
tables and findings. Runnable alone: ``python -m preflight.bench.datapipe --work DIR``.

Cold reads: the page cache is emptied for the files with ``posix_fadvise(POSIX_FADV_DONTNEED)`` (no
root needed; works for clean pages, hence the ``os.sync`` after writing). The kernel's dentry/inode
caches cannot be dropped without root, so a "cold" listing here still finds the metadata cached: on a
local disk it is a lower bound, and the listing on a parallel file system comes from the latency table
(``preflight.models.data``) or from a run of this module on the cluster.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from pathlib import Path

import numpy as np

from preflight.core.fsutil import atomic_write_text
from preflight.core.records import Method
from preflight.harness import samples as S

METHOD = Method("datapipe", 1, required=("dataset.shard_count", "dataset.params.files", "storage.filesystem",
                                         "preprocessing", "assembly", "consume.step_s", "h2d", "cores"))
DATASET_FORMAT = 2                # the test dataset's layout; a change rebuilds it (``prepare``; 2: a folder per set)
DEFAULT = {"files": 20_000, "shard_size": "8MB"}   # the demo set (real data: 200-500 MB shards)
QUICK = {"files": 2000, "shard_size": "1MB"}       # --quick / a quick audit: a smoke-test dataset


# ---------------------------------------------------------------- the two layouts of one dataset
def prepare(work: str | os.PathLike, files: int, shard_bytes: int, seed: int = 0) -> dict:
    """Small files under ``work/<set>/small`` and the same samples as shards under ``work/<set>/shards``,
    ``<set>`` naming the parameters (``2000-files-1000000-B-seed0-v2``).

    Reused when ``<set>/dataset.json`` says it is complete (the first run pays for writing tens of
    thousands of files: that cost is itself a small-file lesson). Safe when several processes prepare
    at once (two audits on one machine, a workshop room on one shared disk): the check and the build
    hold an exclusive lock on ``work/.lock``, and each parameter set has its own folder, so building
    one never removes the files another process is reading. Delete ``work`` to reclaim the space."""
    from preflight.toolkit import shards

    work = Path(work)
    want = {"files": files, "shard_bytes": shard_bytes, "seed": seed, "format": DATASET_FORMAT}
    root = work / f"{files}-files-{shard_bytes}-B-seed{seed}-v{DATASET_FORMAT}"
    stamp = root / "dataset.json"
    work.mkdir(parents=True, exist_ok=True)
    with _locked(work / ".lock"):
        done = json.loads(stamp.read_text()) if stamp.exists() else {}
        if done.get("params") == want:
            return dict(done, reused=True)
        for old in (work / "small", work / "shards", root / "small", root / "shards"):   # format 1 kept them in work/
            _rmtree(old)
        (work / "dataset.json").unlink(missing_ok=True)
        t = time.perf_counter()
        made = S.write_small_files(root / "small", files, seed=seed)
        write_s = time.perf_counter() - t
        conv = shards.convert(root / "small", root / "shards", shard_bytes, force=True)
        os.sync()
        info = {"params": want, "small": str(root / "small"), "shards": str(root / "shards"),
                "bytes": made["bytes"], "write_small_files_s": write_s, "convert_s": conv["seconds"],
                "shard_count": conv["shards"]}
        atomic_write_text(stamp, json.dumps(info, indent=1))          # last: its presence means complete
    return dict(info, reused=False)


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive ``flock`` on ``path`` for the block. A file system without flock (some parallel
    file systems mounted without it) raises OSError: the block then runs unlocked, as it always did."""
    import fcntl

    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX)
        except OSError:
            pass
        yield


def _rmtree(p: Path) -> None:
    import shutil

    if p.exists():
        shutil.rmtree(p)


def layout_files(root: str | os.PathLike, layout: str) -> list[str]:
    """The data files of a layout, sorted: every sample file, or every shard."""
    pattern = "*.tar" if layout == "shards" else "*.*"
    return sorted(str(p) for p in Path(root).rglob(pattern) if p.is_file() and p.name != "manifest.json")


# ---------------------------------------------------------------- storage: listing and reading
def evict(paths: list[str]) -> None:
    """Drop the files' pages from the page cache (clean pages only; no root needed)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def list_tree(root: str | os.PathLike) -> tuple[int, float]:
    """Walk ``root`` and stat every file, as a dataset index is built at start-up: (files, seconds)."""
    t = time.perf_counter()
    n = 0
    for d, _dirs, names in os.walk(root):
        for name in names:
            os.stat(os.path.join(d, name))
            n += 1
    return n, time.perf_counter() - t


def read_all(paths: list[str], chunk: int = 1 << 20) -> tuple[int, float]:
    """Read every file completely, in order: (bytes, seconds)."""
    t = time.perf_counter()
    total = 0
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while True:
                b = f.read(chunk)
                if not b:
                    break
                total += len(b)
    return total, time.perf_counter() - t


def measure_storage(small_dir: str, shard_dir: str, samples: int, repeats: int = 3) -> dict:
    """Full-read time of both layouts, cold (page cache evicted) and warm, and the listing time
    (metadata stays cached without root, so there is no cold listing to measure): medians."""
    out = {}
    for layout, root in (("small_files", small_dir), ("shards", shard_dir)):
        paths = layout_files(root, layout)
        read_all(paths)                                      # touch once: warm is warm
        cold_read, warm_list, warm_read = [], [], []
        for _ in range(repeats):
            evict(paths)
            nbytes, s = read_all(paths)
            cold_read.append(s)
            warm_list.append(list_tree(root)[1])
            warm_read.append(read_all(paths)[1])
        med = lambda xs: float(np.median(xs))  # noqa: E731
        out[layout] = {"files": len(paths), "bytes": nbytes, "samples": samples,
                       "list_warm_s": med(warm_list),
                       "read_cold_s": med(cold_read), "read_warm_s": med(warm_read),
                       "read_cold_MBps": nbytes / med(cold_read) / 1e6,
                       "read_warm_MBps": nbytes / med(warm_read) / 1e6,
                       "read_cold_samples_per_s": samples / med(cold_read),
                       "read_warm_samples_per_s": samples / med(warm_read),
                       "stat_per_file_s": med(warm_list) / max(1, len(paths))}
    sf, sh = out["small_files"], out["shards"]
    out["slowdown_read_cold"] = sf["read_cold_s"] / sh["read_cold_s"]
    out["slowdown_read_warm"] = sf["read_warm_s"] / sh["read_warm_s"]
    out["slowdown_list_warm"] = sf["list_warm_s"] / sh["list_warm_s"]
    out["filesystem"] = filesystem_of(small_dir)
    return out


def filesystem_of(path: str) -> str:
    """The file-system type holding ``path`` (from /proc/mounts; 'unknown' elsewhere)."""
    best, fstype = "", "unknown"
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            _dev, mnt, typ, *_ = line.split()
            if str(Path(path).resolve()).startswith(mnt) and len(mnt) > len(best):
                best, fstype = mnt, typ
    except OSError:
        pass
    return fstype


# ---------------------------------------------------------------- CPU preprocessing, batch assembly
_RNG: dict[int, np.random.Generator] = {}


def _process_rng() -> np.random.Generator:
    """One generator per process, seeded from torch's seed: in a DataLoader worker that is
    base_seed + worker_id, so workers draw different augmentations (a forked copy would repeat them)."""
    pid = os.getpid()
    if pid not in _RNG:
        import torch

        _RNG[pid] = np.random.default_rng(torch.initial_seed() % 2**63)
    return _RNG[pid]


def transform(sample: dict, rng: np.random.Generator | None = None):
    """The worker-side transform of one webdataset sample: (image tensor, label)."""
    return S.decode_augment(sample[S.FIELD], rng or _process_rng()), S.label_of(sample["__key__"])


def preprocessing_rate(shard_dir: str, samples: int = 2000) -> dict:
    """Samples/s of decode + augment on ONE core (one loader worker), from warm shards."""
    import torch

    from preflight.toolkit import shards

    payloads = []
    for s in shards.shard_pipeline(shard_dir):
        payloads.append(s)
        if len(payloads) >= samples:
            break
    rng = np.random.default_rng(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                     # a loader worker runs one thread
    try:
        for s in payloads[:100]:
            transform(s, rng)                      # warm-up
        t = time.perf_counter()
        for s in payloads:
            transform(s, rng)
        dt = time.perf_counter() - t
    finally:
        torch.set_num_threads(threads)
    return {"samples": len(payloads), "seconds": dt, "per_worker_samples_per_s": len(payloads) / dt,
            "per_sample_us": dt / len(payloads) * 1e6}


def batch_assembly(small_dir: str, shard_dir: str, samples: int, buffer: int = 1000, seed: int = 0) -> dict:
    """Read rate (samples/s, no decode) of the two ways to shuffle, from a cold page cache:

    - global shuffle: a random permutation over all small files (random access, one open per sample);
    - buffer shuffle: shards read sequentially through a ``buffer``-sample shuffle buffer (webdataset)."""
    from preflight.toolkit import shards

    small = layout_files(small_dir, "small_files")
    order = np.random.default_rng(seed).permutation(len(small))
    evict(small)
    t = time.perf_counter()
    for i in order:
        with open(small[i], "rb") as f:
            f.read()
    global_s = time.perf_counter() - t

    evict(layout_files(shard_dir, "shards"))
    t = time.perf_counter()
    n = sum(1 for _ in shards.shard_pipeline(shard_dir, shuffle_buffer=buffer, seed=seed))
    buffer_s = time.perf_counter() - t
    return {"samples": samples, "buffer": buffer,
            "global_shuffle_samples_per_s": len(small) / global_s,
            "buffer_shuffle_samples_per_s": n / buffer_s}


# ---------------------------------------------------------------- what the device consumes
def consumer_model():
    """A small CNN on the 56x56 crops: the training step the loader must feed."""
    import torch.nn as nn

    return nn.Sequential(
        nn.Conv2d(3, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, S.CLASSES))


def consume_rate(device, batch: int) -> dict:
    """Median time of one real training step (forward, backward, SGD) on ``device`` for ``batch``
    images already on the device: the rate the pipeline has to supply."""
    import torch

    from preflight.core.timing import time_fn

    dev = torch.device(device)
    model = consumer_model().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(batch, 3, S.CROP, S.CROP, device=dev)
    y = torch.randint(0, S.CLASSES, (batch,), device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    t = time_fn(step, device=dev, warmup=3, repeats=15)
    return {"batch": batch, "step_s": t.median_s, "step_p90_s": t.p90_s,
            "samples_per_s": batch / t.median_s, "device": str(dev)}


def h2d_copy(device, batch: int, repeats: int = 20) -> dict:
    """Host-to-device copy of one batch: pageable + blocking vs pinned + non_blocking (GPU only)."""
    import torch

    from preflight.core.timing import time_fn

    dev = torch.device(device)
    if dev.type != "cuda":
        return {"available": False, "reason": "no host-to-device copy on the CPU (the data is already there)"}
    pageable = torch.randn(batch, 3, S.CROP, S.CROP)
    pinned = pageable.pin_memory()
    pg = time_fn(lambda: pageable.to(dev), device=dev, warmup=3, repeats=repeats)
    pn = time_fn(lambda: pinned.to(dev, non_blocking=True), device=dev, warmup=3, repeats=repeats)
    nbytes = pageable.numel() * pageable.element_size()
    return {"available": True, "bytes": nbytes, "pageable_s": pg.median_s, "pinned_s": pn.median_s,
            "pageable_GBps": nbytes / pg.median_s / 1e9, "pinned_GBps": nbytes / pn.median_s / 1e9,
            "pinned_speedup": pg.median_s / pn.median_s}


def measure(work: str | os.PathLike, files: int, shard_bytes: int, device, batch: int = 64,
            quick: bool = False) -> dict:
    """Method ``datapipe``: the dataset made (or reused) in ``work``, then every break point of the
    chain against what ``device`` consumes at ``batch`` samples per step. The command line and
    chapter 2 both call this and write / read the same record."""
    info = prepare(work, files, shard_bytes)
    return {"dataset": info,
            "storage": measure_storage(info["small"], info["shards"], files, repeats=1 if quick else 3),
            "preprocessing": preprocessing_rate(info["shards"], 500 if quick else 2000),
            "assembly": batch_assembly(info["small"], info["shards"], files),
            "consume": consume_rate(device, batch), "h2d": h2d_copy(device, batch),
            "cores": os.cpu_count()}


def main(argv=None) -> int:
    from preflight.core import device as D
    from preflight.core.records import save_record
    from preflight.toolkit.shards import parse_size

    ap = argparse.ArgumentParser(prog="python -m preflight.bench.datapipe",
                                 description="Small files vs shards, and the break points, on this machine.")
    ap.add_argument("--work", required=True, help="scratch folder on the storage to test")
    ap.add_argument("--files", type=int, default=None, help="small files to generate (default 20,000; 2,000 quick)")
    ap.add_argument("--shard-size", default=None, help="shard size of the test set (default 8MB; 1MB quick)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--quick", action="store_true", help="a small dataset: a smoke test")
    ap.add_argument("--out", help="folder for the JSON record")
    a = ap.parse_args(argv)
    sizes = QUICK if a.quick else DEFAULT
    files = a.files if a.files is not None else sizes["files"]
    if not 1 <= files <= 100_000_000:
        ap.error(f"--files = {files}: accepted range is 1 to 100,000,000")
    if not 1 <= a.batch <= 65_536:
        ap.error(f"--batch = {a.batch}: accepted range is 1 to 65,536")
    try:
        shard_bytes = parse_size(a.shard_size or sizes["shard_size"])
    except ValueError as err:
        ap.error(f"--shard-size = {a.shard_size!r}: {err}")
    if not 1 <= shard_bytes <= 1 << 40:
        ap.error(f"--shard-size = {a.shard_size!r}: accepted range is 1 byte to 1 TiB")
    where = D.probe()
    res = measure(a.work, files, shard_bytes, D.torch_device(where), a.batch, quick=a.quick)
    rec = METHOD.record({"quick": a.quick, "work": a.work, "files": files, "shard_bytes": shard_bytes,
                         "batch": a.batch}, res, where.as_dict())
    print(json.dumps(res, indent=1))
    if a.out:
        print(save_record(rec, a.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
