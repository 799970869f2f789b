"""`eroica analyze --traces`: per-rank torch.profiler chrome traces -> capture files in a report directory.

Why: teams often already hold one trace per rank of a slow job and no tool that says which rank is
the culprit and which only waited. Each trace is boiled down by the runtime's own summary builder
(``summary.build``) into the summary that rank would have sent from a live capture of the same
steps, the summaries are written as ``captures/<step>.msgpack``, and the offline analysis
(``offline.run_analysis``, the live analyst's pipeline) diagnoses them. Nothing here diagnoses.

The order of work keeps memory to one trace at a time: first a cheap look at every file (rank, job,
step numbers) so a wrong file or a mixed-up job is refused before the expensive read; then each
trace is read, summarised for every window it holds and dropped. A rank with one trace per
profiling cycle has each capture built from the cycle's trace; a trace no capture uses is not read.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eroica_launch.tracefile import Say, TraceError, TraceFile, inspect, read
from eroica_launch.tracejob import Window, check_job, choose_windows, holds, rank_groups, trace_paths
from eroica_runtime import __version__, reportdir
from eroica_runtime import summary as summary_mod
from eroica_runtime.summary import chrome


def _groups(trace: TraceFile, world: int) -> list[dict[str, Any]]:
    """The rank's process groups from distributedInfo.pg_config (the engine's peer hints), named as the
    live runtime names them: a DeviceMesh dim's group is "mesh_<dim>" in torch, "<dim>" here. The
    default group (every rank) says nothing about peers and is left out, as the runtime leaves it."""
    out: list[dict[str, Any]] = []
    for pg in trace.dist.get("pg_config") or []:
        if not isinstance(pg, dict) or pg.get("pg_desc") in ("default_pg", None):
            continue
        ranks = pg.get("ranks")
        if isinstance(ranks, str):   # some torch versions write the list as text
            ranks = [int(x) for x in ranks.strip("[] ").replace(" ", "").split(",") if x.isdigit()]
        if not isinstance(ranks, list) or trace.rank not in ranks:
            continue
        ranks = [r for r in ranks if isinstance(r, int) and not isinstance(r, bool) and 0 <= r < world]
        name = str(pg["pg_desc"])
        out.append({"name": (name[5:] if name.startswith("mesh_") else name)[:255], "ranks": ranks})
    return out[:64]


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Python's cyclic GC would walk millions of fresh event records again and again while a big trace
    is read and summarised (a fifth of the time at 250 MB, more as traces grow); the records hold
    no cycles, so they are freed by reference counting when the trace is dropped."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def summarise(trace: TraceFile, windows: list[Window], world: int, say: Say | None = None) -> list[bytes]:
    """Read one trace and build its summary for every window (the runtime's builder), as msgpack.

    A trace without host_name gets "<its file name>" as its host: distinct per rank, so ranks of
    unknown hosts are never merged into one "slow host" finding."""
    with _gc_paused():
        return _summarise(trace, windows, world, say)


def _summarise(trace: TraceFile, windows: list[Window], world: int, say: Say | None) -> list[bytes]:
    reader = read(trace, say)
    for w in windows:
        missing = [n for n in w.steps if n not in reader.steps]
        if missing:
            raise TraceError(f"{trace.path}: no host-side ProfilerStep#{missing[0]} event")
    blobs = []
    dev = min(reader.devices) if reader.devices else None
    device = {"index": dev, "uuid": None, "name": trace.device_names.get(dev) if dev is not None else None}
    for w in windows:
        steps = list(w.steps)
        marks = [reader.steps[n] for n in steps]
        pid = marks[0].thread[0]
        ident = {"rank": trace.rank, "local_rank": 0, "world_size": world,
                 "pid": pid if isinstance(pid, int) and pid >= 0 else 0,
                 "host": trace.host or f"<{trace.name}>"[:255], "groups": _groups(trace, world), "device": device,
                 "versions": {"eroica": __version__, "source": "chrome trace"}}
        try:
            doc = summary_mod.build(chrome.select(reader, steps), identity=ident,
                                    capture={"step": w.first, "trigger": w.trigger, "k": len(steps)},
                                    steps=[{"step": n, "ms": m.end - m.start} for n, m in zip(steps, marks, strict=True)],
                                    gc=chrome.gc_pauses(reader, steps), telemetry={})
            blobs.append(summary_mod.encode(doc))
        except summary_mod.SummaryError as exc:
            raise TraceError(f"{trace.path}: steps {w.first}-{steps[-1]} give no usable summary ({exc})") from None
    return blobs


@dataclass(frozen=True)
class Plan:
    """What `eroica analyze --traces` will build: the traces, the windows and the worlds."""

    traces: list[TraceFile]
    windows: list[Window]
    world: int            # the job's world size (distributedInfo, else the number of traces)
    analysed: int         # the world the captures describe: the traced ranks
    note: str | None      # said to the user before the long read (a sample of a bigger job)
    missing: list[int]    # ranks of the captures' world without a trace (a lone trace's peers)


def plan(paths: Sequence[Path], ranges: Sequence[tuple[int, int]] = (), baseline: tuple[int, int] | None = None,
         say: Say | None = None) -> Plan:
    """The cheap first pass over every file: refuse bad files and mixed jobs, choose the windows."""
    traces = [inspect(p, say) for p in trace_paths(paths)]
    if len(traces) == 1 and traces[0].rank is None:
        # one trace, no rank anywhere in it (a single-GPU job's, or one renamed): its profile is what
        # is wanted, and with no peer its rank changes nothing
        traces[0].rank, traces[0].rank_from = 0, "taken"
    world, analysed, note = check_job(traces)
    windows = choose_windows(traces, ranges, baseline)
    ranks = {t.rank for t in traces}
    missing = [r for r in range(analysed) if r not in ranks] if analysed == world else []
    in_order = [t for files in rank_groups(traces) for t in files]     # by rank, then by cycle
    return Plan(in_order, windows, world, analysed, note, missing)


def write_captures(out: Path, job: Plan, say: Say | None = None) -> list[Path]:
    """Summarise every trace (one in memory at a time) and write one capture file per window into ``out``:
    each window's summaries come from the one trace of each rank that holds its steps."""
    per_window: list[dict[int, bytes]] = [{} for _ in job.windows]
    for t in job.traces:
        mine = [i for i, w in enumerate(job.windows) if holds(t, w)]
        if mine:
            for i, blob in zip(mine, summarise(t, [job.windows[i] for i in mine], job.world, say), strict=True):
                per_window[i][int(t.rank or 0)] = blob
    reportdir.ensure_directory(out)
    written = []
    for w, blobs in zip(job.windows, per_window, strict=True):
        ranks = sorted(blobs)
        data = summary_mod.encode_capture(step=w.first, trigger=w.trigger, world_size=job.analysed, ranks=ranks,
                                          summaries=[blobs[r] for r in ranks], missing=job.missing,
                                          extra={"source": "chrome traces", "job_world_size": job.world,
                                                 "steps": [w.first, w.steps[-1]]})
        written.append(reportdir.atomic_write(reportdir.capture_path(out, w.first), data))
    return written
