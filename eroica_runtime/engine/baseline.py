"""Robust per-peer-group baselines and the thresholds that keep jitter from becoming findings.

A deviation only counts when it is large in three ways at once: in robust z-score against the
peers (median and MAD, so a few slow ranks do not move the yardstick), in absolute milliseconds
(sub-millisecond noise never matters) and relative to the peers' step time (a function that is 3x
slower but costs 0.2% of the step is not what makes the job slow).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class Thresholds:
    """Knobs of the engine; the defaults keep ±10% per-phase jitter on a noisy machine quiet."""

    abs_ms: float = 1.0            # an excess below this many ms per step is noise
    rel_step: float = 0.10         # ... and so is one below this fraction of the peers' median step
    z: float = 5.0                 # robust z-score a culprit must reach against its peers
    sigma_floor_rel: float = 0.02  # MAD floor, relative to the peers' median (identical peers)
    victim_frac: float = 0.5       # a victim waited at least this fraction of the culprit's excess
    regression_rel: float = 0.10   # common-mode growth vs the baseline capture, fraction of its step
    fn_share: float = 0.2          # a function must explain this share of the excess to be named
    top_functions: int = 5         # functions listed in the evidence
    small_group: int = 8           # peer groups smaller than this use the two knobs below
    small_z: float = 3.0
    small_rel_step: float = 0.25   # 4 ranks on 2 shared cores: one rank can lose ~20% of a window to preemption
    noise_k: float = 1.0           # excess must exceed this many std errors of the window's mean step
                                   # (conservative: synchronized ranks wobble together, bursty loaders too)
    regression_noise_k: float = 2.0  # job-wide growth vs the baseline capture must exceed this many std
                                     # errors of the difference of the two windows' mean steps


@dataclass(frozen=True)
class Center:
    """Reference value and robust spread of one quantity across a peer group."""

    ref: float
    sigma: float
    n: int


def center(values: np.ndarray, floor_rel: float = 0.02, floor_abs: float = 0.05) -> Center:
    """Median/MAD for 3+ peers; for 2 peers the faster one is the reference (the median of two
    would split a culprit's excess in half)."""
    n = int(values.shape[0])
    if n == 0:
        return Center(float("nan"), float("nan"), 0)
    if n == 1:
        return Center(float(values[0]), float("inf"), 1)
    ref, sigma = column_center(values.reshape(n, 1), floor_rel, floor_abs)
    return Center(float(ref[0]), float(sigma[0]), n)


def column_center(sub: np.ndarray, floor_rel: float = 0.02, floor_abs: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """``center``'s rule for every column of ``sub`` (rows = 2+ peers) at once: (references, robust
    spreads)."""
    if len(sub) == 2:
        ref = sub.min(axis=0)
        return ref, np.maximum(floor_rel * np.abs(ref), floor_abs)
    ref = np.median(sub, axis=0)
    mad = np.median(np.abs(sub - ref[None, :]), axis=0)
    return ref, np.maximum(np.maximum(MAD_TO_SIGMA * mad, floor_rel * np.abs(ref)), floor_abs)


def column_reference(matrix: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Per-column reference over ``rows`` (median for 3+, min for 2), vectorised over columns."""
    sub = matrix[rows]
    if len(rows) == 2:
        return sub.min(axis=0)
    return np.median(sub, axis=0)


def median_of_others(x: np.ndarray) -> np.ndarray:
    """For every element, the median of all the others (vectorised: one sort, no per-element copies)."""
    n = len(x)
    if n < 2:
        return np.full(n, np.nan)
    order = np.argsort(x, kind="stable")
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    s = x[order]

    def nth(i: int) -> np.ndarray:    # the i-th smallest of the others, per element
        return np.where(i < pos, s[min(i, n - 1)], s[min(i + 1, n - 1)])

    m = n - 1
    return nth(m // 2) if m % 2 else 0.5 * (nth(m // 2 - 1) + nth(m // 2))


def significant(excess: float, z: float, step_ref: float, th: Thresholds, n: int = 1 << 30,
                corroborated: bool = False) -> bool:
    """The triple test: robust z, absolute ms, share of the step.

    A MAD from fewer than ``small_group`` peers is itself noise, so small groups trade the z-score
    requirement (down to ``small_z``) for a larger share of the step (``small_rel_step``); when the
    rank's wait also shrank by about its excess (``corroborated``) that large share alone suffices.
    """
    rel, z_min = group_bars(n, th)
    return excess >= max(th.abs_ms, rel * step_ref) and (z >= z_min or (n < th.small_group and corroborated))


def group_bars(n: int, th: Thresholds) -> tuple[float, float]:
    """(share of the peers' step, robust z) an excess must reach in a group of ``n`` peers.

    Every per-rank comparison uses this one rule: a small group's MAD is itself noise (three of four
    ranks agreeing by chance give a tiny MAD), so it asks for a larger share of the step instead.
    """
    if n < th.small_group:
        return th.small_rel_step, th.small_z
    return th.rel_step, z_required(n, th)


def z_required(n: int, th: Thresholds) -> float:
    """The z-score bar grows with the group: more peers, more chances for one to look extreme by
    luck; fewer peers, a noisier MAD. 4.0 at 8 peers rising (log-linearly) to ``th.z`` at 64+."""
    if n >= 64:
        return th.z
    lo = min(4.0, th.z)
    return lo + (th.z - lo) * max(math.log2(max(n, 8)) - 3.0, 0.0) / 3.0
