"""Job end is bounded: whatever eroica is doing when training ends, every job ends in time, rightly.

The exit soak: short real jobs (4 ranks, gloo, MPICH) written the way users write them (the DDP model
is never deleted, destroy_process_group() at the end) that end while a capture window is open, right
after a trigger fired (votes in flight), with a rank being SIGSTOPped through its exit, with a rank
SIGKILLed, and with a rank that finishes but blocks in interpreter teardown. Each must end within its
timeout with the exit code torchrun would give. ``EROICA_EXIT_SOAK=N`` runs every case N times
(CI: once each).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from conftest import DATA, eroica_run, explain

pytestmark = pytest.mark.multirank
JOB = DATA / "exit" / "job.py"
REPEAT = int(os.environ.get("EROICA_EXIT_SOAK", "1"))

CASES = {
    # the last steps are profiled: the window is still open when the script returns
    "window-open": ({"STEPS": "40"}, ["--capture-at-steps", "38"], 0),
    # one rank slows down for its last 6 steps: detectors fire, votes are in flight at exit
    "trigger-at-end": ({"STEPS": "40", "SLOW_RANK": "2", "SLOW_LAST": "6"}, ["--warmup-steps", "5"], 0),
    # a rank stopped 250 ms once a second by another process, through its job end
    "stopped-rank": ({"STEPS": "60", "FREEZE_RANK": "1"}, ["--capture-at-steps", "50"], 0),
    # a rank dies: the job ends with its signal, as torchrun's would
    "dead-rank": ({"STEPS": "200", "KILL_RANK": "3", "KILL_AT": "30"}, [], 128 + signal.SIGKILL),
    # a rank finishes, then never leaves interpreter teardown: its wrapper ends it with exit code 0
    "stuck-in-teardown": ({"STEPS": "30", "STUCK_EXIT_RANK": "1", "EROICA_EXIT_GRACE_S": "3"}, [], 0),
}


@pytest.mark.parametrize("repeat", range(REPEAT))
@pytest.mark.parametrize("case", sorted(CASES))
def test_job_end_is_bounded_whatever_eroica_is_doing(tmp_path: Path, case: str, repeat: int) -> None:
    env, flags, expected_rc = CASES[case]
    out = tmp_path / "out"
    out.mkdir()
    proc = eroica_run("--nproc-per-node", "4", "--report-dir", tmp_path / "report", "--deadline", "10", *flags,
                      JOB, env={**env, "OUT_DIR": str(out)}, timeout=150)
    assert proc.returncode == expected_rc, explain(proc)
    if expected_rc != 0:
        assert "Root Cause" in proc.stderr, explain(proc)
        return
    # training really finished on every rank, and rank 0's job-end report was written
    assert sorted(p.name for p in out.iterdir()) == [f"rank{r}.json" for r in range(4)], explain(proc)
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert not report["job"].get("partial"), report["job"]
    if case == "stuck-in-teardown":
        assert "rank 1: the program finished (exit code 0) but was still tearing down" in proc.stderr, explain(proc)

