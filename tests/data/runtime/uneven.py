"""Ranks whose loops differ (tests/test_runtime.py).

UNEVEN=pass: rank 0 alone iterates a DataLoader of 400 batches (dataset statistics, an evaluation before
training) with no optimizer step or backward() while the others wait in a barrier; then every rank
trains 60 DDP steps. UNEVEN=extra: every rank trains 60 DDP steps, then rank 0 alone takes 6 more
optimizer steps (no collective in them). UNEVEN=join: DDP with uneven inputs under torch's Join, two
epochs of 60 batches on rank 1 and 70 on rank 0 (rank 1 shadows rank 0's last 10 all-reduces and takes
no optimizer step meanwhile). UNEVEN=probe: every rank trains 60 DDP steps, and after steps 20 and 40
rank 0 alone fits a linear probe on the model's outputs (30 steps of an optimizer of its own) while the
others wait in a barrier; then every rank trains 30 steps more with a new optimizer (a second stage,
the first one kept alive). UNEVEN=late: every rank trains 60 DDP steps, then rank 1
takes 2 s more than rank 0 to end (a final save). UNEVEN=after: rank 1
stalls 50 ms before each of its optimizer steps from step 30 on (a lock, a synchronous read).
"""
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.utils.data import DataLoader, TensorDataset

dist.init_process_group("gloo")
rank = dist.get_rank()
mode = os.environ.get("UNEVEN", "pass")
if mode == "pass" and rank == 0:
    rows = sum(x.shape[0] for (x,) in DataLoader(TensorDataset(torch.randn(400 * 32, 16)), batch_size=32))
    print(f"rank 0 passed over {rows} rows alone", flush=True)
dist.barrier()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
probe = torch.nn.Linear(16, 2)
probe_opt = torch.optim.SGD(probe.parameters(), lr=0.1)
for _epoch in range(2 if mode == "join" else 1):
    with Join([model], enable=mode == "join"):
        for step in range(60 + (10 if mode == "join" and rank == 0 else 0)):
            model(torch.randn(32, 16)).sum().backward()
            if mode == "after" and rank == 1 and step >= 30:
                time.sleep(0.05)   # a stall between backward() and the optimizer step (a lock, a read)
            opt.step()
            opt.zero_grad()
            if mode == "probe" and step in (20, 40):
                if rank == 0:
                    with torch.no_grad():
                        features = model(torch.randn(256, 16))
                    labels = (features[:, 0] > 0).long()
                    for _ in range(30):
                        torch.nn.functional.cross_entropy(probe(features), labels).backward()
                        probe_opt.step()
                        probe_opt.zero_grad()
                dist.barrier()
if mode == "probe":
    second = torch.optim.AdamW(model.parameters(), lr=0.001)
    for _ in range(30):
        model(torch.randn(32, 16)).sum().backward()
        second.step()
        second.zero_grad()
if mode == "late" and rank == 1:
    time.sleep(2.0)
if mode == "extra" and rank == 0:
    for _ in range(6):
        opt.step()
print(f"rank {rank} trained", flush=True)
dist.destroy_process_group()
