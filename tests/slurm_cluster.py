"""A real single-node Slurm on localhost, for tests.

Why: eroica's Slurm paths (srun launch, in-place ranks, --signal delivery, scancel) only mean
something against real slurmctld/slurmd/munged. This module installs Debian's Slurm when missing,
writes a throw-away configuration under a temporary directory (its own munge key and socket,
non-default ports, no state outside that directory), starts the daemons in the foreground and
stops them by pid. Use it as a context manager::

    with SlurmCluster() as cluster:
        job = cluster.sbatch(script, "--ntasks=4")
        info = cluster.wait_job(job, timeout=60)

Tear-down is guaranteed three ways: ``stop()`` (also from ``__exit__`` and an ``atexit`` hook),
and the daemons get ``PR_SET_PDEATHSIG`` so they die with the process that started them even
when that process is killed. ``stop()`` also ends every process still carrying this cluster's
``SLURM_CONF`` in its environment (leftover slurmstepd and job tasks), by pid.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from eroica_launch.plan import free_port

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("srun", "sbatch", "scontrol", "scancel", "sinfo", "squeue")
# Debian's metapackage slurm-wlm = slurmctld + slurmd + slurm-client; munge comes with them.
APT_PACKAGES = ("slurm-wlm", "munge")
TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
    }
)
SBIN_DIRS = ("/usr/sbin", "/usr/local/sbin", "/sbin")


class SlurmUnavailable(RuntimeError):
    """Slurm cannot be installed or started here; the message says why (used as a skip reason)."""


def _which(name: str) -> str | None:
    """Find a binary on PATH or in the sbin directories (often missing from a non-login PATH)."""
    extra = os.pathsep.join(SBIN_DIRS)
    return shutil.which(name, path=os.environ.get("PATH", "") + os.pathsep + extra)


def missing_binaries() -> list[str]:
    """The Slurm/munge programs the harness needs that are not installed."""
    return [name for name in (*DAEMONS, *CLIENTS) if _which(name) is None]


def ensure_slurm_installed(timeout: float = 600.0) -> None:
    """Install Debian's slurm-wlm and munge when missing (root + apt-get only).

    Raises SlurmUnavailable with a clear reason when installing is impossible.
    """
    missing = missing_binaries()
    if not missing:
        return
    if os.geteuid() != 0:
        raise SlurmUnavailable(f"Slurm binaries missing ({', '.join(missing)}) and not root to install them")
    apt = shutil.which("apt-get")
    if apt is None:
        raise SlurmUnavailable(
            f"Slurm binaries missing ({', '.join(missing)}) and no apt-get to install them"
        )
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # Another apt run (set-up on the same machine) may hold the dpkg lock: wait for it, bounded.
    lock = ["-o", "DPkg::Lock::Timeout=180"]
    deadline = time.monotonic() + timeout
    steps = [
        [apt, *lock, "-q", "update"],
        [apt, *lock, "-q", "-y", "--no-install-recommends", "install", *APT_PACKAGES],
    ]
    for cmd in steps:
        left = max(1.0, deadline - time.monotonic())
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=left)
        except subprocess.TimeoutExpired as exc:
            raise SlurmUnavailable(f"`{' '.join(cmd)}` timed out after {left:.0f}s") from exc
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr)[-1500:]
            raise SlurmUnavailable(f"`{' '.join(cmd)}` failed (rc={proc.returncode}):\n{tail}")
    still = missing_binaries()
    if still:
        raise SlurmUnavailable(f"installed {APT_PACKAGES} but still missing: {', '.join(still)}")


ROOT_PREFIX = "eroica-slurm-"


def _cluster_processes(root: Path) -> list[psutil.Process]:
    """Live processes belonging to the cluster under `root`, children included, never this process."""
    marker = str(root / "slurm.conf")
    prefix = str(root) + os.sep
    me = os.getpid()
    found: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter(["pid", "name"]):
        if proc.pid == me:
            continue
        with contextlib.suppress(psutil.Error):
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            mine = proc.environ().get("SLURM_CONF") == marker
            if not mine and proc.info["name"] == "slurmstepd":
                mine = any(f.path.startswith(prefix) for f in proc.open_files())
            if mine:
                found[proc.pid] = proc
                for child in proc.children(recursive=True):
                    if child.pid != me:
                        found[child.pid] = child
    return list(found.values())


def _kill(procs: list[psutil.Process]) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(procs, timeout=5)


def reap_stale_clusters() -> None:
    """End what an earlier, hard-killed test run left behind: its daemons die with their parent
    (PR_SET_PDEATHSIG), but slurmstepd and job tasks are daemonized and survive. Only directories
    named like ours whose slurmctld is gone are touched."""
    tmp = Path(tempfile.gettempdir())
    for root in tmp.glob(ROOT_PREFIX + "*"):
        with contextlib.suppress(OSError):
            if time.time() - root.stat().st_mtime < 120:
                continue  # possibly a cluster that another session is starting right now
        if any(_pid_alive(root / name) for name in ("slurmctld.pid", "slurmd.pid", "munge/munged.pid")):
            continue
        _kill(_cluster_processes(root))
        shutil.rmtree(root, ignore_errors=True)


def _pid_alive(pid_file: Path) -> bool:
    try:
        return psutil.pid_exists(int(pid_file.read_text().strip()))
    except (OSError, ValueError):
        return False


def _free_ports(count: int) -> list[int]:
    """Distinct ports free right now, below the ephemeral range (no outgoing connection takes them)."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def _node_name() -> str:
    """This host's short name if it resolves (job scripts derive MASTER_ADDR from it), else localhost."""
    name = socket.gethostname().split(".")[0]
    try:
        socket.gethostbyname(name)
    except OSError:
        return "localhost"
    return name


def _die_with_parent() -> None:
    """preexec_fn: SIGTERM this daemon when the process that started it dies (Linux prctl)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class JobInfo:
    """What scontrol says about a job once it has ended."""

    job_id: str
    state: str
    exit_code: str
    fields: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.state == "COMPLETED" and self.exit_code == "0:0"


class SlurmCluster:
    """A single-node Slurm (munged + slurmctld + slurmd) under a temporary directory."""

    def __init__(
        self, cpus: int = 8, partition: str = "debug", keep: bool | None = None, node: str | None = None
    ) -> None:
        self.cpus = cpus
        self.partition = partition
        self.keep = bool(os.environ.get("EROICA_KEEP_SLURM")) if keep is None else keep
        self.node = node or _node_name()
        self.root: Path | None = None
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._atexit_registered = False

    # ---------------------------------------------------------------- life cycle
    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def conf(self) -> Path:
        assert self.root is not None, "cluster not started"
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """Environment for client commands (and, via sbatch's default --export=ALL, for jobs)."""
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf)
        env["PATH"] = env.get("PATH", "") + os.pathsep + os.pathsep.join(SBIN_DIRS)
        # Never inherit an outer allocation: the jobs must see only this cluster.
        for key in list(env):
            if key.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")) and key != "SLURM_CONF":
                del env[key]
        return env

    def start(self, timeout: float = 60.0) -> SlurmCluster:
        """Install if needed, write the configuration, start the daemons, wait for an idle node."""
        ensure_slurm_installed()
        if os.geteuid() != 0:
            raise SlurmUnavailable("the local Slurm test cluster runs its daemons as root")
        reap_stale_clusters()
        self.root = Path(tempfile.mkdtemp(prefix=ROOT_PREFIX))
        if not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True
        try:
            self._write_config()
            self._start_munged()
            self._spawn("slurmctld", [_which("slurmctld") or "slurmctld", "-D", "-c", "-f", str(self.conf)])
            self._spawn("slurmd", [_which("slurmd") or "slurmd", "-D", "-N", self.node, "-f", str(self.conf)])
            self._wait_idle(timeout)
        except Exception as exc:
            logs = self.logs()
            self.stop()
            # Not SlurmUnavailable: Slurm is installed, so a failed start is a bug to see, not a skip.
            raise RuntimeError(f"local Slurm failed to start: {exc}\ndaemon logs:\n{logs}") from exc
        except BaseException:
            self.stop()
            raise
        return self

    def _write_config(self) -> None:
        assert self.root is not None
        r = self.root
        for sub in ("munge", "state", "spool", "log"):
            (r / sub).mkdir()
        (r / "munge").chmod(0o755)  # munged wants the socket's directory traversable by all
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        ctld_port, d_port = _free_ports(2)
        first_job_id = random.SystemRandom().randrange(100_000, 60_000_000, 1000)
        text = f"""\
# Generated by tests/slurm_cluster.py for one test session; everything lives under {r}.
ClusterName=eroicatest
# A fresh cluster numbers its jobs from 1 again, but MPICH names its shared-memory segments after the
# PMI job (<jobid>.<step>) and a killed job leaves them in /dev/shm: a later session's job with the
# same id would attach to that stale segment and hang in MPI_Init. Real clusters never reuse job ids.
FirstJobId={first_job_id}
SlurmctldHost={self.node}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={r}/munge/munge.sock
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
# No cgroups in a container: track tasks through /proc, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# Jobs must ask for their MPI plugin (the templates say --mpi=pmi2), as on a real cluster.
MpiDefault=none
ReturnToService=2
# Declare more CPUs than the machine has, so 4+ tasks fit on a 2-core runner.
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# Slurm's default: how long SIGTERM'd tasks get (to flush eroica's report) before SIGKILL.
KillWait=30
InactiveLimit=0
MinJobAge=600
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=1000 State=UNKNOWN
PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""
        self.conf.write_text(text)

    def _start_munged(self) -> None:
        assert self.root is not None
        m = self.root / "munge"
        cmd = [
            _which("munged") or "munged",
            "--foreground",
            "--force",
            f"--socket={m}/munge.sock",
            f"--key-file={m}/munge.key",
            f"--pid-file={m}/munged.pid",
            f"--log-file={m}/munged.log",
            f"--seed-file={m}/munged.seed",
        ]
        self._spawn("munged", cmd)
        self._wait_for(lambda: (m / "munge.sock").exists(), 15.0, "munged socket")

    def _spawn(self, name: str, cmd: Sequence[str]) -> None:
        assert self.root is not None
        with open(self.root / "log" / f"{name}.out", "wb") as out:
            self.procs[name] = subprocess.Popen(
                list(cmd),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                preexec_fn=_die_with_parent,  # prctl only; no locks taken
            )

    def _wait_for(self, cond: object, timeout: float, what: str) -> None:
        assert callable(cond)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode} while waiting for {what}")
            if cond():
                return
            time.sleep(0.2)
        raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")

    def _wait_idle(self, timeout: float) -> None:
        def idle() -> bool:
            out = self.run(["sinfo", "-h", "-N", "-o", "%T"], timeout=10, check=False).stdout
            return out.strip().rstrip("*") == "idle"

        self._wait_for(idle, timeout, f"node {self.node} to become idle")

    def stop(self, timeout: float = 20.0) -> None:
        """Cancel jobs, stop the daemons by pid, end leftover job processes, remove the directory."""
        if self.root is None:
            return
        ctld = self.procs.get("slurmctld")
        if ctld is not None and ctld.poll() is None:
            with contextlib.suppress(Exception):
                self.run(["scancel", "--full", "--user=root"], timeout=10, check=False)
                self._wait_no_jobs(10.0)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self._kill_leftovers()
        self.procs.clear()
        root, self.root = self.root, None
        if not self.keep:
            shutil.rmtree(root, ignore_errors=True)

    def _wait_no_jobs(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.run(["squeue", "-h", "-o", "%i"], timeout=10, check=False).stdout
            if not out.strip():
                return
            time.sleep(0.3)

    def leftover_processes(self) -> list[psutil.Process]:
        """This cluster's processes still alive: anything with its SLURM_CONF in the environment
        (daemons, job tasks), slurmstepd holding a file under its directory, and their descendants."""
        if self.root is None:
            return []
        return _cluster_processes(self.root)

    def _kill_leftovers(self) -> None:
        assert self.root is not None
        _kill(_cluster_processes(self.root))

    # ---------------------------------------------------------------- clients
    def run(
        self,
        cmd: Sequence[str],
        timeout: float = 30.0,
        check: bool = True,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a client command (srun, scontrol, ...) against this cluster, with a timeout."""
        full_env = self.env
        if env:
            full_env.update(env)
        proc = subprocess.run(
            list(cmd), env=full_env, cwd=cwd, capture_output=True, text=True, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"`{' '.join(cmd)}` failed (rc={proc.returncode})\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
            )
        return proc

    def sbatch(
        self,
        script: str | os.PathLike[str],
        *options: str,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> str:
        """Submit a batch script (sbatch options, then the script's own args); returns the job id.

        The submitting environment (plus `env`) is exported to the job, as sbatch does by default.
        """
        cmd = ["sbatch", "--parsable", *options, str(script), *args]
        return self.run(cmd, env=env, cwd=cwd).stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """scontrol's key=value fields for a job (empty dict when unknown)."""
        proc = self.run(["scontrol", "show", "job", "-o", job_id], timeout=10, check=False)
        if proc.returncode != 0:
            return {}
        return dict(re.findall(r"(\w+)=(\S*)", proc.stdout))

    def wait_job(self, job_id: str, timeout: float = 90.0) -> JobInfo:
        """Wait until the job has ended and its node is done cleaning up; raise TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        fields: dict[str, str] = {}
        while time.monotonic() < deadline:
            fields = self.job(job_id)
            state = fields.get("JobState", "")
            if state in TERMINAL_STATES:
                # A job that is still completing holds its node; the next test would queue behind it.
                if not self.run(
                    ["squeue", "-h", "-j", job_id, "-t", "CG"], timeout=10, check=False
                ).stdout.strip():
                    return JobInfo(job_id, state, fields.get("ExitCode", ""), fields)
            time.sleep(0.5)
        self.run(["scancel", "--full", job_id], timeout=10, check=False)
        raise TimeoutError(
            f"job {job_id} did not end within {timeout:.0f}s; last state: {fields.get('JobState')}"
        )

    def wait_running(self, job_id: str, timeout: float = 30.0) -> None:
        """Wait until a job is RUNNING (raise if it ends or times out first)."""
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.job(job_id).get("JobState", "")
            if state == "RUNNING":
                return
            if state in TERMINAL_STATES:
                raise RuntimeError(f"job {job_id} ended ({state}) before it was seen running")
            time.sleep(0.3)
        raise TimeoutError(f"job {job_id} not running within {timeout:.0f}s (state {state})")

    def logs(self) -> str:
        """Tails of the daemon logs (for failure messages)."""
        if self.root is None:
            return ""
        parts = []
        for path in sorted((self.root / "log").glob("*")) + [self.root / "munge" / "munged.log"]:
            if path.exists():
                text = path.read_text(errors="replace")[-2000:]
                parts.append(f"--- {path.name}\n{text}")
        return "\n".join(parts)
