"""What timing a DataLoader's next() costs a batch (docs/benchmarks.md §1c).

    python scripts/bench/loader_next.py [--rounds 5] [--batches 200000]

The cheapest next() torch has (a map-style dataset returning its index, no batching, no workers),
timed untimed and with the step clock's wrapper installed (``stepclock._time_dataloader``: the batch
wait and the epoch turnovers), interleaved round by round in one process; prints ns a batch. The clock
has seen an optimizer step, as in a training job (so no batch is where its steps are counted).
"""

from __future__ import annotations

import argparse
import statistics
import timeit

import torch
from torch.utils.data import DataLoader

from eroica_runtime.stepclock import StepClock


class Index(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 10**8

    def __getitem__(self, i: int) -> int:
        return i


def per_batch_ns(loader: DataLoader, n: int) -> float:
    it = iter(loader)
    return timeit.timeit(lambda: next(it), number=n) / n * 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", type=int, default=200_000)
    a = ap.parse_args()
    loader = DataLoader(Index(), batch_size=None)
    clock = StepClock(lambda step, ms: None)
    param = torch.nn.Parameter(torch.zeros(1))
    param.grad = torch.zeros(1)
    opt = torch.optim.SGD([param], lr=0.0)
    plain, timed = [], []
    for _ in range(a.rounds):
        plain.append(per_batch_ns(loader, a.batches))
        clock.install()
        opt.step()
        timed.append(per_batch_ns(loader, a.batches))
        clock.uninstall()
    added = [t - p for t, p in zip(timed, plain, strict=True)]
    print(f"untimed next(): {statistics.median(plain):.0f} ns a batch ({min(plain):.0f}-{max(plain):.0f})")
    print(f"timed:          {statistics.median(timed):.0f} ns a batch ({min(timed):.0f}-{max(timed):.0f})")
    print(f"added:          {statistics.median(added):.0f} ns a batch ({min(added):.0f}-{max(added):.0f}), "
          f"over {a.rounds} interleaved rounds of {a.batches} batches")


if __name__ == "__main__":
    main()
