"""A long job's report directory stays bounded: old capture files go, what they showed stays, and its
page shows older healthy captures in one row each.

Fixtures: ``data/engine/transient-jobs.json`` (the diagnoses of real long jobs, see test_transient.py)
for the policy; ``data/engine/checkpoint-job`` (a real 4-rank job: baseline 13, a request at 50, the
spike capture at 80 that named rank 1, a request at 99 that named it again) for the files on disk.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import msgpack
import pytest
from conftest import BIN

from eroica_launch.offline import run_analysis
from eroica_runtime import report, reportdir, retention
from eroica_runtime.engine import first_named
from eroica_runtime.engine.hang import HANG_TRIGGER, hang_diagnosis
from eroica_runtime.engine.model import Diagnosis

DATA = Path(__file__).parent / "data" / "engine"
JOBS = json.loads((DATA / "transient-jobs.json").read_text())["jobs"]


def _diagnoses(name: str) -> list[Diagnosis]:
    return [Diagnosis.from_json(d) for d in JOBS[name]]


def _job_dir(tmp_path: Path) -> Path:
    """checkpoint-job's captures, and two more of its real captures under later steps, as a long job
    takes them: the healthy baseline again as a drift capture at 30, the spike capture that named rank
    1 again at 90."""
    root = tmp_path / "job"
    shutil.copytree(DATA / "checkpoint-job" / "captures", root / "captures")
    for src, step, trigger in ((13, 30, "drift"), (80, 90, "spike")):
        doc = msgpack.unpackb((root / "captures" / f"{src}.msgpack").read_bytes(), raw=False, strict_map_key=False)
        doc["step"], doc["trigger"] = step, trigger
        (root / "captures" / f"{step}.msgpack").write_bytes(msgpack.packb(doc, use_bin_type=True))
    return root


def _files(root: Path) -> set[int]:
    return {int(p.stem) for p in (root / "captures").glob("*.msgpack")}


def test_a_long_healthy_jobs_old_captures_lose_their_files_but_not_the_baseline_the_first_finding_or_the_newest(
        ) -> None:
    """5,000 steps, 12 captures: the baseline (13), the one capture that named a rank (655) and the
    newest three keep their files; the 7 other healthy captures do not."""
    diagnoses = _diagnoses("healthy-5000-steps")
    assert retention.kept_steps(diagnoses, 3) == {13, 655, 3168, 4161, 4804}
    assert retention.kept_steps(diagnoses, 0) == {d.step for d in diagnoses}   # 0: every file stays
    assert retention.kept_steps(diagnoses, 100) == {d.step for d in diagnoses}


def test_a_finding_captured_again_keeps_only_its_first_captures_file() -> None:
    """contend-int named rank 1 at 58 and again at 98; a later healthy capture is the newest: 98's file
    is the one that goes (the same finding, already kept at 58)."""
    diagnoses = _diagnoses("contend-int-120-steps")
    later = replace(diagnoses[0], step=140, trigger="drift")
    assert retention.kept_steps([*diagnoses, later], 1) == {13, 58, 140}


def test_a_hang_takes_no_place_among_the_newest_captures() -> None:
    """A hang's diagnosis has no capture file: it does not push a capture out of the newest N."""
    diagnoses = _diagnoses("noise-2500-steps")
    hang = hang_diagnosis({"finding": {"category": "hang", "title": "stuck"}, "world_size": 4}, 2000)
    assert hang.trigger == HANG_TRIGGER
    assert retention.kept_steps([*diagnoses, hang], 2) == {13, 254, 1208, 1303}


def test_eroica_analyze_reports_the_same_job_after_old_capture_files_were_removed(tmp_path: Path) -> None:
    """The job's own report (every capture file there) and `eroica analyze` of the directory after
    retention removed what --keep-captures 1 does not keep: the same captures, findings and transient
    list; the removed capture's diagnosis file is left as the job wrote it."""
    root = _job_dir(tmp_path)
    diagnoses, before, problems = run_analysis(root)
    named = {d.step: {(f.rank, f.category) for f in d.findings} for d in diagnoses}
    assert not problems and named == {13: set(), 30: set(), 50: {(0, "io")}, 80: {(1, "compute")},
                                      90: {(1, "compute")}, 99: {(1, "compute")}}, named
    written = {d.step: (root / f"diagnosis-{d.step}.json").read_bytes() for d in diagnoses}

    for step in (30, 80):   # EROICA_KEEP_RAW_EVENTS=1: every rank's raw events of the capture
        for rank in range(4):
            raw = reportdir.raw_events_path(root, step, rank)
            raw.parent.mkdir(parents=True, exist_ok=True)
            raw.write_bytes(b"events")
    removed = retention.prune(root, diagnoses, 1)
    assert removed == [30, 90] and _files(root) == {13, 50, 80, 99}
    assert sorted(p.name for p in (root / reportdir.RAW).iterdir()) == ["80"]   # they go with the capture file
    assert len(list((root / reportdir.RAW / "80").iterdir())) == 4
    assert retention.prune(root, diagnoses, 1) == []   # nothing left to remove: removed once
    (root / "captures" / "30.msgpack").write_bytes(b"")   # a step already removed is not looked at again
    assert retention.prune(root, diagnoses, 1, gone={30, 90}) == [] and (root / "captures" / "30.msgpack").exists()
    (root / "captures" / "30.msgpack").unlink()
    # a file that cannot be removed (here a directory) stops it; what was removed before is said
    (root / "captures" / "30.msgpack").write_bytes(b"")
    (root / "captures" / "90.msgpack").mkdir()
    with pytest.raises(retention.PruneError) as err:
        retention.prune(root, diagnoses, 1)
    assert err.value.removed == [30] and "90.msgpack" in str(err.value)
    (root / "captures" / "90.msgpack").rmdir()

    proc = subprocess.run([str(BIN / "eroica"), "analyze", str(root)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    after = json.loads((root / "report.json").read_text())
    assert after["captures"] == before["captures"]
    assert after["findings"] == before["findings"] and after["transient"] == before["transient"]
    for step in removed:
        assert (root / f"diagnosis-{step}.json").read_bytes() == written[step]
    assert "2 capture(s) without a file in captures/ (removed once diagnosed: --keep-captures)" in proc.stderr
    assert report.format_job(after) == report.format_job(before)


def test_a_stray_file_named_like_a_diagnosis_or_a_hang_is_rejected_by_name_and_the_rest_analysed(tmp_path: Path) -> None:
    root = _job_dir(tmp_path)
    (root / "diagnosis-7.json").write_text('{"schema": "something else"}')
    (root / "diagnosis-8.json").write_text("{not json")
    (root / "hang-9.json").write_text('{"schema": "eroica.diagnosis/1", "step": 9}')
    # well-formed JSON of the right schema whose finding the job report could not consolidate
    (root / "diagnosis-11.json").write_text(json.dumps({
        "schema": "eroica.diagnosis/1", "step": 11, "trigger": "manual", "world_size": 4, "ranks_analysed": 4,
        "findings": [{"category": "compute", "rank": 1, "host": "vm", "function": "aten::matmul",
                      "captures": ["x"], "victims": [0]}]}))
    (root / "hang-12.json").write_text(json.dumps({"schema": "eroica.hang/1", "world_size": 4, "missing": [],
                                                   "finding": {"rank": "two", "victims": [0]}}))
    diagnoses, doc, problems = run_analysis(root)
    assert {d.step for d in diagnoses} == {13, 30, 50, 80, 90, 99} and len(doc["captures"]) == 6
    assert [p.split(":")[0] for p in problems] == ["diagnosis-7.json", "diagnosis-8.json", "diagnosis-11.json",
                                                   "hang-9.json", "hang-12.json"], problems
    assert "no capture file and not a usable diagnosis" in problems[0]
    assert "(a finding's captures must be integers)" in problems[2]
    assert "not a usable hang diagnosis (schema is 'eroica.diagnosis/1', expected 'eroica.hang/1')" in problems[3]
    assert "(a finding's rank must be an integer or null)" in problems[4]


def test_the_job_report_says_old_capture_files_were_removed(tmp_path: Path) -> None:
    diagnoses = _diagnoses("healthy-5000-steps")
    doc = report.build_report(diagnoses=diagnoses, world_size=4, steps=5000,
                              job={"capture_files_removed": [402, 1321]})
    text = report.format_job(doc)
    assert "2 older capture files were removed from captures/ once diagnosed (--keep-captures)" in text
    assert "removed" not in report.format_job(report.build_report(diagnoses=diagnoses, world_size=4, steps=5000))


def test_a_long_jobs_page_shows_older_healthy_captures_in_one_row_each(tmp_path: Path) -> None:
    """report.html of the 5,000-step healthy job: the baseline, the capture that named rank 1 and the
    newest 8 healthy captures in full; the two older healthy ones (402, 1321) one row each."""
    from eroica_runtime.report_html import FULL_HEALTHY

    diagnoses = _diagnoses("healthy-5000-steps")
    report.write_job(tmp_path, diagnoses=diagnoses, world_size=4, steps=5000)
    page = (tmp_path / "report.html").read_text()
    assert FULL_HEALTHY == 8 and "2 earlier captures found healthy" in page
    for step in (402, 1321):
        assert f"Capture at step {step} " not in page and f"<tr><td>{step}</td><td>" in page
    for step in (13, 655, 1516, 2176, 2359, 2403, 2945, 3168, 4161, 4804):
        assert f"Capture at step {step} " in page, step


def test_a_finding_named_again_is_one_line_in_rank_0s_log_pointing_at_where_it_was_named_first() -> None:
    """contend-int named rank 1 "host" at 58 and again at 98: the capture at 98 says so in one line and
    where to read it in full; the first naming keeps its whole block, with its action."""
    baseline, first, again = _diagnoses("contend-int-120-steps")
    full = report.format_capture(first, first_named([baseline]))
    assert "action:" in full and "named before" not in full
    short = report.format_capture(again, first_named([baseline, first])).splitlines()
    assert len(short) == 1 and short[0].startswith("eroica: step 98 (spike): rank 1 on "), short
    assert short[0].endswith("; named before, at step 58 (this capture in full: diagnosis-98.json)"), short
    assert report.format_capture(again).count("action:") == 1   # without the job's earlier captures: in full


def test_eroica_analyze_prints_a_finding_named_again_in_one_line_as_rank_0_did(tmp_path: Path) -> None:
    root = _job_dir(tmp_path)
    proc = subprocess.run([str(BIN / "eroica"), "analyze", str(root)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if "named before, at step 80" in ln]
    assert [ln.split(":")[1].strip() for ln in lines] == ["step 90 (spike)", "step 99 (manual)"], proc.stdout
