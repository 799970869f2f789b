"""Leader-side reduction, measured: block bytes vs raw summaries, a leader's reduce time, and rank 0's
work on the blocks (capture/2 assembled, written, analysed), for gather_model.py's model (§8).

For each size a synthetic job (the same as gather_model.py measure: 200 functions, a compute fault,
nodes of 8) is made in a child process; every node of its faulty capture is reduced the way a live
leader does (engine/leader.reduce_node, timed one node at a time), the blocks go into the capture/2
file rank 0 would write, and a fresh process times what rank 0's analyst does with it (peak RSS is
that process's) and checks the diagnosis equals the raw capture's. Byte variants (other codecs,
lossy float32 function times) are measured on 64 of the blocks' bodies.

  flock /tmp/eroica-multirank.lock .venv/bin/python scripts/bench/reduce_bench.py --out /tmp/gm-red.json [--full]

--full adds 100,000 ranks (12,500 nodes reduced one after another here: ~2 min; ~3 GB).
"""

from __future__ import annotations

import argparse
import json
import lzma
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import msgpack  # noqa: E402
import numpy as np  # noqa: E402
from gather_model import timed_analysis  # noqa: E402

from eroica_runtime import reportdir, summary, synth  # noqa: E402
from eroica_runtime.engine import blockcodec, blocks, leader  # noqa: E402
from eroica_runtime.pipeline import Pipeline  # noqa: E402
from eroica_runtime.summary.build import _num as rounded_as_built  # noqa: E402

PER_NODE = 8


def _variants(bodies: list[dict[str, Any]]) -> dict[str, int]:
    """Bytes of the same block bodies under other encodings (for what would reach the goal)."""
    def shuffled(o: Any) -> Any:
        """Every array's bytes grouped by byte position (lossless; blosc's trick for floats)."""
        if isinstance(o, dict):
            if "dtype" in o and "data" in o:
                size = np.dtype(o.get("idtype", o["dtype"])).itemsize
                u = np.frombuffer(o["data"], dtype=np.uint8)
                return {**o, "data": u.reshape(-1, size).T.tobytes() if size > 1 and len(u) else u.tobytes()}
            return {k: shuffled(v) for k, v in o.items()}
        if isinstance(o, list):
            return [shuffled(x) for x in o]
        return o

    def f32_only(o: Any, inside: bool = False) -> Any:
        if isinstance(o, dict):
            if inside and o.get("dtype") == "<f8" and "data" in o and "dec" not in o:
                return {**o, "dtype": "<f4", "data": np.frombuffer(o["data"], "<f8").astype("<f4").tobytes()}
            return {k: f32_only(v, k in ("ms", "cnt")) for k, v in o.items()}
        if isinstance(o, list):
            return [f32_only(x) for x in o]
        return o

    out: dict[str, int] = {}
    nodrill = [{**b, "drill": {}} for b in bodies]
    raw = [msgpack.packb(b, use_bin_type=True) for b in nodrill]
    out["none"] = sum(map(len, raw))
    out["zlib1"] = sum(len(zlib.compress(r, 1)) for r in raw)
    out["zlib6"] = sum(len(zlib.compress(r, 6)) for r in raw)
    out["lzma"] = sum(len(lzma.compress(r)) for r in raw)
    sh = [msgpack.packb(shuffled(b), use_bin_type=True) for b in nodrill]
    out["shuffle_zlib1"] = sum(len(zlib.compress(r, 1)) for r in sh)
    f32 = [msgpack.packb(f32_only(b), use_bin_type=True) for b in nodrill]
    out["f32fn_zlib1"] = sum(len(zlib.compress(r, 1)) for r in f32)
    f32s = [msgpack.packb(shuffled(f32_only(b)), use_bin_type=True) for b in nodrill]
    out["f32fn_shuffle_zlib1"] = sum(len(zlib.compress(r, 1)) for r in f32s)
    out["f32fn_shuffle_lzma"] = sum(len(lzma.compress(r)) for r in f32s)
    out["nodes"] = len(bodies)
    return out


def _rounded(o: Any) -> Any:
    """A decoded summary with every float rounded as summary.build rounds them (4 places)."""
    if isinstance(o, dict):
        return {k: _rounded(v) for k, v in o.items()}
    if isinstance(o, list):
        return [_rounded(x) for x in o]
    return rounded_as_built(o) if isinstance(o, float) else o


def realistic_bytes(workdir: str, ranks: int = 1000) -> dict[str, Any]:
    """Block bytes where the numbers are what real summaries hold: synthetic summaries (which carry
    every float's full precision) rounded to 4 places as summary.build rounds, and the recorded real
    CPU captures (tests/data/engine, 4 ranks: one node each)."""
    out = Path(workdir) / "realistic"
    synth.generate(out, ranks=ranks, fault="compute", culprit=ranks // 3 + 1, functions=200, seed=1)
    doc = msgpack.unpackb((out / "captures" / f"{synth.FAULT_STEP}.msgpack").read_bytes(), raw=False)
    got = {r: summary.encode(_rounded(summary.decode(b))) for r, b in zip(doc["ranks"], doc["summaries"], strict=True)}
    sizes = [len(leader.reduce_node(step=synth.FAULT_STEP, trigger="slow_step", world_size=ranks, leader=first,
                                    blobs={r: got[r] for r in range(first, first + PER_NODE)}, missing=[], drill=0))
             for first in range(0, ranks, PER_NODE)]
    real_raw, real_block = [], []
    for p in sorted((ROOT / "tests" / "data" / "engine").rglob("*.msgpack")):
        cap = msgpack.unpackb(p.read_bytes(), raw=False, strict_map_key=False)
        if not isinstance(cap, dict) or cap.get("ranks") != sorted(set(cap.get("ranks") or [None])):
            continue
        blobs = dict(zip(cap["ranks"], cap["summaries"], strict=True))
        block = leader.reduce_node(step=cap["step"], trigger=cap["trigger"], world_size=cap["world_size"],
                                   leader=min(blobs), blobs=blobs, missing=[], drill=0)
        real_raw.append(sum(map(len, blobs.values())) / len(blobs))
        real_block.append(len(block) / len(blobs))
    return {"rounded_synth": {"raw_summary_bytes_median": statistics.median(map(len, got.values())),
                              "block_bytes_median_per_node": statistics.median(sizes), "nodes": len(sizes),
                              "per_node": PER_NODE},
            "real_recorded": {"captures": len(real_raw), "raw_bytes_per_rank_median": statistics.median(real_raw),
                              "block_bytes_per_rank_median": statistics.median(real_block),
                              "block_bytes_per_rank_max": max(real_block), "ranks_per_node": 4}}


def reduce_child(ranks: int, workdir: str) -> dict[str, Any]:
    """Synthesise the job (another process), reduce its faulty capture node by node, write capture/2."""
    out = Path(workdir) / f"n{ranks}"
    culprit = ranks // 3 + 1
    subprocess.run([sys.executable, "-c", "import sys; from eroica_runtime import synth; "
                    f"synth.generate(sys.argv[1], ranks={ranks}, fault='compute', culprit={culprit}, "
                    "functions=200, seed=1)", str(out)], check=True, cwd=ROOT)
    raw_path = out / "captures" / f"{synth.FAULT_STEP}.msgpack"
    doc = msgpack.unpackb(raw_path.read_bytes(), raw=False)
    got = dict(zip(doc["ranks"], doc["summaries"], strict=True))
    del doc
    raw_bytes = [len(b) for b in got.values()]
    times, by_leader = [], {}
    for first in range(0, ranks, PER_NODE):
        mine = {r: got[r] for r in range(first, min(ranks, first + PER_NODE))}
        t = time.perf_counter()
        by_leader[first] = leader.reduce_node(step=synth.FAULT_STEP, trigger="slow_step", world_size=ranks,
                                              leader=first, blobs=mine, missing=[])
        times.append(time.perf_counter() - t)
    del got
    sizes = [len(b) for b in by_leader.values()]
    bodies = [blockcodec.unseal("b", by_leader[k]) for k in sorted(by_leader)[:64]]
    drill_n, drill_b = 0, 0
    for b in by_leader.values():
        d = blockcodec.unseal("b", b)["drill"]
        drill_n += len(d)
        drill_b += sum(len(x) + 8 for x in d.values())
    t = time.perf_counter()
    data = blocks.encode_capture(step=synth.FAULT_STEP, trigger="slow_step", world_size=ranks, blocks=by_leader,
                                 missing=[])
    encode_s = time.perf_counter() - t
    t = time.perf_counter()
    reportdir.atomic_write(out / "reduced.msgpack", data)
    write_s = time.perf_counter() - t
    return {"ranks": ranks, "nodes": len(sizes), "raw_summary_bytes_median": statistics.median(raw_bytes),
            "raw_bytes_total": sum(raw_bytes), "block_bytes_median": statistics.median(sizes),
            "block_bytes_total": sum(sizes), "capture2_bytes": len(data), "drill_summaries": drill_n,
            "drill_bytes": drill_b, "leader_reduce_median_s": statistics.median(times),
            "leader_reduce_p90_s": sorted(times)[int(0.9 * len(times))], "encode_capture_s": encode_s,
            "write_s": write_s, "variants_64_nodes": _variants(bodies), "dir": str(out)}


def analyse_child(folder: str, ranks: int) -> dict[str, Any]:
    """In a fresh process: rank 0's analyst on the capture/2 file (after the job's baseline), then the
    same capture's raw form, for equality (after the peak RSS is read)."""
    out = Path(folder)
    pipe = Pipeline()
    base = (out / "captures" / f"{synth.BASELINE_STEP}.msgpack").read_bytes()
    pipe.analyse(base, origin="baseline")        # the same baseline Table either way (tests/test_blocks.py)
    data = (out / "reduced.msgpack").read_bytes()
    result, analyse_s, report_s, _ = timed_analysis(pipe, data, out, ranks)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    red_doc = result.diagnosis.to_json()
    culprit = ranks // 3 + 1
    ok = bool(result.diagnosis.findings) and result.diagnosis.findings[0].rank == culprit
    drill = sorted(result.summaries)
    del result, data
    pipe2 = Pipeline()
    pipe2.analyse(base, origin="baseline")
    raw_doc = pipe2.analyse((out / "captures" / f"{synth.FAULT_STEP}.msgpack").read_bytes(), origin="capture") \
        .diagnosis.to_json()
    red_doc.pop("engine_s"), raw_doc.pop("engine_s")
    return {"analyse_s": analyse_s, "report_s": report_s, "maxrss_mb": rss, "culprit_right": ok,
            "same_diagnosis_as_raw": red_doc == raw_doc, "drill_ranks_named": drill, "culprit": culprit}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--sizes", default="1000,10000")
    ap.add_argument("--child", nargs=2)
    ap.add_argument("--analyse", nargs=2)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(reduce_child(int(args.child[0]), args.child[1])))
        return
    if args.analyse:
        print(json.dumps(analyse_child(args.analyse[0], int(args.analyse[1]))))
        return
    sizes = [int(x) for x in args.sizes.split(",")] + ([100000] if args.full else [])
    res: dict[str, Any] = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "sizes": {}}
    with tempfile.TemporaryDirectory() as work:
        res["realistic"] = realistic_bytes(work)
        print(f"realistic: {json.dumps(res['realistic'])}", file=sys.stderr)
        for n in sizes:
            proc = subprocess.run([sys.executable, __file__, "--child", str(n), work], capture_output=True,
                                  text=True, check=True)
            row = json.loads(proc.stdout.strip().splitlines()[-1])
            proc = subprocess.run([sys.executable, __file__, "--analyse", row["dir"], str(n)], capture_output=True,
                                  text=True, check=True)
            row.update(json.loads(proc.stdout.strip().splitlines()[-1]))
            res["sizes"][str(n)] = row
            print(f"{n} ranks: {json.dumps(row)}", file=sys.stderr)
            if args.out:
                Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
