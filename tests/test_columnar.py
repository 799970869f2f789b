"""Columnar decoding of captures (engine/ingest.py, summary/layout.py, engine/table.py TableBuilder).

The promise under test: reading a capture straight into the engine's columns gives exactly what the
plain path gives (``summary.decode_capture`` -> ``build_table`` -> ``diagnose``): the same Table to
the bit, the same rejected-summary lines in the same order, the same Diagnosis; and it holds for
the recorded captures under tests/data/engine, for synthetic jobs (read as layout blocks), for real
summaries whose layout is shared by many ranks, and for hostile values written into a layout.
"""

from __future__ import annotations

import math
import os
import struct
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eroica_runtime import summary, synth
from eroica_runtime.engine import Table, TableBuilder, build_table, diagnose, ingest
from eroica_runtime.engine.peers import _unique_rows
from eroica_runtime.engine.table import _sched_row
from eroica_runtime.pipeline import Pipeline
from eroica_runtime.summary.layout import Layout

DATA = Path(__file__).parent / "data" / "engine"
JOBS = sorted(p for p in DATA.iterdir() if (p / "captures").is_dir())


def _recorded() -> dict[str, bytes]:
    """Every recorded capture under tests/data/engine, and one capture per real-4rank scenario
    (recorded there as one summary file per rank)."""
    out = {}
    for p in sorted(DATA.rglob("*.msgpack")):
        doc = msgpack.unpackb(p.read_bytes(), raw=False, strict_map_key=False)
        if isinstance(doc, dict) and doc.get("schema") == summary.CAPTURE_SCHEMA:
            out[str(p.relative_to(DATA))] = p.read_bytes()
    for scenario in sorted({p.name.split(".")[0] for p in (DATA / "real-4rank").glob("*.rank*.msgpack")}):
        blobs = [(DATA / "real-4rank" / f"{scenario}.rank{r}.msgpack").read_bytes() for r in range(4)]
        step = summary.decode(blobs[0])["capture"]["step"]
        out[f"real-4rank/{scenario}"] = summary.encode_capture(step=step, trigger="spike", world_size=4,
                                                               ranks=[0, 1, 2, 3], summaries=blobs, missing=[])
    return out


RECORDED = _recorded()


def assert_tables_equal(a: Table, b: Table) -> None:
    """Every field equal; arrays in shape, dtype, value, NaN place and sign of zero."""
    for name in a.__dataclass_fields__:
        if name == "_fn_index":
            continue
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, dict) and x and isinstance(next(iter(x.values())), np.ndarray):
            assert x.keys() == y.keys(), name
            for k in x:
                _arrays_equal(x[k], y[k], f"{name}[{k}]")
        elif isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            assert x is not None and y is not None, name
            _arrays_equal(x, y, name)
        else:
            assert x == y, (name, x, y)


def _arrays_equal(x: np.ndarray, y: np.ndarray, name: str) -> None:
    assert x.shape == y.shape and x.dtype == y.dtype, (name, x.shape, y.shape, x.dtype, y.dtype)
    assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), name
    if x.dtype.kind == "f":
        assert np.array_equal(np.signbit(x), np.signbit(y)), name


def plain(data: bytes, origin: str = "capture") -> tuple[dict[str, Any], Table, list[str]]:
    meta, good, errors = summary.decode_capture(data, origin=origin)
    return meta, build_table(good), errors


def assert_same_as_plain(data: bytes, origin: str = "capture") -> ingest.Ingested:
    """read_capture and the plain path agree on this capture file (or raise the same error)."""
    try:
        meta, table, errors = plain(data, origin)
    except summary.SummaryError as exc:
        with pytest.raises(summary.SummaryError) as got:
            ingest.read_capture(data, origin=origin)
        assert str(got.value) == str(exc)
        return None  # type: ignore[return-value]
    ing = ingest.read_capture(data, origin=origin)
    assert ing.meta == meta
    assert ing.errors == errors
    assert_tables_equal(ing.table(), table)
    return ing


def _jsonable(d: Any) -> dict[str, Any]:
    doc = d.to_json()
    doc.pop("engine_s")
    return doc


def plain_pipeline(captures: list[bytes], world_size: int | None = None) -> list[dict[str, Any]]:
    """The analysis as it was before columns: decode_capture's dicts, build_table, the same policy."""
    baseline = None
    out = []
    for data in captures:
        meta, good, errors = summary.decode_capture(data, origin="x")
        table = build_table(good)
        extra = meta.get("extra") or {}
        probe = extra.get("link_probe") if isinstance(extra.get("link_probe"), dict) else None
        d = diagnose(table, step=int(meta["step"]), trigger=str(meta["trigger"]),
                     world_size=world_size or int(meta["world_size"]), missing=meta["missing"],
                     baseline=baseline, link_probe=probe, errors=errors)
        if meta["trigger"] == "baseline":
            flagged = {f.rank for f in d.findings if f.rank is not None}
            kept = [s for s in good if s["rank"] not in flagged]
            if len(kept) >= max(1, len(good) // 2):
                baseline = table if len(kept) == len(good) else build_table(kept)
        out.append(_jsonable(d))
    return out


def _capture_order(folder: Path) -> list[bytes]:
    return [p.read_bytes() for p in sorted(folder.glob("*.msgpack"), key=lambda p: int(p.stem))]


# ---- the recorded captures ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(RECORDED))
def test_recorded_capture_gives_the_plain_paths_table_and_errors(name: str) -> None:
    assert assert_same_as_plain(RECORDED[name], origin=name) is not None


@pytest.mark.parametrize("job", JOBS, ids=lambda p: p.name)
def test_recorded_job_gives_the_plain_paths_diagnoses(job: Path) -> None:
    captures = _capture_order(job / "captures")
    pipe = Pipeline()
    got = [_jsonable(pipe.analyse(c, origin="x").diagnosis) for c in captures]
    assert got == plain_pipeline(captures)
    assert any(d["findings"] for d in got)      # the recorded fault is found, as before


def _clone(blob: bytes, rng: np.random.Generator, copies: int) -> list[bytes]:
    """Copies of a real summary with its floats scaled at random: the same layout, other numbers."""
    lay = Layout.derive(blob, summary.decode(blob))
    out = []
    for _ in range(copies):
        arr = bytearray(blob)
        for s in lay.slots:
            if s.dtype == ">f8" and rng.random() < 0.7:
                v = struct.unpack_from(">d", arr, s.offset)[0] * rng.uniform(0.5, 1.5)
                struct.pack_into(">d", arr, s.offset, v)
        out.append(bytes(arr))
    return out


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_real_summaries_sharing_a_layout_are_read_as_blocks_bit_for_bit(name: str) -> None:
    """Real summaries (history, step-clock fields, telemetry, groups) cloned 12 times each with other
    numbers, shuffled: most go through layout blocks, duplicates keep the first in capture order."""
    doc = msgpack.unpackb(RECORDED[name], raw=False, strict_map_key=False)
    rng = np.random.default_rng(7)
    blobs, ranks = [], []
    for blob in doc["summaries"]:
        rank = summary.decode(blob)["rank"]
        for b in _clone(blob, rng, 12):
            blobs.append(b)
            ranks.append(rank)
    order = rng.permutation(len(blobs))
    data = summary.encode_capture(step=doc["step"], trigger=doc["trigger"], world_size=doc["world_size"],
                                  ranks=[ranks[i] for i in order], summaries=[blobs[i] for i in order], missing=[])
    ing = assert_same_as_plain(data)
    assert ing.fast >= len(blobs) - 2 * len(doc["summaries"])
    assert not ing.errors
    assert len(ing.table().errors) == len(blobs) - len(doc["summaries"])   # duplicates, named


# ---- synthetic jobs -------------------------------------------------------------------------------------

@pytest.mark.parametrize("fault,stages", [("compute", 1), ("gc", 2), ("communication", 1), ("regression", 4)])
def test_synthetic_job_is_read_as_blocks_and_diagnosed_as_the_plain_path(tmp_path: Path, fault: str,
                                                                           stages: int) -> None:
    plan = synth.generate(tmp_path, ranks=800, fault=fault, functions=120, seed=5, stages=stages)
    captures = _capture_order(tmp_path / "captures")
    for data in captures:
        ing = assert_same_as_plain(data)
        assert ing.fast >= 800 - 2 * stages and ing.layouts <= 2 * stages
    pipe = Pipeline()
    results = [pipe.analyse(c, origin="x") for c in captures]
    got = [_jsonable(r.diagnosis) for r in results]
    assert got == plain_pipeline(captures)
    last = results[-1].diagnosis
    if plan.culprit is not None and fault != "communication":
        assert last.findings[0].rank == plan.culprit
        # drill-down: the raw summaries of the ranks the findings name, not every rank's
        assert set(results[-1].summaries) == {plan.culprit}
        blob_rank = summary.decode_capture(captures[-1])[1][plan.culprit]
        assert results[-1].summaries[plan.culprit] == blob_rank
    assert last.findings and last.findings[0].category == plan.category


def _synth_blobs(tmp_path: Path, ranks: int = 300, **kw: Any) -> tuple[dict[str, Any], list[bytes]]:
    synth.generate(tmp_path, ranks=ranks, fault="compute", culprit=5, functions=80, seed=2, **kw)
    doc = msgpack.unpackb((tmp_path / "captures" / "500.msgpack").read_bytes(), raw=False)
    return doc, list(doc["summaries"])


def _recapture(doc: dict[str, Any], blobs: list[bytes], ranks: list[Any] | None = None) -> bytes:
    """A capture file of ``blobs`` (``ranks``: what the file says each came from, None for nothing)."""
    return _pack({"schema": summary.CAPTURE_SCHEMA, "step": doc["step"], "trigger": doc["trigger"],
                  "world_size": doc["world_size"], "missing": [],
                  "ranks": ranks if ranks is not None else doc["ranks"], "summaries": blobs})


def test_bad_summaries_inside_a_block_are_rejected_alone_and_named(tmp_path: Path) -> None:
    doc, blobs = _synth_blobs(tmp_path)
    lay = Layout.derive(blobs[0], summary.decode(blobs[0]))
    slot = {s.path: s for s in lay.slots}

    def poke(i: int, path: tuple[Any, ...], raw: bytes | int) -> None:
        s = slot[path]
        raw = raw.to_bytes(s.width, "big") if isinstance(raw, int) else raw
        assert len(raw) == s.width
        arr = bytearray(blobs[i])
        arr[s.offset:s.offset + s.width] = raw
        blobs[i] = bytes(arr)

    poke(17, ("functions", 3, "ms"), struct.pack(">d", math.nan))
    poke(18, ("phases", "step"), struct.pack(">d", -1.0))
    poke(19, ("world_size",), 19)                               # rank 19 of a 19-rank world
    poke(20, ("steps", 2, "ms"), struct.pack(">d", 1e7 * 1.0001))
    poke(21, ("host",), b"node\xff0002")                        # not UTF-8: not msgpack at all
    poke(22, ("host",), b"node\x1b0002")                        # valid, but only the plain path reads it
    blobs[23] = blobs[23][:-5]
    ranks = list(doc["ranks"])
    ranks[24] = 25                                               # the file says it came from rank 25
    ing = assert_same_as_plain(_recapture(doc, blobs, ranks))
    named = [e.split(":")[0] for e in ing.errors]
    # named as the capture file names them (entry 24 says rank 25, and "claims to be rank 24")
    assert named == [f"summary from rank {r}" for r in (17, 18, 19, 20, 21, 23, 25)]
    assert ing.errors[-1].endswith("claims to be rank 24")
    table = ing.table()
    row = int(table.rows_of([22])[0])
    assert table.hosts[table.host_idx[row]] == "node\x1b0002"
    assert table.n == len(blobs) - 7


def test_baseline_without_its_culprits_is_the_table_of_the_kept_summaries(tmp_path: Path) -> None:
    doc, blobs = _synth_blobs(tmp_path)
    blobs = blobs + blobs[:10]                      # duplicates too
    data = _recapture(doc, blobs, list(doc["ranks"]) + list(doc["ranks"][:10]))
    ing = ingest.read_capture(data)
    _, good, _ = summary.decode_capture(data)
    drop = {5, 7, 250}
    assert_tables_equal(ing.table(exclude=drop), build_table(s for s in good if s["rank"] not in drop))
    assert_tables_equal(ing.table(), build_table(good))          # finish() again: unchanged
    assert sorted(ing.good_ranks.tolist()) == sorted(s["rank"] for s in good)


def test_one_at_a_time_and_block_rows_interleave_in_capture_order(tmp_path: Path) -> None:
    """Rows of another layout (a summary re-encoded with other types) between block rows: hosts,
    functions and duplicates are still numbered as one pass in capture order would."""
    doc, blobs = _synth_blobs(tmp_path, ranks=64, stages=2)
    for i in (0, 9, 33, 40):
        s = summary.decode(blobs[i])
        s["host"] = f"odd-{i}"                       # a host of another length: another layout
        s["functions"] = list(reversed(s["functions"]))
        blobs[i] = summary.encode(s)
    blobs.insert(12, blobs[40])                      # rank 40 twice, the first copy the odd one
    ranks = list(doc["ranks"])
    ranks.insert(12, 40)
    assert_same_as_plain(_recapture(doc, blobs, ranks))


# ---- hostile values written into a layout ----------------------------------------------------------

# a real summary: history with stops, step-clock fields, telemetry
_REAL = msgpack.unpackb((DATA / "frozen-rank1.msgpack").read_bytes(), raw=False)["summaries"][1]
_REAL_LAYOUT = Layout.derive(_REAL, summary.decode(_REAL))
_SYNTH: list[bytes] = []


def _synth_source() -> bytes:
    if not _SYNTH:
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            synth.generate(d, ranks=40, fault="none", functions=30, seed=1, stages=2)
            doc = msgpack.unpackb((Path(d) / "captures" / "500.msgpack").read_bytes(), raw=False)
            _SYNTH.append(doc["summaries"][3])
    return _SYNTH[0]


HOSTILE_F = [math.nan, math.inf, -math.inf, -1.0, -0.0, 0.0, 1e7, 1e7 * (1 + 1e-15), 1e9, 1e10, 5e-324, 2.0**53]


def _payload(data: st.DataObject, s: Any) -> bytes:
    if s.dtype == ">f8":
        return struct.pack(">d", data.draw(st.one_of(st.sampled_from(HOSTILE_F), st.floats()), label="f8"))
    if s.dtype == "str":
        return data.draw(st.binary(min_size=s.width, max_size=s.width), label="str")
    if s.fix:
        return bytes([data.draw(st.integers(0, 255), label="fixint")])
    return data.draw(st.sampled_from([b"\x00" * s.width, b"\xff" * s.width, b"\x7f" + b"\xff" * (s.width - 1)])
                     | st.binary(min_size=s.width, max_size=s.width), label="int")


@settings(max_examples=int(os.environ.get("EROICA_FUZZ_EXAMPLES", "150")), deadline=None,
          suppress_health_check=list(HealthCheck))
@given(st.data())
def test_hostile_values_in_a_layout_get_validates_verdict(data: st.DataObject) -> None:
    """Any payload in any slot (NaN, inf, negative, out of range, a rank outside the world, a
    fixint turned into another type, a string not UTF-8): the columnar reader rejects exactly what
    ``validate`` rejects, with its message, and reads the rest as the plain path does."""
    base = data.draw(st.sampled_from(["real", "synth"]), label="source")
    blob = _REAL if base == "real" else _synth_source()
    lay = _REAL_LAYOUT if base == "real" else Layout.derive(blob, summary.decode(blob))
    blobs = []
    for _ in range(6):
        arr = bytearray(blob)
        for _ in range(data.draw(st.integers(0, 3), label="pokes")):
            s = data.draw(st.sampled_from(lay.slots), label="slot")
            arr[s.offset:s.offset + s.width] = _payload(data, s)
        blobs.append(bytes(arr))
    world = summary.decode(blob)["world_size"]
    ranks = data.draw(st.sampled_from([None, "decoded"]), label="ranks")
    doc = {"step": 5, "trigger": "spike", "world_size": world, "ranks": [None] * len(blobs)}
    if ranks == "decoded":
        doc["ranks"] = [summary.decode(blob)["rank"]] * len(blobs)
    assert_same_as_plain(_recapture(doc, blobs, doc["ranks"]))


# ---- odd capture files and the pieces ----------------------------------------------------------------

def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


@pytest.mark.parametrize("shape", ["str summaries", "summaries a map", "ranks short", "ranks junk", "trailing",
                                   "no summaries", "summaries twice", "int key", "empty", "bin8 and bin32"])
def test_odd_capture_files_get_the_plain_decoders_verdict(tmp_path: Path, shape: str) -> None:
    doc, blobs = _synth_blobs(tmp_path, ranks=12)
    base = {"schema": summary.CAPTURE_SCHEMA, "step": 500, "trigger": "spike", "world_size": 12, "missing": [],
            "ranks": list(range(12)), "summaries": blobs}
    if shape == "str summaries":
        data = _pack({**base, "summaries": [b.decode("latin-1") for b in blobs]})
    elif shape == "summaries a map":
        data = _pack({**base, "summaries": {"a": blobs[0]}})
    elif shape == "ranks short":
        data = _pack({**base, "ranks": [0, 1]})
    elif shape == "ranks junk":
        data = _pack({**base, "ranks": [None, True, -1, 2**64 - 1, "x", 5.0, 6, 7, 8, 9, 10, 11]})
    elif shape == "trailing":
        data = _pack(base) + b"\x00"
    elif shape == "no summaries":
        data = _pack({k: v for k, v in base.items() if k != "summaries"})
    elif shape == "summaries twice":
        p = msgpack.Packer(use_bin_type=True)
        data = p.pack_map_header(len(base) + 1) + b"".join(p.pack(k) + p.pack(v) for k, v in base.items()) \
            + p.pack("summaries") + p.pack(blobs[:3])
    elif shape == "int key":
        data = _pack({**base, 7: "x"})
    elif shape == "empty":
        data = _pack({**base, "summaries": [], "ranks": []})
    else:
        tiny = summary.encode({**summary.decode(blobs[0]), "functions": []})
        data = _pack({**base, "summaries": [tiny] + blobs[1:]})
        data = data.replace(b"\xc5" + struct.pack(">H", len(blobs[5])) + blobs[5],
                            b"\xc6" + struct.pack(">I", len(blobs[5])) + blobs[5])
    assert_same_as_plain(data)


def test_capture_offsets_found_for_runs_and_mixed_sizes() -> None:
    rng = np.random.default_rng(3)
    blobs = [bytes(rng.integers(0, 256, size=int(n), dtype=np.uint8))
             for n in [300] * 40 + [301, 70000, 5, 300, 300] + [299] * 100 + list(rng.integers(1, 400, 50))]
    data = _pack({"summaries": blobs, "z": 1})
    fields, (starts, lens) = ingest._outer(data)
    assert fields == {"summaries": None, "z": 1}
    assert [data[a:a + n] for a, n in zip(starts.tolist(), lens.tolist(), strict=True)] == blobs


def test_sched_block_matches_sched_row_per_summary() -> None:
    """The step-clock columns (window and history means, stops, stopped ms) of a block are
    ``_sched_row`` of each of its summaries."""
    base = summary.decode(msgpack.unpackb((DATA / "frozen-rank1.msgpack").read_bytes(), raw=False)["summaries"][1])
    rng = np.random.default_rng(11)
    blobs = []
    for r in range(40):
        s = dict(base)
        hist = dict(s["history"])
        n = len(hist["ms"])
        hist["ms"] = [float(x) for x in rng.uniform(10, 200, n).round(3)]
        hist["stops"] = [int(x) for x in (rng.random(n) < 0.3) * rng.integers(1, 3, n)]
        s["history"] = hist
        s["steps"] = [{**st_, "ms": float(rng.uniform(10, 200)), "stops": int(rng.integers(0, 2))}
                      for st_ in s["steps"]]
        s["rank"] = r
        s["world_size"] = 40
        blobs.append(summary.encode(s))
    data = summary.encode_capture(step=1, trigger="spike", world_size=40, ranks=list(range(40)), summaries=blobs,
                                  missing=[])
    ing = assert_same_as_plain(data)
    assert ing.fast > 0
    rows = [_sched_row(summary.decode(b)) for b in blobs]
    assert np.array_equal(ing.table().sched, np.asarray(rows), equal_nan=True)


def test_unique_rows_is_numpys_unique_along_rows() -> None:
    rng = np.random.default_rng(4)
    for trial in range(200):
        a = rng.integers(0, 3, size=(int(rng.integers(1, 200)), int(rng.integers(1, 5))))
        if trial % 3:
            a = a * rng.choice([0.1, 1.0, -1.0, 1e300])
        if trial % 4 == 0 and a.dtype.kind == "f":
            a[a == 0] = -0.0
        uniq, inv = np.unique(a, axis=0, return_inverse=True)
        got = _unique_rows(a)
        assert got is not None and got[0] == len(uniq) and np.array_equal(got[1], inv.reshape(-1))
    assert _unique_rows(np.array([[np.nan, 1.0]])) is None       # np.unique decides NaN rows


def test_builder_add_is_build_table() -> None:
    _, good, _ = summary.decode_capture((DATA / "healthy-4hosts.msgpack").read_bytes())
    b = TableBuilder()
    for i, s in reversed(list(enumerate(good))):     # any arrival order: capture positions decide
        b.add(s, index=i)
    assert_tables_equal(b.finish(), build_table(good))
