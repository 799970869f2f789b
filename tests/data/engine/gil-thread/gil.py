"""Rank 1 starts a background thread at step 60 that spins in pure Python (a metrics or logging thread
serializing records): its training thread waits for the GIL between and inside its ops. Run:
eroica-run --nproc-per-node 3 gil.py (captures 13 and 68 here, 2026-12-07)."""

import json
import threading

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.set_num_threads(1)
model = DDP(nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(128, 128), nn.ReLU())]))
opt = torch.optim.AdamW(model.parameters())


def logger_thread() -> None:
    rec = {f"k{i}": list(range(20)) for i in range(50)}
    while True:
        json.dumps(rec)


for it in range(250):
    loss = model(torch.randn(32, 128)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if rank == 1 and it == 60:
        threading.Thread(target=logger_thread, daemon=True, name="metrics-logger").start()
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
