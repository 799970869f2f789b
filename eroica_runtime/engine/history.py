"""Culprits from the steps just before a triggered window, when the window itself shows none.

Slowness in bursts (a CPU quota or co-located hogs that come and go, 8 slow steps in 20) is seen by
the vote 6-7 steps after it starts, so a 3-step window often opens as the burst ends and every rank
looks alike in it. The step clock's last HISTORY_RECENT steps before the window are then the burst
itself: a rank whose training thread ran or waited for a CPU (CPU + run-queue ms per step, plus the
time its CPU quota held the process throttled beyond that: its collective threads too), or waited
for its next batch (DataLoader next()), far longer than its peers' there was the slow one; one held
by its quota for half of that is named for the quota (``_quota_finding``).
A wait for peers is spent asleep in a collective, so neither measure counts a victim's waiting.
Only for captures a detector asked for (a baseline or a person's capture is no claim that anything
was slow) and with the same robust bars as the window's culprits, but for one case: a rank starved
of CPU both before the window and in it (``_persistent_contention``). A steady fault that the window
shows too is reported as such, with the function the window names (``_in_window_too``). A burst
costs the job its average over every step the summaries ship before the window (up to 32), not a
slow step's excess (``_burst_cost``); the finding says both.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from eroica_runtime.engine.attribution import CONTENTION_SHARE, grown_functions
from eroica_runtime.engine.baseline import Thresholds, center, column_reference, group_bars, significant
from eroica_runtime.engine.categories import ACTIONS, storage_io, work_action, work_evidence
from eroica_runtime.engine.model import Finding, in_function, ranks_waiting
from eroica_runtime.engine.oncpu import busy_action, window_category
from eroica_runtime.engine.peers import Peers
from eroica_runtime.engine.quota import (
    QUOTA_FUNCTION,
    busy,
    quota_action,
    quota_evidence,
    quota_limit,
    steps_throttled_ms,
)
from eroica_runtime.engine.table import HISTORY_RECENT, Table
from eroica_runtime.engine.turns import CHANCE_CATEGORIES, chance_lead
from eroica_runtime.engine.turns import note as chance_note

TRIGGERED = ("spike", "drift", "throughput")
HISTORY_FUNCTION = "(steps before the window)"   # a finding's function when no profiled step showed the fault


# a burst that costs less than this share of its slow steps' excess on average over the steps shipped
# before the window (and under th.abs_ms) happened once there: see history_culprits
ONE_OFF_SHARE = 0.05


def history_culprits(table: Table, peers: Peers, th: Thresholds, trigger: str,
                     named: set[int], notes: list[str] | None = None) -> list[Finding]:
    """Findings for ranks busy (on CPU, waiting for one, or waiting for their next batch) far
    longer than their peers in the steps before the window.

    A burst whose average over the steps shipped before the window (up to 32) is no more than its
    peers' is no fault of the job's: it happened once, and costs nothing a step. A 4-rank job whose
    DataLoader workers start anew at every epoch (persistent_workers=False, 40 steps an epoch, 2
    cores; 2026-12-05): the spike capture after an epoch boundary named rank 2 "compute ... +0.0
    ms/step (step -> 5.3 ms if fixed)" for the 8 steps in which its workers started (on CPU 5.1 vs
    2.2 ms, waiting for data 8.9 vs 1.6), its average over 32 steps no more than its peers', and it
    stayed the job's one finding. The fault bench's bursty faults average 4.9-128 ms a step (12-52%
    of their slow steps' excess, runs 42 and 45). So a burst averaging under ONE_OFF_SHARE of its
    excess, and under ``th.abs_ms``, is a note (``notes``), not a finding."""
    if trigger not in TRIGGERED:
        return []
    cpu, runq, step = table.sch("hist_cpu"), table.sch("hist_runq"), table.sch("hist_ms")
    data = np.nan_to_num(table.sch("hist_data"))   # older summaries: not measured
    measures = {"busy": busy(table, "hist"), "data": data}
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
                if row in named or excess <= best.get(row, (0.0, ""))[0]:
                    continue
                if significant(excess, z, step_ref, th, len(rows)) or \
                        _over_eight_steps(excess, z, step_ref, th, len(rows)) or \
                        _persistent_contention(table, rows, row, excess, z, step_ref, kind, th):
                    best[row] = (excess, kind)
        for row, excess in _late(table, rows, measures, step_ref, th, named | set(best)).items():
            best[row] = (excess, "late")
        for row, (excess, kind) in best.items():
            f = _finding(table, rows, row, excess, step_ref, kind, th)
            average = f.evidence.get("average_ms")
            if average is not None and average < max(th.abs_ms, ONE_OFF_SHARE * excess):
                if notes is not None:
                    notes.append(f"rank {f.rank} was busy {excess:.1f} ms/step more than its peers in the "
                                 f"{HISTORY_RECENT} steps before the window, but {average:.1f} ms more on average over "
                                 f"the {f.evidence.get('average_steps')} steps before it: once, not a fault of the "
                                 "job's, not reported")
                continue
            by_chance = chance_lead(table, row, rows, excess, HISTORY_RECENT) \
                if f.category in CHANCE_CATEGORIES else None
            if by_chance is not None:
                if notes is not None:
                    notes.append(chance_note(int(f.rank), by_chance))
                continue
            out.append(f)
    return out


# a rank came late to its collectives by this share of the step beyond its own busy and batch time
# before it is named for it: see _late
LATE_SHARE = 0.35


def _late(table: Table, rows: np.ndarray, measures: dict[str, np.ndarray], step_ref: float, th: Thresholds,
          skip: set[int]) -> dict[int, float]:
    """row -> ms a step it came late to its collectives in the steps before the window beyond its
    peers, less what its own extra busy and batch-waiting time there explains (lateness.py), for
    ranks not named otherwise: the others waited for it while its training thread was off the CPU (a
    sleep, a lock, a synchronous write), which neither of those measures shows.

    Its own bar, LATE_SHARE of the step with the group's z: the step-by-step lead of one rank of four
    on 2 shared cores is noisy (0-43 ms a step against the earliest on a 55 ms step in a healthy
    fault-bench run, 3-15 ms on average over 8 steps), while stall-int's rank 1 (asleep 80 ms a step in
    bursts) came 72-98 ms late in each burst step, its peers 0-29.

    Not on GPU ranks (yet): a rank whose device runs slow and whose host waits for it every step (a
    loss.item()) makes its next collectives late just the same, and "asleep off the CPU" would name the
    wrong fault. Not seen on a GPU either way (issue 11): until it is, such a group gets no such finding."""
    late = table.sch("hist_late")
    if not np.isfinite(late[rows]).all() or table.has_device(rows):   # not measured; GPU ranks (above)
        return {}
    busy, data = measures["busy"][rows], measures["data"][rows]
    if not np.isfinite(busy).all():
        return {}
    own = np.maximum(busy - np.median(busy), 0.0) + np.maximum(data - np.median(data), 0.0)
    values = late[rows] - own
    c = center(values, th.sigma_floor_rel)
    out = {}
    for k in np.flatnonzero(values - c.ref >= max(th.abs_ms, LATE_SHARE * step_ref)).tolist():
        row, excess = int(rows[k]), float(values[k] - c.ref)
        z = excess / c.sigma if c.sigma > 0 else float("inf")
        if row not in skip and z >= group_bars(len(rows), th)[1]:
            out[row] = excess
    return out


# what a burst of a kind asks of its user, where it differs from the kind's action
BURST_ACTIONS = {
    # extra CPU work in bursts on one rank is most often work only it does now and then (a 4-rank job
    # whose rank 0 saved a checkpoint every 25 steps was named so from a window that missed the saves)
    "compute": "work only this rank does every so often looks like this (a checkpoint it saves alone, "
               "metrics or logging, an evaluation on one rank): make it asynchronous, share it among the "
               "ranks or do it less often. Otherwise " + ACTIONS["compute"][0].lower() + ACTIONS["compute"][1:],
}

IO_LATE = "It read or wrote {mine:.1f} MiB in the window against its peers' {theirs:.1f}."
LATE_ACTION = ("py-spy dump --pid on this rank while it is slow shows where its training thread waits; "
               "move that call off the training loop (a background thread or process), or make it wait less.")

# a small group's share-of-step bar for the steps before the window (HISTORY_RECENT steps, not a window's 3)
HISTORY_SMALL_SHARE = 0.20


def _over_eight_steps(excess: float, z: float, step_ref: float, th: Thresholds, n: int) -> bool:
    """The small-group test for an excess averaged over the HISTORY_RECENT steps before the window:
    HISTORY_SMALL_SHARE of the step (with the small-group z) instead of the quarter asked of one
    3-step window, where one rank of four can lose a fifth of the window to the scheduler by chance.
    Eight steps average that chance out: over the 1,055 recorded fault-bench captures (2026-12-01), a
    rank with no fault never exceeded 10% of the step there with z >= 3, while contend-int's rank 1
    (2 hogs on its core in 8-step bursts) sat at 21-25% in 6 captures that named nobody (runs 14, 15,
    17, 19 and 7)."""
    if n >= th.small_group:
        return False
    return excess >= max(th.abs_ms, HISTORY_SMALL_SHARE * step_ref) and z >= th.small_z


# a rank starved of CPU both before the window and in it is named from this share of the step and this
# robust z over the steps before the window: see _persistent_contention
CONTENTION_Z = 2.0


def _cause(table: Table, rows: np.ndarray, row: int, excess: float, kind: str) -> str:
    """What the rank's excess before the window was: "data" (waiting for its next batch), "runq"
    (starved: its run-queue wait grew far more than its CPU time; a rank computing more on a loaded
    host queues more too, while its peers sleep in the collective), "gc" (most of it in GC pauses),
    "late" (late to its collectives, off the CPU: ``_late``) or "cpu" (extra work)."""
    if kind in ("data", "late"):
        return kind
    peers = rows[rows != row]
    cpu, runq = table.sch("hist_cpu"), table.sch("hist_runq")
    gc = np.nan_to_num(table.sch("hist_gc"))
    d_cpu = float(cpu[row] - np.median(cpu[peers]))
    if runq[row] - float(np.median(runq[peers])) >= max(0.5 * excess, 2.0 * d_cpu):
        return "runq"
    return "gc" if gc[row] - float(np.median(gc[peers])) >= 0.5 * excess else "cpu"


def _persistent_contention(table: Table, rows: np.ndarray, row: int, excess: float, z: float,
                           step_ref: float, kind: str, th: Thresholds) -> bool:
    """A starved rank named below the small-group bars: it waited for a CPU far longer than its peers
    in the steps before the window AND in the window (at least STEADY_SHARE of that excess), by
    CONTENTION_SHARE of the step and a robust z of CONTENTION_Z over the steps before the window.

    The small-group bars (a quarter of the step and z 3 for groups under 8) are there because one rank
    of four on shared cores can lose a fifth of one window to the scheduler by chance, and three
    ranks that agree make any MAD small or large by chance too; the same rank queued in two periods
    (8 steps, then the window's) is contention, the rule ``scheduler_luck`` applies to the window.
    Measured over the 933 recorded fault-bench captures (runs 4-17, 2026-12-01): the contend cases
    (2 hogs on rank 1's core) had 12 captures where this names rank 1 (15-29% of the step, z 2.0-9.6;
    the steady contend case of run 17 was reported as a job-wide wait without it: z 2.8), and it named
    no other rank: with no fault on it, a rank's such excess reached 10% of the step (freeze's victim,
    link-delay), and the frozen rank itself is named by the SIGCONT marks (stalls.py)."""
    if kind != "busy" or _cause(table, rows, row, excess, kind) != "runq":
        return False
    return z >= CONTENTION_Z and excess >= max(th.abs_ms, CONTENTION_SHARE * step_ref) and \
        _in_window_too(table, rows, row, excess, "runq") is not None


# the window shows a rank's excess too when its own measure there is at least this share of the excess
# the steps before the window gave
STEADY_SHARE = 0.5


def _in_window_too(table: Table, rows: np.ndarray, row: int, excess: float, measure: str) -> float | None:
    """The rank's excess over its peers in the window itself, in the measure that named it before
    the window (on CPU, waiting for a CPU, in GC, waiting for its batch), if it is at least
    STEADY_SHARE of ``excess``; else None (the window missed it: a burst).

    A steady fault is usually named from the window, but on shared cores a peer that the culprit's
    work keeps waiting for a CPU can carry as much own work as the culprit there: the demo's rank 2,
    on CPU 59 ms a step against 18-27, had own work 67 ms against a starved peer's 57 (1 run in 6),
    and only the steps before the window named it. That is no burst, and the window's functions say
    what it did."""
    column = {"cpu": table.sch("cpu"), "runq": table.sch("runq"), "gc": table.col("gc"),
              "data": table.col("data"), "late": table.col("host_gap")}[measure]
    peers = rows[rows != row]
    if not (np.isfinite(column[row]) and np.isfinite(column[peers]).any()):
        return None
    in_window = float(column[row] - np.nanmedian(column[peers]))
    return in_window if in_window >= STEADY_SHARE * excess else None


def _burst_cost(table: Table, rows: np.ndarray, row: int, excess: float, kind: str,
                ev: dict[str, Any]) -> tuple[float, str]:
    """What a burst costs a step on average, and the words for it: the rank's mean busy (or
    batch-waiting) time over every step of the history shipped (up to 32) above its peers' median,
    at most ``excess`` (the last HISTORY_RECENT steps, which the burst filled); ``excess`` and no
    words where the summaries have no such column. The evidence gets ``average_ms`` and
    ``average_steps``.

    The steps before the window are the burst (the vote caught it there), so their excess is what a
    slow step costs, not what the job loses a step: fault-bench runs 22-28 put the bursty cases'
    estimates at 2.2x (0.67-3.13) of the loss measured over the run (8 slow steps in 20)."""
    col = table.sch("span_data") if kind == "data" else table.sch("span_late") if kind == "late" \
        else busy(table, "span")
    n = table.sch("span_steps")[row]
    peers = rows[rows != row]
    if not (np.isfinite(col[row]) and np.isfinite(col[peers]).all() and np.isfinite(n)) or n <= HISTORY_RECENT:
        return excess, ""
    mean = float(np.clip(col[row] - np.median(col[peers]), 0.0, excess))
    ev.update({"average_ms": mean, "average_steps": int(n)})
    return mean, f", +{mean:.1f} ms/step on average over the {int(n)} steps before the window"


def _finding(table: Table, rows: np.ndarray, row: int, excess: float, step_ref: float, kind: str,
             th: Thresholds) -> Finding:
    cpu, runq, data = table.sch("hist_cpu"), table.sch("hist_runq"), np.nan_to_num(table.sch("hist_data"))
    gc = np.nan_to_num(table.sch("hist_gc"))
    peers = rows[rows != row]
    cpu_ref, runq_ref = float(np.median(cpu[peers])), float(np.median(runq[peers]))
    data_ref, gc_ref = float(np.median(data[peers])), float(np.median(gc[peers]))
    cause = _cause(table, rows, row, excess, kind)
    starved, collecting = cause == "runq", cause == "gc"
    category = "dataloader" if kind == "data" else "host" if starved or kind == "late" \
        else "gc" if collecting else "compute"
    io = storage_io(table, row, peers) if kind == "late" else {}
    if io:   # what it was blocked in: reads and writes of its own (the window's I/O counters)
        category = "io"
    late, late_ref = table.sch("hist_late")[row], float(np.median(table.sch("hist_late")[peers]))
    rank = int(table.rank[row])
    host = table.hosts[int(table.host_idx[row])]
    victims = tuple(int(r) for r in table.rank[peers].tolist())
    steady = _in_window_too(table, rows, row, excess, cause)
    quota = quota_evidence(table, row, rows, excess, np.nan_to_num(steps_throttled_ms(table))) \
        if kind == "busy" else {}
    if quota:
        return _quota_finding(table, rows, row, excess, step_ref, quota, steady is not None)
    what = (f"waiting for its next batch {data[row]:.1f} ms/step vs peers' {data_ref:.1f}"
            if kind == "data" else
            f"late to its collectives {late:.1f} ms/step vs peers' {late_ref:.1f} (on CPU {cpu[row]:.1f} vs "
            f"{cpu_ref:.1f}, waiting for a CPU {runq[row]:.1f} vs {runq_ref:.1f}): off the CPU, blocked in a call no "
            "profiled op covers (a sleep, a lock or the GIL held by another thread, a synchronous read or write of "
            "a file, socket or pipe), while its peers waited for it" if kind == "late" else
            f"in Python GC pauses {gc[row]:.1f} ms/step vs peers' {gc_ref:.1f}" if collecting else
            f"runnable but waiting for a CPU {runq[row]:.1f} ms/step vs peers' {runq_ref:.1f}: CPU contention "
            "or a CPU quota (cgroup) on this rank" if starved else
            f"on CPU {cpu[row]:.1f} ms/step vs peers' {cpu_ref:.1f}: extra work")
    seen_in = f"the {HISTORY_RECENT} steps before the window (step clock)"
    function, phase = HISTORY_FUNCTION, "data" if kind == "data" else "host_gap" if starved or kind == "late" \
        else "gc" if collecting else "forward"
    ev = {"excess_ms": excess, "seen_in": seen_in,
          "cpu_ms": [float(cpu[row]), cpu_ref], "run_queue_ms": [float(runq[row]), runq_ref],
          "data_ms": [float(data[row]), data_ref], "gc_ms": [float(gc[row]), gc_ref],
          "step_ms": [float(table.sch("hist_ms")[row]), step_ref], "victims_count": len(victims),
          **({"cpu_starved": True} if starved else {}),
          **({"late_ms": [float(late), late_ref]} if kind == "late" else {}), **io}
    cost, how = excess, "late to its collectives" if kind == "late" else "busy"
    # what a rank blocked off the CPU asks of its user: not "check the host for contention"
    late_action = (ACTIONS["io"] + " " + IO_LATE.format(mine=io["io_bytes"][0] / 2**20, theirs=io["io_bytes"][1] / 2**20)
                   if io else LATE_ACTION) if kind == "late" else None
    if steady is None:
        cost, on_average = _burst_cost(table, rows, row, excess, kind, ev)
        action = (f"In the steps just before the window this rank was {what}, in bursts. The window missed "
                  "the slow steps: " + (late_action or BURST_ACTIONS.get(category, ACTIONS.get(category, ""))))
        title = (f"rank {rank} on {host}: {category} in the {HISTORY_RECENT} steps before the window "
                 f"(+{excess:.1f} ms/step {how}{on_average}, {ranks_waiting(len(victims))})")
    else:
        # a steady fault: the window shows it as well, and what the rank ran there names the function
        ev["seen_in"] = f"the window (+{steady:.1f} ms/step) and {seen_in}"
        ev["window_excess_ms"] = steady
        python = category == "compute" and window_category(table, row, rows) == ("host", "host_gap")
        if python:   # busy on its CPU between ops, not in them: its own Python (oncpu.py)
            category, phase = "host", "host_gap"
            ev["thread_cpu_ms"] = ev["cpu_ms"]
        col, fn_phase, ev["functions"] = grown_functions(
            table, row, column_reference(table.fn_ms, rows), category, steady, th, rows)
        function, phase = (table.fn_names[col], fn_phase or phase) if col is not None else (f"({phase})", phase)
        if python:   # between ops by the window's phases, whichever op grew a little beside it
            function, phase = "(host_gap)", "host_gap"
        action = late_action or (busy_action(ev) if python else ACTIONS.get(category, ""))
        if category == "compute" and col is not None:
            work_ev, work = work_evidence(table, row, rows, col)
            ev.update(work_ev)
            action = work_action(work_ev, work, action)
        action = ("In the window and the steps before it: " if python else
                  f"This rank was {what}, in the window and the steps before it. ") + action
        title = (f"rank {rank} on {host}: {category}{in_function(function)} (+{excess:.1f} ms/step {how} in the window "
                 f"and the {HISTORY_RECENT} steps before it, {ranks_waiting(len(victims))})")
    return Finding(category=category, rank=rank, host=host, function=function, phase=phase,
                   impact_ms_per_step=cost, what_if_step_ms=max(step_ref - excess, 0.0), victims=victims,
                   evidence=ev, action=action.strip(), title=title)


def _quota_finding(table: Table, rows: np.ndarray, row: int, excess: float, step_ref: float,
                   quota: dict[str, Any], steady: bool) -> Finding:
    """A rank its CPU quota held throttled in the steps before the window (the step clock's count of
    the cgroup's throttled time): the quota is what to change, whichever op the throttling fell in."""
    rank = int(table.rank[row])
    host = table.hosts[int(table.host_idx[row])]
    victims = tuple(int(r) for r in table.rank[rows[rows != row]].tolist())
    mine = quota["cgroup_throttled_ms"][0]
    limit = quota_limit(quota)
    when = "in the window and the steps before it" if steady else "in the steps just before the window, in bursts"
    ev = {"excess_ms": excess, "seen_in": f"the {HISTORY_RECENT} steps before the window (step clock)",
          "step_ms": [float(table.sch("hist_ms")[row]), step_ref], "victims_count": len(victims), **quota}
    cost, on_average = (excess, "") if steady else _burst_cost(table, rows, row, excess, "busy", ev)
    return Finding(
        category="host", rank=rank, host=host, function=QUOTA_FUNCTION, phase="host_gap",
        impact_ms_per_step=cost, what_if_step_ms=max(step_ref - excess, 0.0), victims=victims, evidence=ev,
        action=quota_action(quota, when=when),
        title=(f"rank {rank} on {host}: host — held throttled by its CPU quota{limit} for {mine:.1f} ms/step in "
               f"the {HISTORY_RECENT} steps before the window (+{excess:.1f} ms/step busy{on_average}, "
               f"{ranks_waiting(len(victims))})"))
