"""One rank's bad summary is rejected with that rank named; the capture is analysed with the others.

Starts from a capture written by a real 4-rank eroica-run (tests/data/engine/e2e-compute) and spoils
rank 1's summary in each way a wire or a foreign build can.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import msgpack
import pytest
from click.testing import CliRunner

from eroica_launch.offline import analyze_cmd
from eroica_runtime import summary

SRC = Path(__file__).parent / "data" / "engine" / "e2e-compute"


def _spoil(blob: bytes, how: str) -> bytes:
    if how == "corrupt":
        return b"\xc1" + blob[1:]
    if how == "truncated":
        return blob[: len(blob) // 2]
    if how == "oversized":
        doc = msgpack.unpackb(blob, raw=False)
        doc["functions"] = doc["functions"] * 400
        return msgpack.packb(doc, use_bin_type=True)
    if how == "foreign":
        doc = msgpack.unpackb(blob, raw=False)
        doc["schema"] = "eroica.summary/9"
        return msgpack.packb(doc, use_bin_type=True)
    raise AssertionError(how)


@pytest.mark.parametrize("how,says", [("corrupt", "not valid msgpack"), ("truncated", "not valid msgpack"),
                                      ("oversized", "exceeds"), ("foreign", "eroica.summary/9")])
def test_bad_summary_from_one_rank(tmp_path: Path, how: str, says: str) -> None:
    out = tmp_path / "rep"
    shutil.copytree(SRC, out)
    path = max((out / "captures").glob("*.msgpack"), key=lambda p: int(p.stem))
    doc = msgpack.unpackb(path.read_bytes(), raw=False)
    i = doc["ranks"].index(1)
    doc["summaries"][i] = _spoil(doc["summaries"][i], how)
    path.write_bytes(summary.encode_capture(step=doc["step"], trigger=doc["trigger"], world_size=4,
                                            ranks=doc["ranks"], summaries=doc["summaries"], missing=[]))
    res = CliRunner().invoke(analyze_cmd, [str(out)])
    errors = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(errors) == 1 and "rank 1" in errors[0] and says in errors[0], res.stderr
    diag = json.loads((out / f"diagnosis-{path.stem}.json").read_text())
    assert diag["ranks_analysed"] == 3
    assert any("rank 1" in e for e in diag["errors"])
