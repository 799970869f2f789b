"""How right the launcher and phase given to a window's lead-in device work are, on a trace that says.

A chrome trace holds every step's host ops, so the device work a window's previous step launched
(which a live window has no op for: ``summary/launchers.py`` gives it its first-step counterpart's)
can be checked against the trace itself: its launcher is the op its ``External id`` names, and its
phase is the one the builder gives it when that previous step is part of the window. Prints, for the
window of steps 2-5 of the trace's ProfilerSteps (or ``--first``), how much device work was launched
before it, and how much of it got the trace's own launcher and phase.

    python scripts/bench/launcher_truth.py tests/data/traces/hta-trace_diff-test.json.gz
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from eroica_launch import tracefile
from eroica_runtime.summary import build, chrome, launchers
from eroica_runtime.summary.resumable import drain


def _built(reader: Any, steps: list[int]) -> list[Any]:
    evs = chrome.select(reader, steps)
    build(evs, identity={"rank": 0, "world_size": 1}, capture={"step": steps[0], "k": len(steps)},
          steps=[], gc={}, telemetry={})
    return evs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--first", type=int, default=None, help="the window's first step (default: the 2nd)")
    ap.add_argument("--k", type=int, default=4, help="window steps")
    args = ap.parse_args(argv)
    if args.k < 1:
        ap.error(f"--k {args.k}: a window needs at least 1 step")
    reader = tracefile.read(tracefile.inspect(args.trace))
    steps = sorted(reader.steps)
    first = args.first if args.first is not None else steps[1]
    if first not in steps or steps.index(first) == 0 or steps.index(first) + args.k > len(steps):
        print(f"{args.trace}: needs a step before the window and {args.k} in it (steps {steps})")
        return 2
    i = steps.index(first)
    truth = {id(ev): ev.phase for ev in _built(reader, steps[i - 1:i + args.k]) if ev.gpu}
    window = _built(reader, steps[i:i + args.k])
    ops = {ev.corr: ev.name for ev in reader.events if not ev.gpu and ev.corr and not ev.linked}
    in_window = {ev.corr for ev in window if not ev.gpu and ev.corr and not ev.linked}
    early = [ev for ev in window if ev.gpu and not ev.annotation and ev.linked not in in_window]
    # what the builder gave each piece: its phase, and (by the same rule) its launcher's name
    by_thread: dict[Any, list[Any]] = {}
    for ev in window:
        if not ev.gpu:
            by_thread.setdefault(ev.thread, []).append(ev)
    marks = sorted((ev for ev in window if not ev.gpu and ev.name.startswith("ProfilerStep")), key=lambda e: e.start)
    given = drain(launchers.resolve(window, launchers.index_ops(by_thread.values()), (marks[0].start, marks[0].end)))
    ms = sum(ev.end - ev.start for ev in early)
    phase_ok = sum(ev.end - ev.start for ev in early if ev.phase == truth.get(id(ev)))
    op_ok = sum(ev.end - ev.start for ev in early
                if id(ev) in given and ev.linked in ops and given[id(ev)].name == ops[ev.linked])
    device = [ev for ev in window if ev.gpu and not ev.annotation]
    print(f"{args.trace.name}: window steps {steps[i]}-{steps[i + args.k - 1]}, {len(device):,} device events "
          f"({sum(e.end - e.start for e in device):.1f} ms); launched before it: {len(early):,} ({ms:.1f} ms)")
    print(f"  phase as the trace says: {phase_ok:.1f} of {ms:.1f} ms; launcher as the trace says: {op_ok:.1f} of {ms:.1f} ms")
    print(f"  by phase (the trace's, given): {dict(Counter((truth.get(id(ev)), ev.phase) for ev in early))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
