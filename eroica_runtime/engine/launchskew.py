"""Job level: ranks whose processes started late, which every other rank waited for before its first step.

The ranks of a job wait for each other before any of them trains: MPI_Init (eroica's side channel),
init_process_group's rendezvous, DDP's first broadcast. A rank whose process starts late (its node's
prolog or container image pull ran long, the launcher's own skew) holds all of them, and nothing
after it shows it: every rank's start looks alike, since the others' wait sits in MPI_Init before
their code runs. A 3-rank job whose rank 2 was launched 10 s after the others (2026-12-07: a wrapper
that slept before exec-ing python) read "healthy" with nothing of the 10 s. Each rank sends when its
runtime started (wall clock, at the interpreter's start: sitecustomize); rank 0 says which ranks
began LATE_S or more after the first, and on which hosts. Pure: no MPI, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

LATE_S = 5.0   # a rank starting this many seconds after the first is late (wall clocks of hosts differ by ms)
SHOWN = 3      # the latest ranks listed by name


@dataclass(frozen=True)
class LaunchSkew:
    """The job's late starters: ``late`` (rank, host, seconds after the first rank began), latest first,
    at most SHOWN; ``late_count`` of ``ranks`` compared; ``hosts``: the late ranks' hosts (at most SHOWN)."""

    spread_s: float
    late: tuple[tuple[int, str | None, float], ...]
    late_count: int
    ranks: int
    hosts: tuple[str, ...] = ()
    hosts_count: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"spread_s": round(self.spread_s, 3), "late": [[r, h, round(s, 3)] for r, h, s in self.late],
                "late_count": self.late_count, "ranks": self.ranks, "hosts": list(self.hosts),
                "hosts_count": self.hosts_count}

    @classmethod
    def from_json(cls, doc: Any) -> LaunchSkew | None:
        """Back from ``to_json`` (report.json's job.launch); None for anything else."""
        if not isinstance(doc, Mapping):
            return None
        try:
            late = tuple((int(r), h if isinstance(h, str) else None, float(s)) for r, h, s in doc["late"])
            return cls(spread_s=float(doc["spread_s"]), late=late, late_count=int(doc["late_count"]),
                       ranks=int(doc["ranks"]), hosts=tuple(str(h) for h in doc.get("hosts") or ()),
                       hosts_count=int(doc.get("hosts_count") or 0))
        except (KeyError, TypeError, ValueError):
            return None


def launch_skew(per_rank: Mapping[int, Mapping[str, Any]]) -> LaunchSkew | None:
    """The ranks that began LATE_S or more after the first (``started_s`` of each rank's job-end map),
    or None (fewer than 2 ranks sent it, or none was late)."""
    starts = {}
    for r, d in per_rank.items():
        s = d.get("started_s") if isinstance(d, Mapping) else None
        if isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s):
            starts[int(r)] = float(s)
    if len(starts) < 2:
        return None
    first = min(starts.values())
    late = sorted(((r, s - first) for r, s in starts.items() if s - first >= LATE_S), key=lambda x: (-x[1], x[0]))
    if not late:
        return None

    def host(r: int) -> str | None:
        h = per_rank[r].get("host")
        return h if isinstance(h, str) else None

    hosts = sorted({h for r, _ in late if (h := host(r)) is not None})
    return LaunchSkew(spread_s=late[0][1], late=tuple((r, host(r), s) for r, s in late[:SHOWN]),
                      late_count=len(late), ranks=len(starts), hosts=tuple(hosts[:SHOWN]), hosts_count=len(hosts))


def _s(x: float) -> str:
    return f"{x:.1f} s" if x < 120 else f"{x / 60:.1f} min"


def format_launch_skew(k: LaunchSkew) -> str:
    """The job summary's line."""
    names = ", ".join(f"rank {r}" + (f" ({h})" if h else "") + f" {_s(s)}" for r, h, s in k.late)
    more = f" and {k.late_count - len(k.late)} more" if k.late_count > len(k.late) else ""
    on = ""
    if k.hosts_count == 1 and k.late_count > 1:
        on = f", all on {k.hosts[0]}"
    elif k.hosts_count > 1:
        on = f", on {k.hosts_count} hosts"
    if k.late_count > 1:
        who, them, its = (f"{k.late_count} of {k.ranks} ranks began {LATE_S:.0f} s or more after the first "
                          f"({names}{more}{on})"), "them", "their processes were"
    else:
        r, h, s = k.late[0]
        who, them, its = (f"rank {r}{f' ({h})' if h else ''} began {_s(s)} after the first of the {k.ranks} ranks",
                          "it", "its process was")
    return (f"  start: {who}; every other rank waited for {them} before its first step (MPI_Init, "
            f"init_process_group): {its} launched late (a node's prolog, a container image pull, the launcher)")
