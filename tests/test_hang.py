"""Hang diagnosis over the side channel: real ranks, one of them stuck."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from conftest import BIN, DATA, eroica_run, explain

from eroica_runtime.engine.hang import analyse, where

TRAIN = DATA / "runtime" / "train.py"


def _report(rank: int, file: str, line: int, seq: int | None) -> dict:
    frames = [{"file": "/x/site-packages/torch/nn/modules/module.py", "line": 1, "function": "_call_impl",
               "code": ""}, {"file": file, "line": line, "function": "f", "code": "..."}]
    return {"rank": rank, "host": f"h{rank // 2}", "step": 7, "stalled_s": 9.0,
            "stacks": [{"thread": "MainThread", "main": True, "frames": frames}],
            "flight_recorder": {"seq": seq} if seq is not None else None}


def test_analyse_names_the_rank_outside_the_collective() -> None:
    reports = {r: _report(r, "/job/train.py", 80, 41) for r in (0, 1, 3)}
    reports[2] = _report(2, "/job/model.py", 12, 40)
    doc = analyse(reports, 4)
    assert doc["finding"]["rank"] == 2 and doc["finding"]["host"] == "h1"
    assert doc["finding"]["victims"] == [0, 1, 3]
    assert doc["finding"]["evidence"]["outlier_collective_seq"] == 40
    assert where(reports[2]) == "/job/model.py:12 in f"


def test_analyse_blames_a_silent_rank_and_not_a_uniform_stall() -> None:
    same = {r: _report(r, "/job/train.py", 80, 41) for r in range(4)}
    assert analyse(same, 4)["finding"] is None
    del same[3]
    assert analyse(same, 4)["finding"]["rank"] == 3


@pytest.mark.multirank
def test_stuck_rank_is_named_and_abort_ends_the_job(tmp_path) -> None:
    t0 = time.monotonic()
    # no baseline capture: this test is about the hang; a healthy capture's judgement (where a
    # preempted rank 0 can still look like a culprit on 2 shared cores) is test_diagnosis_e2e's subject
    proc = eroica_run("--nproc-per-node", "4", "--report-dir", tmp_path, "--hang-timeout", "5", "--no-baseline",
                      "--hang-action", "abort", TRAIN, env={"HANG_RANK": "2", "HANG_AT": "30", "STEPS": "200"},
                      timeout=180)
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0, explain(proc)
    assert "HANG" in proc.stderr and "culprit: rank 2" in proc.stderr, explain(proc)
    (hang_file,) = tmp_path.glob("hang-*.json")
    doc = json.loads(hang_file.read_text())
    assert doc["finding"]["rank"] == 2 and doc["finding"]["victims"] == [0, 1, 3]
    assert doc["finding"]["evidence"]["stalled_s"] < 5 + 10  # threshold plus a few seconds
    assert any("time.sleep(3600)" in frame for frame in doc["finding"]["evidence"]["stack"])
    report = json.loads((tmp_path / "report.json").read_text())  # written before the job was ended
    assert [(f["category"], f["rank"]) for f in report["findings"]] == [("hang", 2)]
    root = proc.stderr[proc.stderr.index("Root Cause"):]
    assert "hang diagnosed" in root
    assert elapsed < 120, elapsed
    # analysed again offline (no capture was taken): the hang stays the job's finding
    again = subprocess.run([str(BIN / "eroica"), "analyze", str(tmp_path)], capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0, again.stderr
    offline = json.loads((tmp_path / "report.json").read_text())
    assert [(f["category"], f["rank"]) for f in offline["findings"]] == [("hang", 2)], again.stdout
    assert "#1 HANG: rank 2" in again.stdout, again.stdout
