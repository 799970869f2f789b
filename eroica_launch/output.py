"""A rank's output on its way to the console and log files: ``[rankN]:`` prefixes, kineto's log lines
left out, whole lines, and a partial line passed on once the rank pauses.

Why whole lines: every rank writes to the same console, and a line cut where a pipe read ended
would let another rank's line land in the middle of it. Why a partial line still goes out after a
pause (PAUSE_S): a progress bar (tqdm) redraws one line with carriage returns and writes a newline
only when it ends; copying strictly line by line held the whole bar back until then. Why filter:
kineto logs ``USDT: ... ActivityProfilerHandler.cpp ... profiler_start`` / ``profiler_stop`` on stderr
at every profiler start and stop, whatever ``KINETO_LOG_LEVEL`` short of silencing its errors too, so
every eroica window would add two lines per rank to the job's log.
"""

from __future__ import annotations

import os
import re
import select
import threading
import time
from typing import IO

KINETO_NOISE = (b"USDT:", b"STAGE:")
TOGGLE_WARNING = b"] Toggling CPU activity with"   # torch's warning at a toggle of host-op collection
TORCH_WARNING = re.compile(rb"(?:\[rank\d+\]:)?\[W\d")
# torch's soft assert when a range still open at a profiler's stop sits inside another open range:
# eroica's window stops in the optimizer step's post-hook, and a job's own profiler waiting for its
# steps has a ProfilerStep#N range open around that optimizer step ("[W1207 07:01:19.734715178
# collection.cpp:664] Warning: Optimizer.step#AdamW.step (function operator())", once a capture on
# every rank); the step's end is the window's, which the summary cuts at anyway
OPEN_AT_STOP_WARNING = re.compile(rb"(?:\[rank\d+\]:)?\[W\d[^\]]* collection\.cpp:\d+\] Warning: .*"
                                  rb"\(function operator\(\)\)\r?\n?$")
PAUSE_S = 0.1        # a partial line held this long is passed on (a progress bar redraws every ~0.1 s)
MAX_HELD = 1 << 16   # ... and one this long at once, whatever it may become


def is_kineto_noise(line: bytes) -> bool:
    """A kineto profiler start/stop or stage log line (the line, newline included or not):
    ``USDT:... SyncActivityProfilerHandler.cpp:52] profiler_start``, ``STAGE:...
    GenericActivityProfiler.cpp:806] Completed Stage: Collection`` (or ActivityProfilerController.cpp
    in older torch); or torch's warning at each toggle of host-op collection, which eroica's capture
    does around the lead-in step: ``[W1201 12:55:23.796823256 profiler_kineto.cpp:814] Toggling CPU
    activity with GPU activity on may result in traces with GPU events on arbitrary tracks``; or its
    soft assert on a range open at the stop of eroica's window (OPEN_AT_STOP_WARNING)."""
    if line.startswith(KINETO_NOISE):
        return b"ActivityProfiler" in line or b"Completed Stage" in line
    # torch writes its C++ warnings with its own "[rankN]:" prefix once a process group exists
    return (TOGGLE_WARNING in line and TORCH_WARNING.match(line) is not None) or \
        OPEN_AT_STOP_WARNING.match(line) is not None


class LineFilter:
    """Turns a rank's raw output chunks into what the console shows: whole lines, each prefixed once
    (not when torch already wrote the prefix), kineto's profiler lines dropped.

    A partial line is held until its newline comes, or until ``release()`` (the rank paused), which
    passes it on unless it may still become a kineto line or the prefix itself."""

    def __init__(self, prefix: bytes = b"") -> None:
        self.prefix = prefix
        self.held = b""               # the partial line not passed on yet
        self._at_start = True         # ``held`` (or the next byte) starts a line

    def feed(self, data: bytes) -> bytes:
        """The complete lines ``data`` finishes, ready to write; a partial line at its end is held."""
        buf, self.held = self.held + data, b""
        out: list[bytes] = []
        pos = 0
        while True:                       # an index, not slices of the rest: a chunk holds ~10^3 lines
            nl = buf.find(b"\n", pos)
            if nl < 0:
                self.held = buf[pos:]
                return b"".join(out)
            line = buf[pos:nl + 1]
            if not self._at_start:
                out.append(line)
            elif not is_kineto_noise(line):
                out.append(self._line_start(line))
            self._at_start = True
            pos = nl + 1

    def release(self, force: bool = False) -> bytes:
        """A partial line held PAUSE_S (a progress bar): the held part, unless it may still become a
        kineto line or the prefix torch writes itself (those wait for more, unless ``force``)."""
        held = self.held
        if not held:
            return b""
        if self._at_start:
            maybe = held.startswith(KINETO_NOISE) or any(h.startswith(held) for h in (*KINETO_NOISE, self.prefix) if h)
            if maybe and not force:
                return b""
            held = self._line_start(held)
        self.held, self._at_start = b"", False
        return held

    def flush(self) -> bytes:
        """The end of the stream: whatever is held, as it is (a kineto line is still dropped)."""
        held, self.held = self.held, b""
        if not held or (self._at_start and is_kineto_noise(held)):
            return b""
        return self._line_start(held) if self._at_start else held

    def _line_start(self, text: bytes) -> bytes:
        if not self.prefix or text.startswith(self.prefix):
            return text
        return self.prefix + text


class Pump(threading.Thread):
    """Copy one child stream to the console (through a LineFilter) and/or a log file (as written,
    kineto's lines left out)."""

    def __init__(self, src: IO[bytes], console: IO[bytes] | None, logfile: IO[bytes] | None,
                 prefix: bytes) -> None:
        super().__init__(daemon=True)
        self.src, self.console, self.logfile = src, console, logfile
        self._to_console, self._to_file = LineFilter(prefix), LineFilter()

    def _write(self, console_bytes: bytes, file_bytes: bytes) -> None:
        self.logfile = _put(self.logfile, file_bytes)
        self.console = _put(self.console, console_bytes)

    def _held(self) -> int:
        return max(len(self._to_console.held), len(self._to_file.held))

    def run(self) -> None:
        fd = self.src.fileno()
        since: float | None = None        # when the partial line now held was first held
        try:
            while True:
                if since is not None:
                    # age, not quiet: a bar redrawn every 0.1 s never leaves the pipe quiet that long
                    wait = since + PAUSE_S - time.monotonic()
                    if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                        self._write(self._to_console.release(), self._to_file.release())
                        since = None
                        if self._held():
                            select.select([fd], [], [])      # may be kineto's: wait for its newline
                        continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                self._write(self._to_console.feed(chunk), self._to_file.feed(chunk))
                if self._held() > MAX_HELD:
                    self._write(self._to_console.release(force=True), self._to_file.release(force=True))
                since = (since or time.monotonic()) if self._held() else None
            self._write(self._to_console.flush(), self._to_file.flush())
        finally:
            self.src.close()


def _put(out: IO[bytes] | None, data: bytes) -> IO[bytes] | None:
    """Write and flush; None from now on when ``out`` failed. A console that went away (eroica-run
    piped into `head`) or a full disk must not stop the draining: the rank would block on a full
    pipe, or die of a broken one."""
    if out is not None and data:
        try:
            out.write(data)
            out.flush()
        except (OSError, ValueError):
            return None
    return out
