"""Launch planning: turn torchrun-style flags into an mpiexec, srun or in-place launch.

- Already an MPI/Slurm task (started by mpiexec or srun): run in place, in this process.
- Inside a Slurm allocation: ``srun --mpi=<plugin for this MPI>``.
- Otherwise: ``mpiexec`` from the MPI that mpi4py uses (a hostfile for several nodes).
Flags that make no sense under MPI are mapped (with a note) or refused with a one-line reason.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from eroica_launch.rank import SPEC_VAR, RankSpec
from eroica_launch.rankenv import is_launched_task, slurm_default_port, slurm_first_host
from eroica_runtime.config import Config


class LaunchError(RuntimeError):
    """A launch that cannot work; the message says what to do instead."""


@dataclass(frozen=True)
class Plan:
    mode: str                       # "mpiexec" | "srun" | "inplace"
    argv: list[str]                 # the launcher command (mpiexec/srun ...), or the rank command in place
    env: dict[str, str]             # environment for the launched processes
    spec: RankSpec
    command: list[str]              # the training program's command line for each rank
    world_size: int
    nnodes: int
    nproc_per_node: int
    report_dir: str
    script: str
    max_restarts: int = 0
    monitor_interval: float = 0.1
    shutdown_timeout: float = 30.0
    notes: list[str] = field(default_factory=list)


# For eroica's own `python -m` processes (the rank wrapper, the MPI question): -m puts the working
# directory first on sys.path, and a job run from a directory with a module of its own named as one of
# the standard library's (a json.py) broke the wrapper's imports (mpiexec exited 1, no rank started)
# where torchrun's console script never looks there. -P leaves it off; Python 3.10 has no -P.
SAFE_PATH: tuple[str, ...] = ("-P",) if sys.version_info >= (3, 11) else ()


@dataclass(frozen=True)
class MpiInfo:
    library: str            # path of the MPI library mpi4py loads
    mpiexec: str | None     # the matching mpiexec
    flavour: str            # "mpich" | "openmpi" | "unknown"


@functools.lru_cache(maxsize=1)
def mpi_info() -> MpiInfo:
    """Which MPI mpi4py uses, and its mpiexec (asked in a subprocess: importing MPI here would init it)."""
    python = sys.executable   # SAFE_PATH's flags are this interpreter's
    try:
        lib = subprocess.run([python, *SAFE_PATH, "-m", "mpi4py", "--mpi-library"], capture_output=True, text=True,
                             timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        lib = ""
    candidates = []
    if lib and os.path.isabs(lib):
        candidates.append(Path(lib).resolve().parent.parent / "bin" / "mpiexec")
        candidates.append(Path(lib).parent.parent / "bin" / "mpiexec")
    candidates.append(Path(python).parent / "mpiexec")
    mpiexec = next((str(c) for c in candidates if c.exists()), None) or shutil.which("mpiexec")
    flavour = "unknown"
    if mpiexec:
        try:
            out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30)
            text = (out.stdout + out.stderr).lower()
            flavour = "openmpi" if ("open mpi" in text or "openrte" in text) else (
                "mpich" if "hydra" in text or "mpich" in text else "unknown")
        except (OSError, subprocess.SubprocessError):
            pass
    return MpiInfo(lib, mpiexec, flavour)


def resolve_nproc(value: str) -> int:
    """torchrun's --nproc-per-node: int | auto | cpu | gpu."""
    if value.isdigit():
        n = int(value)
        if n < 1:
            raise LaunchError("--nproc-per-node must be >= 1")
        return n
    if value == "cpu":
        return os.cpu_count() or 1
    if value in ("gpu", "auto"):
        gpus = _gpu_count()
        if gpus:
            return gpus
        if value == "gpu":
            raise LaunchError("--nproc-per-node gpu: no CUDA device is visible on this node")
        return os.cpu_count() or 1
    raise LaunchError(f"--nproc-per-node {value!r}: use an integer, auto, cpu or gpu")


def _gpu_count() -> int:
    """GPUs on this node, from NVML (cheaper than importing torch in the launcher)."""
    from eroica_runtime.telemetry import gpu_inventory

    return gpu_inventory()[0]


def parse_nnodes(value: str) -> int:
    """N or MIN:MAX; MPI starts a fixed set of processes, so MIN must equal MAX."""
    if ":" in value:
        lo, hi = value.split(":", 1)
        if lo != hi:
            raise LaunchError(f"--nnodes {value}: elastic node ranges need torchrun's elastic agent; "
                              "under MPI the node count is fixed (use --nnodes N)")
        value = lo
    if not value.isdigit() or int(value) < 1:
        raise LaunchError(f"--nnodes {value!r}: expected a positive integer")
    return int(value)


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A port free now and outside the kernel's ephemeral range.

    A port the kernel handed out for bind(0) sits in the ephemeral range, where any outgoing
    connection (gloo, MPI, a test next door) may take it before rank 0's store listens on it
    (EADDRINUSE at init_process_group). Ports below the range are only ever taken by explicit binds.
    """
    lo, hi = _ephemeral_range()
    candidates = [p for p in (random.randrange(20000, lo) if lo > 21000 else 0 for _ in range(20)) if p]
    for port in candidates:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _job_id(args: argparse.Namespace, env: dict[str, str]) -> str:
    if args.rdzv_id and args.rdzv_id != "none":
        return args.rdzv_id
    if env.get("SLURM_JOB_ID"):
        step = env.get("SLURM_STEP_ID")
        return f"slurm-{env['SLURM_JOB_ID']}" + (f".{step}" if step and step.isdigit() else "")
    return time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"


def _command(args: argparse.Namespace) -> list[str]:
    """The training program's command line, as torchrun builds it (python -u ...)."""
    script_args = list(args.training_script_args)
    if args.no_python:
        if args.module:
            raise LaunchError("--no-python and -m/--module cannot be used together")
        return [args.training_script, *script_args]
    if args.module:
        return [sys.executable, "-u", "-m", args.training_script, *script_args]
    if args.run_path:
        code = ("import runpy, sys; sys.argv = sys.argv[1:]; "
                "runpy.run_path(sys.argv[0], run_name='__main__')")
        return [sys.executable, "-u", "-c", code, args.training_script, *script_args]
    return [sys.executable, "-u", args.training_script, *script_args]


def plan_launch(args: argparse.Namespace, cfg: Config, env: dict[str, str] | None = None) -> Plan:
    """Decide how to start the ranks; raise LaunchError with a one-line reason when it cannot work."""
    env = dict(os.environ if env is None else env)
    notes: list[str] = []
    nnodes = parse_nnodes(args.nnodes)
    if args.standalone and nnodes != 1:
        notes.append(f"--standalone: single node, so --nnodes {args.nnodes} is treated as 1 (as torchrun does)")
        nnodes = 1
    nproc = resolve_nproc(str(args.nproc_per_node))
    if args.rdzv_backend not in ("static", "c10d"):
        raise LaunchError(f"--rdzv-backend {args.rdzv_backend}: only static and c10d map onto MPI "
                          "(MPI's process manager does the rendezvous)")
    if args.logs_specs:
        raise LaunchError("--logs-specs plug-ins do not apply under MPI; use --log-dir/--tee/--redirects")
    if args.numa_binding:
        raise LaunchError("--numa-binding is not supported; bind with your MPI launcher's options "
                          "(--mpiexec-args, e.g. '-bind-to numa' for MPICH)")
    if args.start_method != "spawn":
        notes.append(f"--start-method {args.start_method}: ranks are started by the MPI launcher as fresh "
                     "processes (like spawn)")
    if args.rdzv_conf:
        keys = [kv.split("=", 1)[0] for kv in args.rdzv_conf.split(",") if kv]
        notes.append(f"--rdzv-conf {','.join(keys)}: MPI does the rendezvous; these keys have no effect")
    if args.duplicate_stdout_filters or args.duplicate_stderr_filters:
        notes.append("--duplicate-std*-filters: not supported; use --tee with --log-dir")
    if args.event_log_handler not in ("null", None):
        notes.append("--event-log-handler: eroica records events in its report directory instead")

    for flag, value in (("--redirects", args.redirects), ("--tee", args.tee)):
        if not _STD_SPEC.fullmatch(str(value or "0").strip()):
            raise LaunchError(f"{flag} {value!r}: use 0-3 (1 stdout, 2 stderr, 3 both) or per local rank, "
                              "e.g. 0:1,1:2")

    launcher = args.launcher
    in_task = is_launched_task(env)
    in_alloc = bool(env.get("SLURM_JOB_ID")) and not in_task
    if launcher == "auto":
        launcher = "inplace" if in_task else ("srun" if in_alloc else "mpiexec")
    if launcher == "srun" and not env.get("SLURM_JOB_ID"):
        raise LaunchError("--launcher srun needs a Slurm allocation (run inside sbatch or salloc)")

    # Rendezvous: --rdzv-endpoint wins, then --master-addr/--master-port, then the allocation.
    master_addr = args.master_addr
    explicit_addr = "master_addr" in _given(args) or "PET_MASTER_ADDR" in env
    master_port = args.master_port
    if args.rdzv_endpoint:
        host, _, port = args.rdzv_endpoint.rpartition(":") if ":" in args.rdzv_endpoint else (
            args.rdzv_endpoint, "", "")
        master_addr, explicit_addr = host or args.rdzv_endpoint, True
        if port:
            master_port = int(port)
    if env.get("SLURM_JOB_ID") and launcher in ("srun", "inplace"):
        if not explicit_addr:
            master_addr = slurm_first_host(env) or master_addr
        if master_port is None:
            master_port = slurm_default_port(env)
    elif launcher == "inplace":
        if master_port is None:
            master_port = 29500
    elif nnodes == 1:
        if not explicit_addr:
            master_addr = args.local_addr or "localhost"
        if master_port is None:
            master_port = free_port()
    if master_port is None:
        master_port = 29500

    if nnodes > 1 and launcher == "mpiexec":
        if not args.hostfile:
            raise LaunchError(f"--nnodes {nnodes} needs a Slurm allocation (run eroica-run inside sbatch/"
                              "salloc) or --hostfile for mpiexec")
        if args.node_rank != 0:
            raise LaunchError("--node-rank: under MPI one eroica-run on the first node starts every node; "
                              "run it once, with --node-rank 0")
        if not explicit_addr:
            master_addr = _first_hostfile_host(args.hostfile)

    job_id = _job_id(args, env)
    report_dir = os.path.abspath(cfg.report_dir or os.path.join("eroica-report", job_id))
    command = _command(args)
    world = nnodes * nproc
    spec = RankSpec(
        run_id=job_id, run_dir=os.path.join(report_dir, "launch"), max_restarts=args.max_restarts,
        nproc_per_node=nproc, role=args.role, master_addr=master_addr, master_port=int(master_port),
        enabled=cfg.enabled, prefix=not args.no_prefix, redirects=args.redirects, tee=args.tee,
        log_dir=args.log_dir, local_ranks_filter=args.local_ranks_filter,
        signals_to_handle=args.signals_to_handle, virtual_local_rank=args.virtual_local_rank,
    )
    launch_env = dict(env)
    launch_env.update(Config(**{**cfg.__dict__, "report_dir": report_dir}).to_env())
    if launcher == "mpiexec" and nproc > (os.cpu_count() or 1):
        # Oversubscribed MPICH spins a core in every blocking wait unless told to yield.
        launch_env.setdefault("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")
        launch_env.setdefault("MPIR_CVAR_POLLS_BEFORE_YIELD", "10")
    wrapper = [sys.executable, "-u", *SAFE_PATH, "-m", "eroica_launch.rank", "--"]
    extra = shlex.split(args.mpiexec_args or "")

    if launcher == "inplace":
        argv = command
    elif launcher == "srun":
        info = mpi_info()
        plugin = "pmix" if info.flavour == "openmpi" else "pmi2"
        argv = ["srun", f"--mpi={plugin}", f"--nodes={nnodes}", f"--ntasks={world}",
                f"--ntasks-per-node={nproc}", "--kill-on-bad-exit=1", *extra, *wrapper, *command]
    else:
        info = mpi_info()
        if not info.mpiexec:
            raise LaunchError("no mpiexec found for the MPI that mpi4py uses; install one "
                              "(pip install mpich) or run eroica-run inside srun/mpiexec")
        argv = [info.mpiexec, "-n", str(world)]
        if info.flavour == "openmpi":
            argv += ["--npernode", str(nproc)]
            if os.geteuid() == 0:
                argv += ["--allow-run-as-root"]
            argv += ["--oversubscribe"]
        else:
            argv += ["-ppn", str(nproc)]
        if args.hostfile:
            argv += ["-f" if info.flavour != "openmpi" else "--hostfile", args.hostfile]
        argv += [*extra, *wrapper, *command]
    launch_env[SPEC_VAR] = spec.to_json()
    return Plan(mode=launcher, argv=argv, env=launch_env, spec=spec, command=command, world_size=world,
                nnodes=nnodes, nproc_per_node=nproc, report_dir=report_dir,
                script=os.path.basename(args.training_script), max_restarts=args.max_restarts,
                monitor_interval=args.monitor_interval,
                shutdown_timeout=float(args.shutdown_timeout or 30), notes=notes)


_STD_SPEC = re.compile(r"[0-3]|\d+:[0-3](,\d+:[0-3])*")


def _given(args: argparse.Namespace) -> set[str]:
    """Flags given on the command line (argparse keeps no record, so the CLI stores it)."""
    return set(getattr(args, "_given", ()))


def _first_hostfile_host(path: str) -> str:
    try:
        for line in Path(path).read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                return line.split(":")[0].split()[0]
    except OSError as exc:
        raise LaunchError(f"--hostfile {path}: {exc.strerror}") from None
    raise LaunchError(f"--hostfile {path}: no hosts in it")

