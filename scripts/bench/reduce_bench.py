"""Leader-side reduction, measured: block bytes vs raw summaries, a leader's reduce time, and rank 0's
work on the blocks (capture/2 assembled, written, analysed), for gather_model.py's model (§8).

For each size a synthetic job (the same as gather_model.py measure: 200 functions, a compute fault,
nodes of 8) is made in a child process; every node of its faulty capture is reduced the way a live
leader does (engine/leader.reduce_node, timed one node at a time), the blocks go into the capture/2
file rank 0 would write, and a fresh process times what rank 0's analyst does with it (peak RSS is
that process's) and checks the diagnosis equals the raw capture's. Other general-purpose codecs
(zlib 6, lzma) are measured on 64 of the blocks' bodies; real summaries' blocks on the recorded
captures (``realistic_bytes``).

  flock /tmp/eroica-multirank.lock .venv/bin/python scripts/bench/reduce_bench.py --out /tmp/gm-red.json [--full]

--full adds 100,000 ranks (12,500 nodes reduced one after another here: ~2 min; ~3 GB). Each size's
analysis runs --repeat times (fresh processes); each run times rank 0's work on the blocks and then
the same work on the raw capture in the same process (interleaved: a ratio per run).
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
from gather_model import timed_analysis  # noqa: E402

from eroica_runtime import reportdir, summary, synth  # noqa: E402
from eroica_runtime.engine import blockcodec, blocks, leader  # noqa: E402
from eroica_runtime.pipeline import Pipeline  # noqa: E402

PER_NODE = 8


def _variants(bodies: list[dict[str, Any]]) -> dict[str, int]:
    """Bytes of the same block bodies (the drill-down left out) under other general-purpose codecs."""
    raw = [msgpack.packb({**b, "drill": {}}, use_bin_type=True) for b in bodies]
    return {"none": sum(map(len, raw)), "zlib1": sum(len(zlib.compress(r, 1)) for r in raw),
            "zlib6": sum(len(zlib.compress(r, 6)) for r in raw), "lzma": sum(len(lzma.compress(r)) for r in raw),
            "nodes": len(bodies)}


def _node_of(caps: list[dict[str, Any]]) -> dict[int, bytes]:
    """One node of the recorded summaries of several captures of one job (ranks renumbered after one
    another, world size their sum): real summaries, each rank's functions in its own order and set."""
    out: dict[int, bytes] = {}
    world = sum(c["world_size"] for c in caps)
    for cap in caps:
        base = len(out)
        for r, b in zip(cap["ranks"], cap["summaries"], strict=True):
            s = summary.decode(b)
            s["rank"], s["world_size"], s["groups"] = base + r, world, []
            out[base + r] = summary.encode(s)
    return out


def realistic_bytes(workdir: str) -> dict[str, Any]:
    """Block bytes of the recorded real CPU summaries (tests/data/engine: 4-rank jobs): each capture
    as a node of 4, and two captures of one job as a node of 8 (the model's node; ranks renumbered)."""
    del workdir
    real_raw, real_block, eight = [], [], []
    caps_by_job: dict[Path, list[dict[str, Any]]] = {}
    for p in sorted((ROOT / "tests" / "data" / "engine").rglob("*.msgpack")):
        cap = msgpack.unpackb(p.read_bytes(), raw=False, strict_map_key=False)
        if not isinstance(cap, dict) or cap.get("ranks") != sorted(set(cap.get("ranks") or [None])):
            continue
        blobs = dict(zip(cap["ranks"], cap["summaries"], strict=True))
        block = leader.reduce_node(step=cap["step"], trigger=cap["trigger"], world_size=cap["world_size"],
                                   leader=min(blobs), blobs=blobs, missing=[], drill=0)
        real_raw.append(sum(map(len, blobs.values())) / len(blobs))
        real_block.append(len(block) / len(blobs))
        if cap["ranks"] == list(range(cap["world_size"])):
            caps_by_job.setdefault(p.parent, []).append(cap)
    for caps in caps_by_job.values():
        for a, b in zip(caps[0::2], caps[1::2], strict=False):
            blobs = _node_of([a, b])
            block = leader.reduce_node(step=a["step"], trigger=a["trigger"], world_size=len(blobs), leader=0,
                                       blobs=blobs, missing=[], drill=0)
            eight.append(len(block) / len(blobs))
    return {"real_recorded": {"captures": len(real_raw), "raw_bytes_per_rank_median": statistics.median(real_raw),
                              "block_bytes_per_rank_median": statistics.median(real_block),
                              "block_bytes_per_rank_max": max(real_block), "ranks_per_node": 4},
            "real_nodes_of_8": {"nodes": len(eight), "block_bytes_per_rank_median": statistics.median(eight),
                                "block_bytes_per_rank_max": max(eight)}}


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
    raw = (out / "captures" / f"{synth.FAULT_STEP}.msgpack").read_bytes()
    raw_result, raw_s, _, _ = timed_analysis(pipe2, raw, out / "raw-reports", ranks)   # the same work, raw
    raw_doc = raw_result.diagnosis.to_json()
    red_doc.pop("engine_s"), raw_doc.pop("engine_s")
    return {"analyse_s": analyse_s, "report_s": report_s, "maxrss_mb": rss, "culprit_right": ok,
            "raw_analyse_s": raw_s, "same_diagnosis_as_raw": red_doc == raw_doc, "drill_ranks_named": drill,
            "culprit": culprit}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--sizes", default="1000,10000")
    ap.add_argument("--repeat", type=int, default=3, help="analyses per size (fresh processes)")
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
            runs = []
            for _ in range(args.repeat):        # fresh processes; each times the blocks, then the raw capture
                proc = subprocess.run([sys.executable, __file__, "--analyse", row["dir"], str(n)],
                                      capture_output=True, text=True, check=True)
                runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            row.update(runs[len(runs) // 2])
            for k in ("analyse_s", "raw_analyse_s", "maxrss_mb"):
                row[k + "_runs"] = [r[k] for r in runs]
            row["analyse_s"] = statistics.median(row["analyse_s_runs"])
            row["raw_analyse_s"] = statistics.median(row["raw_analyse_s_runs"])
            row["same_diagnosis_as_raw"] = all(r["same_diagnosis_as_raw"] for r in runs)
            res["sizes"][str(n)] = row
            print(f"{n} ranks: {json.dumps(row)}", file=sys.stderr)
            if args.out:
                Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
