"""Work one rank did alone in a step of the window while its peers waited: a checkpoint rank 0
saves, metrics only it logs, an evaluation only it runs, every N steps.

Why: in synchronous training every rank's step lasts as long as the slowest rank's, so one such
step sets every rank's step statistics. A real 4-rank job whose rank 0 saves a 200 MB checkpoint
every 25 steps while the others wait at a barrier (tests/data/engine/checkpoint-job): a window's
steps ran 665-702, 47-89 and 55-114 ms on every rank, rank 0 working 563 ms alone in the first. The
bars a rank's excess must clear (attribution.find_culprits) come from those steps: the std error of
their mean (~200 ms) and a share of their mean (280 ms). Rank 0's +190 ms a step fell under the
first, and the capture read "healthy — 4/4 ranks agree"; in a later window holding a shorter
checkpoint, rank 1's 60 ms of extra matmuls a step (a fault from step 60) fell under them too, and
nobody was named there either.

So: such a step is found from the per-step waits (``lone_steps``: one rank waited at least a
typical step less than the median of the others, who waited for it); the other ranks are judged on
the window's other steps (``robust_levels``). The lone rank keeps the whole window's bars, as
before; when its excess does not clear them, it is named only if the steps before the window
show the same kind of work, its mean CPU and run-queue time over the history shipped (up to 32
steps) above its peers', or how late it came to its collectives (``periodic``), and at what that
costs on average over every step seen, not per window step (190 ms a step for a checkpoint that
costs ~23 on average, 563 ms once in 25 steps). Work the history does not show is a one-off, a
note.
Pure: no MPI, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from eroica_runtime.engine.baseline import Thresholds, median_of_others
from eroica_runtime.engine.quota import busy
from eroica_runtime.engine.table import HISTORY_RECENT, Table

LONE_SHARE = 1.0      # a lone step's extra work: at least this many typical steps (the peers' median step)
HISTORY_SHARE = 0.5   # the history must show at least this share of the lone work, spread over its steps


@dataclass(frozen=True)
class LoneWork:
    """Steps of the window in which one rank worked alone while its peers waited for it."""

    row: int
    steps: tuple[int, ...]     # positions in the window (0 = its first step)
    ms: float                  # the work alone in them, summed: how much longer than its peers it worked


def lone_steps(table: Table, rows: np.ndarray, th: Thresholds) -> dict[int, LoneWork]:
    """{row: LoneWork} of one peer group (3 ranks or more, with per-step waits and step times):
    in a window step, the rank that waited least, if it waited at least max(abs_ms, LONE_SHARE x
    the group's typical step) less than the median of the others. A step where every rank waited
    alike (a slow network, a host-wide stall) has none. Not on a device timeline (a GPU job): the
    per-step waits are the host's, which runs ahead of the device, and this was seen on CPU ranks
    only."""
    if table.step_comm is None or table.step_ms is None or len(rows) < 3 or table.has_device(rows):
        return {}
    comm, ms = table.step_comm[rows], table.step_ms[rows]
    ok = np.isfinite(comm).all(axis=0) & np.isfinite(ms).all(axis=0)
    if ok.sum() < 3:    # two ordinary steps at least must be left to judge the others on
        return {}
    cols = np.flatnonzero(ok)
    typical = float(np.median(np.median(ms[:, cols], axis=1)))
    bar = max(th.abs_ms, LONE_SHARE * typical)
    alone = np.stack([median_of_others(comm[:, s]) - comm[:, s] for s in cols], axis=1)
    found: dict[int, tuple[list[int], float]] = {}
    for j, s in enumerate(cols.tolist()):
        k = int(np.argmax(alone[:, j]))
        if alone[k, j] >= bar:
            steps, total = found.get(k, ([], 0.0))
            found[k] = (steps + [s], total + float(alone[k, j]))
    lone = {int(rows[k]): LoneWork(int(rows[k]), tuple(steps), total) for k, (steps, total) in found.items()}
    left = ok.sum() - len({s for w in lone.values() for s in w.steps})
    return lone if left >= 2 else {}


def robust_levels(table: Table, rows: np.ndarray, lone: dict[int, LoneWork],
                  th: Thresholds) -> tuple[float, float] | None:
    """(the group's median mean step, ``noise_k`` x its median std error of that mean) over the
    window's steps without lone work: the reference the group's other ranks are judged by. None
    when there is no lone step in the group."""
    mine = [w for r, w in lone.items() if r in set(rows.tolist())]
    if not mine or table.step_ms is None:
        return None
    gone = {s for w in mine for s in w.steps}
    ms = table.step_ms[rows]
    keep = [s for s in range(ms.shape[1]) if s not in gone and np.isfinite(ms[:, s]).all()]
    if len(keep) < 2:
        return None
    x = ms[:, keep]
    step_ref = float(np.median(x.mean(axis=1)))
    noise = th.noise_k * float(np.median(x.std(axis=1, ddof=1) / math.sqrt(len(keep))))
    return step_ref, noise


def periodic(table: Table, rows: np.ndarray, work: LoneWork, excess: float, step_ref: float,
             th: Thresholds) -> dict[str, Any] | None:
    """The evidence that the lone work recurs, and its cost: None unless, over the steps shipped
    before the window (up to 32), the rank's CPU and run-queue time was above its peers' median, or it
    came to its collectives later than they did (lateness.py: work off the CPU, a blocking write to
    slow storage every 10 steps, shows there and nowhere else), by at least HISTORY_SHARE of the
    lone work spread over those steps, and unless its cost is worth a finding (``rel_step`` of
    ``step_ref``, the group's step without lone work: a rank that had one slow step and a ms more CPU
    than its peers before the window is no culprit). Its cost a step is its excess over every step
    seen, the history's and the window's (``excess`` a step, its own work beyond its peers' there)."""
    n = float(table.sch("span_steps")[work.row])
    peers = rows[rows != work.row]
    k = int(np.isfinite(table.step_ms[work.row]).sum()) if table.step_ms is not None else 0
    if not math.isfinite(n) or n < HISTORY_RECENT or not k:
        return None
    before = _beyond_peers(table, "span", work.row, peers)
    if before is None or before < max(th.abs_ms, HISTORY_SHARE * work.ms / n):
        return None
    average = (n * before + k * excess) / (n + k)
    if average < max(th.abs_ms, th.rel_step * step_ref):
        return None
    first = table.capture_step
    span_ms = table.sch("span_ms")[rows]
    mean_step = float(np.median(table.col("step")[rows]))
    if np.isfinite(span_ms).all():
        mean_step = (n * float(np.median(span_ms)) + k * mean_step) / (n + k)
    out = {"lone_ms": work.ms, "lone_steps": [int(first) + s if first is not None else s for s in work.steps],
           "before_window_ms": before, "before_window_steps": int(n),
           "average_ms": average, "average_steps": int(n) + k, "mean_step_ms": mean_step}
    recent = _beyond_peers(table, "hist", work.row, peers)
    if recent is not None:
        out["recent_ms"] = recent
    return out


def _beyond_peers(table: Table, over: str, row: int, peers: np.ndarray) -> float | None:
    """ms a step the rank's CPU and run-queue time, or its lateness to its collectives, whichever is
    more, was above its peers' median over the step clock's recent steps ("hist": the last
    HISTORY_RECENT, less a pause) or all it shipped ("span"); None when its busy time is unknown."""
    mine = busy(table, over)
    if not (np.isfinite(mine[row]) and np.isfinite(mine[peers]).all()):
        return None
    out = float(mine[row] - np.median(mine[peers]))
    late = table.sch(f"{over}_late")
    if np.isfinite(late[row]) and np.isfinite(late[peers]).all():
        out = max(out, float(late[row] - np.median(late[peers])))
    return out


# the history's excess a step at least this share of the lone work: as if it worked so long alone one
# step in 4 or more, slow in bursts; less, work it does alone every so often (a checkpoint every 25
# steps, metrics logged every 10)
BURST_SHARE = 0.25


def describe(lone: dict[str, Any], category: str) -> tuple[str, str]:
    """(the title's words, the action's first sentences) for a finding with ``periodic``'s evidence:
    slow in bursts when the steps before the window, all of them or the last HISTORY_RECENT, held the
    lone step's work one step in 4 or more (a GC storm 8 steps in 20: 105 ms a step more than its
    peers over 32 steps, 178 ms alone in the window; storage reads stalling a rank 8 steps in 20, its
    window opened 7 steps into a burst: 44 ms a step over 32 steps, 190 over the last 8, 228 ms alone
    in the window), else work it does alone every so often (a checkpoint: 24 ms a step over 32 steps,
    917 ms alone in one window step; metrics rank 0 logs every 10 steps: 4.2 ms a step over 32, 40 ms
    alone in one window step). Counted in occurrences (over 32 steps, twice the lone work), the
    metrics read as bursts and the action missed what they are."""
    steps = ", ".join(str(s) for s in lone["lone_steps"])
    seen = (f"{lone['before_window_ms']:.1f} ms/step more than its peers over the {lone['before_window_steps']} "
            "steps before the window")
    cost = f"+{lone['average_ms']:.1f} ms/step on average over {lone['average_steps']} steps"
    bar = BURST_SHARE * lone["lone_ms"]
    recent = lone.get("recent_ms")
    if lone["before_window_ms"] < bar and recent is not None and recent >= bar:
        seen = (f"{recent:.1f} ms/step more than its peers over the last {HISTORY_RECENT} steps before the window, "
                f"{lone['before_window_ms']:.1f} over {lone['before_window_steps']}")
    if lone["before_window_ms"] >= bar or (recent is not None and recent >= bar):
        return (f"in bursts: {lone['lone_ms']:.0f} ms alone in step {steps} while its peers waited, {seen} ({cost}",
                f"Slow in bursts ({seen}; in the window, {lone['lone_ms']:.0f} ms alone in step {steps} while every "
                "other rank waited). ")
    action = (f"Every so often this rank works alone while every other rank waits for it ({lone['lone_ms']:.0f} ms in "
              f"step {steps}; {seen})")
    if category in ("compute", "host", "io"):
        action += (": work only it does, such as saving a checkpoint, logging metrics or evaluating on one rank. "
                   "Make it asynchronous (torch.distributed.checkpoint.async_save, a logging thread), share it among "
                   "the ranks, or do it less often. ")
    else:
        action += ". "
    alone = f"{lone['lone_ms']:.0f} ms" if lone["lone_ms"] < 1000 else f"{lone['lone_ms'] / 1e3:.2f} s"
    return (f"{alone} of work alone in step {steps} while its peers waited, and before the window too ({cost}",
            action)


NOTED = 4   # lone works a note lists by rank; the rest are counted (one note a capture, however many groups)


def _listed(table: Table, works: list[LoneWork], said: str) -> str:
    """"rank 0 563 ms in step 50; ..." for the first NOTED of ``works``, and how many more."""
    first = table.capture_step
    text = "; ".join(f"rank {int(table.rank[w.row])} {w.ms:.0f} ms {said} step "
                     + ", ".join(str(first + s) if first is not None else f"#{s}" for s in w.steps)
                     for w in works[:NOTED])
    return text + (f"; and {len(works) - NOTED} more rank(s)" if len(works) > NOTED else "")


def taken_out_note(table: Table, works: list[LoneWork]) -> str:
    """The note for the peer groups whose other ranks were judged without the steps ``works`` were done in."""
    return (f"window steps one rank worked in alone while its peers waited ({_listed(table, works, 'in')}): the other "
            "ranks were judged on the window's other steps")


def one_off_note(table: Table, works: list[LoneWork]) -> str:
    """The note for lone work the steps before the window do not show as recurring (``periodic``)."""
    return (f"work alone in a window step while the peers waited ({_listed(table, works, 'alone in')}); the steps "
            "before the window show no such work worth a share of the step (neither its CPU time nor when it came "
            "to its collectives): a one-off, not reported as a per-step cost")
