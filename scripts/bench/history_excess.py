"""How far the busiest rank stood out in the steps before each detector capture's window.

    python scripts/bench/history_excess.py /tmp/fb40 /tmp/lh1

Each argument is a fault-bench output directory (``scripts/fault-bench --out``); for every detector
capture (spike, drift, throughput) of every case in it, the rank whose busy time over the step clock's
last 8 steps before the window (on CPU, waiting for one, or held by its CPU quota: ``quota.busy``)
stands out most from its peers' robust centre, as ``engine/history.py`` judges it: that excess as a
share of the peers' step, its robust z, what it was (``history._cause``: runq = waiting for a CPU,
cpu = extra work, gc) and the rank's run-queue and CPU ms a step against its peers'. Sorted by share,
largest first. It says how a fault's contention compares with a healthy job's noise, not what the
engine named (``engine_replay.py`` says that).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from eroica_runtime import summary
from eroica_runtime.engine import build_table
from eroica_runtime.engine.baseline import Thresholds, center
from eroica_runtime.engine.history import _cause
from eroica_runtime.engine.quota import busy
from eroica_runtime.trigger import DETECTED


def rows(dirs: list[Path]) -> list[tuple[float, float, str]]:
    """(share of the step, robust z, line) for every detector capture with step-clock history."""
    th = Thresholds()
    out = []
    for d in dirs:
        for path in sorted(d.glob("*/report/captures/*.msgpack")):
            meta, sums, _ = summary.decode_capture(path.read_bytes())
            if meta.get("trigger") not in DETECTED or len(sums) < 3:
                continue
            table = build_table(sums)
            b = busy(table, "hist")
            if not np.isfinite(b).all():
                continue
            c = center(b, th.sigma_floor_rel)
            ref = float(np.median(table.sch("hist_ms")))
            row = int(np.argmax(b - c.ref))
            excess = float(b[row] - c.ref)
            z = excess / c.sigma if c.sigma > 0 else float("inf")
            everyone = np.arange(table.n)
            peers = everyone[everyone != row]
            runq, cpu = table.sch("hist_runq"), table.sch("hist_cpu")
            case = path.parents[2].name
            out.append((excess / ref, z,
                        f"{d.name}/{case}@{path.stem} {meta.get('trigger')}: rank {int(table.rank[row])} "
                        f"{_cause(table, everyone, row, excess, 'busy')} +{excess:.1f} ms/step "
                        f"(runq {runq[row]:.1f} vs {np.median(runq[peers]):.1f}, cpu {cpu[row]:.1f} vs "
                        f"{np.median(cpu[peers]):.1f}; step {ref:.0f} ms)"))
    return sorted(out, reverse=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", type=Path, help="fault-bench output directories")
    ap.add_argument("--cases", default="", help="only these cases (comma list of case names)")
    args = ap.parse_args()
    missing = [str(d) for d in args.dirs if not d.is_dir()]
    if missing:
        raise SystemExit(f"history_excess: not a fault-bench output directory: {', '.join(missing)}")
    wanted = {c for c in args.cases.split(",") if c}
    for share, z, line in rows(args.dirs):
        case = line.split("@", 1)[0].split("/", 1)[1]
        if not wanted or case in wanted:
            print(f"share {share:.2f}  z {z:5.1f}  {line}")


if __name__ == "__main__":
    main()
