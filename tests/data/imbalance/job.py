"""A plain DDP script whose batches have a different length on every rank and at every step.

Each rank draws its own lengths (256 to 2,304 rows, mostly short: padded variable-length sequences
look like this), so every step waits for whichever rank drew the longest, and that rank changes
from step to step. --spread 0 gives every rank the same length every step (the healthy twin).
Recorded the fixtures beside it (their "command").
"""

import argparse
import random
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

DIM = 256


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--spread", type=float, default=1.0)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank = dist.get_rank()
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(DIM, DIM), torch.nn.ReLU(),
                                                        torch.nn.Linear(DIM, DIM)))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    lengths = random.Random(1000 + rank)
    for _ in range(a.steps):
        rows = int(DIM * (1 + a.spread * 8 * lengths.random() ** 3))
        loss = model(torch.randn(rows, DIM)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(0.005)
    if rank == 0:
        print(f"trained {a.steps} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
