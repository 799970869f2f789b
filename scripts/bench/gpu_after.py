#!/usr/bin/env python3
"""Profiler aftereffect on one process, CUDA if available else CPU.

Driver (default): runs each variant in a fresh child process, interleaved over --rounds rounds,
and prints per-child lines and a summary: median step time over --n steps before and after one
short torch.profiler window started/stopped the way eroica's Capture does (no schedule: it records
from start to stop, an ``eroica::step#N`` record_function range per step, prof.stop(),
kineto_results.events()).

Variants:
  none        no profiler (control: drift/noise)
  empty       eroica's warm_up(): `with profile(...): torch.zeros(1).add_(1)` between the phases
  cpu         window with ProfilerActivity.CPU only (on CUDA builds this still enables CUPTI
              RUNTIME/DRIVER activity tracing: kineto's CPU group includes CUDA_RUNTIME/CUDA_DRIVER)
  cuda        window with CPU + CUDA
  precuda     eroica's warm_up() as the very first thing, before the model touches CUDA (eroica installs
              before training); compare this variant's *before_ms* with none's before_ms (cross-process)
  *_fix       the same with TEARDOWN_CUPTI=1 set (os.environ.setdefault) before the profiler starts,
              as in /tmp/after/capture.diff: kineto then calls cuptiFinalize after the trace
Each child also opens a second window after the "after" phase and reports its start cost and how
many device events it saw (the fix must not lose kernels in later captures: CUPTI lazily re-inits).

Why (issue 11, "no aftereffect"): kineto leaves CUPTI attached after a profile stops unless
TEARDOWN_CUPTI=1 (pytorch/pytorch#144455, 10-20% slower training after profiling), and
Capture now sets it on CUDA >= 12.6. Measured on the CPU build only so far: nothing stays switched
on there (per-op cost after/before 0.9975, 0.986-1.001, n=8). This script is the GPU check.

usage: python3 gpu_after.py [--rounds 3] [--n 150] [--cpu] [--variants none,cpu,cpu_fix,cuda,cuda_fix,empty,empty_fix,precuda,precuda_fix]
Budget: ~8-12 s per child on the H200 (import + CUDA init + ~350 steps of ~7 ms); 9 variants x 3 rounds
= 27 children ~ 4-5 min: `AFTER=1 OUT=$OUT scripts/gpu-session` (timeout_s ~420).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--child", default=None)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--n", type=int, default=150)
ap.add_argument("--k", type=int, default=3)
ap.add_argument("--variants", default="none,cpu,cpu_fix,cuda,cuda_fix,empty,empty_fix,precuda,precuda_fix")
ap.add_argument("--cpu", action="store_true", help="force CPU even if CUDA is available")
args = ap.parse_args()


def child(variant: str) -> dict:
    fix = variant.endswith("_fix")
    kind = variant[:-4] if fix else variant
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    cuda = torch.cuda.is_available() and not args.cpu
    dev = torch.device("cuda" if cuda else "cpu")
    if fix:
        os.environ.setdefault("TEARDOWN_CUPTI", "1")
    if kind == "precuda":  # eroica's warm_up() at install, before the job's first CUDA call
        acts0 = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=acts0, record_shapes=False, with_stack=False):
            torch.zeros(1).add_(1)
    torch.manual_seed(0)
    if not cuda:
        torch.set_num_threads(1)
    d = 256 if cuda else 64
    layer = torch.nn.TransformerEncoderLayer(d, 4, 2 * d, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 12, enable_nested_tensor=False).to(dev)
    x = torch.randn(8 if cuda else 4, 64 if cuda else 16, d, device=dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def step():
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()

    def timed(n):
        ts = []
        for _ in range(n):
            sync()
            t0 = time.perf_counter()
            step()
            sync()
            ts.append((time.perf_counter() - t0) * 1e3)
        return ts

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if (kind == "cuda" or (kind == "empty" and cuda)) else [])

    def window(step0):
        prof = profile(activities=acts, record_shapes=False, with_stack=False)
        t0 = time.perf_counter()
        prof.start()
        mark = record_function(f"eroica::step#{step0 - 1}")
        mark.__enter__()
        t_start = (time.perf_counter() - t0) * 1e3
        step()
        for i in range(args.k):
            mark.__exit__(None, None, None)
            mark = record_function(f"eroica::step#{step0 + i}")
            mark.__enter__()
            step()
        sync()
        t0 = time.perf_counter()
        mark.__exit__(None, None, None)
        prof.stop()
        t_stop = (time.perf_counter() - t0) * 1e3
        evs = prof.profiler.kineto_results.events()
        dev_ev = sum(1 for e in evs if "CUDA" in str(e.device_type()))
        return prof, evs, dict(start_ms=round(t_start, 2), stop_ms=round(t_stop, 2), nev=len(evs), dev_ev=dev_ev)

    for _ in range(40):
        step()
    sync()
    before = timed(args.n)
    held: tuple[object, object] | None = None
    w1 = w2 = None
    if kind == "empty":  # eroica's warm_up()
        with profile(activities=acts, record_shapes=False, with_stack=False):
            torch.zeros(1).add_(1)
    elif kind in ("cpu", "cuda"):
        prof, evs, w1 = window(100)
        held = (prof, evs)  # eroica hands the events on; the repro kept both referenced
    after = timed(args.n)
    if kind in ("cpu", "cuda"):
        _, _, w2 = window(1000)
    del held      # referenced through the "after" phase, as eroica's hand-off and the repro do
    mb, ma = statistics.median(before), statistics.median(after)
    return dict(variant=variant, device=str(dev), torch=torch.__version__, cuda_rt=torch.version.cuda,
                teardown_env=os.environ.get("TEARDOWN_CUPTI"), before_ms=round(mb, 4), after_ms=round(ma, 4),
                ratio=round(ma / mb, 4), first3_after_ms=[round(t, 2) for t in after[:3]],
                window1=w1, window2=w2)


if args.child:
    print("RESULT " + json.dumps(child(args.child)), flush=True)
    sys.exit(0)

variants = args.variants.split(",")
rows = []
env = {k: v for k, v in os.environ.items() if k != "TEARDOWN_CUPTI"}
for r in range(args.rounds):
    order = variants if r % 2 == 0 else variants[::-1]
    for v in order:
        cmd = [sys.executable, __file__, "--child", v, "--n", str(args.n), "--k", str(args.k)] + (["--cpu"] if args.cpu else [])
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            print(f"round {r} {v}: FAILED rc={p.returncode}\n{p.stderr[-2000:]}", flush=True)
            continue
        res = json.loads(line[7:])
        res["round"] = r
        rows.append(res)
        print(json.dumps(res), flush=True)

print("\nsummary (ratio = median step after / before, per child; spread = min..max over rounds)")
for v in variants:
    rs = sorted(x["ratio"] for x in rows if x["variant"] == v)
    if not rs:
        continue
    b = statistics.median(x["before_ms"] for x in rows if x["variant"] == v)
    w2 = [x["window2"] for x in rows if x["variant"] == v and x["window2"]]
    extra = ""
    if w2:
        extra = (f"  2nd window: start {statistics.median(w['start_ms'] for w in w2):.1f} ms, "
                 f"device events {[w['dev_ev'] for w in w2]}")
    print(f"{v:10s} n={len(rs)} before {b:.3f} ms  ratio median {statistics.median(rs):.4f} "
          f"[{rs[0]:.4f}..{rs[-1]:.4f}]{extra}")
