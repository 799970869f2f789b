"""Which traces make one job, and which steps become captures (the checks of `eroica analyze --traces`).

Why apart from the reading and building: these are the decisions a user must be able to predict
and that must fail early, before minutes of reading: two traces of one rank's same steps, a missing
rank, traces of different jobs (world size, backend, NCCL version, process groups, no common step),
steps a trace does not hold. Each refusal is a TraceError, one line naming the file.

A rank may have several traces: torch's own recipe, ``schedule(wait, warmup, active, repeat)`` with
``tensorboard_trace_handler``, writes one file per profiling cycle (``host_pid.<ns>.pt.trace.json``,
the rank in distributedInfo). Their steps do not overlap; each cycle becomes a capture, built from
the one file of each rank that holds its steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eroica_launch.tracefile import TraceError, TraceFile

TRIGGER = "traces"
TRACE_SUFFIXES = (".json", ".json.gz")
_LONE = ("one trace: eroica compares ranks that should behave alike, so one rank alone is not diagnosed; its "
         "summary is still written to captures/")


@dataclass(frozen=True)
class Window:
    """One capture to build from the traces: these ProfilerStep numbers, under this trigger."""

    steps: tuple[int, ...]
    trigger: str

    @property
    def first(self) -> int:
        return self.steps[0]


def parse_range(text: str) -> tuple[int, int]:
    """"100-103" -> (100, 103); "7" -> (7, 7). TraceError with the reason otherwise."""
    lo, sep, hi = text.strip().partition("-")
    if not lo.isdigit() or (sep and not hi.isdigit()):
        raise TraceError(f"--steps {text!r}: expected FIRST-LAST or one step number, e.g. 100-103")
    a, b = int(lo), int(hi) if sep else int(lo)
    if b < a:
        raise TraceError(f"--steps {text!r}: the last step is before the first")
    return a, b


def trace_paths(paths: Sequence[Path]) -> list[Path]:
    """Files as given; a directory stands for its *.json and *.json.gz files (not recursive)."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            found = sorted(q for q in p.iterdir() if q.name.endswith(TRACE_SUFFIXES) and q.is_file())
            if not found:
                raise TraceError(f"{p}: no *.json or *.json.gz trace in this directory")
            out.extend(found)
        else:
            out.append(p)
    if not out:
        raise TraceError("no trace files given")
    return out


def _pg_key(pg: Any) -> tuple[str, str, Any]:
    return (str(pg.get("pg_desc", "")), str(pg.get("backend_config", "")), pg.get("pg_size"))


def rank_groups(traces: Sequence[TraceFile]) -> list[list[TraceFile]]:
    """Each rank's traces in step order (one, or one per profiling cycle), ranks in order. A trace
    whose rank is unknown is a group of its own (``check_job`` refuses it; tools may pass one alone)."""
    groups: dict[tuple[int, int], list[TraceFile]] = {}
    for i, t in enumerate(traces):
        groups.setdefault((0, t.rank) if t.rank is not None else (1, i), []).append(t)
    for files in groups.values():
        files.sort(key=lambda t: (t.steps[:1], t.name))
    return [groups[k] for k in sorted(groups)]


def check_job(traces: list[TraceFile]) -> tuple[int, int, str | None]:
    """Refuse traces that cannot be one job's ranks; return (the job's world size, the world the
    captures describe, a note for the user or None).

    Ranks come from distributedInfo, else the file name. A rank's several traces are its profiling
    cycles and must hold different steps (the same step twice is the same trace twice); different
    world sizes, backends, NCCL versions or process-group configs are different jobs. Without any
    distributedInfo the files are the whole job, so ranks 0..n-1 must all be there. With it, fewer
    ranks than the world size are a sample of the job, analysed as a job of its own (the note says so);
    a lone rank keeps the job's world, so that its capture reads "not diagnosed", never "healthy". One
    trace with no rank at all was made rank 0 by ``plan`` (``rank_from`` "taken"); several must all have
    ranks.
    """
    first = traces[0]
    taken = (" (no rank in it, no distributedInfo and none in its file name: taken as rank 0)"
             if first.rank_from == "taken" else "")
    unknown = next((t for t in traces if t.rank is None), None)
    if unknown is not None:
        raise TraceError(f"{unknown.path}: cannot tell which rank this trace is from: no distributedInfo.rank "
                         "in it and no rank in its file name (name it like trace-rank3.json)")
    ranked = rank_groups(traces)
    for files in ranked:
        seen: dict[int, TraceFile] = {}
        for t in files:
            again = next((seen[n] for n in t.steps if n in seen), None)
            if again is not None:
                raise TraceError(f"{t.path}: rank {t.rank} twice: this trace and {again.path} "
                                 f"(rank from {t.rank_from} and {again.rank_from}) hold the same steps")
            seen.update((n, t) for n in t.steps)
    with_info = [t for t in traces if t.dist]
    ref = with_info[0] if with_info else first
    pgs: dict[str, tuple[tuple[str, str, Any], TraceFile]] = {}
    for t in with_info:
        for field in ("world_size", "backend", "nccl_version"):
            if field in t.dist and field in ref.dist and t.dist[field] != ref.dist[field]:
                raise TraceError(f"{t.path}: {field} {t.dist[field]!r} but {ref.path} says {ref.dist[field]!r}: "
                                 "traces from different jobs")
        for pg in t.dist.get("pg_config") or []:
            if not isinstance(pg, dict) or "pg_name" not in pg:
                continue
            key, seen = _pg_key(pg), pgs.get(str(pg["pg_name"]))
            if seen is not None and seen[0] != key:
                raise TraceError(f"{t.path}: process group {pg['pg_name']!r} is {key} but {seen[1].path} has "
                                 f"{seen[0]}: traces from different jobs")
            pgs.setdefault(str(pg["pg_name"]), (key, t))
    world = ref.world_size if with_info and ref.world_size else None
    ranks, n = [int(files[0].rank or 0) for files in ranked], len(ranked)
    if world is None:
        if n == 1 and ranks[0] > 0:
            # one rank's trace whose job size was not recorded (distributedInfo without world_size, or a
            # rank in the file name): a lone rank of a job of at least rank + 1, never "healthy" alone
            return ranks[0] + 1, ranks[0] + 1, (f"{_LONE} (the job's world size is not in the trace: "
                                                f"taken as {ranks[0] + 1}, the least its rank {ranks[0]} allows)")
        missing = sorted(set(range(n)) - set(ranks))
        if missing:
            sources = " and ".join(sorted({t.rank_from for t in traces if t.rank_from})) or "file name"
            raise TraceError(f"no trace for rank {missing[0]}: the traces of {n} ranks (ranks from their "
                             f"{sources}: {_ranks(ranks)}), with no world size recorded in them, must be "
                             f"ranks 0..{n - 1}")
        return n, n, (_LONE + taken if n == 1 else None)
    outside = [t for t in traces if t.rank is not None and t.rank >= world]
    if outside:
        raise TraceError(f"{outside[0].path}: rank {outside[0].rank} is outside the job's world size {world}")
    if n == 1 and world > 1:
        return world, world, _LONE
    if n < world:
        return world, n, (f"{n} of the job's {world} ranks have traces ({_ranks(ranks)}): "
                          "they are analysed as a job of their own; culprits and victims are named "
                          "among them only")
    return world, world, None


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks[:8])) + (f", … ({len(ranks)} in all)" if len(ranks) > 8 else "")


def choose_windows(traces: list[TraceFile], ranges: Sequence[tuple[int, int]],
                   baseline: tuple[int, int] | None) -> list[Window]:
    """The captures to build: one per --steps range (and the baseline range), every step in one trace
    of every rank; by default one capture per profiling cycle over the steps all ranks share, less the
    first and the last when at least four remain (a trace's edge steps hold the profiler's start-up,
    set-up or teardown)."""
    if not any(t.steps for t in traces):
        raise TraceError(f"{traces[0].path}: no ProfilerStep#N annotations (profile with a schedule, e.g. "
                         "torch.profiler.schedule(...), and call prof.step() every training step)")
    for t in traces:
        if not t.steps:
            raise TraceError(f"{t.path}: no ProfilerStep#N annotations, unlike {traces[0].path}")
    ranked = rank_groups(traces)
    holder = [{n: t for t in files for n in t.steps} for files in ranked]   # per rank: step -> its trace
    common = set(holder[0])
    for files, steps in zip(ranked[1:], holder[1:], strict=True):
        if not common & set(steps):
            raise TraceError(f"{files[0].path}: no step in common with {ranked[0][0].path} (steps "
                             f"{_span(sorted(steps))} vs {_span(sorted(common))}): traces from different jobs "
                             "or different profiling windows")
        common &= set(steps)
    wanted = [(r, TRIGGER) for r in ranges] + ([(baseline, "baseline")] if baseline else [])
    if not wanted:
        cycles: dict[tuple[int, ...], list[int]] = {}     # the same file on every rank: one cycle
        for n in sorted(common):
            cycles.setdefault(tuple(id(steps[n]) for steps in holder), []).append(n)
        # four or more steps left once the edges go: drop them
        return [Window(tuple(c[1:-1] if len(c) >= 6 else c), TRIGGER) for c in cycles.values()]
    windows: list[Window] = []
    taken: dict[int, tuple[int, int]] = {}
    for (a, b), trigger in wanted:
        for n in range(a, b + 1):
            if n in taken:
                raise TraceError(f"step {n} is in two step ranges ({taken[n][0]}-{taken[n][1]} and {a}-{b}); "
                                 "captures must not overlap")
            taken[n] = (a, b)
            for files, steps in zip(ranked, holder, strict=True):
                if n not in steps:
                    where = files[0].path if len(files) == 1 else f"rank {files[0].rank}'s {len(files)} traces"
                    raise TraceError(f"{where}: no ProfilerStep#{n} (its steps: {_span(sorted(steps))})")
                if steps[n] is not steps[a]:
                    raise TraceError(f"{steps[n].path}: steps {a}-{b} are split between this trace and "
                                     f"{steps[a].path} (two profiling cycles of rank {files[0].rank}); a "
                                     "capture's steps must come from one trace of each rank")
        windows.append(Window(tuple(range(a, b + 1)), trigger))
    return sorted(windows, key=lambda w: w.first)


def holds(trace: TraceFile, window: Window) -> bool:
    """Whether this trace holds the window's steps (a rank's one trace for this capture)."""
    steps = set(trace.steps)
    return all(n in steps for n in window.steps)


def _span(steps: list[int]) -> str:
    if not steps:
        return "none"
    return f"{steps[0]}-{steps[-1]}" if steps[-1] - steps[0] + 1 == len(steps) else _ranks(steps)
