"""A CPU quota (a container's CPU limit) that held ranks throttled: evidence from the cgroup's counters.

The kernel throttles a cgroup that used up its quota for the rest of the period: every thread of the
rank stops, its collective threads too, so the training thread's own clock cannot tell a rank held
throttled while its gloo thread was due from a rank waiting for its peers (``attribution.views``
counts that time as the rank's own work). The summary's telemetry carries the quota and the
cgroup's throttle counter at the window's edges (telemetry.cgroup_cpu).

Two uses: a culprit found by the comparison with its peers is named for its quota when the quota
held it throttled for at least half its excess (``quota_evidence``); and ranks held throttled for a
tenth of their step or more are reported even when all of them are alike (``quota_findings``), with
no peer to stand out from: a pod whose CPU limit is too small for its ranks and their DataLoader
workers slows the whole job from its first step, and its baseline capture looks "healthy".
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from eroica_runtime.engine.baseline import Thresholds
from eroica_runtime.engine.model import Finding
from eroica_runtime.engine.table import Table

QUOTA_SHARE = 0.5          # throttled ms per step at least this share of a culprit's excess: the quota made it slow
QUOTA_STEP_SHARE = 0.1     # ... or this share of the rank's step: held throttled, whatever its peers did
QUOTA_FUNCTION = "(CPU quota)"   # a finding's function when the quota, not an op, is what to change
HOSTS_LISTED = 4


def held_ms(counter_ms: np.ndarray, wall_ms: np.ndarray, quota: np.ndarray) -> np.ndarray:
    """ms of ``wall_ms`` a cgroup was held throttled, from how much its throttle counter grew.

    The kernel's counter (v1 ``throttled_time``, v2 ``throttled_usec``) adds up the throttled time
    of every CPU the group had runnable threads on: a pod of 4 busy ranks under a 1-CPU limit on 2
    cores counted 1.2 s a second (read as "held 100% of the step, step -> 0 ms if fixed"), while one
    rank in its own 0.15-CPU cgroup counts ~0.86 s a second, about the wall time it was held. A
    group held for a share f of the wall on n CPUs, and running on those n otherwise, counts
    n f wall and uses n (1 - f) wall of CPU; throttled, it used its quota, q wall. So
    f = counter / (counter + q wall), whatever n is. Where the quota used less than it allows (held
    in only some periods) that undercounts; without a quota the counter is taken as wall time, at
    most all of it."""
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(np.isfinite(quota) & (quota > 0), quota, np.nan)
        by_quota = wall_ms * counter_ms / (counter_ms + q * wall_ms)
        held = np.where(np.isfinite(by_quota), by_quota, counter_ms)
    return np.clip(held, 0.0, np.maximum(wall_ms, 0.0))


def _quotas(table: Table) -> np.ndarray:
    q = table.telemetry.get("cpu_quota")
    return q if q is not None else np.full(table.n, np.nan)


def throttled_ms(table: Table) -> np.ndarray:
    """ms per step each rank's cgroup was held throttled by its CPU quota (NaN where not measured):
    the share of the window's wall time it was held (``held_ms``, from the counter's growth over
    the window), times the rank's step."""
    t = table.telemetry
    thr, wall = t.get("cpu_throttled_ms"), t.get("wall_s")
    if thr is None or wall is None:
        return np.full(table.n, np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(wall > 0, held_ms(thr, wall * 1e3, _quotas(table)) / (wall * 1e3), np.nan)
    return share * table.col("step")


def steps_throttled_ms(table: Table, over: str = "hist") -> np.ndarray:
    """The same for the step clock's steps before the window (``over`` "hist": the recent ones, "span":
    all shipped): its counter growth a step over those steps' mean wall time, 0 where they carry none."""
    return held_ms(np.nan_to_num(table.sch(f"{over}_thr")), table.sch(f"{over}_ms"), _quotas(table))


def busy(table: Table, over: str) -> np.ndarray:
    """ms a step the training thread ran or waited for a CPU, plus the time its CPU quota held the
    process throttled beyond that wait (its collective threads were held too; attribution.views does
    the same for the window), over the step clock's recent steps ("hist") or all it shipped ("span")."""
    runq = table.sch(f"{over}_runq")
    held = np.clip(np.nan_to_num(steps_throttled_ms(table, over)) - np.nan_to_num(runq), 0.0, None)
    return table.sch(f"{over}_cpu") + runq + held


def _quota(table: Table, rows: np.ndarray) -> float | None:
    """The smallest quota (CPUs) the rows reported, None when none did (or only nonsense)."""
    q = table.telemetry.get("cpu_quota")
    vals = q[rows][np.isfinite(q[rows]) & (q[rows] > 0)] if q is not None else np.zeros(0)
    return float(vals.min()) if vals.size else None


def quota_evidence(table: Table, row: int, peer_rows: np.ndarray, excess_ms: float,
                   throttled: np.ndarray | None = None) -> dict[str, Any]:
    """{"cgroup_throttled_ms": [rank, peers' median], "cpu_quota": CPUs} when the rank's CPU quota held it
    throttled for at least QUOTA_SHARE of its excess a step, and clearly more than its peers; else {}.
    ``throttled``: ms a step per row (default: the window's, ``throttled_ms``; the step clock's for
    the steps before the window)."""
    thr = throttled_ms(table) if throttled is None else throttled
    peers = peer_rows[peer_rows != row]
    vals = thr[peers][np.isfinite(thr[peers])]
    mine, ref = float(thr[row]), float(np.median(vals)) if vals.size else 0.0
    if not math.isfinite(mine) or mine <= 0.0 or mine - ref < QUOTA_SHARE * excess_ms:
        return {}
    quota = _quota(table, np.asarray([row]))
    return {"cgroup_throttled_ms": [mine, ref], **({"cpu_quota": quota} if quota is not None else {})}


def _raise_the_limit() -> str:
    return ("raise the CPU limit (Kubernetes resources.limits.cpu, Slurm --cpus-per-task, cgroup cpu.max) or run "
            "fewer threads in it (OMP_NUM_THREADS, DataLoader workers).")


def quota_limit(ev: dict[str, Any]) -> str:
    """" of 0.15 CPUs" for evidence that names the quota, "" for evidence without one."""
    return f" of {ev['cpu_quota']:.2f} CPUs" if ev.get("cpu_quota") is not None else ""


def quota_action(ev: dict[str, Any], step_ms: float | None = None, when: str = "") -> str:
    """The action for ``quota_evidence`` (a culprit in the window, or ``when`` it was held: the steps
    before the window): which limit, how long it held the rank, what to change."""
    mine, ref = ev["cgroup_throttled_ms"]
    share = f" ({mine / step_ms:.0%} of its step)" if step_ms else ""
    return (f"Its cgroup's CPU quota{quota_limit(ev)} held it throttled {mine:.1f} ms/step{share} vs peers' "
            f"{ref:.1f}{' ' + when if when else ''}, its collective threads too: " + _raise_the_limit())


def quota_findings(table: Table, th: Thresholds, named: set[int]) -> list[Finding]:
    """Ranks (not ``named`` rows) that their CPU quota held throttled for at least QUOTA_STEP_SHARE of
    their step, however alike their peers are: one finding per host, or one for the job when more
    than HOSTS_LISTED hosts have them. Its cost is the longest throttled time a step among them (a
    synchronous step waits for its most throttled rank), as the counter says, not a measured loss: a
    throttled period can fall while the rank would have waited anyway, and its peers wait for it on
    top. On a GPU the host runs ahead of the device, and throttling costs the step only while the
    device sits idle for want of the host: there the time counted is at most the device's idle time
    (a DataLoader's workers throttled while the GPU computes cost nothing). Every rank of those hosts
    held throttled a ms or more a step is listed."""
    held_ms = throttled_ms(table)
    idle = table.dev("idle")
    thr = np.where(np.isfinite(idle), np.minimum(held_ms, idle), held_ms)
    step = table.col("step")
    with np.errstate(invalid="ignore"):
        share = np.where(step > 0, thr / step, np.nan)
        held = np.isfinite(thr) & (thr >= th.abs_ms)
        over = held & (share >= QUOTA_STEP_SHARE)
    free = ~np.isin(np.arange(table.n), np.fromiter(named, dtype=np.int64, count=len(named)))
    hosts = np.unique(table.host_idx[over & free]).tolist()
    if not hosts:
        return []
    groups = [hosts] if len(hosts) > HOSTS_LISTED else [[h] for h in hosts]
    sizes = np.bincount(table.host_idx, minlength=len(table.hosts))
    step_med = float(np.median(step))
    out: list[Finding] = []
    for hs in groups:
        on = np.flatnonzero(held & free & np.isin(table.host_idx, hs))
        worst = int(on[np.argmax(thr[on])])
        ms, frac = float(thr[worst]), float(share[worst])
        ranks = sorted(int(r) for r in table.rank[on])
        quota = _quota(table, on)
        limit = f" ({quota:.2f} CPUs)" if quota is not None else ""   # "the CPU quota (0.30 CPUs)"
        if len(hs) > 1:
            host, who = None, f"{len(ranks)} ranks on {len(hs)} hosts"
        else:
            host = table.hosts[hs[0]]
            who = f"rank {ranks[0]} on {host}" if len(ranks) == 1 else \
                f"host {host}: {len(ranks)} of {int(sizes[hs[0]])} ranks"
        ev: dict[str, Any] = {"cgroup_throttled_ms": [float(held_ms[worst]), float(np.median(held_ms[on]))],
                              "step_share": frac,
                              **({"device_idle_ms": float(idle[worst])} if np.isfinite(idle[worst]) else {}),
                              "ranks": ranks, "worst_rank": int(table.rank[worst]),
                              **({"hosts": [table.hosts[h] for h in hs]} if len(hs) > 1 else
                                 {"ranks_on_host": int(sizes[hs[0]])}),
                              **({"cpu_quota": quota} if quota is not None else {})}
        out.append(Finding(
            category="host", rank=ranks[0] if len(ranks) == 1 else None, host=host, function=QUOTA_FUNCTION,
            phase="host_gap", impact_ms_per_step=ms, what_if_step_ms=max(step_med - ms, 0.0), evidence=ev,
            action=(f"The kernel held {'this rank' if len(ranks) == 1 else 'these ranks'} throttled by the CPU "
                    f"quota{limit}, up to {ms:.1f} ms/step ({frac:.0%} of the step, rank {int(table.rank[worst])}): "
                    "the job needs more CPU than the limit gives; " + _raise_the_limit()),
            title=f"{who} held throttled by the CPU quota{limit}, up to {ms:.1f} ms/step ({frac:.0%} of the step)"))
    return out
