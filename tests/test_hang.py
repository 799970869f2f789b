"""Hang diagnosis over the side channel: real ranks, one of them stuck."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import BIN, DATA, eroica_run, explain

from eroica_runtime.engine.hang import MOVED_BYTES, analyse, hang_diagnosis, where
from eroica_runtime.report import format_finding, format_hang, format_pause
from eroica_runtime.report_html import render_html

TRAIN = DATA / "runtime" / "train.py"


def _report(rank: int, file: str, line: int, seq: int | None, moving: dict | None = None) -> dict:
    frames = [{"file": "/x/site-packages/torch/nn/modules/module.py", "line": 1, "function": "_call_impl",
               "code": ""}, {"file": file, "line": line, "function": "f", "code": "..."}]
    return {"rank": rank, "host": f"h{rank // 2}", "step": 7, "stalled_s": 9.0,
            "stacks": [{"thread": "MainThread", "main": True, "frames": frames}],
            "flight_recorder": {"seq": seq} if seq is not None else None,
            **({"moving": moving} if moving is not None else {})}


STILL = {"seconds": 2.0, "stack_moved": False, "storage_bytes": 0, "collectives": 0}

COUNTED = """
import torch, torch.distributed as dist
from eroica_runtime.hang import collectives_recorded
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
before = collectives_recorded()
for _ in range(3):
    dist.all_reduce(torch.ones(2))
print(before, collectives_recorded(), flush=True)
dist.destroy_process_group()   # a job's own clean end: left to the interpreter's exit, torch's teardown of
                               # the recorder's group aborted once ("terminate called without an active
                               # exception", -6, fresh-clone CI at f50223e) after printing the counts
"""


@pytest.mark.parametrize("size, want", [("200", "grew"), ("0", "None None"), (None, "None None")])
def test_the_flight_recorders_count_of_collectives_grows_with_them_and_is_none_when_it_is_off(
        size: str | None, want: str) -> None:
    """runtime._adopt_gate counts no steps in a loop where this count did not grow: a recorder off (not
    set, or a size of 0, which eroica-run leaves as the job set it) must say nothing, not "none ran"."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_FR_BUFFER_SIZE"}
    if size is not None:
        env["TORCH_FR_BUFFER_SIZE"] = size
    proc = subprocess.run([sys.executable, "-c", COUNTED], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    got = proc.stdout.split("\n")[-2]
    if want == "grew":   # the recorder's 3 and the group's sequence number's 3: only growth is read
        before, after = map(int, got.split())
        assert after - before >= 3, got
    else:
        assert got == want, got


def test_no_process_group_counts_no_collective_whatever_the_recorder() -> None:
    """Ranks that never made a process group ran no torch collective: 0, so the runtime stands down
    for them (their pace is their own) even where the recorder is off."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_FR_BUFFER_SIZE"}
    code = "from eroica_runtime.hang import collectives_recorded; print(collectives_recorded())"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0 and proc.stdout.split() == ["0"], proc.stdout + proc.stderr


def test_analyse_names_the_rank_outside_the_collective() -> None:
    reports = {r: _report(r, "/job/train.py", 80, 41) for r in (0, 1, 3)}
    reports[2] = _report(2, "/job/model.py", 12, 40)
    doc = analyse(reports, 4)
    assert doc["finding"]["rank"] == 2 and doc["finding"]["host"] == "h1"
    assert doc["finding"]["victims"] == [0, 1, 3]
    assert doc["finding"]["evidence"]["outlier_collective_seq"] == 40
    assert where(reports[2]) == "/job/model.py:12 in f"


def test_the_rank_behind_in_the_collective_sequence_is_named_wherever_the_others_wait() -> None:
    """A real 4-rank Lightning DDP job (2026-12-07, /tmp/trial/lj/hang_lit.py in the note: a callback
    deadlocks on rank 3 after its optimizer step at step 50): its peers went on to the next step's
    backward, where one had made DDP's first bucket's all-reduce (sequence 117) and two both buckets'
    (118). Grouped by position, the two at 118 were the majority and rank 1, the lowest other rank,
    was named: "culprit: rank 1 ... at hang_lit.py:35 in <module>". The rank whose last collective
    came earliest is the one the others wait for; the positions as the watchdog sent them."""
    graph = "/venv/lib/python3.11/site-packages/torch/autograd/graph.py"

    def rank(r: int, file: str, line: int, seq: int, pg: str = "0") -> dict:
        rep = _report(r, file, line, seq)
        rep["flight_recorder"]["last"] = [{"seq": seq, "name": "gloo:all_reduce", "state": "scheduled", "pg": pg}]
        return rep

    reports = {0: rank(0, graph, 979, 118), 2: rank(2, graph, 979, 118), 1: rank(1, "/job/hang_lit.py", 35, 117),
               3: rank(3, "/job/hang_lit.py", 28, 116)}
    f = analyse(reports, 4)["finding"]
    assert (f["rank"], f["victims"], f["evidence"]["outliers"]) == (3, [0, 1, 2], [3]), f
    assert f["function"] == "/job/hang_lit.py:28 in f" and f["evidence"]["outlier_collective_seq"] == 116
    assert f["evidence"]["majority_position"] == f"{graph}:979 in f", f["evidence"]
    assert f["action"].startswith("rank 3 never reached the collective the other 3 ranks wait in"), f["action"]
    text = format_hang(analyse(reports, 4), 7.0)
    assert "culprit: rank 3 on h1 — at /job/hang_lit.py:28 in f" in text, text
    assert f"the other 3 rank(s) wait at {graph}:979 in f (ranks 0, 2), /job/hang_lit.py:35 in f (rank 1)" in text, text
    # rank 3 on with the others (118): the one behind is rank 1 (117), though no rank waits where it does
    assert analyse({**reports, 3: rank(3, "/job/hang_lit.py", 28, 118)}, 4)["finding"]["rank"] == 1
    # sequences of different process groups say nothing of each other; nor do they when a rank did not
    # answer (dead or frozen, it may be the one they wait for)
    other_group = {**reports, 1: rank(1, "/job/hang_lit.py", 35, 117, pg="1")}
    assert analyse(other_group, 4)["finding"]["rank"] == 1
    assert analyse({r: rep for r, rep in reports.items() if r != 1}, 5)["finding"]["rank"] == 3   # a majority
    assert analyse({r: rep for r, rep in reports.items() if r != 2}, 4)["finding"]["rank"] == 2   # the silent one


def test_one_rank_in_a_collective_while_the_others_wait_in_ddps_backward_is_said_to_have_called_another() -> None:
    """A real 4-rank Lightning job (2026-12-07) whose rank 0 alone logged a metric with sync_dist=True at
    step 40 (a barrier, then an all-reduce): the other 3 ranks wait in DDP's gradient all-reduce inside
    backward, where the autograd engine shows no frame of torch.distributed, and the hang read "rank 0
    never reached the collective the other 3 ranks wait in". The Flight Recorder's last entry says
    which collective each made and has not completed: both are said."""
    graph = "/venv/lib/python3.11/site-packages/torch/autograd/graph.py"
    c10d = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
    reports = {0: _report(0, "/job/lit.py", 17, 98)}
    reports[0]["stacks"][0]["frames"] = [
        {"file": "/job/lit.py", "line": 17, "function": "training_step", "code": "self.log('x', loss, sync_dist=True)"},
        {"file": c10d, "line": 5356, "function": "barrier", "code": "work.wait()"}]
    reports[0]["flight_recorder"]["last"] = [{"seq": 98, "name": "gloo:barrier", "state": "scheduled", "pg": "0"}]
    for r in (1, 2, 3):
        reports[r] = _report(r, graph, 979, 98)
        reports[r]["flight_recorder"]["last"] = [{"seq": 98, "name": "gloo:all_reduce", "state": "scheduled", "pg": "0"}]
    f = analyse(reports, 4)["finding"]
    assert (f["rank"], f["victims"], f["evidence"]["collectives"]) == (0, [1, 2, 3], ["barrier", "all_reduce"]), f
    assert f["action"].startswith(f"rank 0 waits in barrier() at /job/lit.py:17 in training_step while the other 3 "
                                  f"ranks wait in all_reduce() at {graph}:979 in f: different collectives"), f["action"]
    assert "sync_dist=True" in f["action"] and "sync_dist=True" in format_hang(analyse(reports, 4), 7.0)
    # an entry that completed is not what they wait in: then nothing is said of it
    for r in (1, 2, 3):
        reports[r]["flight_recorder"]["last"][-1]["state"] = "completed"
    assert analyse(reports, 4)["finding"]["action"].startswith("rank 0 never reached the collective")


def test_a_hang_in_the_job_report_says_how_long_the_job_went_without_a_step_not_a_cost_a_step() -> None:
    """The fault bench's hang case (rank 1 stopped 80 s, 2026-12-07) read "#1 HANG: rank 1 on vm — ...
    [hang], +62000.0 ms/step" in the job report: its impact is the time without a step, so that it ranks
    first, and is no cost a step."""
    reports = {r: _report(r, "/job/train.py", 80, 41) for r in (0, 1, 3)}
    reports[2] = _report(2, "/job/model.py", 12, 40)
    (f,) = hang_diagnosis(analyse(reports, 4), 7).findings
    head = format_finding(f)[0]
    assert head.startswith("  #1 HANG: rank 2 on h1 — /job/model.py:12 in f [hang], no step for 9 s"), head
    assert "ms/step" not in head
    page = render_html({"schema": "eroica.report/1", "world_size": 4, "findings": [f.to_json()], "captures": []},
                       [], None)
    assert "<td>no step for 9 s</td>" in page and "9000" not in page


def test_ranks_waiting_in_different_collectives_are_said_to_have_called_different_ones() -> None:
    """A real 3-rank job (2026-12-07) whose rank 1 called barrier() at step 50 where ranks 0 and 2
    all-reduced a metric: the hang named rank 1 but read "rank 1 never reached the collective the other
    2 ranks wait in", while it waited in one of its own. Its stack and theirs, as the watchdog sent them."""
    c10d = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
    logger = {"file": "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", "line": 83,
              "function": "wrapper", "code": "return func(*args, **kwargs)"}

    def waiting(rank: int, line: int, code: str, collective: str, at: int) -> dict:
        rep = _report(rank, "/job/mismatch.py", line, 57)
        rep["stacks"][0]["frames"] = [{"file": "/job/mismatch.py", "line": line, "function": "<module>", "code": code},
                                      logger, {"file": c10d, "line": at, "function": collective, "code": "work.wait()"}]
        return rep

    reports = {r: waiting(r, 18, "dist.all_reduce(t)", "all_reduce", 3007) for r in (0, 2)}
    reports[1] = waiting(1, 16, "dist.barrier()", "barrier", 5356)
    f = analyse(reports, 3)["finding"]
    assert (f["rank"], f["victims"], f["evidence"]["collectives"]) == (1, [0, 2], ["barrier", "all_reduce"])
    assert f["action"].startswith("rank 1 waits in barrier() at /job/mismatch.py:16 in <module> while the other 2 "
                                  "ranks wait in all_reduce() at /job/mismatch.py:18 in <module>: different "
                                  "collectives, so none of them can complete"), f["action"]
    assert "TORCH_DISTRIBUTED_DEBUG=DETAIL" in f["action"]
    # a rank elsewhere than any collective keeps the old line
    reports[1] = _report(1, "/job/data.py", 5, 56)
    assert analyse(reports, 3)["finding"]["action"].startswith("rank 1 never reached the collective")


# rank 1's main thread while its DataLoader worker slept in __getitem__ (a real 3-rank job, 2026-12-07)
LOADER_FRAMES = [
    {"file": "/job/dlhang.py", "line": 23, "function": "<module>", "code": "for it, (x, y) in enumerate(dl):"},
    {"file": "/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", "line": 1458,
     "function": "_next_data", "code": "idx, data = self._get_data()"},
    {"file": "/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", "line": 1291,
     "function": "_try_get_data", "code": "data = self._data_queue.get(timeout=timeout)"},
    {"file": "/usr/lib/python3.11/multiprocessing/queues.py", "line": 113, "function": "get",
     "code": "if not self._poll(timeout):"},
    {"file": "/usr/lib/python3.11/selectors.py", "line": 415, "function": "select",
     "code": "fd_event_list = self._selector.poll(timeout)"}]


@pytest.mark.parametrize("workers, says", [
    ([{"pid": 16750, "state": "sleeping", "cpu_s": 0.0}, {"pid": 16748, "state": "sleeping", "cpu_s": 0.0}],
     "none of its 2 workers used CPU while it watched (pids 16750, 16748): one is blocked"),
    ([{"pid": 16750, "state": "disk-sleep", "cpu_s": 0.0}, {"pid": 16748, "state": "sleeping", "cpu_s": 0.0}],
     "1 of its 2 workers are in uninterruptible I/O (state D)"),
    ([{"pid": 16750, "state": "running", "cpu_s": 1.9}, {"pid": 16748, "state": "running", "cpu_s": 1.8}],
     "its 2 workers kept running (pids 16750, 16748)"),
    ([], "no worker of it was seen"),
    ([{"pid": "16750", "state": 3, "cpu_s": True}], "no worker of it was seen")])   # malformed: dropped
def test_a_rank_held_by_its_dataloader_workers_is_said_to_wait_for_them(workers: list, says: str) -> None:
    def rep(rank: int, frames: list[dict]) -> dict:
        doc = _report(rank, "/job/dlhang.py", 26, 120)
        doc["stacks"][0]["frames"] = frames
        return doc

    waiting = [{"file": "/job/dlhang.py", "line": 26, "function": "<module>", "code": "loss.backward()"}]
    reports = {0: rep(0, waiting), 2: rep(2, waiting), 1: {**rep(1, LOADER_FRAMES), "workers": workers}}
    f = analyse(reports, 3)["finding"]
    assert f["rank"] == 1 and f["victims"] == [0, 2], f
    assert f["action"].startswith("rank 1 waits for its next batch from its DataLoader's worker processes while the "
                                  "other 2 ranks wait for it in a collective"), f["action"]
    assert says in f["action"], f["action"]
    assert "py-spy dump --pid" in f["action"] and "DataLoader(timeout=...)" in f["action"], f["action"]


WORKERS_SEEN = """
import multiprocessing, time
from eroica_runtime import telemetry
from eroica_runtime.hang import _watched

def spin(s):
    end = time.monotonic() + s
    while time.monotonic() < end:
        pass

ctx = multiprocessing.get_context("fork")
busy, idle = ctx.Process(target=spin, args=(3.0,)), ctx.Process(target=time.sleep, args=(3.0,))
busy.start(); idle.start()
time.sleep(0.3)
before = telemetry.workers()
time.sleep(1.0)
seen = {w["pid"]: w for w in _watched(before, telemetry.workers())}
print(busy.pid in seen and seen[busy.pid]["cpu_s"] > 0.3, idle.pid in seen and seen[idle.pid]["cpu_s"] < 0.05,
      seen[idle.pid]["state"])
busy.terminate(); idle.terminate()
"""


def test_a_ranks_workers_are_seen_with_the_cpu_they_used_while_it_watched() -> None:
    proc = subprocess.run([sys.executable, "-c", WORKERS_SEEN], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "True", "sleeping"], proc.stdout


def test_analyse_blames_a_silent_rank_and_not_a_uniform_stall() -> None:
    same = {r: _report(r, "/job/train.py", 80, 41) for r in range(4)}
    assert analyse(same, 4)["finding"] is None
    del same[3]
    assert analyse(same, 4)["finding"]["rank"] == 3


def test_a_rank_that_moves_while_the_others_wait_is_busy_not_hung() -> None:
    """Rank 0 writing a checkpoint (its stack moves, it writes) while 1-3 wait in a barrier: the same
    positions that name a hang's culprit, but rank 0 moved, so nobody is blamed."""
    reports = {r: _report(r, "/job/train.py", 85, 41, STILL) for r in (1, 2, 3)}
    reports[0] = _report(0, "/x/site-packages/torch/serialization.py", 650, 40,
                         {**STILL, "stack_moved": True, "storage_bytes": 300 << 20})
    doc = analyse(reports, 4)
    assert doc["finding"] is None
    assert [(b["rank"], b["why"]) for b in doc["busy"]] == [(0, ["stack moving", "storage I/O"])]
    line = format_pause(doc, 62.0, 124.0)
    assert line.startswith("eroica: no step for 62 s, but no hang: rank 0 on h0 is busy at "
                           "/x/site-packages/torch/serialization.py:650 in f (stack moving; storage I/O: 300 MB in 2.0 s)")
    assert "; 3 ranks wait at /job/train.py:85 in f" in line and line.endswith("at 124 s without a step")
    # less storage traffic than eroica itself may write meanwhile is no movement: the hang is rank 0's again
    reports[0]["moving"] = {**STILL, "storage_bytes": MOVED_BYTES - 1}
    assert analyse(reports, 4)["finding"]["rank"] == 0


def test_ranks_that_all_move_are_busy_and_a_silent_rank_is_still_a_hang() -> None:
    """An evaluation: every rank's stack moves and its collectives finish, at two lines of the loop."""
    moving = {**STILL, "stack_moved": True, "collectives": 30}
    reports = {r: _report(r, "/job/eval.py", 90 + 2 * (r % 2), 100 + r, moving) for r in range(4)}
    doc = analyse(reports, 4)
    assert doc["finding"] is None and [b["rank"] for b in doc["busy"]] == [0, 1, 2, 3]
    line = format_pause(doc, 62.0, 124.0)
    assert ("every rank is busy (stack moving; collectives done) at /job/eval.py:90 in f (ranks 0, 2), "
            "/job/eval.py:92 in f (ranks 1, 3)") in line
    del reports[3]   # a rank that does not answer is dead or frozen, whatever the others do
    doc = analyse(reports, 4)
    assert doc["finding"]["rank"] == 3 and doc["busy"] == []


def test_a_rank_whose_program_returned_while_the_others_wait_is_named_and_the_job_ended() -> None:
    """Rank 2 ran fewer steps (uneven inputs): its program returned, the others wait in the gradient
    all-reduce (still). Its report says it finished; before, it did not answer (it sat in
    MPI_Finalize) and read "dead or frozen", and nothing ended the job."""
    in_backward = {"file": "/x/site-packages/torch/autograd/graph.py", "line": 979, "function": "_engine_run_backward",
                   "code": ""}
    reports = {r: {**_report(r, "/job/train.py", 80, 41), "moving": STILL} for r in (0, 1, 3)}
    for r in (0, 1, 3):
        reports[r]["stacks"][0]["frames"].append(in_backward)
    reports[2] = {**_report(2, "/x/eroica_runtime/runtime.py", 600, 40), "moving": STILL, "finished": True}
    doc = analyse(reports, 4)
    f = doc["finding"]
    assert (f["rank"], f["function"], f["victims"]) == (2, "the end of the program", [0, 1, 3]), f
    assert doc["end_job"] is True and "Uneven inputs" in f["action"] and "of the next step" in f["action"]
    # still, but outside torch (rank 0 waits for a subprocess uploading the final model): a pause
    outside = {**reports, 0: {**_report(0, "/job/upload.py", 12, 41), "moving": STILL}}
    doc = analyse(outside, 4)
    assert doc["finding"] is None and "end_job" not in doc and [b["rank"] for b in doc["busy"]] == [0], doc
    assert "rank 0 on h0 is busy at /job/upload.py:12 in f (not in a collective)" in format_pause(doc, 62.0, 124.0)
    # the others busy after the last step (rank 0 saving the final model): a pause, the job goes on
    reports[0]["moving"] = {**STILL, "stack_moved": True, "storage_bytes": 300 * 2**20}
    doc = analyse(reports, 4)
    assert doc["finding"] is None and "end_job" not in doc and [b["rank"] for b in doc["busy"]] == [0]
    line = format_pause(doc, 62.0, 124.0)
    assert "rank 0 on h0 is busy at /job/train.py:80" in line and "1 rank waits at the end of the program" in line
    # every rank finished but one that does not answer: that one is the hang's (dead or frozen)
    finished = {r: {**rep, "finished": True} for r, rep in reports.items() if r != 3}
    doc = analyse(finished, 4)
    assert doc["finding"]["rank"] == 3 and "end_job" not in doc and "ending" not in doc
    # every rank finished: the job is ending, nothing to say
    finished[3] = {**reports[3], "finished": True}
    doc = analyse(finished, 4)
    assert doc["finding"] is None and doc["busy"] == [] and doc["ending"] is True


WATCHED_STALL = """
import sys, time
from eroica_runtime.hang import Watchdog

def stall_here(s):
    time.sleep(s)

times = []
dog = Watchdog(None, step_times=lambda: times, warmup_steps=5, report_dir=".", factor=1000.0, floor_s=600.0,
               action="warn", deadline_s=1.0)
dog.start()
t = time.monotonic()
for step in range(1, 41):          # 10 ms steps: the bar of a long step is its floor, 100 ms
    time.sleep(0.01)
    times.append((time.monotonic() - t) * 1e3)
    t = time.monotonic()
    dog.progress(step)
stall_here(float(sys.argv[1]))     # step 41 runs long
dog.progress(41)
print(" | ".join(dog.sampled(41) or ["none"]))
"""


def test_a_stall_a_few_times_the_bar_has_its_stack_sampled_whenever_it_comes() -> None:
    """The watchdog looks just after a step would cross the bar of a long step (100 ms here), not
    only at its twice-a-second wakes: a 300 ms stall is sampled wherever it falls between them (at
    the old wakes, two times in five); the sample is the stalled line's stack, and a step under
    the bar is not sampled."""
    def sampled(stall_s: float) -> str:
        proc = subprocess.run([sys.executable, "-c", WATCHED_STALL, str(stall_s)], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    for _ in range(3):
        got = sampled(0.3)
        assert got.endswith(" stall_here"), got   # innermost last
    assert sampled(0.03) == "none"


WATCHED_START = """
import time
from eroica_runtime.hang import Watchdog

def load_shard():
    time.sleep(6.0)

def build_model():   # every rank's last second or so before its first step (DDP's constructor importing sympy)
    time.sleep(1.2)

dog = Watchdog(None, step_times=lambda: [], warmup_steps=5, report_dir=".", factor=1000.0, floor_s=600.0,
               action="warn", deadline_s=1.0)
dog.start()
load_shard()
build_model()
print(" | ".join(dog.sampled(0) or ["none"]))   # asked at the first step's boundary, as the step clock does
"""


def test_the_jobs_start_is_sampled_where_a_rank_spent_it_not_in_its_last_second() -> None:
    """Before its first step the watchdog samples the main thread (from 2 s on); the start's record takes
    the sample from a quarter of the start before its end: a rank 6 s into reading its shard, not in the
    model's build that every rank does last (a rank that prepared the data alone for 8 s was sampled
    there, with its waiting peers)."""
    proc = subprocess.run([sys.executable, "-c", WATCHED_START], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith(" load_shard"), proc.stdout


SAMPLED_COMPILE = """
import threading, torch
from eroica_runtime.hang import main_frames_text
from eroica_runtime.engine.longsteps import doing

# a library that descends 12 frames before it waits (fake tensors, autograd tracing a joint graph):
# no frame of dynamo's among the innermost eight
deep = {}
exec(compile("def down(n, inside, done):\\n    if n:\\n        return down(n - 1, inside, done)\\n"
             "    inside.set()\\n    done.wait(30)\\n", "/venv/lib/python3.11/site-packages/deeplib/trace.py", "exec"), deep)
inside, done, got = threading.Event(), threading.Event(), []

def sampler():
    inside.wait(30)
    got.append(main_frames_text())     # as the watchdog samples a step that runs long
    done.set()

def backend(gm, example_inputs):
    deep["down"](12, inside, done)
    return gm.forward

threading.Thread(target=sampler, daemon=True).start()
torch.compile(lambda x: torch.relu(x) * 2, backend=backend)(torch.randn(4))
print("doing:", doing(tuple(got[0])))
print("frames:", " | ".join(got[0]))
"""


def test_a_recompile_deep_in_a_library_is_sampled_with_a_frame_of_dynamos() -> None:
    """The stack sampled while a rank compiles keeps a frame that says so (torch/_dynamo) though its
    innermost frames are elsewhere and its outer ones the user's: the job summary says recompilation."""
    proc = subprocess.run([sys.executable, "-c", SAMPLED_COMPILE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    what = next(x for x in lines if x.startswith("doing:"))
    frames = next(x for x in lines if x.startswith("frames:"))
    assert "recompilation" in what, proc.stdout
    assert "deeplib/trace.py" in frames and "torch/_dynamo/" in frames, frames


@pytest.mark.multirank
def test_a_long_checkpoint_or_evaluation_is_said_as_such_and_is_no_hang(tmp_path) -> None:
    """7 s without an optimizer step, over twice the hang threshold, twice: after step 25 rank 0
    writes checkpoints while the others wait in a barrier; after step 40 every rank evaluates (forward
    passes and all-reduces). For each, rank 0's log says who is busy where (at 3 s, and at 6 s, twice
    the threshold, unless the machine was slow); no HANG, no hang file, no finding naming rank 0, and the
    job ends well. 3 ranks, not 4: rank 0 busy while the others wait for it is the same scene at any
    count, and a fourth rank's start was ~1.4 s; one job for both pauses (two took 14 s each)."""
    proc = eroica_run("--nproc-per-node", "3", "--report-dir", tmp_path / "report", "--hang-timeout", "3",
                      "--no-baseline", TRAIN,
                      env={"PAUSE": "checkpoint,eval", "PAUSE_AT": "25,40", "PAUSE_S": "7",
                           "PAUSE_DIR": str(tmp_path), "STEPS": "55"}, timeout=180)
    assert proc.returncode == 0 and "trained 55 steps" in proc.stdout, explain(proc)
    said = [ln for ln in proc.stderr.splitlines() if "but no hang:" in ln]
    checkpoint = [ln for ln in said if "rank 0 on " in ln and "is busy at " in ln and "train.py:" in ln
                  and "2 ranks wait at " in ln]
    evaluation = [ln for ln in said if "every rank is busy (stack moving" in ln]
    assert len(checkpoint) + len(evaluation) == len(said), said   # each line is one of the two scenes
    for lines in (checkpoint, evaluation):
        assert 1 <= len(lines) <= 2 and lines[0].endswith("Looked at again at 6 s without a step"), said
    assert said.index(checkpoint[-1]) < said.index(evaluation[0]), said   # in the job's order
    assert "HANG" not in proc.stderr and not list((tmp_path / "report").glob("hang-*.json")), explain(proc)
    doc = json.loads((tmp_path / "report" / "report.json").read_text())
    assert not [f for f in doc["findings"] if f["category"] == "hang" or f["rank"] == 0], doc["findings"]


def _running(pid: int) -> bool:
    """Whether a process lives (and is no zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


@pytest.mark.multirank
@pytest.mark.parametrize("where", ["forward", "loader"])
def test_stuck_rank_is_named_and_abort_ends_the_job(tmp_path, where: str) -> None:
    """Rank 2 blocks forever in its forward, or its DataLoader's worker does in reading a sample (a
    stuck mount): then the action says the rank waits for its workers, which ran nothing meanwhile,
    and how to look inside one."""
    t0 = time.monotonic()
    # no baseline capture: this test is about the hang; a healthy capture's judgement (where a
    # preempted rank 0 can still look like a culprit on 2 shared cores) is test_diagnosis_e2e's subject
    # a 3 s threshold, as the pause tests above: the job's own steps and pauses are no hang at it
    env = ({"HANG_RANK": "2", "HANG_AT": "20"} if where == "forward" else
           {"HANG_RANK": "2", "HANG_SAMPLE": str(20 * 16 + 3), "WORKERS": "2"})
    proc = eroica_run("--nproc-per-node", "3", "--report-dir", tmp_path, "--hang-timeout", "3", "--no-baseline",
                      "--hang-action", "abort", TRAIN, env={**env, "STEPS": "200"}, timeout=180)
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0, explain(proc)
    assert "HANG" in proc.stderr and "culprit: rank 2" in proc.stderr, explain(proc)
    (hang_file,) = tmp_path.glob("hang-*.json")
    doc = json.loads(hang_file.read_text())
    assert doc["finding"]["rank"] == 2 and doc["finding"]["victims"] == [0, 1]
    assert doc["finding"]["evidence"]["stalled_s"] < 3 + 10  # threshold plus a few seconds
    if where == "forward":
        assert any("time.sleep(3600)" in frame for frame in doc["finding"]["evidence"]["stack"])
    else:   # the sleep is in a worker: the rank waits in the loader's queue
        action, workers = doc["finding"]["action"], doc["finding"]["evidence"]["workers"]
        assert action.startswith("rank 2 waits for its next batch from its DataLoader's worker processes"), action
        assert len(workers) == 2 and all(w["cpu_s"] < 0.05 for w in workers), workers
        assert f"py-spy dump --pid {workers[0]['pid']}" in action, action
        # the job's end ended them too, the one stuck in its read included (none is left orphaned;
        # an ended one may wait a moment as a zombie for the machine's init to reap it)
        deadline, alive = time.monotonic() + 10, [w["pid"] for w in workers]
        while alive and time.monotonic() < deadline:
            alive = [pid for pid in alive if _running(pid)]
            time.sleep(0.1)
        assert not alive, alive
    report = json.loads((tmp_path / "report.json").read_text())  # written before the job was ended
    assert [(f["category"], f["rank"]) for f in report["findings"]] == [("hang", 2)]
    root = proc.stderr[proc.stderr.index("Root Cause"):]
    assert "hang diagnosed" in root
    assert elapsed < 120, elapsed
    # analysed again offline (no capture was taken): the hang stays the job's finding
    again = subprocess.run([str(BIN / "eroica"), "analyze", str(tmp_path)], capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0, again.stderr
    offline = json.loads((tmp_path / "report.json").read_text())
    assert [(f["category"], f["rank"]) for f in offline["findings"]] == [("hang", 2)], again.stdout
    assert "#1 HANG: rank 2" in again.stdout, again.stdout
