"""Ranks whose processes started late: named in the job summary, with their hosts, and the job report's
head not "healthy" when the wait was a good share of the job (engine/launchskew.py)."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import DATA, eroica_run, explain

from eroica_runtime.analyst import format_job_stats, job_stats
from eroica_runtime.engine import launchskew
from eroica_runtime.report import format_job
from eroica_runtime.report_html import render_html


def _ranks(starts: dict[int, float], host=lambda r: "vm") -> dict[int, dict]:
    return {r: {"rank": r, "host": host(r), "steps": 150, "median_ms": 8.0, "p99_ms": 20.0, "started_s": s}
            for r, s in starts.items()}


def test_a_rank_launched_late_is_named_with_how_late_and_a_skew_of_a_second_is_no_line() -> None:
    """A real 3-rank job's starts (2026-12-07): rank 2's interpreter began 10.0 s after rank 0's."""
    k = launchskew.launch_skew(_ranks({0: 1796640582.101, 1: 1796640582.288, 2: 1796640592.127}))
    assert k is not None and (k.late_count, k.late[0][0], round(k.spread_s, 1)) == (1, 2, 10.0)
    assert launchskew.format_launch_skew(k) == (
        "  start: rank 2 (vm) began 10.0 s after the first of the 3 ranks; every other rank waited for it before "
        "its first step (MPI_Init, init_process_group): its process was launched late (a node's prolog, a "
        "container image pull, the launcher)")
    assert launchskew.launch_skew(_ranks({0: 100.0, 1: 101.0, 2: 104.9})) is None   # under LATE_S
    assert launchskew.launch_skew(_ranks({0: 100.0})) is None
    assert launchskew.launch_skew(_ranks({0: 100.0, 1: float("nan"), 2: "late"})) is None   # type: ignore[dict-item]


def test_a_node_launched_late_is_said_once_with_its_ranks_counted() -> None:
    """Node n3's 8 ranks of 64 began 200 s late (its container image pulled while the others waited)."""
    starts = {r: 100.0 + (200.0 if r // 8 == 3 else 0.0) + r * 0.01 for r in range(64)}
    k = launchskew.launch_skew(_ranks(starts, host=lambda r: f"n{r // 8}"))
    assert k is not None and (k.late_count, k.hosts, k.hosts_count) == (8, ("n3",), 1)
    line = launchskew.format_launch_skew(k)
    assert line.startswith("  start: 8 of 64 ranks began 5 s or more after the first (rank 31 (n3) 3.3 min, "
                           "rank 30 (n3) 3.3 min, rank 29 (n3) 3.3 min and 5 more, all on n3); every other rank "
                           "waited for them"), line
    assert launchskew.LaunchSkew.from_json(k.to_json()).to_json() == k.to_json()   # report.json's job.launch
    assert launchskew.LaunchSkew.from_json({"late": "x"}) is None


def test_the_job_summary_and_report_head_say_a_late_start_that_cost_the_job() -> None:
    stats = job_stats(_ranks({0: 100.0, 1: 100.2, 2: 110.0}), 3)
    assert "  start: rank 2 (vm) began 10.0 s after" in format_job_stats(stats, [], findings=False)
    doc = {"schema": "eroica.report/1", "world_size": 3, "steps": 150, "job": stats, "findings": [],
           "captures": [{"step": 13, "trigger": "baseline", "ranks_analysed": 3, "findings": []}]}
    assert "but its ranks started up to 10.0 s apart (the job summary above)" in format_job(doc).splitlines()[0]
    page = render_html(doc, [], None)
    assert "Start: rank 2 (vm) began 10.0 s after the first" in page
    # the page's head as the text's, not "No findings: ranks behaved like their peers"
    assert "No findings, but its ranks started up to 10.0 s apart (below)." in page and "behaved like" not in page
    # the same skew in a job of 100,000 steps of 8 ms is 1% of it: healthy
    long = {**stats, "steps": 100_000}
    assert "healthy — no findings" in format_job({**doc, "job": long}).splitlines()[0]


@pytest.mark.multirank
def test_a_rank_whose_process_started_late_is_named_at_job_end(tmp_path) -> None:
    """Rank 2's interpreter starts 8 s after the others' (tests/data/runtime/late_launch.sh under
    eroica-run --no-python): ranks 0 and 1 wait in MPI_Init meanwhile, and every rank's start then looks
    alike; the job summary names rank 2 and how late it began."""
    proc = eroica_run("--nproc-per-node", "3", "--report-dir", tmp_path, "--no-python",
                      DATA / "runtime" / "late_launch.sh",
                      env={"STEPS": "40", "LATE_RANK": "2", "LATE_S": "8", "PYTHON": sys.executable}, timeout=240)
    assert proc.returncode == 0, explain(proc)
    line = next((x for x in proc.stderr.splitlines() if "  start: " in x), "")
    assert "rank 2 (" in line and "after the first of the 3 ranks" in line, explain(proc)
    late = json.loads((tmp_path / "report.json").read_text())["job"]["launch"]
    assert late["late"][0][0] == 2 and 7.0 <= late["spread_s"] <= 30.0, late
