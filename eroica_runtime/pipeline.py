"""One analysis pipeline for a job's captures: decode -> validate -> baseline policy -> diagnose.

The live analyst (rank 0, during the job) and ``eroica analyze`` (offline, over a report directory)
both feed captures through a ``Pipeline`` in step order, so the same captures always give the same
diagnosis. Pure: no MPI, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eroica_runtime import engine
from eroica_runtime import summary as summary_mod


@dataclass(frozen=True)
class Analysed:
    """One capture through the pipeline: its diagnosis, the capture file's fields, rejected summaries."""

    diagnosis: engine.Diagnosis
    meta: dict[str, Any]
    errors: tuple[str, ...]


class Pipeline:
    """Diagnoses one job's captures in step order, carrying the job's healthy baseline between them.

    Baseline policy: the capture whose trigger is "baseline" becomes the reference for every later
    capture (captures before it have none). Ranks that capture names as culprits (noise, or a fault
    present from the start) are left out of the reference rather than losing it for the whole job;
    when more than half would be left out, there is no reference.
    """

    def __init__(self, *, world_size: int | None = None, topology: str | None = None) -> None:
        self.world_size = world_size
        self.topology = topology or None
        self.baseline: engine.Table | None = None

    def analyse(self, data: bytes, *, origin: str) -> Analysed:
        """One capture file's bytes; raises summary.SummaryError when the file itself is unusable."""
        meta, summaries, errors = summary_mod.decode_capture(data, origin=origin)
        table = engine.build_table(summaries)
        extra = meta.get("extra") or {}
        probe = extra.get("link_probe") if isinstance(extra.get("link_probe"), dict) else None
        world = self.world_size or int(meta["world_size"])
        diagnosis = engine.diagnose(table, step=int(meta["step"]), trigger=str(meta["trigger"]), world_size=world,
                                    missing=meta["missing"], baseline=self.baseline, topology=self.topology,
                                    link_probe=probe, errors=errors)
        if meta["trigger"] == "baseline":
            flagged = {f.rank for f in diagnosis.findings if f.rank is not None}
            kept = [s for s in summaries if s["rank"] not in flagged]
            if len(kept) >= max(1, len(summaries) // 2):
                self.baseline = table if len(kept) == len(summaries) else engine.build_table(kept)
        return Analysed(diagnosis, meta, tuple(errors))
