"""Time on a timeline as a union of intervals: what "busy", "overlapped" and "idle" are measured on.

Intervals are half-open ``[start, end)`` integer nanoseconds in numpy arrays. Two streams running at
once count once: every measure is taken on the union, and the time in two sets at once is
``|A and B| = |A| + |B| - |A or B|``. All of it vectorised: a trace of millions of kernels is sorted
once, never walked in Python.
"""
from __future__ import annotations

import numpy as np


def union(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals [s, e) as sorted, disjoint intervals."""
    if len(s) == 0:
        return s.astype(np.int64), e.astype(np.int64)
    o = np.argsort(s, kind="stable")
    s, e = s[o], e[o]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > reach[:-1]
    idx = np.flatnonzero(new)
    return s[idx], np.maximum.reduceat(e, idx)


def before(u, x: np.ndarray) -> np.ndarray:
    """For each x, the length of the union ``u`` before x (vectorised)."""
    s, e = u
    if len(s) == 0:
        return np.zeros(len(x), np.int64)
    cum = np.concatenate([[0], np.cumsum(e - s)])
    i = np.searchsorted(s, x, side="right")          # intervals starting at or before x: [0, i)
    j = np.maximum(i - 1, 0)
    part = np.where(i > 0, np.clip(np.minimum(x, e[j]) - s[j], 0, None), 0)
    return cum[j] + part


def length(u) -> int:
    return int((u[1] - u[0]).sum())


def both(a, b) -> int:
    """Time in both of two unions."""
    return length(a) + length(b) - length(union(np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]])))
