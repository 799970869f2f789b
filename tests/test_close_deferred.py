"""A window's summaries are built over the steps after its close and gathered later, at a boundary all
ranks agree on; whatever comes first (the job's end, the next window) still gets every rank's summary.

Real ranks under eroica-run (MPICH, gloo DDP), real torch.profiler windows.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import DATA, captures, eroica_run, explain

pytestmark = pytest.mark.multirank
TRAIN = DATA / "runtime" / "train.py"
# only the scheduled windows: a detector firing on the shared machine's noise would move them
QUIET = ("--spike-ratio", "1000", "--drift-pct", "0", "--lost-pct", "0")


RANKS = 3


def _complete(caps: dict, first: int) -> None:
    meta, sums, errors = caps[first]
    assert not errors and meta["missing"] == [], (first, meta, errors)
    assert sorted(s["rank"] for s in sums) == list(range(RANKS))
    assert all([st["step"] for st in s["steps"]] == [first, first + 1, first + 2] for s in sums)
    assert all(s["profile"]["steps"] == 3 for s in sums)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """Steps 0-39 with windows at 20, 26 and 37 (both tests' scenarios in one job: a rank's start is
    most of a short job's time on 2 cores; the windows are scheduled, so neither moves the other)."""
    out = tmp_path_factory.mktemp("close-deferred")
    proc = eroica_run("--nproc-per-node", str(RANKS), "--report-dir", out, "--no-baseline", *QUIET,
                      "--capture-at-steps", "20,26,37", TRAIN, env={"STEPS": "40"}, timeout=240)
    assert proc.returncode == 0, explain(proc)
    assert "off on this rank" not in proc.stderr, explain(proc)
    assert list(captures(out)) == [20, 26, 37], explain(proc)
    return out, proc


def test_window_closing_at_the_last_step_is_still_gathered_and_reported(job) -> None:
    """The window 37-39 closes at the job's last boundary, so its summaries are still being built when
    training returns: the job's end finishes them, gathers them and reports the capture."""
    out, proc = job
    _complete(captures(out), 37)
    report = json.loads((out / "report.json").read_text())
    assert [c["step"] for c in report["captures"]] == [20, 26, 37], explain(proc)
    assert not report["job"].get("partial"), explain(proc)


def test_a_window_opening_before_the_last_one_was_gathered(job) -> None:
    """Windows 20-22 and 26-28: the second is decided two boundaries after the first closed, before any
    vote could say the first's summaries are built; every rank finishes and gathers the first there,
    then profiles the second."""
    out, _ = job
    caps = captures(out)
    _complete(caps, 20)
    _complete(caps, 26)
