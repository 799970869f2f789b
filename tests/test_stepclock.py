"""The step clock counts one step per iteration (first optimizer), and mark_step() takes over."""

from __future__ import annotations

import torch

from eroica_runtime.stepclock import StepClock


def _opt() -> torch.optim.Optimizer:
    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = torch.zeros(2)
    return torch.optim.SGD([p], lr=0.1)


def test_two_optimizers_and_accumulation_count_one_step_per_iteration() -> None:
    seen: list[int] = []
    clock = StepClock(lambda step, ms: seen.append(step))
    clock.install()
    try:
        a, b = _opt(), _opt()
        for it in range(10):
            if it % 2 == 1:  # gradient accumulation: the optimizers step every other iteration
                a.step()
                b.step()
    finally:
        clock.uninstall()
    assert seen == [0, 1, 2, 3, 4]
    assert all(ms >= 0 for _, ms in clock.durations)


def test_mark_step_replaces_the_optimizer_hook() -> None:
    seen: list[int] = []
    clock = StepClock(lambda step, ms: seen.append(step))
    clock.install()
    try:
        opt = _opt()
        clock.mark()
        opt.step()  # ignored once steps are marked by hand
        clock.mark()
    finally:
        clock.uninstall()
    assert seen == [0, 1]
