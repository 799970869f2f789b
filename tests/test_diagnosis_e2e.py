"""End to end on real ranks: a real fault on rank 2 -> one synchronized capture, and rank 0 names the
rank, its category and its victims.

One job per planted fault, shared by the tests that read it (a 3-rank job here is ~5 s of starting
torch before its first step).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import DATA, captures, eroica_run, explain

from eroica_runtime import summary as summary_mod

pytestmark = pytest.mark.multirank
TRAIN = DATA / "runtime" / "train.py"
# 3 ranks: the culprit (rank 2) and two victims; a fourth rank on these 2 cores cost every job here ~2 s
# of start-up and a third more a step
RANKS = 3
Job = tuple[Path, subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Job]:
    """fault -> (report dir, finished eroica-run): rank 2 gets the fault from step 40 of 75 (found at
    45-48; a GC-stormed step is ~200 ms, so every step after the finding costs). The data fault's job
    runs the closure loop (test_closure_optimizer_loop_names_the_culprit_and_its_victims reads it too;
    the plain loop's slow DataLoader is test_reduce_multirank's and test_traces')."""
    jobs: dict[str, Job] = {}

    def run(fault: str) -> Job:
        if fault not in jobs:
            out = tmp_path_factory.mktemp(f"planted-{fault}")
            # 1000 matmuls: ~25 ms of extra forward here, well over the engine's bar (25% of the step);
            # 300 (~7 ms) sat right at the bar and a preempted peer's host gap could hide it
            loop = {"LOOP": "closure"} if fault == "data" else {}
            jobs[fault] = out, eroica_run("--nproc-per-node", str(RANKS), "--report-dir", out, TRAIN,
                                          env={"FAULT": fault, "FAULT_RANK": "2", "FAULT_FROM": "40",
                                               "FAULT_MATMULS": "1000", "STEPS": "75", **loop}, timeout=240)
        return jobs[fault]
    return run


def test_slowdown_fires_exactly_one_synchronized_capture(planted: Callable[[str], Job]) -> None:
    tmp_path, proc = planted("compute")
    assert proc.returncode == 0, explain(proc)
    caps = captures(tmp_path)
    triggers = {step: meta["trigger"] for step, (meta, _, _) in caps.items()}
    voted = [s for s, t in triggers.items() if t in ("spike", "drift")]
    assert list(triggers.values()).count("baseline") == 1, triggers
    assert len(voted) == 1, triggers
    start = voted[0]
    assert 40 <= start <= 52, triggers  # detection (3 slow steps) + vote lag (3) + lead-in, with slack
    meta, sums, errors = caps[start]
    assert not errors and meta["missing"] == []
    assert sorted(s["rank"] for s in sums) == list(range(RANKS))
    # every rank profiled the same steps
    assert {s["capture"]["step"] for s in sums} == {start}
    assert all([st["step"] for st in s["steps"]] == [start, start + 1, start + 2] for s in sums)
    report = json.loads((tmp_path / "report.json").read_text())
    assert [c["step"] for c in report["captures"]] == sorted(triggers)
    assert "job summary" in proc.stderr


@pytest.mark.parametrize("fault,category,phase", [("compute", "compute", ("forward", "backward", "optimizer")),
                                                  ("data", "dataloader", ("data",)),
                                                  ("gc", "gc", ("gc",))])
def test_planted_fault_is_named_with_victims(planted: Callable[[str], Job], fault: str, category: str,
                                             phase: tuple[str, ...]) -> None:
    tmp_path, proc = planted(fault)
    assert proc.returncode == 0, explain(proc)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["schema"] == "eroica.report/1" and report["world_size"] == RANKS
    assert report["findings"], explain(proc)
    top = report["findings"][0]
    assert (top["rank"], top["category"]) == (2, category), json.dumps(top, indent=1)
    assert sorted(top["victims"]) == [0, 1]
    assert top["impact_ms_per_step"] > 0 and top["action"]
    # in the capture that names the culprit, its victims are victims, not findings of their own
    step = top["captures"][-1]
    named = next(c for c in report["captures"] if c["step"] == step)
    assert not [f for f in named["findings"] if f["rank"] in (0, 1)], "a victim was reported as a culprit"
    # the gathered summaries themselves show it: the culprit's own work up, the victims' waits up
    _, sums, errors = summary_mod.decode_capture((tmp_path / "captures" / f"{step}.msgpack").read_bytes())
    assert not errors
    by_rank = {s["rank"]: s["phases"] for s in sums}
    # and the torch settings each rank ran with, which engine/settings.py compares (none switched here)
    for s in sums:
        torch_settings = s["telemetry"]["end"]["torch"]
        assert torch_settings["anomaly"] == torch_settings["deterministic"] == 0 and torch_settings["threads"] >= 1
    culprit = sum(by_rank[2][p] for p in phase)
    others = sorted(sum(by_rank[r][p] for p in phase) for r in (0, 1))
    assert culprit > 1.5 * others[1], by_rank
    assert by_rank[2]["comm"] < min(by_rank[r]["comm"] for r in (0, 1)), by_rank
    if fault == "gc":
        # the window's GC time a step is that of its steps (the step clock's rows), not theirs and the
        # lead-in step's over the window's count (1.34x the rows' mean, seen on a one-rank job)
        culprit_sum = next(s for s in sums if s["rank"] == 2)
        rows = [row["gc"] for row in culprit_sum["steps"]]
        mean = sum(rows) / len(rows)
        assert abs(culprit_sum["gc"]["ms"] - mean) <= 0.1 * mean + 1.0, (culprit_sum["gc"], rows)
    # printed in rank 0's log, after the files existed
    assert "rank 2" in proc.stderr and category.upper() in proc.stderr


def test_closure_optimizer_loop_names_the_culprit_and_its_victims(planted: Callable[[str], Job]) -> None:
    # PyTorch Lightning's structure: forward, backward and DDP's all-reduce run inside
    # optimizer.step(closure); the peers' wait for a slow rank is still a wait, not optimizer work
    tmp_path, proc = planted("data")   # the closure loop, rank 2's DataLoader slow from step 40
    assert proc.returncode == 0, explain(proc)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["findings"], explain(proc)
    top = report["findings"][0]
    assert (top["rank"], top["category"]) == (2, "dataloader"), json.dumps(top, indent=1)
    assert sorted(top["victims"]) == [0, 1]
    _, sums, _ = summary_mod.decode_capture((tmp_path / "captures" / f"{top['captures'][-1]}.msgpack").read_bytes())
    by_rank = {s["rank"]: s["phases"] for s in sums}
    for r in (0, 1):   # the victims' wait is comm and their forward is forward, not "optimizer"
        assert by_rank[r]["comm"] > by_rank[r]["optimizer"] and by_rank[r]["forward"] > 0, by_rank


@pytest.mark.parametrize("loop, fault, category", [("manual", "compute", "compute"),
                                                   ("inference", "data", "dataloader")])
def test_a_loop_without_a_torch_optim_optimizer_is_watched_and_its_slow_rank_named(tmp_path, loop: str, fault: str,
                                                                                   category: str) -> None:
    """A loop with its own update rule (``p -= lr * p.grad``) and a loop that only infers (forward, an
    all-reduce) step no torch.optim optimizer: eroica counted no step at all in them ("no training step
    was seen"). Now their steps are counted at each backward() or each DataLoader batch (once 64
    passed without an optimizer step), rank 0 says so, and rank 2's fault from the script's step 130
    is named (found some 10 steps later; the capture is gathered at the job's end if not before)."""
    proc = eroica_run("--nproc-per-node", str(RANKS), "--report-dir", tmp_path, TRAIN,
                      env={"LOOP": loop, "FAULT": fault, "FAULT_RANK": "2", "FAULT_FROM": "130",
                           "FAULT_MATMULS": "1000", "STEPS": "200"},
                      timeout=240)
    assert proc.returncode == 0 and "trained 200 steps" in proc.stdout, explain(proc)
    at = {"manual": "backward", "inference": "batch"}[loop]
    report = json.loads((tmp_path / "report.json").read_text())
    # counted from 64 batches (or backward()s) and the agreement's margin: 200 - ~72
    assert report["job"]["steps_at"] == at and 120 <= report["job"]["steps"] <= 140, explain(proc)
    assert f"a step is counted at each {'backward()' if loop == 'manual' else 'batch'} from now on" in proc.stderr
    assert report["findings"], explain(proc)
    top = report["findings"][0]
    assert (top["rank"], top["category"]) == (2, category), explain(proc)


def test_a_mixed_precision_jobs_skipped_optimizer_steps_are_still_steps(tmp_path) -> None:
    """A GradScaler skips the optimizer step whose gradients overflowed (the script's first 3 steps, then
    every 20th): each such iteration is a step of its own (they were merged with the next: 282 steps
    counted for 300 in such a job without the fault, whose throughput rule took the doubled steps for
    lost time and captured it healthy), the job summary says how many were skipped, and rank 2's extra matmuls from step 100 are
    named."""
    proc = eroica_run("--nproc-per-node", str(RANKS), "--report-dir", tmp_path, TRAIN,
                      env={"LOOP": "amp", "AMP_SKIP_EVERY": "20", "FAULT": "compute", "FAULT_RANK": "2",
                           "FAULT_FROM": "100", "FAULT_MATMULS": "1000", "STEPS": "170"}, timeout=240)
    assert proc.returncode == 0 and "trained 170 steps" in proc.stdout, explain(proc)
    report = json.loads((tmp_path / "report.json").read_text())
    # skipped: steps 0-2, and 19, 39, ..., 159
    assert (report["job"]["steps"], report["job"]["skipped_steps"]) == (170, 11), explain(proc)
    assert "the mixed-precision GradScaler skipped 11 of 170 optimizer steps (6.5%)" in proc.stderr, explain(proc)
    assert report["findings"], explain(proc)
    top = report["findings"][0]
    assert (top["rank"], top["category"]) == (2, "compute"), explain(proc)


def test_ranks_whose_batches_differ_in_length_are_said_to_take_turns_not_named(tmp_path) -> None:
    """Each rank draws its own batch lengths (tests/data/imbalance/job.py): every step waits for whichever
    drew the longest. eroica said "healthy"; now the job summary says the ranks took turns and what it
    cost (the busiest rank's work above the ranks' mean), and the report's head says so."""
    # 200 steps: the job-end reduction reads the ranks' last 64 (tests/data/imbalance/turns.json)
    # 4 ranks, not RANKS: with 3 the busiest rank's share of the excess is ~1/3 by chance and was 0.43
    # (the bar for a straggler is 0.5), and 3 turns would be every rank
    proc = eroica_run("--nproc-per-node", "4", "--report-dir", tmp_path, DATA / "imbalance" / "job.py",
                      "--steps", "200", timeout=240)
    assert proc.returncode == 0 and "trained 200 steps" in proc.stdout, explain(proc)
    job = json.loads((tmp_path / "report.json").read_text())["job"]
    turns = job.get("imbalance")
    assert turns is not None and turns["turns"] >= 3 and turns["top_share"] < 0.5, explain(proc)
    assert turns["busiest_ms"] - turns["mean_ms"] >= 0.1 * turns["step_ms"], turns
    assert "ranks took turns being the slowest" in proc.stderr


def test_a_rank_whose_memory_keeps_growing_is_named_in_the_job_summary(tmp_path) -> None:
    """Rank 2 keeps 8 MB more of tensors every step from step 20 (a loop holding what it should drop): the
    job summary names it and how fast it grew, the others are said to have stayed flat. 640 MB in 80
    steps, 2.5x the rule's 256 MB (engine/memgrowth.py)."""
    proc = eroica_run("--nproc-per-node", str(RANKS), "--report-dir", tmp_path, TRAIN,
                      env={"FAULT": "leak", "FAULT_RANK": "2", "FAULT_FROM": "20", "LEAK_MB": "8", "STEPS": "100",
                           "EROICA_MEMORY_SAMPLE_S": "0.1"}, timeout=240)
    assert proc.returncode == 0 and "trained 100 steps" in proc.stdout, explain(proc)
    grown = json.loads((tmp_path / "report.json").read_text())["job"].get("memory_growth")
    assert grown is not None and grown["count"] == 1 and grown["ranks"][0][0] == 2, explain(proc)
    assert grown["others_mb"][1] < 128, grown
    assert "memory kept growing: rank 2's anonymous memory grew" in proc.stderr, explain(proc)
