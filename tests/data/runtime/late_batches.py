"""Every rank reads 100 batches from a DataLoader with no optimizer step and no collective between them
(inference over its own shard), holding HOLD_S (3) before its last batch; rank 1 starts LATE_S (1)
after rank 0, while rank 0 holds. A barrier at the end."""
import os
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == 1:
    time.sleep(float(os.environ.get("LATE_S", "1")))
batches = iter(DataLoader(torch.arange(100 * 8), batch_size=8))
seen = sum(1 for _ in range(len(batches) - 1) if next(batches) is not None)
time.sleep(float(os.environ.get("HOLD_S", "3")))
seen += sum(1 for _ in batches)
dist.barrier()
print(f"rank {rank} read {seen} batches", flush=True)
dist.destroy_process_group()
