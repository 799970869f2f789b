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
