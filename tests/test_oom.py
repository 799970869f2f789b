"""eroica_launch/oom.py: what a rank's SIGKILL death (or its DataLoader worker's) says about the OOM killer
when the kernel's log cannot be read (no root, kernel.dmesg_restrict=1): the host's OOM-kill count.
The kernel's log itself is read in test_launch's root tests, where a real cgroup's OOM killer ends a rank."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from eroica_launch import oom
from eroica_runtime.config import Config


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("nr_free_pages 5\noom_kill 3\nworkingset_refault_file 9\n")
    monkeypatch.setattr(oom, "VMSTAT", str(vmstat))
    monkeypatch.setattr(oom, "KMSG", str(tmp_path / "no-kmsg"))
    return vmstat


def test_oom_kills_on_the_host_while_the_rank_ran_make_it_the_likely_cause(host: Path) -> None:
    assert oom.oom_kills() == 3
    host.write_text("oom_kill 4\n")
    said, certain = oom.explain(4242, 3)
    assert said.startswith("the kernel's OOM killer ended 1 process on this host while the rank ran")
    assert "if this rank was one, it ran out of memory" in said and "raise the memory limit" in said
    assert not certain     # a rank the launcher killed after its peer's OOM kill sees the same count


def test_no_oom_kill_while_the_rank_ran_says_nothing(host: Path) -> None:
    assert oom.explain(4242, 3) == ("", False)
    assert oom.explain(4242, None) == ("", False)      # no count at the start: no claim


def test_a_host_that_does_not_count_oom_kills_says_nothing(host: Path) -> None:
    host.write_text("nr_free_pages 5\n")
    assert oom.oom_kills() is None and oom.explain(4242, 3) == ("", False)


def test_a_dead_worker_is_only_an_oom_kill_when_the_kernel_says_so(host: Path) -> None:
    text = "RuntimeError: DataLoader worker (pid 23336) is killed by signal: Killed."
    assert oom.explain_workers(text) == ""


def test_a_readable_kernel_log_without_the_rank_is_no_oom_kill_whatever_the_count(
        host: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 OOM-killed, rank 2 killed by the launcher afterwards: both saw the host's count grow, and only
    the kernel's log tells them apart."""
    log = host.parent / "kmsg"
    log.write_text("6,1,2,-;eth0: link up\n")
    monkeypatch.setattr(oom, "KMSG", str(log))
    host.write_text("oom_kill 4\n")
    assert oom.explain(4242, 3) == ("", False)


class _Trail(oom.MemoryTrail):
    def __init__(self, samples: list[tuple[float, float]]) -> None:
        super().__init__(0, 1.0, Config().memory_startup_s)
        self._fixed = samples

    @property
    def samples(self) -> list[tuple[float, float]]:
        return self._fixed


def test_an_oom_kill_says_what_the_ranks_memory_did_before_it(host: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's record gives the size at the kill; the wrapper's samples before it say one allocation
    (from the record's anon-rss), and the same words go before what to do."""
    log = host.parent / "kmsg"
    log.write_text("3,9,9,-;Memory cgroup out of memory: Killed process 4242 (python) total-vm:9999kB, "
                   "anon-rss:9216000kB, file-rss:0kB\n")
    monkeypatch.setattr(oom, "KMSG", str(log))
    flat = _Trail([(1000.0 + t, 2000.0) for t in range(0, 600, 2)])
    said, certain = oom.explain(4242, 3, flat, died_at=1600.0)
    assert certain and "(anon-rss 9000 MB)\": the rank ran out of memory; its anonymous memory stayed at or below" in said
    assert "then reached 8.8 GB within 4 s: one allocation" in said and said.endswith(oom.ACTION), said
    assert oom.explain(4242, 3)[0] == said[:said.index("its anonymous")] + oom.ACTION   # no trail: as before


def test_the_wrapper_samples_a_live_process_anonymous_memory() -> None:
    """MemoryTrail reads /proc/<pid>/status when a sample is due; a pid that is gone leaves no sample."""
    trail = oom.MemoryTrail(os.getpid(), 0.0, 0.0)
    trail.sample()
    trail.sample()
    assert len(trail.samples) == 2 and all(mb > 1 for _, mb in trail.samples), trail.samples
    gone = oom.MemoryTrail(2**22 + 17, 0.0, 0.0)
    gone.sample()
    assert gone.samples == []


def test_what_a_ranks_workers_held_says_copy_on_read_from_their_size_not_their_growth() -> None:
    """Workers whose own memory (USS) is pages they share with the rank no more (their resident size no
    larger than the rank's) copied them reading its Python objects: said so, with what to change, even
    when the first read came after the copying (a fast pass). Workers as large again as the rank took the
    memory themselves. Small ones, or small beside the rank, are not said."""
    from eroica_runtime.engine import memgrowth

    copied = [(100.0, 120.0, 130.0, 2100.0, 2150.0, 2200.0), (100.0, 110.0, 130.0, 2000.0, 2150.0, 2200.0)]
    said, cow = memgrowth.children_before_kill(copied, 2300.0, 132.0)
    assert cow and "its 2 child processes (its DataLoader workers, most often) held 4.0 GB" in said, said
    assert "2 s before the kill, 230 MB when first read 30 s earlier" in said and "copy-on-read" in said, said
    assert "numpy arrays" in said, said
    own = [(100.0, 900.0, 130.0, 900.0, 3100.0, 2200.0)]   # 900 MB more resident than the rank: its own
    said, cow = memgrowth.children_before_kill(own, 2300.0, 131.0)
    assert not cow and said.startswith("its child process") and "took itself" in said, said
    assert memgrowth.children_before_kill([(0.0, 5.0, 0.0, 40.0, 2150.0, 2200.0)], 2300.0, 1.0) == ("", False)
    assert memgrowth.children_before_kill(copied, 60_000.0, 132.0) == ("", False)   # a tenth of the rank: no
    assert memgrowth.children_before_kill([], None, 1.0) == ("", False)


def test_workers_holding_copies_of_a_quarter_of_the_rank_are_said_while_it_runs() -> None:
    """While the rank runs, its workers' copies of its pages are said once they are a quarter of its own
    memory (and 64 MB): the one sign of copy-on-read before the OOM killer ends the rank. Memory the
    workers took themselves, or copies small beside the rank, are not said. The wrapper asks only once its
    children hold 64 MB of their own (the engine's import waits till then): the same bar as the engine's."""
    from eroica_runtime.engine import memgrowth

    # (first read s, USS then, last read s, USS, anonymous RSS, the rank's), per worker
    copied = [(100.0, 50.0, 130.0, 300.0, 2150.0, 2200.0), (100.0, 50.0, 130.0, 300.0, 2150.0, 2200.0)]
    said = memgrowth.copies_while_running(copied)
    assert said is not None and said.startswith("its 2 child processes (its DataLoader workers, most often) hold "
                                                "600 MB of pages copied from the rank's memory"), said
    assert "0.3x the rank's own 2.1 GB" in said and "copy-on-read" in said and "numpy arrays" in said, said
    assert memgrowth.copies_while_running(copied[:1]) is None              # 300 MB of 2.2 GB: under a quarter
    took = [(100.0, 50.0, 130.0, 900.0, 3100.0, 2200.0)]                    # resident 900 MB over the rank's
    assert memgrowth.copies_while_running(took) is None
    assert memgrowth.copies_while_running([(0.0, 5.0, 0.0, 60.0, 150.0, 150.0)]) is None   # under 64 MB
    assert memgrowth.copies_while_running([]) is None
    assert oom.CHILDREN_MB == memgrowth.CHILDREN_MB


def _fork_reading(strings: list[str], wait_first: bool) -> tuple[int, int]:
    """A real fork of this process that reads every one of ``strings`` (copying their pages: reading a
    Python object writes its reference count), once a byte comes down the pipe if ``wait_first``, and
    then waits for one more before it exits. (its pid, the pipe's end to write to) The caller holds on
    to ``strings``: freed here, their pages would be the fork's alone before it read any."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(w)
        if wait_first:
            os.read(r, 1)
        total = sum(len(x) for x in strings)
        os.read(r, 1)
        os._exit(0 if total else 1)
    os.close(r)
    return pid, w


def _children_trail() -> oom.MemoryTrail:
    """The wrapper's trail of this process, reading its children at every sample."""
    trail = oom.MemoryTrail(os.getpid(), 0.0, 0.0)
    trail.CHILDREN_EVERY = 0
    trail.CHILDREN_BUDGET = 1.0
    return trail


def test_the_wrapper_reads_a_forked_childs_own_memory_as_it_copies_its_parents_objects() -> None:
    """A real fork of this process that reads 300,000 Python strings of its parent's: its own memory
    (USS) grows by their pages while its resident size does not, as the trail's reads of it say."""
    import time

    strings = [f"item-{i:09d}-" * 3 for i in range(300_000)]   # held here: freed, its pages became the fork's
    pid, w = _fork_reading(strings, wait_first=True)
    try:
        trail = _children_trail()
        trail.sample()
        first = {c[:2]: c for c in trail.children()}   # by when first read and its USS then
        os.write(w, b"x")
        time.sleep(1.0)
        trail.sample()
        # this process may have other children (a Slurm daemon a test started): the fork is the one that grew
        kid = max((c for c in trail.children() if c[:2] in first), key=lambda c: c[3] - c[1])
        grew_uss, grew_rss = kid[3] - kid[1], kid[4] - first[kid[:2]][4]
        assert grew_uss >= 20 and grew_rss < 0.5 * grew_uss, (kid, first)
    finally:
        os.write(w, b"x")
        os.close(w)
        os.waitpid(pid, 0)


def test_a_rank_shrinking_as_it_is_killed_leaves_its_workers_copies_said_to_be_copies() -> None:
    """The OOM killer ends the rank and the kernel frees its memory while its workers still run: a round
    of the wrapper's reads then found the rank small beside them, and read their copied pages as memory
    they took themselves (the rank "ran out while starting up", once in the suite's copy-on-read test).
    Here this process is the rank: a real fork of it reads 300,000 of its Python strings, and then it
    frees 256 MB it held before the fork before the last round (the fork still maps those pages, now its
    alone: its USS holds them too, as a reaped rank's workers' do; the verdict is the point here)."""
    import time

    from eroica_runtime.engine import memgrowth

    held = bytearray(256 << 20)          # touched by its allocation (zeroed), anonymous
    strings = [f"item-{i:09d}-" * 3 for i in range(300_000)]
    pid, w = _fork_reading(strings, wait_first=False)
    try:
        trail = _children_trail()
        trail.sample()                    # the rank at its size, before the kill
        time.sleep(1.0)
        del held                          # the kernel freeing the killed rank's memory
        trail.sample()                    # the last round, with the rank shrunk
        kids = [c for c in trail.children() if c[3] >= 20]   # the fork (not another child of this process)
        assert len(kids) == 1, trail.children()
        said, copied = memgrowth.children_before_kill(kids, None, time.time())
        assert copied and "copy-on-read" in said, (said, kids)
    finally:
        os.write(w, b"x")
        os.close(w)
        os.waitpid(pid, 0)


def test_the_first_copy_on_read_judgement_does_not_hold_off_the_next_read_of_the_workers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The wrapper reads the rank's children every CHILDREN_EVERY samples' time, later when its reads cost
    more CPU than CHILDREN_BUDGET. The warning's first judgement imports the engine (~65 ms of CPU), which
    counted as a read held the next round off 6.5 s: workers that had copied too little to be warned of at
    that round exited unread (the copy-on-read launch test, 2 of 30 runs). Here the judgement burns 100
    ms of CPU and the next round still comes at the usual pace."""
    import subprocess
    import time

    def judge() -> None:   # what the engine's import costs the wrapper's thread, and no warning yet
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.1:
            pass

    child = subprocess.Popen(["sleep", "30"])
    try:
        trail = oom.MemoryTrail(os.getpid(), 0.2, 0.0, warn=lambda said: None)
        monkeypatch.setattr(trail, "_say_copies", judge)
        trail.sample()
        first = max(c[2] for c in trail.children())
        until = time.time() + 4.0   # the usual pace: 5 samples of 0.2 s; held off, 10 s
        while time.time() < until and max(c[2] for c in trail.children()) == first:
            time.sleep(0.05)
            trail.sample()
        assert max(c[2] for c in trail.children()) > first, "the children were not read again within 4 s"
    finally:
        child.kill()
        child.wait()
