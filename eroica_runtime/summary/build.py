"""The summary builder: one rank's profiled window (torch.profiler events) -> one summary dict."""

from __future__ import annotations

import bisect
import operator
import time
from typing import Any

import msgpack
import numpy as np

from eroica_runtime.summary import launchers
from eroica_runtime.summary.events import (
    OWN_RANGE,
    SYNC_NAMES,
    Ev,
    Lease,
    Records,
    classify,
    is_step_mark,
    marks_prefix,
    normalize_steps,
    ran_in,
    step_marks,
    step_number,
)
from eroica_runtime.summary.intervals import intersect as _intersect
from eroica_runtime.summary.intervals import length as _length
from eroica_runtime.summary.intervals import subtract as _subtract
from eroica_runtime.summary.intervals import union as _union
from eroica_runtime.summary.intervals import union_cols as _union_cols
from eroica_runtime.summary.resumable import CHUNK, Steps, drain
from eroica_runtime.summary.schema import FUNCTION_PHASES, PHASES, SCHEMA, validate

MAX_FUNCTIONS = 64
SIZE_BUDGET = 16 * 1024
NAME_LIMIT = 96
OTHER = "<other>"

# ---------------------------------------------------------------------------------------------
# Builder: torch.profiler events -> one summary dict.
#
# Why a timeline and not the op tree: on CPU with gloo DDP (and for a plain ``dist.all_reduce``)
# the main thread's wait for a collective is *not* inside any profiled op. ``Work.wait`` and
# DDP's ``Reducer::finalize_backward`` run unrecorded; only the launch (``c10d::allreduce_``,
# well under a millisecond) is on the main thread, while ``gloo:all_reduce`` records the whole
# life of the collective (enqueue -> completion) on a gloo worker thread. So the builder lays
# out the main thread's step time as a timeline: op self time goes to the op's phase, and time
# with no op running is split into "waiting for a collective" (a collective was in flight) and
# host_gap (nothing was). The same rule covers NCCL on a GPU: the host blocks in a
# synchronize call (or in no op at all) while an NCCL kernel runs.


# Self-time segments of one thread: (starts, ends, owning events), three parallel lists rather than a
# tuple per segment: tuples holding an Ev stay tracked by the garbage collector, and ~10^5 of them
# living through a summary's slices push a full collection (~150 ms in a process with torch) into
# one of the steps after a close.
Segments = tuple[list[float], list[float], list[Ev]]
_SYNC = frozenset(SYNC_NAMES)
_SYNC_PREFIXES = ("cudaStreamSynchronize", "cudaDeviceSynchronize")
_START = operator.attrgetter("start")
_END = operator.attrgetter("end")


def _nest_steps(thread_events: list[Ev]) -> Steps[Segments]:
    """Self-time segments of one thread's (properly nested) events; also sets phase and self_ms.

    A child inherits its parent's phase unless it carries a marker of its own (a collective
    launched from a backward hook is comm, an op under the optimizer annotation is optimizer).
    Stepwise: yields every CHUNK events (resumable.py).
    """
    seg_s: list[float] = []
    seg_e: list[float] = []
    seg_ev: list[Ev] = []
    stack: list[list[Any]] = []  # [end, cursor, event]

    def pop() -> None:
        end, cursor, ev = stack.pop()
        if end > cursor:
            seg_s.append(cursor)
            seg_e.append(end)
            seg_ev.append(ev)
        if stack:
            stack[-1][1] = max(stack[-1][1], end)

    # by start, the longer first on a tie (two stable sorts: cheaper than a tuple key per event)
    ordered = sorted(thread_events, key=_END, reverse=True)
    ordered.sort(key=_START)
    yield
    for i, ev in enumerate(ordered):
        if not i % CHUNK:
            yield
        while stack and stack[-1][0] <= ev.start:
            pop()
        end = ev.end
        if stack:
            parent = stack[-1]
            if ev.start > parent[1]:
                seg_s.append(parent[1])
                seg_e.append(ev.start)
                seg_ev.append(parent[2])
            parent[1] = ev.start
            end = min(end, parent[0])  # clamp a child that outlives its parent (async records)
            ev.phase = ev.marker or parent[2].phase
            ev.parent = parent[2]
            parent[2].nchild += 1
        else:
            ev.phase = ev.marker
        stack.append([end, ev.start, ev])
    while stack:
        pop()
    for ev in thread_events:
        ev.self_ms = 0.0
    for s, e, ev in zip(seg_s, seg_e, seg_ev, strict=True):
        ev.self_ms += e - s
    return seg_s, seg_e, seg_ev


def _closure_ranges(main_evs: list[Ev], bwd_marks: list[tuple[float, float]]) -> set[int]:
    """Optimizer ranges that contain a backward pass: ``optimizer.step(closure)`` (PyTorch
    Lightning, LBFGS) runs forward, backward and the gradient all-reduce inside the step.

    Such a range is no optimizer work by itself: its self time is treated like any record_function
    region's (a wait for an in-flight collective is comm, the rest host gap), and the ops nested in
    it take the phase of where they run in the step (before the backward: forward; after it:
    optimizer) instead of inheriting "optimizer". Returns the ``id()`` of each such range event.
    """
    closures: set[int] = set()
    for ev in main_evs:
        if ev.marker == "optimizer":
            i = bisect.bisect_left(bwd_marks, (ev.start, ev.start))
            if (i < len(bwd_marks) and bwd_marks[i][0] < ev.end) or (i and bwd_marks[i - 1][1] > ev.start):
                closures.add(id(ev))
    if not closures:
        return closures
    for ev in main_evs:
        if ev.marker is None:
            anc = ev.parent
            while anc is not None and anc.marker is None:
                anc = anc.parent
            if anc is not None and id(anc) in closures:
                ev.phase = None      # positional, like an op outside any marker
    return closures


def _backward_passes(spans: list[tuple[float, float]], bwd_marks: list[tuple[float, float]],
                     unmarked: list[float]) -> list[list[tuple[float, float]]]:
    """Each step's backward passes: its backward marks, split where work outside any marker began.

    A step that accumulates gradients runs forward and backward once per micro-batch; the forward
    ops carry no marker of their own (only backward, optimizer, data and collectives do), so the
    span from the step's first backward op to its last holds every micro-batch's forward but the
    first. An op or range outside any marker that starts between two backward marks ran outside the
    autograd engine (whose ops all carry the backward marker or nest in one): the next micro-batch's
    forward or its preparation, never a backward op. ``unmarked``: the start times of the main
    thread's events without a phase of their own, sorted.
    """
    out: list[list[tuple[float, float]]] = []
    for s, e in spans:
        lo = max(0, bisect.bisect_left(bwd_marks, (s, s)) - 1)
        hi = bisect.bisect_right(bwd_marks, (e, float("inf")))
        passes: list[tuple[float, float]] = []
        for a, b in bwd_marks[lo:hi]:
            if b < s or a > e:
                continue
            if passes:
                prev_a, prev_b = passes[-1]
                k = bisect.bisect_right(unmarked, prev_b)
                if not (k < len(unmarked) and unmarked[k] < a):
                    passes[-1] = (prev_a, max(prev_b, b))
                    continue
            passes.append((a, b))
        out.append(passes)
    return out


# how long after a collective's launch began its worker-side record may start and still be that
# launch's (the worker picks the work up from a queue; seen: 0.1 ms on 4 ranks sharing 2 cores)
PICKUP_MS = 1.0


def _unclosed_collective(main_evs: list[Ev], evs: list[Ev], main: Any,
                         spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The window's last collective, when the profiler stopped before its worker closed its record: in
    flight from its launch to the end of the step it was launched in.

    With gloo the training thread only launches a collective (``c10d::allreduce_``, well under a
    millisecond); its life is recorded on a worker thread (``gloo:all_reduce``), whose record closes a
    little after the training thread was released: 0.4 ms after the step's end, seen with 4 ranks on 2
    cores. When the window's last step ends right after its collective (an optimizer step with a
    closure, as PyTorch Lightning runs it) the profiler can stop in between, the record is lost, and
    that step's whole wait looked like host time outside any op (``host_gap``, not ``comm``): the
    victim dropped out of the culprit's list (torch 2.11; tests/data/summary/closure-last-step).

    Only a launch with no worker record started after it, and whose name had, earlier in the window, a
    launch with a worker record starting during it or within ``PICKUP_MS`` of its start (evidence that
    this job's collectives are recorded that way).
    """
    workers = sorted(ev.start for ev in evs if ev.kind == "collective" and not ev.gpu and ev.thread != main)
    launches = [ev for ev in main_evs if ev.kind == "collective"]
    if not workers or not launches or not spans:
        return []
    last = max(launches, key=_START)
    if last.start <= workers[-1] or last.start > spans[-1][1]:
        return []
    paired = False
    for ev in launches:
        if ev is not last and ev.name == last.name:
            i = bisect.bisect_left(workers, ev.start)
            paired = paired or (i < len(workers) and workers[i] <= max(ev.end, ev.start + PICKUP_MS))
    if not paired:
        return []
    end = next((e for s, e in spans if s <= last.start <= e), spans[-1][1])
    return [(last.start, end)]


def _quantile(sorted_vals: list[float], q: float) -> float:
    """Nearest-rank quantile of a sorted, non-empty list."""
    idx = min(len(sorted_vals) - 1, max(0, int(round(q * (len(sorted_vals) - 1)))))
    return sorted_vals[idx]


def _num(x: float) -> float | int:
    """Round for readability; integral values become ints (smaller in msgpack)."""
    r = round(float(x), 4)
    return int(r) if r == int(r) and abs(r) < 2**31 else r


def _fn_stats(name: str, kind: str, phase: str, durs: list[float], self_total: float,
              steps: int) -> dict[str, Any]:
    durs = sorted(durs)
    n = len(durs)
    total = sum(durs)
    mean = total / n if n else 0.0
    var = sum((d - mean) ** 2 for d in durs) / n if n else 0.0
    return {"name": name, "kind": kind, "phase": phase, "count": _num(n / steps),
            "ms": _num(total / steps), "self": _num(self_total / steps), "mean": _num(mean),
            "p50": _num(_quantile(durs, 0.5)) if n else 0, "p90": _num(_quantile(durs, 0.9)) if n else 0,
            "p99": _num(_quantile(durs, 0.99)) if n else 0, "max": _num(durs[-1]) if n else 0,
            "std": _num(var ** 0.5)}


def _pick_main_thread(evs: list[Ev], step_evs: list[Ev], main_tid: int | None) -> Any:
    """The training thread: the one holding ProfilerStep annotations, else main_tid, else the busiest."""
    if step_evs:
        counts: dict[Any, int] = {}
        for ev in step_evs:
            counts[ev.thread] = counts.get(ev.thread, 0) + 1
        return max(counts, key=counts.__getitem__)
    threads = {ev.thread for ev in evs if not ev.gpu}
    if main_tid is not None and main_tid in threads:
        return main_tid
    busy: dict[Any, list[tuple[float, float]]] = {}
    for ev in evs:
        if not ev.gpu and ev.kind != "collective":
            busy.setdefault(ev.thread, []).append((ev.start, ev.end))
    if not busy:
        return None
    return max(busy, key=lambda t: _length(_union(busy[t])))


def _pseudo_steps(main_evs: list[Ev], n_steps: int) -> list[tuple[float, float]]:
    """Step spans without ProfilerStep annotations: cut the window at each DataLoader fetch (else
    after each optimizer step). With more such marks than steps (a lead-in step profiled before
    the window), the last ``n_steps`` pieces are the window; with none, the window stays whole."""
    if not main_evs:
        return []
    lo = min(e.start for e in main_evs)
    hi = max(e.end for e in main_evs)
    fetches = sorted(e.start for e in main_evs if e.marker == "data" and e.kind == "dataloader")
    opt_steps = sorted(e.end for e in main_evs if e.name.startswith("Optimizer.step"))
    if len(fetches) >= n_steps:
        cuts = fetches[1:]
    elif len(opt_steps) >= n_steps:
        cuts = opt_steps[:-1]
    else:
        cuts = []
    edges = [lo, *(c for c in cuts if lo < c < hi), hi]
    pieces = [(a, b) for a, b in zip(edges, edges[1:], strict=False) if b > a]
    return pieces[-n_steps:] if len(pieces) > n_steps else pieces


def _device_phases(gpu_evs: list[Ev], spans: list[tuple[float, float]], n_steps: int,
                   host_wait: list[tuple[float, float]] | None = None) -> dict[str, float | int] | None:
    """Per-step view of the device timeline (an extra block, absent without device events).

    On a GPU the host runs ahead and may never block where the wait happens, so the host
    phases can miss it; on the device a victim's wait is the NCCL kernel spinning for its
    peers (``comm_exposed``: collective time with no compute kernel or copy running), and a culprit's
    excess is compute kernel time. Compute per phase comes from the op that launched the kernel.
    Where no collective ran on the device (gloo on CUDA tensors: the reduction is the host's, between
    copies; the GPU bench's 4 ranks on one GPU, where NCCL refuses two ranks), the wait is the host's
    for its collectives (``host_wait``, the main thread's comm intervals) while the device ran nothing:
    with none, a victim's device sat "idle" through its wait and every rank's own work was its whole
    step, so no rank could stand out (not yet seen on a GPU: scripts/gpu-check, issue 11).
    Copies are their own time (``transfer``), by direction, with the bytes moved and how many of
    them came from or went to pageable host memory (the slow, synchronous path). Annotations
    take no device time.
    """
    work = [e for e in gpu_evs if e.kind != "annotation"]
    if not work or not spans:
        return None

    def covered(pred: Any) -> list[tuple[float, float]]:
        return _intersect(_union([(e.start, e.end) for e in work if pred(e)]), spans)

    comm = covered(lambda e: e.kind == "collective")
    compute = covered(lambda e: e.kind == "kernel")
    transfer = covered(lambda e: e.kind in ("memcpy", "memset"))
    busy = _union(comm + compute + transfer)
    waited = comm if comm else _intersect(_union(host_wait or []), spans)
    out: dict[str, float] = {
        "busy": _length(busy), "compute": _length(compute), "comm": _length(comm),
        "comm_exposed": _length(_subtract(waited, _union(compute + transfer))),
        "transfer": _length(transfer), "idle": _length(_subtract(spans, busy))}
    for phase in ("forward", "backward", "optimizer"):
        out[phase] = _length(covered(lambda e, phase=phase: e.kind == "kernel" and e.phase == phase))
    lo, hi = spans[0][0], spans[-1][1]
    for direction in ("HtoD", "DtoH", "DtoD", "PtoP"):
        copies = [e for e in work if e.copy == direction and lo <= e.start <= hi]
        if not copies:
            continue
        key = direction.lower()
        out[f"{key}_ms"] = _length(covered(lambda e, d=direction: e.copy == d))
        out[f"{key}_mb"] = sum(e.nbytes for e in copies) / 1e6
        if direction in ("HtoD", "DtoH"):
            out[f"{key}_pageable_mb"] = sum(e.nbytes for e in copies if e.pageable) / 1e6
            out[f"{key}_pageable_ms"] = sum(e.end - e.start for e in copies if e.pageable)
    return {k: _num(v / n_steps) for k, v in out.items()}


def _trim_steps(step_evs: list[Ev], main_starts: list[float]) -> list[Ev]:
    """Drop a stub step at either edge of the window (a ProfilerStep opened by a step() just
    before stop(), or closed right after start()): it would drag every per-step mean down.

    A stub is short *and* nearly empty (few ops compared with the other steps), so a step that is
    merely faster than its preempted neighbours on a busy machine is kept.
    """
    def ops_in(ev: Ev) -> int:
        return bisect.bisect_right(main_starts, ev.end) - bisect.bisect_left(main_starts, ev.start)

    while len(step_evs) >= 2:
        durs = sorted(e.end - e.start for e in step_evs)
        typical = durs[len(durs) // 2]
        counts = sorted(ops_in(e) for e in step_evs)
        typical_ops = counts[len(counts) // 2]

        def stub(ev: Ev, typical: float = typical, typical_ops: int = typical_ops) -> bool:
            return ev.end - ev.start < 0.25 * typical and ops_in(ev) < max(3.0, 0.05 * typical_ops)

        if stub(step_evs[-1]):
            step_evs = step_evs[:-1]
        elif stub(step_evs[0]):
            step_evs = step_evs[1:]
        else:
            break
    return step_evs


def build(events: Any, *, identity: dict[str, Any], capture: dict[str, Any], steps: list[dict[str, Any]],
          gc: dict[str, Any], telemetry: dict[str, Any], main_tid: int | None = None,
          history: dict[str, Any] | None = None, max_functions: int = MAX_FUNCTIONS, size_budget: int = SIZE_BUDGET,
          records: Records | None = None, python: dict[str, Any] | None = None) -> dict[str, Any]:
    """Boil one rank's profiled window down to an ``eroica.summary/1`` dict (in one go; see build_steps)."""
    return drain(build_steps(events, identity=identity, capture=capture, steps=steps, gc=gc, telemetry=telemetry,
                             main_tid=main_tid, history=history, max_functions=max_functions,
                             size_budget=size_budget, records=records, python=python))


def build_steps(events: Any, *, identity: dict[str, Any], capture: dict[str, Any], steps: list[dict[str, Any]],
                gc: dict[str, Any], telemetry: dict[str, Any], main_tid: int | None = None,
                history: dict[str, Any] | None = None, max_functions: int = MAX_FUNCTIONS,
                size_budget: int = SIZE_BUDGET, records: Records | None = None,
                python: dict[str, Any] | None = None) -> Steps[dict[str, Any]]:
    """Boil one rank's profiled window down to an ``eroica.summary/1`` dict, as a stepwise
    computation: it yields every CHUNK events or so (resumable.py), so the runtime can spread it over
    the steps after a window's close instead of stalling the closing step (``build`` drains it).

    ``events`` is either ``prof.events()`` (FunctionEvents) or, much cheaper, the raw
    ``prof.profiler.kineto_results.events()`` (recognised by their ``start_ns()`` method). Raw
    events that started before the capture step's mark (``eroica::step#<capture step>``; the
    capture's lead-in step, when the profiler ran one) are left out, here rather than on the training
    thread at the close.

    Reads only the events it is given (never calls the profiler). Steps are eroica's own step marks
    (``eroica::step#N``, capture.Capture) when present, else the ``ProfilerStep#N`` annotations (a
    profiler schedule makes them: a trace's), else the window cut into ``len(steps)`` pseudo-steps.
    ``main_tid`` is only a hint for that case and is the profiler's thread id
    (``FunctionEvent.thread``), not the OS thread id. The result is shrunk (fewer top functions) until
    its encoding fits ``size_budget`` bytes, so the summary stays small whatever the model. ``steps`` may carry the step clock's per-step ``cpu`` and
    ``runq`` ms; the builder adds each profiled step's ``comm`` (ms blocked in collectives), so the
    engine can tell an excess present in every step from one carried by a single step.
    ``history`` (the step clock's steps before the window) and ``python`` (where the main thread's own
    Python was, pysample.FrameSampler) are passed through. ``records``: a pool
    the raw events' records are taken from and given back to at the end (events.Records: the
    runtime's, so that its summaries add nothing to the garbage collector's count of long-lived
    objects after the first); without it they are made and dropped.
    """
    clock = _Clock()
    lease = records.lease() if records is not None else None
    try:
        return (yield from _paused(_build_steps(events, identity=identity, capture=capture, steps=steps, gc=gc,
                                                telemetry=telemetry, main_tid=main_tid, history=history,
                                                max_functions=max_functions, size_budget=size_budget, clock=clock,
                                                lease=lease, python=python),
                                   clock))
    finally:
        if lease is not None:
            lease.release()


class _Clock:
    """Time spent running a stepwise build, not counting the time it sat suspended (build_ms)."""

    def __init__(self) -> None:
        self.total = 0.0
        self.since = time.perf_counter()

    def pause(self) -> None:
        self.total += time.perf_counter() - self.since

    def resume(self) -> None:
        self.since = time.perf_counter()

    def ms(self) -> float:
        return (self.total + time.perf_counter() - self.since) * 1000.0


def _paused(gen: Steps[dict[str, Any]], clock: _Clock) -> Steps[dict[str, Any]]:
    """Pass ``gen``'s yields on, pausing ``clock`` while suspended."""
    while True:
        try:
            next(gen)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        clock.pause()
        yield
        clock.resume()


def _build_steps(events: Any, *, identity: dict[str, Any], capture: dict[str, Any], steps: list[dict[str, Any]],
                 gc: dict[str, Any], telemetry: dict[str, Any], main_tid: int | None, history: dict[str, Any] | None,
                 max_functions: int, size_budget: int, clock: _Clock, lease: Lease | None,
                 python: dict[str, Any] | None = None) -> Steps[dict[str, Any]]:
    window_start = step_marks(int(capture["step"])) if capture.get("step") is not None else None
    evs = yield from normalize_steps(events, window_start, lease)
    for i, ev in enumerate(evs):
        if not i % CHUNK:
            yield
        classify(ev)
    yield
    prefix = marks_prefix(evs)   # eroica's own step marks, else ProfilerStep#N (a job's own are no steps then)
    step_evs = [ev for ev in evs if not ev.gpu and ev.name.startswith(prefix)]
    yield
    main = _pick_main_thread(evs, step_evs, main_tid)
    yield
    main_starts = sorted(ev.start for ev in evs if ev.thread == main and not ev.gpu
                         and not is_step_mark(ev.name))
    step_evs = _trim_steps(sorted((ev for ev in step_evs if ev.thread == main), key=lambda e: e.start),
                           main_starts)
    k_expected = int(capture.get("k", 0) or 0)
    if 0 < k_expected < len(step_evs):  # a lead-in step the capture did not drop: the window is the last k
        step_evs = step_evs[-k_expected:]
    yield
    evs = [ev for ev in evs if not (not ev.gpu and is_step_mark(ev.name))]
    yield

    by_thread: dict[Any, list[Ev]] = {}
    for ev in evs:
        if not ev.gpu:
            by_thread.setdefault(ev.thread, []).append(ev)
    main_segments: Segments = ([], [], [])
    for t, tevs in by_thread.items():
        segments = yield from _nest_steps(tevs)
        if t == main:
            main_segments = segments
    main_evs = by_thread.get(main, [])
    yield

    # Step spans.
    if step_evs:
        spans = _union([(ev.start, ev.end) for ev in step_evs])
        n_steps = len(step_evs)
        step_source = "profiler"
    else:
        n_steps = max(1, len(steps) or int(capture.get("k", 1) or 1))
        spans = _pseudo_steps(main_evs, n_steps)
        step_source = "window"

    # eroica's own work at the step boundaries (its vote, the window's marks; its wait for the other
    # ranks' votes is a collective of its own, capture.Capture.peer_wait): it
    # runs inside the step's last range (Optimizer.step#..., where torch calls step post-hooks), and
    # is no phase of the rank's step: every phase below is counted over the steps without it
    own_ivs = _intersect(_union([(ev.start, ev.end) for ev in main_evs if ev.name == OWN_RANGE]), spans)
    counted = _subtract(spans, own_ivs) if own_ivs else spans

    # Collectives in flight: gloo/nccl records on any thread, NCCL kernels on the device.
    yield
    inflight = _union([(ev.start, ev.end) for ev in evs if ev.kind == "collective"]
                      + _unclosed_collective(main_evs, evs, main, spans))
    inflight_in = _intersect(inflight, counted)
    # Backward running on a thread other than main (the autograd engine's device threads).
    side_bwd = _union([(ev.start, ev.end) for t, tevs in by_thread.items() if t != main
                       for ev in tevs if ev.marker == "backward"])
    yield
    gpu_compute = _union([(ev.start, ev.end) for ev in evs if ev.gpu and ev.kind == "kernel"])
    yield

    # Positional phases for main-thread work outside any marker: before the step's first
    # backward op -> forward, after its last -> optimizer (loss, grad clipping, user code).
    bwd_marks = _union([(ev.start, ev.end) for ev in main_evs if ev.marker == "backward"] + side_bwd)

    yield
    closures = _closure_ranges(main_evs, bwd_marks)
    yield
    span_starts = [s for s, _ in spans]
    span_passes = _backward_passes(spans, bwd_marks, sorted(ev.start for ev in main_evs if ev.phase is None))

    def positional(t: float) -> str:
        i = bisect.bisect_right(span_starts, t) - 1
        if i < 0 or t > spans[i][1]:
            return "other"
        passes = span_passes[i]
        if not passes or t < passes[0][0]:
            return "forward"
        if t > passes[-1][1]:
            return "optimizer"
        j = bisect.bisect_right(passes, (t, float("inf"))) - 1
        # between two passes: the next micro-batch's forward (gradient accumulation)
        return "backward" if passes[j][1] >= t else "forward"

    # the main thread's self-time segments by what they were: an op's work in its phase, a blocking
    # (sync) call in its phase, or the self time of a record_function region (DDP.forward, a user's
    # "train_step" wrapper), which is Python or an unrecorded wait, never an op: treated like a gap.
    # Grouped in columns (one small code per segment), each group merged in numpy.
    seg_groups: dict[tuple[str, str], int] = {}     # (what, phase) -> code
    code_of: dict[int, int] = {}                # id(event) -> its segments' code
    for i, ev in enumerate(main_evs):
        if not i % CHUNK:
            yield
        if ev.phase is None:
            ev.phase = positional(ev.start)
        if (ev.kind == "annotation" and ev.marker is None) or id(ev) in closures:
            what = "gap"
        elif ev.name in _SYNC or ev.name.startswith(_SYNC_PREFIXES):
            what = "blocking"
        else:
            what = "busy"
        code_of[id(ev)] = seg_groups.setdefault((what, ev.phase if what != "gap" else ""), len(seg_groups))
    seg_s = np.asarray(main_segments[0], dtype=np.float64)
    seg_e = np.asarray(main_segments[1], dtype=np.float64)
    seg_code = np.fromiter((code_of[id(ev)] for ev in main_segments[2]), np.int64, len(main_segments[2]))
    yield
    busy_by_phase: dict[str, list[tuple[float, float]]] = {}   # merged, per phase
    blocking: dict[str, list[tuple[float, float]]] = {}        # phase-owned blocking (sync calls), merged
    gap_like: list[tuple[float, float]] = []
    for (what, phase), code in seg_groups.items():
        sel = seg_code == code
        merged = _union_cols(seg_s[sel], seg_e[sel])
        if what == "gap":
            gap_like = merged
        else:
            (blocking if what == "blocking" else busy_by_phase)[phase] = merged
    comm_ivs: list[tuple[float, float]] = []              # main thread blocked on a collective
    yield
    # where the main thread ran an op: its self-time segments, not the events' own extents. An async
    # record (a pipeline stage's gloo:send, from its start inside "Forward N" to its completion) outlives
    # the range it began in; its tail, clamped off by the nesting, is the thread waiting outside any op
    # (a gap, comm while a collective is in flight), and counted as an op it was in no phase at all
    main_union = _union_cols(main_segments[0], main_segments[1])
    gaps = _union(_subtract(counted, main_union) + gap_like)
    yield

    phases = dict.fromkeys(PHASES, 0.0)
    for ph, ivs in busy_by_phase.items():
        key = ph if ph in ("data", "forward", "backward", "optimizer", "comm") else "host_gap"
        phases[key] += _length(_intersect(_union(ivs), counted))
        yield
    for ph, ivs in blocking.items():
        ivs = _intersect(_union(ivs), counted)
        waiting = _intersect(ivs, inflight)
        phases["comm"] += _length(waiting)
        comm_ivs.extend(waiting)
        key = ph if ph in ("data", "forward", "backward", "optimizer", "comm") else "host_gap"
        phases[key] += _length(ivs) - _length(waiting)
    yield
    gaps = _intersect(gaps, counted)
    in_bwd = _intersect(gaps, side_bwd)
    phases["backward"] += _length(in_bwd)
    rest = _subtract(gaps, in_bwd)
    waiting = _intersect(rest, inflight)
    phases["comm"] += _length(waiting)
    comm_ivs.extend(waiting)
    gap_ms = _length(rest) - _length(waiting)
    gc_ms = float(gc.get("ms", 0.0) or 0.0)
    gc_count = float(gc.get("count", 0.0) or 0.0)
    phases["host_gap"] += max(0.0, gap_ms - gc_ms * n_steps)
    yield
    compute = _union([iv for ph in ("forward", "backward", "optimizer") for iv in busy_by_phase.get(ph, [])]
                     + side_bwd + gpu_compute)
    yield
    phases["comm_total"] = _length(inflight_in)
    phases["overlap"] = _length(_intersect(inflight_in, compute))
    for key in phases:
        phases[key] /= n_steps
    phases["gc"] = gc_ms
    phases["io"] = 0.0
    if step_evs:
        phases["step"] = sum(ev.end - ev.start for ev in step_evs) / n_steps
    elif steps:
        phases["step"] = sum(float(s.get("ms", 0.0)) for s in steps) / len(steps)
    else:
        phases["step"] = _length(spans) / n_steps

    # Phases of non-main CPU threads and of device work (through the launching op: launchers.py,
    # which also ties the work the lead-in step launched to its counterpart in the first step)
    yield
    for tevs in (v for t, v in by_thread.items() if t != main):
        for ev in tevs:
            if ev.phase is None:
                ev.phase = "other"
    ops = launchers.index_ops([main_evs, *(v for t, v in by_thread.items() if t != main)])
    first = (step_evs[0].start, step_evs[0].end) if step_evs else None
    launched_by = yield from launchers.resolve(evs, ops, first)
    for i, ev in enumerate(evs):
        if not i % CHUNK:
            yield
        if ev.gpu:
            ev.self_ms = ev.end - ev.start
            if ev.marker == "comm":
                ev.phase = "comm"
            else:
                launcher = launched_by.get(id(ev))
                ev.phase = launcher.phase if launcher is not None else "other"
        if ev.phase not in FUNCTION_PHASES:
            ev.phase = "other"

    yield
    # the main thread's waits for collectives, as phases["comm"] counts them (the device's own wait,
    # where it runs no collective: _device_phases)
    comm_union = _union(comm_ivs + busy_by_phase.get("comm", []))
    device = _device_phases([ev for ev in evs if ev.gpu], spans, n_steps, comm_union)
    yield

    # the function table covers the window only (not a lead-in step before it); device work that
    # ran during it, whichever step launched it (events.ran_in)
    lo_w = spans[0][0] if spans else float("-inf")
    hi_w = spans[-1][1] if spans else float("inf")
    groups: dict[tuple[str, str, str], tuple[list[float], list[float]]] = {}
    launcher_names: dict[tuple[str, str, str], dict[str, int]] = {}
    device_keys: set[tuple[str, str, str]] = set()
    for i, ev in enumerate(evs):
        if not i % CHUNK:
            yield
        if not ran_in(ev, lo_w, hi_w) if ev.gpu else not lo_w <= ev.start <= hi_w:
            continue
        if (ev.gpu and ev.kind == "annotation") or ev.name == OWN_RANGE:
            continue   # the device-side copy of a record_function range (the host row says it), or eroica
        par = ev.parent
        if par is not None and par.name == ev.name and par.nchild == 1:
            # an op re-dispatching to itself (aten::sum -> aten::sum): one call, as prof.events() has it
            while par.parent is not None and par.parent.name == par.name and par.parent.nchild == 1:
                par = par.parent
            par.self_ms += ev.self_ms
            continue
        key = (ev.name[:NAME_LIMIT], ev.kind, ev.phase or "other")
        durs, selfs = groups.setdefault(key, ([], []))
        durs.append(ev.end - ev.start)
        selfs.append(ev.self_ms)
        if ev.gpu:
            device_keys.add(key)
        if ev.gpu:
            op = launched_by.get(id(ev))
            if op is not None:
                seen = launcher_names.setdefault(key, {})
                seen[op.name] = seen.get(op.name, 0) + 1

    def by_time(items: list[Any]) -> list[Any]:
        return sorted(items, key=lambda kv: (-round(sum(kv[1][0]), 6), kv[0]))

    yield
    host_ranked = by_time([kv for kv in groups.items() if kv[0] not in device_keys])
    dev_ranked = by_time([kv for kv in groups.items() if kv[0] in device_keys])
    yield

    step_rows = [{"step": int(s.get("step", 0)), "ms": _num(s.get("ms", 0.0)),
                  **{k: _num(s[k]) for k in ("cpu", "runq", "stops", "data", "gc") if k in s}} for s in steps]
    if step_evs:
        # the per-step rows of the steps the phases count: not of a stub step dropped at an edge
        # (_trim_steps), which the caller listed with the window's other steps
        kept = {n for n in (step_number(ev.name) for ev in step_evs) if n is not None}
        if any(row["step"] in kept for row in step_rows):
            step_rows = [row for row in step_rows if row["step"] in kept]
        by_number = {row["step"]: row for row in step_rows}
        for ev in step_evs:
            number = step_number(ev.name)
            if number is not None and number in by_number:
                by_number[number]["comm"] = _num(_length(_intersect(comm_union, [(ev.start, ev.end)])))

    host = str(identity.get("host", ""))
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "rank": int(identity.get("rank", 0)), "local_rank": int(identity.get("local_rank", 0)),
        "world_size": int(identity.get("world_size", 1)), "pid": int(identity.get("pid", 0)),
        "host": host,
        "device": dict(identity.get("device") or {"index": None, "uuid": None, "name": None}),
        "groups": list(identity.get("groups") or []),
        "versions": dict(identity.get("versions") or {}),
        "capture": {"step": int(capture.get("step", 0)), "trigger": str(capture.get("trigger", "")),
                    "k": int(capture.get("k", n_steps))},
        "steps": step_rows,
        "functions": [],
        "phases": {k: _num(v) for k, v in phases.items()},
        "gc": {"count": _num(gc_count), "ms": _num(gc_ms)},
        "telemetry": dict(telemetry),
        "profile": {"events": len(evs), "steps": n_steps, "step_source": step_source,
                    "threads": len(by_thread), "build_ms": 0.0},
    }
    if own_ivs:   # eroica's own time at the window's step boundaries, per step, left out of the phases
        doc["profile"]["eroica_ms"] = _num(_length(own_ivs) / n_steps)
    if device is not None:
        doc["device_phases"] = device
    if history:
        doc["history"] = history
    if python:
        doc["python"] = python
    limit = max(0, int(max_functions))
    while True:
        yield
        # device work gets its own share (a quarter) of the budget: thousands of short kernels
        # would otherwise all fold into <other> behind the host ops; an unused share goes back
        dev_n = min(len(dev_ranked), max(limit // 4, limit - len(host_ranked)))
        host_n = min(len(host_ranked), limit - dev_n)
        top = host_ranked[:host_n] + dev_ranked[:dev_n]
        rest_items = host_ranked[host_n:] + dev_ranked[dev_n:]
        fns = []
        for (n, k, p), (d, sf) in top:
            fn = _fn_stats(n, k, p, d, sum(sf), n_steps)
            seen = launcher_names.get((n, k, p))
            if seen:
                fn["launcher"] = max(seen, key=seen.__getitem__)[:NAME_LIMIT]
            fns.append(fn)
        if rest_items:
            durs = [x for _, (d, _) in rest_items for x in d]
            selfs = sum(x for _, (_, sf) in rest_items for x in sf)
            fns.append(_fn_stats(OTHER, "other", "other", durs, selfs, n_steps))
        doc["functions"] = fns
        doc["profile"]["build_ms"] = _num(clock.ms())
        if limit == 0 or len(msgpack.packb(doc, use_bin_type=True)) <= size_budget:
            break
        limit = limit * 3 // 4
    validate(doc, origin=f"rank {doc['rank']}")
    return doc

