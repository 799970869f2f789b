"""A host stall spent off the CPU: the culprit's training thread was blocked, not starved or slow.

A rank's own work outside any profiled op (category host, phase host_gap) is its Python between ops.
When its training thread neither ran nor waited for a CPU through most of that time, no CPU was
short: the thread was blocked in a call no op records (a sleep, a lock or the GIL held by another
thread of the process, a synchronous read or write of a file, a socket or a subprocess's pipe). Such a
rank gets far less CPU than its waiting peers (a wait in gloo keeps a thread on a CPU), and the CPU
share alone read as "CPU throttling (cgroup quota / frequency) or contention": rank 1 of 2 stalling
2.5 s before its optimizer steps got 0.01 CPU-s per second against its peer's 0.78, with no quota;
rank 1 of 3 sleeping 50 ms a step there was told "CPU-side stalls (launch gaps / Python overhead /
contention)". The step clock's CPU and run-queue times of the training thread in the window
(Table.sch) tell a blocked thread from a starved one: that rank ran 3 ms and queued 0.1 ms of its
53 ms own work a step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from eroica_runtime.engine.table import Table

# the share of the culprit's excess its thread must have spent off the CPU, more than its peers did
BLOCKED_SHARE = 0.5


def blocked_evidence(table: Table, row: int, peer_rows: np.ndarray, excess_ms: float) -> dict[str, Any]:
    """``{"off_cpu_ms": [rank, peers' median]}``, ms a step of own work in which the training thread
    neither ran nor waited for a CPU, when that is BLOCKED_SHARE of ``excess_ms`` more than its peers';
    {} otherwise, or without the step clock's times."""
    cpu, runq = table.sch("cpu"), table.sch("runq")
    peers = peer_rows[peer_rows != row]
    if excess_ms <= 0 or not peers.size or not (np.isfinite(cpu[row]) and np.isfinite(runq[row])):
        return {}
    off = np.maximum(table.own - cpu - runq, 0.0)
    peer_off = off[peers][np.isfinite(off[peers])]
    if not peer_off.size:
        return {}
    ref = float(np.median(peer_off))
    if off[row] - ref < BLOCKED_SHARE * excess_ms:
        return {}
    return {"off_cpu_ms": [round(float(off[row]), 3), round(ref, 3)]}


def blocked_action(evidence: dict[str, Any], own_ms: float) -> str:
    """What a blocked culprit's finding tells its reader to do."""
    off, ref = evidence["off_cpu_ms"]
    return (f"Its training thread was off the CPU {off:.1f} ms a step of its {own_ms:.1f} ms own work (peers "
            f"{ref:.1f}), not waiting for one: blocked in a call no profiled op covers (a sleep, a lock or the GIL "
            "held by another thread, a synchronous read or write of a file, socket or pipe). py-spy dump --pid "
            "on this rank shows which.")
