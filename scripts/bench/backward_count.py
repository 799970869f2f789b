"""What the step clock's ``backward()`` wrapper costs a backward in a job with an optimizer
(docs/benchmarks.md §1c).

    python scripts/bench/backward_count.py [--rounds 7] [--calls 50000]

The smallest backward() (a 4-element graph, ~18 µs), without and with the step clock installed
(``stepclock._count_backward``, which only passes the call through once an optimizer has stepped),
interleaved round by round in one process; prints ns a call.
"""

from __future__ import annotations

import argparse
import statistics
import timeit

import torch

from eroica_runtime.stepclock import StepClock


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=50_000)
    a = ap.parse_args()
    w = torch.zeros(4, requires_grad=True)

    def one() -> None:
        (w * 2).sum().backward()

    clock = StepClock(lambda step, ms: None)
    param = torch.nn.Parameter(torch.zeros(1))
    param.grad = torch.zeros(1)
    opt = torch.optim.SGD([param], lr=0.0)
    plain, wrapped = [], []
    for _ in range(a.rounds):
        plain.append(timeit.timeit(one, number=a.calls) / a.calls * 1e9)
        clock.install()
        opt.step()   # as in a training job: steps are counted at the optimizer
        wrapped.append(timeit.timeit(one, number=a.calls) / a.calls * 1e9)
        clock.uninstall()
    added = [b - p for b, p in zip(wrapped, plain, strict=True)]
    print(f"backward():   {statistics.median(plain):.0f} ns a call ({min(plain):.0f}-{max(plain):.0f})")
    print(f"with wrapper: {statistics.median(wrapped):.0f} ns a call ({min(wrapped):.0f}-{max(wrapped):.0f})")
    print(f"added:        {statistics.median(added):.0f} ns a call ({min(added):.0f}-{max(added):.0f}), "
          f"over {a.rounds} interleaved rounds of {a.calls} calls")


if __name__ == "__main__":
    main()
