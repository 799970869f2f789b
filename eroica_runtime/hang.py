"""Hang watchdog: notice that a rank stopped making progress and collect where every rank is.

A hung job produces no slow step to compare, and every rank sits in a collective except the one that
never arrived. The side MPI channel does not depend on NCCL/gloo, so it still works while they are
stuck. Each rank's watchdog thread fires after max(hang_factor x median step, floor) without a step
boundary; it watches its own rank for ``WATCH_S`` (does the main thread's stack move, does the process
read or write storage, do its collectives advance), records the Python stacks of its threads (main
thread first), the last collectives from torch's Flight Recorder (``TORCH_FR_BUFFER_SIZE``) and host
telemetry, and sends them to rank 0, whose pure analysis (``engine.hang``) groups ranks by where they
are and names the outliers.

A stretch without optimizer steps is not always a hang: rank 0 writing a checkpoint while the others
wait in a barrier, or every rank evaluating, stops the step clock for minutes in most real jobs. A
rank that moves is busy, not stuck: then rank 0 prints one line saying who is busy where and who
waits, names no culprit, and every rank looks again at 2x, 4x, ... the threshold into the same stall,
so a checkpoint that gets stuck on its storage is still reported as a hang. Found by a 12 s checkpoint
on rank 0 (``--hang-timeout 4``): it was reported as "HANG ... culprit: rank 0" and joined the job's
findings; a 12 s evaluation printed a HANG block too.

A rank whose program has returned keeps answering until every rank's has (``finish``; the runtime
waits for them before MPI_Finalize): it reports that it finished. Peers busy after the last step
(rank 0 saving the final model) are then a pause, not ranks that "did not answer: dead or frozen";
peers stuck in a collective are waiting for a rank that will never join one again (it ran fewer steps
than they), and rank 0 ends the job, as the returned rank's exit ends a torchrun job through the
others' broken connections.
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

from eroica_runtime import errorfile, reportdir, telemetry
from eroica_runtime.engine.hang import analyse
from eroica_runtime.engine.longsteps import LONG_MIN_MS, LONG_RATIO, eroicas_work, is_user_frame, landmark
from eroica_runtime.report import format_hang, format_pause
from eroica_runtime.sidechannel import SideChannel

TAG_HANG = 30200
DEFAULT_FLOOR_S = 60.0
WATCH_S = 2.0          # how long a stalled rank watches itself for movement before it reports
WATCH_EVERY_S = 0.25   # how often it samples its main thread's stack meanwhile
WAKE_S = 0.5           # how often the watchdog looks at the step in progress ...
WAKE_MIN_S = 0.05      # ... or sooner, when it would cross the bar of a long step before then
# the job's start (to its first step): its main thread's stack is sampled from STARTUP_AFTER_S on, every
# look at first; at STARTUP_KEEP samples every other one goes and the spacing doubles, so they span the
# whole start. The start's record takes the one nearest STARTUP_BACK of the start before its end, and
# STARTUP_BEFORE_S at least: a rank 3 s into a 12 s read of its shard, while the others wait for it,
# not the last second, when every rank builds its model (a DDP constructor importing sympy for 1.2 s:
# a rank that had prepared the data alone for 8 s was sampled there with the others)
STARTUP_AFTER_S = 2.0
STARTUP_BEFORE_S = 1.0
STARTUP_BACK = 0.25
STARTUP_KEEP = 32


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


def main_stack_key() -> tuple[tuple[str, int], ...]:
    """Where the main thread is, as (file, line) of every frame: cheap enough to take every
    ``WATCH_EVERY_S`` while a rank is stalled."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    key = []
    while frame is not None:
        key.append((frame.f_code.co_filename, frame.f_lineno))
        frame = frame.f_back
    return tuple(key)


def main_frames_text(inner: int = 8, user: int = 2, depth: int = 256) -> list[str]:
    """Where the main thread is, as 'file:line function' frames, innermost last: the ``inner``
    innermost frames and, above them, the ``user`` innermost frames of the user's own code
    (engine.longsteps.is_user_frame): where a rank was while one of its steps ran long. A recompile
    sits 60 frames deep in dynamo and inductor under the line of the script that called the model:
    its innermost frames can be anywhere in torch (fake tensors, autograd tracing a joint graph), so
    the innermost frame between them that says what the rank was doing (a ``landmark``: dynamo,
    AOTAutograd, torch.save) is kept too, and so is the innermost frame of eroica's own work
    (``eroicas_work``: a window's close deep in torch.profiler is eroica's, not the job's)."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    kept: list[str] = []
    users = 0
    marked = own = False
    while frame is not None and depth > 0 and (len(kept) < inner or users < user):
        text = f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}"
        if len(kept) < inner:
            kept.append(text)
            users += is_user_frame(text)
            marked = marked or landmark(text)
            own = own or eroicas_work(text)
        elif is_user_frame(text):
            kept.append(text)
            users += 1
        elif not marked and landmark(text):
            kept.append(text)
            marked = True
        elif not own and eroicas_work(text):
            kept.append(text)
            own = True
        frame, depth = frame.f_back, depth - 1
    return kept[::-1]


def _watched(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rank's DataLoader workers as it watched itself: pid, state at the end, CPU seconds meanwhile
    (a worker that ran none was stuck or blocked; one in "disk-sleep" waits on storage)."""
    cpu0 = {w["pid"]: w["cpu_s"] for w in before}
    return [{"pid": w["pid"], "state": w["state"], "cpu_s": round(max(w["cpu_s"] - cpu0[w["pid"]], 0.0), 2)}
            for w in after if w["pid"] in cpu0]


def storage_bytes() -> int | None:
    """Bytes this process has read from and written to storage so far (None: not readable here)."""
    sample = telemetry.host_sample()
    read, written = sample.get("io_read_bytes"), sample.get("io_write_bytes")
    return None if read is None or written is None else int(read) + int(written)


def watch(seconds: float, every: float = WATCH_EVERY_S) -> dict[str, Any]:
    """Watch this rank for ``seconds``: did its main thread's stack change, how many bytes did it move
    to or from storage, how many collectives did it finish? A stuck rank (a blocked read, a deadlock,
    a collective a peer never joins, a GPU wait that spins) changes none of them; a rank writing a
    checkpoint or evaluating changes at least one. Not its CPU time: a host thread spinning in a hung
    device synchronize burns CPU too."""
    first, io0 = main_stack_key(), storage_bytes()
    fr0 = (flight_recorder() or {}).get("seq")
    moved = False
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(every)
        moved = moved or main_stack_key() != first
    io1 = storage_bytes()
    fr1 = (flight_recorder() or {}).get("seq")
    return {"seconds": seconds, "stack_moved": moved,
            "storage_bytes": io1 - io0 if io0 is not None and io1 is not None else None,
            "collectives": fr1 - fr0 if isinstance(fr0, int) and isinstance(fr1, int) else None}


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


def collectives_recorded() -> int | None:
    """A count that grows with every collective this rank runs, and every send or receive on the
    default group, or None when it cannot be read: torch's Flight Recorder's count of what it recorded
    (every process group's collectives; one dump of its ring, ~2.5 ms at 200 entries) plus the default
    group's sequence number. The recorder misses gloo's sends and receives (a pipeline's stages on CPU:
    3 sends left its count at 0), which that number counts (0 -> 3, and 4 after an all-reduce).
    None where the recorder is off, a size of 0 included (the job's own setting, which eroica-run
    keeps), or the default group's backend is neither gloo nor NCCL (MPI, oneCCL, HCCL: the recorder
    is theirs alone): an empty ring then says nothing about the job's collectives. 0 while no process
    group exists (torch.distributed not initialized, or not built): no torch collective can have run.
    Ranks launched together that never make one (a sweep's trials, shards of an inference, each reading
    RANK alone) were held at the slowest one's pace by eroica's vote: 3.8 s for rank 0's 240 steps that
    took 1.3 s under torchrun, and the baseline capture named its peer for the wait."""
    try:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return 0
        backends = {part.split(":")[-1] for part in str(dist.get_backend()).split(",")}
        if not backends or not backends <= {"gloo", "nccl"}:
            return None
        entries = _recorded()
        if entries is None:
            return None
        return (int(entries[-1]["record_id"]) + 1 if entries else 0) + \
            int(dist.group.WORLD._get_sequence_number_for_group())
    except Exception:
        return None


def collective_times() -> list[int]:
    """When this rank created each collective the Flight Recorder still holds (its last 200 at
    eroica-run's TORCH_FR_BUFFER_SIZE), epoch ns in order; sends and receives left out (only some
    backends record them). Empty where the recorder is off or cannot be read. gloo records no start
    or end of a collective (both 0 in torch 2.13), only its creation: lateness.py compares it across
    ranks. One dump, ~2 ms, once per capture."""
    try:
        return [int(e["time_created_ns"]) for e in _recorded() or []
                if not e.get("is_p2p") and int(e.get("time_created_ns") or 0) > 0]
    except Exception:
        return []


def _recorded() -> list[dict[str, Any]] | None:
    """The Flight Recorder's ring (one dump, no stacks), None where it is off: a size of 0 or unset."""
    if int(os.environ.get("TORCH_FR_BUFFER_SIZE") or 0) <= 0:
        return None
    import torch._C._distributed_c10d as c10d

    return list(json.loads(c10d._dump_fr_trace_json(True, False)).get("entries") or [])


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
        self.stall_step: int | None = None   # the step the current stall followed, once it was looked at
        self.looks = 0                       # how often this stall was looked at (the next look: 2^looks x)
        self.reported_hang = False           # rank 0: this stall was reported as a hang
        self.finished = False                # this rank's program returned (finish)
        self.job_ended = False               # every rank's program returned: a look says nothing
        self._stop_event = threading.Event()  # not _stop: Thread._stop() is used at fork
        self._sample: tuple[int, list[str]] | None = None   # (step, main_frames_text) of a step that ran long
        self._born = time.monotonic()
        self._startup: list[tuple[float, list[str]]] = []   # (when, frames) before step 0, thinned
        self._startup_every = WAKE_S
        self._startup_next = self._born + STARTUP_AFTER_S

    def progress(self, step: int) -> None:
        """Called at every step boundary (cheap: two attribute writes)."""
        self.last_progress = time.monotonic()
        self.last_step = step

    def median_s(self) -> float:
        ms = self.step_times()[-50:]
        return sorted(ms)[len(ms) // 2] / 1e3 if ms else 0.0

    def threshold(self) -> float:
        return max(self.factor * self.median_s(), self.floor_s)

    def sampled(self, step: int) -> list[str] | None:
        """Where this rank's main thread was while step ``step`` ran long, if this thread looked; for step
        0 (the job's start, asked at its end), where it was a quarter of the start before (STARTUP_BACK)."""
        if step == 0:
            now = time.monotonic()
            at = now - max(STARTUP_BEFORE_S, STARTUP_BACK * (now - self._born))
            kept = [(abs(when - at), frames) for when, frames in self._startup if when <= now - STARTUP_BEFORE_S]
            return min(kept, key=lambda x: x[0])[1] if kept else None
        got = self._sample
        return got[1] if got is not None and got[0] == step else None

    def _sample_startup(self) -> None:
        """Before the first step: where the main thread is (a start that runs long: one rank loading a
        checkpoint or an index while the others wait in init_process_group or DDP's first broadcast)."""
        now = time.monotonic()
        if now < self._startup_next:
            return
        try:
            self._startup.append((now, main_frames_text()))
        except Exception:   # a frame that vanished under it: no sample this time
            pass
        if len(self._startup) >= STARTUP_KEEP:
            self._startup = self._startup[1::2]
            self._startup_every *= 2
        self._startup_next = now + self._startup_every

    def _sample_long_step(self, stalled: float) -> None:
        """Once per step that runs past the bar of a long step (engine.longsteps), sample where the main
        thread is: the step clock keeps it with the step if it ends among the longest (a one-off stall
        leaves no capture behind to say where it was)."""
        step = self.last_step + 1
        try:
            if (self._sample is None or self._sample[0] != step) and \
                    stalled >= max(LONG_RATIO * self.median_s(), LONG_MIN_MS / 1e3):
                self._sample = (step, main_frames_text())
        except Exception:   # a frame that vanished under it: no place for this step, never a dead watchdog
            self._sample = None

    def _next_wake(self) -> float:
        """Seconds to the next look: WAKE_S, or just after the step in progress would cross the bar of
        a long step, if sooner. Why: at a wake every 0.5 s a stall of 300 ms past a 100 ms bar was
        sampled by chance (two times in five), and its line said nothing of where the rank was; a
        step under way is looked at once more at most (one sample a step), and a job whose steps
        all end before the bar wakes about once a bar (at least 100 ms) instead of twice a second."""
        try:
            if self.last_step < self.warmup_steps or (self._sample is not None and self._sample[0] == self.last_step + 1):
                return WAKE_S
            bar = max(LONG_RATIO * self.median_s(), LONG_MIN_MS / 1e3)
            return min(WAKE_S, max(WAKE_MIN_S, self.last_progress + bar - time.monotonic() + 0.005))
        except Exception:   # step times read while another thread changed them: the usual wake
            return WAKE_S

    def stop(self) -> None:
        self._stop_event.set()

    def finish(self) -> None:
        """This rank's program returned: its looks say so from now on."""
        self.finished = True

    def end(self, timeout_s: float) -> None:
        """Every rank's program returned: stop, and wait (bounded) for a look in progress to end, so
        that no thread of this rank calls MPI after MPI_Finalize (MPICH aborts the process: seen at
        the end of a job whose rank 0 saved its final model past the hang threshold)."""
        self.job_ended = True
        self.stop()
        if self.is_alive() and self is not threading.current_thread():
            self.join(timeout_s)

    def run(self) -> None:
        wake = WAKE_S
        while not self._stop_event.wait(wake):
            self._look()
            wake = self._next_wake()

    def _look(self) -> None:
        """One look at the step in progress: sample a long one's stack, and fire on a stall past the
        hang threshold (each stall fires again at twice the wait before)."""
        if self.last_step < 0:
            self._sample_startup()
        if self.last_step < self.warmup_steps:
            return
        if self.stall_step != self.last_step:   # a new stall (or none): looked at from the start
            self.stall_step, self.looks, self.reported_hang = None, 0, False
        stalled = time.monotonic() - self.last_progress
        self._sample_long_step(stalled)
        due = self.threshold() * 2 ** self.looks
        if stalled < due:
            return
        self.stall_step, self.looks = self.last_step, self.looks + 1
        try:
            self._fire(stalled, due)
        except Exception as exc:
            self.warn(f"hang diagnosis failed: {type(exc).__name__}: {exc}")

    def _fire(self, stalled: float, due: float) -> None:
        """Look at this stall on every rank (each fires at the same multiple of the same threshold):
        watch, gather, and on rank 0 say what it is. Every rank takes part in the gather once it has
        fired, also if its own stall ended meanwhile: the others wait for it."""
        side = self.side
        since = self.last_progress
        before = telemetry.workers()
        moving = watch(WATCH_S)
        mine = {"rank": side.rank, "host": socket.gethostname(), "pid": os.getpid(), "step": self.last_step,
                "stalled_s": round(stalled + WATCH_S, 2), "stacks": stacks(), "flight_recorder": flight_recorder(),
                "moving": moving, "finished": self.finished, "workers": _watched(before, telemetry.workers())}
        try:
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
        if self.last_progress != since or self.job_ended:
            return   # the job stepped again (or ended) while this rank watched and gathered: no stall
        doc = json.loads(json.dumps(analyse(reports, side.size), default=str))
        if doc.get("ending"):
            return   # every rank's program returned: the job ends (rank 0 still writing its reports)
        doc["step"] = self.last_step
        if doc.get("busy"):
            print(format_pause(doc, stalled + WATCH_S, 2 * due), file=sys.stderr, flush=True)
            return
        if self.reported_hang:
            return   # said once for this stall
        self.reported_hang = True
        path = reportdir.atomic_write(reportdir.hang_path(self.report_dir, self.last_step),
                                      json.dumps(doc, indent=1))
        if self.on_diagnosis is not None:
            self.on_diagnosis(doc, self.last_step)
        print(format_hang(doc, stalled + WATCH_S) + f"\n  written to {path}", file=sys.stderr, flush=True)
        if doc.get("end_job"):
            finding = doc.get("finding") or {}
            victims = [str(r) for r in finding.get("victims") or []]
            waits = f"rank {victims[0]} waits" if len(victims) == 1 else f"ranks {', '.join(victims)} wait"
            msg = (f"eroica: rank {finding.get('rank')}'s program returned while {waits} for it in a collective: "
                   "the job cannot go on, ending it")
            print(msg, file=sys.stderr, flush=True)
            errorfile.write_message(msg)
            os._exit(3)
        if self.action == "abort":
            finding = doc.get("finding") or {}
            msg = (f"eroica: hang diagnosed (rank {finding.get('rank')} at {finding.get('function')}); "
                   f"--hang-action abort ends the job")
            print(msg, file=sys.stderr, flush=True)
            errorfile.write_message(msg)
            os._exit(3)
