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

A rank whose DataLoader workers fault the pages back in waits only when their prefetch runs dry, in
bursts a 3-step window can miss: with the window's evidence that it is short, it is named from the
steps before the window (``span_culprits``).

Ranks short of memory alike (one container's limit over all of a node's ranks, a dataset that
outgrew every node's page cache) have no peer to stand out from: the job-wide regression against the
baseline capture (commonmode.py) is named memory when half the ranks or more took that many more
major faults than in the baseline and were short by the same rule (``regression_memory``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from eroica_runtime.engine.baseline import Thresholds
from eroica_runtime.engine.history import HISTORY_FUNCTION, TRIGGERED
from eroica_runtime.engine.model import Finding, ranks_waiting
from eroica_runtime.engine.peers import Peers
from eroica_runtime.engine.quota import busy
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


def memory_action(ev: dict[str, Any], all_ranks: bool = False, baseline: bool = False) -> str:
    """What to tell the user for ``memory_evidence``: memory it lacked, or pages storage had to supply;
    ``all_ranks``: for ``regression_memory``, the ranks' medians against the baseline capture;
    ``baseline``: one rank's against its own baseline capture (the only rank compared: a one-rank job
    read "The ranks are short of memory alike: every rank took ...")."""
    mine, ref = ev["major_faults"]
    if all_ranks:
        share = ev.get("ranks_faulting_share", 1.0)
        said = (("every rank" if share >= 1.0 else f"{share:.0%} of the ranks") + f" took {mine:,.0f} major page "
                f"faults a step (median) vs {ref:,.0f} in the baseline capture")
    elif baseline:
        said = f"{mine:,.0f} major page faults a step vs {ref:,.0f} in its baseline capture"
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


SPAN_SHARE = 0.1   # a rank short of memory named from its span: busy at least this share of the step above its peers


def span_culprits(table: Table, peers: Peers, th: Thresholds, trigger: str, named: set[int]) -> list[Finding]:
    """Ranks short of memory whose waits the window and the 8 steps before it missed, named from every step
    the summaries ship before the window (up to 32).

    A rank whose DataLoader workers fault evicted pages back in waits for a batch only when its workers'
    prefetch runs dry: in bursts. The fault bench's memory case with 2 workers a rank (2026-12-06, 300
    steps) ran 18% slower from the onset (median step 64 -> 75.5 ms) and its drift capture read "healthy
    — 4/4 ranks agree, no culprit": rank 1 waited for its batches 5.7 ms a step in the window and 4.3 in
    the 8 steps before (its peers 3.6-10.3), while its workers took 7.3 major faults a step and its
    cgroup read back 15,355 pages a step (its peers none), and over the 32 steps before the window it
    waited 17.8 ms a step against its peers' 5.6-6.1. A rank whose window shows it short of memory
    (``memory_evidence``) and whose busy time (on a CPU, waiting for one or for a batch) over those
    steps is SPAN_SHARE of the step and th.abs_ms above its peers' median is named for it; only in a
    capture a detector asked for, and not a rank already named."""
    if trigger not in TRIGGERED:
        return []
    total = busy(table, "span") + np.nan_to_num(table.sch("span_data"))
    out: list[Finding] = []
    for rows in peers.groups:
        if len(rows) < 2:
            continue
        for row in rows:
            if int(row) in named or not np.isfinite(total[row]):
                continue
            ev = memory_evidence(table, row, rows)
            if not ev.get("memory_short"):
                continue
            others = rows[rows != row]
            ref = float(np.nanmedian(total[others]))
            step = float(np.nanmedian(table.sch("span_ms")[rows]))
            excess = float(total[row]) - ref
            if not (math.isfinite(excess) and excess >= max(th.abs_ms, SPAN_SHARE * step)):
                continue
            data, data_ref = float(table.sch("span_data")[row]), float(np.nanmedian(table.sch("span_data")[others]))
            n = int(table.sch("span_steps")[row]) if np.isfinite(table.sch("span_steps")[row]) else 0
            rank, host = int(table.rank[row]), table.hosts[int(table.host_idx[row])]
            victims = tuple(int(r) for r in table.rank[others].tolist())
            waited = (f"waited for its next batch {data:.1f} ms/step vs peers' {data_ref:.1f}"
                      if math.isfinite(data) and data - data_ref >= 0.5 * excess else
                      f"was busy {float(total[row]):.1f} ms/step vs peers' {ref:.1f}")
            out.append(Finding(
                category="memory", rank=rank, host=host, function=HISTORY_FUNCTION,
                phase="data" if waited.startswith("waited") else "host_gap",
                impact_ms_per_step=excess, what_if_step_ms=max(step - excess, 0.0), victims=victims,
                evidence={**ev, "excess_ms": excess, "seen_in": f"the {n} steps before the window (step clock)",
                          "span_busy_ms": [float(total[row]), ref], "data_ms": [data, data_ref],
                          "step_ms": [step, step], "victims_count": len(victims)},
                action=(f"Over the {n} steps before the window this rank {waited}, in bursts the window "
                        "missed (its DataLoader workers' prefetch hides the rest). " + memory_action(ev)),
                title=(f"rank {rank} on {host}: memory in the {n} steps before the window (+{excess:.1f} "
                       f"ms/step busy, {ranks_waiting(len(victims))})")))
    return out
