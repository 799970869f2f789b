"""The step clock: where a step ends, and how long it took, at a few microseconds per step.

A step ends at the global optimizer step post-hook of the first optimizer that steps (so several
optimizers or gradient accumulation still count one step per iteration), or at ``mark_step()``.
eroica's own time inside the boundary is excluded: each duration runs from the end of eroica's work at
the previous boundary to the start of this one. On CUDA, events recorded at the boundary are read
lazily once complete (never a device synchronize).
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

HISTORY = 4096


class StepClock:
    def __init__(self, on_boundary: Callable[[int, float], None], history: int = HISTORY) -> None:
        self.on_boundary = on_boundary
        self.step = 0                     # index of the step that ends at the next boundary
        self.durations: deque[tuple[int, float]] = deque(maxlen=history)
        self.all_ms: list[float] = []     # step times of steps 1, 2, ... (compact, for the job summary)
        self._last = time.perf_counter()
        self._first_opt: Any = None
        self._manual = False
        self._handle: Any = None
        self._cuda_events: deque[tuple[int, Any]] = deque()
        self._cuda = False

    def install(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._handle = register_optimizer_step_post_hook(self._optimizer_hook)
        try:
            import torch

            self._cuda = torch.cuda.is_available()
        except Exception:
            self._cuda = False

    def uninstall(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _optimizer_hook(self, optimizer: Any, _args: Any, _kwargs: Any) -> None:
        if self._manual:
            return
        if self._first_opt is None:
            self._first_opt = weakref.ref(optimizer)
        elif self._first_opt() is not optimizer:
            return
        self.boundary()

    def mark(self) -> None:
        """mark_step(): from the first call on, manual marks alone define steps."""
        self._manual = True
        self.boundary()

    def boundary(self) -> None:
        now = time.perf_counter()
        ms = (now - self._last) * 1e3
        step = self.step
        if step > 0:  # step 0 also holds start-up (model build, first batch): not a step time
            self.durations.append((step, ms))
            self.all_ms.append(ms)
        self.step += 1
        if self._cuda:
            self._record_cuda(step)
        self.on_boundary(step, ms)
        self._last = time.perf_counter()

    # ---- CUDA: device-side step times, read lazily -----------------------------------------------
    def _record_cuda(self, step: int) -> None:
        import torch

        if not torch.cuda.is_initialized():
            return
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        self._cuda_events.append((step, ev))
        while len(self._cuda_events) > 64:
            self._cuda_events.popleft()

    def gpu_durations(self) -> list[tuple[int, float]]:
        """(step, ms) between consecutive completed CUDA boundary events; non-blocking."""
        out = []
        events = list(self._cuda_events)
        for (_s0, e0), (s1, e1) in zip(events, events[1:], strict=False):
            if e1.query():
                out.append((s1, float(e0.elapsed_time(e1))))
        return out
