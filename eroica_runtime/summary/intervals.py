"""Interval arithmetic over sorted lists of (start, end) pairs, in milliseconds."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np

# below this many intervals the plain loop is cheaper than numpy's set-up
_NUMPY_FROM = 48


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Merge overlapping intervals (sorted result)."""
    if len(intervals) >= _NUMPY_FROM:
        pairs = np.fromiter(chain.from_iterable(intervals), np.float64, 2 * len(intervals)).reshape(-1, 2)
        return union_cols(pairs[:, 0], pairs[:, 1])
    merged: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if merged and s <= merged[-1][1]:
            if e > merged[-1][1]:
                merged[-1] = (merged[-1][0], e)
        else:
            merged.append((s, e))
    return merged


def union_cols(starts: Sequence[float] | np.ndarray, ends: Sequence[float] | np.ndarray) -> list[tuple[float, float]]:
    """``union`` of the intervals (starts[i], ends[i]), given as two columns: a window's ~10^5 self-time
    segments are merged in numpy (sort, running maximum of the ends) instead of a loop over tuples."""
    s = np.asarray(starts, dtype=np.float64)
    e = np.asarray(ends, dtype=np.float64)
    keep = e > s
    if not keep.all():
        s, e = s[keep], e[keep]
    if not len(s):
        return []
    order = np.argsort(s, kind="stable")
    s, reach = s[order], np.maximum.accumulate(e[order])
    first = np.flatnonzero(np.concatenate(([True], s[1:] > reach[:-1])))   # each merged interval's first
    last = np.append(first[1:] - 1, len(s) - 1)
    return list(zip(s[first].tolist(), reach[last].tolist(), strict=True))


def length(intervals: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in intervals)


def intersect(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Intersection of two merged, sorted interval lists."""
    out: list[tuple[float, float]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        s = max(a[i][0], b[j][0])
        e = min(a[i][1], b[j][1])
        if e > s:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """a minus b, both merged and sorted."""
    out: list[tuple[float, float]] = []
    j = 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return out
