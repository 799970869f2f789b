"""Work one rank does alone while the others wait (engine/lonework.py), on a real job.

tests/data/engine/checkpoint-job (its README has the command): 4 ranks on this 2-core machine,
rank 0 saving a 200 MB checkpoint every 25 steps while the others wait at a barrier, as most
training loops do; from step 60 rank 1 also runs 60 ms of extra matmuls a step. Captures: the
baseline (13), step 50 (the checkpoint in the window's first step, before the fault), a spike
capture at 80 (the fault, no checkpoint in its window) and step 99 (the checkpoint in its second
step, with the fault).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from eroica_runtime import summary
from eroica_runtime.engine import Thresholds, build_table, diagnose
from eroica_runtime.engine.attribution import find_culprits
from eroica_runtime.engine.lonework import NOTED, LoneWork, lone_steps, taken_out_note
from eroica_runtime.engine.model import Diagnosis
from eroica_runtime.engine.peers import form_peers
from eroica_runtime.report import format_capture

DATA = Path(__file__).parent / "data" / "engine"


def _captures(job: str = "checkpoint-job") -> dict[int, tuple[dict[str, Any], list[dict[str, Any]]]]:
    out = {}
    for p in (DATA / job / "captures").glob("*.msgpack"):
        meta, sums, errors = summary.decode_capture(p.read_bytes())
        assert not errors
        out[int(meta["step"])] = (meta, sums)
    return out


def _diagnose(step: int, job: str = "checkpoint-job") -> Diagnosis:
    """The capture at ``step`` of a recorded job, against its baseline (its first capture)."""
    caps = _captures(job)
    meta, sums = caps[step]
    return diagnose(sums, step=step, trigger=meta["trigger"], world_size=4, baseline=caps[min(caps)][1])


def test_the_step_a_checkpointing_rank_worked_alone_in_is_found_and_no_healthy_windows_step() -> None:
    """In every capture of the job whose window holds a checkpoint, that step and rank 0, and no other;
    none in the baseline's or the fault's window, or in windows of other real jobs, healthy or with a
    steady culprit."""
    caps = _captures()
    th = Thresholds()
    for step, (_, sums) in sorted(caps.items()):
        table = build_table(sums)
        rows = np.arange(table.n)
        lone = lone_steps(table, rows, th)
        saved = [s for s in range(step, step + 3) if s % 25 == 0]   # the window's checkpoint step, if any
        if not saved:
            assert lone == {}, (step, lone)
        else:
            (work,) = lone.values()
            assert int(table.rank[work.row]) == 0, (step, work)
            assert [step + s for s in work.steps] == saved, (step, work)
            assert work.ms > 0.5 * float(np.median(table.col("step"))), (step, work)
    # nor in healthy or steadily faulty windows of other real jobs
    for name in ("healthy-runq-luck.msgpack", "healthy-4hosts.msgpack", "demo-starved-peer.msgpack"):
        _, sums, _ = summary.decode_capture((DATA / name).read_bytes())
        table = build_table(sums)
        for rows in form_peers(table, world_size=table.n).groups:
            assert lone_steps(table, rows, th) == {}, name


def test_a_checkpoint_rank_0_saves_every_25_steps_is_named_at_its_cost_over_the_steps_not_per_window_step() -> None:
    """The window held one checkpoint (563 ms of rank 0's work while its peers waited: the window's
    median step 280 ms against 58 at the baseline). Before, rank 0's +190 ms/step fell under the
    window's step noise (~200 ms) and the capture read "healthy — 4/4 ranks agree"; counted per
    window step it would have cost 190 ms a step. It costs its work once in 25 steps."""
    d = _diagnose(50)
    (f,) = d.findings
    assert f.rank == 0 and f.category in ("io", "host"), f.title
    lone = f.evidence["lone_work"]
    assert lone["lone_steps"] == [50], lone
    once_in_25 = lone["lone_ms"] / 25
    assert 0.5 * once_in_25 <= f.impact_ms_per_step <= 2.0 * once_in_25, (f.impact_ms_per_step, lone)
    assert f.impact_ms_per_step < 0.3 * f.evidence["excess_ms"], f.evidence["excess_ms"]
    assert "checkpoint" in f.action and "alone" in f.title, (f.title, f.action)
    assert "healthy" not in format_capture(d)
    # fixed, the job steps about as in its baseline capture, not at the window's median less the cost
    base = _diagnose(13).step_ms["median"]
    assert 0.5 * base <= f.what_if_step_ms <= 1.5 * base, (f.what_if_step_ms, base, d.step_ms["median"])


def test_a_steady_culprit_is_named_though_another_ranks_checkpoint_made_the_window_noisy() -> None:
    """Rank 1's 60 ms of extra matmuls a step, in the window whose second step rank 0 spent saving a
    checkpoint: judged on the window's other two steps, rank 1 is the compute culprit. Judged on all
    three (the lone step not taken out), it is not: the checkpoint's step sets the noise and the step
    it is measured against."""
    d = _diagnose(99)
    (mine,) = [f for f in d.findings if f.rank == 1]
    assert (mine.category, mine.function) == ("compute", "aten::matmul"), mine.title
    _, sums = _captures()[99]
    table = build_table(sums)
    peers = form_peers(table, world_size=4)
    lone = {r: w for rows in peers.groups for r, w in lone_steps(table, rows, Thresholds()).items()}
    assert 1 in {int(table.rank[c.row]) for c in find_culprits(table, peers, Thresholds(), [], lone)}
    assert 1 not in {int(table.rank[c.row]) for c in find_culprits(table, peers, Thresholds(), [], {})}


def test_lone_work_in_many_peer_groups_is_one_bounded_note() -> None:
    """A job whose every pipeline stage has a rank saving its shard: one note a capture, naming the
    first few ranks and counting the rest, not a note a group."""
    _, sums = _captures()[50]
    table = build_table(sums)
    works = [LoneWork(row, (0,), 500.0 + row) for row in range(table.n)] * 3
    note = taken_out_note(table, works)
    assert note.count("ms in step 50") == NOTED and f"and {len(works) - NOTED} more rank(s)" in note, note


def test_metrics_rank_0_logs_every_10_steps_are_named_though_the_window_held_fewer_than_usual() -> None:
    """tests/data/engine/rank0-logs-job: rank 0 logs metrics for ~40 ms every 10 steps from step 100
    while its peers wait. The throughput capture's 16-step window held one logging step (161), so
    its excess was +2.6 ms a step against the 3.0 ms (10% of the step) a window must show, and the
    capture read "healthy — 4/4 ranks agree" although the 32 steps before the window showed rank 0
    busier by 4.2 ms a step. Named now, at its average over every step seen, as work it does alone
    every so often (not "in bursts")."""
    (f,) = _diagnose(155, "rank0-logs-job").findings
    assert (f.rank, f.category) == (0, "compute") and sorted(f.victims) == [1, 2, 3], f.title
    lone = f.evidence["lone_work"]
    assert lone["lone_steps"] == [161] and 30 < lone["lone_ms"] < 60, lone
    assert f.impact_ms_per_step == lone["average_ms"] and 3.0 < lone["average_ms"] < 4.5, lone
    assert "40 ms of work alone in step 161 while its peers waited" in f.title, f.title
    assert f.action.startswith("Every so often this rank works alone") and "logging metrics" in f.action, f.action


def test_a_rank_asleep_alone_every_10_steps_is_named_at_its_average_cost_not_a_one_off() -> None:
    """tests/data/engine/recurring-sleep-job: rank 3 of 4 sleeps 500 ms before every 10th step (a
    blocking write to slow storage), one of them in the window. Off the CPU, the sleeps are in no CPU
    or run-queue time of the steps before the window, and the capture read "a one-off stall, no
    steady culprit". How late rank 3 came to its collectives there shows them: it is named for work
    it does alone every so often, at what that costs on average (~50 ms a step), not per window step
    (~170) nor as a one-off."""
    d = _diagnose(69, "recurring-sleep-job")
    assert "one_off" not in d.step_ms, d.step_ms
    (f,) = d.findings
    assert (f.rank, f.category, f.victims) == (3, "host", (0, 1, 2)), f.title
    lone = f.evidence["lone_work"]
    assert lone["lone_steps"] == [70] and lone["before_window_steps"] == 32, lone
    # 3 sleeps of ~508 ms in the 32 steps before the window, ~1 ms of CPU more than its peers a step
    assert 40 < lone["before_window_ms"] < 55 and 40 < f.impact_ms_per_step < 70, (lone, f.impact_ms_per_step)
    assert f.action.startswith("Every so often this rank works alone while every other rank waits for it"), f.action
    assert "off the CPU" in f.action, f.action
