"""Offline commands of the `eroica` tool: analyze, show, synth (registered in eroica_launch/tool.py).

`eroica analyze DIR` re-runs the pure diagnosis engine over DIR/captures/*.msgpack (the capture whose
trigger is "baseline" is the job's healthy baseline), rewrites their diagnosis-*.json, report.json and
report.html, then prints the text report. What the job diagnosed without a capture file there (a
capture whose file --keep-captures removed, a hang) joins the job report as the job wrote it.
`eroica analyze --traces FILES --out DIR` first writes DIR/captures from per-rank torch.profiler
traces (eroica_launch/traces.py), then does the same. Bad input gets one line naming the file or rank
and a non-zero exit; everything that could be read is still analysed.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click

from eroica_runtime import report, reportdir, summary
from eroica_runtime.analyst import stored_job_stats_text
from eroica_runtime.engine import Diagnosis, first_named
from eroica_runtime.engine.hang import HANG_SCHEMA, HANG_TRIGGER, hang_diagnosis
from eroica_runtime.engine.ingest import CaptureBytes
from eroica_runtime.engine.model import DIAGNOSIS_SCHEMA
from eroica_runtime.pipeline import Pipeline
from eroica_runtime.reportdir import (
    MAX_CAPTURE_BYTES,
    MAX_REPORT_BYTES,
    REPORT_JSON,
    InputError,
    capture_files,
    read_capped,
    read_capture,
)


def _fail(msg: str, code: int) -> None:
    click.echo(f"eroica: {msg}", err=True)
    sys.exit(code)


def _history_steps(root: Path, fallback: int) -> int:
    hist = report.load_steps(root)
    if hist and hist["steps"]:
        return int(max(hist["steps"])) + 1
    old = _old_report(root)
    if isinstance(old.get("steps"), int) and not isinstance(old.get("steps"), bool):
        return max(old["steps"], fallback)
    return fallback


def _old_report(root: Path) -> dict[str, Any]:
    """The report.json already in ``root`` ({} when absent or unusable: it is about to be rewritten)."""
    try:
        return report.load_job(root) or {}
    except InputError:
        return {}


def _read_ahead(files: list[Path]) -> Iterator[tuple[Path, CaptureBytes | Exception]]:
    """Each capture file's bytes (or why it could not be read), in order; the next file is read in a
    thread while the caller analyses this one (at 100,000 ranks a file is ~1.1 GB, mapped rather than
    copied, reportdir.read_capture; its pages are brought in while the previous file is analysed; at
    most two files are held at once)."""
    def read(path: Path) -> CaptureBytes | Exception:
        try:
            return read_capture(path, MAX_CAPTURE_BYTES)
        except (OSError, InputError) as exc:
            return exc

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="eroica-read") as pool:
        nxt = pool.submit(read, files[0]) if files else None
        for i, path in enumerate(files):
            assert nxt is not None
            got = nxt.result()
            nxt = pool.submit(read, files[i + 1]) if i + 1 < len(files) else None
            yield path, got
            del got


def _traced_steps(meta: dict[str, Any]) -> list[list[int]]:
    """[[first, last]] of a capture written from chrome traces (its ``extra``), else []."""
    extra = meta.get("extra")
    if not isinstance(extra, dict) or extra.get("source") != "chrome traces":
        return []
    steps = extra.get("steps")
    if isinstance(steps, list) and len(steps) == 2 and all(type(n) is int for n in steps):
        return [[steps[0], steps[1]]]
    return []


def _check_stored(d: Diagnosis) -> None:
    """A stored diagnosis joins the job report's consolidation (engine.consolidate, transient.py):
    raise ValueError naming the field unless every value those read has its type (a stray or edited
    file must give a one-line rejection, not a crash halfway through the report)."""
    def ints(xs: Any, what: str) -> None:
        if not all(type(x) is int for x in xs):
            raise ValueError(f"{what} must be integers")

    if type(d.world_size) is not int or type(d.ranks_analysed) is not int:
        raise ValueError("world_size and ranks_analysed must be integers")
    ints(d.missing, "missing")
    for f in d.findings:
        if f.rank is not None and type(f.rank) is not int:
            raise ValueError("a finding's rank must be an integer or null")
        for name in ("host", "function", "phase"):
            if getattr(f, name) is not None and not isinstance(getattr(f, name), str):
                raise ValueError(f"a finding's {name} must be a string or null")
        ints(f.victims, "a finding's victims")
        ints(f.captures, "a finding's captures")
        if not math.isfinite(f.impact_ms_per_step) or (
                f.what_if_step_ms is not None and not isinstance(f.what_if_step_ms, (int, float))):
            raise ValueError("a finding's impact_ms_per_step and what_if_step_ms must be numbers")


def _stored_diagnoses(root: Path, files: list[Path]) -> tuple[list[Diagnosis], dict[int, Any], list[str]]:
    """What the job diagnosed that no capture file holds, as the job wrote it: the captures whose file
    is gone (retention.py removes an old capture's file once it is diagnosed: --keep-captures), from
    their diagnosis-<step>.json with its drill-down, and the diagnosed hangs (hang-<step>.json: the
    live analyst adds them to the job's findings too). A problem line for each such file that is not
    what its name says."""
    have = {int(p.stem) for p in files if p.stem.isdigit()}
    diagnoses: list[Diagnosis] = []
    drill: dict[int, Any] = {}
    problems: list[str] = []
    stored = [(step, path, DIAGNOSIS_SCHEMA) for step, path in reportdir.diagnosis_files(root).items()
              if step not in have]
    stored += [(step, path, HANG_SCHEMA) for step, path in reportdir.hang_files(root).items()]
    for step, path, schema in stored:
        try:
            doc = json.loads(read_capped(path, MAX_REPORT_BYTES))
            if not isinstance(doc, dict) or doc.get("schema") != schema:
                raise ValueError(f"schema is {doc.get('schema') if isinstance(doc, dict) else type(doc).__name__!r}, "
                                 f"expected {schema!r}")
            if schema == HANG_SCHEMA:
                if not doc.get("finding"):
                    continue   # a stall every rank shared: nothing named, nothing in the job's findings
                d = hang_diagnosis(doc, step)
            else:
                d = Diagnosis.from_json(doc)
                if d.step != step:
                    raise ValueError(f"it is step {d.step}'s diagnosis")
            _check_stored(d)
        except InputError as exc:
            problems.append(str(exc))
            continue
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            what = "a usable hang diagnosis" if schema == HANG_SCHEMA else "a usable diagnosis"
            problems.append(f"{path.name}: no capture file and not {what} ({' '.join(str(exc).split())[:200]})")
            continue
        diagnoses.append(d)
        if schema != HANG_SCHEMA and isinstance(doc.get("drill_down"), dict):
            drill[step] = doc["drill_down"]
    return diagnoses, drill, problems


def run_analysis(root: Path, *, topology: str | None = None,
                 lone: list[dict[str, Any]] | None = None) -> tuple[list[Diagnosis], dict[str, Any], list[str]]:
    """Analyse every capture under ``root`` in step order through the live analyst's pipeline;
    return (diagnoses, report doc, problems). ``lone`` receives the summary of every capture that
    held one rank alone (nothing to compare it with: its profile is what can be said)."""
    files = capture_files(root)
    stored, drill, problems = _stored_diagnoses(root, files)
    if not files and not stored:
        raise click.ClickException(f"{root}: no captures/*.msgpack to analyse")
    pipeline = Pipeline(topology=topology)
    diagnoses: list[Diagnosis] = []
    world = max((d.world_size for d in stored), default=0)
    traced: list[list[int]] = []
    for path, data in _read_ahead(files):
        origin = f"{path.parent.name}/{path.name}"
        try:
            if isinstance(data, Exception):
                raise data
            result = pipeline.analyse(data, origin=origin)
            if lone is not None and result.diagnosis.ranks_analysed == 1:
                lone.extend(summary.decode_capture(data, origin=origin)[1])
            del data
        except (OSError, InputError, summary.SummaryError) as exc:
            problems.append(str(exc) if isinstance(exc, (InputError, summary.SummaryError)) else f"{origin}: {exc}")
            continue
        problems.extend(f"{origin}: {e}" for e in result.errors)
        world = max(world, int(result.meta["world_size"]))
        traced.extend(_traced_steps(result.meta))
        diagnoses.append(result.diagnosis)
        drill[result.diagnosis.step] = report.drill_down(result.summaries)
    if not diagnoses and not stored:
        raise click.ClickException(f"{root}: no capture could be read ({len(problems)} rejected): "
                                   + (problems[0] if problems else ""))
    written = list(diagnoses)   # the others stay as the job wrote them
    diagnoses = sorted(diagnoses + stored, key=lambda d: d.step)
    steps = _history_steps(root, max((d.step for d in diagnoses), default=0) + 1)
    job = _old_report(root).get("job")
    job = job if isinstance(job, dict) else {}
    if traced:   # no step history in traces: the report says which steps were traced, not a job length
        job = {**job, "source": "chrome traces", "traced_steps": sorted(traced)}
    for d in written:   # a removed capture's diagnosis stays as the job wrote it
        report.write_capture(root, d, drill.get(d.step))
    doc = report.write_job(root, diagnoses=diagnoses, world_size=world, steps=steps, job=job, drill=drill)
    return diagnoses, doc, problems


def _print_analysis(report_dir: Path, topology: str | None) -> None:
    """Analyse REPORT_DIR's captures, print the rank-0 text and exit as `eroica analyze` documents;
    for a capture of one rank alone (one rank's trace, a one-process job: nothing to compare it
    with), that rank's profile too (``report.format_profile``)."""
    alone: list[dict[str, Any]] = []
    try:
        diagnoses, doc, problems = run_analysis(report_dir, topology=topology, lone=alone)
    except click.ClickException as exc:
        _fail(f"analyze: {exc.message}", 2)
        return
    except OSError as exc:
        _fail(f"analyze: cannot write the reports into {report_dir}: {exc.strerror or exc}", 3)
        return
    for i, d in enumerate(diagnoses):   # in step order, as rank 0 printed them
        click.echo(report.format_capture(d, first_named(diagnoses[:i])))
    have = {int(p.stem) for p in capture_files(report_dir) if p.stem.isdigit()}
    stored = [d.step for d in diagnoses if d.step not in have and d.trigger != HANG_TRIGGER]
    if stored:
        click.echo(f"eroica: analyze: {len(stored)} capture(s) without a file in captures/ (removed once diagnosed: "
                   f"--keep-captures), reported from their diagnosis-<step>.json as the job wrote it: steps "
                   f"{', '.join(map(str, stored[:8]))}{', ...' if len(stored) > 8 else ''}", err=True)
    for s in alone:
        click.echo("\n".join(report.format_profile(s)))
    stats = stored_job_stats_text(doc)   # the live job's summary block, as rank 0 printed it
    if stats:
        click.echo(stats)
    click.echo(report.format_job(doc, report_dir))
    for p in problems:
        click.echo(f"eroica: analyze: rejected {' '.join(p.split())}", err=True)
    if problems:
        sys.exit(1)


def _analyze_traces(paths: tuple[Path, ...], out: Path | None, step_ranges: tuple[str, ...],
                    baseline_steps: str | None, topology: str | None) -> None:
    """`analyze --traces`: summaries from the traces into OUT/captures, then the one offline analysis."""
    from eroica_launch import tracejob, traces
    from eroica_launch.tracefile import TraceError

    if out is None:
        _fail("analyze: --traces needs --out DIR (the report directory to write)", 2)
        return
    if not paths:
        _fail("analyze: --traces needs one or more trace files or directories", 2)
    if (out / REPORT_JSON).exists() or capture_files(out):
        _fail(f"analyze: {out} already holds a report (report.json or captures/); write into a new or empty "
              "directory, so the traces' captures never mix with another job's", 2)

    def say(msg: str) -> None:
        click.echo(msg, err=True)

    try:
        ranges = [tracejob.parse_range(r) for r in step_ranges]
        baseline = tracejob.parse_range(baseline_steps) if baseline_steps else None
        job = traces.plan(paths, ranges, baseline, say)
        if job.note:
            say(f"eroica: analyze: {job.note}")
        reportdir.ensure_directory(out)   # before the long read: a directory we cannot use fails now
        traces.write_captures(out, job, say)
    except TraceError as exc:
        _fail(f"analyze: {' '.join(str(exc).split())}", 2)
    except OSError as exc:
        _fail(f"analyze: cannot write the captures into {out}: {exc.strerror or exc}", 3)
    _print_analysis(out, topology)


@click.command("analyze")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option("--traces", "from_traces", is_flag=True,
              help="PATHS are per-rank torch.profiler chrome traces (export_chrome_trace; .json or .json.gz; "
                   "a directory stands for its *.json and *.json.gz files), not a report directory. Needs --out.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="With --traces: the report directory to write (new or empty).")
@click.option("--steps", "step_ranges", multiple=True, metavar="FIRST-LAST",
              help="With --traces: the ProfilerStep numbers of one capture, e.g. 100-103 (repeat for more "
                   "captures; each within one profiling cycle). Default: one capture per profiling cycle "
                   "over the steps every rank's traces hold, less the first and the last when six or more "
                   "are shared.")
@click.option("--baseline-steps", metavar="FIRST-LAST", default=None,
              help="With --traces: steps of a healthy stretch; their capture is the job's baseline for the "
                   "later ones (finds slowdowns that hit every rank alike).")
@click.option("--topology", default=None, help='Peer layout, e.g. "pp=4,tp=8,dp=*" (row-major, last dim fastest).')
def analyze_cmd(paths: tuple[Path, ...], from_traces: bool, out: Path | None, step_ranges: tuple[str, ...],
                baseline_steps: str | None, topology: str | None) -> None:
    """Re-run the diagnosis over REPORT_DIR/captures and rewrite the reports; or, with --traces,
    diagnose existing per-rank torch.profiler traces.

    \b
      eroica analyze REPORT_DIR
      eroica analyze --traces TRACE_OR_DIR... --out DIR [--steps 100-103]

    The captures go through the live analyst's pipeline (decode, validate, baseline policy,
    diagnose) in step order, so the result is the diagnosis the job printed.

    With --traces, each trace is one rank's. Its rank, world size and process groups come from the
    trace's distributedInfo, else the rank from its file name (trace-rank3.json, rank_3.json.gz,
    worker_3.json, worker3.<time>.pt.trace.json); then the files must be ranks 0..n-1. A rank may
    have one trace per profiling cycle (schedule(wait, warmup, active, repeat) with
    tensorboard_trace_handler writes them so): each
    cycle is then a capture, built from that cycle's trace of every rank. Traces of fewer ranks than their
    distributedInfo's world size are analysed as a job of their own (said on stderr). Steps are the
    ProfilerStep#N annotations (profile with a schedule and call prof.step() every step). Each
    trace is read as a stream (ijson: memory follows its event count, not its JSON size; progress
    on stderr) and boiled down by the runtime's own summary builder into DIR/captures/<step>.msgpack;
    then DIR is analysed as above. GPU kernels, NCCL kernels, copies and CPU ops are read; GC
    pauses only from traces recorded with with_stack=True and record_python_gc_info (else they
    count as host gaps). A file that is not a chrome trace, a rank missing, two traces of a rank's
    same steps, or traces of
    different jobs (world size, backend, process groups, no common step) is refused with one line
    naming the file.

    Exit codes: 0 every capture and summary analysed; 1 analysed, but some were rejected (one line
    each on stderr); 2 nothing could be analysed (no directory, no readable capture, unusable
    traces); 3 the reports could not be written (read-only or full disk).
    """
    if from_traces:
        _analyze_traces(paths, out, step_ranges, baseline_steps, topology)
        return
    if len(paths) != 1 or out is not None or step_ranges or baseline_steps:
        _fail("analyze: give one REPORT_DIR, or --traces TRACE... --out DIR (--out, --steps and "
              "--baseline-steps go with --traces)", 2)
    report_dir = paths[0]
    if not report_dir.is_dir():
        _fail(f"analyze: no such report directory: {report_dir}", 2)
    _print_analysis(report_dir, topology)


@click.command("show")
@click.argument("report_dir", type=click.Path(path_type=Path))
def show_cmd(report_dir: Path) -> None:
    """Print the text report stored in REPORT_DIR/report.json (exit 2: none there; 1: unreadable)."""
    try:
        doc = report.load_job(report_dir)
        if doc is None:
            _fail(f"show: no report.json in {report_dir}", 2)
            return
        text = report.format_job(doc, report_dir)
        stats = stored_job_stats_text(doc)
        text = f"{stats}\n{text}" if stats else text
    except InputError as exc:
        _fail(f"show: {exc}", 1)
        return
    except (ValueError, TypeError, KeyError, AttributeError) as exc:   # fields format_job cannot read
        _fail(f"show: {report_dir / REPORT_JSON}: unreadable report ({' '.join(str(exc).split())[:200]})", 1)
        return
    click.echo(text)


@click.command("synth")
@click.option("--ranks", type=click.IntRange(min=2), required=True, help="Number of ranks of the synthetic job.")
@click.option("--fault", type=click.Choice(["compute", "dataloader", "gc", "host", "communication",
                                            "regression", "none"]), default="compute", show_default=True)
@click.option("--culprit", type=int, default=None, help="Rank to plant the fault on (default: random).")
@click.option("--functions", type=click.IntRange(min=1), default=200, show_default=True,
              help="Function vocabulary per stage (summaries keep the top 64 + <other>).")
@click.option("--stages", type=click.IntRange(min=1), default=1, show_default=True, help="Pipeline stages.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Report directory to write.")
def synth_cmd(ranks: int, fault: str, culprit: int | None, functions: int, stages: int, seed: int,
              out: Path) -> None:
    """Write synthetic captures (baseline + faulty) with a planted fault, ready for `eroica analyze`."""
    from eroica_runtime import synth

    if (out / REPORT_JSON).exists() or capture_files(out):
        _fail(f"synth: {out} already holds a report (report.json or captures/); write into a new or empty "
              "directory, so synthetic captures never mix with a job's", 2)
        return
    try:
        plan = synth.generate(out, ranks=ranks, fault=fault, culprit=culprit, functions=functions,
                              seed=seed, stages=stages)
    except ValueError as exc:
        _fail(f"synth: {exc}", 2)
        return
    except OSError as exc:
        _fail(f"synth: cannot write {out}: {exc.strerror or exc}", 3)
        return
    where = (f" on rank {plan.culprit} ({plan.culprit_host})" if plan.culprit is not None else "")
    topo = f" --topology {plan.topology}" if plan.topology else ""
    click.echo(f"eroica: synth: wrote {out}/captures ({ranks} ranks, {stages} stage(s)): planted "
               f"{plan.fault}{where}; run: eroica analyze {out}{topo}")
