"""Diagnosis engine: pure functions over decoded summaries (no MPI, no torch).

Called online on rank 0 (in a background thread) and offline by ``eroica analyze``::

    from eroica_runtime.engine import diagnose, consolidate
    d = diagnose(summaries, step=500, trigger="slow_step", world_size=64,
                 missing=[], baseline=baseline_summaries, topology="pp=4,tp=8,dp=*",
                 link_probe=None, errors=decode_errors)
    d.findings            # tuple[Finding], sorted by impact; empty when the capture is healthy
    d.to_json()           # -> diagnosis-<step>.json
    job_findings = consolidate([d1, d2, ...])   # merged across captures, sorted by impact

``summaries`` is a list (or any iterable, consumed once) of decoded ``eroica.summary/1`` dicts, or a
prebuilt ``Table`` (``build_table``) when the caller streams decoding to keep memory low. ``baseline``
takes the summaries (or Table) of the job's healthy baseline capture and enables the common-mode
checks (regression, communication slow everywhere). ``topology`` ("pp=4,tp=8,dp=*", row-major, last
dim fastest) overrides recorded groups for forming peers. ``link_probe`` maps host -> {latency_us,
bandwidth_gbps} and names the slow host of a communication finding. ``errors`` are one-line decode
errors (bad ranks) carried into the diagnosis. ``thresholds`` tunes sensitivity (``Thresholds``).

Pipeline: table (arrays, once) → peers → culprits (own work up, wait not up) → category and function
→ victims → impact; ranks stopped repeatedly (step-clock marks, window and history); with no
culprit in a triggered window, ranks busy far longer than their peers in the steps before it
(history); then baseline/common-mode (and, with nothing found yet, a slow link in bursts: every rank
slower in the steps before the window, the link probe naming its host), local communication excess
and hang checks.

Input hygiene: a summary with a non-finite phase or a duplicate rank is dropped with a line in
``errors``; gc/io phases that do not fit in the step (separately measured, they can count pauses
outside the window) are capped to the room the profiler timeline leaves, with a line in ``notes``.
Sensitivity: an excess counts when it passes a robust z-score against the peers (the bar rises
with the group size), 10% of the peers' step (20% in groups under 8 ranks) and the window's own
step-time wobble; see ``Thresholds``. Tip for callers: keep the baseline as ``build_table(...)``
and pass that Table, so it is converted once and the dicts can be dropped.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from eroica_runtime.engine.attribution import (
    Culprit,
    attribute,
    closest_straggler,
    find_culprits,
    find_victims,
)
from eroica_runtime.engine.baseline import Thresholds
from eroica_runtime.engine.categories import (
    ACTIONS,
    host_lead,
    telemetry_refinement,
    transfer_evidence,
    work_action,
    work_against,
    work_evidence,
    work_verdict,
)
from eroica_runtime.engine.commonmode import comm_before_window, common_mode, hang_findings, local_comm_excess
from eroica_runtime.engine.history import HISTORY_FUNCTION, history_culprits
from eroica_runtime.engine.impact import Gates, all_fixed
from eroica_runtime.engine.lonework import LoneWork, describe, lone_steps, one_off_note
from eroica_runtime.engine.memory import memory_action, memory_evidence, span_culprits
from eroica_runtime.engine.model import CATEGORIES, Diagnosis, Finding, in_function, ranks_waiting
from eroica_runtime.engine.offcpu import blocked_action, blocked_evidence, other_threads_evidence
from eroica_runtime.engine.oncpu import busy_action, busy_evidence
from eroica_runtime.engine.ownbaseline import lone_culprits
from eroica_runtime.engine.peers import Peers, form_peers, parse_topology
from eroica_runtime.engine.quota import (
    QUOTA_FUNCTION,
    quota_action,
    quota_evidence,
    quota_findings,
    quota_limit,
)
from eroica_runtime.engine.settings import with_settings
from eroica_runtime.engine.stalls import STOPPED_FUNCTION, stall_finding, stalls, waited_on
from eroica_runtime.engine.stalls import action as stall_action
from eroica_runtime.engine.table import Table, TableBuilder, build_table
from eroica_runtime.engine.turns import by_chance
from eroica_runtime.engine.turns import note as chance_note

__all__ = ["CATEGORIES", "Diagnosis", "Finding", "Table", "TableBuilder", "Thresholds", "build_table", "consolidate",
           "diagnose", "finding_key", "first_named", "parse_topology"]

STOPS_EXPLAIN = 0.5   # a stopped culprit is named for its stops when they cost this share of its excess
HEAT_COLUMNS = ("step", "data", "forward", "backward", "optimizer", "host_gap", "gc", "io", "comm")
HEAT_MAX_ROWS = 40


def _what_ifs(table: Table, findings: list[Finding], culprits: list[Culprit], step_ms: float,
              healthy_ms: float | None = None) -> tuple[list[Finding], Gates]:
    """The culprits' findings with the step each leaves if fixed alone (impact.Gates: the next-worst
    culprit's level, and no lower than the culprit's peers' own work plus the collective's own time, what
    the culprit, last to arrive, waited: on shared cores a culprit's peers run faster while it stalls),
    and the gates, for the host findings that merge several (_merge_hosts). Nor lower than the job's
    healthy step, ``healthy_ms`` (_no_faster_than says why), so that which culprit holds the step next
    is said against it too. Work alone in a window step that recurs: fixed, the job's mean step over
    every step seen drops by its average cost (the window's median step holds the lone step)."""
    ranks = [int(table.rank[c.row]) for c in culprits]
    healthy = 0.0 if healthy_ms is None else healthy_ms
    gates = Gates(step_ms, {r: c.level_ms for r, c in zip(ranks, culprits, strict=True)},
                  {r: min(step_ms, max(c.own_ref + max(c.comm, 0.0), healthy))
                   for r, c in zip(ranks, culprits, strict=True)})
    out = []
    for f, c, r in zip(findings, culprits, ranks, strict=True):
        if c.alone is not None:
            out.append(replace(f, what_if_step_ms=max(c.alone["mean_step_ms"] - c.cost_ms, 0.0)))
            continue
        what_if, order = gates.fixed({r})
        out.append(replace(f, what_if_step_ms=what_if, evidence={**f.evidence, **order}))
    return out, gates


def _no_faster_than(findings: list[Finding], healthy_ms: float, step_ms: float) -> list[Finding]:
    """Every finding's "step -> X ms if fixed" no lower than the job's healthy step (the baseline
    capture's median, ``healthy_ms``), or than this window's step where that is lower: fixed, the job
    steps as it did healthy, not faster. A culprit that sleeps leaves its peers the cores, and their
    own work runs faster than it does healthy: the fault bench's data case (run 50) said "step -> 37.9
    ms if fixed" of a job whose baseline stepped 56.5 ms, and 24 of that run's 51 what-ifs were below
    its baseline's step (a regression's already was not).

    Only while the baseline stepped faster than this window: one that did not (its three steps slowed by
    another process, or warm-up) says nothing of how fast the job steps fixed, and as a floor it made
    every what-if this window's own step. A hand-built 2x2 tensor x data parallel job whose rank 3 ran 40
    extra matmuls a step read "+15.9 ms/step (step -> 42.9 ms if fixed)" of a 42.9 ms window step, its
    baseline's 44.4 ms, while its steps before the fault ran 34.9 ms (tests/data/engine/tpdp-slow-baseline)."""
    if healthy_ms >= step_ms:
        return findings
    return [replace(f, what_if_step_ms=healthy_ms) if f.what_if_step_ms is not None and f.what_if_step_ms < healthy_ms
            else f for f in findings]


def _beside_the_network(findings: list[Finding], gates: Gates) -> list[Finding]:
    """A culprit and slow collectives at once (host 1's link shaped while rank 3 ran extra matmuls, the
    fault bench's link-compute): fixed, each leaves the other holding the step. The communication
    finding says which culprit then holds it (``then_held_by``), a culprit that names no other culprit
    says the collectives do (``then_collectives``): the order, as between culprits (_what_ifs)."""
    worst = gates.worst
    if worst is None or not any(f.category == "communication" for f in findings):
        return findings
    out = []
    for f in findings:
        if f.category == "communication" and f.what_if_step_ms is not None:
            f = replace(f, evidence={**f.evidence, "then_held_by": worst})
        elif (f.rank in gates.levels and f.what_if_step_ms is not None
              and not {"held_by", "then_held_by"} & set(f.evidence)):
            f = replace(f, evidence={**f.evidence, "then_collectives": True})
        out.append(f)
    return out


def _more_calls(functions: list[dict[str, Any]]) -> bool:
    """Whether the culprit's top function ran more calls a step than its peers' (more work: compute)."""
    if not functions:
        return False
    f = functions[0]
    return work_verdict(float(f.get("rank_calls", math.nan)), float(f.get("rank_ms", math.nan)),
                        float(f.get("peers_calls", math.nan)), float(f.get("peers_ms", math.nan))) == "more"


def _culprit_finding(table: Table, peers: Peers, c: Culprit, stopped: dict[str, Any] | None = None,
                     culprits: Collection[int] = ()) -> Finding:
    """A culprit's finding; its what-if step is set once every culprit is known (_what_ifs). ``culprits``:
    every culprit's row (a rank named for its stops is waited on by all the others)."""
    row, ref_rows = c.row, c.peer_rows(peers)
    rank = int(table.rank[row])
    host = table.hosts[int(table.host_idx[row])]
    contended = bool(c.sched and c.sched["starved"] and c.sched["runq_ms"][0] - c.sched["runq_ms"][1]
                     >= 0.5 * c.excess_ms)
    quota = quota_evidence(table, row, ref_rows, c.excess_ms)
    if contended or stopped:   # runnable without a CPU, not only in this window; or stopped outright
        c = replace(c, category="host")
    if stopped and stopped["lost_ms_per_step"] >= STOPS_EXPLAIN * c.excess_ms:
        # the stops are the excess: whichever op a stop fell in is incidental, as for a quota (the
        # fault bench's freeze, a stop in the window: "host in ...reducer::copy_bucket_to_grad")
        c = replace(c, function=STOPPED_FUNCTION, phase="host_gap",
                    victims=np.asarray(waited_on(table, row, culprits), dtype=np.int64))
    if quota:   # held by its CPU quota: whichever op the throttling fell in is incidental
        c = replace(c, category="host", function=QUOTA_FUNCTION, phase="host_gap")
    # waited for pages: memory it lost (whichever op the faults fell in), or files storage supplied
    memory = {} if quota or stopped or contended else memory_evidence(table, row, ref_rows)
    if memory.get("memory_short"):
        c = replace(c, category="memory")
    elif memory and c.category == "host":
        c = replace(c, category="io")
    # off the CPU through its stall, neither running nor queued: blocked, no CPU was short (offcpu.py);
    # on a CPU rank, inside its ops too while the rest of its process ran (another thread held the GIL):
    # the same calls as its peers', no compute of its own
    blocked = {} if quota or stopped or contended or memory or c.category not in ("host", "compute") \
        or (c.category == "host" and c.phase != "host_gap") or (c.category == "compute" and c.device) \
        else blocked_evidence(table, row, ref_rows, c.excess_ms)
    if blocked:
        blocked.update(other_threads_evidence(table, row, ref_rows, c.excess_ms))
        if c.category == "compute" and ("other_threads_cpu_ms" not in blocked or _more_calls(c.functions)):
            blocked = {}   # a pool of intra-op threads doing more work for it, or no sign of another thread
        elif c.category == "compute":
            c = replace(c, category="host")
    tele_ev, hint = telemetry_refinement(table, row, ref_rows, c.category, quota_named=bool(quota),
                                         blocked=bool(blocked))
    # on the CPU through its stall, neither queued nor blocked, nor in storage I/O: its own Python (oncpu.py)
    busy = {} if quota or stopped or contended or memory or blocked or tele_ev.get("io") \
        or c.category != "host" or c.phase != "host_gap" else busy_evidence(table, row, ref_rows, c.excess_ms)
    if quota:
        tele_ev.update(quota)
        hint = (quota_action(quota, c.step) + " " + hint).strip()
    elif memory:
        tele_ev.update(memory)
        hint = (memory_action(memory) + " " + hint).strip()
    elif blocked:
        tele_ev.update(blocked)
        hint = (blocked_action(blocked, float(table.own[row]), float(table.col("step")[row])) + " "
                + hint).strip()   # the host own work it is of
    elif busy:
        tele_ev.update(busy)
        hint = (busy_action(busy) + " " + hint).strip()
    elif contended and c.sched:
        rq, rq_ref = c.sched["runq_ms"]
        hint = (f"Runnable but waiting for a CPU {rq:.1f} ms/step vs peers' {rq_ref:.1f} (run queue), in the "
                "steps before the window too: CPU contention — another process or a CPU quota (cgroup) "
                "limits this rank's cores. " + hint).strip()
    if tele_ev.get("io"):  # the host stall is the rank's own storage traffic
        c = replace(c, category="io")
    ev: dict[str, Any] = {
        "excess_ms": c.excess_ms, "z": c.z,
        "own_work_ms": [c.own, c.own_ref], "comm_wait_ms": [c.comm, c.comm_ref],
        "step_ms": [c.step, c.step_ref],
        "phase_ms": {p: [c.phase_ref[p] + c.phase_excess[p], c.phase_ref[p]] for p in c.phase_excess
                     if abs(c.phase_excess[p]) >= 0.05 or c.phase_ref[p] >= 0.05},
        "functions": c.functions, "peers": {"source": peers.source, "size": int(len(peers.groups[c.group]))},
        "victims_count": int(len(c.victims)), **tele_ev,
    }
    if c.waited_ms is not None:
        ev["victims_waited_ms"] = c.waited_ms
    if stopped:
        ev["stopped"] = stopped
        hint = (stall_action(stopped) + " " + hint).strip()
    if contended:
        ev["cpu_starved"] = True
    if c.sched:
        ev["run_queue_ms"] = c.sched["runq_ms"]
        if c.sched["runq_before_ms"]:
            ev["run_queue_before_ms"] = c.sched["runq_before_ms"]
    if c.device:
        ev["compared_on"] = "device"    # own work = step - exposed collective wait on the device
    if c.category == "transfer":
        ev.update(transfer_evidence(table, row, ref_rows))
    # telemetry is the main evidence of a host stall; for other kinds it is a secondary hint
    action = (hint + " " + ACTIONS.get(c.category, "")) if c.category == "host" else \
        (ACTIONS.get(c.category, "") + (" Also: " + hint if hint else ""))
    if "throttling" in hint and "hardware_throttle" in tele_ev:
        action = hint + " " + ACTIONS.get(c.category, "")
    if quota or memory.get("memory_short") or (blocked and c.category == "host") or busy:
        action = hint
    if c.baseline_step is not None:   # no peers: compared with itself in the baseline capture
        ev["compared_with"] = f"its own baseline capture (step {c.baseline_step})"
    if c.category == "compute" and c.function_col is not None:
        if c.baseline_step is None:
            work_ev, work = work_evidence(table, row, ref_rows, c.function_col)
        else:
            fn = next((f for f in c.functions if f["name"] == c.function), None)
            work_ev, work = work_against(c.function, fn["now_calls"], fn["now_ms"], fn["baseline_calls"],
                                         fn["baseline_ms"], baseline=True) if fn else ({}, "")
        ev.update(work_ev)
        action = work_action(work_ev, work, action, hint)
    versus = "" if c.baseline_step is None else f" vs its baseline capture at step {c.baseline_step}"
    title = (f"rank {rank} on {host}: {c.category}{in_function(c.function)} "
             f"(+{c.excess_ms:.1f} ms/step own work{versus}, {ranks_waiting(len(c.victims))})")
    if c.alone is not None:   # worked alone in a window step, and before the window too (engine/lonework.py)
        ev["lone_work"] = c.alone
        words, first = describe(c.alone, c.category)
        title = f"rank {rank} on {host}: {c.category}{in_function(c.function)} — {words}, {ranks_waiting(len(c.victims))})"
        action = first + action
    if quota:
        title = (f"rank {rank} on {host}: host — held throttled by its CPU quota{quota_limit(quota)} for "
                 f"{quota['cgroup_throttled_ms'][0]:.1f} ms/step (+{c.excess_ms:.1f} ms/step own work, "
                 f"{ranks_waiting(len(c.victims))})")
    if stopped and c.function == STOPPED_FUNCTION:   # what to change is what stops it, as stall_finding says
        title = (f"rank {rank} on {host}: host — process stopped {stopped['stops']} times in "
                 f"{stopped['steps_seen']} steps (~{stopped['stop_ms_each']:.0f} ms each, +{c.excess_ms:.1f} "
                 f"ms/step own work, {ranks_waiting(len(c.victims))})")
    return Finding(category=c.category, rank=rank, host=host, function=c.function, phase=c.phase,
                   impact_ms_per_step=c.cost_ms, what_if_step_ms=None,
                   victims=tuple(int(v) for v in c.victims), evidence=ev, action=action.strip(), title=title)


def _not_while_held(table: Table, held: list[int], found: list[Finding], notes: list[str]) -> list[Finding]:
    """Communication findings are dropped while a rank was stopped or starved of CPU: its
    communication threads are stopped or starved with it (a cgroup quota covers the whole process),
    so every rank's wait grows alike, which looks like a slow network but is that rank."""
    if not held:
        return found
    kept = [f for f in found if f.category != "communication"]
    if len(kept) < len(found):
        ranks = ", ".join(str(int(table.rank[r])) for r in held)
        notes.append(f"communication waits grew while rank(s) {ranks} were stopped or starved of CPU (their "
                     "collective threads with them): not reported as a network problem")
    return kept


def _merge_hosts(table: Table, findings: list[Finding], gates: Gates) -> list[Finding]:
    """Several culprits of one category on one host, covering most of its ranks, are one host finding;
    fixed, the step loses all of them at once (``gates``)."""
    by_key: dict[tuple[str | None, str], list[Finding]] = {}
    for f in findings:
        by_key.setdefault((f.host, f.category), []).append(f)
    out: list[Finding] = []
    host_sizes = np.bincount(table.host_idx, minlength=len(table.hosts))
    for (host, cat), fs in by_key.items():
        on_host = int(host_sizes[table.hosts.index(host)]) if host in table.hosts else 0
        if len(fs) < 2 or len(fs) < 0.5 * on_host:
            out.extend(fs)
            continue
        worst = max(fs, key=lambda f: f.impact_ms_per_step)
        ranks = sorted(int(f.rank) for f in fs if f.rank is not None)
        victims = tuple(sorted(set().union(*(f.victims for f in fs)) - set(ranks)))
        ev = {k: v for k, v in worst.evidence.items() if k not in ("held_by", "then_held_by")}
        ev.update(ranks=ranks, ranks_on_host=on_host)
        what_if = worst.what_if_step_ms
        if all(r in gates.levels for r in ranks):
            what_if, order = gates.fixed(ranks)
            ev.update(order)
        more = all(f.evidence.get("work") == "more" for f in fs)
        out.append(Finding(category=cat, rank=worst.rank, host=host, function=worst.function,
                           phase=worst.phase, impact_ms_per_step=worst.impact_ms_per_step,
                           what_if_step_ms=what_if, victims=victims, evidence=ev,
                           action=host_lead(host, len(ranks), on_host, len(table.hosts), more) + worst.action,
                           title=f"host {host}: {len(ranks)} ranks slow in {cat} ({worst.function}), "
                                 f"worst rank {worst.rank} +{worst.impact_ms_per_step:.1f} ms/step"))
    return out


def _phase_table(table: Table, peers: Peers, findings: Sequence[Finding]) -> dict[str, Any]:
    """A compact ranks × phases matrix for the HTML heatmap: all ranks of small jobs; otherwise the
    culprits, the most deviating ranks and one median row per peer group."""
    from eroica_runtime.engine.table import PHASE_INDEX
    cols = [PHASE_INDEX[c] for c in HEAT_COLUMNS]
    rows: list[dict[str, Any]] = []
    flagged = {int(f.rank) for f in findings if f.rank is not None}

    def add(row: int, kind: str) -> None:
        r = int(table.rank[row])
        rows.append({"label": f"rank {r} ({table.hosts[int(table.host_idx[row])]})", "rank": r,
                     "kind": "culprit" if r in flagged else kind,
                     "values": table.phases[row, cols].tolist()})

    if table.n <= HEAT_MAX_ROWS:
        for row in range(table.n):
            add(row, "rank")
    else:
        for gi, g in enumerate(peers.groups[:8]):
            rows.append({"label": f"peer group {gi} median (n={len(g)})", "rank": None, "kind": "median",
                         "values": np.median(table.phases[g][:, cols], axis=0).tolist()})
        chosen = list(table.rows_of(sorted(flagged)))
        dev = table.own - np.median(table.own)
        for row in np.argsort(-dev)[: HEAT_MAX_ROWS].tolist():
            if len(chosen) >= HEAT_MAX_ROWS - len(rows):
                break
            if row not in chosen:
                chosen.append(row)
        for row in sorted(int(x) for x in chosen):
            add(row, "rank")
    return {"columns": list(HEAT_COLUMNS), "rows": rows}


def diagnose(summaries: Iterable[dict[str, Any]] | Table, *, step: int, trigger: str, world_size: int,
             missing: Sequence[int] = (), baseline: Iterable[dict[str, Any]] | Table | None = None,
             topology: str | None = None, link_probe: dict[str, Any] | None = None,
             errors: Sequence[str] = (), thresholds: Thresholds | None = None) -> Diagnosis:
    """Diagnose one capture; see the module docstring for the arguments. Never mutates its input."""
    t0 = time.perf_counter()
    th = thresholds or Thresholds()
    table = summaries if isinstance(summaries, Table) else build_table(summaries)
    errs = list(errors) + table.errors
    miss = sorted({int(m) for m in missing})
    notes: list[str] = []
    if table.n == 0:
        return Diagnosis(step=step, trigger=trigger, world_size=world_size, ranks_analysed=0,
                         findings=tuple(hang_findings(trigger, miss, 0.0)), missing=tuple(miss),
                         errors=tuple(errs), notes=("no usable summaries in this capture",),
                         engine_s=time.perf_counter() - t0)
    peers = form_peers(table, topology=topology, world_size=world_size)
    notes.extend(table.notes)
    notes.extend(peers.notes)
    base = baseline if isinstance(baseline, Table) or baseline is None else build_table(baseline)
    lone = sum(len(g) == 1 for g in peers.groups)
    if lone and table.n > 1:
        notes.append(f"{lone} rank(s) have no peers to compare with: " + (
            f"each is compared with itself in the baseline capture (step {base.capture_step})"
            if base is not None and base.n else
            "and no baseline capture to compare them with themselves (--no-baseline?)"))
    elif lone:
        notes.append(f"{lone} rank(s) have no peers to compare with")
    step_col = table.col("step")
    step_med = float(np.median(step_col))

    # window steps a rank worked alone in while its peers waited (a checkpoint only rank 0 saves)
    alone = {r: w for rows in peers.groups for r, w in lone_steps(table, rows, th).items()}
    one_offs: list[LoneWork] = []   # lone work the steps before the window show no sign of
    culprits = find_culprits(table, peers, th, notes, alone, one_offs_out=one_offs)
    if alone and not culprits and not history_culprits(table, peers, th, trigger, set(), []):
        # work alone in a window step that recurs, though this window held less of it than the job
        # does on average (rank 0 logging metrics every 10 steps: one in this 16-step window): named
        # when neither the window nor the steps before it name anyone else (lonework.periodic)
        culprits = find_culprits(table, peers, th, None, alone, below_bar=True)
    attribute(table, peers, culprits, th)
    culprits += lone_culprits(table, base, peers, th)
    find_victims(table, culprits, th)
    if table.n > 1:
        # a rank nobody waited on did not slow the job: its extra own work overlapped the others'
        # waits or was absorbed (preemption noise, a side effect of another culprit); not a root cause
        dropped = [c for c in culprits if not len(c.victims)]
        if dropped:
            notes.append(f"{len(dropped)} rank(s) with extra own work that no rank waited on were not reported: "
                         + ", ".join(f"rank {int(table.rank[c.row])} +{c.excess_ms:.1f} ms" for c in dropped[:5]))
            culprits = [c for c in culprits if len(c.victims)]
    stopped = stalls(table, th)
    rows = {c.row for c in culprits}
    findings = [_culprit_finding(table, peers, c, stopped.get(c.row), rows) for c in culprits]
    # a lead within what the ranks' step-to-step variation gives the busiest by chance: turns, no culprit
    chance = [by_chance(table, peers.groups, f, c.group) for f, c in zip(findings, culprits, strict=True)]
    for f, ev in zip(findings, chance, strict=True):
        if ev is not None:
            notes.append(chance_note(int(f.rank), ev))
    culprits = [c for c, ev in zip(culprits, chance, strict=True) if ev is None]
    healthy = float(np.median(base.col("step"))) if base is not None and base.n else None
    findings, gates = _what_ifs(table, [f for f, ev in zip(findings, chance, strict=True) if ev is None],
                                culprits, step_med, healthy)
    excesses = [c.excess_ms for c in culprits]
    named = {c.row for c in culprits}
    findings.extend(stall_finding(table, row, ev, step_med, named) for row, ev in stopped.items() if row not in named)
    if not findings:
        earlier = history_culprits(table, peers, th, trigger, named, notes)
        findings.extend(earlier)
        # a burst's slow-step excess (its cost is averaged over the steps before the window): what the
        # common-mode check below weighs against the step's growth
        excesses += [float(f.evidence.get("excess_ms", f.impact_ms_per_step)) for f in earlier]
        named |= {int(r) for r in table.rows_of([int(f.rank) for f in earlier if f.rank is not None])}
    if not findings:   # short of memory, its waits hidden by its workers' prefetch: seen over the span
        short = span_culprits(table, peers, th, trigger, named)
        findings.extend(short)
        excesses += [f.impact_ms_per_step for f in short]
        named |= {int(r) for r in table.rows_of([int(f.rank) for f in short if f.rank is not None])}
    findings = _merge_hosts(table, findings, gates)
    # ranks their CPU quota held throttled, alike or not: no peer needs to stand out for that time to be lost
    findings.extend(quota_findings(table, th, named))
    # ranks whose own collective threads were stopped or starved of CPU with them: every rank's wait
    # grows alike then, which looks like the network but is them
    held = sorted(set(stopped) | {int(r) for r in table.rows_of(
        [int(f.rank) for f in findings if f.rank is not None and f.category == "host"
         and (f.evidence.get("cpu_starved") or "stopped" in f.evidence)]
        + [int(r) for f in findings if f.function == QUOTA_FUNCTION
           for r in (f.evidence.get("ranks") or ([f.rank] if f.rank is not None else []))])})

    slower = None   # the step grew against the baseline and no job-wide finding explains it
    if base is not None:
        if base.n:
            extra, more_notes, slower = common_mode(table, base, th, max(excesses, default=0.0), link_probe,
                                                   np.asarray(sorted(named), dtype=np.int64), str(trigger))
            findings.extend(_not_while_held(table, held, extra, notes))
            notes.extend(more_notes)
            if not findings:
                burst, more_notes = comm_before_window(table, base, th, trigger, link_probe)
                findings.extend(burst)
                notes.extend(more_notes)
    if not culprits and not any(f.category == "communication" for f in findings):
        findings.extend(_not_while_held(table, held, local_comm_excess(table, peers, th, link_probe, notes), notes))
    findings = _beside_the_network(findings, gates)
    findings = with_settings(table, findings)   # a switch only the culprit has set (anomaly detection, threads)
    if healthy is not None:
        findings = _no_faster_than(findings, healthy, step_med)
    findings.extend(hang_findings(trigger, miss, step_med))
    findings.sort(key=lambda f: -f.impact_ms_per_step)
    findings = [Finding(**{**f.__dict__, "captures": (int(step),)}) for f in findings]

    if one_offs:
        # a rank some finding names (its stops, its steps before the window) did no one-off work
        named_ranks = {int(f.rank) for f in findings if f.rank is not None}
        left = [w for w in one_offs if int(table.rank[w.row]) not in named_ranks]
        said = one_off_note(table, one_offs)
        notes = [x for x in notes if x != said] + ([one_off_note(table, left)] if left else [])
        one_offs = left
    step_ms = {"median": step_med, "p99": float(np.percentile(step_col, 99)),
               "max": float(step_col.max()), "max_rank": int(table.rank[int(np.argmax(step_col))]),
               "what_if_all_fixed": max(all_fixed(step_med, [f.impact_ms_per_step for f in findings
                                                             if f.category != "hang"]),
                                        healthy if healthy is not None and healthy < step_med else 0.0)}
    if healthy is not None:
        # what this capture was compared with (the runtime's analyst reads a capture with no finding
        # and no "unexplained_ms" as found healthy only when this is here: analyst.healthy_against_baseline)
        step_ms["baseline"] = healthy
    if one_offs and not findings:
        # the window's steps were long for one rank's work alone, once: "healthy" would belie them, and so
        # would "slower, no culprit" (report.py)
        step_ms["one_off"] = _one_off(table, one_offs)
    elif slower is not None and not findings and slower.before_ms is not None:
        # slower in its window only (report.py says so beside "healthy")
        step_ms["baseline"], step_ms["before_window_ms"] = slower.baseline_ms, list(slower.before_ms)
    elif slower is not None and not findings:
        # slower than the healthy reference with no culprit: "healthy" would be wrong (report.py)
        step_ms["baseline"], step_ms["unexplained_ms"] = slower.baseline_ms, slower.now_ms - slower.baseline_ms
        closest = closest_straggler(table, peers, th)
        if closest:
            notes.append(closest)
    return Diagnosis(step=int(step), trigger=str(trigger), world_size=int(world_size),
                     ranks_analysed=table.n, findings=tuple(findings), missing=tuple(miss),
                     errors=tuple(errs), notes=tuple(notes), peers=peers.describe(), step_ms=step_ms,
                     phase_table=_phase_table(table, peers, findings), engine_s=time.perf_counter() - t0)


def _one_off(table: Table, works: list[LoneWork]) -> dict[str, Any]:
    """step_ms.one_off: the largest lone work of the window that the steps before it do not show (rank,
    host, the window steps it was done in, ms alone in them), and how many ranks did such work."""
    w = max(works, key=lambda x: x.ms)
    first = table.capture_step
    return {"rank": int(table.rank[w.row]), "host": table.hosts[int(table.host_idx[w.row])],
            "steps": [int(first) + s if first is not None else s for s in w.steps], "ms": float(w.ms),
            "ranks": len(works)}


def _speaks_for(f: Finding) -> tuple[int, float]:
    """Which capture's finding speaks for a job-level one: a cause that is what to change (a CPU quota,
    stops) before a function a window named, before no function (a burst named from the steps before
    the window, or a phase's placeholder such as "(gc)", which says no more than the category); then
    the higher cost a step, which comes with its own evidence. (A GC storm in bursts: a window on a
    burst's last step said "(gc)", +55 ms a step over the 32 steps before it, one burst of them; a
    later capture's steps before its window, two bursts, +123, nearer the 140 the job lost.)"""
    if f.function in (QUOTA_FUNCTION, STOPPED_FUNCTION):
        return 2, f.impact_ms_per_step
    named = f.function is not None and f.function != HISTORY_FUNCTION and not f.function.startswith("(")
    return (1 if named else 0), f.impact_ms_per_step


def finding_key(f: Finding) -> tuple[Any, ...]:
    """What makes two captures' findings one job-level finding (``consolidate``): a culprit rank is
    one finding per category, a rank-less (host/link/job-wide) one also per function."""
    return (f.category, f.rank, f.host, f.function if f.rank is None else None)


def first_named(diagnoses: Sequence[Diagnosis]) -> dict[tuple[Any, ...], int]:
    """Each job-level finding (``finding_key``) of ``diagnoses`` with the step of the first capture that
    named it: the capture file a long job keeps for it (retention.py), and what rank 0's log points
    at when a later capture names it again (report.format_capture)."""
    out: dict[tuple[Any, ...], int] = {}
    for d in sorted(diagnoses, key=lambda x: x.step):
        for f in d.findings:
            out.setdefault(finding_key(f), d.step)
    return out


def consolidate(diagnoses: Sequence[Diagnosis]) -> list[Finding]:
    """Merge findings across captures into job-level findings, sorted by impact (``_speaks_for``
    picks the capture whose finding is kept, with its cost a step, function and evidence; ``captures``
    lists where it was seen). A culprit rank is one finding per category even when captures name
    different functions of it; rank-less (host/link/job-wide) findings merge only when they name the
    same function. Why not simply the highest cost: in bursts, a window holding one slow step names
    an op of a throttled rank at that window's cost, above the average another capture's steps before
    its window gave, and would hide the CPU quota those steps named; a window that caught a burst
    names the function the steps before another window cannot."""
    merged: dict[tuple[Any, ...], Finding] = {}
    for d in diagnoses:
        for f in d.findings:
            key = finding_key(f)
            prev = merged.get(key)
            caps = tuple(sorted(set((prev.captures if prev else ()) + (f.captures or (d.step,)))))
            victims = tuple(sorted(set(prev.victims if prev else ()) | set(f.victims)))
            best = f if prev is None or _speaks_for(f) >= _speaks_for(prev) else prev
            merged[key] = Finding(**{**best.__dict__, "captures": caps, "victims": victims})
    return sorted(merged.values(), key=lambda f: -f.impact_ms_per_step)
