"""eroica-run as a torchrun drop-in: real ranks under the real MPI launcher (gloo on CPU)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from conftest import BIN, DATA, RANK_ENV, eroica_run, explain, launch

pytestmark = pytest.mark.multirank
SCRIPTS = DATA / "launch"
# Values that legitimately differ between two launches (ports, ids, paths, who hosts the store).
VOLATILE = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "MASTER_ADDR"}


def _collect(out_dir) -> dict[int, dict]:
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in out_dir.glob("rank*.json")}


def test_same_environment_and_result_as_torchrun(tmp_path) -> None:
    # 2 ranks, each with a spawned DataLoader worker: 9 processes start torch (one is torchrun's
    # launcher), ~2 s of CPU each; at 4 ranks (17) this was 26-37 s of the suite
    n = 2
    ours_dir, theirs_dir = tmp_path / "eroica", tmp_path / "torchrun"
    ours_dir.mkdir()
    theirs_dir.mkdir()
    # both run from a directory with a module of its own named as one of the standard library's: torchrun
    # never imports it (eroica's rank wrapper did: no rank started). Not one the job's spawned DataLoader
    # workers import before they take its sys.path (selectors.py, signal.py: those fail under torchrun too)
    work = tmp_path / "work"
    work.mkdir()
    (work / "json.py").write_text("raise ImportError('the job directory\\'s own json.py was imported')\n")
    ours = eroica_run("--nproc-per-node", str(n), "--report-dir", tmp_path / "rep", SCRIPTS / "ddp_env.py", "--a",
                      "1", env={"OUT_DIR": str(ours_dir)}, timeout=240, cwd=work)
    assert ours.returncode == 0, explain(ours)
    theirs = launch([str(BIN / "torchrun"), "--nproc-per-node", str(n), str(SCRIPTS / "ddp_env.py"), "--a", "1"],
                    env={"OUT_DIR": str(theirs_dir)}, timeout=240, cwd=work)
    assert theirs.returncode == 0, explain(theirs)
    a, b = _collect(ours_dir), _collect(theirs_dir)
    assert sorted(a) == sorted(b) == list(range(n))
    for rank in range(n):
        ea = {k: v for k, v in a[rank]["env"].items() if k not in VOLATILE}
        eb = {k: v for k, v in b[rank]["env"].items() if k not in VOLATILE}
        assert ea == eb, f"rank {rank}"
        assert a[rank]["result"] == b[rank]["result"]
        assert a[rank]["argv"] == ["--a", "1"]
    # every rank agrees on one rendezvous point
    assert len({(r["env"]["MASTER_ADDR"], r["env"]["MASTER_PORT"]) for r in a.values()}) == 1
    # only the rank's own process owns eroica: the spawned DataLoader workers ran the
    # sitecustomize too (it is on their PYTHONPATH) but never claimed it
    for rank, doc in a.items():
        claim = tmp_path / "rep" / "launch" / "attempt_0" / str(rank) / "owner"
        assert claim.read_text() == str(doc["pid"])


def test_failing_rank_is_named_with_its_exception(tmp_path) -> None:
    t0 = time.monotonic()
    proc = eroica_run("--nproc-per-node", "3", "--report-dir", tmp_path, SCRIPTS / "fail.py",
                      env={"FAIL_RANK": "2", "FAIL_MODE": "raise"}, timeout=150)
    assert proc.returncode != 0, explain(proc)
    assert time.monotonic() - t0 < 100, "survivors were not stopped after the failure"
    summary = proc.stderr[proc.stderr.index("fail.py FAILED"):]
    root = summary[summary.index("Root Cause"):]
    assert re.search(r"rank\s+: 2 \(local_rank: 2\)", root), explain(proc)
    assert "ValueError: planted failure on rank 2" in root
    assert "exitcode  : 1" in root


def test_rank_killed_by_signal_is_reported_with_signal_name(tmp_path) -> None:
    proc = eroica_run("--nproc-per-node", "3", "--report-dir", tmp_path, SCRIPTS / "fail.py",
                      env={"FAIL_RANK": "1", "FAIL_MODE": "kill"}, timeout=150)
    assert proc.returncode == 128 + signal.SIGKILL, explain(proc)
    root = proc.stderr[proc.stderr.index("Root Cause"):]
    assert re.search(r"rank\s+: 1 ", root) and "SIGKILL" in root, explain(proc)
    assert "OOM" not in proc.stderr, explain(proc)     # it killed itself: no OOM kill to speak of


def test_a_killed_ranks_dataloader_workers_do_not_outlive_it(tmp_path) -> None:
    """Rank 1 is SIGKILLed while its 2 DataLoader workers sit in a 120 s __getitem__: orphaned, they
    would hold their memory (a GPU's too) into the next attempt, and the rank's output pipes until they
    ended. The wrapper ends what the rank left in its process group, as torchrun does."""
    pids = tmp_path / "pids"
    pids.mkdir()
    proc = eroica_run("--nproc-per-node", "2", "--report-dir", tmp_path / "rep", SCRIPTS / "fail.py",
                      env={"FAIL_RANK": "1", "FAIL_MODE": "kill-busy-workers", "FAIL_PIDS": str(pids)}, timeout=150)
    assert proc.returncode == 128 + signal.SIGKILL, explain(proc)
    workers = [int(p.name) for p in pids.iterdir()]
    assert len(workers) == 2, explain(proc)
    alive = []
    for pid in workers:
        with contextlib.suppress(psutil.NoSuchProcess):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
                os.kill(pid, signal.SIGKILL)   # not left to sleep on beside the next tests
    assert not alive, f"the dead rank's workers {alive} outlived the job\n" + explain(proc)


def test_a_report_directory_used_again_keeps_no_failure_of_the_last_job(tmp_path) -> None:
    """``--report-dir`` given again (a retried job, a restarted pod): the last job, of 4 ranks, failed in
    rank 3. The next job, of 2 ranks, must neither stop itself at once for that failure nor blame it,
    and the last job's captures and reports are set aside (kept), not read as the new job's."""
    shutil.copytree(DATA / "runtime" / "one-off-stall", tmp_path, dirs_exist_ok=True)   # its reports
    old = tmp_path / "launch" / "attempt_0" / "3"
    old.mkdir(parents=True)
    (old / "status.json").write_text(json.dumps({
        "rank": 3, "local_rank": 3, "host": "h", "pid": 1, "exitcode": -9, "signal": "SIGKILL",
        "started": time.time() - 600, "ended": time.time() - 500, "error_file": str(old / "error.json"),
        "message": "", "oom": ""}))
    proc = eroica_run("--nproc-per-node", "2", "--report-dir", tmp_path, SCRIPTS / "fail.py",
                      env={"FAIL_ATTEMPTS": "0"}, timeout=120)
    assert proc.returncode == 0, explain(proc)
    assert "a rank failed" not in proc.stderr and "rank 0 finished attempt 0" in proc.stdout, explain(proc)
    assert f"{tmp_path} held the reports of an earlier job (or attempt): moved to {tmp_path}/earlier/" in proc.stderr, explain(proc)
    (earlier,) = (tmp_path / "earlier").iterdir()
    assert sorted(p.name for p in (earlier / "captures").iterdir()) == ["112.msgpack", "13.msgpack"]
    assert not list(tmp_path.glob("diagnosis-*.json")) and not (tmp_path / "captures").exists()


def _outgrow_memory(tmp_path: Path, mode: str, **env: str) -> subprocess.CompletedProcess[str]:
    """fail.py's rank 1 (FAIL_MODE ``mode``) outgrows a real memory cgroup (64 MB unless ``env`` says
    otherwise), removed afterwards."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    from faultlib import faults

    if os.geteuid() != 0 or faults.hierarchy("memory") is None:
        pytest.skip("needs root and a cgroup memory controller")
    name = f"eroica-test-{mode}-{os.getpid()}"
    try:
        return eroica_run("--nproc-per-node", "2", "--report-dir", tmp_path, SCRIPTS / "fail.py",
                          env={"FAIL_RANK": "1", "FAIL_MODE": mode, "FAIL_CGROUP": name, **env}, timeout=150)
    finally:
        with contextlib.suppress(OSError):
            (faults.hierarchy("memory")[0] / name).rmdir()   # type: ignore[index]


@pytest.mark.root
def test_a_rank_the_oom_killer_ended_is_said_to_have_run_out_of_memory(tmp_path) -> None:
    """Rank 1 outgrows its memory cgroup at once (512 MB, 4 GB asked for) and the kernel's OOM killer
    ends it (SIGKILL, no traceback): the failure summary says so, from the kernel's log or the host's
    OOM-kill count, with what to do; where the log gives its size at the kill, its wrapper's samples of
    its memory before say it was one allocation, not a slow leak."""
    # (judged as a longer job's rank: one killed in its first 2 minutes was starting up, whatever it did)
    proc = _outgrow_memory(tmp_path, "oom", FAIL_LIMIT_MB="512", FAIL_AFTER_S="1.5", EROICA_MEMORY_SAMPLE_S="0.2",
                           EROICA_MEMORY_STARTUP_S="0")
    assert proc.returncode == 128 + signal.SIGKILL, explain(proc)
    root = proc.stderr[proc.stderr.index("Root Cause"):]
    assert re.search(r"rank\s+: 1 ", root) and "SIGKILL" in root, explain(proc)
    assert "OOM killer" in root and "ran out of memory" in root and "raise the memory limit" in root, explain(proc)
    if os.access("/dev/kmsg", os.R_OK):   # certain: said on stderr at once, too
        said = [ln for ln in proc.stderr.splitlines() if ln.startswith("eroica-run: rank 1 (pid ")]
        assert said and "killed by the kernel's OOM killer" in said[0], explain(proc)
        assert "one allocation far larger than the others" in said[0] and "a leak" not in said[0], explain(proc)


@pytest.mark.root
def test_a_rank_the_oom_killer_ended_after_its_memory_kept_growing_is_said_to_leak(tmp_path) -> None:
    """Rank 1 keeps 16 MB more every 0.1 s until its 400 MB memory cgroup's OOM killer ends it: the rank
    cannot speak after SIGKILL, and the kernel's record gives one size; its wrapper sampled its memory
    while it ran, and the failure summary says it grew steadily: a leak."""
    # (judged as a longer job's rank, as above)
    proc = _outgrow_memory(tmp_path, "oom", FAIL_LIMIT_MB="400", FAIL_LEAK_MB="16", EROICA_MEMORY_SAMPLE_S="0.2",
                           EROICA_MEMORY_STARTUP_S="0")
    assert proc.returncode == 128 + signal.SIGKILL, explain(proc)
    root = proc.stderr[proc.stderr.index("Root Cause"):]
    assert "ran out of memory" in root and "its anonymous memory had grown for" in root, explain(proc)
    assert "a leak? (tensors kept with their autograd graph" in root, explain(proc)


@pytest.mark.root
def test_a_rank_whose_dataloader_worker_the_oom_killer_ended_is_said_to_have_run_out_of_memory(tmp_path) -> None:
    """torch's "DataLoader worker (pid N) is killed by signal: Killed." names no cause: the kernel's log does."""
    if not os.access("/dev/kmsg", os.R_OK):
        pytest.skip("the kernel's log is not readable here")
    proc = _outgrow_memory(tmp_path, "worker-oom")
    assert proc.returncode == 1, explain(proc)
    root = proc.stderr[proc.stderr.index("Root Cause"):]
    assert "is killed by signal: Killed" in root, explain(proc)
    assert re.search(r"its DataLoader worker \(pid \d+\) was killed by the kernel's OOM killer", root), explain(proc)
    assert "raise the memory limit" in root, explain(proc)


@pytest.mark.root
def test_a_rank_killed_for_what_its_dataloader_workers_copied_is_said_to_be_their_copy_on_read(tmp_path) -> None:
    """Rank 1 reads a dataset of 2 million Python strings through 2 forked DataLoader workers inside a
    150 MB memory cgroup: each worker copies the pages of the strings it reads (reading an object writes
    its reference count), and the OOM killer ends the largest process, the rank. Its own memory did not
    grow in the cgroup; the failure summary says what its workers held and why, not that the rank
    ran out while starting up."""
    if not os.access("/dev/kmsg", os.R_OK):
        pytest.skip("the kernel's log is not readable here")
    proc = _outgrow_memory(tmp_path, "worker-copies", FAIL_LIMIT_MB="150", EROICA_MEMORY_SAMPLE_S="0.2")
    assert proc.returncode == 128 + signal.SIGKILL, explain(proc)
    root = proc.stderr[proc.stderr.index("Root Cause"):]
    assert "killed by the kernel's OOM killer" in root and "its 2 child processes (its DataLoader workers" in root, \
        explain(proc)
    assert "copy-on-read" in root and "numpy arrays" in root and "while starting up" not in root, explain(proc)


def test_a_rank_whose_dataloader_workers_copy_its_python_objects_is_warned_of_while_it_runs(tmp_path) -> None:
    """Copy-on-read ends a job late, by the OOM killer, with nothing said before: rank 1 reads 2 million
    Python strings through 2 forked DataLoader workers, which copy the pages of those they read; rank 0
    reads the same bytes from one numpy array. While the job runs, rank 1's wrapper says that its workers
    hold copies of the rank's memory, why, and what to change; nothing of the kind for rank 0; the job
    ends well.

    The same pass has no collective: its ranks never wait for each other, each at its own pace (rank 1's
    workers are slower). eroica counted a step at each batch from the 72nd, on each rank from where the
    agreement's answer reached it, and rank 0 waited the side channel's deadline (20 s) in a vote rank 1
    never cast, and switched eroica off (2 of 2 runs; the job took 27 s instead of 6): it now counts no
    steps in such a loop, and says why."""
    proc = eroica_run("--nproc-per-node", "2", "--report-dir", tmp_path, SCRIPTS / "copies.py",
                      env={"COPIES_RANK": "1", "EROICA_MEMORY_SAMPLE_S": "0.2"}, timeout=150)
    assert proc.returncode == 0 and "rank 1 read" in proc.stdout and "rank 0 read" in proc.stdout, explain(proc)
    said = [ln for ln in proc.stderr.splitlines() if "pages copied from the rank's memory" in ln]
    assert len(said) == 1 and said[0].startswith("eroica-run: rank 1 (pid "), explain(proc)
    assert "its 2 child processes (its DataLoader workers" in said[0] and "copy-on-read" in said[0], said
    assert "numpy arrays" in said[0], said
    assert "no collective between them: the ranks do not wait for each other" in proc.stderr, explain(proc)
    assert "off on this rank" not in proc.stderr + proc.stdout, explain(proc)
    assert "its loop (DataLoader batches, no torch.optim optimizer step) has no collective" in proc.stdout + \
        proc.stderr, explain(proc)


def test_max_restarts_relaunches_the_job(tmp_path) -> None:
    proc = eroica_run("--nproc-per-node", "2", "--max-restarts", "1", "--report-dir", tmp_path,
                      SCRIPTS / "fail.py", env={"FAIL_RANK": "1", "FAIL_ATTEMPTS": "1"}, timeout=150)
    assert proc.returncode == 0, explain(proc)
    assert "restarting the job (1/1)" in proc.stderr
    assert "finished attempt 1" in proc.stdout


def test_output_prefix_filter_tee_and_user_sitecustomize(tmp_path) -> None:
    logs = tmp_path / "logs"
    proc = eroica_run("--nproc-per-node", "3", "--rdzv-id", "job1", "--log-dir", logs, "--tee", "3",
                      "--local-ranks-filter", "0,2", "--report-dir", tmp_path / "rep", SCRIPTS / "whoami.py",
                      "x", env={"PYTHONPATH": str(SCRIPTS / "usersite"), "USER_SITECUSTOMIZE_MARK": "1"},
                      timeout=120)
    assert proc.returncode == 0, explain(proc)
    assert "[rank0]:whoami rank=0" in proc.stdout and "[rank2]:whoami rank=2" in proc.stdout
    assert "rank=1" not in proc.stdout  # filtered from the console...
    stdout1 = (logs / "job1" / "attempt_0" / "1" / "stdout.log").read_text()
    assert "whoami rank=1" in stdout1  # ...but still in its log file
    assert "to-stderr rank=1" in (logs / "job1" / "attempt_0" / "1" / "stderr.log").read_text()
    assert "[rank0]:user-sitecustomize=yes" in proc.stdout


@pytest.mark.parametrize("nproc", [1, 2])
def test_progress_bars_stream_and_profiler_log_lines_are_left_out(tmp_path, nproc: int) -> None:
    """A tqdm-style bar (carriage returns, no newline yet) reaches the console while it is drawn, and
    kineto's "USDT: ... profiler_start/stop" lines, torch's warning at each toggle of host-op
    collection (eroica's capture, around the lead-in step) and its soft assert on a range open at
    the window's stop inside a job's own waiting profiler's step never do, with or without the
    [rankN]: prefix; the job's own C++-style warnings still do."""
    seen = tmp_path / "seen"
    env = {**os.environ, **RANK_ENV, "PROGRESS_SEEN": str(seen)}
    out_file = tmp_path / "stdout"
    with out_file.open("wb") as out:
        proc = subprocess.Popen([str(BIN / "eroica-run"), "--nproc-per-node", str(nproc), "--report-dir",
                                 str(tmp_path / "rep"), str(SCRIPTS / "progress.py")], env=env,
                                stdout=out, stderr=subprocess.PIPE, start_new_session=True)
    err: list[bytes] = []

    def read() -> None:
        assert proc.stderr is not None
        for chunk in iter(lambda: os.read(proc.stderr.fileno(), 4096), b""):
            err.append(chunk)
            if b"progress  50%" in b"".join(err):
                seen.touch()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        pytest.fail("eroica-run timed out:\n" + b"".join(err).decode(errors="replace")[-3000:])
    reader.join(10)
    text = b"".join(err).decode(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    assert "progress 100%|##########| seen" in text, text[-3000:]    # the half-drawn bar was not held back
    assert "ActivityProfilerHandler" not in text and "USDT:" not in text, text[-3000:]
    assert "Toggling CPU activity" not in text, text[-3000:]
    assert "collection.cpp" not in text and "(function operator())" not in text, text[-3000:]
    assert text.count("a warning of the job's own") == nproc, text[-3000:]
    # the script never steps an optimizer: the job summary says why eroica had nothing to say
    assert "no training step was seen" in text and "mark_step()" in text, text[-3000:]
    assert out_file.read_text().count("profiled rank=") == nproc


def test_in_place_under_mpiexec(tmp_path) -> None:
    proc = launch([str(BIN / "mpiexec"), "-n", "2", str(BIN / "eroica-run"), "--report-dir", str(tmp_path),
                   str(SCRIPTS / "whoami.py")], timeout=120)
    assert proc.returncode == 0, explain(proc)
    assert "whoami rank=0 world=2" in proc.stdout and "whoami rank=1 world=2" in proc.stdout


def test_sigterm_stops_the_job_without_restarting_it_or_blaming_a_rank(tmp_path) -> None:
    """scancel, a time limit or a pod's end: SIGTERM to eroica-run. The job stops, is not restarted by
    --max-restarts (it was, while Slurm waited to kill it), and no rank the SIGTERM ended is called the
    root cause; the exit code is 128 + 15, as a shell reports it."""
    env = {**os.environ, **RANK_ENV, "FAIL_RANK": "99"}
    proc = subprocess.Popen([str(BIN / "eroica-run"), "--nproc-per-node", "2", "--max-restarts", "1",
                             "--report-dir", str(tmp_path), str(SCRIPTS / "fail.py")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not list((tmp_path / "launch" / "attempt_0").glob("*/owner")) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(3)  # inside the training script now
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err[-3000:]
    assert "fail.py STOPPED" in err and "eroica-run got SIGTERM" in err, err[-3000:]
    assert "restarting" not in err and "Root Cause" not in err and "FAILED" not in err, err[-3000:]
    assert not (tmp_path / "launch" / "attempt_1").exists()


def _runs_eroica_run(p: psutil.Process) -> bool:
    """Whether ``p`` is an eroica-run (False for a process that ended meanwhile)."""
    try:
        return any(a.endswith("eroica-run") for a in p.cmdline()[:2])
    except psutil.Error:
        return False


def test_a_stop_sent_to_eroica_run_in_place_is_said_once_and_stops_the_job_without_a_restart(tmp_path) -> None:
    """``srun eroica-run`` / ``mpiexec eroica-run``: one eroica-run in place per task, and scancel or a time
    limit signals every one. Each task's eroica-run used to blame its own rank ("Root Cause ... SIGTERM")
    and start it again under --max-restarts; now the first task says the job was stopped, once."""
    env = {**os.environ, **RANK_ENV, "FAIL_RANK": "99"}
    proc = subprocess.Popen([str(BIN / "mpiexec"), "-n", "2", str(BIN / "eroica-run"), "--max-restarts", "1",
                             "--report-dir", str(tmp_path), str(SCRIPTS / "fail.py")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(list((tmp_path / "launch" / "attempt_0").glob("*/owner"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(3)  # inside the training script now
        tasks = [p for p in psutil.Process(proc.pid).children(recursive=True) if _runs_eroica_run(p)]
        assert len(tasks) == 2, [p.cmdline() for p in tasks]
        for task in tasks:   # as Slurm signals every task of the step
            task.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode != 0, err[-3000:]
    assert err.count("fail.py STOPPED") == 1 and "eroica-run got SIGTERM" in err, err[-3000:]
    assert "restarting" not in err and "Root Cause" not in err and "FAILED" not in err, err[-3000:]
    assert not (tmp_path / "launch" / "attempt_1").exists()


def test_bad_flag_is_one_clear_line() -> None:
    proc = eroica_run("--nnodes", "1:3", "train.py", timeout=60)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "elastic" in lines[0]


def test_doctor_reports_and_exits_zero_here(tmp_path) -> None:
    # from a directory with a json.py of its own, as test_same_environment_and_result_as_torchrun's jobs:
    # the doctor's probes are eroica's own processes and never import it
    (tmp_path / "json.py").write_text("raise ImportError('the job directory\\'s own json.py was imported')\n")
    proc = launch([str(BIN / "eroica"), "doctor"], timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    assert "mpiexec" in proc.stdout and "injection" in proc.stdout and "CPU quota (cgroup)" in proc.stdout
    assert "memory limit (cgroup)" in proc.stdout
    assert sys.executable
