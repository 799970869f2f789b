"""Cost model of a capture's way from the window's close to the printed diagnosis, for 1k-100k ranks.

Why: a 100,000-rank job cannot run here (2 cores), but every piece of the way can be timed here and
the rest is arithmetic on stated assumptions. The pieces (docs/benchmarks.md §8):

  1. bytes per summary: real CPU summaries (tests/data/engine) and synthetic ones (`eroica synth`);
  2. level 1, a node leader: P-1 summaries in over shared memory, then one msgpack bundle packed
     (SideChannel.gather_bytes);
  3. level 2, rank 0 (or a second level of leaders, proposed above 128 leaders): per bundle the
     receive (Iprobe + Recv, timed on real MPI ranks), msgpack unpack and merge into the rank map;
  4. rank 0: the capture file assembled (summary.encode_capture) and written (reportdir.atomic_write,
     fsync), then the analysis (Pipeline.analyse on the in-memory bytes: decode, validate, columns,
     diagnose) and the reports the analyst writes before printing (diagnosis JSON, report.json/html).

Usage (measurements that launch ranks or use >1 GB go under the bench lock):
  .venv/bin/python scripts/bench/gather_model.py measure --out /tmp/gm.json [--full]
  flock /tmp/eroica-multirank.lock .venv/bin/mpiexec -n 16 .venv/bin/python scripts/bench/gather_model.py \
        mpi --out /tmp/gm-mpi16.json        # real ranks: ping, receive rate, the real gather
  flock /tmp/eroica-multirank.lock .venv/bin/mpiexec -n 2 .venv/bin/python scripts/bench/gather_model.py \
        mpi-rank0 --out /tmp/gm-rank0.json   # rank 0 draining 124 / 1,249 / 12,499 real-size node bundles
  flock /tmp/eroica-multirank.lock .venv/bin/python scripts/bench/reduce_bench.py --out /tmp/gm-red.json --full
  .venv/bin/python scripts/bench/gather_model.py model --measured /tmp/gm.json --mpi /tmp/gm-mpi16.json \
        --rank0 /tmp/gm-rank0.json [--reduced /tmp/gm-red.json]
--reduced adds the way with leader-side reduction (engine/leader.py): each node leader reduces its
node to one column block (its measured time), rank 0 receives the measured block bytes, writes the
capture/2 file and analyses it (measured by reduce_bench.py; sizes it did not run scaled by ranks).
--full also times the 100,000-rank analysis (~5 s, ~2 GB; else it is scaled from 10,000 ranks).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import msgpack  # noqa: E402
import numpy as np  # noqa: E402

from eroica_runtime import report, reportdir, summary, synth  # noqa: E402
from eroica_runtime.pipeline import Pipeline  # noqa: E402

SIZES = (1000, 10000, 100000)


def _median_time(fn: Any, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


# ---- in-process measurements ----------------------------------------------------------------------------

def summary_bytes() -> dict[str, Any]:
    """Sizes of real summaries (recorded CPU DDP runs) and of synthetic ones (top 64 + <other>)."""
    real = []
    for p in sorted((ROOT / "tests" / "data" / "engine").rglob("*.msgpack")):
        doc = msgpack.unpackb(p.read_bytes(), raw=False, strict_map_key=False)
        if isinstance(doc, dict) and doc.get("schema") == summary.CAPTURE_SCHEMA:
            real += [len(b) for b in doc["summaries"]]
    return {"real_median": statistics.median(real), "real_max": max(real), "real_n": len(real)}


def timed_analysis(pipe: Pipeline, data: bytes, out: Path, ranks: int) -> tuple[Any, float, float, str]:
    """What rank 0's analyst does with one capture's bytes, timed: (result, seconds analysing,
    seconds writing the diagnosis JSON and report.json/html and formatting the text, the text)."""
    t = time.perf_counter()
    result = pipe.analyse(data, origin="capture")
    analyse_s = time.perf_counter() - t
    t = time.perf_counter()
    report.write_capture(out, result.diagnosis)
    report.write_job(out, diagnoses=[result.diagnosis], world_size=ranks, steps=600, job={"partial": True})
    text = report.format_capture(result.diagnosis)
    return result, analyse_s, time.perf_counter() - t, text


def analysis_child(ranks: int, workdir: str) -> dict[str, Any]:
    """In a fresh process: time what rank 0 does with a synthetic job's faulty capture. The job is
    synthesised in another process, and the analysis runs first, so this process's peak RSS is the
    analyst's (the capture's bytes, the baseline's and the capture's columns, the engine)."""
    out = Path(workdir) / f"n{ranks}"
    subprocess.run([sys.executable, "-c", "import sys; from eroica_runtime import synth; "
                    f"synth.generate(sys.argv[1], ranks={ranks}, fault='compute', culprit={ranks // 3 + 1}, "
                    "functions=200, seed=1)", str(out)], check=True, cwd=ROOT)
    pipe = Pipeline()
    pipe.analyse((out / "captures" / f"{synth.BASELINE_STEP}.msgpack").read_bytes(), origin="baseline")
    data = (out / "captures" / f"{synth.FAULT_STEP}.msgpack").read_bytes()
    result, analyse_s, report_s, text = timed_analysis(pipe, data, out, ranks)
    rss_analysis = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    ok = bool(result.diagnosis.findings) and result.diagnosis.findings[0].rank == ranks // 3 + 1
    del result, pipe
    doc = msgpack.unpackb(data, raw=False)
    del data
    blobs, rank_list = doc["summaries"], doc["ranks"]
    per_summary = statistics.median(len(b) for b in blobs[:1000])
    # level 1 / level 2 pieces on real summary bytes: a node bundle of 8, packed, then unpacked + merged
    bundle = {r: blobs[r] for r in range(min(8, ranks))}
    pack = _median_time(lambda: msgpack.packb({"blobs": bundle, "missing": []}, use_bin_type=True), 200)
    packed = msgpack.packb({"blobs": bundle, "missing": []}, use_bin_type=True)

    def unpack_merge() -> None:
        got: dict[int, bytes] = {}
        d = msgpack.unpackb(packed, raw=False, strict_map_key=False)
        got.update({int(k): v for k, v in d["blobs"].items()})

    unpack = _median_time(unpack_merge, 200)
    t = time.perf_counter()
    encoded = summary.encode_capture(step=synth.FAULT_STEP, trigger="slow_step", world_size=ranks,
                                     ranks=rank_list, summaries=blobs, missing=[])
    encode_s = time.perf_counter() - t
    del blobs, doc
    t = time.perf_counter()
    reportdir.atomic_write(out / "captures" / "written.msgpack", encoded)
    write_s = time.perf_counter() - t
    return {"ranks": ranks, "summary_bytes": per_summary, "capture_bytes": len(encoded),
            "leader_pack_s": pack, "rank0_unpack_merge_s": unpack, "encode_capture_s": encode_s,
            "write_s": write_s, "analyse_s": analyse_s, "report_s": report_s, "culprit_right": ok,
            "maxrss_mb": rss_analysis, "printed_lines": len(text.splitlines())}


def measure(args: argparse.Namespace) -> None:
    sizes = [n for n in SIZES if n < 100000 or args.full]
    res: dict[str, Any] = {"summary": summary_bytes(), "sizes": {}, "machine": os.uname().nodename,
                           "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    with tempfile.TemporaryDirectory() as work:
        for n in sizes:
            proc = subprocess.run([sys.executable, __file__, "child", str(n), work], capture_output=True,
                                  text=True, check=True)
            res["sizes"][str(n)] = json.loads(proc.stdout.strip().splitlines()[-1])
            print(f"measured {n} ranks: {res['sizes'][str(n)]}", file=sys.stderr)
    Path(args.out).write_text(json.dumps(res, indent=1))


# ---- real MPI ranks (run under mpiexec) -------------------------------------------------------------------

def mpi(args: argparse.Namespace) -> None:
    """Ping-pong (shared memory), rank 0's per-message receive cost, and the real gather (emulated
    nodes of 8 ranks: EROICA_NODE_SPLIT) of summaries of the measured size."""
    os.environ.setdefault("EROICA_NODE_SPLIT", "8")
    from eroica_runtime.sidechannel import SideChannel

    side = SideChannel()
    comm, me, size = side.world, side.rank, side.size
    MPI = side.MPI
    s_bytes = int(args.summary_bytes)
    out: dict[str, Any] = {"ranks": size, "nodes": side.leaders.Get_size() if side.is_leader else None,
                           "summary_bytes": s_bytes}
    # 1. ping-pong 0 <-> 1 at S and 8 S: one-way time = latency + bytes / bandwidth
    for nbytes in (64, s_bytes, 8 * s_bytes):
        buf = np.zeros(nbytes, dtype=np.uint8)
        times = []
        for _ in range(40):
            side.barrier(30)
            if me == 0:
                t = time.perf_counter()
                comm.Send([buf, MPI.BYTE], dest=1, tag=11)
                comm.Recv([buf, MPI.BYTE], source=1, tag=12)
                times.append((time.perf_counter() - t) / 2)
            elif me == 1:
                comm.Recv([buf, MPI.BYTE], source=0, tag=11)
                comm.Send([buf, MPI.BYTE], dest=0, tag=12)
        if me == 0:
            out[f"oneway_{nbytes}_s"] = statistics.median(times)
    # 2. rank 0 drains one message from every other rank, the way _recv_all does (Iprobe, Recv)
    for nbytes in (64, 8 * s_bytes):
        per = []
        for rep in range(10):
            payload = np.zeros(nbytes, dtype=np.uint8)
            if me != 0:
                req = comm.Isend([payload, MPI.BYTE], dest=0, tag=500 + rep)
            side.barrier(30)
            if me == 0:
                time.sleep(0.05)                  # let everything arrive: time the receiving only
                t = time.perf_counter()
                got = side._recv_all(comm, list(range(1, size)), 500 + rep, time.monotonic() + 30)
                per.append((time.perf_counter() - t) / max(len(got), 1))
            else:
                req.Wait()
            side.barrier(30)
        if me == 0:
            out[f"recv_per_message_{nbytes}_s"] = statistics.median(per)
    # 3. the real hierarchical gather of S-byte summaries, end to end (every rank's bytes checked)
    def blob_of(rank: int, i: int) -> bytes:
        return np.random.default_rng(rank * 1000 + i).integers(0, 256, s_bytes, dtype=np.uint8).tobytes()

    times = []
    for i in range(args.reps):
        blob = blob_of(me, i)
        side.barrier(30)
        t = time.perf_counter()
        got = side.gather_bytes(blob, 30, tag_base=1000 + 2 * i)
        side.barrier(30)
        times.append(time.perf_counter() - t)
        if me == 0:
            assert got is not None and not got[1] and sorted(got[0]) == list(range(size))
            assert all(bytes(got[0][r]) == blob_of(r, i) for r in range(size))
    if me == 0:
        out["gather_median_s"] = statistics.median(times)
        out["gather_p90_s"] = sorted(times)[int(0.9 * len(times))]
        out["nodes"] = side.leaders.Get_size()
        Path(args.out).write_text(json.dumps(out, indent=1))
        print(json.dumps(out))
    side.drain()
    side.finalize()


def mpi_rank0(args: argparse.Namespace) -> None:
    """Two ranks: rank 1 plays every node leader of a 1k/10k/100k-rank job, sending node bundles (8
    summaries of the measured size, msgpack as gather_bytes packs them) in waves; rank 0 receives,
    unpacks and merges them the way gather_bytes does. Checks the model's rank-0 term at real
    message counts (transport: shared memory here, not a network)."""
    from eroica_runtime.sidechannel import SideChannel

    side = SideChannel()
    comm, me, MPI = side.world, side.rank, side.MPI
    rng = np.random.default_rng(0)
    s_bytes = int(args.summary_bytes)
    blobs = {r: rng.integers(0, 256, s_bytes, dtype=np.uint8).tobytes() for r in range(8)}
    bundle = np.frombuffer(msgpack.packb({"blobs": blobs, "missing": []}, use_bin_type=True), dtype=np.uint8)
    out: dict[str, Any] = {"bundle_bytes": int(bundle.size)}
    for ranks in [int(x) for x in args.sizes.split(",")]:
        leaders = ranks // 8 - 1                  # rank 0's own node is not received
        wave = 256
        side.barrier(60)
        if me == 1:
            for lo in range(0, leaders, wave):
                reqs = [comm.Isend([bundle, MPI.BYTE], dest=0, tag=7) for _ in range(min(wave, leaders - lo))]
                MPI.Request.Waitall(reqs)
        else:
            status = MPI.Status()
            merged: dict[int, bytes] = {}
            t = time.perf_counter()
            for i in range(leaders):
                comm.Probe(source=1, tag=7, status=status)
                buf = np.empty(status.Get_count(MPI.BYTE), dtype=np.uint8)
                comm.Recv([buf, MPI.BYTE], source=1, tag=7)
                doc = msgpack.unpackb(buf.tobytes(), raw=False, strict_map_key=False)
                merged.update({int(k) + 8 * i: v for k, v in doc["blobs"].items()})
            out[str(ranks)] = {"messages": leaders, "seconds": time.perf_counter() - t, "summaries": len(merged)}
            print(json.dumps({ranks: out[str(ranks)]}), file=sys.stderr)
            del merged
    if me == 0:
        Path(args.out).write_text(json.dumps(out, indent=1))
        print(json.dumps(out))
    side.drain()
    side.finalize()


# ---- the model ----------------------------------------------------------------------------------------------

def _scaled(meas: dict[str, Any], n: int, key: str) -> tuple[float, bool]:
    """A rank-0 cost at n ranks: measured there, else scaled linearly from the largest size measured."""
    sizes = meas["sizes"]
    if str(n) in sizes:
        return float(sizes[str(n)][key]), False
    top = max(int(k) for k in sizes)
    return float(sizes[str(top)][key]) * n / top, True


def model(args: argparse.Namespace) -> None:
    meas = json.loads(Path(args.measured).read_text())
    mpi_doc = json.loads(Path(args.mpi).read_text()) if args.mpi else {}
    r0 = json.loads(Path(args.rank0).read_text()) if args.rank0 else {}
    red = json.loads(Path(args.reduced).read_text()) if args.reduced else {}
    any_size = meas["sizes"][min(meas["sizes"], key=int)]
    S = float(any_size["summary_bytes"]) if args.summary_bytes is None else float(args.summary_bytes)
    P, G, T2 = args.per_node, args.group, args.second_level_above
    B_net, lat, poll = args.net_gbps * 1e9 / 8, args.net_latency_us * 1e-6, args.poll_ms * 1e-3
    # rank 0's CPU per byte of bundles received (recv copy, unpack, merge), measured on a stream of
    # real-size node bundles (mpi-rank0), else from the in-process unpack alone
    if r0:
        top = max((k for k in r0 if k.isdigit()), key=int)
        per_byte = r0[top]["seconds"] / r0[top]["messages"] / r0["bundle_bytes"]
    else:
        per_byte = float(any_size["rank0_unpack_merge_s"]) / (P * S)
    small = float(mpi_doc.get("recv_per_message_64_s", args.recv_us * 1e-6))   # per message, software
    pack = float(any_size["leader_pack_s"])
    def stream(msgs: int, size: float) -> float:
        """Receiving ``msgs`` bundles of ``size`` bytes: software per message, rank 0's CPU per byte
        (copies, unpack, merge), the link's bytes and latency; none of it overlapped (an upper bound)."""
        return msgs * (small + lat) + msgs * size * per_byte + msgs * size / B_net

    rows = []
    for n in SIZES:
        leaders = math.ceil(n / P)
        # level 1: a node leader takes P-1 summaries over shared memory, packs one bundle
        t1 = (P - 1) * (small + S * per_byte) + pack + poll
        if leaders > T2:                          # proposed: leaders in groups of G forward to a group leader
            groups = math.ceil(leaders / G)
            t2 = stream(G - 1, P * S) + pack * G + poll
            msgs0, per_msg = groups - 1, G * P * S
            t3 = stream(msgs0, per_msg) + poll
        else:
            groups, t2 = 0, 0.0
            msgs0, per_msg = leaders - 1, P * S
            t3 = stream(msgs0, per_msg) + poll
        today = stream(leaders - 1, P * S) + poll   # two levels, as gather_bytes does now
        encode, est_e = _scaled(meas, n, "encode_capture_s")
        write, est_w = _scaled(meas, n, "write_s")
        analyse, est_a = _scaled(meas, n, "analyse_s")
        rep, est_r = _scaled(meas, n, "report_s")
        mem_an, est_m = _scaled(meas, n, "maxrss_mb")
        mem_gather = 2 * n * S / 2**20             # the merged rank map + the capture file (bundles freed as merged)
        tail = encode + write + analyse + rep
        red_row = _reduced_row(red, n, P, S, per_byte, small, poll, stream) if red else {}
        rows.append({**red_row, "ranks": n, "leaders": leaders, "groups": groups, "rank0_messages": msgs0,
                     "rank0_message_bytes": per_msg, "rank0_bytes": n * S, "t_close": args.close_s,
                     "t_level1": t1, "t_level2": t2, "t_rank0_receive": t3, "t_rank0_receive_today": today,
                     "t_encode": encode, "t_write": write, "t_analyse": analyse, "t_report": rep,
                     "total": args.close_s + t1 + t2 + t3 + tail, "total_today": args.close_s + t1 + today + tail,
                     "rank0_mem_gather_mb": mem_gather, "rank0_mem_analysis_mb": mem_an,
                     "scaled": any((est_e, est_w, est_a, est_r, est_m))})
    checks = {}
    if r0:                                         # the rank-0 term against its own stream measurement
        for k in (k for k in r0 if k.isdigit()):
            m = r0[k]["messages"]
            checks[k] = {"measured_s": r0[k]["seconds"],
                         "model_cpu_s": m * (small + r0["bundle_bytes"] * per_byte)}
    if mpi_doc:                                    # the small end: the real gather on this machine
        checks["gather_16"] = {"measured_median_s": mpi_doc.get("gather_median_s"),
                               "model_s": (P - 1) * (small + S * per_byte) + pack + 2 * poll
                               + stream(max(int(mpi_doc.get("nodes") or 1) - 1, 0), P * S)}
    params = {"summary_bytes": S, "per_node": P, "group": G, "second_level_above": T2,
              "net_gbps": args.net_gbps, "net_latency_us": args.net_latency_us, "poll_ms": args.poll_ms,
              "rank0_cpu_ns_per_byte": per_byte * 1e9, "recv_software_us": small * 1e6,
              "leader_pack_us": pack * 1e6, "close_s": args.close_s}
    doc = {"params": params, "rows": rows, "checks": checks}
    print(json.dumps(doc, indent=1) if args.json else _markdown(params, rows, checks))


def _reduced_row(red: dict[str, Any], n: int, P: int, S: float, per_byte: float, small: float, poll: float,
                 stream: Any) -> dict[str, Any]:
    """The way with leader-side reduction at ``n`` ranks: reduce_bench.py's measurements (scaled by
    ranks from the largest size it ran where it did not run ``n``)."""
    sizes = red["sizes"]
    top = str(n) if str(n) in sizes else max(sizes, key=int)
    m, f = sizes[top], n / int(top)
    nodes = math.ceil(n / P)
    block = m["capture2_bytes"] / m["nodes"]                 # blocks and their drill summaries, per node
    t1 = (P - 1) * (small + S * per_byte) + m["leader_reduce_median_s"] + poll
    t3 = stream(nodes - 1, block) + poll
    t = {k: m[k] * (1 if str(n) in sizes else f) for k in ("encode_capture_s", "write_s", "analyse_s", "report_s")}
    return {"red_rank0_bytes": block * nodes, "red_block_bytes": block, "red_t_level1": t1, "red_t_rank0_receive": t3,
            "red_t_encode": t["encode_capture_s"], "red_t_write": t["write_s"], "red_t_analyse": t["analyse_s"],
            "red_t_report": t["report_s"], "red_mem_analysis_mb": m["maxrss_mb"] * (1 if str(n) in sizes else f),
            "red_scaled": str(n) not in sizes,
            "red_total": sum(t.values()) + t1 + t3}


def _markdown(params: dict[str, Any], rows: list[dict[str, Any]], checks: dict[str, Any]) -> str:
    def ms(x: float) -> str:
        return f"{x * 1e3:,.1f}" if x < 10 else f"{x * 1e3:,.0f}"

    lines = ["| | " + " | ".join(f"{r['ranks']:,} ranks" for r in rows) + " |",
             "|---|" + "---:|" * len(rows)]

    def row(name: str, fmt: Any) -> None:
        lines.append(f"| {name} | " + " | ".join(fmt(r) for r in rows) + " |")

    row("node leaders / second-level groups (proposed)", lambda r: f"{r['leaders']:,} / {r['groups'] or '–'}")
    row("messages into rank 0 × size", lambda r: f"{r['rank0_messages']:,} × {r['rank0_message_bytes'] / 1e3:,.0f} kB")
    row("bytes into rank 0", lambda r: f"{r['rank0_bytes'] / 1e6:,.1f} MB")
    row("window close on every rank (profiler stop, summary; §6), ms", lambda r: ms(r["t_close"]))
    row("level 1: a node leader takes 7 summaries, packs a bundle, ms", lambda r: ms(r["t_level1"]))
    row("level 2 (proposed): a group leader takes 31 bundles, ms",
        lambda r: ms(r["t_level2"]) if r["groups"] else "–")
    row("rank 0 receives and merges: with the second level, ms", lambda r: ms(r["t_rank0_receive"]))
    row("rank 0 receives and merges: today (two levels), ms", lambda r: ms(r["t_rank0_receive_today"]))
    row("capture file assembled (encode_capture), ms", lambda r: ms(r["t_encode"]))
    row("capture file written (atomic, fsync), ms", lambda r: ms(r["t_write"]))
    row("analysis: decode, validate, columns, diagnose, ms", lambda r: ms(r["t_analyse"]))
    row("diagnosis JSON, report.json/html, text, ms", lambda r: ms(r["t_report"]))
    row("**window close → printed diagnosis**, s: second level / today",
        lambda r: f"**{r['total']:.2f}** / {r['total_today']:.2f}")
    row("rank 0 memory in the gather (merged summaries + capture file), MB",
        lambda r: f"{r['rank0_mem_gather_mb']:,.0f}")
    row("rank 0 memory in the analysis (peak RSS of the analyst's work), MB",
        lambda r: f"{r['rank0_mem_analysis_mb']:,.0f}")
    row("rank-0 costs below the gather", lambda r: "scaled from 10k" if r["scaled"] else "measured")
    reduced = (("bytes into rank 0 (blocks + drill-down summaries)", lambda r: f"{r['red_rank0_bytes'] / 1e6:,.1f} MB"),
               ("a node leader takes 7 summaries, reduces them, ms", lambda r: ms(r["red_t_level1"])),
               ("rank 0 receives the blocks, ms", lambda r: ms(r["red_t_rank0_receive"])),
               ("capture/2 assembled + written, ms", lambda r: ms(r["red_t_encode"] + r["red_t_write"])),
               ("analysis of the blocks, ms", lambda r: ms(r["red_t_analyse"])),
               ("reports, ms", lambda r: ms(r["red_t_report"])),
               ("**window close → printed diagnosis**, s", lambda r: f"**{r['t_close'] + r['red_total']:.2f}**"),
               ("rank 0 memory in the analysis (peak RSS), MB", lambda r: f"{r['red_mem_analysis_mb']:,.0f}"),
               ("rank-0 costs", lambda r: "scaled" if r["red_scaled"] else "measured"))
    for name, fmt in reduced if rows and "red_total" in rows[0] else ():
        row(f"with leader reduction: {name}", fmt)
    return "\n".join(lines) + "\n\nparams: " + json.dumps(params) + "\nchecks: " + json.dumps(checks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--out", required=True)
    m.add_argument("--full", action="store_true", help="also time 100,000 ranks (~2 GB; take the bench lock)")
    c = sub.add_parser("child")
    c.add_argument("ranks", type=int)
    c.add_argument("workdir")
    p = sub.add_parser("mpi")
    p.add_argument("--out", required=True)
    p.add_argument("--summary-bytes", default=11423, type=int)
    p.add_argument("--reps", default=30, type=int)
    q = sub.add_parser("mpi-rank0")
    q.add_argument("--out", required=True)
    q.add_argument("--summary-bytes", default=11423, type=int)
    q.add_argument("--sizes", default="1000,10000,100000")
    d = sub.add_parser("model")
    d.add_argument("--measured", required=True)
    d.add_argument("--mpi", default=None, help="the mpi subcommand's JSON (16 ranks)")
    d.add_argument("--rank0", default=None, help="the mpi-rank0 subcommand's JSON")
    d.add_argument("--reduced", default=None, help="reduce_bench.py's JSON (leader-side reduction)")
    d.add_argument("--poll-ms", type=float, default=5.0,
                   help="per level: a waiting receiver sleeps up to this long between tests (sidechannel._poll)")
    d.add_argument("--summary-bytes", type=float, default=None)
    d.add_argument("--per-node", type=int, default=8)
    d.add_argument("--group", type=int, default=32, help="leaders per second-level group")
    d.add_argument("--second-level-above", type=int, default=128, help="leaders before a second level")
    d.add_argument("--net-gbps", type=float, default=100.0, help="rank 0's link into the side channel")
    d.add_argument("--net-latency-us", type=float, default=5.0)
    d.add_argument("--recv-us", type=float, default=20.0, help="without --mpi: software cost per message")
    d.add_argument("--close-s", type=float, default=0.61, help="profiler stop + events + summary.build (§6)")
    d.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.cmd == "child":
        print(json.dumps(analysis_child(args.ranks, args.workdir)))
    elif args.cmd == "measure":
        measure(args)
    elif args.cmd == "mpi":
        mpi(args)
    elif args.cmd == "mpi-rank0":
        mpi_rank0(args)
    else:
        model(args)


if __name__ == "__main__":
    main()
