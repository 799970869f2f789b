"""Rank 0 does pure-Python bookkeeping every step from step 60 (log_metrics: builds and formats a
metrics dict over a big history list), ~10 ms; no aten ops in it."""
import json
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
torch.set_num_threads(1)
model = DDP(nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256)))
opt = torch.optim.SGD(model.parameters(), 1e-3)
history = [float(i) for i in range(200000)]
def smooth(xs):
    out, acc = [], 0.0
    for x in xs:
        acc = 0.9 * acc + 0.1 * x
        out.append(acc)
    return out
def log_metrics(step, loss):
    history.append(loss)
    s = smooth(history[-200000:])
    return json.dumps({"step": step, "loss": loss, "ema": s[-1]})
STEPS = int(os.environ.get("STEPS", "400"))
for it in range(STEPS):
    x = torch.randn(64, 256)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if rank == 0 and it >= 60:
        log_metrics(it, float(loss))
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
