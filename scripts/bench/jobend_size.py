"""Bytes into rank 0 and rank 0's time at job end, for 1k-100k ranks in nodes of 8 (docs/benchmarks.md).

Each rank's job-end map (step statistics, its longest steps and its last 64 steps' busy time,
``runtime._gather_job_end``) is built
as the runtime builds it, for three jobs: healthy (no long step), a checkpoint rank 0 saves alone 8
times (its records carry a stack), and an evaluation every rank works through 8 times (every
rank's records carry a stack). Then the way it travels: each node leader's ``jobend.node_payload``
(timed per node), and on rank 0 ``jobend.read`` of every leader's payload and ``analyst.job_stats``.
"Every rank's map" is what rank 0 received before the leaders reduced the records (the maps as they
are, ``SideChannel.gather_bytes``) and its decode alone. No MPI: the transport is timed elsewhere (§8).

Usage: .venv/bin/python scripts/bench/jobend_size.py [--ranks 1000,10000,100000]
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import msgpack

from eroica_runtime import jobend
from eroica_runtime.analyst import job_stats
from eroica_runtime.engine import imbalance, longsteps

NODE = 8
# a stack as the watchdog samples it (hang.main_frames_text: 8 innermost frames and 2 of the user's code)
WHERE = [f"/opt/conda/envs/train/lib/python3.11/site-packages/torch/distributed/checkpoint/state_dict_saver.py:"
         f"{100 + i} _save_state_dict_{i}" for i in range(8)] + ["/home/user/project/train.py:98 save",
                                                                 "/home/user/project/train.py:140 main"]


def rank_map(r: int, job: str) -> bytes:
    busy = job == "eval" or (job == "checkpoint" and r == 0)
    recs = [] if job == "healthy" else [
        {"step": 500 * (k + 1), "ms": 1020.5 + k, "cpu": 900.25 if busy else 3.5, "runq": 1.25, "stops": 0,
         "data": 0.0, "gc": 0.0, "thr": 0.0, "where": WHERE} for k in range(8)]
    doc = {"rank": r, "host": f"node{r // NODE:05d}", "steps": 5001, "median_ms": 101.234, "p99_ms": 130.2,
           "total_ms": 510000.123, "eroica_ms": 1234.567, "drift_held": [],
           "busy_steps": imbalance.to_send([(s, 40.125 + (s * 7 + r) % 13, 101.5 + s % 3) for s in range(4937, 5001)]),
           "long_steps": longsteps.to_send(recs, 101.234)}
    return msgpack.packb(doc, use_bin_type=True)


def run(ranks: int, job: str) -> dict[str, float]:
    maps = [rank_map(r, job) for r in range(ranks)]
    t = time.perf_counter()
    payloads = {n: jobend.node_payload({r: maps[r] for r in range(n, min(n + NODE, ranks))}, [])
                for n in range(0, ranks, NODE)}
    leader_ms = (time.perf_counter() - t) * 1e3 / len(payloads)
    t = time.perf_counter()
    got = jobend.read(payloads)
    stats = job_stats(got.per_rank, ranks, got.seen, busy=got.busy)
    rank0_s = time.perf_counter() - t
    del got, stats
    tracemalloc.start()   # again, for its peak alone (tracing slows it down)
    got = jobend.read(payloads)
    stats = job_stats(got.per_rank, ranks, got.seen, busy=got.busy)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    t = time.perf_counter()
    every = {r: msgpack.unpackb(m, raw=False) for r, m in enumerate(maps)}
    raw_decode_s = time.perf_counter() - t
    del every
    assert stats["ranks_reporting"] == ranks and len(stats["long_steps"]) == (0 if job == "healthy" else 3)
    return {"raw_mb": sum(map(len, maps)) / 1e6, "raw_decode_s": raw_decode_s,
            "mb": sum(map(len, payloads.values())) / 1e6, "leader_ms": leader_ms, "rank0_s": rank0_s,
            "peak_mb": peak / 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="1000,10000,100000")
    args = ap.parse_args()
    print("| ranks | job | every rank's map: MB into rank 0, its decode | reduced: MB into rank 0 | a leader's "
          "reduction | rank 0: read + job_stats, traced peak |")
    print("|---|---|---|---|---|---|")
    for n in (int(x) for x in args.ranks.split(",")):
        for job in ("healthy", "checkpoint", "eval"):
            m = run(n, job)
            print(f"| {n:,} | {job} | {m['raw_mb']:.1f} MB, {m['raw_decode_s']:.2f} s | {m['mb']:.1f} MB | "
                  f"{m['leader_ms']:.2f} ms | {m['rank0_s']:.2f} s, {m['peak_mb']:.0f} MB |", flush=True)


if __name__ == "__main__":
    main()
