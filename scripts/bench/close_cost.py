"""Where a capture's close spends its time on the CPU, and whether a background build would help.

A 3-step window of a 12-layer transformer (d 64, 1 thread) profiled the way capture.py does; then
``prof.stop()``, reading the raw events, and ``summary.build`` timed (--reps times, median/min), and
the same build run in a background thread while the training loop keeps stepping (default and 0.5 ms
GIL switch intervals): how much the overlapped steps slow down against the inline build.

Usage: .venv/bin/python scripts/bench/close_cost.py [--reps 5]   (benchmarks.md §6)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from eroica_runtime import summary  # noqa: E402
from eroica_runtime.capture import Capture  # noqa: E402
from eroica_runtime.summary.events import normalize_raw  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, num_layers=12, enable_nested_tensor=False)
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(4, 32, 64)

    def step() -> None:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

    for _ in range(5):
        step()
    cap = Capture()
    cap.start(10, "bench", 3)
    for i in range(3):
        step()
        if i < 2:
            cap.mark()
    t0 = time.perf_counter()
    events = cap.stop()
    stop_ms = (time.perf_counter() - t0) * 1e3
    kw = dict(identity={"rank": 0, "world_size": 1, "host": "h"}, capture={"step": 10, "trigger": "bench", "k": 3},
              steps=[{"step": 10 + i, "ms": 10.0} for i in range(3)], gc={"count": 0, "ms": 0.0}, telemetry={})
    read, build = [], []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        normalize_raw(events)
        read.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        summary.build(events, **kw)
        build.append((time.perf_counter() - t0) * 1e3)

    def timed(n: int) -> list[float]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            step()
            out.append((time.perf_counter() - t0) * 1e3)
        return out

    normal = statistics.median(timed(30))
    print(f"events {len(events)}; prof.stop() {stop_ms:.0f} ms; reading raw events {statistics.median(read):.0f} ms "
          f"(min {min(read):.0f}); summary.build {statistics.median(build):.0f} ms (min {min(build):.0f}); "
          f"normal step {normal:.1f} ms")
    for interval in (0.005, 0.0005):
        sys.setswitchinterval(interval)
        done = threading.Event()
        worker = threading.Thread(target=lambda done=done: (summary.build(events, **kw), done.set()))
        t0 = time.perf_counter()
        worker.start()
        during: list[float] = []
        while not done.is_set():
            during += timed(1)
        worker.join()
        wall = (time.perf_counter() - t0) * 1e3
        print(f"build in a thread (switch interval {interval * 1e3:.1f} ms): {wall:.0f} ms over {len(during)} steps, "
              f"those steps median {statistics.median(during):.1f} ms, extra {sum(during) - normal * len(during):.0f} ms")
    sys.setswitchinterval(0.005)


if __name__ == "__main__":
    main()
