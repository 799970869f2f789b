"""`eroica analyze --traces`: existing per-rank torch.profiler chrome traces through the one builder and engine.

Why: the traces teams already have must get the diagnosis eroica would have printed live. Real NCCL GPU
traces (tests/data/traces, HolisticTraceAnalysis test data) prove the GPU reading: NCCL kernels are
communication, never compute; copies are split by direction and pageable/pinned host memory with the
trace's own times and bytes; device copies of user annotations are never kernels; device compute,
collective, exposed-collective, copy, busy and idle time a step are the trace's own interval
arithmetic; two sampled ranks of a 128-rank job are compared as peers. Small synthetic traces pin the
bad-input errors. The multi-rank test runs the fault bench's job live under eroica and profiled as
torch documents it (a schedule that repeats, a file per cycle and rank), and checks that the traces'
cycles, one capture each, name the culprit and category the live captures named.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import ROOT, eroica_run, explain

from eroica_launch import tracefile, tracejob, traces
from eroica_launch.offline import analyze_cmd
from eroica_runtime import summary as summary_mod
from eroica_runtime.summary import chrome
from eroica_runtime.summary.events import classify

DATA = Path(__file__).resolve().parent / "data" / "traces"
SAMPLED = [DATA / "hta-sampled_rank-0.json.gz", DATA / "hta-sampled_rank-1.json.gz"]
NCCL = DATA / "hta-nccl_data.json.gz"
PUBLIC = [*SAMPLED, NCCL]
LAGGED = DATA / "hta-trace_diff-test.json.gz"   # the host runs ~40 ms ahead of its GPU
ROCM = DATA / "hta-mi250-rank-0.json.gz"         # an AMD MI250 under ROCm


def _summaries(paths: list[Path], *ranges: tuple[int, int]) -> list[dict[str, Any]]:
    job = traces.plan(paths, list(ranges))
    return [summary_mod.decode(blob, origin=t.name) for t in job.traces
            for blob in traces.summarise(t, job.windows, job.world)]


def _analyze(*args: str | Path) -> Any:
    return CliRunner().invoke(analyze_cmd, [str(a) for a in args])


def _mini_trace(path: Path, *, rank: int | None = None, world: int | None = None, steps: range = range(6),
                backend: str = "gloo", pg_size: int = 2, slow_ms: float = 0.0, job_slow_ms: float = 0.0,
                gc_ms: float = 0.0, array: bool = False, gz: bool = False) -> Path:
    """A small CPU trace as torch writes it: ProfilerStep#N on the main thread, a matmul (``slow_ms``
    longer on a slow rank), then a gloo allreduce on a worker thread that lasts until the slowest rank
    (``job_slow_ms``) joins it, the main thread waiting outside any op; optionally a GC pause."""
    events: list[dict[str, Any]] = []
    t, ext = 1_700_000_000_000.0, 1
    for n in steps:
        mm = 4000.0 + slow_ms * 1000
        step = 4000.0 + job_slow_ms * 1000 + 3000 + gc_ms * 1000
        events += [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 7, "tid": 7, "ts": t,
             "dur": step, "args": {"External id": ext}},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7, "tid": 7, "ts": t + 500, "dur": mm,
             "args": {"External id": ext + 1}},
            {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 7, "tid": 9,
             "ts": t + 600 + mm, "dur": step - gc_ms * 1000 - 1000 - mm, "args": {"External id": ext + 2}},
            {"ph": "s", "id": ext, "pid": 7, "tid": 7, "ts": t, "cat": "fwdbwd", "name": "fwdbwd"}]
        if gc_ms:
            events.append({"ph": "X", "cat": "python_function", "name": "Python GC", "pid": 7, "tid": 7,
                           "ts": t + step - gc_ms * 1000, "dur": gc_ms * 1000, "args": {}})
        t, ext = t + step, ext + 3
    doc: dict[str, Any] = {"schemaVersion": 1}
    if rank is not None:
        doc["distributedInfo"] = {"backend": backend, "rank": rank, "world_size": world, "pg_count": 1,
                                  "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": backend,
                                                 "pg_size": pg_size, "ranks": list(range(pg_size))}]}
    doc["traceEvents"] = events
    doc["traceName"] = str(path)
    text = json.dumps(events if array else doc).encode()
    path.write_bytes(gzip.compress(text) if gz else text)
    return path


# ---------------------------------------------------------------------------------------------- real GPU traces
@pytest.mark.parametrize("path", PUBLIC, ids=lambda p: p.name)
def test_every_nccl_kernel_is_a_collective_never_compute(path: Path) -> None:
    reader = tracefile.read(tracefile.inspect(path))
    kernels = [ev for ev in reader.events if ev.gpu and ev.activity == "kernel"]
    for ev in kernels:
        classify(ev)
    nccl = [ev for ev in kernels if "nccl" in ev.name.lower()]
    assert len(nccl) >= 10, [ev.name for ev in kernels][:20]
    assert {ev.kind for ev in nccl} == {"collective"} and {ev.marker for ev in nccl} == {"comm"}
    assert [ev for ev in kernels if ev.kind == "kernel"], "the compute kernels must stay compute"
    # and in the built summary: every NCCL row is communication, in the comm phase
    for s in _summaries([path]):
        rows = [f for f in s["functions"] if "nccl" in f["name"].lower() and f["kind"] != "annotation"]
        assert rows and all(f["kind"] == "collective" and f["phase"] == "comm" for f in rows), rows
        assert not [f for f in s["functions"] if f["kind"] == "kernel" and "nccl" in f["name"].lower()]


@pytest.mark.parametrize("path", PUBLIC, ids=lambda p: p.name)
def test_phases_and_device_time_are_nonzero(path: Path) -> None:
    (s,) = _summaries([path])
    ph, dev = s["phases"], s["device_phases"]
    assert s["profile"]["step_source"] == "profiler" and s["capture"]["trigger"] == "traces"
    assert ph["step"] > 100 and ph["forward"] > 0 and ph["backward"] > 0 and ph["comm_total"] > 0
    assert dev["busy"] > 0 and dev["compute"] > 0 and dev["comm"] > 0 and dev["comm_exposed"] > 0
    assert dev["compute"] < ph["step"] and dev["forward"] + dev["backward"] > 0
    assert s["steps"] and all(st["ms"] > 0 for st in s["steps"])


@pytest.mark.parametrize("path", SAMPLED, ids=lambda p: p.name)
def test_copies_are_split_by_direction_and_host_memory_kind(path: Path) -> None:
    """A rank whose host-to-device copies grew must be told whether they came from pageable memory (pin
    it) and how many bytes went which way. The sampled GPU traces hold pageable and pinned HtoD copies,
    pageable DtoH and DtoD ones and memsets: the summary's per-direction time and bytes a step are the
    trace's own sums (all of its 2 steps are the window), and no copy or memset is a kernel row."""
    raw = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    want: dict[str, float] = {}
    for ev in raw:
        if ev.get("cat") != "gpu_memcpy":
            continue
        way = re.search(r"\b(HtoD|DtoH|DtoD|PtoP)\b", ev["name"]).group(1).lower()
        for key in (way, f"{way}_pageable") if "Pageable" in ev["name"] else (way,):
            want[f"{key}_ms"] = want.get(f"{key}_ms", 0.0) + ev["dur"] / 1e3
            want[f"{key}_mb"] = want.get(f"{key}_mb", 0.0) + ev["args"]["bytes"] / 1e6
    (s,) = _summaries([path])
    steps = len(s["steps"])
    assert steps == 2 and {"htod_pageable_ms", "htod_ms", "dtoh_pageable_ms", "dtod_ms"} <= set(want), want
    dev = s["device_phases"]
    got = {k: dev.get(k) for k in want}
    assert got == pytest.approx({k: v / steps for k, v in want.items()}, rel=1e-3, abs=1e-3), (got, want)
    assert 0 < dev["htod_pageable_ms"] < dev["htod_ms"] and 0 < dev["htod_pageable_mb"] < dev["htod_mb"]
    copies_ms = sum(ev["dur"] for ev in raw if ev.get("cat") in ("gpu_memcpy", "gpu_memset")) / 1e3 / steps
    assert max(dev["htod_ms"], dev["dtod_ms"]) <= dev["transfer"] <= copies_ms + 1e-3, (dev["transfer"], copies_ms)
    assert not [f["name"] for f in s["functions"] if f["kind"] == "kernel" and re.match(r"Mem(cpy|set)\b", f["name"])]


# plain interval arithmetic for the device-timeline test, written apart from summary/intervals.py on
# purpose: the builder's own functions would check the builder against itself
def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _ms(spans: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in spans) / 1e3


def _minus(keep: list[tuple[float, float]], cut: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in keep:
        for c, d in cut:
            if d <= a or c >= b:
                continue
            if c > a:
                out.append((a, c))
            a = max(a, d)
        if a < b:
            out.append((a, b))
    return out


def _window(raw: list[dict[str, Any]], s: dict[str, Any]) -> list[tuple[float, float]]:
    """The host's ProfilerStep spans of the summary's steps, in the raw trace."""
    names = {f"ProfilerStep#{st['step']}" for st in s["steps"]}
    return _union([(ev["ts"], ev["ts"] + ev["dur"]) for ev in raw
                   if ev.get("cat") == "user_annotation" and ev.get("name") in names])


@pytest.mark.parametrize("path", [*PUBLIC, LAGGED], ids=lambda p: p.name)
def test_device_timeline_a_step_is_the_traces_own_interval_arithmetic(path: Path) -> None:
    """What the engine weighs on a GPU job: compute kernels (a culprit's excess), collective kernels and
    the part of them nothing else overlapped (a victim spinning for its peers), copies, busy and idle.
    Each a step equals the same arithmetic done here on the raw trace, over the host's spans of the
    window's steps: union of the compute kernels, of the NCCL kernels, of copies and memsets; exposed =
    NCCL less (compute or copy); busy = all three; idle = step - busy."""
    raw = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    (s,) = _summaries([path])
    window = _window(raw, s)

    def spans(keep: Any) -> list[tuple[float, float]]:
        ran = _union([(ev["ts"], ev["ts"] + ev["dur"]) for ev in raw if keep(ev)])
        return _minus(ran, _minus(ran, window))   # what ran during the window's steps

    compute = spans(lambda ev: ev.get("cat") == "kernel" and "nccl" not in ev["name"].lower())
    nccl = spans(lambda ev: ev.get("cat") == "kernel" and "nccl" in ev["name"].lower())
    copies = spans(lambda ev: ev.get("cat") in ("gpu_memcpy", "gpu_memset"))
    n, dev = len(s["steps"]), s["device_phases"]
    want = {"compute": _ms(compute) / n, "comm": _ms(nccl) / n, "transfer": _ms(copies) / n,
            "comm_exposed": _ms(_minus(nccl, _union(compute + copies))) / n,
            "busy": _ms(_union(compute + nccl + copies)) / n}
    want["idle"] = s["phases"]["step"] - want["busy"]
    got = {k: dev[k] for k in want}
    assert got == pytest.approx(want, rel=1e-3, abs=1e-3), (got, want)
    assert 0 < dev["comm_exposed"] < dev["comm"] and dev["compute"] > 0


def test_device_work_counts_in_the_steps_it_ran_in_when_the_host_runs_ahead() -> None:
    """On an asynchronous NCCL job the host enqueues a step's kernels and moves on: the GPU runs them
    later, and furthest behind on the rank whose GPU is slowest. In the lagged trace (rank 1 of a
    2-rank job, host ~40 ms ahead), the window's first steps run kernels launched before the window
    and its last step's kernels run after the host closed it. The device timeline is what the GPU did
    during the window's steps: taking kernels by launch and clipping them to the steps (as the trace
    reader once did) lost 12 of 87 ms of compute a step, and would lose most on the culprit."""
    raw = json.loads(gzip.decompress(LAGGED.read_bytes()))["traceEvents"]
    (s,) = _summaries([LAGGED])
    window = _window(raw, s)
    lo, hi, n = window[0][0], window[-1][1], len(s["steps"])
    launched = {ev["args"]["correlation"]: ev["ts"] for ev in raw
                if ev.get("cat") == "cuda_runtime" and "correlation" in ev.get("args", {})}
    kernels = [ev for ev in raw if ev.get("cat") == "kernel" and "nccl" not in ev["name"].lower()]
    when = [(ev, launched.get(ev["args"].get("correlation"))) for ev in kernels]
    early = sum(ev["dur"] for ev, t in when if t is not None and t < lo < ev["ts"] + ev["dur"]) / 1e3
    late = sum(ev["dur"] for ev, t in when if t is not None and lo <= t < hi <= ev["ts"]) / 1e3
    assert early > 30 and late > 30, (early, late)   # the trace's shape: ms of kernels across each edge

    def clipped(evs: list[dict[str, Any]]) -> float:
        ran = _union([(ev["ts"], ev["ts"] + ev["dur"]) for ev in evs])
        return _ms(_minus(ran, _minus(ran, window))) / n

    ran_in = clipped(kernels)
    by_launch = clipped([ev for ev, t in when if t is not None and lo <= t < hi])
    assert ran_in - by_launch > 5, (ran_in, by_launch)   # the two readings differ on this trace
    assert s["device_phases"]["compute"] == pytest.approx(ran_in, rel=1e-3)


def test_device_work_launched_before_the_window_gets_its_launcher_and_phase() -> None:
    """The lagged trace's window opens on ~70 ms of kernels the step before it launched (its host ops
    are left out, as a live capture's lead-in records none). Each takes the launcher and phase of its
    counterpart in the window's first step; the trace itself says what they were: the op it names
    (all of it is in the file), and the phase the builder gives that op when the step is in the
    window. Without it, 11% of the window's device work had no phase and no launcher."""
    reader = tracefile.read(tracefile.inspect(LAGGED))
    ops = {ev.corr: ev.name for ev in reader.events if not ev.gpu and ev.corr and not ev.linked}
    first = 1010

    def built(steps: list[int]) -> list[Any]:
        evs = chrome.select(reader, steps)
        summary_mod.build(evs, identity={"rank": 1, "world_size": 2}, capture={"step": steps[0], "k": len(steps)},
                          steps=[], gc={}, telemetry={})
        return evs

    truth = {id(ev): ev.phase for ev in built(list(range(first - 1, first + 4))) if ev.gpu}
    window = built(list(range(first, first + 4)))
    recorded = {ev.corr for ev in window if not ev.gpu and ev.corr and not ev.linked}
    early = [ev for ev in window if ev.gpu and not ev.annotation and ev.linked not in recorded]
    early_ms = sum(ev.end - ev.start for ev in early)
    assert early_ms > 50 and {truth[id(ev)] for ev in early} >= {"backward", "optimizer"}, early_ms
    assert all(ev.phase == truth[id(ev)] for ev in early), [(ev.name, ev.phase, truth[id(ev)]) for ev in early
                                                              if ev.phase != truth[id(ev)]][:5]
    (s,) = _summaries([LAGGED])
    dev = s["device_phases"]
    assert dev["forward"] + dev["backward"] + dev["optimizer"] == pytest.approx(dev["compute"], rel=0.02), dev
    # a kernel row names the op that launched most of it: what the trace's own links say
    rows = {(f["name"], f["phase"]): f.get("launcher") for f in s["functions"] if f["kind"] == "kernel"}
    keys = {(ev.name[:summary_mod.NAME_LIMIT], ev.phase) for ev in early} & set(rows)
    said: dict[Any, dict[str, int]] = {key: {} for key in keys}
    for ev in window:
        key = (ev.name[:summary_mod.NAME_LIMIT], ev.phase)
        if ev.gpu and key in said:
            said[key][ops[ev.linked]] = said[key].get(ops[ev.linked], 0) + 1
    assert len(keys) >= 5, keys
    for key, counts in said.items():
        assert counts.get(rows[key]) == max(counts.values()), (key, rows[key], counts)


def test_a_rocm_trace_reads_like_a_cuda_one() -> None:
    """An AMD MI250 under ROCm 6.2 (torch.profiler through roctracer): Tensile GEMMs (Cijk_...) and
    ATen's HIP kernels are compute, tied to the ops that launched them and their phases; the HtoD
    copies are transfers (roctracer records no bytes: 0 MB, not a guess); the device copies of
    ProfilerStep and Optimizer.step are annotations."""
    (s,) = _summaries([ROCM])
    rows = {f["name"]: f for f in s["functions"]}
    gemms = [f for name, f in rows.items() if name.startswith("Cijk_")]
    assert {(f["kind"], f["launcher"], f["phase"]) for f in gemms} == {("kernel", "aten::addmm", "forward"),
                                                                      ("kernel", "aten::mm", "backward")}, gemms
    assert not [f for f in s["functions"] if f["kind"] == "collective"]
    assert not [f for f in s["functions"] if f["kind"] == "kernel" and f["name"].startswith(("ProfilerStep",
                                                                                             "Optimizer.step"))]
    dev = s["device_phases"]
    assert dev["compute"] > 0 and dev["htod_ms"] > 0 and dev["htod_mb"] == 0 and dev["comm"] == 0
    assert dev["forward"] > 0 and dev["backward"] > 0 and dev["optimizer"] > 0


def test_device_copies_of_user_annotations_are_never_kernels() -> None:
    """On the GPU the profiler copies record_function ranges onto the device timeline (ProfilerStep#N,
    DistributedDataParallel.forward, Optimizer.step#..., nccl:all_reduce): they span whole phases, so read
    as kernels they would count a phase's wall time as compute (gpu-check failed that way on the H200).
    In the NCCL trace they are there, and none is a kernel row or in the device's compute time."""
    raw = json.loads(gzip.decompress(NCCL.read_bytes()))["traceEvents"]
    notes = {ev["name"] for ev in raw if ev.get("cat") == "gpu_user_annotation"}
    assert {"DistributedDataParallel.forward", "nccl:all_reduce"} <= notes, notes
    (s,) = _summaries([NCCL])
    assert not [f for f in s["functions"] if f["name"] in notes and f["kind"] == "kernel"], s["functions"]
    # device compute a step is what the compute kernels ran (the window is the trace's 3 steps): the
    # annotations' spans (~123 ms a step, three times the kernels) add nothing
    steps = len(s["steps"])
    kernels_ms = sum(ev["dur"] for ev in raw if ev.get("cat") == "kernel"
                     and "nccl" not in ev["name"].lower()) / 1e3 / steps
    notes_ms = sum(ev["dur"] for ev in raw if ev.get("cat") == "gpu_user_annotation") / 1e3 / steps
    assert steps == 3 and notes_ms > 2 * kernels_ms > 0, (steps, notes_ms, kernels_ms)
    assert s["device_phases"]["compute"] == pytest.approx(kernels_ms, rel=1e-3), (s["device_phases"], kernels_ms)


def test_kernels_are_tied_to_the_ops_that_launched_them() -> None:
    """Newer Kineto names the launching op in a kernel's External id; the sampled traces (older) give the
    runtime call's id, so the kernel is tied through its runtime call to the op around it."""
    for path, launcher in ((SAMPLED[0], "nccl:all_to_all"), (NCCL, "record_param_comms")):
        reader = tracefile.read(tracefile.inspect(path))
        ops = {ev.corr for ev in reader.events if not ev.gpu and ev.corr and not ev.linked}
        work = [ev for ev in reader.events if ev.gpu and not ev.annotation]
        tied = sum(ev.linked in ops for ev in work)
        assert tied >= 0.95 * len(work), (path.name, tied, len(work))
        (s,) = _summaries([path])
        nccl = [f for f in s["functions"] if f["kind"] == "collective" and "launcher" in f]
        assert any(f["launcher"] == launcher for f in nccl), nccl


def test_two_sampled_ranks_are_analysed_as_peers_of_one_job(tmp_path: Path) -> None:
    out = tmp_path / "report"
    res = _analyze("--traces", *SAMPLED, "--out", out)
    assert res.exit_code == 0, res.output + res.stderr
    assert "2 of the job's 128 ranks have traces" in res.stderr
    assert "eroica: step 551 (traces)" in res.stdout and "2/2 ranks" in res.stdout
    meta, sums, errors = summary_mod.decode_capture((out / "captures" / "551.msgpack").read_bytes())
    assert not errors and meta["world_size"] == 2 and meta["trigger"] == "traces"
    assert sorted(s["rank"] for s in sums) == [0, 1] and {s["world_size"] for s in sums} == {128}
    assert {s["capture"]["k"] for s in sums} == {2}
    diag = json.loads((out / "diagnosis-551.json").read_text())
    assert diag["ranks_analysed"] == 2 and diag["peers"]["sizes"] == [2], diag["peers"]
    report = json.loads((out / "report.json").read_text())
    assert report["schema"] == "eroica.report/1" and report["world_size"] == 2
    assert (out / "report.html").read_text().lower().startswith("<!doctype html>")
    # the written report directory is an ordinary one: `eroica analyze DIR` gives the same diagnosis
    again = _analyze(out)
    assert again.exit_code == 0 and again.stdout == res.stdout


def test_a_lone_trace_is_summarised_but_not_diagnosed(tmp_path: Path) -> None:
    res = _analyze("--traces", NCCL, "--out", tmp_path / "r")
    assert res.exit_code == 0, res.output
    assert "one trace" in res.stderr and "not diagnosed" in res.stdout and "missing ranks: 1" in res.stdout
    meta, sums, _ = summary_mod.decode_capture((tmp_path / "r" / "captures" / "4.msgpack").read_bytes())
    assert meta["world_size"] == 2 and meta["missing"] == [1] and sums[0]["device"]["name"].startswith("NVIDIA")


def test_a_lone_trace_without_a_world_size_is_a_lone_rank_of_a_job_its_rank_allows(tmp_path: Path) -> None:
    """HolisticTraceAnalysis's traces often record distributedInfo with a rank and no world size; one such
    rank-3 trace is analysed alone (a job of at least 4 ranks: not diagnosed, its profile printed), not
    refused for want of ranks 0-2."""
    trace = _mini_trace(tmp_path / "t.json", rank=3)
    res = _analyze("--traces", trace, "--out", tmp_path / "r")
    assert res.exit_code == 0, res.output
    assert "world size is not in the trace: taken as 4" in res.stderr, res.stderr
    assert "not diagnosed" in res.stdout and "eroica: rank 3 alone" in res.stdout, res.stdout
    meta, sums, _ = summary_mod.decode_capture(next((tmp_path / "r" / "captures").glob("*.msgpack")).read_bytes())
    assert meta["world_size"] == 4 and [s["rank"] for s in sums] == [3]


def test_one_trace_with_no_rank_anywhere_is_profiled_as_rank_0(tmp_path: Path) -> None:
    """A single-GPU job's trace (HTA's MI250 one, renamed: no distributedInfo, no rank in its name) is
    what a user most often has; alone, its rank changes nothing, so it is profiled as rank 0, and the
    note says the rank was taken. Two such traces are still refused (test_bad_inputs_are_one_line_errors)."""
    trace = tmp_path / "minitoy_train.json.gz"
    shutil.copy(ROCM, trace)
    res = _analyze("--traces", trace, "--out", tmp_path / "r")
    assert res.exit_code == 0, res.output
    assert "taken as rank 0" in res.stderr and "eroica: rank 0 alone" in res.stdout, (res.stderr, res.stdout)
    assert "healthy" not in res.stdout and "one rank, no peer to compare it with" in res.stdout, res.stdout
    assert "heaviest device work" in res.stdout and "Cijk_" in res.stdout, res.stdout


def test_a_lone_trace_gets_its_ranks_profile(tmp_path: Path) -> None:
    """Often one rank's trace is all a team kept. Nothing can be compared, but where the step went can
    be said: the host's phases, the device's busy, compute, collective (and exposed) and copy time,
    and the heaviest host ops and device work with the op that launched it, from the summary itself."""
    out = tmp_path / "r"
    res = _analyze("--traces", LAGGED, "--out", out)
    assert res.exit_code == 0, res.output
    (s,) = _summaries([LAGGED])
    dev = s["device_phases"]
    lines = res.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("eroica: rank 1 alone, steps 1010-1013: "))
    assert f"{s['phases']['step']:.1f} ms a step" in lines[head] and "not a diagnosis" in lines[head]
    assert lines[head + 1].startswith("  host ms a step: ") and f"forward {s['phases']['forward']:.1f}" in lines[head + 1]
    assert lines[head + 2].startswith(f"  device ms a step: busy {dev['busy']:.1f} ")
    assert f"compute {dev['compute']:.1f}, collectives {dev['comm']:.1f} ({dev['comm_exposed']:.1f} with no" in lines[head + 2]
    assert f"HtoD {dev['htod_ms']:.1f} ms {dev['htod_mb']:.1f} MB" in lines[head + 2]
    assert "heaviest device work" in lines[head + 4] and "ncclKernel_SendRecv" in lines[head + 4]
    assert "from nccl:all_to_all" in lines[head + 4]
    # the report directory says the same when analysed again
    again = _analyze(out)
    assert again.stdout == res.stdout
    # ranks with peers get their diagnosis, not a profile
    assert "alone" not in _analyze("--traces", *SAMPLED, "--out", tmp_path / "two").stdout


def test_gzip_and_plain_json_give_the_same_summary(tmp_path: Path) -> None:
    plain = tmp_path / "hta-sampled_rank-0.json"
    plain.write_bytes(gzip.decompress(SAMPLED[0].read_bytes()))
    a, b = _summaries([SAMPLED[0]]), _summaries([plain])
    for s in (*a, *b):
        s["profile"]["build_ms"] = 0
        s["host"] = ""   # "<file name>" when the trace names no host
    assert a == b


# ---------------------------------------------------------------------------------------------- synthetic traces
def test_reader_keeps_what_a_live_capture_records() -> None:
    """Host ops, annotations, runtime calls and device work are read (ms from the first event); flows,
    instants, metadata, the profiler's span, Python-function events other than GC and torch's own
    utility records are not; malformed events are counted, never raised."""
    r = chrome.Reader()
    for e in [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 5, "ts": 1000.0, "dur": 500.0,
         "args": {"External id": 10}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 99, "ts": 1100.0,
         "dur": 5.0, "args": {"External id": 10, "correlation": 77}},
        {"ph": "X", "cat": "kernel", "name": "ampere_sgemm", "pid": 0, "tid": 7, "ts": 1200.0, "dur": 300.0,
         "args": {"External id": 10, "correlation": 77, "device": 0, "stream": 7}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 7,
         "ts": 1600.0, "dur": 10.0, "args": {"correlation": 78, "device": 0, "stream": 7, "bytes": 4096}},
        {"ph": "X", "cat": "python_function", "name": "train.py(3): step", "pid": 1, "tid": 5, "ts": 900.0,
         "dur": 900.0},
        {"ph": "X", "cat": "python_function", "name": "Python GC", "pid": 1, "tid": 5, "ts": 1700.0, "dur": 50.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::is_leaf", "pid": 1, "tid": 5, "ts": 1000.0, "dur": 1.0},
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "x", "ts": 0, "dur": 9},
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 77, "pid": 1, "tid": 5, "ts": 1100.0},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 5, "ts": 1300.0},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 5, "args": {"name": "main"}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 5, "dur": 3.0},
        {"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 5, "ts": 1.0, "dur": 3.0},
        "not an event",
    ]:
        r.add(e)
    evs = {ev.name: ev for ev in r.finish()}
    assert sorted(evs) == ["Memcpy HtoD (Pageable -> Device)", "ampere_sgemm", "aten::mm", "cudaLaunchKernel"]
    assert r.skipped == 2 and r.gc == [(0.7, 0.75)] and r.devices == {0}
    mm, launch, kernel, copy = (evs[n] for n in ("aten::mm", "cudaLaunchKernel", "ampere_sgemm",
                                                 "Memcpy HtoD (Pageable -> Device)"))
    assert (mm.start, mm.end) == (0.0, 0.5) and mm.corr == 10 and not mm.gpu
    assert launch.thread == mm.thread and launch.linked == 10 and not launch.corr   # on its op's thread
    assert kernel.gpu and kernel.linked == 10 and kernel.thread == ("gpu", 0, 7)
    classify(copy)
    assert (copy.kind, copy.copy, copy.pageable, copy.nbytes) == ("memcpy", "HtoD", True, 4096)


def test_a_slow_rank_is_named_and_gc_pauses_are_read(tmp_path: Path) -> None:
    """CPU traces, ranks from file names, one of them slow in compute, one with GC pauses, one in the
    JSON Array Format and gzipped: the culprit and its victims come out of the one engine."""
    d = tmp_path / "traces"
    d.mkdir()
    _mini_trace(d / "trace-rank0.json", job_slow_ms=30)
    _mini_trace(d / "trace-rank1.json", slow_ms=30, job_slow_ms=30)
    _mini_trace(d / "trace-rank2.json.gz", job_slow_ms=30, array=True, gz=True)
    _mini_trace(d / "trace-rank3.json", job_slow_ms=30, gc_ms=2)
    res = _analyze("--traces", d, "--out", tmp_path / "r")
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    top = report["findings"][0]
    assert (top["rank"], top["category"]) == (1, "compute") and top["victims"] == [0, 2, 3], top
    sums = _summaries([d])
    by_rank = {s["rank"]: s for s in sums}
    assert by_rank[3]["gc"] == {"count": 1, "ms": 2} and by_rank[3]["phases"]["gc"] == 2
    assert by_rank[0]["gc"]["count"] == 0


def test_steps_pick_the_captures_and_the_baseline(tmp_path: Path) -> None:
    paths = [_mini_trace(tmp_path / f"rank{r}.json", rank=r, world=2, steps=range(10)) for r in range(2)]
    res = _analyze("--traces", *paths, "--out", tmp_path / "r", "--steps", "6-8", "--baseline-steps", "2-3")
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert [(c["step"], c["trigger"]) for c in report["captures"]] == [(2, "baseline"), (6, "traces")]
    _, sums, _ = summary_mod.decode_capture((tmp_path / "r" / "captures" / "6.msgpack").read_bytes())
    assert [st["step"] for st in sums[0]["steps"]] == [6, 7, 8] and sums[0]["profile"]["steps"] == 3


def test_a_rank_may_have_one_trace_per_profiling_cycle(tmp_path: Path) -> None:
    """schedule(..., repeat=N) with tensorboard_trace_handler writes a file per cycle per rank. Each cycle
    is a capture built from that cycle's file of every rank (rank 1 is slow in the second cycle only,
    and only the second capture names it); a capture may not straddle two cycles; a file holding steps
    another file of its rank holds is the same trace twice."""
    d = tmp_path / "traces"
    d.mkdir()
    for r in range(4):
        for c, steps in enumerate((range(0, 6), range(6, 12))):
            slow = 30.0 if (r, c) == (1, 1) else 0.0
            _mini_trace(d / f"host_{100 + r}.{c}.pt.trace.json", rank=r, world=4, pg_size=4, steps=steps,
                        slow_ms=slow, job_slow_ms=30.0 if c == 1 else 0.0)
    res = _analyze("--traces", d, "--out", tmp_path / "r")
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert [c["step"] for c in report["captures"]] == [1, 7]     # each cycle less its edge steps
    # traces hold no job length: the job line names the traced steps, not "11 steps"
    assert report["job"]["traced_steps"] == [[1, 4], [7, 10]], report["job"]
    assert "world size 4, traced steps 1-4, 7-10 — " in res.stdout, res.stdout
    named = [[(f["rank"], f["category"]) for f in c["findings"]] for c in report["captures"]]
    assert named == [[], [(1, "compute")]], named
    _, sums, _ = summary_mod.decode_capture((tmp_path / "r" / "captures" / "7.msgpack").read_bytes())
    assert sorted(s["rank"] for s in sums) == [0, 1, 2, 3]
    assert all([st["step"] for st in s["steps"]] == [7, 8, 9, 10] for s in sums)

    said: list[str] = []
    job = traces.plan([d], [(8, 9)], None, said.append)
    traces.write_captures(tmp_path / "one", job, said.append)
    read = sorted(m.split()[3].rstrip(":") for m in said if m.startswith("eroica: analyze: read "))
    assert read == [f"host_{100 + r}.1.pt.trace.json" for r in range(4)]   # the first cycle's files unread

    res = _analyze("--traces", d, "--out", tmp_path / "split", "--steps", "4-7")
    assert res.exit_code == 2 and "steps 4-7 are split between this trace and" in res.stderr, res.stderr
    shutil.copy(d / "host_102.1.pt.trace.json", d / "copy.json")
    res = _analyze("--traces", d, "--out", tmp_path / "twice")
    assert res.exit_code == 2 and "rank 2 twice" in res.stderr and "hold the same steps" in res.stderr, res.stderr


def test_process_groups_become_peer_hints(tmp_path: Path) -> None:
    """distributedInfo.pg_config -> the summary's groups, named as the live runtime names them (a
    DeviceMesh dim "mesh_pp" is "pp"); the default group and groups without this rank are left out."""
    t = tracefile.inspect(_mini_trace(tmp_path / "rank1.json", rank=1, world=4))
    t.dist["pg_config"] = [
        {"pg_name": "0", "pg_desc": "default_pg", "pg_size": 4, "ranks": [0, 1, 2, 3]},
        {"pg_name": "1", "pg_desc": "mesh_pp", "pg_size": 2, "ranks": [1, 3]},
        {"pg_name": "2", "pg_desc": "mesh_dp", "pg_size": 2, "ranks": "[0, 1]"},
        {"pg_name": "3", "pg_desc": "mesh_dp", "pg_size": 2, "ranks": [2, 3]}]
    assert traces._groups(t, 4) == [{"name": "pp", "ranks": [1, 3]}, {"name": "dp", "ranks": [0, 1]}]


def test_default_window_is_the_common_steps_less_the_edges(tmp_path: Path) -> None:
    a = tracefile.inspect(_mini_trace(tmp_path / "rank0.json", steps=range(0, 10)))
    b = tracefile.inspect(_mini_trace(tmp_path / "rank1.json", steps=range(2, 12)))
    (w,) = tracejob.choose_windows([a, b], [], None)
    assert w.steps == tuple(range(3, 9)) and w.trigger == "traces"
    short = tracefile.inspect(_mini_trace(tmp_path / "rank2.json", steps=range(0, 3)))
    assert tracejob.choose_windows([short], [], None)[0].steps == (0, 1, 2)


def test_long_reads_report_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracefile, "PROGRESS_EVERY_S", 0.0)
    said: list[str] = []
    tracefile.read(tracefile.inspect(SAMPLED[0], said.append), said.append)
    assert any("reading hta-sampled_rank-0.json.gz:" in s and " of " in s and "MB" in s for s in said), said
    assert said[-1].startswith("eroica: analyze: read hta-sampled_rank-0.json.gz: rank 0, ")


def _torch_trace(path: Path, *, quoted: bool, steps: int = 6) -> Path:
    """A real torch.profiler trace of a few matmul steps. ``quoted`` names what Kineto writes into the JSON
    without escaping (pytorch/pytorch#146900): a record_function range with quotes in its name, and a
    Python frame (``with_stack``) from code compiled under a file name holding quotes, as dynamo makes."""
    import torch
    from torch.profiler import ProfilerAction, ProfilerActivity

    ns: dict[str, Any] = {}
    filename = '<generated {"device": "cpu"}>' if quoted else "<generated>"
    exec(compile("def work(x):\n    return x @ x\n", filename, "exec"), ns)  # noqa: S102 - our own source
    x = torch.ones(64, 64)
    with torch.profiler.profile(activities=[ProfilerActivity.CPU], with_stack=True,
                                schedule=lambda _: ProfilerAction.RECORD) as prof:
        for _ in range(steps):
            with torch.profiler.record_function('load "batch" 7' if quoted else "load batch 7"):
                ns["work"](x)
            prof.step()
    prof.export_chrome_trace(str(path))
    return path


def test_names_torch_wrote_unescaped_are_read_not_refused(tmp_path: Path) -> None:
    """One stray quote in one event name made torch's whole file invalid JSON and cost the rank's trace."""
    quoted = _torch_trace(tmp_path / "trace-rank1.json", quoted=True)
    said: list[str] = []
    reader = tracefile.read(tracefile.inspect(quoted), said.append)
    # 6 ranges and 6 frames at least (torch 2.13 wrote 12 such names, 2.11 wrote 14)
    counts = [int(m.group(1)) for s in said for m in [re.search(r"trace-rank1\.json: (\d+) event names with unescaped quotes", s)] if m]
    assert counts and counts[0] >= 12, \
        (said, "torch now escapes them (pytorch/pytorch#146900 fixed?): the re-escaping read is unused")
    assert set(range(6)) <= set(reader.steps)   # 6 ranges and 6 frames; the steps torch marked
    assert sum(ev.name == 'load "batch" 7' for ev in reader.events) == 6

    plain = _torch_trace(tmp_path / "trace-rank0.json", quoted=False)
    said.clear()
    tracefile.read(tracefile.inspect(plain), said.append)
    assert not any("unescaped" in s for s in said), said
    res = _analyze("--traces", plain, quoted, "--out", tmp_path / "out")
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "out" / "report.json").read_text())["captures"]


def test_older_torch_layout_is_reescaped_and_one_line_json_never_rewritten(tmp_path: Path) -> None:
    """Torch < 2.1 wrote an event's ph, cat, name and pid on one line; the quoted name there is read too.
    JSON another tool wrote on one line is not Kineto's layout: a bad quote in it stays an error."""
    head = '{\n  "schemaVersion": 1,\n  "traceEvents": [\n'
    ev = '  {{\n    "ph": "X", "cat": "{}", "name": "{}", "pid": 1, "tid": 1,\n    "ts": {}, "dur": 5,\n    "args": {{}}\n  }}'
    names = [("user_annotation", "ProfilerStep#1"), ("cpu_op", 'torch/cuda/__init__.py(219): "lazy"'),
             ("cpu_op", "aten::mm")]
    old = tmp_path / "old-rank0.json"
    old.write_text(head + ",\n".join(ev.format(c, n, 100 + i) for i, (c, n) in enumerate(names)) + "\n]}\n")
    reader = tracefile.read(tracefile.inspect(old))
    assert [e.name for e in reader.events] == [n for _, n in names]

    one_line = tmp_path / "tool-rank0.json"
    one_line.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "QUOTE", "pid": 1,
                                                     "tid": 1, "ts": 1.0, "dur": 2.0}]}).replace("QUOTE", 'a"b'))
    with pytest.raises(tracefile.TraceError, match="tool-rank0.json: not a readable chrome trace"):
        tracefile.read(tracefile.inspect(one_line))


@pytest.mark.parametrize("name,rank", [("trace-rank3.json", 3), ("rank-12.json.gz", 12), ("RANK_4.json", 4),
                                       ("worker_5.json", 5), ("job-7.json.gz", 7),
                                       ("worker1.1623143089861.pt.trace.json.gz", 1), ("worker12.json", 12),
                                       ("host_123.1700000000.pt.trace.json", None), ("trace.json", None)])
def test_rank_from_file_name(name: str, rank: int | None) -> None:
    assert tracefile.rank_from_name(Path(name)) == rank


def _bad_case(case: str, tmp: Path) -> tuple[list[Any], str]:
    """(arguments after --traces, text the one error line must hold)."""
    ok0 = _mini_trace(tmp / "rank0.json", rank=0, world=2)
    if case == "not json":
        p = tmp / "rank1.json"
        p.write_text("this is a log file, not JSON\n")
        return [ok0, p], f"{p}: not a readable chrome trace"
    if case == "json but no trace":
        p = tmp / "rank1.json"
        p.write_text('{"loss": [1.0, 0.5], "step": 3}')
        return [ok0, p], f"{p}: not a chrome trace (no traceEvents in it)"
    if case == "truncated gzip":
        p = tmp / "rank1.json.gz"
        p.write_bytes(SAMPLED[1].read_bytes()[:5000])
        return [ok0, p], f"{p}: not a readable chrome trace"
    if case == "no rank":
        p = _mini_trace(tmp / "mytrace.json")
        return [ok0, p], f"{p}: cannot tell which rank this trace is from"
    if case == "rank twice":
        p = tmp / "copy.json"
        shutil.copy(ok0, p)
        return [ok0, p], "rank 0 twice"
    if case == "rank missing":
        a, b = _mini_trace(tmp / "t_rank0.json"), _mini_trace(tmp / "t_rank2.json")
        return [a, b], "no trace for rank 1: the traces of 2 ranks (ranks from their file name: 0, 2)"
    if case == "world sizes differ":
        p = _mini_trace(tmp / "rank1.json", rank=1, world=4)
        return [ok0, p], f"{p}: world_size 4 but {ok0} says 2: traces from different jobs"
    if case == "backends differ":
        p = _mini_trace(tmp / "rank1.json", rank=1, world=2, backend="nccl")
        return [ok0, p], f"{p}: backend 'nccl' but {ok0} says 'gloo'"
    if case == "process groups differ":
        p = _mini_trace(tmp / "rank1.json", rank=1, world=2, pg_size=4)
        return [ok0, p], f"{p}: process group '0' is"
    if case == "no common step":
        p = _mini_trace(tmp / "rank1.json", rank=1, world=2, steps=range(50, 56))
        return [ok0, p], f"{p}: no step in common with {ok0}"
    if case == "no step marks":
        p = tmp / "rank1.json"
        p.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1,
                                                  "tid": 1, "ts": 5.0, "dur": 3.0}]}))
        return [ok0, p], f"{p}: no ProfilerStep#N annotations"
    if case == "step not in trace":
        p = _mini_trace(tmp / "rank1.json", rank=1, world=2, steps=range(3))
        return [ok0, p, "--steps", "4-5"], f"{p}: no ProfilerStep#4"
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["not json", "json but no trace", "truncated gzip", "no rank", "rank twice",
                                  "rank missing", "world sizes differ", "backends differ", "process groups differ",
                                  "no common step", "no step marks", "step not in trace"])
def test_bad_inputs_are_one_line_errors(tmp_path: Path, case: str) -> None:
    args, expected = _bad_case(case, tmp_path)
    out = tmp_path / "out"
    res = _analyze("--traces", *args, "--out", out)
    assert res.exit_code == 2, (res.exit_code, res.output)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("eroica: analyze: ") and expected in lines[0], res.stderr
    assert not (out / "captures").exists() and not (out / "report.json").exists()


def test_usage_errors(tmp_path: Path) -> None:
    trace = _mini_trace(tmp_path / "rank0.json")
    res = _analyze("--traces", trace)
    assert res.exit_code == 2 and "--traces needs --out DIR" in res.stderr
    res = _analyze(tmp_path, "--steps", "1-2")
    assert res.exit_code == 2 and "go with --traces" in res.stderr
    res = _analyze("--traces", trace, "--out", tmp_path / "r", "--steps", "9-3")
    assert res.exit_code == 2 and "--steps '9-3': the last step is before the first" in res.stderr
    first = _analyze("--traces", trace, "--out", tmp_path / "r")
    assert first.exit_code == 0, first.output
    res = _analyze("--traces", trace, "--out", tmp_path / "r")
    assert res.exit_code == 2 and "already holds a report" in res.stderr


# ---------------------------------------------------------------------------------------------- real ranks
TRAIN = ROOT / "scripts" / "faultlib" / "train_bench.py"
PROFILE_WRAP = ROOT / "scripts" / "faultlib" / "profile_wrap.py"
# the fault bench's compute, data and gc faults, one after the other on each rank of a 3-rank job (rank 0,
# which gathers and analyses, is a culprit too)
RANKS = 3
FAULTS = ("compute:rank=1:start=4:stop=12:ms=150;data:rank=2:start=12:stop=20:ms=80;"
          "gc:rank=0:start=20:stop=28:cycles=2000")
EXPECTED = [(1, "compute"), (2, "dataloader"), (0, "gc")]


@pytest.mark.multirank
def test_fault_bench_traces_name_the_live_culprit_and_category(tmp_path: Path) -> None:
    """The same faulty job twice: live under eroica (manual captures in each fault's stretch), and profiled
    as torch's documentation teaches: schedule(skip_first=2, wait=4, warmup=1, active=3, repeat=3) with
    tensorboard_trace_handler (GC pauses recorded), one <host>_<pid>.<ns>.pt.trace.json per cycle and rank,
    the rank only in its distributedInfo. The directory as it is gives one capture per cycle, at the live
    captures' steps, naming the rank and category the live captures named.
    The profiled job runs under eroica too, as a user's would: eroica takes no capture while the job's
    profiler is on and a window of its own gives way when the job's starts (two profilers in a process
    took each other's session: the job segfaulted exporting its first trace), so every trace is written.
    About 20 s here (two 3-rank jobs of 30 steps); run it under the multi-rank lock."""
    live = tmp_path / "live"
    quiet = ("--spike-ratio", "100", "--drift-pct", "0", "--lost-pct", "0")   # only the manual captures
    proc = eroica_run("--nproc-per-node", str(RANKS), "--report-dir", live, "--no-baseline", "--warmup-steps", "2",
                      "--capture-at-steps", "7,15,23", *quiet, TRAIN, "--steps", "30",
                      env={"EROICA_BENCH_FAULT": FAULTS}, timeout=120)
    assert proc.returncode == 0, explain(proc)
    live_caps = json.loads((live / "report.json").read_text())["captures"]
    named_live = [(c["step"], [(f["rank"], f["category"]) for f in c["findings"]][:1]) for c in live_caps]
    assert [n for _, n in named_live] == [[e] for e in EXPECTED], (named_live, explain(proc))

    d = tmp_path / "traces"
    proc = eroica_run("--nproc-per-node", str(RANKS), "--report-dir", tmp_path / "profiled",
                      PROFILE_WRAP, "--steps", "30", timeout=120,
                      env={"EROICA_BENCH_FAULT": FAULTS, "EROICA_BENCH_TRACE_DIR": str(d), "EROICA_BENCH_TRACE_GC": "1",
                           "EROICA_BENCH_TRACE_SCHEDULE": "skip_first=2,wait=4,warmup=1,active=3,repeat=3"})
    assert proc.returncode == 0, explain(proc)
    files = sorted(p.name for p in d.iterdir())
    assert len(files) == 3 * RANKS and all(f.endswith(".pt.trace.json") for f in files), files
    assert "off on this rank" not in proc.stderr, explain(proc)
    held = json.loads((tmp_path / "profiled" / "report.json").read_text())["job"]["job_profiler"]
    assert held["ranks"] == f"ranks 0..{RANKS - 1}" and held["steps"] >= 12, held   # 3 cycles of warm-up + 3 active
    assert f"the job's own torch.profiler is on (ranks 0..{RANKS - 1})" in proc.stderr, explain(proc)
    res = _analyze("--traces", d, "--out", tmp_path / "from-traces")
    assert res.exit_code == 0, res.output
    caps = json.loads((tmp_path / "from-traces" / "report.json").read_text())["captures"]
    named_traces = [(c["step"], [(f["rank"], f["category"]) for f in c["findings"]][:1]) for c in caps]
    assert named_traces == named_live, (named_traces, named_live, res.stdout)   # steps 7, 15, 23 both ways
    for c in caps:   # the victims are the culprit's peers, not culprits of their own
        assert sorted(c["findings"][0]["victims"]) == sorted(set(range(RANKS)) - {c["findings"][0]["rank"]}), c
