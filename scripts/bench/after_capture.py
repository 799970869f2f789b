#!/usr/bin/env python3
"""Does anything stay switched on after an eroica capture window? Per-op cost of a tiny op
(``x.add(1)`` on a 4-element tensor, one thread) before and after one ``Capture`` window driven as the
runtime drives it (start, lead-in step, marks, stop), in this process. A profiler callback left behind
(e.g. by the lead-in's collection toggles) would cost ~1.7x per op; run it several times, one process
each, and read the ratios (docs/benchmarks.md §6).

Usage: .venv/bin/python scripts/bench/after_capture.py [--mode mark|abandon|none]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from eroica_runtime.capture import Capture  # noqa: E402


def per_op_us(x: torch.Tensor, n: int = 20000) -> float:
    t = time.perf_counter()
    for _ in range(n):
        x.add(1)
    return (time.perf_counter() - t) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("mark", "abandon", "none"), default="mark",
                    help="a full window (mark), one abandoned in its lead-in, or no window (control)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    x = torch.ones(4)
    for _ in range(3):
        per_op_us(x)
    before = statistics.median(per_op_us(x) for _ in range(5))
    cap = Capture()
    if args.mode != "none":
        cap.start(10, "bench", 2)
        x.add(1)                    # the lead-in step
        if args.mode == "mark":
            for _ in range(2):
                cap.mark()
                x.add(1)
            list(cap.stop())
        else:
            cap.abandon()
    after = statistics.median(per_op_us(x) for _ in range(5))
    print(f"{args.mode}: per-op {before:.3f} us before, {after:.3f} us after, ratio {after / before:.3f}")


if __name__ == "__main__":
    main()
