"""Job level: a rank starved of CPU once, and not in the captures after it, is no culprit of the job.

One capture cannot tell a rank that a co-located process or the scheduler starved for a dozen steps
once from the first burst of contention that comes back: both are the same run-queue wait on the same
rank, in the window or the steps before it (``history._persistent_contention``, ``attribution``), and
the fault bench's contend-int is named from its first burst. A long job can: a contention that is
the job's keeps showing in the detector captures that follow (a steady one in every window, bursts in
the steps before them), while one that came and went does not. On this project's 2-core VM, healthy
jobs of 2,500-5,000 steps had such one-off spells named as culprits (rank 3 at step 254 of one, "host
in the 8 steps before the window", +16.8 ms a step there, with 6 detector captures after it that did
not name it; rank 1 at step 655 of another, in the window and the 8 steps before it, with 9 after):
the job report read as if the job had a host problem it never had again.

So a job-level finding of CPU contention (category host, ``cpu_starved`` in its evidence: no CPU quota,
no stops) seen in one capture only, with at least ``LATER_CAPTURES`` detector-triggered captures after
it that analysed that rank and did not name it, moves from the job's findings to its transient
observations: kept whole (the capture's own diagnosis is untouched, and the job report prints it as
transient), never dropped. The fault bench's 120-step jobs have at most one detector capture after
the first, so nothing there changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from eroica_runtime.engine.history import TRIGGERED
from eroica_runtime.engine.model import Diagnosis, Finding

LATER_CAPTURES = 2   # detector captures after the one that named it, which did not name it again


def split_transient(findings: Sequence[Finding], diagnoses: Sequence[Diagnosis]) -> tuple[list[Finding],
                                                                                          list[Finding]]:
    """(findings of the job, transient observations): ``findings`` as ``consolidate`` returns them,
    ``diagnoses`` the job's captures; order kept in both. A transient one's evidence gains
    ``not_seen_after``: the steps of the detector captures after it that did not name it."""
    kept: list[Finding] = []
    transient: list[Finding] = []
    for f in findings:
        after = _not_seen_after(f, diagnoses)
        if len(after) >= LATER_CAPTURES:
            transient.append(replace(f, evidence={**f.evidence, "not_seen_after": after}))
        else:
            kept.append(f)
    return kept, transient


def _not_seen_after(f: Finding, diagnoses: Sequence[Diagnosis]) -> list[int]:
    """Steps of the detector captures after the one capture that named ``f`` (CPU contention only)
    that analysed its rank; [] if one of them named it again, or ``f`` is not such a finding."""
    if f.category != "host" or f.rank is None or not f.evidence.get("cpu_starved") or len(f.captures) != 1:
        return []
    later = [d for d in diagnoses if d.step > f.captures[0] and d.trigger in TRIGGERED and d.conclusive
             and f.rank not in d.missing]
    if any(g.rank == f.rank and g.category == f.category for d in later for g in d.findings):
        return []
    return sorted(d.step for d in later)
