"""The engine on a device timeline (GPU jobs), on synthetic summaries: pure logic only.

On a GPU the host runs ahead, so the host phases of a GPU straggler and of its victims look alike;
the device timeline tells them apart (the culprit's kernels grew, its peers' NCCL kernels spun).
These summaries are written by hand with the shapes the builder produces (device_phases, kernel
rows with their launching op); that the builder produces them on a real GPU is scripts/gpu-check's
job, on the GPU machine.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from eroica_runtime.engine import diagnose

DATA = Path(__file__).parent / "data" / "engine"
BASE = json.loads((DATA / "summary_gpu_rank0.json").read_text())


def _rank(rank: int, *, compute: float = 13.0, exposed: float = 27.0, transfer: float = 0.5,
          gemm: float = 9.0, gemm_calls: int = 40, htod_mb: float = 4.0, pageable_mb: float = 0.0,
          data: float = 0.2) -> dict:
    s = copy.deepcopy(BASE)
    s["rank"], s["world_size"], s["host"] = rank, 4, f"gpu-host{rank // 2}"
    step = 45.0
    # the host view: every rank's host ran ahead and blocked in a synchronize while NCCL ran,
    # so its phases say "communication wait" on culprit and victims alike
    s["phases"] = {"step": step, "data": data, "forward": 2.0, "backward": 3.0, "optimizer": 1.0, "comm": 36.0,
                   "comm_total": 40.0, "host_gap": 2.8, "gc": 0.0, "io": 0.0, "overlap": 4.0}
    s["steps"] = [{"step": 100 + i, "ms": step} for i in range(3)]
    s["device_phases"] = {"busy": compute + transfer + exposed, "compute": compute, "comm": exposed + 2.0,
                          "comm_exposed": exposed, "transfer": transfer,
                          "idle": max(step - compute - transfer - exposed, 0.0),
                          "forward": compute * 0.4, "backward": compute * 0.5, "optimizer": compute * 0.1,
                          "htod_ms": transfer, "htod_mb": htod_mb, "htod_pageable_mb": pageable_mb,
                          "htod_pageable_ms": transfer if pageable_mb else 0.0}
    s["functions"] = [
        {"name": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", "kind": "kernel", "phase": "forward",
         "launcher": "aten::mm", "count": gemm_calls, "ms": gemm, "mean": gemm / gemm_calls,
         "p50": gemm / gemm_calls, "p90": gemm / gemm_calls, "p99": gemm / gemm_calls, "max": gemm / gemm_calls,
         "std": 0.0},
        {"name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "kind": "collective", "phase": "comm", "count": 1,
         "ms": exposed + 2, "mean": exposed + 2, "p50": exposed + 2, "p90": exposed + 2, "p99": exposed + 2,
         "max": exposed + 2, "std": 0.0},
        {"name": "Memcpy HtoD (Pageable -> Device)" if pageable_mb else "Memcpy HtoD (Pinned -> Device)",
         "kind": "memcpy", "phase": "forward", "launcher": "aten::copy_", "count": 1, "ms": transfer,
         "mean": transfer, "p50": transfer, "p90": transfer, "p99": transfer, "max": transfer, "std": 0.0},
        {"name": "aten::mm", "kind": "cpu_op", "phase": "forward", "count": 40, "ms": 1.0, "mean": 0.025,
         "p50": 0.025, "p90": 0.025, "p99": 0.025, "max": 0.025, "std": 0.0},
    ]
    return s


def _diagnose(summaries: list[dict]):  # type: ignore[no-untyped-def]
    return diagnose(summaries, step=100, trigger="spike", world_size=4)


def test_gpu_straggler_is_named_from_the_device_timeline_not_communication() -> None:
    ranks = [_rank(r) for r in range(4)]
    # 120 extra GEMMs: its peers' NCCL kernels spin
    ranks[2] = _rank(2, compute=40.0, exposed=1.0, gemm=36.0, gemm_calls=160)
    d = _diagnose(ranks)
    assert [f.category for f in d.findings] == ["compute"], [f.title for f in d.findings]
    top = d.findings[0]
    assert top.rank == 2 and sorted(top.victims) == [0, 1, 3]
    assert top.function == "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"
    assert top.evidence["compared_on"] == "device"
    assert top.impact_ms_per_step > 20
    # more launches of the kernel: this rank does more work; its GPU is not to blame
    assert top.evidence["work"] == "more" and top.evidence["calls"] == [160.0, 40.0]
    assert "160 times a step" in top.action and "drain" not in top.action


def test_on_one_shared_gpu_the_rank_that_launched_the_extra_kernels_is_named_not_a_job_wide_slowdown() -> None:
    """Ranks that share a GPU time-slice it: the culprit's 120 extra GEMMs make its peers' 40 GEMMs each
    ~1.8x longer too, so against the baseline capture every rank's device compute grew (the shape of
    the GPU bench on one H200, issue 11 item 5). The rank that launched more work is the finding, with
    its victims; the peers' slower kernels are no job-wide regression and no hardware problem."""
    base = [_rank(r) for r in range(4)]
    ranks = [_rank(r, compute=20.0, gemm=16.0, exposed=22.0) for r in range(4)]
    ranks[2] = _rank(2, compute=48.0, exposed=1.0, gemm=44.0, gemm_calls=160)
    for s in ranks:
        s["phases"]["step"], s["steps"] = 70.0, [{"step": 100 + i, "ms": 70.0} for i in range(3)]
    d = diagnose(ranks, step=100, trigger="spike", world_size=4, baseline=base)
    assert [(f.rank, f.category) for f in d.findings] == [(2, "compute")], [f.title for f in d.findings]
    top = d.findings[0]
    assert top.function == "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n" and sorted(top.victims) == [0, 1, 3]
    assert top.evidence["work"] == "more" and top.evidence["compared_on"] == "device"


def test_a_throttled_gpu_runs_the_same_kernels_slower_and_keeps_the_hardware_action() -> None:
    ranks = [_rank(r) for r in range(4)]
    ranks[2] = _rank(2, compute=40.0, exposed=1.0, gemm=36.0)     # the same 40 GEMMs, each 4x longer
    gpu = ranks[2]["telemetry"]["end"]["gpu"]
    gpu["sm_mhz"], gpu["throttle"] = 700, ["hw_slowdown"]
    top = _diagnose(ranks).findings[0]
    assert (top.rank, top.category, top.function) == (2, "compute", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n")
    assert top.evidence["work"] == "slower" and top.evidence["calls"] == [40.0, 40.0]
    assert top.evidence["per_call_ms"] == [0.9, 0.225]
    assert top.evidence["hardware_throttle"] == ["hw_slowdown"]
    assert "each slower" in top.action and "throttling" in top.action and "drain the node" in top.action


def test_pageable_copies_are_a_transfer_finding_with_the_pinned_memory_action() -> None:
    ranks = [_rank(r) for r in range(4)]
    ranks[1] = _rank(1, transfer=25.0, exposed=2.0, htod_mb=260.0, pageable_mb=256.0)
    d = _diagnose(ranks)
    top = d.findings[0]
    assert (top.rank, top.category) == (1, "transfer"), [f.title for f in d.findings]
    assert top.function == "Memcpy HtoD (Pageable -> Device)"
    assert top.evidence["htod_pageable_mb"] == [256.0, 0.0]
    assert "pin" in top.action and "PCIe" in top.action


def test_slow_input_on_a_gpu_rank_is_dataloader() -> None:
    ranks = [_rank(r) for r in range(4)]
    ranks[3] = _rank(3, data=26.0, exposed=1.0)     # its device idled while the host read the batch
    d = _diagnose(ranks)
    assert [(f.rank, f.category) for f in d.findings] == [(3, "dataloader")]


def test_healthy_gpu_job_has_no_finding() -> None:
    ranks = [_rank(r, compute=13.0 + 0.3 * r, exposed=27.0 - 0.3 * r) for r in range(4)]
    assert _diagnose(ranks).findings == ()


def test_a_job_without_device_timelines_is_compared_on_the_host_as_before() -> None:
    ranks = [_rank(r) for r in range(4)]
    for s in ranks:
        del s["device_phases"]
    ranks[2]["phases"] = {**ranks[2]["phases"], "forward": 30.0, "comm": 8.0}
    d = _diagnose(ranks)
    assert [(f.rank, f.category) for f in d.findings] == [(2, "compute")]
    assert "compared_on" not in d.findings[0].evidence
