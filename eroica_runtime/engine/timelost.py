"""What the job lost from its first finding on, measured on rank 0's own step times.

A finding's cost per step is the engine's estimate from a few profiled steps. This is what happened:
the mean step from the first capture that named something to the end of the job, against the mean
step before the slowdown. In synchronous training every rank runs at the job's pace, so rank 0's
steps are the job's.

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
- The steps in which the detectors were still seeing the slowdown (``lookback`` before the capture)
  count on neither side: they may be healthy or slow. So the figure is a floor: the fault's steps
  before its capture are not counted as lost.

Pure (no MPI, no torch): the runtime calls it at job end and for a flushed report, and keeps the
result in report.json (``job.time_lost``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

MIN_BEFORE = 10   # fewer healthy steps than this are no reference (a fault from the job's start)
MIN_AFTER = 10  # a mean of fewer steps is luck for a rare stall (5 steps of freeze-int: -14 ms a step)


@dataclass(frozen=True)
class TimeLost:
    since_step: int       # the first capture with a finding: steps from here on are "after"
    last_step: int
    steps: int            # after steps counted (profiled ones left out)
    mean_ms: float
    before_first: int     # the reference steps
    before_last: int
    before_steps: int
    before_ms: float
    eroica_steps: int = 0          # steps from ``since_step`` on left out as eroica's (profiled, building)
    eroica_ms: float | None = None  # their mean step

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
                "eroica_ms": None if self.eroica_ms is None else round(self.eroica_ms, 3)}


def since_step(captures: Iterable[tuple[int, str, bool]]) -> int | None:
    """Where the loss is counted from: the first step of the earliest capture, other than the
    baseline or a hang, that named something; ``captures`` are (step, trigger, named anything)."""
    return min((step for step, trigger, named in captures if named and trigger not in ("baseline", "hang")),
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


def time_lost(history: Sequence[float], windows: Iterable[tuple[int, int]], since: int, *,
              warmup: int, lookback: int, deferred: Iterable[tuple[int, int]] = ()) -> TimeLost | None:
    """``history[i]`` is step i + 1's time (ms); ``windows`` every capture's (first step, k);
    ``deferred`` the (first, last) steps of every capture's summary build and gather; ``since`` the
    first step of the first capture with a finding. None when there are fewer than MIN_BEFORE
    healthy steps before it (a fault from the start) or MIN_AFTER steps after it that eroica left
    alone."""
    skip = eroica_steps(windows, deferred)
    before = [(s, ms) for s, ms in enumerate(history, 1)
              if warmup < s < since - lookback and s not in skip]
    after = [ms for s, ms in enumerate(history, 1) if s >= since and s not in skip]
    own = [ms for s, ms in enumerate(history, 1) if s >= since and s in skip]
    if len(before) < MIN_BEFORE or len(after) < MIN_AFTER:
        return None
    return TimeLost(since_step=since, last_step=len(history), steps=len(after), mean_ms=sum(after) / len(after),
                    before_first=before[0][0], before_last=before[-1][0], before_steps=len(before),
                    before_ms=sum(ms for _, ms in before) / len(before), eroica_steps=len(own),
                    eroica_ms=sum(own) / len(own) if own else None)
