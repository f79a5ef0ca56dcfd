"""The tar-shard format: layout, naming, key rules, the manifest, and the errors.

Both sides of a shard set import this module and nothing of each other's: the writer
(``preflight.toolkit.shards``, which packs a small-file tree) and the checked reader
(``preflight.toolkit.shardread``, which feeds training). So the import graph is one-way::

    shardformat  <-  shardread  <-  shards

Layout (the webdataset convention): ``DST/shard-000000.tar, shard-000001.tar, ...``
(:func:`shard_name`). A sample is the run of consecutive members that share a key, the path up to the
first dot of the basename: ``cls_03/00000123.img.zz`` is field ``img.zz`` of sample
``cls_03/00000123``. Every sample has the same fields (:func:`list_samples` enforces it on the
source tree): that is what lets the reader tell a partial sample (a tar cut between the members of
one sample) from a whole one.

Manifest. ``DST/manifest.json`` (:data:`MANIFEST`, format :data:`FORMAT`) records the source, the
shard size, the fields, and each shard's sample count, size, sha256 and first/last key; ``complete``
is set only once every shard has been written and read back. That makes two things possible:

* resuming: a conversion killed after shard k keeps shards 0..k (checked against their sha256);
* checked reading: a truncated shard yields fewer samples than the manifest says, and the reader
  turns that into an error naming the shard and the sample, never a silently shorter epoch.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

FORMAT = "preflight-shards/1"
MANIFEST = "manifest.json"

__all__ = ["FORMAT", "MANIFEST", "ShardError", "SkipStats", "list_samples", "load_manifest", "read_manifest",
           "read_source", "shard_name", "shard_urls"]


class ShardError(ValueError):
    """A corrupt or truncated shard, a bad shard set or source tree. ``str()`` is the user message;
    ``shard``, ``index`` and ``key`` say where (the shard file, the first sample not delivered)."""

    def __init__(self, message: str, shard: str | None = None, index: int | None = None,
                 key: str | None = None):
        super().__init__(message)
        self.shard, self.index, self.key = shard, index, key


@dataclass
class SkipStats:
    """What ``on_error="skip"`` dropped: sample count and one (shard, index, reason) per incident."""
    skipped_samples: int = 0
    bad_shards: list = field(default_factory=list)


def shard_name(index: int) -> str:
    """File name of shard ``index``: ``shard-000042.tar`` (zero-padded, so names sort in order)."""
    return f"shard-{index:06d}.tar"


# ---------------------------------------------------------------- the source tree: key rules

def list_samples(src: Path) -> tuple[list, list]:
    """([(key, [(ext, path), ...]), ...] sorted by key, the field names every sample has).

    The key rule is webdataset's (``base_plus_ext``): the key is the path relative to ``src`` up to
    the first dot of the file name, the field is the rest. A file without a dot, a field starting
    with ``_`` (reserved for ``__key__`` and friends) or samples with differing fields raise
    ``ShardError``. One directory listing per folder and no ``stat``: the point of sharding is to
    touch the metadata servers as little as possible."""
    from webdataset.tariterators import base_plus_ext

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


def read_source(path: Path) -> bytes:
    """The bytes of one sample file; an unreadable file is a ``ShardError`` naming it."""
    try:
        return path.read_bytes()
    except OSError as err:
        raise ShardError(f"{path}: cannot read the sample file ({err.strerror or err})") from err


# ---------------------------------------------------------------- the manifest

def load_manifest(dst) -> dict:
    """The manifest of a complete shard set in ``dst``; ShardError if there is none."""
    path = Path(dst) / MANIFEST
    m = read_manifest(path)
    if m is None:
        raise ShardError(f"{path}: no shard manifest; convert first: python -m preflight shards SRC {dst}")
    if not m.get("complete"):
        raise ShardError(f"{path}: incomplete shard set (interrupted conversion); run the same "
                         "conversion again to resume it")
    return m


def read_manifest(path: Path) -> dict | None:
    """The manifest at ``path``, complete or not; None when there is no file. A file that is not a
    :data:`FORMAT` manifest raises ``ShardError``."""
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
