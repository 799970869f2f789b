"""Prove a multi-host layout: each rank reports its hostname and times a gloo and an mpi4py allreduce.

Run under mpiexec (e.g. :meth:`netns.Cluster.mpiexec_layout`) or torchrun; prints one JSON line per rank
(``PROBE {...}``) so a test or a person can see where each rank ran and how long collectives took.
Env: PROBE_MB (allreduce size, default 4), PROBE_ITERS (default 5), PROBE_MPI=0 to skip mpi4py.
PROBE_GO=<path>: after the first timing every rank waits for that file (rank 0 creates <path>.ready
once all have timed), then times again into the record's "then" (a network changed in between, in one
job: no second start of every rank).
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any


def _env_int(*names: str, default: int = 0) -> int:
    for n in names:
        if n in os.environ:
            return int(os.environ[n])
    return default


def _time(dist: Any, comm: Any, mb: float, iters: int, world: int) -> dict[str, object]:
    """One gloo (and, with ``comm``, one mpi4py) allreduce timing: ms per call over ``iters`` calls."""
    import torch

    out: dict[str, object] = {}
    t = torch.ones(int(mb * (1 << 20) / 4))
    dist.all_reduce(t)
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t)
    out["gloo_allreduce_ms"] = (time.perf_counter() - t0) / iters * 1e3
    out["gloo_sum_ok"] = bool(t[0].item() == world ** (iters + 1))
    if comm is not None:
        import numpy as np

        a = np.ones(int(mb * (1 << 20) / 4), dtype=np.float32)
        b = np.empty_like(a)
        comm.Allreduce(a, b)
        t0 = time.perf_counter()
        for _ in range(iters):
            comm.Allreduce(a, b)
        out["mpi_allreduce_ms"] = (time.perf_counter() - t0) / iters * 1e3
        out["mpi_sum_ok"] = bool(b[0] == world)
    return out


def main() -> None:
    rank = _env_int("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK")
    world = _env_int("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", default=1)
    mb = float(os.environ.get("PROBE_MB", "4"))
    iters = int(os.environ.get("PROBE_ITERS", "5"))
    out: dict[str, object] = {"rank": rank, "world": world, "hostname": socket.gethostname()}
    comm = None
    if os.environ.get("PROBE_MPI", "1") == "1":
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        out["mpi_rank"] = comm.Get_rank()
        out["mpi_processor"] = MPI.Get_processor_name()
    import torch.distributed as dist

    os.environ.setdefault("MASTER_PORT", "29511")
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
    out.update(_time(dist, comm, mb, iters, world))
    go = os.environ.get("PROBE_GO")
    if go:
        dist.barrier()
        if rank == 0:
            Path(go + ".ready").touch()
        while not os.path.exists(go):
            time.sleep(0.05)
        out["then"] = _time(dist, comm, mb, iters, world)
    dist.barrier()
    dist.destroy_process_group()
    print("PROBE " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
