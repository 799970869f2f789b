"""Each rank trains a model of its own (a sweep or an ensemble launched as one job): no collective
between its steps, only a barrier at the end; with NO_GROUP=1 not even that (no process group at all:
a sweep's trials, each reading RANK). Rank 0's steps sleep INDEPENDENT_MS (5), the others' three times
that; each rank prints how long its own steps took."""
import os
import time

import torch
import torch.distributed as dist

group = os.environ.get("NO_GROUP") != "1"
if group:
    dist.init_process_group("gloo")
rank = int(os.environ["RANK"])
torch.manual_seed(rank)
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(16, 64)
pause = float(os.environ.get("INDEPENDENT_MS", "5")) / 1e3 * (1 if rank == 0 else 3)
t0 = time.perf_counter()
for _ in range(int(os.environ.get("STEPS", "240"))):
    model(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    time.sleep(pause)
print(f"rank {rank} trained in {time.perf_counter() - t0:.3f} s", flush=True)
if group:
    dist.barrier()
    dist.destroy_process_group()
