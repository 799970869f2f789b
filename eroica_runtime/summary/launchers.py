"""Which host op launched each piece of device work in a window, the lead-in step's launches included.

A kernel names its launching op by its linked correlation id (``Ev.linked`` is the op's ``corr``).
That op is in the window's records only when the window launched the kernel. On a GPU job the host
runs ahead of the device, by a good part of a step or more, and furthest on the rank whose device is
slowest: the window's first milliseconds of device work were launched in the step before it (the
capture's lead-in, whose host ops are not recorded; an offline window's previous step, left out the
same way). Left unlinked, that work has no launcher and no phase: 11% of the window's device work in
HolisticTraceAnalysis's lagged trace (rank 1 of a 2-rank NCCL job, host ~40 ms ahead of its GPU),
missing from forward/backward/optimizer and from the kernel rows' launchers.

A training step launches the same sequence of device work every step. On one stream the device
runs it in launch order, so what is still running when the window opens is the tail of the
previous steps' sequence. Each such piece takes the launcher of its counterpart in the window's
first step: the same kernel name on the same stream, counted back from the end of that step's
sequence (cyclically, when the host ran more than a step ahead). What a window launched itself but
without a recorded op keeps no launcher: it is not the lead-in's work.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from eroica_runtime.summary.events import Ev
from eroica_runtime.summary.resumable import CHUNK, Steps


def index_ops(threads: Iterable[list[Ev]]) -> dict[int, Ev]:
    """corr -> host op, over the host threads' events (the main thread's first: an id seen twice keeps
    its op). Runtime calls (cudaLaunchKernel) carry CUPTI ids from another number space and a non-zero
    link, so only frontend events (link 0) are indexed."""
    ops: dict[int, Ev] = {}
    for tevs in threads:
        for ev in tevs:
            if ev.corr and not ev.linked:
                ops.setdefault(ev.corr, ev)
    return ops


def resolve(evs: list[Ev], ops: dict[int, Ev], first_step: tuple[float, float] | None) -> Steps[dict[int, Ev]]:
    """id(device event) -> the host op that launched it: by link, else (work the window did not
    launch) by its counterpart in the window's first step ``first_step``. Stepwise (the builder's
    slices)."""
    out: dict[int, Ev] = {}
    linked: list[Ev] = []
    unlinked: list[Ev] = []
    for i, ev in enumerate(evs):
        if not i % CHUNK:
            yield
        if not ev.gpu or ev.kind == "annotation":
            continue
        op = ops.get(ev.linked) if ev.linked else None
        if op is not None:
            out[id(ev)] = op
            linked.append(ev)
        else:
            unlinked.append(ev)
    if not unlinked or first_step is None:
        return out
    calls: set[int] = set()   # the runtime calls (cudaLaunchKernel...) the window recorded
    for lo in range(0, len(evs), CHUNK):
        yield
        calls.update(ev.corr for ev in evs[lo:lo + CHUNK] if not ev.gpu and ev.corr and ev.linked)
    tails: dict[tuple[Any, str], list[Ev]] = {}
    for ev in unlinked:
        if not (ev.corr and ev.corr in calls):   # launched before the window
            tails.setdefault((ev.thread, ev.name), []).append(ev)
    names = {name for _, name in tails}
    lo, hi = first_step
    by_stream: dict[tuple[Any, str], list[Ev]] = {}
    by_name: dict[str, list[Ev]] = {}
    yield
    for ev in linked:
        if ev.name in names and lo <= out[id(ev)].start < hi:
            by_stream.setdefault((ev.thread, ev.name), []).append(ev)
            by_name.setdefault(ev.name, []).append(ev)
    for (stream, name), tail in tails.items():
        ref = by_stream.get((stream, name)) or by_name.get(name)
        if not ref:
            continue
        ref = sorted(ref, key=_launch_order)
        n, m = len(ref), len(tail)
        for i, ev in enumerate(sorted(tail, key=_launch_order)):
            out[id(ev)] = out[id(ref[(n - m + i) % n])]
    return out


def _launch_order(ev: Ev) -> tuple[int, float]:
    """CUPTI correlation ids grow with every launch in the process; the start time breaks ties (and
    orders work a trace recorded without ids)."""
    return ev.corr, ev.start
