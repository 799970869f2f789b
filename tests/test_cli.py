"""eroica-run's flag parsing against torchrun's own parser, launch planning refusals, failure ordering."""

from __future__ import annotations

import argparse
import json
import os

import pytest
from torch.distributed.run import get_args_parser

from eroica_launch.cli import config_from_args, parse_args
from eroica_launch.plan import LaunchError, parse_nnodes, plan_launch, resolve_nproc
from eroica_runtime.config import Config, ConfigError

SHARED = ("nnodes", "nproc_per_node", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "rdzv_conf", "standalone",
          "max_restarts", "monitor_interval", "start_method", "role", "module", "no_python", "run_path",
          "log_dir", "redirects", "tee", "local_ranks_filter", "node_rank", "master_addr", "master_port",
          "local_addr", "training_script", "training_script_args")

CASES = [
    ["train.py"],
    ["--nproc-per-node", "4", "train.py", "--lr", "3e-4"],
    ["--nproc_per_node=8", "--nnodes", "2", "--node_rank", "1", "--master_addr", "10.0.0.1",
     "--master_port", "1234", "train.py"],
    ["--standalone", "--nproc-per-node", "auto", "-m", "pkg.train", "--epochs", "3"],
    ["--rdzv-backend", "c10d", "--rdzv-endpoint", "host:29400", "--rdzv-id", "job7", "--rdzv-conf",
     "timeout=60", "--max-restarts", "3", "--monitor-interval", "0.5", "--start-method", "fork",
     "--role", "trainer", "train.py"],
    ["--no-python", "--log-dir", "/tmp/logs", "-r", "3", "-t", "0:1,1:2", "--local-ranks-filter", "0,1",
     "./train.sh", "-x"],
    ["--run-path", "--local-addr", "1.2.3.4", "train.py", "--nproc-per-node", "2"],
]


@pytest.mark.parametrize("argv", CASES, ids=lambda a: " ".join(a)[:40])
def test_shared_flags_parse_like_torchrun(argv: list[str]) -> None:
    ours = parse_args(argv)
    theirs = get_args_parser().parse_args(argv)
    for dest in SHARED:
        if dest == "master_port" and ours.master_port is None and theirs.master_port == 29500:
            # torch 2.11's torchrun parses a fixed 29500 when no port is given; 2.13's parses None and
            # takes a free port on one node, as eroica-run does (plan.py): both are torchrun's default
            continue
        assert getattr(ours, dest) == getattr(theirs, dest), dest


@pytest.mark.parametrize("var,value,dest", [("PET_NPROC_PER_NODE", "3", "nproc_per_node"),
                                            ("PET_MAX_RESTARTS", "2", "max_restarts"),
                                            ("PET_STANDALONE", "1", "standalone"),
                                            ("PET_MASTER_PORT", "4242", "master_port")])
def test_pet_environment_defaults_like_torchrun(monkeypatch: pytest.MonkeyPatch, var: str, value: str,
                                                dest: str) -> None:
    monkeypatch.setenv(var, value)
    ours = parse_args(["train.py"])
    theirs = get_args_parser().parse_args(["train.py"])
    assert getattr(ours, dest) == getattr(theirs, dest)


def test_script_args_are_not_ours() -> None:
    args = parse_args(["--nproc-per-node", "2", "train.py", "--report-dir", "x", "--no-eroica"])
    assert args.training_script_args == ["--report-dir", "x", "--no-eroica"]
    assert args.report_dir == "" and not args.no_eroica


@pytest.mark.parametrize("script_args", [["--warmup", "500", "--keep", "3"], ["--max", "1", "--", "-x"],
                                         ["--dead", "--no", "--nproc_per", "8"]], ids=lambda a: " ".join(a))
def test_script_flags_that_abbreviate_our_options_are_the_scripts(script_args: list[str]) -> None:
    """A script's ``--warmup 500`` abbreviates eroica's --warmup-steps and --warmup_steps: argparse
    read it as ours and stopped with "ambiguous option" where torchrun passed it to the script.
    Options before the script may still be abbreviated, as under torchrun."""
    args = parse_args(["--nproc_per", "2", "--dead", "7", "train.py", *script_args])
    assert args.training_script == "train.py" and args.training_script_args == script_args
    assert args.nproc_per_node == "2" and float(args.deadline_s) == 7.0
    assert parse_args(["-m", "pkg.train", *script_args]).training_script_args == script_args


def test_eroica_flags_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EROICA_WINDOW_STEPS", "5")
    monkeypatch.setenv("EROICA_CAPTURE_AT_STEPS", "10,20")
    args = parse_args(["--spike-ratio", "2.5", "--deadline", "7", "--no-eroica", "train.py"])
    cfg = config_from_args(args)
    assert (cfg.window_steps, cfg.capture_at_steps, cfg.spike_ratio, cfg.deadline_s, cfg.enabled) == (
        5, (10, 20), 2.5, 7.0, False)


def test_settings_without_a_flag_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """EROICA_* settings that are no eroica-run flag reach the ranks as the user set them: the launcher
    exports the whole Config, and used to export their defaults over the user's values."""
    monkeypatch.setenv("EROICA_KEEP_RAW_EVENTS", "1")
    monkeypatch.setenv("EROICA_VOTE_LAG", "5")
    monkeypatch.setenv("EROICA_LOG_LEVEL", "debug")
    cfg = config_from_args(parse_args(["--window-steps", "4", "train.py"]))
    assert (cfg.keep_raw_events, cfg.vote_lag, cfg.log_level, cfg.window_steps) == (True, 5, "debug", 4)
    ranks = _plan(["train.py"]).env          # what every rank gets
    assert (ranks["EROICA_KEEP_RAW_EVENTS"], ranks["EROICA_VOTE_LAG"], ranks["EROICA_LOG_LEVEL"]) == ("1", "5", "debug")
    monkeypatch.setenv("EROICA_VOTE_LAG", "0")
    with pytest.raises(ConfigError, match=r"^EROICA_VOTE_LAG=0: must be >= 1$"):
        config_from_args(parse_args(["train.py"]))


def _plan(argv: list[str], env: dict[str, str] | None = None):
    args = parse_args(argv)
    return plan_launch(args, config_from_args(args), env=env or {"PATH": "/usr/bin"})


def test_elastic_ranges_are_refused() -> None:
    with pytest.raises(LaunchError, match="elastic"):
        parse_nnodes("1:4")
    assert parse_nnodes("2:2") == 2


def test_nproc_keywords() -> None:
    import os
    assert resolve_nproc("cpu") == os.cpu_count()
    assert resolve_nproc("auto") >= 1
    with pytest.raises(LaunchError, match="no CUDA device"):
        resolve_nproc("gpu")
    with pytest.raises(LaunchError):
        resolve_nproc("lots")


def test_multinode_without_slurm_or_hostfile_says_what_to_use() -> None:
    with pytest.raises(LaunchError, match="Slurm allocation.*--hostfile"):
        _plan(["--nnodes", "2", "--nproc-per-node", "2", "train.py"])


def test_unsupported_rendezvous_is_refused() -> None:
    with pytest.raises(LaunchError, match="rdzv-backend etcd"):
        _plan(["--rdzv-backend", "etcd", "train.py"])


def test_flags_without_mpi_meaning_get_a_note() -> None:
    plan = _plan(["--start-method", "fork", "--rdzv-conf", "timeout=5", "train.py"])
    assert any("start-method fork" in n for n in plan.notes)
    assert any("rdzv-conf timeout" in n for n in plan.notes)


def test_mpiexec_plan(tmp_path) -> None:
    plan = _plan(["--nproc-per-node", "3", "--report-dir", str(tmp_path), "train.py", "--x"])
    assert plan.mode == "mpiexec" and plan.world_size == 3
    assert plan.argv[1:3] == ["-n", "3"] and "-ppn" in plan.argv
    assert plan.argv[-3:] == ["-u", "train.py", "--x"]
    assert plan.env["EROICA_REPORT_DIR"] == str(tmp_path)
    assert plan.spec.master_addr == "localhost"


def test_rdzv_endpoint_maps_to_master() -> None:
    plan = _plan(["--rdzv-endpoint", "node7:4321", "train.py"])
    assert (plan.spec.master_addr, plan.spec.master_port) == ("node7", 4321)


def test_slurm_allocation_plans_srun() -> None:
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "nodeA", "SLURM_NNODES": "1", "PATH": "/usr/bin"}
    plan = _plan(["--nproc-per-node", "4", "train.py"], env)
    assert plan.mode == "srun"
    assert plan.argv[:2] == ["srun", "--mpi=pmi2"] and "--kill-on-bad-exit=1" in plan.argv
    assert plan.spec.master_addr == "nodeA"


def test_inside_a_task_runs_in_place() -> None:
    env = {"PMI_RANK": "1", "PMI_SIZE": "2", "PATH": "/usr/bin"}
    plan = _plan(["train.py"], env)
    assert plan.mode == "inplace" and plan.argv[-1] == "train.py"


def test_help_documents_env_defaults() -> None:
    from eroica_launch.cli import get_parser
    text = get_parser().format_help()
    assert "EROICA_REPORT_DIR" in text and "EROICA_LAUNCHER" in text and "MIN:MAX" in text
    assert "env_var" not in text and "% above" in text  # help strings are formatted, not dumped
    assert isinstance(get_parser(), argparse.ArgumentParser)


def _rank_dir(attempt, rank: int, *, error_at: float | None, ended: float | None, exitcode: int = 1,
              launch: str = ""):
    d = attempt / str(rank)
    d.mkdir(parents=True)
    err = d / "error.json"
    if error_at is not None:
        err.write_text(json.dumps({"message": {"message": f"rank {rank} broke", "extraInfo": {
            "py_callstack": f"Traceback: rank {rank} broke", "timestamp": str(int(error_at))}}}))
        os.utime(err, (error_at, error_at))
    if ended is not None:
        (d / "status.json").write_text(json.dumps({
            "rank": rank, "local_rank": rank, "host": "h", "pid": 1, "exitcode": exitcode, "signal": None,
            "started": 0.0, "ended": ended, "error_file": str(err), "message": "", "launch": launch}))


def test_root_cause_is_the_first_error_file_even_within_one_second(tmp_path) -> None:
    """A victim fails a few ms after the culprit (same whole second, torchrun's timestamp unit) and is
    reaped first: the error files' mtimes still put the culprit first."""
    from eroica_launch.supervise import read_failures
    t = 1_800_000_000.0
    _rank_dir(tmp_path, 1, error_at=t + 0.40, ended=t + 0.45)  # victim, lower rank, reaped first
    _rank_dir(tmp_path, 2, error_at=t + 0.10, ended=t + 0.90)  # culprit
    _rank_dir(tmp_path, 0, error_at=None, ended=t + 1.0, exitcode=0)
    assert [f["rank"] for f in read_failures(tmp_path)] == [2, 1]


def test_a_rank_killed_outright_is_the_root_cause_though_its_victims_raised_first(tmp_path) -> None:
    """Rank 3 is SIGKILLed (no error file can be written); on a loaded host its wrapper reaps it after
    rank 2 has already raised on the reset connection and written its error file, and the teardown then
    stops rank 2 (SIGTERM). The job's root cause, and exit code, is rank 3's death (seen in a
    fresh-clone CI run: exit 143 instead of 137). A signal death long after a real error is no root cause."""
    from eroica_launch.supervise import read_failures
    t = 1_800_000_000.0
    _rank_dir(tmp_path, 2, error_at=t + 0.05, ended=t + 0.60, exitcode=-15)   # victim, stopped by the teardown
    _rank_dir(tmp_path, 3, error_at=None, ended=t + 0.30, exitcode=-9)         # killed outright, reaped late
    _rank_dir(tmp_path, 0, error_at=t + 0.08, ended=t + 0.50)                  # another victim
    assert [f["rank"] for f in read_failures(tmp_path)] == [3, 2, 0]
    later = tmp_path / "later"
    _rank_dir(later, 1, error_at=t + 0.05, ended=t + 0.20)                    # a real error in rank 1...
    _rank_dir(later, 3, error_at=None, ended=t + 5.0, exitcode=-9)             # ...and a kill 5 s later
    assert [f["rank"] for f in read_failures(later)] == [1, 3]


def test_a_stopped_job_names_the_rank_that_failed_before_the_stop_and_none_the_stop_ended(
        tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """Rank 1 raised before the scheduler's SIGTERM reached eroica-run; ranks 0 and 2 were ended by the
    SIGTERM it passed on. The failure summary's root cause is rank 1 alone, then the STOPPED block
    says the stop came after it; the exit code is the stop's (128 + 15). No report directory: one line
    says there is none yet."""
    import signal
    from types import SimpleNamespace

    from eroica_launch.supervise import _stopped
    t = 1_800_000_000.0
    _rank_dir(tmp_path, 1, error_at=t - 2.0, ended=t - 1.9)
    _rank_dir(tmp_path, 0, error_at=None, ended=t + 0.4, exitcode=-15)
    _rank_dir(tmp_path, 2, error_at=None, ended=t + 0.5, exitcode=-15)
    plan = SimpleNamespace(script="train.py", mode="mpiexec", max_restarts=3, report_dir=str(tmp_path / "none"),
                           spec=SimpleNamespace(enabled=True))
    assert _stopped(plan, tmp_path, None, int(signal.SIGTERM), t) == 143   # type: ignore[arg-type]
    err = capsys.readouterr().err
    root = err.split("Root Cause (first observed failure):", 1)[1]
    assert "rank      : 1 " in root and "rank      : 0 " not in err and "rank      : 2 " not in err, err
    assert "train.py STOPPED" in err and "(the failure above came first)" in err, err
    assert "not restarted (--max-restarts 3 is for failures)" in err and "eroica: no report in" in err, err


def test_an_earlier_jobs_rank_records_are_no_failure_of_this_one(tmp_path) -> None:
    """A report directory used again: the launcher clears the last job's rank records before it launches,
    and a record a wrapper of that job writes afterwards (still ending) carries that job's launch id."""
    from eroica_launch.supervise import _any_failed, forget_earlier_jobs, read_failures
    t = 1_800_000_000.0
    _rank_dir(tmp_path, 5, error_at=t - 50, ended=t - 40, exitcode=-9, launch="old")   # a rank this job lacks
    (tmp_path / "5" / "owner").write_text("123")
    forget_earlier_jobs(tmp_path)
    assert not any((tmp_path / "5").iterdir()) and not _any_failed(tmp_path) and read_failures(tmp_path) == []
    _rank_dir(tmp_path, 1, error_at=t - 5, ended=t - 2, launch="old")                   # written late
    _rank_dir(tmp_path, 0, error_at=t + 3, ended=t + 4, launch="new")                   # this job's
    assert _any_failed(tmp_path, "new")
    assert [f["rank"] for f in read_failures(tmp_path, launch="new")] == [0]
    assert [f["rank"] for f in read_failures(tmp_path)] == [1, 0]                       # in place: any
    (tmp_path / "0" / "status.json").unlink()
    assert not _any_failed(tmp_path, "new")


def test_culprit_still_being_reaped_is_counted(tmp_path) -> None:
    """In place (one eroica-run per task), a victim may summarise before the culprit's status is written:
    the culprit's error file alone makes it the root cause."""
    from eroica_launch.supervise import failure_summary, read_failures
    t = 1_800_000_000.0
    _rank_dir(tmp_path, 1, error_at=t + 0.40, ended=t + 0.45)
    _rank_dir(tmp_path, 2, error_at=t + 0.10, ended=None)
    assert [f["rank"] for f in read_failures(tmp_path)] == [1]  # mpiexec: every wrapper has ended
    failures = read_failures(tmp_path, pending=True)
    assert [f["rank"] for f in failures] == [2, 1]
    text = failure_summary("train.py", failures, launcher_rc=1, mode="inplace")
    root = text[text.index("Root Cause"):]
    assert "rank      : 2" in root and "rank 2 broke" in root


@pytest.mark.parametrize("argv,says", [
    (["--deadline", "nan"], "--deadline (EROICA_DEADLINE_S)=nan: must be a finite number"),
    (["--deadline", "inf"], "--deadline (EROICA_DEADLINE_S)=inf: must be a finite number"),
    (["--deadline", "1e400"], "--deadline (EROICA_DEADLINE_S)=inf: must be a finite number"),
    (["--deadline", "abc"], "--deadline (EROICA_DEADLINE_S)='abc': expected a number"),
    (["--deadline", "-1"], "--deadline (EROICA_DEADLINE_S)=-1.0: must be > 0"),
    (["--window-steps", "0"], "--window-steps (EROICA_WINDOW_STEPS)=0: must be >= 1"),
    (["--spike-ratio", "1"], "--spike-ratio (EROICA_SPIKE_RATIO)=1.0: must be > 1"),
    (["--capture-at-steps", "10,x"], "--capture-at-steps (EROICA_CAPTURE_AT_STEPS)='10,x': expected integers"),
    (["--capture-at-steps", "-5"], "--capture-at-steps (EROICA_CAPTURE_AT_STEPS)=-5: must be >= 0"),
    (["--hang-action", "explode"], "--hang-action (EROICA_HANG_ACTION)='explode': use one of report, abort"),
    (["--exit-grace", "nan"], "--exit-grace (EROICA_EXIT_GRACE_S)=nan: must be a finite number"),
])
def test_bad_eroica_flag_is_one_line_naming_it(argv: list[str], says: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_args(parse_args([*argv, "train.py"]))
    assert str(err.value).startswith(says), str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("var,value,says", [
    ("EROICA_DEADLINE_S", "nan", "--deadline (EROICA_DEADLINE_S)=nan: must be a finite number"),
    ("EROICA_VOTE_LAG", "0", "EROICA_VOTE_LAG=0: must be >= 1"),
    ("EROICA_HANG_FACTOR", "inf", "EROICA_HANG_FACTOR=inf: must be a finite number"),
    ("EROICA_BASELINE", "maybe", "EROICA_BASELINE='maybe': expected 1/0, true/false"),
])
def test_bad_eroica_variable_in_a_rank_names_it(var: str, value: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        Config.from_env({var: value})
    assert str(err.value).startswith(says), str(err.value)


def test_eroica_run_rejects_a_nan_deadline_before_launching(tmp_path) -> None:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "eroica_launch.cli", "--deadline", "nan", "train.py"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "eroica-run: error: --deadline (EROICA_DEADLINE_S)=nan: must be a finite number"


def test_every_config_field_with_help_is_a_flag_and_round_trips_through_env() -> None:
    from eroica_launch.cli import get_parser
    from eroica_runtime.config import env_name, flag_fields, flag_name

    text = get_parser().format_help()
    for f in flag_fields():
        assert flag_name(f.name) in text and env_name(f.name) in text, f.name
    cfg = Config(deadline_s=7.5, capture_at_steps=(3, 9), hang_action="abort", exit_grace_s=0.0)
    assert Config.from_env(cfg.to_env()) == cfg
