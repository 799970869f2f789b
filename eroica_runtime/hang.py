"""Hang diagnosis: notice that a rank stopped making progress, ask every rank where it is, name the odd one.

A hung job produces no slow step to compare, and every rank sits in a collective except the one that
never arrived. The side MPI channel does not depend on NCCL/gloo, so it still works while they are
stuck. Each rank's watchdog thread fires after max(hang_factor x median step, floor) without a step
boundary; it records the Python stacks of its threads (main thread first), the last collectives from
torch's Flight Recorder (``TORCH_FR_BUFFER_SIZE``) and host telemetry, and sends them to rank 0, which
groups ranks by where they are and names the outliers. ``analyse`` is pure (no MPI, no torch).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import msgpack

TAG_HANG = 30200
DEFAULT_FLOOR_S = 60.0


def stacks() -> list[dict[str, Any]]:
    """Python stacks of every thread of this process, the main thread first."""
    frames = sys._current_frames()
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    out = []
    for ident, frame in sorted(frames.items(), key=lambda kv: kv[0] != main):
        if names.get(ident, "").startswith("eroica-"):
            continue
        summary = traceback.extract_stack(frame)
        out.append({"thread": names.get(ident, str(ident)), "main": ident == main,
                    "frames": [{"file": f.filename, "line": f.lineno, "function": f.name,
                                "code": (f.line or "").strip()} for f in summary[-30:]]})
    return out


def flight_recorder() -> dict[str, Any] | None:
    """The last collectives torch recorded (sequence number, name, state), when the recorder is on."""
    if not os.environ.get("TORCH_FR_BUFFER_SIZE"):
        return None
    try:
        import torch._C._distributed_c10d as c10d

        doc = json.loads(c10d._dump_fr_trace_json(True, True))
    except Exception:
        return None
    entries = doc.get("entries") or []
    last = [{"seq": e.get("collective_seq_id"), "name": e.get("profiling_name"), "state": e.get("state"),
             "pg": (e.get("process_group") or [None])[0]} for e in entries[-5:]]
    return {"last": last, "seq": last[-1]["seq"] if last else None}


def where(report: dict[str, Any], user_roots: tuple[str, ...] = ()) -> str:
    """A rank's position: the innermost frame of its main thread outside Python's and torch's own code."""
    main = next((s for s in report.get("stacks", []) if s.get("main")), None)
    if not main or not main["frames"]:
        return "unknown"
    frames = main["frames"]
    library = ("/torch/", "/site-packages/", "/lib/python3", "eroica_runtime/")
    for f in reversed(frames):
        if not any(part in f["file"] for part in library):
            return f"{f['file']}:{f['line']} in {f['function']}"
    f = frames[-1]
    return f"{f['file']}:{f['line']} in {f['function']}"


def analyse(reports: dict[int, dict[str, Any]], world_size: int) -> dict[str, Any]:
    """Group ranks by position (and collective sequence); the minority are the outliers to blame."""
    groups: dict[tuple[str, Any], list[int]] = {}
    for rank, rep in sorted(reports.items()):
        fr = rep.get("flight_recorder") or {}
        groups.setdefault((where(rep), fr.get("seq")), []).append(rank)
    missing = sorted(set(range(world_size)) - set(reports))
    ordered = sorted(groups.items(), key=lambda kv: -len(kv[1]))
    finding: dict[str, Any] | None = None
    if len(ordered) > 1 and len(ordered[0][1]) > len(ordered[1][1]):
        majority_where, majority_seq = ordered[0][0]
        outliers = sorted(r for key, ranks in ordered[1:] for r in ranks)
        culprit = outliers[0]
        rep = reports[culprit]
        main = next((s for s in rep.get("stacks", []) if s.get("main")), {"frames": []})
        finding = {
            "category": "hang", "rank": culprit, "host": rep.get("host"), "function": where(rep),
            "phase": "hang", "impact_ms_per_step": None, "victims": sorted(ordered[0][1]),
            "evidence": {"stalled_s": rep.get("stalled_s"), "last_step": rep.get("step"),
                         "outliers": outliers, "majority_position": majority_where,
                         "majority_collective_seq": majority_seq,
                         "outlier_collective_seq": (rep.get("flight_recorder") or {}).get("seq"),
                         "stack": [f"{f['file']}:{f['line']} {f['function']}: {f['code']}"
                                   for f in main["frames"][-12:]]},
            "action": (f"rank {culprit} never reached the collective the other {len(ordered[0][1])} ranks wait "
                       f"in; look at its stack (a stuck data read, a deadlock, a rank-dependent branch that "
                       f"skips a collective)"),
        }
    elif missing:
        finding = {"category": "hang", "rank": missing[0], "host": None, "function": "unknown",
                   "phase": "hang", "impact_ms_per_step": None, "victims": sorted(reports),
                   "evidence": {"missing": missing},
                   "action": f"ranks {missing} did not answer over the side channel: they are dead or "
                             f"frozen (SIGSTOP, D state); check their hosts"}
    return {"schema": "eroica.hang/1", "world_size": world_size, "missing": missing,
            "positions": [{"where": w, "collective_seq": s, "ranks": r} for (w, s), r in ordered],
            "finding": finding}


def format_hang(doc: dict[str, Any], stalled_s: float) -> str:
    lines = [f"eroica: HANG: no step progress for {stalled_s:.0f}s"]
    f = doc.get("finding")
    if f:
        lines.append(f"  culprit: rank {f['rank']} on {f.get('host')} — at {f['function']}")
        lines.append(f"  the other {len(f['victims'])} rank(s) wait at {f['evidence'].get('majority_position')}"
                     if f["evidence"].get("majority_position") else f"  {f['action']}")
        for frame in f["evidence"].get("stack", [])[-6:]:
            lines.append(f"     {frame}")
        lines.append(f"  action: {f['action']}")
    else:
        lines.append("  every rank is at the same place: " + ", ".join(
            f"{p['where']} ({len(p['ranks'])} ranks)" for p in doc["positions"][:3]))
    return "\n".join(lines)


class Watchdog(threading.Thread):
    """Per-rank thread: fires once per stall, exchanges positions over the side channel."""

    def __init__(self, runtime: Any, factor: float, floor_s: float, action: str, deadline_s: float) -> None:
        super().__init__(name="eroica-hang-watchdog", daemon=True)
        self.rt = runtime
        self.factor, self.floor_s, self.action, self.deadline_s = factor, floor_s, action, deadline_s
        self.last_progress = time.monotonic()
        self.last_step = -1
        self.fired_at_step: int | None = None
        self._stop_event = threading.Event()  # not _stop: Thread._stop() is used at fork

    def progress(self, step: int) -> None:
        """Called at every step boundary (cheap: two attribute writes)."""
        self.last_progress = time.monotonic()
        self.last_step = step

    def threshold(self) -> float:
        ms = [m for _, m in list(self.rt.clock.durations)[-50:]]
        median = sorted(ms)[len(ms) // 2] / 1e3 if ms else 0.0
        return max(self.factor * median, self.floor_s)

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        while not self._stop_event.wait(0.5):
            if self.last_step < self.rt.cfg.warmup_steps or self.fired_at_step == self.last_step:
                continue
            stalled = time.monotonic() - self.last_progress
            if stalled < self.threshold():
                continue
            self.fired_at_step = self.last_step
            try:
                self._fire(stalled)
            except Exception as exc:
                self.rt._warn(f"hang diagnosis failed: {type(exc).__name__}: {exc}")

    def _fire(self, stalled: float) -> None:
        side = self.rt.side
        if side is None:
            return
        mine = {"rank": side.rank, "host": socket.gethostname(), "pid": os.getpid(), "step": self.last_step,
                "stalled_s": round(stalled, 2), "stacks": stacks(), "flight_recorder": flight_recorder()}
        try:
            from eroica_runtime import telemetry

            mine["telemetry"] = telemetry.sample().get("host")
        except Exception:
            pass
        got = side.gather_bytes(msgpack.packb(mine, use_bin_type=True, default=str), self.deadline_s,
                                tag_base=TAG_HANG)
        if got is None:
            return
        blobs, _missing = got
        reports = {}
        for r, raw in blobs.items():
            try:
                reports[r] = msgpack.unpackb(raw, raw=False, strict_map_key=False)
            except Exception:
                self.rt._warn(f"hang: unreadable report from rank {r}")
        doc = analyse(reports, side.size)
        doc["step"] = self.last_step
        from eroica_runtime.report import atomic_write

        path = Path(self.rt.report_dir) / f"hang-{self.last_step}.json"
        atomic_write(path, json.dumps(doc, indent=1, default=str))
        if self.rt.analyst is not None:
            self.rt.analyst.add_hang(json.loads(json.dumps(doc, default=str)), self.last_step)
        print(format_hang(doc, stalled) + f"\n  written to {path}", file=sys.stderr, flush=True)
        if self.action == "abort":
            finding = doc.get("finding") or {}
            msg = (f"eroica: hang diagnosed (rank {finding.get('rank')} at {finding.get('function')}); "
                   f"--hang-action abort ends the job")
            print(msg, file=sys.stderr, flush=True)
            _write_error_file(msg)
            os._exit(3)


def _write_error_file(message: str) -> None:
    """So the launcher's failure summary shows why eroica ended the job."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or os.path.exists(path):
        return
    doc = {"message": {"message": message, "extraInfo": {"py_callstack": message,
                                                         "timestamp": str(int(time.time()))}}}
    Path(path).write_text(json.dumps(doc))
