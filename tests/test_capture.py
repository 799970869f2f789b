"""eroica_runtime.capture with the real torch.profiler: what a window records."""

from __future__ import annotations

import torch

from eroica_runtime.capture import Capture


def _window(cap: Capture, first: int, k: int) -> list:
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))

    def step() -> None:
        model(torch.randn(8, 32)).sum().backward()

    step()
    cap.start(first, "test", k)            # as the runtime drives it: the lead-in step, then k steps
    for i in range(k + 1):
        step()
        if i < k:
            cap.mark()
    return list(cap.stop())


def test_lead_in_step_records_no_host_op_and_the_window_records_every_step() -> None:
    """The lead-in only absorbs the window's edge: its host ops are not recorded (prof.stop(), run in
    the closing step, costs time per recorded event), while each window step is recorded whole."""
    k = 3
    events = _window(Capture(), 50, k)
    steps = {e.name(): e.start_ns() for e in events if e.name().startswith("ProfilerStep#")}
    assert sorted(steps) == ["ProfilerStep#49", "ProfilerStep#50", "ProfilerStep#51", "ProfilerStep#52"]
    ops = [e for e in events if e.name().startswith("aten::")]
    assert ops and all(e.start_ns() >= steps["ProfilerStep#50"] for e in ops), "lead-in ops recorded"
    per_step = [sum(1 for e in ops if e.name() == "aten::addmm" and steps[f"ProfilerStep#{s}"] <= e.start_ns()
                    and (s == 52 or e.start_ns() < steps[f"ProfilerStep#{s + 1}"])) for s in (50, 51, 52)]
    assert per_step == [2, 2, 2], per_step


def test_a_window_abandoned_in_its_lead_in_leaves_no_profiler_behind() -> None:
    """Switching eroica off mid lead-in (collection toggled off) must leave no profiler behind: a
    user's own profile afterwards records its ops as usual."""
    cap = Capture()
    cap.start(10, "test", 3)
    cap.abandon()
    assert not cap.active
    with torch.profiler.profile() as prof:
        torch.ones(4).add_(1)
    assert any(e.name == "aten::add_" for e in prof.events())
