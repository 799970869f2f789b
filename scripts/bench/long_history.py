#!/usr/bin/env python3
"""What rank 0's analyst thread spends per capture on a long job's step history (issue: a job that
runs for days keeps being captured, so this is paid again every refill period, holding the GIL the
training thread needs).

Per capture the analyst (analyst.py) measures the time lost so far twice (``Runtime._time_lost``:
engine/timelost.py over every step), rewrites ``steps.msgpack`` (report.write_steps) and report.json
/ report.html, which read it back (report.load_steps). This times those calls on a synthetic history
of N steps (a 40 ms job, +8 ms from the middle, two captures) and the memory a rank's history takes.

    python scripts/bench/long_history.py [--steps 10000,100000,1200000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from eroica_runtime import report  # noqa: E402
from eroica_runtime.config import Config  # noqa: E402
from eroica_runtime.engine import timelost  # noqa: E402
from eroica_runtime.stepclock import StepClock  # noqa: E402


def history(n: int) -> list[float]:
    rng = np.random.default_rng(0)
    ms = 40.0 + rng.normal(0.0, 2.0, n)
    ms[n // 2:] += 8.0
    return [float(x) for x in np.abs(ms)]


def clock_bytes(values: list[float]) -> int:
    """Bytes a StepClock's history holds after len(values) steps (its own container, filled as a job does)."""
    clock = StepClock(lambda step, ms: None)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for v in values:
        clock.all_ms.append(v + 0.0)
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return used


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", default="10000,100000,1200000")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    cfg = Config()
    reach = timelost.onset_reach(cfg.spike_steps, cfg.vote_lag, cfg.drift_window, cfg.lost_window)
    print("| steps | history in a rank | time lost (x2) | write steps.msgpack | report.json+html (reads it) | "
          "per capture |")
    print("|---|---|---|---|---|---|")
    for n in (int(s) for s in args.steps.split(",")):
        values = history(n)
        held = clock_bytes(values)
        clock = StepClock(lambda step, ms: None)
        for v in values:
            clock.all_ms.append(v)
        windows = [(14, 3), (n // 2 + 10, 3)]
        lost, write, job = [], [], []
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                for _ in range(2):
                    timelost.time_lost(clock.all_ms[:], windows, n // 2 + 10, warmup=cfg.warmup_steps,
                                       lookback=timelost.lookback(cfg.spike_steps, cfg.vote_lag), reach=reach)
                t1 = time.perf_counter()
                report.write_steps(tmp, clock.all_ms[:])
                t2 = time.perf_counter()
                report.write_job(tmp, diagnoses=[], world_size=4, steps=n + 1, job={})
                t3 = time.perf_counter()
                lost.append(t1 - t0)
                write.append(t2 - t1)
                job.append(t3 - t2)
        med = [statistics.median(x) * 1e3 for x in (lost, write, job)]
        print(f"| {n:,} | {held / 2**20:.1f} MB | {med[0]:.0f} ms | {med[1]:.0f} ms | {med[2]:.0f} ms | "
              f"{sum(med):.0f} ms |")


if __name__ == "__main__":
    main()
