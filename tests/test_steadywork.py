"""A rank busier than its peers over the whole job (engine/steadywork.py), from ranks' real job-end
statistics (tests/data/steadywork: a 4-rank DDP job, with and without rank 0 logging metrics every
10 steps from the start, recorded with its command)."""

from __future__ import annotations

import json
from typing import Any

from conftest import DATA

from eroica_runtime import report
from eroica_runtime.analyst import format_job_stats, job_stats
from eroica_runtime.engine import steadywork
from eroica_runtime.report_html import render_html


def _ranks(name: str) -> dict[int, dict[str, Any]]:
    doc = json.loads((DATA / "steadywork" / f"{name}.json").read_text())
    return {int(r): {"rank": int(r), **stats} for r, stats in doc["per_rank"].items()}


def test_a_rank_that_logs_metrics_from_the_first_step_is_named_with_what_it_costs_a_step() -> None:
    """No capture saw it (the baseline's 3 steps held no logging step, and nothing changed for a
    detector to see); over the job's steps rank 0 was busy ~4 ms a step longer than its peers, on a CPU."""
    w = steadywork.steady_work(_ranks("rank0-logs"))
    assert w is not None and (w.rank, w.host, w.ranks) == (0, "vm", 4)
    assert 3.0 < w.excess_ms < 5.5 and w.cpu_ms[0] - w.cpu_ms[1] > 0.8 * w.excess_ms, w
    line = steadywork.format_steady_work(w)
    assert line.startswith("  rank 0 (vm) was busy ") and " ms a step longer than its peers over the job's " in line
    assert "they waited for it: work only it does (metrics or logging" in line, line


def test_ranks_alike_over_the_job_are_no_line() -> None:
    assert steadywork.steady_work(_ranks("healthy")) is None


def test_ranks_that_cannot_be_compared_are_no_line() -> None:
    ranks = _ranks("rank0-logs")
    # a rank that drives a GPU: its thread's times do not show the device's work
    assert steadywork.steady_work({**ranks, 1: {**ranks[1], "own": {**ranks[1]["own"], "cuda": True}}}) is None
    # a rank from an older eroica, or a corrupt one: not every rank compared
    assert steadywork.steady_work({**ranks, 2: {k: v for k, v in ranks[2].items() if k != "own"}}) is None
    assert steadywork.steady_work({**ranks, 2: {**ranks[2], "own": {**ranks[2]["own"], "cpu": float("nan")}}}) is None
    # peers as different from one another as the top from them (a pipeline's stages): no one rank held the rest
    spread = {r: {**s, "own": {**s["own"], "cpu": s["own"]["cpu"] * (1 + 0.4 * r)}} for r, s in ranks.items()}
    assert steadywork.steady_work(spread) is None
    # ranks not in step with one another (no collective between them): nobody waited for anyone
    apart = {**ranks, 3: {**ranks[3], "own": {**ranks[3]["own"], "ms": ranks[3]["own"]["ms"] * 1.5}}}
    assert steadywork.steady_work(apart) is None


def test_the_job_summary_and_the_report_head_say_it_and_read_it_back_from_report_json() -> None:
    stats = json.loads(json.dumps(job_stats(_ranks("rank0-logs"), 4)))
    assert all("own" not in r for r in stats["per_rank"]) and stats["steady_work"]["rank"] == 0
    assert "  rank 0 (vm) was busy " in format_job_stats(stats, [])
    back = steadywork.SteadyWork.from_json(stats["steady_work"])
    assert back is not None and back.to_json() == stats["steady_work"]
    assert steadywork.SteadyWork.from_json({"rank": 0}) is None and steadywork.SteadyWork.from_json("x") is None
    head = report.format_job({"world_size": 4, "steps": 300, "findings": [], "job": stats,
                              "captures": [{"step": 13, "trigger": "baseline", "ranks_analysed": 4}]}).splitlines()[0]
    assert head.startswith("eroica: job report: no findings over 1 capture(s), but rank 0 was busier than its peers "
                           "over the whole job"), head
    assert "healthy" not in head
    page = render_html({"world_size": 4, "steps": 300, "findings": [], "job": stats,
                        "captures": [{"step": 13, "trigger": "baseline", "ranks_analysed": 4}]}, [], None)
    assert "No findings, but rank 0 was busier than its peers over the whole job" in page, page[:2000]
    assert "behaved like their peers" not in page


def test_a_rank_a_finding_names_is_left_to_the_finding() -> None:
    """The demo's compute fault on rank 2 read twice at job end, the finding with its function and
    this line without; the line stays only where no finding names that rank (the same job's captures:
    tests/data/engine/rank0-logs-job, whose capture at 155 names rank 0, its baseline nobody)."""
    from eroica_runtime import summary
    from eroica_runtime.engine import diagnose

    caps = {}
    for p in (DATA / "engine" / "rank0-logs-job" / "captures").glob("*.msgpack"):
        meta, sums, _ = summary.decode_capture(p.read_bytes())
        caps[int(meta["step"])] = diagnose(sums, step=int(meta["step"]), trigger=meta["trigger"], world_size=4)
    stats = job_stats(_ranks("rank0-logs"), 4)
    kept = report.build_report(diagnoses=[caps[13]], world_size=4, steps=300, job=stats)
    assert kept["job"]["steady_work"]["rank"] == 0
    named = report.build_report(diagnoses=[caps[13], caps[155]], world_size=4, steps=300, job=stats)
    assert [f["rank"] for f in named["findings"]] == [0] and "steady_work" not in named["job"]
    assert "was busy" not in format_job_stats(named["job"], [])
