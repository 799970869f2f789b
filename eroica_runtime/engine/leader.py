"""Leader-side pre-reduction: a node's raw summaries -> one column block (engine/blocks.py).

Why: at 100,000 ranks rank 0 would receive 1.1 GB of raw summaries and spend seconds decoding
them; a node leader can do its node's share (8 summaries) in milliseconds, in parallel with every
other leader, and forward the columns the engine reads. The leader reads its node's summaries
exactly as rank 0 reads a capture file (``ingest.read_capture``: the same checks, the same one-line
errors naming the rank, the same TableBuilder rows), so there is one decoding path, not a copy; its
rows go out as one segment with each function list in one canonical order (``merge_segments``), so
that ranks listing the same functions in orders of their own share one list of names.
Never raises: anything unexpected becomes a "failed" block naming the node's ranks, which rank 0
then counts as missing with the reason (the training is never hurt by eroica). Pure: no MPI.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from eroica_runtime.engine import ingest
from eroica_runtime.engine.blocks import DRILL_PER_NODE, encode_node_block, pick_drill
from eroica_runtime.engine.table import merge_segments
from eroica_runtime.summary import schema


def reduce_node(*, step: int, trigger: str, world_size: int, leader: int, blobs: dict[int, bytes],
                missing: list[int], drill: int | None = None) -> bytes:
    """The block leader ``leader`` forwards for its node: ``blobs`` are the summaries it received
    (by world rank), ``missing`` the node ranks it did not hear from in time."""
    ranks = sorted(blobs)
    node = sorted({*ranks, *missing, leader})
    try:
        data = schema.encode_capture(step=step, trigger=trigger, world_size=world_size, ranks=ranks,
                                     summaries=[blobs[r] for r in ranks], missing=missing)
        ing = ingest.read_capture(data, origin=f"node of rank {leader}")
        pos = np.asarray(ranks, dtype=np.int64)
        # a row's place in the node's capture -> its rank: where rank 0's capture (in rank order) puts it
        segments = [replace(s, index=pos[s.index]) for s in ing.builder.segments()]
        errors = [(ranks[i], line) for i, line in zip(ing.error_index, ing.errors, strict=True)]
        kept = pick_drill(segments, DRILL_PER_NODE if drill is None else drill)
        ing.release()
        seg = merge_segments(segments, canonical=True) if segments else None
        return encode_node_block(step=step, world_size=world_size, leader=leader, ranks=node, missing=missing,
                                 errors=errors, segment=seg, drill={r: blobs[r] for r in kept})
    except Exception as exc:    # a bug here must cost this node's diagnosis, never the job
        why = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:500]
        return encode_node_block(step=step, world_size=world_size, leader=leader, ranks=node, missing=missing,
                                 errors=[], segment=None, drill={}, failure=why)
