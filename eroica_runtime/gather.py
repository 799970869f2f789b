"""Gather: every rank's summary bytes to rank 0, hierarchically and bounded, then persisted.

The transport (node ranks -> node leader -> rank 0, with deadlines) lives in the side channel; this
stage chooses tags, and on rank 0 writes ``captures/<step>.msgpack`` before anything is analysed or
printed, so `eroica analyze` can always redo the diagnosis.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eroica_runtime import reportdir
from eroica_runtime import summary as summary_mod
from eroica_runtime.sidechannel import SideChannel

TAG_JOBEND = 30100


def capture_tag(step: int) -> int:
    """A tag pair per capture, so a late message of one capture never lands in another."""
    return 2 + 2 * (step % 15000)


@dataclass(frozen=True)
class Gathered:
    step: int
    trigger: str
    path: Path
    data: bytes             # the capture file's bytes (decode with summary.decode_capture)
    missing: list[int]


def gather_capture(side: SideChannel, blob: bytes, *, step: int, trigger: str, deadline_s: float,
                   report_dir: str, extra: dict | None = None) -> Gathered | None:
    """Collective over all ranks; returns the persisted capture on rank 0, None elsewhere."""
    got = side.gather_bytes(blob, deadline_s, tag_base=capture_tag(step))
    if got is None:
        return None
    blobs, missing = got
    ranks = sorted(blobs)
    data = summary_mod.encode_capture(step=step, trigger=trigger, world_size=side.size, ranks=ranks,
                                      summaries=[blobs[r] for r in ranks], missing=missing, extra=extra)
    path = reportdir.atomic_write(reportdir.capture_path(report_dir, step), data)
    return Gathered(step, trigger, path, data, missing)


def gather_job_end(side: SideChannel, blob: bytes, deadline_s: float) -> tuple[dict[int, bytes], list[int]] | None:
    """Each rank's end-of-job step statistics to rank 0 (bounded)."""
    return side.gather_bytes(blob, deadline_s, tag_base=TAG_JOBEND)
