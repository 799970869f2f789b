"""Reports: the text block in the rank-0 log, diagnosis-<step>.json, report.json and report.html.

Files are written atomically (tmp + rename) before anything is printed, so a job killed right after
a diagnosis still leaves it on disk. Text leads with the answer (who, what, how much) for an SRE
reading it at 3 a.m.; numbers are shown next to the peers' median.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgpack

from eroica_runtime.engine import Diagnosis, Finding, consolidate

REPORT_SCHEMA = "eroica.report/1"
STEPS_SCHEMA = "eroica.steps/1"


def atomic_write(path: str | os.PathLike[str], data: str | bytes) -> Path:
    """Write via a temp file in the same directory and rename, so readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data.encode("utf-8") if isinstance(data, str) else data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def write_capture(report_dir: str | os.PathLike[str], diagnosis: Diagnosis) -> Path:
    """``<report-dir>/diagnosis-<step>.json`` for one capture."""
    doc = json.dumps(diagnosis.to_json(), indent=1, allow_nan=False)
    return atomic_write(Path(report_dir) / f"diagnosis-{diagnosis.step}.json", doc)


def load_steps(report_dir: str | os.PathLike[str]) -> dict[str, list] | None:
    """Rank 0's step history (``steps.msgpack``) or None when absent or unreadable."""
    path = Path(report_dir) / "steps.msgpack"
    try:
        doc = msgpack.unpackb(path.read_bytes(), raw=False, strict_map_key=False)
    except (OSError, ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
        return None
    if not isinstance(doc, dict) or doc.get("schema") != STEPS_SCHEMA:
        return None
    steps, ms = doc.get("steps"), doc.get("ms")
    if not isinstance(steps, list) or not isinstance(ms, list) or len(steps) != len(ms):
        return None
    return {"steps": [int(s) for s in steps], "ms": [float(m) for m in ms]}


def build_report(*, diagnoses: Sequence[Diagnosis], world_size: int, steps: int,
                 job: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report.json document (findings consolidated over the job, sorted by impact)."""
    caps = []
    for d in sorted(diagnoses, key=lambda x: x.step):
        doc = d.to_json()
        caps.append({"step": d.step, "trigger": d.trigger, "findings": doc["findings"],
                     "missing": doc["missing"], "errors": doc["errors"], "notes": doc["notes"],
                     "ranks_analysed": d.ranks_analysed, "step_ms": doc["step_ms"], "peers": doc["peers"]})
    return {"schema": REPORT_SCHEMA, "world_size": int(world_size), "steps": int(steps),
            "job": job or {}, "captures": caps,
            "findings": [f.to_json() for f in consolidate(list(diagnoses))]}


def write_job(report_dir: str | os.PathLike[str], *, diagnoses: Sequence[Diagnosis], world_size: int,
              steps: int, job: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write ``report.json`` and ``report.html`` (atomically) and return the report document.

    Print ``format_job(report)`` only after this returns.
    """
    from eroica_runtime.report_html import render_html

    report = build_report(diagnoses=diagnoses, world_size=world_size, steps=steps, job=job)
    root = Path(report_dir)
    atomic_write(root / "report.json", json.dumps(report, indent=1, allow_nan=False))
    html = render_html(report, [d.to_json() for d in sorted(diagnoses, key=lambda x: x.step)],
                       load_steps(root))
    atomic_write(root / "report.html", html)
    return report


# ---------------------------------------------------------------------------------------- text

def _ms(x: Any) -> str:
    return f"{x:.1f}" if isinstance(x, (int, float)) else "?"


def _pair(ev: dict[str, Any], key: str) -> str | None:
    v = ev.get(key)
    if isinstance(v, list) and len(v) == 2:
        return f"{_ms(v[0])} vs peers {_ms(v[1])} ms"
    return None


def _ranks(ranks: Sequence[int], limit: int = 8) -> str:
    shown = ", ".join(str(r) for r in list(ranks)[:limit])
    return shown + (f", … (+{len(ranks) - limit})" if len(ranks) > limit else "")


def format_finding(f: dict[str, Any] | Finding, index: int = 1) -> list[str]:
    """A few lines for one finding: answer first, then evidence, then what to do."""
    f = f.to_json() if isinstance(f, Finding) else f
    ev = f.get("evidence") or {}
    who = f"rank {f['rank']}" if f.get("rank") is not None else "no single rank"
    where = f" on {f['host']}" if f.get("host") else ""
    if f.get("category") == "regression":
        who, where = "all ranks", ""
    what_if = f.get("what_if_step_ms")
    head = (f"  #{index} {str(f.get('category', '?')).upper()}: {who}{where} — "
            f"{f.get('function') or '?'} [{f.get('phase') or '-'}], "
            f"+{_ms(f.get('impact_ms_per_step'))} ms/step"
            + (f" (step → {_ms(what_if)} ms if fixed)" if isinstance(what_if, (int, float)) else ""))
    lines = [head]
    facts = []
    if f.get("category") == "regression" or "baseline_step" in ev:
        for key, label in (("own_work_ms", "own work"), ("comm_wait_ms", "comm wait"), ("step_ms", "step")):
            v = ev.get(key)
            if isinstance(v, list) and len(v) == 2:
                facts.append(f"{label} {_ms(v[0])} vs baseline {_ms(v[1])} ms")
    else:
        for key, label in (("own_work_ms", "own work"), ("comm_wait_ms", "comm wait"), ("step_ms", "step")):
            p = _pair(ev, key)
            if p:
                facts.append(f"{label} {p}")
    if facts:
        lines.append("     " + " | ".join(facts))
    fns = ev.get("functions") or []
    if fns:
        parts = []
        for fn in fns[:3]:
            if "rank_ms" in fn:
                parts.append(f"{fn['name']} {_ms(fn['rank_ms'])} vs {_ms(fn['peers_ms'])} ms")
            elif "now_ms" in fn:
                parts.append(f"{fn['name']} {_ms(fn['now_ms'])} vs baseline {_ms(fn['baseline_ms'])} ms")
        lines.append("     grew most: " + "; ".join(parts))
    if ev.get("ranks"):
        lines.append(f"     ranks: {_ranks(ev['ranks'])}")
    if ev.get("hosts"):
        lines.append(f"     hosts: {', '.join(ev['hosts'][:8])} (by {ev.get('localized_by', '?')})")
    victims = f.get("victims") or []
    if victims:
        lines.append(f"     victims: {len(victims)} ranks only waited on it ({_ranks(victims)})")
    if f.get("action"):
        lines.append(f"     action: {f['action']}")
    return lines


def format_capture(diagnosis: Diagnosis | dict[str, Any]) -> str:
    """Text block for one capture (one line when nothing is wrong)."""
    d = diagnosis.to_json() if isinstance(diagnosis, Diagnosis) else diagnosis
    n, ws = d.get("ranks_analysed", 0), d.get("world_size", 0)
    med = (d.get("step_ms") or {}).get("median")
    tail = []
    if d.get("missing"):
        tail.append(f"     missing ranks: {_ranks(d['missing'])}")
    for e in (d.get("errors") or [])[:5]:
        tail.append(f"     rejected: {e}")
    if len(d.get("errors") or []) > 5:
        tail.append(f"     … {len(d['errors']) - 5} more rejected summaries")
    findings = d.get("findings") or []
    if not findings:
        line = (f"eroica: step {d.get('step')} ({d.get('trigger')}): healthy — {n}/{ws} ranks agree, "
                f"no culprit (median step {_ms(med)} ms)")
        return "\n".join([line, *tail])
    top = findings[0]
    more = f" [+{len(findings) - 1} more finding(s)]" if len(findings) > 1 else ""
    lines = [f"eroica: step {d.get('step')} ({d.get('trigger')}): {top.get('title') or top.get('category')}"
             f"{more} — {n}/{ws} ranks analysed, median step {_ms(med)} ms"]
    for i, f in enumerate(findings, 1):
        lines.extend(format_finding(f, i))
    return "\n".join(lines + tail)


def format_job(report: dict[str, Any], report_dir: str | os.PathLike[str] | None = None) -> str:
    """Text block at job end (also what `eroica show` prints)."""
    findings = report.get("findings") or []
    caps = report.get("captures") or []
    where = f" — {Path(report_dir) / 'report.html'}" if report_dir else ""
    head = (f"eroica: job report: {len(findings)} finding(s) over {len(caps)} capture(s), "
            f"world size {report.get('world_size')}, {report.get('steps')} steps{where}")
    if not findings:
        head = (f"eroica: job report: healthy — no findings over {len(caps)} capture(s), world size "
                f"{report.get('world_size')}, {report.get('steps')} steps{where}")
    lines = [head]
    for i, f in enumerate(findings, 1):
        lines.extend(format_finding(f, i))
        if f.get("captures"):
            lines.append(f"     seen in captures at steps {_ranks(f['captures'])}")
    errors = sum(len(c.get("errors") or []) for c in caps)
    missing = sum(len(c.get("missing") or []) for c in caps)
    if errors or missing:
        lines.append(f"  ({errors} rejected summaries, {missing} missing rank-captures; see report.json)")
    return "\n".join(lines)
