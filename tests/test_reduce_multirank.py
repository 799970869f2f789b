"""Leader-side reduction on real ranks: a 4-rank eroica-run job (real mpiexec, gloo DDP on CPU, two
emulated nodes of 2 via EROICA_NODE_SPLIT) with a real slow DataLoader on rank 3 (on the second node:
its columns reach rank 0 through the other leader's block), run with reduction forced on and forced
off. Issue 15's promise: the online analyst gives the same findings (culprit rank, category,
function) either way; with it on, the capture file holds two node blocks (eroica.capture/2),
`eroica analyze` reads it back to the same findings, and the culprit's raw summary was forwarded for
the drill-down. Many ranks on 2 cores are slow: few steps, a generous timeout, detectors off and one
manual capture after the fault starts, so the run is deterministic in what it captures. The fault is
a sleep, not extra compute: the ranks share 2 cores here, so one rank's extra compute slows its peers'
compute too and no rank stands out (a first run at 16 ranks with 1000 extra matmuls on rank 11 was
judged healthy, with reduction on). The job had 16 ranks (two nodes of 8), then 8 (two of 4: 41-56 s
of the suite's 15 minutes, most of it starting torch on every rank); the two gather paths are the same
code at 4 ranks, two leaders either way, and the reduced and raw tables agree to the bit at any size
(tests/test_blocks.py).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import msgpack
import pytest
from conftest import BIN, DATA, eroica_run, explain

from eroica_runtime.engine import ingest
from eroica_runtime.pipeline import Pipeline, named_ranks

pytestmark = pytest.mark.multirank
TRAIN = DATA / "runtime" / "train.py"
WORLD, NODE = 4, 2
CULPRIT = 3


def _job(out: Path, reduce: str) -> dict[str, Any]:
    # 10 ms a sample, 160 ms a step: many ranks on 2 cores spread their own work widely (at 16 ranks a
    # robust sigma of 17 ms, and a culprit among 16 peers needs z >= 4.33: with the default 4 ms, 64 ms a
    # step, a CI run saw the dataloader excess at 72 ms, z 4.32, and no finding; at 10 ms, z 18-29). This
    # test is about the two gather paths agreeing, not the smallest fault found at 4 ranks a core.
    proc = eroica_run("--nproc-per-node", str(WORLD), "--report-dir", out, "--leader-reduce", reduce,
                      "--warmup-steps", "6", "--capture-at-steps", "22", "--cooldown-steps", "0",
                      "--spike-ratio", "100", "--drift-pct", "0", "--lost-pct", "0", TRAIN,
                      env={"EROICA_NODE_SPLIT": str(NODE), "FAULT": "data", "FAULT_RANK": str(CULPRIT),
                           "FAULT_FROM": "12", "STEPS": "30", "DATA_SLEEP_S": "0.010"}, timeout=1200)
    assert proc.returncode == 0, explain(proc)
    report = json.loads((out / "report.json").read_text())
    assert report["world_size"] == WORLD and report["findings"], explain(proc)
    report["_stderr"] = proc.stderr
    return report


def _top(report: dict[str, Any]) -> tuple[Any, ...]:
    f = report["findings"][0]
    return f["rank"], f["category"], f["function"]


def _schema(path: Path) -> str:
    return str(msgpack.unpackb(path.read_bytes(), raw=False, strict_map_key=False)["schema"])


def test_two_nodes_same_findings_with_and_without_leader_reduction(tmp_path: Path) -> None:
    on, off = _job(tmp_path / "on", "on"), _job(tmp_path / "off", "off")
    assert _top(on) == _top(off), (json.dumps(on["findings"][0], indent=1), json.dumps(off["findings"][0], indent=1))
    assert _top(on)[:2] == (CULPRIT, "dataloader"), json.dumps(on["findings"][0], indent=1)
    # every other rank a victim, on both nodes, through either path (at 16 ranks on 2 cores, a rank
    # preempted in its optimizer step could wait just under the victim bar in one of two jobs; at 4 it
    # waits for the culprit's 160 ms a step like the rest)
    others = set(range(WORLD)) - {CULPRIT}
    v_on, v_off = set(on["findings"][0]["victims"]), set(off["findings"][0]["victims"])
    assert v_on == v_off == others, (sorted(v_on), sorted(v_off))

    caps_on = sorted((tmp_path / "on" / "captures").glob("*.msgpack"))
    caps_off = sorted((tmp_path / "off" / "captures").glob("*.msgpack"))
    assert caps_on and {_schema(p) for p in caps_on} == {"eroica.capture/2"}
    assert caps_off and {_schema(p) for p in caps_off} == {"eroica.capture/1"}
    # the faulty capture: two node blocks, every rank in the table, the culprit's raw summary kept
    step = on["findings"][0]["captures"][-1]
    path = tmp_path / "on" / "captures" / f"{step}.msgpack"
    doc = msgpack.unpackb(path.read_bytes(), raw=False, strict_map_key=False)
    assert doc["leaders"] == [0, NODE], doc["leaders"]
    cap = ingest.read_capture(path.read_bytes())
    assert not cap.errors and cap.meta["missing"] == [] and cap.table().rank.tolist() == list(range(WORLD))
    result = Pipeline(world_size=WORLD).analyse(path.read_bytes(), origin=str(path))
    assert CULPRIT in named_ranks(result.diagnosis) and CULPRIT in result.summaries
    assert result.summaries[CULPRIT]["rank"] == CULPRIT

    # offline over the blocks: the same findings as the live analyst printed
    proc = subprocess.run([str(BIN / "eroica"), "analyze", str(tmp_path / "on")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, explain(proc)
    offline = json.loads((tmp_path / "on" / "report.json").read_text())
    assert _top(offline) == _top(on)
