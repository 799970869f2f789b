"""The local detector and the agreed capture schedule (pure logic over step times)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from eroica_runtime.config import Config
from eroica_runtime.trigger import DETECTED, FLOOR_WINDOWS, Budget, Detector, Trigger

DATA = Path(__file__).parent / "data" / "trigger"


def _jitter(n: int, base: float = 20.0, spread: float = 0.15, seed: int = 0) -> list[float]:
    rnd = random.Random(seed)
    return [base * (1 + rnd.uniform(-spread, spread)) for _ in range(n)]


def test_single_noisy_step_does_not_fire() -> None:
    det = Detector(Config())
    fired = [det.observe(ms)[0] for ms in _jitter(60) + [200.0] + _jitter(20, seed=1)]
    assert not any(fired)


def test_persistent_rise_fires_spike_within_a_few_steps() -> None:
    det = Detector(Config(drift_pct=0))
    steps = _jitter(60) + [45.0] * 10
    fired_at = next(i for i, ms in enumerate(steps) if det.observe(ms)[0])
    assert 60 <= fired_at <= 63


def test_gradual_drift_fires_drift_but_jitter_does_not() -> None:
    det = Detector(Config(spike_ratio=10))
    healthy = [any(det.observe(ms)) for ms in _jitter(400, spread=0.2)]
    assert not any(healthy)
    det = Detector(Config(spike_ratio=10))
    ramp = [20.0 * (1 + 0.002 * i) for i in range(300)]
    assert any(det.observe(ms)[1] for ms in ramp)


def test_a_held_trigger_judges_no_step_and_takes_no_baseline_before_its_end_but_a_persons_capture() -> None:
    """While the runtime looks for a job's first collective past its warm-up (a local-SGD job meets
    every few steps), no rule judges a step and the baseline waits; a person's request is still taken."""
    t = Trigger(Config(warmup_steps=10))
    t.hold(32)
    assert not t.local_flags(20, 500.0, False).any()                    # a spike in the hold: not judged
    t.manual_pending = True
    assert t.local_flags(21, 5.0, False)[2] == 1                        # SIGUSR1 is voted all the same
    # the baseline's lead-in was step 12: now the step after the hold's end
    assert [(d.start_step, d.trigger) for step in range(40) if (d := t.decide(step, None))] == [(34, "baseline")]
    # steps counted somewhere else from step 15 (an optimizer after backward()s): a new warm-up, still no
    # baseline inside the hold
    t = Trigger(Config(warmup_steps=10))
    t.hold(32)
    t.relearn(15)
    assert [(d.start_step, d.trigger) for step in range(40) if (d := t.decide(step, None))] == [(34, "baseline")]


def test_baseline_and_budget_schedule_is_identical_everywhere() -> None:
    cfg = Config(warmup_steps=5, window_steps=3, cooldown_steps=10, max_captures=3)
    a, b = Trigger(cfg), Trigger(cfg)
    yes = np.array([1, 0, 0])
    decisions = []
    for step in range(100):
        da, db = a.decide(step, yes), b.decide(step, yes)
        assert da == db
        if da:
            decisions.append((da.start_step, da.trigger))
    assert decisions[0] == (7, "baseline")
    assert len(decisions) == 3  # capture budget
    starts = [s for s, _ in decisions]
    assert all(b - a >= 10 for a, b in zip(starts, starts[1:], strict=False))


def test_manual_request_ignores_cooldown_but_not_the_budget() -> None:
    cfg = Config(warmup_steps=0, baseline=False, cooldown_steps=1000, max_captures=2)
    t = Trigger(cfg)
    manual = np.array([0, 0, 1])
    assert t.decide(10, manual).trigger == "manual"
    assert t.decide(20, manual).trigger == "manual"
    assert t.decide(30, manual) is None


def test_profiled_fraction_cap() -> None:
    cfg = Config(warmup_steps=0, baseline=False, cooldown_steps=0, max_captures=100,
                 max_profiled_fraction=0.1, window_steps=3)
    t = Trigger(cfg)
    spike = np.array([1, 0, 0])
    taken = sum(1 for step in range(200) if t.decide(step, spike))
    assert 0 < taken and t.profiled_steps <= 0.1 * 200 + 3


def test_scheduled_capture_right_after_the_baseline_is_not_held_back_by_the_vote_lag() -> None:
    """--capture-at-steps 20 after the baseline window (lead-in 12, steps 13-15): the vote lag only
    keeps the detectors from acting on votes about profiled steps; a scheduled capture waits for the
    window alone. (vote_lag 4 once swallowed this capture in the forked-workers test.)"""
    cfg = Config(warmup_steps=10, capture_at_steps=(20,), vote_lag=4)
    trig = Trigger(cfg)
    started = [(d.start_step + 1, d.trigger) for step in range(40)
               if (d := trig.decide(step, None)) is not None]
    assert started == [(13, "baseline"), (20, "manual")]
    # a vote arriving during the lag after a window is still ignored
    trig = Trigger(Config(warmup_steps=10, vote_lag=4))
    assert trig.decide(11, None) is not None          # baseline lead-in at 12, window 13-15
    spike = np.array([1, 0, 0], dtype=np.int64)
    assert trig.decide(17, spike) is None             # votes cast in the window are due until step 20


def _freeze(n: int, every: int = 28, stall: float = 250.0, seed: int = 2) -> list[float]:
    """Steps of ~35 ms, one of them ``stall`` ms longer every ``every`` steps (SIGSTOP once a second)."""
    return [ms + (stall if i % every == every - 1 else 0.0) for i, ms in enumerate(_jitter(n, 35.0, 0.2, seed))]


def test_rare_long_stalls_fire_the_throughput_rule_but_not_spike_or_drift() -> None:
    det = Detector(Config())
    flags = [det.observe_all(ms) for ms in _jitter(100, 35.0, 0.2) + _freeze(120)]
    assert not any(s or d for s, d, _ in flags)        # the median never moved
    fired = [i for i, (_, _, lost) in enumerate(flags) if lost]
    assert fired and 100 < fired[0] <= 100 + 2 * 48, fired[:3]


def test_jitter_and_one_stall_do_not_fire_the_throughput_rule() -> None:
    det = Detector(Config())
    steps = _jitter(400, 35.0, 0.3, seed=5)
    steps[200] += 250.0
    steps[300] += 250.0     # 100 steps later: never two in one window
    assert not any(det.observe_all(ms)[2] for ms in steps)


def test_throughput_capture_gets_the_long_window_even_early_in_a_short_job() -> None:
    cfg = Config(warmup_steps=10, max_profiled_fraction=0.2)
    trig = Trigger(cfg)
    assert trig.decide(11, None).trigger == "baseline"
    lost = np.array([0, 0, 0, 1], dtype=np.int64)
    d = next(d for step in range(16, 80) if (d := trig.decide(step, lost)) is not None)
    # as soon as the cooldown after the baseline allows: 17 profiled steps are far over 20% of the
    # 42 steps so far, but the first capture a detector asks for is allowed
    assert (d.trigger, d.k, d.start_step) == ("throughput", cfg.burst_window_steps, 12 + cfg.cooldown_steps), d
    assert trig.window_until == d.start_step + cfg.burst_window_steps


def test_a_rank_stopped_twice_votes_at_once_and_once_is_an_accident() -> None:
    det = Detector(Config())
    steps = _jitter(60, 35.0, 0.2)
    assert not any(det.observe_all(ms)[2] for ms in steps)
    assert not det.observe_all(285.0, stops=1)[2]                  # one SIGCONT: a person's Ctrl-Z
    assert not any(det.observe_all(ms)[2] for ms in _jitter(10, 35.0, 0.2, seed=3))
    assert det.observe_all(290.0, stops=1)[2]                      # the second within the window


def _captures(steps: list[float], cfg: Config, retry_after: int | None = None,
              unjudged: set[int] | None = None, give_way_once: bool = False) -> list[tuple[int, str]]:
    """Drive one rank's Trigger the way Runtime._boundary does (its own vote, ``vote_lag`` steps late;
    no detector input while a window is open); return (first profiled step, trigger) per capture.
    ``retry_after``: this many steps after each detector capture starts, rank 0's analyst reports it
    found no culprit (the runtime then calls Detector.retry). ``unjudged``: steps the runtime says
    say nothing of the job's pace (a DataLoader began an epoch, the job's profiler was on).
    ``give_way_once``: the first detector capture's window gives way to the job's own profiler (the
    runtime calls Trigger.gave_way after it, and the capture is dropped)."""
    trig, votes, started, window_end = Trigger(cfg), [], [], -1
    retry_at = gave_at = -1
    for step, ms in enumerate(steps):
        if step == retry_at:
            trig.detector.retry()
        if step == gave_at:
            trig.gave_way(started.pop()[1])
        in_window = step <= window_end
        votes.append(trig.local_flags(step, ms, in_window, unjudged=step in (unjudged or ())))
        voted = votes.pop(0) if len(votes) > cfg.vote_lag else None
        if in_window:
            continue
        d = trig.decide(step, voted)
        if d is not None:
            started.append((d.start_step + 1, d.trigger))
            window_end = d.start_step + d.k
            if retry_after is not None and d.trigger in DETECTED:
                retry_at = d.start_step + retry_after
            if give_way_once and d.trigger in DETECTED:
                gave_at, give_way_once = window_end + 1, False
    return started


def _job_captures(ranks: list[list[float]], cfg: Config, quiet_after: int = 0,
                  decide_when_quiet: bool = False, healthy: bool = False, retry: bool = False,
                  drift_at: int | None = None) -> list[tuple[int, str]]:
    """``_captures`` for a job: one Trigger per rank, each fed its own steps, and the vote every rank
    gets is the MAX of all ranks' flags, ``vote_lag`` steps late (as the side channel's Iallreduce).
    ``quiet_after``: steps after each window that the detectors do not judge either, as the runtime
    holds them back while the summary is built and gathered (16 in the demo's runs).
    ``decide_when_quiet``: the schedule is consulted in those steps too, as Runtime._boundary does
    (only an open window skips it), so a person's capture may start while a summary is built.
    ``healthy``: rank 0's analyst finds every detector capture healthy, and the vote brings that to
    every rank ``vote_lag`` + 2 steps after the quiet steps (the gather, the analysis and the vote).
    ``retry``: rank 0's analyst finds no culprit in every detector capture, and rank 0 alone calls
    Detector.retry then, as the runtime does. ``drift_at``: the vote at that step says drift (a noise
    drift capture)."""
    trigs = [Trigger(cfg) for _ in ranks]
    retry_at = -1
    votes: list[np.ndarray] = []
    started: list[tuple[int, str]] = []
    verdicts: dict[int, int] = {}
    window_end = quiet_end = -1
    for step in range(min(len(r) for r in ranks)):
        if step == retry_at:
            trigs[0].detector.retry()
        in_window = step <= quiet_end
        votes.append(np.max([t.local_flags(step, r[step], in_window) for t, r in zip(trigs, ranks, strict=True)], axis=0))
        if step == drift_at:
            votes[-1][1] = 1
        voted = votes.pop(0) if len(votes) > cfg.vote_lag else None
        if step in verdicts:
            first = verdicts.pop(step)
            for t in trigs:
                t.found_healthy(first)
        if in_window and not (decide_when_quiet and step > window_end):
            continue
        decisions = {t.decide(step, voted) for t in trigs}
        assert len(decisions) == 1, decisions   # the agreed side: the same answer on every rank
        d = decisions.pop()
        if d is not None:
            started.append((d.start_step + 1, d.trigger))
            window_end = d.start_step + d.k
            quiet_end = window_end + quiet_after
            if healthy and d.trigger in DETECTED:
                verdicts[quiet_end + cfg.vote_lag + 2] = d.start_step + 1
            if retry and d.trigger in DETECTED:
                retry_at = quiet_end + cfg.vote_lag + 2
    return started


def test_a_fault_right_after_a_noise_capture_is_captured_once_the_cooldown_ends() -> None:
    """CI saw this: a 4-step noise burst opened a capture 7 steps before a real 3x slowdown; the
    detector then learnt the slow steps as its new normal during the 30-step cooldown and the job
    ended without a capture of the fault."""
    cfg = Config(drift_pct=0)
    steps = _jitter(36, 55.0, 0.1) + [110.0] * 4 + _jitter(8, 55.0, 0.1, seed=1) + _jitter(60, 165.0, 0.1, seed=2)
    caps = _captures(steps, cfg)
    assert [t for _, t in caps] == ["baseline", "spike", "spike"], caps
    noise, fault = caps[1][0], caps[2][0]
    assert noise < 48 < fault <= noise + cfg.cooldown_steps + 2, caps   # as soon as the cooldown allows


def test_a_captured_slowdown_is_not_captured_again_but_a_further_rise_is() -> None:
    cfg = Config(drift_pct=0, cooldown_steps=10)
    slow = _jitter(40, 55.0, 0.1) + _jitter(150, 110.0, 0.1, seed=3)
    caps = _captures(slow, cfg)
    assert [t for _, t in caps] == ["baseline", "spike"], caps
    # ... unless its capture explained nothing: then it is captured again once the cooldown allows
    caps = _captures(slow, Config(drift_pct=0), retry_after=12)
    assert [t for _, t in caps][:3] == ["baseline", "spike", "spike"], caps
    assert caps[2][0] - caps[1][0] <= Config().cooldown_steps + 6, caps
    worse = slow + _jitter(40, 250.0, 0.1, seed=4)
    caps = _captures(worse, cfg)
    assert [t for _, t in caps] == ["baseline", "spike", "spike"] and caps[2][0] > len(slow), caps



def test_a_moderate_slowdown_right_after_a_noise_capture_is_caught_by_drift() -> None:
    """The fault bench's contend case (run 9): a noise capture 2 steps before a 1.4x slowdown, under
    the spike ratio (1.3x here). The drift rule used to forget its best window at every capture and learn the
    slow steps as its new best."""
    steps = _jitter(40, 50.0, 0.1) + [100.0] * 4 + _jitter(6, 50.0, 0.1, seed=1) + _jitter(150, 65.0, 0.1, seed=2)
    caps = _captures(steps, Config())
    assert [t for _, t in caps] == ["baseline", "spike", "drift"] and caps[1][0] < 50 < caps[2][0], caps
    # a rise still in progress when its capture starts is the new normal for drift as well
    steps = _jitter(40, 50.0, 0.1) + _jitter(250, 70.0, 0.1, seed=2)
    caps = _captures(steps, Config(spike_ratio=1.3))
    assert [t for _, t in caps] == ["baseline", "spike"], caps


def test_a_one_step_spike_rule_survives_its_own_capture() -> None:
    """--spike-steps 1 is allowed: the acknowledged level's check must not index past one step."""
    caps = _captures(_jitter(40, 50.0, 0.1) + _jitter(100, 120.0, 0.1, seed=3), Config(spike_steps=1, drift_pct=0))
    assert [t for _, t in caps][:2] == ["baseline", "spike"], caps


@pytest.mark.parametrize("run", ["demo-compute-steps.json", "demo-compute-steps-2.json"])
def test_a_noisy_slowdown_is_captured_once_not_at_every_cooldown(run: str) -> None:
    """The demo's own steps (tests/data/trigger): a +40 ms compute fault from step 60 on a 2-core
    machine, 45 +- 12 ms before and 75 +- 15 ms after; the same fault was captured again at every
    cooldown's end, printing the same diagnosis each time. In the first run three slow steps of
    four dipped under the midpoint between the old and the captured level, and the rule took the
    slowdown for over; in the second, one quick step right before the capture started (79, 105, 68,
    36 ms) meant the capture acknowledged no rise at all."""
    steps = json.loads((DATA / run).read_text())["ms"]
    caps = _captures(steps, Config())
    assert [t for _, t in caps] == ["baseline", "spike"] and 60 < caps[1][0] <= 72, caps


def test_a_noisy_slowdown_is_captured_once_by_a_job_whose_ranks_each_judge_their_own_steps() -> None:
    """The demo's four ranks (tests/data/trigger): every rank's detector votes, and one rank that
    acknowledged nothing as the capture started (a quick step between slow ones), or only the level
    its rule fired on early in the rise, was enough to capture the same fault again at the next
    cooldown's end, twice in this run. The capture's window and the steps after it say what it saw, on
    every rank."""
    ranks = json.loads((DATA / "demo-compute-steps-4ranks.json").read_text())["ranks"]
    for quiet_after in (0, 16):   # the window only; and as the runtime holds back the build's steps
        caps = _job_captures(ranks, Config(), quiet_after)
        assert [t for _, t in caps] == ["baseline", "spike"] and 60 < caps[1][0] <= 72, (quiet_after, caps)
    # each rank alone as well (the single-rank replay of rank 3 and of rank 0 captured it twice)
    for steps in ranks:
        caps = _captures(steps, Config())
        assert [t for _, t in caps] == ["baseline", "spike"], caps


def _captured(det: Detector, window: list[float], after: list[float]) -> list[tuple[bool, bool, bool]]:
    """A detector capture starts, its window's (profiled) steps end it, then ``after`` is judged."""
    det.reset()
    det.window_ended(window)
    return [det.observe_all(ms) for ms in after]


def test_a_slowdown_seen_through_the_profilers_overhead_is_acknowledged_at_its_own_level() -> None:
    """The fault bench's compute case on 2 cores: 190 ms steps against 75 before, 300-400 ms while
    profiled. A capture that acknowledged nothing as it started (a quick step just before it) must
    not vote for the same slowdown again, nor acknowledge the profiled 400 ms, which would read the
    190 ms steps as back to normal."""
    det = Detector(Config())
    for ms in _jitter(60, 75.0, 0.05):
        det.observe_all(ms)
    slow = _jitter(120, 190.0, 0.05, seed=1)
    flags = _captured(det, [379.0, 307.0, 400.0], slow[:8])
    assert det.ack is not None and 190.0 < det.ack < 250.0, det.ack
    flags += [det.observe_all(ms) for ms in slow[8:]]
    assert not any(any(f) for f in flags), [i for i, f in enumerate(flags) if any(f)]
    # (by now the steps before the capture have left the reference: 190 ms is the new normal)
    assert any(det.observe_all(ms)[0] for ms in _jitter(10, 400.0, 0.05, seed=2))


def test_a_window_slow_only_from_profiling_acknowledges_nothing() -> None:
    """Normal steps after a window whose profiled steps were 2x: the capture saw no rise, and a
    moderate slowdown (1.4x, under the spike ratio) that starts right after it is still caught by
    the drift rule against the steps before the capture."""
    det = Detector(Config())
    for ms in _jitter(60, 50.0, 0.05):
        det.observe_all(ms)
    flags = _captured(det, [100.0, 105.0, 98.0], _jitter(8, 50.0, 0.05, seed=1) + _jitter(120, 70.0, 0.05, seed=2))
    assert det.ack is None
    assert any(f[1] for f in flags), "the drift rule never fired on the 1.4x slowdown"


def test_an_unexplained_capture_acknowledges_nothing_after_all() -> None:
    """A rank just under the spike ratio (1.44x after, 1.9x in the window) is acknowledged; if rank
    0's analyst then finds no culprit (retry), the drift rule gets back the steps before the
    capture as its reference, and votes for the slowdown again."""
    def run(retry: bool) -> list[tuple[bool, bool, bool]]:
        det = Detector(Config())
        for ms in _jitter(60, 50.0, 0.05):
            det.observe_all(ms)
        flags = _captured(det, [94.0, 96.0, 90.0], _jitter(8, 72.0, 0.05, seed=1))
        assert det.ack is not None and not any(any(f) for f in flags)
        if retry:
            det.retry()
        return [det.observe_all(ms) for ms in _jitter(80, 72.0, 0.05, seed=2)]

    assert not any(any(f) for f in run(retry=False))
    assert any(any(f) for f in run(retry=True))


def test_a_capture_that_sees_a_worse_level_than_its_trigger_acknowledges_what_it_saw() -> None:
    """The rule fired early in a rise (1.6x); the window then saw the full 2.5x. A later capture
    needs a rise beyond what the window saw, not beyond the level the rule fired on."""
    cfg = Config(drift_pct=0, cooldown_steps=10, lost_pct=0)
    steps = _jitter(40, 50.0, 0.05) + [80.0] * 5 + _jitter(120, 125.0, 0.05, seed=5)
    caps = _captures(steps, cfg)
    assert [t for _, t in caps] == ["baseline", "spike"], caps
    # but a burst that was over before its window opened acknowledges nothing: a fault after it is caught
    steps = _jitter(40, 50.0, 0.05) + [120.0] * 5 + _jitter(30, 50.0, 0.05, seed=6) + _jitter(60, 130.0, 0.05, seed=7)
    caps = _captures(steps, cfg)
    assert [t for _, t in caps] == ["baseline", "spike", "spike"] and caps[2][0] > 75, caps


def test_a_slowdown_right_after_the_baselines_summary_is_captured() -> None:
    """CI saw this (tests/test_linkprobe.py): the baseline capture's summary was built and gathered
    over 17 steps after its window, the detectors skipped them, and with only the two steps before
    the window to go on, the spike rule learnt a 4.7x slowdown that began 7 steps later as its
    reference. Its steps are judged now (never voted on)."""
    data = json.loads((DATA / "link-after-baseline-steps.json").read_text())
    steps = [data["ms"][0]] * data["first_step"] + data["ms"]
    cfg = Config(warmup_steps=25)
    caps = _job_captures([steps], cfg, quiet_after=17)
    assert [t for _, t in caps] == ["baseline", "spike"] and 55 < caps[1][0] <= 65, caps


def test_a_slowdown_that_went_away_and_came_back_is_captured_again() -> None:
    steps = (_jitter(40, 50.0, 0.1) + _jitter(40, 110.0, 0.1, seed=1) + _jitter(30, 50.0, 0.1, seed=2)
             + _jitter(40, 110.0, 0.1, seed=3))
    caps = _captures(steps, Config())
    # once, and once again: here the return is caught by the throughput rule (the spike rule's p90
    # still holds the first slowdown's steps), and that capture acknowledges the rise for the spike
    # rule too, which otherwise captured the same return again 30 steps later
    assert len(caps) == 3 and 40 < caps[1][0] <= 50 and 110 < caps[2][0] <= 122, caps


def test_a_request_or_scheduled_step_during_an_open_window_is_taken_when_it_ends() -> None:
    """A person's SIGUSR1 that arrives while a window is open (the runtime then only tells the trigger
    ``requested``), and a --capture-at-steps step inside another capture's window, are captured once
    that window ends, not dropped."""
    cfg = Config(warmup_steps=10, capture_at_steps=(14,))
    trig = Trigger(cfg)
    started = []
    for step in range(40):
        if step == 20:
            trig.requested()     # voted while the window below is open
        if trig.window_until >= step + 1:
            continue             # the runtime does not decide while a window is open
        d = trig.decide(step, None)
        if d is not None:
            started.append((d.start_step + 1, d.trigger))
    assert started[0] == (13, "baseline")
    assert started[1] == (17, "manual")      # 14 fell in the baseline's window (13-15): taken after it
    assert started[2][1] == "manual" and started[2][0] > 20 and len(started) == 3


def test_the_budget_says_what_it_refuses_a_slowdown_once_and_every_request() -> None:
    """With the budget spent, a slowdown that keeps voting counts once a run of votes and is said
    once until a capture comes back; a person's request is refused and said every time; the same on
    every rank, and each line says when the budget has a capture again."""
    cfg = Config(warmup_steps=0, baseline=False, cooldown_steps=5, max_captures=1, window_steps=3)
    a, b = Trigger(cfg), Trigger(cfg)
    spike, manual, none = np.array([1, 0, 0, 0]), np.array([0, 0, 1, 0]), np.zeros(4, dtype=np.int64)
    votes = {**{s: spike for s in range(10, 60)}, **{s: spike for s in range(70, 80)}, 90: manual, 95: manual}
    taken = []
    for step in range(100):
        v = votes.get(step, none)
        da, db = a.decide(step, v), b.decide(step, v)
        assert da == db and a.said == b.said
        if da:
            taken.append(da.trigger)
    assert taken == ["spike"]
    assert a.refused == b.refused
    assert (a.refused.slowdowns, a.refused.requests) == (2, 2)
    assert a.refused.first_step is not None and a.refused.first_step > 10
    said = a.take_said()
    assert [x.what for x in said] == ["spike", "request", "request"] and a.take_said() == []
    assert [x.step for x in said][1:] == [92, 97]   # the steps their windows would have begun at
    assert {x.back_at for x in said} == {11 + cfg.capture_refill_steps}   # the capture at 11 comes back


def test_a_spent_budget_comes_back_one_capture_per_refill_period_never_above_its_size() -> None:
    """A bucket of --max-captures: each capture takes one, one comes back every
    --capture-refill-steps steps counted from the capture that emptied it first, and a long quiet
    spell does not store up more than the bucket holds."""
    b = Budget(2, 100)
    assert b.available(10) and b.next_back() is None
    b.spend(10)                       # the refill clock starts with the first capture taken from a full bucket
    assert b.next_back() == 110
    b.spend(50)
    assert not b.available(109) and b.available(110) and b.next_back() == 210   # one back; the clock runs on
    b.spend(120)
    assert not b.available(209) and b.available(210)
    assert b.available(5000) and b.left == 2 and b.next_back() is None          # full: no more than its size
    b.spend(5000)
    b.spend(5001)
    assert not b.available(5099) and b.next_back() == 5100
    never = Budget(2, 0)              # --capture-refill-steps 0: two captures for the job
    never.spend(10)
    never.spend(20)
    assert not never.available(10**9) and never.next_back() is None
    empty = Budget(0, 100)            # --max-captures 0: no capture ever, whatever the refill
    assert not empty.available(10**9) and empty.next_back() is None


def test_a_slowdown_after_noise_spent_the_budget_is_captured_when_a_capture_comes_back() -> None:
    """A long job on a noisy host spends a budget per job on captures that find nothing: a real
    healthy 4-rank job (tests/data/trigger) spends a budget of 3 on the baseline and two noise
    captures by step ~1,000, and a slowdown from step 2,200 was never captured, only counted as
    refused. With one capture back every 400 steps it is captured within one such period of its
    onset (noise may take the capture that comes back first); the same on every rank."""
    ranks = json.loads(HEALTHY_JOB.read_text())["ranks"]
    onset = 2200
    slowed = [r[:onset] + [ms * 1.6 for ms in r[onset:]] for r in ranks]
    spent = _job_captures(slowed, Config(max_captures=3, capture_refill_steps=0), quiet_after=16, healthy=True)
    assert len(spent) == 3 and spent[-1][0] < onset, spent   # the noise spent it before the slowdown began
    refilled = _job_captures(slowed, Config(max_captures=3, capture_refill_steps=400), quiet_after=16, healthy=True)
    after = [s for s, t in refilled if t in DETECTED and s >= onset]
    assert after and after[0] - onset <= 400 + 16, refilled
    assert refilled[:3] == spent   # until the budget is spent, the schedule is the one it always was


def test_a_refused_slowdown_is_said_again_after_a_capture_came_back_and_went() -> None:
    """Rank 0 says once that the budget refused a slowdown, and when the next capture comes back;
    after that capture is taken and the budget is spent again, the next refused slowdown is said
    again (with no refill it is said once for the job: test_the_budget_says_what_it_refuses...)."""
    cfg = Config(warmup_steps=0, baseline=False, cooldown_steps=5, max_captures=1, window_steps=3,
                 capture_refill_steps=50)
    t = Trigger(cfg)
    spike = np.array([1, 0, 0, 0])
    taken = [d.start_step for d in (t.decide(step, spike) for step in range(10, 130)) if d]
    assert taken == [11, 61, 111], taken          # one capture per refill period of a standing slowdown
    said = t.take_said()
    assert [(x.what, x.back_at) for x in said] == [("spike", 61), ("spike", 111), ("spike", 161)], said
    assert t.refused.slowdowns == 3   # each run of refused votes counted once


def test_a_slowdown_soon_after_a_persons_early_capture_is_still_captured() -> None:
    """A person's capture right after the baseline (--capture-at-steps 20) and its summary's build
    (20 steps on this machine's 4-rank jobs) left the spike rule a handful of steps of reference; a
    fault from step 40 filled its history and became the job's normal: never captured (a real
    4-rank job, compute +60 ms on rank 1 from step 40: only the person's second capture at 90 saw it).
    The rules now judge, without voting, the build steps of any capture while they still learn."""
    cfg = Config(capture_at_steps=(20, 90))
    ranks = [[s * (1.0 if i < 40 else 1.7) for i, s in enumerate(_jitter(120, base=75.0, seed=r))]
             for r in range(4)]
    got = _job_captures(ranks, cfg, quiet_after=20, decide_when_quiet=True)
    assert got[:2] == [(13, "baseline"), (20, "manual")]
    detected = [(s, t) for s, t in got if t in DETECTED]
    assert detected and 40 < detected[0][0] <= 60, got


HEALTHY_JOB = DATA / "healthy-3000-steps-4ranks.json"


def _drift_captures(caps: list[tuple[int, str]]) -> list[int]:
    return [s for s, t in caps if t == "drift"]


def test_a_drift_level_found_healthy_is_not_captured_again_and_again() -> None:
    """A real healthy 4-rank job of 3,000 steps on a 2-core VM (tests/data/trigger; its 50-step
    windows' means wander between 40 and 57 ms with the VM's load): the drift rule's best window sank
    as the job ran, and windows 5% above it came back again and again. Every such capture finds
    nothing, and the default budget of 8 went on them. Rank 0's verdict that a drift capture was
    healthy, brought to every rank by the vote, makes the level it opened at the drift rule's least
    reference for a while: far fewer captures of the same noise."""
    ranks = json.loads(HEALTHY_JOB.read_text())["ranks"]
    cfg = Config(max_captures=1000)   # count them all: the default budget stops counting at 7
    without = _drift_captures(_job_captures(ranks, cfg, quiet_after=16))
    found = _drift_captures(_job_captures(ranks, cfg, quiet_after=16, healthy=True))
    assert len(without) >= 6, without   # the noise this is about is in the recording
    assert len(found) <= len(without) // 2, (found, without)
    assert found[0] == without[0]       # the first one is taken as before: nothing was found healthy yet


@pytest.mark.parametrize(("onset", "factor"), [(1000, 1.15), (2000, 1.15), (2400, 1.2)])
def test_a_slowdown_after_a_drift_level_found_healthy_is_still_captured(onset: int, factor: float) -> None:
    """The same recorded job, every rank's steps from ``onset`` on ``factor`` x slower (a job-wide
    slowdown, the drift rule's case: under the spike rule's 1.5x). The level a noise capture was found
    healthy at is the drift rule's least reference for 10 windows only: kept for good, a level found in
    a noisy spell hid these slowdowns for the rest of the job."""
    ranks = json.loads(HEALTHY_JOB.read_text())["ranks"]
    slowed = [r[:onset] + [ms * factor for ms in r[onset:]] for r in ranks]
    cfg = Config(max_captures=1000)
    caps = _job_captures(slowed, cfg, quiet_after=16, healthy=True)
    after = [s for s, t in caps if t in DETECTED and s >= onset]
    assert after and after[0] - onset <= 4 * cfg.drift_window, caps


def test_a_healthy_verdict_counts_only_for_the_latest_drift_capture() -> None:
    """The verdict names the capture's first step: one about an earlier capture (the analysis took
    longer than the cooldown) or about a capture another rule opened leaves the drift rule alone."""
    cfg = Config(warmup_steps=5, window_steps=3, cooldown_steps=10)
    trig = Trigger(cfg)
    steps = _jitter(120, 50.0, 0.02)
    for step, ms in enumerate(steps[:100]):
        trig.local_flags(step, ms, False)
    drift = np.array([0, 1, 0, 0])
    assert trig.decide(100, drift) is not None and trig.window_trigger == "drift"
    level = trig.detector.capture_level
    assert level is not None
    trig.found_healthy(100)   # not this capture's first step (100 is its lead-in): an earlier capture's
    assert trig.detector.floor_left == 0
    trig.found_healthy(102)
    assert trig.detector.floor_left == FLOOR_WINDOWS * cfg.drift_window and trig.detector.floor == level
    spike = Trigger(cfg)
    for step, ms in enumerate(steps[:100]):
        spike.local_flags(step, ms, False)
    assert spike.decide(100, np.array([1, 0, 0, 0])) is not None
    spike.found_healthy(102)
    assert spike.detector.floor_left == 0


def test_a_level_found_healthy_holds_the_drift_rule_back_for_ten_windows_then_not() -> None:
    """A drift capture that opened at 52 ms (its windows' best 50) was found healthy: steps at 54.3 ms
    (5% above 52 is 54.6) do not fire for 10 windows; once those are over, the rule is back to its
    best window (5% above 50 is 52.5) and they do."""
    cfg = Config(spike_ratio=10, lost_pct=0)
    det = Detector(cfg)
    for ms in _jitter(200, 50.0, 0.01) + _jitter(50, 52.0, 0.01, seed=1):
        det.observe(ms)
    det.reset()          # the capture starts (this rank's drift rule had not fired: it keeps its best)
    det.found_healthy()
    assert det.floor is not None and 51.5 < det.floor < 52.5
    fired = [det.observe(ms)[1] for ms in _jitter(FLOOR_WINDOWS * cfg.drift_window + 60, 54.3, 0.01, seed=2)]
    assert not any(fired[: FLOOR_WINDOWS * cfg.drift_window])
    assert any(fired[FLOOR_WINDOWS * cfg.drift_window:])


def test_a_long_pause_between_ordinary_steps_fills_no_place_among_the_spike_rules_slow_steps() -> None:
    """A 12 s checkpoint after an 8 ms step, then rank 3's real steps after it (a 4-rank job on this
    VM, tests/data/runtime/train.py PAUSE=checkpoint): two of them 1.55x. Counted as a slow step, the
    pause made three of four slow and the rule voted; left out, two noisy steps are no rise."""
    det = Detector(Config(drift_pct=0))
    steps = _jitter(60, base=8.0) + [12008.3, 12.4, 12.7, 5.3, 10.5, 5.3] + _jitter(10, base=8.0, seed=2)
    assert not any(det.observe(ms)[0] for ms in steps)


@pytest.mark.parametrize("level", [45.0, 500.0, 5000.0])
def test_a_rise_that_stays_is_voted_as_soon_however_far_it_goes(level: float) -> None:
    """A step 10x and more is held back one step as a possible pause; when the next is far slower too,
    both count at once, so a huge lasting rise is voted at the same step as a moderate one."""
    det = Detector(Config(drift_pct=0))
    steps = _jitter(60) + [level] * 10
    assert next(i for i, ms in enumerate(steps) if det.observe(ms)[0]) == 62


def test_a_burst_that_starts_with_its_longest_step_is_voted_at_its_third_step() -> None:
    """gc-int of fault bench run 42, rank 0 (steps 44-59): the first GC storm step is 765 ms against
    ~35, the rest 174-234. Held back, then counted with the next: the rule votes at the burst's
    third step (52), as before there was a pause rule."""
    det = Detector(Config(drift_pct=0))
    gc_int = [68, 36, 21, 48, 20, 37, 765, 234, 174, 230, 213, 195, 205, 197, 60, 68]
    steps = _jitter(44, base=35.0, spread=0.4) + [float(x) for x in gc_int]
    assert next(i for i, ms in enumerate(steps) if det.observe(ms)[0]) == 52


def _periodic(n: int, every: int = 25, pause: float = 300.0, seed: int = 4) -> list[float]:
    """Steps of ~30 ms with a pause 10x a step after every ``every`` steps (an evaluation or a
    checkpoint the job does itself): windows of 48 steps hold one or two of them."""
    return [ms + (pause if i % every == every - 1 else 0.0) for i, ms in enumerate(_jitter(n, 30.0, 0.15, seed))]


def _throughput(caps: list[tuple[int, str]]) -> list[int]:
    return [step for step, trigger in caps if trigger == "throughput"]


def test_a_job_that_evaluates_every_25_steps_is_captured_twice_not_at_every_cooldown() -> None:
    """The share of time lost to the job's own pauses swings between ~3% and ~29% with how many
    the window holds; judged against the best window since each capture, it opened a capture at
    every cooldown (8 in 1,500 steps, the whole budget). Now: once, and once more because the
    analysis explained nothing (the window may have missed the bursts); then it is the job's own."""
    caps = _captures(_periodic(1500), Config(warmup_steps=10), retry_after=20)
    assert len(_throughput(caps)) == 2, caps
    # a checkpoint the first capture explained (rank 0 works alone): no retry, no second capture
    caps = _captures(_periodic(1500), Config(warmup_steps=10))
    assert len(_throughput(caps)) == 1, caps


def test_a_noise_capture_between_an_evaluating_jobs_two_throughput_captures_adds_no_third() -> None:
    """CI saw this (2026-12-05): the 4-rank job evaluating every 25 steps took throughput captures at 85,
    210 and 348 around a drift capture of noise at 178, where it takes 85 and 185. Rank 0 (which alone
    retries a capture its analysis explained nothing in) kept its window across the drift capture's
    unjudged steps; a window that spanned them held one pause more, the retried capture acknowledged
    that share, with the best of the few windows since the drift capture as the level the stalls go
    back to, and ordinary windows then read as back to normal, forgot it and captured again. The level
    they go back to is now the lowest any throughput capture of the job started from. Replayed over 48
    drift-capture steps and 3 jobs of 4 ranks: 6 schedules with 3-4 throughput captures before, none
    now."""
    cfg = Config(warmup_steps=10)
    for seed in (4, 8):
        ranks = [_periodic(600, seed=seed + r) for r in range(4)]
        caps = _job_captures(ranks, cfg, quiet_after=16, retry=True, drift_at=150)
        assert ("drift" in [t for _, t in caps]) and len(_throughput(caps)) == 2, caps


def test_stalls_captured_once_are_captured_again_when_they_come_back_or_grow() -> None:
    cfg = Config(warmup_steps=10)
    healthy = _jitter(100, 35.0, 0.2)
    # a rank stopped 250 ms once a second for 300 steps: one capture, not one per cooldown
    caps = _captures(healthy + _freeze(300) + _jitter(100, 35.0, 0.2, seed=7) + _freeze(200, seed=9), cfg)
    first, again = _throughput(caps)
    assert 100 < first < 200 and 500 < again < 600, caps   # the stalls went away for a window and came back
    # the same stalls three times as often: a larger share than the capture saw
    caps = _captures(healthy + _freeze(300) + _freeze(300, every=9, seed=9), cfg)
    first, again = _throughput(caps)
    assert 100 < first < 200 and 400 < again < 500, caps


def test_a_rank_stopped_again_and_again_is_captured_once_until_a_window_without_stops() -> None:
    cfg = Config(warmup_steps=10)
    trig = Trigger(cfg)
    stopped = [i % 28 == 27 for i in range(400)]
    starts, window_end = [], -1
    votes: list[np.ndarray] = []
    steps = _jitter(100, 35.0, 0.2) + _jitter(250, 35.0, 0.2, seed=3) + _jitter(100, 35.0, 0.2, seed=5) + _jitter(150, 35.0, 0.2, seed=6)
    for step, ms in enumerate(steps):
        stops = int(100 <= step < 350 and stopped[step - 100]) or int(step >= 450 and stopped[step - 450])
        in_window = step <= window_end
        votes.append(trig.local_flags(step, ms, in_window, stops))
        voted = votes.pop(0) if len(votes) > cfg.vote_lag else None
        if in_window:
            continue
        if (d := trig.decide(step, voted)) is not None:
            starts.append((d.start_step + 1, d.trigger))
            window_end = d.start_step + d.k
    first, again = _throughput(starts)
    assert 100 < first < 200 and 450 < again < 550, starts


def test_no_capture_starts_while_the_jobs_profiler_is_on_and_the_baseline_comes_after() -> None:
    """While the vote says the job's own torch.profiler is on somewhere, nothing starts (one profiler
    a process): not the baseline, a person's request or a slowdown. The baseline and the request come
    once it is off, in that order, every rank alike."""
    cfg = Config(warmup_steps=5, window_steps=3, cooldown_steps=10)
    a, b = Trigger(cfg), Trigger(cfg)
    asked, quiet = np.array([0, 0, 1, 0]), np.array([0, 0, 0, 0])
    got = []
    for step in range(40):
        vote = asked if step == 6 else quiet
        held = 4 <= step < 20
        da, db = a.decide(step, vote, held=held), b.decide(step, vote, held=held)
        assert da == db
        if da:
            got.append((da.start_step, da.trigger))
            a.window_until = b.window_until = da.start_step + da.k   # as decide set it (identical)
    assert got[:2] == [(21, "baseline"), (25, "manual")], got


def test_a_baseline_or_request_given_way_to_the_jobs_profiler_is_taken_again() -> None:
    """A capture dropped because its window gave way to the job's profiler: the baseline (the job's
    healthy reference) and a person's request are taken again; a detector's is voted for again by
    the detector if the slowdown is still there, not started here."""
    cfg = Config(warmup_steps=5, window_steps=3)
    trig = Trigger(cfg)
    first = next(d for d in (trig.decide(s, None) for s in range(20)) if d)
    assert first.trigger == "baseline" and first.start_step == 7
    trig.gave_way("baseline")
    again = next(d for d in (trig.decide(s, None) for s in range(20, 40)) if d)
    assert again.trigger == "baseline" and again.start_step == 21
    assert not any(trig.decide(s, None) for s in range(40, 80))   # taken: not again and again
    trig.gave_way("manual")
    assert trig.decide(80, None).trigger == "manual"
    trig.gave_way("spike")
    assert not any(trig.decide(s, None) for s in range(100, 140))


def test_a_slowdown_whose_capture_gave_way_to_the_jobs_profiler_is_voted_for_again() -> None:
    """A 3x slowdown from step 80; its first capture's window gives way to the job's own profiler (one
    cycling every 13 steps, 2026-12-05): the detector had acknowledged the level as the capture
    started, so the slowdown was never captured again. Now it is."""
    steps = _jitter(80, 20.0, 0.1, seed=5) + [3 * ms for ms in _jitter(120, 20.0, 0.1, seed=6)]
    cfg = Config(warmup_steps=10)
    assert [t for _, t in _captures(steps, cfg)] == ["baseline", "spike"]
    again = _captures(steps, cfg, give_way_once=True)
    assert [t for _, t in again][:2] == ["baseline", "spike"] and again[1][0] > 90, again


def test_the_steps_a_dataloader_began_an_epoch_in_are_not_judged() -> None:
    """Workers started anew at every epoch (30 steps of ~17 ms, each epoch's start ~8x a step): the
    rhythm reads as lost throughput and opened captures that found every rank alike (a real 4-rank
    job, 2026-12-05: at steps 100 and 190 of 240). The runtime marks those steps unjudged
    (stepclock.StepClock.epoch_began): only the baseline is taken."""
    steps = [ms + (120.0 if i % 30 == 0 else 0.0) for i, ms in enumerate(_jitter(600, 17.0, 0.1, seed=3))]
    cfg = Config(warmup_steps=10)
    assert _throughput(_captures(steps, cfg))
    assert [t for _, t in _captures(steps, cfg, unjudged=set(range(0, 600, 30)))] == ["baseline"]


def test_a_new_kind_of_step_is_learnt_afresh_and_gets_its_own_baseline() -> None:
    """The step clock counted an evaluation pass's batches before the training's first optimizer step,
    then the optimizer's steps (stepclock.ADOPT_AFTER), 4x as long: ``relearn(step)`` makes the rules
    learn the new pace instead of voting a spike on it, and the baseline is taken again after a new
    warm-up (the one taken in the evaluation would be every later capture's reference)."""
    cfg = Config(warmup_steps=10, vote_lag=4)
    for relearn in (False, True):
        trig = Trigger(cfg)
        started, spikes = [], 0
        for step in range(100):
            if step == 40 and relearn:
                trig.relearn(step)
            ms = 10.0 if step < 40 else 40.0
            in_window = trig.window_until >= step
            spikes += int(trig.local_flags(step, ms, in_window)[0])
            if (d := trig.decide(step, None)) is not None:
                started.append((d.start_step + 1, d.trigger))
        if relearn:
            assert started == [(13, "baseline"), (53, "baseline")] and spikes == 0, (started, spikes)
        else:
            assert started == [(13, "baseline")] and spikes > 0, (started, spikes)
