"""Real fault injectors for the bench: they slow a rank the way real machines do, not by faking timings.

Why: eroica must tell compute, host, dataloader, gc, io and communication faults apart from profiles, so
each fault here makes the process really do (or really be denied) work: extra matmuls, a cgroup CPU
quota, a CPU hog on the same core, SIGSTOP bursts, a sleeping ``__getitem__``, cyclic garbage and full
collections, blkio-throttled O_DIRECT reads, a tbf-limited link.

Use from a training script (the bench way; no launcher change)::

    ctl = FaultController.from_env(rank)        # reads EROICA_BENCH_FAULT
    dataset = ctl.wrap_dataset(dataset)         # only matters for 'data' faults
    for step in ...: ctl.step(step); ...        # starts/stops faults at step boundaries
    ctl.close()                                 # also runs at exit; always undoes everything

Spec (``EROICA_BENCH_FAULT``; several separated by ``;``)::

    KIND:rank=R:start=S[:stop=E][:intermittent[:on=5:off=15]][:param=value…]

``rank`` is an int or ``*``. Kinds and params (defaults):

- ``compute``  ms=40 — extra matmuls per step (fixed work, calibrated to ``ms`` at start)
- ``throttle`` quota=0.25 — cgroup CPU quota in CPUs (v1 cpu.cfs_quota_us, v2 cpu.max); root
- ``contend``  hogs=2 — busy processes pinned (sched_setaffinity) to the rank's core; rank pinned too
- ``freeze``   ms=300 every=1.0 — SIGSTOP for ``ms`` every ``every`` seconds, from a helper process
- ``data``     ms=100 — each ``__getitem__`` of the wrapped dataset sleeps ``ms``/batch size
- ``gc``       live=300000 cycles=50000 — keeps ``live`` tracked objects, makes cyclic garbage,
  runs ``gc.collect()`` each step
- ``io``       kb=2048 mbps=20 via=auto — O_DIRECT read of ``kb`` per step under a blkio read limit
  (root, block device), else through a pipe fed at ``mbps`` by a helper process
- ``link``     mbit=100 — tbf on this rank's own interface (egress); only inside a fake host; root
- ``hang``     seconds=inf — the rank stops inside its first faulty step (peers block in a collective)
- ``stall``    ms=50 — sleeps ``ms`` after the step's collectives, before the optimizer step (peers wait
  in the next step's); only where the script calls ``after_collectives`` (train_bench.py does)
- ``memory``   mb=256 cache=32 — memory pressure: every rank reads its items from a memory-mapped file
  of ``mb`` MB (one page each, as token datasets are read); this rank's memory cgroup (v1
  memory.limit_in_bytes, v2 memory.max) then leaves its page cache ``cache`` MB above its anonymous
  memory (set again every step), so most items are read back from storage in major page faults; root

From outside a running process: ``python faults.py apply --pid P --kind throttle quota=0.3 --seconds 10``
(kinds throttle, contend, freeze); cleanup runs on exit, Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import mmap
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV_VAR = "EROICA_BENCH_FAULT"
CGROOT = Path("/sys/fs/cgroup")


# ---------------------------------------------------------------------------------------------- spec
@dataclass
class FaultSpec:
    """One planned fault: what, on which rank, from which step, and whether it comes and goes."""

    kind: str
    rank: int | None  # None = every rank
    start: int = 0
    stop: int | None = None
    intermittent: bool = False
    on: int = 5
    off: int = 15
    params: dict[str, str] = field(default_factory=dict)

    def applies_to(self, rank: int) -> bool:
        return self.rank is None or self.rank == rank

    def active_at(self, step: int) -> bool:
        """Whether the fault is on during ``step``."""
        if step < self.start or (self.stop is not None and step >= self.stop):
            return False
        return not self.intermittent or (step - self.start) % (self.on + self.off) < self.on

    def num(self, key: str, default: float) -> float:
        return float(self.params.get(key, default))


def parse_specs(text: str) -> list[FaultSpec]:
    """Parse ``KIND:rank=R:start=S[:…]`` items separated by ``;``."""
    specs = []
    for item in filter(None, (s.strip() for s in text.split(";"))):
        kind, *parts = item.split(":")
        if kind not in KINDS:
            raise ValueError(f"unknown fault kind {kind!r} (known: {', '.join(sorted(KINDS))})")
        spec = FaultSpec(kind=kind, rank=None)
        for part in parts:
            key, _, val = part.partition("=")
            if key == "intermittent":
                spec.intermittent = True
            elif key == "rank":
                spec.rank = None if val in ("*", "all") else int(val)
            elif key in ("start", "stop", "on", "off"):
                setattr(spec, key, int(val))
            elif val:
                spec.params[key] = val
            else:
                raise ValueError(f"bad fault parameter {part!r} in {item!r}")
        specs.append(spec)
    return specs


# ---------------------------------------------------------------------------------------------- base
class Fault:
    """A fault that can be switched on and off; ``tick`` runs once per step while on."""

    needs_root = False

    def __init__(self, spec: FaultSpec, pid: int | None = None) -> None:
        self.spec = spec
        self.pid = pid or os.getpid()

    @classmethod
    def unavailable_reason(cls, spec: FaultSpec) -> str | None:
        if cls.needs_root and os.geteuid() != 0:
            return f"'{spec.kind}' needs root"
        return None

    def start(self) -> None:
        """Turn the fault on."""

    def tick(self, step: int) -> None:
        """Per-step work while on (in-process faults)."""

    def after_collectives(self, step: int) -> None:
        """Per-step work while on, after the step's collectives: backward() has returned (DDP's all-reduce
        done), the optimizer step not begun. Only the jobs that call FaultController.after_collectives
        (train_bench.py) run it."""

    def stop(self) -> None:
        """Turn the fault off and undo everything it changed; must be idempotent."""


def _spawn_helper(code: str, *args: str) -> subprocess.Popen[bytes]:
    """A small Python helper process; it watches its parent and exits when the parent is gone."""
    return subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.DEVNULL, close_fds=True)


def _stop_helper(p: subprocess.Popen[bytes] | None, grace: float = 2.0) -> None:
    if p is None or p.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        p.terminate()
    try:
        p.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            p.kill()
        p.wait(grace)


# ---------------------------------------------------------------------------------------------- compute
def eroica_fault_extra_compute(a: Any, b: Any, n: int) -> Any:
    """The planted hot function: ``n`` matmuls. Named so a profile shows where the time went."""
    c = a
    for _ in range(n):
        c = a @ b
    return c


class ComputeFault(Fault):
    """Extra compute on one rank: a fixed number of matmuls per step, calibrated to ``ms`` once, or
    ``n`` of them. The same work on every rank (``rank=*``) needs ``n``: ranks that calibrate at the
    same moment on shared cores measure different speeds (fault bench run 9: one rank got twice its
    peers' matmuls, and eroica rightly named it)."""

    def start(self) -> None:
        try:
            import torch

            self.a = torch.randn(256, 256)
            self.b = torch.randn(256, 256)
        except ImportError:  # pragma: no cover - numpy fallback for torch-less use
            import numpy as np

            self.a = np.random.rand(256, 256).astype(np.float32)
            self.b = np.random.rand(256, 256).astype(np.float32)
        eroica_fault_extra_compute(self.a, self.b, 3)
        if "n" in self.spec.params:
            self.n = max(1, int(self.spec.num("n", 1)))
            return
        # calibrate over >= 100 ms, whatever one matmul costs, from the fastest batch of 5: a batch
        # another process preempted reads slower, never faster (a 100-ms average taken while a parallel
        # test started torch gave 34 matmuls for 40 ms, and they ran in 9.7)
        t0, best = time.perf_counter(), float("inf")
        while time.perf_counter() - t0 < 0.1:
            b0 = time.perf_counter()
            eroica_fault_extra_compute(self.a, self.b, 5)
            best = min(best, time.perf_counter() - b0)
        self.n = max(1, round(self.spec.num("ms", 40) / 1e3 / (best / 5)))

    def tick(self, step: int) -> None:
        eroica_fault_extra_compute(self.a, self.b, self.n)


# ---------------------------------------------------------------------------------------------- cgroup cpu
MNT_DIR = Path("/run/eroica-faultlib")


def hierarchy(controller: str) -> tuple[Path, str] | None:
    """(mount point, 'v1'|'v2') of the cgroup hierarchy that has ``controller``, or None.

    Under ``ip netns exec`` (a fake host) /sys is a fresh sysfs without /sys/fs/cgroup; there, as root,
    the v1 hierarchy is mounted again inside that private mount namespace (the host never sees it).
    A fake host's ranks share that namespace and start their faults at the same step: the ranks whose
    mount lost the race use the winner's (two-host run of 4 ranks each, ranks 4-7 throttled: three of them
    skipped their fault as "no cgroup cpu controller" before).
    """
    if (CGROOT / controller / "cgroup.procs").exists():
        return CGROOT / controller, "v1"
    ctrl = CGROOT / "cgroup.controllers"
    if ctrl.exists() and controller in ctrl.read_text().split():
        return CGROOT, "v2"
    mnt = MNT_DIR / f"cgmnt-{controller}"
    if (mnt / "cgroup.procs").exists():
        return mnt, "v1"
    if os.geteuid() != 0 or faultlib_netns() is None:
        return None
    mnt.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "cgroup", "-o", controller, "none", str(mnt)], capture_output=True, timeout=10)
    return (mnt, "v1") if (mnt / "cgroup.procs").exists() else None


def cgroup_cpu_mode() -> str | None:
    """'v1' (cpu.cfs_quota_us), 'v2' (cpu.max) or None."""
    h = hierarchy("cpu")
    return h[1] if h else None


def _cgroup_of(pid: int, controller: str) -> str:
    """The pid's cgroup path for a v1 controller ('' for v2)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _id, ctrls, path = line.split(":", 2)
        if (controller and controller in ctrls.split(",")) or (not controller and ctrls == ""):
            return path
    return "/"


class CgroupJail:
    """A temporary cgroup that holds a pid; moves it back and removes the cgroup on release."""

    def __init__(self, controller: str, name: str) -> None:
        self.wanted = controller
        h = hierarchy(controller)
        if h is None:
            raise RuntimeError(f"no cgroup hierarchy with {controller}")
        self.base, self.mode = h
        self.controller = controller if self.mode == "v1" else ""
        self.dir = self.base / name
        self.moved: list[tuple[int, Path]] = []

    def create(self) -> Path:
        if self.mode == "v2":  # the parent must delegate the controller to children
            with contextlib.suppress(OSError):
                (CGROOT / "cgroup.subtree_control").write_text("+cpu" if self.wanted == "cpu" else "+io")
        self.dir.mkdir(exist_ok=True)
        return self.dir

    def add(self, pid: int) -> None:
        orig = self.base / _cgroup_of(pid, self.controller).lstrip("/")
        (self.dir / "cgroup.procs").write_text(str(pid))
        self.moved.append((pid, orig))

    def release(self) -> None:
        for pid, orig in self.moved:
            with contextlib.suppress(OSError):
                (orig / "cgroup.procs").write_text(str(pid))
        self.moved.clear()
        # anything still inside (threads/children created meanwhile) goes to the root of the hierarchy
        with contextlib.suppress(OSError):
            for p in (self.dir / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (self.base / "cgroup.procs").write_text(p)
        for _ in range(20):
            try:
                self.dir.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.05)


class ThrottleFault(Fault):
    """A throttled CPU: the rank's cgroup gets ``quota`` CPUs (cfs quota / cpu.max)."""

    needs_root = True

    @classmethod
    def unavailable_reason(cls, spec: FaultSpec) -> str | None:
        return super().unavailable_reason(spec) or (None if cgroup_cpu_mode() else "no cgroup cpu controller")

    def start(self) -> None:
        self.jail = CgroupJail("cpu", f"eroica-fault-cpu-{self.pid}")
        d = self.jail.create()
        period = 100_000
        quota = max(1000, int(self.spec.num("quota", 0.25) * period))
        if self.jail.mode == "v1":
            (d / "cpu.cfs_period_us").write_text(str(period))
            (d / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (d / "cpu.max").write_text(f"{quota} {period}")
        self.jail.add(self.pid)

    def stop(self) -> None:
        if getattr(self, "jail", None) is not None:
            # lift the cap before moving the rank out: a task moved while its group is throttled can
            # stay starved for a while (seen here as 6% of a CPU a second after the fault ended)
            d = self.jail.dir
            with contextlib.suppress(OSError):
                if self.jail.mode == "v1":
                    (d / "cpu.cfs_quota_us").write_text("-1")
                else:
                    (d / "cpu.max").write_text("max 100000")
            self.jail.release()
            self.jail = None  # type: ignore[assignment]


# ---------------------------------------------------------------------------------------------- memory
class MappedDataset:
    """The wrapped dataset's items served from a memory-mapped file, as token datasets are read (Megatron's
    indexed .bin, a numpy memmap): item i sits alone on a page spread over ``mb`` MB, so a batch touches
    as many pages as it has items. Written once at start; while memory is plentiful every page stays
    in the page cache and a read costs what copying the item does."""

    PAGE = 4096

    def __init__(self, base: Any, mb: float) -> None:
        self.base = base
        first = base[0]
        self.shape, self.dtype = tuple(first.shape), first.numpy().dtype
        self.nbytes = first.numpy().nbytes
        if self.nbytes > self.PAGE:
            raise ValueError(f"items of {self.nbytes} bytes do not fit one page")
        self.pages = 1 << max(4, int(mb * 2**20 // self.PAGE).bit_length() - 1)   # a power of two
        if len(base) > self.pages:
            raise ValueError(f"{len(base)} items need more than {self.pages} pages: raise mb")
        self._inv = pow(self.STRIDE, -1, self.pages)
        fd, path = tempfile.mkstemp(prefix="eroica-fault-mapped-", dir=os.environ.get("EROICA_FAULT_TMP"))
        try:
            chunk = bytearray(2**20)
            per = len(chunk) // self.PAGE
            for first_page in range(0, self.pages, per):
                for k in range(per):
                    i = self._item_at(first_page + k)
                    if i is not None:
                        chunk[k * self.PAGE:k * self.PAGE + self.nbytes] = base[i].numpy().tobytes()
                os.write(fd, chunk)
            os.fsync(fd)   # clean pages, cached: reclaim drops them at once, and the next read faults them in
            self.map = mmap.mmap(fd, self.pages * self.PAGE, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
            os.unlink(path)

    # item i lives on page (i * STRIDE) mod pages: an odd stride walks every page of a power of two
    STRIDE = 40503

    def _page(self, idx: int) -> int:
        return (idx * self.STRIDE) % self.pages

    def _item_at(self, page: int) -> int | None:
        i = (page * self._inv) % self.pages
        return i if i < len(self.base) else None

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, idx: int) -> Any:
        import numpy as np
        import torch
        off = self._page(idx) * self.PAGE
        item = np.frombuffer(self.map, dtype=self.dtype, count=self.nbytes // self.dtype.itemsize, offset=off)
        return torch.from_numpy(item.reshape(self.shape).copy())


class MemoryFault(Fault):
    """Memory pressure on one rank: its memory cgroup leaves its page cache ``cache`` MB.

    The rank's process joins a fresh memory cgroup before its mapped dataset is written (page cache is
    charged to whoever brought it in: only pages read after the move count against the limit). From
    start the limit is the cgroup's anonymous memory plus ``cache`` MB, set again at every step, so
    the kernel reclaims the mapped file's pages and the job's next reads fault them back in from
    storage, as a host short of memory does. Its anonymous memory (no swap here) cannot be reclaimed:
    one that grows by more than ``cache`` MB within a step (a profiler capture allocates tens of MB)
    would meet the cgroup's OOM killer, hence the margin and the per-step update. Stop lifts the
    limit and moves the process back."""

    needs_root = True

    @classmethod
    def unavailable_reason(cls, spec: FaultSpec) -> str | None:
        return super().unavailable_reason(spec) or (None if hierarchy("memory") else "no cgroup memory controller")

    def prepare(self) -> None:
        """Join the cgroup (before the mapped dataset is written)."""
        self.jail = CgroupJail("memory", f"eroica-fault-memory-{self.pid}")
        self.jail.create()
        self.jail.add(self.pid)

    def _limit_file(self) -> Path:
        return self.jail.dir / ("memory.limit_in_bytes" if self.jail.mode == "v1" else "memory.max")

    def start(self) -> None:
        if getattr(self, "jail", None) is None:
            raise RuntimeError("memory fault needs FaultController.wrap_dataset(...) before the job's first step")
        self.tick(0)

    def tick(self, step: int) -> None:
        stat = dict(line.split() for line in (self.jail.dir / "memory.stat").read_text().splitlines())
        anon = int(stat.get("rss", stat.get("anon", 0)))
        with contextlib.suppress(OSError):   # EBUSY: pages it could not reclaim yet; the next step sets it again
            self._limit_file().write_text(str(anon + int(self.spec.num("cache", 32) * 2**20)))

    def stop(self) -> None:
        if getattr(self, "jail", None) is not None:
            with contextlib.suppress(OSError):
                self._limit_file().write_text("-1" if self.jail.mode == "v1" else "max")
            self.jail.release()
            self.jail = None  # type: ignore[assignment]


# ---------------------------------------------------------------------------------------------- contention
_HOG = """
import os, sys, time
parent = os.getppid()
os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(',')})
try:
    os.setpriority(os.PRIO_PROCESS, 0, int(sys.argv[2]))
except OSError:
    pass
while os.getppid() == parent:
    t = time.monotonic() + 0.05
    while time.monotonic() < t:
        pass
"""


def _tids(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


class ContendFault(Fault):
    """A contended CPU: ``hogs`` busy processes, at the rank's nice level, pinned to the rank's (pinned) core."""

    def start(self) -> None:
        cpus = sorted(os.sched_getaffinity(self.pid))
        rank = self.spec.rank if self.spec.rank is not None else 0
        self.core = int(self.spec.params.get("core", cpus[rank % len(cpus)]))
        self.saved: dict[int, set[int]] = {}
        for tid in _tids(self.pid):
            with contextlib.suppress(OSError):
                self.saved[tid] = os.sched_getaffinity(tid)
                os.sched_setaffinity(tid, {self.core})
        nice = os.getpriority(os.PRIO_PROCESS, self.pid)  # contend at the rank's own priority
        self.hogs = [_spawn_helper(_HOG, str(self.core), str(nice)) for _ in range(int(self.spec.num("hogs", 2)))]

    def stop(self) -> None:
        for h in getattr(self, "hogs", []):
            _stop_helper(h)
        self.hogs = []
        for tid, cpus in getattr(self, "saved", {}).items():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, cpus)
        # threads born while pinned inherited the pin: give them the process's original mask too
        if getattr(self, "saved", None):
            full = next(iter(self.saved.values()))
            for tid in _tids(self.pid):
                if tid not in self.saved:
                    with contextlib.suppress(OSError):
                        os.sched_setaffinity(tid, full)
        self.saved = {}


# ---------------------------------------------------------------------------------------------- freeze
_FREEZER = """
import os, signal, sys, time
target, stop_s, every = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
stopped = False
def resume(*_):
    try:
        os.kill(target, signal.SIGCONT)
    finally:
        os._exit(0)
signal.signal(signal.SIGTERM, resume)
signal.signal(signal.SIGINT, resume)
try:
    # the first stop at the onset: a burst shorter than ``every`` (intermittent faults) must still
    # stop the process (it used to sleep first, and an 8-step burst never froze anything)
    while True:
        os.kill(target, 0)
        os.kill(target, signal.SIGSTOP)
        time.sleep(stop_s)
        os.kill(target, signal.SIGCONT)
        time.sleep(max(0.0, every - stop_s))
except ProcessLookupError:
    pass
finally:
    try:
        os.kill(target, signal.SIGCONT)
    except ProcessLookupError:
        pass
"""


class FreezeFault(Fault):
    """A frozen process: a helper SIGSTOPs the rank for ``ms`` every ``every`` seconds, then SIGCONTs."""

    def start(self) -> None:
        self.helper = _spawn_helper(
            _FREEZER, str(self.pid), str(self.spec.num("ms", 300) / 1e3), str(self.spec.num("every", 1.0))
        )

    def stop(self) -> None:
        _stop_helper(getattr(self, "helper", None))
        self.helper = None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)


# ---------------------------------------------------------------------------------------------- data
class SlowDataset:
    """Wraps a map-style dataset; ``__getitem__`` sleeps while the shared delay is non-zero.

    The delay lives in shared memory so DataLoader worker processes see it switch on and off.
    """

    def __init__(self, base: Any) -> None:
        self.base = base
        self.delay_us = multiprocessing.Value("q", 0, lock=False)

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, idx: int) -> Any:
        d = self.delay_us.value
        if d:
            eroica_fault_slow_getitem(d / 1e6)
        return self.base[idx]


def eroica_fault_slow_getitem(seconds: float) -> None:
    """The planted slow input pipeline (a named function so profiles show it)."""
    time.sleep(seconds)


class DataFault(Fault):
    """A slow dataset: each batch takes ``ms`` longer to load (spread over its items)."""

    dataset: SlowDataset | None = None
    batch_size: int = 1

    def start(self) -> None:
        if self.dataset is None:
            raise RuntimeError("data fault needs FaultController.wrap_dataset(...) on the training dataset")
        self.dataset.delay_us.value = int(self.spec.num("ms", 100) * 1e3 / max(1, self.batch_size))

    def stop(self) -> None:
        if self.dataset is not None:
            self.dataset.delay_us.value = 0


# ---------------------------------------------------------------------------------------------- gc
class _Node:
    __slots__ = ("ref", "payload", "__weakref__")

    def __init__(self) -> None:
        self.ref: Any = None
        self.payload: Any = None


def eroica_fault_make_garbage(n: int) -> None:
    """Makes ``n`` two-object reference cycles that only the cyclic collector can free."""
    for _ in range(n):
        a, b = _Node(), _Node()
        a.ref, b.ref = b, a
        a.payload = [a, b]


class GcFault(Fault):
    """GC storms: a large live set of tracked objects plus cyclic garbage and a full collection per step."""

    def start(self) -> None:
        self.live = [[i] for i in range(int(self.spec.num("live", 300_000)))]

    def tick(self, step: int) -> None:
        eroica_fault_make_garbage(int(self.spec.num("cycles", 50_000)))
        gc.collect()

    def stop(self) -> None:
        self.live = []


# ---------------------------------------------------------------------------------------------- io
def block_device_of(path: str) -> str | None:
    """'major:minor' of the whole block device holding path, if it is a real disk with blkio."""
    st = os.stat(path)
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    sysdev = Path(f"/sys/dev/block/{major}:{minor}")
    if not sysdev.exists():
        return None
    if (sysdev / "partition").exists():  # throttle rules take the whole disk
        parent = sysdev.resolve().parent / "dev"
        return parent.read_text().strip() if parent.exists() else None
    return f"{major}:{minor}"


def io_mode(want: str = "auto", directory: str | None = None) -> tuple[str, str]:
    """Pick 'blkio' or 'pipe' for the io fault; returns (mode, reason for not using blkio)."""
    d = directory or tempfile.gettempdir()
    if want == "pipe":
        return "pipe", "asked for pipe"
    why = ""
    if os.geteuid() != 0:
        why = "blkio needs root"
    elif (h := hierarchy("blkio")) is None or not (h[0] / "blkio.throttle.read_bps_device").exists():
        why = "no cgroup v1 blkio throttle"
    elif block_device_of(d) is None:
        why = f"{d} is not on a block device"
    if want == "blkio" and why:
        raise RuntimeError(why)
    return ("pipe", why) if why else ("blkio", "")


_PIPE_FEEDER = """
import os, sys, time
fd, bps = int(sys.argv[1]), float(sys.argv[2])
parent = os.getppid()
chunk = b"\\0" * 65536
t0 = time.monotonic(); sent = 0
while os.getppid() == parent:
    due = t0 + sent / bps
    now = time.monotonic()
    if due > now:
        time.sleep(due - now)
    try:
        sent += os.write(fd, chunk)
    except (BrokenPipeError, OSError):
        break
"""


def eroica_fault_slow_read(fd: int, buf: mmap.mmap, nbytes: int, offset: int | None) -> int:
    """The planted slow storage read (named so profiles show it); returns bytes read."""
    got = 0
    view = memoryview(buf)
    while got < nbytes:
        want = min(len(buf), nbytes - got)
        k = os.preadv(fd, [view[:want]], offset + got) if offset is not None else os.readv(fd, [view[:want]])
        if k <= 0:
            break
        got += k
    return got


class IoFault(Fault):
    """Slow storage reads: ``kb`` per step via O_DIRECT under a blkio read limit, or from a paced pipe."""

    def start(self) -> None:
        self.mode, self.why = io_mode(self.spec.params.get("via", "auto"), self.spec.params.get("dir"))
        self.nbytes = int(self.spec.num("kb", 2048)) * 1024
        bps = self.spec.num("mbps", 20) * 1e6
        self.buf = mmap.mmap(-1, 1 << 20)  # page aligned, as O_DIRECT wants
        self.helper: subprocess.Popen[bytes] | None = None
        self.jail: CgroupJail | None = None
        if self.mode == "blkio":
            dev = block_device_of(self.spec.params.get("dir") or tempfile.gettempdir())
            fd, self.path = tempfile.mkstemp(prefix="eroica-fault-io-", dir=self.spec.params.get("dir"))
            size = max(self.nbytes, 16 << 20)
            with os.fdopen(fd, "wb") as f:
                for _ in range(size >> 20):
                    f.write(os.urandom(1 << 20))
                f.flush()
                os.fsync(f.fileno())
            self.size = size
            self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECT)
            self.offset = 0
            self.jail = CgroupJail("blkio", f"eroica-fault-io-{self.pid}")
            d = self.jail.create()
            (d / "blkio.throttle.read_bps_device").write_text(f"{dev} {int(bps)}")
            self.jail.add(self.pid)
        else:
            r, w = os.pipe()
            self.helper = subprocess.Popen([sys.executable, "-c", _PIPE_FEEDER, str(w), str(bps)], pass_fds=(w,))
            os.close(w)
            self.fd = r

    def tick(self, step: int) -> None:
        if self.mode == "blkio":
            if self.offset + self.nbytes > self.size:
                self.offset = 0
            eroica_fault_slow_read(self.fd, self.buf, self.nbytes, self.offset)
            self.offset += self.nbytes
        else:
            eroica_fault_slow_read(self.fd, self.buf, self.nbytes, None)

    def stop(self) -> None:
        if getattr(self, "jail", None) is not None:
            self.jail.release()  # type: ignore[union-attr]
            self.jail = None
        if getattr(self, "fd", None) is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None
        _stop_helper(getattr(self, "helper", None))
        self.helper = None
        if getattr(self, "path", None):
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            self.path = None


# ---------------------------------------------------------------------------------------------- link
def faultlib_netns() -> str | None:
    """Name of the faultlib fake-host namespace this process runs in, else None (never shape a real NIC)."""
    try:
        r = subprocess.run(["ip", "netns", "identify", str(os.getpid())], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    name = r.stdout.strip()
    return name if re.match(r"^erf[0-9a-f]{6}-h\d+$", name) else None


class LinkFault(Fault):
    """A slow link from inside a fake host: tbf on this namespace's interface (egress)."""

    needs_root = True

    @classmethod
    def unavailable_reason(cls, spec: FaultSpec) -> str | None:
        if os.geteuid() != 0:
            return "'link' needs root"
        if shutil.which("tc") is None:
            return "'tc' not installed"
        if faultlib_netns() is None:
            return "'link' only shapes a fake host's interface (run ranks in faultlib.netns namespaces)"
        return None

    def start(self) -> None:
        self.dev = self.spec.params.get("dev") or os.environ.get("GLOO_SOCKET_IFNAME", "eth0")
        mbit = self.spec.num("mbit", 100)
        burst = max(16_000, int(mbit * 1e6 / 8 / 250))
        subprocess.run(["tc", "qdisc", "replace", "dev", self.dev, "root", "tbf", "rate", f"{mbit}mbit",
                        "burst", str(burst), "latency", "100ms"], check=True, timeout=10, capture_output=True)

    def stop(self) -> None:
        if getattr(self, "dev", None):
            subprocess.run(["tc", "qdisc", "del", "dev", self.dev, "root"], timeout=10, capture_output=True)
            self.dev = None


# ---------------------------------------------------------------------------------------------- mark
class MarkFault(Fault):
    """Changes nothing: its on/off log lines ("[fault rank R] step S: mark on") let a driver outside the
    job act at a training step (e.g. shape a link from the namespace owner, which a rank cannot do)."""


# ---------------------------------------------------------------------------------------------- hang
def eroica_fault_hang(seconds: float) -> None:
    """The planted hang: this rank stops making progress (its peers block in the next collective)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(min(1.0, max(0.0, end - time.monotonic())))


def eroica_fault_stall_after_collectives(seconds: float) -> None:
    """The planted stall: this rank sleeps after its step's all-reduce (a synchronous write of a log or a
    metric, a lock): its peers go on and wait for it in the next step's collective."""
    time.sleep(seconds)


class StallFault(Fault):
    """A stall of ``ms`` (default 50) after the step's collectives, before the optimizer step: the rank's
    time is neither compute nor a wait in a collective, and its thread is off the CPU."""

    def after_collectives(self, step: int) -> None:
        eroica_fault_stall_after_collectives(self.spec.num("ms", 50.0) / 1e3)


class HangFault(Fault):
    """A hang: at its first step the rank sleeps ``seconds`` (default: for ever) inside the step."""

    def start(self) -> None:
        self.done = False

    def tick(self, step: int) -> None:
        if not self.done:
            self.done = True
            eroica_fault_hang(self.spec.num("seconds", float("inf")))


KINDS: dict[str, type[Fault]] = {
    "compute": ComputeFault,
    "throttle": ThrottleFault,
    "contend": ContendFault,
    "freeze": FreezeFault,
    "data": DataFault,
    "gc": GcFault,
    "io": IoFault,
    "link": LinkFault,
    "hang": HangFault,
    "stall": StallFault,
    "mark": MarkFault,
    "memory": MemoryFault,
}


# ---------------------------------------------------------------------------------------------- controller
class FaultController:
    """Starts and stops this rank's planned faults at step boundaries; undoes all of them on close()."""

    def __init__(self, specs: list[FaultSpec], rank: int, log: Callable[[str], None] | None = None) -> None:
        self.rank = rank
        self.log = log or (lambda m: print(f"[fault rank {rank}] {m}", file=sys.stderr, flush=True))
        self.faults: list[tuple[FaultSpec, Fault]] = []
        self.active: set[int] = set()
        self.broken: set[int] = set()
        self.mapped_mb = max((s.num("mb", 256) for s in specs if s.kind == "memory"), default=0.0)
        self.events: list[tuple[int, str, str]] = []  # (step, kind, 'on'|'off') for the bench's ground truth
        self.event_wall: list[float] = []  # time.time() of each event: the bench's time-to-diagnosis origin
        for spec in specs:
            if not spec.applies_to(rank):
                continue
            reason = KINDS[spec.kind].unavailable_reason(spec)
            if reason:
                self.log(f"skipping {spec.kind}: {reason}")
                continue
            self.faults.append((spec, KINDS[spec.kind](spec)))
        self._closed = False
        atexit.register(self.close)

    @classmethod
    def from_env(cls, rank: int, env_var: str = ENV_VAR) -> FaultController:
        return cls(parse_specs(os.environ.get(env_var, "")), rank)

    def wrap_dataset(self, dataset: Any, batch_size: int = 1) -> Any:
        """Return the dataset, wrapped in a SlowDataset when a 'data' fault is planned on this rank, and
        read from a memory-mapped file on every rank when a 'memory' fault is planned on any (the rank
        it is planted on joins its cgroup first)."""
        for s, f in self.faults:
            if s.kind == "memory":
                assert isinstance(f, MemoryFault)
                f.prepare()
        if self.mapped_mb:
            dataset = MappedDataset(dataset, self.mapped_mb)
        data = [f for s, f in self.faults if s.kind == "data"]
        if not data:
            return dataset
        slow = SlowDataset(dataset)
        for f in data:
            assert isinstance(f, DataFault)
            f.dataset, f.batch_size = slow, batch_size
        return slow

    def step(self, step: int) -> None:
        """Call at the start of every step: switches faults on/off, then runs per-step fault work."""
        for i, (spec, fault) in enumerate(self.faults):
            want = spec.active_at(step) and i not in self.broken
            if want and i not in self.active:
                try:
                    fault.start()
                except Exception as exc:  # a fault that cannot start must not kill the job it is planted in
                    self.log(f"{spec.kind} failed to start, dropped: {exc!r}")
                    with contextlib.suppress(Exception):
                        fault.stop()
                    self.broken.add(i)
                    continue
                self.active.add(i)
                self.events.append((step, spec.kind, "on"))
                self.event_wall.append(time.time())
                self.log(f"step {step}: {spec.kind} on")
            elif not want and i in self.active:
                fault.stop()
                self.active.discard(i)
                self.events.append((step, spec.kind, "off"))
                self.event_wall.append(time.time())
                self.log(f"step {step}: {spec.kind} off")
            if i in self.active:
                fault.tick(step)

    def after_collectives(self, step: int) -> None:
        """Call after the step's collectives (backward() returned), before the optimizer step."""
        for i in sorted(self.active):
            self.faults[i][1].after_collectives(step)

    def close(self) -> None:
        """Undo every fault (idempotent; also registered with atexit)."""
        if self._closed:
            return
        self._closed = True
        for i in sorted(self.active):
            with contextlib.suppress(Exception):
                self.faults[i][1].stop()
        self.active.clear()


# ---------------------------------------------------------------------------------------------- CLI
def apply_external(pid: int, kind: str, params: dict[str, str], seconds: float) -> None:
    """Apply an external fault to another process for ``seconds``; always undone on return."""
    if kind not in ("throttle", "contend", "freeze"):
        raise ValueError("external faults: throttle, contend, freeze")
    spec = FaultSpec(kind=kind, rank=None, params=params)
    reason = KINDS[kind].unavailable_reason(spec)
    if reason:
        raise RuntimeError(reason)
    fault = KINDS[kind](spec, pid=pid)
    done = threading.Event()
    prev = signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        fault.start()
        deadline = time.monotonic() + seconds
        while not done.is_set() and time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            done.wait(0.1)
    except KeyboardInterrupt:
        pass
    finally:
        fault.stop()
        signal.signal(signal.SIGTERM, prev)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="apply a fault to a running process")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("apply")
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--kind", required=True, choices=["throttle", "contend", "freeze"])
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("params", nargs="*", help="key=value")
    a = ap.parse_args(argv)
    apply_external(a.pid, a.kind, dict(kv.split("=", 1) for kv in a.params), a.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
