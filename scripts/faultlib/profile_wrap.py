"""Run train_bench.py under an always-on torch.profiler and export one chrome trace per rank.

Why: this is what users do today instead of eroica (profile everything, look at traces later); the
fault bench compares its step-time overhead and trace volume with eroica's dormant cost, and
``eroica analyze --traces`` is checked on these traces against eroica's live diagnosis of the same
fault. Same flags as train_bench.py; traces go to ``$EROICA_BENCH_TRACE_DIR`` (default ``./traces``)
as ``trace-rank<r>.json``, and each rank prints ``BENCH_TRACE {"rank", "bytes", "seconds", "export_s"}``
(seconds = time the profiler was on, for bytes per second).

Each optimizer step closes one ``ProfilerStep#N`` annotation (as a user's ``prof.step()`` in the
training loop would; ProfilerStep#N is training step N, #0 also holds the set-up).
``EROICA_BENCH_TRACE_GC=1`` also records Python GC pauses (``with_stack`` and
``record_python_gc_info``: without them a trace cannot tell a GC pause from any other host stall).
``EROICA_BENCH_TRACE_SCHEDULE=wait=4,warmup=1,active=3,repeat=3`` profiles as torch's documentation
teaches instead: ``torch.profiler.schedule(...)`` with ``tensorboard_trace_handler``, one
``<host>_<pid>.<ns>.pt.trace.json`` per profiling cycle (the rank only in its distributedInfo).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from torch.optim.optimizer import register_optimizer_step_post_hook  # noqa: E402
from torch.profiler import ProfilerAction  # noqa: E402

from faultlib import train_bench  # noqa: E402


def _always_record(_step: int) -> ProfilerAction:
    """A schedule that never stops recording: torch emits ProfilerStep#N annotations only with one."""
    return ProfilerAction.RECORD


def _profiler_options() -> dict[str, Any]:
    if os.environ.get("EROICA_BENCH_TRACE_GC", "") not in ("1", "true", "yes"):
        return {}
    from torch._C._profiler import _ExperimentalConfig

    return {"with_stack": True, "experimental_config": _ExperimentalConfig(record_python_gc_info=True)}


def _cycles(out: Path) -> dict[str, Any]:
    """``schedule`` and ``on_trace_ready`` from EROICA_BENCH_TRACE_SCHEDULE ("wait=4,warmup=1,active=3,repeat=3")."""
    spec = os.environ.get("EROICA_BENCH_TRACE_SCHEDULE", "")
    if not spec:
        return {"schedule": _always_record}
    try:
        args = {k.strip(): int(v) for k, _, v in (part.partition("=") for part in spec.split(","))}
        schedule = torch.profiler.schedule(**args)
    except (ValueError, TypeError) as exc:
        raise SystemExit(f"profile_wrap: EROICA_BENCH_TRACE_SCHEDULE={spec!r}: expected name=int pairs of "
                         f"torch.profiler.schedule, e.g. wait=4,warmup=1,active=3,repeat=3 ({exc})") from None
    return {"schedule": schedule,
            "on_trace_ready": torch.profiler.tensorboard_trace_handler(str(out))}


def main(argv: list[str] | None = None) -> int:
    rank = int(os.environ.get("RANK", os.environ.get("PMI_RANK", "0")))
    out = Path(os.environ.get("EROICA_BENCH_TRACE_DIR", "traces"))
    out.mkdir(parents=True, exist_ok=True)
    acts = [torch.profiler.ProfilerActivity.CPU]
    cycles = _cycles(out)
    t0 = time.perf_counter()
    with torch.profiler.profile(activities=acts, **cycles, **_profiler_options()) as prof:
        hook = register_optimizer_step_post_hook(lambda *_: prof.step())
        try:
            rc = train_bench.main(argv)
        finally:
            hook.remove()
    on_s = time.perf_counter() - t0
    if "on_trace_ready" in cycles:    # the handler wrote one file per cycle as it went
        paths, export_s = sorted(out.glob(f"*_{os.getpid()}.*.pt.trace.json")), 0.0
    else:
        paths = [out / f"trace-rank{rank}.json"]
        t1 = time.perf_counter()
        prof.export_chrome_trace(str(paths[0]))
        export_s = time.perf_counter() - t1
    print("BENCH_TRACE " + json.dumps({"rank": rank, "bytes": sum(p.stat().st_size for p in paths),
                                       "seconds": round(on_s, 3), "export_s": round(export_s, 3),
                                       "files": len(paths)}), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
