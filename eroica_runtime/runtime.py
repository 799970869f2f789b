"""The online chain on one rank: step clock -> trigger/vote -> capture window -> summary -> gather.

Everything here runs inside the step boundary on the training thread, so the steady state is a few
microseconds (clock, detector, one nonblocking vote). Any exception is caught, logged once, and
switches eroica off on this rank; the training carries on.

A window's close is spread over the steps after it: the closing boundary only stops the profiler;
the summary is built a slice at a time (at most ``_slice_s()`` per boundary) on this same thread,
which holds the data and needs no lock and no GIL hand-over; each rank says in its vote whether its
summary is still being built, and the gather runs at the first boundary whose vote says every rank
is done, the same boundary on every rank (the gather is collective over the side channel).
"""

from __future__ import annotations

import atexit
import itertools
import os
import signal
import socket
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from eroica_runtime import __version__, errorfile, lateness, reportdir, telemetry
from eroica_runtime import summary as summary_mod
from eroica_runtime.agreement import Agreement
from eroica_runtime.capture import Capture, JobProfilers
from eroica_runtime.config import Config
from eroica_runtime.engine import imbalance, longsteps, timelost
from eroica_runtime.gather import gather_capture, gather_job_end
from eroica_runtime.memwatch import MemoryWatch
from eroica_runtime.pgkeeper import REFRESH_EVERY, GroupKeeper
from eroica_runtime.sidechannel import DeadlineMissed, SideChannel, Vote, leave_mpi
from eroica_runtime.signals import Signals, describe
from eroica_runtime.stepclock import StepClock
from eroica_runtime.summary import rawevents
from eroica_runtime.trigger import Trigger

TRIGGER_FILE_EVERY_S = 1.0
HISTORY_STEPS = 32   # steps before a window shipped in its summary (~0.9 KB)
# a job in which no collective ran from the end of this step to the end of its warm-up (cfg.warmup_steps, at
# least the step after this one) is one eroica stands down for: its ranks never wait for each other, and
# its vote at every step makes them (_check_synchronised)
UNSYNCED_FROM = 1
# ... unless a process group exists: then it is judged again at this step before eroica stands down (a
# local-SGD job's ranks meet every few steps, and wait for the slowest then)
UNSYNCED_LONGEST = 32
# Deferred work (a summary being built) per step boundary: up to 20 ms, or 20% of the job's median
# step where that is more, and never more than half a step. A 50 ms step gets 20 ms slices (the 50 ms
# a closing step may add is the ceiling for any step; the ~0.4-0.7 s of a summary take ~30 steps,
# ~2 s); steps from 0.1 s up get a fifth of a step, so a build of W seconds is gathered ~6·W seconds
# after the window whatever the step (~3.6 s for 0.6 s), not 30 long steps later (half a minute at
# 1 s a step), at +20% for those few steps; a 2 ms floor keeps a very fast job from taking thousands
# of steps. The closing boundary counts the profiler's stop against the same budget.
SLICE_SHARE = 0.5
SLICE_MIN_S = 0.002
SLICE_FLAT_S = 0.020
SLICE_LONG_SHARE = 0.2


def slice_budget_s(median_step_s: float) -> float:
    """Seconds of deferred work allowed at one step boundary of a job with this median step."""
    return max(SLICE_MIN_S, min(SLICE_SHARE * median_step_s, max(SLICE_FLAT_S, SLICE_LONG_SHARE * median_step_s)))


# The vote: the trigger's flags (trigger.REASONS), then these, each reduced with MAX over the ranks.
HEALTHY = 0      # rank 0's verdict: the first step of a detector capture its analysis found healthy
BUILDING = 1     # "my summary is still being built"
PROFILER_HI = 2  # the job's own profiler is on here: rank + 1 (MAX: the highest such rank)
PROFILER_LO = 3  # ... world size - rank (MAX: the lowest such rank)
GAVE_HI = 4      # this rank's open or pending window gave way to the job's profiler: rank + 1
GAVE_LO = 5      # ... world size - rank
VOTE_TAIL = 6


def ranks_text(hi: int, lo: int, size: int) -> str:
    """The ranks a pair of MAX-reduced (rank + 1, size - rank) votes speaks for: "rank 3", or the
    lowest and highest of several ("ranks 0..3", some or all of those between)."""
    first, last = size - lo, hi - 1
    return f"rank {last}" if first == last else f"ranks {first}..{last}"


@dataclass
class _Pending:
    """A closed window whose summary is being built, a slice per step boundary, until the gather."""

    first: int                  # the window's first step (names the capture)
    trigger: str
    close_step: int             # the step whose boundary closed the window
    build: summary_mod.Resumable[dict[str, Any]]
    probe: dict[str, Any] | None = None   # rank 0: the link probe run as the window opened
    gave_way: str = ""          # the window gave way to the job's own profiler on this rank: nothing to send
    # when this rank made each of the HISTORY_STEPS steps' last collective before the window, and the
    # all-reduce of the earliest of those (_post_arrivals)
    arrivals: tuple[np.ndarray, Vote] | None = None


def _no_summary() -> summary_mod.resumable.Steps[dict[str, Any]]:
    """The build of a window that gave way to the job's profiler: nothing (done at once)."""
    return {}
    yield  # a generator, like every build


class Runtime:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.enabled = False
        self.rank = int(os.environ.get("RANK", "0"))
        self.report_dir = cfg.report_dir or os.path.abspath("eroica-report")
        self.side: SideChannel | None = None
        self.gc = telemetry.GcMonitor()
        # GC pauses inside eroica's own boundary work (collections its summary building set off) are
        # not the training's: the step clock's per-step GC ms leaves them out, as it does the time
        self._own_gc_ms = 0.0
        self.throttle = telemetry.ThrottleClock()
        self.clock = StepClock(self._on_boundary, gc_ms=lambda: self.gc.snapshot()[1] - self._own_gc_ms,
                               throttled_ms=self.throttle.read, long_from=cfg.warmup_steps + 1)
        self.trigger = Trigger(cfg)
        # this rank's anonymous memory every few seconds: a leak is said before the OOM killer ends it
        self.memwatch = MemoryWatch(cfg.warmup_steps, telemetry.memory_room_mb, cfg.memory_sample_s)
        self.job_profilers = JobProfilers()
        self.capture = Capture(self.job_profilers)
        # steps the job's own profiler was on somewhere (voted), the first of them and on which ranks
        self._job_profiler: dict[str, Any] = {}
        self.pg_keeper = GroupKeeper()
        self.votes: deque[tuple[int, Any]] = deque()
        self.analyst: Any = None
        self.groups: list[dict[str, Any]] = []
        self._window: dict[str, Any] = {}
        self._pending: _Pending | None = None
        self._raw_failed = False   # EROICA_KEEP_RAW_EVENTS: a failed write was said once
        self._quiet_until = -1   # steps up to this one are eroica's own disturbance: detectors skip them
        self.clock.disturbed = self._disturbed
        self.clock.on_counted_at = self._counted_at
        self.clock.adopt_gate = self._adopt_gate
        self.clock.switch_gate = self._switch_gate
        # where steps are counted, changed by every rank at once: "adopt" (at backward()s or batches),
        # "switch" (another optimizer)
        self._agreements: dict[str, Agreement] = {}
        # the Flight Recorder's count of collectives when steps were first asked to be counted at backward()s
        # or batches (_adopt_gate), and where that loop was found to have none ("batch", "backward"; then
        # never asked again, and the job summary says so)
        self._collectives_at_ask: int | None = None
        self._collectives_from: int | None = None   # the same at step UNSYNCED_FROM (_check_synchronised)
        self._unsynced_until = max(cfg.warmup_steps, UNSYNCED_FROM + 1)   # ... and the step it is judged at
        self._unsynced: str | None = None
        self.clock.on_error = self._disable
        self._next_file_check = 0.0
        self._own_s = 0.0
        self._started_s = time.time()   # wall clock at the runtime's start, near the interpreter's: launchskew.py
        self._peer_wait_s = 0.0   # of this boundary's time, the wait for the other ranks' votes
        self._windows: list[tuple[int, int]] = []   # every capture's (first step, k): profiled steps
        # every gathered capture's (first, last) steps after its window: the summary's build and gather
        self._deferred: list[tuple[int, int]] = []
        # autograd anomaly detection seen on at a window's close (the job-end statistics': Lightning's
        # Trainer(detect_anomaly=True) turns it off again when fit() returns, before the job's end)
        self._anomaly_seen = 0
        self._job_end_done = False
        self.watchdog: Any = None
        self._world_broken = False   # a peer missed a deadline: never wait for it again
        self._flush_requested = threading.Event()
        self._signals_before: dict[int, Any] = {}
        self.signals: Signals | None = None

    # ---- lifecycle -------------------------------------------------------------------------------------
    @classmethod
    def start(cls, signals_before: dict[int, Any] | None = None) -> Runtime:
        """``signals_before``: what SIGUSR1/SIGUSR2 had before agent.bootstrap ignored them while
        the runtime starts (what the job is told they have while eroica's handlers are in)."""
        rt = cls(Config.from_env())
        rt._signals_before = dict(signals_before or {})
        rt._install()
        return rt

    def _install(self) -> None:
        from eroica_runtime.sidechannel import SideChannelError

        try:
            self.side = SideChannel(self.cfg.deadline_s)
        except SideChannelError as exc:
            self._warn(f"off on this rank: {exc}; training continues without eroica")
            # MPI may be up: a healthy rank must still finalize it at exit (see _at_exit)
            atexit.register(lambda: leave_mpi(failing=errorfile.leaving_early()))
            return
        self.rank = self.side.rank
        atexit.register(self._at_exit)   # from here on, whatever happens, exit goes through _at_exit
        # rank 0 needs its report directory; every rank learns at once whether it has it, so that
        # nobody waits a deadline for a rank 0 that switched itself off
        usable, why = True, ""
        if self.rank == 0:
            try:
                reportdir.ensure_directory(self.report_dir)
                earlier = reportdir.set_aside_earlier_job(self.report_dir)
            except OSError as exc:
                usable, why = False, f"report directory {self.report_dir}: {exc.strerror or exc}"
            else:
                if earlier is not None:
                    from eroica_runtime.analyst import say

                    say(f"eroica: {self.report_dir} held the reports of an earlier job (or attempt): moved to {earlier}")
        try:
            everyone = self.side.agree(usable, self.cfg.deadline_s, "start-up agreement")
        except SideChannelError as exc:
            self._world_broken = True
            self._warn(f"off on this rank: {exc}; training continues without eroica")
            return
        if not everyone:
            self._warn(f"off on every rank: {why or 'rank 0 cannot write its report directory'}; "
                       "training continues without eroica")
            return
        self.capture.warm_up()
        self.job_profilers.before_start = self._job_profiler_starts
        self.job_profilers.install()
        self.gc.install()
        self.clock.install()
        self._record_groups()
        self._install_signals()
        os.register_at_fork(after_in_child=self._forked_child)
        if self.rank == 0:
            from eroica_runtime.analyst import Analyst

            self.analyst = Analyst(self.report_dir, self.side.size, self.cfg.topology,
                                   keep_captures=self.cfg.keep_captures)
            self.analyst.history_source = lambda: self.clock.all_ms[:]   # a copy: see StepClock.all_ms
            self.analyst.time_lost_source = self._time_lost
            # a report.json from the start: a job cancelled at any moment leaves one (rewritten
            # after every capture and at job end)
            self.analyst.write_job(steps=0, job={"partial": True}, history=[])
            threading.Thread(target=self._flush_loop, name="eroica-flush", daemon=True).start()
        if self.side.thread_multiple:
            from eroica_runtime.hang import DEFAULT_FLOOR_S, Watchdog

            self.watchdog = Watchdog(
                self.side, step_times=lambda: [m for _, m in self.clock.durations],
                warmup_steps=self.cfg.warmup_steps, report_dir=self.report_dir, factor=self.cfg.hang_factor,
                floor_s=self.cfg.hang_timeout_s or DEFAULT_FLOOR_S, action=self.cfg.hang_action,
                deadline_s=self.cfg.deadline_s, warn=self._warn,
                on_diagnosis=self.analyst.add_hang if self.analyst is not None else None)
            self.watchdog.start()
            self.clock.where = self.watchdog.sampled
        else:
            self._warn("MPI gives no MPI_THREAD_MULTIPLE: the hang watchdog is off")
        self.side.before_job_finalize(self._at_exit)   # a job that finalizes MPI itself ends eroica's job there
        self.enabled = True

    def _warn(self, msg: str) -> None:
        print(f"[eroica rank {self.rank}] {msg}", file=sys.stderr, flush=True)

    def _disable(self, why: str, *, quiet: bool = False) -> None:
        """Switch eroica off on this rank (once), leaving the training untouched; ``quiet``: every rank
        does so at once, and rank 0 has said why for all of them."""
        if not self.enabled:
            return
        self.enabled = False
        if not quiet:
            self._warn(f"off on this rank: {why}; training continues")
        self._pending = None
        self.capture.abandon()
        self.job_profilers.uninstall()
        self.clock.uninstall()
        self.throttle.close()
        self.memwatch.close()
        if self.watchdog is not None:
            self.watchdog.stop()

    def _job_profiler_starts(self) -> None:
        """The job's own profiler is about to start (JobProfilers, on the thread starting it): an
        open window gives way to it first, as two cannot run at once (capture.py)."""
        if self.enabled and self.capture.active:
            self.capture.give_way(f"the job's own profiler started in step {self.clock.step}")

    def _forked_child(self) -> None:
        """A fork()ed DataLoader worker inherits this object: it must never vote, profile or use MPI."""
        self.enabled = False
        self.side = None
        self.analyst = None

    # ---- per step ----------------------------------------------------------------------------------------
    def on_step(self) -> None:
        """mark_step(): a step boundary set by the user's loop."""
        self.clock.safely(self.clock.mark)

    def _on_boundary(self, step: int, ms: float) -> float:
        """eroica's work at a step boundary; returns the seconds of it spent waiting for the other
        ranks' votes, which the step clock counts into the job's next step (runtime._wait_vote)."""
        if not self.enabled:
            return 0.0
        if self.watchdog is not None:
            self.watchdog.progress(step)
        t0 = time.perf_counter()
        gc0 = self.gc.snapshot()[1]
        self._peer_wait_s = 0.0
        try:
            self.capture.own_begin()   # in a window: this time is eroica's, not the step's (capture.py)
            self._boundary(step, ms, t0)
            leak = self.memwatch.sample(step, time.monotonic(), self._typical_step_ms)
            if leak:
                self._warn(leak)
            self.capture.own_end()
        except DeadlineMissed as exc:
            self._world_broken = True
            self._disable(str(exc))
        except Exception as exc:
            self._disable(f"internal error at step {step}: {type(exc).__name__}: {exc}")
        self._own_gc_ms += self.gc.snapshot()[1] - gc0
        self._own_s += time.perf_counter() - t0 - self._peer_wait_s
        return self._peer_wait_s

    def _typical_step_ms(self) -> float | None:
        recent = list(self.clock.all_ms[-64:])
        return statistics.median(recent) if recent else None

    def _disturbed(self, step: int) -> bool:
        """Eroica's own work held step ``step`` up on some rank, so none of its times are the job's
        alone: a capture's lead-in (the link probe) and window, a summary being built (every rank slices,
        the slowest rank's last slices make the others wait) and, as after a window, vote_lag + 1 steps
        after the gather (rank 0's analyst starts there). Every rank answers alike (agreed steps)."""
        return self.capture.active or self._pending is not None or step <= self._quiet_until

    def _check_synchronised(self, step: int, until: int) -> bool:
        """Whether eroica stands down for the job at this step: no collective ran on this rank after
        step UNSYNCED_FROM up to step ``until``, the warm-up's end (hang.collectives_recorded; nothing
        is judged where it cannot say). Every rank runs the same loop, so every rank stands down at
        this same boundary, and no vote is left for one alone; before the baseline capture, whose
        window would compare ranks that waited only for eroica's vote (at step 48, as first built, the
        baseline had named the slower rank for the other's wait). Where a process group exists, a
        warm-up without a collective is looked at again at step UNSYNCED_LONGEST, no rule judging and no
        baseline taken meanwhile (Trigger.hold): a local-SGD job whose ranks average every 16 steps
        waits for the slowest at every meeting, and is watched from there; the vote holds its ranks
        together between meetings too, which its ranks' own jitter pays for (3 ranks, 200 steps of ~9
        ms: 1.87-2.02 s a rank with no capture against 1.62-1.95 under torchrun; docs/benchmarks.md
        §23). One meeting less often is left too, and told that --warmup-steps above its period keeps
        it watched. Ranks with no process group are left at the warm-up's end (their cost: 10 steps at
        the slowest rank's pace, 32 with a group). Not asked of a job of one rank, whose vote waits for
        nobody.

        Why: eroica's vote at every step waits for every rank's, vote_lag steps later. Ranks that never
        wait for each other (each training a model of its own: a sweep or an ensemble launched as one
        job) then wait for each other in the vote instead: two ranks training 300 steps of 10 and 20 ms
        alone took 3.3 and 6.4 s under torchrun and 6.5 and 6.5 s under eroica-run, whose report named
        the slower rank for the faster one's wait. Their pace is their own: there is no slowest rank
        that every rank waits for to find."""
        from eroica_runtime.hang import collectives_recorded

        if step == UNSYNCED_FROM:
            self._collectives_from = collectives_recorded()
            return False
        if step != until or self._collectives_from is None:
            return False
        if collectives_recorded() != self._collectives_from:
            return False
        import torch.distributed as dist

        group = dist.is_available() and dist.is_initialized()
        if group and step < UNSYNCED_LONGEST:
            # its ranks may meet less often than the warm-up (local SGD): look until UNSYNCED_LONGEST, with
            # no rule judging and no baseline meanwhile (every rank alike: the same loop, the same steps)
            self._unsynced_until = UNSYNCED_LONGEST
            self.trigger.hold(UNSYNCED_LONGEST)
            return False
        if self.rank == 0:
            from eroica_runtime.analyst import say

            alone = "each trains on its own" if group else "no process group: torch.distributed was never initialized"
            why = (f"steps {UNSYNCED_FROM}-{step} ran no collective: the job's ranks do not wait for each other "
                   f"({alone}), and eroica's vote at every step would make them. eroica is off for this "
                   "job from here: it finds the rank that the others wait for, and here none does")
            if group:   # a local-SGD job meets every N steps: whoever is slow makes the others wait then
                why += (". Ranks that meet less often than that (local SGD averaging every N steps) are watched "
                        "with --warmup-steps above N")
            if self.analyst is not None:   # report.json says it too (written before it is said)
                try:
                    self.analyst.write_job(steps=step + 1, job={"partial": True, "stood_down": {"step": step, "why": why}},
                                           history=self.clock.all_ms[:])
                except Exception as exc:
                    self._warn(f"cannot write the report: {type(exc).__name__}: {exc}")
            say(f"eroica: {why}")
        self.votes.clear()   # cast by every rank: the side channel completes them at the job's end (drain)
        self._disable("no collective in the job's steps", quiet=True)
        return True

    def _boundary(self, step: int, ms: float, t0: float) -> None:
        assert self.side is not None
        cfg = self.cfg
        until = self._unsynced_until
        if (step == UNSYNCED_FROM or step == until) and self.side.size > 1 and self._check_synchronised(step, until):
            return
        pending = self._pending
        if step % REFRESH_EVERY == 0:
            self.pg_keeper.refresh()
        # the detectors judge neither profiled steps nor the steps eroica's deferred work disturbs
        in_window = self._disturbed(step)
        if self.rank == 0 and time.monotonic() >= self._next_file_check:
            self._next_file_check = time.monotonic() + TRIGGER_FILE_EVERY_S
            self._check_trigger_file()
        if self.analyst is not None and self.analyst.take_unexplained():
            self.trigger.detector.retry()   # rank 0: a slowdown its capture did not explain may be captured again
        last = self.clock.thread[-1] if self.clock.thread else None
        # a step the job's own profiler was on in is slower for it, on this rank: not judged; nor a
        # step in which this rank's DataLoader began an epoch (its workers started anew, the first
        # batch waited for them): a turnover every epoch is the job's own rhythm, no slowdown
        # (stepclock.Turnovers; the job summary says what they cost)
        profiler_on = not self.capture.profiling and self.job_profilers.on
        flags = self.trigger.local_flags(step, ms, in_window, last[3] if last is not None and last[0] == step else 0,
                                         unjudged=profiler_on or self.clock.epoch_began)
        n, size = len(flags), self.side.size
        vote = np.zeros(n + VOTE_TAIL, dtype=np.int64)
        vote[:n] = flags
        vote[n + HEALTHY] = (self.analyst.take_healthy() or 0) if self.analyst is not None else 0
        vote[n + BUILDING] = pending is not None and not pending.build.done
        if profiler_on:
            vote[n + PROFILER_HI], vote[n + PROFILER_LO] = self.rank + 1, size - self.rank
        if (pending is not None and pending.gave_way) or (self.capture.active and self.capture.gave_way):
            vote[n + GAVE_HI], vote[n + GAVE_LO] = self.rank + 1, size - self.rank
        self.votes.append((step, self.side.post_vote(vote)))
        voted = None
        held = False
        if len(self.votes) > cfg.vote_lag:
            voted_step, handle = self.votes.popleft()
            voted = self._wait_vote(handle)
            tail = voted[n:]
            # a vote cast after the close saying nobody is still building: every rank gets this same
            # answer at this same boundary, so all of them gather here (or all drop the capture: a
            # rank's window gave way to the job's profiler)
            if pending is not None and voted_step > pending.close_step and not tail[BUILDING]:
                gave = ranks_text(int(tail[GAVE_HI]), int(tail[GAVE_LO]), size) if tail[GAVE_HI] else ""
                self._gather_pending(step, gave=gave)
            if tail[HEALTHY]:
                self.trigger.found_healthy(int(tail[HEALTHY]))
            held = bool(tail[PROFILER_HI])
            if held:
                self._note_job_profiler(voted_step, ranks_text(int(tail[PROFILER_HI]), int(tail[PROFILER_LO]), size))
            voted = voted[:n]
        if self.capture.active:
            if voted is not None and voted[2]:
                self.trigger.requested()   # a person's request waits for this window to end
            last = self.capture.step + self.capture.k - 1  # type: ignore[operator]
            if step >= last:
                self._close_window(step)
                self._advance_pending(t0)
            else:
                if step == self.capture.step - 1:   # type: ignore[operator]
                    # the lead-in step ends: the window's GC counts start here, as its step rows do (from
                    # the capture's start they held the lead-in's collections too: k + 1 steps over k)
                    self._window["gc_start"] = self.gc.snapshot()
                self.capture.mark()
            return
        decision = self.trigger.decide(step, voted, held=held)
        said = self.trigger.take_said()
        if said and self.rank == 0:
            from eroica_runtime.analyst import refused_text, say

            for refused in said:
                say(refused_text(refused, cfg.max_captures, cfg.capture_refill_steps))
        if decision is None:
            self._advance_pending(t0)
        else:
            if self._pending is not None:
                # a new window may not open with a summary still unsent (its building would be
                # profiled): every rank has this decision at this boundary, so all finish and gather
                self._gather_pending(step, gave=None)
            # no barrier here: every rank has this decision at this same step boundary (the vote), and
            # the lead-in step absorbs how far apart in time they reach it. A world barrier cost every
            # rank 22-52 ms in this step on 4 ranks sharing 2 cores (docs/benchmarks.md §6), and a
            # rank that stopped answering is caught by the next vote's deadline as before.
            # per-host link latency/bandwidth between node leaders (a no-op on one node): the only way
            # to name the host of a slow link, since a slow link slows every rank's collectives alike.
            # Run now, while the slowdown that opened the window is going on: at the gather, after the
            # summaries' slices, a slow link in bursts had recovered (the fault bench's link-int), and
            # the profiler is not running yet, so the lead-in step absorbs its cost
            probe = self.side.probe_links(cfg.deadline_s)
            self._window = {"tele_start": telemetry.sample(), "gc_start": self.gc.snapshot(),
                            "own_start": self._own_s, "probe": probe}
            # the agreed step is the lead-in; the window proper starts one step later. On a rank whose
            # job's own profiler came on after its vote, the window opens given way (capture.py)
            self.capture.start(decision.start_step + 1, decision.trigger, decision.k)
            self._windows.append((decision.start_step + 1, decision.k))

    def _wait_vote(self, handle: Any) -> np.ndarray:
        """The result of a vote cast vote_lag boundaries ago, waiting for it if it is not in yet.

        That wait is for a peer, not eroica's work: MPICH completes the vote one stage per MPI call,
        and with more stages than the lag (3 and 6 ranks here; 8 in part) a rank that reaches its
        boundary late after its last collective (a stall between backward() and the optimizer step)
        is waited for here instead of in the next collective. Booked as eroica's own time and left
        out of the step, the waiting ranks' steps showed no wait, the capture found "no culprit" for
        a rank sleeping 50 ms a step on 3 ranks, and eroica's share of their time read 86%. It is
        counted into the next step, and in a window recorded as a collective (capture.peer_wait)."""
        assert self.side is not None
        if self.side.done(handle):
            return self.side.wait_vote(handle, self.cfg.deadline_s)
        w0 = time.perf_counter()
        try:
            with self.capture.peer_wait():
                return self.side.wait_vote(handle, self.cfg.deadline_s)
        finally:
            self._peer_wait_s += time.perf_counter() - w0

    def _check_trigger_file(self) -> None:
        taken = reportdir.take_trigger(self.report_dir)
        if taken is None:
            # a trigger file eroica cannot remove would request a capture every second: stop looking
            self._next_file_check = float("inf")
            self._warn(f"cannot remove {Path(self.report_dir) / reportdir.TRIGGER}: manual captures by file are "
                       "off for this job (SIGUSR1 still works)")
        elif taken:
            self.trigger.manual_pending = True
            self._warn(f"manual capture requested ({Path(self.report_dir) / reportdir.TRIGGER})")

    # ---- the window ------------------------------------------------------------------------------------
    def _slice_s(self) -> float:
        """Seconds of deferred work allowed at this step boundary (``slice_budget_s``)."""
        recent = [m for _, m in itertools.islice(reversed(self.clock.durations), 16)]
        return slice_budget_s(statistics.median(recent) / 1e3) if recent else SLICE_FLAT_S

    def _advance_pending(self, t0: float) -> None:
        """Build the pending summary for what is left of this boundary's slice (begun at ``t0``)."""
        pending = self._pending
        if pending is None or pending.build.done:
            return
        left = t0 + self._slice_s() - time.perf_counter()
        if left > 0:
            pending.build.run(left)

    def _gather_pending(self, step: int, gave: str | None) -> None:
        """Encode the pending summary and gather it (collective: every rank calls this at the same
        boundary, that of ``step``). The build is normally done already; a capture about to start or
        the job's end finishes it here.

        ``gave``: the ranks whose window gave way to the job's own profiler, as the vote said ("": none;
        None: no vote said, so the ranks agree on it here): then no rank sends its summary, and rank 0
        says why the capture was not taken. Dropped whole, as a comparison of ranks that were not
        all profiled would blame the difference."""
        assert self.side is not None
        pending, self._pending = self._pending, None
        if pending is None:
            return
        late = self._late_ms(pending)
        self._quiet_until = step + 1 + self.cfg.vote_lag
        self._deferred.append((pending.close_step + 1, self._quiet_until))
        if gave is None:
            everyone = self.side.agree(not pending.gave_way, self.cfg.deadline_s, "capture agreement")
            gave = "" if everyone else ("rank 0" if pending.gave_way and self.rank == 0 else "some rank")
        if gave:
            self.trigger.gave_way(pending.trigger)
            if self.analyst is not None:
                self.analyst.add_gave_way(pending.first, pending.trigger, gave)
            return
        pending.build.run(None)
        doc = pending.build.result
        hist = doc.get("history") if isinstance(doc, dict) else None
        if late and isinstance(hist, dict) and "late" in hist:
            hist["late"] = [late.get(hist["first"] + j, 0.0) for j in range(len(hist["late"]))]
        blob = summary_mod.encode(doc)  # type: ignore[arg-type]
        first, trigger, probe = pending.first, pending.trigger, pending.probe
        gathered = gather_capture(self.side, blob, step=first, trigger=trigger,
                                  deadline_s=self.cfg.deadline_s, report_dir=self.report_dir,
                                  extra={"link_probe": probe} if probe else None,
                                  reduce=self.cfg.reduces(self.side.size))
        if gathered is not None and self.analyst is not None:
            if gathered.missing:
                what = "no block from node leaders" if gathered.reduced else "no summary from ranks"
                self._warn(f"capture at step {first}: {what} {gathered.missing} "
                           f"within {self.cfg.deadline_s:.0f}s; analysing the others")
            self.analyst.submit(gathered)

    def _close_window(self, step: int) -> None:
        """Stop the profiler and set the summary's build going (it runs in later slices)."""
        assert self.side is not None
        cap = self.capture
        first, trigger, k = cap.step, cap.trigger, cap.k
        # read the GC counters before stopping: turning events into Python objects collects a lot
        gc_count0, gc_ms0 = self._window["gc_start"]
        gc_count1, gc_ms1 = self.gc.snapshot()
        gave_way = cap.gave_way
        events = cap.stop()
        arrivals = self._post_arrivals(first)
        if gave_way:
            self._pending = _Pending(first, trigger, step, summary_mod.Resumable(_no_summary()),  # type: ignore[arg-type]
                                     self._window.get("probe"), gave_way=gave_way, arrivals=arrivals)
            return
        if self.cfg.keep_raw_events:
            self._keep_raw(events, first)
        steps, history = self._step_records(first, step)
        if history is not None and arrivals is not None:   # the size the build budgets for; filled at the gather
            history["late"] = [0.0] * len(history["ms"])
        n = max(len(steps), 1)
        ident = {"rank": self.rank, "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
                 "world_size": self.side.size, "pid": os.getpid(), "host": socket.gethostname(),
                 "device": telemetry.gpu_identity(), "groups": self.groups,
                 "versions": {"eroica": __version__, "torch": _torch_version()}}
        settings = _torch_settings()
        self._anomaly_seen |= settings.get("anomaly", 0)
        build = summary_mod.build_steps(
            events, identity=ident, capture={"step": first, "trigger": trigger, "k": k}, steps=steps,
            history=history, gc={"count": (gc_count1 - gc_count0) / n, "ms": (gc_ms1 - gc_ms0) / n},
            telemetry={"start": self._window["tele_start"], "end": {**telemetry.sample(), "torch": settings}},
            records=summary_mod.RECORDS,
            python=cap.python)
        self._pending = _Pending(first, trigger, step, summary_mod.Resumable(build),  # type: ignore[arg-type]
                                 self._window.get("probe"), arrivals=arrivals)

    def _post_arrivals(self, first: int) -> tuple[np.ndarray, Vote] | None:
        """When this rank made the last collective of each of the HISTORY_STEPS steps before the window
        (lateness.last_created, from the Flight Recorder: one dump, ~2 ms), and an all-reduce of the
        earliest rank's, started (collective: every rank at the same window's close, data or not)."""
        assert self.side is not None
        if self.side.size == 1:
            return None
        from eroica_runtime.hang import collective_times

        to_epoch = time.time_ns() - time.perf_counter_ns()
        ends = {s: int(t * 1e9) + to_epoch for s, t, _ in self.clock.ends}
        held = {s: int(w * 1e9) for s, _, w in self.clock.ends}
        mine = lateness.last_created(collective_times(), range(first - HISTORY_STEPS, first), ends, held)
        return mine, self.side.post_min(mine)

    def _late_ms(self, pending: _Pending) -> dict[int, float]:
        """step -> ms this rank came late to the step's collectives (lateness.lateness), for the steps
        before the window; waits for the all-reduce ``_post_arrivals`` started (collective)."""
        if pending.arrivals is None:
            return {}
        assert self.side is not None
        mine, vote = pending.arrivals
        late = lateness.lateness(mine, self.side.wait_vote(vote, self.cfg.deadline_s))
        return {pending.first - HISTORY_STEPS + i: round(float(v), 3) for i, v in enumerate(late)}

    def _keep_raw(self, events: Any, first: int) -> None:
        """EROICA_KEEP_RAW_EVENTS=1: write the window's raw events (a debugging aid; its cost, ~7 µs an
        event, lands in this closing step). A debugging aid must not switch eroica off: a file that
        cannot be written (or events that cannot be read) is said once, and the capture goes on."""
        path = reportdir.raw_events_path(self.report_dir, first, self.rank)
        try:
            reportdir.ensure_directory(path.parent)
            reportdir.atomic_write(path, rawevents.dump(events, rank=self.rank, step=first))
        except Exception as exc:
            if not self._raw_failed:
                self._raw_failed = True
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
                self._warn(f"cannot keep the raw profiler events in {path}: {why}")

    def _step_records(self, first: int, last: int) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """The window's steps (wall, and the training thread's CPU and run-queue ms) and the same
        columns for up to HISTORY_STEPS contiguous steps before the window."""
        thread = {s: rest for s, *rest in self.clock.thread} if self.clock.has_runq else {}
        steps = []
        for s, m in self.clock.durations:
            if first <= s <= last:
                row: dict[str, Any] = {"step": s, "ms": round(m, 4)}
                if s in thread:
                    row["cpu"], row["runq"] = round(thread[s][0], 3), round(thread[s][1], 3)
                    row["data"], row["gc"] = round(thread[s][3], 3), round(thread[s][4], 3)
                    if thread[s][2]:
                        row["stops"] = thread[s][2]
                    if thread[s][5]:
                        row["thr"] = round(thread[s][5], 3)
                steps.append(row)
        before = [(s, m) for s, m in self.clock.durations if s < first and s in thread][-HISTORY_STEPS:]
        while before and before[0][0] != first - len(before):   # keep the contiguous tail only
            before.pop(0)
        if not before:
            return steps, None
        hist: dict[str, Any] = {"first": before[0][0], "ms": [round(m, 3) for _, m in before],
                                "cpu": [round(thread[s][0], 3) for s, _ in before],
                                "runq": [round(thread[s][1], 3) for s, _ in before],
                                "data": [round(thread[s][3], 3) for s, _ in before],
                                "gc": [round(thread[s][4], 3) for s, _ in before]}
        if any(thread[s][2] for s, _ in before):
            hist["stops"] = [thread[s][2] for s, _ in before]
        if any(thread[s][5] for s, _ in before):   # held throttled by a CPU quota: only where it was
            hist["thr"] = [round(thread[s][5], 3) for s, _ in before]
        return steps, hist

    # ---- groups, signals ---------------------------------------------------------------------------------
    def _record_groups(self) -> None:
        """Remember process groups / device-mesh dims this rank joins: the engine's peer hints."""
        try:
            import torch.distributed as dist
        except Exception:
            return
        original_new_group = dist.new_group
        runtime = self

        def new_group(*args: Any, **kwargs: Any) -> Any:
            group = original_new_group(*args, **kwargs)
            runtime.pg_keeper.hold(group)
            ranks = kwargs.get("ranks", args[0] if args else None)
            if ranks is not None and runtime.rank in list(ranks) and len(runtime.groups) < 64:
                name = kwargs.get("group_desc") or f"group{len(runtime.groups)}"
                runtime.groups.append({"name": str(name), "ranks": [int(r) for r in ranks]})
            return group

        dist.new_group = new_group
        try:
            import torch.distributed.device_mesh as dm
        except Exception:
            return
        original_init = dm.init_device_mesh

        def init_device_mesh(device_type: str, mesh_shape: tuple[int, ...], *args: Any, **kwargs: Any) -> Any:
            mesh = original_init(device_type, mesh_shape, *args, **kwargs)
            try:
                runtime._record_mesh(tuple(mesh_shape), kwargs.get("mesh_dim_names"))
            except Exception:
                pass
            return mesh

        dm.init_device_mesh = init_device_mesh

    def _record_mesh(self, shape: tuple[int, ...], names: tuple[str, ...] | None) -> None:
        import numpy as np

        grid = np.arange(int(np.prod(shape))).reshape(shape)
        where = np.argwhere(grid == self.rank)
        if not len(where):
            return
        coord = tuple(where[0])
        for dim in range(len(shape)):
            index = list(coord)
            index[dim] = slice(None)
            ranks = grid[tuple(index)].tolist()
            name = names[dim] if names and dim < len(names) else f"dim{dim}"
            self.groups.append({"name": str(name), "ranks": [int(r) for r in ranks]})

    def _install_signals(self) -> None:
        """SIGUSR1: capture now. SIGUSR2: flush the report now. SIGCONT: count it (a stopped process).
        Each is the job's as soon as the job installs a handler of its own (signals.py: Lightning's
        SLURM auto-requeue takes SIGUSR1 only when it has no handler)."""
        def on_usr1(signum: int, frame: Any) -> None:
            self.trigger.manual_pending = True

        def on_usr2(signum: int, frame: Any) -> None:
            # only a flag here: the flush waits for the analyst and writes files, which a signal
            # handler (run between two bytecodes of whatever the main thread holds) must never do
            self._flush_requested.set()

        def on_cont(signum: int, frame: Any) -> None:
            # the process was stopped (SIGSTOP/SIGTSTP) and goes on: the step clock marks this step
            self.clock.continued += 1

        self.signals = Signals({signal.SIGUSR1: on_usr1, signal.SIGUSR2: on_usr2, signal.SIGCONT: on_cont},
                               before=self._signals_before, on_taken=self._signal_taken)
        self.signals.install()
        # No SIGTERM handler: a Python handler never runs while a rank is stuck in C++ (a collective),
        # so it would make the rank ignore SIGTERM. Rank 0 rewrites report.json after every capture
        # instead, so a killed job still leaves its diagnoses.

    def _adopt_gate(self, at: str, passed: int) -> bool:
        """Whether steps are counted at backward()s or batches from this one (``passed`` of them so far
        with no optimizer step): only once every rank asked the same, and all from the same one
        (``agreement``).

        A rank alone in a pass of its own (rank 0 computing dataset statistics or evaluating before
        training while the others wait in a barrier) counted its batches as steps, waited the side
        channel's deadline (20 s) for votes its peers never cast, switched eroica off, and its peers
        did the same when training began: a 2-second job took 41. A rank whose peers never ask counts
        nowhere until an optimizer steps (then as any job). Off eroica: at once, as before.

        Nor where the loop has no collective (torch's Flight Recorder counted none while every rank
        agreed: each rank infers on its own shard, or trains a model of its own). Its ranks never wait
        for each other, so each runs at its own pace, while a vote at every counted step makes them
        wait for each other, and the agreement's answer reaches a rank that ran ahead past the step it
        names: two ranks reading 122 batches each (one through slower workers) counted from different
        batches, and the one ahead waited the side channel's deadline for a vote its peer never cast
        (a 10-second job took 27, eroica off on that rank). Such a loop is said once and counts nowhere."""
        from eroica_runtime.hang import collectives_recorded

        if self._unsynced:
            return False
        if self.side is None or self.side.size == 1:   # one rank waits for nobody: its vote holds nothing
            return self._agreed("adopt", passed)
        if self._collectives_at_ask is None:
            self._collectives_at_ask = collectives_recorded()
        if not self._agreed("adopt", passed):
            return False
        before, now = self._collectives_at_ask, collectives_recorded()
        if before is None or now is None or now > before:
            return True
        self._unsynced = at
        if self.rank == 0:
            from eroica_runtime.analyst import say

            say(f"eroica: {passed} {'backward() calls' if at == 'backward' else 'DataLoader batches'} with no "
                "optimizer step and no collective between them: the ranks do not wait for each other there, so "
                "eroica counts no steps in this loop (a step counted at each would make them wait for each "
                "other's votes). eroica_runtime.mark_step() once per iteration counts them all the same")
        return False

    def _switch_gate(self, passed: int) -> bool:
        """Whether steps follow another optimizer from this one of its steps (``passed`` of them since
        the one they follow last stepped): only once every rank asked (``agreement``).

        A rank whose other optimizer steps alone (rank 0 fitting a linear probe on the model's features
        after steps 20 and 40, 30 optimizer steps each, while the others waited in a barrier) followed
        it after 8 of its steps and counted the rest as steps its peers never took: it voted on them
        alone and gathered the baseline capture's summaries while its peer waited in the barrier, both
        ranks switched eroica off after a deadline each (the capture lost), and a 7-second job took 60
        s (tests/test_runtime.py). Asked of every rank, the switch happens where all of them switch (a
        fine-tuning's second stage), and a rank alone in its own optimizer's steps keeps counting at
        the one all of them step. Off eroica: at once, as before."""
        return self._agreed("switch", passed)

    def _agreed(self, about: str, passed: int) -> bool:
        if not self.enabled or self.side is None:
            return True
        try:
            agreement = self._agreements.get(about)
            if agreement is None:
                agreement = self._agreements[about] = Agreement(self.side, about)
            return agreement.ready(passed)
        except Exception as exc:
            self._disable(f"internal error agreeing where steps are counted: {type(exc).__name__}: {exc}")
            return True

    def _counted_at(self, at: str) -> None:
        """Steps are counted somewhere other than at an optimizer step (or at one again): rank 0 says
        so once, as step times and the vote mean something else then. Every rank's rules learn the
        new steps' pace afresh (all ranks run the same loop: they switch at the same step)."""
        if not self.enabled:
            return
        self.trigger.relearn(self.clock.step)
        if self.rank != 0:
            return
        from eroica_runtime.analyst import say
        from eroica_runtime.stepclock import ADOPT_AFTER

        how = "eroica_runtime.mark_step() once per iteration sets the steps instead"
        say({"backward": f"eroica: no torch.optim optimizer stepped in {ADOPT_AFTER} backward() calls: a step is "
                         f"counted at each backward() from now on ({how})",
             "batch": f"eroica: {ADOPT_AFTER} DataLoader batches with no optimizer step or backward(): a step is "
                      f"counted at each batch from now on ({how})",
             "mark_step": "eroica: eroica_runtime.mark_step() was called: a step is counted at each of its calls "
                          "from now on",
             }.get(at, "eroica: a torch.optim optimizer stepped: steps are counted at its steps from now on"))

    def _signal_taken(self, signum: int, handler: Any) -> None:
        """The job installed a handler of its own for one of eroica's signals: it is the job's now;
        rank 0 says so once, with what to use instead."""
        if self.rank != 0:
            return
        from eroica_runtime.analyst import say

        name = signal.Signals(signum).name
        instead = {signal.SIGUSR1: f"`touch {Path(self.report_dir) / reportdir.TRIGGER}` asks eroica for a capture",
                   signal.SIGUSR2: "eroica's report is still written after every capture and at the job's end",
                   }.get(signum, "eroica no longer marks the steps a rank was stopped and continued in")
        say(f"eroica: the job handles {name} itself ({describe(handler)}): eroica leaves it to the job; {instead}")

    def _flush_loop(self) -> None:
        """Rank 0's flusher thread: writes the report whenever SIGUSR2 asked (even while training hangs)."""
        while True:
            self._flush_requested.wait()
            self._flush_requested.clear()
            self._flush("SIGUSR2")

    def _flush(self, why: str, show: bool = False) -> None:
        """Write what rank 0 knows so far (no collective: other ranks may be gone); ``show``: then
        print the job report, as at the job's end (the job is ending early)."""
        if self.analyst is None:
            return
        try:
            self.analyst.wait(5.0)
            stats = {"rank": 0, "host": socket.gethostname(), **_step_stats(self.clock.all_ms[:], self.cfg, self.clock.step),
                     "steps_at": self.clock.counted_at, "skips": self.clock.skips,
                     "loader": self.clock.loader.to_json(self.clock.data_ms)}
            from eroica_runtime.analyst import job_stats
            from eroica_runtime.report import format_job

            rep = self.analyst.write_job(steps=self.clock.step, job={**job_stats({0: stats}, self.side.size),
                                                                     **self._time_lost(), **self._refused(),
                                                                     **self._job_profiler_stats(),
                                                                     "flushed_by": why},
                                         history=self.clock.all_ms[:])   # a copy: see StepClock.all_ms
            self._warn(f"{why}: report flushed to {self.report_dir}")
            if show:
                print(format_job(rep, self.report_dir), file=sys.stderr, flush=True)
        except Exception as exc:
            self._warn(f"{why}: report flush failed: {type(exc).__name__}: {exc}")

    # ---- job end -----------------------------------------------------------------------------------------
    def _at_exit(self) -> None:
        """Job end, bounded whatever state eroica is in (a window open, votes in flight, a peer gone).

        The job-end gather and rank 0's wait for its analyst have deadlines. Then every rank waits for
        every other's program to return (``SideChannel.wait_all_at_end``), as torchrun waits for every
        worker: a rank still working (a checkpoint after the last step) must not be cut short. Its hang
        watchdog answers meanwhile, saying this rank finished: a peer still busy is a pause, a peer
        stuck in a collective waits for a rank that will never join one, and rank 0 ends the job
        (``eroica_runtime.hang``). Only then is the watchdog stopped and MPI finalized. A rank that
        finished but hangs in interpreter teardown is ended by its wrapper (eroica_launch.rank,
        EROICA_EXIT_GRACE_S), which releases the others.
        Only a failing or interrupted rank leaves without finalizing: under MPICH's hydra a rank that
        exits without MPI_Finalize makes it kill every other rank at once, which is what a failure or
        a ^C should do (as torchrun stops the job) and never what a healthy rank may do to its peers.
        Rank 0 first writes what it knows (``_flush``, no collective). Why ^C too: the first rank the
        SIGINT interrupts is one running Python while its peers wait for it in a collective, where no
        signal reaches them; it gathered, then sat in MPI_Finalize waiting for them, they in the
        collective waiting for it, until eroica-run killed the job 30 s later (--shutdown-timeout),
        where torchrun's job ends at once.
        """
        if self._job_end_done:
            return
        self._job_end_done = True
        # the program's process groups, freed here with the GIL released (see pgkeeper), not inside
        # ~Reducer at the program's last frame or at teardown
        self.pg_keeper.release()
        side = self.side
        if side is None:
            return
        failing = errorfile.leaving_early()
        if self.watchdog is not None:
            if failing:
                self.watchdog.stop()
            else:
                self.watchdog.finish()   # it answers "finished" until every rank is
        if failing and self.rank == 0 and self.enabled:
            self._flush("this rank was interrupted (^C)" if errorfile.interrupted() else "this rank failed",
                        show=True)
        try:
            if self.capture.active:
                self.capture.abandon()
            if self.enabled and not failing:
                if self._pending is not None:
                    # the job ended before the last summary was sent: every rank is at the same point
                    # (the same boundaries decided it), so all finish and gather it before the job's end
                    self._gather_pending(self.clock.step, gave=None)
                stats = self._gather_job_end(side)
                if stats is not None:
                    self._write_job_end(stats)   # before MPI_Finalize: a killed job keeps its report
        except DeadlineMissed as exc:
            self._world_broken = True
            self._warn(f"job-end report incomplete: {exc}")
        except Exception as exc:
            self._warn(f"job-end report failed: {type(exc).__name__}: {exc}")
        # no MPI from here on (the job may train on after its own MPI.Finalize ran this): no more votes
        self.enabled = False
        for agreement in self._agreements.values():   # asked where no peer ever did: never completes
            agreement.abandon()
        if failing:
            side.drain(timeout_s=0.2)
            return
        try:
            side.wait_all_at_end()   # no deadline, as MPI_Finalize; the watchdog ends a job that cannot
        except Exception as exc:     # get there (a rank waits in a collective for one that returned)
            self._warn(f"job end: waiting for every rank failed: {type(exc).__name__}: {exc}")
        if self.watchdog is not None:
            from eroica_runtime.hang import WATCH_S

            self.watchdog.end(WATCH_S + self.cfg.deadline_s + 1.0)   # a look in progress: never MPI after Finalize
        side.drain(timeout_s=0.2 if self._world_broken else 2.0)
        try:
            side.finalize()
        except Exception as exc:
            self._warn(f"MPI_Finalize failed: {type(exc).__name__}: {exc}")

    def _gather_job_end(self, side: SideChannel) -> dict[str, Any] | None:
        """Every rank's step statistics to rank 0 (bounded); rank 0 gets the job's, the others None."""
        from eroica_runtime.analyst import job_stats

        # drift_held: the drift captures found healthy whose level this rank's drift rule took as its
        # least reference (report.json: why a level was not captured again; the same list on every rank)
        stats = _step_stats(self.clock.all_ms, self.cfg, self.clock.step)
        grown = self.memwatch.growth()
        mine = {"rank": self.rank, "host": socket.gethostname(), **stats, "steps_at": self.clock.counted_at,
                "started_s": round(self._started_s, 3),
                "skips": self.clock.skips, "memory": grown.to_json() if grown is not None else None,
                "eroica_ms": round(self._own_s * 1e3, 3), "drift_held": list(self.trigger.held),
                "anomaly": self._anomaly_seen | _torch_settings().get("anomaly", 0),
                "loader": self.clock.loader.to_json(self.clock.data_ms),
                "own": self.clock.own_work(),
                "busy_steps": imbalance.to_send(self.clock.last_steps(timelost.eroica_steps(self._windows,
                                                                                             self._deferred))),
                "long_steps": longsteps.to_send(self.clock.long_steps(), stats["median_ms"], self.clock.startup)}
        got = gather_job_end(side, msgpack.packb(mine, use_bin_type=True), self.cfg.deadline_s)
        if got is None or self.analyst is None:
            return None
        if got.unreadable:
            self._warn(f"job end: unreadable statistics from rank(s) {', '.join(map(str, got.unreadable[:8]))}")
        job = job_stats(got.per_rank, side.size, got.seen, busy=got.busy)
        if self._unsynced is not None and not job["steps"]:   # the same loop, so the same verdict, on every rank
            job["unsynced_loop"] = self._unsynced
        return job

    def _time_lost(self) -> dict[str, Any]:
        """``{"time_lost": ...}``: what the job lost from its first finding on, measured on rank 0's
        step times (engine/timelost.py); empty before a finding or without a healthy reference. For
        the job-end report and a flushed one (SIGUSR2, Slurm's pre-timeout signal) alike."""

        since = None if self.analyst is None else self.analyst.first_finding_step()
        if since is None:
            return {}
        deferred = list(self._deferred)
        pending = self._pending
        if pending is not None:   # a flush while a summary is still being built: from its close on
            deferred.append((pending.close_step + 1, self.clock.step + 1))
        cfg = self.cfg
        # steps counted elsewhere before (an evaluation's batches, then the training's optimizer steps:
        # stepclock.ADOPT_AFTER) are another kind: no reference for these
        warmup = cfg.warmup_steps + self.clock.counted_from
        lost = timelost.time_lost(self.clock.all_ms[:], list(self._windows), since, warmup=warmup,
                                  lookback=timelost.lookback(cfg.spike_steps, cfg.vote_lag), deferred=deferred,
                                  reach=timelost.onset_reach(cfg.spike_steps, cfg.vote_lag, cfg.drift_window,
                                                             cfg.lost_window))
        return {} if lost is None else {"time_lost": lost.to_json()}

    def _note_job_profiler(self, step: int, ranks: str) -> None:
        """The vote says the job's own profiler was on in ``step`` (on ``ranks``): no capture starts
        while it is (Trigger.decide), and rank 0 says so the first time."""
        seen = self._job_profiler
        if not seen:
            seen.update(first_step=step, steps=0, ranks=ranks)
            if self.rank == 0:
                from eroica_runtime.analyst import say

                say(f"eroica: step {step}: the job's own torch.profiler is on ({ranks}): eroica takes no capture "
                    "while it is (a process runs one profiler at a time) and does not judge those steps")
        seen["steps"] += 1
        seen["last_step"] = step

    def _job_profiler_stats(self) -> dict[str, Any]:
        """``{"job_profiler": {first_step, last_step, steps, ranks}}`` once the job's own profiler was
        seen on (voted), else {}: the job summary says why captures waited."""
        return {"job_profiler": dict(self._job_profiler)} if self._job_profiler else {}

    def _refused(self) -> dict[str, Any]:
        """``{"captures_refused": ...}`` once the capture budget refused a capture (trigger.Refused), else {}."""
        r = self.trigger.refused
        if not (r.slowdowns or r.requests):
            return {}
        return {"captures_refused": {**r.to_json(), "max_captures": self.cfg.max_captures,
                                     "refill_steps": self.cfg.capture_refill_steps}}

    def _write_job_end(self, stats: dict[str, Any]) -> None:
        """Rank 0: wait (bounded) for the analyst, write report.json/html, then print the job report."""
        from eroica_runtime.analyst import format_job_stats
        from eroica_runtime.report import format_job

        if not self.analyst.wait(max(30.0, self.cfg.deadline_s)):
            self._warn("job end: analysis still running after 30s; writing the report without it")
        stats = {**stats, **self._time_lost(), **self._refused(), **self._job_profiler_stats()}
        rep = self.analyst.write_job(steps=stats["steps"], job=stats, history=self.clock.all_ms[:])
        print(format_job_stats(rep["job"], self.analyst.captures, findings=bool(rep.get("findings"))), file=sys.stderr)   # as report.json says
        print(format_job(rep, self.report_dir), file=sys.stderr, flush=True)


def _step_stats(history: Sequence[float], cfg: Config, seen: int = 0) -> dict[str, Any]:
    """Steps, median and p99 step time after warm-up (all steps when the job was shorter). ``seen``:
    the steps the clock counted; a job of one step has no step time (a step is timed from the end of
    the one before it), but it had a step."""
    values = history[cfg.warmup_steps:] or history   # history[i] is step i + 1
    if not values:
        return {"steps": max(len(history) + 1 if history else 0, seen), "median_ms": None, "p99_ms": None}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {"steps": len(history) + 1, "median_ms": round(statistics.median(values), 4), "p99_ms": round(p99, 4),
            "total_ms": round(sum(history), 3)}


def _torch_settings() -> dict[str, int]:
    """This process's torch settings that change how fast the same code runs (the summary's
    telemetry.end.torch; engine/settings.py compares a culprit's with its peers'): autograd anomaly
    detection (a stack trace recorded for every op, every gradient checked for NaN: a debugging
    switch left on one rank of a test job took its own work from 43 to 71 ms a step, docs/benchmarks.md
    §31), intra-op threads, deterministic algorithms. Read at the window's close, on the training thread
    (anomaly mode is one switch per process; the thread count is what this thread's ops run with), and
    at the job's end. Not the inter-op threads: asking for their number starts torch's inter-op pool,
    and the job could no longer set it. {} in a process that never imported torch (importing it here
    would cost the job's end seconds)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    try:
        return {"anomaly": int(torch.is_anomaly_enabled()), "threads": int(torch.get_num_threads()),
                "deterministic": int(torch.are_deterministic_algorithms_enabled())}
    except Exception:
        return {}


def _torch_version() -> str:
    try:
        import torch

        return str(torch.__version__)
    except Exception:
        return "?"
