"""Checked reading of tar shards (the format: ``preflight.toolkit.shardformat``; the writer: ``preflight.toolkit.shards``).

Checked reading. A tar reader on its own cannot tell a shard cut short from a short shard: a copy
interrupted at a sample boundary is a valid tar, and an epoch would silently be shorter. So every
shard is read against its manifest entry: a truncated or corrupt tar, a partial sample (a tar cut
between the members of one sample) or fewer samples than the manifest lists raise ``ShardError``
naming the shard, the index of the first sample not delivered and its key.

Skip or raise. ``on_error="raise"`` (the default) stops at the first bad shard or failing
transform: right for a benchmark or a first run, where a damaged shard is a bug to fix. With
``on_error="skip"`` a bad shard ends early and a failing transform drops its one sample; each
incident is warned about and counted into ``SkipStats``, so a long run can lose a few samples
without losing its job, and the loss is still visible.

Buffer shuffle vs global shuffle. Shards are read front to back, so ``shard_pipeline`` mixes samples
in a buffer of ``shuffle_buffer`` samples (optionally also the shard order, ``shuffle_shards``), not
globally as a map-style Dataset with a RandomSampler does (``small_file_dataset``, the small-file
baseline). A sample then only meets samples from nearby in the stream: a buffer of several shards'
worth of samples and shards that each mix classes make the difference small. A fixed ``seed`` gives
the same order every epoch: pass ``seed=base + epoch`` for a new one.

Splitting. The manifest's shards are split across distributed ranks (``split_by_node``), then across
the DataLoader workers of each rank (``split_by_worker``), so that every sample is read exactly once
per epoch by the job as a whole.
"""
from __future__ import annotations

import functools
import random
import warnings
from pathlib import Path

import webdataset as wds
from torch.utils.data import Dataset, default_collate
from webdataset.tariterators import base_plus_ext, group_by_keys, tar_file_expander

from preflight.toolkit.shardformat import ShardError, SkipStats, list_samples, load_manifest, read_source


class SmallFileDataset(Dataset):
    """Map-style dataset over the small files: sample i is one open+read per file (metadata-heavy)."""

    def __init__(self, src, transform=None):
        self.src = Path(src).resolve()
        self.samples, self.fields = list_samples(self.src)
        self.transform = transform

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        key, files = self.samples[i]
        sample = {"__key__": key, "__url__": str(self.src), "__index__": i}
        sample.update({ext.lower(): read_source(path) for ext, path in files})
        return self.transform(sample) if self.transform is not None else sample


def small_file_dataset(src, transform=None) -> SmallFileDataset:
    """The small files as a map-style Dataset (for the global-shuffle comparison, RandomSampler)."""
    return SmallFileDataset(src, transform)


def _sample_error(shard, index, key, reason, after=None) -> ShardError:
    where = f" (key {key})" if key else (f" (after key {after})" if after else "")
    return ShardError(f"{shard}: sample {index}{where}: {reason}", shard, index, key)


def _check_on_error(on_error: str) -> None:
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error = {on_error!r}: accepted values are 'raise' and 'skip'")


def checked_samples(url: str, stream, expected: int | None, fields: list | None = None):
    """Yield the samples of one open shard through webdataset's tar iteration, checked: every sample
    has ``fields`` (the first sample's fields when None) and there are exactly ``expected`` of them
    (any number when None); otherwise ``ShardError`` naming the shard and the first sample not
    delivered. Also the read-back check of ``shards.convert``: the writer verifies with the training
    reader."""
    shard = Path(url).name
    last = {"fname": None}

    def members():
        for member in tar_file_expander([{"url": url, "stream": stream}]):
            last["fname"] = member.get("fname", last["fname"])
            yield member

    delivered, last_key = 0, None
    try:
        for sample in group_by_keys(members()):
            have = sorted(k for k in sample if not k.startswith("__"))
            fields = fields or have       # no manifest: the first sample sets the fields
            if have != sorted(fields):     # a partial sample (tar cut between its members)
                raise _sample_error(shard, delivered, sample["__key__"],
                                    f"fields {have}, expected {sorted(fields)} (truncated tar?)")
            if expected is not None and delivered >= expected:
                raise _sample_error(shard, delivered, sample["__key__"],
                                    f"more samples than the {expected} in the manifest")
            sample["__index__"] = delivered
            yield sample
            delivered, last_key = delivered + 1, sample["__key__"]
    except ShardError:
        raise
    except Exception as err:   # tarfile.ReadError (truncated), ValueError (duplicate member), OSError
        reason = str(err.args[0]).split(" @ ")[0] if err.args else ""
        key = base_plus_ext(last["fname"])[0] if last["fname"] else None
        raise _sample_error(shard, delivered, key if key != last_key else None,
                            f"truncated or corrupt tar ({type(err).__name__}: {reason})", last_key) from err
    if expected is not None and delivered < expected:
        raise _sample_error(shard, delivered, None, f"only {delivered} of {expected} samples in the "
                            "shard (truncated at a sample boundary?)", last_key)


def _skipped(stats: SkipStats | None, err: ShardError, lost: int | None) -> None:
    if stats is not None:
        stats.skipped_samples += lost or 0
        stats.bad_shards.append((err.shard, err.index, str(err)))
    count = "an unknown number of" if lost is None else str(lost)
    warnings.warn(f"skipped {count} sample(s): {err}", stacklevel=3)


def iter_shard(url, expected: int | None = None, on_error: str = "raise",
               stats: SkipStats | None = None, fields: list | None = None):
    """Yield the samples of one shard: dicts with ``__key__``, ``__url__``, ``__index__`` and one bytes
    entry per field. A truncated/unreadable tar, a partial sample or fewer than ``expected`` samples
    raise ShardError naming the shard and the first sample not delivered; with ``on_error="skip"``
    the rest of the shard is counted into ``stats``, warned about, and the iteration just ends."""
    _check_on_error(on_error)
    url, delivered = str(url), 0
    try:
        with open(url, "rb") as stream:
            for sample in checked_samples(url, stream, expected, fields):
                yield sample
                delivered += 1
    except (OSError, ShardError) as err:   # OSError: open() itself; read errors arrive as ShardError
        bad = err if isinstance(err, ShardError) else _sample_error(
            Path(url).name, delivered, None, f"cannot open ({err.strerror})")
        if on_error == "raise":
            raise bad from (err if bad is not err else err.__cause__)
        _skipped(stats, bad, None if expected is None else expected - delivered)


def _read_shards(sources, expected, fields, on_error, stats):
    for source in sources:
        url = source["url"]
        yield from iter_shard(url, expected[url], on_error, stats, fields)


def _apply(samples, transform, on_error, stats):
    for sample in samples:
        try:
            result = transform(sample)
        except Exception as err:
            shard, index = Path(sample["__url__"]).name, sample["__index__"]
            bad = _sample_error(shard, index, sample["__key__"],
                                f"transform failed ({type(err).__name__}: {err})")
            if on_error == "raise":
                raise bad from err
            _skipped(stats, bad, 1)
            continue
        yield result


def shard_pipeline(dst, transform=None, batch_size: int | None = None, collate_fn=None,
                   shuffle_buffer: int = 0, seed: int = 0, on_error: str = "raise",
                   split_by_worker: bool = True, stats: SkipStats | None = None,
                   shuffle_shards: bool = False, split_by_node: bool = True) -> wds.DataPipeline:
    """An IterableDataset for a DataLoader: manifest shards -> split across ranks -> split across
    DataLoader workers -> checked samples (iter_shard) -> buffer shuffle -> transform -> batches.
    ``.stats`` is the SkipStats of ``on_error="skip"`` (in the main process only: each worker counts
    in its copy).

    ``split_by_node``: when torch.distributed is initialised with a world size above 1 (or RANK and
    WORLD_SIZE are set in the environment, as torchrun does; webdataset reads those first), rank r
    reads only shards r, r + world, r + 2 world, ...: each rank reads a disjoint subset and the ranks
    together read every shard once. Within a rank, ``split_by_worker`` deals that subset out to the
    DataLoader workers the same way. For equal epochs on every rank the number of shards should be a
    multiple of ranks x workers (and the shards should hold equal sample counts); otherwise some ranks
    get more batches than others, and a collective (DDP's gradient all-reduce) waits forever for the
    ranks that ran out. Pass ``split_by_node=False`` when every rank should read the whole set."""
    _check_on_error(on_error)
    if not isinstance(shuffle_buffer, int) or shuffle_buffer < 0:
        raise ValueError(f"shuffle_buffer = {shuffle_buffer!r}: accepted values are 0 (off) or more")
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"batch_size = {batch_size!r}: accepted values are None or 1 or more")
    manifest = load_manifest(dst)
    urls = [str((Path(dst) / s["name"]).resolve()) for s in manifest["shards"]]
    expected = {url: s["samples"] for url, s in zip(urls, manifest["shards"])}
    if shuffle_shards:   # same permutation in every rank and worker (same seed), so the splits partition
        random.Random(seed).shuffle(urls)
    stats = stats if stats is not None else SkipStats()
    stages = [wds.SimpleShardList(urls), wds.split_by_node if split_by_node else None,
              wds.split_by_worker if split_by_worker else None,
              functools.partial(_read_shards, expected=expected, fields=manifest["fields"],
                                on_error=on_error, stats=stats)]
    if shuffle_buffer:
        stages.append(wds.shuffle(shuffle_buffer, seed=seed))
    if transform is not None:
        stages.append(functools.partial(_apply, transform=transform, on_error=on_error, stats=stats))
    if batch_size is not None:
        stages.append(wds.batched(batch_size, collation_fn=collate_fn or default_collate, partial=True))
    pipeline = wds.DataPipeline(*stages)
    pipeline.stats = stats
    return pipeline
