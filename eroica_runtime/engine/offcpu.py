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

Where the other threads of its process ran meanwhile, the training thread waited for them: a thread
that spins in pure Python (a metrics or logging thread serializing records) holds the GIL, and the
training thread takes it back only between ops and inside them. Then the ops themselves read slower,
the same calls as the peers', and a compute finding sent its reader to the hardware: a 3-rank job
whose rank 1 started such a thread at step 60 stepped 890 ms instead of 6.6, and read "COMPUTE: rank
1 ... Compare this rank's GPU/CPU with its peers (clocks, thermals, co-located jobs); drain the node"
(2026-12-07), while its training thread ran 15.6 ms a step, queued 1.7, and the rest of its process
ran 1.01 CPU-s a second against its peers' 0.01.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from eroica_runtime.engine.table import Table

# the share of the culprit's excess its thread must have spent off the CPU, more than its peers did
BLOCKED_SHARE = 0.5
# the other threads of its process ran this share of the excess more than its peers' did, and this many
# times more against the training thread's own CPU time than theirs: not a pool working for the
# training thread (intra-op threads run the same share of the work on every rank)
OTHERS_SHARE = 0.5
OTHERS_RATIO = 4.0


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


def other_threads_evidence(table: Table, row: int, peer_rows: np.ndarray, excess_ms: float) -> dict[str, Any]:
    """``{"other_threads_cpu_ms": [rank, peers' median]}``, CPU ms a step the process's other threads ran
    (its CPU over the window, telemetry, less the training thread's, step clock), when that is
    OTHERS_SHARE of ``excess_ms`` more than the peers' and OTHERS_RATIO times more for each ms of the
    training thread's own CPU time; {} otherwise or without those times."""
    t = table.telemetry
    if excess_ms <= 0 or "cpu_s" not in t or "wall_s" not in t:
        return {}
    wall, cpu = t["wall_s"], table.sch("cpu")
    with np.errstate(divide="ignore", invalid="ignore"):
        others = np.where(wall > 0, t["cpu_s"] / wall, np.nan) * table.col("step") - cpu
        ratio = others / np.maximum(cpu, 0.1)
    peers = peer_rows[(peer_rows != row) & np.isfinite(others[peer_rows])]
    if not (peers.size and np.isfinite(others[row])):
        return {}
    ref, ref_ratio = float(np.median(others[peers])), float(np.median(ratio[peers]))
    if others[row] - ref < OTHERS_SHARE * excess_ms or ratio[row] < OTHERS_RATIO * max(ref_ratio, 1.0):
        return {}
    return {"other_threads_cpu_ms": [round(float(others[row]), 3), round(ref, 3)]}


def blocked_action(evidence: dict[str, Any], own_ms: float, step_ms: float | None = None) -> str:
    """What a blocked culprit's finding tells its reader to do (``step_ms``: its step, for the other
    threads' CPU a second)."""
    off, ref = evidence["off_cpu_ms"]
    head = (f"Its training thread was off the CPU {off:.1f} ms a step of its {own_ms:.1f} ms own work (peers "
            f"{ref:.1f}), not waiting for one")
    others = evidence.get("other_threads_cpu_ms")
    if others and step_ms:
        return (f"{head}, while the other threads of its process ran {others[0] / step_ms:.2f} CPU-s a second "
                f"(peers' {others[1] / step_ms:.2f}): another thread of this rank holds the GIL (a logging, "
                "metrics or data thread running pure Python: serializing, formatting, polling) or a lock the "
                "training thread waits for. py-spy dump --pid on this rank shows every thread's stack; move that "
                "work to a process (multiprocessing, a DataLoader worker) or make it sleep between turns.")
    return (f"{head}: blocked in a call no profiled op covers (a sleep, a lock or the GIL held by another "
            "thread, a synchronous read or write of a file, socket or pipe). py-spy dump --pid on this rank "
            "shows which.")
