"""The online chain on real ranks: trigger, synchronized windows, deadlines, and eroica staying harmless."""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import time

import pytest
from conftest import BIN, DATA, RANK_ENV, captures, eroica_run, explain

from eroica_runtime import report as report_mod
from eroica_runtime.summary import rawevents

pytestmark = pytest.mark.multirank
TRAIN = DATA / "runtime" / "train.py"


# a slowdown's one synchronized capture: tests/test_diagnosis_e2e.py (its compute job)


def test_healthy_run_captures_only_after_a_real_slowdown_and_finds_nothing(tmp_path) -> None:
    """On a healthy job the detectors stay quiet through jitter; a capture happens only after the job
    really slowed, and finds nothing. The captures a person asks for (steps 50 and 90, every rank
    profiled whatever the detectors say; one is skipped only if a detector's window is open then) are
    judged healthy too: the engine on a healthy capture.

    This machine is shared: another process taking a core for a few hundred ms slows every rank for
    several steps (a fresh-clone CI run saw 40-58 ms steps for 14 steps against a 37 ms median), and
    a capture then is right. What must never happen is a capture with no such rise before it (the
    detectors firing on jitter), or a finding on a healthy job."""
    # DIM 768: ~40 ms steps, so one preemption on a shared 2-core machine is not a persistent rise (DIM 512
    # gave ~40 ms steps when this was written, 22 ms by 2026-12-04, where a manual window of three 35 ms
    # steps among 19-27 ms ones read as a job-wide communication slowdown in a fresh-clone CI run)
    proc = eroica_run("--nproc-per-node", "4", "--report-dir", tmp_path, "--capture-at-steps", "50,90", TRAIN,
                      env={"STEPS": "120", "DIM": "768"}, timeout=240)
    assert proc.returncode == 0, explain(proc)
    caps = captures(tmp_path)
    triggers = [meta["trigger"] for meta, _, _ in caps.values()]
    assert triggers[0] == "baseline" and "manual" in triggers, explain(proc)
    assert set(triggers[1:]) <= {"manual", "spike", "drift", "throughput"}, explain(proc)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["findings"] == [], explain(proc)
    assert "healthy" in proc.stderr
    assert "steady_work" not in report["job"], explain(proc)   # no rank busier than the others over the job
    assert "imbalance" not in report["job"], explain(proc)     # nor ranks taking turns
    history = report_mod.load_steps(tmp_path)
    assert history is not None
    by_step = dict(zip(history["steps"], history["ms"], strict=True))
    median = sorted(history["ms"])[len(history["ms"]) // 2]
    for step, (meta, _, _) in caps.items():
        if meta["trigger"] in ("baseline", "manual"):
            continue
        before = [by_step[s] for s in range(step - 14, step) if s in by_step]
        assert sum(ms > 1.4 * median for ms in before) >= 2, (step, before, median, explain(proc))


def _peer_wait_ms(summary: dict) -> float:
    """ms a step a rank's summary spent waiting for the other ranks' votes (runtime._wait_vote)."""
    return sum(f["ms"] for f in summary["functions"] if f["name"] == "eroica::peer_wait")


def test_eroicas_own_wait_at_a_windows_boundaries_is_no_ranks_optimizer_work_on_eight_ranks(tmp_path) -> None:
    """eroica's step boundary runs inside torch's ``Optimizer.step#...`` range (an optimizer step
    post-hook). In a window its vote waits for the other ranks' votes: with 8 ranks on 2 cores, 0.2 ms
    a step on some ranks and up to 29 ms on others. Booked as the rank's optimizer work, it made one
    rank's optimizer phase 0.27-0.42 of the step above the median rank's in every such job recorded
    (7 jobs), and named healthy ranks ("compute in Optimizer.step#SGD.step", 5 of 21 captures,
    docs/benchmarks.md §5c). The range is recorded and left out of the phases (at most 0.14 in 13
    jobs since), and each summary says how long eroica took at the boundaries (its wait for the votes,
    a wait for a peer, is now recorded apart as a collective: runtime._wait_vote). Detectors off: the
    captures are the baseline and the three asked for. Whether a capture names anybody is not asserted:
    8 ranks on 2 cores are real CPU contention, and a rank queued 3 ms a step more than its peers can
    be named for it."""
    proc = eroica_run("--nproc-per-node", "8", "--report-dir", tmp_path, "--warmup-steps", "6",
                      "--capture-at-steps", "20,35,50", "--cooldown-steps", "0", "--max-profiled-fraction", "0.9",
                      "--spike-ratio", "100", "--drift-pct", "0", "--lost-pct", "0", TRAIN,
                      env={"STEPS": "60"}, timeout=600)
    assert proc.returncode == 0, explain(proc)
    caps = captures(tmp_path)
    assert sorted(meta["trigger"] for meta, _, _ in caps.values()) == ["baseline", "manual", "manual", "manual"], \
        sorted(caps)
    spreads, waited = [], []
    for step, (_, sums, errors) in caps.items():
        assert not errors and len(sums) == 8, (step, errors)
        assert all("eroica_ms" in s["profile"] for s in sums), (step, [s["profile"] for s in sums])
        optimizer = sorted(s["phases"]["optimizer"] for s in sums)
        steps = sorted(s["phases"]["step"] for s in sums)
        spreads.append((optimizer[-1] - optimizer[3]) / steps[3])
        waited += [(step, s["rank"], s["phases"]["optimizer"], _peer_wait_ms(s))
                   for s in sums if _peer_wait_ms(s) >= 2.0]
    # Booked as optimizer work, a rank's wait at the boundaries made its optimizer phase at least that
    # long. Booked apart (a collective), the optimizer phase of a rank that waited 2 ms or more is well
    # under its wait. Not
    # on every such rank: a preemption lands on any rank (one of 7 others on 2 cores took 6.4 ms of rank
    # 4's optimizer step once, its eroica wait 2.6 ms; in another run 3.4 ms of the optimizer step of
    # the rank that waited longest, 5.6 ms, in a window where the three next-longest waits of 2.6-5.4 ms
    # came with 0.3 ms optimizer steps), so the rule is most of them, which no rank met before the fix.
    assert waited, spreads
    under = [w for w in waited if w[2] < 0.5 * w[3]]
    assert len(under) > len(waited) / 2, waited
    # and the optimizer phases stay alike but for such luck (0.27-0.42 of the step above the median
    # rank's in every job recorded before the fix)
    assert statistics.median(spreads) < 0.2, spreads
    assert sum(s["profile"]["eroica_ms"] for _, sums, _ in caps.values() for s in sums) > 0


def test_a_drift_capture_found_healthy_reaches_every_ranks_drift_rule(tmp_path) -> None:
    """Every rank sleeps 2 ms longer a step from step 120 (~3.5% of the step: a drift at --drift-pct 2,
    and under the engine's 10% bar for a job-wide regression, with no rank apart): the drift capture
    it opens is found healthy on rank 0, and the vote brings that verdict to every rank, whose drift
    rule then takes the capture's level as its least reference (report.json lists, per rank, the
    captures it did that for: the same on every rank). Two ranks: four on two cores made the 5-step
    window noisy enough that the engine read 1 capture in 3 as slower than the baseline."""
    proc = eroica_run("--nproc-per-node", "2", "--report-dir", tmp_path, "--drift-pct", "2", TRAIN,
                      env={"STEPS": "240", "STEP_SLEEP": "0.05", "SLEEP_MORE": "0.002", "SLEEP_MORE_FROM": "120"},
                      timeout=240)
    assert proc.returncode == 0, explain(proc)
    report = json.loads((tmp_path / "report.json").read_text())
    drift = {c["step"] for c in report["job"]["captures_taken"] if c["trigger"] == "drift"}
    held = [r["drift_held"] for r in report["job"]["per_rank"]]
    assert len(held) == 2 and held[0] == held[1] and held[0], (held, drift, explain(proc))
    for step in held[0]:
        assert step in drift, (held, drift)
        diagnosis = json.loads((tmp_path / f"diagnosis-{step}.json").read_text())
        assert not diagnosis["findings"] and "unexplained_ms" not in diagnosis["step_ms"], diagnosis


def test_a_slowdown_the_spent_budget_refused_is_captured_when_a_capture_comes_back(tmp_path) -> None:
    """A budget of one capture (the baseline's, lead-in step 12) that comes back 50 steps later, and
    rank 2 doing extra matmuls from step 40: the slowdown is refused while the budget is spent, rank 0
    says when a capture comes back (step 62), and the slowdown, still there then, is captured and
    rank 2 named. A budget per job (--capture-refill-steps 0) left such a job with the refusal alone
    (tests/test_trigger.py replays a long recorded job)."""
    proc = eroica_run("--nproc-per-node", "3", "--report-dir", tmp_path, "--max-captures", "1",
                      "--capture-refill-steps", "50", TRAIN,
                      env={"FAULT": "compute", "FAULT_RANK": "2", "FAULT_FROM": "40", "FAULT_MATMULS": "1000",
                           "STEPS": "110"}, timeout=240)
    assert proc.returncode == 0, explain(proc)
    assert "but the capture budget is spent (1 capture," in proc.stderr, explain(proc)
    assert "one comes back at step 62 (every 50 steps, --capture-refill-steps)" in proc.stderr, explain(proc)
    report = json.loads((tmp_path / "report.json").read_text())
    taken = report["job"]["captures_taken"]
    assert taken[0]["trigger"] == "baseline" and len(taken) == 2, (taken, explain(proc))
    assert taken[1]["step"] >= 62, taken
    assert report["job"]["captures_refused"]["slowdowns"] >= 1, report["job"]
    top = report["findings"][0]
    assert (top["rank"], top["category"]) == (2, "compute"), (top["title"], explain(proc))


def test_a_job_that_evaluates_every_25_steps_opens_two_throughput_captures_not_one_per_cooldown(tmp_path) -> None:
    """Every rank evaluates for 0.5 s after every 25 steps (20 ms of sleep and a few of work each): the
    share of time the throughput rule reads as lost swings between ~3% and ~29% with how many
    evaluations its window holds. It opened a capture after every cooldown, each found healthy (85, 166, 260, 336 in 400
    steps: the capture budget a real slowdown would need); now the share the first capture saw is
    its reference, the one capture rank 0's analysis found nothing in is retried once, and then the
    job's own evaluations are left alone. 300 steps: three of the old captures fall in them (3 ranks, the
    code before 3c0426e from a worktree: throughput captures at 85, 166 and 260; now at 85 and 185)."""
    proc = eroica_run("--nproc-per-node", "3", "--report-dir", tmp_path, TRAIN,
                      env={"PAUSE": "eval", "PAUSE_EVERY": "25", "PAUSE_S": "0.5", "STEPS": "300",
                           "STEP_SLEEP": "0.02"}, timeout=240)
    assert proc.returncode == 0 and "trained 300 steps" in proc.stdout, explain(proc)
    report = json.loads((tmp_path / "report.json").read_text())
    throughput = [c["step"] for c in report["job"]["captures_taken"] if c["trigger"] == "throughput"]
    assert 1 <= len(throughput) <= 2, (report["job"]["captures_taken"], explain(proc))


def test_a_long_job_keeps_the_files_of_its_baseline_its_first_finding_and_its_newest_capture(tmp_path) -> None:
    """--keep-captures 1 and four captures asked for (30, 45, 80, 95) around rank 2's extra matmuls
    from step 60: the baseline's, the first capture that named rank 2's and the newest capture's
    files stay in captures/; the others' files are removed once diagnosed, every diagnosis file
    stays, the job report lists what was removed, and `eroica analyze` of the directory afterwards
    reports the same captures and findings as the job did."""
    proc = eroica_run("--nproc-per-node", "3", "--report-dir", tmp_path, "--keep-captures", "1",
                      "--capture-at-steps", "30,45,80,95", "--cooldown-steps", "5", "--max-captures", "20",
                      "--max-profiled-fraction", "0.6", TRAIN,
                      env={"FAULT": "compute", "FAULT_RANK": "2", "FAULT_FROM": "60", "FAULT_MATMULS": "1000",
                           "STEPS": "110"}, timeout=240)
    assert proc.returncode == 0, explain(proc)
    job = json.loads((tmp_path / "report.json").read_text())
    caps = [c["step"] for c in job["captures"]]
    files = sorted(int(p.stem) for p in (tmp_path / "captures").glob("*.msgpack"))
    removed = job["job"].get("capture_files_removed") or []
    assert removed and sorted(set(files) | set(removed)) == caps and not set(files) & set(removed), (
        caps, files, removed, explain(proc))
    first = next(c["step"] for c in job["captures"] if any(f["rank"] == 2 for f in c["findings"]))
    assert {caps[0], first, caps[-1]} <= set(files), (caps, files, first)
    assert job["captures"][0]["trigger"] == "baseline"
    assert all((tmp_path / f"diagnosis-{s}.json").is_file() for s in caps)
    assert "older capture files were removed from captures/ once diagnosed" in proc.stderr, explain(proc)

    again = subprocess.run([str(BIN / "eroica"), "analyze", str(tmp_path)], capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0, again.stderr
    offline = json.loads((tmp_path / "report.json").read_text())
    assert offline["captures"] == job["captures"] and offline["findings"] == job["findings"], again.stdout


def test_sigusr1_to_one_rank_captures_on_all_ranks(tmp_path) -> None:
    """Also: with EROICA_KEEP_RAW_EVENTS=1 every rank keeps the window's raw profiler events, and the
    summary built again from them, read back on their own, is the one the rank sent."""
    env = {**os.environ, **RANK_ENV, "STEPS": "60", "STEP_SLEEP": "0.02", "EROICA_KEEP_RAW_EVENTS": "1"}
    proc = subprocess.Popen([str(BIN / "eroica-run"), "--nproc-per-node", "3", "--report-dir", str(tmp_path),
                             "--no-baseline", "--drift-pct", "0", "--spike-ratio", "100", str(TRAIN)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # rank 0 at step 10 => every rank's runtime is installed
            if "reached step 10" in line:
                break
        owner = tmp_path / "launch" / "attempt_0" / "1" / "owner"
        os.kill(int(owner.read_text()), signal.SIGUSR1)
        out, err = proc.communicate(timeout=200)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-4000:]
    caps = captures(tmp_path)
    assert [meta["trigger"] for meta, _, _ in caps.values()] == ["manual"], err[-4000:]
    (_, sums, _), = caps.values()
    assert sorted(s["rank"] for s in sums) == [0, 1, 2]
    step = next(iter(caps))
    for sent in sums:
        path = tmp_path / "raw" / str(step) / f"rank{sent['rank']}.msgpack"
        meta, events = rawevents.load(path.read_bytes(), origin=str(path))
        assert (meta["rank"], meta["step"]) == (sent["rank"], step) and meta["n"] > 500
        again, as_sent = rawevents.rebuild(sent, events)
        assert not rawevents.differences(again, as_sent), (sent["rank"], rawevents.differences(again, as_sent))


def test_a_job_that_takes_sigusr1_for_itself_gets_it_and_eroica_says_how_to_ask_for_a_capture(tmp_path) -> None:
    """Lightning's SLURM auto-requeue installs its SIGUSR1 handler only when SIGUSR1 has none; with
    eroica's in place it installed nothing, and the requeue signal started a capture instead
    (signals.py). The job here takes SIGUSR1 that way and each rank sends itself one at step 20:
    the job's handler runs on every rank, no capture is taken for it, and rank 0 says once how to
    ask eroica for a capture instead."""
    proc = eroica_run("--nproc-per-node", "2", "--report-dir", tmp_path, "--no-baseline", TRAIN,
                      env={"STEPS": "40", "OWN_USR1_AT": "20"}, timeout=180)
    assert proc.returncode == 0, explain(proc)
    for rank in (0, 1):
        assert f"rank {rank}: the job's SIGUSR1 handler ran 1 time(s)" in proc.stdout, explain(proc)
    said = [line for line in proc.stderr.splitlines() if "the job handles SIGUSR1 itself" in line]
    assert len(said) == 1 and "`touch " in said[0] and "/trigger` asks eroica for a capture" in said[0], explain(proc)
    # a noise spike on 2 shared cores may open a detector's capture; a manual one would be SIGUSR1's
    assert all(meta["trigger"] != "manual" for meta, _, _ in captures(tmp_path).values()), explain(proc)


def test_a_rank_that_logs_metrics_from_the_first_step_is_named_at_job_end(tmp_path) -> None:
    """Rank 0 logs metrics for ~80 ms every 10 steps from step 0 (tests/data/engine/rank0-logs-job):
    nothing changes for a detector to see, and a baseline window of 3 steps may hold no logging step;
    over the job's steps it was busier than its peers, who waited for it (engine/steadywork.py). (A
    capture whose window holds logging steps may name it first; the job-end line then leaves it to
    that finding.)"""
    job = DATA / "engine" / "rank0-logs-job" / "job.py"
    # twice the recorded job's logging, ~25% of the step: well over the line's 10% on a noisy machine
    proc = eroica_run("--nproc-per-node", "3", "--report-dir", tmp_path, job, "--steps", "100", "--log-reps", "80",
                      timeout=180)
    assert proc.returncode == 0, explain(proc)
    report = json.loads((tmp_path / "report.json").read_text())
    if any(f["rank"] == 0 for f in report["findings"]):
        assert "steady_work" not in report["job"] and " was busy " not in proc.stderr, explain(proc)
        return
    line = next((line for line in proc.stderr.splitlines() if "  rank 0 (" in line and " was busy " in line), "")
    assert "ms a step longer than its peers over the job's" in line and "they waited for it" in line, explain(proc)
    steady = report["job"]["steady_work"]
    assert steady["rank"] == 0 and steady["busy_ms"] - steady["peers_busy_ms"] >= 0.10 * steady["step_ms"], steady


def test_rank_killed_inside_a_window_does_not_hang_the_others(tmp_path) -> None:
    t0 = time.monotonic()
    proc = eroica_run("--nproc-per-node", "3", "--report-dir", tmp_path, "--capture-at-steps", "20",
                      "--window-steps", "10", "--deadline", "10", "--no-baseline", TRAIN,
                      env={"STEPS": "200", "KILL_RANK": "1", "KILL_AT": "24"}, timeout=180)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 128 + signal.SIGKILL, explain(proc)
    root = proc.stderr[proc.stderr.index("Root Cause"):]
    assert "rank      : 1 " in root and "SIGKILL" in root
    assert elapsed < 120, elapsed


def test_a_pass_of_one_ranks_own_before_training_neither_stalls_it_nor_switches_eroica_off(tmp_path) -> None:
    """Rank 0 alone iterates 400 DataLoader batches (no optimizer step, no backward()) while the others
    wait in a barrier, then all train. Its batches became steps after 64 and it voted on them alone: each
    vote waited the side channel's deadline for peers that never voted, eroica went off on every rank,
    and the job never ended (a 2-second job killed after minutes). Steps are counted at batches only once
    every rank asks to; here none but rank 0 does, so the training's optimizer steps are the steps, as
    in any job. With a deadline longer than the launch's timeout, a wait for it fails the test."""
    proc = eroica_run("--nproc-per-node", "2", "--report-dir", tmp_path, "--deadline", "200",
                      DATA / "runtime" / "uneven.py", env={"UNEVEN": "pass"}, timeout=150)
    assert proc.returncode == 0 and "rank 0 passed over 12800 rows alone" in proc.stdout, explain(proc)
    assert proc.stdout.count("trained") == 2 and "off on this rank" not in proc.stderr, explain(proc)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["job"]["steps_at"] == "optimizer" and report["job"]["steps"] == 60, explain(proc)
    assert any(c["trigger"] == "baseline" for c in report["captures"]), explain(proc)


def test_steps_follow_another_optimizer_where_every_rank_does_and_never_where_one_alone_does(tmp_path) -> None:
    """After steps 20 and 40 rank 0 alone fits a linear probe (30 steps of an optimizer of its own)
    while its peers wait in a barrier; then every rank trains 30 steps with a new optimizer, the first
    kept alive. Rank 0 followed the probe's optimizer after 8 of its steps (as a second stage is
    followed) and counted the rest as steps: it voted and gathered the baseline capture alone, the
    capture was lost, eroica went off on every rank after a deadline each, and the job took 60 s
    instead of 7. Steps follow another optimizer only once every rank asked to, all at the same one of
    its steps (74 = 60 + 30 - 16 counted on each). A deadline longer than the launch's timeout makes any
    wait for one fail. Not shown by this job: the poll that lets every rank learn the answer in time
    (it passes with one Test a pass too); benchmarks §18 has the runs that need it."""
    proc = eroica_run("--nproc-per-node", "3", "--report-dir", tmp_path, "--deadline", "200",
                      DATA / "runtime" / "uneven.py", env={"UNEVEN": "probe"}, timeout=120)
    assert proc.returncode == 0 and proc.stdout.count("trained") == 3, explain(proc)
    assert "off on this rank" not in proc.stderr, explain(proc)
    report = json.loads((tmp_path / "report.json").read_text())
    assert [r["steps"] for r in report["job"]["per_rank"]] == [74, 74, 74], explain(proc)
    assert report["captures"][0]["trigger"] == "baseline", explain(proc)
    assert report["captures"][0]["ranks_analysed"] == 3, explain(proc)


def test_a_rank_that_ran_more_steps_than_its_peers_does_not_keep_the_job_from_ending(tmp_path) -> None:
    """Rank 0 takes 6 optimizer steps more than its peer, alone: its votes on them are never matched.
    Every rank's end waited for the others in a barrier on the communicator those votes were posted on,
    where rank 1's barrier met rank 0's vote: the job, every rank done, never ended. The end's barrier
    and the votes have communicators of their own. Rank 0's wait for the vote its peer never casts
    still costs it the deadline (2 s here)."""
    proc = eroica_run("--nproc-per-node", "2", "--report-dir", tmp_path, "--deadline", "2",
                      DATA / "runtime" / "uneven.py", env={"UNEVEN": "extra"}, timeout=120)
    assert proc.returncode == 0 and proc.stdout.count("trained") == 2, explain(proc)


def test_a_rank_late_for_a_gather_its_root_gave_up_on_still_ends_the_job_cleanly(tmp_path) -> None:
    """The capture at step 55 is still to be gathered when the 60-step job ends, and rank 1 ends 2 s
    after rank 0 (a final save), past the 0.5 s deadline: rank 0 gathers without it, and rank 1's
    summary, sent after that, is never received. The job's end cancelled that send, MPICH crashed in
    MPI_Cancel, and a job whose ranks had both trained to the end failed with SIGSEGV (rc 139). The
    detectors sit out the job (--warmup-steps 60): a noise spike's capture at step 53 once held the
    scheduled one back past the job's end, and nothing was left to gather late."""
    proc = eroica_run("--nproc-per-node", "2", "--report-dir", tmp_path, "--deadline", "0.5", "--no-baseline",
                      "--warmup-steps", "60", "--capture-at-steps", "55", DATA / "runtime" / "uneven.py",
                      env={"UNEVEN": "late"}, timeout=120)
    assert "missed in gather (to node leader)" in proc.stderr, explain(proc)   # the case under test
    assert proc.returncode == 0 and proc.stdout.count("trained") == 2, explain(proc)


def test_a_rank_stalling_after_its_all_reduce_is_named_and_its_peers_wait_is_not_eroicas(tmp_path) -> None:
    """Rank 1 of 3 sleeps 50 ms between backward() (DDP's all-reduce) and its optimizer step from step
    30 on. Its peers then wait for it in eroica's vote at their step boundary, not in the next
    all-reduce (MPICH completes the vote one stage per boundary, more stages than the vote's lag on 3
    ranks). Booked as eroica's own time, that wait was in no step: the spike capture named nobody, or
    rank 1 with one of its two victims (benchmarks §18), and eroica's own work at the boundaries read
    up to 1.8 s, 87% of a peer's time. The wait is the step's and, in a
    window, a collective's: rank 1 is named, both others its victims. Its summary says when it came to
    its all-reduces in the steps before the window (lateness.py): ~50 ms after the earliest rank in
    each stalled step, its peers on time."""
    proc = eroica_run("--nproc-per-node", "3", "--report-dir", tmp_path, DATA / "runtime" / "uneven.py",
                      env={"UNEVEN": "after"}, timeout=120)
    assert proc.returncode == 0 and proc.stdout.count("trained") == 3, explain(proc)
    report = json.loads((tmp_path / "report.json").read_text())
    later = [c for c in report["captures"] if c["step"] >= 30]
    assert later and later[0]["findings"], explain(proc)
    top = later[0]["findings"][0]
    assert top["rank"] == 1 and top["victims"] == [0, 2], explain(proc)
    late = {}
    for s in captures(tmp_path)[later[0]["step"]][1]:
        h = s["history"]
        late[s["rank"]] = statistics.mean(x for j, x in enumerate(h["late"]) if h["first"] + j > 32) \
            if h["first"] + len(h["late"]) > 34 else None
    assert late[1] is not None and late[1] > 30.0 and max(late[0], late[2]) < 0.3 * late[1], (late, later[0]["step"])
    # the 30 stalls took 1.5 s; eroica's own work at the boundaries stays well under that on every rank
    assert max(r["eroica_ms"] for r in report["job"]["per_rank"]) < 750, report["job"]["per_rank"]


def test_ddp_join_with_uneven_inputs_costs_no_wait_and_keeps_eroica_on(tmp_path) -> None:
    """torch's Join: rank 1 runs out of batches 10 steps before rank 0 in each of two epochs and shadows
    rank 0's all-reduces, taking no optimizer step. Rank 0 voted on those steps alone and waited the
    side channel's deadline for its peer's votes, and eroica went off on both ranks (20 s a rank: a
    0.3-second job took 44 s). Each shadowed iteration is a step of the joined rank's: both count 140
    and vote as often (a deadline longer than the launch's timeout: a wait for it fails the test)."""
    proc = eroica_run("--nproc-per-node", "2", "--report-dir", tmp_path, "--deadline", "200",
                      DATA / "runtime" / "uneven.py", env={"UNEVEN": "join"}, timeout=120)
    assert proc.returncode == 0 and proc.stdout.count("trained") == 2, explain(proc)
    assert "off on this rank" not in proc.stderr, explain(proc)
    report = json.loads((tmp_path / "report.json").read_text())
    assert [r["steps"] for r in report["job"]["per_rank"]] == [140, 140], explain(proc)
    assert any(c["trigger"] == "baseline" for c in report["captures"]), explain(proc)


def test_broken_mpi_leaves_training_running_with_one_warning(tmp_path) -> None:
    proc = eroica_run("--nproc-per-node", "2", "--report-dir", tmp_path,
                      "--mpiexec-args", "-genv MPI4PY_LIBMPI /nonexistent/libmpi.so.12", TRAIN,
                      env={"STEPS": "30"}, timeout=180)
    assert proc.returncode == 0, explain(proc)
    assert "trained 30 steps" in proc.stdout
    warnings = [ln for ln in proc.stderr.splitlines() if "off on this rank" in ln]
    assert len(warnings) == 2 and all("MPI unavailable" in w for w in warnings), explain(proc)


def test_a_one_step_job_is_said_to_have_had_its_step(tmp_path) -> None:
    """A smoke test of one optimizer step: a step is timed from the end of the one before it, so it
    has no time, but it was a step (it read "no training step was seen ... should call mark_step()")."""
    proc = eroica_run("--nproc-per-node", "2", "--report-dir", tmp_path, TRAIN, env={"STEPS": "1"}, timeout=180)
    assert proc.returncode == 0 and "trained 1 steps" in proc.stdout, explain(proc)
    assert "no training step was seen" not in proc.stderr, explain(proc)
    assert "job summary: 1 step on 2 ranks, too few to time" in proc.stderr, explain(proc)
    assert json.loads((tmp_path / "report.json").read_text())["steps"] == 1, explain(proc)
    assert "world size 2, 1 step, " in (tmp_path / "report.html").read_text(), explain(proc)


def test_mark_step_drives_the_clock_without_an_optimizer(tmp_path) -> None:
    proc = eroica_run("--nproc-per-node", "2", "--report-dir", tmp_path, "--no-baseline", "--capture-at-steps",
                      "15", DATA / "runtime" / "manual_steps.py", timeout=180)
    assert proc.returncode == 0, explain(proc)
    caps = captures(tmp_path)
    assert list(caps) == [15], explain(proc)
    _, sums, _ = caps[15]
    assert all([st["step"] for st in s["steps"]] == [15, 16, 17] for s in sums)
    assert json.loads((tmp_path / "report.json").read_text())["steps"] == 40


@pytest.mark.parametrize("group", ["a process group", "no process group"])
def test_ranks_that_never_wait_for_each_other_are_not_made_to_by_eroica(tmp_path, group: str) -> None:
    """Two ranks each train a model of their own (no collective between steps), rank 1's steps three
    times as long: eroica's vote at every step made rank 0 wait for rank 1 (its 240 steps took as long
    as rank 1's: 6.45 s against 3.28 under torchrun in a job of this shape; 3.83 against 1.33 where the
    ranks made no process group at all). It finds no collective in steps 1-10 (the warm-up) without a
    process group, in steps 1-32 with one (its ranks could meet less often: local SGD), says so, and
    stands down for the job before its baseline capture, which named rank 1 for rank 0's wait in the
    vote: rank 0 keeps its own pace, every rank ends well. A job of one rank is watched as ever."""
    env = {"NO_GROUP": "1"} if group == "no process group" else {}
    proc = eroica_run("--nproc-per-node", "2", "--report-dir", tmp_path, DATA / "runtime" / "independent.py",
                      env=env, timeout=120)
    assert proc.returncode == 0, explain(proc)
    took = {int(m[1]): float(m[2]) for m in re.finditer(r"rank (\d) trained in ([\d.]+) s", proc.stdout)}
    assert set(took) == {0, 1}, explain(proc)
    last = 10 if env else 32
    assert f"steps 1-{last} ran no collective: the job's ranks do not wait for each other" in proc.stderr, explain(proc)
    assert ("torch.distributed was never initialized" in proc.stderr) == (group == "no process group"), explain(proc)
    # ranks with a process group may meet less often still (local SGD): how to keep eroica on
    assert ("Ranks that meet less often than that (local SGD averaging every N steps) are watched with "
            "--warmup-steps above N" in proc.stderr) == (group == "a process group"), explain(proc)
    assert "off on this rank" not in proc.stderr + proc.stdout, explain(proc)
    assert not (tmp_path / "captures").exists() or not list((tmp_path / "captures").iterdir()), explain(proc)
    stood = json.loads((tmp_path / "report.json").read_text())["job"]["stood_down"]
    assert stood["step"] == last and "ran no collective" in stood["why"], stood
    # rank 0 alone: ~1.3 s (10 steps at rank 1's pace), ~1.6 s (32) of rank 1's ~3.7; held at it, ~1.0
    assert took[0] < 0.7 * took[1], took
    if env:
        return
    # one rank waits for nobody, its vote holds nothing: watched as ever (its baseline capture taken)
    alone = eroica_run("--nproc-per-node", "1", "--report-dir", tmp_path / "alone", DATA / "runtime" / "independent.py",
                       env={"STEPS": "40"}, timeout=120)
    assert alone.returncode == 0 and "ran no collective" not in alone.stderr, explain(alone)
    assert [c["trigger"] for c in json.loads((tmp_path / "alone" / "report.json").read_text())["captures"]] == \
        ["baseline"], explain(alone)


def test_a_local_sgd_job_meeting_every_16_steps_is_watched_and_the_rank_its_meetings_wait_for_named(
        tmp_path) -> None:
    """Three ranks average their parameters every 16 steps (local SGD); rank 1 sleeps 10 ms a step more
    from step 80. The warm-up (steps 1-10) ran no collective: eroica stood down saying the ranks never
    wait for each other, though they wait for the slowest at every meeting. It looks until step 32 now,
    no rule judging and no baseline meanwhile, finds the meeting at step 16, and watches the job: its
    baseline capture comes after step 32, and rank 1 is named with both peers waiting on it."""
    proc = eroica_run("--nproc-per-node", "3", "--report-dir", tmp_path, DATA / "runtime" / "localsgd.py",
                      timeout=150)
    assert proc.returncode == 0 and proc.stdout.count(" done") == 3, explain(proc)
    assert "ran no collective" not in proc.stderr and "off on this rank" not in proc.stderr + proc.stdout, \
        explain(proc)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["captures"][0]["trigger"] == "baseline" and report["captures"][0]["step"] > 32, report["captures"]
    findings = report["findings"]
    assert findings and (findings[0]["rank"], findings[0]["category"]) == (1, "host"), explain(proc)
    assert sorted(findings[0]["victims"]) == [0, 2], findings[0]


def test_a_loop_without_a_collective_is_said_once_though_one_rank_came_to_it_while_the_other_paused(
        tmp_path) -> None:
    """Two ranks read 100 DataLoader batches each with no optimizer step and no collective; rank 1
    starts 1 s after rank 0, which holds 3 s before its last batch. Each rank asks the other where to
    count steps at its 64th batch: rank 0 first, then rank 1 while rank 0 holds, which learns the
    answer at once and, past its margin, calls MPI no more. MPICH completes rank 0's request only at
    the second Test after its pause (sidechannel.SideChannel.settle): tested once at its last batch, it
    never learned it, counted no steps without saying why, and its peer was left with a request of
    its own (2 of 90 runs of the copy-on-read launch test here, which this schedule makes certain)."""
    proc = eroica_run("--nproc-per-node", "2", "--report-dir", tmp_path, DATA / "runtime" / "late_batches.py",
                      timeout=120)
    assert proc.returncode == 0, explain(proc)
    assert "rank 0 read 100 batches" in proc.stdout and "rank 1 read 100 batches" in proc.stdout, explain(proc)
    said = [ln for ln in proc.stderr.splitlines() if "no optimizer step and no collective between them" in ln]
    assert len(said) == 1 and re.match(r"\[rank0\]:eroica: \d+ DataLoader batches", said[0]), explain(proc)
    assert "its loop (DataLoader batches, no torch.optim optimizer step) has no collective" in proc.stderr, \
        explain(proc)
    assert "off on this rank" not in proc.stderr + proc.stdout, explain(proc)


def test_a_one_off_stall_names_the_rank_the_others_waited_for_and_where_it_was(tmp_path) -> None:
    """Rank 3 sleeps 2 s once before step 70 (as a write to a congested filesystem blocks it off the
    CPU), and works alone for 2 s once before step 100 (as a recompile or a lone save does): no
    detector captures a stall that is over, but the job summary says which steps, which rank, and the
    line it was at. Two emulated nodes of 2: rank 3's records and stacks reach rank 0 through its node
    leader's reduction (jobend.py), beside its node-mate's record of the same steps. Asleep, rank 3 is
    as idle as the ranks waiting for it: its stack, elsewhere than theirs, names it; asleep inside a
    capture's window (opened at step 69 here, by a noise spike at 68 in CI on 2026-12-07, when the job
    summary listed no long step: a window's step carries eroica's mark), too, and the capture says a
    one-off, not "healthy" or a per-step cost. (The work at step 100 is 31 steps after the window's
    lead-in, past the 32 steps of history before it, so the window's stall is the only one it sees;
    one job for both stalls, two took 10 s each.)"""
    proc = eroica_run("--nproc-per-node", "4", "--report-dir", tmp_path, "--capture-at-steps", "69", TRAIN,
                      env={"STEPS": "120", "STALL_RANK": "3", "STALL_AT": "70,100", "STALL_S": "2",
                           "STALL_KIND": "sleep,compute", "EROICA_NODE_SPLIT": "2"}, timeout=240)
    assert proc.returncode == 0, explain(proc)
    # rank 3 is named for its one step's work alone (lonework), or, when its other window steps ran
    # slower than its peers' by chance on 2 shared cores, as the window's culprit; never "healthy"
    d = json.loads((tmp_path / "diagnosis-69.json").read_text())
    one = d["step_ms"].get("one_off") or {}
    assert one.get("rank") == 3 and one.get("steps") == [70] or [f["rank"] for f in d["findings"]] == [3], d
    cap = next((x for x in proc.stderr.splitlines() if "eroica: step 69 (manual):" in x), "")
    assert "healthy" not in cap and "rank 3" in cap, cap
    # the two 2 s stalls are the longest steps; on 2 shared cores another step may pass the bar too
    # (100 ms and 10x the median), so the header may count more than two
    lines = proc.stderr.splitlines()
    head = next((i for i, line in enumerate(lines) if "  longest step" in line), None)
    assert head is not None, explain(proc)
    listed = {int(x.split("step ", 1)[1].split()[0]): x for x in lines[head + 1:head + 6] if " took " in x}
    assert {70, 100} <= set(listed), explain(proc)
    for line in (listed[70], listed[100]):
        assert ": rank 3 on " in line and "they waited for it" in line, line
        assert "train.py:" in line and "stall_once" in line, line
    assert "was off the CPU through it" in listed[70], listed[70]
    job = json.loads((tmp_path / "report.json").read_text())["job"]
    assert job["ranks_reporting"] == 4, job
    by_step = {s["step"]: s for s in job["long_steps"]}
    asleep, busy = by_step[70], by_step[100]
    assert asleep["rank"] == 3 and asleep["what"] == "away" and asleep["ms"] >= 1500, asleep
    assert asleep["busy_ms"] < 0.25 * asleep["ms"] and asleep["waiting"] == 3 and asleep["ranks_seen"] == 4, asleep
    assert busy["rank"] == 3 and busy["ms"] >= 1500 and busy["busy_ms"] >= 0.5 * busy["ms"], busy
    assert busy["others_ms"] < 0.25 * busy["busy_ms"] and busy["ranks_seen"] == 4, busy
    head = next(line for line in lines if line.startswith("[rank0]:eroica: job report"))
    assert "healthy" not in head, head   # 4 s of a ~6 s job: the longest steps, or rank 3's steady work, say so


def test_a_rank_that_held_the_jobs_start_is_named_with_where_it_was(tmp_path) -> None:
    """Rank 2 reads its shard from slow storage for 10 s before building its model, while ranks 0 and 1
    wait in DDP's first broadcast: the job summary names it, where it was and where they waited, and the
    job report does not call the job healthy (a 3-rank job like it read "healthy", 12 of its 17.6 s
    spent so). Two emulated nodes: its record reaches rank 0 through its leader's reduction."""
    proc = eroica_run("--nproc-per-node", "3", "--report-dir", tmp_path, TRAIN,
                      env={"STEPS": "60", "START_SLEEP_RANK": "2", "START_SLEEP_S": "10", "EROICA_NODE_SPLIT": "2"},
                      timeout=240)
    assert proc.returncode == 0, explain(proc)
    lines = proc.stderr.splitlines()
    line = next((x for x in lines if "the job's start took " in x), "")
    assert ": rank 2 on " in line and "they waited for it" in line and "load_shard" in line, explain(proc)
    assert "torch/" in line.split("others waited (", 1)[1], line
    (start,) = [s for s in json.loads((tmp_path / "report.json").read_text())["job"]["long_steps"] if s["step"] == 0]
    assert start["rank"] == 2 and start["ms"] >= 9000 and start["others_ms"] < 0.5 * start["ms"], start
    head = next(x for x in lines if x.startswith("[rank0]:eroica: job report"))
    # (a baseline window on 2 shared cores may find something of its own: then the head counts it)
    findings = json.loads((tmp_path / "report.json").read_text())["findings"]
    assert "healthy" not in head and ("its start" in head or findings), head


def test_dataloader_workers_forked_anew_every_epoch_stay_inert_and_the_summary_prices_their_restarts(tmp_path) -> None:
    """fork()ed workers inherit the runtime object; they must never vote, profile or touch MPI. Their
    loader starts them anew at each of the 5 epochs (no persistent_workers; 40 steps of 10 batches,
    and the loop begins a fifth before it stops): the job summary says what the epochs' starts cost
    and how to keep the workers (engine/epochs.py)."""
    proc = eroica_run("--nproc-per-node", "2", "--report-dir", tmp_path, "--capture-at-steps", "20", TRAIN,
                      env={"WORKERS": "2", "STEPS": "40", "EPOCH_STEPS": "10"}, timeout=180)
    assert proc.returncode == 0, explain(proc)
    assert "trained 40 steps" in proc.stdout
    caps = captures(tmp_path)
    assert 20 in caps and sorted(s["rank"] for s in caps[20][1]) == [0, 1]
    assert "off on this rank" not in proc.stderr
    line = next((line for line in proc.stderr.splitlines() if "  epoch starts: " in line), "")
    assert "(5 epochs: " in line and "its 2 worker processes start anew at every epoch; persistent_workers=True" \
        in line, explain(proc)
    starts = json.loads((tmp_path / "report.json").read_text())["job"]["epoch_starts"]
    assert starts["ranks"] == 2 and starts["restarts"] == 5 and starts["per_start_ms"][0] > 0, starts
    assert "Epoch starts: each held the ranks" in (tmp_path / "report.html").read_text()
