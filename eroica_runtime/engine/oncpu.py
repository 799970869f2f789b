"""A host stall spent on the CPU: the culprit's training thread ran its own Python between ops.

A rank's own work outside any profiled op (category host, phase host_gap) that its training thread
spent running, neither waiting for a CPU (contention, a quota: ``Culprit.sched``, quota.py) nor off
it (blocked, offcpu.py), is Python the training loop runs on that rank: code only it runs (rank-0
logging, metrics or progress bars, checkpoint bookkeeping) or the same code over larger Python
data. The category's generic action sent its reader to the host: rank 0 of 3 smoothing a 200,000-
entry loss history in pure Python after every step (~11 ms) read "CPU-side stalls on this rank
(launch gaps / Python overhead / contention): check other processes on the host, CPU pinning and
cgroup limits" (2026-12-07), while its training thread ran 17.5 ms a step against its peers' 6.0
and queued 0.75 ms against 0.21-2.8. And where the window's own comparison missed it and the steps
before the window named it (history.py), "compute (forward) ... Compare this rank's GPU/CPU with its
peers (clocks, thermals, co-located jobs); drain the node", though the window's extra own work was
all between ops (host_gap 13.0 ms against 1.0-1.4).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from eroica_runtime.engine.categories import PHASE_CATEGORY, pick_category
from eroica_runtime.engine.model import Diagnosis
from eroica_runtime.engine.table import PHASE_INDEX, Table

# the share of the culprit's excess its training thread must have run on a CPU more than its peers did
BUSY_SHARE = 0.5


def busy_evidence(table: Table, row: int, peer_rows: np.ndarray, excess_ms: float) -> dict[str, Any]:
    """``{"thread_cpu_ms": [rank, peers' median]}``, CPU ms a step the training thread ran in the window
    (the step clock's), when that is BUSY_SHARE of ``excess_ms`` more than its peers'; {} otherwise, or
    without the step clock's times."""
    cpu = table.sch("cpu")
    peers = peer_rows[peer_rows != row]
    peers = peers[np.isfinite(cpu[peers])]
    if excess_ms <= 0 or not peers.size or not np.isfinite(cpu[row]):
        return {}
    ref = float(np.median(cpu[peers]))
    if cpu[row] - ref < BUSY_SHARE * excess_ms:
        return {}
    return {"thread_cpu_ms": [round(float(cpu[row]), 3), round(ref, 3)]}


def window_category(table: Table, row: int, peer_rows: np.ndarray) -> tuple[str, str]:
    """(category, phase) of the rank's extra own work in the window against its peers' median: where
    the steps before the window name a rank busy on its CPU, the window's profile tells ops (compute)
    from the Python between them (host, host_gap)."""
    peers = peer_rows[peer_rows != row]
    excess = {}
    for phase in PHASE_CATEGORY:
        if phase in PHASE_INDEX:
            col = table.col(phase)
            ref = col[peers][np.isfinite(col[peers])]
            if np.isfinite(col[row]) and ref.size:
                excess[phase] = float(col[row] - np.median(ref))
    return pick_category(excess) if excess else ("compute", "forward")


PYSPY = "py-spy top --pid on this rank (or torch.profiler with with_stack=True) names the function."
# where its Python was (pysample.py): a frame with this share of its sampled time above its peers'
# median, over this many looks at least
WHERE_SHARE = 0.2
WHERE_MIN = 5
WHERE_PEERS = 16     # the culprit's victims whose samples are compared (its peers: they ran the same loop)


def busy_action(evidence: dict[str, Any]) -> str:
    """What a culprit whose training thread ran its own Python tells its reader to do; with
    ``python_frame`` (with_python_where), where that Python was."""
    mine, ref = evidence["thread_cpu_ms"]
    head = (f"Its training thread ran on a CPU {mine:.1f} ms a step (peers {ref:.1f}), neither waiting for one "
            "nor blocked, outside any torch op: Python of its own in the training loop")
    if evidence.get("python_frame"):
        share, peers = evidence["python_share"]
        function, at = frame_words(str(evidence["python_frame"]))
        return (f"{head}, {share:.0%} of its time in {function} ({at}; peers {peers:.0%}), as eroica sampled "
                f"its main thread through the window: that function, or what it calls, is work this rank does "
                f"and its peers do not, or the same work over larger Python data (a list or dict that keeps "
                f"growing, rank-0 logging or metrics).")
    return (f"{head}. Look for code this rank runs and its peers do not (rank-0 logging, metrics or progress "
            "bars, checkpoint bookkeeping, building lists or dicts over a growing history) or the same code over "
            "larger Python data; " + PYSPY)


def frame_words(frame: str) -> tuple[str, str]:
    """('smooth', '/job/pylog.py:18') for '/job/pylog.py:18 smooth' (a pysample frame)."""
    where, _, function = frame.rpartition(" ")
    return (function, where) if where else (frame, frame)


def _shares(py: Any) -> tuple[dict[str, float], int]:
    """({frame: share of the sampled time}, looks) of a summary's ``python`` ({}, 0 when absent)."""
    if not isinstance(py, Mapping):
        return {}, 0
    n, total, frames = py.get("samples"), py.get("ms"), py.get("frames")
    if not isinstance(n, int) or n <= 0 or not isinstance(total, (int, float)) or total <= 0 \
            or not isinstance(frames, list):
        return {}, 0
    return {str(f[0]): f[1] / total for f in frames if isinstance(f, list) and len(f) == 2
            and isinstance(f[1], (int, float))}, n


def python_where(mine: Any, peers: Sequence[Any]) -> dict[str, Any]:
    """``{"python_frame": frame, "python_share": [culprit's share, peers' median]}``: the frame of the
    culprit's sampled Python (a summary's ``python``) most above its peers' (which run the same loop:
    the model's forward line is in every rank's samples alike), when WHERE_SHARE above, over
    WHERE_MIN looks or more; {} otherwise, or without samples. A frame outside a peer's listed few counts 0."""
    own, n = _shares(mine)
    theirs = [s for s, k in map(_shares, peers) if k]
    if not own or not theirs:
        return {}
    best: tuple[float, str, float, float] | None = None
    for frame, share in own.items():
        ref = float(np.median([t.get(frame, 0.0) for t in theirs]))
        if share - ref >= WHERE_SHARE and n >= WHERE_MIN and (best is None or share - ref > best[0]):
            best = (share - ref, frame, share, ref)
    if best is None:
        return {}
    return {"python_frame": best[1], "python_share": [round(best[2], 3), round(best[3], 3)]}


def with_python_where(diagnosis: Diagnosis, summaries: Mapping[int, Mapping[str, Any]]) -> Diagnosis:
    """The diagnosis with each busy culprit (``thread_cpu_ms``: its own Python) told where that Python
    was, from its and its victims' sampled frames (``summaries``: raw summaries by rank; a rank without
    one, as in a capture of node blocks, is left out): the title and the action name the function
    instead of sending the reader to py-spy."""
    out = []
    for f in diagnosis.findings:
        if "thread_cpu_ms" not in f.evidence or f.rank is None or f.rank not in summaries:
            out.append(f)
            continue
        where = python_where(summaries[f.rank].get("python"),
                             [summaries[v].get("python") for v in f.victims[:WHERE_PEERS] if v in summaries])
        if not where:
            out.append(f)
            continue
        function, at = frame_words(where["python_frame"])
        ev = {**f.evidence, **where}
        out.append(replace(f, evidence=ev, action=f.action.replace(busy_action(f.evidence), busy_action(ev)),
                           title=f.title.replace(" between profiled ops", f" between profiled ops, Python in "
                                                 f"{function} ({os.path.basename(at)})", 1)))
    return replace(diagnosis, findings=tuple(out))
