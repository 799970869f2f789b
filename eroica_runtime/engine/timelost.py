"""What the job lost from the slowdown's onset on, measured on rank 0's own step times.

A finding's cost per step is the engine's estimate from a few profiled steps. This is what happened:
the mean step from the slowdown's onset (below; else the first capture that named something) to the
end of the job, against the mean step before it. In synchronous training every rank runs at the
job's pace, so rank 0's steps are the job's.

- Means, not medians: a fault in bursts (8 slow steps in 20) leaves the median alone but costs the
  job every slow step.
- eroica's steps are left out on both sides: each capture's lead-in step, its window and the step
  after it carry the profiler's cost, and the steps after them carry the summary's build (a slice
  of up to 20 ms a boundary on every rank) and the gather, until the detectors judge steps again.
  Rank 0's own boundary work is not in its step times (the step clock leaves it out), but every
  other rank's is: rank 0 waits for it in the next collective, and on shared cores the slices take
  the CPU from the training. Counted in, one 16-step capture of the fault bench's `freeze` job
  (0.7 s of building a rank, 4 ranks on 2 cores) raised its step from ~40 to ~75 ms up to the job's
  end: "+36 ms a step" against 6 measured on the same job without that capture (docs/benchmarks.md
  §5b). Those steps' mean is kept next to the figure, so that eroica's own cost is said
  too (``eroica_steps``, ``eroica_ms``).
- The slowdown began before the capture that named it: the detectors need a few steps to see a
  spike, and up to their window (50 steps) for a drift or a loss of throughput. Counted from the
  capture, those steps would be lost from the total and, further back than the spike's ``lookback``,
  counted as the healthy reference, lowering the figure a step (a fault 20 steps old at its capture,
  in a 60-step reference: a fifth of it). So the loss is counted from the slowdown's onset
  (``onset``): the split of rank 0's steps into a level before and one after that fits them best,
  searched over the detectors' reach before the capture, and taken only when the steps it adds
  before the capture are slow like the ones after it. Otherwise (no clear onset) the steps in which
  the detectors were still seeing the slowdown (``lookback`` before the capture) count on neither
  side, and the figure is a floor.

Pure (no MPI, no torch): the runtime calls it at job end and for a flushed report, and keeps the
result in report.json (``job.time_lost``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from eroica_runtime.engine.hang import HANG_TRIGGER

MIN_BEFORE = 10   # fewer healthy steps than this are no reference (a fault from the job's start)
SURE = 4.0      # an onset's two levels differ by this many standard errors (of healthy noise) at least
MIN_AFTER = 10  # a mean of fewer steps is luck for a rare stall (5 steps of freeze-int: -14 ms a step)


@dataclass(frozen=True)
class TimeLost:
    since_step: int       # the first capture with a finding (the onset's search starts from it)
    last_step: int
    steps: int            # after steps counted (profiled ones left out)
    mean_ms: float
    before_first: int     # the reference steps
    before_last: int
    before_steps: int
    before_ms: float
    eroica_steps: int = 0          # steps from where the loss is counted on that were eroica's (profiled, building)
    eroica_ms: float | None = None  # their mean step
    onset_step: int | None = None   # where the slowdown began (``onset``): counted from it, else since_step

    @property
    def per_step_ms(self) -> float:
        return self.mean_ms - self.before_ms

    @property
    def total_s(self) -> float:
        """Time lost over the steps counted (never below zero: a job that got faster lost nothing)."""
        return max(self.per_step_ms, 0.0) * self.steps / 1e3

    def to_json(self) -> dict[str, Any]:
        return {"since_step": self.since_step, "last_step": self.last_step, "steps": self.steps,
                "mean_ms": round(self.mean_ms, 3), "before_steps": [self.before_first, self.before_last],
                "before_count": self.before_steps, "before_ms": round(self.before_ms, 3),
                "per_step_ms": round(self.per_step_ms, 3), "total_s": round(self.total_s, 3),
                "eroica_steps": self.eroica_steps,
                "eroica_ms": None if self.eroica_ms is None else round(self.eroica_ms, 3),
                "onset_step": self.onset_step}


def since_step(captures: Iterable[tuple[int, str, bool]]) -> int | None:
    """Where the loss is counted from: the first step of the earliest capture, other than the
    baseline or a hang, that named something; ``captures`` are (step, trigger, named anything)."""
    return min((step for step, trigger, named in captures if named and trigger not in ("baseline", HANG_TRIGGER)),
               default=None)


def lookback(spike_steps: int, vote_lag: int) -> int:
    """The steps before a capture that count on neither side: those the spike rule and the vote took
    to see the slowdown, and one on either side of them."""
    return spike_steps + vote_lag + 2


def profiled_steps(windows: Iterable[tuple[int, int]]) -> set[int]:
    """Steps that ran under the profiler: for each capture (first window step, k), its lead-in step,
    its k steps and the step after them."""
    out: set[int] = set()
    for first, k in windows:
        out.update(range(first - 1, first + k + 1))
    return out


def eroica_steps(windows: Iterable[tuple[int, int]], deferred: Iterable[tuple[int, int]] = ()) -> set[int]:
    """Every step eroica disturbed: the profiled ones (``profiled_steps``) and, for ``deferred``
    (first, last) spans, the steps in which a capture's summary was built and gathered."""
    out = profiled_steps(windows)
    for first, last in deferred:
        out.update(range(first, last + 1))
    return out


def onset_reach(spike_steps: int, vote_lag: int, *windows: int) -> int:
    """How many steps before a capture its slowdown may have begun: the longest detector window (the
    drift and throughput rules judge a window of steps) and the vote's lag, or the spike's lookback."""
    return max(lookback(spike_steps, vote_lag), max(windows, default=0) + vote_lag + 2)


def _steps(history: Sequence[float], skip: set[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(step numbers, step times, eroica's own) as arrays: a long job's history is a million steps,
    measured again at every capture (scripts/bench/long_history.py)."""
    ms = np.asarray(history, dtype=np.float64)
    steps = np.arange(1, len(ms) + 1)
    own = np.isin(steps, np.fromiter(skip, dtype=np.int64, count=len(skip)))
    return steps, ms, own


def onset(history: Sequence[float], since: int, *, warmup: int, skip: set[int], reach: int) -> int | None:
    """The step the slowdown seen at ``since`` began, from rank 0's step times, or None.

    The least-squares split of the steps after warm-up (eroica's own left out) into a level before a
    step t and one from t to the job's end, for t within ``reach`` steps before ``since`` (the steps
    after ``since`` pin the slow level). Taken only when the slow level is above the healthy one and
    the steps from t up to ``since`` are nearer the slow level than the healthy one: otherwise noise
    picked t, and there is no clear onset."""
    return _onset(*_steps(history, skip), since, warmup=warmup, reach=reach)


def _onset(all_steps: np.ndarray, all_ms: np.ndarray, own: np.ndarray, since: int, *, warmup: int,
           reach: int) -> int | None:
    """``onset`` on the history as ``_steps`` returns it (``time_lost`` converts it once)."""
    keep = (all_steps > warmup) & ~own
    steps, ms = all_steps[keep], all_ms[keep]
    if len(ms) < MIN_BEFORE + MIN_AFTER:
        return None
    # candidate splits: index i puts ms[:i] before; at least MIN_BEFORE before, t <= since
    first = max(MIN_BEFORE, int(np.searchsorted(steps, since - reach)))
    last = int(np.searchsorted(steps, since, side="right"))
    if first >= last:
        return None
    csum, csq = np.cumsum(ms), np.cumsum(ms * ms)
    n, total, total_sq = len(ms), csum[-1], csq[-1]
    i = np.arange(first, last)
    left_n, right_n = i, n - i
    left_s, left_q = csum[i - 1], csq[i - 1]
    right_s, right_q = total - left_s, total_sq - left_q
    sse = (left_q - left_s ** 2 / left_n) + (right_q - right_s ** 2 / right_n)
    k = int(np.argmin(sse))
    best = int(i[k])
    healthy, slow = float(ms[:best].mean()), float(ms[best:].mean())
    spread = float(ms[:best].std(ddof=1))      # the healthy steps' noise (a burst's spread is the fault)
    t = int(steps[best])
    gap = ms[(steps >= t) & (steps < since)]
    if slow - healthy <= SURE * spread * float(np.sqrt(1 / best + 1 / (n - best))):
        return None          # two levels no clearer than noise
    if len(gap) and float(gap.mean()) < (healthy + slow) / 2:
        return None          # the steps it would add before the capture are not slow
    return t


def time_lost(history: Sequence[float], windows: Iterable[tuple[int, int]], since: int, *,
              warmup: int, lookback: int, deferred: Iterable[tuple[int, int]] = (),
              reach: int = 0) -> TimeLost | None:
    """``history[i]`` is step i + 1's time (ms); ``windows`` every capture's (first step, k);
    ``deferred`` the (first, last) steps of every capture's summary build and gather; ``since`` the
    first step of the first capture with a finding; ``reach`` how far before it the onset is looked
    for (``onset_reach()``; 0: not looked for). None when there are fewer than MIN_BEFORE healthy steps
    before the loss is counted (a fault from the start) or MIN_AFTER steps after that eroica left
    alone."""
    steps, ms, own = _steps(history, eroica_steps(windows, deferred))
    start = _onset(steps, ms, own, since, warmup=warmup, reach=reach) if reach > 0 else None
    end_before = since - lookback if start is None else start
    begin = since if start is None else start
    before = (steps > warmup) & (steps < end_before) & ~own
    after = (steps >= begin) & ~own
    mine = (steps >= begin) & own
    n_before, n_after, n_own = int(before.sum()), int(after.sum()), int(mine.sum())
    if n_before < MIN_BEFORE or n_after < MIN_AFTER:
        return None
    first_before, last_before = steps[before][[0, -1]]
    return TimeLost(since_step=since, last_step=len(ms), steps=n_after, mean_ms=float(ms[after].mean()),
                    before_first=int(first_before), before_last=int(last_before), before_steps=n_before,
                    before_ms=float(ms[before].mean()), eroica_steps=n_own,
                    eroica_ms=float(ms[mine].mean()) if n_own else None, onset_step=start)
