"""A window's summaries are built over the steps after its close and gathered later, at a boundary all
ranks agree on; whatever comes first (the job's end, the next window) still gets every rank's summary.

Real ranks under eroica-run (MPICH, gloo DDP), real torch.profiler windows.
"""

from __future__ import annotations

import json

import pytest
from conftest import DATA, captures, eroica_run, explain

pytestmark = pytest.mark.multirank
TRAIN = DATA / "runtime" / "train.py"
# only the scheduled windows: a detector firing on the shared machine's noise would move them
QUIET = ("--spike-ratio", "1000", "--drift-pct", "0", "--lost-pct", "0")


def _complete(caps: dict, first: int, ranks: int) -> None:
    meta, sums, errors = caps[first]
    assert not errors and meta["missing"] == [], (first, meta, errors)
    assert sorted(s["rank"] for s in sums) == list(range(ranks))
    assert all([st["step"] for st in s["steps"]] == [first, first + 1, first + 2] for s in sums)
    assert all(s["profile"]["steps"] == 3 for s in sums)


def test_window_closing_at_the_last_step_is_still_gathered_and_reported(tmp_path) -> None:
    """Steps 0-39; the window 37-39 closes at the job's last boundary, so its summaries are still being
    built when training returns: the job's end finishes them, gathers them and reports the capture."""
    proc = eroica_run("--nproc-per-node", "4", "--report-dir", tmp_path, "--no-baseline", *QUIET,
                      "--capture-at-steps", "37", TRAIN, env={"STEPS": "40"}, timeout=240)
    assert proc.returncode == 0, explain(proc)
    caps = captures(tmp_path)
    assert list(caps) == [37], explain(proc)
    _complete(caps, 37, 4)
    report = json.loads((tmp_path / "report.json").read_text())
    assert [c["step"] for c in report["captures"]] == [37], explain(proc)
    assert not report["job"].get("partial") and "off on this rank" not in proc.stderr, explain(proc)


def test_a_window_opening_before_the_last_one_was_gathered(tmp_path) -> None:
    """Windows 20-22 and 26-28: the second is decided two boundaries after the first closed, before any
    vote could say the first's summaries are built; every rank finishes and gathers the first there,
    then profiles the second."""
    proc = eroica_run("--nproc-per-node", "4", "--report-dir", tmp_path, "--no-baseline", *QUIET,
                      "--capture-at-steps", "20,26", TRAIN, env={"STEPS": "60"}, timeout=240)
    assert proc.returncode == 0, explain(proc)
    caps = captures(tmp_path)
    assert list(caps) == [20, 26], explain(proc)
    _complete(caps, 20, 4)
    _complete(caps, 26, 4)
    assert "off on this rank" not in proc.stderr, explain(proc)
