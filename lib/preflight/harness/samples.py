"""The chapter-2 dataset: many small image files, as a real training set on a shared file system looks.

Each sample is one file ``<root>/cls_NN/<index>.img.zz``: a 64x64 RGB uint8 image (smooth gradients
plus a coarse texture, so it compresses like a photo-ish thumbnail, a few kB) compressed with zlib, in an
ImageNet-style class-folder layout. The label is the folder. PNG's Sub filter + zlib stand in for PNG/JPEG:
inflating and unfiltering is real CPU decode work, and its Adler-32 checksum makes a corrupt payload fail loudly.

``decode_augment`` is the per-sample CPU transform the loader workers run: decode, to float, random
crop (with padding), random horizontal flip, normalise. It costs on the order of 100 us per sample on
one core, which is what makes ``num_workers`` matter.

The same samples packed in tar shards (``preflight.toolkit.shards``) have member names
``cls_NN/<index>.img.zz``: webdataset keys are ``cls_NN/<index>``, the field is ``img.zz``.
"""
from __future__ import annotations

import os
import zlib
from pathlib import Path

import numpy as np

SIDE = 64            # image side, pixels
CROP = 56            # augmented crop side
CLASSES = 10
FIELD = "img.zz"     # the sample's one field (file extension)
MEAN, STD = 0.5, 0.25


def _image(rng: np.random.Generator) -> np.ndarray:
    """A smooth random image with a coarse texture: (SIDE, SIDE, 3) uint8."""
    y, x = np.mgrid[0:SIDE, 0:SIDE].astype(np.float32) / SIDE
    a, b, c = rng.uniform(0, 255, size=(3, 3)).astype(np.float32)
    img = a * x[..., None] + b * y[..., None] + c * (x * y)[..., None] / 2
    texture = rng.normal(0, 24, size=(SIDE // 4, SIDE // 4, 3)).astype(np.float32)
    img += np.kron(texture, np.ones((4, 4, 1), dtype=np.float32))     # coarse texture, 4x4 blocks
    return np.clip(img, 0, 255).astype(np.uint8)


def encode(img: np.ndarray) -> bytes:
    """PNG-style: the 'Sub' filter (each byte minus its left neighbour, mod 256), then deflate."""
    img = np.ascontiguousarray(img, dtype=np.uint8)
    sub = np.diff(img, axis=1, prepend=np.zeros((SIDE, 1, 3), np.uint8))
    return zlib.compress(sub.tobytes(), 1)


def sample_name(index: int) -> str:
    """Relative path of sample ``index`` (its webdataset key plus ``.img.zz``)."""
    return f"cls_{index % CLASSES:02d}/{index:08d}.{FIELD}"


def label_of(key: str) -> int:
    """The class from a key or relative path such as ``cls_03/00000123``."""
    return int(key.split("/")[-2].removeprefix("cls_"))


def write_small_files(root: str | os.PathLike, count: int, seed: int = 0, sync: bool = True) -> dict:
    """Write ``count`` sample files under ``root``; return {'files', 'bytes'}.

    ``sync`` flushes them to disk (``os.sync``): the page cache only drops clean pages, so a cold read
    measured after ``posix_fadvise(DONTNEED)`` needs the data written back first."""
    if count < 1:
        raise ValueError(f"count = {count}: need at least 1 sample")
    root = Path(root)
    for c in range(CLASSES):
        (root / f"cls_{c:02d}").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    total = 0
    for i in range(count):
        data = encode(_image(rng))
        (root / sample_name(i)).write_bytes(data)
        total += len(data)
    if sync:
        os.sync()
    return {"files": count, "bytes": total}


def decode(payload: bytes) -> np.ndarray:
    """Inflate one payload to a (SIDE, SIDE, 3) uint8 array; ``zlib.error`` if it is corrupt."""
    raw = zlib.decompress(payload)
    if len(raw) != SIDE * SIDE * 3:
        raise ValueError(f"decoded {len(raw)} bytes, expected {SIDE * SIDE * 3}")
    sub = np.frombuffer(raw, dtype=np.uint8).reshape(SIDE, SIDE, 3)
    return np.cumsum(sub, axis=1, dtype=np.uint8)      # undo the Sub filter (wraps mod 256)


def decode_augment(payload: bytes, rng: np.random.Generator | None = None):
    """The worker-side transform: decode, to float CHW, random crop + flip, normalise -> torch tensor."""
    import torch

    rng = rng or np.random.default_rng()
    img = torch.from_numpy(decode(payload).copy()).permute(2, 0, 1).float().div_(255.0)
    top, left = (int(v) for v in rng.integers(0, SIDE - CROP + 1, size=2))
    img = img[:, top:top + CROP, left:left + CROP]
    if rng.random() < 0.5:
        img = img.flip(-1)
    return img.sub_(MEAN).div_(STD).contiguous()
