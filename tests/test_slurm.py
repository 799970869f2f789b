"""The slurm/ sbatch templates, run for real on a single-node Slurm started for this session.

Why: a template is only worth shipping if sbatch accepts it and the job it describes works: srun
wires up MPI (pmi2), eroica-run finds its rank, the tiny DDP job agrees on the world, a failing
rank ends the job with a failure summary, and signals (pre-timeout SIGUSR2, scancel's SIGTERM)
leave a flushed report. Everything here is real: slurmctld, slurmd, munged, srun, MPICH, gloo.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

try:
    from tests.slurm_cluster import TERMINAL_STATES, SlurmCluster, SlurmUnavailable, ensure_slurm_installed
except ImportError:  # tests/ on sys.path (pytest's rootdir-less import mode)
    from slurm_cluster import TERMINAL_STATES, SlurmCluster, SlurmUnavailable, ensure_slurm_installed

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parent.parent
TEMPLATES = ("eroica-srun.sbatch", "eroica-run.sbatch")
DDP_TINY = REPO / "tests" / "data" / "slurm" / "ddp_tiny.py"
# 3 tasks: every assertion is written in NTASKS, and rank 2 (the failing one) still has two victims
NTASKS = 3
JOB_TIMEOUT = 120.0
# A job in one of these has ended (or is ending: COMPLETING) for wait_while_running.
ENDED_STATES = TERMINAL_STATES | {"COMPLETING"}


@pytest.fixture(scope="session")
def slurm_cluster(request: pytest.FixtureRequest) -> Iterator[SlurmCluster]:
    """One local Slurm for the whole session; stopped by a finalizer whatever happens."""
    if os.geteuid() != 0:
        pytest.skip("the local Slurm test cluster needs root (it runs slurmctld/slurmd/munged)")
    try:
        ensure_slurm_installed()
    except SlurmUnavailable as exc:
        pytest.skip(f"cannot install Slurm here: {exc}")
    cluster = SlurmCluster(cpus=8)
    request.addfinalizer(cluster.stop)
    cluster.start()
    yield cluster


def job_env(tmp_path: Path) -> dict[str, str]:
    """Environment exported into the job: eroica-run on PATH, the tiny DDP job as train.py."""
    path = os.environ.get("PATH", "")
    venv_bin = str(Path(sys.executable).parent)
    if venv_bin not in path.split(os.pathsep):
        path = path + os.pathsep + venv_bin
    return {
        "PATH": path,
        "TRAIN_SCRIPT": str(DDP_TINY),
        "EROICA_REPORT_ROOT": str(tmp_path / "reports"),
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        # 4 ranks on a 2-core runner: without these, MPICH busy-polls in every blocking wait (MPI_Finalize
        # at exit included), and four spinning ranks on two cores take tens of seconds to get through.
        "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1",
        "MPIR_CVAR_POLLS_BEFORE_YIELD": "10",
    }


def render(template: str, tmp_path: Path) -> Path:
    """The template as a CPU-only site would edit it: drop the GPU request, keep everything else.

    The rest (nodes, tasks, time, output) is overridden on the sbatch command line, which is what
    a user can do too, so the template's own logic is what runs.
    """
    text = (REPO / "slurm" / template).read_text()
    lines = text.splitlines(keepends=True)
    kept = [line for line in lines if not line.startswith("#SBATCH --gpus-per-node")]
    assert len(kept) == len(lines) - 1, f"{template}: expected exactly one '#SBATCH --gpus-per-node' line"
    out = tmp_path / template
    out.write_text("".join(kept))
    return out


def submit(
    cluster: SlurmCluster, template: str, tmp_path: Path, *train_args: str, extra: tuple[str, ...] = ()
) -> tuple[str, Path]:
    """sbatch a rendered template with NTASKS tasks on one node; returns (job id, output file)."""
    if shutil.which("eroica-run", path=job_env(tmp_path)["PATH"]) is None:
        pytest.fail("eroica-run is not installed in the test environment (pip install -e .)")
    script = render(template, tmp_path)
    output = tmp_path / "job-%j.out"
    job = cluster.sbatch(
        script,
        "--nodes=1",
        f"--ntasks-per-node={NTASKS}",
        "--cpus-per-task=1",
        "--time=5",
        f"--output={output}",
        *extra,
        args=train_args,
        env=job_env(tmp_path),
        cwd=tmp_path,
    )
    return job, tmp_path / f"job-{job}.out"


def read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else f"<{path} missing>"


def load_report(report_dir: Path) -> dict[str, object]:
    report = report_dir / "report.json"
    assert report.exists(), f"no {report}; report dir holds {sorted(p.name for p in report_dir.glob('*'))}"
    data = json.loads(report.read_text())
    assert data.get("schema") == "eroica.report/1", data
    return data


def wait_while_running(
    cluster: SlurmCluster, job: str, output: Path, cond: Callable[[], bool], timeout: float, what: str
) -> None:
    """Wait for `cond` while the job runs; fail at once (with the job's log) if the job ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        # Only an end state counts as ended: a running job passes through transient ones too, such as
        # SIGNALING while slurmctld delivers the pre-timeout signal (seen in CI).
        state = cluster.job(job).get("JobState", "")
        if state in ENDED_STATES:
            if cond():
                return
            pytest.fail(f"job {job} ended ({state}) before {what}\n{read(output)}")
        time.sleep(0.3)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}\n{read(output)}")


# ------------------------------------------------------------------------------- the cluster itself


def test_srun_pmi2_wires_up_mpich(slurm_cluster: SlurmCluster) -> None:
    """The premise of both templates: srun --mpi=pmi2 gives PyPI MPICH one 4-rank world."""
    code = "from mpi4py import MPI; c = MPI.COMM_WORLD; print('RANK', c.Get_rank(), c.Get_size(), c.allreduce(1))"
    proc = slurm_cluster.run(["srun", "--mpi=pmi2", f"-n{NTASKS}", sys.executable, "-c", code], timeout=60)
    lines = sorted(line for line in proc.stdout.splitlines() if line.startswith("RANK"))
    assert lines == [f"RANK {r} {NTASKS} {NTASKS}" for r in range(NTASKS)], proc.stdout + proc.stderr


def test_eroica_run_refuses_mpi_none(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """srun --mpi=none would give N separate rank-0 jobs; eroica-run must say so and fail."""
    env = job_env(tmp_path)
    proc = slurm_cluster.run(
        [
            "srun",
            "--mpi=none",
            "-n2",
            "eroica-run",
            "--nproc-per-node",
            "2",
            str(DDP_TINY),
            "--out-dir",
            str(tmp_path),
        ],
        timeout=60,
        check=False,
        env=env,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "pmi2" in out or "--mpi" in out, out
    assert not list(tmp_path.glob("rank-*.json")), "ranks ran although the MPI wire-up was missing"


# ------------------------------------------------------------------------------- the templates


@pytest.mark.parametrize("template", TEMPLATES)
def test_template_runs_ddp_job(slurm_cluster: SlurmCluster, tmp_path: Path, template: str) -> None:
    """The template runs a 4-rank gloo DDP job to completion and leaves the job's report."""
    ranks_dir = tmp_path / "ranks"
    job, output = submit(slurm_cluster, template, tmp_path, "--out-dir", str(ranks_dir))
    info = slurm_cluster.wait_job(job, timeout=JOB_TIMEOUT)
    log = read(output)
    assert info.ok, f"job {job}: {info.state} {info.exit_code}\n{log}"

    records = [json.loads(p.read_text()) for p in sorted(ranks_dir.glob("rank-*.json"))]
    assert sorted(r["rank"] for r in records) == list(range(NTASKS)), log
    for r in records:
        assert r["source"] == "torchrun-env", r  # eroica-run set RANK/WORLD_SIZE, not the fallback
        assert r["world_size"] == NTASKS, r
        assert r["local_world_size"] == NTASKS, r
        assert r["slurm_job_id"] == job, r
        # every rank saw the same world: all ranks, all agreeing on its size
        assert [s["rank"] for s in r["seen"]] == list(range(NTASKS)), r
        assert {s["world_size"] for s in r["seen"]} == {NTASKS}, r
    # MASTER_ADDR/PORT derived from the allocation, the same on every rank
    assert {r["master_addr"] for r in records} == {slurm_cluster.node}, records
    assert {r["master_port"] for r in records} == {str(20000 + int(job) % 12000)}, records

    load_report(tmp_path / "reports" / job)


@pytest.mark.parametrize("template", TEMPLATES)
def test_template_rank_failure_fails_job_with_summary(
    slurm_cluster: SlurmCluster, tmp_path: Path, template: str
) -> None:
    """Rank 2 crashes mid-training: the job fails (kill-on-bad-exit) and the summary blames rank 2."""
    job, output = submit(
        slurm_cluster,
        template,
        tmp_path,
        "--out-dir",
        str(tmp_path / "ranks"),
        "--steps",
        "50",
        "--fail-rank",
        "2",
        "--fail-step",
        "2",
    )
    info = slurm_cluster.wait_job(job, timeout=JOB_TIMEOUT)
    log = read(output)
    assert info.state == "FAILED", f"job {job}: {info.state} {info.exit_code}\n{log}"
    assert "rank 2 failing on purpose" in log, log
    assert not list((tmp_path / "ranks").glob("rank-*.json")), "a rank finished although rank 2 failed"
    # torchrun-style failure summary whose root cause is rank 2. In place (one eroica-run per task)
    # every task may print one; none may blame a victim (a rank that died of rank 2's crash).
    roots = re.findall(
        r"Root Cause \(first observed failure\):\s*\[0\]:.*?^\s*rank\s*:\s*(\d+)", log, re.S | re.M
    )
    assert roots, f"no torchrun-style failure summary in the job log\n{log}"
    assert set(roots) == {"2"}, f"root cause named as rank(s) {roots}, expected rank 2 only\n{log}"


def test_pre_timeout_signal_flushes_report(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """The template's own `--signal=USR2@120`, sent by slurmctld as the time limit nears, makes the
    ranks flush report.json while training carries on.

    The job starts with a 5-minute limit; once it trains, the limit is cut to 2 minutes, which puts
    the template's signal time (120 s before the end) in the past, so slurmctld sends SIGUSR2 at its
    next time-limit check (Slurm checks limits periodically: up to ~30 s later). Each rank has a
    DataLoader worker: Slurm signals every process of the step, workers included, and training must
    survive that.
    """
    job, output = submit(
        slurm_cluster,
        "eroica-srun.sbatch",
        tmp_path,
        "--out-dir",
        str(tmp_path / "ranks"),
        "--steps",
        "100000",
        "--step-sleep",
        "0.05",
        "--workers",
        "1",
    )
    report_dir = tmp_path / "reports" / job
    try:
        wait_while_running(
            slurm_cluster, job, output, lambda: "ddp_tiny: step 3 " in read(output), 90, "training to start"
        )
        # rank 0 keeps a partial report.json from the start; the signal must make it write a flushed one
        def flushed() -> bool:
            try:
                return load_report(report_dir).get("job", {}).get("flushed_by") == "SIGUSR2"
            except Exception:
                return False

        assert not flushed(), "a flushed report before any signal: test proves nothing"
        slurm_cluster.run(["scontrol", "update", f"JobId={job}", "TimeLimit=2"])
        wait_while_running(slurm_cluster, job, output, flushed, 50,
                           f"report.json flushed by SIGUSR2 in {report_dir} after the pre-timeout signal")
        # Training carries on (and its DataLoader workers survived the signal): more steps follow.
        steps_at_flush = read(output).count("ddp_tiny: step ")
        wait_while_running(
            slurm_cluster,
            job,
            output,
            lambda: read(output).count("ddp_tiny: step ") >= steps_at_flush + 5,
            30,
            "training to go on after SIGUSR2",
        )
    finally:
        slurm_cluster.run(["scancel", job], check=False)
    # scancel's half of test_scancel_leaves_flushed_report for this template
    info = slurm_cluster.wait_job(job, timeout=JOB_TIMEOUT)
    assert info.state == "CANCELLED", f"{info.state}\n{read(output)}"
    load_report(report_dir)
    # each task's eroica-run in place got the SIGTERM too: the first says the job was stopped, and no task
    # blames its rank for it (each printed "Root Cause ... SIGTERM" before)
    said = read(output)
    assert said.count("STOPPED") == 1 and "eroica-run got SIGTERM" in said and "Root Cause" not in said, \
        said[-4000:]


@pytest.mark.parametrize("template", ["eroica-run.sbatch"])
def test_scancel_leaves_flushed_report(slurm_cluster: SlurmCluster, tmp_path: Path, template: str) -> None:
    """scancel (SIGTERM to every step, then SIGKILL after KillWait) still leaves report.json. (The srun
    template's job is scancelled at the end of test_pre_timeout_signal_flushes_report.)"""
    job, output = submit(
        slurm_cluster,
        template,
        tmp_path,
        "--out-dir",
        str(tmp_path / "ranks"),
        "--steps",
        "100000",
        "--step-sleep",
        "0.05",
    )
    try:
        wait_while_running(
            slurm_cluster, job, output, lambda: "ddp_tiny: step 3 " in read(output), 90, "training to start"
        )
    finally:
        slurm_cluster.run(["scancel", job], check=False)
    info = slurm_cluster.wait_job(job, timeout=JOB_TIMEOUT)
    assert info.state == "CANCELLED", f"{info.state}\n{read(output)}"
    load_report(tmp_path / "reports" / job)
    # eroica-run got the SIGTERM too: the job stopped from outside, no rank blamed for it
    said = read(output)
    assert "STOPPED" in said and "eroica-run got SIGTERM" in said and "Root Cause" not in said, said[-4000:]


def test_no_daemons_left_after_stop(tmp_path: Path) -> None:
    """The harness's own promise: a second cluster comes up and, once stopped, leaves nothing."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    try:
        ensure_slurm_installed()
    except SlurmUnavailable as exc:
        pytest.skip(str(exc))
    script = tmp_path / "sleep.sh"
    script.write_text("#!/bin/bash\nsleep 300\n")
    with SlurmCluster(cpus=2) as cluster:
        job = cluster.sbatch(script, "-n1", f"--output={tmp_path}/sleep-%j.out")
        cluster.wait_running(job, timeout=30)
        root = cluster.root
        pids = {p.pid for p in cluster.leftover_processes()}
        assert {cluster.procs[n].pid for n in ("munged", "slurmctld", "slurmd")} <= pids
    assert root is not None and not root.exists()
    alive = [p for p in map(_proc, pids) if p is not None and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [(p.pid, p.cmdline()) for p in alive]


def _proc(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None
