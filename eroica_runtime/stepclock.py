"""The step clock: where a step ends, and how long it took, at a few microseconds per step.

A step ends at the global optimizer step post-hook of the first optimizer that steps (so several
optimizers or gradient accumulation still count one step per iteration; one a mixed-precision GradScaler
skipped counts as well), or at ``mark_step()``. A job
in which no torch.optim optimizer steps (its own update rule, an optimizer from elsewhere, inference)
has its steps counted at each ``backward()``, or, with none either, at each DataLoader batch, once
ADOPT_AFTER of them passed without an optimizer step (an optimizer stepping later takes over).
eroica's own time inside the boundary is excluded: each duration runs from the end of eroica's work at
the previous boundary to the start of this one, less the part of that work spent waiting for the other
ranks' votes (a wait for a late peer: the job's, runtime._wait_vote). On CUDA, events recorded at the boundary are read
lazily once complete (never a device synchronize).

Each step also records what the training thread did with its wall time: CPU time (the thread's
own clock) and run-queue wait (``/proc/thread-self/schedstat``: runnable, but no CPU was free).
The rest was spent blocked (a collective, the next batch, storage, a sleep, a SIGSTOP); a step in
which the process was stopped and continued (SIGSTOP/SIGCONT: a freezing agent, a debugger, Slurm's
suspend) is marked by the SIGCONT it received; time spent getting the next batch from a DataLoader
and in GC pauses is counted too, and how long the process's CPU quota held it throttled
(telemetry.ThrottleClock, 2-5 µs more: docs/benchmarks.md §5b). These cost ~3 µs a step and let the engine tell a rank that was
slow only because the scheduler ran others first from one that is persistently slow, and name a
rank from the steps before a capture window when the window missed its slow steps.
The DataLoaders' epoch turnovers (the ``next()`` that ends an iteration, ``iter()``, the first
batch after it) are counted apart (``Turnovers``): the step an epoch began in is no slowdown of the
job's, and what they cost over the job is said at its end. The thread's times are totalled over the
job too (``own_work``): at its end, a rank busier than its peers at every step is named.
"""

from __future__ import annotations

import functools
import heapq
import os
import threading
import time
import weakref
from array import array
from collections import deque
from collections.abc import Callable
from typing import Any

HISTORY = 4096
THREAD_HISTORY = 256
# the longest steps kept whole for the job end (engine/longsteps.py): more than the 3 it reports, since
# which of several alike stalls (a checkpoint every 50 steps) a rank keeps differs between ranks
LONGEST = 8
# steps of another optimizer, with none of the one steps are counted at, after which that one is
# followed instead once every rank asks to (switch_gate; a fine-tuning's second stage with a new
# optimizer, the old one kept alive). More
# than a GAN's critic steps per generator step (5 in WGAN), which must not move the count
SWITCH_AFTER = 8
# an epoch that began this many steps or more after the last one began is a turnover the detectors
# leave unjudged (StepClock.epoch_began); a loop that calls iter() every few steps is judged as ever
EPOCH_APART = 8
MAX_DATASETS = 64   # distinct datasets a rank's Turnovers tells apart
# backward() calls (or, with none, DataLoader batches) without an optimizer step after which a step is
# counted at each of them instead: more micro-batches than a gradient accumulation's first step holds
# (16-32 in fine-tuning recipes), so a job with an optimizer is never counted at its backward()s
ADOPT_AFTER = 64
# where steps are counted (StepClock.counted_at): a torch.optim optimizer step, eroica_runtime.mark_step(),
# or, in a job with neither, each backward() or each DataLoader batch
COUNTED_AT = ("optimizer", "mark_step", "backward", "batch")


class ThreadTimes:
    """Cumulative CPU time and run-queue wait (ms) of the thread that created it."""

    def __init__(self) -> None:
        self._fd: int | None = None
        try:
            # a kept descriptor names this thread even when read later: one pread per sample
            self._fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
            self._runq()
        except (OSError, ValueError, IndexError):
            self.close()

    @property
    def has_runq(self) -> bool:
        return self._fd is not None

    def _runq(self) -> float:
        assert self._fd is not None
        return int(os.pread(self._fd, 128, 0).split()[1]) / 1e6

    def sample(self) -> tuple[float, float]:
        """(cpu ms, run-queue ms) so far; run-queue is 0 where the kernel does not say."""
        cpu = time.thread_time_ns() / 1e6
        if self._fd is None:
            return cpu, 0.0
        try:
            return cpu, self._runq()
        except (OSError, ValueError, IndexError):
            self.close()
            return cpu, 0.0

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None


class Turnovers:
    """The job's DataLoader epoch turnovers on this rank: the ends and starts of their iterations.

    Without ``persistent_workers`` a DataLoader shuts its worker processes down in the ``next()`` that
    ends an epoch and starts them anew in the next ``iter()``, whose first batch then waits for a fresh
    worker. A 4-rank job with 2 workers a rank and 30-step epochs on 2 cores (2026-12-05) spent
    ~130 ms a rank at every epoch's start against a ~18 ms step, a sixth of its time, with nothing
    said about it; worse, the detectors took the periodic stall for lost throughput and took two
    captures in 240 steps that found the job healthy. Counted here, the step clock can mark the step
    in which an epoch began (the detectors leave it unjudged) and the job summary can say what the
    turnovers cost and why (``engine.epochs``).
    """

    __slots__ = ("ms", "count", "restarts", "workers", "batches", "datasets")

    def __init__(self) -> None:
        self.ms = 0.0       # in iter(), each iteration's first next() and the next() that ended it
        self.count = 0      # iter() calls: epochs begun
        self.restarts = 0   # iter() calls that started worker processes anew (not persistent_workers)
        self.workers = 0    # the most worker processes one such restart started
        self.batches = 0    # next() calls, each iteration's last (StopIteration) included
        # the datasets iterated (ids, at most MAX_DATASETS): a validation pass after each epoch is a
        # turnover too, but "16 epochs" for 8 misled; a loader made anew each epoch is one dataset
        self.datasets: set[int] = set()

    def to_json(self, data_ms: float) -> dict[str, float | int]:
        """The job-end map (``engine.epochs.epoch_starts`` reads it): with all the rank's batch wait,
        which sets the wait of an ordinary batch against the turnovers'."""
        return {"turnovers": self.count, "turnover_ms": round(self.ms, 3), "restarts": self.restarts,
                "workers": self.workers, "batches": self.batches, "data_ms": round(data_ms, 3),
                "datasets": len(self.datasets)}


def _time_dataloader(clock: StepClock) -> Callable[[], None] | None:
    """Time every DataLoader ``next()``, and every ``iter()`` of one, into ``clock.data_ms`` (~0.3 µs a
    batch), and the epoch turnovers among them into ``clock.loader`` (``Turnovers``); returns the undo.

    A slow input pipeline makes its rank sleep, like a victim waiting in a collective, so CPU and
    run-queue time cannot show it; the time spent getting the next batch does, for every step, not
    only the profiled ones. All of torch's DataLoader iterators share ``_BaseDataLoaderIter.__next__``
    (the same place torch marks with ``record_function`` for the profiler). ``DataLoader.__iter__``
    starts the worker processes anew at every epoch unless ``persistent_workers``: a 4-rank job with
    2 workers a rank and 40-step epochs stalled 130 ms at every epoch's first step (10x its median
    step, 2026-12-05), which read as CPU, not as the input pipeline, before this was timed too.
    """
    try:
        from torch.utils.data import DataLoader
        from torch.utils.data.dataloader import _BaseDataLoaderIter
    except Exception:
        return None
    original, original_iter = _BaseDataLoaderIter.__next__, DataLoader.__iter__
    if getattr(original, "__eroica_timed__", False):
        return None
    perf = time.perf_counter
    loader = clock.loader

    def __next__(self: Any) -> Any:
        t0 = perf()
        # an iteration's first batch waits for the pipeline to fill (fresh workers, without
        # persistent_workers); its last next() shuts the workers down and raises StopIteration
        turning = getattr(self, "_num_yielded", 1) == 0
        try:
            got = original(self)
        except StopIteration:
            turning = True
            raise
        finally:
            ms = (perf() - t0) * 1e3
            clock.data_ms += ms
            loader.batches += 1
            if turning:
                loader.ms += ms
        if clock.fallback:   # no optimizer has stepped (yet): a batch may be where steps are counted
            clock.safely(clock.batch_done)
        return got

    def __iter__(self: Any) -> Any:
        workers = getattr(self, "num_workers", 0)
        restart = (isinstance(workers, int) and workers > 0 and not getattr(self, "persistent_workers", False))
        t0 = perf()
        try:
            return original_iter(self)
        finally:
            ms = (perf() - t0) * 1e3
            clock.data_ms += ms
            loader.ms += ms
            loader.count += 1
            if len(loader.datasets) < MAX_DATASETS:
                loader.datasets.add(id(getattr(self, "dataset", None)))
            if restart:
                loader.restarts += 1
                loader.workers = max(loader.workers, workers)

    __next__.__eroica_timed__ = True  # type: ignore[attr-defined]
    _BaseDataLoaderIter.__next__ = __next__  # type: ignore[method-assign]
    DataLoader.__iter__ = __iter__  # type: ignore[method-assign]

    def undo() -> None:
        if _BaseDataLoaderIter.__next__ is __next__:
            _BaseDataLoaderIter.__next__ = original  # type: ignore[method-assign]
        if DataLoader.__iter__ is __iter__:
            DataLoader.__iter__ = original_iter  # type: ignore[method-assign]

    return undo


def _patch(owner: Any, name: str, wrapper: Callable[..., Any]) -> Callable[[], None]:
    """Put ``wrapper`` in place of ``owner.<name>``, marked as eroica's (a second clock leaves it be);
    returns the undo, which puts the original back only while the wrapper is still in place."""
    original = getattr(owner, name)
    wrapper.__eroica_counted__ = True  # type: ignore[attr-defined]
    setattr(owner, name, wrapper)

    def undo() -> None:
        if getattr(owner, name) is wrapper:
            setattr(owner, name, original)

    return undo


def _count_backward(clock: StepClock) -> Callable[[], None] | None:
    """Tell ``clock`` of every ``backward()`` the main thread runs (``torch.autograd.backward``, which
    ``Tensor.backward`` calls), while no optimizer has stepped; returns the undo.

    A loop with its own update rule (``p -= lr * p.grad``) or an optimizer outside torch.optim had
    no step counted at all: "no training step was seen" after the job, nothing watched during it
    (2026-12-05, a 4-rank manual-SGD DDP job with one rank doing extra matmuls). A backward() nested
    in one (a reentrant activation checkpoint recomputing its segment) is part of it, not a step;
    one on another thread (autograd's device threads) is not the training loop's.
    """
    try:
        import torch.autograd as autograd
    except Exception:
        return None
    original = autograd.backward
    if getattr(original, "__eroica_counted__", False):
        return None
    main = threading.main_thread().ident
    depth = 0

    @functools.wraps(original)
    def backward(*args: Any, **kwargs: Any) -> Any:
        nonlocal depth
        if not clock.fallback or threading.get_ident() != main:
            return original(*args, **kwargs)
        depth += 1
        try:
            got = original(*args, **kwargs)
        finally:
            depth -= 1
        if depth == 0:
            clock.safely(clock.backward_done)
        return got

    return _patch(autograd, "backward", backward)


def _count_skipped_steps(clock: StepClock) -> Callable[[], None] | None:
    """Count a step the mixed-precision ``GradScaler.step()`` skipped as the optimizer's step; returns
    the undo.

    ``GradScaler.step(optimizer)`` does not call ``optimizer.step()`` when the gradients hold an inf or
    a NaN (an fp16 job's first steps overflow while the loss scale settles, and one more overflows each
    time the scale grows, every 2,000 steps by default), so the optimizer's post-hook does not run and
    two iterations were counted as one step: a CPU job with a skip every 20 steps (2026-12-05) was told
    "282 steps" for 300, its p99 step was the merged steps' 31 ms against a median of 8.8, and the
    throughput rule took the doubled steps for lost time and opened a capture that found it healthy.
    ``torch.cuda.amp.GradScaler`` and FSDP's ``ShardedGradScaler`` inherit this ``step``. Only a
    torch.optim optimizer's step always runs the post-hook; another object with ``param_groups`` and
    ``step()`` (which GradScaler drives as well) ends its iteration here but is no skip.
    """
    try:
        from torch.amp import GradScaler
        from torch.optim import Optimizer
    except Exception:
        return None
    original = GradScaler.step
    if getattr(original, "__eroica_counted__", False):
        return None

    @functools.wraps(original)
    def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        stepped = clock.optimizer_steps
        got = original(self, optimizer, *args, **kwargs)
        if clock.optimizer_steps == stepped:
            clock.safely(clock.skipped, optimizer, isinstance(optimizer, Optimizer))
        return got

    return _patch(GradScaler, "step", step)


def _count_joined_steps(clock: StepClock) -> Callable[[], None] | None:
    """Count a step on a DDP rank that ran out of batches under ``Join`` (uneven inputs) each time it
    shadows a step of the others; returns the undo.

    The joined rank takes no optimizer step while the others finish theirs: its DDP join hook matches
    their collectives instead (``_DDPJoinHook.main_hook``, once per iteration of theirs). It voted on no
    step meanwhile, the others' votes waited the side channel's deadline for its own, and eroica went
    off on every rank: two epochs of 60 and 70 batches on two ranks took 44 s for 0.3. Counted here, the
    joined rank takes a step at the shadowed iterations that sync gradients (those of a gradient
    accumulation's no_sync() micro-batches do not, as the others' optimizer takes no step in them),
    or at every one where steps are counted at batches or backward()s, so every rank votes as often.
    A torch without the hook: None.
    """
    try:
        from torch.nn.parallel import distributed
    except Exception:
        return None
    hook_cls = getattr(distributed, "_DDPJoinHook", None)
    original = getattr(hook_cls, "main_hook", None)
    if hook_cls is None or original is None or getattr(original, "__eroica_counted__", False):
        return None

    @functools.wraps(original)
    def main_hook(self: Any) -> Any:
        got = original(self)
        clock.safely(clock.shadowed, bool(getattr(getattr(self, "ddp", None), "require_forward_param_sync", True)))
        return got

    return _patch(hook_cls, "main_hook", main_hook)


class StepClock:
    def __init__(self, on_boundary: Callable[[int, float], float | None], history: int = HISTORY,
                 gc_ms: Callable[[], float] | None = None,
                 throttled_ms: Callable[[], float | None] | None = None, long_from: int = 1) -> None:
        self.on_boundary = on_boundary
        self.gc_ms = gc_ms                # cumulative GC pause ms (telemetry.GcMonitor), if watched
        self._gc_last = 0.0
        self.throttled_ms = throttled_ms  # cumulative ms held throttled by a CPU quota (telemetry.ThrottleClock)
        self._thr_last = 0.0
        self.step = 0                     # index of the step that ends at the next boundary
        self.durations: deque[tuple[int, float]] = deque(maxlen=history)
        # step times of steps 1, 2, ... (the job summary, time lost, steps.msgpack): 8 bytes a step, not
        # a list's 32 (38 MB a rank after 1.2 M steps; scripts/bench/long_history.py). Other threads read
        # a copy (all_ms[:]): a view held while this thread appends would make the append fail
        self.all_ms: array[float] = array("d")
        # (step, cpu ms, run-queue ms, times continued, ms waiting for batches, ms in GC pauses, ms
        # the process was held throttled by its CPU quota) of the training thread, eroica's own
        # boundary work excluded
        self.thread: deque[tuple[int, float, float, int, float, float, float]] = deque(maxlen=THREAD_HISTORY)
        # (step, perf_counter() at its end, s eroica's vote held the rank there after it): which step a
        # collective was made in, and how late eroica made it (lateness.py)
        self.ends: deque[tuple[int, float, float]] = deque(maxlen=THREAD_HISTORY)
        self.continued = 0                # SIGCONTs received (the runtime's handler counts them)
        self._continued_last = 0
        self.data_ms = 0.0                # time in DataLoader next() (waiting for a batch), cumulative
        self._data_last = 0.0
        self._untime_data: Callable[[], None] | None = None
        self.loader = Turnovers()         # the DataLoaders' epoch turnovers (_time_dataloader)
        self._loader_count = 0
        self._epoch_step = -EPOCH_APART
        # the step that just ended began an epoch, EPOCH_APART steps or more after the last did
        self.epoch_began = False
        # the LONGEST longest steps from step long_from on, with what the training thread did in them: a
        # min-heap of (ms, step, record); where(step) is its main thread's stack sampled while that
        # step ran long (hang.Watchdog.sampled), if anything sampled it
        self.longest: list[tuple[float, int, dict[str, Any]]] = []
        self.long_from = long_from        # warm-up steps (a first compile, a cold cache) are not stalls
        # what the training thread did over every step from long_from on: steps, step ms, CPU ms, run-queue
        # ms, batch-wait ms (the job end compares ranks' own work over the whole job: engine/steadywork.py)
        self.totals = [0, 0.0, 0.0, 0.0, 0.0]
        self.where: Callable[[int], list[str] | None] | None = None
        # step 0 as a long step's record: the job's start (imports, model build, the first batch and step),
        # with what the training thread did in it and where it was near its end (engine/longsteps.py)
        self.startup: dict[str, Any] | None = None
        # disturbed(step): eroica's own work held this step up (a capture's lead-in with its link probe,
        # its window, a summary's slices, the gather): such a step is kept marked "eroica" (a rank may
        # still have stalled in it on its own), as the detectors leave it unjudged (runtime._boundary)
        self.disturbed: Callable[[int], bool] | None = None
        self._times: ThreadTimes | None = None
        self._t_last: tuple[float, float] | None = None
        self._last = time.perf_counter()
        self._first_opt: Any = None       # weakref to the optimizer whose steps are counted
        self._others = 0                  # steps of other optimizers since it last stepped
        # where steps are counted (COUNTED_AT; None: nowhere yet), and whether that may still become a
        # backward() or a batch (no optimizer has stepped, no mark_step()): read at every batch
        self.counted_at: str | None = None
        self.fallback = True
        self.counted_from = 0             # the step from which they were counted there
        self._backwards = 0               # backward()s and batches before steps were counted at them
        self._batches = 0
        self._main = threading.main_thread().ident
        # told where steps are counted when that became a backward() or a batch, or an optimizer after one
        self.on_counted_at: Callable[[str], None] | None = None
        # asked (where, how many passed) before steps are counted at backward()s or batches: whether every
        # rank counts them now (the runtime's agreement over the side channel; None: at once). A rank
        # that counted a pass of its own (rank 0 alone through a DataLoader while the others waited in a
        # barrier) as steps voted on them alone and waited for its peers' votes at every one
        self.adopt_gate: Callable[[str, int], bool] | None = None
        # asked (steps of another optimizer passed) before steps follow another optimizer: whether every
        # rank switches (None: at once). A second optimizer stepped on one rank alone (rank 0 fitting a
        # linear probe while the others waited in a barrier) made that rank alone count its steps
        self.switch_gate: Callable[[int], bool] | None = None
        self.on_error: Callable[[str], None] | None = None   # see safely()
        self.optimizer_steps = 0          # torch.optim steps seen (the post-hook ran)
        self.skips = 0                    # optimizer steps a GradScaler skipped (_count_skipped_steps)
        self._handle: Any = None
        self._uncount_skips: Callable[[], None] | None = None
        self._uncount_joined: Callable[[], None] | None = None
        self._uncount_backward: Callable[[], None] | None = None
        self._cuda_events: deque[tuple[int, Any]] = deque()
        self._cuda = False

    def install(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._handle = register_optimizer_step_post_hook(self._optimizer_hook)
        self._untime_data = _time_dataloader(self)
        self._uncount_backward = _count_backward(self) if self.fallback else None
        self._uncount_skips = _count_skipped_steps(self)
        self._uncount_joined = _count_joined_steps(self)
        try:
            import torch

            self._cuda = torch.cuda.is_available()
        except Exception:
            self._cuda = False

    def uninstall(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        if self._untime_data is not None:
            self._untime_data()
            self._untime_data = None
        if self._uncount_backward is not None:
            self._uncount_backward()
            self._uncount_backward = None
        if self._uncount_skips is not None:
            self._uncount_skips()
            self._uncount_skips = None
        if self._uncount_joined is not None:
            self._uncount_joined()
            self._uncount_joined = None
        if self._times is not None:
            self._times.close()
            self._times = None
            self._t_last = None

    @property
    def has_runq(self) -> bool:
        return self._times is not None and self._times.has_runq

    def _optimizer_hook(self, optimizer: Any, _args: Any, _kwargs: Any) -> None:
        self.optimizer_steps += 1
        self.safely(self._optimizer_stepped, optimizer)

    def safely(self, fn: Callable[..., None], *args: Any) -> None:
        """``fn(*args)`` for a caller inside the job's own code (its optimizer step, backward(), a batch,
        mark_step()): an error in eroica goes to ``on_error`` (the runtime switches itself off on this
        rank), never into the training. Without ``on_error`` (a bare clock) it is raised."""
        try:
            fn(*args)
        except Exception as exc:
            if self.on_error is None:
                raise
            self.on_error(f"internal error in the step clock: {type(exc).__name__}: {exc}")

    def shadowed(self, synced: bool) -> None:
        """This rank, joined under DDP's Join, shadowed an iteration of the others' (_count_joined_steps):
        a step where they take one (one that synced gradients, or any where steps are counted at
        batches or backward()s)."""
        if threading.get_ident() != self._main or self.counted_at is None:
            return
        if synced or self.counted_at in ("batch", "backward"):
            self.boundary()

    def skipped(self, optimizer: Any, skip: bool = True) -> None:
        """A GradScaler's step() ran no torch.optim post-hook: it skipped ``optimizer``'s step (inf/NaN
        gradients), or with ``skip`` False, the optimizer is none of torch.optim's. The iteration ended
        all the same."""
        self.skips += int(skip)
        self._optimizer_stepped(optimizer)

    def _optimizer_stepped(self, optimizer: Any) -> None:
        if self.counted_at == "mark_step":
            return
        if self.fallback:
            self._no_fallback()
            if self.counted_at is not None:
                # an optimizer stepped after all (past a long first accumulation, or an evaluation
                # before training): its steps are counted from now; the time since the last
                # backward() or batch is no step of either
                self._first_opt = weakref.ref(optimizer)
                self._adopt("optimizer")
                return
            self.counted_at = "optimizer"
        followed = self._first_opt() if self._first_opt is not None else None
        if followed is None:
            # the first step, or the optimizer they were counted at is gone (a new one for the next
            # stage): steps go on with this one. Counting only the first for good missed every step
            # of a fine-tuning's second stage (30 of 120 steps counted)
            self._first_opt = weakref.ref(optimizer)
        elif followed is not optimizer:
            self._others += 1
            if self._others < SWITCH_AFTER or not (self.switch_gate is None or self.switch_gate(self._others)):
                return   # several optimizers a step (a GAN's), or one rank's own: one step
            # the counted one stopped stepping (kept alive, unused): follow this one, from now; the
            # steps in between were no step of either
            self._first_opt, self._others = weakref.ref(optimizer), 0
            self._rebase()
            return
        self._others = 0
        self.boundary()

    def _no_fallback(self) -> None:
        """Steps are counted at an optimizer or at mark_step() for good: backward() is torch's own again.
        Why: the wrapper's frame stood in every traceback through backward() (an out-of-memory error, a
        peer's lost connection), where a user reads it as eroica's part in the failure."""
        self.fallback = False
        if self._uncount_backward is not None:
            self._uncount_backward()
            self._uncount_backward = None

    def _rebase(self) -> None:
        """The next step starts now; nothing is recorded for the time since the last boundary."""
        if self._times is not None:
            self._t_last = self._times.sample()
        self._continued_last, self._data_last = self.continued, self.data_ms
        self._gc_last = self.gc_ms() if self.gc_ms is not None else 0.0
        thr = self.throttled_ms() if self.throttled_ms is not None else None
        if thr is not None:
            self._thr_last = thr
        self._last = time.perf_counter()

    def mark(self) -> None:
        """mark_step(): from the first call on, manual marks alone define steps. Steps counted elsewhere
        until then (an optimizer's, backward()s') switch over as at any change of where steps are
        counted: the time since the last of them is no step, and the marked steps' warm-up no stall."""
        self._no_fallback()
        if self.counted_at is None or self.counted_at == "mark_step":
            self.counted_at = "mark_step"
            self.boundary()
        else:
            self._adopt("mark_step")

    def backward_done(self) -> None:
        """A backward() ended on the main thread while no optimizer has stepped (_count_backward)."""
        if self.counted_at == "backward":
            self.boundary()
            return
        self._backwards += 1
        if self._backwards >= ADOPT_AFTER and self._may_adopt("backward", self._backwards):
            self._adopt("backward")

    def batch_done(self) -> None:
        """A DataLoader batch arrived while no optimizer has stepped: with no backward() either (an
        inference or evaluation loop), ADOPT_AFTER of them make batches where steps are counted."""
        if threading.get_ident() != self._main:
            return   # a prefetching thread's batches are not the loop's iterations
        if self.counted_at == "batch":
            self.boundary()
            return
        if self.counted_at is None and self._backwards == 0:
            self._batches += 1
            if self._batches >= ADOPT_AFTER and self._may_adopt("batch", self._batches):
                self._adopt("batch")

    def _may_adopt(self, at: str, passed: int) -> bool:
        return self.adopt_gate is None or self.adopt_gate(at, passed)

    def _adopt(self, at: str) -> None:
        """Count steps at ``at`` from now: the first counted boundary is step 0 (the start-up, as at a
        first optimizer step); after a switch, the time since the last boundary is no step."""
        first = self.counted_at is None
        self.counted_at = at
        if not first:   # steps of another kind from here: their warm-up is no stall either
            self.long_from += self.step - self.counted_from
            self.counted_from = self.step
        if self.on_counted_at is not None:
            self.on_counted_at(at)
        if first:
            self.boundary()
        else:
            self._rebase()

    def boundary(self) -> None:
        now = time.perf_counter()
        ms = (now - self._last) * 1e3
        step = self.step
        times = self._times
        if times is None:   # opened by the thread that trains (the one calling the boundary)
            times = self._times = ThreadTimes()
        sample = times.sample()
        continued, data, gc = self.continued, self.data_ms, self.gc_ms() if self.gc_ms is not None else 0.0
        thr = self.throttled_ms() if self.throttled_ms is not None else None
        if thr is None:   # not measured (or no longer: the clock gave up): no step was held
            thr = self._thr_last
        if step == 0 and self.startup is None:
            self._keep_startup(ms, sample, continued, data, gc, thr)
        if step > 0:  # step 0 also holds start-up (model build, first batch): not a step time
            self.durations.append((step, ms))
            self.all_ms.append(ms)
            if self._t_last is not None:
                rec = (step, sample[0] - self._t_last[0], sample[1] - self._t_last[1],
                       continued - self._continued_last, data - self._data_last, gc - self._gc_last,
                       thr - self._thr_last)
                self.thread.append(rec)
                if step >= self.long_from:
                    t = self.totals
                    t[0] += 1
                    t[1] += ms
                    t[2] += rec[1]
                    t[3] += rec[2]
                    t[4] += rec[4]
                    if len(self.longest) < LONGEST or ms > self.longest[0][0]:
                        self._keep_long(ms, rec)
        self._t_last, self._continued_last, self._data_last, self._gc_last = sample, continued, data, gc
        self._thr_last = thr
        count = self.loader.count
        self.epoch_began = count != self._loader_count and step - self._epoch_step >= EPOCH_APART
        if count != self._loader_count:
            self._loader_count, self._epoch_step = count, step
        self.step += 1
        if self._cuda:
            self._record_cuda(step)
        waited = self.on_boundary(step, ms) or 0.0
        if step > 0:
            self.ends.append((step, now, waited))
        end = time.perf_counter()
        if end - now > 1e-3:
            # eroica did real work here (a window closed, a capture started): not the next step's.
            # A plain boundary (~15 µs) is left in it rather than paying a second sample every step
            self._t_last = times.sample()
        # but its wait for the other ranks (``on_boundary`` returns it) is the job's: the rank waits
        # for a late peer there instead of in its next collective (runtime._wait_vote)
        self._last = end - waited

    def _keep_startup(self, ms: float, sample: tuple[float, float], continued: int, data: float, gc: float,
                      thr: float) -> None:
        """Step 0's record: its training thread's times since it began (the process's first thread)."""
        doc: dict[str, Any] = {"step": 0, "ms": round(ms, 3), "cpu": round(sample[0], 3), "runq": round(sample[1], 3),
                               "stops": continued, "data": round(data, 3), "gc": round(gc, 3), "thr": round(thr, 3)}
        try:
            where = self.where(0) if self.where is not None else None
        except Exception:
            where = None
        if where:
            doc["where"] = where
        self.startup = doc

    def _keep_long(self, ms: float, rec: tuple[int, float, float, int, float, float, float]) -> None:
        """Keep one of the longest steps so far (a few µs, only for a step longer than the kept ones)."""
        step = rec[0]
        doc: dict[str, Any] = {"step": step, "ms": round(ms, 3), "cpu": round(rec[1], 3), "runq": round(rec[2], 3),
                               "stops": rec[3], "data": round(rec[4], 3), "gc": round(rec[5], 3),
                               "thr": round(rec[6], 3)}
        try:
            where = self.where(step) if self.where is not None else None
        except Exception:
            where = None
        if where:
            doc["where"] = where
        try:
            if self.disturbed is not None and self.disturbed(step):
                doc["eroica"] = 1
        except Exception:
            pass
        item = (ms, step, doc)
        if len(self.longest) < LONGEST:
            heapq.heappush(self.longest, item)
        else:
            heapq.heapreplace(self.longest, item)

    def own_work(self) -> dict[str, Any]:
        """The job-end map of ``totals`` (engine/steadywork.py reads it): steps after warm-up, and the
        training thread's ms in them in all, on a CPU, runnable waiting for one, waiting for batches;
        ``cuda``: the rank used a GPU, whose work its thread's times do not show."""
        steps, ms, cpu, runq, data = self.totals
        return {"steps": steps, "ms": round(ms, 3), "cpu": round(cpu, 3), "runq": round(runq, 3),
                "data": round(data, 3), "cuda": self._cuda}

    def last_steps(self, skip: set[int]) -> list[tuple[int, float, float]]:
        """(step, busy ms, step ms) of the last THREAD_HISTORY steps after warm-up, the training thread's
        busy time being its CPU time and its wait for batches (engine/imbalance.py compares ranks' step
        by step), less the steps in ``skip`` (eroica's own) and those the process was stopped in; none
        on a GPU rank, whose thread's times do not show the device's work."""
        if self._cuda:
            return []
        ms = dict(self.durations)
        return [(rec[0], rec[1] + rec[4], ms[rec[0]]) for rec in list(self.thread)
                if rec[0] >= self.long_from and not rec[3] and rec[0] not in skip and rec[0] in ms]

    def long_steps(self) -> list[dict[str, Any]]:
        """The kept longest steps, longest first (a copy: another thread may read it at job end)."""
        return [doc for _, _, doc in sorted(self.longest[:], key=lambda x: -x[0])]

    # ---- CUDA: device-side step times, read lazily -----------------------------------------------
    def _record_cuda(self, step: int) -> None:
        import torch

        if not torch.cuda.is_initialized():
            return
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        self._cuda_events.append((step, ev))
        while len(self._cuda_events) > 64:
            self._cuda_events.popleft()

    def gpu_durations(self) -> list[tuple[int, float]]:
        """(step, ms) between consecutive completed CUDA boundary events; non-blocking."""
        out = []
        events = list(self._cuda_events)
        for (_s0, e0), (s1, e1) in zip(events, events[1:], strict=False):
            if e1.query():
                out.append((s1, float(e0.elapsed_time(e1))))
        return out
