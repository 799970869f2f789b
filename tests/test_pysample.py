"""The capture window's frame sampler (eroica_runtime/pysample.py): a real thread sampling this
process's main thread, and the summary field it fills."""

from __future__ import annotations

import copy
import os
import socket
import time

import msgpack
import pytest

from eroica_runtime import pysample, summary
from eroica_runtime.summary import SummaryError


def smooth(xs: range) -> float:
    """Pure Python with no op in it: the kind of work the sampler is there to find."""
    acc = 0.0
    for x in xs:
        acc = 0.9 * acc + 0.1 * x
    return acc


def test_the_time_the_main_thread_spends_in_a_function_of_its_own_is_booked_to_that_function() -> None:
    """Sampled for 0.6 s while the main thread smooths in pure Python for 20 ms and sleeps for 40 (a
    wait that releases the GIL, as a collective's does) by turns: about a quarter of the time is booked
    to the function, though looks land in the sleep far more often (the GIL is free there). Counted by
    looks, the Python read 9% here, and 4 of 38 looks in a real job that spent a third of its step
    there; booked by the time between looks, as it ran."""
    sampler = pysample.FrameSampler()
    sampler.start()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.6:
        s0 = time.perf_counter()
        while time.perf_counter() - s0 < 0.02:
            smooth(range(2000))
        time.sleep(0.04)
    got = sampler.stop()
    assert got is not None and got["samples"] >= 10, got
    frames = dict((f.rsplit(" ", 1)[1], ms) for f, ms in got["frames"])
    assert frames.get("smooth", 0.0) >= 0.18 * got["ms"], got   # 0.26-0.27 here; by looks 0.09
    here = f"{os.path.abspath(__file__)}:{smooth.__code__.co_firstlineno} smooth"
    assert here in dict(got["frames"]), got
    assert sampler.stop() is None   # stopped: nothing more to say


def test_frames_of_pythons_library_and_eroica_are_passed_over_for_the_users_own() -> None:
    """A look that finds the main thread inside Python's library (json decoding a record) or inside
    eroica (its step hook) books the time to the user's frame that called it."""
    import json
    import sys

    seen: list = []
    json.loads('{"a": 1}', object_hook=lambda d: seen.append(sys._getframe(1)))   # json.decoder's frame
    assert "json" in seen[0].f_code.co_filename
    me = pysample.user_frame(seen[0])
    assert me is not None and me.endswith(" test_frames_of_pythons_library_and_eroica_are_passed_over_for_the_users_own")
    ns: dict = {}
    exec(compile("import sys\nf = sys._getframe()", pysample._OWN + "hook.py", "exec"), ns)   # as if in eroica
    assert pysample.user_frame(ns["f"]) == me   # this function again (its first line names it)
    assert pysample.user_frame(None) is None


IDENTITY = {"rank": 3, "local_rank": 1, "world_size": 8, "pid": 1234, "host": socket.gethostname(),
            "device": {"index": None, "uuid": None, "name": None}, "groups": [], "versions": {"eroica": "test"}}


def test_the_summarys_python_field_is_validated() -> None:
    py = {"samples": 26, "ms": 94.8, "frames": [["/job/pylog.py:1 <module>", 64.1], ["/job/pylog.py:18 smooth", 30.7]]}
    doc = summary.build([], identity=IDENTITY, capture={"step": 10, "trigger": "test", "k": 1},
                        steps=[{"step": 10, "ms": 5.0}], gc={"count": 0, "ms": 0.0}, telemetry={}, python=py)
    assert summary.decode(summary.encode(doc), origin="rank 3")["python"] == py
    for where, breakage in (("python.samples", lambda d: d["python"].update(samples=-1)),
                            ("python.ms", lambda d: d["python"].update(ms=float("inf"))),
                            (r"python\.frames\[1\]\[1\]", lambda d: d["python"]["frames"][1].__setitem__(1, -1.0)),
                            (r"python\.frames\[0\] must be", lambda d: d["python"]["frames"][0].append(3)),
                            ("python.frames must be", lambda d: d["python"].update(frames=[["f", 1.0]] * 17)),
                            ("python must be a map", lambda d: d.update(python=[1]))):
        bad = copy.deepcopy(doc)
        breakage(bad)
        with pytest.raises(SummaryError, match=f"rank 4.*{where}"):
            summary.decode(msgpack.packb(bad, use_bin_type=True), origin="rank 4")
