"""Work that runs in slices: a generator that yields between small pieces, resumed under a time budget.

Why: a capture's summary takes hundreds of milliseconds to build (reading ~10^4-10^5 profiler events,
nesting, interval arithmetic). Run in one go on the training thread it makes the step that closes a
window that much longer; run on another thread it competes for the GIL with a CPU-bound training loop
and slows every overlapped step as much (docs/benchmarks.md §6). Written as a generator that yields
every ``CHUNK`` events, the same code can run to completion (``drain``, offline and in tests) or a
few milliseconds at each step boundary (``Resumable.run``), on the thread that owns the data.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import Generic, TypeVar

T = TypeVar("T")

CHUNK = 512   # events handled between two yields: ~0.3-1 ms of work, so a budget is kept to ~1 ms

Steps = Generator[None, None, T]


def drain(gen: Steps[T]) -> T:
    """Run a stepwise computation to completion and return its result."""
    while True:
        try:
            next(gen)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


class Resumable(Generic[T]):
    """A stepwise computation resumed in slices; ``result`` once ``done``."""

    def __init__(self, gen: Steps[T]) -> None:
        self._gen = gen
        self.done = False
        self.result: T | None = None
        self.spent_s = 0.0      # time spent in run() so far (the work's own cost, whatever the slicing)
        self.slices = 0

    def run(self, budget_s: float | None = None) -> bool:
        """Advance until finished or until ``budget_s`` seconds have passed (None: to completion).

        The budget is checked between pieces, so a slice overruns it by at most one piece. Returns
        ``done``. An exception inside the computation propagates (and ends it)."""
        if self.done:
            return True
        t0 = time.perf_counter()
        deadline = None if budget_s is None else t0 + budget_s
        self.slices += 1
        try:
            while True:
                try:
                    next(self._gen)
                except StopIteration as stop:
                    self.result = stop.value
                    self.done = True
                    return True
                if deadline is not None and time.perf_counter() >= deadline:
                    return False
        finally:
            self.spent_s += time.perf_counter() - t0
