"""Ranks taking turns being the slowest (engine/imbalance.py), from real job-end reductions
(tests/data/imbalance: a 4-rank DDP job with per-rank batch lengths, its equal-length twin and a
straggler, each recorded with its command), and the reductions on their way to rank 0 (jobend.py)."""

from __future__ import annotations

import json
import math

import msgpack
import numpy as np
from conftest import DATA

from eroica_runtime import jobend
from eroica_runtime.analyst import format_job_stats, job_stats
from eroica_runtime.engine import imbalance
from eroica_runtime.report import format_job
from eroica_runtime.report_html import render_html


def _busy(name: str) -> imbalance.BusySteps:
    """A fixture's reduction (its columns as lists), through the wire as a node leader sends it."""
    doc = json.loads((DATA / "imbalance" / f"{name}.json").read_text())["busy"]
    b = imbalance.BusySteps(doc["first"], np.array(doc["total"]), np.array(doc["count"]), np.array(doc["busiest"]),
                            np.array(doc["rank"]), np.array(doc["ms"]))
    got = imbalance.BusySteps.from_wire(msgpack.unpackb(msgpack.packb(b.to_wire()), raw=False))
    assert got is not None and np.allclose(got.total, b.total, rtol=1e-6) and np.array_equal(got.busiest_rank, b.busiest_rank)
    return got


def test_ranks_drawing_batches_of_different_lengths_are_said_to_take_turns_with_what_it_costs() -> None:
    t = imbalance.from_steps(_busy("turns"), 4)
    assert t is not None and t.steps >= imbalance.MIN_STEPS and t.turns == 4 and t.top_share < 0.5
    # each rank busy ~11 ms a step on average, the busiest of them ~18.6: ~7.6 ms of a 36 ms step
    assert 5.0 <= t.excess_ms <= 10.0 and 0.15 <= t.share <= 0.30, t
    line = imbalance.format_imbalance(t)
    assert line.startswith("  ranks took turns being the slowest: each step waited for whichever rank had the most work")
    assert "4 of 4 ranks were the busiest at some step" in line and "bucket or pack samples by length" in line
    assert imbalance.Imbalance.from_json(json.loads(json.dumps(t.to_json()))) is not None


def test_equal_batches_and_a_straggler_are_no_turns() -> None:
    """The equal-length twin: the busiest rank ~0.2 ms above the mean (1% of the step). Rank 2 with
    extra matmuls at every step is the busiest at every step: a straggler (the findings and the
    steady-work line name it), not ranks taking turns."""
    assert imbalance.from_steps(_busy("equal"), 4) is None
    straggler = _busy("straggler")
    assert imbalance.from_steps(straggler, 4) is None
    keep = straggler.count == 4
    assert set(straggler.busiest_rank[keep].tolist()) == {2}


def test_steps_not_every_rank_reported_say_nothing() -> None:
    """A rank missing from the reduction (it sent no steps: a GPU rank, one whose eroica was off)
    leaves no step every rank reported: no line, rather than a mean over the others."""
    assert imbalance.from_steps(_busy("turns"), 5) is None
    assert imbalance.from_steps(None, 4) is None


def _rank_records() -> dict[int, dict]:
    """Per-rank ``to_send`` records that reduce to the turns fixture's shape: four ranks, 40 steps,
    rank (step % 4) the busiest by 6 ms."""
    out = {}
    for r in range(4):
        steps = [(100 + i, 10.0 + (6.0 if i % 4 == r else 0.0), 30.0) for i in range(40)]
        out[r] = imbalance.to_send(steps)
    return out


def test_node_leaders_reduce_their_ranks_steps_and_rank_0_merges_them_as_if_it_had_every_rank() -> None:
    records = _rank_records()
    whole = imbalance.reduce_ranks(records)
    parts = [imbalance.reduce_ranks({r: records[r]}) for r in (0, 1)] + [imbalance.reduce_ranks({2: records[2], 3: records[3]})]
    merged = imbalance.merge([imbalance.BusySteps.from_wire(msgpack.unpackb(msgpack.packb(p.to_wire()), raw=False))
                              for p in parts])
    whole = imbalance.BusySteps.from_wire(whole.to_wire())   # the same float32 rounding as the parts
    assert whole is not None and merged is not None
    assert imbalance.BusySteps.from_wire({**parts[0].to_wire(), "n": 65}) is None   # truncated: no reduction
    for a, b in ((whole.total, merged.total), (whole.count, merged.count), (whole.busiest, merged.busiest),
                 (whole.busiest_rank, merged.busiest_rank), (whole.step_total, merged.step_total)):
        assert np.array_equal(a, b)
    t = imbalance.from_steps(merged, 4)
    assert t is not None and t.turns == 4 and math.isclose(t.excess_ms, 4.5) and math.isclose(t.top_share, 0.25)


def test_a_leader_forwards_the_reduction_and_drops_malformed_records() -> None:
    """What a node leader sends (jobend.node_payload) and rank 0 reads (jobend.read): the ranks'
    statistics without their step records, one reduction; a foreign record is left out, never fails
    the job-end report."""
    records = _rank_records()
    blobs = {}
    for r in range(4):
        doc = {"rank": r, "host": "vm", "steps": 140, "median_ms": 30.0, "total_ms": 4200.0,
               "busy_steps": records[r] if r != 3 else {"first": "x", "busy": "no"}}
        blobs[r] = msgpack.packb(doc, use_bin_type=True)
    got = jobend.read({0: jobend.node_payload(blobs, [])})
    assert sorted(got.per_rank) == [0, 1, 2, 3] and all("busy_steps" not in d for d in got.per_rank.values())
    assert got.busy is not None and set(got.busy.count.tolist()) == {3}   # rank 3's record left out


def test_the_job_summary_and_both_reports_say_it() -> None:
    ranks = {r: {"rank": r, "host": "vm", "steps": 300, "median_ms": 34.0, "p99_ms": 60.0, "total_ms": 10700.0,
                 "eroica_ms": 200.0} for r in range(4)}
    stats = job_stats(ranks, 4, busy=_busy("turns"))
    assert "imbalance" in stats
    text = format_job_stats(json.loads(json.dumps(stats)), [])
    assert "a line below says why" in text and "  ranks took turns being the slowest" in text
    report = {"world_size": 4, "steps": 300, "captures": [{"step": 13, "trigger": "baseline", "ranks_analysed": 4,
                                                          "findings": []}],
              "findings": [], "job": stats}
    assert "but the ranks took turns being the slowest" in format_job(report, "/tmp/r")
    assert "Ranks took turns being the slowest" in render_html({"schema": "eroica.report/1", **report}, [], None)


def test_a_ranks_left_out_steps_are_gaps_that_keep_the_others_aligned() -> None:
    """Steps a rank leaves out (eroica's own, one it was stopped in) travel as NaN: its last 64 steps
    may span more, and the steps around them still line up with the other ranks'."""
    steps = [(s, 10.0, 30.0) for s in range(100, 200) if not 150 <= s < 170]
    sent = imbalance.to_send(steps)
    assert sent is not None and sent["first"] == 116 and len(sent["busy"]) == 84
    assert math.isnan(sent["busy"][150 - 116]) and sent["busy"][170 - 116] == 10.0
    whole = imbalance.to_send([(s, 12.0, 30.0) for s in range(100, 200)])
    got = imbalance.reduce_ranks({0: sent, 1: whole})
    assert got is not None and got.first == 116 and got.count[120 - 116] == 1 and got.count[140 - 116] == 2
    assert got.count[155 - 116] == 1 and got.busiest_rank[155 - 116] == 1   # rank 0 left step 155 out
    assert got.count[199 - got.first] == 2 and got.busiest_rank[199 - got.first] == 1


def test_ranks_busier_at_every_step_are_theirs_not_the_turns() -> None:
    """A pipeline's heavier stage (the fault bench's healthy-pp: ranks 2 and 3 at ~15 ms a step, 0 and
    1 at ~12) makes every step wait, and its two ranks take turns at being the busiest: that wait is
    the stage's, at every step, not ranks drawing different work; it is taken off before the bar."""
    doc = json.loads((DATA / "imbalance" / "pipeline.json").read_text())
    assert imbalance.from_steps(_busy("pipeline"), 4, doc["rank_means"]) is None
    # three heavy ranks and a light one, a 20 ms step: the wait clears the bar only without the means
    rng = np.random.default_rng(0)
    per_rank = np.vstack([np.full((1, 64), 6.0), 15.0 + rng.normal(0, 0.6, (3, 64))])
    b = imbalance.BusySteps(100, per_rank.sum(0), np.full(64, 4), per_rank.max(0), per_rank.argmax(0),
                            np.full(64, 4 * 20.0))
    assert imbalance.from_steps(b, 4) is not None
    assert imbalance.from_steps(b, 4, [6.0, 15.0, 15.0, 15.0]) is None
