"""Diagnosis engine: planted faults are found with the right culprit, category and victims;
healthy captures stay quiet; pipeline stages are never compared with each other."""

from __future__ import annotations

import copy
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from eroica_runtime import analyst, report, summary, synth
from eroica_runtime.engine import (
    Diagnosis,
    Thresholds,
    build_table,
    categories,
    consolidate,
    diagnose,
    parse_topology,
)
from eroica_runtime.engine.categories import host_lead
from eroica_runtime.engine.impact import Gates
from eroica_runtime.engine.model import Finding
from eroica_runtime.engine.peers import form_peers
from eroica_runtime.report import format_capture, format_finding
from eroica_runtime.report_html import render_html

DATA = Path(__file__).parent / "data" / "engine"
SCENARIOS = json.loads((DATA / "scenarios.json").read_text())["scenarios"]


def load_dir(root: Path) -> dict[str, tuple[dict, list[dict], list[str]]]:
    """trigger -> (meta, summaries, errors) for every capture synth wrote."""
    out = {}
    for path in sorted((root / "captures").glob("*.msgpack")):
        meta, good, errors = summary.decode_capture(path.read_bytes(), origin=path.name)
        out[meta["trigger"]] = (meta, good, errors)
    return out


def run(root: Path, **kw: Any):
    caps = load_dir(root)
    meta, good, errors = caps["slow_step"]
    probe = (meta.get("extra") or {}).get("link_probe")
    return diagnose(good, step=meta["step"], trigger=meta["trigger"], world_size=meta["world_size"],
                    baseline=caps["baseline"][1], errors=errors, link_probe=probe, **kw)


@pytest.mark.parametrize("sc", SCENARIOS, ids=[s["name"] for s in SCENARIOS])
def test_planted_culprit(tmp_path: Path, sc: dict) -> None:
    synth.generate(tmp_path, **sc["make"])
    d = run(tmp_path)
    exp = sc["expect"]
    assert len(d.findings) == 1, [f.title for f in d.findings]
    f = d.findings[0]
    assert (f.category, f.rank, f.function, f.phase) == (exp["category"], exp["rank"], exp["function"], exp["phase"])
    n = sc["make"]["ranks"]
    # victims: (nearly) every other rank waited on it; none of them is a finding
    assert exp["rank"] not in f.victims
    assert len(f.victims) >= 0.6 * (n - 1)
    assert f.impact_ms_per_step > 20
    assert f.what_if_step_ms is not None and f.what_if_step_ms < d.step_ms["median"]
    assert f.evidence["own_work_ms"][0] > f.evidence["own_work_ms"][1]
    assert f.evidence["comm_wait_ms"][0] < f.evidence["comm_wait_ms"][1]


def test_host_fault_reports_cpu_contention(tmp_path: Path) -> None:
    synth.generate(tmp_path, ranks=16, fault="host", culprit=3)
    f = run(tmp_path).findings[0]
    assert f.evidence.get("cpu_contention") and f.evidence.get("cpu_throttled")
    assert "contention" in f.action


def test_communication_named_host_with_probe_and_with_counters(tmp_path: Path) -> None:
    plan = synth.generate(tmp_path, ranks=32, fault="communication", culprit=19)
    d = run(tmp_path)
    comm = [f for f in d.findings if f.category == "communication"]
    assert len(d.findings) == 1 and len(comm) == 1
    assert comm[0].rank is None and comm[0].host == plan.culprit_host == "node00002"
    assert comm[0].evidence["localized_by"] == "link_probe"
    caps = load_dir(tmp_path)
    d2 = diagnose(caps["slow_step"][1], step=500, trigger="slow_step", world_size=32,
                  baseline=caps["baseline"][1])           # no probe: TCP retransmits still point at it
    assert d2.findings[0].host == "node00002"
    assert "tcp_retrans" in d2.findings[0].evidence["localized_by"]


def test_regression_names_grown_function(tmp_path: Path) -> None:
    synth.generate(tmp_path, ranks=24, fault="regression")
    d = run(tmp_path)
    assert [f.category for f in d.findings] == ["regression"]
    f = d.findings[0]
    assert f.rank is None and f.function == "aten::bmm" and f.phase == "forward"
    assert f.impact_ms_per_step > 20
    assert f.evidence["functions"][0]["now_ms"] > f.evidence["functions"][0]["baseline_ms"]
    # synth's regression makes the same bmm calls slower: not more work
    assert f.action.startswith("The same 20 calls of aten::bmm a step as in the baseline, each slower"), f.action
    # without the baseline capture there is nothing to compare with: no finding
    caps = load_dir(tmp_path)
    assert not diagnose(caps["slow_step"][1], step=500, trigger="slow_step", world_size=24).findings


def _job_wide_regression(case: str, step: int):  # type: ignore[no-untyped-def]
    """The one finding of a 4-rank fault-bench job slowed on every rank alike (tests/data/faultbench/
    ``case``: its baseline capture and the capture at ``step``): a regression, no culprit rank."""
    (_, base, _), (meta, spike, errors) = (
        summary.decode_capture(p.read_bytes())
        for p in sorted((DATA.parent / "faultbench" / case / "captures").glob("*.msgpack"), key=lambda p: int(p.stem)))
    assert not errors and meta["step"] == step
    d = diagnose(spike, step=step, trigger=meta["trigger"], world_size=4, baseline=base)
    assert [(f.category, f.rank) for f in d.findings] == [("regression", None)], [f.title for f in d.findings]
    return d.findings[0]


def test_a_real_job_wide_regression_shows_the_extra_calls_and_no_collective_as_grown_work() -> None:
    """The fault bench's everyone-slower captures (every rank runs 230 extra matmuls a step): the
    regression names the matmul with its calls then and now (more work per step, not slower work),
    and the collective every rank waited longer in is not listed as work that grew."""
    f = _job_wide_regression("everyone-slower", 56)
    assert f.function in ("aten::matmul", "aten::mm")
    top = f.evidence["functions"][0]
    assert top["now_calls"] >= 200 and top["baseline_calls"] <= 5, top
    assert all(fn["name"] != "gloo:all_reduce" for fn in f.evidence["functions"]), f.evidence["functions"]
    grew = next(line for line in format_finding(f) if "grew most:" in line)
    assert f"{top['now_calls']:.0f} vs {top['baseline_calls']:.0f} calls" in grew, grew
    assert f.action.startswith(f"{top['name']} runs {top['now_calls']:.0f} times a step now vs "
                               f"{top['baseline_calls']:.0f} in the baseline: every rank does more work"), f.action


def test_a_baseline_no_faster_than_the_window_puts_no_floor_under_what_fixing_the_culprit_gives() -> None:
    """A 2x2 tensor x data parallel job whose rank 3 ran 40 extra matmuls a step (tests/data/engine/
    tpdp-slow-baseline, a real 4-rank job): its baseline window stepped 44.4 ms, slower than the spike
    window's 42.9, while the job's steps before the fault ran 34.9. Used as the healthy floor, that
    baseline read "+15.9 ms/step (step -> 42.9 ms if fixed)": no gain from fixing a culprit 3 ranks
    waited on. Without it, the what-if is the step less what the culprit holds it by."""
    d = DATA / "tpdp-slow-baseline"
    (_, base, _), (meta, cur, errors) = (summary.decode_capture(p.read_bytes())
                                         for p in (d / "13.msgpack", d / "72.msgpack"))
    assert not errors
    r = diagnose(cur, step=72, trigger=meta["trigger"], world_size=4, baseline=base)
    (f,) = r.findings
    assert (f.category, f.rank, f.function) == ("compute", 3, "aten::matmul"), f.title
    assert r.step_ms["baseline"] >= r.step_ms["median"], r.step_ms
    assert f.what_if_step_ms is not None and f.what_if_step_ms <= r.step_ms["median"] - 0.5 * f.impact_ms_per_step, (
        f.what_if_step_ms, f.impact_ms_per_step, r.step_ms)
    assert r.step_ms["what_if_all_fixed"] < r.step_ms["median"], r.step_ms


def _capture_pair(name: str, base_step: int, step: int, world: int) -> Diagnosis:
    (_, base, _), (meta, cur, errors) = (summary.decode_capture((DATA / name / f"{s}.msgpack").read_bytes())
                                         for s in (base_step, step))
    assert not errors
    return diagnose(cur, step=step, trigger=meta["trigger"], world_size=world, baseline=base)


def test_a_rank_whose_other_thread_holds_the_gil_is_named_blocked_not_slower_hardware() -> None:
    """Rank 1 of 3 runs a thread spinning in pure Python (tests/data/engine/gil-thread, a real job): its
    ops read 100x slower, the same calls as its peers', and the finding said "COMPUTE ... Compare this
    rank's GPU/CPU with its peers (clocks, thermals, co-located jobs); drain the node". Its training
    thread was off the CPU through nearly all of it while its process's other threads ran a CPU: that
    rank, blocked (host), with what to look for and how to see it."""
    d = _capture_pair("gil-thread", 13, 68, 3)
    (f,) = d.findings
    assert (f.category, f.rank, f.victims) == ("host", 1, (0, 2)), f.title
    off, peers_off = f.evidence["off_cpu_ms"]
    others, peers_others = f.evidence["other_threads_cpu_ms"]
    assert off >= 0.9 * f.evidence["own_work_ms"][0] and others >= 0.9 * f.evidence["step_ms"][0], f.evidence
    assert peers_off < 5 and peers_others < 0.05 * f.evidence["step_ms"][1], f.evidence
    assert "another thread of this rank holds the GIL" in f.action and "py-spy dump" in f.action, f.action
    for wrong in ("thermals", "drain the node", "clocks"):
        assert wrong not in f.action, f.action


@pytest.mark.parametrize("step", [68, 216])
def test_a_rank_running_python_of_its_own_between_ops_is_told_to_look_at_its_loop_not_the_host(step: int) -> None:
    """Rank 0 of 3 smooths a long loss history in pure Python after every step (tests/data/engine/
    python-between-ops, a real job). The spike capture read "CPU-side stalls ... check other processes
    on the host, CPU pinning and cgroup limits", the drift capture (named from the steps before its
    window) "compute (forward) ... drain the node". Its training thread ran on a CPU, neither queued nor
    blocked, outside any op: its own Python, and where to look for it."""
    d = _capture_pair("python-between-ops", 13, step, 3)
    (f,) = d.findings
    assert (f.category, f.rank, f.phase, f.victims) == ("host", 0, "host_gap", (1, 2)), f.title
    mine, peers = f.evidence["thread_cpu_ms"]
    assert mine - peers >= 0.5 * f.evidence["excess_ms"], f.evidence
    assert "Python of its own in the training loop" in f.action and "py-spy top" in f.action, f.action
    for wrong in ("thermals", "drain the node", "cgroup", "other processes on the host"):
        assert wrong not in f.action, f.action


@pytest.mark.parametrize("name", ["69.msgpack", "69-rerun.msgpack"])
def test_a_window_one_rank_stalled_once_in_reads_a_one_off_not_healthy_nor_a_per_step_cost(name: str) -> None:
    """Rank 3 of 4 slept 2 s once, in step 70 of a manual capture's 3-step window (tests/data/engine/
    one-off-stall, a real job run twice): the same window read "+667.0 ms/step" in one run and
    "healthy" (median step 686 ms) in the other. Both read a one-off of rank 3's, in that step, with no
    finding, and no level the drift rule would learn as healthy."""
    (_, base, _), (meta, cur, errors) = (summary.decode_capture((DATA / "one-off-stall" / f).read_bytes())
                                         for f in ("13.msgpack", name))
    assert not errors
    d = diagnose(cur, step=69, trigger=meta["trigger"], world_size=4, baseline=base)
    assert d.findings == () and d.step_ms["median"] > 40 * d.step_ms["baseline"], d.step_ms
    one = d.step_ms["one_off"]
    assert (one["rank"], one["steps"], one["ranks"]) == (3, [70], 1) and 1900 < one["ms"] < 2100, one
    line = format_capture(d)
    assert line.startswith("eroica: step 69 (manual): a one-off stall, no steady culprit — rank 3 on vm worked "
                           "2.00 s alone in step 70 while its peers waited"), line
    assert "healthy" not in line and "ms/step" not in line, line
    assert "the job summary's longest steps say where it was" in line, line
    doc = d.to_json()
    assert not report.is_healthy(doc) and not analyst.healthy_against_baseline(d)
    # a one-off too short for the job summary's longest steps (10x the step, 100 ms) does not send the reader there
    short = copy.deepcopy(doc)
    short["step_ms"]["one_off"]["ms"] = 60.0
    assert "alone in step 70" in format_capture(short) and "longest steps" not in format_capture(short)
    page = render_html({"schema": "eroica.report/1", "world_size": 4, "findings": [], "captures": []}, [doc], None)
    assert "A one-off stall, no steady culprit: rank 3" in page


def test_a_rank_whose_intra_op_threads_do_more_work_stays_a_compute_culprit() -> None:
    """Every rank computes with 3 intra-op threads and rank 2's batches are 4x larger (tests/data/engine/
    intra-op-bigger-batch, a real job): its other threads run for its work as its peers' do for theirs,
    so it is compute, not a thread holding the GIL."""
    d = _capture_pair("intra-op-bigger-batch", 13, 114, 3)
    (f,) = d.findings
    assert (f.category, f.rank) == ("compute", 2), f.title
    assert "other_threads_cpu_ms" not in f.evidence and "GIL" not in f.action, f.action


def test_every_ranks_input_slowing_alike_is_a_regression_with_the_input_pipelines_action() -> None:
    """Every rank's dataset 40 ms slower a batch (the storage all ranks read from slowed; a real 4-rank
    job, tests/data/faultbench/everyone-data): no rank is the culprit, the job is slower than its
    baseline in the data phase. What to check is the shared input path, not the clocks and thermals
    of a compute regression, which the action said before."""
    f = _job_wide_regression("everyone-data", 57)
    assert f.phase == "data" and "DataLoader" in str(f.function), (f.phase, f.function)
    assert "next batch" in f.action and "storage or network path to the dataset" in f.action, f.action
    assert "clocks" not in f.action and "thermals" not in f.action, f.action
    # own work grew more than the step did (the waits shrank as every rank slowed alike): fixed, the job
    # steps as in its baseline, not faster ("step -> 60.8 ms if fixed" against a 66.8 ms baseline step)
    now, base_step = f.evidence["step_ms"]
    assert f.impact_ms_per_step > now - base_step and f.what_if_step_ms == base_step, (f.impact_ms_per_step,
                                                                                       f.what_if_step_ms, now, base_step)


def _one_rank_spike(case: str) -> tuple[list[dict[str, Any]], Diagnosis]:
    """A one-rank fault-bench job's spike capture (step 67) and its diagnosis against its baseline."""
    (_, base, _), (meta, spike, errors) = (
        summary.decode_capture(p.read_bytes())
        for p in sorted((DATA.parent / "faultbench" / case / "captures").glob("*.msgpack"), key=lambda p: int(p.stem)))
    assert not errors and meta["step"] == 67 and len(spike) == 1
    return spike, diagnose(spike, step=67, trigger=meta["trigger"], world_size=1, baseline=base)


def test_a_one_rank_jobs_slower_dataset_names_that_rank_and_its_input_path_not_all_ranks() -> None:
    """A job of one process whose dataset slowed 40 ms a batch (tests/data/faultbench/one-rank-data, a
    real eroica-run --nproc-per-node 1 job): compared with its own baseline, the rank and its host are
    named. It read "REGRESSION: all ranks", "every rank's batches take longer", "something all ranks
    share slowed" and "The same 1 calls of ..." for a job with no other rank."""
    spike, d = _one_rank_spike("one-rank-data")
    assert [(f.category, f.rank, f.host) for f in d.findings] == [("regression", 0, spike[0]["host"])], \
        [f.title for f in d.findings]
    f = d.findings[0]
    assert f.phase == "data" and "DataLoader" in str(f.function), (f.phase, f.function)
    assert f.title.startswith("Rank 0 slower than its baseline capture"), f.title
    head = format_finding(f)[0]
    assert f"REGRESSION: rank 0 on {spike[0]['host']} — " in head, head
    assert f.action.startswith(f"The same call of {f.function} a step as in the baseline, slower"), f.action
    assert "next batch" in f.action and "storage or network path to the dataset" in f.action, f.action
    for many in ("every rank", "Every rank", "all ranks", "each rank"):
        assert many not in f.action and many not in f.title, (many, f.title, f.action)
    assert report.ranks_text(f.to_json()) == "0"


def test_a_one_rank_job_short_of_memory_is_told_about_that_rank_not_the_ranks_alike() -> None:
    """A job of one process whose memory cgroup left its page cache 32 MB from step 60
    (tests/data/faultbench/one-rank-memory, a real eroica-run --nproc-per-node 1 job as root): named
    memory, that rank, with its own figures against its baseline and the one-rank advice. It read "The
    ranks are short of memory alike: every rank took 8 major page faults a step (median) ... 0 MB left
    of the 68 MB each may use ... every rank waits for storage"."""
    spike, d = _one_rank_spike("one-rank-memory")
    assert [(f.category, f.rank, f.host) for f in d.findings] == [("memory", 0, spike[0]["host"])], \
        [f.title for f in d.findings]
    f = d.findings[0]
    assert f.title.startswith("Rank 0 slower than its baseline capture, short of memory"), f.title
    assert f.action.startswith("This rank is short of memory: 8 major page faults a step vs 0 in its baseline "
                               "capture"), f.action
    assert "MB it may use" in f.action and "Raise its memory limit" in f.action, f.action
    for many in ("every rank", "Every rank", "all ranks", "each rank", "The ranks", "alike"):
        assert many not in f.action and many not in f.title, (many, f.title, f.action)
    head = format_finding(f)[0]
    assert f"MEMORY: rank 0 on {spike[0]['host']} — " in head, head


def test_fixing_the_worse_of_two_culprits_brings_the_step_down_to_the_other_ones_level() -> None:
    """Two faults at once in a real 4-rank job (tests/data/faultbench/two-culprits): rank 3 runs 150 ms
    of extra matmuls a step and rank 1's dataset sleeps 80 ms a batch. Both are named, rank 3 first.
    Fixed alone, rank 3 leaves the step where rank 1's own work holds it (the same job with rank 1's
    fault alone stepped at 62% of this one's step), not the step less the difference of the two costs,
    which said 164 of 195 ms and sent a reader to the wrong rank first; fixing rank 1 alone leaves the
    step as it is. Each says which rank holds the step after or before it: the order to fix them in.
    Both are measured against the two ranks that only waited (own work 18 ms a step), not against a
    median that counts the other culprit (58.7 ms, which put rank 1's own work 40 ms above its peers'
    for 81 ms of slower batches)."""
    (_, base, _), (meta, spike, errors) = (summary.decode_capture(p.read_bytes()) for p in sorted(
        (DATA.parent / "faultbench" / "two-culprits" / "captures").glob("*.msgpack"), key=lambda p: int(p.stem)))
    assert not errors
    d = diagnose(spike, step=meta["step"], trigger=meta["trigger"], world_size=4, baseline=base)
    assert [(f.rank, f.category) for f in d.findings] == [(3, "compute"), (1, "dataloader")], \
        [f.title for f in d.findings]
    worse, other = d.findings
    step = d.step_ms["median"]
    own_other, ref = other.evidence["own_work_ms"]
    assert worse.evidence["own_work_ms"][1] == ref < 0.3 * own_other, (worse.evidence["own_work_ms"], own_other)
    assert worse.what_if_step_ms is not None and other.what_if_step_ms is not None
    assert own_other <= worse.what_if_step_ms <= 0.75 * step, (worse.what_if_step_ms, own_other, step)
    assert other.what_if_step_ms >= 0.95 * step, (other.what_if_step_ms, step)
    # the order to fix them in, said where the step is
    assert worse.evidence["then_held_by"] == 1 and other.evidence["held_by"] == 3
    assert format_finding(worse)[0].endswith("ms if fixed, then rank 1 holds it)"), format_finding(worse)[0]
    assert "fixed alone, the step stays" in format_finding(other)[0], format_finding(other)[0]


def test_of_two_culprits_alike_neither_fixed_alone_shortens_the_step() -> None:
    """Two ranks holding the step equally high: fixing either alone leaves it as it is, and each says
    the other "holds it too" (not "longer", which both would say of each other); fixed together, the step
    falls by their level, no lower than the floor; a culprit that holds nothing is never named for it."""
    gates = Gates(200.0, {1: 100.0, 3: 100.0, 2: 0.0}, {1: 60.0, 3: 70.0, 2: 60.0})
    assert gates.fixed({1}) == (200.0, {"held_by": 3}) and gates.fixed({3}) == (200.0, {"held_by": 1})
    assert gates.fixed({1, 3}) == (100.0, {}) and gates.fixed({2}) == (200.0, {"held_by": 1})
    assert Gates(200.0, {1: 180.0}, {1: 70.0}).fixed({1}) == (70.0, {})    # no lower than the floor
    f = Finding(category="compute", rank=1, host="h", function="aten::mm", phase="forward", impact_ms_per_step=100.0,
                what_if_step_ms=200.0, victims=(0,), evidence={"held_by": 3}, action="", title="")
    assert format_finding(f)[0].endswith("+100.0 ms/step (fixed alone, the step stays 200.0 ms: rank 3 holds it too)")


def test_a_culprit_beside_slow_collectives_and_the_network_finding_each_say_the_other_holds_the_step_next() -> None:
    """Host 1's link shaped while rank 3 runs extra matmuls (tests/data/faultbench/link-compute): the
    communication finding and rank 3's compute are both named, and each says that, fixed, the other holds
    the step (before: "step -> X ms if fixed" alone, as if either fix gave the healthy step)."""
    (_, base, _), (meta, spike, _) = (summary.decode_capture(p.read_bytes()) for p in sorted(
        (DATA.parent / "faultbench" / "link-compute" / "captures").glob("*.msgpack"), key=lambda p: int(p.stem)))
    d = diagnose(spike, step=meta["step"], trigger=meta["trigger"], world_size=4, baseline=base,
                 link_probe=meta.get("link_probe"))
    by = {f.category: f for f in d.findings}
    assert set(by) == {"communication", "compute"} and by["compute"].rank == 3, [f.title for f in d.findings]
    assert by["communication"].evidence["then_held_by"] == 3 and by["compute"].evidence["then_collectives"] is True
    assert format_finding(by["communication"])[0].endswith("ms if fixed, then rank 3 holds it)")
    assert format_finding(by["compute"])[0].endswith("ms if fixed, then the slow collectives hold it)")


def test_two_culprits_merged_into_one_host_finding_are_fixed_together() -> None:
    """Ranks 1 and 3 of a 4-rank host both run 150 ms of extra matmuls a step (tests/data/faultbench/
    two-alike): one host finding for both. Fixed, it takes both away: its step is not held by rank 3,
    one of its own ranks ("step -> 192.7 ms if fixed, then rank 3 holds it" of a 201 ms step before), and
    its action does not send anyone to the host.
    Its cost is what the job lost: half the group slow put the median of all four between the slow and
    the healthy (+77 ms a step, the step 58.4 -> 201.2 ms against the baseline); the ranks that only
    waited are the reference."""
    (_, base, _), (meta, spike, _) = (summary.decode_capture(p.read_bytes()) for p in sorted(
        (DATA.parent / "faultbench" / "two-alike" / "captures").glob("*.msgpack"), key=lambda p: int(p.stem)))
    d = diagnose(spike, step=meta["step"], trigger=meta["trigger"], world_size=4, baseline=base)
    (f,) = d.findings
    assert f.category == "compute" and f.evidence["ranks"] == [1, 3], f.title
    assert "held_by" not in f.evidence and "then_held_by" not in f.evidence, f.evidence
    lost = d.step_ms["median"] - d.step_ms["baseline"]
    assert 0.8 * lost <= f.impact_ms_per_step <= 1.2 * lost, (f.impact_ms_per_step, lost)
    assert f.what_if_step_ms is not None and f.what_if_step_ms <= 0.75 * d.step_ms["median"], (
        f.what_if_step_ms, d.step_ms["median"])
    assert format_finding(f)[0].endswith("ms if fixed)"), format_finding(f)[0]
    # both run more calls than their peers: more work, whatever host they are on (it read "suspect the
    # host", in a job on one host whose other two ranks were fine)
    assert "not the host" in f.action and "suspect the host" not in f.action, f.action


def test_a_host_finding_sends_the_reader_to_the_host_only_where_another_host_could_be_fine() -> None:
    """Every rank of one host of several slow alike: the host. Some of its ranks: the host or what those
    ranks share on it. A job on one host: what the slow ranks share, never "the host". Ranks that each run
    more calls than their peers: more work, not the host."""
    assert host_lead("n3", 8, 8, 4, False) == "All 8 ranks on n3 are slow alike: suspect the host. "
    assert "suspect the host, or what those ranks share" in host_lead("n3", 4, 8, 4, False)
    one = host_lead("vm", 2, 4, 1, False)
    assert "the host" not in one and "what those ranks share" in one, one
    assert "more work, not the host" in host_lead("n3", 8, 8, 4, True)


def test_a_culprit_the_other_hid_from_the_median_is_judged_again_against_the_healthy_ranks() -> None:
    """The fault bench's two-alike, a run where rank 3 missed the bars (tests/data/faultbench/
    two-alike-missed): own work 50, 190, 45 and 157 ms; against the median of all four rank 3 was +53.3 ms,
    0.4 ms short of a quarter of the step, and only rank 1 was named. Against ranks 0 and 2 it is
    +110 ms: both are named, in one host finding, and fixed, the step falls to about the baseline's,
    not to rank 3's own wait (106.8 ms if fixed, 33 ms of it for rank 1)."""
    (_, base, _), (meta, spike, _) = (summary.decode_capture(p.read_bytes()) for p in sorted(
        (DATA.parent / "faultbench" / "two-alike-missed" / "captures").glob("*.msgpack"), key=lambda p: int(p.stem)))
    d = diagnose(spike, step=meta["step"], trigger=meta["trigger"], world_size=4, baseline=base)
    (f,) = d.findings
    assert f.category == "compute" and f.evidence["ranks"] == [1, 3], (f.title, f.evidence.get("ranks"))
    lost = d.step_ms["median"] - d.step_ms["baseline"]
    assert 0.8 * lost <= f.impact_ms_per_step <= 1.2 * lost, (f.impact_ms_per_step, lost)
    assert f.what_if_step_ms is not None and f.what_if_step_ms <= 0.4 * d.step_ms["median"], f.what_if_step_ms


def test_most_of_a_group_slow_alike_is_a_regression_that_names_the_ranks_it_spared() -> None:
    """Three of four ranks slow alike (the two-alike fixture with rank 0 made a copy of rank 1: 150 ms of
    extra matmuls a step on ranks 0, 1 and 3) is beyond a comparison of peers, and the capture reads as a
    regression against the baseline. It said "all ranks" and "every rank does more work" though rank 2
    did not slow: an SRE would drain its host with the others'. It says 3 of 4 ranks, and not rank 2."""
    (_, base, _), (meta, spike, _) = (summary.decode_capture(p.read_bytes()) for p in sorted(
        (DATA.parent / "faultbench" / "two-alike" / "captures").glob("*.msgpack"), key=lambda p: int(p.stem)))
    spike = sorted(spike, key=lambda s: s["rank"])
    spike[0] = {**copy.deepcopy(spike[1]), "rank": 0, "local_rank": spike[0].get("local_rank", 0)}
    d = diagnose(spike, step=meta["step"], trigger=meta["trigger"], world_size=4, baseline=base)
    (f,) = d.findings
    assert f.category == "regression" and f.evidence["ranks_spared"] == [2], f.evidence
    head, facts = format_finding(f)[:2]
    assert "REGRESSION: 3 of 4 ranks" in head and "not slower: rank 2" in facts, (head, facts)
    assert "every rank" not in f.action.lower() and "rank 2 did not" in f.action, f.action
    assert f.impact_ms_per_step >= 0.8 * (d.step_ms["median"] - d.step_ms["baseline"])
    spike[2] = {**copy.deepcopy(spike[3]), "rank": 2, "local_rank": spike[2].get("local_rank", 2)}
    (f,) = diagnose(spike, step=meta["step"], trigger=meta["trigger"], world_size=4, baseline=base).findings
    assert "ranks_spared" not in f.evidence and "REGRESSION: all ranks" in format_finding(f)[0]


def test_half_of_eight_ranks_slow_alike_cost_what_the_slow_ones_grew() -> None:
    """Ranks 1, 3, 5 and 6 of a real 8-rank job each run 100 ms of extra matmuls a step (tests/data/
    faultbench/half-of-eight): nobody stands out from the median of all eight, and the capture is a
    regression against the baseline that spares ranks 0, 2, 4 and 7. Its cost is what the slow ranks'
    own work grew, not the median of theirs and the spared ranks' (+47 ms a step of the 84 the step grew)."""
    (_, base, _), (meta, spike, _) = (summary.decode_capture(p.read_bytes()) for p in sorted(
        (DATA.parent / "faultbench" / "half-of-eight" / "captures").glob("*.msgpack"), key=lambda p: int(p.stem)))
    d = diagnose(spike, step=meta["step"], trigger=meta["trigger"], world_size=8, baseline=base)
    (f,) = d.findings
    assert f.category == "regression" and f.evidence["ranks_spared"] == [0, 2, 4, 7], (f.title, f.evidence)
    grew = d.step_ms["median"] - d.step_ms["baseline"]
    assert 0.8 * grew <= f.impact_ms_per_step <= 1.25 * grew, (f.impact_ms_per_step, grew)
    assert f.what_if_step_ms == d.step_ms["baseline"] and "4 of 8 ranks" in format_finding(f)[0]


def test_half_the_ranks_slow_alike_on_one_node_of_two_names_the_node() -> None:
    """The half-of-eight capture with its four slow ranks on host node-b and the others on node-a (a
    two-node job whose one node slowed alike): the same regression, named on node-b, every rank of which
    slowed and none elsewhere. Their extra calls say more work, not the host; the same calls each slower
    would make the host the suspect."""
    (_, base, _), (meta, spike, _) = (summary.decode_capture(p.read_bytes()) for p in sorted(
        (DATA.parent / "faultbench" / "half-of-eight" / "captures").glob("*.msgpack"), key=lambda p: int(p.stem)))
    for s in (*base, *spike):
        s["host"] = "node-b" if s["rank"] in (1, 3, 5, 6) else "node-a"
    d = diagnose(spike, step=meta["step"], trigger=meta["trigger"], world_size=8, baseline=base)
    (f,) = d.findings
    assert f.category == "regression" and f.host == "node-b" and f.evidence["slow_hosts"] == ["node-b"], f.title
    assert "4 of 8 ranks on node-b" in format_finding(f)[0], format_finding(f)[0]
    assert "every rank on node-b and none elsewhere, each running more calls" in f.action, f.action
    assert "suspect the host" in categories.regression_action("forward", [0, 2, 4, 7], 4, ["node-b"], False)
    for s in base:   # the spared ranks on node-b too: no host is singled out
        s["host"] = "node-b" if s["rank"] in (1, 3, 5, 6, 7) else "node-a"
    for s in spike:
        s["host"] = "node-b" if s["rank"] in (1, 3, 5, 6, 7) else "node-a"
    (f,) = diagnose(spike, step=meta["step"], trigger=meta["trigger"], world_size=8, baseline=base).findings
    assert f.host is None and "slow_hosts" not in f.evidence, (f.host, f.evidence.get("slow_hosts"))


def _two_captures(name: str) -> tuple[list[dict], dict, list[dict]]:
    """(baseline summaries, spike meta, spike summaries) of a recorded tests/data/faultbench fixture."""
    (_, base, _), (meta, spike, _) = (summary.decode_capture(p.read_bytes()) for p in sorted(
        (DATA.parent / "faultbench" / name / "captures").glob("*.msgpack"), key=lambda p: int(p.stem)))
    return base, meta, spike


def test_one_node_of_two_slow_alike_on_real_hosts_is_named_on_that_node() -> None:
    """A real job on two fake hosts, four ranks each, every rank of the second host +100 ms of matmuls
    a step (tests/data/faultbench/two-hosts-slow-node): the regression that spares the first host's
    ranks is named on the second host, by its real hostname, and more calls say more work."""
    base, meta, spike = _two_captures("two-hosts-slow-node")
    slow_host = next(s["host"] for s in spike if s["rank"] == 4)
    d = diagnose(spike, step=meta["step"], trigger=meta["trigger"], world_size=8, baseline=base)
    (f,) = d.findings
    assert f.category == "regression" and f.host == slow_host, (f.title, f.host)
    assert f.evidence["ranks_spared"] == [0, 1, 2, 3] and f.evidence["slow_hosts"] == [slow_host], f.evidence
    assert f"4 of 8 ranks on {slow_host}" in format_finding(f)[0], format_finding(f)[0]
    assert "more work" in f.action and "suspect the host" not in f.action, f.action
    grew = d.step_ms["median"] - d.step_ms["baseline"]
    assert 0.8 * grew <= f.impact_ms_per_step <= 1.25 * grew, (f.impact_ms_per_step, grew)


def test_a_nodes_ranks_all_held_by_their_cpu_quota_are_one_finding_on_that_node() -> None:
    """A real job on two fake hosts, every rank of the second held by a CPU quota of 0.1 CPUs
    (tests/data/faultbench/two-hosts-throttled-node): one host finding on that host with its four ranks,
    and its head says so ("4 of 4 ranks on <host>"), not "no single rank", which reads as if nobody
    were to blame."""
    base, meta, spike = _two_captures("two-hosts-throttled-node")
    slow_host = next(s["host"] for s in spike if s["rank"] == 4)
    (f,) = diagnose(spike, step=meta["step"], trigger=meta["trigger"], world_size=8, baseline=base).findings
    assert (f.category, f.host, f.rank) == ("host", slow_host, None), f.title
    assert f.evidence["ranks"] == [4, 5, 6, 7] and f.evidence["cpu_quota"] == 0.1, f.evidence
    head = format_finding(f)[0]
    assert f"HOST: 4 of 4 ranks on {slow_host}" in head and "no single rank" not in head, head


def test_fixed_a_culprit_leaves_the_job_at_its_healthy_step_not_faster() -> None:
    """The fault bench's data case (tests/data/faultbench/data): rank 1's dataset sleeps 80 ms a batch,
    and while it sleeps its peers have the 2 cores: their own work runs faster than healthy. Its what-if
    took the step less its cost and said 37.9 ms, of a job whose baseline stepped 56.5 ms; fixed, the
    job steps as in its baseline, and so does the capture's "every finding fixed"."""
    (_, base, _), (meta, spike, _) = (summary.decode_capture(p.read_bytes()) for p in sorted(
        (DATA.parent / "faultbench" / "data" / "captures").glob("*.msgpack"), key=lambda p: int(p.stem)))
    d = diagnose(spike, step=meta["step"], trigger=meta["trigger"], world_size=4, baseline=base)
    (f,) = d.findings
    assert (f.rank, f.category) == (1, "dataloader"), f.title
    assert f.what_if_step_ms == d.step_ms["baseline"] == d.step_ms["what_if_all_fixed"], (f.what_if_step_ms, d.step_ms)
    assert f.impact_ms_per_step > d.step_ms["median"] - d.step_ms["baseline"]   # its cost is still its own


def test_a_detector_window_too_noisy_to_call_is_slower_when_the_steps_before_it_were() -> None:
    """The fault bench's memory case with 2 DataLoader workers a rank (tests/data/faultbench/memory-workers):
    rank 1's thrashing slowed every rank of the 2-core host alike, and its drift capture's 3-step window
    (62.9 ms against the baseline's 48.7) was within its noise: "healthy". The 8 steps before it ran 55.9 ms
    against 42.6 before the baseline's: slower than the baseline, no culprit found, never "healthy"; with
    those steps as fast as the baseline's, healthy as before."""
    (_, base, _), (meta, drift, _) = (summary.decode_capture(p.read_bytes()) for p in sorted(
        (DATA.parent / "faultbench" / "memory-workers" / "captures").glob("*.msgpack"), key=lambda p: int(p.stem)))
    assert meta["trigger"] == "drift"
    d = diagnose(drift, step=meta["step"], trigger="drift", world_size=4, baseline=base)
    assert d.findings == () and d.step_ms.get("unexplained_ms", 0) > 0, (d.notes, d.step_ms)
    assert any("steps before it" in n and "slower than the baseline" in n for n in d.notes), d.notes
    assert "healthy" not in format_capture(d), format_capture(d)
    calm = copy.deepcopy(drift)
    for s, b in zip(calm, base, strict=True):   # every step before the window at the baseline's recent mean
        recent = b["history"]["ms"][-8:]
        s["history"]["ms"] = [sum(recent) / len(recent)] * len(s["history"]["ms"])
    d = diagnose(calm, step=meta["step"], trigger="drift", world_size=4, baseline=base)
    assert d.findings == () and "unexplained_ms" not in d.step_ms, (d.notes, d.step_ms)


def test_a_persons_capture_of_slow_steps_the_job_did_not_have_before_is_a_passing_slowdown(tmp_path: Path) -> None:
    """A capture a person asked for can land on three steps another process slowed: a healthy CI job's
    manual window of three 35 ms steps among 19-27 ms ones read "COMMUNICATION ... +8.3 ms/step". The
    fault bench's everyone-slower window (every rank's steps 3x the baseline's, real summaries) taken as
    a person's capture: with its real step history (slow before the window too) it is the regression;
    with the steps before the window as fast as the baseline's it is no finding, and the capture's line
    says its window alone was slower (neither "healthy" nor the unexplained slowdown a detector's
    capture with no culprit is)."""
    caps = [summary.decode_capture(p.read_bytes()) for p in sorted(
        (DATA.parent / "faultbench" / "everyone-slower" / "captures").glob("*.msgpack"), key=lambda p: int(p.stem))]
    (_, base, _), (meta, spike, _) = caps
    persistent = diagnose(spike, step=meta["step"], trigger="manual", world_size=4, baseline=base)
    assert [(f.category, f.rank) for f in persistent.findings] == [("regression", None)], persistent.notes
    passing = copy.deepcopy(spike)
    for s, b in zip(passing, base, strict=True):
        healthy = b["history"]["ms"]
        s["history"]["ms"] = [healthy[i % len(healthy)] for i in range(len(s["history"]["ms"]))]
    d = diagnose(passing, step=meta["step"], trigger="manual", world_size=4, baseline=base)
    assert d.findings == () and any("passing slowdown" in n for n in d.notes), ([f.title for f in d.findings], d.notes)
    line = format_capture(d)
    assert "a passing slowdown, no finding" in line and "healthy" not in line and "slower, no culprit" not in line, line
    report.write_job(tmp_path, diagnoses=[d], world_size=4, steps=120)
    page = (tmp_path / "report.html").read_text()
    # the job has no finding; the capture's own section says what its window was instead
    assert "A passing slowdown, no finding: median step" in page and page.count("No findings: ranks behaved") == 1
    # a detector's capture follows slow steps by construction: the same summaries opened by a spike keep it
    spiked = diagnose(passing, step=meta["step"], trigger="spike", world_size=4, baseline=base)
    assert [(f.category, f.rank) for f in spiked.findings] == [("regression", None)], spiked.notes


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("stages", [1, 4])
def test_healthy_jitter_gives_no_findings(tmp_path: Path, seed: int, stages: int) -> None:
    synth.generate(tmp_path, ranks=64, fault="none", seed=seed, stages=stages, jitter=0.10)
    d = run(tmp_path)
    assert d.healthy, [f.title for f in d.findings]
    caps = load_dir(tmp_path)
    assert diagnose(caps["baseline"][1], step=100, trigger="baseline", world_size=64).healthy


def test_healthy_large_job(tmp_path: Path) -> None:
    synth.generate(tmp_path, ranks=1024, fault="none", seed=7, functions=120)
    assert run(tmp_path).healthy


def test_healthy_handmade_jitter() -> None:
    """±10% uniform jitter on every phase of realistic summaries (not synth) stays quiet."""
    base = json.loads((DATA / "summary_gpu_rank0.json").read_text())
    rng = random.Random(3)
    for _ in range(5):
        sums = []
        for r in range(32):
            s = copy.deepcopy(base)
            s["rank"], s["host"] = r, f"gpu-a{r // 8:02d}"
            for p in ("data", "forward", "backward", "optimizer", "host_gap", "comm"):
                s["phases"][p] *= rng.uniform(0.9, 1.1)
            for fn in s["functions"]:
                fn["ms"] *= rng.uniform(0.9, 1.1)
            sums.append(s)
        assert diagnose(sums, step=1, trigger="slow_step", world_size=32).healthy


def test_stages_are_never_mixed(tmp_path: Path) -> None:
    synth.generate(tmp_path, ranks=64, fault="compute", culprit=50, stages=4)
    caps = load_dir(tmp_path)
    good = caps["slow_step"][1]
    stage_of = {s["rank"]: s["rank"] // 16 for s in good}
    stripped = copy.deepcopy(good)
    for s in stripped:
        s["groups"] = []
    for summaries, topo, source in ((good, None, "groups"), (good, "pp=4,dp=*", "topology"),
                                    (stripped, None, "signature")):
        table = build_table(summaries)
        peers = form_peers(table, topology=topo, world_size=64)
        assert peers.source == source
        assert len(peers.groups) == 4
        for rows in peers.groups:
            assert len({stage_of[int(r)] for r in table.rank[rows]}) == 1
        d = diagnose(summaries, step=500, trigger="slow_step", world_size=64, topology=topo)
        assert [(f.rank, f.category) for f in d.findings] == [(50, "compute")]


def test_topology_row_major_last_dim_fastest() -> None:
    assert parse_topology("pp=2,tp=2,dp=*", 8) == [("pp", 2), ("tp", 2), ("dp", 2)]
    base = json.loads((DATA / "summary_gpu_rank0.json").read_text())
    sums = []
    for r in range(8):
        s = copy.deepcopy(base)
        s["rank"] = r
        sums.append(s)
    peers = form_peers(build_table(sums), topology="pp=2,tp=2,dp=*", world_size=8)
    assert sorted(sorted(g.tolist()) for g in peers.groups) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    peers = form_peers(build_table(sums), topology="tp=2,pp=2,dp=2", world_size=8)
    assert sorted(sorted(g.tolist()) for g in peers.groups) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    with pytest.raises(ValueError):
        parse_topology("pp=3,dp=*", 8)
    d = diagnose(sums, step=1, trigger="x", world_size=8, topology="pp=3,dp=*")
    assert any("topology ignored" in n for n in d.notes)


def test_corrupt_and_foreign_summaries_rejected_rest_analysed(tmp_path: Path) -> None:
    synth.generate(tmp_path, ranks=16, fault="compute", culprit=9)
    path = tmp_path / "captures" / "500.msgpack"
    doc = msgpack.unpackb(path.read_bytes(), raw=False)
    blobs = list(doc["summaries"])
    blobs[3] = b"\xc1garbage"
    foreign = summary.decode(blobs[4], origin="x")
    foreign["schema"] = "other.tool/9"
    blobs[4] = msgpack.packb(foreign)
    liar = summary.decode(blobs[5], origin="x")
    liar["rank"] = 6
    blobs[5] = msgpack.packb(liar)
    path.write_bytes(summary.encode_capture(step=500, trigger="slow_step", world_size=16,
                                            ranks=doc["ranks"], summaries=blobs, missing=[]))
    d = run(tmp_path)
    assert d.ranks_analysed == 13
    assert len(d.errors) == 3
    assert any("rank 3" in e for e in d.errors) and any("rank 4" in e and "schema" in e for e in d.errors)
    assert any("rank 5" in e and "claims" in e for e in d.errors)
    assert [(f.rank, f.category) for f in d.findings] == [(9, "compute")]


def test_duplicate_rank_is_reported() -> None:
    base = json.loads((DATA / "summary_gpu_rank0.json").read_text())
    sums = [copy.deepcopy(base) for _ in range(3)]
    sums[1]["rank"] = 1
    d = diagnose(sums, step=1, trigger="x", world_size=3)
    assert d.ranks_analysed == 2 and any("duplicate" in e for e in d.errors)


def _gpu_job(n: int = 8) -> list[dict]:
    base = json.loads((DATA / "summary_gpu_rank0.json").read_text())
    sums = []
    for r in range(n):
        s = copy.deepcopy(base)
        s["rank"], s["host"] = r, f"gpu-a{r // 4:02d}"
        sums.append(s)
    return sums


def _make_slow(s: dict, phase: str, extra: float, fn: str | None = None) -> None:
    s["phases"][phase] += extra
    s["phases"]["comm"] = max(s["phases"]["comm"] - extra, 1.0)
    if fn:
        for f in s["functions"]:
            if f["name"] == fn:
                f["ms"] += extra


def _victimize(sums: list[dict], culprit: int, extra: float) -> None:
    for s in sums:
        if s["rank"] != culprit:
            s["phases"]["comm"] += extra


def test_gpu_throttling_is_named() -> None:
    sums = _gpu_job()
    _make_slow(sums[6], "backward", 40.0, "aten::mm")
    _victimize(sums, 6, 40.0)
    gpu = sums[6]["telemetry"]["end"]["gpu"]
    gpu["sm_mhz"], gpu["throttle"] = 1100, ["hw_thermal_slowdown", "sw_power_cap"]
    d = diagnose(sums, step=1, trigger="slow_step", world_size=8)
    assert len(d.findings) == 1
    f = d.findings[0]
    assert (f.rank, f.host, f.category, f.function) == (6, "gpu-a01", "compute", "aten::mm")
    assert f.evidence["hardware_throttle"] == ["hw_thermal_slowdown", "sw_power_cap"]
    assert "throttling" in f.action and sorted(f.victims) == [0, 1, 2, 3, 4, 5, 7]


def test_memory_category_from_allocator_function() -> None:
    sums = _gpu_job()
    for s in sums:
        s["functions"].insert(0, {"name": "cudaMalloc", "kind": "cpu_op", "phase": "forward", "count": 1.0,
                                  "ms": 0.1, "mean": 0.1, "p50": 0.1, "p90": 0.1, "p99": 0.1, "max": 0.1,
                                  "std": 0.0})
    _make_slow(sums[2], "forward", 30.0, "cudaMalloc")
    _victimize(sums, 2, 30.0)
    f = diagnose(sums, step=1, trigger="slow_step", world_size=8).findings[0]
    assert (f.rank, f.category, f.function) == (2, "memory", "cudaMalloc")


def test_submillisecond_noise_is_ignored() -> None:
    sums = _gpu_job()
    for s in sums:
        for p in s["phases"]:
            s["phases"][p] *= 0.01      # a 1 ms step
    _make_slow(sums[1], "forward", 0.4)
    assert diagnose(sums, step=1, trigger="slow_step", world_size=8).healthy


def test_host_wide_slowness_is_one_host_finding() -> None:
    sums = _gpu_job(16)
    for r in range(4, 8):               # every rank of gpu-a01
        _make_slow(sums[r], "forward", 35.0 + r, "aten::addmm")
    for s in sums:                      # the other hosts' ranks wait for them
        if s["host"] != "gpu-a01":
            s["phases"]["comm"] += 40.0
    d = diagnose(sums, step=1, trigger="slow_step", world_size=16)
    assert len(d.findings) == 1
    f = d.findings[0]
    assert f.host == "gpu-a01" and f.evidence["ranks"] == [4, 5, 6, 7] and f.rank == 7


def test_extra_own_work_nobody_waited_on_is_no_finding() -> None:
    """One rank's backward +30 ms, but no peer's wait grew: the work overlapped the step's waits
    (or was preemption noise) and cost the job nothing. A healthy 4-rank CI run once blamed rank 0
    for +6 ms in copy_bucket_to_grad with "0 ranks waiting on it"; a real straggler has victims."""
    sums = _gpu_job(8)
    sums[3]["phases"]["backward"] += 30.0
    d = diagnose(sums, step=1, trigger="slow_step", world_size=8)
    assert list(d.findings) == [], [f.title for f in d.findings]
    assert any("no rank waited on" in n and "rank 3" in n for n in d.notes), d.notes
    _victimize(sums, 3, 30.0)           # the same work, now the others wait for it: a culprit
    d = diagnose(sums, step=1, trigger="slow_step", world_size=8)
    assert [(f.rank, f.victims) for f in d.findings] == [(3, (0, 1, 2, 4, 5, 6, 7))]


def test_local_comm_excess_without_baseline() -> None:
    sums = _gpu_job(16)
    for r in range(8, 12):
        sums[r]["phases"]["comm"] += 40.0
    probe = {"hosts": {"gpu-a00": {"latency_us": 20}, "gpu-a01": {"latency_us": 22},
                       "gpu-a02": {"latency_us": 400}, "gpu-a03": {"latency_us": 21}}}
    d = diagnose(sums, step=1, trigger="slow_step", world_size=16, link_probe=probe)
    assert [(f.category, f.rank, f.host) for f in d.findings] == [("communication", None, "gpu-a02")]
    d = diagnose(sums, step=1, trigger="slow_step", world_size=16)
    assert d.findings[0].host == "gpu-a02" and d.findings[0].evidence["ranks"] == [8, 9, 10, 11]


def test_lone_comm_wait_in_a_small_group_must_be_a_quarter_of_the_step() -> None:
    """One rank per host, 4 hosts (the CI link test's healthy run): three ranks agreeing closely make a
    tiny MAD, so a +17% wait on one rank once passed the 10% bar as a network finding. Small groups
    use the culprit rule's larger share (baseline.group_bars); a real +40% wait is still named."""
    sums = _gpu_job(4)
    for s in sums:
        s["host"] = f"h{s['rank']}"
    sums[1]["phases"]["comm"] += 17.0
    d = diagnose(sums, step=28, trigger="baseline", world_size=4)
    assert d.healthy, [f.title for f in d.findings]
    sums[1]["phases"]["comm"] += 23.0
    d = diagnose(sums, step=28, trigger="baseline", world_size=4)
    assert [(f.category, f.host) for f in d.findings] == [("communication", "h1")]


def test_hang_names_missing_rank() -> None:
    sums = _gpu_job(8)[:7]
    d = diagnose(sums, step=9, trigger="hang", world_size=8, missing=[7])
    assert [(f.category, f.rank) for f in d.findings] == [("hang", 7)]
    assert diagnose(sums, step=9, trigger="slow_step", world_size=8, missing=[7]).healthy


def test_no_summaries() -> None:
    d = diagnose([], step=3, trigger="slow_step", world_size=4, errors=["summary from rank 0: bad"])
    assert d.ranks_analysed == 0 and d.errors == ("summary from rank 0: bad",) and not d.findings


def test_consolidate_merges_and_sorts(tmp_path: Path) -> None:
    synth.generate(tmp_path, ranks=16, fault="dataloader", culprit=4)
    caps = load_dir(tmp_path)
    d1 = diagnose(caps["slow_step"][1], step=500, trigger="slow_step", world_size=16)
    d2 = diagnose(caps["slow_step"][1], step=700, trigger="slow_step", world_size=16)
    sums = _gpu_job(8)
    _make_slow(sums[1], "gc", 5.0)
    _victimize(sums, 1, 5.0)
    assert diagnose(sums, step=900, trigger="slow_step", world_size=8).healthy   # 5% of the step
    d3 = diagnose(sums, step=900, trigger="slow_step", world_size=8,
                  thresholds=Thresholds(rel_step=0.02, z=2.5))
    merged = consolidate([d1, d2, d3])
    assert [(f.rank, f.category) for f in merged] == [(4, "dataloader"), (1, "gc")]
    assert merged[0].captures == (500, 700)
    assert json.loads(json.dumps(merged[0].to_json()))["victims"]


def test_diagnosis_json_roundtrip(tmp_path: Path) -> None:
    synth.generate(tmp_path, ranks=8, fault="gc", culprit=2)
    d = run(tmp_path)
    doc = json.loads(json.dumps(d.to_json(), allow_nan=False))
    assert doc["findings"][0]["rank"] == 2 and doc["schema"] == "eroica.diagnosis/1"
    from eroica_runtime.engine import Diagnosis
    assert Diagnosis.from_json(doc).findings[0].category == "gc"


def test_table_matches_codec_own_work(tmp_path: Path) -> None:
    synth.generate(tmp_path, ranks=8, fault="none")
    good = load_dir(tmp_path)["slow_step"][1]
    table = build_table(reversed(good))          # any order, any iterable
    assert table.rank.tolist() == list(range(8))
    expected = [summary.own_work_ms(s) for s in sorted(good, key=lambda s: s["rank"])]
    assert np.allclose(table.own, expected)


def test_engine_is_pure() -> None:
    code = ("import sys, eroica_runtime.engine, eroica_runtime.report, eroica_runtime.synth; "
            "bad = [m for m in ('torch', 'mpi4py') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


REAL = DATA / "real-4rank"


@pytest.mark.parametrize("scenario", ["none", "compute", "direct", "data0", "data2", "gc"])
def test_real_gloo_summaries(scenario: str) -> None:
    """Summaries built by summary.build from real 4-rank gloo DDP runs (tests/data/engine/real-4rank)."""
    expected = json.loads((REAL / "expected.json").read_text())[scenario]
    docs = [summary.decode((REAL / f"{scenario}.rank{r}.msgpack").read_bytes(), origin=f"rank {r}")
            for r in range(4)]
    d = diagnose(docs, step=1, trigger="slow_step", world_size=4)
    if expected is None:
        assert d.healthy, [f.title for f in d.findings]
        return
    cat = {"compute": "compute", "direct": "compute", "data0": "dataloader", "data2": "dataloader",
           "gc": "gc"}[scenario]
    assert [(f.rank, f.category) for f in d.findings] == [(expected, cat)]
    f = d.findings[0]
    assert sorted(f.victims) == sorted(set(range(4)) - {expected})
    if cat == "compute":
        assert f.function in ("aten::matmul", "aten::mm")
        # the planted matmuls are extra calls: this rank does more work, which no node drain fixes
        rank_calls, peers_calls = f.evidence["calls"]
        assert f.evidence["work"] == "more" and rank_calls >= peers_calls + 30, f.evidence
        assert "more work" in f.action and "drain" not in f.action, f.action
        grew = next(line for line in format_finding(f) if "grew most:" in line)
        assert f"{rank_calls:.0f} vs {peers_calls:.0f} calls" in grew, grew
    if cat == "dataloader":
        assert "DataLoader" in (f.function or "")


def test_non_finite_phase_rejects_only_that_rank() -> None:
    sums = _gpu_job(8)
    sums[3]["phases"]["forward"] = float("nan")
    sums[4]["functions"][0]["ms"] = float("inf")
    _make_slow(sums[6], "backward", 40.0, "aten::mm")
    _victimize(sums, 6, 40.0)
    d = diagnose(sums, step=1, trigger="slow_step", world_size=8)
    assert d.ranks_analysed == 7 and any("rank 3" in e and "forward" in e for e in d.errors)
    assert [(f.rank, f.function) for f in d.findings] == [(6, "aten::mm")]
    json.dumps(d.to_json(), allow_nan=False)


@pytest.mark.parametrize("name,rank,category", [("e2e-compute", 2, "compute"), ("e2e-gc", 1, "gc"),
                                                ("e2e-data", 1, "dataloader")])
def test_real_eroica_run_captures(name: str, rank: int, category: str) -> None:
    """Captures written by a real eroica-run (4 ranks): the spike capture names the planted rank and
    nothing else (no spurious communication finding from the baseline comparison)."""
    caps = []
    for path in sorted((DATA / name / "captures").glob("*.msgpack"), key=lambda p: int(p.stem)):
        meta, good, errors = summary.decode_capture(path.read_bytes())
        assert not errors
        caps.append((meta, good))
    (base_meta, base), (meta, spike) = caps[0], caps[1]
    assert base_meta["trigger"] == "baseline"
    assert diagnose(base, step=12, trigger="baseline", world_size=4).healthy
    d = diagnose(spike, step=meta["step"], trigger=meta["trigger"], world_size=4, baseline=base)
    assert [(f.rank, f.category) for f in d.findings] == [(rank, category)]


@pytest.mark.parametrize("report", [DATA / "e2e-data", DATA / "e2e-gc", DATA.parent / "faultbench" / "compute-report"])
def test_step_if_fixed_is_not_far_below_the_healthy_step(report: Path) -> None:
    """Real 4-rank captures on 2 shared cores: while the culprit stalls, its peers get the CPU and run
    faster than when healthy, so "step - own-work excess" said 12 ms if fixed for a job whose healthy
    step was 63 ms. The cost is at most what the victims waited for the culprit, and the step if fixed
    at least the peers' own work plus the collective's own time."""
    from eroica_runtime.pipeline import Pipeline

    pipe = Pipeline()
    done = [pipe.analyse(p.read_bytes(), origin=p.name)
            for p in sorted((report / "captures").glob("*.msgpack"), key=lambda p: int(p.stem))]
    healthy = done[0].diagnosis.step_ms["median"]
    assert done[0].meta["trigger"] == "baseline" and done[0].diagnosis.healthy
    top = done[1].diagnosis.findings[0]
    assert top.rank == 1 and top.what_if_step_ms >= 0.6 * healthy, (top.what_if_step_ms, healthy)
    excess, waited = top.evidence["excess_ms"], top.evidence["victims_waited_ms"]
    assert top.impact_ms_per_step == min(excess, waited) and waited >= 0.5 * excess


def test_function_in_two_phases_is_named_in_the_phase_it_grew() -> None:
    """Real summaries list ``aten::mm`` twice, in the forward and in the backward. In the e2e-compute
    capture rank 2's extra matmuls ran in the forward; its backward matmuls were as its peers'. The
    finding must show the forward growth as forward, not fold both into one ``aten::mm`` row with
    whichever phase was listed first (which said "backward, 8.6 vs 0.7 ms")."""
    caps = sorted((DATA / "e2e-compute" / "captures").glob("*.msgpack"), key=lambda p: int(p.stem))
    meta, spike, _ = summary.decode_capture(caps[1].read_bytes())
    _, base, _ = summary.decode_capture(caps[0].read_bytes())
    table = build_table(spike)
    fwd, bwd = table.fn("aten::mm", "forward"), table.fn("aten::mm", "backward")
    assert fwd is not None and bwd is not None and fwd != bwd
    d = diagnose(spike, step=meta["step"], trigger=meta["trigger"], world_size=4, baseline=base)
    (finding,) = d.findings
    grown = {(f["name"], f["phase"]): f for f in finding.evidence["functions"]}
    assert ("aten::mm", "forward") in grown and ("aten::mm", "backward") not in grown
    mm = grown[("aten::mm", "forward")]
    assert mm["rank_ms"] > 5.0 and mm["peers_ms"] < 1.0
    assert finding.phase == "forward"


def test_all_ranks_starved_of_cpu_is_host_contention_not_network() -> None:
    """Every rank waits longer than in the baseline and is descheduled far more: CPU contention."""
    import copy

    from eroica_runtime import summary as summary_mod
    from eroica_runtime.engine import build_table

    here = Path(__file__).parent / "data" / "engine" / "real-4rank"
    base = [summary_mod.decode((here / f"none.rank{r}.msgpack").read_bytes()) for r in range(4)]
    cur = copy.deepcopy(base)
    for s in cur:  # +60 ms: well above these real windows' own step noise (std error ~15 ms)
        s["phases"]["comm"] += 60.0
        s["phases"]["step"] += 60.0
        t0, t1 = s["telemetry"]["start"]["host"], s["telemetry"]["end"]["host"]
        t1["ctx_invol"] = t0["ctx_invol"] + 20 * max(1, t1["ctx_invol"] - t0["ctx_invol"]) + 200
    d = diagnose(cur, step=90, trigger="drift", world_size=4, baseline=build_table(base))
    assert [f.category for f in d.findings] == ["host"], [f.title for f in d.findings]
    assert "cpu contention" in d.findings[0].function
    # the same waits without the context switches stay a communication finding
    for s, b in zip(cur, base, strict=True):
        s["telemetry"] = copy.deepcopy(b["telemetry"])
    d = diagnose(cur, step=90, trigger="drift", world_size=4, baseline=build_table(base))
    assert [f.category for f in d.findings] == ["communication"]


def test_job_wide_growth_within_the_windows_noise_is_no_finding() -> None:
    """A healthy job's capture 20 ms slower than its baseline, where the two 3-step windows' means
    wobble by ~15 ms (std error) each: chance, not a regression or a slow network (a healthy 4-rank
    CI run once got "Communication wait +4.9 ms/step" from such a pair)."""
    import copy

    from eroica_runtime import summary as summary_mod
    from eroica_runtime.engine import build_table

    here = Path(__file__).parent / "data" / "engine" / "real-4rank"
    base = [summary_mod.decode((here / f"none.rank{r}.msgpack").read_bytes()) for r in range(4)]
    cur = copy.deepcopy(base)
    for s in cur:
        s["phases"]["comm"] += 20.0
        s["phases"]["step"] += 20.0
    d = diagnose(cur, step=90, trigger="drift", world_size=4, baseline=build_table(base))
    assert list(d.findings) == [], [f.title for f in d.findings]


def test_host_stall_with_the_rank_reading_storage_is_io() -> None:
    """A plain read() is no profiled op: the stall shows as host time, the telemetry shows the reads."""
    import copy

    from eroica_runtime import summary as summary_mod

    here = Path(__file__).parent / "data" / "engine" / "real-4rank"
    cur = [summary_mod.decode((here / f"none.rank{r}.msgpack").read_bytes()) for r in range(4)]
    cur = copy.deepcopy(cur)
    for s in cur:
        for point in ("start", "end"):
            s["telemetry"][point]["host"]["io_read_bytes"] = 0
            s["telemetry"][point]["host"]["io_write_bytes"] = 0
    slow = cur[1]
    slow["phases"]["host_gap"] += 60.0
    slow["phases"]["step"] += 5.0
    for s in cur:
        if s is not slow:
            s["phases"]["comm"] += 55.0
            s["phases"]["step"] += 5.0
    slow["telemetry"]["end"]["host"]["io_read_bytes"] = 8 << 20
    d = diagnose(cur, step=60, trigger="spike", world_size=4)
    assert [(f.category, f.rank) for f in d.findings] == [("io", 1)], [f.title for f in d.findings]
    slow["telemetry"]["end"]["host"]["io_read_bytes"] = 0
    d = diagnose(cur, step=60, trigger="spike", world_size=4)
    assert [(f.category, f.rank) for f in d.findings] == [("host", 1)]


def test_job_wide_comm_wait_on_one_host_names_the_host_not_the_network() -> None:
    """A real single-host job whose cores were shared with other work (tests/data/engine/
    one-host-comm-wait): every rank's collective wait grew alike and nobody is late. The finding names
    the host and an action for what carries collectives there (shared memory/loopback, NVLink/PCIe,
    the host's CPUs), never NICs and switch ports; the rank-0 log prints that action."""
    from eroica_runtime import report
    from eroica_runtime.pipeline import Pipeline

    caps = Path(__file__).parent / "data" / "engine" / "one-host-comm-wait" / "captures"
    pipe = Pipeline(world_size=4)
    pipe.analyse((caps / "13.msgpack").read_bytes(), origin="baseline")
    diag = pipe.analyse((caps / "65.msgpack").read_bytes(), origin="spike").diagnosis
    (top,) = diag.findings
    assert (top.category, top.rank, top.host) == ("communication", None, "vm"), top.title
    assert top.evidence["one_host"] is True and top.evidence["hosts"] == ["vm"]
    assert "switch port" not in top.action and "no NIC or switch is involved" in top.action
    assert "nvidia-smi topo -m" in top.action and "cgroup" in top.action
    assert "only host" in top.title and "could be singled out" not in top.title
    text = report.format_capture(diag)
    assert top.action in text and "switch ports" not in text, text   # printed whole, not clipped
    assert "hosts: vm (the job's only host)" in text, text


def test_a_function_only_some_ranks_list_does_not_split_a_ddp_job() -> None:
    """A real contend-int capture (tests/data/engine/contend-int-listed-by-two): a trivial op that a
    preemption landed in is listed by two ranks and folded into `<other>` by the other two. The four
    DDP ranks stay one peer group, so the contended rank is named from the steps before the window;
    a pipeline stage's own functions still separate stages (test_stages_are_never_mixed)."""
    from eroica_runtime.pipeline import Pipeline

    caps = DATA / "contend-int-listed-by-two" / "captures"
    _, sums, _ = summary.decode_capture((caps / "97.msgpack").read_bytes())
    table = build_table(sums)
    col = next(j for j, (n, ph) in enumerate(zip(table.fn_names, table.fn_phase, strict=True))
               if (n, ph) == ("aten::add", "forward"))
    assert (table.fn_count[:, col] > 0).tolist() == [True, True, False, False]   # what split it
    assert [sorted(g.tolist()) for g in form_peers(table).groups] == [[0, 1, 2, 3]]
    pipe = Pipeline(world_size=4)
    pipe.analyse((caps / "13.msgpack").read_bytes(), origin="baseline")
    diag = pipe.analyse((caps / "97.msgpack").read_bytes(), origin="spike").diagnosis
    assert [(f.category, f.rank) for f in diag.findings] == [("host", 1)], [f.title for f in diag.findings]
    assert diag.findings[0].evidence.get("cpu_starved") is True


def test_a_lone_comm_wait_is_no_network_finding_when_the_probe_measured_every_link_healthy() -> None:
    """CI's healthy link-test job (tests/test_linkprobe.py, 4 fake hosts): in the baseline window rank 3
    waited ~19 ms a step longer in collectives than its peers (it arrived first: its three steps ran
    69-85 ms against 37-100), over the small-group bar, and the engine named its host. The link probe,
    run as the window opened, read every link healthy (h3's the fastest), so it is a note now; without
    a probe, the wait still localises a finding (nothing else measured the links)."""
    import copy

    from eroica_runtime.pipeline import Pipeline

    data = (DATA / "healthy-4hosts-probe-clean.msgpack").read_bytes()
    meta, sums, _ = summary.decode_capture(data)
    probe = meta["extra"]["link_probe"]
    assert max(probe, key=lambda h: probe[h]["bandwidth_gbps"]).endswith("-h3")
    diag = Pipeline(world_size=4).analyse(data, origin="baseline").diagnosis
    assert diag.healthy, [f.title for f in diag.findings]
    assert any("link probe singled out no host" in n for n in diag.notes), diag.notes
    d = diagnose(copy.deepcopy(sums), step=meta["step"], trigger=meta["trigger"], world_size=4)
    assert [(f.category, f.host) for f in d.findings] == [("communication", sums[3]["host"])]


def test_a_lone_comm_wait_is_no_network_finding_when_the_probe_names_another_host() -> None:
    """The fault bench's link case, its baseline capture before the fault (run at 9e2422b): rank 3
    (host h3) waited ~20 ms a step longer than its peers, and the probe's one outlier was h2 (87 us
    latency against 28), where none of the waiting ranks runs; the engine named h2. The two disagree:
    a note, no finding."""
    from eroica_runtime.pipeline import Pipeline

    data = (DATA / "healthy-4hosts-probe-elsewhere.msgpack").read_bytes()
    meta, sums, _ = summary.decode_capture(data)
    probe = meta["extra"]["link_probe"]
    assert max(probe, key=lambda h: probe[h]["latency_us"]).endswith("-h2") and sums[3]["host"].endswith("-h3")
    diag = Pipeline(world_size=4).analyse(data, origin="baseline").diagnosis
    assert diag.healthy, [f.title for f in diag.findings]
    assert any("where none of them runs" in n for n in diag.notes), diag.notes


PIPELINE4 = DATA / "pipeline-4-stages"


def _pipeline4() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A real 4-stage pipeline job, one rank a stage (the fault bench's pp4-compute: rank 1, the second
    stage, 150 ms of extra matmuls a step from step 50): its baseline capture (step 13) and the spike
    capture at step 57."""
    _, base, _ = summary.decode_capture((PIPELINE4 / "13.msgpack").read_bytes())
    _, now, _ = summary.decode_capture((PIPELINE4 / "57.msgpack").read_bytes())
    return base, now


def test_a_rank_without_peers_is_named_against_its_own_baseline_and_its_waiting_stages_are_victims() -> None:
    base, now = _pipeline4()
    dg = diagnose(now, step=57, trigger="spike", world_size=4, baseline=base)
    assert "4 rank(s) have no peers to compare with: each is compared with itself in the baseline capture " \
        "(step 13)" in dg.notes
    top = dg.findings[0]
    assert (top.rank, top.category, top.function) == (1, "compute", "aten::matmul"), top.title
    assert set(top.victims) == {0, 2, 3}
    assert top.evidence["compared_with"] == "its own baseline capture (step 13)"
    assert top.evidence["own_work_ms"][0] - top.evidence["own_work_ms"][1] > 100.0
    assert "vs its baseline capture at step 13" in top.title
    grown = top.evidence["functions"][0]
    assert grown["name"] == "aten::matmul" and grown["now_calls"] > grown["baseline_calls"]   # more calls: more work
    assert top.evidence["work"] == "more" and "in its baseline capture" in top.action   # not "drain the node"
    lines = format_finding(top)
    assert "own work" in lines[1] and "vs baseline" in lines[1] and "peers" not in lines[1], lines
    grew = next(line for line in lines if "grew most:" in line)
    assert "aten::matmul" in grew and "vs baseline" in grew and "calls" in grew, grew
    # without a baseline there is nothing to compare a peerless rank with: no culprit, as before, and the
    # log says why
    alone = diagnose(now, step=57, trigger="spike", world_size=4)
    assert not [f for f in alone.findings if f.rank is not None]
    assert any("no baseline capture to compare them with themselves" in n for n in alone.notes), alone.notes


def test_peerless_ranks_all_slower_alike_name_no_culprit() -> None:
    """Every stage 150 ms slower than its baseline, nobody waiting longer: a job-wide slowdown (the
    baseline capture's own ranks, each forward grown alike), not a straggler."""
    base, _ = _pipeline4()
    slower = copy.deepcopy(base)
    for s in slower:
        s["phases"]["forward"] += 150.0
        s["phases"]["step"] += 150.0
        for row in s["steps"]:
            row["ms"] += 150.0
    dg = diagnose(slower, step=57, trigger="spike", world_size=4, baseline=base)
    assert not [f for f in dg.findings if f.rank is not None], [f.title for f in dg.findings]


def test_a_title_names_the_op_and_says_no_placeholder_for_one() -> None:
    from eroica_runtime.engine.model import in_function

    assert in_function("aten::matmul") == " in aten::matmul"
    assert in_function("(host_gap)") == " between profiled ops"       # was "io in (host_gap)"
    assert in_function("(gc)") == "" and in_function(None) == ""              # was "gc in (gc)"
    assert in_function("(CPU quota)") == " in (CPU quota)"              # a named cause stays


def test_a_rank_running_python_of_its_own_is_told_which_function_from_its_sampled_frames() -> None:
    """The same job with the window's frame sampler (tests/data/engine/python-sampled, a real run): rank
    0's summary books 32% of its sampled time to pylog.py:18 smooth, its peers' none. Through the
    pipeline (as rank 0's analyst and eroica analyze run it) the finding names the function, in its
    title and its action, instead of sending the reader to py-spy."""
    from eroica_runtime.pipeline import Pipeline

    pipe = Pipeline(world_size=3)
    for step in (13, 68):
        got = pipe.analyse((DATA / "python-sampled" / f"{step}.msgpack").read_bytes(), origin=f"{step}.msgpack")
    (f,) = got.diagnosis.findings
    assert (f.category, f.rank, f.phase) == ("host", 0, "host_gap"), f.title
    assert f.evidence["python_frame"].endswith("pylog.py:18 smooth"), f.evidence
    share, peers = f.evidence["python_share"]
    assert share >= 0.2 and peers == 0.0, f.evidence
    assert "Python in smooth (pylog.py:18)" in f.title, f.title
    assert "of its time in smooth (" in f.action and "py-spy" not in f.action, f.action
    assert sorted(got.summaries) == [0], "the drill-down keeps the named rank's summary only"


def test_where_a_culprits_python_was_needs_its_peers_samples_to_compare_with() -> None:
    """Without the peers' summaries (a capture of node blocks forwards the deviant ranks' only) the
    culprit's own samples say nothing: its training loop's line is in every rank's. Left as it was."""
    from eroica_runtime.engine import oncpu
    from eroica_runtime.summary import schema as summary_schema

    meta, summaries, errors = summary_schema.decode_capture((DATA / "python-sampled" / "68.msgpack").read_bytes())
    by_rank = {s["rank"]: s for s in summaries}
    d = _capture_pair("python-sampled", 13, 68, 3)
    assert oncpu.with_python_where(d, {0: by_rank[0]}) == d
    named = oncpu.with_python_where(d, by_rank)
    assert named != d and "python_frame" in named.findings[0].evidence
    # a peer running the same function as much is no lead
    same = {r: {**s, "python": by_rank[0]["python"]} for r, s in by_rank.items()}
    assert oncpu.with_python_where(d, same) == d
