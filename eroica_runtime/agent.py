"""The runtime inside each rank: wires the stages together and keeps eroica from ever hurting the job.

``bootstrap()`` is called by the sitecustomize in the rank's own process. Any error inside eroica is
caught, logged once, and switches eroica off for this rank while training continues.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from eroica_runtime import errorfile

_agent = None


def warn(msg: str) -> None:
    rank = os.environ.get("RANK", "?")
    print(f"[eroica rank {rank}] {msg}", file=sys.stderr, flush=True)


def bootstrap() -> None:
    """Entry from sitecustomize: error-file hook always; the runtime when EROICA_ENABLED=1."""
    errorfile.install()
    if os.environ.get("EROICA_ENABLED", "0") != "1":
        return
    import signal

    # SIGUSR1 (capture now) / SIGUSR2 (flush) arriving while the runtime starts must not kill the
    # rank (their default action): ignore them until the runtime's handlers are in place
    early = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGUSR1, signal.SIGUSR2)}
    try:
        install(signals_before=early)
    except Exception as exc:
        warn(f"disabled on this rank: {type(exc).__name__}: {exc}")
    if _agent is None or not getattr(_agent, "enabled", False):
        for sig, previous in early.items():
            signal.signal(sig, previous)


def install(signals_before: dict[int, Any] | None = None) -> None:
    """Start the runtime in this process (idempotent). ``signals_before``: see Runtime.start."""
    global _agent
    if _agent is not None:
        return
    from eroica_runtime.runtime import Runtime

    _agent = Runtime.start(signals_before)


def mark_step() -> None:
    """Mark a step boundary, for training loops without a torch.optim optimizer."""
    if _agent is not None:
        _agent.on_step()
