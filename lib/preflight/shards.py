"""Tar shards: pack a small-file dataset into a few large files, and read them back with checks.

Why shards. A parallel file system (Lustre, GPFS, BeeGFS) spreads file *data* over many storage
servers but serves *metadata* (open, stat, directory lookup) from a few metadata servers. A training
set of millions of small files makes every sample a metadata operation; hundreds of loader workers on
dozens of nodes then queue at the metadata servers while the GPUs wait. Packed into tar shards, the
same bytes are read as long sequential streams: one open per shard, then bandwidth. Cluster guides
advise shards of 200-500 MB and no file under 64 MB on a parallel file system; the default is 256 MB.

Layout (the webdataset convention): ``DST/shard-000000.tar, shard-000001.tar, ...``. A sample is the
run of consecutive members that share a key, the path up to the first dot of the basename:
``cls_03/00000123.img.zz`` is field ``img.zz`` of sample ``cls_03/00000123``. ``DST/manifest.json``
records each shard's sample count, size, sha256 and first/last key. That makes two things possible:

* resuming: a conversion killed after shard k keeps shards 0..k (checked against their sha256);
* checked reading: a truncated shard yields fewer samples than the manifest says, and ``iter_shard``
  turns that into an error naming the shard and the sample, never a silently shorter epoch.

Shuffling: shards are read front to back, so ``shard_pipeline`` mixes samples in a buffer of
``shuffle_buffer`` samples (optionally also the shard order), not globally as a map-style Dataset with
a RandomSampler does (``small_file_dataset``). A fixed ``seed`` gives the same order every epoch:
pass ``seed=base + epoch`` for a new one.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import re
import tarfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import webdataset as wds
from torch.utils.data import Dataset, default_collate
from webdataset.tariterators import base_plus_ext, group_by_keys, tar_file_expander

FORMAT = "preflight-shards/1"
MANIFEST = "manifest.json"
_MTIME = 0            # fixed member mtime: the same source bytes always give the same shard bytes
_OWNER = "preflight"  # member uname/gname
_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
          "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}
_SIZE_FORMS = ("accepted forms: 256MB, 500kB, 1GB (powers of 1000), 64MiB, 1GiB (powers of 1024), "
               "or plain bytes such as 1000000")


class ShardError(ValueError):
    """A corrupt or truncated shard, a bad shard set or source tree. ``str()`` is the user message."""

    def __init__(self, message: str, shard: str | None = None, index: int | None = None,
                 key: str | None = None):
        super().__init__(message)
        self.shard, self.index, self.key = shard, index, key


@dataclass
class SkipStats:
    """What ``on_error="skip"`` dropped: sample count and one (shard, index, reason) per incident."""
    skipped_samples: int = 0
    bad_shards: list = field(default_factory=list)


def _sample_error(shard, index, key, reason, after=None) -> ShardError:
    where = f" (key {key})" if key else (f" (after key {after})" if after else "")
    return ShardError(f"{shard}: sample {index}{where}: {reason}", shard, index, key)


def _check_on_error(on_error: str) -> None:
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error = {on_error!r}: accepted values are 'raise' and 'skip'")


def parse_size(text: str) -> int:
    """Bytes in "256MB", "500kB", "1GiB", "1000000" (kB/MB/GB/TB: 1000^n; KiB/MiB/GiB/TiB: 1024^n)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read {text!r} as a size; {_SIZE_FORMS}")
    number, unit = m.group(1), _UNITS[m.group(2).lower()]
    n = int(number) * unit if number.isdigit() else int(float(number) * unit)
    if n <= 0:
        raise ValueError(f"{text!r} is {n} bytes, a size must be more than 0; {_SIZE_FORMS}")
    return n


def shard_name(index: int) -> str:
    return f"shard-{index:06d}.tar"


# ---------------------------------------------------------------- the source tree

def _list_samples(src: Path) -> tuple[list, list]:
    """([(key, [(ext, path), ...]), ...] sorted by key, the field names every sample has)."""
    if not src.is_dir():
        raise ShardError(f"source {src}: {'not a folder' if src.exists() else 'no such folder'}")
    groups: dict[str, list] = {}
    for dirpath, _, filenames in os.walk(src):     # one directory listing per folder, no stat
        for name in filenames:
            path = Path(dirpath, name)
            key, ext = base_plus_ext(path.relative_to(src).as_posix())
            if key is None or ext.startswith("_"):
                raise ShardError(f"{path}: not a sample file; a webdataset member needs a name KEY.EXT")
            groups.setdefault(key, []).append((ext, path))
    if not groups:
        raise ShardError(f"source {src}: no sample files in it")
    samples = sorted((key, sorted(files)) for key, files in groups.items())
    fields = [ext.lower() for ext, _ in samples[0][1]]
    for key, files in samples:     # uniform fields: the reader can then tell a partial sample
        have = [ext.lower() for ext, _ in files]
        if have != fields or len(set(have)) != len(have):
            raise ShardError(f"source {src}: sample {key} has fields {have}, sample {samples[0][0]} has "
                             f"{fields}; every sample needs the same fields (extensions)")
    return samples, fields


def _read_source(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise ShardError(f"{path}: cannot read the sample file ({err.strerror or err})") from err


class SmallFileDataset(Dataset):
    """Map-style dataset over the small files: sample i is one open+read per file (metadata-heavy)."""

    def __init__(self, src, transform=None):
        self.src = Path(src).resolve()
        self.samples, self.fields = _list_samples(self.src)
        self.transform = transform

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        key, files = self.samples[i]
        sample = {"__key__": key, "__url__": str(self.src), "__index__": i}
        sample.update({ext.lower(): _read_source(path) for ext, path in files})
        return self.transform(sample) if self.transform is not None else sample


def small_file_dataset(src, transform=None) -> SmallFileDataset:
    """The small files as a map-style Dataset (for the global-shuffle comparison, RandomSampler)."""
    return SmallFileDataset(src, transform)


# ---------------------------------------------------------------- reading shards

class _Hashing:
    """File wrapper that hashes and counts every byte written or read through it."""

    def __init__(self, f):
        self.f, self.sha, self.size = f, hashlib.sha256(), 0

    def write(self, data):
        self.sha.update(data)
        self.size += len(data)
        return self.f.write(data)

    def read(self, n=-1):
        data = self.f.read(n)
        self.sha.update(data)
        self.size += len(data)
        return data


def _samples(url: str, stream, expected: int | None, fields: list | None = None):
    """Yield the samples of one open shard through webdataset's tar iteration, checked."""
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
            for sample in _samples(url, stream, expected, fields):
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


def load_manifest(dst) -> dict:
    """The manifest of a complete shard set in ``dst``; ShardError if there is none."""
    path = Path(dst) / MANIFEST
    m = _read_manifest(path)
    if m is None:
        raise ShardError(f"{path}: no shard manifest; convert first: python -m preflight shards SRC {dst}")
    if not m.get("complete"):
        raise ShardError(f"{path}: incomplete shard set (interrupted conversion); run the same "
                         "conversion again to resume it")
    return m


def _read_manifest(path: Path) -> dict | None:
    if not path.exists():
        return None
    try:
        m = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ShardError(f"{path}: unreadable manifest ({err})") from err
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise ShardError(f"{path}: not a {FORMAT} manifest")
    return m


def shard_urls(dst) -> list[str]:
    """Absolute paths of the shards of the complete set in ``dst``, in manifest order."""
    return [str((Path(dst) / s["name"]).resolve()) for s in load_manifest(dst)["shards"]]


def shard_pipeline(dst, transform=None, batch_size: int | None = None, collate_fn=None,
                   shuffle_buffer: int = 0, seed: int = 0, on_error: str = "raise",
                   split_by_worker: bool = True, stats: SkipStats | None = None,
                   shuffle_shards: bool = False) -> wds.DataPipeline:
    """An IterableDataset for a DataLoader: manifest shards -> split across DataLoader workers ->
    checked samples (iter_shard) -> buffer shuffle -> transform -> batches. ``.stats`` is the
    SkipStats of ``on_error="skip"`` (in the main process only: each worker counts in its copy)."""
    _check_on_error(on_error)
    if not isinstance(shuffle_buffer, int) or shuffle_buffer < 0:
        raise ValueError(f"shuffle_buffer = {shuffle_buffer!r}: accepted values are 0 (off) or more")
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"batch_size = {batch_size!r}: accepted values are None or 1 or more")
    manifest = load_manifest(dst)
    urls = [str((Path(dst) / s["name"]).resolve()) for s in manifest["shards"]]
    expected = {url: s["samples"] for url, s in zip(urls, manifest["shards"])}
    if shuffle_shards:        # same permutation in every worker, so split_by_worker still partitions
        random.Random(seed).shuffle(urls)
    stats = stats if stats is not None else SkipStats()
    stages = [wds.SimpleShardList(urls), wds.split_by_worker if split_by_worker else None,
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


# ---------------------------------------------------------------- writing shards

def _member_bytes(tar: tarfile.TarFile, name: str, size: int) -> int:
    """Bytes a member takes in the tar: header block(s) + data padded to 512-byte blocks."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uname, info.gname = size, _MTIME, 0o444, _OWNER, _OWNER
    header = info.tobuf(tar.format, tar.encoding, tar.errors)
    return len(header) + -(-size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE


def _tar_bytes(members: int) -> int:
    """File size of a tar holding ``members`` bytes: + two zero end blocks, padded to 10240 bytes."""
    return -(-(members + 2 * tarfile.BLOCKSIZE) // tarfile.RECORDSIZE) * tarfile.RECORDSIZE


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_manifest(dst: Path, manifest: dict) -> None:
    tmp = dst / (MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, dst / MANIFEST)
    _fsync_dir(dst)


def _verify_shard(path: Path, entry: dict, fields: list) -> None:
    """Read one shard back (same checked reader as training) and compare it with its manifest entry."""
    first = last = None
    try:
        with open(path, "rb") as f:
            stream = _Hashing(f)
            for sample in _samples(str(path), stream, entry["samples"], fields):
                first, last = first or sample["__key__"], sample["__key__"]
            while stream.read(1 << 20):     # hash the end-of-archive padding too
                pass
    except OSError as err:
        raise ShardError(f"{path.name}: cannot read ({err.strerror})", path.name) from err
    if (stream.size, stream.sha.hexdigest()) != (entry["bytes"], entry["sha256"]):
        raise ShardError(f"{path.name}: size or sha256 differs from the manifest", path.name)
    if (first, last) != (entry["first_key"], entry["last_key"]):
        raise ShardError(f"{path.name}: keys {first}..{last} differ from the manifest", path.name)


def _resumable(src: Path, dst: Path, shard_bytes: int, force: bool) -> list:
    """Shard entries of an interrupted run of this same conversion; refuse to overwrite anything else."""
    if force or not dst.exists():
        return []
    present = {p.name for p in dst.glob("shard-*.tar")}
    try:
        m = _read_manifest(dst / MANIFEST)
    except ShardError as err:
        raise ShardError(f"{err}; pass force=True (--force) to replace it") from err
    if m is None and not present:
        return []
    if (m is not None and not m.get("complete") and m.get("source") == str(src)
            and m.get("shard_bytes") == shard_bytes and present <= {s["name"] for s in m["shards"]}):
        return m["shards"]
    if m is not None and m.get("complete"):
        what = f"a complete shard set ({len(m['shards'])} shards of {m.get('source')})"
    elif m is not None and (m.get("source"), m.get("shard_bytes")) != (str(src), shard_bytes):
        what = f"an interrupted conversion of {m.get('source')} with shard_bytes={m.get('shard_bytes')}"
    else:
        what = "shard files that no interrupted conversion of this source lists"
    raise ShardError(f"destination {dst} already holds {what}; pass force=True (--force) to replace it")


def convert(src, dst, shard_bytes: int, force: bool = False, progress=None) -> dict:
    """Pack every sample of the small-file tree ``src`` into ``dst/shard-NNNNNN.tar`` + manifest.json.

    A shard is closed when the next sample would take it past ``shard_bytes`` (at least one sample per
    shard). Each shard is written as ``.tmp``, fsynced, listed in the manifest, then renamed: a killed
    run leaves only finished shards, and running the same conversion again verifies and keeps them.
    At the end every shard is read back and the sample count checked. ``progress(done_samples,
    total_samples, shards_done)`` is called after each shard."""
    t0 = time.perf_counter()
    if isinstance(shard_bytes, bool) or not isinstance(shard_bytes, int) or shard_bytes <= 0:
        raise ValueError(f"shard_bytes = {shard_bytes!r}: accepted values are whole bytes, 1 or more")
    src, dst = Path(src).resolve(), Path(dst).resolve()
    if not src.is_dir():
        raise ShardError(f"source {src}: {'not a folder' if src.exists() else 'no such folder'}")
    if dst == src or src in dst.parents:
        raise ShardError(f"destination {dst} is inside the source {src}; the shards would become samples")
    if dst.exists() and not dst.is_dir():
        raise ShardError(f"destination {dst}: exists and is not a folder")
    candidates = _resumable(src, dst, shard_bytes, force)      # nothing written yet
    samples, fields = _list_samples(src)

    dst.mkdir(parents=True, exist_ok=True)
    kept, pos = [], 0                  # keep the prefix of finished shards that still check out
    for entry in candidates:
        n = entry["samples"]
        if (entry["name"] != shard_name(len(kept)) or pos + n > len(samples)
                or (samples[pos][0], samples[pos + n - 1][0]) != (entry["first_key"], entry["last_key"])):
            break
        try:
            _verify_shard(dst / entry["name"], entry, fields)
        except ShardError:
            break
        kept.append(entry)
        pos += n
    keep = {e["name"] for e in kept}
    for p in [*dst.glob("shard-*.tar"), *dst.glob("shard-*.tar.tmp"), dst / (MANIFEST + ".tmp")]:
        if p.name not in keep:         # the manifest itself is replaced atomically just below
            p.unlink(missing_ok=True)
    manifest = {"format": FORMAT, "source": str(src), "shard_bytes": shard_bytes, "samples": len(samples),
                "fields": fields, "complete": False, "shards": list(kept)}
    _write_manifest(dst, manifest)

    carry = None                       # a sample read but not fitting the previous shard
    while pos < len(samples):
        name, start, members = shard_name(len(manifest["shards"])), pos, 0
        tmp = dst / (name + ".tmp")
        try:
            with open(tmp, "wb") as f:
                out = _Hashing(f)
                with wds.TarWriter(out, user=_OWNER, group=_OWNER, compress=False, encoder=False,
                                   mtime=_MTIME) as writer:
                    while pos < len(samples):
                        key, files = samples[pos]
                        data = carry or {ext: _read_source(path) for ext, path in files}
                        size = sum(_member_bytes(writer.tarstream, f"{key}.{ext}", len(b))
                                   for ext, b in data.items())
                        if pos > start and _tar_bytes(members + size) > shard_bytes:
                            carry = data
                            break
                        writer.write({"__key__": key, **data})
                        carry, members, pos = None, members + size, pos + 1
                f.flush()
                os.fsync(f.fileno())
            manifest["shards"].append({"name": name, "samples": pos - start, "bytes": out.size,
                                       "sha256": out.sha.hexdigest(), "first_key": samples[start][0],
                                       "last_key": samples[pos - 1][0]})
            _write_manifest(dst, manifest)     # listed before the rename: every shard-*.tar is listed
            os.replace(tmp, dst / name)
            _fsync_dir(dst)
        finally:
            tmp.unlink(missing_ok=True)
        if progress is not None:
            progress(pos, len(samples), len(manifest["shards"]))

    total = 0
    for entry in manifest["shards"]:
        _verify_shard(dst / entry["name"], entry, fields)
        total += entry["samples"]
    if total != len(samples):
        raise ShardError(f"destination {dst}: the shards hold {total} samples, the source {len(samples)}")
    manifest["complete"] = True
    _write_manifest(dst, manifest)
    return {"shards": len(manifest["shards"]), "samples": total, "dst": str(dst),
            "bytes": sum(e["bytes"] for e in manifest["shards"]), "seconds": time.perf_counter() - t0,
            "resumed_shards": len(kept)}
