"""Padding waste: what batching sequences of unequal length costs, and how bucketing recovers it.

A batch of token sequences is a rectangle: every sequence is padded to the longest one in it, and
the padded positions cost compute like real tokens (more, for attention, which grows with the
square of the length; counted here in tokens, so the figures are a lower bound). With lengths
spanning tens of times (a long-tailed, roughly log-normal distribution is typical of text corpora)::

    waste = padded tokens / (real + padded tokens)        cost vs ideal = 1 / (1 - waste)

Three strategies, worst to best (pitfalls brief, section 4):

1. pad everything to the longest sequence in the dataset (a fixed ``max_length``);
2. pad to the longest in each random batch (dynamic padding, e.g. a collate function);
3. length bucketing: batch sequences of similar length together, then shuffle the batch order
   (fairseq's and torchtext's bucket iterators; field case in the brief: 2x single-GPU throughput).

Bucketing trades randomness for padding: ``n_buckets = 1`` is random batching, one bucket per
batch is fully sorted batching. Packing several sequences into one row removes padding entirely
but needs attention masks that stop at sequence boundaries; it is not modelled here.
"""
from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pandas as pd


def lognormal_lengths(n: int, median: float = 512, sigma: float = 0.8, max_len: int = 4096,
                      seed: int = 0) -> np.ndarray:
    """``n`` integer lengths, log-normal around ``median`` (``exp(mu)``), clipped to [1, max_len].

    sigma = 0.8 puts the 5th and 95th percentiles about 14x apart (``exp(2 * 1.645 * 0.8)``).
    """
    if n < 1 or median <= 0 or sigma < 0 or max_len < 1:
        raise ValueError(f"need n >= 1, median > 0, sigma >= 0, max_len >= 1 "
                         f"(got n={n}, median={median}, sigma={sigma}, max_len={max_len})")
    rng = np.random.default_rng(seed)
    x = rng.lognormal(mean=math.log(median), sigma=sigma, size=int(n))
    return np.clip(np.rint(x), 1, max_len).astype(np.int64)


def load_lengths(path) -> np.ndarray:
    """Read lengths: one integer per line, or a CSV file with a header holding a ``length`` column.

    Blank lines are skipped. Anything that is not a positive integer raises ValueError naming the
    file and the line number.
    """
    path = Path(path)
    lines = path.read_text().splitlines()
    rows = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
    if not rows:
        raise ValueError(f"{path}: no lengths found (empty file)")
    first = [c.strip().lower() for c in next(csv.reader([rows[0][1]]))]
    col = None
    if "length" in first:
        col, rows = first.index("length"), rows[1:]
    out = []
    for lineno, line in rows:
        if col is None:
            cell = line.strip()
        else:
            cells = next(csv.reader([line]))
            if col >= len(cells):
                raise ValueError(f"{path}:{lineno}: no 'length' column in {line!r}")
            cell = cells[col].strip()
        try:
            value = int(cell)
        except ValueError:
            hint = "" if col is not None else " (or a CSV header with a 'length' column)"
            raise ValueError(f"{path}:{lineno}: {cell!r} is not an integer length{hint}") from None
        if value < 1:
            raise ValueError(f"{path}:{lineno}: length must be >= 1 (got {value})")
        out.append(value)
    if not out:
        raise ValueError(f"{path}: header but no lengths")
    return np.asarray(out, dtype=np.int64)


# --- batching --------------------------------------------------------------------------------

def _as_lengths(lengths) -> np.ndarray:
    a = np.asarray(lengths, dtype=np.int64)
    if a.ndim != 1 or a.size == 0 or a.min() < 1:
        raise ValueError("lengths must be a non-empty 1-D sequence of integers >= 1")
    return a


def _check_batch(batch: int) -> None:
    if int(batch) != batch or batch < 1:
        raise ValueError(f"batch size must be an integer >= 1 (got {batch})")


def bucket_batches(lengths, batch_size: int, n_buckets: int | None = None, shuffle: bool = True,
                   seed: int = 0, drop_last: bool = False, *,
                   bucket_width: int | None = None) -> list[list[int]]:
    """Batches of indices drawn from buckets of similar length (pure; wrap it in a torch Sampler).

    1. sort indices by length (ties in random order when ``shuffle``);
    2. form buckets: by default one bucket per batch (fully sorted batching, least padding);
       ``n_buckets=k`` groups consecutive batches into k buckets of (nearly) equal count;
       ``bucket_width=w`` groups by length range ``[i w, (i+1) w)`` instead;
    3. shuffle indices inside each bucket (when ``shuffle``), cut it into batches of ``batch_size``;
    4. shuffle the order of all batches (when ``shuffle``).

    Every index appears exactly once; with ``drop_last`` the incomplete batches (at most one per
    bucket) are dropped instead, so every index appears at most once. Pass a new ``seed`` each
    epoch (e.g. ``seed + epoch``) for a different order.
    """
    a = _as_lengths(lengths)
    _check_batch(batch_size)
    if n_buckets is not None and bucket_width is not None:
        raise ValueError("give n_buckets or bucket_width, not both")
    rng = np.random.default_rng(seed)
    idx = rng.permutation(a.size) if shuffle else np.arange(a.size)
    idx = idx[np.argsort(a[idx], kind="stable")]            # by length; random among equals
    if bucket_width is not None:
        if bucket_width < 1:
            raise ValueError(f"bucket_width must be >= 1 (got {bucket_width})")
        keys = a[idx] // bucket_width
        buckets = [idx[keys == k] for k in np.unique(keys)]
    else:
        n_batches = math.ceil(a.size / batch_size)
        k = n_batches if n_buckets is None else int(n_buckets)
        if k < 1:
            raise ValueError(f"n_buckets must be >= 1 (got {n_buckets})")
        k = min(k, n_batches)
        # bucket boundaries fall on batch boundaries, so only the last bucket has a partial batch
        cuts = [(i * n_batches // k) * batch_size for i in range(k + 1)]
        buckets = [idx[cuts[i]:cuts[i + 1]] for i in range(k)]
    batches = []
    for bucket in buckets:
        bucket = rng.permutation(bucket) if shuffle else bucket
        for start in range(0, bucket.size, batch_size):
            chunk = bucket[start:start + batch_size]
            if drop_last and chunk.size < batch_size:
                continue
            batches.append([int(i) for i in chunk])
    if shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def _waste(strategy: str, a: np.ndarray, batches) -> dict:
    real = padded = 0
    for b in batches:
        seq = a[np.asarray(b, dtype=np.int64)]
        real += int(seq.sum())
        padded += int(seq.size * seq.max() - seq.sum())
    total = real + padded
    return {"strategy": strategy, "real_tokens": real, "padded_tokens": padded,
            "waste": padded / total, "relative_cost": total / real}


def pad_to_longest_in_dataset(lengths, batch: int) -> dict:
    """Every sequence padded to the dataset's longest (a fixed ``max_length``); batching is irrelevant.

    Returns strategy, real_tokens, padded_tokens, waste (padded / processed), relative_cost
    (processed / real, 1.0 = no padding).
    """
    a = _as_lengths(lengths)
    _check_batch(batch)
    real, padded = int(a.sum()), int(a.size * a.max() - a.sum())
    return {"strategy": "pad to longest in dataset", "real_tokens": real, "padded_tokens": padded,
            "waste": padded / (real + padded), "relative_cost": (real + padded) / real}


def pad_to_longest_in_batch(lengths, batch: int, shuffle_seed: int = 0) -> dict:
    """Random batches (a shuffled order cut every ``batch``), each padded to its own longest."""
    a = _as_lengths(lengths)
    _check_batch(batch)
    order = np.random.default_rng(shuffle_seed).permutation(a.size)
    batches = [order[i:i + batch] for i in range(0, a.size, batch)]
    return _waste("pad to longest in batch", a, batches)


def length_bucketing(lengths, batch: int, n_buckets: int | None = None,
                     bucket_width: int | None = None, seed: int = 0) -> dict:
    """Batches from ``bucket_batches`` (similar lengths together), each padded to its longest."""
    a = _as_lengths(lengths)
    batches = bucket_batches(a, batch, n_buckets=n_buckets, bucket_width=bucket_width, seed=seed)
    return _waste("length bucketing", a, batches)


def padding_table(lengths, batch: int, n_buckets: int | None = None, seed: int = 0) -> pd.DataFrame:
    """The three strategies side by side: strategy, real_tokens, padded_tokens, waste, relative_cost."""
    rows = [pad_to_longest_in_dataset(lengths, batch),
            pad_to_longest_in_batch(lengths, batch, shuffle_seed=seed),
            length_bucketing(lengths, batch, n_buckets=n_buckets, seed=seed)]
    return pd.DataFrame(rows)
