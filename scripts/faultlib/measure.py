"""Measure what each injector really does (the numbers in docs/bench-faults.md; the tests assert on them).

Why one module: the doc's numbers, the tests and a person checking a new machine should all run the
same measurement. ``python scripts/faultlib/measure.py [all|compute|throttle|contend|freeze|data|gc|io|
net|mpi|memory]`` prints one JSON object per measurement. Root-only ones report ``{"skipped": reason}``.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from faultlib import faults, netns  # noqa: E402

HERE = Path(__file__).resolve().parent
SPIN = "import time\nend = time.monotonic() + 60\nwhile time.monotonic() < end: pass\n"


def cpu_seconds(pid: int) -> float:
    """utime+stime of a process (all threads) in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_share(pid: int, seconds: float = 1.0) -> float:
    """Fraction of one CPU the process used over the next ``seconds``."""
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - c0) / (time.monotonic() - t0)


@contextlib.contextmanager
def spinner(boost: bool = False) -> Iterator[subprocess.Popen[bytes]]:
    """A CPU-bound child process (killed on exit, at most 60 s).

    boost (root only): run it in its own session with that autogroup at nice -10, so other jobs on a small
    shared machine (each session is its own autogroup here) do not drown what a fault does to it.
    """
    boost = boost and os.geteuid() == 0
    p = subprocess.Popen([sys.executable, "-c", SPIN], start_new_session=boost)
    try:
        if boost:
            with contextlib.suppress(OSError):
                Path(f"/proc/{p.pid}/autogroup").write_text("-10")
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, p.pid, -10)
        time.sleep(0.2)
        yield p
    finally:
        p.kill()
        p.wait(5)


def affinity(pid: int) -> set[int]:
    return os.sched_getaffinity(pid)


def _external(kind: str, params: dict[str, str], window: float = 1.0, boost: bool = True) -> dict[str, Any]:
    spec = faults.FaultSpec(kind=kind, rank=None, params=params)
    reason = faults.KINDS[kind].unavailable_reason(spec)
    if reason:
        return {"skipped": reason}
    with spinner(boost) as p:
        base = cpu_share(p.pid, window)
        f = faults.KINDS[kind](spec, pid=p.pid)
        f.start()
        during: dict[str, Any] = {}
        try:
            time.sleep(0.5)  # helpers (hogs) are Python processes: let them start and pin themselves
            hogs = [h.pid for h in getattr(f, "hogs", [])]
            h0 = {h: cpu_seconds(h) for h in hogs}
            hit = cpu_share(p.pid, window)
            during = {"target_affinity": sorted(affinity(p.pid)),
                      "hog_affinity": sorted({c for h in hogs for c in affinity(h)}),
                      "hog_cpu_min": round(min((cpu_seconds(h) - h0[h]) / window for h in hogs), 3) if hogs else None}
            extra = f
        finally:
            f.stop()
        after = cpu_share(p.pid, window)
        state = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        affinity_after = affinity(p.pid)
    return {"baseline_cpu": round(base, 3), "fault_cpu": round(hit, 3), "after_cpu": round(after, 3),
            "after_state": state, "after_affinity": sorted(affinity_after), "fault": extra, **during}


def measure_throttle(quota: float = 0.2) -> dict[str, Any]:
    """A busy process's CPU share before/while/after a cgroup quota of ``quota`` CPUs."""
    r = _external("throttle", {"quota": str(quota)})
    if "fault" in r:
        f = r.pop("fault")
        r["cgroup_left"] = f.jail is not None or any(faults.hierarchy("cpu")[0].glob("eroica-fault-cpu-*"))  # type: ignore[index]
        r["quota"] = quota
    return r


def measure_contend(hogs: int = 2) -> dict[str, Any]:
    """A busy process's CPU share while ``hogs`` pinned busy processes share its core."""
    r = _external("contend", {"hogs": str(hogs)}, boost=False)  # hogs share the target's autogroup
    f = r.pop("fault")
    r["hogs_alive_after"] = sum(1 for h in getattr(f, "hogs", []) if h.poll() is None)
    r["hogs"] = hogs
    return r


def measure_freeze(ms: float = 300, every: float = 0.6) -> dict[str, Any]:
    """A busy process's CPU share under SIGSTOP bursts, and whether it was seen stopped."""
    spec = faults.FaultSpec(kind="freeze", rank=None, params={"ms": str(ms), "every": str(every)})
    with spinner(boost=True) as p:
        base = cpu_share(p.pid, 1.0)
        f = faults.FreezeFault(spec, pid=p.pid)
        f.start()
        seen_stopped = samples = 0
        try:
            c0, t0 = cpu_seconds(p.pid), time.monotonic()
            while time.monotonic() - t0 < 1.8:
                samples += 1
                if Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T":
                    seen_stopped += 1
                time.sleep(0.01)
            hit = (cpu_seconds(p.pid) - c0) / (time.monotonic() - t0)
        finally:
            f.stop()
        time.sleep(0.1)
        state = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        after = cpu_share(p.pid, 0.5)
    return {"baseline_cpu": round(base, 3), "fault_cpu": round(hit, 3), "after_cpu": round(after, 3),
            "stopped_fraction": round(seen_stopped / max(1, samples), 3), "after_state": state, "ms": ms, "every": every}


def _timed(fn: Callable[[], Any], n: int = 3) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e3


def measure_compute(ms: float = 40) -> dict[str, Any]:
    """Per-step time the compute fault adds."""
    import torch

    torch.set_num_threads(1)  # as in train_bench; multi-threaded small matmuls are erratic on 2 cores
    f = faults.ComputeFault(faults.FaultSpec(kind="compute", rank=0, params={"ms": str(ms)}))
    f.start()
    tick = _timed(lambda: f.tick(0), 5)
    f.stop()
    return {"target_ms": ms, "tick_ms": round(tick, 1), "matmuls": f.n}


def measure_data(ms: float = 50) -> dict[str, Any]:
    """Batch load time from a wrapped dataset with the data fault on and off."""
    ctl = faults.FaultController(faults.parse_specs(f"data:rank=0:start=1:stop=2:ms={ms}"), 0, log=lambda m: None)
    ds = ctl.wrap_dataset(list(range(100)), batch_size=4)

    def batch() -> None:
        for i in range(4):
            ds[i]

    ctl.step(0)
    off = _timed(batch)
    ctl.step(1)
    on = _timed(batch)
    ctl.step(2)
    after = _timed(batch)
    ctl.close()
    return {"target_ms": ms, "batch_ms_off": round(off, 2), "batch_ms_on": round(on, 1), "batch_ms_after": round(after, 2)}


_MEMORY_CHILD = """
import json, random, resource, sys, time
sys.path.insert(0, sys.argv[1])
import torch
from faultlib import faults
mb, cache = float(sys.argv[2]), float(sys.argv[3])
ctl = faults.FaultController(faults.parse_specs(f"memory:rank=0:start=1:stop=2:mb={mb}:cache={cache}"), 0,
                             log=lambda m: None)
items = [torch.arange(33) + i for i in range(4000)]
ds = ctl.wrap_dataset(items, batch_size=8)
order = list(range(len(items)))
random.Random(0).shuffle(order)
out = {}
for step in range(2):                            # 100 items not read before in each step
    ctl.step(step)
    f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_majflt, time.perf_counter()
    ok = all(bool((ds[i] == items[i]).all()) for i in order[100 * step:100 * step + 100])
    out[step] = ok, resource.getrusage(resource.RUSAGE_SELF).ru_majflt - f0, (time.perf_counter() - t0) * 1e3
fault = next(f for _, f in ctl.faults)
ctl.close()
print(json.dumps({"same_items": all(v[0] for v in out.values()), "faults_off": out[0][1], "faults_on": out[1][1],
                  "read_ms_off": round(out[0][2], 1), "read_ms_on": round(out[1][2], 1),
                  "jail_left": getattr(fault, "jail", None) is not None}))
"""


def measure_memory(mb: float = 64, cache: float = 8) -> dict[str, Any]:
    """Major faults and read time of 100 items of a memory-mapped dataset (each on its own page) before,
    and 100 others while, its rank's memory cgroup leaves it ``cache`` MB of page cache (in a child
    process: the fault moves its own process into the cgroup)."""
    reason = faults.KINDS["memory"].unavailable_reason(faults.FaultSpec("memory", 0))
    if reason:
        return {"skipped": reason}
    r = subprocess.run([sys.executable, "-c", _MEMORY_CHILD, str(HERE.parent), str(mb), str(cache)],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"memory measurement failed: {r.stderr[-2000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["cgroup_left"] = any(faults.hierarchy("memory")[0].glob("eroica-fault-memory-*"))  # type: ignore[index]
    return out


def measure_gc(live: int = 300_000, cycles: int = 50_000) -> dict[str, Any]:
    """Step time added by the gc fault, and the longest gen-2 pause seen through gc.callbacks."""
    pauses: list[float] = []
    t_start: list[float] = []

    def cb(phase: str, info: dict[str, int]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            t_start.append(time.perf_counter())
        elif t_start:
            pauses.append((time.perf_counter() - t_start.pop()) * 1e3)

    f = faults.GcFault(faults.FaultSpec(kind="gc", rank=0, params={"live": str(live), "cycles": str(cycles)}))
    gc.callbacks.append(cb)
    try:
        f.start()
        tick = _timed(lambda: f.tick(0), 3)
        f.stop()
    finally:
        gc.callbacks.remove(cb)
    return {"tick_ms": round(tick, 1), "gen2_collections": len(pauses), "max_gen2_pause_ms": round(max(pauses, default=0), 1)}


def measure_io(via: str = "auto", kb: int = 1024, mbps: float = 5) -> dict[str, Any]:
    """Time of one per-step read under the io fault (expected kb*1024/(mbps*1e6) s)."""
    spec = faults.FaultSpec(kind="io", rank=0, params={"via": via, "kb": str(kb), "mbps": str(mbps)})
    f = faults.IoFault(spec)
    try:
        f.start()
    except RuntimeError as e:
        return {"skipped": str(e)}
    try:
        f.tick(0)  # the first read may ride on throttle credit / a full pipe
        tick = _timed(lambda: f.tick(0), 3)
        mode, why = f.mode, f.why
    finally:
        f.stop()
    h = faults.hierarchy("blkio")
    left = list(h[0].glob("eroica-fault-io-*")) if h else []
    return {"mode": mode, "why_not_blkio": why, "kb": kb, "mbps": mbps, "expected_ms": round(kb * 1024 / (mbps * 1e6) * 1e3, 1),
            "read_ms": round(tick, 1), "cgroup_left": bool(left)}


def _probe(c: netns.Cluster, a: int, b: int, cmd: str, **kw: Any) -> dict[str, Any]:
    args = [sys.executable, str(HERE / "netprobe.py"), cmd, "--host", c.hosts[b].addr, "--port", "5201"]
    for k, v in kw.items():
        args += [f"--{k}"] if v is True else [f"--{k}", str(v)]
    r = c.run(a, args, timeout=60)
    if r.returncode:
        raise RuntimeError(r.stderr)
    return json.loads(r.stdout)


def measure_net(mbit: float = 50, delay_ms: float = 10) -> dict[str, Any]:
    """RTT and TCP throughput between two fake hosts: clean, rate-limited (each way), delayed."""
    reason = netns.unavailable_reason()
    if reason:
        return {"skipped": reason}
    out: dict[str, Any] = {}
    with netns.cluster(2) as c:
        srv = c.popen(1, [sys.executable, str(HERE / "netprobe.py"), "serve", "--port", "5201"], stdout=subprocess.PIPE)
        assert srv.stdout is not None and srv.stdout.readline().strip() == "ready"
        out["base_rtt_ms"] = round(_probe(c, 0, 1, "rtt", count=50)["rtt_ms_median"], 3)
        out["base_mbit"] = round(_probe(c, 0, 1, "bulk", mbytes=100)["mbit_s"])
        c.limit_rate(1, mbit)
        out["limit_mbit"] = mbit
        out["limited_mbit_to_host"] = round(_probe(c, 0, 1, "bulk", mbytes=mbit / 8 * 1.0)["mbit_s"], 1)
        out["limited_mbit_from_host"] = round(_probe(c, 0, 1, "bulk", mbytes=mbit / 8 * 1.0, reverse=True)["mbit_s"], 1)
        out["limited_rtt_ms"] = round(_probe(c, 0, 1, "rtt", count=20)["rtt_ms_median"], 3)
        c.clear_rate(1)
        out["cleared_mbit"] = round(_probe(c, 0, 1, "bulk", mbytes=100)["mbit_s"])
        reason = netns.delay_unavailable_reason()
        if reason:
            out["delay_skipped"] = reason
        else:
            c.add_delay(1, delay_ms)
            out["delay_ms"] = delay_ms
            out["delayed_rtt_ms"] = round(_probe(c, 0, 1, "rtt", count=20)["rtt_ms_median"], 3)
            out["delayed_mbit"] = round(_probe(c, 0, 1, "bulk", mbytes=50)["mbit_s"])
            c.clear_delay(1)
            out["undelayed_rtt_ms"] = round(_probe(c, 0, 1, "rtt", count=20)["rtt_ms_median"], 3)
            c.cut_link(1)
            try:
                _probe(c, 0, 1, "rtt", count=1, timeout=1)
                out["cut_link_blocks"] = False
            except RuntimeError:
                out["cut_link_blocks"] = True
            c.restore_link(1)
            out["restored_rtt_ms"] = round(_probe(c, 0, 1, "rtt", count=20)["rtt_ms_median"], 3)
            out["forward_rules_left"] = c.forward_rules()
        prefix = c.prefix
    out["leftovers"] = netns.leftovers(prefix)
    return out


def run_probe_job(c: netns.Cluster, n: int, mb: float = 4, iters: int = 5, timeout: float = 120,
                  between: Callable[[], None] | None = None) -> list[dict[str, Any]]:
    """Run scripts/faultlib/probe_ranks.py as an n-rank mpiexec job across the fake hosts. With
    ``between`` (a change to the network), every rank times once, ``between()`` runs, and every rank
    times again into its record's "then": one job, one start of every rank."""
    argv, env = c.mpiexec_layout()
    e = dict(os.environ, **env, PROBE_MB=str(mb), PROBE_ITERS=str(iters), MASTER_PORT="29533")
    with tempfile.TemporaryDirectory(prefix="eroica-probe-") as tmp:
        go = Path(tmp) / "go"
        if between is not None:
            e["PROBE_GO"] = str(go)
        proc = subprocess.Popen([*argv, "-n", str(n), sys.executable, str(HERE / "probe_ranks.py")], env=e,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            if between is not None:
                ready, end = Path(f"{go}.ready"), time.monotonic() + timeout
                while not ready.exists() and proc.poll() is None and time.monotonic() < end:
                    time.sleep(0.05)
                if ready.exists():
                    between()
                go.touch()
            out, err = proc.communicate(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"mpiexec failed rc={proc.returncode}: {err[-2000:]}")
    return sorted(parse_tagged(out, "PROBE "), key=lambda x: x["rank"])


def parse_tagged(text: str, tag: str) -> list[dict[str, Any]]:
    """Every ``<tag>{json}`` in text; ranks' lines can interleave through mpiexec, so no line splitting."""
    dec, out, i = json.JSONDecoder(), [], text.find(tag)
    while i >= 0:
        obj, end = dec.raw_decode(text, i + len(tag))
        out.append(obj)
        i = text.find(tag, end)
    return out


def measure_mpi(n: int = 4, mbit: float = 200, slow_host: int = 2) -> dict[str, Any]:
    """An n-rank mpiexec job, one rank per fake host: hostnames, gloo/MPI allreduce ms, clean vs one slow link."""
    reason = netns.unavailable_reason()
    if reason:
        return {"skipped": reason}
    with netns.cluster(n) as c:
        clean = run_probe_job(c, n, between=lambda: c.limit_rate(slow_host, mbit))
        slow = [r["then"] for r in clean]
    return {
        "hostnames": [r["hostname"] for r in clean],
        "clean_gloo_ms": max(r["gloo_allreduce_ms"] for r in clean),
        "clean_mpi_ms": max(r["mpi_allreduce_ms"] for r in clean),
        "slow_host": slow_host, "slow_mbit": mbit,
        "slow_gloo_ms": max(r["gloo_allreduce_ms"] for r in slow),
        "slow_mpi_ms": max(r["mpi_allreduce_ms"] for r in slow),
        "sums_ok": all(r["gloo_sum_ok"] and r["mpi_sum_ok"] for r in clean + slow),
    }


MEASUREMENTS: dict[str, Callable[[], dict[str, Any]]] = {
    "compute": measure_compute, "throttle": measure_throttle, "contend": measure_contend,
    "freeze": measure_freeze, "data": measure_data, "gc": measure_gc, "io": measure_io,
    "net": measure_net, "mpi": measure_mpi, "memory": measure_memory,
}


def main(argv: list[str] | None = None) -> int:
    names = (argv if argv is not None else sys.argv[1:]) or ["all"]
    for name in MEASUREMENTS if names == ["all"] else names:
        print(json.dumps({name: MEASUREMENTS[name]()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
