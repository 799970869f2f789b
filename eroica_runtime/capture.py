"""Capture: the only module that drives torch.profiler.

All ranks start the profiler at the same agreed step, mark each step boundary inside the window
(``eroica::step#N`` ranges: torch's ProfilerStep#N are the job's own profiler's too, summary.events.
OWN_STEP_PREFIX), and stop after K steps; the events go to the summary stage.
A profiler's first start pays one-time costs (kineto's set-up; on a GPU, CUPTI's), so ``warm_up()``
pays them at install time. torch's own start would also import inductor (1 s and 72 MB a rank), which
eroica's profiler avoids where the job never imported it (``_inductor_left_unloaded``).

A process runs one torch.profiler session at a time: a second one started inside another takes the
session over, and the first one's stop then finds none and returns no results, whose export crashes
the process (a segfault in ``export_chrome_trace``: a job with its own torch.profiler schedule died
under eroica-run at its first trace). The job's own profiler always comes first: ``JobProfilers``
sees it prepare and stop, eroica starts no window while it is on, and a window open as it starts
gives way to it (``Capture.give_way``), before the job's profiler takes the session.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from eroica_runtime.pysample import FrameSampler
from eroica_runtime.summary.events import OWN_RANGE, OWN_STEP_PREFIX, PEER_WAIT_RANGE


def _detach_cupti_after_stop() -> None:
    """Have kineto detach CUPTI when a profile stops: upstream's fix for training that stays slower
    after a profile (not yet measured on our GPU job: ``AFTER=1 scripts/gpu-session`` is the check).

    Without ``TEARDOWN_CUPTI=1`` kineto disables its CUPTI activities at stop but never calls
    ``cuptiFinalize()``: CUPTI stays attached to the CUDA driver and every later CUDA call pays for it
    (pytorch/pytorch#144455: 10-20% slower training after a profile; issue 11 here: 1.14-1.31x on a
    7.3 ms H200 step). CPU-only windows are hit too: kineto's CPU group includes the CUDA runtime and
    driver API activities, which go through CUPTI. kineto reads the variable when it resets the trace
    inside ``prof.stop()``; the finalize then runs on the next CUDA call, and the next window
    re-attaches CUPTI lazily. A value the user (or torch: CUDA graphs with CUDA < 12.6) set is kept,
    and nothing is set below CUDA 12.6, where teardown with CUDA graphs can crash. Process-wide: the
    job's own torch.profiler windows detach too.
    """
    import os

    import torch

    if wants_cupti_teardown(os.environ.get("TEARDOWN_CUPTI"), getattr(torch.version, "cuda", None)):
        os.environ["TEARDOWN_CUPTI"] = "1"


def wants_cupti_teardown(current: str | None, cuda_version: str | None) -> bool:
    """Set TEARDOWN_CUPTI=1? Not over a value already set, not without CUDA (no CUPTI: CPU-only or
    ROCm builds), not below CUDA 12.6."""
    if current is not None or not cuda_version:
        return False
    try:
        major, minor = (int(part) for part in cuda_version.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (12, 6)


@contextlib.contextmanager
def _inductor_left_unloaded() -> Iterator[None]:
    """Keep torch.profiler's start from importing torch._inductor where the job never did.

    ``torch.profiler.profile.prepare_trace`` asks ``hasattr(torch, "_inductor")`` to read whether
    inductor's CUDA graphs are on; torch's lazy module ``__getattr__`` answers it by importing
    inductor and dynamo: 1.0 s of CPU and 72 MB of memory in every rank (2 ms and 3 MB for the
    profiler itself, torch 2.13 on this machine), at start-up (``warm_up``) in every job eroica
    watches. A process that never imported inductor has no compiled graph, so "no CUDA graphs" is
    the true answer: for this thread only, while eroica's profiler prepares, the lazy lookup of
    ``_inductor`` says there is none. A job that compiled has it imported, and torch's own check runs.
    """
    import torch

    lazy = torch.__dict__.get("__getattr__")
    if "torch._inductor" in sys.modules or lazy is None:
        yield
        return
    me = threading.get_ident()

    def lookup(name: str) -> Any:
        if name == "_inductor" and threading.get_ident() == me:
            raise AttributeError(name)
        return lazy(name)

    torch.__getattr__ = lookup
    try:
        yield
    finally:
        if torch.__dict__.get("__getattr__") is lookup:
            torch.__getattr__ = lazy


def _profile(**kwargs: Any) -> Any:
    """A torch.profiler.profile that prepares without importing inductor (``_inductor_left_unloaded``)."""
    return _profile_class()(**kwargs)


@functools.cache
def _profile_class() -> type:
    from torch.profiler import profile

    class EroicaProfile(profile):
        def prepare_trace(self) -> None:
            with _inductor_left_unloaded():
                super().prepare_trace()

    return EroicaProfile


class RawEvents:
    """The window's raw kineto events, made into Python objects only when first iterated.

    Each event becomes a pybind object (~0.5-3 µs apiece, 10^4-10^5 events a window): that is left to
    the summary's builder, which runs in slices after the closing step, not in it. Iterate once.
    """

    def __init__(self, results: Any) -> None:
        self._results = results

    def __iter__(self) -> Any:
        return iter(self._results.events())


class JobProfilers:
    """The job's own profilers (torch.profiler, torch.autograd.profiler, emit_nvtx, emit_itt): which
    are on in this process, and a call just before one starts.

    torch keeps no list of them and calls nothing when one starts, so the methods every one of them
    goes through are wrapped: ``torch.autograd.profiler.profile._prepare_trace`` / ``_start_trace``
    (torch.profiler.profile's warm-up and start, and the plain context manager's enter) and the two
    emitters' ``__enter__``; each one's ``__exit__`` says it stopped. eroica's own profiler goes
    through the same methods inside ``own()`` and is not counted. A profiler started before these
    wrappers (none: sitecustomize installs them first) is still seen by ``on`` through torch's own
    flag, while it records.
    """

    _PROFILERS = (("profile", ("_prepare_trace", "_start_trace")), ("emit_nvtx", ("__enter__",)),
                  ("emit_itt", ("__enter__",)))

    def __init__(self) -> None:
        self._open: weakref.WeakSet[Any] = weakref.WeakSet()
        self._own = threading.local()
        self._undo: list[tuple[Any, str, Any]] = []   # (class, name, its own attribute or None: inherited)
        self.before_start: Callable[[], None] | None = None   # called before a job's profiler starts
        self._ap: Any = None   # torch.autograd.profiler, once installed (``on`` runs at every step)
        self.seen = False   # a job's profiler was on at some point

    def install(self) -> None:
        import torch.autograd.profiler as ap

        self._ap = ap
        for cls_name, starts in self._PROFILERS:
            cls = getattr(ap, cls_name, None)
            if cls is None:
                continue
            for name in starts:
                if callable(getattr(cls, name, None)):
                    self._wrap(cls, name, self._starting)
            if callable(getattr(cls, "__exit__", None)):
                self._wrap(cls, "__exit__", self._stopped)

    def uninstall(self) -> None:
        """torch's classes as they were: a method they inherited is inherited again."""
        for cls, name, own in reversed(self._undo):
            if own is None:
                delattr(cls, name)
            else:
                setattr(cls, name, own)
        self._undo.clear()

    def _wrap(self, cls: Any, name: str, around: Callable[[Any, Any, tuple[Any, ...], dict[str, Any]], Any]) -> None:
        own = cls.__dict__.get(name)
        original = own if own is not None else getattr(cls, name)

        def wrapper(prof: Any, *args: Any, **kwargs: Any) -> Any:
            return around(original, prof, args, kwargs)

        wrapper.__name__, wrapper.__doc__ = getattr(original, "__name__", name), getattr(original, "__doc__", None)
        wrapper.__wrapped__ = original   # type: ignore[attr-defined]
        setattr(cls, name, wrapper)
        self._undo.append((cls, name, own))

    def _starting(self, original: Any, prof: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not getattr(self._own, "on", False) and getattr(prof, "enabled", True) is not False:
            self.seen = True
            try:
                self._open.add(prof)
                if self.before_start is not None:
                    self.before_start()
            except Exception:   # eroica's trouble never stops the job's profiler
                pass
        return original(prof, *args, **kwargs)

    def _stopped(self, original: Any, prof: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            return original(prof, *args, **kwargs)
        finally:
            self._open.discard(prof)

    class _Own:
        def __init__(self, local: threading.local) -> None:
            self._local = local

        def __enter__(self) -> None:
            self._local.on = True

        def __exit__(self, *_exc: Any) -> None:
            self._local.on = False

    def own(self) -> JobProfilers._Own:
        """Context: eroica's own profiler calls, not the job's."""
        return JobProfilers._Own(self._own)

    @property
    def on(self) -> bool:
        """A job's profiler is warming up or recording in this process (eroica's own not counted:
        ask only while eroica's is off)."""
        if len(self._open):
            return True
        return self._ap is not None and getattr(self._ap, "_is_profiler_enabled", False) is True


class Capture:
    def __init__(self, jobs: JobProfilers | None = None, sampler: FrameSampler | None = None) -> None:
        self.jobs = jobs if jobs is not None else JobProfilers()
        # where the main thread's Python is while the profiler runs (pysample.py): what no op records
        self.sampler = sampler if sampler is not None else FrameSampler()
        self.python: dict[str, Any] | None = None   # the last window's samples (stop)
        self._open = False       # a window is open on this rank (profiling, or given way to the job's)
        self.gave_way = ""       # this window gave way to the job's own profiler: when (else "")
        self._prof: Any = None
        self._own: Any = None   # the open range over eroica's own work at this boundary (own_begin)
        self._lead_in = False   # host ops are not being recorded: the lead-in step (see start())
        self._mark: Any = None  # the open step mark (eroica::step#N, _open_mark)
        self._mark_step = 0
        self.step: int | None = None
        self.trigger = ""
        self.k = 0

    @staticmethod
    def _activities() -> list[Any]:
        import torch
        from torch.profiler import ProfilerActivity

        acts = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            acts.append(ProfilerActivity.CUDA)
        return acts

    def warm_up(self) -> None:
        """Start and stop an empty profile once, so the first real window does not pay the profiler's
        one-time set-up (kineto's; on a GPU, CUPTI's)."""
        import torch

        _detach_cupti_after_stop()  # the warm-up's own CUPTI attach must not outlive it either
        with self.jobs.own(), _profile(activities=self._activities(), record_shapes=False, with_stack=False):
            torch.zeros(1).add_(1)

    @property
    def active(self) -> bool:
        """A window is open on this rank (its steps are the window's, profiled or given way)."""
        return self._open

    @property
    def profiling(self) -> bool:
        return self._prof is not None

    def give_way(self, why: str) -> None:
        """The job's own profiler starts (or is on) in this window: stop eroica's, its events dropped,
        before the job's takes the session. The window stays open (its steps and close are agreed
        with every rank); its summary is not sent (runtime: the gather drops the capture)."""
        if not self._open or self.gave_way:
            return
        self.gave_way = why
        self.abandon(close=False)

    def start(self, step: int, trigger: str, k: int) -> bool:
        """Start profiling one lead-in step before ``step``; steps step..step+k-1 are the window.

        The lead-in absorbs what differs between ranks at a window's edge (when each reached the
        agreed step boundary, the profiler's own start-up), so that no rank looks slow just because it
        started first. Its host
        ops are not recorded (collection is toggled off until the window's first boundary): the
        summary leaves them out anyway, and ``prof.stop()``, the one piece of a capture's close that
        must run in the closing step, costs time per recorded event (a quarter less with k = 3).
        The window opens whatever happens; False when the job's own profiler is on in this process
        (``JobProfilers``): then eroica's does not start and the window has given way from its start.
        """
        self.step, self.trigger, self.k = step, trigger, k
        self._open, self.gave_way = True, ""
        if self.jobs.on:
            self.gave_way = f"the job's own profiler was on at step {step - 1}"
            return False
        _detach_cupti_after_stop()
        # no schedule: it records from start to stop, and opens no ProfilerStep#N range (eroica marks
        # its steps with its own, _open_mark)
        prof = _profile(activities=self._activities(), record_shapes=False, with_stack=False)
        with self.jobs.own():
            prof.start()
        self._prof = prof
        self._open_mark(step - 1)  # the lead-in
        self._lead_in = self._collect_host_ops(False)
        self.python = None
        self.sampler.start()
        return True

    def _collect_host_ops(self, on: bool) -> bool:
        """Toggle the recording of host ops (torch's RecordFunction callbacks; device activity stays
        on, so CUPTI is not re-armed at the window's edge). True if toggled. kineto logs a warning
        line at each toggle; the launcher's output filter drops it (eroica_launch/output.py)."""
        from torch.profiler import ProfilerActivity

        try:
            self._prof.toggle_collection_dynamic(on, [ProfilerActivity.CPU])
        except Exception:   # a torch without it (or one that refuses): the lead-in is recorded
            return False
        return True

    def mark(self) -> None:
        """A step boundary inside the window: closes one step's mark and opens the next."""
        if self._prof is not None:
            self._end_lead_in()
            self._open_mark(self._mark_step + 1)

    def _open_mark(self, step: int) -> None:
        """Close the open step mark, if any, and open ``eroica::step#<step>`` (recorded as a user
        annotation, as torch's ProfilerStep#N is)."""
        from torch.profiler import record_function

        self._close_mark()
        mark = record_function(f"{OWN_STEP_PREFIX}#{step}")
        mark.__enter__()
        self._mark, self._mark_step = mark, step

    def _close_mark(self) -> None:
        mark, self._mark = self._mark, None
        if mark is not None:
            mark.__exit__(None, None, None)

    def own_begin(self) -> None:
        """Open a profiler range over eroica's own work at this step boundary (its vote, the window's
        marks, the close; not its wait for the other ranks' votes: ``peer_wait``), while the profiler
        records.

        The boundary runs inside the step's last range: torch calls optimizer step post-hooks inside
        ``Optimizer.step#...``. Unmarked, that time was booked as the rank's optimizer work, and on 8
        ranks sharing 2 cores the wait for the votes is 0.2 ms a step on some ranks and up to 29 ms
        on others, which named healthy ranks as stragglers in their optimizer step. The summary builder leaves
        the range out of every phase (``summary.events.OWN_RANGE``)."""
        if self._prof is None or self._own is not None or self._lead_in:
            return
        from torch.profiler import record_function

        own = record_function(OWN_RANGE)
        own.__enter__()
        self._own = own

    def own_end(self) -> None:
        """Close the range own_begin opened (before the profiler stops, so that its end is recorded)."""
        own, self._own = self._own, None
        if own is not None:
            own.__exit__(None, None, None)

    def peer_wait(self) -> Any:
        """A context for the wait for the other ranks' votes inside own_begin's range: recorded as a
        range of its own that the summary counts as a collective (``summary.events.PEER_WAIT_RANGE``),
        since it is a wait for a late peer, not eroica's work (why: ``runtime.Runtime._wait_vote``)."""
        if self._own is None:
            return contextlib.nullcontext()
        return self._peer_wait()

    @contextlib.contextmanager
    def _peer_wait(self) -> Iterator[None]:
        from torch.profiler import record_function

        self.own_end()
        try:
            with record_function(PEER_WAIT_RANGE):
                yield
        finally:
            self.own_begin()

    def _end_lead_in(self) -> None:
        if self._lead_in:
            self._lead_in = False
            self._collect_host_ops(True)

    def stop(self) -> Any:
        """Stop (closing the last step mark) and return the window's events, the lead-in step's
        included (its mark and device activity; its host ops were not recorded).

        The raw kineto events are handed over, not ``prof.events()``: torch's post-processing into
        FunctionEvents costs 2-3x the whole summary (docs/benchmarks.md), on every rank, in the step
        that closes the window. Nothing here touches the events (even listing them costs a pybind
        object each): this runs on the training thread in the closing step; the summary builder reads
        them later, in slices, and leaves out what started before ``eroica::step#<step>`` (the lead-in).
        """
        self._open = False
        if self._prof is None:
            return []
        self.python = self.sampler.stop()
        self.own_end()
        self._end_lead_in()   # stop with the profiler's callbacks where it put them
        self._close_mark()
        prof, self._prof = self._prof, None
        with self.jobs.own():
            prof.stop()
        results = getattr(getattr(prof, "profiler", None), "kineto_results", None)
        if results is not None:
            return RawEvents(results)
        return prof.events()

    def abandon(self, close: bool = True) -> None:
        """Stop without processing (eroica is switching off on this rank; ``close=False``: the window
        stays open, given way to the job's profiler)."""
        if close:
            self._open = False
        self.sampler.stop()
        if self._prof is not None:
            try:
                self.own_end()
            except Exception:
                self._own = None
            try:
                self._close_mark()
            except Exception:
                self._mark = None
            self._end_lead_in()
        prof, self._prof = self._prof, None
        if prof is not None:
            try:
                with self.jobs.own():
                    prof.stop()
            except Exception:
                pass
