"""Hang watchdog: notice that a rank stopped making progress and collect where every rank is.

A hung job produces no slow step to compare, and every rank sits in a collective except the one that
never arrived. The side MPI channel does not depend on NCCL/gloo, so it still works while they are
stuck. Each rank's watchdog thread fires after max(hang_factor x median step, floor) without a step
boundary; it records the Python stacks of its threads (main thread first), the last collectives from
torch's Flight Recorder (``TORCH_FR_BUFFER_SIZE``) and host telemetry, and sends them to rank 0, whose
pure analysis (``engine.hang``) groups ranks by where they are and names the outliers.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import msgpack

from eroica_runtime import errorfile, reportdir
from eroica_runtime.engine.hang import analyse
from eroica_runtime.report import format_hang
from eroica_runtime.sidechannel import SideChannel

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


class Watchdog(threading.Thread):
    """Per-rank thread: fires once per stall, exchanges positions over the side channel.

    Its collaborators are passed in: the side channel, the recent step times (for the threshold),
    where reports go, and (rank 0) what to do with a diagnosis.
    """

    def __init__(self, side: SideChannel, *, step_times: Callable[[], list[float]], warmup_steps: int,
                 report_dir: str, factor: float, floor_s: float, action: str, deadline_s: float,
                 on_diagnosis: Callable[[dict[str, Any], int], None] | None = None,
                 warn: Callable[[str], None] = print) -> None:
        super().__init__(name="eroica-hang-watchdog", daemon=True)
        self.side, self.step_times, self.warmup_steps, self.report_dir = side, step_times, warmup_steps, report_dir
        self.on_diagnosis, self.warn = on_diagnosis, warn
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
        ms = self.step_times()[-50:]
        median = sorted(ms)[len(ms) // 2] / 1e3 if ms else 0.0
        return max(self.factor * median, self.floor_s)

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        while not self._stop_event.wait(0.5):
            if self.last_step < self.warmup_steps or self.fired_at_step == self.last_step:
                continue
            stalled = time.monotonic() - self.last_progress
            if stalled < self.threshold():
                continue
            self.fired_at_step = self.last_step
            try:
                self._fire(stalled)
            except Exception as exc:
                self.warn(f"hang diagnosis failed: {type(exc).__name__}: {exc}")

    def _fire(self, stalled: float) -> None:
        side = self.side
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
                doc = msgpack.unpackb(raw, raw=False, strict_map_key=False)
                if isinstance(doc, dict):
                    reports[r] = doc
            except Exception:
                self.warn(f"hang: unreadable report from rank {r}")
        doc = json.loads(json.dumps(analyse(reports, side.size), default=str))
        doc["step"] = self.last_step
        path = reportdir.atomic_write(reportdir.hang_path(self.report_dir, self.last_step),
                                      json.dumps(doc, indent=1))
        if self.on_diagnosis is not None:
            self.on_diagnosis(doc, self.last_step)
        print(format_hang(doc, stalled) + f"\n  written to {path}", file=sys.stderr, flush=True)
        if self.action == "abort":
            finding = doc.get("finding") or {}
            msg = (f"eroica: hang diagnosed (rank {finding.get('rank')} at {finding.get('function')}); "
                   f"--hang-action abort ends the job")
            print(msg, file=sys.stderr, flush=True)
            errorfile.write_message(msg)
            os._exit(3)
