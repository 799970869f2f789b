"""Rank 0's analyst: diagnoses gathered captures off the training thread, and writes the job report.

The training thread only enqueues a persisted capture; a background thread decodes it, runs the pure
engine, writes ``diagnosis-<step>.json`` and then prints the block. At job end (or on a flush signal)
it writes ``steps.msgpack``, ``report.json`` and ``report.html`` before printing the job summary.
"""

from __future__ import annotations

import queue
import statistics
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack

from eroica_runtime import engine, report
from eroica_runtime import summary as summary_mod
from eroica_runtime.gather import Gathered


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Analyst:
    def __init__(self, report_dir: str, world_size: int, topology: str = "") -> None:
        self.report_dir = Path(report_dir)
        self.world_size = world_size
        self.topology = topology or None
        self.diagnoses: list[engine.Diagnosis] = []
        self.captures: list[dict[str, Any]] = []   # step, trigger for every capture taken
        self.baseline: engine.Table | None = None  # built once, reused by every later capture
        self.history_source: Any = None   # callable -> rank 0's step history (set by the runtime)
        self._lock = threading.Lock()
        self._queue: queue.Queue[Gathered | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="eroica-analyst", daemon=True)
        self._thread.start()

    def submit(self, gathered: Gathered) -> None:
        with self._lock:
            self.captures.append({"step": gathered.step, "trigger": gathered.trigger,
                                  "missing": gathered.missing})
        self._queue.put(gathered)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._analyse(item)
            except Exception as exc:  # never let the analysis take the rank down
                say(f"eroica: analysis of the capture at step {getattr(item, 'step', '?')} failed: "
                    f"{type(exc).__name__}: {exc}")
            finally:
                self._queue.task_done()

    def _analyse(self, g: Gathered) -> None:
        meta, summaries, errors = summary_mod.decode_capture(g.data, origin=f"capture {g.step}")
        for err in errors:
            say(f"eroica: rejected {err}")
        probe = (meta.get("extra") or {}).get("link_probe")
        diagnosis = engine.diagnose(summaries, step=g.step, trigger=g.trigger, world_size=self.world_size,
                                    missing=g.missing, baseline=self.baseline, topology=self.topology,
                                    link_probe=probe, errors=errors)
        if g.trigger == "baseline":
            # the job's healthy reference; ranks flagged in it (noise, or a fault from the start)
            # are left out rather than losing the reference for the whole job
            flagged = {f.rank for f in diagnosis.findings if f.rank is not None}
            kept = [s for s in summaries if s["rank"] not in flagged]
            if len(kept) >= max(1, len(summaries) // 2):
                self.baseline = engine.build_table(kept)
        with self._lock:
            self.diagnoses.append(diagnosis)
        report.write_capture(self.report_dir, diagnosis)   # on disk before it is printed
        self._write_partial()  # a job killed from now on still leaves a report.json
        say(report.format_capture(diagnosis))

    def add_hang(self, doc: dict[str, Any], step: int) -> None:
        """A diagnosed hang (hang.analyse) joins the job's findings in report.json."""
        f = doc.get("finding")
        if not f:
            return
        finding = replace(engine.Finding.from_json(f), category="hang", phase="hang", what_if_step_ms=None,
                          impact_ms_per_step=float((f.get("evidence") or {}).get("stalled_s") or 0) * 1e3,
                          title=f"hang: rank {f.get('rank')} at {f.get('function')}", captures=(step,))
        diagnosis = engine.Diagnosis(step=step, trigger="hang", world_size=self.world_size,
                                     ranks_analysed=self.world_size - len(doc.get("missing") or []),
                                     findings=(finding,), missing=tuple(doc.get("missing") or ()))
        with self._lock:
            self.diagnoses.append(diagnosis)
            self.captures.append({"step": step, "trigger": "hang", "missing": list(doc.get("missing") or [])})
        self._write_partial()

    def wait(self, timeout_s: float) -> bool:
        """Let queued analyses finish (bounded); True when the queue drained."""
        done = threading.Event()

        def join() -> None:
            self._queue.join()
            done.set()

        threading.Thread(target=join, daemon=True).start()
        return done.wait(timeout_s)

    def write_job(self, *, steps: int, job: dict[str, Any], history: list[float]) -> dict[str, Any]:
        """steps.msgpack, report.json, report.html — all before the caller prints anything."""
        data = msgpack.packb({"schema": report.STEPS_SCHEMA, "steps": list(range(1, len(history) + 1)),
                              "ms": [round(float(m), 4) for m in history]}, use_bin_type=True)
        report.atomic_write(self.report_dir / "steps.msgpack", data)
        with self._lock:
            diagnoses = list(self.diagnoses)
            job = {**job, "captures_taken": list(self.captures)}
        return report.write_job(self.report_dir, diagnoses=diagnoses, world_size=self.world_size,
                                steps=steps, job=job)

    def _write_partial(self) -> None:
        """report.json/html with what is known so far (rank 0's own step history only)."""
        history = list(self.history_source()) if self.history_source else []
        self.write_job(steps=len(history) + 1 if history else 0, job={"partial": True}, history=history)

    def stop(self) -> None:
        self._queue.put(None)


def job_stats(per_rank: dict[int, dict[str, Any]], world_size: int) -> dict[str, Any]:
    """Job-level step-time statistics from every rank's end-of-job numbers."""
    ranks = [per_rank[r] for r in sorted(per_rank)]
    medians = [r["median_ms"] for r in ranks if r.get("median_ms") is not None]
    slowest = sorted(ranks, key=lambda r: -(r.get("median_ms") or 0))[:3]
    return {
        "ranks_reporting": len(ranks), "world_size": world_size,
        "steps": max((r["steps"] for r in ranks), default=0),
        "median_step_ms": statistics.median(medians) if medians else None,
        "p99_step_ms": max((r["p99_ms"] for r in ranks if r.get("p99_ms") is not None), default=None),
        "per_rank": ranks,
        "slowest": [{"rank": r["rank"], "host": r["host"], "median_ms": r["median_ms"]} for r in slowest],
    }


def format_job_stats(stats: dict[str, Any], captures: list[dict[str, Any]]) -> str:
    """The job summary block: steps, step-time median/p99, captures and why."""
    def ms(x: Any) -> str:
        return "n/a" if x is None else f"{x:.1f} ms"

    caps = ", ".join(f"step {c['step']} ({c['trigger']})" for c in captures) or "none"
    missing = stats["world_size"] - stats["ranks_reporting"]
    slow = ", ".join(f"rank {r['rank']} ({r['host']}) {ms(r['median_ms'])}" for r in stats["slowest"])
    lines = [f"eroica: job summary: {stats['steps']} steps on {stats['world_size']} ranks; step time median "
             f"{ms(stats['median_step_ms'])}, p99 {ms(stats['p99_step_ms'])}",
             f"  slowest ranks by median step: {slow or 'n/a'}",
             f"  captures: {caps}"]
    if missing:
        lines.append(f"  {missing} rank(s) did not report at job end")
    return "\n".join(lines)
