"""A tiny CPU DDP training job (gloo) that stands in for train.py in the Slurm template tests.

Why: the templates must start a real multi-rank torch job; this one is small enough for a 2-core
runner. Like a torchrun script it reads RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT from the
environment (set by eroica-run). Each rank all-gathers (rank, world size) and writes what it saw to
<out-dir>/rank-<rank>.json, so a test can check that every rank agrees on the world.

Options: --fail-rank R --fail-step S makes rank R raise at step S (a rank crash, exit code 1);
--steps N --step-sleep T makes the job last long enough to be signalled or cancelled;
--workers W feeds batches through W DataLoader worker processes.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

T0 = time.time()  # after the imports: the times printed below leave torch's import out


def env_source() -> str:
    """Where the rank identity came from: 'torchrun-env' (RANK etc.) or 'slurm' (fallback)."""
    return "torchrun-env" if "RANK" in os.environ and "WORLD_SIZE" in os.environ else "slurm"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--fail-step", type=int, default=2)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    args = parser.parse_args()

    source = env_source()
    if source == "slurm":  # only for plain `srun python ddp_tiny.py`, without eroica-run
        os.environ.setdefault("RANK", os.environ["SLURM_PROCID"])
        os.environ.setdefault("WORLD_SIZE", os.environ["SLURM_NTASKS"])
        os.environ.setdefault("LOCAL_RANK", os.environ["SLURM_LOCALID"])
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    if rank == 0:
        print(f"ddp_tiny: process group up after {time.time() - T0:.1f}s", flush=True)

    seen = [None] * world
    dist.all_gather_object(seen, {"rank": rank, "world_size": world, "host": socket.gethostname()})

    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # Batches come from a DataLoader so that --workers adds worker processes, which Slurm signals
    # along with the ranks (every process of a job step gets scancel's / --signal's signal).
    data = DataLoader(
        TensorDataset(torch.randn(64, 16)),
        batch_size=8,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
    )
    batches = iter(())
    for step in range(args.steps):
        try:
            (x,) = next(batches)
        except StopIteration:
            batches = iter(data)
            (x,) = next(batches)
        if rank == args.fail_rank and step == args.fail_step:
            # An uncaught exception, like a real crash (exit code 1 with a traceback).
            print(f"ddp_tiny: rank {rank} failing on purpose at step {step}", file=sys.stderr, flush=True)
            raise RuntimeError(f"ddp_tiny: injected failure on rank {rank} at step {step}")
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if rank == 0:
            print(f"ddp_tiny: step {step} loss {loss.item():.4f}", flush=True)

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "rank": rank,
        "world_size": world,
        "local_rank": int(os.environ.get("LOCAL_RANK", "-1")),
        "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", "-1")),
        "master_addr": os.environ.get("MASTER_ADDR"),
        "master_port": os.environ.get("MASTER_PORT"),
        "source": source,
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "seen": seen,
    }
    (out / f"rank-{rank}.json").write_text(json.dumps(record))
    del model  # DDP's reducer holds the process group: free it before the group goes
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    print(f"ddp_tiny: rank {rank}/{world} done after {time.time() - T0:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    rc = main()
    gc.freeze()   # leave fast (the exit's last collections over torch's objects): tests/data/runtime/train.py
    sys.exit(rc)
