"""Offline commands of the `eroica` tool: analyze, show, synth (registered in eroica_launch/tool.py).

`eroica analyze DIR` re-runs the pure diagnosis engine over DIR/captures/*.msgpack (the capture whose
trigger is "baseline" is the job's healthy baseline), rewrites diagnosis-*.json, report.json and
report.html, then prints the text report. Bad input gets one line naming the file or rank and a
non-zero exit; everything that could be read is still analysed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from eroica_runtime import report, summary
from eroica_runtime.engine import Diagnosis, build_table, diagnose


def _fail(msg: str, code: int) -> None:
    click.echo(f"eroica: {msg}", err=True)
    sys.exit(code)


def _step_of(path: Path) -> int:
    try:
        return int(path.stem)
    except ValueError:
        return sys.maxsize


def _history_steps(root: Path, fallback: int) -> int:
    hist = report.load_steps(root)
    if hist and hist["steps"]:
        return int(max(hist["steps"])) + 1
    try:
        old = json.loads((root / "report.json").read_text())
        if isinstance(old.get("steps"), int):
            return max(old["steps"], fallback)
    except (OSError, ValueError, AttributeError):
        pass
    return fallback


def run_analysis(root: Path, *, topology: str | None = None) -> tuple[list[Diagnosis], dict[str, Any], list[str]]:
    """Analyse every capture under ``root``; return (diagnoses, report doc, problems)."""
    files = sorted((root / "captures").glob("*.msgpack"), key=lambda p: (_step_of(p), p.name))
    if not files:
        raise click.ClickException(f"{root}: no captures/*.msgpack to analyse")
    problems: list[str] = []
    decoded: list[tuple[dict[str, Any], Any, list[str]]] = []
    world = 0
    for path in files:
        origin = f"{path.parent.name}/{path.name}"
        try:
            meta, good, errors = summary.decode_capture(path.read_bytes(), origin=origin)
        except (OSError, summary.SummaryError) as exc:
            problems.append(str(exc) if isinstance(exc, summary.SummaryError) else f"{origin}: {exc}")
            continue
        problems.extend(f"{origin}: {e}" for e in errors)
        table = build_table(good)    # columnar once; the decoded dicts are dropped here
        del good
        world = max(world, int(meta.get("world_size") or 0), table.n)
        decoded.append((meta, table, errors))
    baseline = next((t for m, t, _ in decoded if m.get("trigger") == "baseline"), None)
    diagnoses = []
    for meta, table, errors in decoded:
        extra = meta.get("extra") if isinstance(meta.get("extra"), dict) else {}
        probe = extra.get("link_probe") if isinstance(extra.get("link_probe"), dict) else None
        is_base = meta.get("trigger") == "baseline"
        diagnoses.append(diagnose(
            table, step=int(meta.get("step") or table.capture_step or 0),
            trigger=str(meta.get("trigger") or "?"), world_size=int(meta.get("world_size") or table.n),
            missing=[int(m) for m in meta.get("missing") or [] if isinstance(m, int)],
            baseline=None if is_base else baseline, topology=topology, link_probe=probe, errors=errors))
    steps = _history_steps(root, max((d.step for d in diagnoses), default=0) + 1)
    job: dict[str, Any] = {}
    try:
        old = json.loads((root / "report.json").read_text())
        job = old.get("job") or {} if isinstance(old, dict) else {}
    except (OSError, ValueError):
        pass
    for d in diagnoses:
        report.write_capture(root, d)
    doc = report.write_job(root, diagnoses=diagnoses, world_size=world, steps=steps, job=job)
    return diagnoses, doc, problems


@click.command("analyze")
@click.argument("report_dir", type=click.Path(path_type=Path))
@click.option("--topology", default=None, help='Peer layout, e.g. "pp=4,tp=8,dp=*" (row-major, last dim fastest).')
def analyze_cmd(report_dir: Path, topology: str | None) -> None:
    """Re-run the diagnosis over REPORT_DIR/captures and rewrite the reports."""
    if not report_dir.is_dir():
        _fail(f"analyze: no such report directory: {report_dir}", 2)
    try:
        diagnoses, doc, problems = run_analysis(report_dir, topology=topology)
    except click.ClickException as exc:
        _fail(f"analyze: {exc.message}", 2)
        return
    for d in diagnoses:
        click.echo(report.format_capture(d))
    click.echo(report.format_job(doc, report_dir))
    for p in problems:
        click.echo(f"eroica: analyze: rejected {p}", err=True)
    if problems:
        sys.exit(1)


@click.command("show")
@click.argument("report_dir", type=click.Path(path_type=Path))
def show_cmd(report_dir: Path) -> None:
    """Print the text report stored in REPORT_DIR/report.json."""
    path = report_dir / "report.json"
    if not path.is_file():
        _fail(f"show: no report.json in {report_dir}", 2)
    try:
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict) or doc.get("schema") != report.REPORT_SCHEMA:
            raise ValueError(f"schema is {doc.get('schema') if isinstance(doc, dict) else type(doc).__name__!r}, "
                             f"expected {report.REPORT_SCHEMA!r}")
        click.echo(report.format_job(doc, report_dir))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        _fail(f"show: {path}: unreadable report ({exc})", 1)


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

    try:
        plan = synth.generate(out, ranks=ranks, fault=fault, culprit=culprit, functions=functions,
                              seed=seed, stages=stages)
    except ValueError as exc:
        _fail(f"synth: {exc}", 2)
        return
    where = (f" on rank {plan.culprit} ({plan.culprit_host})" if plan.culprit is not None else "")
    topo = f" --topology {plan.topology}" if plan.topology else ""
    click.echo(f"eroica: synth: wrote {out}/captures ({ranks} ranks, {stages} stage(s)): planted "
               f"{plan.fault}{where}; run: eroica analyze {out}{topo}")
