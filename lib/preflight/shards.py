"""Tar shards: the format, and the writer that packs a small-file dataset into it.

Why shards. A parallel file system (Lustre, GPFS, BeeGFS) spreads file *data* over many storage
servers but serves *metadata* (open, stat, directory lookup) from a few metadata servers. A training
set of millions of small files makes every sample a metadata operation; hundreds of loader workers on
dozens of nodes then queue at the metadata servers while the GPUs wait. Packed into tar shards, the
same bytes are read as long sequential streams: one open per shard, then bandwidth. Cluster guides
advise shards of 200-500 MB and no file under 64 MB on a parallel file system; the default is 256 MB.

Layout (the webdataset convention): ``DST/shard-000000.tar, shard-000001.tar, ...``. A sample is the
run of consecutive members that share a key, the path up to the first dot of the basename:
``cls_03/00000123.img.zz`` is field ``img.zz`` of sample ``cls_03/00000123``. Every sample has the
same fields. Member bytes are deterministic (fixed mtime, owner, mode): the same source gives the same
shards, byte for byte.

Manifest. ``DST/manifest.json`` (``FORMAT``) records the source, the shard size, the fields, and each
shard's sample count, size, sha256 and first/last key; ``complete`` is set only once every shard has
been written and read back. That makes two things possible:

* resuming: a conversion killed after shard k keeps shards 0..k (checked against their sha256);
* checked reading: a truncated shard yields fewer samples than the manifest says, and the reader
  turns that into an error naming the shard and the sample, never a silently shorter epoch.

Reading lives in ``preflight.shardread`` (``iter_shard``, ``shard_pipeline``, ``small_file_dataset``);
those names are also reachable here, as ``shards.shard_pipeline`` and so on.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import webdataset as wds
from webdataset.tariterators import base_plus_ext

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


# ---------------------------------------------------------------- the manifest

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


def _write_manifest(dst: Path, manifest: dict) -> None:
    tmp = dst / (MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, dst / MANIFEST)
    _fsync_dir(dst)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    # imported here, not at the top: shardread imports this module
    from preflight.shardread import _samples
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


# ---------------------------------------------------------------- the reader, under its old names

_READER = ("iter_shard", "shard_pipeline", "small_file_dataset", "SmallFileDataset")


def __getattr__(name: str):
    """``shards.shard_pipeline`` etc. keep working. Imported on first use, not at the top: shardread
    imports ShardError, SkipStats and load_manifest from here, so the import graph stays one-way."""
    if name in _READER:
        from preflight import shardread
        return getattr(shardread, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_READER])
