"""Node blocks and the capture file that holds them (``eroica.capture/2``).

A node block is what a node leader forwards instead of its node's raw summaries (engine/leader.py
builds it): the node's rows as one TableBuilder segment (engine/blockcodec.py), the node's ranks it
speaks for (those it received, and those it waited for in vain), the one-line errors of the
summaries it rejected (the very lines rank 0 would have printed, with the rank each belongs to, so
rank 0 keeps its capture order), and the raw bytes of a few of the node's ranks for the report's
drill-down (``pick_drill``). Rank 0 writes the blocks as they came into ``captures/<step>.msgpack``
(``encode_capture``) before anything is analysed; ``ingest.read_capture`` reads both that and the
old raw layout (``eroica.capture/1``) through the same Pipeline. Pure: no MPI, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from eroica_runtime.engine.blockcodec import BlockError, Part, pack_segment, parse_segment, seal, unseal
from eroica_runtime.engine.table import OWN_IDX, PHASE_INDEX, FnKey, Segment
from eroica_runtime.summary.schema import MAX_SUMMARY_BYTES

CAPTURE_SCHEMA_V2 = "eroica.capture/2"
DRILL_PER_NODE = 2          # raw summaries a leader forwards for the drill-down, at most
# ... and only of ranks this far from their node's median, as a share of the node's median step: the
# engine's own bar for naming a rank is 10% of its peers' step (20% in groups under 8)
DRILL_MIN_EXCESS = 0.1
DRILL_MIN_MS = 1.0          # ... and at least this many ms per step from it


@dataclass
class NodeBlock:
    """One node's block, its structure checked (its numbers are checked with every other block's,
    blockcodec.check_parts)."""

    leader: int
    ranks: list[int]                       # every rank the block speaks for (received + missing), sorted
    missing: list[int]                     # node ranks the leader never heard from
    errors: list[tuple[int, str]]          # (rank, one-line error) of each summary the leader rejected
    part: Part | None                      # the node's rows (None: no rows)
    drill: dict[int, bytes] = field(default_factory=dict)
    failure: str = ""                      # the leader could not build its block: why (ranks then missing)


def encode_node_block(*, step: int, world_size: int, leader: int, ranks: list[int], missing: list[int],
                      errors: list[tuple[int, str]], segment: Segment | None, drill: dict[int, bytes],
                      failure: str = "") -> bytes:
    """A node leader's block as bytes (see the module docstring); ``segment``: the node's rows as
    one segment (``table.merge_segments(..., canonical=True)``), None when it has none."""
    body = {"step": int(step), "world_size": int(world_size), "leader": int(leader),
            "ranks": sorted(int(r) for r in ranks), "missing": sorted(int(r) for r in missing),
            "errors": [[int(r), str(e)] for r, e in errors],
            "seg": pack_segment(segment) if segment is not None and segment.m else None,
            "drill": {int(r): bytes(b) for r, b in drill.items()}, "failure": str(failure)}
    return seal(body)


def _int_list(who: str, what: str, x: Any, world: int) -> list[int]:
    if not isinstance(x, list) or not all(isinstance(r, int) and not isinstance(r, bool) and 0 <= r < world
                                          for r in x):
        raise BlockError(f"{who}: {what} must be a list of ranks below world_size {world}")
    if len(set(x)) != len(x):
        raise BlockError(f"{who}: {what} names a rank twice")
    return [int(r) for r in x]


def decode_node_block(data: Any, *, leader: int, step: int, world_size: int,
                      known: dict[bytes, tuple[tuple[FnKey, ...], bool]] | None = None) -> NodeBlock:
    """A node block from the bytes leader ``leader`` sent for capture ``step``; BlockError (one line
    naming the leader) when it is damaged, of another version, of another capture or job (foreign),
    or its structure is wrong. The caller checks that no two blocks speak for one rank, and the
    rows' values with every block's at once (blockcodec.check_parts: rows only of ranks the block
    received and accepted, each once). ``known``: function lists already checked."""
    who = f"block from node leader rank {leader}"
    doc = unseal(who, data)
    if doc.get("leader") != leader:
        raise BlockError(f"{who}: it says it comes from rank {doc.get('leader')!r} (foreign or misrouted)")
    if doc.get("step") != step or doc.get("world_size") != world_size:
        raise BlockError(f"{who}: it is for step {doc.get('step')!r} of a {doc.get('world_size')!r}-rank job, "
                         f"not step {step} of this {world_size}-rank job (foreign)")
    ranks = _int_list(who, "ranks", doc.get("ranks"), world_size)
    missing = _int_list(who, "missing", doc.get("missing"), world_size)
    if leader not in ranks or not set(missing) <= set(ranks):
        raise BlockError(f"{who}: its ranks must include the leader and every rank it calls missing")
    failure = doc.get("failure")
    if not isinstance(failure, str) or len(failure) > 1000:
        raise BlockError(f"{who}: failure must be a short string")
    raw_err = doc.get("errors")
    if not isinstance(raw_err, list):
        raise BlockError(f"{who}: errors must be a list of [rank, line]")
    errors: list[tuple[int, str]] = []
    have = set(ranks) - set(missing)
    for item in raw_err:
        if (not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], int)
                or isinstance(item[0], bool) or item[0] not in have
                or not isinstance(item[1], str) or len(item[1]) > 4000 or "\n" in item[1]):
            raise BlockError(f"{who}: errors must be [rank, one line] of ranks it received")
        errors.append((item[0], item[1]))
    rejected = {r for r, _ in errors}
    part = None
    if doc.get("seg") is not None:
        part = parse_segment(who, doc["seg"], world_size, sorted(have - rejected), known)
    drill_doc = doc.get("drill")
    if not isinstance(drill_doc, dict) or not all(
            isinstance(r, int) and r in have and isinstance(b, bytes) and len(b) <= MAX_SUMMARY_BYTES
            for r, b in drill_doc.items()):
        raise BlockError(f"{who}: drill must map ranks it received to summary bytes")
    if failure and (part is not None or errors):
        raise BlockError(f"{who}: a failed block carries no rows")
    return NodeBlock(leader, sorted(ranks), sorted(missing), errors, part, dict(drill_doc), failure)


def pick_drill(segments: list[Segment], limit: int = DRILL_PER_NODE) -> list[int]:
    """The node's ranks whose raw summaries go to rank 0 for the drill-down: at most ``limit``, the
    most deviant from their node mates' median in own work, step, data or comm (comm either way: a
    culprit waits less than its node mates, a rank on a slow link more), and only those at least
    DRILL_MIN_EXCESS of the node's median step and DRILL_MIN_MS away from it, so a healthy node
    forwards none (a wait's ~40% wobble between healthy ranks is ~7% of their step; measured on
    synthetic jobs, tests/test_blocks.py).

    Node mates of different pipeline stages (their recorded pp groups: ``Segment.stage``) differ by
    design, so a rank is compared with the node mates of its own stage only; a node with one rank of
    a stage has nothing to compare it with and forwards none of it. Without that, every node mixing
    a light and a heavy stage forwarded two raw summaries in every capture (2 x 11.4 kB a node, up to
    285 MB at 100,000 ranks).

    What this guarantees: a rank whose own work, step, data or comm time is >= 10% of its node's
    median step (and >= 1 ms) away from the median of its node mates of the same stage (of >= 3
    ranks; of 2, their mean) and is among its node's two most deviant has its raw summary in the
    capture, so the usual finding (one slow rank among alike node mates, named by the engine only
    above a similar bar) has its culprit's drill-down. What it does not: a rank that looks like its
    node mates (a whole slow host, a one-rank node or stage, a fault below the bar) may be named by a
    finding and have no raw summary; rank 0 then has its columns (the diagnosis is complete) but no
    drill-down. Why not more: rank 0's bytes are the point of reducing (one raw summary a node is
    ~140 MB at 100,000 ranks), and asking again after the diagnosis would need an MPI round from
    the analyst thread, which must not touch MPI."""
    good = [(s.rank[s.badp < 0], s.phases[s.badp < 0], np.asarray(s.stage)[s.badp < 0]) for s in segments]
    ranks = np.concatenate([g[0] for g in good]) if good else np.zeros(0, dtype=np.int64)
    if len(ranks) < 2 or limit <= 0:
        return []
    ph = np.concatenate([g[1] for g in good])
    stage = np.concatenate([g[2] for g in good]).astype(np.int64)
    cols = {"own": ph[:, OWN_IDX].sum(axis=1), "step": ph[:, PHASE_INDEX["step"]],
            "data": ph[:, PHASE_INDEX["data"]], "comm": ph[:, PHASE_INDEX["comm"]]}
    score = np.zeros(len(ranks))
    step = max(float(np.median(cols["step"])), 1e-9)
    for st in np.unique(stage).tolist():
        mates = np.flatnonzero(stage == st)
        if len(mates) < 2:
            continue
        for name, v in cols.items():
            med = float(np.median(v[mates]))
            diff = np.abs(v[mates] - med) if name == "comm" else v[mates] - med
            rel = diff / step
            ok = (diff >= DRILL_MIN_MS) & (rel >= DRILL_MIN_EXCESS)
            score[mates] = np.maximum(score[mates], np.where(ok & np.isfinite(rel), rel, 0.0))
    order = np.argsort(-score, kind="stable")
    return [int(ranks[i]) for i in order[:limit] if score[i] > 0]


def encode_capture(*, step: int, trigger: str, world_size: int, blocks: dict[int, bytes], missing: list[int],
                   extra: dict[str, Any] | None = None) -> bytes:
    """Rank 0's capture file with reduction on: each node leader's block as it came (bytes, keyed by
    the leader's world rank) and the leaders that sent none (``missing``; their node mates are
    unknown to rank 0 and count as missing when the file is read)."""
    leaders = sorted(blocks)
    doc: dict[str, Any] = {"schema": CAPTURE_SCHEMA_V2, "step": int(step), "trigger": str(trigger),
                           "world_size": int(world_size), "missing": sorted(int(r) for r in missing),
                           "leaders": leaders, "blocks": [blocks[r] for r in leaders]}
    if extra:
        doc["extra"] = extra
    return msgpack.packb(doc, use_bin_type=True)
