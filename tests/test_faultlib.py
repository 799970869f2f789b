"""The fault bench's injectors really inject, and really clean up (scripts/faultlib).

Each test measures the effect on a real process or a real link (CPU share, read time, throughput, RTT,
allreduce time), so a no-op injector fails. Root-only tests carry ``@pytest.mark.root`` and skip with
the reason when not root / tools are missing. Every subprocess has a timeout.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from faultlib import faults, measure, netns  # noqa: E402

IS_ROOT = os.geteuid() == 0
NETNS_SKIP = netns.unavailable_reason()
DELAY_SKIP = netns.delay_unavailable_reason()


# ------------------------------------------------------------------------------------------- spec
def test_spec_parsing_and_schedule() -> None:
    (a, b) = faults.parse_specs("compute:rank=2:start=40:ms=30 ; gc:rank=*:start=5:stop=9:intermittent:on=2:off=1")
    assert (a.kind, a.rank, a.start, a.params) == ("compute", 2, 40, {"ms": "30"})
    assert a.applies_to(2) and not a.applies_to(1)
    assert [a.active_at(s) for s in (39, 40, 1000)] == [False, True, True]
    assert b.rank is None and b.applies_to(7)
    assert [s for s in range(12) if b.active_at(s)] == [5, 6, 8]
    with pytest.raises(ValueError):
        faults.parse_specs("nosuchfault:rank=1")
    with pytest.raises(ValueError):
        faults.parse_specs("compute:rank=1:bogus")


def test_controller_starts_and_stops_at_steps() -> None:
    ctl = faults.FaultController(faults.parse_specs("data:rank=0:start=2:stop=4:ms=20; compute:rank=1:start=0"), 0,
                                 log=lambda m: None)
    assert [s.kind for s, _ in ctl.faults] == ["data"]  # the compute fault is for rank 1
    ds = ctl.wrap_dataset(list(range(10)))
    times = []
    for step in range(6):
        ctl.step(step)
        t0 = time.perf_counter()
        ds[step]
        times.append((time.perf_counter() - t0) * 1e3)
    ctl.close()
    assert [t > 15 for t in times] == [False, False, True, True, False, False]
    assert ctl.events == [(2, "data", "on"), (4, "data", "off")]


# ------------------------------------------------------------------------------------------- in-process

def test_mark_fault_logs_steps_for_an_outside_driver() -> None:
    """The bench shapes links from outside the job when a rank logs its 'mark' on/off lines."""
    logged: list[str] = []
    ctl = faults.FaultController(faults.parse_specs("mark:rank=0:start=3:intermittent:on=2:off=2"), 0,
                                 log=logged.append)
    t0 = time.time()
    for step in range(8):
        ctl.step(step)
    ctl.close()
    assert ctl.events == [(3, "mark", "on"), (5, "mark", "off"), (7, "mark", "on")]
    assert logged == ["step 3: mark on", "step 5: mark off", "step 7: mark on"]
    assert len(ctl.event_wall) == 3 and all(t0 <= t <= time.time() for t in ctl.event_wall)


def test_fault_that_cannot_start_is_dropped_not_fatal() -> None:
    logs: list[str] = []
    ctl = faults.FaultController(faults.parse_specs("data:rank=0:start=1"), 0, log=logs.append)
    for step in range(3):  # no wrap_dataset: the data fault cannot start
        ctl.step(step)
    ctl.close()
    assert ctl.events == [] and any("data failed to start" in m for m in logs), logs


def test_hang_fault_blocks_its_step_once() -> None:
    ctl = faults.FaultController(faults.parse_specs("hang:rank=0:start=1:seconds=0.3"), 0, log=lambda m: None)
    t = []
    for step in range(3):
        t0 = time.perf_counter()
        ctl.step(step)
        t.append(time.perf_counter() - t0)
    ctl.close()
    assert t[0] < 0.1 and t[1] >= 0.3 and t[2] < 0.1, t


def test_stall_fault_sleeps_after_the_collectives_of_its_steps_only() -> None:
    """The stall is not in the step's start (ctl.step) but where the job says its collectives are done."""
    ctl = faults.FaultController(faults.parse_specs("stall:rank=0:start=1:stop=2:ms=200"), 0, log=lambda m: None)
    starts, afters = [], []
    for step in range(3):
        t0 = time.perf_counter()
        ctl.step(step)
        t1 = time.perf_counter()
        ctl.after_collectives(step)
        starts.append(t1 - t0)
        afters.append(time.perf_counter() - t1)
    ctl.close()
    assert max(starts) < 0.1 and afters[0] < 0.1 and afters[1] >= 0.2 and afters[2] < 0.1, (starts, afters)
    assert ctl.events == [(1, "stall", "on"), (2, "stall", "off")]


@pytest.mark.parametrize("flag,value,said", [("--batch-size", "0", "0 must be at least 1"),
                                             ("--steps", "-3", "-3 must be at least 1"),
                                             ("--workers", "two", "'two' is not an integer")])
def test_bench_job_refuses_sizes_it_cannot_train_with(flag: str, value: str, said: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from faultlib import train_bench

    with pytest.raises(SystemExit) as e:
        train_bench.parse_args([flag, value])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and flag in err and said in err, err


def test_compute_fault_adds_per_step_time() -> None:
    r = measure.measure_compute(ms=40)
    assert 20 <= r["tick_ms"] <= 200, r


def test_compute_fault_with_a_count_does_the_same_work_on_every_rank() -> None:
    """``n`` skips the per-rank calibration, whose result depends on the load at that moment."""
    (spec,) = faults.parse_specs("compute:rank=*:start=0:n=7")
    fault = faults.ComputeFault(spec)
    fault.start()
    assert fault.n == 7


def test_data_fault_slows_getitem_only_while_on() -> None:
    r = measure.measure_data(ms=40)
    assert r["batch_ms_on"] >= 38 and r["batch_ms_off"] < 5 and r["batch_ms_after"] < 5, r


def test_gc_fault_runs_long_full_collections() -> None:
    r = measure.measure_gc(live=200_000, cycles=30_000)
    assert r["gen2_collections"] >= 3 and r["max_gen2_pause_ms"] >= 5 and r["tick_ms"] >= 10, r


def test_io_fault_pipe_paces_reads() -> None:
    r = measure.measure_io(via="pipe", kb=512, mbps=5)
    assert r["mode"] == "pipe"
    assert r["read_ms"] >= 0.7 * r["expected_ms"], r


# ------------------------------------------------------------------------------------------- CPU faults on another process
def test_contend_fault_takes_cpu_and_cleans_up() -> None:
    r = measure.measure_contend(hogs=2)
    # mechanism: target and hogs pinned to one core, hogs really burning CPU there
    assert len(r["target_affinity"]) == 1 and r["hog_affinity"] == r["target_affinity"], r
    assert r["hog_cpu_min"] > 0.05, r
    # effect: three equal tasks on one core, so the target gets at most ~1/3 whatever else runs
    assert r["fault_cpu"] < 1 / 3 + 0.08, r
    assert r["hogs_alive_after"] == 0 and len(r["after_affinity"]) == os.cpu_count(), r


def test_freeze_fault_stops_and_always_resumes() -> None:
    r = measure.measure_freeze(ms=300, every=0.6)
    assert r["stopped_fraction"] >= 0.25, r  # 300 ms of every 600 ms: ideally 0.5
    assert r["after_state"] != "T", r


@pytest.mark.root
@pytest.mark.skipif(not IS_ROOT or faults.cgroup_cpu_mode() is None, reason="needs root and a cgroup cpu controller")
def test_throttle_fault_caps_cpu_and_removes_cgroup() -> None:
    r = measure.measure_throttle(quota=0.1)
    # the quota is a hard cap whatever else runs; the baseline only has to be clearly above it
    assert r["fault_cpu"] <= 0.15, r
    assert r["baseline_cpu"] > 2 * r["fault_cpu"] and r["after_cpu"] > 2 * r["fault_cpu"], r
    assert not r["cgroup_left"], r


@pytest.mark.root
@pytest.mark.skipif(faults.io_mode("auto")[0] != "blkio", reason=f"blkio: {faults.io_mode('auto')[1]}")
def test_io_fault_blkio_throttles_direct_reads() -> None:
    r = measure.measure_io(via="blkio", kb=1024, mbps=8)
    assert r["mode"] == "blkio" and not r["cgroup_left"], r
    assert r["read_ms"] >= 0.7 * r["expected_ms"], r


@pytest.mark.root
@pytest.mark.skipif(not IS_ROOT or faults.hierarchy("memory") is None, reason="needs root and a cgroup memory controller")
def test_memory_fault_makes_mapped_items_fault_in_from_storage_and_removes_cgroup() -> None:
    r = measure.measure_memory(mb=64, cache=8)
    assert r["same_items"], r          # the mapped dataset serves the items it wraps
    # cached before (the file was just written), read back from storage while the cgroup squeezes it
    assert r["faults_off"] <= 2 and r["faults_on"] >= 50, r
    assert r["read_ms_on"] > 5 * r["read_ms_off"], r
    assert not r["jail_left"] and not r["cgroup_left"], r


def test_external_apply_cli_undoes_on_exit() -> None:
    with measure.spinner() as p:
        subprocess.run([sys.executable, str(ROOT / "scripts/faultlib/faults.py"), "apply", "--pid", str(p.pid),
                        "--kind", "freeze", "--seconds", "0.8", "ms=200", "every=0.3"], check=True, timeout=30)
        states = []
        for _ in range(20):  # resumed for good: never seen stopped again
            states.append(Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()[0])
            time.sleep(0.02)
        assert "T" not in states, states


def test_link_fault_refuses_outside_fake_hosts() -> None:
    reason = faults.LinkFault.unavailable_reason(faults.FaultSpec(kind="link", rank=0))
    assert reason is not None  # pytest runs in the machine's own namespace: never shape its NIC


# ------------------------------------------------------------------------------------------- network namespaces
@pytest.mark.root
@pytest.mark.skipif(NETNS_SKIP is not None, reason=str(NETNS_SKIP))
def test_netns_rate_limit_and_delay_are_real_and_cleaned() -> None:
    r = measure.measure_net(mbit=50, delay_ms=10)
    assert r["base_mbit"] > 300, r
    assert 30 < r["limited_mbit_to_host"] < 60 and 30 < r["limited_mbit_from_host"] < 60, r
    assert r["cleared_mbit"] > 300, r
    if DELAY_SKIP is None:
        assert 19 <= r["delayed_rtt_ms"] < 40, r
        assert r["undelayed_rtt_ms"] < 5, r
        assert r["cut_link_blocks"] and r["restored_rtt_ms"] < 5, r
        assert r["forward_rules_left"] == [], r
    assert r["leftovers"] == [], r


@pytest.mark.root
@pytest.mark.skipif(NETNS_SKIP is not None, reason=str(NETNS_SKIP))
def test_netns_hosts_have_own_hostnames_and_addresses() -> None:
    with netns.cluster(2) as c:
        names = [c.run(i, ["hostname"]).stdout.strip() for i in range(2)]
        assert names == [h.hostname for h in c.hosts]
        assert len(set(names)) == 2
        r = c.run(0, [sys.executable, "-c", f"import socket; print(socket.gethostbyname('{c.hosts[1].hostname}'))"])
        assert r.stdout.strip() == c.hosts[1].addr
        flags, env = c.eroica_run_args()
        assert flags[:4] == ["--nnodes", "2", "--nproc-per-node", "1"]
        assert Path(flags[flags.index("--hostfile") + 1]).read_text().split() == [f"{h.hostname}:1" for h in c.hosts]
        assert "-launcher-exec" in flags[flags.index("--mpiexec-args") + 1]
        assert env["MPIR_CVAR_CH4_NETMOD"] == "ofi" and env["MASTER_ADDR"] == c.hosts[0].addr
        prefix = c.prefix
    assert netns.leftovers(prefix) == []


@pytest.mark.root
@pytest.mark.skipif(NETNS_SKIP is not None, reason=str(NETNS_SKIP))
def test_a_fake_hosts_ranks_starting_cgroup_faults_at_once_all_find_the_controller() -> None:
    """A fake host's ranks share one mount namespace without /sys/fs/cgroup, and the first fault mounts
    the cpu hierarchy there. Four ranks of one host throttled from the same step raced to mount it, and
    three skipped their fault ("no cgroup cpu controller"): a node's ranks all slow was one rank slow."""
    # one write(2) a line (under PIPE_BUF: atomic on the shared pipe); print's text and newline were two,
    # and two processes' lines interleaved ("(...'v1')(...'v1')", "") in a CI run where all four found it
    code = (f"import os, sys, time; sys.path.insert(0, {str(ROOT / 'scripts')!r}); from faultlib import faults; "
            "t = float(sys.argv[1]); time.sleep(max(0.0, t - time.time())); "
            "os.write(1, (str(faults.hierarchy('cpu')) + chr(10)).encode())")
    with netns.cluster(1) as c:
        at = time.time() + 1.5   # after every interpreter has started: the four look at once
        r = c.run(0, ["sh", "-c", " & ".join([f"{sys.executable} -c {code!r} {at}"] * 4) + " & wait"], timeout=60)
    found = r.stdout.split("\n")[:4]
    assert len(found) == 4 and all("'v1')" in line or "'v2')" in line for line in found), (r.stdout, r.stderr)


@pytest.mark.root
@pytest.mark.skipif(NETNS_SKIP is not None, reason=str(NETNS_SKIP))
def test_netns_cleanup_on_sigterm_and_after_sigkill() -> None:
    code = (f"import sys, time; sys.path.insert(0, {str(ROOT / 'scripts')!r}); from faultlib import netns\n"
            "with netns.cluster(2) as c:\n"
            "    c.popen(1, ['sleep', '60'])\n"
            "    print(c.prefix, flush=True); time.sleep(60)\n")
    for sig in (signal.SIGTERM, signal.SIGKILL):
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        try:
            assert p.stdout is not None
            prefix = p.stdout.readline().strip()
            assert prefix.startswith("erf") and netns.leftovers(prefix)
            p.send_signal(sig)
            p.wait(20)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait(5)
        if sig == signal.SIGKILL:  # nothing can run on SIGKILL: the next user sweeps it up
            assert netns.leftovers(prefix)
            assert prefix in netns.cleanup_stale()
        assert netns.leftovers(prefix) == [], (sig, prefix)


@pytest.mark.root
@pytest.mark.multirank
@pytest.mark.skipif(NETNS_SKIP is not None, reason=str(NETNS_SKIP))
def test_mpiexec_places_one_rank_per_fake_host_and_slow_link_shows() -> None:
    with netns.cluster(3) as c:
        # one job: timed on the clean network, then again once host 1's link is cut to 50 Mbit/s
        clean = measure.run_probe_job(c, 3, mb=2, iters=3, between=lambda: c.limit_rate(1, 50))
        assert [r["hostname"] for r in clean] == [h.hostname for h in c.hosts]
        assert [r["mpi_processor"] for r in clean] == [h.hostname for h in c.hosts]
        slow = [r["then"] for r in clean]
        assert all(r["gloo_sum_ok"] and r["mpi_sum_ok"] for r in clean + slow)
    # 2 MiB ring allreduce over 3 ranks: each rank sends ~2.8 MB; at 50 Mbit/s that is ~450 ms
    clean_g, slow_g = (max(r["gloo_allreduce_ms"] for r in x) for x in (clean, slow))
    clean_m, slow_m = (max(r["mpi_allreduce_ms"] for r in x) for x in (clean, slow))
    assert slow_g > 2 * clean_g + 150 and slow_m > 2 * clean_m + 150, (clean_g, slow_g, clean_m, slow_m)


# ------------------------------------------------------------------------------------------- the bench job
@pytest.mark.multirank
def test_train_bench_under_torchrun_with_planted_fault(tmp_path: Path) -> None:
    torchrun = Path(sys.executable).parent / "torchrun"
    env = dict(os.environ, EROICA_BENCH_FAULT="compute:rank=1:start=6:ms=250", OMP_NUM_THREADS="1")
    with socket.socket() as s:  # a free port: other suites may run torchrun at the same time
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run([str(torchrun), "--nproc-per-node", "2", "--master-port", str(port),
                        str(ROOT / "scripts/faultlib/train_bench.py"), "--steps", "14", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(next(line for line in r.stdout.splitlines() if line.startswith("BENCH_SUMMARY "))[14:])
    assert summary["fault_start"] == 6
    assert summary["median_after_ms"] > summary["median_before_ms"] + 100, summary  # noisy shared 2-core box
    r1 = json.loads((tmp_path / "steps-rank1.json").read_text())
    assert r1["fault_events"] == [[6, "compute", "on"]] and len(r1["step_ms"]) == 14
