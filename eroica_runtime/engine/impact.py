"""What each finding costs per step, and the step time if it were fixed.

In synchronous training the job runs at the pace of its slowest rank, so a culprit's own-work
excess is what every rank pays per step, up to how long its victims waited for it
(``Culprit.cost_ms``: on shared cores the peers of a stalled rank run faster than when healthy,
and the excess over their own work overstates the cost). With several culprits in one job, fixing
one only helps down to the next-worst one's level (``Culprit.level_ms``: how far above the peers'
own work it holds the step): ``what_if`` accounts for that, ``impact`` is the finding's own cost;
the engine also keeps ``what_if`` at or above the peers' own work plus the collective's own time.
"""

from __future__ import annotations


def culprit_what_if(step_ms: float, levels: list[float], i: int) -> float:
    """Step time if culprit ``i`` alone were fixed (the others still gate the step); ``levels``: how far
    above their peers' own work each culprit holds the step."""
    worst = max(levels) if levels else 0.0
    others = max((e for j, e in enumerate(levels) if j != i), default=0.0)
    return max(step_ms - (worst - others), 0.0)


def all_fixed(step_ms: float, impacts: list[float]) -> float:
    """Step time if every finding were fixed (the gating costs do not add up; the largest does)."""
    return max(step_ms - max(impacts, default=0.0), 0.0)
