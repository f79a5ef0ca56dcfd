"""Tar shards: the writer that packs a small-file dataset into them, and one import for all of it.

Why shards. A parallel file system (Lustre, GPFS, BeeGFS) spreads file *data* over many storage
servers but serves *metadata* (open, stat, directory lookup) from a few metadata servers. A training
set of millions of small files makes every sample a metadata operation; hundreds of loader workers on
dozens of nodes then queue at the metadata servers while the GPUs wait. Packed into tar shards, the
same bytes are read as long sequential streams: one open per shard, then bandwidth. Cluster guides
advise shards of 200-500 MB and no file under 64 MB on a parallel file system; the default is 256 MB.

The format (layout, key rules, manifest, errors) is ``preflight.toolkit.shardformat``; the checked reader
is ``preflight.toolkit.shardread``. This module writes: ``convert`` packs the samples in key order into
shards of about ``shard_bytes``, with deterministic member bytes (fixed mtime, owner, mode: the same
source gives the same shards, byte for byte), writes the manifest after every shard, and reads every
shard back with the training reader before marking the set complete.

The reader's and the format's public names are re-exported here (``shards.shard_pipeline``,
``shards.ShardError``, ``shards.load_manifest``, ...): one import for a notebook. The reader's names
load on first use (``__getattr__`` below): the reader and the writer import webdataset and torch
(about 1 s), which ``parse_size`` and the format do not need, nor does a plan-only audit.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import tarfile
import time
from pathlib import Path

from preflight.core.fsutil import atomic_write_text, fsync_dir
from preflight.toolkit.shardformat import (
    FORMAT,
    MANIFEST,
    ShardError,
    SkipStats,
    list_samples,
    load_manifest,
    read_manifest,
    read_source,
    shard_name,
    shard_urls,
)

__all__ = ["FORMAT", "MANIFEST", "ShardError", "SkipStats", "SmallFileDataset", "convert", "iter_shard",  # noqa: F822 - the reader names load in __getattr__
           "load_manifest", "parse_size", "shard_name", "shard_pipeline", "shard_urls", "small_file_dataset"]
_READER = ("SmallFileDataset", "checked_samples", "iter_shard", "shard_pipeline", "small_file_dataset")


def __getattr__(name: str):
    """``shards.shard_pipeline`` and the reader's other names, from ``preflight.toolkit.shardread`` on first use."""
    if name in _READER:
        from preflight.toolkit import shardread

        return getattr(shardread, name)
    raise AttributeError(f"module 'preflight.toolkit.shards' has no attribute {name!r}")

_MTIME = 0            # fixed member mtime: the same source bytes always give the same shard bytes
_OWNER = "preflight"  # member uname/gname
_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
          "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}
_SIZE_FORMS = ("accepted forms: 256MB, 500kB, 1GB (powers of 1000), 64MiB, 1GiB (powers of 1024), "
               "or plain bytes such as 1000000")


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


def _write_manifest(dst: Path, manifest: dict) -> None:
    """Replace the manifest whole and durably: a resumed conversion trusts what it lists."""
    atomic_write_text(dst / MANIFEST, json.dumps(manifest, indent=1))


# ---------------------------------------------------------------- writing shards

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


def _member_bytes(tar: tarfile.TarFile, name: str, size: int) -> int:
    """Bytes a member takes in the tar: header block(s) + data padded to 512-byte blocks."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uname, info.gname = size, _MTIME, 0o444, _OWNER, _OWNER
    header = info.tobuf(tar.format, tar.encoding, tar.errors)
    return len(header) + -(-size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE


def _tar_bytes(members: int) -> int:
    """File size of a tar holding ``members`` bytes: + two zero end blocks, padded to 10240 bytes."""
    return -(-(members + 2 * tarfile.BLOCKSIZE) // tarfile.RECORDSIZE) * tarfile.RECORDSIZE


def _verify_shard(path: Path, entry: dict, fields: list) -> None:
    """Read one shard back (same checked reader as training) and compare it with its manifest entry."""
    from preflight.toolkit.shardread import checked_samples

    first = last = None
    try:
        with open(path, "rb") as f:
            stream = _Hashing(f)
            for sample in checked_samples(str(path), stream, entry["samples"], fields):
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
        m = read_manifest(dst / MANIFEST)
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
    import webdataset as wds

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
    samples, fields = list_samples(src)

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
    for p in [*dst.glob("shard-*.tar"), *dst.glob("shard-*.tar.tmp"), *dst.glob(f".{MANIFEST}.*.tmp")]:
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
                        data = carry or {ext: read_source(path) for ext, path in files}
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
            fsync_dir(dst)
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
