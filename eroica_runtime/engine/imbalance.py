"""Job level: ranks that take turns being the slowest, each step waiting for whichever had the most work.

When each rank's work a step depends on its own data (sequences of different lengths padded per
batch, images of different sizes, a sampler's uneven shards), every step waits in its collectives
for the rank that drew the most, and that rank changes from step to step. No rank is a culprit: a
capture's window finds the ranks alike on average, the detectors see no slowdown (the job was
always so), and the job summary said "step time alike on every rank". A 4-rank DDP job whose
batches were 256-2,300 rows long, drawn per rank (2026-12-05, 2 cores; tests/data/imbalance): its
ranks' training threads were busy (on a CPU or waiting for a batch) 11.0 ms a step on average, the
busiest of them 18.6 ms, the step 36.1 ms; eroica said "healthy". The same job with equal batches:
the busiest rank 0.2 ms above the mean.

At job end every rank contributes what its training thread did (CPU time and the wait for its next
batch: the work that differs between ranks, not the collectives' wait) in each of the job's last
steps; on the job-end gather each node leader reduces its ranks' to one record a step (the ranks'
sum, the busiest rank and its time: jobend.py) and rank 0 merges the nodes'. From these this says
what waiting for the busiest cost the job a step, over the ranks' mean, and whether one rank was the busiest most of the time (a
straggler: the findings and the steady-work line are about it, this is not) or the ranks took turns.
Pure: no MPI, no torch. CPU ranks only: on a GPU rank the training thread's time does not show the
device's work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from eroica_runtime.engine.model import read_count, read_ms

MIN_STEPS = 32      # steps every rank reported (eroica's own excluded): fewer say nothing of a rhythm
MIN_SHARE = 0.10    # of the step: the waiting for the busiest rank under this is no line (healthy: 1%)
MIN_MS = 1.0        # nor under this, a step
TURN_SHARE = 0.5    # one rank holding this much of the excess is a straggler, not ranks taking turns
MIN_RANKS = 2


@dataclass(frozen=True)
class Imbalance:
    """Over ``steps`` of the job's last steps: the busiest rank's time a step and the ranks' mean, the
    step time (rank 0's), how many ranks were the busiest at least once, and the rank that most often
    was with its share of the excess."""

    ranks: int
    steps: int
    busiest_ms: float
    mean_ms: float
    step_ms: float
    turns: int
    top_rank: int
    top_share: float

    @property
    def excess_ms(self) -> float:
        return self.busiest_ms - self.mean_ms

    @property
    def share(self) -> float:
        return self.excess_ms / self.step_ms if self.step_ms > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"ranks": self.ranks, "steps": self.steps, "busiest_ms": round(self.busiest_ms, 3),
                "mean_ms": round(self.mean_ms, 3), "step_ms": round(self.step_ms, 3), "turns": self.turns,
                "top_rank": self.top_rank, "top_share": round(self.top_share, 4)}

    @classmethod
    def from_json(cls, doc: Any) -> Imbalance | None:
        """Back from ``to_json`` (report.json's job.imbalance); None for anything else."""
        try:
            return cls(ranks=read_count(doc["ranks"]), steps=read_count(doc["steps"]),
                       busiest_ms=read_ms(doc["busiest_ms"]), mean_ms=read_ms(doc["mean_ms"]),
                       step_ms=read_ms(doc["step_ms"]), turns=read_count(doc["turns"]),
                       top_rank=read_count(doc["top_rank"]), top_share=read_ms(doc["top_share"]))
        except (KeyError, TypeError, ValueError):
            return None


# --- on the way to rank 0 (jobend.py): each rank's last steps, a node's reduction, the job's ----------

# a rank's last steps sent at job end; a node's reduction of them is 2.3 kB, 29 MB into rank 0 at 100,000
# ranks of 8 a node, read and merged in ~0.5 s (docs/benchmarks.md §12)
KEEP_STEPS = 64


def to_send(steps: list[tuple[int, float, float]]) -> dict[str, Any] | None:
    """A rank's (step, busy ms, step ms) of its last steps as it sends them: its last KEEP_STEPS,
    consecutive from ``first``, a step missing from ``steps`` (one it left out) as NaN."""
    if not steps:
        return None
    last = steps[-KEEP_STEPS:]
    first = last[0][0]
    busy = [float("nan")] * (last[-1][0] - first + 1)
    ms = list(busy)
    for step, b, m in last:
        busy[step - first], ms[step - first] = round(b, 3), round(m, 3)
    return {"first": first, "busy": busy, "ms": ms}


@dataclass(frozen=True)
class BusySteps:
    """Per step from ``first``, over the ranks that reported it: their busy ms summed, how many, the
    most and whose, and their step ms summed."""

    first: int
    total: np.ndarray
    count: np.ndarray
    busiest: np.ndarray
    busiest_rank: np.ndarray
    step_total: np.ndarray

    def to_wire(self) -> dict[str, Any]:
        """Little-endian arrays as msgpack bytes (float32 ms): 1.2 kB a node for 64 steps, not the 2.3 kB
        of lists of doubles, and read back without a Python float per value."""
        return {"first": self.first, "n": len(self.total), **{k: np.asarray(getattr(self, a), dtype=t).tobytes()
                                                               for k, a, t in _WIRE}}

    @classmethod
    def from_wire(cls, doc: Any) -> BusySteps | None:
        """Back from ``to_wire``; None for anything else (a foreign or truncated payload)."""
        try:
            first, n = read_count(doc["first"]), read_count(doc["n"])
            if n > 4 * KEEP_STEPS:
                return None
            cols = {a: np.frombuffer(doc[k], dtype=t, count=n).astype(np.float64 if t == "<f4" else np.int64)
                    for k, a, t in _WIRE if isinstance(doc[k], bytes) and len(doc[k]) == n * np.dtype(t).itemsize}
        except (KeyError, TypeError, ValueError):
            return None
        if len(cols) != len(_WIRE):
            return None
        return cls(first, **cols)


# the wire's (key, field, dtype)
_WIRE = (("total", "total", "<f4"), ("count", "count", "<u4"), ("busiest", "busiest", "<f4"),
         ("rank", "busiest_rank", "<i4"), ("ms", "step_total", "<f4"))


def _combine(parts: list[BusySteps]) -> BusySteps | None:
    """Parts for the same steps (aligned by step number) as one: sums summed, the busiest of the
    busiest (the first part's on a tie)."""
    if not parts:
        return None
    first = min(p.first for p in parts)
    n = max(p.first + len(p.total) for p in parts) - first
    total, step = np.zeros((len(parts), n)), np.zeros((len(parts), n))
    count, rank = np.zeros((len(parts), n), dtype=np.int64), np.full((len(parts), n), -1, dtype=np.int64)
    busiest = np.full((len(parts), n), -np.inf)
    for i, p in enumerate(parts):
        at = slice(p.first - first, p.first - first + len(p.total))
        total[i, at], count[i, at], step[i, at] = p.total, p.count, p.step_total
        busiest[i, at], rank[i, at] = p.busiest, p.busiest_rank
    busiest = np.nan_to_num(busiest, nan=-np.inf)
    top = np.argmax(busiest, axis=0)
    cols = np.arange(n)
    most = busiest[top, cols]
    return BusySteps(first, np.nan_to_num(total).sum(axis=0), count.sum(axis=0), np.where(np.isfinite(most), most, np.nan),
                     np.where(np.isfinite(most), rank[top, cols], -1), np.nan_to_num(step).sum(axis=0))


def reduce_ranks(records: dict[int, Any]) -> BusySteps | None:
    """A node leader's reduction of its ranks' ``to_send`` records (malformed ones left out)."""
    parts = []
    for r, doc in records.items():
        try:
            first = read_count(doc["first"])
            busy = np.asarray(doc["busy"], dtype=np.float64)
            ms = np.asarray(doc["ms"], dtype=np.float64)
        except (KeyError, TypeError, ValueError):
            continue
        if busy.ndim != 1 or busy.shape != ms.shape or len(busy) > 4 * KEEP_STEPS:
            continue
        ok = np.isfinite(busy) & np.isfinite(ms) & (busy >= 0) & (ms >= 0)
        parts.append(BusySteps(first, np.where(ok, busy, 0.0), ok.astype(np.int64), np.where(ok, busy, np.nan),
                               np.full(len(busy), int(r), dtype=np.int64), np.where(ok, ms, 0.0)))
    return _combine(parts)


def merge(parts: list[BusySteps]) -> BusySteps | None:
    """Rank 0: the node leaders' reductions as the job's."""
    return _combine(parts)


def from_steps(b: BusySteps | None, world: int, rank_means: list[float] | None = None) -> Imbalance | None:
    """``imbalance`` of the job's reduction (None: nothing reduced)."""
    if b is None:
        return None
    step = np.where(b.count > 0, b.step_total / np.maximum(b.count, 1), np.nan)
    return imbalance(b.total, b.count, b.busiest, b.busiest_rank, step, world, rank_means)


def imbalance(total: np.ndarray, count: np.ndarray, busiest: np.ndarray, busiest_rank: np.ndarray,
              step_ms: np.ndarray, world: int, rank_means: list[float] | None = None) -> Imbalance | None:
    """From per-step reductions over the ranks (``total``: the sum of their busy ms, ``count``: how
    many reported the step, ``busiest`` and ``busiest_rank``: the most and whose) and the ranks' mean
    step times, the ranks taking turns, or None: too few steps every rank reported, waiting for the
    busiest cost under MIN_SHARE of the step (or MIN_MS), or one rank held TURN_SHARE of that cost.

    ``rank_means``: every rank's busy ms a step over the job (its own totals). What ranks that do more
    at every step add to the wait (a pipeline's heavier stage: 15.0 vs 12.0 ms over a 37 ms step in
    the fault bench's healthy-pp, the two heavier ranks taking turns at being the busiest of the two)
    is theirs, not the turns': it is taken off before the bar."""
    if world < MIN_RANKS:
        return None
    keep = (count == world) & np.isfinite(step_ms) & np.isfinite(total) & np.isfinite(busiest)
    n = int(keep.sum())
    if n < MIN_STEPS:
        return None
    mean = total[keep] / world
    excess = np.maximum(busiest[keep] - mean, 0.0)
    step = float(np.mean(step_ms[keep]))
    cost = float(excess.mean())
    steady = max(rank_means) - float(np.mean(rank_means)) if rank_means and len(rank_means) > 1 else 0.0
    if cost - steady < max(MIN_MS, MIN_SHARE * step):
        return None
    who = busiest_rank[keep].astype(np.int64)
    by_rank = np.bincount(who, weights=excess, minlength=world)
    top = int(np.argmax(by_rank))
    top_share = float(by_rank[top] / excess.sum()) if excess.sum() > 0 else 1.0
    if top_share >= TURN_SHARE:
        return None
    return Imbalance(ranks=world, steps=n, busiest_ms=float(busiest[keep].mean()), mean_ms=float(mean.mean()),
                     step_ms=step, turns=int(np.count_nonzero(by_rank)), top_rank=top, top_share=top_share)


def format_imbalance(t: Imbalance) -> str:
    """The job summary's line (indented like its others)."""
    return (f"  ranks took turns being the slowest: each step waited for whichever rank had the most work, "
            f"{t.excess_ms:.1f} ms above the ranks' mean ({t.busiest_ms:.1f} vs {t.mean_ms:.1f} ms on a CPU or "
            f"waiting for a batch), {100 * t.share:.0f}% of the {t.step_ms:.1f} ms step, over the job's last "
            f"{t.steps} steps; {t.turns} of {t.ranks} ranks were the busiest at some step, none most of the "
            f"time (rank {t.top_rank}: {100 * t.top_share:.0f}% of the wait): the work a step varies with each "
            "rank's data. Balance it: batches of equal cost per rank (bucket or pack samples by length or "
            "tokens), equal shards, or more work a step to even it out")
