"""Process supervision: run the planned launch, forward signals, restart, and explain failures.

Exit codes and the failure summary follow torchrun: the first rank that failed is the root cause
(time, host, rank, local rank, exit code or signal name, pid, error file and traceback when known).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from eroica_launch.plan import Plan
from eroica_launch.rank import SPEC_VAR, clear_records, die_with_parent, end_groups, run_rank

PREFIX = "eroica-run"
_ALWAYS_FORWARDED = ("SIGUSR1", "SIGUSR2")
STOP_GRACE_S = 10.0   # in place, how long a task other than the first waits after a stop (run_plan)


def log(msg: str) -> None:
    print(f"[{PREFIX}] {msg}", file=sys.stderr, flush=True)


def run_plan(plan: Plan) -> int:
    """Launch (with restarts) and return the job's exit code."""
    for note in plan.notes:
        log(f"note: {note}")
    if plan.nproc_per_node > 1 and "OMP_NUM_THREADS" not in os.environ:
        log("setting OMP_NUM_THREADS=1 for each rank (as torchrun does); tune it for your application")
    first_task = plan.mode != "inplace" or os.environ.get("SLURM_PROCID", os.environ.get("PMI_RANK", "0")) == "0"
    if plan.spec.enabled and first_task:  # in place, every task runs eroica-run: one line is enough
        ranks = "all ranks" if plan.mode == "inplace" else \
            f"{plan.world_size} rank{'' if plan.world_size == 1 else 's'}"
        log(f"{ranks} via {plan.mode}; "
            f"eroica reports in {plan.report_dir}")
    rc = 0
    for attempt in range(plan.max_restarts + 1):
        launch = uuid.uuid4().hex if plan.mode != "inplace" else None   # one per eroica-run in place
        spec = replace(plan.spec, attempt=attempt, launch_id=launch or "")
        env = dict(plan.env)
        env[SPEC_VAR] = spec.to_json()
        attempt_dir = Path(spec.run_dir) / f"attempt_{attempt}"
        teardown: list[float] = []
        stopped: list[tuple[int, float]] = []
        if plan.mode == "inplace":
            # under Slurm every process of the step gets the step's signals already: don't double them
            rc = run_rank(spec, plan.command, env, forward_signals=not os.environ.get("SLURM_JOB_ID"),
                          stopped=stopped)
        else:
            forget_earlier_jobs(attempt_dir)
            rc = _run_launcher(plan, env, attempt_dir, teardown, launch, stopped)
            end_groups(attempt_dir, launch)
        if rc == 0:
            return 0
        if stopped:
            if first_task:
                return _stopped(plan, attempt_dir, launch, *stopped[0])
            # in place, every task was sent the stop and the first says it. A task that ends non-zero
            # makes mpiexec (and srun --kill-on-bad-exit) kill the others at once: the first was killed
            # while it read report.json, and nothing was said. The first's end ends this wait sooner
            time.sleep(STOP_GRACE_S)
            return 128 + stopped[0][0]
        failures = read_failures(attempt_dir, pending=plan.mode == "inplace", launch=launch)
        if plan.mode == "inplace" and not failures:
            return rc  # this task never started its program (its one-line error says why)
        if teardown:  # ranks we stopped after the root cause are not failures of their own
            failures = failures[:1] + [f for f in failures[1:] if (f.get("ended") or 0) < teardown[0]]
        print(failure_summary(plan.script, failures, launcher_rc=rc, mode=plan.mode), file=sys.stderr,
              flush=True)
        if failures:
            root = failures[0]
            rc = root["exitcode"] if root["exitcode"] > 0 else 128 + _signum(root)
        if attempt < plan.max_restarts:
            log(f"restarting the job ({attempt + 1}/{plan.max_restarts})")
    return rc or 1


def _signum(status: dict[str, Any]) -> int:
    return -int(status["exitcode"]) if status["exitcode"] < 0 else 0


def forget_earlier_jobs(attempt_dir: Path) -> None:
    """A report directory used before (``--report-dir`` given again, a restarted pod's) holds the rank
    records of the last job that used it. Its failed rank's status made the next job stop itself at
    once ("a rank failed") and blamed a process of the old job, unless that rank's wrapper cleared it
    before the launcher's first look, and never where the old job had more ranks. Cleared before the
    launch; a record written later by a wrapper of the old job still ending is told apart by its launch
    id (``launch`` in read_failures: a fresh one per launch, in every record its wrappers write)."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(attempt_dir):
            if entry.name.isdigit() and entry.is_dir(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    clear_records(Path(entry.path))


def _stopped(plan: Plan, attempt_dir: Path, launch: str | None, signum: int, at: float) -> int:
    """The job was stopped from outside: eroica-run got a stop signal (scancel or a time limit's
    SIGTERM, ^C, a pod's termination) and passed it on. Said as such, with what eroica had found
    by then, and never restarted (torchrun's agent raises on the signal; --max-restarts is for
    failures): a scancelled job with --max-restarts used to start again while Slurm waited to kill
    it, and its failure summary named whichever rank the SIGTERM ended first as the root cause.
    A rank that had failed before the signal still gets the usual failure summary. Exit code
    128 + the signal, as a shell reports a process the signal ended. In place (``srun eroica-run``),
    where scancel signals every task and its program, the first task says it; before, each task
    blamed its own rank ("Root Cause ... SIGTERM") and restarted it under --max-restarts."""
    name = signal.Signals(signum).name
    # in place, every task is sent the stop, and another task's rank may end of it before this task's
    # handler runs: a rank the stop's own signal ended is none of the job's failures
    failures = [f for f in read_failures(attempt_dir, launch=launch)
                if (f.get("ended") or at) < at and f.get("exitcode") != -signum]
    if failures:
        print(failure_summary(plan.script, failures, launcher_rc=128 + signum, mode=plan.mode), file=sys.stderr,
              flush=True)
    when = time.strftime("%Y-%m-%d_%H:%M:%S", time.localtime(at))
    bar = "=" * 60
    lines = [bar, f"{plan.script} STOPPED", "-" * 60,
             f"eroica-run got {name} at {when}, and so did the ranks: the job was stopped from outside\n"
             f"(scancel, a time limit, ^C, kill), not ended by a rank of its own"
             + (" (the failure above came first)" if failures else "")
             + (f"; not restarted (--max-restarts {plan.max_restarts} is for failures)" if plan.max_restarts else "")]
    if plan.spec.enabled:
        from eroica_runtime.report import until_stopped_text
        lines.append(until_stopped_text(plan.report_dir))
    print("\n".join([*lines, bar]), file=sys.stderr, flush=True)
    return 128 + signum


def _run_launcher(plan: Plan, env: dict[str, str], attempt_dir: Path, teardown: list[float],
                  launch: str | None = None, stopped: list[tuple[int, float]] | None = None) -> int:
    """Run mpiexec/srun in its own session; forward our signals; stop the job when a rank fails.

    Like torchrun's agent, one failed rank ends the whole job at once (MPI launchers wait for the
    others when the failed process never initialized MPI). ``stopped`` gets the first stop signal
    eroica-run was sent (one of --signals-to-handle but SIGUSR1/2) and when.
    """
    stopped = [] if stopped is None else stopped
    try:
        # own session (so a terminal's Ctrl-C reaches us, not mpiexec, and we stop it cleanly), but
        # tied to our life: if eroica-run is killed outright, mpiexec gets SIGTERM and takes the ranks
        proc = subprocess.Popen(plan.argv, env=env, start_new_session=True, preexec_fn=die_with_parent(signal.SIGTERM))
    except OSError as exc:
        log(f"error: cannot start {plan.argv[0]!r}: {exc}")
        return 127
    stopping: list[float] = []

    def forward(signum: int, _frame: object) -> None:
        sig = signum
        if plan.mode == "srun" and signum == signal.SIGINT:
            sig = signal.SIGTERM  # srun wants two SIGINTs within a second to stop; one SIGTERM does
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            return
        if signal.Signals(signum).name in _ALWAYS_FORWARDED:
            return
        if not stopping:
            stopping.append(time.monotonic())
        if not stopped:   # also while a failed rank's teardown runs: a stopped job is not restarted
            stopped.append((signum, time.time()))

    names = {n.strip() for n in plan.spec.signals_to_handle.split(",") if n.strip()} | set(_ALWAYS_FORWARDED)
    previous = {}
    for name in names:
        sig = getattr(signal, name, None)
        if sig is not None:
            previous[sig] = signal.signal(sig, forward)
    said = False
    try:
        while True:
            try:
                return proc.wait(timeout=max(plan.monitor_interval, 0.05))
            except subprocess.TimeoutExpired:
                if stopped and not said:   # said here, not in the handler (no printing in a signal handler)
                    said = True
                    log(f"got {signal.Signals(stopped[0][0]).name}: passed to every rank (SIGKILL to any left "
                        f"{plan.shutdown_timeout:.0f}s later, --shutdown-timeout)")
                if not teardown and _any_failed(attempt_dir, launch):
                    teardown.append(time.time())
                    stopping.append(time.monotonic())
                    if not stopped:   # else the ranks end by the stop signal eroica-run passed on
                        log("a rank failed: stopping the others")
                    try:
                        os.kill(proc.pid, signal.SIGTERM)
                    except ProcessLookupError:
                        pass
                if stopping and time.monotonic() - stopping[0] > plan.shutdown_timeout:
                    log(f"ranks still running {plan.shutdown_timeout:.0f}s after the stop signal: killing")
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _this_job(doc: dict[str, Any], launch: str | None) -> bool:
    """A rank record of this launch (``launch`` None, in place: any)."""
    return launch is None or doc.get("launch") == launch


def _any_failed(attempt_dir: Path, launch: str | None = None) -> bool:
    """Cheap poll: has any rank of this attempt recorded a non-zero end?"""
    try:
        entries = list(os.scandir(attempt_dir))
    except OSError:
        return False
    for entry in entries:
        try:
            with open(os.path.join(entry.path, "status.json")) as f:
                doc = json.load(f)
            if doc.get("exitcode") != 0 and _this_job(doc, launch):
                return True
        except (OSError, ValueError):
            continue
    return False


def read_failures(attempt_dir: Path, *, pending: bool = False, launch: str | None = None) -> list[dict[str, Any]]:
    """Every rank that ended non-zero in this attempt, first failure first (``launch``: of that launch's
    ranks only: forget_earlier_jobs).

    pending (in place): a rank whose error file exists but whose wrapper has not yet recorded its end
    counts too; there a victim's eroica-run can print its summary while the culprit is still being
    reaped, and must not blame itself. Under mpiexec every wrapper has ended by now, and one without a
    status was stopped by the teardown: its error is the teardown's doing, not a failure of its own.
    """
    out = []
    for rank_dir in sorted(p for p in attempt_dir.glob("*") if p.is_dir() and p.name.isdigit()):
        status, error = rank_dir / "status.json", rank_dir / "error.json"
        try:
            doc = json.loads(status.read_text())
        except FileNotFoundError:
            if not pending or not error.exists():
                continue
            doc = {"rank": int(rank_dir.name),
                   "exitcode": 1, "error_file": str(error), "ended": None, "host": None, "pid": None,
                   "local_rank": None}
        except (OSError, ValueError):
            continue
        if doc.get("exitcode") != 0 and _this_job(doc, launch):
            doc["traceback"] = _traceback(doc)
            out.append(doc)
    out.sort(key=lambda d: (_failed_at(d), d.get("rank", 0)))
    return out


# signals that end a process before it can write an error file: killed outright (the OOM killer, a node
# agent, a self-kill) or crashed
_HARD_SIGNALS = frozenset(int(getattr(signal, n)) for n in ("SIGKILL", "SIGSEGV", "SIGBUS", "SIGABRT", "SIGILL",
                                                            "SIGFPE"))
REAP_SLACK_S = 2.0   # how much earlier than its wrapper saw it such a rank may have died (see _failed_at)


def _failed_at(status: dict[str, Any]) -> float:
    """When the rank failed: when its error file was written (torchrun's rule), else when it ended.

    Under load a failing rank can be reaped after the ranks it brought down, so end times alone
    can blame a victim. The file's own timestamp has whole seconds only (torchrun's format), and a
    victim usually fails within the same second, so the file's mtime decides.

    A rank killed by a signal (SIGKILL, a crash) writes no error file, and its end is when its
    wrapper reaped it: on a loaded host that came after its peers had raised on the broken
    connection ("Connection reset by peer", milliseconds later) and written theirs, and a fresh-clone
    CI run blamed such a victim (exit 143) for a rank that SIGKILLed itself (137). Such a death counts
    as up to ``REAP_SLACK_S`` earlier than its wrapper saw it.
    """
    times = [float(status["ended"])] if status.get("ended") else []
    written = False
    if status.get("error_file"):
        with contextlib.suppress(OSError):
            times.append(os.stat(status["error_file"]).st_mtime)
            written = True
    at = min(times, default=0.0)
    code = status.get("exitcode")
    if times and not written and isinstance(code, int) and code < 0 and -code in _HARD_SIGNALS:
        at -= REAP_SLACK_S
    return at


def _traceback(status: dict[str, Any]) -> str:
    """The error file's message (torchrun's format) or a signal line."""
    path = status.get("error_file")
    if path and os.path.exists(path):
        try:
            doc = json.loads(Path(path).read_text())
            msg = doc.get("message", {})
            said = str(msg.get("extraInfo", {}).get("py_callstack") or msg.get("message") or "") \
                if isinstance(msg, dict) else str(msg)
            return said + (f"\n{status['oom']}" if status.get("oom") else "")
        except (OSError, ValueError):
            pass
    if status.get("signal"):
        said = f"Signal {-status['exitcode']} ({status['signal']}) received by PID {status.get('pid')}"
        return said + (f": {status['oom']}" if status.get("oom") else "")
    if status.get("message"):
        return str(status["message"])
    return "To see the traceback, let the rank's exception reach the top level (eroica records it)."


def _block(index: int, st: dict[str, Any]) -> str:
    when = time.strftime("%Y-%m-%d_%H:%M:%S", time.localtime(st.get("ended") or time.time()))
    code = st["exitcode"]
    tb = str(st.get("traceback") or "").rstrip().replace("\n", "\n    ")
    return "\n".join([
        f"[{index}]:",
        f"  time      : {when}",
        f"  host      : {st.get('host')}",
        f"  rank      : {st.get('rank')} (local_rank: {st.get('local_rank')})",
        f"  exitcode  : {code} (pid: {st.get('pid')})"
        + (f" [signal {st['signal']}]" if st.get("signal") else ""),
        f"  error_file: {st.get('error_file') if os.path.exists(str(st.get('error_file'))) else '<N/A>'}",
        f"  traceback : {tb}",
    ])


def failure_summary(script: str, failures: list[dict[str, Any]], *, launcher_rc: int, mode: str) -> str:
    """torchrun's ChildFailedError layout: other failures, then the root cause (first failure)."""
    bar, thin = "=" * 60, "-" * 60
    lines = [bar, f"{script} FAILED", thin, "Failures:"]
    if len(failures) > 1:
        lines += [_block(i, f) for i, f in enumerate(failures[1:], start=1)]
    else:
        lines.append("  <NO_OTHER_FAILURES>")
    lines += [thin, "Root Cause (first observed failure):"]
    if failures:
        lines.append(_block(0, failures[0]))
    else:
        lines.append(f"[0]:\n  {mode} exited with code {launcher_rc} before any rank reported how it "
                     "ended (see the launcher's messages above)")
    lines.append(bar)
    return "\n".join(lines)
