"""A host stall spent on the CPU: the culprit's training thread ran its own Python between ops.

A rank's own work outside any profiled op (category host, phase host_gap) that its training thread
spent running, neither waiting for a CPU (contention, a quota: ``Culprit.sched``, quota.py) nor off
it (blocked, offcpu.py), is Python the training loop runs on that rank: code only it runs (rank-0
logging, metrics or progress bars, checkpoint bookkeeping) or the same code over larger Python
data. The category's generic action sent its reader to the host: rank 0 of 3 smoothing a 200,000-
entry loss history in pure Python after every step (~11 ms) read "CPU-side stalls on this rank
(launch gaps / Python overhead / contention): check other processes on the host, CPU pinning and
cgroup limits" (2026-12-07), while its training thread ran 17.5 ms a step against its peers' 6.0
and queued 0.75 ms against 0.21-2.8. And where the window's own comparison missed it and the steps
before the window named it (history.py), "compute (forward) ... Compare this rank's GPU/CPU with its
peers (clocks, thermals, co-located jobs); drain the node", though the window's extra own work was
all between ops (host_gap 13.0 ms against 1.0-1.4).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from eroica_runtime.engine.categories import PHASE_CATEGORY, pick_category
from eroica_runtime.engine.table import PHASE_INDEX, Table

# the share of the culprit's excess its training thread must have run on a CPU more than its peers did
BUSY_SHARE = 0.5


def busy_evidence(table: Table, row: int, peer_rows: np.ndarray, excess_ms: float) -> dict[str, Any]:
    """``{"thread_cpu_ms": [rank, peers' median]}``, CPU ms a step the training thread ran in the window
    (the step clock's), when that is BUSY_SHARE of ``excess_ms`` more than its peers'; {} otherwise, or
    without the step clock's times."""
    cpu = table.sch("cpu")
    peers = peer_rows[peer_rows != row]
    peers = peers[np.isfinite(cpu[peers])]
    if excess_ms <= 0 or not peers.size or not np.isfinite(cpu[row]):
        return {}
    ref = float(np.median(cpu[peers]))
    if cpu[row] - ref < BUSY_SHARE * excess_ms:
        return {}
    return {"thread_cpu_ms": [round(float(cpu[row]), 3), round(ref, 3)]}


def window_category(table: Table, row: int, peer_rows: np.ndarray) -> tuple[str, str]:
    """(category, phase) of the rank's extra own work in the window against its peers' median: where
    the steps before the window name a rank busy on its CPU, the window's profile tells ops (compute)
    from the Python between them (host, host_gap)."""
    peers = peer_rows[peer_rows != row]
    excess = {}
    for phase in PHASE_CATEGORY:
        if phase in PHASE_INDEX:
            col = table.col(phase)
            ref = col[peers][np.isfinite(col[peers])]
            if np.isfinite(col[row]) and ref.size:
                excess[phase] = float(col[row] - np.median(ref))
    return pick_category(excess) if excess else ("compute", "forward")


def busy_action(evidence: dict[str, Any]) -> str:
    """What a culprit whose training thread ran its own Python tells its reader to do."""
    mine, ref = evidence["thread_cpu_ms"]
    return (f"Its training thread ran on a CPU {mine:.1f} ms a step (peers {ref:.1f}), neither waiting for one "
            "nor blocked, outside any torch op: Python of its own in the training loop. Look for code this rank "
            "runs and its peers do not (rank-0 logging, metrics or progress bars, checkpoint bookkeeping, "
            "building lists or dicts over a growing history) or the same code over larger Python data; "
            "py-spy top --pid on this rank (or torch.profiler with with_stack=True) names the function.")
