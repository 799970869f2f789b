"""Gather: every rank's summary bytes to rank 0, hierarchically and bounded, then persisted.

The transport (node ranks -> node leader -> rank 0, with deadlines) lives in the side channel; this
stage chooses tags, and on rank 0 writes ``captures/<step>.msgpack`` before anything is analysed or
printed, so `eroica analyze` can always redo the diagnosis. With leader-side reduction on
(``reduce=True``), each node leader forwards one column block of its node (engine/leader.py) and
the file holds the blocks as they came (``eroica.capture/2``); off, every rank's raw summary
(``eroica.capture/1``), exactly as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eroica_runtime import jobend, reportdir
from eroica_runtime import summary as summary_mod
from eroica_runtime.engine import blocks, leader
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
    data: bytes             # the capture file's bytes (read with engine.ingest.read_capture)
    missing: list[int]      # ranks (reduced: node leaders) that sent nothing in time
    reduced: bool = False   # node leaders sent column blocks (eroica.capture/2)


def gather_capture(side: SideChannel, blob: bytes, *, step: int, trigger: str, deadline_s: float,
                   report_dir: str, extra: dict | None = None, reduce: bool = False) -> Gathered | None:
    """Collective over all ranks; returns the persisted capture on rank 0, None elsewhere."""
    if reduce:
        def node_block(blobs: dict[int, bytes], missing: list[int]) -> bytes:
            return leader.reduce_node(step=step, trigger=trigger, world_size=side.size, leader=side.rank,
                                      blobs=blobs, missing=missing)

        red = side.gather_reduced(blob, deadline_s, node_block, tag_base=capture_tag(step))
        if red is None:
            return None
        by_leader, silent = red
        data = blocks.encode_capture(step=step, trigger=trigger, world_size=side.size, blocks=by_leader,
                                     missing=silent, extra=extra)
        path = reportdir.atomic_write(reportdir.capture_path(report_dir, step), data)
        return Gathered(step, trigger, path, data, silent, reduced=True)
    got = side.gather_bytes(blob, deadline_s, tag_base=capture_tag(step))
    if got is None:
        return None
    blobs, missing = got
    ranks = sorted(blobs)
    data = summary_mod.encode_capture(step=step, trigger=trigger, world_size=side.size, ranks=ranks,
                                      summaries=[blobs[r] for r in ranks], missing=missing, extra=extra)
    path = reportdir.atomic_write(reportdir.capture_path(report_dir, step), data)
    return Gathered(step, trigger, path, data, missing)


def gather_job_end(side: SideChannel, blob: bytes, deadline_s: float) -> jobend.JobEnd | None:
    """Each rank's end-of-job step statistics to rank 0 (bounded), their longest steps reduced by the
    node leaders on the way (jobend.py). Returns what rank 0 got on rank 0, None elsewhere."""
    got = side.gather_reduced(blob, deadline_s, jobend.node_payload, tag_base=TAG_JOBEND)
    return None if got is None else jobend.read(got[0])
