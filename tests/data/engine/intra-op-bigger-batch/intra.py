"""Each rank computes with 3 intra-op threads; rank 2's batches are 4x larger from step 60 (the same
calls, more work in each). Run: eroica-run --nproc-per-node 3 intra.py (captures 13 and 114 here,
2026-12-07)."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.set_num_threads(3)
model = DDP(nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 512)))
opt = torch.optim.AdamW(model.parameters())
for it in range(160):
    loss = model(torch.randn(256 if (rank == 2 and it >= 60) else 64, 512)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
