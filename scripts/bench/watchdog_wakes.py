"""How often the hang watchdog looks at a healthy job's steps, and what a look costs (docs/benchmarks.md §1c).

    python scripts/bench/watchdog_wakes.py [--step-ms 10] [--seconds 10]

A real ``hang.Watchdog`` thread (no side channel: no stall here reaches its hang threshold) watches
a loop of ``--step-ms`` steps for ``--seconds``: looks a second. Then 20,000 looks and wake
computations timed in this thread, with 5,000 step times behind them.
"""

from __future__ import annotations

import argparse
import time

from eroica_runtime.hang import Watchdog


def watchdog(times: list[float]) -> Watchdog:
    return Watchdog(None, step_times=lambda: times, warmup_steps=5, report_dir=".", factor=1000.0,  # type: ignore[arg-type]
                    floor_s=600.0, action="warn", deadline_s=1.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--step-ms", type=float, default=10.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    times = [args.step_ms] * 100
    dog = watchdog(times)
    looks = 0
    look = dog._look

    def counted() -> None:
        nonlocal looks
        looks += 1
        look()

    dog._look = counted   # type: ignore[method-assign]
    dog.progress(100)
    dog.start()
    t, step = time.monotonic(), 100
    while time.monotonic() - t < args.seconds:
        time.sleep(args.step_ms / 1e3)
        step += 1
        times.append(args.step_ms)
        dog.progress(step)
    dog.stop()
    print(f"{looks / args.seconds:.1f} looks a second over {args.seconds:.0f} s of {args.step_ms:.0f} ms steps")

    busy = watchdog([10.0 + (i % 7) for i in range(5000)])
    busy.progress(5000)
    t0 = time.perf_counter()
    for _ in range(20000):
        busy._look()
        busy._next_wake()
    print(f"{(time.perf_counter() - t0) / 20000 * 1e6:.1f} µs a look and its wake computation")


if __name__ == "__main__":
    main()
