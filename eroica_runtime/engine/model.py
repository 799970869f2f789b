"""Result types of the diagnosis engine: frozen, JSON-ready, shared by the engine and the reports."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

CATEGORIES = ("compute", "communication", "dataloader", "host", "gc", "io", "transfer", "memory", "hang",
              "regression")


def _clean(value: Any) -> Any:
    """Make a value JSON-safe (numpy scalars → python, NaN/inf → None, tuples → lists)."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if all(type(v) is int for v in value):   # victims of a 100,000-rank job: no walk per element
            return list(value)
        return [_clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float):
        return round(value, 4) if math.isfinite(value) else None
    return value


@dataclass(frozen=True)
class Finding:
    """One diagnosed root cause (never a victim): who, where, what kind, how much it costs per step."""

    category: str
    rank: int | None            # None for a host/link/job-level finding
    host: str | None
    function: str | None        # the function (or phase pseudo-name) that grew most
    phase: str | None
    impact_ms_per_step: float
    what_if_step_ms: float | None   # step time if this finding were fixed
    victims: tuple[int, ...] = ()
    evidence: dict[str, Any] = field(default_factory=dict)
    action: str = ""
    title: str = ""
    captures: tuple[int, ...] = ()  # steps of the captures that showed it

    def to_json(self) -> dict[str, Any]:
        """The JSON object written into diagnosis-<step>.json and report.json."""
        return _clean({
            "title": self.title, "category": self.category, "rank": self.rank, "host": self.host,
            "function": self.function, "phase": self.phase,
            "impact_ms_per_step": float(self.impact_ms_per_step),
            "what_if_step_ms": self.what_if_step_ms, "victims": list(self.victims),
            "evidence": self.evidence, "action": self.action, "captures": list(self.captures),
        })

    @staticmethod
    def from_json(doc: dict[str, Any]) -> Finding:
        """Inverse of to_json (used by `eroica show` and consolidation of stored diagnoses)."""
        return Finding(category=str(doc.get("category", "")), rank=doc.get("rank"), host=doc.get("host"),
                       function=doc.get("function"), phase=doc.get("phase"),
                       impact_ms_per_step=float(doc.get("impact_ms_per_step") or 0.0),
                       what_if_step_ms=doc.get("what_if_step_ms"),
                       victims=tuple(doc.get("victims") or ()), evidence=dict(doc.get("evidence") or {}),
                       action=str(doc.get("action", "")), title=str(doc.get("title", "")),
                       captures=tuple(doc.get("captures") or ()))


def read_count(x: Any) -> int:
    """A whole number >= 0 read back from another rank's map or a report.json (a bool is none); raises
    ValueError otherwise, so a reader drops the whole record rather than half of it."""
    if isinstance(x, bool) or not isinstance(x, int) or x < 0:
        raise ValueError(x)
    return x


def read_ms(x: Any) -> float:
    """A finite duration >= 0 read back the same way (ValueError otherwise)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
        raise ValueError(x)
    return float(x)


def count_ranks(n: int) -> str:
    """"1 rank", "3 ranks": a culprit's victims as a title and the victims line count them (a pipeline
    stage of two data-parallel ranks has one)."""
    return f"{n} rank{'' if n == 1 else 's'}"


def in_function(function: str | None) -> str:
    """A title's " in <function>" after the category: nothing where the function only repeats the
    phase the time went to (a GC finding "in (gc)"), "between profiled ops" for host time no op
    covers ("(host_gap)"), else the op. Why: "io in (host_gap)" and "gc in (gc)" were jargon in the
    rank-0 log line a person reads first."""
    if not function:
        return ""
    if function == "(host_gap)":
        return " between profiled ops"
    if function in ("(gc)", "(data)", "(comm)", "(forward)", "(backward)", "(optimizer)"):
        return ""
    return f" in {function}"


def ranks_waiting(n: int) -> str:
    """Every finding's title's "(..., 3 ranks waiting on it)"."""
    return f"{count_ranks(n)} waiting on it"


def conclusive(ranks_analysed: int, world_size: int) -> bool:
    """See Diagnosis.conclusive (also applied to stored diagnoses, which are plain JSON)."""
    return ranks_analysed >= min(2, max(world_size, 1)) and 2 * ranks_analysed >= world_size


DIAGNOSIS_SCHEMA = "eroica.diagnosis/1"   # diagnosis-<step>.json


@dataclass(frozen=True)
class Diagnosis:
    """Everything the engine concluded about one capture (plus what it could not look at)."""

    step: int
    trigger: str
    world_size: int
    ranks_analysed: int
    findings: tuple[Finding, ...]
    missing: tuple[int, ...] = ()
    errors: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    peers: dict[str, Any] = field(default_factory=dict)     # how peers were formed, group sizes
    step_ms: dict[str, Any] = field(default_factory=dict)   # median/p99/max over ranks
    phase_table: dict[str, Any] = field(default_factory=dict)  # compact ranks × phases (for the heatmap)
    engine_s: float = 0.0

    @property
    def conclusive(self) -> bool:
        """Enough usable summaries to compare: at least two ranks (one in a one-rank job) and at least
        half of the world. Fewer, and "no finding" means "could not look", not "healthy"."""
        return conclusive(self.ranks_analysed, self.world_size)

    @property
    def healthy(self) -> bool:
        """True when nothing was found in a capture that could show something (the one-line case)."""
        return not self.findings and self.conclusive

    def to_json(self) -> dict[str, Any]:
        """The JSON document written as diagnosis-<step>.json."""
        return _clean({
            "schema": DIAGNOSIS_SCHEMA, "step": self.step, "trigger": self.trigger,
            "world_size": self.world_size, "ranks_analysed": self.ranks_analysed,
            "missing": list(self.missing), "errors": list(self.errors), "notes": list(self.notes),
            "findings": [f.to_json() for f in self.findings], "peers": self.peers,
            "step_ms": self.step_ms, "phase_table": self.phase_table, "engine_s": self.engine_s,
        })

    @staticmethod
    def from_json(doc: dict[str, Any]) -> Diagnosis:
        """Rebuild a Diagnosis from its JSON form."""
        return Diagnosis(step=int(doc.get("step", 0)), trigger=str(doc.get("trigger", "")),
                         world_size=int(doc.get("world_size", 0)),
                         ranks_analysed=int(doc.get("ranks_analysed", 0)),
                         findings=tuple(Finding.from_json(f) for f in doc.get("findings") or ()),
                         missing=tuple(doc.get("missing") or ()), errors=tuple(doc.get("errors") or ()),
                         notes=tuple(doc.get("notes") or ()), peers=dict(doc.get("peers") or {}),
                         step_ms=dict(doc.get("step_ms") or {}),
                         phase_table=dict(doc.get("phase_table") or {}),
                         engine_s=float(doc.get("engine_s") or 0.0))
