"""Time the side channel's summary gather on real ranks (run under mpiexec; see scripts/bench-gather)."""
from __future__ import annotations

import json
import os
import statistics
import time

from eroica_runtime.sidechannel import SideChannel

REPS = int(os.environ.get("REPS", "30"))
SIZE = int(os.environ.get("SIZE", str(12 * 1024)))


def main() -> None:
    side = SideChannel()
    blob = os.urandom(SIZE)
    times = []
    for i in range(REPS):
        side.barrier(30)
        t0 = time.perf_counter()
        got = side.gather_bytes(blob, 30, tag_base=100 + 2 * i)
        side.barrier(30)  # everyone sees the gather finished when rank 0 has it all
        times.append(time.perf_counter() - t0)
        if side.rank == 0:
            assert got is not None and len(got[0]) == side.size and not got[1]
    if side.rank == 0:
        print("GATHER " + json.dumps({"ranks": side.size, "nodes": side.leaders.Get_size(), "bytes": SIZE,
                                      "median_ms": round(statistics.median(times) * 1e3, 3),
                                      "p90_ms": round(sorted(times)[int(0.9 * len(times))] * 1e3, 3)}))
    side.drain()
    side.finalize()


if __name__ == "__main__":
    main()
