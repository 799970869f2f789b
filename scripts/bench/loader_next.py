"""What the step clock's wrappers cost: a DataLoader's next() and a backward() (docs/benchmarks.md §1c).

    python scripts/bench/loader_next.py [--rounds 5] [--batches 200000] [--backward-rounds 7] [--calls 50000]

The cheapest next() torch has (a map-style dataset returning its index, no batching, no workers),
timed untimed and with the step clock's wrapper installed (``stepclock._time_dataloader``: the batch
wait and the epoch turnovers), interleaved round by round in one process; prints ns a batch. Then the
smallest backward() (a 4-element graph, ~16 µs) without and with ``stepclock._count_backward``, the
same way; prints ns a call. The clock has seen an optimizer step, as in a training job (so no batch
is where its steps are counted and the DataLoader wrapper only passes through; backward() is torch's
own again from that step on, so the second part should show nothing added).
"""

from __future__ import annotations

import argparse
import statistics
import timeit
from collections.abc import Callable

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


def interleaved(measure: Callable[[], float], rounds: int) -> tuple[list[float], list[float]]:
    """ns a call of ``measure`` without and with the step clock installed, round by round."""
    clock = StepClock(lambda step, ms: None)
    param = torch.nn.Parameter(torch.zeros(1))
    param.grad = torch.zeros(1)
    opt = torch.optim.SGD([param], lr=0.0)
    plain, timed = [], []
    for _ in range(rounds):
        plain.append(measure())
        clock.install()
        opt.step()   # as in a training job: steps are counted at the optimizer
        timed.append(measure())
        clock.uninstall()
    return plain, timed


def report(what: str, with_: str, plain: list[float], timed: list[float], unit: str, n: int) -> None:
    added = [t - p for t, p in zip(timed, plain, strict=True)]
    width = max(len(what), len(with_), len("added")) + 1
    print(f"{what + ':':<{width}} {statistics.median(plain):.0f} ns a {unit} ({min(plain):.0f}-{max(plain):.0f})")
    print(f"{with_ + ':':<{width}} {statistics.median(timed):.0f} ns a {unit} ({min(timed):.0f}-{max(timed):.0f})")
    print(f"{'added:':<{width}} {statistics.median(added):.0f} ns a {unit} ({min(added):.0f}-{max(added):.0f}), "
          f"over {len(plain)} interleaved rounds of {n} {'batches' if unit == 'batch' else unit + 's'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", type=int, default=200_000)
    ap.add_argument("--backward-rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=50_000)
    a = ap.parse_args()
    loader = DataLoader(Index(), batch_size=None)
    plain, timed = interleaved(lambda: per_batch_ns(loader, a.batches), a.rounds)
    report("untimed next()", "timed", plain, timed, "batch", a.batches)
    w = torch.zeros(4, requires_grad=True)

    def backward() -> None:
        (w * 2).sum().backward()

    plain, timed = interleaved(lambda: timeit.timeit(backward, number=a.calls) / a.calls * 1e9, a.backward_rounds)
    report("backward()", "with wrapper", plain, timed, "call", a.calls)


if __name__ == "__main__":
    main()
