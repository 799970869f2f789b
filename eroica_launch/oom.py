"""Whether the kernel's OOM killer ended a rank that died of SIGKILL.

A rank killed outright leaves no error file and no traceback: torchrun's summary says "Signal 9
(SIGKILL) received by PID 15835", and whoever reads it at 3 a.m. is left to guess who sent it. Most
often it was the kernel's OOM killer: the host, or the memory cgroup of the rank's container or
Slurm step, ran out of memory (the fault bench's memory case met it once, when the rank's anonymous
memory outgrew its squeezed cgroup). The wrapper that reaped the rank (rank.py) runs on its host and
can tell: the kernel's log names every process its OOM killer ends ("Killed process 15835 (python)"
in ``/dev/kmsg``, readable by root, or by anyone where kernel.dmesg_restrict is 0), and failing that,
the host's count of OOM kills (``/proc/vmstat`` oom_kill) grew while the rank ran.

A DataLoader worker the OOM killer ends takes its rank down with "RuntimeError: DataLoader worker (pid
23810) is killed by signal: Killed." (or "... exited unexpectedly"), which names no cause either: the
same log says whether it was the OOM killer (``explain_workers``).
"""

from __future__ import annotations

import collections
import os
import re
import time
from collections.abc import Callable

import psutil

VMSTAT = "/proc/vmstat"
KMSG = "/dev/kmsg"
# the rank's children's own memory (USS, MB) from which the wrapper asks whether part of it is copies of
# the rank's pages (memgrowth.CHILDREN_MB, without the engine's import)
CHILDREN_MB = 64.0
MAX_RECORDS = 200_000      # the kernel's ring buffer holds far fewer; a bound on a pathological reader
ACTION = ("raise the memory limit of the ranks' container or job (Kubernetes resources.limits.memory, Slurm "
          "--mem) or use less: fewer DataLoader workers or a smaller prefetch_factor, pinned-memory buffers, "
          "caches and tensors kept for logging")


def oom_kills() -> int | None:
    """The host's OOM kills since boot (None where the kernel does not count them or the file is unreadable)."""
    try:
        with open(VMSTAT, encoding="ascii") as fh:
            for line in fh:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


NOT_READABLE = "not readable"   # killed_by_kernel's answer where the kernel's log cannot be read


def killed_by_kernel(pid: int, path: str | None = None) -> str | None:
    """The kernel log's record of its OOM killer ending ``pid`` ("Memory cgroup out of memory: Killed
    process 15835 (python) total-vm:..., anon-rss:272352kB, ..."), trimmed; None when the log holds no
    such record; NOT_READABLE when it cannot be read here."""
    want = re.compile(rf"Killed process {pid} \(")
    found = None
    try:
        fd = os.open(path or KMSG, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return NOT_READABLE
    try:
        for _ in range(MAX_RECORDS):
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError:        # EPIPE: records overwritten while reading; go on with the next
                continue
            if not record:
                break
            text = record.decode("utf-8", "replace")
            message = text.split(";", 1)[1].strip() if ";" in text else text.strip()
            if want.search(message):
                found = message
    finally:
        os.close(fd)
    if found is None:
        return None
    # the kernel's own words up to the process's sizes: the rest (page tables, UID, oom_score_adj) is noise
    head, _, sizes = found.partition(" total-vm:")
    rss = re.search(r"anon-rss:(\d+)kB", sizes)
    return head + (f" (anon-rss {int(rss.group(1)) / 1024:.0f} MB)" if rss else "")


class MemoryTrail:
    """The rank's anonymous memory, sampled by its wrapper while it runs (every ``every_s``; the kernel's
    record of an OOM kill gives one size, at the kill, and the rank itself cannot speak after SIGKILL):
    the whole run in at most WHOLE samples, thinned as memwatch.py thins its own, and the last RECENT at
    the full rate, so that a job of days still shows what its last seconds did. psutil's resident less
    shared memory (one read of /proc/<pid>/statm) is the RssAnon the rank's memwatch reads. The wrapper
    imports no more than this: the engine (numpy and all) would cost every rank's wrapper 0.17 s of CPU
    at its start; memgrowth judges the trail only once the rank is dead (``explain``)."""

    WHOLE = 64
    RECENT = 8
    # The rank's child processes (its DataLoader workers, most often): each one's private memory (USS,
    # psutil's memory_full_info: one read of /proc/<pid>/smaps_rollup) and anonymous resident size, at its
    # first sample and its last. A forked worker shares the rank's pages until it writes them, and reading a
    # Python object writes its reference count: a worker that reads the dataset's lists, dicts and strings
    # copies every page of them it reads, which RssAnon (the rank's or the worker's) never shows and the
    # memory cgroup charges all the same. smaps_rollup walks the page tables (2 ms at 430 MB here), so
    # the children are read every CHILDREN_EVERY samples' time, slower when a round costs more CPU than
    # CHILDREN_BUDGET of the wrapper's time (a host of large workers), for at most CHILDREN processes.
    CHILDREN_EVERY = 5
    CHILDREN_BUDGET = 0.01
    CHILDREN = 64

    def __init__(self, pid: int, every_s: float, startup_s: float,
                 warn: Callable[[str], None] | None = None) -> None:
        self.startup_s = startup_s   # EROICA_MEMORY_STARTUP_S: killed this soon after its start, it was starting up
        # told once, while the rank runs, when its children hold copies of its pages (copy-on-read)
        self._warn = warn
        try:
            self._proc: psutil.Process | None = psutil.Process(pid)
        except (psutil.Error, ValueError):
            self._proc = None
        self._every = self._base = every_s
        self._whole: list[tuple[float, float]] = []
        self._recent: collections.deque[tuple[float, float]] = collections.deque(maxlen=self.RECENT)
        self._next = self._next_whole = self._next_children = 0.0
        # pid -> [first read, USS MB then, last read, USS MB, anonymous RSS MB, the rank's] (memgrowth.ChildMemory)
        self._children: dict[int, list[float]] = {}
        self._children_at = 0.0   # when the children were last read

    def sample(self) -> None:
        """Called often (the wrapper's wait loop); reads the rank's memory when a sample is due. Never
        raises: the wrapper waiting for its rank must not fail over a sample (the trail stops instead)."""
        now = time.time()
        if now < self._next or self._proc is None:
            return
        self._next = now + self._base
        try:
            mem = self._proc.memory_info()
        except psutil.Error:   # gone: nothing more to sample
            return
        except Exception:      # anything else: the trail stops, the wrapper goes on
            self._proc = None
            return
        if not mem.rss:        # being killed or a zombie: its memory is gone already, not small
            return
        mb = (mem.rss - mem.shared) / (1 << 20)
        self._recent.append((now, mb))
        if now >= self._next_whole:
            self._next_whole = now + self._every
            self._whole.append((now, mb))
            if len(self._whole) > self.WHOLE:
                self._whole = self._whole[::2]
                self._every *= 2
        if now >= self._next_children:
            self._sample_children(now)

    def _sample_children(self, now: float) -> None:
        # the round's cost in this thread's CPU time (the kernel's walk of the page tables included), not
        # in wall time: on a loaded host a round waits for a CPU, and a 50 ms wait held the next round
        # off 5 s, long enough for the workers to fill the cgroup unread (the copy-on-read test, once)
        t0 = time.thread_time()
        try:
            kids = self._proc.children() if self._proc is not None else []
        except Exception:   # the rank gone, or /proc unreadable: no round now
            kids = []
        # A child's size is weighed against the rank's largest in its recent samples (this one's included),
        # not a read of it now: a rank the OOM killer is ending shrinks as the kernel frees its memory, and
        # a round then read its workers' copied pages as memory they took themselves. Both anonymous: the
        # rank's shared libraries are resident in it, hardly in a worker, and reclaimed under pressure.
        rank_mb = max((mb for _, mb in self._recent), default=0.0)
        for kid in kids:
            try:
                mem = kid.memory_full_info()
            except Exception:   # gone meanwhile, or not ours to read
                continue
            uss, anon = mem.uss / (1 << 20), (mem.rss - mem.shared) / (1 << 20)
            rec = self._children.get(kid.pid)
            if rec is None:
                if len(self._children) >= self.CHILDREN:   # forget the child seen longest ago
                    del self._children[min(self._children, key=lambda p: self._children[p][2])]
                self._children[kid.pid] = [now, uss, now, uss, anon, rank_mb]
            else:
                rec[2:] = [now, uss, anon, rank_mb]
        if kids:
            self._children_at = now
        # the reads' cost only: the warning's first judgement imports the engine (~65 ms of CPU here), which
        # counted held the next round off 6.5 s, and workers that had copied too little at that round to be
        # warned of were never read again before they exited (the copy-on-read test, 2 of 30 runs)
        cost = time.thread_time() - t0
        self._next_children = now + max(self.CHILDREN_EVERY * self._base, cost / self.CHILDREN_BUDGET)
        if kids and self._warn is not None:
            self._say_copies()

    def _say_copies(self) -> None:
        """Warn once if the last round's children hold copies of the rank's pages worth a share of its
        memory (memgrowth.copies_while_running), the one sign of copy-on-read before the OOM killer ends
        the rank. The engine is imported only once they hold CHILDREN_MB of their own: the copies are
        part of that (MemoryTrail's docstring says why the wrapper does not import it at its start)."""
        kids = self.children()
        if sum(k[3] for k in kids) < CHILDREN_MB:
            return
        warn, self._warn = self._warn, None   # once, whatever happens below
        try:
            from eroica_runtime.engine import memgrowth

            said = memgrowth.copies_while_running(kids)
        except Exception:   # the wrapper waiting for its rank must not fail over a warning
            return
        if said is None:
            self._warn = warn   # not yet: ask again at the next round
        elif warn is not None:
            warn(said)

    def children(self, pid: int | None = None) -> list[tuple[float, ...]]:
        """The rank's children as read at one round, memgrowth.ChildMemory's fields each. The last round;
        with ``pid`` (a worker that died before the rank), the last round that read it, which later
        rounds (its siblings alone) do not replace. [] when none."""
        at = self._children[pid][2] if pid in self._children else self._children_at if pid is None else None
        return [tuple(r) for r in self._children.values() if r[2] == at]

    @property
    def samples(self) -> list[tuple[float, float]]:
        return sorted(set(self._whole) | set(self._recent))

    @property
    def jump_s(self) -> float:
        """How recent a rise is one allocation: three of its sampling intervals."""
        return 3 * self._base


def _anon_rss_mb(record: str) -> float | None:
    m = re.search(r"\(anon-rss (\d+) MB\)$", record)
    return float(m.group(1)) if m else None


def explain(pid: int | None, kills_before: int | None, trail: MemoryTrail | None = None,
            died_at: float | None = None) -> tuple[str, bool]:
    """What to add to a SIGKILL death of ``pid``, and whether it is certain: the kernel's log naming it
    (certain); where that log cannot be read, OOM kills on the host while it ran (not certain: a rank
    the launcher killed after a peer's OOM kill counts them too); ("", False) when neither can be said.
    A readable log without a record of it is the answer: someone else killed it. With the rank's
    ``trail`` (its wrapper's samples; ``died_at``: when it died), what its memory did before."""
    record = killed_by_kernel(pid) if pid is not None else NOT_READABLE
    certain = record is not None and record != NOT_READABLE
    said, killed_mb = "", None
    if record is not None and record != NOT_READABLE:
        said = f"killed by the kernel's OOM killer, which logged \"{record}\": the rank ran out of memory; "
        killed_mb = _anon_rss_mb(record)
    after = oom_kills()
    if record == NOT_READABLE and kills_before is not None and after is not None and after > kills_before:
        n = after - kills_before
        said = (f"the kernel's OOM killer ended {n} process{'es' if n > 1 else ''} on this host while the rank ran "
                f"(/proc/vmstat oom_kill; `dmesg` names them): if this rank was one, it ran out of memory; ")
    if not said:
        return "", False
    if trail is not None:   # what its memory did before: a leak, or one allocation
        from eroica_runtime.engine import memgrowth  # only now the rank is dead (MemoryTrail says why)

        died_at = time.time() if died_at is None else died_at
        rank_mb = killed_mb if killed_mb is not None else (trail.samples[-1][1] if trail.samples else None)
        kids, copied = memgrowth.children_before_kill(trail.children(), rank_mb, died_at)
        # its workers' copies of its pages filled the cgroup and the killer took the largest process, the
        # rank: that is the story, not what the rank's own memory did (loading the dataset they copied)
        mine = "" if copied else memgrowth.before_kill(trail.samples, killed_mb, died_at, startup_s=trail.startup_s,
                                                       jump_s=trail.jump_s)
        said += "".join(f"{part}; " for part in (kids, mine) if part)
    return said + ACTION, certain


# torch's words for a dead worker: "DataLoader worker (pid 23810) is killed by signal: Killed." (its SIGCHLD
# handler) and "DataLoader worker (pid(s) 23810, 23811) exited unexpectedly" (the loader's own check)
_WORKERS = re.compile(r"DataLoader worker \(pid(?:\(s\))? ([\d, ]+)\)")


def explain_workers(error_text: str, trail: MemoryTrail | None = None, died_at: float | None = None) -> str:
    """What to add to a rank's error that names dead DataLoader workers the kernel's OOM killer ended; ""
    when it names none, or the kernel's log cannot say. With the rank's ``trail``, what the workers held
    of their own memory when last read before (``died_at``: when the rank ended)."""
    pids = sorted({int(p) for m in _WORKERS.finditer(error_text) for p in re.findall(r"\d+", m.group(1))})
    for pid in pids[:16]:
        record = killed_by_kernel(pid)
        if record == NOT_READABLE:
            return ""
        if record:
            before = ""
            if trail is not None:   # only now the rank is dead: the engine's import (MemoryTrail says why)
                from eroica_runtime.engine import memgrowth

                before = memgrowth.children_before_kill(trail.children(pid), None,
                                                         time.time() if died_at is None else died_at)[0]
            return (f"its DataLoader worker (pid {pid}) was killed by the kernel's OOM killer, which logged "
                    f"\"{record}\": the rank ran out of memory; {before + '; ' if before else ''}{ACTION}")
    return ""
