"""Job level: a rank busier than its peers over the whole job, whom they waited for at every step.

A capture compares ranks over a few profiled steps, and the detectors open one only when the job
gets slower. Work that one rank does from the first step on, a few steps apart, is neither: a
4-rank job whose rank 0 logged metrics for ~40 ms every 10 steps (2026-12-05, tests/data/
steadywork) ran at 33.9 ms a step against 29.6 without the logging, and eroica said "healthy":
the baseline's 3-step window held no logging step, and nothing changed afterwards for a detector
to see. The step clock knows better: over the job's 289 steps after warm-up rank 0's training
thread was busy (on a CPU, runnable waiting for one, or waiting for its batches) 12.5 ms a step,
its peers 8.1 each, within 0.01 ms of one another; without the logging the four were within
0.4 ms. In synchronous training the others wait for that rank's extra work in the next
collective, so it costs the job about that much a step.

So at job end each rank sends its totals (``stepclock.StepClock.own_work``), and a rank whose busy
time a step exceeds the median of the ranks by MIN_SHARE of the step (and MIN_MS), while the
others are alike (their spread under PEERS_SPREAD of that excess: a pipeline's stages, each busy
differently, are no such case) and every rank's step is alike (they waited for each other), gets a
line in the job summary (rank 0's logging: 12-13% of the step). Not for ranks that drive a GPU: their thread's times do not show the
device's work. Pure: no MPI, no torch.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eroica_runtime.engine.model import read_count, read_ms

# of the job's step: less is no line. The captures' own bar (engine.baseline.Thresholds.rel_step): a
# healthy 4-rank CI job on this machine (120 steps, fresh clone, 2026-12-05) had rank 1 busier by
# 1.9 ms a step, 6% of its 33 ms step, where three quieter runs kept the four within 0.4 ms of 30
MIN_SHARE = 0.10
MIN_MS = 1.0
PEERS_SPREAD = 0.25   # the other ranks' busy times within this share of the excess of one another
ALIKE_STEPS = 1.05    # ranks' mean steps within this factor: synchronous, each waited for the slowest
MIN_STEPS = 20        # steps after warm-up a rank must have run for its mean to say anything


@dataclass(frozen=True)
class SteadyWork:
    """One rank's own work a step over the job against the other ranks' median (ms a step)."""

    rank: int
    host: str | None
    steps: int
    step_ms: float         # the job's mean step (the ranks' median)
    busy_ms: float         # the rank's: on a CPU + waiting for one + waiting for its batches
    peers_busy_ms: float   # the other ranks' median
    cpu_ms: tuple[float, float]    # (the rank's, the peers' median)
    runq_ms: tuple[float, float]
    data_ms: tuple[float, float]
    ranks: int             # ranks compared

    @property
    def excess_ms(self) -> float:
        return self.busy_ms - self.peers_busy_ms

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "host": self.host, "steps": self.steps, "step_ms": round(self.step_ms, 3),
                "busy_ms": round(self.busy_ms, 3), "peers_busy_ms": round(self.peers_busy_ms, 3),
                "cpu_ms": [round(x, 3) for x in self.cpu_ms], "runq_ms": [round(x, 3) for x in self.runq_ms],
                "data_ms": [round(x, 3) for x in self.data_ms], "ranks": self.ranks}

    @classmethod
    def from_json(cls, doc: Any) -> SteadyWork | None:
        """Back from ``to_json`` (report.json's job.steady_work); None for anything else."""
        try:
            host = doc.get("host")
            return cls(rank=read_count(doc["rank"]), host=host if isinstance(host, str) else None,
                       steps=read_count(doc["steps"]), step_ms=read_ms(doc["step_ms"]), busy_ms=read_ms(doc["busy_ms"]),
                       peers_busy_ms=read_ms(doc["peers_busy_ms"]), cpu_ms=_pair(doc["cpu_ms"]),
                       runq_ms=_pair(doc["runq_ms"]), data_ms=_pair(doc["data_ms"]), ranks=read_count(doc["ranks"]))
        except (KeyError, TypeError, ValueError, IndexError, AttributeError):
            return None


def _pair(x: Any) -> tuple[float, float]:
    if not isinstance(x, (list, tuple)) or len(x) != 2:
        raise ValueError(x)
    return read_ms(x[0]), read_ms(x[1])


def _means(own: Any) -> tuple[int, float, float, float, float] | None:
    """(steps, step, cpu, run queue, batch wait ms a step) of one rank's map, None when unusable
    (an older eroica, a GPU rank, too few steps, a corrupt value)."""
    try:
        if own.get("cuda") is not False:
            return None
        n = read_count(own["steps"])
        if n < MIN_STEPS:
            return None
        return n, read_ms(own["ms"]) / n, read_ms(own["cpu"]) / n, read_ms(own["runq"]) / n, read_ms(own["data"]) / n
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def steady_work(per_rank: Mapping[int, Mapping[str, Any]]) -> SteadyWork | None:
    """The rank the others waited for over the whole job, from every rank's job-end statistics (their
    ``own`` maps); None when no rank stands out so, or the ranks cannot be compared (see the module)."""
    got = {r: m for r, stats in per_rank.items()
           if isinstance(stats, Mapping) and (m := _means(stats.get("own"))) is not None}
    if len(got) < 3 or len(got) < len(per_rank):   # every rank, none of them a GPU's: 3 to have a median
        return None
    steps = [m[1] for m in got.values()]
    if max(steps) > ALIKE_STEPS * min(steps):
        return None
    busy = {r: m[2] + m[3] + m[4] for r, m in got.items()}
    top = max(busy, key=lambda r: busy[r])
    others = [busy[r] for r in busy if r != top]
    ref = statistics.median(others)
    step = statistics.median(steps)
    excess = busy[top] - ref
    if excess < max(MIN_MS, MIN_SHARE * step) or max(others) - min(others) > PEERS_SPREAD * excess:
        return None

    def pair(i: int) -> tuple[float, float]:
        return got[top][i], statistics.median(got[r][i] for r in got if r != top)

    host = per_rank[top].get("host")
    return SteadyWork(rank=top, host=host if isinstance(host, str) else None, steps=got[top][0], step_ms=step,
                      busy_ms=busy[top], peers_busy_ms=ref, cpu_ms=pair(2), runq_ms=pair(3), data_ms=pair(4),
                      ranks=len(got))


def format_steady_work(w: SteadyWork) -> str:
    """The job summary's line (indented like its others): who, how much, doing what, and what to do."""
    host = f" ({w.host})" if w.host else ""
    parts = (("on a CPU", w.cpu_ms), ("waiting for a CPU", w.runq_ms), ("waiting for its batches", w.data_ms))
    doing = ", ".join(f"{what} {mine:.1f} vs {theirs:.1f}" for what, (mine, theirs) in parts
                      if mine >= 0.05 or theirs >= 0.05)
    most = max(parts, key=lambda p: p[1][0] - p[1][1])[0]
    if most == "on a CPU":
        hint = ("work only it does (metrics or logging, a checkpoint it saves alone, an evaluation on one rank): "
                "make it asynchronous, share it among the ranks or do it less often; or a slower CPU")
    elif most == "waiting for a CPU":
        hint = "its CPUs are shared with other work (other processes, threads, a neighbour): give it its own cores"
    else:
        hint = "its input pipeline is slower than its peers' (more DataLoader workers, its storage)"
    return (f"  rank {w.rank}{host} was busy {w.excess_ms:.1f} ms a step longer than its peers over the job's "
            f"{w.steps} steps ({w.busy_ms:.1f} vs {w.peers_busy_ms:.1f} ms: {doing}), "
            f"{100 * w.excess_ms / w.step_ms:.0f}% of its {w.step_ms:.1f} ms step, and they waited for it: {hint}")
