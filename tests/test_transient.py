"""The job report tells CPU contention that came once and went from a culprit of the job.

Fixture ``data/engine/transient-jobs.json``: the diagnoses (the fields the job report reads) of real
jobs on this 2-core VM, 4 ranks of the fault bench's train job:
- ``healthy-5000-steps``: ``scripts/fault-bench --cases healthy-1 --steps 5000 --overhead-rounds 0``
  (2026-12-04, the refilling budget): the spike capture at step 655 named rank 1 "host in
  aten::linear" (waiting for a CPU 27.1 ms a step against 12.3, in the window and the 8 steps before
  it); 9 detector captures after it named nobody.
- ``noise-2500-steps``: the first 2,500-step run of the drift-floor comparison (``d83abfa``, a compute
  fault from step 2,000 that its spent budget never captured): the spike capture at step 254 named
  rank 3 "host in the 8 steps before the window"; 6 detector captures after it named nobody.
- ``contend-int-120-steps``: fault bench run 36, contend-int (2 hogs on rank 1's core, 8 steps in 20
  from step 50): rank 1 named "host" from the steps before the windows at 58 and 98.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from eroica_runtime import report
from eroica_runtime.engine.model import Diagnosis
from eroica_runtime.engine.transient import LATER_CAPTURES

JOBS = json.loads((Path(__file__).parent / "data" / "engine" / "transient-jobs.json").read_text())["jobs"]


def _diagnoses(name: str) -> list[Diagnosis]:
    return [Diagnosis.from_json(d) for d in JOBS[name]]


@pytest.mark.parametrize(("name", "rank", "step", "after"), [("healthy-5000-steps", 1, 655, 9),
                                                           ("noise-2500-steps", 3, 254, 6)])
def test_a_rank_starved_once_and_not_in_the_captures_after_is_transient_not_a_finding(
        tmp_path: Path, name: str, rank: int, step: int, after: int) -> None:
    """Both long healthy jobs' reports read as if the job had a host problem: now the job has no
    finding, and the report still says what that capture saw, as transient (text, report.json,
    report.html); the capture's own diagnosis keeps its finding."""
    diagnoses = _diagnoses(name)
    doc = report.write_job(tmp_path, diagnoses=diagnoses, world_size=4, steps=5000)
    assert doc["findings"] == []
    [seen] = doc["transient"]
    assert (seen["rank"], seen["category"], seen["captures"]) == (rank, "host", [step])
    assert len(seen["evidence"]["not_seen_after"]) == after and min(seen["evidence"]["not_seen_after"]) > step
    head, *rest = report.format_job(doc, tmp_path).splitlines()
    assert "0 finding(s)" not in head and ("healthy" in head or "no findings" in head), head
    assert any(line.startswith(f"  transient, not a finding: rank {rank} on vm was starved of CPU around step "
                               f"{step}") and f"not in the {after} detector capture(s) after it" in line
               for line in rest), rest
    assert "Transient (not findings)" in (tmp_path / "report.html").read_text()
    assert [d for d in diagnoses if d.step == step][0].findings[0].rank == rank


def test_contention_named_again_in_a_later_capture_stays_a_finding() -> None:
    """contend-int: the bursts come back, and the capture after the first names rank 1 again."""
    doc = report.build_report(diagnoses=_diagnoses("contend-int-120-steps"), world_size=4, steps=120)
    assert [(f["rank"], f["category"], f["captures"]) for f in doc["findings"]] == [(1, "host", [58, 98])]
    assert doc["transient"] == []


def test_a_rank_starved_once_near_the_end_of_a_job_stays_a_finding() -> None:
    """Fewer than LATER_CAPTURES detector captures after it (the fault bench's 120-step jobs have at
    most one after the first): nothing says it went away, so it is named as before."""
    diagnoses = [d for d in _diagnoses("healthy-5000-steps") if d.step <= 1321]
    assert sum(d.step > 655 for d in diagnoses) == LATER_CAPTURES - 1
    doc = report.build_report(diagnoses=diagnoses, world_size=4, steps=1400)
    assert [(f["rank"], f["category"]) for f in doc["findings"]] == [(1, "host")] and doc["transient"] == []


def test_only_cpu_contention_is_ever_transient() -> None:
    """A rank doing more work, or one its CPU quota held, is its own cause however rarely the
    captures see it: the same finding as compute, or without the run-queue evidence, stays named."""
    for change in ({"category": "compute"}, {"evidence": {"cpu_quota": 0.5}}):
        diagnoses = [replace(d, findings=tuple(replace(f, **change) for f in d.findings))
                     for d in _diagnoses("healthy-5000-steps")]
        doc = report.build_report(diagnoses=diagnoses, world_size=4, steps=5000)
        assert len(doc["findings"]) == 1 and doc["transient"] == [], change


def test_a_report_without_transient_or_with_a_foreign_one_prints_no_such_line() -> None:
    base = {"schema": report.REPORT_SCHEMA, "world_size": 4, "steps": 10, "captures": [], "findings": []}
    for odd in (None, [], [3], [{"captures": [5]}], [{"captures": "5", "evidence": {"not_seen_after": [9, 10]}}]):
        assert report.transient_lines({**base, "transient": odd}) == []
    assert report.transient_lines(base) == []


def test_rank_0s_log_says_a_starved_rank_was_transient_once_the_captures_after_it_show_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The healthy 5,000-step job's captures, handed to rank 0's analyst one by one as the live job
    did: the capture at 655 names rank 1, and the log says it was transient at the second detector
    capture after it, once, with the job report's words; report.json then agrees."""
    from eroica_runtime.analyst import Analyst

    diagnoses = _diagnoses("healthy-5000-steps")
    analyst = Analyst(str(tmp_path), world_size=4)
    try:
        said: dict[int, str] = {}
        for d in diagnoses:
            analyst.record(d, {})
            said[d.step] = capsys.readouterr().err
    finally:
        analyst.stop()
    later = [d.step for d in diagnoses if d.step > 655 and d.trigger in ("spike", "drift", "throughput")]
    news = {step: [line for line in text.splitlines() if "transient" in line] for step, text in said.items()}
    assert "rank 1" in said[655].splitlines()[0]
    at = later[LATER_CAPTURES - 1]
    assert [step for step, lines in news.items() if lines] == [at]
    [line] = news[at]
    assert line.startswith(f"eroica: step {at}: transient, not a finding: rank 1 on vm was starved of CPU around "
                           "step 655 (+"), line
    assert line.endswith(f"not in the {LATER_CAPTURES} detector capture(s) after it: contention on its host that "
                         "came and went"), line
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["findings"] == [] and [f["rank"] for f in doc["transient"]] == [1]
