"""What the rank wrapper's read of the rank's children costs (eroica_launch/oom.MemoryTrail).

    .venv/bin/python scripts/bench/wrapper_children.py [--mb 400] [--children 4] [--rounds 20]

Why: the wrapper reads each child's own memory (USS, psutil's memory_full_info: /proc/<pid>/smaps_rollup,
which walks the page tables) to tell a DataLoader worker's copy-on-read at an OOM kill, while RssAnon
(psutil's memory_info, /proc/<pid>/statm) is what it reads of the rank. This builds ``--mb`` MB of Python
strings, forks ``--children`` processes that read them all (each then holds a private copy of their pages,
as a DataLoader worker does), and times per child memory_info, memory_full_info, and one whole round of
MemoryTrail._sample_children (psutil children() over /proc plus every child's read), with the USS and RSS a
child reports. The round is kept under MemoryTrail.CHILDREN_BUDGET of the wrapper's time by stretching its
interval, whatever these figures are on another machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from eroica_launch import oom  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--mb", type=float, default=400.0)
    ap.add_argument("--children", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=20)
    a = ap.parse_args()
    strings = [f"item-{i:09d}-" * 3 for i in range(int(a.mb * 2**20 / 96))]
    pids, ready = [], []
    for _ in range(a.children):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            total = sum(len(x) for x in strings)   # every page of them becomes this child's own
            os.write(w, b"x")
            time.sleep(600)
            os._exit(0 if total else 1)
        os.close(w)
        pids.append(pid)
        ready.append(r)
    try:
        for r in ready:
            os.read(r, 1)
        kids = [psutil.Process(p) for p in pids]

        def per_call_ms(fn: str) -> float:
            t = time.perf_counter()
            for _ in range(a.rounds):
                for k in kids:
                    getattr(k, fn)()
            return (time.perf_counter() - t) / (a.rounds * len(kids)) * 1e3

        info, full = per_call_ms("memory_info"), per_call_ms("memory_full_info")
        trail = oom.MemoryTrail(os.getpid(), 0.0, 0.0)
        rounds = []
        for _ in range(a.rounds):
            t = time.perf_counter()
            trail._sample_children(time.time())
            rounds.append((time.perf_counter() - t) * 1e3)
        mem = kids[0].memory_full_info()
        rss = psutil.Process().memory_info().rss
        print(f"parent RSS {rss / 2**20:.0f} MB; a child: USS {mem.uss / 2**20:.0f} MB, RSS {mem.rss / 2**20:.0f} MB; "
              f"{len(psutil.pids())} processes on the host")
        print(f"per child: memory_info {info:.3f} ms, memory_full_info {full:.2f} ms; a round of {len(kids)} "
              f"children: median {statistics.median(rounds):.1f} ms (min {min(rounds):.1f}, max {max(rounds):.1f}); "
              f"at CHILDREN_BUDGET {oom.MemoryTrail.CHILDREN_BUDGET:.0%} a round every "
              f">= {statistics.median(rounds) / 1e3 / oom.MemoryTrail.CHILDREN_BUDGET:.1f} s")
    finally:
        for p in pids:
            os.kill(p, 9)
            os.waitpid(p, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
