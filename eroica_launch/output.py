"""A rank's output on its way to the console and log files: ``[rankN]:`` prefixes, kineto's log lines
left out, and partial lines passed on as they come.

Why a stream and not lines: a progress bar (tqdm) redraws one line with carriage returns and writes a
newline only when it ends; copying line by line held the whole bar back until then. Why filter: kineto
logs ``USDT: ... ActivityProfilerHandler.cpp ... profiler_start`` / ``profiler_stop`` on stderr at every
profiler start and stop, whatever ``KINETO_LOG_LEVEL`` short of silencing its errors too, so every
eroica window would add two lines per rank to the job's log.
"""

from __future__ import annotations

import os
import threading
from typing import IO

KINETO_NOISE = (b"USDT:", b"STAGE:")


def is_kineto_noise(line: bytes) -> bool:
    """A kineto profiler start/stop or stage log line (the line, newline included or not):
    ``USDT:... SyncActivityProfilerHandler.cpp:52] profiler_start``, ``STAGE:...
    GenericActivityProfiler.cpp:806] Completed Stage: Collection`` (or ActivityProfilerController.cpp
    in older torch)."""
    return line.startswith(KINETO_NOISE) and (b"ActivityProfiler" in line or b"Completed Stage" in line)


class LineFilter:
    """Turns a rank's raw output chunks into what the console shows: each line prefixed once (not when
    torch already wrote the prefix), kineto's profiler lines dropped, the rest passed on at once.

    Only the start of a line is ever held back, and only while it could still be a prefix already
    written or a kineto line (which is dropped whole, so it waits for its newline)."""

    def __init__(self, prefix: bytes = b"") -> None:
        self.prefix = prefix
        self._held = b""
        self._at_start = True
        self._heads = tuple(h for h in (*KINETO_NOISE, prefix) if h)

    def _undecided(self, head: bytes) -> bool:
        """The start of a line, no newline yet: wait for more bytes before deciding?"""
        if head.startswith(KINETO_NOISE):
            return True                                      # drop or keep it whole
        return any(len(head) < len(h) and h.startswith(head) for h in self._heads)

    def feed(self, data: bytes) -> bytes:
        """What to write for ``data`` (may be empty: the start of a line held back)."""
        buf, self._held = self._held + data, b""
        out: list[bytes] = []
        pos, end = 0, len(buf)
        while pos < end:                  # an index, not slices of the rest: a chunk holds ~10^3 lines
            nl = buf.find(b"\n", pos)
            cut = end if nl < 0 else nl + 1
            if not self._at_start:
                out.append(buf[pos:cut])
            elif nl < 0 and self._undecided(buf[pos:]):
                self._held = buf[pos:]              # still at a line start
                break
            elif nl < 0 or not is_kineto_noise(buf[pos:cut]):
                out.append(self._line_start(buf[pos:cut]))
            self._at_start = nl >= 0
            pos = cut
        return b"".join(out)

    def flush(self) -> bytes:
        """The end of the stream: a held line start is written as it is."""
        held, self._held = self._held, b""
        if not held or is_kineto_noise(held):
            return b""
        self._at_start = False
        return self._line_start(held)

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

    def run(self) -> None:
        fd = self.src.fileno()
        try:
            while True:
                chunk = os.read(fd, 65536)       # what is there now: a partial line is not held back
                if not chunk:
                    break
                self._write(self._to_console.feed(chunk), self._to_file.feed(chunk))
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
