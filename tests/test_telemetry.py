"""telemetry.sample (host counters, NVML through a fake pynvml), GcMonitor, and the NVML-in-one-module rule."""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import psutil
import pytest

from eroica_runtime import telemetry

HOST_KEYS = {"cpu_s", "wall_s", "ctx_vol", "ctx_invol", "load1", "cpu_mhz", "mem_rss_mb", "mem_avail_mb",
             "tcp_retrans", "net_bytes_sent", "net_bytes_recv", "net_drops", "cpu_quota", "cpu_throttled_ms",
             "majflt", "refaults", "mem_limit_mb", "mem_free_mb"}
GPU_KEYS = {"sm_mhz", "sm_max_mhz", "mem_mhz", "mem_max_mhz", "throttle", "temp_c", "power_w", "power_limit_w",
            "pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max", "nvlink_crc", "nvlink_replay",
            "ecc_corrected", "ecc_uncorrected"}


def test_sample_host_fields() -> None:
    s = telemetry.sample()
    assert set(s) == {"host", "gpu"}
    assert HOST_KEYS <= set(s["host"])
    assert s["host"]["cpu_s"] > 0 and s["host"]["mem_rss_mb"] > 0
    assert isinstance(s["host"]["tcp_retrans"], int)
    if s["gpu"] is not None:
        assert GPU_KEYS <= set(s["gpu"])


def test_sample_is_cheap() -> None:
    telemetry.sample()
    costs = []
    for _ in range(30):
        t0 = time.perf_counter()
        telemetry.sample()
        costs.append(time.perf_counter() - t0)
    assert statistics.median(costs) < 0.05  # ~0.4 ms measured; generous for a noisy machine


def test_missing_host_fields_become_none(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a: Any, **k: Any) -> Any:
        raise OSError("nope")

    monkeypatch.setattr(psutil, "cpu_freq", boom)
    monkeypatch.setattr(psutil, "net_io_counters", boom)
    monkeypatch.setattr(telemetry, "_read_tcp_retrans", lambda: None)
    host = telemetry.sample()["host"]
    assert host["cpu_mhz"] is None and host["net_bytes_sent"] is None and host["tcp_retrans"] is None
    assert host["cpu_s"] is not None


def test_decode_throttle() -> None:
    assert telemetry.decode_throttle(None) is None
    assert telemetry.decode_throttle(0) == []
    assert telemetry.decode_throttle(0x4 | 0x40) == ["sw_power_cap", "hw_thermal"]
    assert telemetry.decode_throttle(0x10000) == ["0x10000"]


def _fake_pynvml(fail: set[str]) -> types.ModuleType:
    """A pynvml stand-in: one H100-like device with two active NVLinks; names in ``fail`` raise."""
    nv = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    values: dict[str, Any] = {
        "nvmlInit": None, "nvmlDeviceGetCount": 1, "nvmlDeviceGetHandleByIndex": "h0",
        "nvmlDeviceGetHandleByUUID": "h0", "nvmlDeviceGetName": b"NVIDIA H100", "nvmlDeviceGetUUID": "GPU-1",
        "nvmlDeviceGetIndex": 0, "nvmlDeviceGetPowerUsage": 350_000, "nvmlDeviceGetEnforcedPowerLimit": 700_000,
        "nvmlDeviceGetCurrentClocksEventReasons": 0x20, "nvmlDeviceGetTemperature": 71,
        "nvmlDeviceGetCurrPcieLinkGeneration": 4, "nvmlDeviceGetMaxPcieLinkGeneration": 5,
        "nvmlDeviceGetCurrPcieLinkWidth": 8, "nvmlDeviceGetMaxPcieLinkWidth": 16,
        "nvmlDeviceGetTotalEccErrors": 2,
    }

    def make(name: str, value: Any) -> Any:
        def fn(*args: Any) -> Any:
            if name in fail:
                raise NVMLError(name)
            return value
        return fn

    for name, value in values.items():
        setattr(nv, name, make(name, value))

    def clock(h: Any, kind: int) -> int:
        if "nvmlDeviceGetClockInfo" in fail:
            raise NVMLError("clock")
        return 1200 if kind == 1 else 2600

    nv.nvmlDeviceGetClockInfo = clock
    nv.nvmlDeviceGetMaxClockInfo = lambda h, kind: 1980 if kind == 1 else 2619
    nv.nvmlDeviceGetNvLinkState = lambda h, link: 1 if link < 2 else 0
    nv.nvmlDeviceGetNvLinkErrorCounter = lambda h, link, counter: {0: 5, 2: 1, 3: 2}.get(counter, 0)
    for const, v in {"NVML_CLOCK_SM": 1, "NVML_CLOCK_MEM": 2, "NVML_TEMPERATURE_GPU": 0,
                     "NVML_NVLINK_MAX_LINKS": 18, "NVML_NVLINK_ERROR_DL_REPLAY": 0,
                     "NVML_NVLINK_ERROR_DL_CRC_FLIT": 2, "NVML_NVLINK_ERROR_DL_CRC_DATA": 3,
                     "NVML_MEMORY_ERROR_TYPE_CORRECTED": 0, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1,
                     "NVML_VOLATILE_ECC": 0}.items():
        setattr(nv, const, v)
    return nv


def test_gpu_fields_through_fake_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(fail={"nvmlDeviceGetTemperature",
                                                                 "nvmlDeviceGetClockInfo"}))
    monkeypatch.setattr(telemetry, "_NVML", telemetry._Nvml())
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpu = telemetry.sample()["gpu"]
    assert gpu is not None and GPU_KEYS <= set(gpu)
    assert gpu["temp_c"] is None and gpu["sm_mhz"] is None  # a failing call gives None, never raises
    assert gpu["sm_max_mhz"] == 1980 and gpu["throttle"] == ["sw_thermal"]
    assert gpu["power_w"] == 350.0 and gpu["power_limit_w"] == 700.0
    assert (gpu["pcie_gen"], gpu["pcie_gen_max"], gpu["pcie_width"], gpu["pcie_width_max"]) == (4, 5, 8, 16)
    assert gpu["nvlink_crc"] == 2 * (1 + 2) and gpu["nvlink_replay"] == 2 * 5
    assert gpu["ecc_corrected"] == 2
    assert telemetry.gpu_identity() == {"index": 0, "uuid": "GPU-1", "name": "NVIDIA H100"}


def test_nvml_init_failure_means_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(fail={"nvmlInit"}))
    monkeypatch.setattr(telemetry, "_NVML", telemetry._Nvml())
    assert telemetry.sample()["gpu"] is None
    assert telemetry.gpu_identity() == {"index": None, "uuid": None, "name": None}


def test_gc_monitor_counts_pauses() -> None:
    mon = telemetry.GcMonitor().install()
    try:
        c0, ms0 = mon.snapshot()
        keep = [{"i": i} for i in range(50_000)]
        for _ in range(3):
            gc.collect()
        c1, ms1 = mon.snapshot()
        assert c1 - c0 >= 3 and ms1 > ms0
    finally:
        mon.uninstall()
    assert mon._callback not in gc.callbacks
    gc.collect()
    assert mon.snapshot()[0] == c1
    del keep


def test_nvml_only_in_telemetry() -> None:
    """Inside the ranks' runtime, NVML is touched by telemetry.py alone."""
    root = Path(__file__).resolve().parents[1]
    offenders = [str(p) for p in (root / "eroica_runtime").rglob("*.py")
                 if p.name != "telemetry.py" and "pynvml" in p.read_text(errors="replace")]
    assert offenders == []


_SPIN_AND_REPORT = """
import json, sys, time
from eroica_runtime import telemetry
clock = telemetry.ThrottleClock()         # made before the move, as a rank's is at its start
first = clock.read()
print("ready", flush=True)
sys.stdin.readline()                      # moved into the cgroup by now
before = telemetry.host_sample()
moved = clock.read()
end = time.monotonic() + 1.0
while time.monotonic() < end:
    pass
after = telemetry.host_sample()
print(json.dumps([before["cpu_quota"], before["cpu_throttled_ms"], after["cpu_throttled_ms"],
                  after["wall_s"] - before["wall_s"], first, moved, clock.read()]), flush=True)
"""


@pytest.mark.root
def test_cpu_quota_and_throttled_time_of_a_real_cgroup() -> None:
    """A process held to 0.1 CPU by a real cgroup quota reads that quota and how long the kernel held
    it throttled: most of a second of spinning (the engine's evidence for a CPU-limited rank)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    from faultlib import faults

    if os.geteuid() != 0 or faults.cgroup_cpu_mode() is None:
        pytest.skip("needs root and a cgroup cpu controller")
    outside = telemetry.cgroup_cpu()
    assert outside[1] is not None and (outside[0] is not None or outside[1] == 0.0), outside
    child = subprocess.Popen([sys.executable, "-c", _SPIN_AND_REPORT], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    jail = faults.CgroupJail("cpu", f"eroica-test-quota-{child.pid}")
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "ready"
        d = jail.create()
        if jail.mode == "v1":
            (d / "cpu.cfs_period_us").write_text("100000")
            (d / "cpu.cfs_quota_us").write_text("10000")
        else:
            (d / "cpu.max").write_text("10000 100000")
        jail.add(child.pid)
        child.stdin.write("go\n")
        child.stdin.flush()
        out, _ = child.communicate(timeout=60)
    finally:
        child.kill()
        jail.release()
    quota, thr0, thr1, wall, first, moved, last = json.loads(out.strip().splitlines()[-1])
    assert quota == pytest.approx(0.1)
    # a spinning thread on a tenth of a CPU: throttled for most of the second (0.9 if exact). The kernel
    # counts the throttled time of each CPU's runqueue the group was throttled on: a thread that moved
    # from one CPU to the other can count more than the wall (1,161 ms in a 1.00 s run, 2026-12-06), never
    # more than the wall on every CPU (a unit mix-up would be 1,000x off)
    assert 0.5 * wall * 1e3 < thr1 - thr0 <= 1.05 * wall * 1e3 * (os.cpu_count() or 1), (thr0, thr1, wall)
    # the per-step clock follows the move into the cgroup and counts from there, with no jump
    assert first == 0.0 and moved is not None and moved < 0.2 * (thr1 - thr0), (first, moved)
    assert last - moved == pytest.approx(thr1 - thr0, rel=0.1, abs=20.0), (moved, last, thr0, thr1)


def test_cgroup_reading_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unreadable cgroup (no /sys/fs/cgroup in a network namespace) leaves both fields None."""
    def boom(*_a: Any, **_k: Any) -> Any:
        raise OSError("no such file")
    monkeypatch.setattr(telemetry, "cgroup_cpu", boom)
    host = telemetry.host_sample()
    assert host["cpu_quota"] is None and host["cpu_throttled_ms"] is None


def _cgroup_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


@pytest.mark.parametrize("layout", ["v2", "v2-namespaced", "v1"])
def test_cgroup_quota_is_the_smallest_up_the_tree_and_throttling_the_nearest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str) -> None:
    """The file layouts a rank meets (cgroup v2 on a host or inside a container's cgroup namespace,
    cgroup v1's cpu hierarchy): a pod-level limit of 2 CPUs above a container's 1.5, the container's
    throttle counter. This machine has only v1, so its files are laid out here."""
    if layout == "v1":
        _cgroup_tree(tmp_path, {"kubepods/cpu.cfs_quota_us": "200000\n", "kubepods/cpu.cfs_period_us": "100000\n",
                                "kubepods/c1/cpu.cfs_quota_us": "150000\n", "kubepods/c1/cpu.cfs_period_us": "100000\n",
                                "kubepods/c1/cpu.stat": "nr_periods 9\nnr_throttled 4\nthrottled_time 2500000000\n",
                                "cpu.cfs_quota_us": "-1\n", "cpu.cfs_period_us": "100000\n"})
        proc = "12:cpu,cpuacct:/kubepods/c1\n0::/\n"
    else:
        _cgroup_tree(tmp_path, {"kubepods/cpu.max": "200000 100000\n", "kubepods/c1/cpu.max": "150000 100000\n",
                                "kubepods/c1/cpu.stat": "usage_usec 1\nnr_throttled 4\nthrottled_usec 2500000\n"})
        proc = "0::/kubepods/c1\n"
    root = tmp_path
    if layout == "v2-namespaced":     # the container sees its own cgroup as the mount's root
        root = tmp_path / "kubepods" / "c1"
        proc = "0::/\n"
    (tmp_path / "proc-cgroup").write_text(proc)
    monkeypatch.setattr(telemetry, "PROC_CGROUP", str(tmp_path / "proc-cgroup"))
    monkeypatch.setattr(telemetry, "_CGROUP_MOUNTS", {layout[:2]: root})
    quota, throttled = telemetry.cgroup_cpu()
    assert throttled == pytest.approx(2500.0)
    assert quota == pytest.approx(1.5)
    if layout == "v2":   # a pod limit below the container's binds: its counter is the one read
        _cgroup_tree(tmp_path, {"kubepods/cpu.max": "100000 100000\n",
                                "kubepods/cpu.stat": "usage_usec 1\nnr_throttled 9\nthrottled_usec 7000000\n"})
        assert telemetry.cgroup_cpu() == (pytest.approx(1.0), pytest.approx(7000.0))
    if layout != "v2-namespaced":    # no limit anywhere: never throttled
        (tmp_path / "proc-cgroup").write_text(proc.replace("kubepods/c1", "system"))
        (tmp_path / "system").mkdir()
        if layout == "v2":
            (tmp_path / "system" / "cpu.max").write_text("max 100000\n")
        assert telemetry.cgroup_cpu() == (None, 0.0)


@pytest.mark.parametrize("layout", ["v2", "v2-namespaced", "v1"])
def test_memory_limit_is_the_smallest_up_the_tree_with_the_cgroups_usage_and_refaults(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str) -> None:
    """A pod's 8 GiB memory limit above a container's 6 GiB, the container's usage and workingset refaults,
    in the layouts a rank meets (v1's memory hierarchy reports the binding limit itself)."""
    if layout == "v1":
        _cgroup_tree(tmp_path, {"kubepods/c1/memory.stat": f"cache 5\nhierarchical_memory_limit {6 << 30}\n"
                                "total_workingset_refault_anon 0\ntotal_workingset_refault_file 4096\n"
                                                            f"total_inactive_file {512 << 20}\n",
                                "kubepods/c1/memory.usage_in_bytes": f"{5 << 30}\n"})
        proc = "11:memory:/kubepods/c1\n1:cpu,cpuacct:/\n0::/\n"
    else:
        _cgroup_tree(tmp_path, {"kubepods/memory.max": f"{8 << 30}\n", "kubepods/c1/memory.max": f"{6 << 30}\n",
                                "kubepods/c1/memory.current": f"{5 << 30}\n",
                                "kubepods/c1/memory.stat": "anon 1\nworkingset_refault_anon 96\n"
                                                            f"workingset_refault_file 4000\ninactive_file {512 << 20}\n"})
        proc = "0::/kubepods/c1\n"
    root = tmp_path
    if layout == "v2-namespaced":
        root = tmp_path / "kubepods" / "c1"
        proc = "0::/\n"
    (tmp_path / "proc-cgroup").write_text(proc)
    monkeypatch.setattr(telemetry, "PROC_CGROUP", str(tmp_path / "proc-cgroup"))
    monkeypatch.setattr(telemetry, "_CGROUP_MOUNTS", {"v1-memory" if layout == "v1" else "v2": root})
    cg = telemetry.cgroup_memory()
    assert cg is not None and (cg.limit_mb, cg.usage_mb, cg.refaults) == (6144.0, 5120.0, 4096)
    if layout == "v2":   # the pod's limit below the container's binds
        (tmp_path / "kubepods" / "memory.max").write_text(f"{4 << 30}\n")
        assert telemetry.cgroup_memory().limit_mb == 4096.0   # type: ignore[union-attr]
    limit = 4096.0 if layout == "v2" else 6144.0
    sample = telemetry.memory_sample(types.SimpleNamespace(total=64 << 30, available=32 << 30))
    # what is left is the limit less the cgroup's usage (page cache included), none once it is over
    assert sample == {"majflt": sample["majflt"], "mem_limit_mb": limit, "mem_free_mb": max(limit - 5120.0, 0.0),
                      "refaults": 4096}
    # what it may still take: the limit less what the cgroup holds beyond its inactive page cache
    assert telemetry.memory_room_mb() == limit - 5120.0 + 512.0
    # no limit anywhere: the host's memory binds, and what is left of it is what the host has available
    if layout == "v1":
        (tmp_path / "kubepods" / "c1" / "memory.stat").write_text(f"hierarchical_memory_limit {1 << 63}\n")
    else:
        for d in (tmp_path / "kubepods", tmp_path / "kubepods" / "c1"):
            (d / "memory.max").write_text("max\n")
    sample = telemetry.memory_sample(types.SimpleNamespace(total=64 << 30, available=32 << 30))
    assert (sample["mem_limit_mb"], sample["mem_free_mb"]) == (65536.0, 32768.0)


def _fault_in(path: str, conn: Any) -> None:
    """A DataLoader worker's work, in short: fault a cold memory-mapped file's pages in, one a fault."""
    import mmap
    import resource

    with open(path, "rb") as fh:
        m = mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ)
    m.madvise(mmap.MADV_RANDOM)                # no readahead: one page a fault
    sum(m[i] for i in range(0, len(m), 1 << 16))
    conn.send(resource.getrusage(resource.RUSAGE_SELF).ru_majflt)
    conn.recv()


def _cold_file(path: Path, mb: int) -> None:
    with open(path, "wb") as fh:
        fh.write(os.urandom(mb << 20))
        fh.flush()
        os.fsync(fh.fileno())
        os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)   # clean pages leave the page cache


def test_major_faults_count_a_dataloader_workers_faults_while_it_lives_and_after(tmp_path: Path) -> None:
    """A DataLoader's workers read the batches: a worker (a multiprocessing child) that faults pages of a
    cold memory-mapped file in counts toward the rank's major faults, and still does once it exited."""
    import multiprocessing

    data = tmp_path / "data.bin"
    _cold_file(data, 8)
    before = telemetry.major_faults()
    ctx = multiprocessing.get_context("fork")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=_fault_in, args=(str(data), theirs))
    child.start()
    try:
        assert ours.poll(60), "the child did not report"
        its_own = ours.recv()
        if its_own == 0:
            pytest.skip("this filesystem serves a cold file without major faults (tmpfs?)")
        assert telemetry.major_faults() - before >= its_own
        assert child.pid in telemetry._children_pids()
    finally:
        ours.send("go")
        child.join(30)
    assert child.exitcode == 0
    assert telemetry.major_faults() - before >= its_own


def test_counting_a_workers_faults_never_reaps_it() -> None:
    """A dead worker stays for torch to find (its waitid() names how the worker died): sampling the faults
    must not wait() for it, as multiprocessing.active_children() would."""
    import multiprocessing

    child = multiprocessing.get_context("fork").Process(target=os._exit, args=(3,))
    child.start()
    try:
        deadline = time.monotonic() + 30
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        telemetry.major_faults()
        telemetry.memory_sample()
        assert psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE   # still there to be waited for
        assert os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    finally:
        child.join(10)
    assert child.exitcode == 3


_SHORT_OF_MEMORY = """
import json, mmap, os, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from faultlib import faults
from eroica_runtime import telemetry
jail = faults.CgroupJail("memory", f"eroica-test-memory-{os.getpid()}")
d = jail.create()
jail.add(os.getpid())
try:
    v1 = jail.mode == "v1"
    (d / ("memory.limit_in_bytes" if v1 else "memory.max")).write_text(str(24 << 20))
    path = Path(sys.argv[2])
    with open(path, "wb") as fh:             # written inside the cgroup: its page cache is the cgroup's
        for _ in range(64):
            fh.write(os.urandom(1 << 20))
        fh.flush()
        os.fsync(fh.fileno())
    before = telemetry.memory_sample()
    with open(path, "rb") as fh:
        m = mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ)
    for _ in range(2):                       # the second pass reads back what the first one lost
        sum(m[i] for i in range(0, len(m), 4096))
    after = telemetry.memory_sample()
    print(json.dumps({"before": before, "after": after}), flush=True)
finally:
    jail.release()
"""


@pytest.mark.root
def test_a_process_whose_memory_cgroup_is_too_small_for_its_mapped_file_shows_refaults(tmp_path: Path) -> None:
    """A real memory cgroup of 24 MB and a 64 MB memory-mapped file read twice: the process takes major
    faults, its cgroup reads evicted pages back (refaults), and the limit is the cgroup's with little of
    it left (the evidence engine/memory.py names a rank short of memory from)."""
    scripts = Path(__file__).resolve().parent.parent / "scripts"
    sys.path.insert(0, str(scripts))
    from faultlib import faults

    if os.geteuid() != 0 or faults.hierarchy("memory") is None:
        pytest.skip("needs root and a cgroup memory controller")
    out = subprocess.run([sys.executable, "-c", _SHORT_OF_MEMORY, str(scripts), str(tmp_path / "data.bin")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    before, after = got["before"], got["after"]
    assert after["majflt"] - before["majflt"] > 0
    assert after["refaults"] - before["refaults"] >= 1024, got     # 4 MB and more read back
    assert after["mem_limit_mb"] == pytest.approx(24.0)
    assert after["mem_free_mb"] < 0.25 * 24.0, got
