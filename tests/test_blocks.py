"""Leader-side pre-reduction (engine/leader.py, blocks.py, blockcodec.py; ingest's capture/2 reader).

The promise under test: splitting a capture's ranks into nodes, reducing each node to a column block
at its "leader" and merging the blocks at "rank 0" gives the Table of the raw capture bit for bit,
the same rejected-summary lines in the same order, the same missing ranks and the same Diagnosis;
a damaged, foreign or misrouted block costs one line naming its leader and only its node's ranks
(then missing); the capture/2 file goes through `eroica analyze` to the same reports; the ranks a
finding names keep their raw summary for the drill-down when they stand out in their node.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from click.testing import CliRunner
from test_columnar import RECORDED, _capture_order, _jsonable, assert_tables_equal

from eroica_launch.offline import analyze_cmd
from eroica_runtime import summary, synth
from eroica_runtime.config import REDUCE_AUTO_RANKS, Config
from eroica_runtime.engine import blockcodec, blocks, build_table, ingest, leader
from eroica_runtime.pipeline import Pipeline
from eroica_runtime.summary.layout import Layout


def _doc(data: bytes) -> dict[str, Any]:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def node_blocks(data: bytes, node: int, *, blobs: dict[int, bytes] | None = None) -> dict[int, bytes]:
    """What the node leaders of a raw capture (ranks in nodes of ``node`` consecutive ranks) send."""
    doc = _doc(data)
    world = doc["world_size"]
    got = blobs if blobs is not None else dict(zip(doc["ranks"], doc["summaries"], strict=True))
    out = {}
    for first in range(0, world, node):
        members = range(first, min(world, first + node))
        mine = {r: got[r] for r in members if r in got}
        if not mine:
            continue                 # a node that sent nothing: its leader is silent
        out[min(mine)] = leader.reduce_node(step=doc["step"], trigger=doc["trigger"], world_size=world,
                                            leader=min(mine), blobs=mine, missing=[r for r in members if r not in got])
    return out


def reduced(data: bytes, node: int, **kw: Any) -> bytes:
    """The capture/2 file rank 0 writes for the raw capture ``data`` with nodes of ``node`` ranks."""
    doc = _doc(data)
    by_leader = node_blocks(data, node, **kw)
    return blocks.encode_capture(step=doc["step"], trigger=doc["trigger"], world_size=doc["world_size"],
                                 blocks=by_leader, missing=[], extra=doc.get("extra"))


def _live(data: bytes) -> bool:
    """A capture as the live path writes it: ranks named, once each, in order."""
    ranks = _doc(data).get("ranks")
    return isinstance(ranks, list) and ranks == sorted(set(ranks))


LIVE = sorted(n for n, d in RECORDED.items() if _live(d))


def assert_same_as_raw(raw: bytes, red: bytes) -> ingest.Ingested:
    a, b = ingest.read_capture(raw), ingest.read_capture(red)
    assert_tables_equal(b.table(), a.table())
    assert b.errors == a.errors
    assert b.meta == a.meta
    assert sorted(b.good_ranks.tolist()) == sorted(a.good_ranks.tolist())
    return b


# ---- equal to the raw capture ---------------------------------------------------------------------------

@pytest.mark.parametrize("node", [1, 2, 3])
@pytest.mark.parametrize("name", LIVE)
def test_recorded_capture_reduced_in_nodes_gives_the_raw_table(name: str, node: int) -> None:
    assert LIVE, "no recorded capture of the live shape"
    assert_same_as_raw(RECORDED[name], reduced(RECORDED[name], node))


@pytest.mark.parametrize("job", sorted(p for p in (Path(__file__).parent / "data" / "engine").iterdir()
                                       if (p / "captures").is_dir()), ids=lambda p: p.name)
def test_recorded_job_reduced_gives_the_raw_diagnoses(job: Path) -> None:
    raw = _capture_order(job / "captures")
    pipe_raw, pipe_red = Pipeline(), Pipeline()
    got = [_jsonable(pipe_red.analyse(reduced(c, 2), origin="x").diagnosis) for c in raw]
    assert got == [_jsonable(pipe_raw.analyse(c, origin="x").diagnosis) for c in raw]
    assert any(d["findings"] for d in got)


@pytest.mark.parametrize("fault,stages,node", [("compute", 1, 8), ("gc", 2, 8), ("communication", 1, 5),
                                               ("regression", 4, 16)])
def test_synthetic_job_reduced_gives_the_raw_table_and_diagnosis(tmp_path: Path, fault: str, stages: int,
                                                                   node: int) -> None:
    plan = synth.generate(tmp_path, ranks=400, fault=fault, functions=90, seed=5, stages=stages)
    raw = _capture_order(tmp_path / "captures")
    pipe_raw, pipe_red = Pipeline(), Pipeline()
    for data in raw:
        red = reduced(data, node)
        assert_same_as_raw(data, red)
        a, b = pipe_raw.analyse(data, origin="x"), pipe_red.analyse(red, origin="x")
        assert _jsonable(b.diagnosis) == _jsonable(a.diagnosis)
        assert len(red) < len(data) / 3          # the point of it
    if plan.culprit is not None and fault != "communication":
        assert b.diagnosis.findings[0].rank == plan.culprit
        # the culprit stands out in its node: its raw summary came along for the drill-down
        assert b.summaries == a.summaries and plan.culprit in b.summaries


def test_faultbench_capture_reduced_gives_the_raw_diagnosis() -> None:
    files = sorted((Path(__file__).parent / "data" / "faultbench").rglob("captures/*.msgpack"))
    live = [f for f in files if _live(f.read_bytes())][:6]
    assert live, "no recorded fault-bench capture"
    for f in live:
        data = f.read_bytes()
        assert_same_as_raw(data, reduced(data, 2))


def test_rejected_summaries_at_a_leader_give_rank_zeros_lines(tmp_path: Path) -> None:
    synth.generate(tmp_path, ranks=96, fault="compute", culprit=5, functions=60, seed=2)
    data = (tmp_path / "captures" / "500.msgpack").read_bytes()
    doc = _doc(data)
    got = dict(zip(doc["ranks"], doc["summaries"], strict=True))
    lay = Layout.derive(got[17], summary.decode(got[17]))
    slot = {s.path: s for s in lay.slots}

    def poke(r: int, path: tuple[Any, ...], raw: bytes) -> None:
        s = slot[path]
        arr = bytearray(got[r])
        arr[s.offset:s.offset + s.width] = raw
        got[r] = bytes(arr)

    poke(17, ("functions", 3, "ms"), struct.pack(">d", math.nan))
    poke(18, ("phases", "step"), struct.pack(">d", -1.0))
    poke(40, ("steps", 2, "ms"), struct.pack(">d", 1e7 * 1.0001))
    got[41] = got[41][:-5]                       # truncated
    got[42] = b"\x93\x01\x02"                    # not a summary at all
    got[43] = got[44]                            # rank 44's summary sent by rank 43
    del got[60]                                  # never arrived
    ranks = sorted(got)
    raw = summary.encode_capture(step=doc["step"], trigger=doc["trigger"], world_size=96, ranks=ranks,
                                 summaries=[got[r] for r in ranks], missing=[60])
    ing = assert_same_as_raw(raw, reduced(raw, 8, blobs=got))
    assert [e.split(":")[0] for e in ing.errors] == [f"summary from rank {r}" for r in (17, 18, 40, 41, 42, 43)]
    assert ing.meta["missing"] == [60]


# ---- damaged and foreign blocks -------------------------------------------------------------------------

def _reseal(data: bytes, change: Any) -> bytes:
    body = blockcodec.unseal("t", data)
    change(body)
    return blockcodec.seal(body)


def _flip(data: bytes) -> bytes:
    arr = bytearray(data)
    arr[len(arr) // 2] ^= 0x40
    return bytes(arr)


def _set(path: tuple[Any, ...], value: Any) -> Any:
    def change(body: dict[str, Any]) -> None:
        cur = body
        for k in path[:-1]:
            cur = cur[k]
        cur[path[-1]] = value
    return change


def _keys(pat: dict[str, Any]) -> list[list[str]]:
    """A block pattern's [names, phases, kinds]."""
    return _doc(zlib.decompress(pat["keys"]))


def _ints(field: int, change: Any) -> Any:
    """Change one per-row integer field of a block's segment (blockcodec.INT_FIELDS)."""
    def edit(body: dict[str, Any]) -> None:
        seg = body["seg"]
        m = seg["m"]
        ints = blockcodec.unshuffle("t", "ints", seg["ints"], len(blockcodec.INT_FIELDS) * m).reshape(-1, m)
        ints[field] = change(ints[field])
        seg["ints"] = blockcodec.shuffle(ints)
    return edit


SPOILERS: dict[str, Any] = {
    "flipped byte": lambda b, o: _flip(b),
    "truncated": lambda b, o: b[:-7],
    "not msgpack": lambda b, o: b"\xc1\xc1",
    "other version": lambda b, o: msgpack.packb({**_doc(b), "schema": "eroica.block/9"}, use_bin_type=True),
    "pickle": lambda b, o: b"\x80\x04\x95" + b[3:],
    "bad crc": lambda b, o: msgpack.packb({**_doc(b), "crc32": 1}, use_bin_type=True),
    "zip bomb": lambda b, o: msgpack.packb({**_doc(b), "body": zlib.compress(b"\x00" * (300 << 20), 9)},
                                           use_bin_type=True),
    "other step": lambda b, o: _reseal(b, _set(("step",), 7)),
    "other job": lambda b, o: _reseal(b, _set(("world_size",), 97)),
    "misrouted": lambda b, o: o[8],
    "speaks for another node": lambda b, o: _reseal(b, _set(("ranks",), list(range(8, 24)))),
    "ints short": lambda b, o: _reseal(b, lambda d: d["seg"].update(ints=d["seg"]["ints"][:-8])),
    "short floats": lambda b, o: _reseal(b, lambda d: d["seg"].update(floats=b"\x00" * 8)),
    "short step times": lambda b, o: _reseal(b, lambda d: d["seg"].update(ms=b"\x00" * 8)),
    "bad float kind": lambda b, o: _reseal(b, lambda d: d["seg"].update(
        floats=[b"\x07" * len(d["seg"]["floats"][0]), *d["seg"]["floats"][1:]])),
    "same values short": lambda b, o: _reseal(b, lambda d: d["seg"].update(
        floats=[d["seg"]["floats"][0], d["seg"]["floats"][1][:-8], d["seg"]["floats"][2]])),
    "function values short": lambda b, o: _reseal(b, lambda d: d["seg"]["pats"][0].update(
        vals=[*d["seg"]["pats"][0]["vals"][:2], d["seg"]["pats"][0]["vals"][2][:-3]])),
    "no host": lambda b, o: _reseal(b, lambda d: d["seg"].update(hosts=[])),
    "host out of range": lambda b, o: _reseal(b, _ints(4, lambda v: v + 5)),
    "rows not covered": lambda b, o: _reseal(b, lambda d: d["seg"].update(pats=[])),
    "row of another node": lambda b, o: _reseal(b, _ints(0, lambda v: v + 24)),
    "a rank twice": lambda b, o: _reseal(b, _ints(0, lambda v: np.full_like(v, v[0]))),
    "rank out of range": lambda b, o: _reseal(b, _ints(0, lambda v: v - 1000)),
    "order not a permutation": lambda b, o: _reseal(b, lambda d: d["seg"]["pats"][0].update(
        order=b"\x01" * (len(_keys(d["seg"]["pats"][0])[0]) * d["seg"]["m"]))),   # all at place 0
    "function list not msgpack": lambda b, o: _reseal(b, lambda d: d["seg"]["pats"][0].update(keys=b"\xc1")),
    "function list of numbers": lambda b, o: _reseal(b, lambda d: d["seg"]["pats"][0].update(
        keys=zlib.compress(msgpack.packb([[1, 2], ["a", "b"], ["c", "d"]])))),
    "function list a zip bomb": lambda b, o: _reseal(b, lambda d: d["seg"]["pats"][0].update(
        keys=zlib.compress(b"\x00" * (300 << 20), 9))),
    "plane count 9": lambda b, o: _reseal(b, lambda d: d["seg"].update(ints=b"\x09" + d["seg"]["ints"][1:])),
    "pattern rows outside": lambda b, o: _reseal(b, lambda d: d["seg"]["pats"][0].update(
        rows=np.arange(50, 50 + d["seg"]["m"], dtype="<i4").tobytes())),
    "two-line error": lambda b, o: _reseal(b, _set(("errors",), [[17, "a\nb"]])),
    "leader failed": lambda b, o: blocks.encode_node_block(step=500, world_size=96, leader=16,
                                                           ranks=list(range(16, 24)), missing=[], errors=[],
                                                           segment=None, drill={}, failure="MemoryError: boom"),
}


@pytest.mark.parametrize("how", sorted(SPOILERS))
def test_a_bad_block_spoils_only_its_node_with_one_line(tmp_path: Path, how: str) -> None:
    synth.generate(tmp_path, ranks=96, fault="compute", culprit=5, functions=60, seed=2)
    data = (tmp_path / "captures" / "500.msgpack").read_bytes()
    doc = _doc(data)
    by_leader = node_blocks(data, 8)
    by_leader[16] = SPOILERS[how](by_leader[16], by_leader)
    red = blocks.encode_capture(step=500, trigger=doc["trigger"], world_size=96, blocks=by_leader, missing=[])
    ing = ingest.read_capture(red)
    assert len(ing.errors) == 1, ing.errors
    line = ing.errors[0]
    assert "node leader rank 16" in line and "\n" not in line and "missing" in line, line
    assert ing.meta["missing"] == list(range(16, 24))
    _, good, _ = summary.decode_capture(data)
    assert_tables_equal(ing.table(), build_table(s for s in good if not 16 <= s["rank"] < 24))
    d = Pipeline().analyse(red, origin="x").diagnosis      # and the rest is still diagnosed
    assert d.findings and d.findings[0].rank == 5 and line in d.errors


def test_a_block_of_a_leader_that_ships_no_step_times_is_read_with_them_unknown(tmp_path: Path) -> None:
    """Blocks carry each window step's time (``ms``, engine/lonework.py needs it) since 2026-12-04; a
    capture/2 file written before has none. Its rows are read, their step times NaN, the rest of the
    Table bit for bit the raw capture's, and the capture is diagnosed."""
    synth.generate(tmp_path, ranks=96, fault="compute", culprit=5, functions=60, seed=2)
    data = (tmp_path / "captures" / "500.msgpack").read_bytes()
    by_leader = node_blocks(data, 8)
    by_leader[16] = _reseal(by_leader[16], lambda d: d["seg"].pop("ms"))
    red = blocks.encode_capture(step=500, trigger=_doc(data)["trigger"], world_size=96, blocks=by_leader, missing=[])
    ing = ingest.read_capture(red)
    assert not ing.errors
    table, raw = ing.table(), build_table(summary.decode_capture(data)[1])
    assert table.step_ms is not None and raw.step_ms is not None
    old = table.rows_of(range(16, 24))
    assert np.isnan(table.step_ms[old]).all() and np.isfinite(np.delete(table.step_ms, old, axis=0)).all()
    table.step_ms[old] = raw.step_ms[old]
    assert_tables_equal(table, raw)
    d = Pipeline().analyse(red, origin="x").diagnosis
    assert d.findings and d.findings[0].rank == 5


def test_a_silent_leader_leaves_its_node_missing(tmp_path: Path) -> None:
    synth.generate(tmp_path, ranks=24, fault="none", functions=30, seed=2)
    data = (tmp_path / "captures" / "500.msgpack").read_bytes()
    by_leader = node_blocks(data, 8)
    del by_leader[8]
    red = blocks.encode_capture(step=500, trigger="spike", world_size=24, blocks=by_leader, missing=[8])
    ing = ingest.read_capture(red)
    assert ing.meta["missing"] == list(range(8, 16)) and not ing.errors


def test_block_fuzz_never_breaks_the_capture() -> None:
    """Random damage to one block: read_capture still returns, the damage is one line or nothing."""
    data = RECORDED["e2e-compute/captures/82.msgpack"]
    base = node_blocks(data, 2)
    rng = np.random.default_rng(3)
    for _ in range(300):
        victim = int(rng.choice(sorted(base)))
        arr = bytearray(base[victim])
        for _ in range(int(rng.integers(1, 4))):
            arr[int(rng.integers(0, len(arr)))] = int(rng.integers(0, 256))
        red = blocks.encode_capture(step=82, trigger="spike", world_size=4, blocks={**base, victim: bytes(arr)},
                                    missing=[])
        ing = ingest.read_capture(red)
        assert len(ing.errors) <= 1 and all("\n" not in e for e in ing.errors)
        ing.table()


# ---- the codec ------------------------------------------------------------------------------------------

def test_arrays_round_trip_to_the_bit_and_are_checked() -> None:
    a = np.array([[0.0, -0.0], [np.nan, -np.inf]])
    b = blockcodec.unpack_array("w", "x", blockcodec.pack_array(a), "<f8", (2, 2))
    assert np.array_equal(a.view(np.uint64), b.view(np.uint64))
    nan = np.full(5, -np.nan)
    packed = blockcodec.pack_array(nan)
    assert "fill" in packed and "data" not in packed
    assert np.array_equal(blockcodec.unpack_array("w", "x", packed, "<f8", (5,)).view(np.uint64), nan.view(np.uint64))
    for bad, expect in (({**packed, "dtype": "<i8"}, "array of <f8"), ({**packed, "shape": [6, 1]}, "shape"),
                        ({"dtype": "<f8", "shape": [5], "data": b"\x00" * 39}, "wrong number of bytes"),
                        ({"dtype": "<f8", "shape": [1 << 40], "fill": b"\x00" * 8}, "shape")):
        with pytest.raises(blockcodec.BlockError, match=expect):
            blockcodec.unpack_array("block from node leader rank 3", "x", bad, "<f8", (5,))


def test_builder_decimals_travel_as_integers_and_come_back_to_the_bit() -> None:
    rng = np.random.default_rng(1)
    ms = np.array([round(float(x), 4) for x in rng.uniform(0, 5000, 300)])      # as summary.build rounds
    packed = blockcodec.pack_array(ms)
    assert packed["dec"] == 4 and packed["idtype"] == "<i4" and len(packed["data"]) == 4 * len(ms)
    back = blockcodec.unpack_array("w", "ms", packed, "<f8", (300,))
    assert np.array_equal(back.view(np.uint64), ms.view(np.uint64))
    counts = np.array([16.0, 3.0, 0.0, 1e9])
    assert blockcodec.pack_array(counts)["dec"] == 0
    for other in (np.array([0.1 + 0.2, 1.0]), np.array([-0.0, 1.0]), np.array([np.nan, 1.0]), ms * (1 + 1e-12)):
        assert "dec" not in blockcodec.pack_array(other)       # not such a decimal: the float bits as they are
        assert np.array_equal(blockcodec.unpack_array("w", "x", blockcodec.pack_array(other), "<f8", (len(other),))
                              .view(np.uint64), other.view(np.uint64))
    for bad in ({**packed, "dec": 3}, {**packed, "idtype": "<u8"}, {**packed, "data": packed["data"][:-4]}):
        with pytest.raises(blockcodec.BlockError, match="bad decimal encoding"):
            blockcodec.unpack_array("block from node leader rank 3", "ms", bad, "<f8", (300,))


def test_capture2_through_eroica_analyze_gives_the_same_reports(tmp_path: Path) -> None:
    raw_dir, red_dir = tmp_path / "raw", tmp_path / "red"
    synth.generate(raw_dir, ranks=200, fault="dataloader", culprit=77, functions=60, seed=4)
    (red_dir / "captures").mkdir(parents=True)
    (red_dir / "steps.msgpack").write_bytes((raw_dir / "steps.msgpack").read_bytes())
    for f in (raw_dir / "captures").glob("*.msgpack"):
        (red_dir / "captures" / f.name).write_bytes(reduced(f.read_bytes(), 8))
    outs = {}
    for d in (raw_dir, red_dir):
        res = CliRunner().invoke(analyze_cmd, [str(d)])
        assert res.exit_code == 0, res.output
        outs[d] = [line.replace(str(d), "DIR") for line in res.output.splitlines() if "ms" not in line]
    assert outs[raw_dir] == outs[red_dir]
    for f in sorted(raw_dir.glob("diagnosis-*.json")):
        a, b = json.loads(f.read_text()), json.loads((red_dir / f.name).read_text())
        a.pop("engine_s"), b.pop("engine_s")
        assert a == b
    rep = json.loads((red_dir / "report.json").read_text())
    assert [(f["rank"], f["category"]) for f in rep["findings"]] == [(77, "dataloader")]


def test_drill_down_is_bounded_per_node_and_quiet_when_healthy(tmp_path: Path) -> None:
    synth.generate(tmp_path, ranks=160, fault="none", functions=40, seed=9)
    data = (tmp_path / "captures" / "500.msgpack").read_bytes()
    red = reduced(data, 8)
    ing = ingest.read_capture(red)
    assert ing.drill is not None and len(ing.drill) <= 2 * 20
    healthy = sum(len(blockcodec.unseal("t", b)["drill"]) for b in _doc(red)["blocks"])
    assert healthy <= 4, "healthy nodes forward (almost) no raw summaries"


def test_reduction_is_auto_by_default_on_from_a_size() -> None:
    for auto in (Config(), Config.from_env({"EROICA_LEADER_REDUCE": "auto"})):    # pays from ~1k ranks (§8)
        assert not auto.reduces(REDUCE_AUTO_RANKS - 1) and auto.reduces(REDUCE_AUTO_RANKS)
    assert Config.from_env({"EROICA_LEADER_REDUCE": "on"}).reduces(2)
    assert not Config.from_env({"EROICA_LEADER_REDUCE": "off"}).reduces(100_000)


@pytest.mark.parametrize("drop", [False, True])
def test_ranks_listing_functions_in_orders_of_their_own_share_one_list_of_names(tmp_path: Path, drop: bool) -> None:
    """Real summaries list functions by time, in an order (and a top-N set) of each rank's own: a
    leader lists a node's functions once, in one canonical order, with each row's own list, and rank
    0's Table is still the raw one (functions numbered by first appearance)."""
    synth.generate(tmp_path, ranks=48, fault="compute", culprit=13, functions=40, seed=3)
    data = (tmp_path / "captures" / "500.msgpack").read_bytes()
    doc = _doc(data)
    rng = np.random.default_rng(0)
    plan_fn = "autograd::engine::evaluate_function: MmBackward0"
    shuffled = []
    for b in doc["summaries"]:
        s = summary.decode(b)
        keep = rng.permutation(len(s["functions"]))
        if drop:                     # another top-N set on most ranks (never the planted function)
            keep = [i for i in keep if s["functions"][i]["name"] != plan_fn][:len(keep) - int(rng.integers(0, 4))]
            keep += [i for i, f in enumerate(s["functions"]) if f["name"] == plan_fn]
        s["functions"] = [s["functions"][i] for i in keep]
        shuffled.append(summary.encode(s))
    raw = summary.encode_capture(step=doc["step"], trigger=doc["trigger"], world_size=48, ranks=doc["ranks"],
                                 summaries=shuffled, missing=[])
    assert_same_as_raw(raw, reduced(raw, 2))   # 24 nodes, lists of their own: rank 0 joins them (UNION_ABOVE)
    red = reduced(raw, 8)
    assert_same_as_raw(raw, red)
    for b in _doc(red)["blocks"]:
        pats = blockcodec.unseal("t", b)["seg"]["pats"]
        assert len(pats) == 1 and pats[0]["order"] is not None   # one list of names a node
        names = _keys(pats[0])[0]
        assert names == sorted(names)
    d_raw, d_red = Pipeline().analyse(raw, origin="x"), Pipeline().analyse(red, origin="x")
    assert _jsonable(d_red.diagnosis) == _jsonable(d_raw.diagnosis)
    assert d_red.diagnosis.findings[0].rank == 13


def test_merging_segments_keeps_the_table_to_the_bit() -> None:
    """table.merge_segments (a leader's one segment; rank 0's one segment of all blocks) changes
    nothing finish computes."""
    from eroica_runtime.engine.table import TableBuilder, merge_segments
    for data in RECORDED.values():
        ing = ingest.read_capture(data)
        for canonical in (False, True):
            b = TableBuilder()
            b.add_segment(merge_segments(ing.builder.segments(), canonical=canonical))
            assert_tables_equal(b.finish(), ing.table())


@pytest.mark.parametrize("values", [[0], [-1, 0, 1], [127, -128], [128], [-129, 5], [2**40, -3], [-2**63, 2**63 - 1],
                                    list(range(-300, 300, 7))])
def test_shuffled_integers_round_trip_with_their_high_planes_left_out(values: list[int]) -> None:
    a = np.asarray(values, dtype=np.int64).reshape(1, -1)
    data = blockcodec.shuffle(a)
    assert len(data) == 1 + data[0] * a.size and data[0] <= (1 if max(map(abs, values)) < 128 else 8)
    assert np.array_equal(blockcodec.unshuffle("w", "x", data, a.size), a.reshape(-1))
    many = blockcodec.unshuffle_many([data, blockcodec.shuffle(a * 0 + 1), data], 1, [a.size] * 3)
    assert np.array_equal(many, np.concatenate([a, a * 0 + 1, a], axis=1))


def test_float_matrices_round_trip_to_the_bit_across_blocks_of_other_kinds() -> None:
    """pack_floats / decode_many: decimals, float bits, same-valued columns (NaN, -0.0 included), and
    blocks whose columns are of other kinds, decoded side by side."""
    rng = np.random.default_rng(2)
    dec = np.round(rng.uniform(0, 500, (4, 6)), 4)
    mats = [dec, np.vstack([dec[:2], rng.normal(size=(1, 6)), np.full((1, 6), np.nan)]),
            np.vstack([np.full((2, 3), -0.0), np.full((2, 3), 7.25)]).reshape(4, 3), np.zeros((4, 1))]
    items = [tuple(blockcodec.pack_floats(m)) for m in mats]
    assert blockcodec.pack_floats(mats[1])[0][3] == blockcodec.KIND_SAME       # the NaN column: sent once
    got = blockcodec.decode_many(items, 4, [m.shape[1] for m in mats])           # type: ignore[arg-type]
    want = np.concatenate(mats, axis=1)
    assert np.array_equal(got.view(np.uint64), want.view(np.uint64))


def test_a_node_mixing_pipeline_stages_forwards_only_ranks_unlike_their_own_stage(tmp_path: Path) -> None:
    """A node holding ranks of two pipeline stages (recorded pp groups), the second stage 50% heavier
    by design: healthy, it forwards no raw summary (every rank is like its own stage's node mates);
    a culprit in the heavy stage is still forwarded."""
    from eroica_runtime.summary import OWN_WORK_PHASES

    synth.generate(tmp_path, ranks=16, fault="none", stages=2, functions=40, seed=3)
    doc = _doc((tmp_path / "captures" / "500.msgpack").read_bytes())
    sums = {r: summary.decode(b) for r, b in zip(doc["ranks"], doc["summaries"], strict=True)}
    for r in range(8, 16):                       # stage 1: its layers and the loss
        ph = sums[r]["phases"]
        extra = 0.5 * sum(ph[p] for p in OWN_WORK_PHASES)
        ph["forward"] += extra
        ph["step"] += extra
    node = [0, 1, 2, 3, 8, 9, 10, 11]

    def drill() -> set[int]:
        block = leader.reduce_node(step=doc["step"], trigger=doc["trigger"], world_size=16, leader=0,
                                   blobs={r: summary.encode(sums[r]) for r in node}, missing=[])
        body = blockcodec.unseal("test", block)
        assert not body["failure"], body["failure"]
        return set(body["drill"])

    assert drill() == set()
    sums[9]["phases"]["forward"] += 0.3 * sums[9]["phases"]["step"]
    assert drill() == {9}
