"""A rank short of memory: evidence from its major page faults and its memory cgroup's refaults.

Training hosts run without swap, so a host or container short of memory evicts file pages: a
memory-mapped dataset's (Megatron's indexed .bin, a numpy memmap), the libraries' code. The rank
then waits for storage inside whatever touched them, and its phases say only where: the fault
bench's memory case (rank 1's cgroup leaves its page cache a few MB; its items are read through
mmap) was "dataloader ... __next__ +57.7 ms/step: check its storage/network path to the dataset,
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

Ranks short of memory alike (one container's limit over all of a node's ranks, a dataset that
outgrew every node's page cache) have no peer to stand out from: the job-wide regression against the
baseline capture (commonmode.py) is named memory when half the ranks or more took that many more
major faults than in the baseline and were short by the same rule (``regression_memory``).
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
    refaults = _at(per_step(table, "refaults"), row)
    free, limit = _at(table.telemetry.get("mem_free_mb"), row), _at(table.telemetry.get("mem_limit_mb"), row)
    return _evidence([mine, ref], refaults, free, limit)


def _evidence(faults: list[float], refaults: float | None, free: float | None, limit: float | None) -> dict[str, Any]:
    """The evidence map for ``faults`` [now, reference] a step and what the memory telemetry said."""
    ev: dict[str, Any] = {"major_faults": faults}
    if refaults is not None:
        ev["refaults"] = refaults
    if free is not None and limit is not None and limit > 0:
        ev["mem_free_mb"], ev["mem_limit_mb"] = free, limit
    ev["memory_short"] = _short(faults[0] - faults[1], refaults, free, limit)
    return ev


def _short(faults: float, refaults: float | None, free: float | None, limit: float | None) -> bool:
    """Memory it lacked, for ``faults`` more major faults a step than its reference: its cgroup read back
    at least REFAULT_SHARE of that many pages, or (no refault counter) little of its limit was left."""
    if refaults is not None:
        return refaults >= REFAULT_SHARE * faults
    return free is not None and limit is not None and limit > 0 and free < FREE_SHARE * limit


def _median(values: np.ndarray) -> float | None:
    vals = values[np.isfinite(values)]
    return float(np.median(vals)) if vals.size else None


def regression_memory(cur: Table, base: Table, rc: np.ndarray, rb: np.ndarray) -> dict[str, Any]:
    """``memory_evidence`` for ranks short of memory alike: the medians over the aligned rows (``rc`` in this
    capture, ``rb`` in the baseline capture) of those whose major faults grew by MIN_FAULTS a step and
    FAULT_RATIO times over their own in the baseline, with "major_faults" [now, baseline] and
    "ranks_faulting_share", when that is half the ranks or more and their memory was short; else {}."""
    if not len(rc):
        return {}
    now, was = per_step(cur, "majflt")[rc], per_step(base, "majflt")[rb]
    with np.errstate(invalid="ignore"):
        grew = np.isfinite(now) & np.isfinite(was) & (now >= was + MIN_FAULTS) & (now >= FAULT_RATIO * was)
    if grew.mean() < 0.5:
        return {}
    m_now, m_was = float(np.median(now[grew])), float(np.median(was[grew]))
    refaults = _median(per_step(cur, "refaults")[rc][grew])
    t = cur.telemetry
    free = _median(t["mem_free_mb"][rc][grew]) if "mem_free_mb" in t else None
    limit = _median(t["mem_limit_mb"][rc][grew]) if "mem_limit_mb" in t else None
    ev = _evidence([m_now, m_was], refaults, free, limit)
    return {**ev, "ranks_faulting_share": float(grew.mean())} if ev["memory_short"] else {}


def memory_action(ev: dict[str, Any], all_ranks: bool = False) -> str:
    """What to tell the user for ``memory_evidence``: memory it lacked, or pages storage had to supply;
    ``all_ranks``: for ``regression_memory``, the ranks' medians against the baseline capture."""
    mine, ref = ev["major_faults"]
    if all_ranks:
        share = ev.get("ranks_faulting_share", 1.0)
        said = (("every rank" if share >= 1.0 else f"{share:.0%} of the ranks") + f" took {mine:,.0f} major page "
                f"faults a step (median) vs {ref:,.0f} in the baseline capture")
    else:
        said = f"{mine:,.0f} major page faults a step vs peers' {ref:,.0f}"
    who = "each" if all_ranks else "it"
    left = (f"; {ev['mem_free_mb']:,.0f} MB left of the {ev['mem_limit_mb']:,.0f} MB {who} may use"
            if "mem_free_mb" in ev else "")
    if not ev["memory_short"]:
        return (f"{said}: it reads memory-mapped files (a dataset, checkpoints) from storage, pages its peers "
                "find in memory: check the storage path, or warm the page cache (read the files once first).")
    its = "their memory cgroups (median)" if all_ranks else "its memory cgroup"
    again = (f"; {its} read back {ev['refaults']:,.0f} pages a step that the kernel had evicted shortly "
             "before (workingset refaults)" if ev.get("refaults") is not None else "")
    if all_ranks:
        return (f"The ranks are short of memory alike: {said}{again}{left}. Without swap the kernel evicts file "
                "pages (memory-mapped data, library code) and every rank waits for storage to read them back. "
                "Raise the memory limit of the ranks' containers or jobs (Kubernetes resources.limits.memory, "
                "Slurm --mem) or use less on every rank: fewer DataLoader workers or a smaller prefetch_factor, "
                "caches that grow; a dataset read through mmap that outgrew the page cache needs a smaller "
                "working set or faster storage.")
    return (f"This rank is short of memory: {said}{again}{left}. Without swap the kernel evicts file pages "
            "(memory-mapped data, library code) and the rank waits for storage to read them back, inside "
            "whatever op touched them. Raise its memory limit (Kubernetes resources.limits.memory, Slurm "
            "--mem) or use less: fewer DataLoader workers or a smaller prefetch_factor (each worker holds "
            "what it touches), caches that grow, other processes on the host.")
