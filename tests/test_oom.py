"""eroica_launch/oom.py: what a rank's SIGKILL death (or its DataLoader worker's) says about the OOM killer
when the kernel's log cannot be read (no root, kernel.dmesg_restrict=1): the host's OOM-kill count.
The kernel's log itself is read in test_launch's root tests, where a real cgroup's OOM killer ends a rank."""

from __future__ import annotations

from pathlib import Path

import pytest

from eroica_launch import oom


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
