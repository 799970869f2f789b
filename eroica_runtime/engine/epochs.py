"""Job level: what the DataLoaders' epoch turnovers cost the job, and why.

A DataLoader without ``persistent_workers`` shuts its worker processes down at every epoch's end
and starts them anew at the next epoch's ``iter()``; the first batch then waits for a fresh worker
to import, fork and load it. Every rank does so in the same step, so no rank is slower than its
peers and no capture can name anything: the job is simply slower at every epoch's start. A 4-rank
job with 2 workers a rank and 30-step epochs on 2 cores (2026-12-05) spent ~130 ms a rank at every
epoch's start against an ~18 ms step, a sixth of its time (4.8-5.5 s with persistent_workers=True,
6.2-6.3 s without), and eroica said nothing of it. The step clock counts the turnovers
(``stepclock.Turnovers``: ``iter()``, each iteration's first and last ``next()``); at job end each
rank sends what they took, and this says, when they cost the job a share of its step time worth a
line, how much and what to change. Pure: no MPI, no torch.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eroica_runtime.engine.model import read_count, read_ms

MIN_TURNOVERS = 2   # one epoch's start is the job's start-up, not a rhythm
MIN_SHARE = 0.02    # of a rank's step time: less than this is no line ...
# ... and for a loader whose workers persist (or that has none) this: its epochs' first batch waits for
# the pipeline to fill, which no setting removes (the 30-step epochs above with persistent_workers=True:
# 15-21 ms a start, 3-4% of the step time), so only a start that costs the job more is worth a line
MIN_SHARE_FILL = 0.05
SLOW_RATIO = 2.0    # a rank whose epoch starts took this many times the median rank's ...
SLOW_MS = 50.0      # ... and this much longer each names that rank: the others waited for it


@dataclass(frozen=True)
class EpochStarts:
    """The epoch turnovers of a job's DataLoaders, over its ranks: ``per_start_ms`` is the time a
    rank's epoch start took beyond an ordinary batch's wait (the lowest and highest rank);
    ``total_ms`` and ``share`` are the slowest rank's over the job and of its step time: every rank
    waits for it in the next collective, so that is what the job lost."""

    ranks: int
    turnovers: int
    per_start_ms: tuple[float, float]
    total_ms: float
    share: float
    restarts: int = 0                 # starts of worker processes anew (persistent_workers=False)
    workers: int = 0                  # the most worker processes one restart started
    slowest_rank: int | None = None   # the rank the others waited for at each epoch's start
    slowest_host: str | None = None
    slowest_ms: float = 0.0
    datasets: int = 1                 # datasets iterated (a training and a validation loop: 2)

    def to_json(self) -> dict[str, Any]:
        return {"ranks": self.ranks, "turnovers": self.turnovers,
                "per_start_ms": [round(self.per_start_ms[0], 3), round(self.per_start_ms[1], 3)],
                "total_ms": round(self.total_ms, 3), "share": round(self.share, 5), "restarts": self.restarts,
                "workers": self.workers, "slowest_rank": self.slowest_rank, "slowest_host": self.slowest_host,
                "slowest_ms": round(self.slowest_ms, 3), "datasets": self.datasets}

    @classmethod
    def from_json(cls, doc: Any) -> EpochStarts | None:
        """Back from ``to_json`` (report.json's job.epoch_starts); None for anything else."""
        try:
            span = doc["per_start_ms"]
            rank, host = doc.get("slowest_rank"), doc.get("slowest_host")
            out = cls(ranks=read_count(doc["ranks"]), turnovers=read_count(doc["turnovers"]),
                      per_start_ms=(read_ms(span[0]), read_ms(span[1])), total_ms=read_ms(doc["total_ms"]),
                      share=read_ms(doc["share"]), restarts=read_count(doc.get("restarts", 0)),
                      workers=read_count(doc.get("workers", 0)),
                      slowest_rank=rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
                      slowest_host=host if isinstance(host, str) else None, slowest_ms=read_ms(doc.get("slowest_ms", 0.0)),
                      datasets=max(1, read_count(doc.get("datasets", 1))))
        except (KeyError, TypeError, ValueError, IndexError):
            return None
        return out


def _excess(loader: Any, total_ms: Any) -> tuple[int, float, float] | None:
    """(turnovers, ms a start beyond an ordinary batch's wait, share of the rank's step time) from one
    rank's job-end map (``stepclock.Turnovers.to_json``), None when it holds no usable numbers."""
    try:
        n, ms = read_count(loader["turnovers"]), read_ms(loader["turnover_ms"])
        batches, data, total = read_count(loader["batches"]), read_ms(loader["data_ms"]), read_ms(total_ms)
    except (KeyError, TypeError, ValueError):
        return None
    if n < MIN_TURNOVERS or total <= 0:
        return None
    # an ordinary batch's wait: the rest of the rank's batch wait over the rest of its next() calls
    # (each iteration's first and last are the turnover's); each start would have waited that anyway
    ordinary = max(0.0, data - ms) / max(1, batches - 2 * n)
    per_start = max(0.0, ms / n - ordinary)
    return n, per_start, per_start * n / total


def epoch_starts(per_rank: Mapping[int, Mapping[str, Any]]) -> EpochStarts | None:
    """What the epoch turnovers cost, from every rank's job-end statistics (their ``loader`` maps and
    ``total_ms``); None when no rank began MIN_TURNOVERS epochs or they cost under MIN_SHARE
    (MIN_SHARE_FILL for a loader that does not restart its workers)."""
    seen: dict[int, tuple[int, float, float]] = {}
    restarts = workers = 0
    datasets = 1
    for rank, stats in per_rank.items():
        loader = stats.get("loader") if isinstance(stats, Mapping) else None
        got = _excess(loader, stats.get("total_ms")) if isinstance(loader, Mapping) else None
        if got is None:
            continue
        seen[rank] = got
        try:
            restarts, workers = max(restarts, read_count(loader.get("restarts", 0))), max(workers, read_count(loader.get("workers", 0)))
            datasets = max(datasets, read_count(loader.get("datasets", 1)))
        except ValueError:
            pass
    if not seen:
        return None
    top = max(seen, key=lambda r: seen[r][1])   # the rank the others waited for at each start
    n, each, share = seen[top]
    if share < (MIN_SHARE if restarts >= MIN_TURNOVERS else MIN_SHARE_FILL):
        return None
    per_start = sorted(p for _, p, _ in seen.values())
    middle = statistics.median(per_start)
    slow = len(seen) > 1 and each >= SLOW_RATIO * middle and each - middle >= SLOW_MS
    host = per_rank[top].get("host") if slow else None
    return EpochStarts(ranks=len(seen), turnovers=max(m for m, _, _ in seen.values()),
                     per_start_ms=(per_start[0], per_start[-1]), total_ms=n * each, share=share,
                     restarts=restarts, workers=workers, slowest_rank=top if slow else None,
                     slowest_host=host if isinstance(host, str) else None, slowest_ms=each if slow else 0.0,
                     datasets=datasets)


def format_epoch_starts(t: EpochStarts) -> str:
    """The job summary's line (indented like its others)."""
    lo, hi = t.per_start_ms
    each = f"{lo:.0f} ms" if f"{lo:.0f}" == f"{hi:.0f}" else f"{lo:.0f}-{hi:.0f} ms"
    total = f"{t.total_ms:.0f} ms" if t.total_ms < 1000 else f"{t.total_ms / 1e3:.1f} s"
    # a validation pass after each epoch begins an iteration too: passes over each dataset, not epochs
    starts = f"{t.turnovers} epochs" if t.datasets <= 1 else f"{t.turnovers} passes over {t.datasets} datasets"
    line = (f"  epoch starts: each held the ranks {each} waiting for their DataLoader ({starts}: "
            f"{total}, {100 * t.share:.0f}% of the job's step time)")
    if t.slowest_rank is not None:
        where = f" ({t.slowest_host})" if t.slowest_host else ""
        line += f"; rank {t.slowest_rank}{where} took longest, {t.slowest_ms:.0f} ms a start, and the others waited for it"
    if t.restarts >= MIN_TURNOVERS:
        workers = f"its {t.workers} worker processes" if t.workers > 1 else "its worker process"
        return line + f": {workers} start anew at every epoch; persistent_workers=True keeps them"
    return line + (": the first batch of each epoch waits for the pipeline to fill (the sampler, the dataset's "
                   "start, the workers' prefetch)")
