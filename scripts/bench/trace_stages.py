"""Where `eroica analyze --traces` spends its time and memory on one trace, stage by stage.

Why: the whole command's /usr/bin/time figure (docs/benchmarks.md, "Analysing existing traces")
does not say whether the JSON parsing, the event records or the summary builder dominate; this runs
the same calls one at a time on one trace (default window, GC paused as the command does) and
prints CPU seconds and the peak RSS after each.

    python scripts/bench/trace_stages.py /tmp/big/g1/rank-0.json
    python scripts/bench/trace_stages.py tests/data/traces/hta-trace_diff-test.json.gz --builds 5

``--builds N`` builds the window's summary N more times and prints the min and median wall ms of
``summary.build``: run it alternately from two checkouts (``PYTHONPATH=<worktree>``) to compare builders.
"""

from __future__ import annotations

import argparse
import gc
import resource
import statistics
import sys
import time
from pathlib import Path

from eroica_launch import tracefile, tracejob
from eroica_runtime.summary import build, chrome


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--builds", type=int, default=0, help="time summary.build this many more times")
    args = ap.parse_args(argv)
    t = time.process_time()
    info = tracefile.inspect(args.trace)
    print(f"first look (header + step scan): {time.process_time() - t:.1f} s CPU")
    gc.disable()
    t = time.process_time()
    reader = tracefile.read(info)
    print(f"read (ijson + records): {time.process_time() - t:.1f} s CPU, peak {_peak_mb():.0f} MB, "
          f"{len(reader.events):,} events")
    (window,) = tracejob.choose_windows([info], [], None)
    t = time.process_time()
    events = chrome.select(reader, list(window.steps))
    print(f"select the window ({len(window.steps)} steps): {time.process_time() - t:.1f} s CPU")
    t = time.process_time()
    build(events, identity={"rank": info.rank or 0, "world_size": info.world_size or 1},
          capture={"step": window.first, "trigger": "traces", "k": len(window.steps)},
          steps=[{"step": n, "ms": 1.0} for n in window.steps], gc={"count": 0, "ms": 0}, telemetry={})
    print(f"summary.build: {time.process_time() - t:.1f} s CPU, peak {_peak_mb():.0f} MB")
    walls = []
    for _ in range(max(0, args.builds)):
        events = chrome.select(reader, list(window.steps))
        t = time.perf_counter()
        build(events, identity={"rank": info.rank or 0, "world_size": info.world_size or 1},
              capture={"step": window.first, "trigger": "traces", "k": len(window.steps)},
              steps=[{"step": n, "ms": 1.0} for n in window.steps], gc={"count": 0, "ms": 0}, telemetry={})
        walls.append((time.perf_counter() - t) * 1e3)
    if walls:
        print(f"summary.build x{len(walls)}: min {min(walls):.1f} ms, median {statistics.median(walls):.1f} ms "
              f"({len(events):,} events in the window)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
