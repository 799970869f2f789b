"""Hostile and broken inputs: each gets one clear line, and the valid part is still analysed.

Starts from a real report directory (tests/data/engine/e2e-compute: 4 CPU ranks, rank 2 given extra
matmuls; capture 44 names it) and breaks it the ways a wire, a foreign build, a careless user or a
hostile one can.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

import msgpack
import pytest
from click.testing import CliRunner

from eroica_launch.offline import analyze_cmd, show_cmd, synth_cmd
from eroica_runtime import report, reportdir, summary
from eroica_runtime.engine import Diagnosis, Finding
from eroica_runtime.pipeline import Pipeline

SRC = Path(__file__).parent / "data" / "engine" / "e2e-compute"
FAULT_STEP = 44


def _copy(tmp_path: Path) -> Path:
    out = tmp_path / "rep"
    shutil.copytree(SRC, out)
    return out


def _rewrite_rank(root: Path, rank: int, change) -> None:  # type: ignore[no-untyped-def]
    path = root / "captures" / f"{FAULT_STEP}.msgpack"
    doc = msgpack.unpackb(path.read_bytes(), raw=False)
    i = doc["ranks"].index(rank)
    s = msgpack.unpackb(doc["summaries"][i], raw=False, strict_map_key=False)
    change(s)
    doc["summaries"][i] = msgpack.packb(s, use_bin_type=True)
    path.write_bytes(msgpack.packb(doc, use_bin_type=True))


def _set(path: str, value):  # type: ignore[no-untyped-def]
    def change(s: dict) -> None:
        *head, last = path.split(".")
        cur = s
        for key in head:
            cur = cur[int(key)] if isinstance(cur, list) else cur[key]
        if isinstance(cur, list):
            cur[int(last)] = value
        else:
            cur[last] = value
    return change


def _del(path: str):  # type: ignore[no-untyped-def]
    def change(s: dict) -> None:
        *head, last = path.split(".")
        cur = s
        for key in head:
            cur = cur[key]
        del cur[last]
    return change


def _all_phases(value: float):  # type: ignore[no-untyped-def]
    def change(s: dict) -> None:
        s["phases"] = {k: value for k in s["phases"]}
    return change


HOSTILE = [
    ("huge-phase", _set("phases.forward", 1e308), "phase 'forward'=1e+308 is outside"),
    ("negative-phases", _all_phases(-1e6), "is outside [0,"),
    ("empty-phases", _set("phases", {}), "phase 'step' is missing"),
    ("missing-phase", _del("phases.comm"), "phase 'comm' is missing"),
    ("bool-phase", _set("phases.forward", True), "phase 'forward' is not a number"),
    ("nan-step", _set("steps.0.ms", float("nan")), "steps[0].ms=nan"),
    ("bool-rank", _set("rank", True), "field 'rank' has type bool"),
    ("rank-out-of-world", _set("rank", 7), "rank=7 must be an integer in [0, 3]"),
    ("bad-groups", _set("groups", [{"name": "dp", "ranks": "0,1"}]), "groups[0]"),
    ("foreign-group-ranks", _set("groups", [{"name": "dp", "ranks": [0, 99]}]), "ranks of this world"),
    ("bad-telemetry", _set("telemetry", {"start": {"host": {"cpu_s": float("inf")}}}), "not finite"),
    ("deep-telemetry", _set("telemetry", {"a": {"b": {"c": {"d": {"e": {"f": 1}}}}}}), "nested deeper"),
    ("inf-function", _set("functions.0.ms", float("inf")), "functions[0].ms"),
    ("unknown-kind", _set("functions.0.kind", "rootkit"), "unknown kind/phase"),
]


@pytest.mark.parametrize("case,change,says", HOSTILE, ids=[c[0] for c in HOSTILE])
def test_a_hostile_summary_is_rejected_and_the_culprit_still_named(tmp_path: Path, case: str, change, says: str,
                                                                   ) -> None:
    root = _copy(tmp_path)
    _rewrite_rank(root, 1, change)     # a victim's summary goes bad
    res = CliRunner().invoke(analyze_cmd, [str(root)])
    assert res.exit_code == 1, res.output
    errors = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(errors) == 1 and "rank 1" in errors[0] and says in errors[0], res.stderr
    diag = json.loads((root / f"diagnosis-{FAULT_STEP}.json").read_text())
    assert diag["ranks_analysed"] == 3
    assert [(f["rank"], f["category"]) for f in diag["findings"]] == [(2, "compute")], diag["findings"]
    assert 1 not in diag["findings"][0]["victims"]      # nothing built from the rejected rank


def test_a_capture_with_too_few_valid_ranks_says_so_instead_of_healthy(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    for rank in (0, 2, 3):
        _rewrite_rank(root, rank, _set("phases", {}))
    res = CliRunner().invoke(analyze_cmd, [str(root)])
    line = next(ln for ln in res.output.splitlines() if f"step {FAULT_STEP} " in ln)
    assert "not diagnosed — only 1/4 ranks sent a usable summary (3 rejected, 0 missing)" in line
    assert "healthy" not in line


@pytest.mark.parametrize("field,value,says", [
    ("step", "abc", "'step' must be a non-negative integer, got 'abc'"),
    ("step", float("nan"), "'step' must be a non-negative integer, got nan"),
    ("world_size", "four", "'world_size' must be an integer"),
    ("missing", 5, "'missing' must be a list of ranks"),
    ("missing", [9], "'missing' must be a list of ranks below world_size 4"),
    ("trigger", "spike\nrank 0: forged", "'trigger' must be a short printable string"),
    ("extra", {"link_probe": {"h": {"latency_us": float("nan")}}}, "not finite"),
])
def test_bad_capture_metadata_is_one_line_naming_the_file(tmp_path: Path, field: str, value, says: str) -> None:
    root = _copy(tmp_path)
    path = root / "captures" / f"{FAULT_STEP}.msgpack"
    doc = msgpack.unpackb(path.read_bytes(), raw=False)
    doc[field] = value
    path.write_bytes(msgpack.packb(doc, use_bin_type=True))
    res = CliRunner().invoke(analyze_cmd, [str(root)])
    assert res.exit_code == 1, res.output      # the other captures are still analysed
    errors = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(errors) == 1 and f"captures/{FAULT_STEP}.msgpack" in errors[0] and says in errors[0], res.stderr
    assert "Traceback" not in res.output


def test_a_fifo_named_like_a_capture_does_not_hang_analyze(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    os.mkfifo(root / "captures" / "05.msgpack")
    res = CliRunner().invoke(analyze_cmd, [str(root)])
    assert res.exit_code == 1
    assert "05.msgpack: not a regular file" in res.stderr


def test_unreadable_steps_file_does_not_stop_analyze(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    (root / "steps.msgpack").write_bytes(b"\xc1\xc1garbage")
    res = CliRunner().invoke(analyze_cmd, [str(root)])
    assert res.exit_code == 0, res.output
    assert "COMPUTE: rank 2" in res.output


def test_reports_that_cannot_be_written_give_one_line_and_leave_no_temp_files(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    (root / "report.html").mkdir()           # the rename onto it fails like a read-only target would
    (root / "report.html" / "x").write_text("x")
    res = CliRunner().invoke(analyze_cmd, [str(root)])
    assert res.exit_code == 3, res.output
    assert res.stderr.strip().startswith(f"eroica: analyze: cannot write the reports into {root}")
    assert not [p for p in root.rglob("*.tmp")]


def test_show_on_a_deeply_nested_report_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "report.json").write_text("[" * 100000 + "]" * 100000)
    res = CliRunner().invoke(show_cmd, [str(tmp_path)])
    assert res.exit_code == 1
    assert res.stderr.strip().count("\n") == 0 and "unreadable report" in res.stderr


def test_synth_refuses_a_directory_that_holds_a_report(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    before = sorted(p.name for p in (root / "captures").iterdir())
    res = CliRunner().invoke(synth_cmd, ["--ranks", "8", "--out", str(root)])
    assert res.exit_code == 2 and "already holds a report" in res.stderr
    assert sorted(p.name for p in (root / "captures").iterdir()) == before


def test_a_planted_symlink_is_replaced_not_followed(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    (root / "report.json").unlink(missing_ok=True)
    (root / "report.json").symlink_to(victim)
    res = CliRunner().invoke(analyze_cmd, [str(root)])
    assert res.exit_code == 0, res.output
    assert victim.read_text() == "keep me"
    assert not (root / "report.json").is_symlink()


def _in_threads(n: int, times: int, write) -> list[BaseException]:  # type: ignore[no-untyped-def]
    """Run write(i) ``times`` times in each of ``n`` threads at once; the exceptions raised."""
    failures: list[BaseException] = []

    def loop(i: int) -> None:
        try:
            for _ in range(times):
                write(i)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return failures


def test_concurrent_writes_of_one_file_never_fail_or_collide(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    assert _in_threads(10, 60, lambda i: reportdir.atomic_write(target, json.dumps({"writer": i}))) == []
    assert json.loads(target.read_text())["writer"] in range(10)
    assert not list(tmp_path.glob("*.tmp"))


def test_a_report_directory_others_can_tamper_with_is_refused(tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(reportdir.UnsafeDirectory, match="writable by every user without the sticky bit"):
        reportdir.check_directory(open_dir)
    open_dir.chmod(0o777 | stat.S_ISVTX)       # like /tmp: fine
    reportdir.check_directory(open_dir)
    proc = subprocess.run([sys.executable, "-m", "eroica_launch.cli", "--report-dir", str(tmp_path / "wide" / "r"),
                           str(SRC / "README.md")], capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: os.umask(0))
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("eroica-run: error: --report-dir ")


def test_an_unusable_report_dir_is_one_line_from_eroica_run(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    proc = subprocess.run([sys.executable, "-m", "eroica_launch.cli", "--nproc-per-node", "2", "--report-dir",
                           str(blocker / "r"), str(SRC / "README.md")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"eroica-run: error: --report-dir {blocker / 'r'}: Not a directory"


@pytest.mark.parametrize("flag,value", [("--redirects", "7"), ("--tee", "0:1,x")])
def test_bad_redirects_or_tee_is_one_line_from_eroica_run(tmp_path: Path, flag: str, value: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "eroica_launch.cli", flag, value, "--report-dir", str(tmp_path),
                           str(SRC / "README.md")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith(f"eroica-run: error: {flag} {value!r}: use 0-3")


def test_a_missing_script_is_refused_before_anything_launches(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "eroica_launch.cli", "--nproc-per-node", "1", "--report-dir",
                           str(tmp_path / "r"), "missing.py"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "eroica-run: error: missing.py: no such training script"
    assert not (tmp_path / "r").exists()


def test_an_undeletable_trigger_file_is_reported_once_not_every_second(tmp_path: Path) -> None:
    (tmp_path / "trigger").mkdir()
    (tmp_path / "trigger" / "x").write_text("")   # unlink() fails on it
    assert reportdir.take_trigger(tmp_path) is None
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "trigger").write_text("")
    assert reportdir.take_trigger(tmp_path / "other") is True
    assert reportdir.take_trigger(tmp_path / "other") is False


def test_names_with_newlines_or_escapes_cannot_forge_lines_in_the_text_report() -> None:
    f = Finding(category="compute", rank=2, host="vm\n[rank0]:eroica: step 9: healthy", function="op\x1b[2J",
                phase="forward", impact_ms_per_step=5.0, what_if_step_ms=10.0, victims=(0, 1),
                evidence={"hosts": ["h\r\nx"], "functions": [{"name": "f\nrank 9", "rank_ms": 2.0, "peers_ms": 1.0}]},
                action="look\nhere")
    d = Diagnosis(step=9, trigger="spike", world_size=4, ranks_analysed=4, findings=(f,),
                  errors=("summary from rank 3: bad\nforged line",))
    text = report.format_capture(d)
    assert len(text.splitlines()) == len(report.format_finding(f)) + 2   # head + finding + one rejected line
    assert "\x1b" not in text and "\r" not in text
    assert "vm\\n[rank0]" in text


def test_the_live_analyst_and_eroica_analyze_are_the_same_pipeline(tmp_path: Path) -> None:
    """On a recorded report dir, the analyst's pipeline (fed the captures as the gather hands them
    over) and `eroica analyze` give the same findings, ranks, categories and impacts."""
    root = _copy(tmp_path)
    live = Pipeline(world_size=4)
    online = [live.analyse(p.read_bytes(), origin=f"capture {p.stem}").diagnosis
              for p in reportdir.capture_files(root)]
    res = CliRunner().invoke(analyze_cmd, [str(root)])
    assert res.exit_code == 0, res.output
    for d in online:
        offline = json.loads((root / f"diagnosis-{d.step}.json").read_text())
        assert [(f["rank"], f["category"], f["function"], f["victims"]) for f in offline["findings"]] == \
            [(f.rank, f.category, f.function, list(f.victims)) for f in d.findings]
        assert [round(f["impact_ms_per_step"], 2) for f in offline["findings"]] == \
            [round(f.impact_ms_per_step, 2) for f in d.findings]
    assert any(d.findings for d in online)


def test_summary_validation_keeps_real_summaries(tmp_path: Path) -> None:
    """Every summary recorded by real runs in tests/data passes the stricter checks."""
    for path in sorted((Path(__file__).parent / "data").rglob("captures/*.msgpack")):
        _, good, errors = summary.decode_capture(path.read_bytes(), origin=str(path))
        assert not errors and good, (path, errors)


def test_the_job_report_has_one_writer_at_a_time(tmp_path: Path) -> None:
    """The analyst thread, the hang watchdog and the SIGUSR2 flusher may write report.json together."""
    diagnoses = [Diagnosis(step=s, trigger="spike", world_size=4, ranks_analysed=4, findings=()) for s in range(30)]

    def write(i: int) -> None:
        report.write_steps(tmp_path, [10.0 + i] * 50)
        report.write_job(tmp_path, diagnoses=diagnoses[: i + 1], world_size=4, steps=50, job={"writer": i})

    assert _in_threads(3, 20, write) == []
    doc = json.loads((tmp_path / "report.json").read_text())
    assert len(doc["captures"]) == doc["job"]["writer"] + 1
    assert not list(tmp_path.glob(".*.tmp"))


def test_an_earlier_jobs_reports_are_set_aside_whole_and_kept(tmp_path: Path) -> None:
    """A report directory used again (the same --rdzv-id, a requeued Slurm job, --report-dir): the
    earlier job's captures, diagnoses, hang files and reports move to earlier/<when>/, so that the new
    job's directory (and `eroica analyze` of it) holds the new job's alone; the rank records in
    launch/ and a trigger file asked for the new job stay."""
    for name in ("captures/13.msgpack", "raw/13/rank0.msgpack", "diagnosis-13.json", "diagnosis-57.json",
                 "hang-90.json", "report.json", "report.html", "steps.msgpack", "launch/attempt_0/0/status.json",
                 "trigger", "notes.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    assert reportdir.set_aside_earlier_job(tmp_path / "launch") is None   # nothing of a job's there
    first = reportdir.set_aside_earlier_job(tmp_path)
    assert first is not None and first.parent == tmp_path / reportdir.EARLIER
    assert sorted(p.name for p in tmp_path.iterdir()) == ["earlier", "launch", "notes.txt", "trigger"]
    assert sorted(str(p.relative_to(first)) for p in first.rglob("*") if p.is_file()) == [
        "captures/13.msgpack", "diagnosis-13.json", "diagnosis-57.json", "hang-90.json", "raw/13/rank0.msgpack",
        "report.html", "report.json", "steps.msgpack"]
    assert reportdir.set_aside_earlier_job(tmp_path) is None
    reportdir.atomic_write(tmp_path / "report.json", "{}")   # a second job, ended within the same second
    os.utime(tmp_path / "report.json", (os.stat(first / "report.json").st_mtime,) * 2)
    second = reportdir.set_aside_earlier_job(tmp_path)
    assert second is not None and second != first and (first / "report.json").read_text() == "report.json"
    assert (second / "report.json").read_text() == "{}"
