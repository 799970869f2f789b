"""Every rank reads a dataset of 2 million items through 2 forked DataLoader workers, and keeps the
workers alive for COPIES_HOLD_S (2 s) after the last batch. Rank COPIES_RANK's dataset is Python strings
(~190 MB): reading one writes its reference count, so each worker copies the pages of the strings it
reads (copy-on-read). The others' is the same bytes in one numpy array, whose pages no read writes."""
import os
import time

import numpy as np
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

N = 2_000_000


class Strings(Dataset):
    def __init__(self) -> None:
        self.items = [f"item-{i:09d}-" * 3 for i in range(N)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, idx: int) -> int:
        return len(self.items[idx])


class Packed(Dataset):
    def __init__(self) -> None:
        self.items = np.array([f"item-{i:09d}-" * 3 for i in range(N)], dtype="S48")

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, idx: int) -> int:
        return len(self.items[idx])


dist.init_process_group("gloo")
data = Strings() if dist.get_rank() == int(os.environ.get("COPIES_RANK", "1")) else Packed()
batches = iter(DataLoader(data, batch_size=16384, num_workers=2, collate_fn=sum))
read = sum(next(batches) for _ in range(len(batches) - 1))   # every batch but the last: the workers stay
time.sleep(float(os.environ.get("COPIES_HOLD_S", "2")))
read += sum(batches)
dist.barrier()
print(f"rank {dist.get_rank()} read {read} bytes", flush=True)
dist.destroy_process_group()
