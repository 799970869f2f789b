"""A rank short of memory: evidence from its major page faults and its memory cgroup's refaults.

Training hosts run without swap, so a host or container short of memory evicts file pages: a
memory-mapped dataset's (Megatron's indexed .bin, a numpy memmap), the libraries' code. The rank
then waits for storage inside whatever touched them, and its phases say only where: the fault
bench's memory case (rank 1's cgroup leaves its page cache 8 MB; its items are read through mmap)
was "dataloader ... __next__ +57.7 ms/step: check its storage/network path to the dataset,
num_workers ... 7704 involuntary context switches per CPU-second: CPU contention", while neither
the storage, the loader nor the CPUs were at fault, and more memory was the fix.

The summary's telemetry (telemetry.memory_sample) carries, over the window, the process's major
faults (its DataLoader workers' too) and its memory cgroup's workingset refaults (pages read back in
shortly after the kernel evicted them), and at its end the memory limit that binds and what is left.
A culprit whose major faults a step stand out from its peers' (at least MIN_FAULTS more, and
FAULT_RATIO times as many) waited for pages. It lacked memory when its cgroup refaulted at least
REFAULT_SHARE of that many pages (a working set that no longer fits; without a refault counter,
when less than FREE_SHARE of its limit was left): category memory, whatever op the faults fell in.
Otherwise the pages were never cached (a memory-mapped file read from storage for the first time):
the finding keeps its category and says so.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from eroica_runtime.engine.table import Table

MIN_FAULTS = 4.0        # major faults a step more than the peers' median ...
FAULT_RATIO = 3.0       # ... and this many times it: a rank that waited for pages
REFAULT_SHARE = 0.5     # its cgroup's refaults at least this share of its faults: pages it had and lost
FREE_SHARE = 0.05       # without a refault counter: less than this share of its memory limit left


def per_step(table: Table, key: str) -> np.ndarray:
    """A telemetry counter's growth over the window, per step of each rank (NaN where not measured)."""
    t = table.telemetry
    count, wall = t.get(key), t.get("wall_s")
    if count is None or wall is None:
        return np.full(table.n, np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(wall > 0, count * table.col("step") / (wall * 1e3), np.nan)


def _at(values: np.ndarray | None, row: int) -> float | None:
    if values is None:
        return None
    v = float(values[row])
    return v if math.isfinite(v) else None


def memory_evidence(table: Table, row: int, peer_rows: np.ndarray) -> dict[str, Any]:
    """{"major_faults": [rank, peers' median] a step, "refaults": a step (its cgroup's), "mem_free_mb",
    "mem_limit_mb", "memory_short": bool} when the rank's major faults stand out from its peers'; else {}."""
    faults = per_step(table, "majflt")
    peers = peer_rows[peer_rows != row]
    vals = faults[peers][np.isfinite(faults[peers])]
    mine = float(faults[row])
    ref = float(np.median(vals)) if vals.size else 0.0
    if not math.isfinite(mine) or mine < ref + MIN_FAULTS or mine < FAULT_RATIO * ref:
        return {}
    ev: dict[str, Any] = {"major_faults": [mine, ref]}
    refaults = _at(per_step(table, "refaults"), row)
    free, limit = _at(table.telemetry.get("mem_free_mb"), row), _at(table.telemetry.get("mem_limit_mb"), row)
    if refaults is not None:
        ev["refaults"] = refaults
    if free is not None and limit is not None and limit > 0:
        ev["mem_free_mb"], ev["mem_limit_mb"] = free, limit
    if refaults is not None:
        short = refaults >= REFAULT_SHARE * (mine - ref)
    else:
        short = free is not None and limit is not None and limit > 0 and free < FREE_SHARE * limit
    ev["memory_short"] = bool(short)
    return ev


def memory_action(ev: dict[str, Any]) -> str:
    """What to tell the user for ``memory_evidence``: memory it lacked, or pages storage had to supply."""
    mine, ref = ev["major_faults"]
    said = f"{mine:,.0f} major page faults a step vs peers' {ref:,.0f}"
    left = (f"; {ev['mem_free_mb']:,.0f} MB left of the {ev['mem_limit_mb']:,.0f} MB it may use"
            if "mem_free_mb" in ev else "")
    if not ev["memory_short"]:
        return (f"{said}: it reads memory-mapped files (a dataset, checkpoints) from storage, pages its peers "
                "find in memory: check the storage path, or warm the page cache (read the files once first).")
    again = (f"; its memory cgroup read back {ev['refaults']:,.0f} pages a step that the kernel had evicted shortly "
             "before (workingset refaults)" if ev.get("refaults") is not None else "")
    return (f"This rank is short of memory: {said}{again}{left}. Without swap the kernel evicts file pages "
            "(memory-mapped data, library code) and the rank waits for storage to read them back, inside "
            "whatever op touched them. Raise its memory limit (Kubernetes resources.limits.memory, Slurm "
            "--mem) or use less: fewer DataLoader workers or a smaller prefetch_factor (each worker holds "
            "what it touches), caches that grow, other processes on the host.")
