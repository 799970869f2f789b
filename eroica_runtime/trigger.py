"""The trigger: a local detector on each rank, and the lagged vote that makes all ranks agree.

Local rules (defaults in Config, all configurable):
- spike: all but one of the last ``spike_steps`` steps exceed ``spike_ratio`` x the rolling median of
  the ``spike_history`` steps before them, and their p90 — a persistent rise; noise bursts don't fire;
  a rise stays out of that history until a capture has seen it, and fires again only
  ``spike_ratio`` x above the level that capture saw (judged as it starts, and settled from its
  window and the steps after it, which vote for nothing until then), or once steps are back to
  normal (all but one of the last 2 x ``spike_steps`` nearer the old reference than that level);
  a step ``PAUSE_RATIO`` x the reference between two normal ones is a pause (a checkpoint, an
  evaluation), not part of a rise (``_spike``);
- drift (EROICA's rule): the mean of the last ``drift_window`` steps (top 10% trimmed, so stray
  spikes don't count) stays more than ``drift_pct`` % — and more than 3 standard errors of that
  mean — above the best window seen since the last capture that caught a rise in progress, for
  ``drift_window // 2`` consecutive steps; for ``FLOOR_WINDOWS`` windows after a drift capture
  was found healthy, never judged against less than the level it opened at (``found_healthy``);
- throughput: the share of time lost to steps slower than the median over the last ``lost_window``
  steps, the longest one left out (1 - median x (n-1) / (sum - max)), stays ``lost_pct`` % points above the best such window since the last
  capture for ``lost_window // 8`` steps: rare long stalls (a process stopped 250 ms once a second,
  slowness in bursts) that leave the median, and so the spike and drift rules, alone; also as soon as
  the rank was stopped and continued (SIGCONT) twice within ``lost_window`` steps. It opens a
  ``burst_window_steps`` window, long enough to hold the bursts' slow steps; after such a capture it
  fires again only ``lost_pct`` points above the share that capture saw, or once a whole window is
  back to normal (``Detector.lost_ack``): a job that evaluates or checkpoints every few dozen steps
  loses a steady share that swings with how many pauses the window holds;
- manual: SIGUSR1, a ``trigger`` file in the report dir, ``--capture-at-steps``;
- baseline: one automatic capture right after warm-up, so every job has a healthy reference (the
  steps its summary is built and gathered in are judged by the rules, never voted on).

Budget: at most ``max_captures`` captures at once (baseline included); a spent one comes back every
``capture_refill_steps`` steps (``Budget``), so a job that runs for days keeps being watched while
noise captures cost it one capture per that many steps at most.

Vote: every step each rank posts an Iallreduce(MAX) of its flags and completes the one posted
``vote_lag`` (3) steps earlier, so all ranks learn the same result at the same step and agree on the same
capture start step without an extra round-trip. MPI moves a nonblocking collective on only inside MPI
calls, so every boundary also touches the votes in flight. Measured on a dormant 4-rank job: at lag 2 a
vote was unfinished when due on every step and completing it cost 0.8-1.3 ms; at lag 3, 6-8 µs; at
lag 4, 3-4 µs. Each step of lag delays a capture by a step, and short bursts end before their window
(8-step bursts: lag 4 missed all of them in the fault bench), so 3.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass

import numpy as np

from eroica_runtime.config import Config
from eroica_runtime.engine.table import PAUSE_RATIO

REASONS = ("spike", "drift", "manual", "throughput")
DETECTED = ("spike", "drift", "throughput")   # the captures a slowdown opened (not baseline or manual)
FLOOR_WINDOWS = 10   # drift windows a level found healthy stays the drift rule's least reference
MIN_STOPS = 2   # SIGCONTs within the throughput window that make a rank vote (one is an accident)


class Budget:
    """The capture budget: a bucket of ``size`` captures (--max-captures) from which every capture takes
    one, and to which one comes back every ``refill_steps`` steps (--capture-refill-steps; 0: never)
    while it is not full.

    A budget per job was spent by a long job's noise: 22,340 steps of healthy 4-rank jobs recorded on
    this project's 2-core VM (whole-job slow spells, a wandering level), replayed through the trigger
    with every capture found healthy, spent the default 8 by step 1,424, and 22 slowdowns (x1.2, x1.6)
    planted from step 4,000 on were all missed, only counted as refused. With one capture back every
    1,000 steps all 22 were captured, 12 within 47 steps and the rest when the next capture came back
    (513 steps: the noise takes each one that comes back while nothing else is slow), for 29 noise
    captures instead of 7 (docs/bench-faults.md). Counted in steps, not seconds, so every rank
    computes the same budget from the same agreed decisions. The bucket never holds more than
    ``size``: a long quiet spell does not buy a burst of captures later."""

    def __init__(self, size: int, refill_steps: int) -> None:
        self.size, self.refill_steps = size, refill_steps
        self.left = size
        self.refill_from: int | None = None   # the step the next capture back counts from (None: full)

    def available(self, step: int) -> bool:
        """Whether a capture starting at ``step`` may be taken."""
        self._refill(step)
        return self.left > 0

    def spend(self, step: int) -> None:
        """A capture starts at ``step``."""
        self._refill(step)
        self.left -= 1
        if self.refill_from is None:
            self.refill_from = step

    def next_back(self) -> int | None:
        """The step the next capture comes back at (None: full, or it never refills)."""
        if self.refill_from is None or self.refill_steps <= 0:
            return None
        return self.refill_from + self.refill_steps

    def _refill(self, step: int) -> None:
        since = self.refill_from
        if since is None or self.refill_steps <= 0 or step < since + self.refill_steps:
            return
        n = (step - since) // self.refill_steps
        self.left = min(self.size, self.left + n)
        self.refill_from = None if self.left == self.size else since + n * self.refill_steps


@dataclass(frozen=True)
class Decision:
    start_step: int
    trigger: str
    k: int = 0          # window length (steps)


class Detector:
    """Per-rank anomaly rules over step durations (warm-up and profiled steps excluded)."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.lost_window: deque[float] = deque()   # the throughput rule's steps, kept across resets
        self.lost_sorted: list[float] = []         # the same, sorted (median and max per step in O(n))
        self.lost_sum = 0.0
        # spike: steps accepted as the reference, and the newest spike_steps steps judged against them
        self.history: deque[float] = deque(maxlen=cfg.spike_history)
        self.recent: deque[float] = deque(maxlen=cfg.spike_steps)
        self.tail: deque[float] = deque(maxlen=2 * cfg.spike_steps)   # "back to normal" is judged on more
        self.raised = False                        # the spike rule fired on the last step
        self.level = 0.0                           # the level it judged last: all but one recent step above it
        self.raise_level = 0.0                     # the level of its latest firing ...
        self.since_raise = 1 << 30                 # ... this many steps ago
        self.reference = 0.0                       # the spike rule's reference (median of history)
        self.held: float | None = None             # a step PAUSE_RATIO x the reference, judged with the next
        self.far = False                           # the last step was 2 x spike_ratio x the reference
        self.window: deque[float] = deque(maxlen=max(cfg.drift_window, 2))
        self.best: float | None = None             # drift: the best window seen
        self.over = 0
        self.best_lost: float | None = None
        self.lost_over = 0
        # the latest lost shares judged (the level a throughput capture saw is their highest)
        self.lost_recent: deque[float] = deque(maxlen=max(1, cfg.lost_window // 8) + cfg.vote_lag + 1)
        self.lost_ack: float | None = None         # the lost share the last throughput capture saw, ...
        self.lost_base: float | None = None        # ... the best window's before such captures, ...
        self.lost_normal = 0                       # ... and the steps judged back to normal since
        self.lost_retried = False                  # a capture of that level explained nothing once
        self.stops_acked = False                   # the last throughput capture saw this rank stopped
        self.last_trigger = ""                     # what opened the latest capture (reset)
        self.stops: deque[int] = deque(maxlen=max(cfg.lost_window, 4))
        self.ack: float | None = None              # step level the last capture saw (spike)
        self.settle: list[float] | None = None     # the first steps judged after a capture's window,
        self.window_level = 0.0                    # and that window's median step
        # the drift rule's state before _settle() acknowledged a rise (for retry())
        self.unacked: tuple[deque[float], float | None, int] | None = None
        self.capture_level: float | None = None    # drift: the window's mean as the last capture started
        self.floor: float | None = None            # drift: the level a capture was found healthy at, ...
        self.floor_left = 0                        # ... the reference's least for this many more steps

    def reset(self, trigger: str = "") -> None:
        """A capture started (opened by ``trigger``): acknowledge what it caught, so the same slowness
        does not fire again.

        The spike rule keeps its reference. Forgetting it made the steps right after a capture the
        new reference, so a fault that began just after a capture of something else (a noise burst
        that opened a window 7 steps before a real 3x slowdown, seen in CI) was learnt as normal
        before the cooldown ended and never captured. Instead, if the capture caught a rise the rule
        fired on (``_rise_in_progress``), it remembers the level the capture saw (``ack``) and fires again only on a rise
        beyond it, or on a new rise once the steps are back to normal; the acknowledged steps then
        become the reference as usual.

        The drift rule forgets its best window when the capture caught a rise in progress (spike or
        drift raised): the new level is then its reference. Otherwise (the burst that fired was over
        by the time the window opened, a person's capture, stalls) it keeps it, so a slowdown that
        starts just after such a capture is judged against the steps before it. Keeping it always
        tripled the drift captures of simulated healthy noisy jobs: the best of many noisy windows
        sinks with every window seen. The throughput rule keeps its window and forgets only its reference: a capture
        that opened on the first of a series of stalls (a spike) must not make the rule wait a whole
        new window before the next stalls can count. A capture the throughput rule opened
        acknowledges the share of time lost it saw instead, and that rule's window starts afresh
        (``_acknowledge_lost``)."""
        self.ack = self._acknowledged()
        self.settle = self.unacked = None   # what an earlier capture left to settle is this one's now
        self.held, self.far = None, False   # a step held back as a possible pause is the capture's now
        full = len(self.window) >= max(self.cfg.drift_window, 2)
        self.capture_level = self._drift_mean()[0] if full else None
        if self.ack is not None or self.over:
            self._forget_best_window()
        self.over = 0
        self.last_trigger = trigger
        if trigger == "throughput":
            self._acknowledge_lost()
        elif self.lost_ack is not None:
            self._restart_lost_window()   # the same holds after any capture while a share is acknowledged
        self.best_lost = None
        self.lost_over = 0
        self.stops = deque(maxlen=max(self.cfg.lost_window, 4))

    def _acknowledge_lost(self) -> None:
        """A capture the throughput rule opened: the share of time lost it saw (the highest of the
        latest shares judged) becomes the rule's reference, and a rank stopped in the rule's window
        votes no more for stops (``observe_all``); the rule's window starts afresh."""
        if self.lost_recent:
            seen = max(self.lost_recent)
            if self.lost_ack is None:
                # the lowest over the job's throughput captures, not the best since the last capture: after
                # another capture (a drift capture of noise) the best of the few windows since can hold one
                # more of a periodic job's pauses, and ordinary windows then read as "back to normal"
                best = self.best_lost or 0.0
                self.lost_base = best if self.lost_base is None else min(self.lost_base, best)
            elif seen - self.lost_ack >= self.cfg.lost_pct / 100.0:
                self.lost_retried = False   # a larger share than the one retried: it may be retried too
            self.lost_ack, self.lost_normal = max(self.lost_ack or 0.0, seen), 0
        self.stops_acked = self.stops_acked or sum(self.stops) >= MIN_STOPS
        self._restart_lost_window()

    def _restart_lost_window(self) -> None:
        """The throughput rule's window starts empty. The steps of a capture's window and of its
        summary's build are not judged, so a window that kept the steps before them spans more of the
        job than ``lost_window`` steps, and holds more of a periodic job's pauses than any window
        before it: 3 of a 0.5 s evaluation every 25 steps, 43% lost against the 28% the throughput
        capture saw (rank 0's recorded steps of that job, replayed with the unjudged steps left out),
        and a capture again at the next cooldown. Done while a share is acknowledged
        only: otherwise a capture that opened on the first of a series of stalls would make the rule
        wait a whole new window before the next stalls can count (``reset``)."""
        self.lost_window.clear()
        self.lost_sorted.clear()
        self.lost_sum = 0.0
        self.lost_recent.clear()

    def retry(self) -> None:
        """The last detector capture explained nothing (rank 0's analyst found no culprit): forget
        the level it acknowledged, so a slowdown that persists is captured again once the cooldown
        allows, instead of only when it grows 1.5x more or goes away and comes back. Called on rank 0
        only after an analysis (its vote alone makes the capture collective: the vote is a MAX), and
        on every rank when the capture was dropped for the job's own profiler (Trigger.gave_way)."""
        self.ack = None
        self.settle = None
        if self.last_trigger == "throughput" and not self.lost_retried:
            # once: the window may have missed the bursts. A second capture of the same share that
            # explains nothing makes it this job's own (a periodic evaluation every rank does alike)
            self.lost_ack, self.stops_acked, self.lost_retried = None, False, True
        if self.unacked is not None:   # what _settle() acknowledged for the drift rule, undone too
            self.window, self.best, self.over = self.unacked
            self.unacked = None

    def found_healthy(self) -> None:
        """Rank 0's analysis found the last drift capture healthy: no culprit, and the job's step no
        slower than in the baseline capture. The level the drift window was at as that capture
        started is then this job's noise, not a drift: for the next ``FLOOR_WINDOWS`` drift windows
        the rule judges against no less (``floor``), so the same level does not open capture after
        capture; then it goes back to its best window.

        Why: the best of many noisy windows sinks the longer a job runs, and on a host whose load
        wanders, windows ``drift_pct`` above it come back again and again. Two healthy 4-rank bench
        jobs of 3,000 steps on this 2-core VM (their windows' means wandered 40-57 ms) replayed
        through the trigger took 12 and 9 drift captures; each profiles a window and gathers a
        summary, and the default budget of 8 was spent by step ~1,200. Why for a while only: kept for
        good, a level found healthy in a noisy spell hid +10-20% job-wide slowdowns planted in the
        same replays 500-1,000 steps later (never captured in 6 of 40 cases); for 10 windows, none
        was missed, and the drift captures fell to 6 and 4 (scripts/bench/trigger_replay.py
        --verdicts). Live, three interleaved pairs of healthy 2,500-step bench jobs: 19 drift
        captures of noise before, 7 after (docs/bench-faults.md). Only drift captures: a spike's
        window opens on a burst, and the level its drift window held then says little about the
        job's noise.
        """
        if self.capture_level is not None:
            self.floor = max(self.floor or 0.0, self.capture_level) if self.floor_left else self.capture_level
            self.floor_left = FLOOR_WINDOWS * max(self.cfg.drift_window, 2)

    def _acknowledged(self) -> float | None:
        """The level the capture starting now saw, if it caught a rise (else None): one the spike
        rule fired on, or all but one of the latest steps above ``spike_ratio`` x the reference when
        the rule's p90 guard held it back (a slowdown that came back while the history still holds
        the first one's steps; the throughput rule caught it, and the spike rule captured the same
        slowdown again once those steps left its history)."""
        if self._rise_in_progress():
            return self.raise_level
        if self.reference > 0 and self.level > self.cfg.spike_ratio * self.reference:
            return self.level
        return None

    def learning(self) -> bool:
        """The spike rule has not yet seen the steps it needs for a reference (it judges nothing)."""
        return len(self.history) < max(10, self.cfg.spike_steps * 3)

    def _forget_best_window(self) -> None:
        """The drift rule starts over: the level a capture acknowledged is its new reference."""
        self.window = deque(maxlen=max(self.cfg.drift_window, 2))
        self.best = None

    def window_ended(self, window_ms: list[float]) -> None:
        """A detector capture's window ended with these (profiled) steps; the level it saw is settled
        once the rules have judged 2 x ``spike_steps`` more (``_settle``)."""
        if window_ms:
            self.window_level = sorted(window_ms)[(len(window_ms) - 1) // 2]
            self.settle = []

    def _settle(self, ms: float) -> None:
        """After a detector capture, acknowledge the level it saw, if it saw a rise: its window's
        median step and the mean of the first 2 x ``spike_steps`` steps judged after it both at least
        halfway to ``spike_ratio`` x the reference (1.25x by default). The level acknowledged is the
        window's median, but no more than that halfway factor over the steps after it (what is beyond
        is the profiler's), or what ``reset()`` acknowledged, if higher; when ``reset()``
        acknowledged nothing, the drift rule's best window is forgotten too, as ``reset()`` does for
        a rise, and kept aside for ``retry()``.

        ``reset()`` judges a rank's latest few steps as the capture starts. On a noisy job one rank
        can be between two slow steps there and acknowledge nothing (the demo, per rank: 92.6, 42.8
        ms against a 48 ms reference), or only the level its rule fired on early in the rise (75.8
        ms, then ~90): that rank then votes for the same slowdown again once the cooldown ends (the
        vote is a MAX: one such rank of four is enough). Why both: the window's steps are what the
        capture saw, but the profiler slows a CPU job's steps by up to 2x (the fault bench's compute
        case, 190 ms steps: 307-400 ms profiled), so a window can look like a rise that is not there,
        and a level acknowledged that high reads the slowdown as over at once; the steps after the
        window are unprofiled, but may hold a fault that began after it (a noise capture 5 steps
        before a real slowdown), which the capture never saw. Why the mean: the ranks step in
        lockstep, so the mean of a few steps is the job's pace on every rank, wherever each rank's
        boundary falls; a waiting rank's single steps swing between short and long (29-137 ms in the
        demo), and their median read a slowdown as none. Why halfway: a rank that only waits for the
        slow one can sit just under ``spike_ratio`` (the demo's rank 0: 1.45x) and cross it on every
        noisy stretch. A noise capture that opened just before a moderate slowdown may acknowledge it;
        its analysis finds nothing then, and ``retry()`` undoes it.
        """
        assert self.settle is not None
        self.settle.append(ms)
        if len(self.settle) < 2 * self.cfg.spike_steps:
            return
        after = sum(self.settle) / len(self.settle)
        self.settle = None
        ref, half = self.reference, 0.5 * (1.0 + self.cfg.spike_ratio)
        if ref <= 0 or self.window_level <= half * ref or after <= half * ref:
            return
        if self.ack is None:
            self.unacked = (self.window, self.best, self.over)
            self._forget_best_window()
            self.over = 0
        self.ack = max(self.ack or 0.0, min(self.window_level, half * after))

    def _rise_in_progress(self) -> bool:
        """Did the capture starting now catch a rise the spike rule fired on? It fired within the
        vote's lag (the capture is the answer to a vote cast that many steps ago) and all but one of
        the latest steps are still nearer that level than the reference. Not "fired on the very last
        step": one quick step among slow ones drops the rule for a step (the demo: 79, 105, 68, 36 ms
        against 47), the capture then acknowledged nothing, and the same slowdown was captured again
        as soon as the cooldown allowed."""
        if self.since_raise > self.cfg.vote_lag + self.cfg.spike_steps:
            return False
        return self.level > 0.5 * (self.reference + self.raise_level)

    def observe_all(self, ms: float, stops: int = 0) -> tuple[bool, bool, bool]:
        """Add one step (and the SIGCONTs this rank received in it); return (spike, drift, throughput).

        Throughput fires on lost time, or as soon as this rank was stopped and continued twice within
        the rule's window: a stopped process is the one case the step clock sees directly, and on a
        noisy host a 250 ms stop a second moves the lost-time share by only a few points; once a
        throughput capture saw the rank stopped, again only after a whole window without a stop. While the
        level the last capture saw is being settled (``_settle``), the rules judge but do not vote:
        the slowdown that capture saw would otherwise fire them again."""
        settling = self.settle is not None
        if settling:
            self._settle(ms)
            settling = self.settle is not None
        spike, drift = self.observe(ms)
        self.stops.append(stops)
        if self.stops_acked and len(self.stops) == self.stops.maxlen and not sum(self.stops):
            self.stops_acked = False
        lost = self._lost(ms) or (sum(self.stops) >= MIN_STOPS and not self.stops_acked)
        if settling:
            return False, False, False
        return spike, drift, lost

    def _lost(self, ms: float) -> bool:
        cfg = self.cfg
        if cfg.lost_pct <= 0:
            return False
        n = max(cfg.lost_window, 4)
        self.lost_window.append(ms)
        bisect.insort(self.lost_sorted, ms)
        self.lost_sum += ms
        if len(self.lost_window) > n:
            old = self.lost_window.popleft()
            del self.lost_sorted[bisect.bisect_left(self.lost_sorted, old)]
            self.lost_sum -= old
        if len(self.lost_window) < n or self.ack is not None:
            # while a captured rise lasts, the window holds two levels: the slow steps of a step change
            # crossing it would read as lost time and capture the same slowness again
            self.lost_over = 0
            return False
        ordered = self.lost_sorted
        median = 0.5 * (ordered[(n - 1) // 2] + ordered[n // 2])
        # the longest step is left out: one stall (a checkpoint, a one-off collection) is no pattern
        total = self.lost_sum - ordered[-1]
        # not below 0: steps faster than the median (the last of a faster level still in the window)
        # are no gain, and a negative best would make the next ordinary window look like a loss
        lost = max(0.0, 1.0 - median * (n - 1) / total) if total > 0 else 0.0
        self.lost_recent.append(lost)
        if self.best_lost is None or lost < self.best_lost:
            self.best_lost = lost
        reference = self.best_lost
        if self.lost_ack is not None and self._lost_ack_stands(lost):
            reference = max(reference, self.lost_ack)
        self.lost_over = self.lost_over + 1 if lost - reference >= cfg.lost_pct / 100.0 else 0
        return self.lost_over >= max(1, cfg.lost_window // 8)

    def _lost_ack_stands(self, lost: float) -> bool:
        """Judge one more step's share against the one a throughput capture saw, and say whether
        that share is still the rule's reference: it is until a whole window's steps in a row were
        nearer the best window before that capture than to it (the stalls went away); then it is
        forgotten.

        Why: the share lost to a job's own periodic pauses swings with how many of them the window
        holds. A 4-rank job that evaluated for 0.5 s every 25 steps (28 ms steps, window 48) lost
        1-3% in windows with one pause (the longest step is left out) and ~29% in windows with two,
        23 steps of every 25; the rule's reference, the best window since the last capture, sat at
        the low end, so it fired soon after every capture's cooldown: 6 captures found healthy in
        600 steps, which spent the capture budget a real slowdown would need."""
        assert self.lost_ack is not None
        self.lost_normal = self.lost_normal + 1 if lost < 0.5 * ((self.lost_base or 0.0) + self.lost_ack) else 0
        if self.lost_normal >= max(self.cfg.lost_window, 4):
            self.lost_ack, self.lost_retried = None, False
        return self.lost_ack is not None

    def observe(self, ms: float) -> tuple[bool, bool]:
        """Add one step to the spike and drift rules; return (spike, drift)."""
        return self._spike(ms), self._drift(ms)

    def _spike(self, ms: float) -> bool:
        """The spike rule on one step; a step ``PAUSE_RATIO`` x the reference is held back and judged
        with the next one: if that one is well above a spike too (2 x ``spike_ratio`` x), both count
        (a huge rise, or a burst that starts with its longest step: gc-int's 765 ms, then 234, 174,
        ... against 52); if not, the long step was a pause between ordinary steps (rank 0 writing a
        checkpoint while the others wait, an evaluation, a one-off hiccup) and is left out, and the
        steps after it are judged on their own. Why: "all but one of the last ``spike_steps`` steps
        slow" let a 12 s checkpoint fill one of the 4 places, and two noisy 1.55x steps after it on
        one rank of a healthy 4-rank job (8 ms steps) made a spike vote; its capture named the
        checkpointing rank "compute"."""
        far = ms > 2 * self.cfg.spike_ratio * self.reference
        if self.held is not None:
            held, self.held = self.held, None
            if far:
                self._judge(held)
        elif self.reference > 0 and not self.learning() and not self.far and ms > PAUSE_RATIO * self.reference:
            self.held, self.far = ms, True
            self.raised = False
            self.since_raise += 1
            return False
        self.far = far
        return self._judge(ms)

    def _judge(self, ms: float) -> bool:
        cfg = self.cfg
        if len(self.recent) == self.recent.maxlen and not self.raised:
            # a rise nobody captured yet stays out of the reference: otherwise a rise the cooldown or
            # the budget holds back would become "normal" before a capture may start
            self.history.append(self.recent[0])
        self.recent.append(ms)
        self.tail.append(ms)
        self.raised = False
        if self.learning():
            return False
        history = sorted(self.history)
        reference = self.reference = history[len(history) // 2]
        p90 = history[int(0.9 * (len(history) - 1))]
        recent = sorted(self.recent)
        latest = self.level = recent[1] if len(recent) > 2 else recent[0]
        if self.ack is not None:
            # back to normal (all but one of the last 2 x spike_steps steps nearer the reference than
            # the captured level), or the reference has caught up: the captured level is history. Not
            # judged on spike_steps alone: on a noisy job (the demo's steps, 75 +- 15 ms against 45
            # before) three of four slow steps dip under the midpoint once in ~50 steps, and the
            # same slowdown was captured again and again
            tail = sorted(self.tail)
            upper = tail[-2] if len(tail) > 1 else tail[-1]
            if (len(tail) == self.tail.maxlen and upper <= 0.5 * (reference + self.ack)) or reference >= self.ack:
                self.ack = None
        # all but one of the recent steps well above the typical step AND above what this job's own
        # noise reaches one step in ten: a burst of noise does not fire, one dip does not hide; and
        # above what the last capture already saw
        self.raised = (latest > cfg.spike_ratio * reference and latest > p90
                       and (self.ack is None or latest > cfg.spike_ratio * self.ack))
        if self.raised:
            self.raise_level, self.since_raise = latest, 0
        else:
            self.since_raise += 1
        return self.raised

    def _drift_mean(self) -> tuple[float, float]:
        """The drift window's mean with its top 10% trimmed, and that mean's standard error."""
        ordered = sorted(self.window)
        kept = ordered[: max(1, int(len(ordered) * 0.9))]
        mean = sum(kept) / len(kept)
        var = sum((x - mean) ** 2 for x in kept) / max(1, len(kept) - 1)
        return mean, (var / len(kept)) ** 0.5

    def _drift(self, ms: float) -> bool:
        cfg = self.cfg
        if cfg.drift_pct <= 0:
            return False
        self.window.append(ms)
        if len(self.window) < max(cfg.drift_window, 2):
            return False
        mean, stderr = self._drift_mean()
        if self.best is None or mean < self.best:
            self.best = mean
        ref = self.best
        if self.floor_left:
            self.floor_left -= 1
            ref = max(ref, self.floor or 0.0)
        # drift_pct above the best window, and beyond what the window's own noise explains (the best
        # of many noisy windows is biased low by a few standard errors)
        margin = max(ref * cfg.drift_pct / 100.0, 3.0 * stderr)
        self.over = self.over + 1 if mean - ref > margin else 0
        return self.over >= max(1, cfg.drift_window // 2)


class Trigger:
    """Schedules captures: deterministic ones (baseline, --capture-at-steps) and voted ones."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.detector = Detector(cfg)
        self.manual_pending = False
        self.budget = Budget(cfg.max_captures, cfg.capture_refill_steps)
        self.profiled_steps = 0
        self.last_capture_start: int | None = None
        self.busy_until = -1          # no voted capture starts before this step (its votes saw the window)
        self.window_until = -1        # last step of the current window: nothing starts before it ends
        # the baseline's lead-in step; a baseline held back by the job's own profiler (or whose window
        # gave way to it) comes as soon as it is off (baseline_late), one missed otherwise does not
        self.baseline_step = cfg.warmup_steps + 2 if cfg.baseline else None
        self.baseline_due = cfg.baseline
        self.baseline_late = False
        self.window_trigger = ""      # the current (or last) window's trigger, and its profiled steps
        self.window_ms: list[float] = []
        # a person's request (SIGUSR1, the trigger file) or a --capture-at-steps step that came while a
        # window was open waits for it to end instead of being dropped; agreed like everything here
        self.manual_waiting = False
        self.scheduled = sorted(set(cfg.capture_at_steps))
        self.refused = Refused()
        self.said: list[Refusal] = []   # what the budget refused, for rank 0 to say
        self.said_since_capture = False   # a refused slowdown is said once until a capture is taken again
        self.held: list[int] = []   # first steps of the drift captures found healthy this rank applied
        self.quiet_until = -1   # no rule judges a step up to this one, nor is the baseline taken before (hold)

    def relearn(self, step: int) -> None:
        """What a step is changed from step ``step`` on (the step clock counts at an optimizer now,
        after backward()s or batches: stepclock.ADOPT_AFTER): the rules learn the new steps' pace
        afresh instead of taking it for a slowdown (a pass over the data before training) or a
        recovery, and the baseline is taken again after a new warm-up: one taken in an evaluation
        before the training would be the reference every later capture is compared with."""
        self.detector = Detector(self.cfg)
        if self.cfg.baseline:   # never inside a hold
            self.baseline_step = max(step + self.cfg.warmup_steps, self.quiet_until) + 2
            self.baseline_due, self.baseline_late = True, False

    def hold(self, until: int) -> None:
        """No rule judges a step up to ``until``, nor is the baseline taken before it (a person's or a
        scheduled capture still is): until then the runtime looks for the job's first collective
        (runtime._check_synchronised), and a window meanwhile would compare ranks that may have waited
        only for eroica's vote. The rules learn the job's pace from there."""
        self.quiet_until = max(self.quiet_until, until)
        if self.baseline_step is not None and self.baseline_due and not self.baseline_late:
            self.baseline_step = max(self.baseline_step, until + 2)

    # ---- local side ----------------------------------------------------------------------------------
    def local_flags(self, step: int, ms: float, in_window: bool, stops: int = 0, unjudged: bool = False) -> np.ndarray:
        """This rank's vote for the step that just ended: [spike, drift, manual, throughput]
        (``stops``: SIGCONTs this rank received in that step). ``unjudged``: a step that says nothing
        about the job's pace (the job's own profiler was on, a DataLoader began an epoch): no rule
        sees it, not even while judging without voting after a window."""
        flags = np.zeros(len(REASONS), dtype=np.int64)
        if self.manual_pending:
            flags[2] = 1
            self.manual_pending = False
        if step < self.cfg.warmup_steps or step <= self.quiet_until:
            return flags
        if in_window or step <= self.busy_until:
            if step > self.window_until and (self.window_trigger == "baseline" or self.detector.learning()):
                # after the baseline's window, while its summary is built and gathered: judged, never
                # voted on (the build's slices disturb the votes). The rules have only the one or two
                # steps before the window to go on: skipping these too left the spike rule without a
                # reference for 12 more steps, and a slowdown starting in them became the reference
                # (a slow link from step 55, the baseline at 28 built until step 47: never captured).
                # The same after any capture that comes while the spike rule still learns its
                # reference: a person's capture right after the baseline (--capture-at-steps 14) left
                # it a few steps, and a fault from step 40 was the job's "normal" by step 54
                if not unjudged:
                    self.detector.observe_all(ms, stops)
            else:
                self._in_window(step, ms, unjudged)
            return flags
        if unjudged:
            return flags
        spike, drift, lost = self.detector.observe_all(ms, stops)
        flags[0], flags[1], flags[3] = int(spike), int(drift), int(lost)
        return flags

    def _in_window(self, step: int, ms: float, unjudged: bool = False) -> None:
        """Collect a detector capture's profiled steps (an epoch's turnover in it is not its level); at
        its last, tell the detector what it saw."""
        if self.window_trigger not in DETECTED or self.last_capture_start is None:
            return
        if self.last_capture_start < step <= self.window_until:   # the lead-in step is not the window's
            if not unjudged:
                self.window_ms.append(ms)
            if step == self.window_until:
                self.detector.window_ended(self.window_ms)

    # ---- agreed side (identical on every rank) -----------------------------------------------------
    def window_for(self, trigger: str) -> int:
        """Steps profiled for a capture of this kind."""
        return self.cfg.burst_window_steps if trigger == "throughput" else self.cfg.window_steps

    def _allowed(self, start: int, k: int) -> bool:
        cfg = self.cfg
        if not self.budget.available(start):
            return False
        if start <= self.busy_until:
            return False
        if self.last_capture_start is not None and start - self.last_capture_start < cfg.cooldown_steps:
            return False
        # the first capture a detector asks for is always allowed (the baseline does not count): a
        # short job must not lose its one diagnosis to the share cap
        return self.profiled_steps == 0 or (self.profiled_steps + k) <= max(k, cfg.max_profiled_fraction * start)

    def requested(self) -> None:
        """A person's request was voted while a window is open (the runtime does not call ``decide``
        then): it waits for the window to end. Called on every rank with the same vote."""
        self.manual_waiting = True

    def found_healthy(self, first_step: int) -> None:
        """Rank 0's analysis found the detector capture whose window began at ``first_step`` healthy
        (``Detector.found_healthy``). Called on every rank with the same vote, so every rank's drift
        rule learns it at the same step; ignored unless that is still the latest capture and the
        drift rule opened it (a verdict that arrives after the next capture started is about a level
        that capture replaced)."""
        if (self.last_capture_start is not None and first_step == self.last_capture_start + 1
                and self.window_trigger == "drift"):
            self.detector.found_healthy()
            self.held.append(first_step)

    def gave_way(self, trigger: str) -> None:
        """A capture of this kind was dropped: its window gave way to the job's own profiler on some
        rank (runtime._gather_pending; every rank at the same boundary). The baseline and a
        person's request are taken again once the profiler is off; a slowdown still there is voted for
        again: the detector forgets the level the dropped capture acknowledged (``Detector.retry``;
        it did not, and a job whose own profiler cycled every 13 steps had the spike at its step 128,
        rank 2's extra matmuls from 120, given way and never captured again). Its budget stays
        spent: a job whose profiler keeps taking eroica's windows costs at most the budget's captures."""
        if trigger == "baseline" and self.baseline_step is not None:
            self.baseline_due = self.baseline_late = True
        elif trigger == "manual":
            self.manual_waiting = True
        elif trigger in DETECTED:
            self.detector.retry()

    def _due(self, start: int) -> bool:
        """A --capture-at-steps step this capture (lead-in ``start``) reaches: its own, or one an open
        window held back (taken late rather than never)."""
        return bool(self.scheduled) and self.scheduled[0] <= start + 1

    def _answered(self, start: int) -> None:
        """The waiting request and every scheduled step up to this capture are answered (taken or refused)."""
        self.manual_waiting = False
        while self._due(start):
            self.scheduled.pop(0)

    def decide(self, step: int, voted: np.ndarray | None, held: bool = False) -> Decision | None:
        """At the boundary after ``step``: does a capture start at step+1? Same answer on all ranks.

        ``start_step`` is the capture's lead-in step; the profiled window is the K steps after it.
        ``held``: the job's own profiler was on (the vote says, on some rank): nothing starts, as two
        profilers cannot run in one process; the baseline, a person's request and a scheduled step
        wait for it to stop, and a slowdown still there then is captured then.
        """
        start = step + 1
        trigger = None
        if voted is not None and voted[2]:
            self.manual_waiting = True
        base = self.baseline_step
        if held:
            if self.baseline_due and base is not None and start >= base:
                self.baseline_late = True
            return None
        asked = self.manual_waiting or self._due(start)
        if self.baseline_due and base is not None and (start == base or (self.baseline_late and start > base)):
            trigger = "baseline"
        elif asked:
            trigger = "manual"
        elif voted is not None and voted.any():
            trigger = "spike" if voted[0] else "drift" if voted[1] else "throughput"
            settled = max(self.cfg.warmup_steps, self.baseline_step or 0)  # never before the baseline
            if start <= settled:
                return None
            if not self._allowed(start, self.window_for(trigger)):
                if not self.budget.available(start):
                    self._refuse(start + 1, trigger)
                return None
        if trigger is None:
            return None
        # a person's or the schedule's capture waits only for the window in progress, not for the
        # vote lag after it (that guards the detectors against judging profiled steps), and is not
        # held back by cooldown or budget share; the budget itself refuses it (said, not dropped)
        if trigger in ("baseline", "manual"):
            if start <= self.window_until:
                return None
            if not self.budget.available(start):
                if trigger == "manual":
                    self._answered(start)
                    self._refuse(start + 1, "request")
                return None
        if trigger == "manual":
            self._answered(start)
        if trigger == "baseline":
            self.baseline_due = False
        k = self.window_for(trigger)
        self.budget.spend(start)
        self.said_since_capture = False
        if trigger != "baseline":
            self.profiled_steps += k + 1  # the window and its lead-in step
        self.last_capture_start = start
        self.window_trigger, self.window_ms = trigger, []
        # lead-in, window and vote lag: votes cast inside the window are about profiled steps
        self.window_until = start + k
        self.busy_until = self.window_until + 1 + self.cfg.vote_lag
        if trigger != "baseline":
            self.detector.reset(trigger)
        return Decision(start, trigger, k)

    def _refuse(self, step: int, what: str) -> None:
        """The budget refused a capture whose window would have begun at ``step``: counted (a slowdown
        once, however many consecutive steps it keeps voting) and queued in ``said`` every time for a
        person's request, and for a slowdown the first time since a capture was last taken (once the
        budget is spent, that is: again after a capture came back and went)."""
        r = self.refused
        first = r.first_step if r.first_step is not None else step
        refusal = Refusal(step, what, self.budget.next_back())
        if what == "request":
            self.refused = Refused(r.slowdowns, r.requests + 1, first, step)
            self.said.append(refusal)
            return
        new = not r.slowdowns or r.last_step != step - 1
        self.refused = Refused(r.slowdowns + int(new), r.requests, first, step)
        if not self.said_since_capture:
            self.said_since_capture = True
            self.said.append(refusal)

    def take_said(self) -> list[Refusal]:
        """What the budget refused since the last call (rank 0 prints it)."""
        out, self.said = self.said, []
        return out


@dataclass(frozen=True)
class Refusal:
    """A capture the budget refused, for rank 0's line: the step its window would have begun at,
    what asked for it ("request" or the detector's rule), and the step the budget gets one back at
    (None: never, --capture-refill-steps 0)."""

    step: int
    what: str
    back_at: int | None


@dataclass(frozen=True)
class Refused:
    """Captures the budget (--max-captures) refused: slowdowns the detectors voted for (a run of
    consecutive voting steps counts once), people's requests, and the first and latest step."""

    slowdowns: int = 0
    requests: int = 0
    first_step: int | None = None
    last_step: int | None = None

    def to_json(self) -> dict[str, int | None]:
        return {"slowdowns": self.slowdowns, "requests": self.requests, "first_step": self.first_step}
