#!/usr/bin/env python3
"""How close a finding's estimated cost a step is to what the job lost: over a fault bench's output.

For every fault case of a ``scripts/fault-bench --out DIR`` run: the top finding's
``impact_ms_per_step`` (the engine's estimate from the profiled window) against the job's measured
loss a step from its first finding on (``engine/timelost.py``: rank 0's mean step after it against
the mean before the slowdown, profiled steps left out). A report written before job.time_lost
existed is measured here from its steps.msgpack and captures with the same function, the capture
windows taken at the default sizes (3 steps, 16 for a throughput capture).

  .venv/bin/python scripts/bench/cost_accuracy.py /tmp/fb23
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

import msgpack

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from eroica_runtime.config import Config  # noqa: E402
from eroica_runtime.engine.timelost import lookback, since_step, time_lost  # noqa: E402


def measured(report_dir: Path, cfg: Config) -> dict[str, Any] | None:
    rep = json.loads((report_dir / "report.json").read_text())
    kept = (rep.get("job") or {}).get("time_lost")
    if isinstance(kept, dict):
        return kept
    steps = msgpack.unpackb((report_dir / "steps.msgpack").read_bytes(), raw=False, strict_map_key=False)
    history = list(steps["ms"])
    caps = [c for c in rep.get("captures") or [] if c.get("trigger") != "hang"]
    windows = [(int(c["step"]), cfg.burst_window_steps if c["trigger"] == "throughput" else cfg.window_steps)
               for c in caps]
    since = since_step((int(c["step"]), c["trigger"], bool(c.get("findings"))) for c in caps)
    if since is None:
        return None
    lost = time_lost(history, windows, since, warmup=cfg.warmup_steps, lookback=lookback(cfg.spike_steps, cfg.vote_lag))
    return None if lost is None else lost.to_json()


def main(out: Path) -> None:
    cfg = Config()
    bench = json.loads((out / "bench.json").read_text())
    print("| case | fault | top finding | estimated ms/step | measured ms/step | estimated / measured |")
    print("| --- | --- | --- | --- | --- | --- |")
    ratios: dict[str, list[float]] = {"steady": [], "bursts": []}
    for r in bench["results"]:
        top = (r.get("score") or {}).get("top")
        if not r.get("fault") or not top or top.get("category") == "hang":
            continue
        got = measured(out / r["case"] / "report", cfg)
        est, meas = top.get("impact_ms_per_step"), got and got.get("per_step_ms")
        ratio = est / meas if est is not None and meas and meas > 0 else None
        if ratio is not None:
            ratios["bursts" if r["case"].endswith("-int") else "steady"].append(ratio)
        who = "job-wide" if top["rank"] is None else f"r{top['rank']}"
        print(f"| {r['case']} | `{r['fault']}` | {top['category']} {who} | "
              f"{est:.1f} | {'–' if meas is None else f'{meas:.1f}'} | "
              f"{'–' if ratio is None else f'{ratio:.2f}'} |")
    for kind, xs in ratios.items():
        if xs:
            print(f"\n{kind}: {len(xs)} cases, estimated / measured median {statistics.median(xs):.2f} "
                  f"(range {min(xs):.2f}-{max(xs):.2f})", end="")
    print()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
