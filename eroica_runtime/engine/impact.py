"""What each finding costs per step, and the step time if it were fixed.

In synchronous training the job runs at the pace of its slowest rank, so a culprit's own-work
excess is what every rank pays per step, up to how long its victims waited for it
(``Culprit.cost_ms``: on shared cores the peers of a stalled rank run faster than when healthy,
and the excess over their own work overstates the cost). With several culprits in one job, fixing
one only helps down to the next-worst one's level (``Culprit.level_ms``: how far above the peers'
own work it holds the step): ``Gates.fixed`` accounts for that, ``impact`` is the finding's own cost;
the engine also keeps ``what_if`` at or above the peers' own work plus the collective's own time.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class Gates:
    """The culprits that hold a window's step: ``levels`` (rank -> how far above its peers' own work it
    holds the step, ``Culprit.level_ms``) and ``floors`` (rank -> the step it leaves fixed is no shorter
    than its peers' own work plus the collective's own time)."""

    step_ms: float
    levels: Mapping[int, float]
    floors: Mapping[int, float]

    def fixed(self, ranks: Collection[int]) -> tuple[float, dict[str, int]]:
        """Step time if the culprits ``ranks`` were fixed (the others still gate the step: it falls to the
        next-worst one's level), and which other culprit holds the step then (``then_held_by``) or holds
        it as long or longer now (``held_by``): the order to fix them in."""
        mine = max((self.levels[r] for r in ranks if r in self.levels), default=0.0)
        # the collective's own time is what the last of them to arrive, the one that holds the step
        # highest, waited; the others' waits hold their wait for it too (ranks 1 and 3 of 4 slow alike,
        # the fault bench's two-alike: rank 3 waited 62 ms, 33 of them for rank 1, whose wait was 28 ms,
        # and the host's "step -> 106.8 ms if fixed" was twice the job's healthy 50.5 ms step)
        last = max((r for r in ranks if r in self.floors), key=lambda r: self.levels.get(r, 0.0), default=None)
        floor = self.floors[last] if last is not None else 0.0
        nxt = next((r for r in self._by_level if r not in ranks), None)   # the worst other culprit
        if nxt is None:
            return max(self.step_ms - mine, floor, 0.0), {}
        if self.levels[nxt] >= mine:
            return max(self.step_ms, floor), {"held_by": nxt}
        what_if = max(self.step_ms - (mine - self.levels[nxt]), floor, 0.0)
        return what_if, ({"then_held_by": nxt} if what_if > floor else {})

    @property
    def worst(self) -> int | None:
        """The culprit that holds the step highest (None without one that holds it at all)."""
        return self._by_level[0] if self._by_level else None

    @cached_property
    def _by_level(self) -> list[int]:
        """The culprits that hold the step at all, worst first (one sort for every ``fixed``: a job-wide
        fault can name thousands of ranks)."""
        return sorted((r for r, v in self.levels.items() if v > 0), key=lambda r: -self.levels[r])


def all_fixed(step_ms: float, impacts: list[float]) -> float:
    """Step time if every finding were fixed (the gating costs do not add up; the largest does)."""
    return max(step_ms - max(impacts, default=0.0), 0.0)
