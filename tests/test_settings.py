"""A culprit named for a torch setting only it has (engine/settings.py), and for more work run inside an
op whose calls did not change (attribution._more_inside), on real jobs.

tests/data/engine/anomaly-rank-job, threads-rank-job and recompute-rank-job (their READMEs have the
commands): a 4-rank transformer with activation checkpointing on this 2-core machine; from step 60 rank 2
turns on autograd anomaly detection, runs 2 intra-op threads where the others run 1, or runs extra matmuls
in its checkpointed blocks.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import captures, eroica_run, explain

from eroica_runtime.analyst import format_job_stats, job_stats
from eroica_runtime.engine import diagnose
from eroica_runtime.engine.model import Diagnosis
from eroica_runtime.engine.settings import ANOMALY_FUNCTION
from eroica_runtime.report import format_capture

DATA = Path(__file__).parent / "data" / "engine"


def _diagnose(job: str, step: int, edit: Any = None) -> Diagnosis:
    """The capture at ``step`` against the job's baseline; ``edit(summaries)`` changes a copy first."""
    caps = captures(DATA / job)
    meta, sums, errors = caps[step]
    assert not errors
    if edit is not None:
        sums = copy.deepcopy(sums)
        edit(sums)
    return diagnose(sums, step=step, trigger=meta["trigger"], world_size=4, baseline=caps[min(caps)][1])


def _set(rank: int, name: str, value: int | None) -> Any:
    """An edit for ``_diagnose``: rank ``rank``'s (every rank's when negative) torch setting ``name`` set
    to ``value``, or removed (None: a summary from before the settings)."""
    def edit(sums: list[dict[str, Any]]) -> None:
        for s in sums:
            if s["rank"] == rank or rank < 0:
                torch = s["telemetry"]["end"]["torch"]
                if value is None:
                    torch.pop(name)
                else:
                    torch[name] = value
    return edit


def test_the_rank_that_turned_on_anomaly_detection_is_named_for_it_and_told_to_turn_it_off() -> None:
    d = _diagnose("anomaly-rank-job", 107)
    top = d.findings[0]
    assert (top.rank, top.category, top.function) == (2, "compute", ANOMALY_FUNCTION)
    assert top.evidence["settings"] == {"anomaly": [1.0, 0.0]}
    assert top.action.startswith("Autograd anomaly detection is on on this rank only")
    assert "hardware" not in top.action and "drain" not in top.action   # the switch is the cause
    text = format_capture(d).splitlines()
    assert "(autograd anomaly detection)" in text[0]
    assert "     set on this rank only: autograd anomaly detection on" in text
    assert not any(f.rank != 2 for f in d.findings)


def test_without_the_setting_in_its_summaries_the_same_rank_is_named_for_an_op_it_ran() -> None:
    """The summaries carry the setting: without it (older summaries) the finding names what grew."""
    top = _diagnose("anomaly-rank-job", 107, _set(-1, "anomaly", None)).findings[0]
    assert (top.rank, top.category) == (2, "compute")
    assert top.function != ANOMALY_FUNCTION and "settings" not in top.evidence
    assert "anomaly" not in top.action.lower()


def test_anomaly_detection_on_another_rank_too_is_not_called_this_ranks_alone() -> None:
    top = _diagnose("anomaly-rank-job", 107, _set(1, "anomaly", 1)).findings[0]
    assert top.rank == 2 and top.function != ANOMALY_FUNCTION and "settings" not in top.evidence


def test_a_rank_running_more_intra_op_threads_than_the_others_is_told_so() -> None:
    d = _diagnose("threads-rank-job", 106)
    top = d.findings[0]
    assert (top.rank, top.category) == (2, "compute")
    assert top.evidence["settings"] == {"threads": [2.0, 1.0]}
    assert top.action.startswith("Its ops run on 2 intra-op threads vs 1 on the other ranks")
    assert top.function != ANOMALY_FUNCTION   # what grew is still named: the threads are how, not where
    assert "     set on this rank only: 2 intra-op threads vs 1" in format_capture(d).splitlines()


def test_deterministic_algorithms_only_on_the_culprit_lead_its_action_and_the_others_alone_do_not() -> None:
    """The rule on a recorded job's summaries, edited: rank 2 (the culprit) with deterministic algorithms on
    is told so; rank 1 (a victim) with them on says nothing of rank 2, nor of itself."""
    top = _diagnose("threads-rank-job", 106, _set(2, "deterministic", 1)).findings[0]
    assert top.rank == 2 and top.evidence["settings"] == {"deterministic": [1.0, 0.0], "threads": [2.0, 1.0]}
    assert top.action.startswith("Deterministic algorithms are on on this rank only")
    d = _diagnose("threads-rank-job", 106, _set(1, "deterministic", 1))
    assert d.findings[0].evidence["settings"] == {"threads": [2.0, 1.0]} and all(f.rank != 1 for f in d.findings)


def test_the_baselines_before_the_switch_find_nothing_to_say_about_settings() -> None:
    for job in ("anomaly-rank-job", "threads-rank-job"):
        assert not _diagnose(job, 13).findings


def test_more_work_recomputed_inside_a_backward_node_is_named_as_more_work_not_slower_hardware() -> None:
    """tests/data/engine/recompute-rank-job: the extra matmuls of rank 2's checkpointed blocks run again
    inside the first backward node of each block, whose calls stay the same: the op with more calls is
    named, and the action is about work only this rank does, not its hardware."""
    top = _diagnose("recompute-rank-job", 67).findings[0]
    assert (top.rank, top.category, top.function) == (2, "compute", "aten::mm")
    assert top.evidence["work"] == "more" and top.evidence["calls"][0] > 10 * top.evidence["calls"][1]
    assert "drain" not in top.action and "more work" in top.action


def _rank_stats(rank: int, anomaly: int) -> dict[str, Any]:
    return {"rank": rank, "host": "h", "steps": 100, "median_ms": 10.0, "p99_ms": 12.0, "anomaly": anomaly}


def test_the_job_summary_says_which_ranks_trained_with_anomaly_detection_on() -> None:
    every = job_stats({r: _rank_stats(r, 1) for r in range(4)}, 4)
    assert every["anomaly_ranks"] == [0, 1, 2, 3] and all("anomaly" not in r for r in every["per_rank"])
    assert "autograd anomaly detection was on while it trained on every rank (4)" in format_job_stats(every, [])
    one = job_stats({r: _rank_stats(r, int(r == 2)) for r in range(4)}, 4)
    assert "autograd anomaly detection was on while it trained on rank 2:" in format_job_stats(one, [])
    none = job_stats({r: _rank_stats(r, 0) for r in range(4)}, 4)
    assert "anomaly_ranks" not in none and "anomaly" not in format_job_stats(none, [])


@pytest.mark.multirank
def test_a_job_whose_ranks_trained_with_anomaly_detection_on_is_told_at_its_end(tmp_path: Path) -> None:
    """Every rank alike: no finding can name it (no peer stands out), so the job summary does; also when
    the job turned it off again after its last step (Lightning's Trainer(detect_anomaly=True) does)."""
    train = Path(__file__).parent / "data" / "runtime" / "train.py"
    proc = eroica_run("--nproc-per-node", "2", "--report-dir", tmp_path, train,
                      env={"ANOMALY_RANKS": "0,1", "STEPS": "30"}, timeout=180)
    assert proc.returncode == 0 and "trained 30 steps" in proc.stdout, explain(proc)
    assert "autograd anomaly detection was on while it trained on every rank (2)" in proc.stderr, explain(proc)
    assert json.loads((tmp_path / "report.json").read_text())["job"]["anomaly_ranks"] == [0, 1]
    assert "Autograd anomaly detection was on while it trained on every rank (2)" in (tmp_path / "report.html").read_text()
