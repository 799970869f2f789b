"""Profiler events, read and classified: what each event is (op, kernel, collective, copy...).

Reads either raw kineto events (``prof.profiler.kineto_results.events()``) or FunctionEvents into
one small record type, and tags each with its kind and, for events that define a phase by
themselves (a collective, the optimizer step, a DataLoader fetch, a backward op), its marker.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from typing import Any

from eroica_runtime.summary.resumable import CHUNK, Steps, drain

STEP_PREFIX = "ProfilerStep"
# eroica's live capture marks its window's steps with ranges of its own (capture.Capture), not with
# torch's ProfilerStep#N: a job's own torch.profiler with a schedule opens a ProfilerStep#N range at
# every prof.step(), also in the steps it only waits through, and eroica's profiler records those too.
# Read as the window's steps (a 3-rank job whose profiler waited for step 20 while eroica captured
# 13-15: the same numbers opened twice a step), one all-reduce a step read 0.67, half of
# DistributedDataParallel.forward read as backward and a warning of torch's came with each capture.
# The builder takes eroica's marks where there are any, else ProfilerStep#N (a trace's, offline).
OWN_STEP_PREFIX = "eroica::step"
# eroica's own work at a step boundary, as a profiler range (capture.Capture.own_begin): not the rank's
OWN_RANGE = "eroica::step_boundary"
# the part of it spent waiting for the other ranks' votes (capture.Capture.peer_wait): a wait for a
# peer, as in a collective, and counted as one
PEER_WAIT_RANGE = "eroica::peer_wait"
GPU_DEVICE_TYPES = ("CUDA", "HIP", "XPU", "PrivateUse1", "MTIA")
# (DDP's own reducer ops, "torch.distributed.ddp.reducer::copy_bucket_to_grad" and friends, are
# local copies after the allreduce, not collectives: they keep the phase they run in.)
_COLLECTIVE_PREFIXES = ("gloo:", "nccl:", "c10d::", "c10d_functional::", "_c10d_functional::",
                        "record_param_comms")
_COLLECTIVE_KERNEL_PREFIXES = ("nccl", "ncclDevKernel", "ncclKernel", "rccl")
# CPU calls in which the host blocks on the device (time in them that overlaps a running
# collective is counted as comm).
SYNC_NAMES = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
               "cudaStreamWaitEvent", "cuStreamSynchronize", "cuCtxSynchronize",
               "hipStreamSynchronize", "hipDeviceSynchronize", "aten::_local_scalar_dense",
               "aten::item", "c10d::wait", "aten::wait", "_c10d_functional::wait_tensor")
# DDP's Reducer finalizes backward after the last gradient hook (copies reduced buckets into
# .grad, scales them): still the backward pass, though no autograd node is running.
_DDP_REDUCER_PREFIXES = ("torch.distributed.ddp.reducer::", "torch::distributed::reducer::")
_OPTIMIZER_PREFIXES = ("Optimizer.step#", "Optimizer.zero_grad#", "Optimizer.")
_DATALOADER_MARKERS = ("DataLoader", "DataLoaderIter")
_MEMORY_NAMES = ("[memory]", "[OutOfMemory]")


class Ev:
    """One profiler event reduced to what the builder needs (plain floats, milliseconds)."""

    __slots__ = ("name", "start", "end", "thread", "gpu", "annotation", "scope", "corr",
                 "linked", "kind", "marker", "phase", "self_ms", "parent", "nchild", "nbytes", "copy",
                 "pageable", "activity")

    def __init__(self, name: str, start: float, end: float, thread: Any, gpu: bool,
                 annotation: bool, scope: int, corr: int, linked: int) -> None:
        self.set(name, start, end, thread, gpu, annotation, scope, corr, linked)

    def set(self, name: str, start: float, end: float, thread: Any, gpu: bool,
            annotation: bool, scope: int, corr: int, linked: int) -> Ev:
        """(Re)initialise every field: a new record, or one of the Records pool's."""
        self.name = name
        self.start = start
        self.end = max(end, start)
        self.thread = thread
        self.gpu = gpu
        self.annotation = annotation
        self.scope = scope
        self.corr = corr
        self.linked = linked
        self.kind = "other"
        self.marker: str | None = None
        self.phase: str | None = None
        self.self_ms = self.end - self.start
        self.parent: Ev | None = None
        self.nchild = 0
        self.nbytes = 0               # device copies: bytes moved (from the profiler's metadata)
        self.copy: str | None = None  # device copies: HtoD, DtoH, DtoD, PtoP, HtoH
        self.pageable = False         # device copies: the host side is pageable (not pinned) memory
        self.activity = ""            # kineto's activity type ("kernel", "gpu_memcpy", ...), when known
        return self


class Records:
    """Ev records kept from one window's summary to the next, so that building a summary does not
    push a full garbage collection into the training.

    A window's 10^4-10^5 records live through the summary's slices, i.e. through many of the
    training's young collections, so they reach the oldest generation; CPython's collector counts
    every object that does and runs a full collection once they add up to a quarter of the long-
    lived objects (~290k in a process with torch): ~150 ms in one step after most windows of a
    48k-event window (docs/benchmarks.md §6). Records that stay in the pool are promoted once, by
    the first window; later windows re-initialise them and add nothing to that count (measured:
    no full collection after 16 windows, against 3 in 8 without the pool; §6). Holds at most
    ``limit`` records, and only as many as the largest window used (14 MB for 65,536, measured
    with tracemalloc); a larger window's extra records are made and dropped as before.
    ``lease()`` hands out records for one build and takes all of them back at once
    (``Lease.release``, at the build's end, or when it is abandoned).
    """

    def __init__(self, limit: int = 1 << 16) -> None:
        self.limit = limit
        self._free: list[Ev] = []

    def lease(self) -> Lease:
        return Lease(self)

    def take(self, name: str, start: float, end: float, thread: Any, gpu: bool,
             annotation: bool, scope: int, corr: int, linked: int) -> Ev:
        """A pooled record set to these fields, or a new one when the pool is empty."""
        if self._free:
            return self._free.pop().set(name, start, end, thread, gpu, annotation, scope, corr, linked)
        return Ev(name, start, end, thread, gpu, annotation, scope, corr, linked)

    def give_back(self, records: list[Ev]) -> None:
        """Keep what fits under ``limit``, dropping what the records refer to (names, parents)."""
        kept = records[:max(0, self.limit - len(self._free))]
        for ev in kept:
            ev.name, ev.parent, ev.thread, ev.marker, ev.phase, ev.copy, ev.activity = "", None, 0, None, None, None, ""
        self._free.extend(kept)

    def __len__(self) -> int:
        return len(self._free)

    def __iter__(self) -> Iterator[Ev]:
        return iter(self._free)


class Lease:
    """The records one build took from a pool (see Records)."""

    def __init__(self, pool: Records) -> None:
        self._pool = pool
        self._taken: list[Ev] = []

    def new(self, name: str, start: float, end: float, thread: Any, gpu: bool,
            annotation: bool, scope: int, corr: int, linked: int) -> Ev:
        ev = self._pool.take(name, start, end, thread, gpu, annotation, scope, corr, linked)
        self._taken.append(ev)
        return ev

    def release(self) -> None:
        """Give every record back; the caller must hold none of them any more."""
        taken, self._taken = self._taken, []
        self._pool.give_back(taken)


RECORDS = Records()   # the runtime's pool: one summary is built at a time


_DEVICE_NAMES: dict[Any, str] = {}


def device_type_name(value: Any) -> str:
    """'CUDA' for DeviceType.CUDA (or the string form a raw kineto event gives); cached per value."""
    try:
        return _DEVICE_NAMES[value]
    except (KeyError, TypeError):
        pass
    text = str(getattr(value, "name", value)).rsplit(".", 1)[-1]
    try:
        _DEVICE_NAMES[value] = text
    except TypeError:
        pass
    return text


# Utility records torch's own post-processing drops (torch.autograd.profiler_util._filter_name).
_FILTERED_NAMES = frozenset(("[memory]", "[OutOfMemory]", "profiler::_record_function_enter",
                             "profiler::_record_function_enter_new", "profiler::_record_function_exit",
                             "aten::is_leaf", "aten::output_nr", "aten::_version"))


_DEMANGLED: dict[str, str] = {}


def demangle(name: str) -> str:
    """C++ kernel names as prof.events() shows them (torch's demangler, only if torch is loaded)."""
    if not name.startswith("_Z"):
        return name
    hit = _DEMANGLED.get(name)
    if hit is None:
        torch = sys.modules.get("torch")
        try:
            hit = str(torch._C._demangle(name)) if torch is not None else name
        except Exception:
            hit = name
        _DEMANGLED[name] = hit
    return hit


def ran_in(ev: Ev, lo: float, hi: float = float("inf")) -> bool:
    """Whether device work belongs to the window [lo, hi) of the host's steps: whether it ran then,
    whichever step launched it (a kernel running across an edge counts; the device timeline is
    clipped to the steps anyway).

    Why not by launch: the host runs ahead of the device, by a step or more on an asynchronous NCCL
    job, and furthest on the rank whose device is slowest. Device work taken by launch and then
    clipped to the host's steps loses that lead at both ends of the window: 12 ms a step of an
    8-GPU job's 87 ms of kernels (HolisticTraceAnalysis's trace_diff trace, whose host is ~36 ms
    ahead), and most of all on the culprit. Host events belong to the window they start in."""
    return ev.end > lo and ev.start < hi


def _in_window(ev: Ev, t0: float) -> bool:
    """The live capture's cut at its window's first step (``t0``): the lead-in step's host events go,
    device work still running at ``t0`` stays (``ran_in``)."""
    return ran_in(ev, t0) if ev.gpu else ev.start >= t0


def step_marks(step: int) -> tuple[str, str]:
    """The names a window's first step ``step`` is marked by, in the order they are taken: eroica's
    own, then torch's (a trace's, or records from before eroica marked its own)."""
    return f"{OWN_STEP_PREFIX}#{step}", f"{STEP_PREFIX}#{step}"


def is_step_mark(name: str) -> bool:
    """A step's mark (eroica's or torch's ProfilerStep#N): an annotation of the window, no work
    (eroica's marks are told from its other ranges, OWN_RANGE, by their "#")."""
    return name.startswith(STEP_PREFIX) or name.startswith(OWN_STEP_PREFIX + "#")


def marks_prefix(evs: list[Ev]) -> str:
    """The prefix of the marks that are the window's steps (names start with it): eroica's own
    ("eroica::step#") where it marked any (the job's own ProfilerStep#N ranges are then no steps of the
    window), else torch's."""
    own = OWN_STEP_PREFIX + "#"
    return own if any(not ev.gpu and ev.name.startswith(own) for ev in evs) else STEP_PREFIX


def step_number(name: str) -> int | None:
    """N of a step mark "<prefix>#N", or None."""
    number = name.rpartition("#")[2]
    return int(number) if number.isdigit() else None


def _window_cut(found: dict[str, int | float], window_start: str | tuple[str, ...] | None) -> int | float | None:
    """The start of the first of ``window_start``'s names that was found."""
    names = (window_start,) if isinstance(window_start, str) else window_start or ()
    return next((found[n] for n in names if n in found), None)


def normalize_raw(events: Any, window_start: str | tuple[str, ...] | None = None) -> list[Ev]:
    """Read raw kineto events (``prof.profiler.kineto_results.events()``, methods not fields).

    About 100x cheaper than ``prof.events()``, which builds FunctionEvents and an op tree the
    builder does not need. Mirrors torch's post-processing: drops the same utility records and
    moves device-runtime calls (cudaLaunchKernel...) onto the thread of the op that made them.
    With ``window_start`` (``step_marks(first window step)``: the first of its names found), the host
    events that started before that annotation (the capture's lead-in step) are left out, and the
    device work that had ended by then (``ran_in``).
    """
    return drain(normalize_raw_steps(events, window_start))


def normalize_raw_steps(events: Any, window_start: str | tuple[str, ...] | None = None,
                        lease: Lease | None = None) -> Steps[list[Ev]]:
    """``normalize_raw`` as a stepwise computation (yields every CHUNK events; see resumable.py).
    With ``lease``, the records come from its pool (Records)."""
    make = lease.new if lease is not None else Ev
    raw = events if isinstance(events, list) else list(events)
    if not raw:
        return []
    out: list[Ev] = []
    has_activity = callable(getattr(raw[0], "activity_type", None))
    has_meta = callable(getattr(raw[0], "metadata_json", None))
    has_hidden = callable(getattr(raw[0], "is_hidden_event", None))
    cpu_type: Any = None          # the (one) host device type value, compared without naming it
    starts: list[int] = []
    marks = (window_start,) if isinstance(window_start, str) else window_start or ()
    found: dict[str, int] = {}    # start (ns) of each of the window's first-step marks seen
    # one pass of method calls (each is a pybind call: the cost of this function), times made
    # relative afterwards
    for i, ke in enumerate(raw):
        if not i % CHUNK:
            yield
        name = ke.name()
        if name in _FILTERED_NAMES or (has_hidden and ke.is_hidden_event()):
            continue
        dtype = ke.device_type()
        if cpu_type is not None and dtype == cpu_type:
            gpu = False
        else:
            gpu = device_type_name(dtype) in GPU_DEVICE_TYPES
            if not gpu and device_type_name(dtype) == "CPU":
                cpu_type = dtype
        start = ke.start_ns()
        if name in marks and not gpu and name not in found:
            found[name] = start
        starts.append(start)
        if gpu:
            activity = str(ke.activity_type()) if has_activity else ""
            ev = make(demangle(name), start, ke.end_ns(), ("gpu", ke.device_index(), ke.device_resource_id()), True,
                    bool(ke.is_user_annotation()) or activity.endswith("user_annotation"), 0,
                    int(ke.correlation_id() or 0), int(ke.linked_correlation_id() or 0))
            ev.activity = activity
            if activity == "gpu_memcpy" or name.startswith("Memcpy"):
                ev.nbytes = copy_bytes(ke.metadata_json() if has_meta else "")
        else:
            ev = make(name, start, ke.end_ns(), ke.start_thread_id(), False, bool(ke.is_user_annotation()),
                    int(ke.scope() or 0), int(ke.correlation_id() or 0), int(ke.linked_correlation_id() or 0))
        out.append(ev)
    t0 = _window_cut(found, marks)
    if t0 is not None:
        out = [ev for ev in out if _in_window(ev, t0)]
        starts = [ev.start for ev in out]
    yield
    base = min(starts) if starts else 0
    op_thread: dict[int, Any] = {}
    for i, ev in enumerate(out):
        if not i % (4 * CHUNK):
            yield
        ev.start = (ev.start - base) / 1e6
        ev.end = max((ev.end - base) / 1e6, ev.start)
        ev.self_ms = ev.end - ev.start
        if not ev.gpu and not ev.linked and ev.corr:
            op_thread[ev.corr] = ev.thread
    for i, ev in enumerate(out):
        if not i % (4 * CHUNK):
            yield
        if not ev.gpu and ev.linked and ev.linked in op_thread:
            ev.thread = op_thread[ev.linked]
    return out


def normalize_steps(events: Any, window_start: str | tuple[str, ...] | None = None,
                    lease: Lease | None = None) -> Steps[list[Ev]]:
    """``normalize`` as a stepwise computation: raw kineto events are read in pieces (their records
    from ``lease``'s pool, when given), FunctionEvents in one go (offline and tests only); both are
    cut at ``window_start`` (the profiler's forms of the same window tell the same story). Ev records
    (a chrome trace, already selected) pass through."""
    if not isinstance(events, list | tuple):
        events = list(events)
    if events and callable(getattr(events[0], "start_ns", None)):
        return (yield from normalize_raw_steps(events, window_start, lease))
    if (events and isinstance(events[0], Ev)) or window_start is None:
        return normalize(events)
    evs = normalize(events)
    found: dict[str, int | float] = {}
    for ev in evs:
        if not ev.gpu:
            found.setdefault(ev.name, ev.start)
    t0 = _window_cut(found, window_start)
    return evs if t0 is None else [ev for ev in evs if _in_window(ev, t0)]


def normalize(events: Any) -> list[Ev]:
    """Read FunctionEvents (fast path: the torch 2.x attributes; else field by field, defaulted);
    Ev records already read from a chrome trace (summary/chrome.py) pass through."""
    if not isinstance(events, list | tuple):
        events = list(events)
    if events and isinstance(events[0], Ev):  # already read (a chrome trace: summary/chrome.py)
        return list(events)
    if events and callable(getattr(events[0], "start_ns", None)):
        return normalize_raw(events)
    out: list[Ev] = []
    for fe in events:
        try:
            name = fe.trace_name or fe.name
            tr = fe.time_range
            start, end = tr.start / 1000.0, tr.end / 1000.0
            dev = device_type_name(fe.device_type)
            thread = fe.thread
            annotation, scope = fe.is_user_annotation, fe.scope
            corr, linked = fe.id, fe.linked_correlation_id
        except AttributeError:
            name = getattr(fe, "trace_name", None) or getattr(fe, "name", "") or ""
            tr = getattr(fe, "time_range", None)
            if tr is None:
                continue
            start, end = float(tr.start) / 1000.0, float(tr.end) / 1000.0
            dev = device_type_name(getattr(fe, "device_type", "CPU"))
            thread = getattr(fe, "thread", 0)
            annotation, scope = getattr(fe, "is_user_annotation", False), getattr(fe, "scope", 0)
            corr, linked = getattr(fe, "id", 0), getattr(fe, "linked_correlation_id", 0)
        if name in _MEMORY_NAMES:
            continue
        gpu = dev in GPU_DEVICE_TYPES
        if gpu:  # streams share small ids with CPU threads: keep them apart
            thread = ("gpu", getattr(fe, "device_index", 0), getattr(fe, "device_resource_id", thread))
        out.append(Ev(str(name), start, end, thread, gpu, bool(annotation), int(scope or 0),
                       int(corr or 0), int(linked or 0)))
    return out


_COPY = re.compile(r"Memcpy (HtoD|DtoH|DtoD|PtoP|HtoH|DtoA|AtoD|AtoH|HtoA|AtoA)(?: \((\w+) -> (\w+)\))?")
_BYTES = re.compile(r'"bytes":\s*(\d+)')


def copy_bytes(metadata: str) -> int:
    """Bytes of a device copy from kineto's metadata ('"bytes": 4000, ...'); 0 when absent."""
    m = _BYTES.search(metadata or "")
    return int(m.group(1)) if m else 0


def parse_copy(name: str) -> tuple[str | None, bool]:
    """("HtoD", pageable?) from "Memcpy HtoD (Pageable -> Device)"; (None, False) for other names."""
    m = _COPY.match(name)
    if not m:
        return None, False
    direction, src, dst = m.group(1), (m.group(2) or "").lower(), (m.group(3) or "").lower()
    return direction, "pageable" in (src, dst)


# what classify decided, per (name, gpu, annotation, backward scope, activity): a window repeats a few
# hundred names tens of thousands of times, and the string tests were ~5% of a build
_CLASSES: dict[tuple[str, bool, bool, bool, str], tuple[str, str | None, str | None, bool]] = {}
_CLASSES_LIMIT = 1 << 16


def classify(ev: Ev) -> None:
    """Set the function kind and, for events that define a phase by themselves, the marker.

    Device events are what the device did: compute kernels, collective (NCCL/RCCL) kernels, copies
    (with direction and whether the host memory was pageable), memsets; the device-side copies of
    record_function ranges (ProfilerStep#N, DistributedDataParallel.forward, nccl:all_reduce...) are
    annotations, never kernels, and take no device time.
    """
    key = (ev.name, ev.gpu, ev.annotation, ev.scope == 1, ev.activity)
    hit = _CLASSES.get(key)
    if hit is None:
        hit = _class_of(*key)
        if len(_CLASSES) >= _CLASSES_LIMIT:   # names are bounded in practice; memory must be too
            _CLASSES.clear()
        _CLASSES[key] = hit
    ev.kind, ev.marker, ev.copy, ev.pageable = hit


def _class_of(name: str, gpu: bool, annotation: bool, backward_scope: bool,
              act: str) -> tuple[str, str | None, str | None, bool]:
    """(kind, marker, copy direction, pageable) of an event: classify's rules."""
    if gpu:
        low = name.lower()
        if annotation or act.endswith("user_annotation"):
            return "annotation", None, None, False
        if act == "gpu_memcpy" or low.startswith("memcpy"):
            return ("memcpy", None, *parse_copy(name))
        if act == "gpu_memset" or low.startswith("memset"):
            return "memset", None, None, False
        if name.startswith(_COLLECTIVE_KERNEL_PREFIXES) or "nccl" in low or "rccl" in low:
            return "collective", "comm", None, False
        return "kernel", None, None, False
    if (name.startswith(_COLLECTIVE_PREFIXES) or ("nccl" in name.lower() and not name.startswith("cuda"))
            or name == PEER_WAIT_RANGE):
        return "collective", "comm", None, False
    if name.startswith(_OPTIMIZER_PREFIXES):
        return "optimizer", "optimizer", None, False
    if annotation and any(m in name for m in _DATALOADER_MARKERS):
        return "dataloader", "data", None, False
    if name.startswith("autograd::engine::evaluate_function") or backward_scope or name.startswith(_DDP_REDUCER_PREFIXES):
        return "cpu_op", "backward", None, False
    if annotation:
        return "annotation", None, None, False
    return "cpu_op", None, None, False
