"""What the DataLoaders' epoch turnovers cost a job (engine/epochs.py), from ranks' real job-end
statistics (tests/data/epochs: a 4-rank DDP job with 30-step epochs, recorded with its command)."""

from __future__ import annotations

import json
from typing import Any

from conftest import DATA

from eroica_runtime.analyst import format_job_stats, job_stats
from eroica_runtime.engine import epochs


def _ranks(name: str) -> dict[int, dict[str, Any]]:
    doc = json.loads((DATA / "epochs" / f"{name}.json").read_text())
    return {int(r): {"rank": int(r), "steps": 240, "median_ms": 17.0, **stats} for r, stats in doc["per_rank"].items()}


def test_workers_started_anew_every_epoch_are_priced_and_persistent_workers_is_the_advice() -> None:
    t = epochs.epoch_starts(_ranks("restarts"))
    assert t is not None and t.ranks == 4 and t.turnovers == 8 and t.restarts == 8 and t.workers == 2
    # each start cost ~110 ms beyond an ordinary batch's wait (the job: 5.5 s in steps, 4.8 s with
    # persistent workers), no rank much slower than the others
    assert 80 <= t.per_start_ms[0] <= t.per_start_ms[1] <= 140 and t.slowest_rank is None
    assert 0.10 <= t.share <= 0.25
    line = epochs.format_epoch_starts(t)
    assert line.startswith("  epoch starts: each held the ranks ") and "(8 epochs: " in line
    assert line.endswith("its 2 worker processes start anew at every epoch; persistent_workers=True keeps them")


def test_a_validation_pass_after_each_epoch_is_counted_as_a_pass_over_its_dataset_not_an_epoch() -> None:
    """The same job with a 10-batch validation loader after every epoch: 16 iterations began on each
    rank, over 2 datasets; the line said "16 epochs" for 8."""
    t = epochs.epoch_starts(_ranks("with_validation"))
    assert t is not None and t.turnovers == 16 and t.datasets == 2 and t.restarts == 16
    line = epochs.format_epoch_starts(t)
    assert "(16 passes over 2 datasets: " in line and " epochs: " not in line, line
    assert epochs.EpochStarts.from_json(json.loads(json.dumps(t.to_json()))).datasets == 2
    # a report.json written before datasets were counted reads as one dataset
    old = {k: v for k, v in epochs.epoch_starts(_ranks("restarts")).to_json().items() if k != "datasets"}
    assert "(8 epochs: " in epochs.format_epoch_starts(epochs.EpochStarts.from_json(old))


def test_persistent_workers_refilling_at_each_epoch_are_no_line() -> None:
    """The same job with persistent_workers=True: each epoch's first batch still waits ~20 ms for the
    pipeline to fill (3-4% of the step time), which no setting removes."""
    assert epochs.epoch_starts(_ranks("persistent")) is None


def test_a_rank_whose_workers_start_slowly_is_the_one_the_others_waited_for() -> None:
    t = epochs.epoch_starts(_ranks("slow_start_rank2"))
    assert t is not None and t.slowest_rank == 2 and t.slowest_host == "vm"
    assert t.slowest_ms >= 300 and t.per_start_ms[1] == t.slowest_ms and t.per_start_ms[0] < 150
    # the job lost what rank 2 took: every rank waited for it in the next all-reduce
    assert t.total_ms == 8 * t.slowest_ms and t.share >= 0.3
    assert "; rank 2 (vm) took longest, " in epochs.format_epoch_starts(t)


def test_the_job_summary_says_it_and_reads_it_back_from_report_json() -> None:
    stats = job_stats(_ranks("restarts"), 4)
    assert all("loader" not in r for r in stats["per_rank"])   # one summary, not a map a rank
    stored = json.loads(json.dumps(stats))
    text = format_job_stats(stored, [])
    assert "  epoch starts: each held the ranks " in text and "persistent_workers=True" in text
    back = epochs.EpochStarts.from_json(stored["epoch_starts"])
    assert back is not None and back.to_json() == stored["epoch_starts"]


def test_ranks_from_an_older_eroica_or_with_bad_numbers_are_left_out() -> None:
    ranks = _ranks("restarts")
    ranks[0].pop("loader")
    ranks[1]["loader"] = {**ranks[1]["loader"], "turnover_ms": float("nan")}
    ranks[2]["loader"] = "corrupt"
    t = epochs.epoch_starts(ranks)
    assert t is not None and t.ranks == 1
    assert epochs.epoch_starts({r: {**s, "loader": None} for r, s in ranks.items()}) is None
    assert epochs.EpochStarts.from_json({"ranks": 4}) is None and epochs.EpochStarts.from_json("x") is None
    # one epoch is the job's start-up, not a rhythm
    one = {r: {**s, "loader": {**s["loader"], "turnovers": 1}} for r, s in _ranks("restarts").items()}
    assert epochs.epoch_starts(one) is None
