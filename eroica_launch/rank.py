"""The per-rank wrapper: started by mpiexec/srun (or run in place), it starts the training program.

Why a wrapper process: it learns the rank's identity from the MPI environment and hands the program
torchrun's variables, prefixes/tees/redirects its output like torchrun, forwards signals, and records
how the program ended (exit code or signal, host, pid, time, error file) so the launcher can print a
torchrun-style failure summary naming the root-cause rank. It never initializes MPI itself.

Usage (built by eroica_launch.plan): ``python -m eroica_launch.rank -- <command...>`` with the launch
settings in ``EROICA_LAUNCH_SPEC`` (JSON).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

from eroica_launch import oom
from eroica_launch.output import Pump
from eroica_launch.rankenv import Identity, RankEnvError, identity
from eroica_runtime import reportdir
from eroica_runtime.config import Config, ConfigError, env_name

SPEC_VAR = "EROICA_LAUNCH_SPEC"
FORWARDED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
NOT_STOPS = ("SIGUSR1", "SIGUSR2")   # forwarded, but a pre-timeout warning or the job's own, not a stop
EXIT_MARKER = "exiting.json"   # written by the program's last atexit handler (eroica_runtime.errorfile)
GROUP_RECORD = "group.json"   # the rank's process group, for the launcher's last sweep (end_groups)
RECORDS = ("error.json", "owner", "status.json", EXIT_MARKER, GROUP_RECORD)   # a rank folder's files (clear_records)
BOOTSTRAP_DIR = str(Path(__file__).resolve().parent.parent / "eroica_runtime" / "_bootstrap")


@dataclass
class RankSpec:
    """What the launcher decided, shared by every rank (serialized into EROICA_LAUNCH_SPEC)."""

    run_id: str
    run_dir: str
    attempt: int = 0
    max_restarts: int = 0
    nproc_per_node: int = 1
    role: str = "default"
    master_addr: str = "localhost"
    master_port: int = 29500
    enabled: bool = True
    prefix: bool = True
    redirects: str = "0"
    tee: str = "0"
    log_dir: str | None = None
    local_ranks_filter: str = ""
    signals_to_handle: str = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
    virtual_local_rank: bool = False
    extra_env: dict[str, str] = field(default_factory=dict)
    launch_id: str = ""   # one launch's (an attempt under mpiexec): its rank records carry it (supervise)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RankSpec:
        return cls(**json.loads(text))


def _std_mask(spec: str, local_rank: int) -> int:
    """torchrun's Std spec: '3' for all ranks or '0:1,1:2' per local rank -> bitmask (1 out, 2 err)."""
    spec = (spec or "0").strip()
    if ":" not in spec:
        return int(spec)
    for part in spec.split(","):
        r, v = part.split(":")
        if int(r) == local_rank:
            return int(v)
    return 0


def rank_env(ident: Identity, spec: RankSpec, base: dict[str, str]) -> dict[str, str]:
    """The environment the training program sees: torchrun's variables plus eroica's own."""
    env = dict(base)
    env.update(spec.extra_env)
    attempt_dir = Path(spec.run_dir) / f"attempt_{spec.attempt}" / str(ident.rank)
    env.update({
        "RANK": str(ident.rank),
        "LOCAL_RANK": "0" if spec.virtual_local_rank else str(ident.local_rank),
        "WORLD_SIZE": str(ident.world_size),
        "LOCAL_WORLD_SIZE": str(ident.local_world_size),
        "GROUP_RANK": str(ident.node_rank),
        "GROUP_WORLD_SIZE": str(ident.nnodes),
        "ROLE_NAME": spec.role,
        "ROLE_RANK": str(ident.rank),
        "ROLE_WORLD_SIZE": str(ident.world_size),
        "MASTER_ADDR": spec.master_addr,
        "MASTER_PORT": str(spec.master_port),
        "TORCHELASTIC_RUN_ID": spec.run_id,
        "TORCHELASTIC_RESTART_COUNT": str(spec.attempt),
        "TORCHELASTIC_MAX_RESTARTS": str(spec.max_restarts),
        # No elastic agent hosts a store here: rank 0's init_process_group creates the TCPStore.
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_SIGNALS_TO_HANDLE": spec.signals_to_handle,
        "TORCHELASTIC_ERROR_FILE": str(attempt_dir / "error.json"),
        "EROICA_OWNER_CLAIM": str(attempt_dir / "owner"),
        "EROICA_EXIT_MARKER": str(attempt_dir / EXIT_MARKER),
        "EROICA_ENABLED": "1" if spec.enabled else "0",
    })
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    if spec.enabled:
        env.setdefault("TORCH_FR_BUFFER_SIZE", "200")  # Flight Recorder: where each rank's collectives are
    if ident.local_world_size > 1:
        env.setdefault("OMP_NUM_THREADS", "1")
    if ident.local_world_size > (os.cpu_count() or 1):
        # oversubscribed MPICH spins a core in every blocking wait unless told to yield
        env.setdefault("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")
        env.setdefault("MPIR_CVAR_POLLS_BEFORE_YIELD", "10")
    if spec.virtual_local_rank and "CUDA_VISIBLE_DEVICES" not in base:
        env["CUDA_VISIBLE_DEVICES"] = str(ident.local_rank)
    # The bootstrap folder goes first so its sitecustomize runs before the user's program.
    pp = env.get("PYTHONPATH", "")
    parts = [p for p in pp.split(os.pathsep) if p and p != BOOTSTRAP_DIR]
    env["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, *parts])
    return env


def _pmi_fds(env: dict[str, str]) -> tuple[int, ...]:
    """The process manager's wire-up socket (PMI_FD for hydra and Slurm's pmi2) must reach the rank."""
    fds = []
    for var in ("PMI_FD", "PMI_CONTROL_FD"):
        value = env.get(var, "")
        if value.isdigit():
            fds.append(int(value))
    return tuple(fds)


def clear_records(rank_dir: Path) -> None:
    """Remove what a rank's wrapper (and its program) wrote of a rank's end into its folder of the report
    directory: a folder used before holds the last job's."""
    for stale in RECORDS:
        with contextlib.suppress(FileNotFoundError):
            (rank_dir / stale).unlink()


def die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A preexec_fn: the child gets ``sig`` when its parent dies, so nothing is left orphaned
    (a training rank when its wrapper is killed; mpiexec, with SIGTERM so it stops its ranks,
    when eroica-run is)."""

    def preexec() -> None:
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG
        except Exception:
            pass

    return preexec


def run_rank(spec: RankSpec, command: list[str], env: dict[str, str] | None = None,
             forward_signals: bool = True, stopped: list[tuple[int, float]] | None = None) -> int:
    """Start the training program as this rank, supervise it, record how it ended; return its code.
    ``stopped`` (eroica-run in place, as a task of srun or mpiexec) gets the first stop signal this
    process was sent (one of FORWARDED but SIGUSR1/2) and when: the job was stopped from outside."""
    base = dict(os.environ if env is None else env)
    base.pop(SPEC_VAR, None)
    try:
        ident = identity(base)
    except RankEnvError as exc:
        print(f"eroica-run: error: {exc}", file=sys.stderr, flush=True)
        return 2
    env_out = rank_env(ident, spec, base)
    attempt_dir = Path(env_out["TORCHELASTIC_ERROR_FILE"]).parent
    attempt_dir.mkdir(parents=True, exist_ok=True)
    clear_records(attempt_dir)

    shown = not spec.local_ranks_filter or str(ident.local_rank) in spec.local_ranks_filter.split(",")
    redirect = _std_mask(spec.redirects, ident.local_rank)
    tee = _std_mask(spec.tee, ident.local_rank)
    to_file = redirect | tee
    prefix = f"[rank{ident.rank}]:".encode() if spec.prefix and ident.world_size > 1 else b""
    log_dir = (Path(spec.log_dir) / spec.run_id / f"attempt_{spec.attempt}" / str(ident.rank)
               if spec.log_dir else None)
    if to_file and log_dir is None:
        print("eroica-run: --redirects/--tee need --log-dir; printing to the console instead",
              file=sys.stderr)
        to_file = redirect = tee = 0

    streams: list[tuple[int, IO[bytes]]] = [(1, sys.stdout.buffer), (2, sys.stderr.buffer)]
    pipes = {}
    files: dict[int, IO[bytes] | None] = {}
    for bit, _console in streams:
        wants_file = bool(to_file & bit)
        wants_console = shown and not (redirect & bit and not tee & bit)
        # stderr also goes through the pump while eroica is on: kineto logs every profiler start and
        # stop there (output.py), and a capture must not add lines to a job's log
        need_pipe = wants_file or not wants_console or bool(prefix) or (bit == 2 and spec.enabled)
        pipes[bit] = subprocess.PIPE if need_pipe else None
        if wants_file and log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
            files[bit] = open(log_dir / ("stdout.log" if bit == 1 else "stderr.log"), "ab")
        else:
            files[bit] = None

    started = time.time()
    kills_before = oom.oom_kills()
    adopt_orphans()
    try:
        # in a session of its own, as torchrun starts its workers: what it leaves behind when it ends
        # is its process group, ended with it (end_leftovers)
        child = subprocess.Popen(command, env=env_out, stdout=pipes[1], stderr=pipes[2], start_new_session=True,
                                 preexec_fn=die_with_parent(), pass_fds=_pmi_fds(base))
    except OSError as exc:
        _write_status(attempt_dir, ident, spec.launch_id, pid=None, exitcode=127, signame=None, started=started,
                      message=f"cannot start {command[0]!r}: {exc}")
        print(f"eroica-run: error: rank {ident.rank}: cannot start {command[0]!r}: {exc}", file=sys.stderr)
        return 127

    with contextlib.suppress(OSError):
        (attempt_dir / GROUP_RECORD).write_text(json.dumps(
            {"host": socket.gethostname(), "pid_ns": _pid_ns(), "pgid": child.pid, "launch": spec.launch_id}))

    pumps = []
    for bit, console in streams:
        stream = child.stdout if bit == 1 else child.stderr
        if stream is not None:
            wants_console = shown and not (redirect & bit and not tee & bit)
            pump = Pump(stream, console if wants_console else None, files[bit], prefix)
            pump.start()
            pumps.append(pump)

    def on_signal(signum: int, _frame: object) -> None:
        if stopped is not None and not stopped and signal.Signals(signum).name not in NOT_STOPS:
            stopped.append((signum, time.time()))
        if forward_signals:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)

    for name in FORWARDED:
        signal.signal(getattr(signal, name), on_signal)
    trail = oom.MemoryTrail(child.pid, memory_sample_s(base), _setting(base, "memory_startup_s"),
                            warn=lambda said: print(f"eroica-run: rank {ident.rank} (pid {child.pid}): {said}",
                                                    file=sys.stderr, flush=True))
    rc, message = wait_with_exit_guard(child, attempt_dir / EXIT_MARKER, exit_grace_s(base), tick=trail.sample)
    ended = time.time()  # before draining output: a killed rank's end must not look later than its victims'
    if message:
        print(f"eroica-run: rank {ident.rank}: {message}", file=sys.stderr, flush=True)
    end_leftovers(child.pid)
    for pump in pumps:
        pump.join(timeout=5)
    for f in files.values():
        if f is not None:
            f.close()
    signame = None
    if rc < 0:
        try:
            signame = signal.Signals(-rc).name
        except ValueError:
            signame = f"signal {-rc}"
    oom_said, certain = oom.explain(child.pid, kills_before, trail, ended) if rc == -signal.SIGKILL else ("", False)
    if rc > 0 and not message:   # its error may name DataLoader workers the kernel killed
        with contextlib.suppress(OSError):
            oom_said = oom.explain_workers((attempt_dir / "error.json").read_text(errors="replace")[:1 << 20],
                                           trail, ended)
            certain = bool(oom_said)
    if certain:   # said at once; a guess only in the failure summary, where the rank is a root cause
        print(f"eroica-run: rank {ident.rank} (pid {child.pid}): {oom_said}", file=sys.stderr, flush=True)
    _write_status(attempt_dir, ident, spec.launch_id, pid=child.pid, exitcode=rc, signame=signame, started=started, ended=ended,
                  message=message, oom=oom_said)
    return rc if rc >= 0 else 128 - rc


def _pid_ns() -> str:
    """This process's pid namespace ('' where unreadable): a process group's number means the same
    process group only within one."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def end_groups(attempt_dir: Path, launch: str | None) -> list[int]:
    """The launcher's last sweep, once mpiexec has ended: SIGKILL what is left of each rank's process
    group on this host (in this pid namespace). A wrapper ends its rank's group itself (end_leftovers),
    unless it was killed first, as mpiexec's own cleanup kills the other ranks' wrappers when one rank
    ends non-zero: a DataLoader worker stuck in a read then lived on, orphaned, after every aborted
    job (torchrun ends each worker's group). A group's number is not given to another process while
    any member lives, so a group found is the rank's. Returns the groups signalled."""
    here, ns, ended = socket.gethostname(), _pid_ns(), []
    with contextlib.suppress(OSError):
        for entry in os.scandir(attempt_dir):
            try:
                doc = json.loads(Path(entry.path, GROUP_RECORD).read_text())
                pgid = doc["pgid"]
                if (doc.get("host") != here or doc.get("pid_ns") != ns or not ns or type(pgid) is not int
                        or pgid <= 1 or (launch is not None and doc.get("launch") != launch)):
                    continue
                os.killpg(pgid, signal.SIGKILL)
                ended.append(pgid)
            except (OSError, ValueError, KeyError, TypeError):
                continue
    return ended


def adopt_orphans() -> None:
    """Make this wrapper the child subreaper of what the rank starts: a process orphaned below it (a
    dead rank's DataLoader workers) becomes the wrapper's child, so end_leftovers can reap it (where
    the machine's init never reaps, as in a container whose first process is a shell, a reparented
    zombie would stay a member of the rank's process group forever)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER


def end_leftovers(pgid: int, grace_s: float = 1.0, poll_s: float = 0.02) -> None:
    """End what the rank left in its process group when it ended: SIGTERM, then SIGKILL after ``grace_s``.

    Its DataLoader workers, mostly. A rank killed (by the OOM killer, a signal, the exit guard) leaves
    them orphaned: one in a long ``__getitem__`` lives on, holding memory (a GPU's too) into the next
    attempt of a restarted job, and every one holds the rank's output pipes, so the wrapper waited
    for them before it said how the rank ended. torchrun ends each worker's process group the same way
    (its SubprocessHandler.close); a process that left the group on purpose (its own session) is
    left alone. Call it only once the rank itself was waited for: reaping the group would reap it too.
    """
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    deadline, sig = time.monotonic() + grace_s, signal.SIGTERM
    while True:
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-pgid, os.WNOHANG)[0]:   # the orphans adopt_orphans made ours
                pass
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        if sig == signal.SIGTERM and time.monotonic() >= deadline:
            sig = signal.SIGKILL
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
            deadline = time.monotonic() + grace_s
        elif sig == signal.SIGKILL and time.monotonic() >= deadline:
            return   # zombies some other parent has yet to reap
        time.sleep(poll_s)


def _setting(env: dict[str, str], name: str) -> float:
    """A setting of config.py's table from the rank's environment; eroica-run checked the value, so a bad
    one here falls back to the default."""
    var = env_name(name)
    try:
        return float(getattr(Config.from_env({var: env[var]}) if env.get(var) else Config(), name))
    except ConfigError:
        return float(getattr(Config(), name))


def exit_grace_s(env: dict[str, str]) -> float:
    """EROICA_EXIT_GRACE_S: seconds a finished program may spend in interpreter teardown (0 = forever)."""
    return _setting(env, "exit_grace_s")


def memory_sample_s(env: dict[str, str]) -> float:
    """EROICA_MEMORY_SAMPLE_S: seconds between samples of the rank's anonymous memory (the rank's own,
    memwatch.py, and its wrapper's, oom.MemoryTrail, which outlives an OOM kill)."""
    return _setting(env, "memory_sample_s")


def wait_with_exit_guard(child: subprocess.Popen, marker: Path, grace_s: float,
                         poll_s: float = 0.2, tick: Callable[[], None] | None = None) -> tuple[int, str]:
    """Wait for the program; end it if it is still alive ``grace_s`` after it finished.

    The program writes ``marker`` (with the exit code it chose) from its last atexit handler: from
    then on only interpreter teardown is left, which a library thread can deadlock (see
    eroica_runtime.errorfile). A program that finished must end, so once the grace has passed the
    wrapper kills it and reports the exit code the program chose, with a message saying so.
    Returns (exit code, message); the message is empty for an ordinary exit. ``tick`` runs at every
    poll (the rank's memory trail).
    """
    seen: float | None = None
    while True:
        if tick is not None:
            tick()
        try:
            return child.wait(timeout=poll_s), ""
        except subprocess.TimeoutExpired:
            pass
        if grace_s <= 0:
            continue
        if seen is None:
            if marker.exists():
                seen = time.monotonic()
            continue
        if time.monotonic() - seen < grace_s:
            continue
        try:
            chosen = int(json.loads(marker.read_text())["exitcode"])
        except (OSError, ValueError, KeyError, TypeError):
            chosen = 1
        child.kill()
        child.wait()
        return chosen, (f"the program finished (exit code {chosen}) but was still tearing down "
                        f"{grace_s:.0f}s later (a library thread blocking interpreter exit, e.g. a gloo "
                        "worker waiting for the GIL); ended it (EROICA_EXIT_GRACE_S)")


def _write_status(attempt_dir: Path, ident: Identity, launch_id: str, *, pid: int | None, exitcode: int,
                  signame: str | None, started: float, message: str = "", ended: float | None = None,
                  oom: str = "") -> None:
    """Record how this rank ended (read by the launcher's failure summary); ``oom``: what eroica_launch/oom.py
    said of its SIGKILL death or of the DataLoader workers its error names."""
    doc = {"rank": ident.rank, "local_rank": ident.local_rank, "host": socket.gethostname(),
           "pid": pid, "exitcode": exitcode, "signal": signame, "started": started,
           "ended": ended if ended is not None else time.time(),
           "error_file": str(attempt_dir / "error.json"), "message": message, "oom": oom, "launch": launch_id}
    reportdir.atomic_write(attempt_dir / "status.json", json.dumps(doc))


def main() -> None:
    argv = sys.argv[1:]
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv or SPEC_VAR not in os.environ:
        print("usage: EROICA_LAUNCH_SPEC=... python -m eroica_launch.rank -- command...", file=sys.stderr)
        sys.exit(2)
    spec = RankSpec.from_json(os.environ[SPEC_VAR])
    sys.exit(run_rank(spec, argv))


if __name__ == "__main__":
    main()
