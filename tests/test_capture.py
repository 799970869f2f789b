"""eroica_runtime.capture with the real torch.profiler: what a window records."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import torch

from eroica_runtime.capture import Capture, JobProfilers


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
    steps = {e.name(): e.start_ns() for e in events if e.name().startswith("eroica::step#")}
    assert sorted(steps) == ["eroica::step#49", "eroica::step#50", "eroica::step#51", "eroica::step#52"]
    assert not [e for e in events if e.name().startswith("ProfilerStep#")]
    ops = [e for e in events if e.name().startswith("aten::")]
    assert ops and all(e.start_ns() >= steps["eroica::step#50"] for e in ops), "lead-in ops recorded"
    per_step = [sum(1 for e in ops if e.name() == "aten::addmm" and steps[f"eroica::step#{s}"] <= e.start_ns()
                    and (s == 52 or e.start_ns() < steps[f"eroica::step#{s + 1}"])) for s in (50, 51, 52)]
    assert per_step == [2, 2, 2], per_step


def test_a_jobs_own_profiler_waiting_for_its_steps_adds_no_step_to_the_window() -> None:
    """A job's torch.profiler with a schedule opens a ProfilerStep#N range at every prof.step(), also
    while it only waits (schedule wait=...), and eroica's profiler records those too. Read as the
    window's steps (a real 3-rank DDP job whose profiler waited for step 20 while eroica captured
    13-15), one all-reduce a step read 0.67 and half of DistributedDataParallel.forward backward.
    eroica marks its steps with its own ranges: the window holds its k steps, each with its ops."""
    from eroica_runtime import summary

    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    jobs = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                  schedule=torch.profiler.schedule(wait=1000, warmup=1, active=1))
    cap, k = Capture(), 3

    def step() -> None:
        opt.zero_grad()
        model(torch.randn(8, 32)).sum().backward()
        opt.step()

    jobs.start()
    step()
    jobs.step()
    cap.start(50, "test", k)
    for i in range(k + 1):
        step()
        if i < k:
            cap.mark()          # the runtime's boundary, in the optimizer step's post-hook
        jobs.step()             # the job's own prof.step() after its optimizer step
    events = list(cap.stop())
    jobs.stop()
    assert {e.name() for e in events if e.name().startswith("ProfilerStep#")}, "the job's ranges were recorded"
    doc = summary.build(events, identity={"rank": 0, "host": "h"}, capture={"step": 50, "trigger": "test", "k": k},
                        steps=[{"step": 50 + i, "ms": 1.0} for i in range(k)], gc={"count": 0, "ms": 0.0},
                        telemetry={})
    assert doc["profile"]["steps"] == k and [s["step"] for s in doc["steps"]] == [50, 51, 52], doc["profile"]
    counts = {(f["name"], f["phase"]): f["count"] for f in doc["functions"]}
    assert counts.get(("aten::addmm", "forward")) == 2 and counts.get(("Optimizer.step#SGD.step", "optimizer")) == 1, \
        counts
    assert not [name for name, _ in counts if name.startswith(("ProfilerStep#", "eroica::step#"))], counts


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


# ---- the job's own profiler comes first ---------------------------------------------------------------
# A process runs one torch.profiler session at a time: one started inside another takes the session
# over, and the outer one's stop then gets no results, whose export_chrome_trace segfaulted the job
# (a job with its own profiler schedule died under eroica-run at its first trace).

def _watched() -> tuple[Capture, JobProfilers]:
    jobs = JobProfilers()
    cap = Capture(jobs)
    jobs.before_start = lambda: cap.give_way("the job's own profiler started")
    jobs.install()
    return cap, jobs


def _job_trace(tmp_path: Path, prof: Any) -> set[str]:
    """The job's trace as its on_trace_ready would write it: the op names in it."""
    path = tmp_path / "job.json"
    prof.export_chrome_trace(str(path))
    return {e.get("name") for e in json.loads(path.read_text())["traceEvents"]}


def test_a_window_gives_way_to_the_jobs_profiler_starting_in_it(tmp_path: Path) -> None:
    """eroica's window is open and recording when the job's own profiler starts: eroica's stops first,
    so the job's profile records its steps and exports; eroica's window stays open (its close is
    agreed with the other ranks) and hands over no events."""
    cap, jobs = _watched()
    try:
        cap.start(10, "test", 3)
        assert cap.profiling
        torch.ones(4).mul_(2)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            torch.ones(4).add_(1)
        assert cap.active and not cap.profiling and "started" in cap.gave_way
        cap.mark()
        assert list(cap.stop()) == [] and not cap.active
        assert "aten::add_" in _job_trace(tmp_path, prof)
    finally:
        jobs.uninstall()


def test_no_window_profiles_while_the_jobs_profiler_is_on(tmp_path: Path) -> None:
    """A window agreed while the job's profiler warms up or records (its schedule's warm-up step
    counts: the session is being prepared) opens given way: eroica's profiler never starts, and the
    job's profile keeps every op it recorded."""
    cap, jobs = _watched()
    try:
        sched = torch.profiler.schedule(wait=0, warmup=1, active=2, repeat=1)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=sched) as prof:
            assert jobs.on
            assert cap.start(20, "test", 2) is False
            assert cap.active and not cap.profiling and "on at step 19" in cap.gave_way
            for _ in range(3):
                torch.ones(4).add_(1)
                prof.step()
                cap.mark()
        assert list(cap.stop()) == []
        assert not jobs.on
        assert "aten::add_" in _job_trace(tmp_path, prof)
        # the job's profiler off: the next window records again
        assert cap.start(30, "test", 1) is True and cap.profiling
        cap.mark()   # the lead-in's host ops are not recorded
        torch.ones(4).add_(1)
        assert any(e.name() == "aten::add_" for e in cap.stop())
    finally:
        jobs.uninstall()


def test_eroicas_own_profiler_is_not_the_jobs() -> None:
    """eroica's warm-up and windows go through the same torch methods the watch wraps; they never
    count as the job's profiler (nor make a window give way to itself), and uninstall restores torch."""
    import torch.autograd.profiler as ap

    before = {name: (cls.__dict__.get(name), getattr(cls, name)) for cls in (ap.profile, ap.emit_nvtx, ap.emit_itt)
              for name in ("_prepare_trace", "_start_trace", "__enter__", "__exit__") if hasattr(cls, name)}
    original = ap.profile._start_trace
    cap, jobs = _watched()
    try:
        cap.warm_up()
        _window(cap, 50, 2)
        assert not jobs.seen and not jobs.on and cap.gave_way == ""
    finally:
        jobs.uninstall()
    assert ap.profile._start_trace is original
    after = {name: (cls.__dict__.get(name), getattr(cls, name)) for cls in (ap.profile, ap.emit_nvtx, ap.emit_itt)
             for name in ("_prepare_trace", "_start_trace", "__enter__", "__exit__") if hasattr(cls, name)}
    assert after == before


def _fresh_python(code: str) -> dict:
    """Run code in a new interpreter (this one may have imported inductor already); it prints JSON."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_eroicas_profiler_never_imports_inductor_into_a_job_that_did_not():
    """torch.profiler's start asks hasattr(torch, "_inductor"), and torch answers by importing inductor
    and dynamo: a second of CPU and ~70 MB in every rank eroica watches. Its warm-up and windows must
    record as before without it, and leave torch's lazy lookup as it was (the job's own use still works)."""
    seen = _fresh_python("""
        import json, sys, threading, torch
        lazy = torch.__getattr__
        from eroica_runtime.capture import Capture
        cap = Capture()
        cap.warm_up()
        cap.start(10, "test", 2)
        for i in range(3):                  # the lead-in step, then the window's two
            torch.ones(64).add_(1)
            if i < 2:
                cap.mark()
        names = {e.name() for e in cap.stop()}
        print(json.dumps({"unloaded": "torch._inductor" not in sys.modules, "lookup_kept": torch.__getattr__ is lazy,
                          "steps": sorted(n for n in names if n.startswith("eroica::step#")),
                          "ops": "aten::add_" in names, "job_gets_it": hasattr(torch, "_inductor")}))
    """)
    assert seen == {"unloaded": True, "lookup_kept": True, "steps": ["eroica::step#10", "eroica::step#11",
                    "eroica::step#9"], "ops": True, "job_gets_it": True}


def test_a_job_that_compiled_with_cuda_graphs_still_gets_torchs_cuda_graph_check():
    """Where the job has inductor loaded, torch's own check runs: a profile started with CUDA graphs on
    knows it (torch then keeps CUPTI attached, since teardown crashes CUDA graphs)."""
    seen = _fresh_python("""
        import json, torch
        import torch._inductor.config as config
        config.triton.cudagraphs = True
        from eroica_runtime.capture import _profile
        prof = _profile()
        prof.prepare_trace()
        print(json.dumps({"cudagraphs": prof.has_cudagraphs}))
        prof.profiler = None
    """)
    assert seen == {"cudagraphs": True}
