"""A rank whose lead over its peers is within what their step-to-step variation gives the busiest by
chance is no culprit (engine/turns.py), while a straggler that clears the bar over the steps before the
window is still named.

Fixtures: windows of tests/data/imbalance/job.py, each rank drawing its own heavy-tailed batch lengths
(`eroica-run --nproc-per-node 4 --report-dir D tests/data/imbalance/job.py --steps 600 --spread 2`,
2026-12-05, this 2-core machine): ``turns-window-rank2.msgpack`` is a spike capture at step 95 that named
"rank 2 ... compute in aten::linear (+19.2 ms/step own work)" from its 3-step window, and
``turns-history-rank0.msgpack`` a throughput capture at step 319 that named "rank 0 ... compute in the 8
steps before the window (+16.5 ms/step busy)"; the job summaries said the ranks took turns.
"""

from __future__ import annotations

import copy
from pathlib import Path

from eroica_runtime import summary
from eroica_runtime.engine import diagnose
from eroica_runtime.engine.table import build_table

DATA = Path(__file__).parent / "data"


def _capture(name: str) -> tuple[dict, list[dict]]:
    path = DATA / "imbalance" / name
    meta, sums, errors = summary.decode_capture(path.read_bytes(), origin=path.name)
    assert not errors
    return meta, sorted(sums, key=lambda s: s["rank"])


def _diagnose(meta: dict, sums: list[dict]):
    return diagnose(sums, step=meta["step"], trigger=meta["trigger"], world_size=meta["world_size"])


def test_a_lead_within_the_draw_of_a_turn_taking_job_names_nobody() -> None:
    for name, rank, trigger in (("turns-window-rank2.msgpack", 2, "spike"),
                                ("turns-history-rank0.msgpack", 0, "throughput")):
        meta, sums = _capture(name)
        assert meta["trigger"] == trigger
        # the ranks' busy time varies by 10-37 ms from step to step here (1-6 ms in healthy jobs)
        sd = build_table(sums).sch("span_busy_sd")
        assert min(sd) > 9.0, sd
        d = _diagnose(meta, sums)
        assert not [f for f in d.findings if f.category in ("compute", "dataloader")], [f.title for f in d.findings]
        said = [n for n in d.notes if n.startswith(f"rank {rank} was +") and "take turns being the slowest" in n]
        assert said, d.notes


def test_a_steady_straggler_in_a_turn_taking_job_is_still_named() -> None:
    """Rank 2 of the window fixture, 20 ms more CPU in each of the 32 steps before the window (and so in
    its recent 8): its window lead is as before, within the draw, but over the steps before the window
    it is far above what chance gives, and the window's finding stands."""
    meta, sums = _capture("turns-window-rank2.msgpack")
    slow = copy.deepcopy(sums)
    slow[2]["history"]["cpu"] = [x + 20.0 for x in slow[2]["history"]["cpu"]]
    d = _diagnose(meta, slow)
    assert [(f.rank, f.category) for f in d.findings] == [(2, "compute")], ([f.title for f in d.findings], d.notes)
    assert not [n for n in d.notes if "take turns being the slowest" in n]


def test_extra_calls_are_never_the_luck_of_the_draw() -> None:
    """A rank that ran more calls of the named function than its peers (an extra code path) is named
    whatever the draw: rank 2 of the window fixture with the calls of its matmuls (forward and backward)
    doubled."""
    meta, sums = _capture("turns-window-rank2.msgpack")
    more = copy.deepcopy(sums)
    for fn in more[2]["functions"]:
        if any(k in fn["name"] for k in ("linear", "addmm", "Addmm", "aten::mm")):
            fn["count"] = fn["count"] * 2
    d = _diagnose(meta, more)
    assert [(f.rank, f.category, f.evidence.get("work")) for f in d.findings] == [(2, "compute", "more")], \
        [f.title for f in d.findings]
