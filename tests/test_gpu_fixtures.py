"""Windows a real GPU recorded, built and diagnosed by the code of the day on a machine without one
(issue 11 item 6).

The fixtures are what ``scripts/gpu-session`` brought back from the GPU machine (one H200, 4 ranks
sharing it), unpacked by ``scripts/gpu-fixtures`` into tests/data/gpu/: gpu-check's two ranks (summary,
raw profiler events, metadata) and, per ``scripts/gpu-bench`` case, every rank's summary of each capture
as the live gather wrote it and ranks 0-1's raw events of the last capture. Their record (date, machine,
command, what the bench printed there) is tests/data/gpu/gpu-bench.md and gpu-check.txt.

Three promises, with the same checks the GPU scripts make there (imported from them, one definition):
the raw events rebuild into summaries with the device evidence gpu-check asks for; each case's captures,
diagnosed again, give the verdict gpu-bench expects; and so do they with ranks 0-1's summaries rebuilt
from their raw events by today's builder. Until a GPU session has recorded them, the tests are skipped
with that reason. ``EROICA_GPU_FIXTURES=DIR`` runs them on another recording (a dry run's, on CPU).
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import os
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import msgpack
import pytest
from click.testing import CliRunner

from eroica_launch.offline import analyze_cmd
from eroica_runtime import summary
from eroica_runtime.summary import rawevents
from eroica_runtime.summary.schema import encode_capture

ROOT = Path(__file__).resolve().parent.parent
GPU = Path(os.environ.get("EROICA_GPU_FIXTURES") or ROOT / "tests" / "data" / "gpu")
pytestmark = pytest.mark.skipif(
    not GPU.is_dir(), reason=f"no GPU fixtures in {GPU} yet (issue 11: scripts/gpu-session on the GPU machine, "
                             "then scripts/gpu-fixtures)")


def _script(name: str) -> ModuleType:
    loader = importlib.machinery.SourceFileLoader(name.replace("-", "_"), str(ROOT / "scripts" / name))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


CHECK, BENCH = _script("gpu-check"), _script("gpu-bench")
# a dry run's recording (scripts/gpu-session with DRY=1) says so in its bench output
SMOKE = GPU.is_dir() and "CPU smoke" in ((GPU / "gpu-bench.md").read_text() if (GPU / "gpu-bench.md").exists() else "")
EXPECTED = BENCH.cases(argparse.Namespace(start=0, small=0, large=0, pageable_mb=0, data_ms=0, cpu_smoke=SMOKE))
CASES = sorted(p.name for p in GPU.glob("*") if (p / "captures").is_dir()) if GPU.is_dir() else []


def _rebuilt(sent: dict[str, Any], raw: Path) -> dict[str, Any]:
    return rawevents.rebuild(sent, rawevents.load(raw.read_bytes(), origin=str(raw))[1])[0]


def _top(report_dir: Path) -> dict[str, Any] | None:
    return (json.loads((report_dir / "report.json").read_text()).get("findings") or [None])[0]


def _expected(case: str) -> tuple[int, tuple[str, ...]] | None:
    """What gpu-bench expects of ``case`` (a recording of a case gpu-bench no longer has is named)."""
    assert case in EXPECTED, f"{GPU / case}: no gpu-bench case of that name (cases now: {', '.join(EXPECTED)})"
    return EXPECTED[case][1]


def _analyse(report_dir: Path) -> dict[str, Any] | None:
    res = CliRunner().invoke(analyze_cmd, [str(report_dir)])
    assert res.exit_code == 0, res.output
    return _top(report_dir)


def test_gpu_checks_windows_rebuild_into_summaries_with_the_device_evidence() -> None:
    """Kernels with the op that launched them and their phase, collectives, copies by direction and host
    memory kind, device phases, NVML, within the size budget: what gpu-check asked of the live summaries,
    asked of the ones today's builder makes from the same raw events."""
    ranks = sorted(GPU.glob("gpu-check/rank*.raw.msgpack"))
    assert ranks, f"no gpu-check windows in {GPU}"
    for raw in ranks:
        stem = raw.name.removesuffix(".raw.msgpack")
        sent = summary.decode((raw.parent / f"{stem}.msgpack").read_bytes(), origin=stem)
        meta = json.loads((raw.parent / f"{stem}.json").read_text())
        again = _rebuilt(sent, raw)
        meta = {**meta, "bytes": len(summary.encode(again))}
        assert CHECK.summary_problems(again, meta, k=int(sent["capture"]["k"]), smoke=SMOKE) == [], stem


@pytest.mark.parametrize("case", CASES)
def test_each_cases_captures_are_diagnosed_as_on_the_gpu(case: str, tmp_path: Path) -> None:
    """``eroica analyze`` over the case's captures (the live path's Pipeline): the verdict gpu-bench
    expects of the case (the +60% straggler's rank, compute, naming a kernel; pageable copies, transfer;
    ...; the healthy job, no finding)."""
    report_dir = shutil.copytree(GPU / case, tmp_path / case, ignore=shutil.ignore_patterns("raw"))
    top = _analyse(report_dir)
    ok, want = BENCH.judge(case, _expected(case), top, cpu_smoke=SMOKE)
    assert ok, (want, top and top.get("title"))


@pytest.mark.parametrize("case", CASES)
def test_summaries_rebuilt_from_the_raw_events_give_the_same_verdict(case: str, tmp_path: Path) -> None:
    """Ranks 0-1's summaries of the case's last capture (rank 1 is every case's faulty rank) replaced
    by what today's builder makes of their raw events: still within budget, and still the verdict."""
    report_dir = shutil.copytree(GPU / case, tmp_path / case)
    raws = sorted((report_dir / "raw").glob("*/rank*.msgpack"))
    assert raws, f"no raw events kept for {case}"
    step = int(raws[0].parent.name)
    path = report_dir / "captures" / f"{step}.msgpack"
    doc = msgpack.unpackb(path.read_bytes(), raw=False, strict_map_key=False)
    blobs = list(doc["summaries"])
    for raw in raws:
        rank = int(raw.stem.removeprefix("rank"))
        i = doc["ranks"].index(rank)
        again = summary.encode(_rebuilt(summary.decode(blobs[i], origin=f"rank {rank}"), raw))
        assert len(again) <= summary.SIZE_BUDGET, (rank, len(again))
        blobs[i] = again
    path.write_bytes(encode_capture(step=doc["step"], trigger=doc["trigger"], world_size=doc["world_size"],
                                    ranks=doc["ranks"], summaries=blobs, missing=doc["missing"],
                                    extra=doc.get("extra")))
    shutil.rmtree(report_dir / "raw")
    top = _analyse(report_dir)
    ok, want = BENCH.judge(case, _expected(case), top, cpu_smoke=SMOKE)
    assert ok, (want, top and top.get("title"))
