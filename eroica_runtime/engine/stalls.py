"""Stopped processes: a rank that was stopped and continued while its peers ran on.

A process stopped for 250 ms once a second (SIGSTOP from a freezing or checkpointing agent, a
debugger attaching, job control, a preempting scheduler) leaves the median step alone and a 3-step
window rarely holds a stopped step, yet every other rank waits out every stop in its next
collective: the job loses that time. The step clock marks each step in which the process received
SIGCONT, for the window and the steps before it, so the stopped rank is named from those marks,
with how often and how long, whether or not the window caught a stop.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import numpy as np

from eroica_runtime.engine.baseline import Thresholds
from eroica_runtime.engine.model import Finding, ranks_waiting
from eroica_runtime.engine.table import Table

MIN_STOPS = 2          # one stop is an accident (a person's Ctrl-Z); two are a pattern
MIN_SHARE = 0.05       # ... costing at least this share of the median step, per step
STOPPED_FUNCTION = "(stopped)"   # a finding's function when the stops, not an op, are what to change


def stalls(table: Table, th: Thresholds) -> dict[int, dict[str, Any]]:
    """row -> evidence for every rank stopped repeatedly while most ranks were not.

    When (nearly) every rank was stopped alike (a whole job suspended and resumed), nobody waited
    on anybody: no rank is named.
    """
    stops, stop_ms, seen = table.sch("stops"), table.sch("stop_ms"), table.sch("steps_seen")
    known = np.isfinite(stops) & np.isfinite(seen) & (seen > 0)
    if not known.any():
        return {}
    stopped = known & (stops >= MIN_STOPS)
    if stopped.sum() * 2 > known.sum():
        return {}
    step_med = float(np.median(table.col("step")))
    out: dict[int, dict[str, Any]] = {}
    for row in np.flatnonzero(stopped).tolist():
        per_step = float(stop_ms[row] / seen[row]) if np.isfinite(stop_ms[row]) else 0.0
        if per_step < max(th.abs_ms, MIN_SHARE * step_med):
            continue
        out[row] = {"stops": int(stops[row]), "steps_seen": int(seen[row]),
                    "stop_ms_each": float(stop_ms[row] / stops[row]), "lost_ms_per_step": per_step}
    return out


def action(ev: dict[str, Any]) -> str:
    return (f"The process was stopped and continued (SIGSTOP/SIGCONT) in {ev['stops']} of its last "
            f"{ev['steps_seen']} steps, ~{ev['stop_ms_each']:.0f} ms each, and every other rank waited each "
            "time: find what stops it — a checkpointing or freezing agent, a debugger or profiler attaching, "
            "job control (Ctrl-Z), a scheduler suspending the task.")


def waited_on(table: Table, row: int, culprits: Collection[int] = ()) -> tuple[int, ...]:
    """The ranks that waited out a stopped rank's stops: every other rank but the rows of ``culprits``
    (rows named for a fault of their own), as each stop is waited out by every rank in its next
    collective. Not the window's waits: where a window's edge cuts one stop's wait is chance. A ring
    all-reduce let rank 0 finish the step a stop fell in and wait in the window's first collective
    while rank 2 still waited in the step before it (rank 2's window steps 37 ms, rank 0's 53): the
    window's rule named rank 0 alone a victim, in 1 of 15 runs of the suite's freeze test (and once in CI)."""
    others = set(culprits) | {row}
    return tuple(int(table.rank[r]) for r in range(table.n) if r not in others)


def stall_finding(table: Table, row: int, ev: dict[str, Any], step_med: float,
                  culprits: Collection[int] = ()) -> Finding:
    """A finding for a stopped rank that the window's comparison did not name."""
    rank = int(table.rank[row])
    host = table.hosts[int(table.host_idx[row])]
    victims = waited_on(table, row, culprits)
    impact = float(ev["lost_ms_per_step"])
    return Finding(category="host", rank=rank, host=host, function=STOPPED_FUNCTION, phase="host_gap",
                   impact_ms_per_step=impact, what_if_step_ms=max(step_med - impact, 0.0),
                   victims=victims, evidence={"stopped": ev, "excess_ms": impact}, action=action(ev),
                   title=f"rank {rank} on {host}: host — process stopped {ev['stops']} times in "
                         f"{ev['steps_seen']} steps (~{ev['stop_ms_each']:.0f} ms each, "
                         f"+{impact:.1f} ms/step, {ranks_waiting(len(victims))})")
