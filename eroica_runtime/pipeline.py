"""One analysis pipeline for a job's captures: decode -> validate -> baseline policy -> diagnose.

The live analyst (rank 0, during the job) and ``eroica analyze`` (offline, over a report directory)
both feed captures through a ``Pipeline`` in step order, so the same captures always give the same
diagnosis. Decoding and validating go straight into the engine's columns (engine/ingest.py): no
list of per-rank dicts is held, so a 100,000-rank capture costs seconds and its bytes plus the
columns in memory; the raw summaries of the ranks a diagnosis names are decoded again for the
report's drill-down. A capture of node blocks (``eroica.capture/2``: node leaders pre-reduced their
ranks, engine/blocks.py) takes the same path and gives the same Table; its drill-down has the raw
summaries the leaders forwarded (``blocks.pick_drill``). Pure: no MPI, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eroica_runtime import engine
from eroica_runtime.engine import ingest, oncpu


@dataclass(frozen=True)
class Analysed:
    """One capture through the pipeline: its diagnosis, the capture file's fields, rejected summaries,
    and the raw summaries of the ranks its findings name (for drill-down; not every rank's; from a
    capture of node blocks, only those of the named ranks whose leader forwarded them)."""

    diagnosis: engine.Diagnosis
    meta: dict[str, Any]
    errors: tuple[str, ...]
    summaries: dict[int, dict[str, Any]] = field(default_factory=dict)


def named_ranks(diagnosis: engine.Diagnosis) -> list[int]:
    """Ranks the findings name as culprits (a host finding's ranks too), most costly finding first."""
    out: dict[int, None] = {}
    for f in diagnosis.findings:
        if f.rank is not None:
            out[int(f.rank)] = None
        for r in (f.evidence or {}).get("ranks") or ():
            if isinstance(r, int) and not isinstance(r, bool):
                out[r] = None
    return list(out)


class Pipeline:
    """Diagnoses one job's captures in step order, carrying the job's healthy baseline between them.

    Baseline policy: the capture whose trigger is "baseline" becomes the reference for every later
    capture (captures before it have none). Ranks that capture names as culprits (noise, or a fault
    present from the start) are left out of the reference rather than losing it for the whole job;
    when more than half would be left out, there is no reference. A second baseline (the job's steps
    came to be counted elsewhere, trigger.Trigger.relearn: an evaluation pass's batches, then the
    training's optimizer steps) is compared with none and replaces the first: its steps are another
    kind, and against the evaluation's the training read as "all ranks slower than the baseline".
    """

    def __init__(self, *, world_size: int | None = None, topology: str | None = None) -> None:
        self.world_size = world_size
        self.topology = topology or None
        self.baseline: engine.Table | None = None

    def analyse(self, data: ingest.CaptureBytes, *, origin: str) -> Analysed:
        """One capture file's bytes (or a large one mapped: reportdir.read_capture); raises
        summary.SummaryError when the file itself is unusable."""
        cap = ingest.read_capture(data, origin=origin)
        meta, errors = cap.meta, cap.errors
        table = cap.table()
        extra = meta.get("extra") or {}
        probe = extra.get("link_probe") if isinstance(extra.get("link_probe"), dict) else None
        world = self.world_size or int(meta["world_size"])
        diagnosis = engine.diagnose(table, step=int(meta["step"]), trigger=str(meta["trigger"]), world_size=world,
                                    missing=meta["missing"], topology=self.topology,
                                    baseline=None if meta["trigger"] == "baseline" else self.baseline,
                                    link_probe=probe, errors=errors)
        if meta["trigger"] == "baseline":
            flagged = {f.rank for f in diagnosis.findings if f.rank is not None}
            good = cap.good_ranks
            kept = int(sum(1 for r in good.tolist() if r not in flagged)) if flagged else len(good)
            if kept >= max(1, len(good) // 2):
                self.baseline = table if kept == len(good) else cap.table(exclude={int(r) for r in flagged})
        named = named_ranks(diagnosis)
        # a culprit that ran Python of its own: where, from its and its peers' sampled frames (oncpu.py)
        peers = {v for f in diagnosis.findings if "thread_cpu_ms" in f.evidence for v in f.victims[:oncpu.WHERE_PEERS]}
        raw = cap.summaries(named + sorted(peers - set(named)))
        if peers:
            diagnosis = oncpu.with_python_where(diagnosis, raw)
        drill = {r: raw[r] for r in named if r in raw}
        cap.release()
        return Analysed(diagnosis, meta, tuple(errors), drill)
