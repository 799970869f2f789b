"""summary.build from real torch.profiler events (single process), synthetic GPU timelines, and the codec."""

from __future__ import annotations

import copy
import socket
import time
import warnings
from typing import Any

import msgpack
import pytest
import torch
from torch.profiler import ProfilerActivity, profile, schedule

from eroica_runtime import summary
from eroica_runtime.summary import SummaryError

IDENTITY = {"rank": 3, "local_rank": 1, "world_size": 8, "pid": 1234, "host": socket.gethostname(),
            "device": {"index": None, "uuid": None, "name": None}, "groups": [],
            "versions": {"eroica": "test", "torch": torch.__version__}}
TELEMETRY = {"start": {"host": {"cpu_s": 1.0}, "gpu": None}, "end": {"host": {"cpu_s": 2.0}, "gpu": None}}


def _profile(step_fn: Any, k: int, raw: bool = False) -> Any:
    """Profile k steps the way capture.py does: start at a boundary, step() inside, stop after k."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prof = profile(activities=[ProfilerActivity.CPU], record_shapes=False, with_stack=False,
                       schedule=schedule(wait=0, warmup=0, active=k))
        prof.start()
        for i in range(k):
            step_fn()
            if i < k - 1:
                prof.step()
        prof.stop()
    return prof.profiler.kineto_results.events() if raw else prof.events()


def _build(events: Any, k: int, **kw: Any) -> dict[str, Any]:
    return summary.build(events, identity=IDENTITY, capture={"step": 10, "trigger": "test", "k": k},
                         steps=[{"step": 10 + i, "ms": 5.0} for i in range(k)], gc={"count": 0, "ms": 0.0},
                         telemetry=TELEMETRY, **kw)


@pytest.fixture(scope="module")
def mlp_events() -> Any:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ds = torch.utils.data.TensorDataset(torch.randn(1024, 256), torch.randint(0, 10, (1024,)))
    it = iter(torch.utils.data.DataLoader(ds, batch_size=32))

    def step() -> None:
        x, y = next(it)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    step()
    return _profile(step, 3)


@pytest.fixture(scope="module")
def transformer_events() -> Any:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=256, batch_first=True)
    model = torch.nn.Sequential(torch.nn.Embedding(1000, 128),
                                torch.nn.TransformerEncoder(layer, num_layers=12, enable_nested_tensor=False),
                                torch.nn.Linear(128, 1000))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 1000, (4, 32))

    def step() -> None:
        logits = model(tokens)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 1000), tokens.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    step()
    return _profile(step, 2)


def test_build_from_real_profile(mlp_events: Any) -> None:
    doc = _build(mlp_events, 3)
    summary.validate(doc)
    ph = doc["phases"]
    assert doc["profile"]["step_source"] == "profiler" and doc["profile"]["steps"] == 3
    for p in ("data", "forward", "backward", "optimizer"):
        assert ph[p] > 0, (p, ph)
    assert ph["comm"] == 0 and ph["comm_total"] == 0 and ph["overlap"] == 0
    assert "device_phases" not in doc  # CPU only
    # the timeline partitions the step exactly (no gc here)
    assert summary.own_work_ms(doc) + ph["comm"] == pytest.approx(ph["step"], rel=0.02, abs=0.05), \
        (ph, doc["profile"])
    kinds = {(f["kind"], f["phase"]) for f in doc["functions"]}
    for pair in (("dataloader", "data"), ("optimizer", "optimizer"), ("cpu_op", "backward"), ("cpu_op", "forward")):
        assert pair in kinds, (pair, sorted(kinds), doc["profile"])
    for f in doc["functions"]:
        assert f["kind"] in summary.KINDS and f["phase"] in summary.FUNCTION_PHASES
        assert 0 <= f["p50"] <= f["p90"] <= f["p99"] <= f["max"] + 1e-9, f
        assert not f["name"].startswith("ProfilerStep")
    assert doc["rank"] == 3 and doc["host"] == IDENTITY["host"] and doc["capture"]["k"] == 3


def test_closure_optimizer_step_keeps_forward_and_backward_phases() -> None:
    """optimizer.step(closure) (Lightning, LBFGS): the forward inside the step is forward, not optimizer."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss

    def step() -> None:
        opt.step(closure)

    step()
    doc = _build(_profile(step, 3), 3)
    ph = doc["phases"]
    assert ph["forward"] > 0 and ph["backward"] > 0, ph
    # by what ran where, not by how long (a sub-millisecond model on a loaded box: one preemption in
    # the optimizer's few ops outweighs the rest): the model's matmuls are forward and backward work
    fns = {(f["name"], f["phase"]) for f in doc["functions"]}
    assert ("aten::linear", "forward") in fns and ("aten::linear", "optimizer") not in fns, sorted(fns)
    matmuls = {p for n, p in fns if n in ("aten::addmm", "aten::mm")}
    assert matmuls and matmuls <= {"forward", "backward"}, sorted(fns)


def test_gradient_accumulation_keeps_each_micro_batchs_forward_forward() -> None:
    """4 micro-batches a step: the forwards between backward passes are forward work, not backward."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = torch.randn(128, 128)
    batches = [(torch.randn(32, 256), torch.randint(0, 10, (32,))) for _ in range(4)]

    def step() -> None:
        opt.zero_grad()
        for x, y in batches:
            torch.tanh(w @ w)      # the micro-batch's own preparation, before its forward
            loss = torch.nn.functional.cross_entropy(model(x), y) / 4
            loss.backward()
        opt.step()

    step()
    doc = _build(_profile(step, 3), 3)
    fns = {(f["name"], f["phase"]) for f in doc["functions"]}
    assert ("aten::linear", "forward") in fns and ("aten::linear", "backward") not in fns, sorted(fns)
    assert ("aten::tanh", "forward") in fns and ("aten::tanh", "backward") not in fns, sorted(fns)
    assert ("autograd::engine::evaluate_function: AddmmBackward0", "backward") in fns, sorted(fns)
    # every micro-batch's forward counted as forward: the model's forward ops took their three
    # later micro-batches' share, not one in four (backward costs about twice the forward here)
    linear = [f for f in doc["functions"] if f["name"] == "aten::linear"]
    assert linear and all(f["count"] == 8 for f in linear), linear


def test_raw_kineto_events_give_the_same_summary() -> None:
    """capture.py may pass prof.profiler.kineto_results.events() (much cheaper than prof.events())."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 64)

    def step() -> None:
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()

    step()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prof = profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=0, active=2))
        prof.start()
        step()
        prof.step()
        step()
        prof.stop()
    a = _build(prof.events(), 2)
    b = _build(prof.profiler.kineto_results.events(), 2)
    for phase, value in a["phases"].items():
        assert b["phases"][phase] == pytest.approx(value, rel=1e-3, abs=1e-3), phase
    fa = {(f["name"], f["kind"], f["phase"]): f for f in a["functions"]}
    fb = {(f["name"], f["kind"], f["phase"]): f for f in b["functions"]}
    assert fa.keys() == fb.keys()
    for key, f in fa.items():
        assert fb[key]["count"] == f["count"] and fb[key]["ms"] == pytest.approx(f["ms"], rel=1e-3, abs=1e-3)


def test_transformer_summary_fits_16k(transformer_events: Any) -> None:
    doc = _build(transformer_events, 2)
    data = summary.encode(doc)
    assert len(data) <= 16 * 1024, len(data)
    assert len(doc["functions"]) <= summary.MAX_FUNCTIONS + 1
    assert doc["functions"][-1]["name"] == summary.OTHER  # a 12-layer model has > 64 (name, phase) pairs
    # clip_grad_norm_ after backward lands in the optimizer phase, attention in forward and backward
    assert doc["phases"]["optimizer"] > 0 and doc["phases"]["backward"] > 0 and doc["phases"]["forward"] > 0
    names = {(f["name"], f["phase"]) for f in doc["functions"]}
    assert ("Optimizer.step#AdamW.step", "optimizer") in names


def test_top_n_and_other_bucket_conserve_totals(transformer_events: Any) -> None:
    full = _build(transformer_events, 2, max_functions=10_000, size_budget=1 << 30)
    assert all(f["name"] != summary.OTHER for f in full["functions"])
    top = _build(transformer_events, 2, max_functions=5)
    assert len(top["functions"]) == 6 and top["functions"][-1]["name"] == summary.OTHER
    assert [f["name"] for f in top["functions"][:5]] == [f["name"] for f in full["functions"][:5]]
    total = sum(f["ms"] for f in full["functions"])
    assert sum(f["ms"] for f in top["functions"]) == pytest.approx(total, rel=1e-3)
    assert sum(f["count"] for f in top["functions"]) == pytest.approx(sum(f["count"] for f in full["functions"]))
    ranked = [f["ms"] for f in full["functions"]]
    assert ranked == sorted(ranked, reverse=True)


def test_size_budget_shrinks_function_list(transformer_events: Any) -> None:
    doc = _build(transformer_events, 2, size_budget=4096)
    assert len(summary.encode(doc)) <= 4096
    assert doc["functions"][-1]["name"] == summary.OTHER


def test_round_trip_and_decode_errors(mlp_events: Any) -> None:
    doc = _build(mlp_events, 3)
    data = summary.encode(doc)
    back = summary.decode(data, origin="rank 3")
    assert back["phases"] == doc["phases"] and back["functions"] == doc["functions"]
    with pytest.raises(SummaryError, match="rank 5.*not valid msgpack"):
        summary.decode(b"\xc1garbage", origin="rank 5")
    with pytest.raises(SummaryError, match="rank 5"):
        summary.decode(data[: len(data) // 2], origin="rank 5")
    with pytest.raises(SummaryError, match="rank 6.*exceeds"):
        summary.decode(data, origin="rank 6", max_bytes=len(data) - 1)
    foreign = copy.deepcopy(doc)
    foreign["schema"] = "eroica.summary/2"
    with pytest.raises(SummaryError, match="rank 7.*unsupported schema"):
        summary.decode(msgpack.packb(foreign, use_bin_type=True), origin="rank 7")
    bad = copy.deepcopy(doc)
    bad["functions"][0]["ms"] = "slow"
    with pytest.raises(SummaryError, match=r"rank 8.*functions\[0\]"):
        summary.decode(msgpack.packb(bad, use_bin_type=True), origin="rank 8")
    with pytest.raises(SummaryError, match="rank 9"):
        summary.decode("not bytes", origin="rank 9")  # type: ignore[arg-type]



def test_step_clock_columns_are_validated(mlp_events: Any) -> None:
    doc = _build(mlp_events, 3)
    doc["steps"][0].update(cpu=4.0, runq=1.5)
    doc["history"] = {"first": 1, "ms": [30.0, 31.0], "cpu": [5.0, 5.1], "runq": [0.5, 0.0]}
    back = summary.decode(summary.encode(doc), origin="rank 3")
    assert back["history"] == doc["history"] and back["steps"][0]["runq"] == 1.5
    for where, breakage in ((r"steps\[0\]\.runq", lambda d: d["steps"][0].update(runq=float("nan"))),
                            ("history needs lists", lambda d: d["history"]["runq"].pop()),
                            (r"history\.cpu\[1\]", lambda d: d["history"]["cpu"].__setitem__(1, -3.0)),
                            ("history.first", lambda d: d["history"].update(first="x"))):
        bad = copy.deepcopy(doc)
        breakage(bad)
        with pytest.raises(SummaryError, match=f"rank 4.*{where}"):
            summary.decode(msgpack.packb(bad, use_bin_type=True), origin="rank 4")


# ------------------------------------------------------------------ synthetic timelines


class _T:
    def __init__(self, start: float, end: float) -> None:
        self.start, self.end = start, end


class _E:
    """A stand-in for FunctionEvent with the fields the builder reads (times in ms here)."""

    def __init__(self, name: str, start_ms: float, end_ms: float, thread: int = 1, device: str = "CPU",
                 annotation: bool = False, corr: int = 0, linked: int = 0, stream: int = 0, scope: int = 0) -> None:
        self.name = self.trace_name = name
        self.time_range = _T(start_ms * 1000, end_ms * 1000)
        self.thread, self.device_type, self.is_user_annotation = thread, device, annotation
        self.id, self.linked_correlation_id = corr, linked
        self.device_index, self.device_resource_id, self.scope = 0, stream, scope


def _gpu_step(with_step: bool = True) -> list[_E]:
    ev = [
        _E("DistributedDataParallel.forward", 0, 20, annotation=True),
        _E("aten::mm", 2, 18, corr=10),
        _E("cudaLaunchKernel", 3, 4, corr=10, linked=10),  # CUPTI ids may collide with op ids
        _E("sm90_xmma_gemm_f16f16_f32", 5, 25, device="CUDA", linked=10, stream=7),
        # the autograd engine runs backward on its device thread while main blocks in backward()
        _E("autograd::engine::evaluate_function: MmBackward0", 22, 50, thread=2),
        _E("MmBackward0", 22, 50, thread=2, scope=1),
        _E("nccl:all_reduce", 40, 41, thread=2),
        _E("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 40, 80,
           device="CUDA", stream=9),
        _E("cudaStreamSynchronize", 60, 85),
        _E("Optimizer.step#AdamW.step", 85, 95, annotation=True),
        _E("aten::copy_", 85.2, 86.5, corr=20),
        _E("cudaMemcpyAsync", 85.5, 86, corr=3, linked=20),
        _E("Memcpy HtoD (Pageable -> Device)", 86, 87, device="CUDA", linked=20, stream=7),
        _E("aten::zero_", 89.8, 90.8, corr=21),
        _E("cudaMemsetAsync", 90, 90.5, corr=4, linked=21),
        _E("Memset (Device)", 91, 91.2, device="CUDA", linked=21, stream=7),
        _E("[memory]", 50, 50),
    ]
    if with_step:
        ev.insert(0, _E("ProfilerStep#7", 0, 100, annotation=True))
    return ev


def test_gpu_paths_synthetic() -> None:
    doc = summary.build(_gpu_step(), identity=IDENTITY, capture={"step": 7, "trigger": "t", "k": 1},
                        steps=[{"step": 7, "ms": 100.0}], gc={"count": 0, "ms": 0.0}, telemetry=TELEMETRY)
    ph = doc["phases"]
    assert ph["step"] == pytest.approx(100)
    assert ph["forward"] == pytest.approx(16)        # DDP.forward's own 4 ms is Python: host_gap
    assert ph["backward"] == pytest.approx(28)       # main blocked while the autograd thread worked
    assert ph["comm"] == pytest.approx(30)           # 50-60 idle + 60-80 synchronize, NCCL running
    assert ph["optimizer"] == pytest.approx(15)      # 80-85 synchronize tail + the optimizer step
    assert ph["host_gap"] == pytest.approx(11)
    assert ph["comm_total"] == pytest.approx(40)
    assert ph["overlap"] == pytest.approx(10)        # NCCL 40-50 under the backward
    by = {(f["name"][:16], f["kind"]): f for f in doc["functions"]}
    assert by[("sm90_xmma_gemm_f", "kernel")]["phase"] == "forward"
    assert by[("ncclDevKernel_Al", "collective")]["phase"] == "comm"
    assert by[("Memcpy HtoD (Pag", "memcpy")]["phase"] == "optimizer"
    assert by[("Memset (Device)", "memset")]["phase"] == "optimizer"
    assert by[("nccl:all_reduce", "collective")]["phase"] == "comm"
    assert all(len(f["name"]) <= summary.NAME_LIMIT for f in doc["functions"])
    dev = doc["device_phases"]  # the device timeline: kernels 5-25, NCCL 40-80, copies 86-87 and 91-91.2
    assert dev["compute"] == pytest.approx(20) and dev["comm"] == pytest.approx(40)
    assert dev["transfer"] == pytest.approx(1.2) and dev["htod_ms"] == pytest.approx(1)
    assert dev["htod_pageable_ms"] == pytest.approx(1)
    assert dev["comm_exposed"] == pytest.approx(40) and dev["idle"] == pytest.approx(38.8)
    assert dev["forward"] == pytest.approx(20) and dev["optimizer"] == 0 and dev["backward"] == 0
    assert by[("sm90_xmma_gemm_f", "kernel")]["launcher"] == "aten::mm"
    assert by[("Memcpy HtoD (Pag", "memcpy")]["launcher"] == "aten::copy_"


def test_a_gloo_collective_on_cuda_tensors_is_the_devices_wait_where_the_device_runs_none() -> None:
    """gloo on CUDA tensors (the GPU bench's 4 ranks on one GPU, where NCCL refuses two ranks): no
    collective runs on the device, the host reduces between copies. The device's wait is then the
    host's wait for its collective while the device ran nothing (50-80 here, as the host's comm);
    counted as idle, every rank's own work on the device was its whole step. Synthetic events in the
    shapes of the NCCL step above; what a real GPU records is scripts/gpu-check's to show (issue 11)."""
    events = [e for e in _gpu_step() if not e.name.startswith(("nccl", "ncclDevKernel"))]
    events.append(_E("gloo:all_reduce", 40, 80, thread=3))
    doc = summary.build(events, identity=IDENTITY, capture={"step": 7, "trigger": "t", "k": 1},
                        steps=[{"step": 7, "ms": 100.0}], gc={"count": 0, "ms": 0.0}, telemetry=TELEMETRY)
    assert doc["phases"]["comm"] == pytest.approx(30)   # 50-60 idle + 60-80 synchronize, gloo in flight
    dev = doc["device_phases"]
    assert dev["comm"] == 0 and dev["compute"] == pytest.approx(20)
    assert dev["comm_exposed"] == pytest.approx(30) and dev["idle"] == pytest.approx(78.8)


def test_device_annotations_are_not_kernels_and_take_no_device_time() -> None:
    """On a GPU every record_function range has a device-side copy (ProfilerStep#N,
    DistributedDataParallel.forward, Optimizer.step#..., nccl:all_reduce): annotations, never kernels."""
    events = _gpu_step() + [
        _E("ProfilerStep#7", 0, 100, device="CUDA", annotation=True, stream=7),
        _E("DistributedDataParallel.forward", 1, 30, device="CUDA", annotation=True, stream=7),
        _E("nccl:all_reduce", 39, 81, device="CUDA", annotation=True, stream=9),
    ]
    doc = summary.build(events, identity=IDENTITY, capture={"step": 7, "trigger": "t", "k": 1},
                        steps=[{"step": 7, "ms": 100.0}], gc={"count": 0, "ms": 0.0}, telemetry=TELEMETRY)
    dev = doc["device_phases"]
    assert dev["compute"] == pytest.approx(20) and dev["comm"] == pytest.approx(40)
    assert dev["idle"] == pytest.approx(38.8)
    kernels = [f["name"] for f in doc["functions"] if f["kind"] in ("kernel", "collective")]
    assert "DistributedDataParallel.forward" not in kernels and "ProfilerStep#7" not in kernels
    assert doc["phases"]["comm"] == pytest.approx(30)     # the host view is unchanged by them


def _lagged_window(raw: bool) -> list[Any]:
    """A window (step 5, 30-60 ms) whose host ran ahead of its GPU: the lead-in step's GEMM still ran
    when step 5 began, and step 5's last kernel ran on after it closed."""
    from test_rawevents import _Kineto

    def ev(name: str, start: float, end: float, gpu: bool = False, **kw: Any) -> Any:
        if raw:
            return _Kineto(name, "CUDA" if gpu else "CPU", int(start * 1e6), int(end * 1e6),
                           is_user_annotation=kw.get("annotation", False),
                           correlation_id=kw.get("corr", 0), linked_correlation_id=kw.get("linked", 0))
        return _E(name, start, end, device="CUDA" if gpu else "CPU", stream=7 if gpu else 0, **kw)

    return [ev("ProfilerStep#4", 0, 30, annotation=True),                  # the lead-in step
            ev("aten::mm", 20, 22, corr=1),
            ev("gemm_a", 25, 40, gpu=True, corr=2, linked=1),              # launched in it, ran 25-40
            ev("ProfilerStep#5", 30, 60, annotation=True),
            ev("aten::mm", 50, 52, corr=3),
            ev("gemm_b", 55, 70, gpu=True, corr=4, linked=3),              # ran 55-70
            ev("gemm_c", 62, 66, gpu=True, corr=5, linked=3)]              # wholly after the step


@pytest.mark.parametrize("raw", [True, False], ids=["raw kineto events", "FunctionEvents"])
def test_a_window_counts_the_device_work_that_ran_during_its_steps(raw: bool) -> None:
    """The device runs behind the host (a step or more on an asynchronous NCCL job, furthest on the rank
    whose GPU is slowest). The live capture records the device from its lead-in step on: a kernel the
    lead-in launched that was still running when the window began is the window's device work, and
    one launched in the window that ran only after its last step is the next step's. Read either way
    the same (a chrome trace too: tests/test_traces.py)."""
    doc = summary.build(_lagged_window(raw), identity=IDENTITY, capture={"step": 5, "trigger": "t", "k": 1},
                        steps=[{"step": 5, "ms": 30.0}], gc={"count": 0, "ms": 0.0}, telemetry=TELEMETRY)
    dev = doc["device_phases"]
    assert dev["compute"] == pytest.approx(15)          # 30-40 of gemm_a, 55-60 of gemm_b
    assert dev["idle"] == pytest.approx(15)
    rows = {f["name"]: f for f in doc["functions"] if f["kind"] == "kernel"}
    assert set(rows) == {"gemm_a", "gemm_b"}, rows
    assert rows["gemm_a"]["ms"] == pytest.approx(15) and rows["gemm_b"]["launcher"] == "aten::mm"


def _lead_in_kernels(raw: bool) -> list[Any]:
    """A window (step 5, 30-60 ms) whose first milliseconds on the device are the lead-in step's
    backward GEMM (launched at 20 by an op the capture did not record: host collection is off in the
    lead-in). Every step launches the same GEMM kernel twice, from forward (aten::addmm) and from
    backward (aten::mm on the autograd thread); step 5 also launches one with no op around its call."""
    from test_rawevents import _Kineto

    def ev(name: str, start: float, end: float, gpu: bool = False, thread: int = 1, **kw: Any) -> Any:
        if raw:
            return _Kineto(name, "CUDA" if gpu else "CPU", int(start * 1e6), int(end * 1e6),
                           start_thread_id=10 + thread, is_user_annotation=kw.get("annotation", False),
                           correlation_id=kw.get("corr", 0), linked_correlation_id=kw.get("linked", 0))
        return _E(name, start, end, thread=thread, device="CUDA" if gpu else "CPU", stream=7 if gpu else 0, **kw)

    return [ev("ProfilerStep#4", 0, 30, annotation=True),                       # the lead-in step
            ev("cudaLaunchKernel", 20, 20.1, corr=101, linked=1),
            ev("gemm", 28, 36, gpu=True, corr=101, linked=1),                   # its backward GEMM
            ev("ProfilerStep#5", 30, 60, annotation=True),
            ev("aten::addmm", 31, 33, corr=3),
            ev("cudaLaunchKernel", 31.5, 31.6, corr=103, linked=3),
            ev("gemm", 36, 40, gpu=True, corr=103, linked=3),
            ev("autograd::engine::evaluate_function: MmBackward0", 40, 50, thread=2),
            ev("aten::mm", 41, 43, thread=2, corr=4),
            ev("cudaLaunchKernel", 41.5, 41.6, thread=2, corr=104, linked=4),
            ev("gemm", 44, 52, gpu=True, corr=104, linked=4),
            ev("cudaLaunchKernel", 52, 52.1, corr=105, linked=9),               # no op recorded around it
            ev("gemm", 53, 54, gpu=True, corr=105, linked=9)]


@pytest.mark.parametrize("raw", [True, False], ids=["raw kineto events", "FunctionEvents"])
def test_device_work_the_lead_in_launched_takes_its_first_step_counterparts_launcher(raw: bool) -> None:
    """The lead-in's GEMM (still running when step 5 began) was launched by no op the window recorded.
    Each step launches the same sequence, and the device runs a stream in launch order: it is the tail
    of the step before, so it takes the launcher and phase of the last GEMM of step 5 (backward,
    aten::mm), not no phase at all. The GEMM step 5 launched with no op around it stays unattributed."""
    doc = summary.build(_lead_in_kernels(raw), identity=IDENTITY, capture={"step": 5, "trigger": "t", "k": 1},
                        steps=[{"step": 5, "ms": 30.0}], gc={"count": 0, "ms": 0.0}, telemetry=TELEMETRY)
    rows = {f["phase"]: f for f in doc["functions"] if f["name"] == "gemm"}
    assert set(rows) == {"forward", "backward", "other"}, doc["functions"]
    assert rows["forward"]["launcher"] == "aten::addmm" and rows["forward"]["count"] == 1
    assert rows["backward"]["launcher"] == "aten::mm" and rows["backward"]["count"] == 2
    assert "launcher" not in rows["other"] and rows["other"]["count"] == 1
    dev = doc["device_phases"]
    assert dev["compute"] == pytest.approx(6 + 4 + 8 + 1)
    assert dev["forward"] == pytest.approx(4) and dev["backward"] == pytest.approx(6 + 8)


def test_kernels_get_their_own_share_of_the_function_budget() -> None:
    """Thousands of short kernels must not all fold into <other> behind the host ops."""
    events = _gpu_step()
    for i in range(200):   # 200 distinct host ops, each longer than any kernel below
        events.append(_E(f"aten::op{i}", 26 + i * 0.1, 26 + i * 0.1 + 0.09, corr=1000 + i))
    for i in range(40):
        events.append(_E(f"kernel_{i}", 26 + i * 0.2, 26 + i * 0.2 + 0.01, device="CUDA", linked=1000 + i, stream=7))
    doc = summary.build(events, identity=IDENTITY, capture={"step": 7, "trigger": "t", "k": 1},
                        steps=[{"step": 7, "ms": 100.0}], gc={"count": 0, "ms": 0.0}, telemetry=TELEMETRY,
                        max_functions=32)
    names = [f["name"] for f in doc["functions"] if f["name"] != summary.OTHER]
    device = [n for n in names if n.startswith(("kernel_", "sm90", "ncclDev", "Memcpy", "Memset"))]
    assert len(names) == 32 and len(device) == 8      # a quarter of the budget


@pytest.mark.parametrize("name,direction,pageable", [
    ("Memcpy HtoD (Pageable -> Device)", "HtoD", True), ("Memcpy HtoD (Pinned -> Device)", "HtoD", False),
    ("Memcpy DtoH (Device -> Pageable)", "DtoH", True), ("Memcpy DtoH (Device -> Pinned)", "DtoH", False),
    ("Memcpy DtoD (Device -> Device)", "DtoD", False), ("Memcpy PtoP (Device -> Device)", "PtoP", False),
    ("Memcpy HtoD", "HtoD", False), ("cudaMemcpyAsync", None, False)])
def test_device_copies_are_classified_by_direction_and_host_memory(name: str, direction, pageable: bool) -> None:
    from eroica_runtime.summary.events import copy_bytes, parse_copy

    assert parse_copy(name) == (direction, pageable)
    assert copy_bytes('"device": 0, "context": 1, "stream": 7, "correlation": 64014, "bytes": 4000') == 4000
    assert copy_bytes("") == 0


def test_without_step_annotations_uses_window_and_step_count() -> None:
    doc = summary.build(_gpu_step(with_step=False), identity=IDENTITY,
                        capture={"step": 7, "trigger": "t", "k": 2},
                        steps=[{"step": 7, "ms": 50.0}, {"step": 8, "ms": 50.0}],
                        gc={"count": 1, "ms": 0.5}, telemetry=TELEMETRY, main_tid=1)
    assert doc["profile"]["step_source"] == "window" and doc["profile"]["steps"] == 2
    assert doc["phases"]["step"] == pytest.approx(50.0)
    assert doc["phases"]["comm"] > 0 and doc["phases"]["gc"] == 0.5


def test_empty_window_is_still_a_valid_summary() -> None:
    doc = summary.build([], identity=IDENTITY, capture={"step": 1, "trigger": "t", "k": 3}, steps=[],
                        gc={"count": 0, "ms": 0.0}, telemetry=TELEMETRY)
    summary.validate(doc)
    assert doc["functions"] == [] and doc["phases"]["step"] == 0


def test_stub_step_at_window_edge_is_dropped() -> None:
    """A step() right before stop() opens a near-empty ProfilerStep; it must not count as a step."""
    events = _gpu_step() + [_E("ProfilerStep#8", 100, 100.5, annotation=True), _E("aten::add", 100.1, 100.2)]
    doc = summary.build(events, identity=IDENTITY, capture={"step": 7, "trigger": "t", "k": 1},
                        steps=[{"step": 7, "ms": 100.0}], gc={"count": 0, "ms": 0.0}, telemetry=TELEMETRY)
    assert doc["profile"]["steps"] == 1 and doc["phases"]["step"] == pytest.approx(100)
    assert doc["phases"]["comm"] == pytest.approx(30)
    # a trace's window lists every ProfilerStep it holds, the stub's too: its row goes with it
    doc = summary.build(events, identity=IDENTITY, capture={"step": 7, "trigger": "traces", "k": 2},
                        steps=[{"step": 7, "ms": 100.0}, {"step": 8, "ms": 0.5}], gc={"count": 0, "ms": 0.0},
                        telemetry=TELEMETRY)
    assert doc["profile"]["steps"] == 1 and [row["step"] for row in doc["steps"]] == [7], doc["steps"]


def test_profile_without_schedule_falls_back_to_pseudo_steps() -> None:
    """capture.py without a schedule gives no ProfilerStep annotations: cut at each batch fetch."""
    model = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ds = torch.utils.data.TensorDataset(torch.randn(256, 128), torch.randint(0, 10, (256,)))
    it = iter(torch.utils.data.DataLoader(ds, batch_size=16))

    def step() -> None:
        x, y = next(it)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    step()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                step()
    doc = _build(prof.events(), 3)
    assert doc["profile"]["step_source"] == "window" and doc["profile"]["steps"] == 3
    ph = doc["phases"]
    for p in ("data", "forward", "backward", "optimizer"):
        assert ph[p] > 0, (p, ph)
    fwd = {f["name"] for f in doc["functions"] if f["phase"] == "forward"}
    assert "aten::addmm" in fwd and "aten::cross_entropy_loss" in fwd


def test_build_from_the_capture_module() -> None:
    """The real hand-off: eroica_runtime.capture's window (start, mark at each boundary, stop)."""
    capture_mod = pytest.importorskip("eroica_runtime.capture")
    cap = capture_mod.Capture()
    if not all(hasattr(cap, a) for a in ("start", "mark", "stop")):
        pytest.skip("capture API changed")
    model = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ds = torch.utils.data.TensorDataset(torch.randn(256, 128), torch.randint(0, 10, (256,)))
    it = iter(torch.utils.data.DataLoader(ds, batch_size=16))

    def step() -> None:
        x, y = next(it)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    step()
    k = 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # as the runtime drives it: start one lead-in step before the window, mark every boundary
        cap.start(100, "test", k)
        for i in range(k + 1):
            step()
            if i < k:
                cap.mark()
        events = cap.stop()
    doc = summary.build(events, identity=IDENTITY, capture={"step": 100, "trigger": "test", "k": k},
                        steps=[{"step": 100 + i, "ms": 5.0} for i in range(k)], gc={"count": 0, "ms": 0.0},
                        telemetry=TELEMETRY)
    summary.validate(doc)
    assert doc["profile"]["steps"] == k
    for p in ("data", "forward", "backward", "optimizer"):
        assert doc["phases"][p] > 0, (p, doc["phases"], doc["profile"])
    # the lead-in step is not counted: one optimizer step and one batch per window step
    by_kind = {f["kind"]: f for f in doc["functions"]}
    assert by_kind["optimizer"]["count"] == pytest.approx(1.0, abs=0.34), doc["functions"]
    assert by_kind["dataloader"]["count"] == pytest.approx(1.0, abs=0.34), doc["functions"]


WAIT_MS = 40.0   # eroica's stand-in wait at each boundary of the test below


@pytest.mark.parametrize("marked", [True, False])
def test_eroicas_own_work_at_a_boundary_is_no_phase_of_the_step(marked: bool) -> None:
    """eroica's step boundary runs in an optimizer step post-hook, inside torch's
    ``Optimizer.step#SGD.step`` range: what it does there (its vote, and the wait for the other ranks'
    votes, here a WAIT_MS sleep) must not count as the rank's optimizer work. Driven as the runtime does
    it (capture.own_begin at the boundary, mark, own_end; the close ends the range before stopping).
    Unmarked (``marked=False``, what eroica did before), the same sleep is optimizer time."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from eroica_runtime.capture import Capture

    cap = Capture()
    model = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 128), torch.randint(0, 10, (16,))
    k, boundaries = 3, []

    def boundary(*_: Any) -> None:
        if not cap.active:
            return
        if marked:
            cap.own_begin()
        time.sleep(WAIT_MS / 1e3)
        boundaries.append(len(boundaries))
        if len(boundaries) <= k:
            cap.mark()
            cap.own_end()

    def step() -> None:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    step()
    handle = register_optimizer_step_post_hook(boundary)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cap.start(100, "test", k)
            for _ in range(k + 1):
                step()
            events = cap.stop()
    finally:
        handle.remove()
    doc = summary.build(events, identity=IDENTITY, capture={"step": 100, "trigger": "test", "k": k},
                        steps=[{"step": 100 + i, "ms": 25.0} for i in range(k)], gc={"count": 0, "ms": 0.0},
                        telemetry=TELEMETRY)
    summary.validate(doc)
    ph, own = doc["phases"], doc["profile"].get("eroica_ms")
    names = {f["name"] for f in doc["functions"]}
    if marked:
        # relative to the wait: a preempted SGD step on a loaded machine must not fail it
        assert ph["optimizer"] < 0.25 * WAIT_MS and own is not None and own >= 0.95 * WAIT_MS, (ph, doc["profile"])
        assert sum(ph[p] for p in summary.OWN_WORK_PHASES) + ph["comm"] < ph["step"] - 0.75 * WAIT_MS, ph
        assert "eroica::step_boundary" not in names, names
    else:
        assert ph["optimizer"] >= 0.95 * WAIT_MS and own is None, (ph, doc["profile"])


def test_fast_edge_step_is_kept() -> None:
    """A genuinely fast step next to slow (preempted) ones is a step, not a stub."""
    events = []
    for i, (start, dur) in enumerate([(0, 3), (3, 40), (43, 45)]):
        events.append(_E(f"ProfilerStep#{i}", start, start + dur, annotation=True))
        for j in range(10):
            t = start + dur * j / 10
            events.append(_E("aten::mm", t, t + dur / 20))
    doc = summary.build(events, identity=IDENTITY, capture={"step": 0, "trigger": "t", "k": 3}, steps=[],
                        gc={"count": 0, "ms": 0.0}, telemetry=TELEMETRY)
    assert doc["profile"]["steps"] == 3


def test_long_kernel_names_and_gpu_telemetry_stay_within_budget() -> None:
    """Worst case for size: hundreds of distinct long CUDA kernel names plus a full NVML block."""
    events: list[_E] = [_E("ProfilerStep#1", 0, 1000, annotation=True)]
    for i in range(300):
        events.append(_E(f"aten::op{i}", i * 3, i * 3 + 2, corr=i + 1))
        events.append(_E("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_" + "x" * 200 + str(i) + ">(Params)",
                         i * 3 + 0.5, i * 3 + 1 + (i % 7), device="CUDA", linked=i + 1, stream=7))
    gpu = dict.fromkeys(("sm_mhz", "sm_max_mhz", "mem_mhz", "mem_max_mhz", "temp_c", "power_w", "power_limit_w",
                         "pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max", "nvlink_crc", "nvlink_replay",
                         "ecc_corrected", "ecc_uncorrected"), 1234.5678)
    gpu["throttle"] = ["sw_power_cap", "hw_thermal"]
    tel = {"start": {"host": TELEMETRY["start"]["host"], "gpu": gpu}, "end": {"host": TELEMETRY["end"]["host"], "gpu": gpu}}
    doc = summary.build(events, identity=IDENTITY, capture={"step": 1, "trigger": "t", "k": 1},
                        steps=[{"step": 1, "ms": 1000.0}], gc={"count": 0, "ms": 0.0}, telemetry=tel)
    assert len(summary.encode(doc)) <= summary.SIZE_BUDGET
    assert doc["functions"][-1]["name"] == summary.OTHER
    assert all(len(f["name"]) <= summary.NAME_LIMIT for f in doc["functions"])
    assert doc["device_phases"]["forward"] > 0
