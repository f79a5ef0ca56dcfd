"""Padding waste: what batching sequences of unequal length costs, and how bucketing and packing recover it.

A batch of token sequences is a rectangle: every sequence is padded to the longest one in it, and
the padded positions cost compute like real tokens (more, for attention, which grows with the
square of the length; counted here in tokens, so the figures are a lower bound). With lengths
spanning tens of times (a long-tailed, roughly log-normal distribution is typical of text corpora)::

    waste = padded tokens / (real + padded tokens)        cost vs ideal = 1 / (1 - waste)

Three padding strategies, worst to best (pitfalls brief, section 4), then packing:

1. pad everything to the longest sequence in the dataset (a fixed ``max_length``);
2. pad to the longest in each random batch (dynamic padding, e.g. a collate function);
3. length bucketing: batch sequences of similar length together, then shuffle the batch order
   (fairseq's and torchtext's bucket iterators; field case in the brief: 2x single-GPU throughput).

Bucketing trades randomness for padding: ``n_buckets = 1`` is random batching, one bucket per
batch is fully sorted batching.

4. sequence packing, the usual pretraining answer (``pack_rows``, ``packing``): concatenate samples
   into rows of exactly ``seq_len`` tokens. Policies: *split* (a sample that does not fit is cut at
   the row's end and continues in the next row: the only padding is the tail of the very last row),
   and two that keep samples whole, *next fit* (a sample that does not fit starts a new row; the
   row's tail is padding) and *best fit decreasing* (almost no padding, but rows of a fixed company).
   (Next to) no padding, but:

   * **batch statistics change**: a batch is a fixed number of tokens holding a varying number of
     samples (``samples_per_batch_min`` / ``_max``), not a fixed number of samples;
   * **attention across document boundaries**: without a document mask (FlashAttention's
     varlen kernels with ``cu_seqlens``, FlexAttention's document mask, a block-diagonal mask) every
     token attends to the unrelated documents before it in its row (positions need not restart with
     RoPE, which depends only on relative offsets, under a document mask; absolute position embeddings
     do need it). How much the mask matters is measured, not given: Llama 3 reports it had limited
     impact in standard pre-training and mattered for very long sequences (Llama 3 paper, sec. 3.2);
   * **loss weighting**: a per-token mean over the packed batch weights each sample by its length;
     a per-sample mean (each sample's mean, then the mean over samples) must be computed per
     document, with the document ids, and the two differ in what they optimise;
   * *split* cuts documents (``split_samples``): the second piece loses the first as context.
"""
from __future__ import annotations

import bisect
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


PACKING = {"split": "packing, samples split at row ends",
           "next_fit": "packing, whole samples (next fit)",
           "best_fit": "packing, whole samples (best fit decreasing)"}


def pack_rows(lengths, seq_len: int, policy: str = "split", seed: int = 0) -> list[list[tuple[int, int]]]:
    """Pack samples into rows of ``seq_len`` tokens: each row a list of ``(sample index, tokens of that
    sample in this row)``. A sample longer than ``seq_len`` first fills whole rows of its own (whole-
    sample policies). Policies, samples taken in a shuffled order unless said otherwise:

    * ``split``: fill each row to the brim; a sample that does not fit continues in the next row
      (every row is full but the last: pretraining's "concatenate, then chunk"; torchtune's greedy
      ``PackedDataset`` with ``split_across_pack=True``);
    * ``next_fit``: a sample that does not fit closes the row (its tail is padding) and opens the next
      (that ``PackedDataset``'s default, ``split_across_pack=False``);
    * ``best_fit``: longest first, each into the open row it fills most tightly (best fit decreasing,
      an offline bin packer); the rows, not the samples, are then shuffled, so a row's company is fixed.
    """
    a = _as_lengths(lengths)
    if int(seq_len) != seq_len or seq_len < 1:
        raise ValueError(f"seq_len must be an integer >= 1 (got {seq_len})")
    if policy not in PACKING:
        raise ValueError(f"policy must be one of {sorted(PACKING)} (got {policy!r})")
    rng = np.random.default_rng(seed)
    order = rng.permutation(a.size)
    if policy == "best_fit":
        order = order[np.argsort(-a[order], kind="stable")]
    rows, row, used = [], [], 0
    free: list[tuple[int, int]] = []                      # best fit: (free tokens, row number), sorted
    for i in order:
        i, left = int(i), int(a[i])
        if policy != "split":
            while left > seq_len:                          # whole rows of a too-long sample first
                rows.append([(i, seq_len)])
                left -= seq_len
        if policy == "best_fit":
            k = bisect.bisect_left(free, (left, -1))       # the tightest open row it fits in
            if k == len(free):
                rows.append([])
                room, r = seq_len, len(rows) - 1
            else:
                room, r = free.pop(k)
            rows[r].append((i, left))
            if room - left:
                bisect.insort(free, (room - left, r))
            continue
        if policy == "next_fit" and used + left > seq_len:   # does not fit: close the row
            rows.append(row)
            row, used = [], 0
        while left:
            take = min(left, seq_len - used)
            row.append((i, take))
            used, left = used + take, left - take
            if used == seq_len:
                rows.append(row)
                row, used = [], 0
    if row:
        rows.append(row)
    if policy == "best_fit":
        rows = [rows[k] for k in rng.permutation(len(rows))]
    return rows


def packing(lengths, seq_len: int, batch: int, policy: str = "split", seed: int = 0) -> dict:
    """Packed rows of ``seq_len`` (``pack_rows``), ``batch`` rows per batch: the waste columns of the
    other strategies (padded_tokens = the rows' empty tails) plus rows, samples_per_batch_min / _mean /
    _max (samples with tokens in a batch; a padded batch always holds ``batch``) and split_samples
    (samples cut across rows: the later piece loses the earlier as context)."""
    a = _as_lengths(lengths)
    _check_batch(batch)
    if policy == "split":
        n_rows, per_batch, split = _split_counts(a, int(seq_len), int(batch), seed)
    else:
        rows = pack_rows(a, seq_len, policy=policy, seed=seed)
        n_rows, split = len(rows), 0
        per_batch = [len({i for row in rows[k:k + batch] for i, _ in row}) for k in range(0, len(rows), batch)]
    real, total = int(a.sum()), n_rows * int(seq_len)
    return {"strategy": PACKING[policy], "real_tokens": real, "padded_tokens": total - real,
            "waste": (total - real) / total, "relative_cost": total / real, "rows": n_rows,
            "samples_per_batch_min": min(per_batch), "samples_per_batch_mean": float(np.mean(per_batch)),
            "samples_per_batch_max": max(per_batch), "split_samples": split}


def _split_counts(a: np.ndarray, seq_len: int, batch: int, seed: int) -> tuple[int, np.ndarray, int]:
    """``pack_rows(policy="split")``'s rows, samples per batch and cut samples without building the
    rows: the shuffled samples laid end to end are token ranges ``[c[j-1], c[j])`` (``c`` the running
    sum), a row is ``[r S, (r+1) S)``, a batch ``batch`` rows; a range crossing a row end is cut."""
    if int(seq_len) != seq_len or seq_len < 1:
        raise ValueError(f"seq_len must be an integer >= 1 (got {seq_len})")
    order = np.random.default_rng(seed).permutation(a.size)      # the order pack_rows takes them in
    ends = np.cumsum(a[order])
    starts = ends - a[order]
    total = int(ends[-1])
    n_rows = -(-total // seq_len)
    span = seq_len * batch
    first = np.arange(0, total, span)                           # each batch's first and last token
    last = np.minimum(first + span, total) - 1
    per_batch = np.searchsorted(ends, last, side="right") - np.searchsorted(ends, first, side="right") + 1
    split = int((starts // seq_len != (ends - 1) // seq_len).sum())
    return n_rows, per_batch.tolist(), split


COLUMNS = ["strategy", "real_tokens", "padded_tokens", "waste", "relative_cost"]


def padding_table(lengths, batch: int, n_buckets: int | None = None, seed: int = 0,
                  seq_len: int | None = None) -> pd.DataFrame:
    """The strategies side by side: strategy, real_tokens, padded_tokens, waste, relative_cost. With
    ``seq_len``, the three packing policies too (rows of ``seq_len``, ``batch`` rows per batch)."""
    rows = [pad_to_longest_in_dataset(lengths, batch),
            pad_to_longest_in_batch(lengths, batch, shuffle_seed=seed),
            length_bucketing(lengths, batch, n_buckets=n_buckets, seed=seed)]
    if seq_len is not None:
        rows += [packing(lengths, seq_len, batch, policy=policy, seed=seed) for policy in PACKING]
    return pd.DataFrame(rows)[COLUMNS]
