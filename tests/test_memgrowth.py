"""A rank whose memory keeps growing is said to leak (engine/memgrowth.py, memwatch.py): by the rank itself
while there is time, when at its rate the memory it may still take runs out before the job has run as
long again, and in the job summary; memory that grew early and stopped (a cache or a pool filling) is
no leak."""

from __future__ import annotations

import numpy as np

from eroica_runtime.config import Config
from eroica_runtime.engine import memgrowth
from eroica_runtime.memwatch import MemoryWatch


def _series(mb_at) -> list[tuple[int, float]]:
    return [(s, float(mb_at(s))) for s in range(10, 1010, 20)]


def test_steady_growth_is_a_leak_and_growth_that_stopped_is_not() -> None:
    steady = memgrowth.growth(_series(lambda s: 2000 + 2.0 * s))
    assert steady is not None and memgrowth.leaking(steady)
    assert steady.recent_mb_per_step == 2.0
    # 1.5 GB in the first 200 steps (a pinned-memory pool, a cache filling), then flat
    filled = memgrowth.growth(_series(lambda s: 2000 + 7.5 * min(s, 200)))
    assert filled is not None and filled.grown_mb >= 1000 and not memgrowth.leaking(filled)
    # steady, but small against what the rank holds: no leak worth a line
    small = memgrowth.growth(_series(lambda s: 8000 + 0.2 * s))
    assert small is not None and not memgrowth.leaking(small)
    assert memgrowth.growth(_series(lambda s: 1)[:3]) is None


def test_the_rank_is_warned_when_its_room_runs_out_before_the_job_has_run_as_long_again() -> None:
    g = memgrowth.growth(_series(lambda s: 2000 + 2.0 * s))
    assert g is not None
    said = memgrowth.warning(g, room_mb=1500.0, step_ms=120.0)   # 750 steps left, 980 run
    assert said is not None and said.startswith("memory: this rank's anonymous memory grew 1.9 GB in steps 10-990")
    assert "runs out in ~750 steps (~2 min at 120 ms a step)" in said and "OOM killer" in said
    assert memgrowth.warning(g, room_mb=50_000.0, step_ms=120.0) is None   # 25,000 steps away
    assert memgrowth.warning(g, room_mb=None, step_ms=120.0) is None
    # a cgroup already over its limit (usage above it for a moment) has no room left, not a negative one
    over = memgrowth.warning(g, room_mb=-512.0, step_ms=120.0)
    assert over is not None and "the 0 MB it may still take runs out in ~0 steps" in over, over


def test_the_job_summary_names_the_rank_that_kept_growing_and_what_the_others_did() -> None:
    per_rank = {0: memgrowth.growth(_series(lambda s: 900 + 0.01 * s)),
                1: memgrowth.growth(_series(lambda s: 950)),
                2: memgrowth.growth(_series(lambda s: 900 + 4.0 * s)),
                3: None}
    doc = memgrowth.summarize(per_rank)
    assert doc is not None and doc["count"] == 1 and doc["ranks"][0][0] == 2
    line = memgrowth.format_summary(doc)
    assert line is not None and line.startswith("  memory kept growing: rank 2's anonymous memory grew 3.8 GB")
    assert "the other ranks 0 MB to 10 MB" in line and "leak?" in line
    assert memgrowth.summarize({0: per_rank[0], 1: per_rank[1]}) is None
    assert memgrowth.format_summary({"ranks": "junk"}) is None       # a report edited by hand


def test_a_rank_that_really_grows_warns_once_and_not_before() -> None:
    """The sampler on this very process: 64 MB more held at each step, 400 MB of room (the collaborator
    that says how much the rank may still take)."""
    watch = MemoryWatch(after_step=0, room_mb=lambda: 400.0, every_s=0.0)
    held, said = [], []
    try:
        for step in range(1, 13):
            held.append(np.ones(64 << 17))     # 64 MB of float64, touched
            got = watch.sample(step, float(step), lambda: 100.0)
            if got:
                said.append((step, got))
    finally:
        watch.close()
    assert len(said) == 1, said
    step, text = said[0]
    assert step >= 4 and "grew" in text and "runs out in ~" in text, said
    g = watch.growth()
    assert g is not None and g.grown_mb >= 0.8 * 64 * (g.last_step - g.first_step)


def _before(samples: list[tuple[float, float]], killed_mb: float | None, died_at: float,
            startup_s: float = Config().memory_startup_s) -> str:
    """memgrowth.before_kill as the wrapper of a rank sampled every 2 s calls it (a jump: within 6 s)."""
    return memgrowth.before_kill(samples, killed_mb, died_at, startup_s=startup_s, jump_s=6.0)


def _trail(mb_at, start: float = 1e9, span_s: int = 3600, every_s: int = 60) -> list[tuple[float, float]]:
    """A wrapper's samples (wall time, MB) over ``span_s`` from ``start``."""
    return [(start + t, float(mb_at(t))) for t in range(0, span_s + 1, every_s)]


def test_what_a_ranks_memory_did_before_the_oom_killer_says_leak_one_allocation_or_start_up() -> None:
    """The kernel's record of an OOM kill gives one size; the wrapper's samples say what to change."""
    end = 1e9 + 3600
    # an hour of steady growth: a leak, with its rate at the end
    leak = _before(_trail(lambda t: 2000 + t / 2), 3850.0, end + 2)
    assert leak.startswith("its anonymous memory had grown for 58 min, 2.0 GB -> 3.7 GB at its last sample "
                           "(30 MB a minute at the end, 3.8 GB when killed): a leak? (tensors kept"), leak
    # flat for an hour, then the kill far above anything sampled: one allocation, not a leak
    flat = _trail(lambda t: 2000 + (t // 60) % 3)
    spike = _before(flat, 9000.0, end + 1)
    assert spike.startswith("its anonymous memory stayed at or below 2.0 GB over the 57 min sampled, then "
                            "reached 8.8 GB within 61 s: one allocation far larger than the others"), spike
    assert "leak" not in spike
    # no kernel record (its log unreadable): the last sample's jump says it
    jumped = _before([*flat, (end + 60, 7000.0)], None, end + 61)
    assert "then reached 6.8 GB within 60 s: one allocation" in jumped, jumped
    # growing, then a jump on top of it
    both = _before(_trail(lambda t: 2000 + t / 2), 9000.0, end + 1)
    assert "had grown for 57 min, 2.0 GB -> 3.7 GB (a leak as well?), then reached 8.8 GB" in both, both
    # killed 40 s after it started, having grown all along: loading, not a leak
    young = _before(_trail(lambda t: 10 + 700 * t, span_s=40, every_s=2), 28_500.0, 1e9 + 41)
    assert young.startswith("its anonymous memory grew 10 MB -> 27.8 GB in the 41 s since it started: it ran out "
                            "while starting up"), young
    # the same growth judged as a longer job's (EROICA_MEMORY_STARTUP_S=0): a leak
    assert "a leak?" in _before(_trail(lambda t: 10 + 700 * t, span_s=40, every_s=2), 28_500.0,
                                              1e9 + 41, startup_s=0)
    # nothing stood out: the series in one line; too few samples: nothing
    plain = _before(flat, 2100.0, end + 5)
    assert plain == ("its anonymous memory over the 58 min sampled: 2.0 GB at first, 2.0 GB at most, 2.0 GB at its "
                     "last sample, 5 s before it died"), plain
    assert _before(flat[:2], 9000.0, end) == ""
    # its first 2 minutes (imports, the model loading: 10 MB -> 2 GB) are no leak and no "at first"
    loaded = _before(_trail(lambda t: min(10 + 40 * t, 2000), every_s=20), 2100.0, end + 5)
    assert loaded.startswith("its anonymous memory over the 58 min sampled: 2.0 GB at first"), loaded
