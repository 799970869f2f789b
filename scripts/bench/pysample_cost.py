"""What the capture window's frame sampler (eroica_runtime/pysample.py) costs the main thread.

    python scripts/bench/pysample_cost.py [--rounds 7] [--seconds 1.0]

Interleaved rounds of the same work on the main thread, with the sampler on and off: pure Python (a
loop the sampler takes the GIL from every switch interval) and torch matmuls with a gloo-like wait
(time.sleep, which releases the GIL). Prints each round's ratio (work done with the sampler on over
off; < 1 is a cost) and their median and spread.
"""

from __future__ import annotations

import argparse
import statistics
import time

from eroica_runtime.pysample import FrameSampler


def python_work(seconds: float) -> int:
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        acc = 0.0
        for x in range(2000):
            acc = 0.9 * acc + 0.1 * x
        n += 1
    return n


def torch_work(seconds: float) -> int:
    import torch

    torch.set_num_threads(1)
    a = torch.randn(256, 256)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            a = torch.tanh(a @ a)
        time.sleep(0.001)
        n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=1.0)
    args = ap.parse_args()
    for name, work in (("pure Python", python_work), ("torch ops + sleeps", torch_work)):
        ratios = []
        for i in range(args.rounds):
            order = (False, True) if i % 2 == 0 else (True, False)
            done = {}
            for on in order:
                sampler = FrameSampler()
                if on:
                    sampler.start()
                done[on] = work(args.seconds)
                sampler.stop()
            ratios.append(done[True] / done[False])
        print(f"{name}: on/off {statistics.median(ratios):.3f} (median of {args.rounds}; "
              f"{min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
