"""Who am I? A rank's identity from the MPI / PMI / Slurm environment, as torchrun's variables.

Pure functions over an environment mapping, so every launcher flavour is unit-testable; the rank
wrapper (``eroica_launch.rank``) applies the result before the training program starts, which is what
lets ``init_process_group()`` with ``env://`` work unchanged.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass


class RankEnvError(RuntimeError):
    """The environment cannot describe a sane rank (e.g. srun --mpi=none)."""


@dataclass(frozen=True)
class Identity:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    nnodes: int
    source: str  # "openmpi" | "hydra" | "slurm" | "pmix" | "singleton"


def _int(env: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        value = env.get(name)
        if value not in (None, ""):
            return int(value)
    return None


def tasks_per_node(spec: str) -> list[int]:
    """Expand Slurm's compressed per-node task counts: '2(x3),1' -> [2, 2, 2, 1]."""
    out: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise RankEnvError(f"cannot parse Slurm tasks-per-node {spec!r}")
        out.extend([int(m.group(1))] * int(m.group(2) or 1))
    return out


def has_mpi_wireup(env: Mapping[str, str]) -> bool:
    """True when some process manager gave this process an MPI wire-up (PMI, PMIx or Open MPI)."""
    return any(k in env for k in ("PMI_FD", "PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK",
                                  "PMI_PORT"))


def is_launched_task(env: Mapping[str, str]) -> bool:
    """True inside a process started by mpiexec or srun (so eroica-run should run in place)."""
    return has_mpi_wireup(env) or "SLURM_PROCID" in env and "SLURM_STEP_ID" in env


def identity(env: Mapping[str, str]) -> Identity:
    """Derive rank, sizes and node index from whichever launcher started this process."""
    if "OMPI_COMM_WORLD_RANK" in env:
        rank = int(env["OMPI_COMM_WORLD_RANK"])
        size = int(env["OMPI_COMM_WORLD_SIZE"])
        # Open MPI numbers local ranks itself; under --oversubscribe they need not follow the
        # global order, so take them as given rather than computing rank % local_size.
        local = int(env.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
        lsize = int(env.get("OMPI_COMM_WORLD_LOCAL_SIZE", str(size)))
        return Identity(rank, size, local, lsize, rank // max(lsize, 1), max(1, -(-size // lsize)), "openmpi")
    if "SLURM_PROCID" in env and "SLURM_STEP_ID" in env:
        ntasks = _int(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS") or 1
        if ntasks > 1 and not has_mpi_wireup(env):
            raise RankEnvError(
                f"srun started {ntasks} tasks without an MPI plugin, so each would be a separate rank 0: "
                "use srun --mpi=pmi2 (MPICH) or --mpi=pmix (Open MPI), or let eroica-run call srun itself")
        rank = int(env["SLURM_PROCID"])
        per_node = tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE")
                                  or env.get("SLURM_TASKS_PER_NODE") or str(ntasks))
        node = int(env.get("SLURM_NODEID", "0"))
        lsize = per_node[node] if node < len(per_node) else per_node[-1]
        return Identity(rank, ntasks, int(env.get("SLURM_LOCALID", "0")), lsize, node,
                        _int(env, "SLURM_STEP_NUM_NODES", "SLURM_NNODES") or len(per_node), "slurm")
    if "PMI_RANK" in env:
        rank = int(env["PMI_RANK"])
        size = int(env.get("PMI_SIZE", "1"))
        local = _int(env, "MPI_LOCALRANKID")
        lsize = _int(env, "MPI_LOCALNRANKS")
        if local is None or lsize is None:
            local, lsize = rank, size
        # eroica-run passes -ppn to hydra, so ranks are placed in blocks of lsize per node.
        return Identity(rank, size, local, lsize, rank // max(lsize, 1), max(1, -(-size // lsize)), "hydra")
    if "PMIX_RANK" in env:
        rank = int(env["PMIX_RANK"])
        size = _int(env, "PMIX_SIZE", "PMI_SIZE") or 1
        local = _int(env, "PMIX_LOCAL_RANK") or 0
        lsize = _int(env, "PMIX_LOCAL_SIZE") or size
        return Identity(rank, size, local, lsize, rank // max(lsize, 1), max(1, -(-size // lsize)), "pmix")
    return Identity(0, 1, 0, 1, 0, 1, "singleton")


def slurm_first_host(env: Mapping[str, str]) -> str | None:
    """First host of the Slurm step/job node list (scontrol expands it; simple forms parsed here)."""
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        return None
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                             text=True, timeout=10, check=True).stdout.split()
        if out:
            return out[0]
    except (OSError, subprocess.SubprocessError):
        pass
    m = re.match(r"([^,\[]+)(?:\[(\d+)[^\]]*\])?", nodelist)
    if not m:
        return None
    return m.group(1) + (m.group(2) or "")


def slurm_default_port(env: Mapping[str, str]) -> int:
    """A port every task of a Slurm step can compute alone: spread over 20000-31999 by job id
    (below Linux's default ephemeral range, where outgoing connections could hold it)."""
    job = int(env.get("SLURM_JOB_ID", "0") or 0)
    step = int(re.sub(r"\D", "", env.get("SLURM_STEP_ID", "0")) or 0)
    return 20000 + (job * 7 + step) % 12000
