"""Problems peers agree on: regression against the job's healthy baseline capture, and slow
communication with no late rank to blame (localized to hosts with a link probe or telemetry).

``link_probe`` (optional, attached by the runtime) maps host -> measurements, either directly
``{host: {...}}`` or under ``{"hosts": {host: {...}}}``; recognised keys are ``latency_us`` /
``latency_ms`` (higher is worse) and ``bandwidth_gbps`` / ``bandwidth_mbps`` (lower is worse).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from eroica_runtime.engine.baseline import Thresholds, center, group_bars
from eroica_runtime.engine.categories import (
    ACTIONS,
    COMPUTE_PHASES,
    regression_action,
    regression_verdict,
    regression_work,
)
from eroica_runtime.engine.history import TRIGGERED
from eroica_runtime.engine.memory import memory_action, regression_memory
from eroica_runtime.engine.model import Finding
from eroica_runtime.engine.peers import Peers
from eroica_runtime.engine.table import HISTORY_RECENT, Table
from eroica_runtime.summary import OWN_WORK_PHASES


def _others_median(values: np.ndarray) -> np.ndarray:
    """Per-entry reference: the median of the OTHER entries (exact for few hosts, where one outlier
    moves the median a lot), the plain median when there are many."""
    finite = np.where(np.isfinite(values), values, np.nan)
    if len(values) >= 5:
        return np.full(len(values), float(np.nanmedian(finite)))
    return np.asarray([float(np.nanmedian(np.delete(finite, i))) if np.isfinite(np.delete(finite, i)).any()
                       else float("nan") for i in range(len(values))])


def _aligned(cur: Table, base: Table) -> tuple[np.ndarray, np.ndarray]:
    common = np.intersect1d(cur.rank, base.rank)
    return cur.rows_of(common), base.rows_of(common)


def _below_gap(values: np.ndarray) -> np.ndarray:
    """Which entries lie below the widest ratio gap in the lower half of the sorted values: slow
    links are a minority, and set apart from the healthy ones, however widely those spread."""
    finite = np.flatnonzero(np.isfinite(values) & (values >= 0))
    out = np.zeros(len(values), dtype=bool)
    if len(finite) < 2:
        return out
    order = finite[np.argsort(values[finite], kind="stable")]
    ranked = np.maximum(values[order], 1e-12)   # a dead link (0) is the slowest, not a division by zero
    lowest = max(1, len(ranked) // 2)
    k = int(np.argmax(ranked[1:lowest + 1] / ranked[:lowest])) + 1
    out[order[:k]] = True
    return out


def slow_hosts_from_probe(link_probe: dict[str, Any] | None, bw_factor: float = 0.5,
                          latency: bool = True) -> tuple[list[str], dict[str, Any]]:
    """Hosts whose probe latency is far above (or bandwidth below ``bw_factor`` x) the other hosts',
    and set apart from them: below the widest gap in bandwidth (above it in latency). Healthy links
    read 1.0-11 Gbps in one probe of this 2-core machine's fake hosts, a 100 Mbit/s link 0.09: the
    factor alone also named the healthy host at 1.1-1.9 next to the slow one (the fault bench's link
    cases, 2026-12-01). ``latency=False``: bandwidth alone (one descheduled ping on a shared host
    reads as 2-4 ms of latency in a healthy probe; a slow link's bandwidth drops 5-15x)."""
    if not isinstance(link_probe, dict):
        return [], {}
    hosts = link_probe.get("hosts", link_probe)
    if not isinstance(hosts, dict) or len(hosts) < 2:
        return [], {}
    names = [h for h, v in hosts.items() if isinstance(v, dict)]

    def col(*keys: str, scale: tuple[float, ...]) -> np.ndarray:
        out = []
        for h in names:
            v = float("nan")
            for k, s in zip(keys, scale, strict=True):
                x = hosts[h].get(k)
                if isinstance(x, (int, float)):
                    v = float(x) * s
                    break
            out.append(v)
        return np.asarray(out, dtype=np.float64)

    lat = col("latency_us", "latency_ms", scale=(1.0, 1000.0))
    bw = col("bandwidth_gbps", "bandwidth_mbps", scale=(1.0, 0.001))
    ev: dict[str, Any] = {}
    slow_bw: list[str] = []
    slow_lat: list[str] = []
    if np.isfinite(bw).sum() >= 2:
        apart = _below_gap(bw)
        for h, v, med, sep in zip(names, bw, _others_median(bw), apart, strict=True):
            if sep and math.isfinite(v) and math.isfinite(med) and v < bw_factor * med:
                slow_bw.append(h)
                ev.setdefault("probe", {}).setdefault(h, {}).update(
                    {"bandwidth_gbps": v, "hosts_median_bandwidth_gbps": med})
    if latency and np.isfinite(lat).sum() >= 2:
        apart = _below_gap(np.where(lat > 0, 1.0 / np.where(lat > 0, lat, 1.0), np.nan))
        for h, v, med, sep in zip(names, lat, _others_median(lat), apart, strict=True):
            if sep and math.isfinite(v) and math.isfinite(med) and v > 3.0 * med and v - med > 5.0:
                slow_lat.append(h)
                ev.setdefault("probe", {}).setdefault(h, {}).update(
                    {"latency_us": v, "hosts_median_latency_us": med})
    # a slow link (rate limit, delay, errors) always costs bandwidth; a latency outlier alone is
    # often one descheduled ping, so it names a host only when no host stands out in bandwidth
    bad = slow_bw or slow_lat
    ev["probe"] = {h: v for h, v in ev.get("probe", {}).items() if h in bad}
    if not bad:
        ev = {}
    return bad, ev


def slow_hosts_from_telemetry(table: Table) -> tuple[list[str], dict[str, Any]]:
    """Hosts whose TCP retransmits / packet drops during the window stand out from the others."""
    t = table.telemetry
    errs = np.nan_to_num(t["tcp_retrans"]) + np.nan_to_num(t["net_drops"])
    if not np.any(errs > 0) or len(table.hosts) < 2:
        return [], {}
    per_host = np.zeros(len(table.hosts))
    np.maximum.at(per_host, table.host_idx, errs)
    ref = _others_median(per_host)
    hit = np.flatnonzero((per_host > 10.0 * np.maximum(ref, 1.0)) & (per_host >= 20))
    bad = [table.hosts[i] for i in hit]
    ev = {"net_errors": {table.hosts[i]: [float(per_host[i]), float(ref[i])] for i in hit}} if bad else {}
    return bad, ev


def localize(table: Table, link_probe: dict[str, Any] | None,
             suspects: list[str] | None = None) -> tuple[list[str], dict[str, Any]]:
    """Name the slow host(s): a link probe first, then network error counters, then ``suspects``."""
    bad, ev = slow_hosts_from_probe(link_probe)
    if bad:
        ev["localized_by"] = "link_probe"
        return bad, ev
    bad, ev = slow_hosts_from_telemetry(table)
    if bad:
        ev["localized_by"] = "network error counters (tcp_retrans + net_drops)"
        return bad, ev
    if suspects:
        return suspects, {"localized_by": "ranks with excess communication wait"}
    return [], {}


def _comm_finding(table: Table, hosts: list[str], impact: float, step_ms: float,
                  ev: dict[str, Any], title: str) -> Finding:
    """A communication finding on the named host(s). A job on one host names that host and gets its
    own action: sending an SRE to NICs and switch ports that carry none of its collectives is wrong
    (a healthy single-host fault-bench job whose cores were shared with other work once read
    "no host could be singled out ... check the NICs, links and switch ports")."""
    action, suffix = ACTIONS["communication"], ""
    if len(table.hosts) == 1 and not ev.get("localized_by"):
        hosts, ev = list(table.hosts), {**ev, "one_host": True}
        action, suffix = ACTIONS["communication_one_host"], ", the job's only host (no network link between its ranks)"
    host = hosts[0] if len(hosts) == 1 else (",".join(hosts) if hosts else None)
    where = (f" on {host}" if host else " (no host could be singled out)") + suffix
    return Finding(category="communication", rank=None, host=host, function="(comm)", phase="comm",
                   impact_ms_per_step=impact, what_if_step_ms=max(step_ms - impact, 0.0),
                   evidence={**ev, "hosts": hosts}, action=action, title=title + where)


def _in_most_steps(table: Table, rows: np.ndarray, bar: float) -> np.ndarray:
    """Which of ``rows`` waited at least ``bar`` ms longer than the group's median in most of the
    window's steps (all True without per-step data). A slow path delays every step's collectives;
    a collective thread descheduled once on a shared host adds to one step only."""
    if table.step_comm is None:
        return np.ones(len(rows), dtype=bool)
    per_step = table.step_comm[rows]
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # an all-NaN step column
        d = per_step - np.nanmedian(per_step, axis=0)
    known = np.isfinite(d).sum(axis=1)
    over = (np.nan_to_num(d, nan=-np.inf) >= bar).sum(axis=1)
    return (known == 0) | (over * 2 > known)


def local_comm_excess(table: Table, peers: Peers, th: Thresholds,
                      link_probe: dict[str, Any] | None, notes: list[str] | None = None) -> list[Finding]:
    """Ranks that wait much longer in communication than their peers while nobody is late.

    Only across hosts: on one host there is no network path to blame, and a rank that waits alone
    there was preempted (its collective thread descheduled), which the step-level checks see. When
    a link probe ran as the window opened and singled out no host, or only hosts none of the waiting
    ranks runs on, the wait is a note, not a finding: the two measurements disagree, and which rank
    waits longest in a collective is mostly which rank arrived first. Every such finding in the
    recorded runs was of a healthy network: a CI link test's baseline named host h3, whose rank's
    three window steps ran 69-85 ms against its peers' 37-100, while the probe read h3's link the
    fastest (6.9 Gbps against 3.9-4.7); two fault-bench baselines (before any fault) named h2 from
    the probe (87 us latency against 28; 0.48 Gbps against 1.09) for a rank 3 or rank 1 that waited.
    """
    if len(table.hosts) < 2 and not link_probe:
        return []
    comm = table.col("comm")
    step = table.col("step")
    own = table.own
    hit = np.zeros(table.n, dtype=bool)
    excess = np.zeros(table.n)
    for rows in peers.groups:
        if len(rows) < 3:
            continue
        c = center(comm[rows], th.sigma_floor_rel)
        step_ref = float(np.median(step[rows]))
        # a rank that finished its own work early waits longer: that part of the wait is explained
        early = np.maximum(float(np.median(own[rows])) - own[rows], 0.0)
        d = comm[rows] - c.ref - early
        # the same size rule as a culprit's (baseline.group_bars): a healthy 4-host CI job on 2 shared
        # cores once had a host named for a wait over the old bar (10% of the step) while three peers
        # agreed closely (a tiny MAD, so the z test let it through)
        rel, z_min = group_bars(len(rows), th)
        bar = max(th.abs_ms, rel * step_ref)
        ok = (d >= bar) & (d / c.sigma >= z_min) & _in_most_steps(table, rows, 0.5 * bar)
        hit[rows[ok]] = True
        excess[rows[ok]] = d[ok]
    if not hit.any():
        return []
    host_hits = np.bincount(table.host_idx[hit], minlength=len(table.hosts))
    host_all = np.bincount(table.host_idx, minlength=len(table.hosts))
    suspects = [table.hosts[i] for i in np.flatnonzero(host_hits >= np.maximum(1, 0.5 * host_all))]
    hosts, ev = localize(table, link_probe, suspects)
    probed = isinstance(link_probe, dict) and len(link_probe.get("hosts", link_probe)) >= 2
    waiting_on = {table.hosts[i] for i in np.flatnonzero(host_hits)}
    if probed and (ev.get("localized_by") == "ranks with excess communication wait"
                   or (ev.get("localized_by") == "link_probe" and not waiting_on & set(hosts))):
        if notes is not None:
            why = ("singled out no host" if ev.get("localized_by") != "link_probe" else
                   f"singled out {', '.join(hosts[:4])}, where none of them runs")
            notes.append(f"rank(s) {', '.join(str(int(r)) for r in table.rank[hit][:8])} waited "
                         f"{float(excess[hit].max()):.1f} ms/step longer in collectives than their peers, but the "
                         f"link probe {why}: not reported as a network problem")
        return []
    ev.update({"ranks": table.rank[hit][:64].tolist(), "ranks_count": int(hit.sum()),
               "comm_wait_ms": [float(np.median(comm[hit])), float(np.median(comm[~hit]))
                                if (~hit).any() else float("nan")]})
    impact = float(excess[hit].max())
    return [_comm_finding(table, hosts, impact, float(np.median(step)), ev,
                          "Communication wait far above peers with no late rank")]


@dataclass(frozen=True)
class Slower:
    """A capture whose median step grew beyond noise against the baseline capture's, with no
    job-wide finding to show for it: unexplained (the report must not call it healthy), or passing
    (``before_ms``: the steps just before a capture no detector asked for were not slower)."""

    now_ms: float
    baseline_ms: float
    before_ms: tuple[float, float] | None = None   # the steps before this window, before the baseline's


def common_mode(cur: Table, base: Table, th: Thresholds, culprit_excess: float,
                link_probe: dict[str, Any] | None,
                culprit_rows: np.ndarray | None = None, trigger: str = ""
                ) -> tuple[list[Finding], list[str], Slower | None]:
    """Regression / common-mode communication findings against the baseline capture, notes, and
    a ``Slower`` when the step grew beyond noise and no finding here explains it.

    Culprit rows are left out: their own growth is already a finding and must not leak into the
    job-wide medians (it would with two or three ranks).

    A capture no detector asked for (a person's, ``trigger`` not in TRIGGERED) claims a slowdown
    only when the steps just before its window were slower than the baseline as well
    (``_passing``): a detector's capture follows slow steps by construction, a person's can land
    on three steps another process slowed (a healthy CI job's manual window of three 35 ms steps
    among 19-27 ms ones read "COMMUNICATION ... +8.3 ms/step" against its baseline).
    """
    notes: list[str] = []
    rc, rb = _aligned(cur, base)
    # how much the latest rank's own work grew against the baseline, culprits included: the others'
    # extra wait up to that much is its lateness, not the network's
    late_all = float(np.max(cur.own[rc] - base.own[rb])) if len(rc) else 0.0
    culprit_growth = 0.0
    if culprit_rows is not None and len(culprit_rows):
        keep = ~np.isin(rc, culprit_rows)
        culprit_growth = float(np.max(cur.own[rc[~keep]] - base.own[rb[~keep]])) if (~keep).any() else 0.0
        rc, rb = rc[keep], rb[keep]
    if len(rc) == 0:
        return [], ["baseline capture shares no ranks with this capture; regression check skipped"], None
    step_c, step_b = cur.col("step")[rc], base.col("step")[rb]
    base_step = float(np.median(step_b))
    now_step = float(np.median(cur.col("step")))
    # two short windows of a noisy job differ by chance: the growth must also clear the std error
    # of the difference of their mean steps (a 3-step window on a shared host wobbles by 10-20%)
    noise = th.regression_noise_k * math.hypot(float(np.median(cur.step_noise[rc])),
                                               float(np.median(base.step_noise[rb])))
    limit = max(th.abs_ms, th.regression_rel * base_step, noise)
    d_own = cur.own[rc] - base.own[rb]
    d_comm = cur.col("comm")[rc] - base.col("comm")[rb]
    m_own, m_comm = float(np.median(d_own)), float(np.median(d_comm)) - culprit_excess
    # a wait that grew by as much as the latest rank's own work grew is that rank's lateness
    late = max(late_all, float(np.max(d_own)) if len(d_own) else 0.0)
    # (with slack: a late rank also slows the collective itself — ring steps, shared cores)
    if late >= limit and float(np.median(d_comm)) <= 1.25 * late + limit:
        notes.append(f"communication wait grew {float(np.median(d_comm)):.1f} ms/step vs the baseline, about "
                     f"as much as the latest rank's own work grew ({late:.1f}): not blamed on the network")
        m_comm = 0.0
    cpu_growth = _waited_for_cpu(cur, base, rc, rb, m_own)
    if m_own > 0.0 and _shares_hosts(cur, rc, culprit_rows) and \
            ((culprit_growth >= limit and m_own <= 0.5 * culprit_growth) or cpu_growth is not None):
        # the culprit's peers on its own host(s) slowed too: they share its cores/memory (a culprit
        # starved by co-located work starves its host-mates as well: their growth is run-queue wait)
        how = (f", {cpu_growth:.1f} of it CPU time (the rest waiting for a CPU)" if cpu_growth is not None
               else f" with its {culprit_growth:.1f}")
        notes.append(f"the culprit's host-mates' own work grew {m_own:.1f} ms/step{how}: "
                     "shared-host contention, not a job-wide regression")
        m_own = 0.0
    findings: list[Finding] = []
    if now_step - base_step < limit:
        # the job is not slower than its healthy reference: a phase that grew is not a problem to
        # report (per-rank deltas of a few ms on a faster step are noise); unless the window's few steps
        # are only too noisy to say so, and the steps before a detector's window do
        before = _slower_before(cur, base, rc, rb, th, trigger, now_step - base_step, base_step)
        if before is not None:
            notes.append(f"the window's steps ran {now_step:.1f} ms against {base_step:.1f} ms in the baseline "
                         f"capture, within their noise, but the {HISTORY_RECENT} steps before it {before[0]:.1f} ms "
                         f"against {before[1]:.1f} before the baseline's: slower than the baseline")
            return findings, notes, Slower(now_step, base_step)
        return findings, notes, None
    passing = _passing(cur, base, rc, rb, max(th.abs_ms, 0.5 * (now_step - base_step)), trigger)
    if passing is not None:
        notes.append(f"the window's steps ran {now_step:.1f} ms against {base_step:.1f} ms in the baseline capture, "
                     f"but the {HISTORY_RECENT} steps before it {passing[0]:.1f} ms against {passing[1]:.1f} before "
                     "the baseline's: a passing slowdown (another process on the host, a checkpoint), not a job-wide "
                     "problem")
        return findings, notes, Slower(now_step, base_step, passing)
    common = {"step_ms": [now_step, base_step], "baseline_step": base.capture_step,
              "ranks_compared": int(len(rc)), "step_delta_ms": float(np.median(step_c - step_b))}
    if m_own >= limit:
        # ranks whose own work did not grow with the others': most of a peer group slow alike is beyond
        # a comparison of peers (the healthy ranks are the ones that stand out), and is named here; the
        # ranks it spared must not be drained with the rest (3 of 4 ranks +150 ms of matmuls read "all
        # ranks" though rank 2 did not slow), nor count in what it costs (4 of 8 ranks +100 ms read +47
        # ms a step, the median of the slow and the spared, of the 84 the step grew)
        spared = (d_own < limit) & (d_own < 0.5 * m_own)
        ra, rba = rc[~spared], rb[~spared]
        m_own = float(np.median(d_own[~spared]))
        phase_d = {p: float(np.median(cur.col(p)[ra] - base.col(p)[rba])) for p in OWN_WORK_PHASES}
        phase = max(phase_d, key=lambda p: phase_d[p])
        fns = _function_growth(cur, base, ra, rba, th)
        share = float(np.mean(d_own >= limit))
        ev = {**common, "own_work_ms": [float(np.median(cur.own[ra])), float(np.median(base.own[rba]))],
              "phase_delta_ms": phase_d, "functions": fns, "ranks_affected_share": share}
        slow_hosts: list[str] = []
        if spared.any():
            ev["ranks_spared"] = [int(r) for r in cur.rank[rc[spared]][:SPARED_LISTED]]
            ev["ranks_spared_count"] = int(spared.sum())
            slow_hosts = hosts_alone(cur, ra, rc[spared])
            if slow_hosts:
                ev["slow_hosts"] = slow_hosts[:SPARED_LISTED]
        # one rank compared (a job of one process): it is named, with its host, as itself, not "all ranks"
        one = int(cur.rank[rc[0]]) if len(rc) == 1 else None
        who = f"{len(rc) - int(spared.sum())} of {len(rc)} ranks" if spared.any() else \
            "All ranks" if one is None else f"Rank {one}"
        top = fns[0]["name"] if fns else f"({phase})"
        if phase in COMPUTE_PHASES and fns and fns[0]["phase"] in COMPUTE_PHASES:
            phase = fns[0]["phase"]
        action = (regression_work(fns[0], bool(spared.any()), one is not None) + " " if fns else "") \
            + regression_action(phase, ev.get("ranks_spared"), len(rc) - int(spared.sum()), slow_hosts,
                                bool(fns) and regression_verdict(fns[0]) == "more", one is not None) \
            + (" Grew most: " + ", ".join(f["name"] for f in fns[:3]) if fns else "")
        if one is not None:
            slow_hosts = [cur.hosts[int(cur.host_idx[rc[0]])]]
        memory = regression_memory(cur, base, ra, rba)   # every slow rank waited for pages it had lost
        if memory:
            ev.update(memory)
            ev["all_ranks"] = one is None
            action = memory_action(memory, all_ranks=one is None, baseline=True)
        findings.append(Finding(
            category="memory" if memory else "regression", rank=one,
            host=",".join(slow_hosts) if 0 < len(slow_hosts) <= HOSTS_NAMED else None, function=top, phase=phase,
            # fixed, the job steps about as in its baseline, not faster: own work that grew more than the
            # step did (its waits shrank) must not print "step -> 0.0 ms if fixed"
            impact_ms_per_step=m_own, what_if_step_ms=max(now_step - m_own, min(base_step, now_step)), evidence=ev,
            action=action,
            title=f"{who} slower than {'the' if one is None else 'its'} baseline capture"
                  f"{', short of memory' if memory else ''}: own work "
                  f"+{m_own:.1f} ms/step"))
    # with a culprit, the residual wait is a small difference of big numbers: judge it against the
    # current step as well (a 270 ms culprit on a 13 ms baseline step leaves a few ms of slack)
    comm_limit = max(limit, th.regression_rel * now_step) if culprit_excess > 0 else limit
    if m_comm >= comm_limit:
        hosts, ev = localize(cur, link_probe)
        ev.update(common)
        ev["comm_wait_ms"] = [float(np.median(cur.col("comm")[rc])), float(np.median(base.col("comm")[rb]))]
        contention = _cpu_contention(cur, base, rc, rb)
        if contention is not None and not ev.get("link_probe"):
            # every rank descheduled far more than in the baseline: the waits are CPU starvation on
            # the host(s), not the network (collectives over loopback/shm need CPU too)
            host_names = sorted({cur.hosts[int(i)] for i in cur.host_idx[rc]})
            findings.append(Finding(
                category="host", rank=None, host=",".join(host_names[:4]), function="(cpu contention)",
                phase="host_gap", impact_ms_per_step=m_comm, what_if_step_ms=max(now_step - m_comm, 0.0),
                evidence={**ev, **contention}, action=ACTIONS["host"],
                title=f"All ranks starved of CPU (involuntary context switches x{contention['ctx_invol_ratio']:.0f} "
                      f"vs the baseline): +{m_comm:.1f} ms/step"))
        else:
            findings.append(_comm_finding(cur, hosts, m_comm, now_step, ev,
                                          f"Communication wait +{m_comm:.1f} ms/step vs the baseline capture"))
    if not findings and now_step - base_step >= limit and culprit_excess == 0.0:
        notes.append(f"step {now_step:.1f} ms vs baseline {base_step:.1f} ms, but neither own work nor "
                     "communication wait explains it on most ranks")
        return findings, notes, Slower(now_step, base_step)
    return findings, notes, None


# A slow link in bursts, seen in the steps before the window (comm_before_window): how far every
# rank's steps must have grown over the baseline's (a fraction of its step), how little of that any
# rank's own work may explain, and how far below the other hosts' the probe's bandwidth must be.
BURST_GROWTH = 0.5
BURST_OWN_SHARE = 0.25
BURST_PROBE_BW = 0.2


def comm_before_window(cur: Table, base: Table, th: Thresholds, trigger: str,
                       link_probe: dict[str, Any] | None) -> tuple[list[Finding], list[str]]:
    """A slow link in bursts: the window missed it, the steps just before it and the probe did not.

    A link that is slow for 8 steps in 20 is seen by the vote 6-7 steps after it slows, so the
    window opens as the burst ends and holds one slow step or none (the fault bench's link-int: no
    finding in runs 5, 10 and 11). The step clock's last HISTORY_RECENT steps before the window are
    the burst: every rank's steps there far slower than in the baseline capture (by half its step
    or more), no rank's own work grown by more than a quarter of that (its CPU, its wait for a CPU,
    its wait for the next batch: a late rank would explain the others' wait, and history_culprits
    names it), nobody stopped. The link probe, run as the window opened (still in the burst), must
    single out the host: its bandwidth a fifth of the other hosts' or less (healthy links read
    1.0-11 Gbps within one probe on this machine's shared cores, a 100 Mbit/s link 0.09). Without
    such a host there is no finding, only a note: a job-wide wait the window did not see is no
    evidence to send anyone to a switch port. Only for captures a detector asked for, across hosts.
    Its cost a step is the ranks' mean step over all the history shipped (up to 32 steps) against the
    baseline: what the bursts cost on average, not a slow step's growth.
    """
    if trigger not in TRIGGERED or len(cur.hosts) < 2:
        return [], []
    rc, rb = _aligned(cur, base)
    if len(rc) < 2:
        return [], []
    hist_ms = cur.sch("hist_ms")[rc]
    own_now = cur.sch("hist_cpu")[rc] + cur.sch("hist_runq")[rc] + np.nan_to_num(cur.sch("hist_data")[rc])
    own_was = base.sch("cpu")[rb] + base.sch("runq")[rb] + np.nan_to_num(base.col("data")[rb])
    step_was = base.col("step")[rb]
    if not (np.isfinite(hist_ms).all() and np.isfinite(own_now).all() and np.isfinite(own_was).all()):
        return [], []
    if np.nan_to_num(cur.sch("stops")[rc]).any():
        return [], []   # a stopped rank makes every other rank wait alike (engine/stalls.py)
    grow = hist_ms - step_was
    base_step = float(np.median(step_was))
    median_grow = float(np.median(grow))
    late = float(np.max(own_now - own_was))
    if not (float(np.min(grow)) >= max(th.abs_ms, BURST_GROWTH * base_step) and late <= BURST_OWN_SHARE * median_grow):
        return [], []
    hosts, ev = slow_hosts_from_probe(link_probe, bw_factor=BURST_PROBE_BW, latency=False)
    if not hosts:
        return [], [f"every rank's steps just before the window were +{median_grow:.1f} ms/step slower than in the "
                    f"baseline capture (own work +{late:.1f} at most), but the window missed it and the link probe "
                    "singled out no host"]
    ev.update({"localized_by": "link_probe, run as the window opened",
               "seen_in": f"the {HISTORY_RECENT} steps before the window (step clock)",
               "step_ms": [float(np.median(hist_ms)), base_step], "baseline_step": base.capture_step,
               "own_work_growth_ms_max": late, "ranks_compared": int(len(rc))})
    # what the bursts cost a step on average: every step shipped before the window (up to 32), not only
    # the burst the vote caught (history.py's _burst_cost does the same for a rank)
    span, n = cur.sch("span_ms")[rc], cur.sch("span_steps")[rc]
    cost, on_average = median_grow, ""
    if np.isfinite(span).all() and np.isfinite(n).all() and float(np.min(n)) > HISTORY_RECENT:
        cost = float(np.clip(np.median(span - step_was), 0.0, median_grow))
        on_average = f" (+{cost:.1f} ms/step on average over the {int(np.min(n))} steps before the window)"
        ev.update({"average_ms": cost, "average_steps": int(np.min(n)), "excess_ms": median_grow})
    found = _comm_finding(cur, hosts, cost, float(np.median(hist_ms)), ev,
                          f"Communication in bursts: every rank waited +{median_grow:.1f} ms/step in the "
                          f"{HISTORY_RECENT} steps before the window{on_average}, nobody's own work grew; slow link")
    return [replace(found, what_if_step_ms=max(float(np.median(hist_ms)) - median_grow, 0.0),
                    action="The link slowed in bursts (the window missed the slow steps; the probe ran during one): "
                           + found.action)], []


SPARED_LISTED = 16    # ranks a regression spared, listed by number (the rest counted)
HOSTS_NAMED = 4       # a regression's slow hosts named as its finding's host (more: in its evidence only)


def hosts_alone(table: Table, slow: np.ndarray, spared: np.ndarray) -> list[str]:
    """The hosts of the ``slow`` rows when none of them runs a ``spared`` row, sorted; else []. Half the
    ranks of a two-node job slow alike, one node's, is beyond a comparison of peers as 4 of 8 ranks on
    one host are (tests/data/faultbench/half-of-eight), and the regression that names the ranks it spared
    then names the node as well."""
    slow_h = set(table.host_idx[slow].tolist())
    if not slow_h or slow_h & set(table.host_idx[spared].tolist()):
        return []
    return sorted(table.hosts[h] for h in slow_h)
BEFORE_GROWTH = 2.0   # the steps before a detector's window: this many times th.regression_rel above the baseline's


def _slower_before(cur: Table, base: Table, rc: np.ndarray, rb: np.ndarray, th: Thresholds, trigger: str,
                   window_growth: float, base_step: float) -> tuple[float, float] | None:
    """(median step of the HISTORY_RECENT steps before the window, the same before the baseline's) when a
    detector's window grew against the baseline by th.regression_rel of its step or more, but within its
    steps' noise, and the steps before it grew by BEFORE_GROWTH times that share: slower, which the window's
    few steps could not say. Else None.

    A window of 3 steps on a loaded host wobbles by 10-20%: the fault bench's memory case with 2 DataLoader
    workers a rank (rank 1's thrashing slowing every rank of the 2-core host alike) had its drift capture's
    window at 62.9 ms against the baseline's 48.7, under the noise bar (28 ms), and read "healthy", while the
    8 steps before it ran 55.9 ms against 42.6 before the baseline's. Steps before a window against steps
    before the baseline's, as ``_passing`` compares them (a profiled window's steps run slower)."""
    if trigger not in TRIGGERED or window_growth < th.regression_rel * base_step:
        return None
    before = _steps_before(cur, base, rc, rb)
    if before is None or before[0] - before[1] < max(th.abs_ms, BEFORE_GROWTH * th.regression_rel * before[1]):
        return None
    return before


def _steps_before(cur: Table, base: Table, rc: np.ndarray, rb: np.ndarray) -> tuple[float, float] | None:
    """(median step of the HISTORY_RECENT steps before the window, the same before the baseline's), None
    without rows or for summaries without a step history."""
    if not len(rc):
        return None
    now, was = cur.sch("hist_ms")[rc], base.sch("hist_ms")[rb]
    if not (np.isfinite(now).all() and np.isfinite(was).all()):
        return None
    return float(np.median(now)), float(np.median(was))


def _passing(cur: Table, base: Table, rc: np.ndarray, rb: np.ndarray, bar: float,
             trigger: str) -> tuple[float, float] | None:
    """(median step of the HISTORY_RECENT steps before the window, the same before the baseline's)
    when the capture is one no detector asked for and the first is not ``bar`` ms slower than the
    second: the window's slowdown came and went with it. Else None, and None for summaries without
    a step history. Steps before a window against steps before the baseline's: a profiled window's
    steps run slower than unprofiled ones (56.7 ms against 47.4 in a CI baseline), so a window's
    median is no reference for them. ``bar``: half the window's growth, as a slowdown that lasts
    shows before the window about as much as in it (a rank's 15 ms of extra matmuls a step: the
    window +34 ms, the steps before it +21)."""
    if trigger in TRIGGERED:
        return None
    before = _steps_before(cur, base, rc, rb)
    return before if before is not None and before[0] - before[1] < bar else None


def _shares_hosts(table: Table, rows: np.ndarray, culprit_rows: np.ndarray | None) -> bool:
    """True when every compared rank lives on a host that also runs a culprit."""
    if culprit_rows is None or not len(culprit_rows) or not len(rows):
        return False
    culprit_hosts = set(table.host_idx[culprit_rows].tolist())
    return set(table.host_idx[rows].tolist()) <= culprit_hosts


def _waited_for_cpu(cur: Table, base: Table, rc: np.ndarray, rb: np.ndarray, m_own: float) -> float | None:
    """The ranks' median CPU-time growth per step against the baseline, when their own-work growth
    ``m_own`` is mostly waiting for a CPU (CPU time grew by under a quarter of it, run-queue wait by
    over half); else None. More work (a regression) costs CPU time; a host whose cores something
    else takes makes the same work wait (the fault bench's contend-int, run 18: the other ranks' own
    work +21.8 ms/step, their CPU time +3.8, their run-queue wait +17). On an oversubscribed host more
    work queues too (everyone-slower, run 10: own work +90, CPU time +44, run queue +50), hence a
    quarter, not a half. Host timeline only."""
    if m_own <= 0.0 or cur.has_device(rc) or base.has_device(rb):
        return None
    d_cpu = cur.sch("cpu")[rc] - base.sch("cpu")[rb]
    d_runq = cur.sch("runq")[rc] - base.sch("runq")[rb]
    if not (np.isfinite(d_cpu).all() and np.isfinite(d_runq).all()) or not len(rc):
        return None
    cpu, runq = float(np.median(d_cpu)), float(np.median(d_runq))
    return cpu if cpu < 0.25 * m_own and runq > 0.5 * m_own else None


def _cpu_contention(cur: Table, base: Table, rc: np.ndarray, rb: np.ndarray,
                    ratio: float = 3.0, floor_per_s: float = 20.0) -> dict[str, Any] | None:
    """Involuntary context switches per second of wall time, now vs the baseline (median over ranks)."""
    def rate(t: Table, rows: np.ndarray) -> float:
        inv, wall = t.telemetry.get("ctx_invol"), t.telemetry.get("wall_s")
        if inv is None or wall is None:
            return float("nan")
        r = inv[rows] / np.where(wall[rows] > 0, wall[rows], np.nan)
        return float(np.nanmedian(r)) if np.isfinite(r).any() else float("nan")

    now, was = rate(cur, rc), rate(base, rb)
    if not (np.isfinite(now) and np.isfinite(was)) or now < floor_per_s or now < ratio * max(was, 1.0):
        return None
    return {"ctx_invol_per_s": [round(now, 1), round(was, 1)], "ctx_invol_ratio": now / max(was, 1.0)}


def _function_growth(cur: Table, base: Table, rc: np.ndarray, rb: np.ndarray,
                     th: Thresholds) -> list[dict[str, Any]]:
    """Functions whose median ms per step grew most against the baseline (matched by name and phase),
    with their median calls per step then and now (more calls: more work per step, not slower work)."""
    bidx = {k: i for i, k in enumerate(zip(base.fn_names, base.fn_phase, strict=True))}
    ckeys = list(zip(cur.fn_names, cur.fn_phase, strict=True))
    # own work only, as for a culprit (attribution.grown_functions): a collective that grew is a wait
    own = [k not in ("annotation", "collective") and ph != "comm" and name != "<other>"
           for name, ph, k in zip(cur.fn_names, cur.fn_phase, cur.fn_kind, strict=True)]
    pairs = [(i, bidx[k]) for i, k in enumerate(ckeys) if k in bidx and own[i]]
    new = [i for i, k in enumerate(ckeys) if k not in bidx and own[i]]
    out: list[tuple[float, dict[str, Any]]] = []
    if pairs:
        ci = np.asarray([p[0] for p in pairs])
        bi = np.asarray([p[1] for p in pairs])
        now = np.median(cur.fn_ms[np.ix_(rc, ci)], axis=0)
        was = np.median(base.fn_ms[np.ix_(rb, bi)], axis=0)
        for k in np.argsort(-(now - was))[: th.top_functions].tolist():
            if now[k] - was[k] > th.abs_ms:
                j, b = int(ci[k]), int(bi[k])
                out.append((float(now[k] - was[k]), {
                    "name": cur.fn_names[j], "phase": cur.fn_phase[j], "now_ms": float(now[k]),
                    "baseline_ms": float(was[k]), "now_calls": float(np.median(cur.fn_count[rc, j])),
                    "baseline_calls": float(np.median(base.fn_count[rb, b]))}))
    for j in new:
        now_j = float(np.median(cur.fn_ms[rc, j]))
        if now_j > th.abs_ms:
            out.append((now_j, {"name": cur.fn_names[j], "phase": cur.fn_phase[j], "now_ms": now_j,
                                "baseline_ms": 0.0, "now_calls": float(np.median(cur.fn_count[rc, j])),
                                "baseline_calls": 0.0}))
    out.sort(key=lambda x: -x[0])
    return [d for _, d in out[: th.top_functions]]


def hang_findings(trigger: str, missing: list[int], step_ms: float) -> list[Finding]:
    """Ranks that never sent a summary during a hang-triggered capture are the prime suspects."""
    if not missing or not any(w in trigger.lower() for w in ("hang", "stall", "timeout", "stuck")):
        return []
    rank = int(missing[0]) if len(missing) == 1 else None
    return [Finding(category="hang", rank=rank, host=None, function=None, phase=None,
                    impact_ms_per_step=step_ms, what_if_step_ms=None,
                    evidence={"missing_ranks": list(missing)[:256], "missing_count": len(missing)},
                    action=ACTIONS["hang"],
                    title=f"{len(missing)} rank(s) sent no summary during a {trigger} capture")]
