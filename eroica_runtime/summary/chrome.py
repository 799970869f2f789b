"""Chrome traces (torch.profiler's ``export_chrome_trace``, Kineto JSON) read into ``Ev`` records.

Why: many teams already hold one trace per rank from a slow job. Read into the same records the live
runtime reads from kineto, a trace goes through the one summary builder (``build.build``) and the one
engine, so a trace and a live capture of the same fault get the same diagnosis.

What is read (complete events, ``ph: "X"``, ``ts``/``dur`` in microseconds):

- host: ``cpu_op``, ``user_annotation`` (ProfilerStep#N, DataLoader fetches, optimizer steps, the
  record_function ranges of gloo/nccl collectives) and device runtime/driver calls (``cuda_runtime``...);
- device: ``kernel``, ``gpu_memcpy`` (direction from the name, bytes from ``args.bytes``),
  ``gpu_memset``, ``gpu_user_annotation``;
- ``python_function`` events named "Python GC" (recorded with ``with_stack=True`` and
  ``record_python_gc_info``): GC pauses, which the live runtime measures with gc.callbacks. Other
  Python-function events are dropped: the live runtime never records them, and as ops their self time
  would hide the host gaps the builder looks for.

Flows, instant and metadata events and the profiler's own span are skipped. This module only turns
event dicts into records; reading files is ``eroica_launch/tracefile.py``'s job.
"""

from __future__ import annotations

import math
from typing import Any

from eroica_runtime.summary.events import _FILTERED_NAMES, STEP_PREFIX, Ev, ran_in

DEVICE_CATS = frozenset(("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"))
HOST_CATS = frozenset(("cpu_op", "user_annotation"))
RUNTIME_SUFFIXES = ("_runtime", "_driver")   # cuda_runtime, cuda_driver, xpu_runtime, privateuse1_driver...
GC_EVENT = "Python GC"


def _num(x: Any) -> bool:
    """A finite JSON number (booleans are not numbers)."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _int(x: Any) -> int:
    return int(x) if _num(x) else 0


def _key(x: Any) -> Any:
    """A pid/tid/stream value usable in a dict key (traces write ints, sometimes strings)."""
    return x if isinstance(x, int | float | str) else repr(x)


class Reader:
    """Chrome-trace event dicts in, one at a time as a streaming parser yields them; ``Ev`` records out.

    Times become milliseconds from the first event read. Names and thread keys are shared between
    records (a trace repeats a few thousand names millions of times), so memory follows the event
    count, not the JSON's size.
    """

    def __init__(self) -> None:
        self.events: list[Ev] = []
        self.steps: dict[int, Ev] = {}                  # ProfilerStep#N on the host, by N
        self.gc: list[tuple[float, float]] = []         # Python GC pauses (start, end)
        self.runtime: dict[int, Ev] = {}                # device runtime calls, by correlation id
        self.devices: set[int] = set()                  # device indexes that ran work
        self.skipped = 0                                # malformed events (no name, no time)
        self._base: float | None = None
        self._names: dict[str, str] = {}
        self._threads: dict[tuple[Any, ...], tuple[Any, ...]] = {}

    def _thread(self, *key: Any) -> tuple[Any, ...]:
        key = tuple(_key(k) for k in key)
        return self._threads.setdefault(key, key)

    def add(self, e: Any) -> None:
        """Read one trace event (anything that is not a complete host/device event is ignored)."""
        if not isinstance(e, dict) or e.get("ph") != "X":
            return
        cat = e.get("cat")
        if not isinstance(cat, str):
            return
        device = cat in DEVICE_CATS
        runtime = not device and cat.endswith(RUNTIME_SUFFIXES)
        if not (device or runtime or cat in HOST_CATS or cat == "python_function"):
            return
        name, ts, dur = e.get("name"), e.get("ts"), e.get("dur", 0)
        if not isinstance(name, str) or not _num(ts) or not _num(dur):
            self.skipped += 1
            return
        if self._base is None:
            self._base = ts
        start = (ts - self._base) / 1000.0
        end = start + max(dur, 0.0) / 1000.0
        args = e.get("args")
        if not isinstance(args, dict):
            args = {}
        if cat == "python_function":
            if name == GC_EVENT:
                self.gc.append((start, end))
            return
        if name in _FILTERED_NAMES:
            return
        name = self._names.setdefault(name, name)
        if device:
            dev = args.get("device", e.get("pid"))
            ev = Ev(name, start, end, self._thread("gpu", dev, args.get("stream", e.get("tid"))), True,
                    cat == "gpu_user_annotation", 0, _int(args.get("correlation")), _int(args.get("External id")))
            ev.activity = cat
            if cat == "gpu_memcpy":
                ev.nbytes = _int(args.get("bytes"))
            if isinstance(dev, int) and not isinstance(dev, bool) and cat != "gpu_user_annotation":
                self.devices.add(dev)
        elif runtime:
            ev = Ev(name, start, end, self._thread(e.get("pid"), e.get("tid")), False, False, 0, 0,
                    _int(args.get("External id")))
            corr = _int(args.get("correlation"))
            if corr:
                self.runtime[corr] = ev
        else:
            ev = Ev(name, start, end, self._thread(e.get("pid"), e.get("tid")), False,
                    cat == "user_annotation", 0, _int(args.get("External id")), 0)
            if name.startswith(STEP_PREFIX):
                number = name[len(STEP_PREFIX) + 1:]
                if number.isdigit():
                    old = self.steps.get(int(number))
                    if old is None or end - start > old.end - old.start:
                        self.steps[int(number)] = ev
        self.events.append(ev)

    def finish(self) -> list[Ev]:
        """Tie runtime calls and device work to the ops that made them; return the records.

        A kernel names its launching op by ``args["External id"]``. Older traces give kernels the
        runtime call's own id there instead; such a kernel is tied through its runtime call (same
        ``correlation``) to the innermost op around that call on the call's thread. Runtime calls move
        to their op's thread, as the live reader does.
        """
        if not self.runtime and not self.devices:
            return self.events
        ops = {ev.corr: ev for ev in self.events if not ev.gpu and ev.corr and not ev.linked}
        for call in self.runtime.values():
            op = ops.get(call.linked)
            if op is not None:
                call.thread = op.thread
        loose = [ev for ev in self.events if ev.gpu and not ev.annotation
                 and (ev.linked == ev.corr or ev.linked not in ops)]
        calls = [c for c in (self.runtime.get(ev.corr) for ev in loose) if c is not None]
        around = _innermost_ops(self.events, calls) if calls else {}
        for ev in loose:
            call = self.runtime.get(ev.corr)
            op = around.get(id(call)) if call is not None else None
            if op is not None:
                ev.linked = op.corr
            elif ev.linked not in ops:
                ev.linked = 0
        return self.events


def _innermost_ops(events: list[Ev], calls: list[Ev]) -> dict[int, Ev]:
    """id(call) -> the innermost host op running on the call's thread when the call started."""
    ops_by_thread: dict[Any, list[Ev]] = {}
    for ev in events:
        if not ev.gpu and ev.corr and not ev.linked:
            ops_by_thread.setdefault(ev.thread, []).append(ev)
    calls_by_thread: dict[Any, list[Ev]] = {}
    for call in calls:
        calls_by_thread.setdefault(call.thread, []).append(call)
    out: dict[int, Ev] = {}
    for thread, cs in calls_by_thread.items():
        ops = sorted(ops_by_thread.get(thread, []), key=lambda e: (e.start, -e.end))
        stack: list[Ev] = []
        i = 0
        for call in sorted(cs, key=lambda e: e.start):
            while i < len(ops) and ops[i].start <= call.start:
                while stack and stack[-1].end <= ops[i].start:
                    stack.pop()
                stack.append(ops[i])
                i += 1
            while stack and stack[-1].end < call.start:
                stack.pop()
            if stack:
                out[id(call)] = stack[-1]
    return out


def select(reader: Reader, steps: list[int]) -> list[Ev]:
    """The records of one capture window (ProfilerStep#N for N in ``steps``), as a live capture of
    those steps would have recorded them: host events that start inside the window, the device
    work that ran during it (``events.ran_in``: whichever step launched it, as the live capture
    records the device from its lead-in step on), and only the window's own ProfilerStep marks.

    Resets what a previous build wrote into the records, so windows of one trace can be built one
    after the other (they must not overlap).
    """
    marks = [reader.steps[n] for n in steps]
    lo = min(m.start for m in marks)
    hi = max(m.end for m in marks)
    chosen = {id(m) for m in marks}
    out: list[Ev] = []
    for ev in reader.events:
        if ev.gpu:
            keep = ran_in(ev, lo, hi)
        elif ev.name.startswith(STEP_PREFIX):
            keep = id(ev) in chosen
        else:
            keep = lo <= ev.start < hi
        if keep:
            ev.phase, ev.parent, ev.nchild, ev.marker = None, None, 0, None
            ev.self_ms = ev.end - ev.start
            out.append(ev)
    return out


def gc_pauses(reader: Reader, steps: list[int]) -> dict[str, float]:
    """Python GC pauses inside the window, per step (the live runtime's ``gc`` block); zero when the
    trace was recorded without GC events."""
    marks = [reader.steps[n] for n in steps]
    lo = min(m.start for m in marks)
    hi = max(m.end for m in marks)
    pauses = [e - s for s, e in reader.gc if lo <= s < hi]
    n = max(1, len(steps))
    return {"count": len(pauses) / n, "ms": sum(pauses) / n}
