"""The job's longest steps: which rank the others waited for in a one-off stall, doing what, where.

Records are as the step clock keeps them (``StepClock.long_steps``) and ranks send them at job end
(``longsteps.to_send``); their numbers are those of a real run: a 4-rank DDP job with a
``torch.compile``-d model whose rank 2 recompiled at step 200 (its batch shape changed), 848 ms
against a 14.3 ms median, rank 2 on a CPU 0.35 s of it, its peers 0.01 s (2026-12-05).
"""

from __future__ import annotations

import random

import msgpack

from eroica_runtime import jobend
from eroica_runtime.analyst import format_job_stats, job_stats
from eroica_runtime.engine import longsteps
from eroica_runtime.report_html import render_html

RECOMPILE_WHERE = [
    "/tmp/job/train.py:139 main",
    "/tmp/torchinductor_root/tmpa1/ix/cixw.py:70 <module>",
    "/venv/lib/python3.11/site-packages/torch/_inductor/async_compile.py:818 wait",
    "/venv/lib/python3.11/site-packages/torch/_inductor/codecache.py:3852 load_fn",
    "/usr/lib/python3.11/concurrent/futures/_base.py:451 result",
    "/usr/lib/python3.11/threading.py:327 wait",
]


def _rec(step: int, ms: float, cpu: float, data: float = 0.0, gc: float = 0.0, stops: int = 0,
         where: list[str] | None = None) -> dict:
    doc = {"step": step, "ms": ms, "cpu": cpu, "runq": 0.5, "stops": stops, "data": data, "gc": gc, "thr": 0.0}
    return {**doc, "where": where} if where else doc


def _job(records: dict[int, list[dict]], median: float = 14.3) -> dict[int, dict]:
    return {r: {"rank": r, "host": f"node{r // 2}", "steps": 400, "median_ms": median, "p99_ms": 40.0,
                "total_ms": 400 * median, "eroica_ms": 100.0, "long_steps": recs} for r, recs in records.items()}


def _long(per_rank: dict[int, dict], median: float | None, node: int = 2) -> list[longsteps.LongStep]:
    """The path the records take at job end: each rank's map packed, its node leader's reduction
    (nodes of ``node`` ranks), rank 0's merge."""
    nodes: dict[int, dict[int, bytes]] = {}
    for r, doc in per_rank.items():
        nodes.setdefault(r // node, {})[r] = msgpack.packb(doc, use_bin_type=True)
    got = jobend.read({min(blobs): jobend.node_payload(blobs, []) for blobs in nodes.values()})
    assert not got.unreadable and sorted(got.per_rank) == sorted(per_rank)
    return longsteps.long_steps(got.seen, got.per_rank, median)


def test_a_rank_that_recompiled_alone_is_the_one_the_others_waited_for() -> None:
    per_rank = _job({r: [_rec(200, 848.0 - r, 350.0 if r == 2 else 5.0, where=RECOMPILE_WHERE if r == 2 else None),
                         _rec(31, 40.0, 30.0)] for r in range(4)})
    (s,) = _long(per_rank, 14.3)   # step 31 is under the bar (10x the median, 200 ms)
    assert (s.step, s.rank, s.host, s.what, s.ranks_seen) == (200, 2, "node1", "cpu", 4)
    line = longsteps.format_long_step(s)
    assert line.startswith("step 200 took 848 ms (59x the median 14.3 ms): rank 2 on node1 on a CPU 350 ms of it, "
                           "the others 6 ms at most: they waited for it"), line
    # the torch frame that waits and the user's line, not threading.wait or inductor's generated module
    assert "in torch/_inductor/codecache.py:3852 load_fn, from /tmp/job/train.py:139 main" in line, line
    assert "recompilation" in line and "TORCH_LOGS=recompiles" in line, line


# rank 1's stack at step 80 of a 3-rank DDP job compiled with torch.compile(backend="aot_eager"),
# recompiling for a new sequence length (2026-12-07): AOTAutograd tracing the joint graph, no frame
# of dynamo's among the innermost eight
AOT_WHERE = ["/tmp/trial/s62/recompile.py:24 <module>",
             "/venv/lib/python3.11/site-packages/torch/_functorch/_aot_autograd/graph_capture_wrappers.py:497 joint_helper",
             "/venv/lib/python3.11/site-packages/torch/_functorch/_aot_autograd/graph_capture_wrappers.py:489 inner_fn_with_anomaly",
             "/venv/lib/python3.11/site-packages/torch/_functorch/_aot_autograd/graph_capture_wrappers.py:453 inner_fn",
             "/venv/lib/python3.11/site-packages/torch/autograd/__init__.py:540 grad",
             "/venv/lib/python3.11/site-packages/torch/overrides.py:1771 handle_torch_function",
             "/venv/lib/python3.11/site-packages/torch/fx/experimental/proxy_tensor.py:1823 __torch_function__",
             "/venv/lib/python3.11/site-packages/torch/autograd/__init__.py:594 grad",
             "/venv/lib/python3.11/site-packages/torch/autograd/graph.py:979 _engine_run_backward"]


def test_a_recompile_seen_tracing_its_backward_graph_is_said_to_be_one() -> None:
    per_rank = _job({r: [_rec(80, 217.0, 206.0 if r == 1 else 11.0, where=AOT_WHERE if r == 1 else None)]
                     for r in range(3)}, median=14.8)
    (s,) = _long(per_rank, 14.8)
    line = longsteps.format_long_step(s)
    assert s.rank == 1 and "recompilation" in line and "TORCH_LOGS=recompiles" in line, line


def test_what_the_busy_rank_was_waiting_for_or_collecting_is_said() -> None:
    data = _job({0: [_rec(90, 900.0, 3.0)], 1: [_rec(90, 900.0, 20.0, data=700.0)], 2: [_rec(90, 900.0, 4.0)]})
    (s,) = _long(data, 20.0)
    assert (s.rank, s.what) == (1, "data") and "waiting for its next batch 720 ms" in longsteps.format_long_step(s)
    gc = _job({0: [_rec(90, 900.0, 3.0)], 1: [_rec(90, 900.0, 640.0, gc=600.0)], 2: [_rec(90, 900.0, 4.0)]})
    (s,) = _long(gc, 20.0)
    assert (s.rank, s.what) == (1, "gc") and "garbage-collection" in longsteps.format_long_step(s)


def test_a_stall_every_rank_worked_through_or_none_did_names_no_rank() -> None:
    everyone = _job({r: [_rec(50, 2000.0, 1800.0 + r)] for r in range(4)})
    (s,) = _long(everyone, 20.0)
    assert s.rank is None and "every rank was busy" in s.why
    asleep = _job({r: [_rec(50, 2000.0, 5.0)] for r in range(4)})   # a shared filesystem hung for everyone
    (s,) = _long(asleep, 20.0)
    assert s.rank is None and "no rank was busy" in s.why
    stopped = _job({0: [_rec(50, 2000.0, 5.0)], 1: [_rec(50, 2000.0, 5.0, stops=1)]})
    (s,) = _long(stopped, 20.0)
    assert s.rank is None and "rank 1 stopped and continued" in s.why


def test_only_the_longest_few_stalls_are_reported_longest_first() -> None:
    recs = [_rec(step, 300.0 + step, 250.0 + step) for step in (100, 200, 300, 400)]
    per_rank = _job({0: recs, 1: [_rec(r["step"], r["ms"], 1.0) for r in recs]})
    got = _long(per_rank, 20.0)
    assert [s.step for s in got] == [400, 300, 200] and all(s.rank == 0 for s in got)
    assert _long(per_rank, None) == [] and _long({}, 20.0) == []


def test_a_rank_sends_only_stalls_and_its_leader_only_the_stacks_that_can_name_a_rank() -> None:
    """A rank sends its stalls with their stacks; its node leader forwards a count of ranks a place, and
    a stack only of a rank busy through the step or alone at its place (a victim's stack is the
    collective it waited in, the same as its node-mates')."""
    kept = [_rec(200, 848.0, 5.0, where=["a.py:1 f"]), _rec(300, 600.0, 400.0, where=["b.py:2 g"]),
            _rec(31, 40.0, 30.0, where=["c.py:3 h"])]
    sent = longsteps.to_send(kept, 14.3)
    assert [(d["step"], d["where"]) for d in sent] == [(200, ["a.py:1 f"]), (300, ["b.py:2 g"])]
    assert longsteps.to_send(kept, None) == [] and longsteps.to_send([], 14.3) == []
    node = jobend.node_payload({r: msgpack.packb(doc, use_bin_type=True) for r, doc in _job(
        {r: [_rec(200, 848.0, 5.0, where=VICTIM_WHERE), _rec(300, 600.0, 400.0 if r == 0 else 5.0, where=VICTIM_WHERE)]
         for r in range(8)}).items()}, [])
    assert node.count(b"torch/_tensor.py") == 1   # rank 0's stack at step 300, where it was busy alone
    assert node.count(b"_engine_run_backward") == 3   # that stack's and each step's place


# where a DDP rank's main thread waits for its peers' gradients (gloo: the all-reduce is waited out
# inside backward), sampled by eroica_runtime.hang.main_frames_text in a real job
VICTIM_WHERE = ["/job/nfs.py:15 <module>",
                "/venv/lib/python3.11/site-packages/torch/_tensor.py:623 backward",
                "/venv/lib/python3.11/site-packages/torch/autograd/__init__.py:395 backward",
                "/venv/lib/python3.11/site-packages/torch/autograd/graph.py:979 _engine_run_backward"]
AWAY_WHERE = ["/job/nfs.py:18 <module>", "/job/nfs.py:12 write_shard"]


def test_a_rank_off_the_cpu_alone_is_named_by_where_its_stack_was() -> None:
    """A 3-rank DDP job whose rank 1 blocked 1.2 s writing a checkpoint shard (off the CPU) at steps 61
    and 121 (2026-12-07): every rank was busy 3-7 ms of each 1.21 s step, so busy time named no one,
    but ranks 0 and 2 sat in backward's all-reduce and rank 1 in its own code. Whatever the node size,
    rank 1 is named with its stack; with a rank unsampled, or two ranks only, or the others scattered
    over places, no one is."""
    def job(world: int = 3, odd: dict[int, list[str]] | None = None, sampled: bool = True) -> dict[int, dict]:
        odd = {1: AWAY_WHERE} if odd is None else odd
        return _job({r: [_rec(st, 1210.0 + r + (st == 121), 4.0 + r, where=odd.get(r, VICTIM_WHERE) if sampled or r else None)
                         for st in (61, 121)] for r in range(world)}, median=7.5)
    for node in (1, 2, 3):
        got = _long(job(), 7.5, node=node)
        assert [(s.step, s.rank, s.what, s.waiting, s.where) for s in got] == \
            [(121, 1, "away", 2, tuple(AWAY_WHERE)), (61, 1, "away", 2, tuple(AWAY_WHERE))], node
    (line,) = longsteps.format_long_steps(got)
    assert line == ("steps 121, 61 took 1.21 s each (162x the median 7.5 ms): rank 1 on node0 was off the CPU through "
                    "it (busy 6 ms), not where the 2 others waited (torch/autograd/graph.py:979 _engine_run_backward): "
                    "they waited for it; in /job/nfs.py:12 write_shard"), line
    back = longsteps.LongStep.from_json(got[0].to_json())   # report.json keeps what the line needs
    assert (back.what, back.waited_at, back.waiting) == ("away", VICTIM_WHERE[-1], 2)
    assert all(s.rank is None and "no rank was busy" in s.why for s in _long(job(sampled=False), 7.5))
    assert all(s.rank is None for s in _long(job(world=2), 7.5))
    scattered = {1: AWAY_WHERE, 2: ["/job/nfs.py:20 <module>"], 3: ["/job/nfs.py:21 <module>"]}
    assert all(s.rank is None for s in _long(job(world=5, odd=scattered), 7.5, node=1))
    pairs = {1: AWAY_WHERE, 2: AWAY_WHERE}   # two ranks at one place away from two others: no one rank
    assert all(s.rank is None for s in _long(job(world=4, odd=pairs), 7.5))


DDP_WAIT = ["/job/train.py:30 <module>", "/venv/lib/python3.11/site-packages/torch/nn/parallel/distributed.py:835 __init__",
            "/venv/lib/python3.11/site-packages/torch/distributed/utils.py:286 _verify_param_shape_across_processes"]


def test_the_jobs_start_is_said_only_when_one_rank_held_the_others_in_it() -> None:
    """The job's start (step 0) as the step clock keeps it and the watchdog samples it, from a real
    3-rank job (2026-12-07) whose rank 2 slept 12 s reading its shard before building its model while 0
    and 1 waited in DDP's first broadcast: named, with where each was. A start every rank worked through,
    ranks scattered at their own lines, or one elsewhere while the others were not waiting in
    torch.distributed, is no line: ranks importing and building alike are sampled wherever they are."""
    def job(wait: list[str], busy_others: float = 2440.0, odd: list[str] | None = None) -> dict[int, dict]:
        return _job({r: longsteps.to_send([], 9.4, {"step": 0, "ms": 14632.0 - r, "cpu": 2379.0 if r == 2 else busy_others,
                                                     "runq": 0.5, "stops": 0, "data": 0.0, "gc": 0.0, "thr": 0.0,
                                                     "where": (odd or ["/job/slowstart.py:9 <module>"]) if r == 2 else wait})
                     for r in range(3)}, median=9.4)
    (s,) = _long(job(DDP_WAIT), 9.4)
    assert (s.step, s.rank, s.what, s.waiting) == (0, 2, "away", 2), s
    (line,) = longsteps.format_long_steps([s])
    assert line == ("the job's start took 14.63 s to its first step: rank 2 on node1 was off the CPU through it "
                    "(busy 2.38 s), not where the 2 others waited (torch/distributed/utils.py:286 "
                    "_verify_param_shape_across_processes): they waited for it; in /job/slowstart.py:9 <module>"), line
    assert longsteps.held_ms([s]) == s.ms - s.others_ms
    # every rank importing on 2 shared cores for a quarter of it or more (a real run, 2026-12-07: rank 2 busy
    # 3.57 s of a 13.7 s start, the others 3.44 s): busy alike, yet the stacks say who held the start
    shared = _job({r: longsteps.to_send([], 8.2, {"step": 0, "ms": 13717.0 - r, "cpu": 2740.0 if r == 2 else 2600.0,
                                                  "runq": 827.0 if r == 2 else 840.0, "stops": 0, "data": 2.6,
                                                  "gc": 272.0, "thr": 0.0,
                                                  "where": ["/job/slowstart.py:9 <module>"] if r == 2 else DDP_WAIT})
                   for r in range(3)}, median=8.2)
    (s,) = _long(shared, 8.2)
    assert (s.step, s.rank, s.what, s.waiting) == (0, 2, "away", 2), s
    assert _long(job(DDP_WAIT, busy_others=14000.0), 9.4) == []   # every rank busy through its start
    assert _long(job(["/job/model.py:12 build"]), 9.4) == []      # two ranks at one line of their own by chance
    # a rank that prepares the data alone on a CPU while the others wait: named for its busy time
    busy = _job({r: longsteps.to_send([], 9.4, {"step": 0, "ms": 60000.0, "cpu": 57000.0 if r == 0 else 2500.0,
                                                "runq": 0.0, "stops": 0, "data": 0.0, "gc": 0.0, "thr": 0.0})
                 for r in range(4)}, median=9.4)
    (s,) = _long(busy, 9.4)
    assert (s.step, s.rank, s.what) == (0, 0, "cpu") and "on a CPU 57.00 s of it" in longsteps.format_long_step(s)
    # the same, for 8 s of an 11 s start, its peers busy 2.8 s with their own imports and builds (a real
    # job, 2026-12-07): more than a quarter of its busy time and of the start, yet no start alike; named
    # for its busy time, under half of which its peers were busy, with where it was
    barrier = ["/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py:83 wrapper",
               "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:5356 barrier"]
    prep = _job({r: longsteps.to_send([], 8.0, {"step": 0, "ms": 11055.0 - 40 * r, "cpu": 9835.0 if r == 0 else 1836.0,
                                                "runq": 916.0 if r == 0 else 946.0, "stops": 0, "data": 0.0, "gc": 0.0,
                                                "thr": 0.0, "where": ["/job/prep0.py:11 prepare_dataset"] if r == 0
                                                else barrier}) for r in range(3)}, median=8.0)
    (s,) = _long(prep, 8.0)
    assert (s.rank, s.what) == (0, "cpu") and ("rank 0 on node0 on a CPU 10.75 s of it, the others 2.78 s at most: "
                                               "they waited for it; in /job/prep0.py:11 prepare_dataset") in \
        longsteps.format_long_step(s), longsteps.format_long_step(s)


def test_a_rank_whose_share_of_an_evaluation_is_bigger_is_the_one_the_others_waited_for() -> None:
    """Every rank evaluates every 100 steps, rank 2 on a shard 3x the others', then the metrics are
    all-reduced (a real 3-rank job, 2026-12-07: rank 2 busy 421 ms of a 441 ms step, the others 189
    and 170). It read "every rank was busy through it (an evaluation, a job-wide pause)": the others
    worked under half of it and waited for rank 2 the rest. An evaluation every rank works through
    alike is still every rank's."""
    uneven = _job({r: [_rec(st, 440.0 - r, 420.0 if r == 2 else 170.0 + 19 * r) for st in (101, 201, 401)]
                   for r in range(3)}, median=38.5)
    got = _long(uneven, 38.5)
    assert [(s.step, s.rank, s.what) for s in got] == [(101, 2, "cpu"), (201, 2, "cpu"), (401, 2, "cpu")], got
    (line,) = longsteps.format_long_steps(got)
    assert "rank 2 on node1 on a CPU 420 ms of it, the others 190 ms at most: they waited for it" in line, line
    alike = _job({r: [_rec(st, 440.0 - r, 420.0 - 60 * r) for st in (101, 201, 401)] for r in range(3)}, median=38.5)
    assert all(s.rank is None and "every rank was busy" in s.why for s in _long(alike, 38.5))


def test_a_job_report_whose_longest_steps_cost_a_good_share_of_it_is_not_called_healthy() -> None:
    from eroica_runtime.report import format_job

    def report(world_steps: int) -> dict:
        stats = job_stats(_job({r: [_rec(st, 1210.0, 4.0, where=AWAY_WHERE if r == 1 else VICTIM_WHERE)
                                    for st in (61, 121)] for r in range(3)}, median=7.5), 3)
        stats["steps"] = world_steps
        return {"schema": "eroica.report/1", "world_size": 3, "steps": world_steps, "job": stats,
                "captures": [{"step": 13, "trigger": "baseline", "ranks_analysed": 3, "findings": []}],
                "findings": []}
    head = format_job(report(160)).splitlines()[0]
    assert head.startswith("eroica: job report: no findings over 1 capture(s), but its longest steps held every rank "
                           "2.4 s, 67% of the job's time (the job summary above)"), head
    page = render_html(report(160), [], None)
    assert "No findings, but its longest steps held every rank 2.4 s" in page
    # the same two stalls in a job of 100,000 steps are 0.3% of it: healthy
    assert "healthy — no findings" in format_job(report(100_000)).splitlines()[0]


def test_the_job_summary_prints_the_longest_step_and_report_json_keeps_it() -> None:
    per_rank = _job({r: [_rec(200, 848.0, 350.0 if r == 2 else 5.0, where=RECOMPILE_WHERE if r == 2 else None)]
                     for r in range(4)})
    stats = job_stats(per_rank, 4)
    assert all("long_steps" not in r for r in stats["per_rank"])   # each rank's records are read, not kept
    assert stats["long_steps"][0]["rank"] == 2 and stats["long_steps"][0]["where"] == RECOMPILE_WHERE
    text = format_job_stats(stats, [])
    assert "  longest step:\n    step 200 took 848 ms" in text and "rank 2 on node1" in text, text
    page = render_html({"schema": "eroica.report/1", "world_size": 4, "steps": 400, "job": stats, "captures": [],
                        "findings": []}, [], None)
    assert "<h3>Longest steps</h3>" in page and "step 200 took 848 ms" in page
    # report.json read back by another reader: junk in it is no crash
    back = longsteps.LongStep.from_json({"step": "x", "ms": None, "rank": True, "where": [1, "a.py:1 f"]})
    assert back.rank is None and back.where == ("a.py:1 f",)
    assert "longest" not in format_job_stats(job_stats(_job({0: [], 1: []}), 2), [])


def test_a_stall_whose_busy_rank_kept_no_record_of_it_says_the_records_are_incomplete() -> None:
    """Rank 0 saved a checkpoint in 9 steps alike and kept 8 of them: for the ninth only its peers'
    records remain, all asleep, and the line must not read as if nobody was busy for sure."""
    saves = [100 * k for k in range(1, 10)]
    per_rank = _job({0: [_rec(st, 1020.0, 610.0) for st in saves[1:]],
                     **{r: [_rec(st, 1020.0 + (st == 100), 5.0) for st in saves] for r in (1, 2, 3)}})
    got = _long(per_rank, 10.0)
    assert got[0].step == 100 and got[0].rank is None, got[0]
    assert "only 3 of the 4 ranks that reported kept this step" in got[0].why
    assert [(s.step, s.rank) for s in got[1:]] == [(200, 0), (300, 0)]
    one = _long(_job({0: [_rec(7, 900.0, 800.0)]}), 10.0)
    assert one[0].rank is None and "the job's one rank was busy 0.80 s" in one[0].why


def test_a_step_eroicas_own_capture_held_up_is_no_stall_unless_a_rank_stalled_in_it_alone() -> None:
    """A capture's lead-in on two nodes: the leaders ran the link probe (their own work, left out of
    their step) while the others waited for them: 112 ms against an 11 ms median, "no rank was busy",
    and eroica's doing (the step clock marks it). It is not reported; a rank that recompiled alone in
    such a step still is."""
    probe = _job({r: [{**_rec(12, 112.0, 3.0), "eroica": 1}] if r in (1, 3) else [] for r in range(4)}, median=10.9)
    assert _long(probe, 10.9) == []
    both = _job({r: [{**_rec(12, 112.0, 3.0), "eroica": 1}, _rec(70, 2010.0, 2000.0 if r == 3 else 7.0)]
                 for r in range(4)}, median=10.9)
    (s,) = _long(both, 10.9)
    assert (s.step, s.rank, s.among) == (70, 3, 1)
    lone = _job({r: [{**_rec(12, 900.0, 800.0 if r == 2 else 5.0), "eroica": 1}] for r in range(4)}, median=10.9)
    (s,) = _long(lone, 10.9)
    assert (s.step, s.rank) == (12, 2)


SLEEP_WHERE = ["/job/train.py:225 <module>", "/job/train.py:171 main", "/job/train.py:101 stall_once"]
PROBE_WHERE = ["/job/train.py:180 main", "/venv/lib/python3.11/site-packages/torch/optim/optimizer.py:485 wrapper",
               "/venv/lib/python3.11/site-packages/eroica_runtime/stepclock.py:420 _after_step",
               "/venv/lib/python3.11/site-packages/eroica_runtime/sidechannel.py:380 probe_links"]


def test_a_rank_asleep_in_its_own_code_in_a_captures_window_is_named_and_one_in_eroicas_work_is_not() -> None:
    """Rank 3 of 4 slept 2 s at step 70, inside a capture's window (its steps carry eroica's mark), its
    stack in the script while the others waited in backward (a real CI run, 2026-12-07, listed no long
    step): named. A rank elsewhere in eroica's own work (a leader's link probe) is not; the step
    clock's frames, which sit in every rank's stack under backward() and the DataLoader, are no sign
    of it."""
    def job(odd: list[str]) -> dict[int, dict]:
        return _job({r: [{**_rec(70, 2020.0 + r, 6.0 if r == 3 else 4.0, where=odd if r == 3 else VICTIM_WHERE),
                          "eroica": 1}] for r in range(4)}, median=11.7)
    (s,) = _long(job(SLEEP_WHERE), 11.7)
    assert (s.step, s.rank, s.what, s.waiting, s.where) == (70, 3, "away", 3, tuple(SLEEP_WHERE)), s
    assert _long(job(PROBE_WHERE), 11.7) == []
    clocked = [*SLEEP_WHERE, "/venv/lib/python3.11/site-packages/eroica_runtime/stepclock.py:300 counted"]
    assert [s.rank for s in _long(job(clocked), 11.7)] == [3]
    # eroica's code is never the user's, installed in place or not
    assert not longsteps.is_user_frame("/work/main/eroica_runtime/runtime.py:300 _boundary")
    assert longsteps.is_user_frame(SLEEP_WHERE[-1])


def test_stalls_with_the_same_verdict_read_as_one_line() -> None:
    """Workers started anew at every epoch: the same job-wide wait at steps 40, 160, 240, one line."""
    per_rank = _job({r: [_rec(st, 164.0 + st / 16, 5.0, data=150.0) for st in (40, 160, 240)] for r in range(4)})
    got = _long(per_rank, 14.2)
    (line,) = longsteps.format_long_steps(got)
    assert line.startswith("steps 240, 160, 40 took 166-179 ms each (12-13x the median 14.2 ms): every rank waited "
                           "for its next batch"), line
    assert "persistent_workers=True" in line
    saves = _job({0: [_rec(st, 1020.0, 600.0, where=["/venv/lib/python3.11/site-packages/torch/serialization.py:1312 _save",
                                                     ]) for st in (50, 100)], 1: [_rec(st, 1020.0, 5.0) for st in (50, 100)]})
    (line,) = longsteps.format_long_steps(_long(saves, 10.0))
    assert line.startswith("steps 50, 100 took 1.02 s each (102x the median 10.0 ms): rank 0 on node0 on a CPU 600 ms"), line


def test_a_checkpoint_lightning_writes_outside_torch_save_is_said_to_be_one() -> None:
    """A real 4-rank Lightning job (2026-12-07) with ModelCheckpoint(every_n_train_steps=25): rank 0's
    stack, sampled while it wrote, was in fsspec writing the bytes torch.save had made, and the line read
    "in fsspec/implementations/local.py:480 write, from ckpt_lit.py:28 <module>", never what it was
    doing. The framework's checkpoint functions on the stack say it."""
    venv = "/venv/lib/python3.11/site-packages"
    where = ["/job/ckpt_lit.py:28 <module>",
             f"{venv}/lightning/pytorch/callbacks/model_checkpoint.py:600 _save_checkpoint",
             f"{venv}/lightning/pytorch/trainer/trainer.py:1464 save_checkpoint",
             f"{venv}/lightning/pytorch/strategies/strategy.py:491 save_checkpoint",
             f"{venv}/lightning/fabric/plugins/io/torch_io.py:58 save_checkpoint",
             f"{venv}/lightning/fabric/utilities/cloud_io.py:117 _atomic_save",
             f"{venv}/fsspec/implementations/local.py:480 write"]
    saves = _job({0: [_rec(st, 360.0, 300.0, where=where) for st in (25, 75, 100)],
                  **{r: [_rec(st, 360.0, 20.0) for st in (25, 75, 100)] for r in (1, 2, 3)}}, median=20.6)
    (line,) = longsteps.format_long_steps(_long(saves, 20.6))
    assert ": rank 0 on node0 on a CPU 300 ms" in line and "it was saving a checkpoint" in line, line
    assert "fsspec/implementations/local.py:480 write, from /job/ckpt_lit.py:28 <module>" in line, line
    # the stack sampler keeps such a frame however deep under the innermost ones
    assert longsteps.landmark(where[2]) and not longsteps.landmark(where[-1])


def _verdicts(per_rank: dict[int, dict], median: float) -> list[tuple]:
    """The rule read straight off every rank's records side by side, as the engine states it: the
    3 longest steps past the bar; in each, the busiest rank is named when busy a quarter of its
    step or more while no other was busy half as long (and its stack comes with it). Else,
    unless every rank was busy or one was stopped, the one rank whose stack's innermost frame differs
    from all the others' (two or more, at one place) is named, when every rank sent its stack."""
    by_step: dict[int, dict[int, dict]] = {}
    for r, doc in per_rank.items():
        for rec in doc["long_steps"]:
            by_step.setdefault(rec["step"], {})[r] = rec
    busy = {st: {r: x["cpu"] + x["runq"] + x["data"] for r, x in recs.items()} for st, recs in by_step.items()}
    out = []
    for st in sorted(by_step, key=lambda st: -max(x["ms"] for x in by_step[st].values()))[:3]:
        recs, longest = by_step[st], max(x["ms"] for x in by_step[st].values())
        if longest < max(10 * median, 100.0):
            continue
        top = min(busy[st], key=lambda r: (-busy[st][r], r))
        others = max((b for r, b in busy[st].items() if r != top), default=0.0)
        alone = busy[st][top] >= 0.25 * recs[top]["ms"] and others <= 0.5 * busy[st][top] and len(busy[st]) > 1
        named, where = (top, tuple(recs[top].get("where") or ())) if alone else (None, ())
        alike = len(recs) > 1 and others >= 0.25 * longest
        if not (alone or alike or any(x["stops"] for x in recs.values())) and len(recs) == len(per_rank) \
                and all(x.get("where") for x in recs.values()):
            at: dict[str, list[int]] = {}
            for r, x in recs.items():
                at.setdefault(x["where"][-1], []).append(r)
            lone = [rs[0] for rs in at.values() if len(rs) == 1]
            if len(at) == 2 and len(lone) == 1 and len(recs) >= 3:
                named, where = lone[0], tuple(recs[lone[0]]["where"])
                others = max(b for r, b in busy[st].items() if r != named)   # the most any other rank was busy
        out.append((st, len(recs), named, others, where))
    return out


def test_node_leaders_reduce_the_records_to_the_verdicts_every_ranks_records_give() -> None:
    """Whatever the node size, rank 0 judges every long step as from every rank's records side by
    side (random jobs: lone busy ranks, every rank busy, batch waits, stops, ranks that kept no record
    of a step). Up to MAX_SENT stalls in the job: past that, a node keeps its longest few as a rank
    does, and the steps its ranks waited out longest are the job's."""
    rng = random.Random(7)
    for _ in range(300):
        world = rng.randint(1, 12)
        steps = rng.sample(range(50, 2000, 10), rng.randint(1, longsteps.MAX_SENT))
        lone = {st: rng.randrange(world) for st in steps}
        # where each rank was: the lone one mostly in its own code, the rest mostly in one collective,
        # now and then elsewhere or not sampled
        places = ([f"/job/train.py:{st} main", "/job/train.py:77 save"] if lone[st] == r and rng.random() < 0.7
                  else rng.choice((VICTIM_WHERE,) * 12 + (None, ["/job/train.py:9 log"], [f"/job/train.py:{st} main",
                                                                                       f"rank {r}"]))
                  for st in steps for r in range(world))
        per_rank = _job({r: [_rec(st, 900.0 + rng.random() * 300, rng.choice((5.0, 5.0, 300.0, 800.0)) if lone[st] == r
                                  else rng.choice((2.0, 5.0, 5.0, 60.0, 190.0, 400.0)), data=rng.choice((0.0, 0.0, 700.0)),
                                  stops=int(rng.random() < 0.05), where=next(places))
                             for st in steps if rng.random() < 0.9] for r in range(world)})
        want = _verdicts(per_rank, 20.0)
        for node in (1, 2, 3, world):
            got = _long(per_rank, 20.0, node=node)
            assert [(s.step, s.ranks_seen, s.rank, s.others_ms, s.where) for s in got] == want, (world, node)


def test_a_stall_every_rank_worked_through_sends_no_stacks_past_the_node_leaders() -> None:
    """An evaluation all 64 ranks work through, in 8 steps: each rank's records carry its stack (it was
    busy), but no rank can be the one the others waited for, so its leader forwards none of them; the
    verdict is the same."""
    where = [f"/venv/lib/python3.11/site-packages/torch/nn/modules/module.py:{i} _call_impl" for i in range(8)] \
        + ["/job/train.py:98 evaluate", "/job/train.py:140 main"]
    per_rank = _job({r: [_rec(100 * k, 2000.0, 1800.0 + r, where=where) for k in range(1, 9)] for r in range(64)})
    raw = {r: msgpack.packb(doc, use_bin_type=True) for r, doc in per_rank.items()}
    payloads = {n: jobend.node_payload({r: raw[r] for r in range(n, n + 8)}, []) for n in range(0, 64, 8)}
    assert sum(map(len, payloads.values())) < 0.3 * sum(map(len, raw.values()))
    assert not any(b"module.py" in p for p in payloads.values())
    got = _long(per_rank, 20.0, node=8)
    assert len(got) == 3 and all(s.rank is None and "every rank was busy" in s.why for s in got)


def test_a_thousand_ranks_stopped_in_a_step_are_counted_not_listed() -> None:
    per_rank = _job({r: [_rec(50, 2000.0, 5.0, stops=1)] for r in range(1000)})
    (s,) = _long(per_rank, 20.0, node=8)
    assert s.why.startswith("1000 ranks (0, 1, 2,") and len(s.stopped) == longsteps.MAX_STOPPED, s.why


def test_statistics_that_are_no_statistics_are_named_and_the_rest_still_read() -> None:
    good = msgpack.packb(_job({0: [_rec(200, 848.0, 350.0)], 1: [_rec(200, 848.0, 5.0)]})[0], use_bin_type=True)
    node = jobend.node_payload({0: good, 1: b"\xc1junk", 2: msgpack.packb([1, 2])}, [3])
    got = jobend.read({0: node, 4: b"not msgpack", 8: msgpack.packb({"schema": "other", "ranks": {}})})
    assert sorted(got.per_rank) == [0] and got.unreadable == [1, 2, 4, 8]
    forged = msgpack.packb({"schema": jobend.SCHEMA, "ranks": {}, "seen": [{"step": "x"}, 3, {"step": 5, "ranks": 1,
                            "top": 0, "rec": {"ms": "slow", "where": [1, "a.py:1 f"]}}]})
    (seen,) = jobend.read({0: forged}).seen.values()
    assert seen.step == 5 and seen.top_rec["ms"] == 0.0 and seen.top_rec["where"] == ["a.py:1 f"]
    # a rank map job_stats cannot read (no host, a median that is no number) is that rank's loss only:
    # it failed the whole job-end report (KeyError in job_stats)
    whole = _job({0: [_rec(200, 848.0, 5.0)], 1: [], 2: []})
    nohost = {k: v for k, v in whole[1].items() if k != "host"}
    odd = {**whole[2], "median_ms": "slow"}
    node = jobend.node_payload({r: msgpack.packb(d, use_bin_type=True) for r, d in ((0, whole[0]), (1, nohost),
                                                                                   (2, odd))}, [])
    got = jobend.read({0: node})
    assert sorted(got.per_rank) == [0] and got.unreadable == [1, 2]
    assert job_stats(got.per_rank, 3, got.seen)["ranks_reporting"] == 1
