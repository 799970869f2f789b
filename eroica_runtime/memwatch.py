"""This rank's anonymous memory over the job, sampled every few seconds at the step boundary.

Why: a loop that keeps what it should drop grows until the kernel's OOM killer ends the rank, hours
in (engine/memgrowth.py judges the series). One read of ``/proc/self/status`` (~15 µs) every
SAMPLE_EVERY_S, not every step; the series keeps at most memgrowth.MAX_SAMPLES samples, thinned to
every other one (and the interval doubled) when full, so a job of days costs the same.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

from eroica_runtime.engine import memgrowth

SAMPLE_EVERY_S = 2.0
STATUS = "/proc/self/status"


class MemoryWatch:
    """Samples (step, anonymous RSS MB) after ``after_step``; ``sample`` returns the warning to print, once."""

    def __init__(self, after_step: int, room_mb: Callable[[], float | None], every_s: float = SAMPLE_EVERY_S) -> None:
        self.samples: list[tuple[int, float]] = []
        self.warned = False
        self._after = after_step
        self._room = room_mb
        self._every = every_s
        self._next = 0.0
        self._fd: int | None = None
        with contextlib.suppress(OSError):
            self._fd = os.open(STATUS, os.O_RDONLY)

    def _anon_mb(self) -> float | None:
        if self._fd is None:
            return None
        text = os.pread(self._fd, 8192, 0)
        i = text.find(b"RssAnon:")
        if i < 0:
            return None
        return int(text[i + 8:text.index(b"kB", i)]) / 1024

    def sample(self, step: int, now: float, step_ms: Callable[[], float | None]) -> str | None:
        """At a step boundary (``now``: time.monotonic()): take a sample when one is due, and return the
        warning when the series says the rank leaks toward running out (once a job; ``step_ms``: the
        job's typical step, asked for only then)."""
        if step <= self._after or now < self._next:
            return None
        self._next = now + self._every
        mb = self._anon_mb()
        if mb is None:
            return None
        self.samples.append((step, mb))
        if len(self.samples) > memgrowth.MAX_SAMPLES:
            self.samples = self.samples[::2]
            self._every *= 2
        if self.warned:
            return None
        g = memgrowth.growth(self.samples)
        if not memgrowth.leaking(g):
            return None
        said = memgrowth.warning(g, self._room(), step_ms())
        self.warned = said is not None
        return said

    def growth(self) -> memgrowth.Growth | None:
        return memgrowth.growth(self.samples)

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
