"""Job-end statistics on their way to rank 0: what a node leader forwards, and what rank 0 reads.

Each rank sends one msgpack map: its step statistics, its longest steps
(``engine.longsteps.to_send``) and its last steps' busy time (``engine.imbalance.to_send``). A node
leader forwards its node's statistics as they came, less the longest steps, which it reduces to one
record a step (``longsteps.reduce_records``), and the last steps, reduced to one sum and busiest
rank a step (``imbalance.reduce_ranks``); rank 0 merges the leaders' reductions (``longsteps.merge_seen``,
``imbalance.merge``). Why not every rank's records: an evaluation
every rank works through puts a stack in each of a rank's 8 records, ~9.4 kB a rank: 947 MB into
rank 0 at 100,000 ranks and 10.6-11.0 s of its time; reduced, 31 MB and 2.0-2.1 s, the records
~1.5 kB a node (docs/benchmarks.md §12). Pure: msgpack only; the side channel moves the bytes
(``gather.gather_job_end``), and nothing here is ever unpickled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import msgpack

from eroica_runtime.engine import imbalance, longsteps

SCHEMA = "eroica.jobend/1"


@dataclass(frozen=True)
class JobEnd:
    """What rank 0 got at job end."""

    per_rank: dict[int, dict[str, Any]]            # each reporting rank's statistics, less its records
    seen: dict[int, longsteps.StepSeen]            # the job's longest steps, one record a step
    busy: imbalance.BusySteps | None = None        # the ranks' last steps, one reduction a step
    unreadable: list[int] = field(default_factory=list)   # ranks (or leaders) whose bytes were no statistics


def is_statistics(doc: Any) -> bool:
    """A rank's job-end map as ``analyst.job_stats`` reads it: its rank, host, step count and median
    (None when it ran no step after warm-up). One without them failed the whole job-end report
    (a KeyError in job_stats), not just that rank's line."""
    def count(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)

    median = doc.get("median_ms") if isinstance(doc, dict) else None
    return (isinstance(doc, dict) and count(doc.get("steps")) and count(doc.get("rank"))
            and isinstance(doc.get("host"), str)
            and (median is None or (isinstance(median, (int, float)) and not isinstance(median, bool)
                                    and math.isfinite(median))))


def node_payload(blobs: dict[int, bytes], missing: list[int]) -> bytes:
    """A node leader's forward: its ranks' statistics and their longest steps reduced (never raises).
    ``missing`` (ranks of the node that sent nothing in time) is not forwarded: rank 0 counts the
    ranks that reported."""
    ranks: dict[int, dict[str, Any]] = {}
    records: dict[int, Any] = {}
    busy: dict[int, Any] = {}
    unreadable: list[int] = []
    for r, raw in blobs.items():
        try:
            doc = msgpack.unpackb(raw, raw=False)
        except Exception:
            doc = None
        if not is_statistics(doc):
            unreadable.append(int(r))
            continue
        records[int(r)] = doc.pop("long_steps", None)
        busy[int(r)] = doc.pop("busy_steps", None)
        ranks[int(r)] = doc
    try:
        seen = [s.to_wire() for s in longsteps.reduce_records(records).values()]
    except Exception:   # a malformed record: the statistics still go
        seen = []
    try:
        reduced = imbalance.reduce_ranks({r: b for r, b in busy.items() if isinstance(b, dict)})
    except Exception:
        reduced = None
    return msgpack.packb({"schema": SCHEMA, "ranks": ranks, "seen": seen, "unreadable": unreadable,
                          **({"busy": reduced.to_wire()} if reduced is not None else {})}, use_bin_type=True)


def read(payloads: dict[int, bytes]) -> JobEnd:
    """Rank 0: the leaders' payloads (``{leader world rank: bytes}``) as one JobEnd."""
    per_rank: dict[int, dict[str, Any]] = {}
    parts: list[dict[int, longsteps.StepSeen]] = []
    busy: list[imbalance.BusySteps] = []
    unreadable: list[int] = []
    for leader, raw in payloads.items():
        try:
            doc = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        except Exception:
            doc = None
        if not (isinstance(doc, dict) and doc.get("schema") == SCHEMA and isinstance(doc.get("ranks"), dict)):
            unreadable.append(int(leader))
            continue
        per_rank.update({r: d for r, d in doc["ranks"].items() if isinstance(r, int) and is_statistics(d)})
        unreadable += [r for r in doc.get("unreadable") or [] if isinstance(r, int)]
        wire = doc.get("seen") if isinstance(doc.get("seen"), list) else []
        seen = [longsteps.StepSeen.from_wire(s) for s in wire]
        parts.append({s.step: s for s in seen if s is not None})
        node = imbalance.BusySteps.from_wire(doc.get("busy")) if doc.get("busy") is not None else None
        if node is not None:
            busy.append(node)
    return JobEnd(per_rank=per_rank, seen=longsteps.merge_seen(parts), unreadable=sorted(unreadable),
                  busy=imbalance.merge(busy))
