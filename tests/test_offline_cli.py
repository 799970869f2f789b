"""`eroica analyze|show|synth` end to end through click, including bad input."""

from __future__ import annotations

import json
import mmap
import shutil
from pathlib import Path

import msgpack
import pytest
from click.testing import CliRunner

from eroica_launch.offline import analyze_cmd, show_cmd, synth_cmd
from eroica_runtime import reportdir, summary


def _synth(tmp_path: Path, *args: str) -> Path:
    out = tmp_path / "rep"
    res = CliRunner().invoke(synth_cmd, ["--out", str(out), *args])
    assert res.exit_code == 0, res.output
    return out


def test_synth_then_analyze_then_show(tmp_path: Path) -> None:
    out = _synth(tmp_path, "--ranks", "32", "--fault", "dataloader", "--culprit", "17", "--functions", "80")
    res = CliRunner().invoke(analyze_cmd, [str(out)])
    assert res.exit_code == 0, res.output
    assert "DATALOADER: rank 17 on node00002" in res.output
    assert (out / "diagnosis-100.json").is_file() and (out / "diagnosis-500.json").is_file()
    doc = json.loads((out / "report.json").read_text())
    assert [(f["rank"], f["category"]) for f in doc["findings"]] == [(17, "dataloader")]
    assert doc["steps"] == 600
    res = CliRunner().invoke(show_cmd, [str(out)])
    assert res.exit_code == 0 and "DATALOADER: rank 17" in res.output


def test_analyze_with_topology_and_stages(tmp_path: Path) -> None:
    out = _synth(tmp_path, "--ranks", "32", "--stages", "4", "--fault", "gc", "--culprit", "30")
    res = CliRunner().invoke(analyze_cmd, [str(out), "--topology", "pp=4,dp=*"])
    assert res.exit_code == 0, res.output
    assert "GC: rank 30" in res.output
    assert json.loads((out / "diagnosis-500.json").read_text())["peers"]["source"] == "topology"


def test_analyze_missing_dir(tmp_path: Path) -> None:
    res = CliRunner().invoke(analyze_cmd, [str(tmp_path / "nope")])
    assert res.exit_code == 2
    assert "no such report directory" in res.output and len(res.output.strip().splitlines()) == 1
    res = CliRunner().invoke(analyze_cmd, [str(tmp_path)])
    assert res.exit_code == 2 and "no captures" in res.output


def test_analyze_corrupt_summary_names_rank(tmp_path: Path) -> None:
    out = _synth(tmp_path, "--ranks", "16", "--fault", "compute", "--culprit", "2")
    path = out / "captures" / "500.msgpack"
    doc = msgpack.unpackb(path.read_bytes(), raw=False)
    doc["summaries"][11] = b"not msgpack at all \xc1"
    path.write_bytes(summary.encode_capture(step=500, trigger="slow_step", world_size=16, ranks=doc["ranks"],
                                            summaries=doc["summaries"], missing=[]))
    res = CliRunner().invoke(analyze_cmd, [str(out)])
    assert res.exit_code == 1
    assert "COMPUTE: rank 2" in res.stdout
    err = [ln for ln in res.stderr.splitlines() if ln]
    assert len(err) == 1 and "rank 11" in err[0] and "500.msgpack" in err[0]
    assert json.loads((out / "report.json").read_text())["captures"][1]["errors"]


def test_analyze_corrupt_capture_file(tmp_path: Path) -> None:
    out = _synth(tmp_path, "--ranks", "8", "--fault", "none")
    (out / "captures" / "300.msgpack").write_bytes(b"\x00garbage")
    (out / "captures" / "400.msgpack").write_bytes(msgpack.packb({"schema": "foreign/1"}))
    res = CliRunner().invoke(analyze_cmd, [str(out)])
    assert res.exit_code == 1
    assert "healthy" in res.stdout
    assert "300.msgpack" in res.stderr and "400.msgpack" in res.stderr and "foreign/1" in res.stderr


def test_show_errors(tmp_path: Path) -> None:
    res = CliRunner().invoke(show_cmd, [str(tmp_path)])
    assert res.exit_code == 2 and "no report.json" in res.output
    (tmp_path / "report.json").write_text("{not json")
    res = CliRunner().invoke(show_cmd, [str(tmp_path)])
    assert res.exit_code == 1 and "unreadable" in res.output


def test_synth_rejects_bad_culprit(tmp_path: Path) -> None:
    res = CliRunner().invoke(synth_cmd, ["--ranks", "4", "--culprit", "9", "--out", str(tmp_path / "x")])
    assert res.exit_code == 2 and "culprit 9" in res.output


def test_analyze_real_report_dir(tmp_path: Path) -> None:
    """A report dir written by a real eroica-run (tests/data/engine/e2e-compute)."""
    import shutil
    src = Path(__file__).parent / "data" / "engine" / "e2e-compute"
    out = tmp_path / "e2e"
    shutil.copytree(src, out)
    res = CliRunner().invoke(analyze_cmd, [str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "report.json").read_text())
    assert [(f["rank"], f["category"], f["function"]) for f in doc["findings"]] == [(2, "compute", "aten::matmul")]
    assert sorted(doc["findings"][0]["victims"]) == [0, 1, 3]
    d44 = json.loads((out / "diagnosis-44.json").read_text())
    assert any("gc/io phases larger than the step" in n and "rank 2" in n for n in d44["notes"])
    assert doc["steps"] == 90 and "<polyline" in (out / "report.html").read_text()


def test_a_large_capture_is_mapped_and_diagnosed_as_when_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`eroica analyze` maps capture files from MAP_FROM_BYTES on instead of copying them (a
    100,000-rank file is 1.15 GB); the engine reads the mapping exactly as it reads bytes."""
    src = Path(__file__).parent / "data" / "engine" / "e2e-compute"
    read, mapped = tmp_path / "read", tmp_path / "mapped"
    shutil.copytree(src, read)
    shutil.copytree(src, mapped)
    assert CliRunner().invoke(analyze_cmd, [str(read)]).exit_code == 0
    got: list[object] = []
    real = reportdir.read_capture

    def spy(path, limit=reportdir.MAX_CAPTURE_BYTES, **kw):  # type: ignore[no-untyped-def]
        got.append(real(path, limit, **kw))
        return got[-1]

    monkeypatch.setattr(reportdir, "MAP_FROM_BYTES", 1)
    monkeypatch.setattr("eroica_launch.offline.read_capture", spy)
    res = CliRunner().invoke(analyze_cmd, [str(mapped)])
    assert res.exit_code == 0, res.output
    assert got and all(isinstance(d, mmap.mmap) for d in got)
    names = sorted(p.name for p in read.glob("diagnosis-*.json"))
    assert names and names == sorted(p.name for p in mapped.glob("diagnosis-*.json"))

    def same(doc: dict) -> dict:
        return {k: v for k, v in doc.items() if k not in ("engine_s", "generated_at")}
    for name in [*names, "report.json"]:
        a, b = (json.loads((d / name).read_text()) for d in (read, mapped))
        assert same(a) == same(b), name
    # the limits and refusals stay those of a read: one line naming the file
    cap = next((mapped / "captures").glob("*.msgpack"))
    for bad, why in ((lambda: reportdir.read_capture(cap, 10, map_from=1), "over the 10-byte limit"),
                     (lambda: reportdir.read_capture(mapped / "captures", map_from=1), "not a regular file")):
        try:
            bad()
        except reportdir.InputError as exc:
            assert why in str(exc) and str(cap.parent) in str(exc)
        else:
            raise AssertionError(why)
    empty = tmp_path / "empty.msgpack"
    empty.write_bytes(b"")
    assert reportdir.read_capture(empty, map_from=0) == b""


def test_show_and_analyze_print_the_job_summary_rank_0_printed(tmp_path: Path) -> None:
    """A real 4-rank eroica-run dir (tests/data/runtime/one-off-stall: rank 3 worked alone 2 s at step
    70, two emulated nodes): `eroica show` and `eroica analyze` print the job summary block the job's
    log had (step times, captures, eroica's cost, the longest step and who held it), before the job
    report; a report with no job-end statistics (partial) or hand-edited junk in them prints none
    and still shows the job report."""
    src = Path(__file__).parent / "data" / "runtime" / "one-off-stall"
    out = tmp_path / "job"
    shutil.copytree(src, out)
    shown = CliRunner().invoke(show_cmd, [str(out)])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert lines[0].startswith("eroica: job summary: 120 steps on 4 ranks"), shown.output
    step = next(i for i, line in enumerate(lines) if line == "  longest step:")
    assert lines[step + 1].startswith("    step 70 took 2.01 s") and "rank 3 on vm" in lines[step + 1], shown.output
    # its 2 s stall cost 63% of the 120-step job: not "healthy"
    assert lines[-1].startswith("eroica: job report: no findings over 2 capture(s), but its longest steps held every "
                                "rank 2.0 s, 63% of the job's time"), lines[-1]
    analysed = CliRunner().invoke(analyze_cmd, [str(out)])
    assert analysed.exit_code == 0, analysed.output
    assert "\n".join(lines[:-1]) in analysed.output, analysed.output

    doc = json.loads((out / "report.json").read_text())
    for job in ({"partial": True}, {**doc["job"], "per_rank": "junk", "long_steps": [7], "captures_taken": 3}):
        (out / "report.json").write_text(json.dumps({**doc, "job": job}))
        res = CliRunner().invoke(show_cmd, [str(out)])
        assert res.exit_code == 0 and "eroica: job report:" in res.output, res.output
        assert ("job summary" in res.output) == ("steps" in job), res.output
