"""A plain DDP script with short epochs: DistributedSampler, a DataLoader with 2 workers a rank.

Recorded the fixtures beside it (their "command"): the workers start anew at every epoch unless
--persistent; --slow-start-rank R makes rank R's workers take 0.3 s longer to start; --validate runs
a 10-batch validation pass, its own DataLoader with as many workers, after every epoch.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Data(Dataset):
    def __init__(self, batches: int = 30) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return self.batches * 8 * int(os.environ.get("WORLD_SIZE", 1))   # this many batches of 8 a rank

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.001)
        return torch.randn(256), torch.randint(0, 10, ()).long()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--persistent", action="store_true")
    ap.add_argument("--slow-start-rank", type=int, default=-1)
    ap.add_argument("--validate", action="store_true")
    a = ap.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                                        torch.nn.Linear(512, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = Data()
    sampler = DistributedSampler(data)
    slow = dist.get_rank() == a.slow_start_rank
    loader = DataLoader(data, batch_size=8, sampler=sampler, num_workers=a.workers,
                        persistent_workers=a.persistent and a.workers > 0,
                        worker_init_fn=(lambda _: time.sleep(0.3)) if slow else None)
    held_out = Data(10)
    val = DataLoader(held_out, batch_size=8, sampler=DistributedSampler(held_out, shuffle=False),
                     num_workers=a.workers, persistent_workers=a.persistent and a.workers > 0)
    t0 = time.time()
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(0.01)
        if a.validate:
            correct = torch.zeros(1)
            with torch.no_grad():
                for x, y in val:
                    correct += (model(x).argmax(1) == y).sum()
            dist.all_reduce(correct)
    if dist.get_rank() == 0:
        print(f"done {a.epochs} epochs in {time.time() - t0:.1f}s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
