"""Where a capture's close spends its time on the CPU, and what the closing step costs a real job.

Pieces: a 3-step window of a 12-layer transformer (d 64, 1 thread) profiled the way capture.py does;
then ``prof.stop()``, reading the raw events, and ``summary.build`` timed (--reps times, median/min),
and the same build run in a background thread while the training loop keeps stepping (default and
0.5 ms GIL switch intervals): how much the overlapped steps slow down against the inline build.

Job (``--job``): real N-rank CPU DDP jobs (scripts/faultlib/train_bench.py under eroica-run, the fault
bench's job) with captures at fixed steps; each rank's own wall time per step (eroica's boundary work
included, which the step clock leaves out) gives, per capture, the closing step's extra time over the
same rank's median step before the window, and the extra summed over the steps after it (where any
deferred work lands). Run it under the bench lock: ``flock /tmp/eroica-multirank.lock ...``.

Usage: .venv/bin/python scripts/bench/close_cost.py [--reps 5]   (benchmarks.md §6)
       .venv/bin/python scripts/bench/close_cost.py --gc --reps 8   (full collections after each close)
       .venv/bin/python scripts/bench/close_cost.py --job --rounds 3 [--layers 12]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from eroica_runtime import summary  # noqa: E402
from eroica_runtime.capture import Capture  # noqa: E402
from eroica_runtime.runtime import slice_budget_s  # noqa: E402
from eroica_runtime.summary.events import normalize_raw, step_marks  # noqa: E402

try:   # the tree under test may be older than EROICA_KEEP_RAW_EVENTS (PYTHONPATH=<an older tree>)
    from eroica_runtime.summary import rawevents  # noqa: E402
except ImportError:
    rawevents = None  # type: ignore[assignment]

ROOT = Path(__file__).resolve().parents[2]
AFTER = 40   # steps after the closing one whose extra time is summed


def job_round(args: argparse.Namespace, out: Path) -> list[dict[str, float]]:
    """One eroica-run job; per capture: the closing step's extra ms (slowest rank), the next step's, and
    the extra summed over the AFTER steps after the closing one (each rank's, then the slowest)."""
    steps = sorted(int(s) for s in args.captures.split(","))
    env = {**os.environ, "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1", "MPIR_CVAR_POLLS_BEFORE_YIELD": "10",
           "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [str(Path(sys.executable).parent / "eroica-run"), "--nproc-per-node", str(args.ranks), "--report-dir",
           str(out / "report"), "--capture-at-steps", args.captures, "--no-baseline",
           str(ROOT / "scripts/faultlib/train_bench.py"), "--steps", str(max(steps) + AFTER + 20), "--out",
           str(out / "steps"), "--layers", str(args.layers)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"job failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    ranks = [json.loads(p.read_text())["step_ms"] for p in sorted((out / "steps").glob("steps-rank*.json"))]
    from eroica_runtime import summary as summary_mod

    rows = []
    for path in sorted((out / "report" / "captures").glob("*.msgpack"), key=lambda p: int(p.stem)):
        meta, sums, _ = summary_mod.decode_capture(path.read_bytes())
        first = int(meta["step"])
        k = int(sums[0]["capture"]["k"]) if sums else 3
        close = first + k - 1            # its boundary closes the window (step_ms[s] is eroica's step s)
        extra_open, extra_close, extra_next, extra_after = [], [], [], []
        refs = [statistics.median(ms[first - 14:first - 2]) for ms in ranks]   # before the lead-in step
        for ms, ref in zip(ranks, refs, strict=True):
            extra_open.append(ms[first - 2] - ref)   # its boundary starts the profiler (the lead-in follows)
            extra_close.append(ms[close] - ref)
            extra_next.append(ms[close + 1] - ref)
            extra_after.append(sum(m - ref for m in ms[close + 1:close + 1 + AFTER]))
        # the same statistic (slowest rank's extra) on the normal steps before the window: what it
        # says of a step that costs nothing extra (the max of N noisy ranks is above their median)
        floor = statistics.median(max(ms[s] - ref for ms, ref in zip(ranks, refs, strict=True))
                                  for s in range(first - 14, first - 2))
        rows.append({"step": first, "ref": statistics.median(refs), "floor": floor,
                     "open": max(extra_open), "close": max(extra_close), "next": max(extra_next), "after": max(extra_after),
                     "events": statistics.median(s["profile"]["events"] for s in sums) if sums else 0,
                     "build_ms": statistics.median(s["profile"]["build_ms"] for s in sums) if sums else 0})
    return rows


def job(args: argparse.Namespace) -> None:
    every: list[dict[str, float]] = []
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="close-cost-") as tmp:
            rows = job_round(args, Path(tmp))
        for row in rows:
            print(f"round {r} capture {row['step']:4d}: step {row['ref']:.1f} ms, {row['events']:.0f} events, "
                  f"build {row['build_ms']:.0f} ms; opening step +{row['open']:.0f} ms, closing step +{row['close']:.0f} ms, next +{row['next']:.0f} ms, "
                  f"next {AFTER} steps +{row['after']:.0f} ms (slowest rank; a normal step +{row['floor']:.0f})",
                  flush=True)
        every += rows
    for key in ("open", "close", "next", "after", "floor"):
        vals = sorted(row[key] for row in every)
        print(f"{key}: median {statistics.median(vals):.0f} ms, min {vals[0]:.0f}, max {vals[-1]:.0f} "
              f"({len(vals)} captures)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--job", action="store_true", help="measure the closing step of real eroica-run jobs")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2, help="train_bench's transformer layers (more: more events)")
    ap.add_argument("--captures", default="30,90,150", help="window first steps, comma-separated")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--threaded", action="store_true", help="also time the build in a background thread (§6, 2026-11-30)")
    ap.add_argument("--gc", action="store_true",
                    help="the runtime's way only, counting full garbage collections in the steps after each close")
    args = ap.parse_args()
    if args.job:
        job(args)
        return
    pieces(args)


def pieces(args: argparse.Namespace) -> None:
    """One process: the close's pieces, and the closing and following steps as the runtime runs them."""
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

    def timed(n: int) -> list[float]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            step()
            out.append((time.perf_counter() - t0) * 1e3)
        return out

    k = 3
    kw = dict(identity={"rank": 0, "world_size": 1, "host": "h"}, capture={"step": 10, "trigger": "bench", "k": k},
              steps=[{"step": 10 + i, "ms": 10.0} for i in range(k)], gc={"count": 0, "ms": 0.0}, telemetry={})
    cap = Capture()
    cap.warm_up()
    for _ in range(5):
        step()

    def window() -> tuple[float, summary.Resumable]:
        """A window as the runtime drives it (lead-in step, k steps, a mark at each boundary); returns
        the closing step's ms (its training work, then stop() and the builder set going) and the build."""
        cap.start(10, "bench", k)
        for _ in range(k):
            step()
            cap.mark()
        t0 = time.perf_counter()
        step()
        job = summary.Resumable(summary.build_steps(cap.stop(), **kw, **pool))
        return (time.perf_counter() - t0) * 1e3, job

    # the runtime's record pool (summary.Records), where the tree has one (PYTHONPATH=<an older tree>: none)
    pool = {"records": summary.RECORDS} if hasattr(summary, "RECORDS") else {}
    full_gc: list[float] = []   # ms of each full (generation 2) collection while watched
    watching = [False]
    gc_t0 = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if not watching[0] or info.get("generation") != 2:
            return
        if phase == "start":
            gc_t0[0] = time.perf_counter()
        else:
            full_gc.append((time.perf_counter() - gc_t0[0]) * 1e3)

    if args.gc:
        gc.callbacks.append(on_gc)

    normal = statistics.median(timed(30))
    budget = slice_budget_s(normal / 1e3)
    stop, listing, read, build, closing, after, n_after, extra_after = [], [], [], [], [], [], [], []
    dump: list[float] = []
    dump_bytes: list[int] = []
    slices: list[float] = []   # each slice's own ms (the budget, or one piece longer than it)
    per_window_gc: list[tuple[int, float]] = []   # full collections in the steps after each close: (count, ms)

    def sliced(job: summary.Resumable) -> list[float]:
        """The steps after a close, each followed by a slice of the build, until it is done (ms each)."""
        out = []
        while not job.done:
            t0 = time.perf_counter()
            step()
            t1 = time.perf_counter()
            job.run(budget)
            out.append((time.perf_counter() - t0) * 1e3)
            slices.append((time.perf_counter() - t1) * 1e3)
        return out

    for _ in range(args.reps):
        if args.gc:
            # the runtime's way only (the pieces below make and drop records of their own), watching for
            # full collections from the close until AFTER steps after the build is done
            ms, job = window()
            closing.append(ms - normal)
            watching[0], full_gc[:] = True, []
            steps_after = sliced(job) + timed(AFTER)
            watching[0] = False
            per_window_gc.append((len(full_gc), sum(full_gc)))
            after.append(max(steps_after) - normal)
            extra_after.append(sum(steps_after) - normal * len(steps_after))
            continue
        # the pieces, one at a time
        cap.start(10, "bench", k)
        for i in range(k + 1):
            step()
            if i < k:
                cap.mark()
        t0 = time.perf_counter()
        raw = cap.stop()
        stop.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        listed = list(raw)
        listing.append((time.perf_counter() - t0) * 1e3)
        n_events = len(listed)
        t0 = time.perf_counter()
        normalize_raw(listed, step_marks(10))
        read.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        summary.build(listed, **kw)
        build.append((time.perf_counter() - t0) * 1e3)
        if rawevents is not None:   # EROICA_KEEP_RAW_EVENTS's cost in the closing step, and its size
            t0 = time.perf_counter()
            kept = rawevents.dump(raw, rank=0, step=10)
            dump.append((time.perf_counter() - t0) * 1e3)
            dump_bytes.append(len(kept))
        del raw
        # the runtime's way: the closing step, then a slice of the build after each following step
        ms, job = window()
        closing.append(ms - normal)
        steps_after = sliced(job)
        after.append(max(steps_after) - normal)
        n_after.append(len(steps_after))
        extra_after.append(sum(steps_after) - normal * len(steps_after))

    def med(vals: list[float]) -> str:
        return f"{statistics.median(vals):.0f} ms (min {min(vals):.0f}, max {max(vals):.0f})"

    if args.gc:
        print(f"normal step {normal:.1f} ms; {'with' if pool else 'without'} the record pool; {args.reps} windows:")
        print(f"  closing step +{med(closing)}; the longest step from the close to {AFTER} steps after the build "
              f"+{med(after)}")
        print("  full collections in those steps, per window: "
              + ", ".join(f"{n} ({ms:.0f} ms)" for n, ms in per_window_gc))
        return

    print(f"events {n_events} (lead-in step included); normal step {normal:.1f} ms; over {args.reps} windows:")
    print(f"  prof.stop() {med(stop)}; listing the raw events {med(listing)}; reading them {med(read)}; "
          f"summary.build {med(build)}")
    if dump:
        print(f"  keeping the raw events (EROICA_KEEP_RAW_EVENTS) {med(dump)}: "
              f"{statistics.median(dump) * 1e3 / n_events:.1f} µs and "
              f"{statistics.median(dump_bytes) / n_events:.1f} bytes an event")
    print(f"  closing step +{med(closing)} over a normal step; then {statistics.median(n_after):.0f} steps with a "
          f"{budget * 1e3:.0f} ms slice each: the longest +{med(after)}, all of them +{med(extra_after)}")
    slices.sort()
    print(f"  slices: median {statistics.median(slices):.1f} ms, 90th percentile {slices[int(0.9 * (len(slices) - 1))]:.1f}, "
          f"the {min(5, len(slices))} longest {', '.join(f'{v:.0f}' for v in slices[-5:])} ms")
    if not args.threaded:
        return
    events = listed
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
