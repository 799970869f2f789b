"""Local SGD: each rank steps an optimizer of its own and the ranks average their parameters (an
all-reduce each) every SYNC (16) steps, so between meetings no rank waits for another. Rank
FAULT_RANK (1) sleeps SLOW_MS (10) more a step from step FROM (80): at every meeting the others wait
for it."""
import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(64, 256)
sync, start = int(os.environ.get("SYNC", "16")), int(os.environ.get("FROM", "80"))
slow = float(os.environ.get("SLOW_MS", "10")) / 1e3 if rank == int(os.environ.get("FAULT_RANK", "1")) else 0.0
t0 = time.perf_counter()
for step in range(int(os.environ.get("STEPS", "200"))):
    model(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    if step >= start:
        time.sleep(slow)
    if (step + 1) % sync == 0:
        with torch.no_grad():
            for p in model.parameters():
                dist.all_reduce(p)
                p /= world
print(f"rank {rank} done in {time.perf_counter() - t0:.3f} s", flush=True)
dist.destroy_process_group()
