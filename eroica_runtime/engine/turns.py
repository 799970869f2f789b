"""A rank ahead of its peers by no more than their step-to-step variation gives by chance is no culprit.

In a job whose work a step depends on each rank's data (variable-length sequences, padded batches
of different lengths, routed experts), every step waits for whichever rank drew the most work, and
that rank changes from step to step (engine/imbalance.py says so at the job's end). In a window of 3
to 16 steps one rank then holds more of the long steps than its peers by chance, and the robust bar
against its 3 peers' window means let it through: 2 of 4 jobs of tests/data/imbalance/job.py (4
ranks, heavy-tailed lengths, 600 steps; 2026-12-05) had a finding, "rank 2 ... compute in
aten::linear (+19.2 ms/step own work, 3 ranks waiting on it)" in a 3-step window and "rank 0 ...
compute in the 8 steps before the window (+16.5 ms/step busy)", each a different rank, each the
same calls as its peers, while the job summary said the ranks took turns.

The step clock's history (up to 32 steps a rank, shipped in every summary) says how much a rank's
busy time (CPU + run-queue + batch wait) varies from step to step: ``span_busy_sd``, 10-37 ms a step
in those jobs against 1-6 ms in healthy ones and in the demo's steady straggler's peers. If each
rank's busy time a step were drawn alike, the mean of k steps of the busiest of n ranks would lie
about ``sqrt(2 ln n)`` standard errors (``sd / sqrt(k)``) above the rest. A compute or input-pipeline
culprit whose lead stays within CHANCE times that, with the group's median sd, over the steps it was
named from (its window; the steps before it; for work alone in window steps, the average that work
costs over the steps seen), over the last HISTORY_RECENT steps before the window and over all the
history shipped, is the luck of the draw: a note, not a finding. A real straggler clears at least one
of the three bars: a steady one the 32-step bar (0.74 sd with 4 ranks), one that has just begun the
window's (2.4 sd over 3 steps), one in bursts its peers' small sd. Extra calls (``work: more``), GPU
ranks (compared on the device: the host's busy time is not the device's), ranks compared with their
own baseline, and CPU contention, quota or stop findings are never judged here.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from eroica_runtime.engine.model import Finding
from eroica_runtime.engine.table import HISTORY_RECENT, Table

# how many standard errors of the busiest rank's chance lead an excess must clear (see the module doc:
# the two false findings above were 0.61 and 0.83 of this bar; a steady straggler's 32-step excess
# must then exceed 0.74 of its peers' sd a step, with 4 ranks)
CHANCE = 2.5
MIN_STEPS = 16   # history steps a rank must have shipped for its sd to be trusted
CHANCE_CATEGORIES = ("compute", "dataloader")   # what a rank's share of the draw shows as


def by_chance(table: Table, groups: list[np.ndarray], finding: Finding, group: int) -> dict[str, Any] | None:
    """``chance_lead`` for a culprit's finding from the window (``diagnose``): its lead over the window's
    steps, or for work alone in window steps that recurs, its average over the steps seen. None for a
    finding this module never judges: not compute or input pipeline, extra calls, compared on the
    device or with its own baseline, starved of CPU or stopped."""
    ev = finding.evidence
    if finding.category not in CHANCE_CATEGORIES or finding.rank is None or ev.get("work") == "more" or \
            any(k in ev for k in ("compared_with", "cpu_starved", "stopped", "compared_on")):
        return None
    rows = table.rows_of([int(finding.rank)])
    lone = ev.get("lone_work")
    if isinstance(lone, dict):   # work alone in window steps that recurs: its average over the steps it covers
        excess, steps = float(lone.get("average_ms", 0.0)), int(lone.get("average_steps", 0))
    else:
        excess = float(ev.get("excess_ms", finding.impact_ms_per_step))
        steps = int(table.step_ms.shape[1]) if table.step_ms is not None else 0
    if not len(rows) or steps < 1:
        return None
    return chance_lead(table, int(rows[0]), groups[group], excess, steps)


def _busy(table: Table, over: str) -> np.ndarray:
    """Busy ms a step (CPU + run-queue + batch wait) over the recent history ("hist") or all ("span")."""
    return table.sch(f"{over}_cpu") + table.sch(f"{over}_runq") + np.nan_to_num(table.sch(f"{over}_data"))


def chance_lead(table: Table, row: int, group: np.ndarray, excess_ms: float, steps: int) -> dict[str, Any] | None:
    """Evidence that rank ``row``'s ``excess_ms`` a step over ``steps`` steps (its window, or the steps it
    was named from) is the chance lead of the busiest of its ``group`` (rows, itself included), and so
    are its leads over the last HISTORY_RECENT steps and all the history shipped; None when it is not
    (or the history cannot say)."""
    peers = np.asarray([r for r in np.asarray(group).tolist() if r != row], dtype=np.int64)
    if not len(peers) or steps < 1:
        return None
    sd_all, span_n = table.sch("span_busy_sd"), table.sch("span_steps")
    if not (np.isfinite(sd_all[[row, *peers.tolist()]]).all() and np.isfinite(span_n[[row, *peers.tolist()]]).all()
            and float(span_n[row]) >= MIN_STEPS):
        return None
    # the group's median: with 3 ranks or more one rank's own bursts (a fault's) cannot move it, and a
    # rank that drew the longest steps is one of the draws; with 2, its one peer's
    sd = float(np.median(sd_all[np.asarray(group)] if len(group) >= 3 else sd_all[peers]))
    z = math.sqrt(2.0 * math.log(len(group))) if len(group) > 1 else 1.0

    def bar(k: float) -> float:
        return CHANCE * z * sd / math.sqrt(k)

    leads = {}
    for over, k in (("hist", float(HISTORY_RECENT)), ("span", float(span_n[row]))):
        busy = _busy(table, over)
        if not np.isfinite(busy[[row, *peers.tolist()]]).all():
            return None
        leads[over] = (float(busy[row] - np.median(busy[peers])), bar(k))
    if excess_ms > bar(steps) or any(lead > limit for lead, limit in leads.values()):
        return None
    return {"busy_sd_ms": round(sd, 3), "ranks": int(len(group)), "steps": int(steps),
            "excess_ms": [round(excess_ms, 3), round(bar(steps), 3)],
            "recent_ms": [round(v, 3) for v in leads["hist"]], "span_ms": [round(v, 3) for v in leads["span"]],
            "span_steps": int(span_n[row])}


def note(rank: int, ev: dict[str, Any]) -> str:
    """The diagnosis note for a rank ``chance_lead`` let go."""
    lead, limit = ev["excess_ms"]
    return (f"rank {rank} was +{lead:.1f} ms/step busier than its peers over {ev['steps']} steps, within what chance gives "
            f"the busiest of {ev['ranks']} ranks whose busy time varies by {ev['busy_sd_ms']:.1f} ms from step to step "
            f"(up to {limit:.1f} over {ev['steps']}; over the {ev['span_steps']} steps before the window "
            f"{ev['span_ms'][0]:+.1f}, up to {ev['span_ms'][1]:.1f}): the ranks take turns being the slowest "
            "(each step's work depends on its data), not reported as a culprit")
