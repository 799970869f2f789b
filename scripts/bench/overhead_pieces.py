"""Micro-cost of eroica's per-step pieces on real ranks (run under mpiexec -n N).

Times, per call in microseconds: the optimizer post-hook path into the step clock (without and
with the CPU-quota clock, telemetry.ThrottleClock, as the runtime installs it), the local detector,
posting the vote (Iallreduce), and completing it at the configured lag.
"""
from __future__ import annotations

import json
import statistics
import time

import numpy as np
import torch

from eroica_runtime.config import Config
from eroica_runtime.sidechannel import SideChannel
from eroica_runtime.stepclock import StepClock
from eroica_runtime.telemetry import ThrottleClock, cgroup_cpu
from eroica_runtime.trigger import Trigger

N = 3000


def per_call_us(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {"median_us": round(statistics.median(s) * 1e6, 2), "p90_us": round(s[int(0.9 * len(s))] * 1e6, 2)}


def main() -> None:
    side = SideChannel()
    cfg = Config()
    trig = Trigger(cfg)
    p = torch.nn.Parameter(torch.zeros(4))
    opt = torch.optim.SGD([p], lr=0.1)
    p.grad = torch.zeros(4)

    # 1. optimizer.step() with and without eroica's post-hook (clock boundary with a no-op consumer)
    def timed_steps() -> list[float]:
        out = []
        for _ in range(N):
            t = time.perf_counter()
            opt.step()
            out.append(time.perf_counter() - t)
        return out

    bare = timed_steps()
    clock = StepClock(lambda step, ms: None)
    clock.install()
    hooked = timed_steps()
    clock.uninstall()
    hook_cost = [h - b for h, b in zip(sorted(hooked), sorted(bare), strict=True)]
    throttle = ThrottleClock()
    clock = StepClock(lambda step, ms: None, throttled_ms=throttle.read)
    clock.install()
    hooked_thr = timed_steps()
    clock.uninstall()
    throttle.close()
    hook_thr_cost = [h - b for h, b in zip(sorted(hooked_thr), sorted(bare), strict=True)]

    # 2. local detector
    det = []
    for i in range(N):
        t = time.perf_counter()
        trig.local_flags(100 + i, 20.0 + (i % 7) * 0.1, False)
        det.append(time.perf_counter() - t)

    # 3. vote post and completion at the configured lag (all ranks in lockstep, like training)
    post, done = [], []
    pending = []
    side.barrier(30)
    for _ in range(N):
        flags = np.zeros(3, dtype=np.int64)
        t = time.perf_counter()
        pending.append(side.post_vote(flags))
        post.append(time.perf_counter() - t)
        if len(pending) > cfg.vote_lag:
            t = time.perf_counter()
            side.wait_vote(pending.pop(0), 30)
            done.append(time.perf_counter() - t)
        side.world.Barrier()  # stand-in for the training collective that keeps ranks in step
    for h in pending:
        side.wait_vote(h, 30)
    if side.rank == 0:
        result = {"ranks": side.size, "calls": N, "hook": per_call_us(hook_cost),
                  "hook_with_quota_clock": per_call_us(hook_thr_cost), "quota": cgroup_cpu()[0],
                  "hook_total_step": per_call_us(hooked), "bare_step": per_call_us(bare),
                  "detector": per_call_us(det), "vote_post": per_call_us(post), "vote_complete": per_call_us(done)}
        print("PIECES " + json.dumps(result), flush=True)
    side.drain()
    side.finalize()


if __name__ == "__main__":
    main()
