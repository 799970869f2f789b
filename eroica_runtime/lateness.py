"""How late a rank came to its collectives in the steps before a window, against the earliest rank.

Why: a rank whose training thread is blocked off the CPU in bursts (a sleep, a lock or the GIL held by
another thread, a synchronous write to a slow file system) makes every other rank wait in its next
collective, and neither its CPU time, its run-queue wait nor its batch waits say so: its waiting
peers are off the CPU just as long, asleep in gloo or NCCL. A 3-step window that opens as such a
burst ends (the vote sees a burst 6-7 steps after it starts) holds one slow step of three. The fault
bench's stall-int (rank 1 of 4 asleep 80 ms before its optimizer step, 8 steps in 20) was missed in
both of its captures: +19.7 and +24.1 ms a step of host gap in the window, under the bar, and nothing
in the steps before it (benchmarks §20).

What tells the stalled rank from its victims is when each got to its collectives. torch's Flight
Recorder (which eroica-run turns on) keeps when each of a rank's last collectives was created, in
wall-clock ns; gloo records nothing else (no start, no end). Per step before the window, each rank
takes the creation of the last collective it made in that step (``last_created``; in data parallelism
every rank makes the same collectives in the same order, so the last one is the same operation
everywhere; where groups differ, a pipeline stage or a tensor-parallel group, a rank's last one is
always the same operation of its own and stands apart by about as much every step), the ranks
take the earliest of those per step in one all-reduce at the window's close, and each ships how much
later than that it was, less its usual lead (``lateness``): a host whose clock runs apart, or a
pipeline stage that is always later by design, is late every step and so not late at all.
Pure: no MPI, no torch.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

# a rank's usual lead over the earliest rank is this quantile of its leads over the steps shipped: a
# burst may fill up to the other three quarters of them and still stand out
USUAL = 0.25


def last_created(created_ns: Sequence[int], steps: Sequence[int], ends_ns: Mapping[int, int],
                 held_ns: Mapping[int, int] | None = None) -> np.ndarray:
    """Per step of ``steps``: epoch ms at which this rank created the last collective it made in that
    step (after the previous step's end, by its own), less the time eroica's vote held it at the
    previous step's end, ``inf`` where none is known (no collective recorded then, or the step's bounds
    unknown): the all-reduce's MIN passes over it.

    ``created_ns``: the recorder's creation times (epoch ns); ``ends_ns``: step -> epoch ns at its end;
    ``held_ns``: step -> ns the vote held the rank after that step's end. Where MPICH's vote has more
    stages than its lag (3 ranks), a rank waits for a late peer in the vote at its boundary rather
    than in the next collective (runtime._wait_vote), and so makes its next collectives as late as
    the peer it waited for: rank 0 of 3 came 58 ms late a step behind rank 1's 51 ms stall."""
    out = np.full(len(steps), np.inf)
    if not len(created_ns):
        return out
    created = np.sort(np.asarray(created_ns, dtype=np.int64))
    for i, s in enumerate(steps):
        lo, hi = ends_ns.get(s - 1), ends_ns.get(s)
        if lo is None or hi is None:
            continue
        j = int(np.searchsorted(created, hi, side="right")) - 1
        if j >= 0 and created[j] > lo:
            out[i] = (created[j] - (held_ns or {}).get(s - 1, 0)) / 1e6
    return out


def lateness(mine: np.ndarray, earliest: np.ndarray) -> np.ndarray:
    """ms per step that this rank made its step's last collective after the earliest rank did, less
    its usual lead (the USUAL quantile of those over the steps), never below 0; 0 where either is
    unknown."""
    with np.errstate(invalid="ignore"):
        lead = np.asarray(mine, dtype=np.float64) - np.asarray(earliest, dtype=np.float64)
    known = np.isfinite(lead)
    if not known.any():
        return np.zeros(len(lead))
    usual = float(np.quantile(lead[known], USUAL))
    return np.where(known, np.maximum(np.where(known, lead, 0.0) - usual, 0.0), 0.0)
