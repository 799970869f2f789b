"""Rank 0's analyst on recorded captures (tests/data/engine/e2e-data): which captures leave a
slowdown unexplained, so that the runtime lets rank 0's detector capture it again."""

from __future__ import annotations

from pathlib import Path

import msgpack

from eroica_runtime.analyst import Analyst
from eroica_runtime.gather import Gathered

ENGINE = Path(__file__).parent / "data" / "engine"
CAPTURES = ENGINE / "e2e-data" / "captures"


def _gathered(step: int | Path, trigger: str, as_step: int | None = None) -> Gathered:
    """A recorded capture (its step in CAPTURES, or a file) as the gather hands it over, re-labelled (a
    healthy window the spike rule opened is the baseline capture's summaries under another trigger)."""
    path = step if isinstance(step, Path) else CAPTURES / f"{step}.msgpack"
    doc = msgpack.unpackb(path.read_bytes(), raw=False, strict_map_key=False)
    doc["trigger"] = trigger
    if as_step is not None:
        doc["step"] = as_step
    return Gathered(step=doc["step"], trigger=trigger, path=path, data=msgpack.packb(doc, use_bin_type=True),
                    missing=[])


def _analysed(tmp_path: Path, *captures: Gathered) -> Analyst:
    analyst = Analyst(str(tmp_path), world_size=4)
    for g in captures:
        analyst.submit(g)
    assert analyst.wait(60.0)
    analyst.stop()
    return analyst


def test_a_detector_capture_with_no_culprit_leaves_the_slowdown_unexplained(tmp_path: Path) -> None:
    analyst = _analysed(tmp_path, _gathered(12, "baseline"), _gathered(12, "spike", as_step=40))
    assert not analyst.diagnoses[-1].findings
    assert analyst.take_unexplained() and not analyst.take_unexplained()   # said once


def test_a_capture_that_named_a_culprit_or_was_not_a_detectors_is_no_reason_to_capture_again(
        tmp_path: Path) -> None:
    analyst = _analysed(tmp_path, _gathered(12, "baseline"), _gathered(46, "spike"))
    assert analyst.diagnoses[-1].findings and not analyst.take_unexplained()
    analyst = _analysed(tmp_path / "manual", _gathered(12, "baseline"), _gathered(12, "manual", as_step=40))
    assert not analyst.take_unexplained()


def test_a_drift_capture_no_slower_than_the_baseline_is_found_healthy_and_said_once(tmp_path: Path) -> None:
    """The runtime sends this verdict to every rank (Trigger.found_healthy): the drift rule then stops
    taking that level for a drift for a while."""
    analyst = _analysed(tmp_path, _gathered(12, "baseline"), _gathered(12, "drift", as_step=40))
    assert analyst.diagnoses[-1].healthy
    assert analyst.take_healthy() == 40 and analyst.take_healthy() is None


def test_no_capture_is_found_healthy_that_named_a_culprit_was_slower_or_had_no_baseline(tmp_path: Path) -> None:
    """A culprit named; a real capture slower than its baseline (91.0 vs 56.7 ms) with nobody to blame
    (tests/data/engine/slower-no-culprit*.msgpack); and a job without a baseline capture, where "no
    finding" says nothing about the step's level: none of them may hold the drift rule back."""
    named = _analysed(tmp_path / "named", _gathered(12, "baseline"), _gathered(46, "drift"))
    assert named.diagnoses[-1].findings and named.take_healthy() is None
    slower = _analysed(tmp_path / "slower", _gathered(ENGINE / "slower-no-culprit-baseline.msgpack", "baseline"),
                       _gathered(ENGINE / "slower-no-culprit.msgpack", "drift"))
    assert not slower.diagnoses[-1].findings and slower.take_unexplained() and slower.take_healthy() is None
    alone = _analysed(tmp_path / "alone", _gathered(12, "drift", as_step=40))
    assert alone.diagnoses[-1].healthy and alone.take_healthy() is None


def test_a_second_baseline_is_the_new_reference_compared_with_none(tmp_path: Path) -> None:
    """The job's steps came to be counted elsewhere (an evaluation pass's batches, then the training's
    optimizer steps: Trigger.relearn takes the baseline again): the second baseline is no slowdown
    against the first (91.0 vs 56.7 ms here, "all ranks slower than the baseline" before), and the
    captures after it are judged against it."""
    first = _gathered(ENGINE / "slower-no-culprit-baseline.msgpack", "baseline")
    again = _gathered(ENGINE / "slower-no-culprit.msgpack", "baseline")
    later = _gathered(ENGINE / "slower-no-culprit.msgpack", "drift", as_step=again.step + 40)
    analyst = _analysed(tmp_path, first, again, later)
    assert [d.trigger for d in analyst.diagnoses] == ["baseline", "baseline", "drift"]
    assert not analyst.diagnoses[1].findings and "unexplained_ms" not in analyst.diagnoses[1].step_ms
    assert analyst.diagnoses[2].healthy and analyst.take_healthy() == later.step


def test_the_job_summary_ranks_ranks_only_when_their_step_times_differ() -> None:
    """In synchronous training every rank spends the same wall time a step (each waits for the slowest):
    the summary says so instead of calling a victim "slowest". Medians are no test of that: the demo
    printed "slowest ranks by median step: rank 3 (vm) 66.7 ms, rank 2 (vm) 65.2 ms" with rank 2 the
    culprit, its ranks' medians 63.4-66.7 ms while their step times plus eroica's boundary work summed
    alike. Ranks whose step times really differ (no collective ties them) are still ranked, by that mean."""
    from eroica_runtime.analyst import format_job_stats, job_stats

    def stats(medians: list[float], totals: list[float] | None = None, own: list[float] | None = None) -> dict:
        return job_stats({r: {"rank": r, "host": "vm", "steps": 141, "median_ms": m, "p99_ms": m * 2,
                              **({"total_ms": totals[r], "eroica_ms": own[r]} if totals and own else {})}
                          for r, m in enumerate(medians)}, len(medians))

    demo = stats([64.8, 63.4, 65.2, 66.7], [9_160.0, 9_100.0, 9_180.0, 9_150.0], [300.0, 360.0, 280.0, 310.0])
    text = format_job_stats(demo, [{"step": 68, "trigger": "spike"}])
    assert ("  step time alike on every rank (67.6 ms a step on average, eroica's boundary work included): "
            "ranks wait for each other") in text and "slowest" not in text, text
    # a healthy job's summary points at no findings it does not have (a job checkpointing every 25 steps
    # read "...; the findings name it" above "healthy — no findings")
    assert ("  step time alike on every rank (67.6 ms a step on average, eroica's boundary work included)"
            in format_job_stats(demo, [], findings=False).splitlines())
    unsynced = stats([75.7, 110.0, 75.2, 74.9], [10_600.0, 15_400.0, 10_530.0, 10_490.0], [10.0] * 4)
    assert "  slowest ranks by mean step: rank 1 (vm) 110.1 ms, rank 0 (vm) 75.8 ms, rank 2 (vm) 75.3 ms" \
        in format_job_stats(unsynced, []).splitlines()
    # ranks of an older eroica send no totals: their medians are all there is
    text = format_job_stats(stats([75.7, 75.1, 75.2, 74.9]), [{"step": 68, "trigger": "spike"}])
    assert "step time alike on every rank (median step 74.9-75.7 ms)" in text and "slowest" not in text, text
    text = format_job_stats(stats([75.7, 110.0, 75.2, 74.9]), [])
    assert "slowest ranks by median step: rank 1 (vm) 110.0 ms" in text, text
    # one rank without totals (a spoiled value) ranks every rank by median rather than mixing the two
    mixed = stats([75.7, 110.0, 75.2, 74.9], [10_600.0, float("nan"), 10_530.0, 10_490.0], [10.0] * 4)
    assert "slowest ranks by median step: rank 1 (vm) 110.0 ms" in format_job_stats(mixed, [])
    # a one-rank job (a single-GPU run): its step, no ranking of one, and "1 rank"
    lines = format_job_stats(stats([97.4], [9_300.0], [230.0]), []).splitlines()
    assert lines[:2] == ["eroica: job summary: 141 steps on 1 rank; step time median 97.4 ms, p99 194.8 ms",
                         "  68.1 ms a step on average, eroica's boundary work included"], lines


def test_the_job_summary_says_what_eroica_itself_took_on_each_rank() -> None:
    """A healthy job's log has no finding to weigh eroica's cost against: the summary says the time its
    boundary work took (left out of the step times) as seconds and a share of each rank's time. Ranks
    that sent no such numbers (an older eroica, a spoiled value) are left out, and none leaves no line."""
    from eroica_runtime.analyst import format_job_stats, job_stats, own_time_text

    per_rank = {r: {"rank": r, "host": "vm", "steps": 140, "median_ms": 75.0, "p99_ms": 90.0,
                    "total_ms": 10_000.0, "eroica_ms": e} for r, e in enumerate([120.0, 310.0, 150.0])}
    per_rank[3] = {"rank": 3, "host": "vm", "steps": 140, "median_ms": 75.0, "p99_ms": 90.0, "eroica_ms": 5000.0}
    per_rank[4] = {"rank": 4, "host": "vm", "steps": 140, "median_ms": 75.0, "p99_ms": 90.0,
                   "total_ms": float("nan"), "eroica_ms": 5000.0}
    text = format_job_stats(job_stats(per_rank, 5), [])
    assert "  eroica's own work at step boundaries: 0.1-0.3 s a rank, 1.2-3.0% of its time" in text.splitlines(), text
    assert own_time_text([{"eroica_ms": 150.0, "total_ms": 9850.0}]) == \
        "  eroica's own work at step boundaries: 0.1 s a rank, 1.5% of its time"
    # a short job's: in ms, not "0.0 s"
    assert own_time_text([{"eroica_ms": 42.4, "total_ms": 300.0}, {"eroica_ms": 8.0, "total_ms": 292.0}]) == \
        "  eroica's own work at step boundaries: 8-42 ms a rank, 2.7-12.4% of its time"
    assert own_time_text([{"eroica_ms": True, "total_ms": 100.0}, {"eroica_ms": -1.0, "total_ms": 100.0}, "x"]) == ""


def test_a_later_capture_says_what_the_job_has_lost_so_far_and_the_partial_report_keeps_it(
        tmp_path: Path, capsys) -> None:
    """A long job slowed at step 46 and captured again at 90: the SRE reading the log sees the time lost
    so far under the second capture's finding, and a job killed then keeps it in report.json."""
    import json

    from eroica_runtime import report
    from eroica_runtime.engine.timelost import time_lost

    history = [50.0] * 45 + [90.0] * 60          # step 46 on: 40 ms slower a step
    analyst = Analyst(str(tmp_path), world_size=4)

    def source() -> dict:
        since = analyst.first_finding_step()
        lost = None if since is None else time_lost(history, [(12, 3), (46, 3), (90, 3)], since, warmup=10,
                                                    lookback=9)
        return {} if lost is None else {"time_lost": lost.to_json()}

    analyst.time_lost_source = source
    for g in (_gathered(12, "baseline"), _gathered(46, "spike")):
        analyst.submit(g)
    assert analyst.wait(60.0)
    first = capsys.readouterr().err
    assert analyst.diagnoses[-1].findings and "time lost" not in first   # the first finding: nothing to measure yet
    analyst.submit(_gathered(46, "spike", as_step=90))
    assert analyst.wait(60.0)
    analyst.stop()
    later = capsys.readouterr().err
    lost = source()["time_lost"]
    assert report.format_time_lost(lost) in later.splitlines(), later
    assert 39.0 < lost["per_step_ms"] < 41.0
    job = json.loads((tmp_path / "report.json").read_text())["job"]
    assert job["partial"] and job["time_lost"] == lost


def test_a_failing_time_lost_source_never_fails_the_analysis(tmp_path: Path, capsys) -> None:
    analyst = Analyst(str(tmp_path), world_size=4)
    analyst.time_lost_source = lambda: 1 / 0
    for g in (_gathered(12, "baseline"), _gathered(46, "spike")):
        analyst.submit(g)
    assert analyst.wait(60.0)
    analyst.stop()
    assert analyst.diagnoses[-1].findings and (tmp_path / "diagnosis-46.json").exists()
    assert "time lost so far not measured: ZeroDivisionError" in capsys.readouterr().err


def test_an_old_capture_file_that_cannot_be_removed_is_said_once_and_every_file_kept_from_then_on(
        tmp_path: Path, capsys) -> None:
    """--keep-captures 1: after the capture at 30, the file of the healthy one at 20 would go; it is a
    directory here (any OSError), so rank 0 says so once, keeps every file from then on, and every
    capture is still diagnosed."""
    (tmp_path / "captures" / "20.msgpack").mkdir(parents=True)
    analyst = Analyst(str(tmp_path), world_size=4, keep_captures=1)
    for g in (_gathered(12, "baseline"), *(_gathered(12, "drift", as_step=s) for s in (20, 30, 40))):
        analyst.submit(g)
    assert analyst.wait(60.0)
    analyst.stop()
    err = capsys.readouterr().err
    assert err.count("cannot remove an old capture file") == 1, err
    assert analyst.keep_captures == 0 and analyst.removed == [] and len(analyst.diagnoses) == 4
    assert (tmp_path / "captures" / "20.msgpack").is_dir()
