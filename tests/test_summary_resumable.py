"""The summary built in slices (as the runtime does after a window closes) is the summary built in one go.

Real torch.profiler events from capture.py's window (lead-in step included, as Capture.stop() now hands
them over); the builder leaves the lead-in out itself, and slicing changes nothing but build_ms.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from eroica_runtime import summary
from eroica_runtime.capture import Capture
from eroica_runtime.summary.resumable import CHUNK, Resumable, drain

K = 3
FIRST = 20


@pytest.fixture(scope="module")
def window() -> tuple[Any, dict[str, Any]]:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(4, 16, 32)

    def step() -> None:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

    step()
    cap = Capture()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cap.start(FIRST, "test", K)   # the lead-in step FIRST-1, then the window
        for i in range(K + 1):
            step()
            if i < K:
                cap.mark()
        events = cap.stop()
    kw = {"identity": {"rank": 0, "world_size": 1, "host": "h"},
          "capture": {"step": FIRST, "trigger": "test", "k": K},
          "steps": [{"step": FIRST + i, "ms": 10.0} for i in range(K)], "gc": {"count": 0, "ms": 0.0},
          "telemetry": {}}
    return events, kw


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    a, b = dict(a), dict(b)
    a["profile"] = {**a["profile"], "build_ms": 0}
    b["profile"] = {**b["profile"], "build_ms": 0}
    assert a == b


def test_sliced_build_is_the_one_go_build(window: tuple[Any, dict[str, Any]]) -> None:
    events, kw = window
    whole = summary.build(events, **kw)
    sliced = Resumable(summary.build_steps(events, **kw))
    while not sliced.run(0.0):      # the smallest slices: one piece per call
        pass
    assert sliced.slices > len(list(events)) // CHUNK   # the work really is cut into pieces
    _same(whole, sliced.result)  # type: ignore[arg-type]
    summary.validate(sliced.result)  # type: ignore[arg-type]


def test_the_runtimes_record_pool_changes_no_summary_and_the_next_window_makes_no_new_records(
        window: tuple[Any, dict[str, Any]]) -> None:
    """The runtime's builds take their records from a pool and give them back (summary.Records), so
    a window's ~10^4-10^5 records are promoted to the collector's oldest generation once, not at
    every window (each promotion counts towards the next full collection: ~150 ms in a process with
    torch, in one step after a window)."""
    events, kw = window
    plain = summary.build(events, **kw)
    pool = summary.Records()
    first = Resumable(summary.build_steps(events, records=pool, **kw))
    while not first.run(0.0):
        pass
    _same(plain, first.result)  # type: ignore[arg-type]
    kept = {id(ev) for ev in pool}
    assert 0 < len(kept) <= len(list(events))   # every record given back (lead-in ones too), none held twice
    assert all(ev.name == "" and ev.parent is None for ev in pool)   # they hold no names or parents
    second = Resumable(summary.build_steps(events, records=pool, **kw))
    while not second.run(0.0):
        pass
    _same(plain, second.result)  # type: ignore[arg-type]
    assert {id(ev) for ev in pool} == kept   # the same records again: nothing new to promote
    # an abandoned build (eroica switched off mid-way) gives its records back as well
    third = Resumable(summary.build_steps(events, records=pool, **kw))
    third.run(0.0)
    third.run(0.0)
    assert len(pool) < len(kept)
    del third   # the runtime drops a pending build when eroica switches off: the generator is closed
    assert {id(ev) for ev in pool} == kept
    small = summary.Records(limit=10)
    summary.build(events, records=small, **kw)
    assert len(small) == 10   # a bounded pool: a larger window's extra records are dropped


def test_lead_in_step_is_left_out_by_the_builder(window: tuple[Any, dict[str, Any]]) -> None:
    """What Capture.stop() used to cut on the training thread, the builder now cuts: the same summary."""
    events, kw = window
    t0 = next(e.start_ns() for e in events if e.name() == f"eroica::step#{FIRST}")
    assert any(e.start_ns() < t0 for e in events)   # the lead-in step is in what stop() returned
    cut = [e for e in events if e.start_ns() >= t0]
    doc = summary.build(events, **kw)
    _same(doc, summary.build(cut, **kw))
    assert doc["profile"]["steps"] == K
    assert [s["step"] for s in doc["steps"]] == [FIRST + i for i in range(K)]


def test_an_error_inside_a_slice_reaches_the_caller() -> None:
    """The runtime catches it there (and switches itself off on that rank), like any internal error."""
    def broken() -> Any:
        yield
        raise ValueError("spoiled event")

    job = Resumable(broken())
    assert job.run(0.0) is False
    with pytest.raises(ValueError, match="spoiled event"):
        job.run(None)
    assert drain(iter(())) is None   # an empty computation returns None at once


def test_cupti_is_torn_down_after_a_capture_only_where_it_is_safe() -> None:
    """kineto keeps CUPTI attached after a profile unless TEARDOWN_CUPTI=1, and every later CUDA call
    pays (pytorch/pytorch#144455); teardown with CUDA graphs crashes below CUDA 12.6, and a value the
    user or torch set wins. The GPU check of the speed itself: AFTER=1 scripts/gpu-session."""
    from eroica_runtime.capture import wants_cupti_teardown

    assert wants_cupti_teardown(None, "12.6") and wants_cupti_teardown(None, "13.0")
    assert not wants_cupti_teardown(None, "12.4")
    assert not wants_cupti_teardown(None, None)          # CPU-only (this machine) or ROCm build
    assert not wants_cupti_teardown("0", "13.0")          # torch sets 0 for CUDA graphs on old CUDA
    assert not wants_cupti_teardown(None, "dev")


def test_deferred_summary_work_is_bounded_per_step_yet_finishes_in_few_steps_on_long_steps() -> None:
    """A ~0.6 s summary build: short steps get at most 20 ms a boundary (within the 50 ms a closing
    step may add), long steps a fifth of a step, so a job with 1 s steps hears its diagnosis ~3 steps
    after the window, not half a minute later; no step more than 1.5x longer."""
    from eroica_runtime.runtime import slice_budget_s

    assert slice_budget_s(0.050) == 0.020 and slice_budget_s(0.010) == 0.005 and slice_budget_s(0.001) == 0.002
    assert abs(slice_budget_s(1.0) - 0.2) < 1e-12 and abs(slice_budget_s(10.0) - 2.0) < 1e-12
    for step_s in (0.005, 0.04, 0.2, 1.0, 5.0):
        assert slice_budget_s(step_s) <= max(0.5 * step_s, 0.002)
    assert 0.6 / slice_budget_s(1.0) <= 3
