"""Which capture files a long job keeps, so that its report directory does not grow without end.

Why: the capture budget refills (``--capture-refill-steps``), so a job that runs for days takes a
capture every refill period: noise its drift rule voted on, or a fault already named, captured again.
Each leaves ``captures/<step>.msgpack``: ~50 KB at 4 ranks (the train job of tests/test_runtime.py),
11.5 MB at 1,000 ranks (``eroica synth --ranks 1000``), 33-69 MB at 100,000 ranks (node blocks).
What a capture showed is in its ``diagnosis-<step>.json`` (1-9 KB at 4 ranks, 10-25 KB at 1,000,
with the summaries of the ranks it names); the capture file is only needed to analyse it again.

Kept: the baseline capture (the reference every later capture is compared with, live and by
``eroica analyze``), the first capture of each job-level finding (``engine.finding_key``: the
evidence it was first found on, ``engine.first_named``), and the newest ``--keep-captures``
captures. Every other capture's file (and the raw events kept of it, EROICA_KEEP_RAW_EVENTS=1) is
removed once its diagnosis is on disk; ``eroica analyze`` reads that diagnosis in its place
(eroica_launch/offline.py), so the job report it writes is the one the job wrote. Pure policy plus
one call into reportdir, the files' owner.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence

from eroica_runtime import reportdir
from eroica_runtime.engine import Diagnosis, first_named
from eroica_runtime.engine.hang import HANG_TRIGGER  # a hang's diagnosis has no capture file


class PruneError(OSError):
    """A capture file that could not be removed; ``removed``: the steps whose file was removed before it."""

    def __init__(self, cause: OSError, removed: list[int]) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause), cause.filename)
        self.removed = removed


def kept_steps(diagnoses: Sequence[Diagnosis], newest: int) -> set[int]:
    """The capture steps whose files stay, out of ``diagnoses`` (every capture diagnosed so far);
    ``newest`` <= 0 keeps them all."""
    caps = sorted((d for d in diagnoses if d.trigger != HANG_TRIGGER), key=lambda d: d.step)
    if newest <= 0:
        return {d.step for d in caps}
    return ({d.step for d in caps[-newest:]} | {d.step for d in caps if d.trigger == "baseline"}
            | set(first_named(caps).values()))


def prune(root: str | os.PathLike[str], diagnoses: Sequence[Diagnosis], newest: int,
          gone: Collection[int] = ()) -> list[int]:
    """Remove the capture files ``kept_steps`` does not keep (each capture's diagnosis-<step>.json must
    already be written), except those of the steps in ``gone`` (removed before: a job of a thousand
    captures is not sent a thousand unlinks at each one); return the steps whose file was removed now.
    PruneError when one cannot be (with the steps removed before it: the job report lists them)."""
    keep = kept_steps(diagnoses, newest)
    removed: list[int] = []
    for d in sorted(diagnoses, key=lambda d: d.step):
        try:
            if d.trigger != HANG_TRIGGER and d.step not in keep and d.step not in gone \
                    and reportdir.remove_capture(root, d.step):
                removed.append(d.step)
        except OSError as exc:
            raise PruneError(exc, removed) from exc
    return removed
