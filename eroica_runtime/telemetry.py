"""Host and GPU telemetry sampled at the start and end of a capture window, plus a GC monitor.

This is the only module that talks to NVML: the summary carries hardware counters (clocks vs
maximum, throttle reasons, PCIe link, NVLink errors) so the diagnosis can tell a throttled or
degraded device from slow code. Every field is read on its own and turns into ``None`` when the
driver, the device or the library cannot give it; a sample never raises.

The host side includes the process's CPU quota (cgroup v1 ``cpu.cfs_quota_us`` or v2 ``cpu.max``)
and how long the kernel held its cgroup throttled: a container CPU limit stops every thread of the
rank, its collective threads too, so the training thread's own clock cannot tell a rank throttled
while its gloo thread was due from a rank waiting for its peers. Only the cgroup's counter can.

It also says whether the rank was short of memory (``memory_sample``): its major page faults (its
own and its DataLoader workers'), and its memory cgroup's limit, headroom and workingset refaults
(pages read back soon after the kernel evicted them). Without swap, a host or container short of
memory evicts file pages: a memory-mapped dataset, the libraries' code. The rank then waits for
storage inside whatever touched them (a batch, an op), which by phase alone reads as a slow input
pipeline or slow compute.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import resource
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

# NVML clock event / throttle reason bits (stable across driver versions; named here so a
# reason list is readable in a report without the library).
_THROTTLE_BITS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"), (0x002, "applications_clocks"), (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"), (0x010, "sync_boost"), (0x020, "sw_thermal"), (0x040, "hw_thermal"),
    (0x080, "hw_power_brake"), (0x100, "display_clocks"), (0x200, "board_limit"),
    (0x400, "reliability"),
)

_PROC: psutil.Process | None = None
# "v1" (the hierarchy with the cpu controller), "v1-memory" (the one with the memory controller), "v2"
_CGROUP_MOUNTS: dict[str, Path] | None = None
PROC_CGROUP = "/proc/self/cgroup"
PROC_CGROUP_MAX = 1 << 16   # bytes read of it per step: a v1 host lists a dozen hierarchies, ~1-2 KB
MAX_CGROUP_DEPTH = 16


def decode_throttle(mask: int | None) -> list[str] | None:
    """Reason names for an NVML clocks-event bitmask (unknown bits as hex)."""
    if mask is None:
        return None
    names = [name for bit, name in _THROTTLE_BITS if mask & bit]
    known = 0
    for bit, _ in _THROTTLE_BITS:
        known |= bit
    if mask & ~known:
        names.append(hex(mask & ~known))
    return names


def _read_tcp_retrans() -> int | None:
    """TCP RetransSegs from /proc/net/snmp (host-wide): a lossy network shows up here first."""
    try:
        with open("/proc/net/snmp", encoding="ascii") as fh:
            lines = [line.split() for line in fh if line.startswith("Tcp:")]
        if len(lines) >= 2:
            return int(lines[1][lines[0].index("RetransSegs")])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_mounts() -> dict[str, Path]:
    """Mount points of the cgroup v1 hierarchies that hold the cpu and the memory controllers and of
    cgroup v2 (psutil lists every mount with its options); cached once found."""
    global _CGROUP_MOUNTS
    if _CGROUP_MOUNTS:
        return _CGROUP_MOUNTS
    found: dict[str, Path] = {}
    for part in psutil.disk_partitions(all=True):
        opts = part.opts.split(",")
        if part.fstype == "cgroup" and "cpu" in opts and "v1" not in found:
            found["v1"] = Path(part.mountpoint)
        if part.fstype == "cgroup" and "memory" in opts and "v1-memory" not in found:
            found["v1-memory"] = Path(part.mountpoint)
        elif part.fstype == "cgroup2" and "v2" not in found:
            found["v2"] = Path(part.mountpoint)
    _CGROUP_MOUNTS = found
    return found


def _read_words(path: Path) -> list[str]:
    with open(path, encoding="ascii") as fh:
        return fh.read().split()


def _quota_cpus(d: Path, v: str) -> float | None:
    """The CPUs a cgroup directory may use per period (None: no limit set there)."""
    if v == "v1":
        quota, period = int(_read_words(d / "cpu.cfs_quota_us")[0]), int(_read_words(d / "cpu.cfs_period_us")[0])
    else:
        words = _read_words(d / "cpu.max")
        if words[0] == "max":
            return None
        quota, period = int(words[0]), int(words[1])
    return quota / period if quota > 0 and period > 0 else None


def _binding_cgroup(proc_cgroup: str) -> tuple[float | None, Path | None] | None:
    """(smallest quota in CPUs up the tree, the cpu.stat of the cgroup that sets it) for the
    ``/proc/<pid>/cgroup`` text; (None, None) without any quota; None when the process's cgroup
    cannot be found."""
    mounts = _cgroup_mounts()
    rel = None
    version = ""
    for line in proc_cgroup.splitlines():
        hid, ctrls, path = line.split(":", 2)
        if "v1" in mounts and "cpu" in ctrls.split(","):
            rel, version = path, "v1"
            break
        if hid == "0" and ctrls == "" and "v2" in mounts:
            rel, version = path, "v2"
    if rel is None:
        return None
    root = mounts[version]
    leaf = root / rel.lstrip("/")
    if not leaf.is_dir():
        leaf = root     # inside a cgroup namespace the mount is the process's own cgroup
    quota: float | None = None
    counter: Path | None = None
    d = leaf
    for _ in range(MAX_CGROUP_DEPTH):
        try:
            q = _quota_cpus(d, version)
        except (OSError, ValueError, IndexError):
            q = None
        if q is not None and (quota is None or q < quota):
            quota, counter = q, d / "cpu.stat"
        if d == root or root not in d.parents:
            break
        d = d.parent
    return quota, counter


def _throttled_ms(stat: bytes) -> float:
    """The throttled time in a cpu.stat's text, ms (v2 ``throttled_usec``, v1 ``throttled_time`` ns)."""
    for key, scale in ((b"throttled_usec ", 1e-3), (b"throttled_time ", 1e-6)):
        i = stat.find(key)
        if i >= 0:
            j = i + len(key)
            end = stat.find(b"\n", j)
            return int(stat[j:end if end >= 0 else None]) * scale
    raise ValueError("cpu.stat without a throttled time")


def cgroup_cpu() -> tuple[float | None, float | None]:
    """(quota in CPUs, ms the cgroup was throttled since it was made) for this process's CPU cgroup.

    Re-read at every sample: a process can be moved to another cgroup while it runs. The limit that
    binds is the smallest quota on the way up to the hierarchy's root (Kubernetes sets one on the
    pod and one on the container), and the throttle counter is that cgroup's (the nearest of equal
    ones): each cgroup's bandwidth timer counts only the throttling its own quota did. Without any
    quota the process is never throttled: (None, 0.0). (None, None) when the cgroup files cannot be
    read (no /sys/fs/cgroup in a network namespace, an unusual layout)."""
    with open(PROC_CGROUP, encoding="utf-8") as fh:
        found = _binding_cgroup(fh.read())
    if found is None:
        return None, None
    quota, counter = found
    if counter is None:
        return None, 0.0
    with open(counter, "rb") as fh:
        return quota, _throttled_ms(fh.read())


NO_LIMIT = 1 << 60   # v1 reports "no limit" as the largest page-aligned counter (~8 EiB)


def _memory_cgroup(proc_cgroup: str) -> tuple[Path, str] | None:
    """(directory, "v1"|"v2") of the memory cgroup the ``/proc/<pid>/cgroup`` text names, or None."""
    mounts = _cgroup_mounts()
    for line in proc_cgroup.splitlines():
        hid, ctrls, path = line.split(":", 2)
        if "v1-memory" in mounts and "memory" in ctrls.split(","):
            root, version = mounts["v1-memory"], "v1"
        elif hid == "0" and ctrls == "" and "v2" in mounts and "v1-memory" not in mounts:
            root, version = mounts["v2"], "v2"
        else:
            continue
        leaf = root / path.lstrip("/")
        return (leaf if leaf.is_dir() else root), version   # in a cgroup namespace: the mount is ours
    return None


def _stat_words(path: Path) -> dict[str, int]:
    with open(path, encoding="ascii") as fh:
        return {k: int(v) for k, v in (line.split() for line in fh if line.count(" ") == 1)}


@dataclass(frozen=True)
class CgroupMemory:
    """This process's memory cgroup: the limit that binds (MB, None without any), its usage (MB, page cache
    included), its workingset refaults (None on a kernel without them) and its inactive page cache (MB)."""

    limit_mb: float | None
    usage_mb: float
    refaults: int | None
    inactive_file_mb: float


def cgroup_memory() -> CgroupMemory | None:
    """This process's memory cgroup (None when no memory cgroup is found).

    The limit is the one that binds: the smallest on the way up (v1 reports it as
    ``hierarchical_memory_limit``). Usage counts the page cache, which fills up to the limit in any
    container that reads files, so only the refaults tell a working set that no longer fits: pages
    read back in shortly after the kernel evicted them (``workingset_refault_*``, file and anonymous).
    Raises OSError/ValueError when its files cannot be read."""
    with open(PROC_CGROUP, encoding="utf-8") as fh:
        found = _memory_cgroup(fh.read())
    if found is None:
        return None
    d, version = found
    stat = _stat_words(d / "memory.stat")
    prefix = "total_" if version == "v1" else ""
    refaults = [stat.get(f"{prefix}workingset_refault_{k}") for k in ("file", "anon")]
    refault = sum(v for v in refaults if v is not None) if any(v is not None for v in refaults) else None
    inactive = stat.get(f"{prefix}inactive_file", 0) / 2**20
    limit: float | None = None
    if version == "v1":
        raw = stat.get("hierarchical_memory_limit")
        limit = raw / 2**20 if raw is not None and raw < NO_LIMIT else None
        usage = int(_read_words(d / "memory.usage_in_bytes")[0]) / 2**20
    else:
        usage = int(_read_words(d / "memory.current")[0]) / 2**20
        root = _cgroup_mounts()["v2"]
        e = d
        for _ in range(MAX_CGROUP_DEPTH):
            with contextlib.suppress(OSError, IndexError, ValueError):
                word = _read_words(e / "memory.max")[0]
                if word != "max" and (limit is None or int(word) / 2**20 < limit):
                    limit = int(word) / 2**20
            if e == root or root not in e.parents:
                break
            e = e.parent
    return CgroupMemory(limit, usage, refault, inactive)


def _majflt_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as fh:
        return int(fh.read().rsplit(b")", 1)[1].split()[9])


def _children_pids() -> list[int]:
    """Pids of the processes this one started through multiprocessing (DataLoader workers), read without
    reaping any: ``multiprocessing.active_children()`` would wait() for a dead worker, and torch learns
    of a worker's death (its "DataLoader worker (pid N) is killed by signal" error) by waitid() on it."""
    children = getattr(multiprocessing.process, "_children", None)
    for _ in range(3):   # another thread may start a worker meanwhile
        try:
            return [p.pid for p in list(children or ()) if getattr(p, "pid", None) is not None]
        except RuntimeError:
            continue
    return []


def workers() -> list[dict[str, Any]]:
    """This process's multiprocessing children (DataLoader workers): pid, state (psutil's: "running",
    "sleeping", "disk-sleep" for uninterruptible I/O...) and CPU seconds so far (at most 16; [] where
    unreadable). A hang diagnosis takes them twice: a rank waiting for its next batch is held by them."""
    out = []
    for pid in _children_pids()[:16]:
        with contextlib.suppress(psutil.Error, OSError):
            proc = psutil.Process(pid)
            with proc.oneshot():
                cpu = proc.cpu_times()
                out.append({"pid": pid, "state": str(proc.status()), "cpu_s": round(cpu.user + cpu.system, 2)})
    return out


def major_faults() -> int:
    """Major page faults of this process, its live multiprocessing children (DataLoader workers read
    the batches) and the children it reaped: a worker that exits between two samples moves from the
    one sum to the other, so the total only grows."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_majflt + resource.getrusage(resource.RUSAGE_CHILDREN).ru_majflt
    for pid in _children_pids():
        with contextlib.suppress(OSError, IndexError, ValueError):
            own += _majflt_of(pid)
    return own


def memory_sample(vm: Any = None) -> dict[str, Any]:
    """Major faults (counter), the memory that binds this rank (its cgroup's limit, else the host's RAM:
    ``mem_limit_mb``), what is left of it (``mem_free_mb``: the limit less the cgroup's usage, or the
    host's available memory if that is less) and its cgroup's workingset refaults (counter, the host's
    from /proc/vmstat without a readable cgroup); each None when unreadable. Never raises."""
    out: dict[str, Any] = {"majflt": _guard(major_faults)}
    cg = _guard(cgroup_memory)
    limit = cg.limit_mb if cg is not None else None
    refault = cg.refaults if cg is not None else None
    if refault is None:
        refault = _guard(_host_refaults)
    vm = vm if vm is not None else _guard(psutil.virtual_memory)
    avail = vm.available / 2**20 if vm is not None else None
    free = (limit - cg.usage_mb) if cg is not None and limit is not None else None
    if avail is not None and (free is None or avail < free):
        free = avail
    out["mem_limit_mb"] = limit if limit is not None else (vm.total / 2**20 if vm is not None else None)
    out["mem_free_mb"] = max(free, 0.0) if free is not None else None
    out["refaults"] = refault
    return out


def memory_room_mb() -> float | None:
    """Memory this process may still take before its cgroup's limit or the host runs out: the host's
    available memory, or the cgroup's limit less what it holds beyond its inactive page cache (the
    kernel reclaims that first), if less; None when neither can be read. Never raises."""
    vm = _guard(psutil.virtual_memory)
    room = vm.available / 2**20 if vm is not None else None
    cg = _guard(cgroup_memory)
    if cg is not None and cg.limit_mb is not None:
        left = cg.limit_mb - cg.usage_mb + cg.inactive_file_mb
        room = left if room is None else min(room, left)
    return room


def _host_refaults() -> int:
    stat = _stat_words(Path("/proc/vmstat"))
    return stat["workingset_refault_file"] + stat.get("workingset_refault_anon", 0)


class ThrottleClock:
    """How long this process's CPU quota has held it throttled, cheaply enough for every step (~3 µs:
    two preads of kept descriptors).

    The step clock reads it at each boundary, so that a quota binding in bursts shows in the steps
    before a window as well as in it. The process's cgroup file is compared with its last text at
    every read and the binding cgroup found again when it changed (a process moved to another
    cgroup); the total carries on across such a move, so a step's difference never jumps. ``read``
    returns None when no cgroup can be read (then it stops trying), and the total so far, unchanged,
    while no quota applies.
    """

    def __init__(self) -> None:
        self._proc: int | None = None
        self._stat: int | None = None
        self._text = b""
        self._raw = 0.0        # the counter's last reading
        self._total = 0.0
        try:
            self._proc = os.open(PROC_CGROUP, os.O_RDONLY)
        except OSError:
            self._proc = None

    def _rebind(self, text: bytes) -> None:
        self._close_stat()
        self._text = text
        found = _binding_cgroup(text.decode("utf-8", "replace"))
        if found is None:
            raise OSError("no CPU cgroup for this process")
        counter = found[1]
        if counter is not None:
            self._stat = os.open(counter, os.O_RDONLY)
            self._raw = _throttled_ms(os.pread(self._stat, 4096, 0))

    def read(self) -> float | None:
        if self._proc is None:
            return None
        try:
            text = os.pread(self._proc, PROC_CGROUP_MAX, 0)
            if text != self._text:
                self._rebind(text)
            if self._stat is not None:
                raw = _throttled_ms(os.pread(self._stat, 4096, 0))
                self._total += max(raw - self._raw, 0.0)
                self._raw = raw
            return self._total
        except (OSError, ValueError, IndexError):
            self.close()
            return None

    def _close_stat(self) -> None:
        if self._stat is not None:
            with contextlib.suppress(OSError):
                os.close(self._stat)
            self._stat = None

    def close(self) -> None:
        self._close_stat()
        if self._proc is not None:
            with contextlib.suppress(OSError):
                os.close(self._proc)
            self._proc = None


def _guard(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:
        return None


def host_sample() -> dict[str, Any]:
    """Process and host counters (cheap: a handful of /proc reads)."""
    global _PROC
    if _PROC is None:
        _PROC = psutil.Process()
    proc = _PROC
    out: dict[str, Any] = {"wall_s": time.time()}
    cpu = _guard(proc.cpu_times)
    out["cpu_s"] = (cpu.user + cpu.system) if cpu is not None else None
    ctx = _guard(proc.num_ctx_switches)
    out["ctx_vol"] = ctx.voluntary if ctx is not None else None
    out["ctx_invol"] = ctx.involuntary if ctx is not None else None
    load = _guard(os.getloadavg)
    out["load1"] = load[0] if load is not None else None
    freq = _guard(psutil.cpu_freq)
    out["cpu_mhz"] = freq.current if freq is not None else None
    mem = _guard(proc.memory_info)
    out["mem_rss_mb"] = mem.rss / 2**20 if mem is not None else None
    vm = _guard(psutil.virtual_memory)
    out["mem_avail_mb"] = vm.available / 2**20 if vm is not None else None
    out.update(memory_sample(vm))
    io = _guard(proc.io_counters)  # storage traffic of this process (not in the schema's list: extra)
    out["io_read_bytes"] = io.read_bytes if io is not None else None
    out["io_write_bytes"] = io.write_bytes if io is not None else None
    out["tcp_retrans"] = _read_tcp_retrans()
    net = _guard(psutil.net_io_counters)
    out["net_bytes_sent"] = net.bytes_sent if net is not None else None
    out["net_bytes_recv"] = net.bytes_recv if net is not None else None
    out["net_drops"] = (net.dropin + net.dropout) if net is not None else None
    quota_throttled = _guard(cgroup_cpu)
    out["cpu_quota"], out["cpu_throttled_ms"] = quota_throttled if quota_throttled is not None else (None, None)
    return out


class _Nvml:
    """Lazy, once-only NVML state for this process's device; disabled for good on any init failure."""

    def __init__(self) -> None:
        self.tried = False
        self.nv: Any = None
        self.handle: Any = None
        self.links: list[int] = []
        self.static: dict[str, Any] = {}
        self.lock = threading.Lock()

    def _device_handle(self, nv: Any) -> Any:
        """The NVML handle of the GPU this rank uses (current CUDA device, else LOCAL_RANK)."""
        torch = sys.modules.get("torch")  # never import torch here; use it only if loaded
        if torch is not None:
            try:
                if torch.cuda.is_available() and torch.cuda.is_initialized():
                    uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
                    return nv.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-"))
                                                        else "GPU-" + uuid)
            except Exception:
                pass
        local = int(os.environ.get("LOCAL_RANK", "0") or 0)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible:
            entries = [v.strip() for v in visible.split(",") if v.strip()]
            if entries:
                entry = entries[local % len(entries)]
                if entry.isdigit():
                    return nv.nvmlDeviceGetHandleByIndex(int(entry))
                return nv.nvmlDeviceGetHandleByUUID(entry)
        return nv.nvmlDeviceGetHandleByIndex(local % max(1, nv.nvmlDeviceGetCount()))

    def ensure(self) -> bool:
        if self.tried:
            return self.handle is not None
        with self.lock:
            if self.tried:
                return self.handle is not None
            self.tried = True
            try:
                import pynvml as nv

                nv.nvmlInit()
                handle = self._device_handle(nv)
            except Exception:
                return False
            self.nv, self.handle = nv, handle
            self.static = {
                "sm_max_mhz": _guard(nv.nvmlDeviceGetMaxClockInfo, handle, nv.NVML_CLOCK_SM),
                "mem_max_mhz": _guard(nv.nvmlDeviceGetMaxClockInfo, handle, nv.NVML_CLOCK_MEM),
                "pcie_gen_max": _guard(nv.nvmlDeviceGetMaxPcieLinkGeneration, handle),
                "pcie_width_max": _guard(nv.nvmlDeviceGetMaxPcieLinkWidth, handle),
                "name": _guard(nv.nvmlDeviceGetName, handle),
                "uuid": _guard(nv.nvmlDeviceGetUUID, handle),
                "index": _guard(nv.nvmlDeviceGetIndex, handle),
            }
            for key in ("name", "uuid"):
                if isinstance(self.static[key], bytes):
                    self.static[key] = self.static[key].decode(errors="replace")
            for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
                if _guard(nv.nvmlDeviceGetNvLinkState, handle, link) == 1:
                    self.links.append(link)
            return True

    def sample(self) -> dict[str, Any] | None:
        if not self.ensure():
            return None
        nv, h = self.nv, self.handle
        power = _guard(nv.nvmlDeviceGetPowerUsage, h)
        limit = _guard(nv.nvmlDeviceGetEnforcedPowerLimit, h)
        reasons_fn = (getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
                      or getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None))
        out: dict[str, Any] = {
            "sm_mhz": _guard(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
            "sm_max_mhz": self.static.get("sm_max_mhz"),
            "mem_mhz": _guard(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
            "mem_max_mhz": self.static.get("mem_max_mhz"),
            "throttle": decode_throttle(_guard(reasons_fn, h) if reasons_fn else None),
            "temp_c": _guard(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
            "power_w": power / 1000.0 if power is not None else None,
            "power_limit_w": limit / 1000.0 if limit is not None else None,
            "pcie_gen": _guard(nv.nvmlDeviceGetCurrPcieLinkGeneration, h),
            "pcie_gen_max": self.static.get("pcie_gen_max"),
            "pcie_width": _guard(nv.nvmlDeviceGetCurrPcieLinkWidth, h),
            "pcie_width_max": self.static.get("pcie_width_max"),
            "nvlink_crc": self._nvlink_sum(nv.NVML_NVLINK_ERROR_DL_CRC_FLIT, nv.NVML_NVLINK_ERROR_DL_CRC_DATA),
            "nvlink_replay": self._nvlink_sum(nv.NVML_NVLINK_ERROR_DL_REPLAY),
            "ecc_corrected": _guard(nv.nvmlDeviceGetTotalEccErrors, h,
                                    nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC),
            "ecc_uncorrected": _guard(nv.nvmlDeviceGetTotalEccErrors, h,
                                      nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC),
        }
        return out

    def _nvlink_sum(self, *counters: int) -> int | None:
        """Sum of NVLink error counters over the active links (None: no NVLink or unreadable)."""
        if not self.links:
            return None
        total, seen = 0, False
        for link in self.links:
            for counter in counters:
                value = _guard(self.nv.nvmlDeviceGetNvLinkErrorCounter, self.handle, link, counter)
                if value is not None:
                    total += int(value)
                    seen = True
        return total if seen else None


_NVML = _Nvml()


def gpu_sample() -> dict[str, Any] | None:
    """NVML counters of this rank's GPU, or None without a GPU / NVML."""
    try:
        return _NVML.sample()
    except Exception:
        return None


def gpu_identity() -> dict[str, Any]:
    """{index, uuid, name} of this rank's GPU as NVML sees it (all None without one)."""
    if not _guard(_NVML.ensure):
        return {"index": None, "uuid": None, "name": None}
    return {k: _NVML.static.get(k) for k in ("index", "uuid", "name")}


def gpu_inventory() -> tuple[int, str]:
    """(number of GPUs NVML sees, a one-line status) for the launcher and `eroica doctor`."""
    try:
        import pynvml
    except ImportError:
        return 0, "nvidia-ml-py not installed: no GPU telemetry"
    try:
        pynvml.nvmlInit()
        try:
            n = int(pynvml.nvmlDeviceGetCount())
            driver = pynvml.nvmlSystemGetDriverVersion()
            return n, f"{n} GPU(s), driver {driver}"
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:
        return 0, f"no NVIDIA driver ({type(exc).__name__}): no GPU telemetry"


def sample() -> dict[str, Any]:
    """One telemetry sample ``{host: {...}, gpu: {...} | None}``; never raises."""
    try:
        host = host_sample()
    except Exception:
        host = {}
    return {"host": host, "gpu": gpu_sample()}


class GcMonitor:
    """Running count and total pause time of Python garbage collections (via gc.callbacks).

    Cheap enough to stay installed for the whole job: two perf_counter calls per collection.
    """

    def __init__(self) -> None:
        self.count = 0
        self.ns = 0
        self._started: int | None = None
        self._installed = False

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter_ns()
        elif phase == "stop" and self._started is not None:
            self.ns += time.perf_counter_ns() - self._started
            self.count += 1
            self._started = None

    def install(self) -> GcMonitor:
        if not self._installed:
            gc.callbacks.append(self._callback)
            self._installed = True
        return self

    def uninstall(self) -> None:
        if self._installed:
            try:
                gc.callbacks.remove(self._callback)
            except ValueError:
                pass
            self._installed = False

    def snapshot(self) -> tuple[int, float]:
        """(collections so far, total pause ms so far); take differences around a window."""
        return self.count, self.ns / 1e6
