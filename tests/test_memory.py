"""A rank short of memory is named for it (engine/memory.py), not for the op its page faults fell in; ranks
short of memory alike are one job-wide memory finding, not a regression of their input pipeline.

Fixtures: the fault bench's memory case (`scripts/fault-bench --cases memory`, 2026-12-06, this 2-core
machine, root): 4 DDP ranks read their items from a memory-mapped file, and from step 50 rank 1's
memory cgroup leaves its page cache 32 MB. ``short-rank1.msgpack`` is the spike capture at step 56
(rank 1: 32 major faults and 65,518 refaulted pages in its 3-step window, 0 MB left of its 68 MB
limit; its peers none: 8 MB of readahead a fault on this disk). Before this rule it read "dataloader
... check its storage/network path to the dataset, num_workers ... CPU contention".

``short-all.msgpack``: the bench's memory-all case, every rank's cgroup squeezed alike from step 50
(spike capture at step 57: each rank 32 major faults and ~65,000 refaulted pages in its window, 0 MB
left of its 65-70 MB), and ``short-all-baseline.msgpack`` that job's baseline capture at step 13; it
read "REGRESSION ... most often the storage or network path to the dataset".

``workers-rank1.msgpack``: the memory case with 2 DataLoader workers a rank (`--workers 2`, 300 steps),
its drift capture at step 111: rank 1's workers took 7.3 major faults a step and its cgroup read back
15,355 pages a step, but their prefetch hid its waits from the window and the 8 steps before it (5.7
and 4.3 ms vs its peers' 3.6-10.3); over the 32 steps before the window it waited 17.8 ms a step
against 5.6-6.1. It read "healthy — 4/4 ranks agree, no culprit".
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np

from eroica_runtime import report, summary
from eroica_runtime.engine import diagnose
from eroica_runtime.engine.memory import memory_evidence
from eroica_runtime.engine.table import build_table

DATA = Path(__file__).parent / "data" / "memory"


def _capture(name: str) -> tuple[dict, list[dict]]:
    path = DATA / name
    meta, sums, errors = summary.decode_capture(path.read_bytes(), origin=path.name)
    assert not errors
    return meta, sorted(sums, key=lambda s: s["rank"])


def _diagnose(meta: dict, sums: list[dict]):
    return diagnose(sums, step=meta["step"], trigger=meta["trigger"], world_size=meta["world_size"])


def _host(s: dict, edge: str) -> dict:
    return s["telemetry"][edge]["host"]


def test_a_rank_whose_page_cache_its_cgroup_squeezed_is_named_short_of_memory() -> None:
    meta, sums = _capture("short-rank1.msgpack")
    d = _diagnose(meta, sums)
    assert [(f.rank, f.category) for f in d.findings] == [(1, "memory")], [f.title for f in d.findings]
    f = d.findings[0]
    # where the faults fell stays the function: the batch it was reading
    assert f.function.endswith("__next__") and f.phase == "data"
    faults, peers = f.evidence["major_faults"]
    assert faults >= 4.0 and peers == 0.0
    assert f.evidence["memory_short"] and f.evidence["refaults"] > faults
    assert f.evidence["mem_free_mb"] < 0.05 * f.evidence["mem_limit_mb"]
    assert f.action.startswith("This rank is short of memory")
    assert "memory limit" in f.action and "evicted" in f.action
    # neither the loader, the storage path nor the CPUs were at fault
    assert "num_workers, CPU load" not in f.action and "CPU contention" not in f.action
    assert "cpu_contention" not in f.evidence


def test_faults_of_pages_never_cached_are_storage_reads_not_a_memory_shortage() -> None:
    """The same faults with no refault in its cgroup and memory to spare: a memory-mapped file read from
    storage for the first time. The finding keeps its category and says where the pages came from."""
    meta, sums = _capture("short-rank1.msgpack")
    cold = copy.deepcopy(sums)
    _host(cold[1], "end")["refaults"] = _host(cold[1], "start")["refaults"]
    _host(cold[1], "end")["mem_free_mb"] = 20000.0
    d = _diagnose(meta, cold)
    assert [(f.rank, f.category) for f in d.findings] == [(1, "dataloader")], [f.title for f in d.findings]
    f = d.findings[0]
    assert f.evidence["memory_short"] is False
    assert "memory-mapped files" in f.action and "from storage" in f.action
    assert "short of memory" not in f.action


def test_without_a_refault_counter_little_memory_left_says_short() -> None:
    meta, sums = _capture("short-rank1.msgpack")
    table = build_table(sums)
    peers = np.arange(table.n)   # one group: the 4 ranks are alike
    no_counter = copy.deepcopy(sums)
    for s in no_counter:
        for edge in ("start", "end"):
            del _host(s, edge)["refaults"]
    ev = memory_evidence(build_table(no_counter), 1, peers)
    assert ev["memory_short"] and "refaults" not in ev
    roomy = copy.deepcopy(no_counter)
    _host(roomy[1], "end")["mem_free_mb"] = 0.5 * _host(roomy[1], "end")["mem_limit_mb"]
    assert memory_evidence(build_table(roomy), 1, peers)["memory_short"] is False
    # the peers, which faulted no page, never carry the evidence
    assert all(memory_evidence(table, r, peers) == {} for r in (0, 2, 3))


def test_a_capture_from_before_the_memory_telemetry_is_judged_as_before() -> None:
    meta, sums = _capture("short-rank1.msgpack")
    old = copy.deepcopy(sums)
    for s in old:
        for edge in ("start", "end"):
            for key in ("majflt", "refaults", "mem_limit_mb", "mem_free_mb"):
                del _host(s, edge)[key]
    d = _diagnose(meta, old)
    assert [(f.rank, f.category) for f in d.findings] == [(1, "dataloader")]
    assert "major_faults" not in d.findings[0].evidence


def test_ranks_short_of_memory_alike_are_one_job_wide_memory_finding() -> None:
    meta, sums = _capture("short-all.msgpack")
    _, base = _capture("short-all-baseline.msgpack")
    d = diagnose(sums, step=meta["step"], trigger=meta["trigger"], world_size=meta["world_size"], baseline=base)
    assert [(f.rank, f.category) for f in d.findings] == [(None, "memory")], [f.title for f in d.findings]
    f = d.findings[0]
    assert f.evidence["all_ranks"] and f.evidence["ranks_faulting_share"] == 1.0
    now, was = f.evidence["major_faults"]
    assert now >= 4.0 and was == 0.0 and f.evidence["refaults"] > now
    assert f.action.startswith("The ranks are short of memory alike: every rank took")
    assert "storage or network path" not in f.action
    assert report.format_finding(f)[0].startswith("  #1 MEMORY: all ranks — ")
    # without the memory telemetry it is the regression it was
    old = copy.deepcopy(sums)
    for s in old:
        for edge in ("start", "end"):
            for key in ("majflt", "refaults", "mem_limit_mb", "mem_free_mb"):
                del _host(s, edge)[key]
    d = diagnose(old, step=meta["step"], trigger=meta["trigger"], world_size=meta["world_size"], baseline=base)
    assert [(f.rank, f.category) for f in d.findings] == [(None, "regression")]


def test_the_same_jobs_healthy_baseline_shows_no_fault_and_no_finding() -> None:
    meta, sums = _capture("short-all-baseline.msgpack")
    assert meta["trigger"] == "baseline"
    d = _diagnose(meta, sums)
    assert not d.findings
    table = build_table(sums)
    assert all(memory_evidence(table, r, np.arange(table.n)) == {} for r in range(4))


def test_a_rank_short_of_memory_whose_workers_hid_its_waits_is_named_from_the_steps_before_the_window() -> None:
    meta, sums = _capture("workers-rank1.msgpack")
    assert meta["trigger"] == "drift"
    d = _diagnose(meta, sums)
    assert [(f.rank, f.category) for f in d.findings] == [(1, "memory")], ([f.title for f in d.findings], d.notes)
    f = d.findings[0]
    assert f.evidence["seen_in"] == "the 32 steps before the window (step clock)" and f.evidence["memory_short"]
    assert 0.1 * f.evidence["step_ms"][0] <= f.impact_ms_per_step <= 15.0
    assert f.action.startswith("Over the 32 steps before the window this rank waited for its next batch 17.8")
    assert "This rank is short of memory" in f.action
    # only a capture a detector asked for claims that something was slow
    assert not diagnose(sums, step=meta["step"], trigger="baseline", world_size=meta["world_size"]).findings
    # the same waits without the window's evidence of a memory shortage: no culprit, as before
    healthy = copy.deepcopy(sums)
    _host(healthy[1], "end")["majflt"] = _host(healthy[1], "start")["majflt"]
    assert not _diagnose(meta, healthy).findings
