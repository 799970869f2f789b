"""eroica synth imitates real summaries: its numbers have the precision summary.build gives them.

Why it matters: a node leader's block (engine/blockcodec.py) ships 4-place decimals as small
integers, so a synthetic job carrying every float's 16 digits would overstate the bytes a real job
sends to rank 0 (issue 15's gather-tree model is measured on synthetic jobs).
"""

from __future__ import annotations

from pathlib import Path

import msgpack

from eroica_runtime import summary, synth


def test_synthetic_numbers_have_the_precision_of_built_summaries(tmp_path: Path) -> None:
    synth.generate(tmp_path, ranks=16, fault="compute", culprit=3, functions=40, seed=1)
    doc = msgpack.unpackb((tmp_path / "captures" / "500.msgpack").read_bytes(), raw=False)
    for blob in doc["summaries"]:
        s = summary.decode(blob)
        built = [s["phases"][p] for p in s["phases"]] + [x["ms"] for x in s["steps"]] + \
            [f[k] for f in s["functions"] for k in ("count", "ms", "mean", "p50", "p90", "p99", "max", "std")] + \
            [s["gc"]["count"], s["gc"]["ms"]]
        assert all(x == round(x, 4) for x in built)
        host = s["telemetry"]["end"]["host"]
        assert host["cpu_s"] == round(host["cpu_s"], 2)
        assert host["ctx_invol"] == int(host["ctx_invol"]) and host["tcp_retrans"] == int(host["tcp_retrans"])


def test_rounded_synthetic_job_still_plants_its_fault(tmp_path: Path) -> None:
    from eroica_runtime.pipeline import Pipeline
    plan = synth.generate(tmp_path, ranks=64, fault="compute", culprit=21, functions=60, seed=4)
    pipe = Pipeline()
    for step in (synth.BASELINE_STEP, synth.FAULT_STEP):
        res = pipe.analyse((tmp_path / "captures" / f"{step}.msgpack").read_bytes(), origin="x")
    f = res.diagnosis.findings[0]
    assert (f.rank, f.category, f.function) == (plan.culprit, plan.category, plan.function)
