"""``eroica doctor``: what eroica would use on this machine, and what to fix before a launch.

Each check returns a Check; a failed check marked ``blocking`` makes the command exit non-zero.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from eroica_launch.plan import SAFE_PATH, mpi_info
from eroica_launch.rank import BOOTSTRAP_DIR
from eroica_launch.rankenv import is_launched_task


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    blocking: bool = False


def _py(code: str, *flags: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    try:
        out = subprocess.run([sys.executable, *SAFE_PATH, *flags, "-c", code], capture_output=True, text=True,
                             timeout=120, env=env)
        return out.returncode, (out.stdout + out.stderr).strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return 1, str(exc)


def check_mpi() -> list[Check]:
    info = mpi_info()
    checks = [Check("MPI library (mpi4py)", bool(info.library), info.library or "mpi4py cannot find an MPI",
                    "pip install 'eroica[mpich]' (MPICH from PyPI) or load your cluster's MPI module",
                    blocking=True)]
    checks.append(Check("mpiexec", bool(info.mpiexec), f"{info.mpiexec} ({info.flavour})" if info.mpiexec
                        else "not found", "install the MPI's launcher next to its library",
                        blocking=not os.environ.get("SLURM_JOB_ID")))
    if info.mpiexec:
        try:
            out = subprocess.run([info.mpiexec, "-n", "2", sys.executable, *SAFE_PATH, "-c",
                                  "from mpi4py import MPI; c = MPI.COMM_WORLD; n = c.allreduce(1)\n"
                                  "if c.rank == 0: print('eroica-smoke', c.size, n)"],
                                 capture_output=True, text=True, timeout=60)
            ok = out.returncode == 0 and "eroica-smoke 2 2" in out.stdout
            checks.append(Check("2-rank MPI smoke test", ok, "ok" if ok else (out.stdout + out.stderr)[-300:],
                                "see the MPI error above", blocking=True))
        except (OSError, subprocess.SubprocessError) as exc:
            checks.append(Check("2-rank MPI smoke test", False, str(exc), blocking=True))
    return checks


def check_torch() -> list[Check]:
    rc, out = _py("import torch; print(torch.__version__, torch.cuda.is_available(), torch.cuda.device_count(),"
                  " torch.distributed.is_available())")
    if rc != 0:
        return [Check("torch", False, out[-300:], "pip install torch", blocking=True)]
    version, cuda, count, dist = out.split()[-4:]
    return [Check("torch", dist == "True", f"{version}; torch.distributed available: {dist}",
                  "a torch build with distributed support", blocking=True),
            Check("CUDA", True, f"available={cuda}, devices={count}" + ("" if cuda == "True" else
                  " (CPU only: gloo backend, CPU profiling)"))]


def check_nvml() -> list[Check]:
    from eroica_runtime.telemetry import gpu_inventory

    n, status = gpu_inventory()
    return [Check("NVML", True, status, "pip install nvidia-ml-py on GPU nodes" if "not installed" in status
                  else "")]


def check_cpu_quota() -> list[Check]:
    """The CPU limit of this process's cgroup (a container's), which the ranks launched from here share
    or inherit: too small a limit slows a job from its first step, and eroica reports it."""
    from eroica_runtime.telemetry import cgroup_cpu

    try:
        quota, throttled = cgroup_cpu()
    except (OSError, ValueError, IndexError) as exc:
        return [Check("CPU quota (cgroup)", True, f"cannot read the cgroup files ({type(exc).__name__}): "
                      "eroica will not see CPU throttling")]
    cpus = os.cpu_count() or 0
    if throttled is None:
        return [Check("CPU quota (cgroup)", True, "cannot read the cgroup files: eroica will not see CPU throttling")]
    if quota is None:
        return [Check("CPU quota (cgroup)", True, f"none ({cpus} CPUs visible)")]
    return [Check("CPU quota (cgroup)", True, f"{quota:.2f} CPUs of {cpus} visible; the cgroup has been held "
                  f"throttled {throttled / 1e3:.1f} s so far (eroica reports ranks it throttles)")]


def check_memory_limit() -> list[Check]:
    """The memory limit of this process's cgroup (a container's), which the ranks launched from here share
    or inherit: a rank short of memory waits for storage to read back what the kernel evicted, and
    eroica names it (engine/memory.py) from its page faults and the cgroup's refaults."""
    from eroica_launch import oom
    from eroica_runtime.telemetry import cgroup_memory, memory_sample

    try:
        cg = cgroup_memory()
    except (OSError, ValueError, IndexError, KeyError) as exc:
        return [Check("memory limit (cgroup)", True, f"cannot read the cgroup files ({type(exc).__name__}): "
                      "eroica sees the host's memory and page faults only")]
    host = memory_sample()
    limit, usage, refaults = (cg.limit_mb, cg.usage_mb, cg.refaults) if cg is not None else (None, None, None)
    seen = f"; {refaults:,} pages read back after eviction so far" if refaults else ""
    # how eroica-run tells a rank the OOM killer ended (eroica_launch/oom.py)
    seen += ("; OOM kills: named from the kernel's log" if os.access(oom.KMSG, os.R_OK) else
             "; OOM kills: inferred from the host's count (the kernel's log needs root or kernel.dmesg_restrict=0)")
    if limit is None:
        room = (f" (the host's {host['mem_limit_mb'] / 1024:.1f} GiB, {host['mem_free_mb'] / 1024:.1f} available)"
                if host.get("mem_limit_mb") and host.get("mem_free_mb") is not None else "")
        return [Check("memory limit (cgroup)", True, f"none{room}{seen}")]
    used = f", {usage / 1024:.1f} GiB used with the page cache" if usage is not None else ""
    return [Check("memory limit (cgroup)", True, f"{limit / 1024:.1f} GiB{used}{seen} (eroica reports ranks "
                  "short of memory)")]


def check_slurm() -> list[Check]:
    job = os.environ.get("SLURM_JOB_ID")
    srun = shutil.which("srun")
    if not job:
        return [Check("Slurm", True, "not inside an allocation" + (f" (srun at {srun})" if srun else ""))]
    detail = f"job {job}, nodes {os.environ.get('SLURM_JOB_NODELIST')}, tasks {os.environ.get('SLURM_NTASKS')}"
    if is_launched_task(os.environ):
        detail += "; this process is a task (eroica-run will run in place)"
    return [Check("Slurm", bool(srun), detail, "srun not on PATH", blocking=not srun)]


def check_injection() -> list[Check]:
    """Does a rank's interpreter run eroica's sitecustomize? python -S / -I and some wrappers defeat it."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([BOOTSTRAP_DIR, os.environ.get("PYTHONPATH", "")]))
    code = "import sys; print(getattr(sys, '_eroica_bootstrapped', False))"
    rc, out = _py(code, env=env)
    ok = rc == 0 and out.endswith("True")
    checks = [Check("injection (sitecustomize on PYTHONPATH)", ok, "works" if ok else out[-300:],
                    "PYTHONPATH must reach the rank's interpreter; don't run ranks with python -S/-I or "
                    "PYTHONNOUSERSITE wrappers that reset PYTHONPATH", blocking=True)]
    for flag in ("-S", "-I"):
        rc, out = _py(code, flag, env=env)
        defeated = not out.endswith("True")
        checks.append(Check(f"python {flag}", True, "defeats injection (eroica would be off)" if defeated
                            else "injection still works"))
    if Path(BOOTSTRAP_DIR, "sitecustomize.py").exists() is False:
        checks.append(Check("bootstrap files", False, f"{BOOTSTRAP_DIR} missing", "reinstall eroica",
                            blocking=True))
    return checks


def run_checks() -> list[Check]:
    return [*check_mpi(), *check_torch(), *check_nvml(), *check_cpu_quota(), *check_memory_limit(), *check_slurm(), *check_injection()]


def render(checks: list[Check]) -> tuple[str, int]:
    """Text for the terminal and the exit code (1 when a blocking check failed)."""
    lines = []
    for c in checks:
        mark = "ok  " if c.ok else ("FAIL" if c.blocking else "warn")
        lines.append(f"[{mark}] {c.name}: {c.detail}")
        if not c.ok and c.fix:
            lines.append(f"       fix: {c.fix}")
    blocked = [c for c in checks if not c.ok and c.blocking]
    lines.append("eroica-run can launch here." if not blocked else
                 f"eroica-run cannot launch here: {len(blocked)} blocking problem(s) above.")
    return "\n".join(lines), 1 if blocked else 0
