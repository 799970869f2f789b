"""Culprits from the steps just before a triggered window, when the window itself shows none.

Slowness in bursts (a CPU quota or co-located hogs that come and go, 8 slow steps in 20) is seen by
the vote 6-7 steps after it starts, so a 3-step window often opens as the burst ends and every rank
looks alike in it. The step clock's last HISTORY_RECENT steps before the window are then the burst
itself: a rank whose training thread ran or waited for a CPU (CPU + run-queue ms per step), or
waited for its next batch (DataLoader next()), far longer than its peers' there was the slow one.
A wait for peers is spent asleep in a collective, so neither measure counts a victim's waiting. Only for captures a detector asked for (a baseline or a person's
capture is no claim that anything was slow) and with the same robust bars as the window's culprits.
"""

from __future__ import annotations

import numpy as np

from eroica_runtime.engine.baseline import Thresholds, center, significant
from eroica_runtime.engine.categories import ACTIONS
from eroica_runtime.engine.model import Finding
from eroica_runtime.engine.peers import Peers
from eroica_runtime.engine.table import HISTORY_RECENT, Table

TRIGGERED = ("spike", "drift", "throughput")


def history_culprits(table: Table, peers: Peers, th: Thresholds, trigger: str,
                     named: set[int]) -> list[Finding]:
    """Findings for ranks busy (on CPU, waiting for one, or waiting for their next batch) far
    longer than their peers in the steps before the window."""
    if trigger not in TRIGGERED:
        return []
    cpu, runq, step = table.sch("hist_cpu"), table.sch("hist_runq"), table.sch("hist_ms")
    data = np.nan_to_num(table.sch("hist_data"))   # older summaries: not measured
    measures = {"busy": cpu + runq, "data": data}
    out: list[Finding] = []
    for rows in peers.groups:
        if len(rows) < 3 or not np.isfinite(cpu[rows] + runq[rows]).all() or not np.isfinite(step[rows]).all():
            continue
        step_ref = float(np.median(step[rows]))
        best: dict[int, tuple[float, str]] = {}
        for kind, values in measures.items():
            c = center(values[rows], th.sigma_floor_rel)
            for k in np.flatnonzero(values[rows] - c.ref >= th.abs_ms).tolist():
                row = int(rows[k])
                excess = float(values[row] - c.ref)
                z = excess / c.sigma if c.sigma > 0 else float("inf")
                if row not in named and significant(excess, z, step_ref, th, len(rows)) \
                        and excess > best.get(row, (0.0, ""))[0]:
                    best[row] = (excess, kind)
        out.extend(_finding(table, rows, row, excess, step_ref, kind) for row, (excess, kind) in best.items())
    return out


def _finding(table: Table, rows: np.ndarray, row: int, excess: float, step_ref: float, kind: str) -> Finding:
    cpu, runq, data = table.sch("hist_cpu"), table.sch("hist_runq"), np.nan_to_num(table.sch("hist_data"))
    gc = np.nan_to_num(table.sch("hist_gc"))
    peers = rows[rows != row]
    cpu_ref, runq_ref = float(np.median(cpu[peers])), float(np.median(runq[peers]))
    data_ref, gc_ref = float(np.median(data[peers])), float(np.median(gc[peers]))
    # starved: the run-queue wait grew far more than the CPU time (a rank computing more on a loaded
    # host queues more too, while its peers sleep in the collective)
    starved = kind == "busy" and runq[row] - runq_ref >= max(0.5 * excess, 2.0 * (cpu[row] - cpu_ref))
    collecting = kind == "busy" and not starved and gc[row] - gc_ref >= 0.5 * excess
    category = "dataloader" if kind == "data" else "host" if starved else "gc" if collecting else "compute"
    rank = int(table.rank[row])
    host = table.hosts[int(table.host_idx[row])]
    victims = tuple(int(r) for r in table.rank[peers].tolist())
    what = (f"waiting for its next batch {data[row]:.1f} ms/step vs peers' {data_ref:.1f}, in bursts. "
            if kind == "data" else
            f"in Python GC pauses {gc[row]:.1f} ms/step vs peers' {gc_ref:.1f}, in bursts. " if collecting else
            f"runnable but waiting for a CPU {runq[row]:.1f} ms/step vs peers' {runq_ref:.1f}: CPU contention "
            "or a CPU quota (cgroup) on this rank, in bursts. " if starved else
            f"on CPU {cpu[row]:.1f} ms/step vs peers' {cpu_ref:.1f}: extra work in bursts. ")
    ev = {"excess_ms": excess, "seen_in": f"the {HISTORY_RECENT} steps before the window (step clock)",
          "cpu_ms": [float(cpu[row]), cpu_ref], "run_queue_ms": [float(runq[row]), runq_ref],
          "data_ms": [float(data[row]), data_ref], "gc_ms": [float(gc[row]), gc_ref],
          "step_ms": [float(table.sch("hist_ms")[row]), step_ref], "victims_count": len(victims),
          **({"cpu_starved": True} if starved else {})}
    phase = "data" if kind == "data" else "host_gap" if starved else "gc" if collecting else "forward"
    return Finding(category=category, rank=rank, host=host, function="(steps before the window)",
                   phase=phase, impact_ms_per_step=excess,
                   what_if_step_ms=max(step_ref - excess, 0.0), victims=victims, evidence=ev,
                   action=("In the steps just before the window this rank was " + what
                           + "The window missed the slow steps: " + ACTIONS.get(category, "")).strip(),
                   title=f"rank {rank} on {host}: {category} in the {HISTORY_RECENT} steps before the window "
                         f"(+{excess:.1f} ms/step busy, {len(victims)} ranks waiting on it)")
