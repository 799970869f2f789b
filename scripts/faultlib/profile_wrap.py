"""Run train_bench.py under an always-on torch.profiler and export one chrome trace per rank.

Why: this is what users do today instead of eroica (profile everything, look at traces later); the
fault bench compares its step-time overhead and trace volume with eroica's dormant cost. Same flags as
train_bench.py; traces go to ``$EROICA_BENCH_TRACE_DIR`` (default ``./traces``) as
``trace-rank<r>.json``, and each rank prints ``BENCH_TRACE {"rank", "bytes", "seconds", "export_s"}``
(seconds = time the profiler was on, for bytes per second).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from faultlib import train_bench  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    rank = int(os.environ.get("RANK", os.environ.get("PMI_RANK", "0")))
    out = Path(os.environ.get("EROICA_BENCH_TRACE_DIR", "traces"))
    out.mkdir(parents=True, exist_ok=True)
    acts = [torch.profiler.ProfilerActivity.CPU]
    t0 = time.perf_counter()
    with torch.profiler.profile(activities=acts) as prof:
        rc = train_bench.main(argv)
    on_s = time.perf_counter() - t0
    path = out / f"trace-rank{rank}.json"
    t1 = time.perf_counter()
    prof.export_chrome_trace(str(path))
    export_s = time.perf_counter() - t1
    print("BENCH_TRACE " + json.dumps({"rank": rank, "bytes": path.stat().st_size, "seconds": round(on_s, 3),
                                       "export_s": round(export_s, 3)}), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
