"""The job's measured time lost from the slowdown's onset (else its first finding) on (engine/timelost.py) and its report line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from eroica_runtime import report
from eroica_runtime.config import Config
from eroica_runtime.engine.timelost import (
    eroica_steps,
    lookback,
    onset,
    onset_reach,
    profiled_steps,
    since_step,
    time_lost,
)

WARMUP, LOOKBACK = Config().warmup_steps, lookback(Config().spike_steps, Config().vote_lag)   # 10, 9
REACH = onset_reach(Config().spike_steps, Config().vote_lag, Config().drift_window, Config().lost_window)   # 55


def _job(n: int = 140, onset: int = 60, extra_ms: float = 40.0, every: int = 1, seed: int = 0) -> list[float]:
    """A 50 ms job (noisy) whose steps from ``onset`` on take ``extra_ms`` more, every ``every``-th step."""
    rng = np.random.default_rng(seed)
    ms = 50.0 + rng.normal(0.0, 4.0, n)
    for s in range(onset, n + 1):
        if (s - onset) % every == 0:
            ms[s - 1] += extra_ms
    return ms.tolist()


def test_steady_slowdown_is_measured_from_the_first_finding_on() -> None:
    lost = time_lost(_job(), [(13, 3), (67, 3)], 67, warmup=WARMUP, lookback=LOOKBACK)
    assert lost is not None
    assert 36 < lost.per_step_ms < 44
    # the reference ends before the steps the detectors were still looking at, and skips the baseline window
    assert (lost.before_first, lost.before_last) == (11, 57)
    assert lost.before_steps == 57 - 11 + 1 - 5   # the baseline's lead-in 12, window 13-15 and 16 left out
    assert lost.steps == 140 - 67 + 1 - 4      # its window 67-69 and step 70 left out (lead-in 66 is before)
    assert abs(lost.total_s - lost.per_step_ms * lost.steps / 1e3) < 1e-9


def test_a_fault_in_bursts_is_counted_by_its_slow_steps_not_hidden_by_the_median() -> None:
    """One step in four is 120 ms slower: the median step does not move, the job loses ~30 ms a step."""
    history = _job(extra_ms=120.0, every=4)
    lost = time_lost(history, [(13, 3), (70, 16)], 70, warmup=WARMUP, lookback=LOOKBACK)
    assert lost is not None
    after = [history[s - 1] for s in range(70, 141) if s not in profiled_steps([(70, 16)])]
    assert np.median(after) < 60            # the median sees almost nothing ...
    assert 20 < lost.per_step_ms < 40       # ... the mean sees the bursts


def test_profiled_steps_count_on_neither_side() -> None:
    """The profiler's own cost is eroica's, not the fault's: 500 ms windows change nothing."""
    history = _job()
    windows = [(13, 3), (67, 3), (100, 16)]
    slowed = list(history)
    for s in profiled_steps(windows):
        slowed[s - 1] = 500.0
    a = time_lost(slowed, windows, 67, warmup=WARMUP, lookback=LOOKBACK)
    b = time_lost(history, windows, 67, warmup=WARMUP, lookback=LOOKBACK)
    assert a is not None and b is not None
    assert (a.per_step_ms, a.steps, a.before_steps) == (b.per_step_ms, b.steps, b.before_steps)
    assert a.eroica_ms == 500.0 and a.eroica_steps == 4 + 18   # (67, 3): 66-70 from 67 on; (100, 16): 99-116


def test_steps_in_which_summaries_were_built_count_on_neither_side_and_are_said() -> None:
    """After a window every rank builds its summary a slice per boundary until the gather: those steps
    are slower because of eroica (a 16-step window's build took a shared-core job from 40 to 75 ms a
    step to its end), not the fault. They are left out like profiled steps, and their mean is kept, so
    that the report says what eroica itself cost."""
    history = _job()
    windows, deferred = [(13, 3), (67, 3)], [(17, 24), (71, 95)]
    slowed = list(history)
    for s in range(17, 25):
        slowed[s - 1] += 30.0
    for s in range(71, 96):
        slowed[s - 1] += 35.0
    clean = time_lost(history, windows, 67, warmup=WARMUP, lookback=LOOKBACK, deferred=deferred)
    lost = time_lost(slowed, windows, 67, warmup=WARMUP, lookback=LOOKBACK, deferred=deferred)
    assert lost is not None and clean is not None
    assert (lost.per_step_ms, lost.steps, lost.before_steps) == (clean.per_step_ms, clean.steps, clean.before_steps)
    assert 36 < lost.per_step_ms < 44
    assert lost.steps == 140 - 67 + 1 - 4 - 25    # window 67-69, step 70 and the build 71-95 left out
    own = [s for s in range(67, 141) if s in eroica_steps(windows, deferred)]
    assert lost.eroica_steps == len(own) == 29
    assert lost.eroica_ms == pytest.approx(sum(slowed[s - 1] for s in own) / len(own), rel=1e-12)
    # counted in, eroica's build would have been booked as the fault's loss
    naive = time_lost(slowed, windows, 67, warmup=WARMUP, lookback=LOOKBACK)
    assert naive is not None and naive.per_step_ms > lost.per_step_ms + 5


def test_a_build_that_runs_to_the_job_end_leaves_no_figure() -> None:
    """A capture whose summary was still being built at the job's end: no step after it was eroica's-free."""
    assert time_lost(_job(), [(13, 3), (100, 16)], 100, warmup=WARMUP, lookback=LOOKBACK,
                     deferred=[(117, 141)]) is None


def test_no_figure_without_healthy_steps_before_the_finding() -> None:
    """A fault from the start (its first finding at the baseline's step, or right after warm-up) has no
    healthy reference: no number rather than a wrong one."""
    assert time_lost(_job(onset=1), [(13, 3)], 13, warmup=WARMUP, lookback=LOOKBACK) is None
    assert time_lost(_job(), [(13, 3), (135, 3)], 137, warmup=WARMUP, lookback=LOOKBACK) is None  # 3 steps after


def test_healthy_noise_after_a_finding_measures_about_nothing() -> None:
    lost = time_lost(_job(extra_ms=0.0, seed=3), [(13, 3), (67, 3)], 67, warmup=WARMUP, lookback=LOOKBACK)
    assert lost is not None and abs(lost.per_step_ms) < 3.0


def test_report_line_says_the_loss_and_what_it_was_measured_on() -> None:
    lost = time_lost(_job(), [(13, 3), (67, 3)], 67, warmup=WARMUP, lookback=LOOKBACK)
    assert lost is not None
    doc = json.loads(json.dumps(lost.to_json()))   # as report.json keeps it
    line = report.format_time_lost(doc)
    assert line.startswith(f"  time lost from step 67 (first finding) to 140: {lost.total_s:.1f} s, "
                           f"+{lost.per_step_ms:.1f} ms a step over {lost.steps} steps")
    assert "steps 11-57" in line
    assert line.endswith(f"left out: the {lost.eroica_steps} steps eroica profiled or summarised in, "
                         f"mean {lost.eroica_ms:.1f} ms)")
    faster = dict(doc, mean_ms=40.0, per_step_ms=-10.0, total_s=0.0)
    assert "none measured" in report.format_time_lost(faster)
    # a report.json from before eroica's steps were counted: the figure, and what it left out then
    older = {k: v for k, v in doc.items() if k not in ("eroica_steps", "eroica_ms")}
    assert report.format_time_lost(older).endswith("rank 0's step times, profiled steps left out)")
    assert report.format_time_lost(dict(doc, eroica_ms=float("nan"))).endswith("profiled steps left out)")


def test_report_line_of_a_spoiled_value_is_empty() -> None:
    """report.json is read back by `eroica analyze`: a value that is not a TimeLost prints nothing."""
    lost = time_lost(_job(), [(13, 3), (67, 3)], 67, warmup=WARMUP, lookback=LOOKBACK)
    assert lost is not None
    good = lost.to_json()
    for bad in (None, 3, "x", {}, dict(good, before_steps=[1]), dict(good, mean_ms="fast"), dict(good, steps=None)):
        assert report.format_time_lost(bad) == ""


def test_job_report_ends_with_the_measured_loss_only_when_something_was_found() -> None:
    """`eroica show` and the job-end block print it after the findings' estimates; a healthy job's
    report has no finding to measure from."""
    lost = time_lost(_job(), [(13, 3), (67, 3)], 67, warmup=WARMUP, lookback=LOOKBACK)
    assert lost is not None
    finding = {"title": "rank 2: compute", "category": "compute", "rank": 2, "host": "h", "function": "aten::mm",
               "phase": "forward", "impact_ms_per_step": 40.0, "what_if_step_ms": 50.0, "victims": [0, 1, 3],
               "evidence": {}, "action": "look", "captures": [67]}
    doc = {"schema": report.REPORT_SCHEMA, "world_size": 4, "steps": 140, "job": {"time_lost": lost.to_json()},
           "captures": [{"step": 67, "trigger": "spike", "ranks_analysed": 4, "findings": [finding]}],
           "findings": [finding]}
    text = report.format_job(doc).splitlines()
    assert text[-1] == report.format_time_lost(lost.to_json())
    healthy = dict(doc, findings=[], captures=[dict(doc["captures"][0], findings=[])])
    assert "time lost" not in report.format_job(healthy)


def test_the_loss_is_counted_from_the_first_capture_that_named_something() -> None:
    """Not from the baseline (a fault there has no healthy reference), a hang, or a capture that named
    nobody."""
    assert since_step([(13, "baseline", True), (40, "spike", False), (67, "drift", True), (90, "manual", True)]) == 67
    assert since_step([(13, "baseline", True), (200, "hang", True)]) is None
    assert since_step([]) is None


def test_a_late_capture_counts_the_loss_from_the_slowdowns_onset() -> None:
    """The throughput and drift rules see a slowdown up to their window late (the bench's freeze case:
    21 steps). Counted from the capture, the 21 slow steps would be lost from the total, and the 12 of
    them before the spike's lookback would sit in the healthy reference, a fifth of the loss a step
    gone. Counted from the onset found in rank 0's step times, neither."""
    history = _job(onset=50)
    windows = [(13, 3), (71, 3)]
    late = time_lost(history, windows, 71, warmup=WARMUP, lookback=LOOKBACK, reach=REACH)
    floor = time_lost(history, windows, 71, warmup=WARMUP, lookback=LOOKBACK)
    assert late is not None and floor is not None
    assert late.onset_step is not None and abs(late.onset_step - 50) <= 1, late.onset_step
    assert late.since_step == 71
    assert 36 < late.per_step_ms < 44 and floor.per_step_ms < 33, (late.per_step_ms, floor.per_step_ms)
    assert late.before_last < late.onset_step and late.steps > floor.steps + 15
    assert late.total_s > 1.2 * floor.total_s


def test_the_onset_of_a_fault_in_bursts_is_its_first_slow_steps() -> None:
    history = _job(onset=60, extra_ms=120.0, every=4)
    lost = time_lost(history, [(13, 3), (70, 16)], 70, warmup=WARMUP, lookback=LOOKBACK, reach=REACH)
    assert lost is not None and lost.onset_step is not None and 56 <= lost.onset_step <= 60, lost.onset_step
    assert 20 < lost.per_step_ms < 40


@pytest.mark.parametrize("seed", range(20))
def test_healthy_noise_has_no_onset(seed: int) -> None:
    """A finding on a job whose step times did not move (a straggler the job absorbs, a minor finding):
    no onset is made up from noise, and the figure stays the floor's."""
    history = _job(extra_ms=0.0, seed=seed)
    assert onset(history, 67, warmup=WARMUP, skip=profiled_steps([(13, 3), (67, 3)]), reach=REACH) is None


def test_a_slowdown_older_than_the_detectors_reach_keeps_the_floor() -> None:
    """Slower from step 15 on, named at step 100: a new level long before the capture is the job's
    pace, not a fault's onset the detectors missed; and with too few healthy steps, no figure."""
    history = _job(onset=15)
    assert onset(history, 100, warmup=WARMUP, skip=profiled_steps([(13, 3), (100, 3)]), reach=REACH) is None


def test_report_line_names_the_onset_and_the_first_finding() -> None:
    lost = time_lost(_job(onset=50), [(13, 3), (71, 3)], 71, warmup=WARMUP, lookback=LOOKBACK, reach=REACH)
    assert lost is not None and lost.onset_step is not None
    line = report.format_time_lost(json.loads(json.dumps(lost.to_json())))
    assert line.startswith(f"  time lost from step {lost.onset_step} (the slowdown's onset in rank 0's step "
                           f"times; first finding at 71) to 140: {lost.total_s:.1f} s"), line
    assert f"steps 11-{lost.before_last}" in line
