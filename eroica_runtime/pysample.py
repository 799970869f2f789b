"""Where a rank's main thread runs Python of the user's own while a capture window is open: sampled.

The profiler records ops, not the Python between them. A rank whose training loop runs Python of its
own between ops (rank-0 bookkeeping over a growing history, engine/oncpu.py) showed only as time
outside any op, and its finding could only say "py-spy top --pid on this rank names the function".
torch.profiler's with_stack=True records every Python call and slows such code several times over,
in every capture. So while a window is open a thread looks at the main thread every INTERVAL_S and
books the time since its last look to the innermost frame of the user's own code there
(engine.longsteps.is_user_frame: not Python's library, an installed package or eroica), as
'file:line function' of the function's first line. The summary carries the frames with the most time
(``python``), and rank 0 compares the culprit's with its peers' (engine/oncpu.py, ``python_where``):
its peers run the same loop, so what only it runs stands out.

Time, not looks: a sampler waiting for the GIL gets it at once while the main thread sits in an op
that releases it (a collective's wait), but only every ``sys.getswitchinterval()`` (5 ms) while it
runs Python. Counted by looks, rank 0 of a job whose loop smoothed a long history in Python for 11 ms
of a 30 ms step had 4 of its 38 looks there (2026-12-07); the time between looks puts that time where
the main thread was when the sampler got in. Each look costs the main thread one GIL hand-over and a
walk up its stack.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import Counter
from types import FrameType
from typing import Any

from eroica_runtime.engine.longsteps import is_user_frame

INTERVAL_S = 0.002    # between two looks (more apart while the main thread holds the GIL)
MAX_SAMPLES = 4000    # a window's samples at most (a long window stops sampling, it keeps what it has)
TOP = 8               # frames a summary lists
_OWN = os.path.dirname(os.path.abspath(__file__)) + os.sep   # eroica's own frames are never the user's


def user_frame(frame: FrameType | None, depth: int = 256) -> str | None:
    """'file:line function' (the function's first line) of the innermost frame of the user's own code
    at or above ``frame``; None when there is none within ``depth`` frames."""
    while frame is not None and depth > 0:
        code = frame.f_code
        text = f"{code.co_filename}:{code.co_firstlineno} {code.co_name}"
        if is_user_frame(text) and not code.co_filename.startswith(_OWN):
            return text
        frame, depth = frame.f_back, depth - 1
    return None


class FrameSampler:
    """Samples the main thread's user frame from ``start`` to ``stop`` on a daemon thread of its own
    (named eroica-*, so hang.stacks leaves it out). Never raises: a sampler that fails stops sampling."""

    def __init__(self, interval_s: float = INTERVAL_S, max_samples: int = MAX_SAMPLES) -> None:
        self.interval_s, self.max_samples = interval_s, max_samples
        self._ms: Counter[str] = Counter()
        self._samples = 0
        self._total_ms = 0.0
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start sampling the main thread (a sampler already running goes on)."""
        if self._thread is not None:
            return
        self._ms, self._samples, self._total_ms = Counter(), 0, 0.0
        self._halt = threading.Event()
        main = threading.main_thread().ident
        thread = threading.Thread(target=self._run, args=(main, self._halt), name="eroica-pysample", daemon=True)
        thread.start()
        self._thread = thread

    def _run(self, main: int | None, halt: threading.Event) -> None:
        try:
            last = time.perf_counter()
            while not halt.wait(self.interval_s) and self._samples < self.max_samples:
                frame = sys._current_frames().get(main or -1)
                where = user_frame(frame)
                del frame
                now = time.perf_counter()
                ms, last = (now - last) * 1e3, now
                self._samples += 1
                self._total_ms += ms
                if where is not None:
                    self._ms[where] += ms
        except Exception:   # a frame that vanished under it, an interpreter shutting down: what it has
            pass

    def stop(self) -> dict[str, Any] | None:
        """Stop and return ``{"samples": looks taken, "ms": the time they cover, "frames": [[frame, ms],
        ...]}`` (the TOP with the most time, most first), None when it was not running or took no sample."""
        thread, self._thread = self._thread, None
        if thread is None:
            return None
        self._halt.set()
        thread.join(timeout=1.0)
        try:   # a thread still running past the join must not break the capture
            if not self._samples:
                return None
            return {"samples": int(self._samples), "ms": round(self._total_ms, 3),
                    "frames": [[frame, round(ms, 3)] for frame, ms in self._ms.most_common(TOP)]}
        except RuntimeError:
            return None
