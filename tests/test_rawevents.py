"""Raw profiler events kept as data (EROICA_KEEP_RAW_EVENTS): read back, they are the events the builder
read, and a file that is not one is refused in one line. (That a real job's kept events rebuild the
very summary each rank sent is tests/test_runtime.py's SIGUSR1 test.)"""

from __future__ import annotations

import zlib
from pathlib import Path

import msgpack
import pytest

from eroica_runtime import summary
from eroica_runtime.summary import rawevents
from eroica_runtime.summary.events import normalize_raw


class _Kineto:
    """The methods of a raw kineto event the builder calls, with a GPU's values (pure logic: the real
    GPU events are the fixtures a GPU session records)."""

    def __init__(self, name: str, dtype: str, start: int, end: int, **kw: object) -> None:
        self.values = {"name": name, "device_type": dtype, "start_ns": start, "end_ns": end, "device_index": 0,
                       "device_resource_id": 7 if dtype == "CUDA" else 0, "start_thread_id": 11,
                       "correlation_id": 0, "linked_correlation_id": 0, "scope": 0, "is_user_annotation": False,
                       "is_hidden_event": False, "activity_type": "kernel" if dtype == "CUDA" else "cpu_op",
                       "metadata_json": "", **kw}

    def __getattr__(self, method: str):  # type: ignore[no-untyped-def]
        try:
            value = self.__dict__["values"][method]
        except KeyError:
            raise AttributeError(method) from None
        return lambda: value


def _gpu_window() -> list[_Kineto]:
    ms = 1_000_000
    return [
        _Kineto("ProfilerStep#5", "CPU", 0, 30 * ms, is_user_annotation=True),
        _Kineto("aten::mm", "CPU", 1 * ms, 3 * ms, correlation_id=1),
        _Kineto("cudaLaunchKernel", "CPU", 2 * ms, 2 * ms + 5000, correlation_id=2, linked_correlation_id=1,
                start_thread_id=12),
        _Kineto("_Z14gemm_kernelPfS_", "CUDA", 4 * ms, 9 * ms, correlation_id=2, linked_correlation_id=1),
        _Kineto("aten::copy_", "CPU", 10 * ms, 11 * ms, correlation_id=3),
        _Kineto("Memcpy HtoD (Pageable -> Device)", "CUDA", 12 * ms, 20 * ms, correlation_id=3,
                activity_type="gpu_memcpy", metadata_json='"bytes": 268435456, "memory bandwidth (GB/s)": 33.5'),
        _Kineto("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "CUDA", 21 * ms, 28 * ms, correlation_id=4),
        _Kineto("ProfilerStep#5", "CUDA", 0, 30 * ms, activity_type="gpu_user_annotation",
                is_user_annotation=True),
    ]


def _fields(ev: summary.events.Ev) -> tuple:
    return (ev.name, ev.start, ev.end, ev.thread, ev.gpu, ev.annotation, ev.scope, ev.corr, ev.linked, ev.nbytes,
            ev.activity)


def test_kept_events_read_back_as_the_builder_read_them() -> None:
    window = _gpu_window()
    meta, back = rawevents.load(rawevents.dump(window, rank=3, step=5), origin="rank3.msgpack")
    assert meta == {"schema": rawevents.SCHEMA, "rank": 3, "step": 5, "n": len(window)}
    assert [_fields(e) for e in normalize_raw(back)] == [_fields(e) for e in normalize_raw(window)]
    copy = next(e for e in normalize_raw(back) if e.name.startswith("Memcpy"))
    assert copy.nbytes == 268435456 and copy.activity == "gpu_memcpy"
    assert back[2].start_thread_id() == 12 and back[6].device_resource_id() == 7


def _doc(window: list[_Kineto] | None = None) -> dict:
    return msgpack.unpackb(zlib.decompress(rawevents.dump(window or _gpu_window(), rank=0, step=5)),
                           raw=False, strict_map_key=False)


def _spoiled(change) -> bytes:  # type: ignore[no-untyped-def]
    doc = _doc()
    change(doc)
    return zlib.compress(msgpack.packb(doc, use_bin_type=True))


@pytest.mark.parametrize("data,says", [
    (b"not zlib at all", "cannot be read (error)"),
    (zlib.compress(msgpack.packb([1, 2, 3])), "schema 'list'"),
    (_spoiled(lambda d: d.update(schema="eroica.summary/1")), "schema 'eroica.summary/1'"),
    (_spoiled(lambda d: d.update(n=-1)), "event count -1"),
    (_spoiled(lambda d: d.update(rank="0")), "rank '0'"),
    (_spoiled(lambda d: d["cols"].pop("corr")), "columns"),
    (_spoiled(lambda d: d["cols"].update(start_ns=d["cols"]["start_ns"][:-8])), "column start_ns does not hold 8"),
    (_spoiled(lambda d: d.update(strings=d["strings"][:2])), "points outside the string table"),
    (_spoiled(lambda d: d.update(meta={99: "x"})), "meta"),
])
def test_a_file_that_is_not_kept_events_is_refused_in_one_line(data: bytes, says: str) -> None:
    with pytest.raises(rawevents.RawEventsError) as err:
        rawevents.load(data, origin="raw/5/rank0.msgpack")
    text = str(err.value)
    assert text.startswith("raw/5/rank0.msgpack: not an eroica.rawevents/1 document: ") and says in text, text
    assert "\n" not in text


def test_raw_events_that_cannot_be_kept_are_said_once_and_the_capture_goes_on(
        tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """A debugging aid must not switch eroica off: a report directory that cannot hold the file, or
    events that cannot be read, give one line on stderr, however many windows close."""
    from eroica_runtime.config import Config
    from eroica_runtime.runtime import Runtime

    class Unreadable:
        def __iter__(self):  # type: ignore[no-untyped-def]
            raise RuntimeError("profiler results already freed")

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    unwritable = Runtime(Config(report_dir=str(blocker / "report"), keep_raw_events=True))
    unwritable._keep_raw(_gpu_window(), 10)
    unwritable._keep_raw(_gpu_window(), 20)
    unreadable = Runtime(Config(report_dir=str(tmp_path / "report"), keep_raw_events=True))
    unreadable._keep_raw(Unreadable(), 10)
    unreadable._keep_raw(Unreadable(), 20)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    assert "cannot keep the raw profiler events in" in lines[0] and str(blocker) in lines[0]
    assert lines[1].endswith("RuntimeError: profiler results already freed"), lines[1]
    # and where it can, it does
    Runtime(Config(report_dir=str(tmp_path / "ok"), keep_raw_events=True))._keep_raw(_gpu_window(), 10)
    meta, _ = rawevents.load((tmp_path / "ok" / "raw" / "10" / "rank0.msgpack").read_bytes())
    assert meta["n"] == len(_gpu_window())


def test_differences_allow_the_rounding_of_the_inputs_and_nothing_more() -> None:
    """A summary rebuilt from kept events takes the sent summary's rounded step and GC times as inputs,
    so its numbers may move in the last places; anything beyond that, or any other change, is named."""
    sent = {"phases": {"host_gap": 18.0561, "gc": 0.0}, "functions": [{"name": "aten::mm", "count": 3}],
            "rank": 0}
    assert rawevents.differences({**sent, "phases": {"host_gap": 18.056, "gc": 0.0}}, sent) == []
    assert rawevents.differences({**sent, "phases": {"host_gap": 18.066, "gc": 0.0}}, sent) == [
        "phases.host_gap (18.066 vs 18.0561)"]
    assert rawevents.differences({**sent, "functions": [{"name": "aten::bmm", "count": 3}]}, sent) == [
        "functions[0].name ('aten::bmm' vs 'aten::mm')"]
    assert rawevents.differences({**sent, "functions": []}, sent) == ["functions (length 0 vs 1)"]
    assert rawevents.differences({"phases": sent["phases"], "functions": sent["functions"]}, sent) == ["rank"]


PIPELINE = Path(__file__).resolve().parent / "data" / "summary" / "pipeline"


def test_a_pipeline_stages_wait_for_its_sends_is_comm_and_every_rank_names_its_whole_step() -> None:
    """A pipeline-parallel job's send is recorded on the calling thread from its start inside the
    micro-batch's ``Forward N`` range to its completion, after that range ended; the stage then waits
    for it outside any op. The builder counted that tail as a main-thread op (it was in no phase) and
    not as a gap: the first stage's ranks, waiting on a straggler in the second, lost 37 ms of their
    82 ms step from every phase, and the diagnosis saw one victim instead of three.

    Fixture: ``EROICA_BENCH_FAULT=compute:rank=2:start=8:ms=40 EROICA_KEEP_RAW_EVENTS=1 eroica-run
    --nproc-per-node 4 --capture-at-steps 20 --no-baseline scripts/faultlib/train_pipeline.py --steps 26``
    (2 stages x 2 FSDP2 replicas; rank 2 is the second stage's first replica): the capture and every
    rank's raw events."""
    from eroica_runtime.engine import diagnose
    from eroica_runtime.summary.schema import decode_capture

    _, sent, errors = decode_capture((PIPELINE / "capture-20.msgpack").read_bytes())
    assert not errors and sorted(s["rank"] for s in sent) == [0, 1, 2, 3]
    rebuilt = []
    for s in sorted(sent, key=lambda s: s["rank"]):
        _, events = rawevents.load((PIPELINE / f"raw-20-rank{s['rank']}.msgpack").read_bytes())
        again, _ = rawevents.rebuild(s, events)
        p = again["phases"]
        named = sum(p[k] for k in summary.OWN_WORK_PHASES) + p["comm"]
        assert abs(named - p["step"]) < 0.02 * p["step"], (s["rank"], p)
        rebuilt.append(again)
    first_stage = [r["phases"]["comm"] for r in rebuilt[:2]]
    assert min(first_stage) > 0.5 * rebuilt[0]["phases"]["step"], first_stage   # they waited on rank 2
    f = diagnose(rebuilt, step=20, trigger="manual", world_size=4).findings[0]
    assert (f.rank, f.category) == (2, "compute") and f.evidence["peers"] == {"source": "groups", "size": 2}
    assert set(f.victims) == {0, 1, 3}, f.victims


CLOSURE = Path(__file__).resolve().parent / "data" / "summary" / "closure-last-step"


def test_a_victims_wait_in_the_windows_last_step_is_comm_when_the_profiler_stopped_before_its_collectives_record_closed() -> None:
    """With gloo the training thread only launches a collective (``c10d::allreduce_``); its life is
    recorded on a worker thread, whose record closes a little after the training thread was released.
    In a loop that ends its step right after the all-reduce (``optimizer.step(closure)``, as PyTorch
    Lightning runs it) the profiler stopped in between on rank 3: its last step's 70 ms wait for the
    straggler had no collective in flight, was booked as host time outside any op, and rank 3 dropped
    out of the victims. The launch is now in flight until its step's end.

    Fixture: ``tests/test_diagnosis_e2e.py::test_closure_optimizer_loop_names_the_culprit_and_its_victims``
    (rank 1's dataset slow from step 40) with ``EROICA_KEEP_RAW_EVENTS=1`` under torch 2.11, in a run where
    it failed (1 run in 4 there): the capture at step 48 and every rank's raw events."""
    from eroica_runtime.engine import diagnose
    from eroica_runtime.summary.schema import decode_capture

    _, sent, errors = decode_capture((CLOSURE / "capture-48.msgpack").read_bytes())
    assert not errors and sorted(s["rank"] for s in sent) == [0, 1, 2, 3]
    by_rank = {s["rank"]: s for s in sent}
    assert [r["comm"] for r in by_rank[3]["steps"]][-1] < 1.0         # what the capture said: no wait
    rebuilt = []
    for rank in range(4):
        _, events = rawevents.load((CLOSURE / f"raw-48-rank{rank}.msgpack").read_bytes())
        again, _ = rawevents.rebuild(by_rank[rank], events)
        rebuilt.append(again)
    waits = [r["comm"] for r in rebuilt[3]["steps"]]
    assert min(waits) > 0.8 * max(waits), waits                      # every step of the victim waited
    assert rebuilt[3]["phases"]["host_gap"] < 0.1 * rebuilt[3]["phases"]["comm"], rebuilt[3]["phases"]
    for r in (0, 2):   # the other victims had their records: unchanged
        assert rebuilt[r]["phases"]["comm"] == pytest.approx(by_rank[r]["phases"]["comm"], abs=0.01)
    f = diagnose(rebuilt, step=48, trigger="manual", world_size=4).findings[0]
    assert (f.rank, f.category) == (1, "dataloader")
    assert set(f.victims) == {0, 2, 3}, f.victims
