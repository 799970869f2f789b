"""The fault bench (issue 6): plant one real fault per case in a 4-rank DDP job, run it under eroica-run,
and score eroica's report against the planted truth. ``scripts/fault-bench`` is the command line.

Why: eroica's claims (right rank, right host, right category, victims not blamed, nothing on a healthy
job) are only worth what a bench with real faults says, and a miss must show up as a miss.

Per case: detected, culprit rank / category / host right, steps and seconds from the fault's onset to
the printed diagnosis, summary bytes per rank, false findings. Also dormant overhead of eroica vs no
runtime and always-on torch.profiler's overhead and trace volume, from interleaved runs. ``--write-doc``
puts the table into docs/bench-faults.md between ``<!-- fault-bench:begin -->`` and ``:end -->``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eroica_runtime.engine import consolidate
from eroica_runtime.engine.model import Diagnosis
from faultlib import faults, netns

ROOT = Path(__file__).resolve().parent.parent.parent
TRAIN = ROOT / "scripts" / "faultlib" / "train_bench.py"
# The same job under real frameworks' loops (issue 12): their own step structure, same fault planting.
TRAIN_LIGHTNING = ROOT / "scripts" / "faultlib" / "train_lightning.py"
TRAIN_HF = ROOT / "scripts" / "faultlib" / "train_hf.py"
TRAIN_PIPELINE = ROOT / "scripts" / "faultlib" / "train_pipeline.py"
PROFILE_WRAP = ROOT / "scripts" / "faultlib" / "profile_wrap.py"
BIN = Path(sys.executable).parent
EROICA_RUN = str(BIN / "eroica-run") if (BIN / "eroica-run").exists() else "eroica-run"
# 4 ranks share 2 cores: keep MPICH from spinning and torch from oversubscribing (as tests/conftest.py).
RANK_ENV = {"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1", "MPIR_CVAR_POLLS_BEFORE_YIELD": "10",
            "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
INTERMITTENT = "intermittent:on=8:off=12"
DIAG_RE = re.compile(r"eroica: step (\d+) \(([a-z_-]+)\)")
MARK_RE = re.compile(r"\[fault rank (\d+)\] step (\d+): mark (on|off)")


@dataclass
class Case:
    """One bench case: the planted fault and what a correct diagnosis names."""

    name: str
    fault: str  # EROICA_BENCH_FAULT value ('' = none); {rank} {start} {int} are filled in
    categories: tuple[str, ...]  # acceptable categories ('' = expect no finding at all)
    rank: int | None = 1  # culprit rank (None = no culprit rank: every rank / a host)
    needs_netns: bool = False
    link_mbit: float = 0.0  # with a 'mark' fault: the driver rate-limits the culprit's host (both ways)
    link_delay_ms: float = 0.0  # with a 'mark' fault: the driver delays the culprit's host (both ways)
    note: str = ""
    script: Path = TRAIN  # the training job (it must honour EROICA_BENCH_FAULT, --steps and --out)
    needs_modules: tuple[str, ...] = ()  # Python packages the job imports (missing: the case is skipped)
    script_args: tuple[str, ...] = ()  # more flags for the training job (train_bench: --parallel, --compile)
    # at least this many steps whatever --steps says: a case whose capture's summary is still being
    # built (a slower job) leaves no step eroica did not disturb to measure its time lost on
    min_steps: int = 0
    # more culprits planted at once, (rank, accepted categories): the right diagnosis names each of them
    # too (rank_ok), and a finding that does is not a false one
    also: tuple[tuple[int, tuple[str, ...]], ...] = ()

    @property
    def healthy(self) -> bool:
        return self.categories == ("",)


CPU = ("compute", "host")
CASES: list[Case] = [
    Case("healthy-1", "", ("",), None, note="no fault: natural jitter only, expect no finding"),
    Case("healthy-2", "", ("",), None, note="second healthy run"),
    # more healthy runs, so that >= 1,000 healthy steps are judged (issue 12)
    *[Case(f"healthy-{i}", "", ("",), None, note="another healthy run") for i in range(3, 10)],
    Case("compute", "compute:rank={rank}:start={start}:ms=150", ("compute",)),
    Case("compute-int", "compute:rank={rank}:start={start}:ms=150:{int}", ("compute",)),
    Case("throttle", "throttle:rank={rank}:start={start}:quota=0.15", CPU, note="root: cgroup cpu quota"),
    Case("throttle-int", "throttle:rank={rank}:start={start}:quota=0.15:{int}", CPU, note="root"),
    Case("contend", "contend:rank={rank}:start={start}:hogs=2", CPU, note="2 busy processes on the rank's core"),
    Case("contend-int", "contend:rank={rank}:start={start}:hogs=2:{int}", CPU),
    # its 16-step throughput capture (~63-75) is summarised until ~115-120 on 2 shared cores (37k events)
    Case("freeze", "freeze:rank={rank}:start={start}:ms=250:every=1.0", ("host",), note="SIGSTOP 250 ms / s",
         min_steps=180),
    Case("freeze-int", "freeze:rank={rank}:start={start}:ms=250:every=1.0:{int}", ("host",), min_steps=180),
    # a host stall after the all-reduce (the thread off the CPU): its peers wait in the next step's
    Case("stall", "stall:rank={rank}:start={start}:ms=80", ("host",), note="80 ms asleep after its all-reduce"),
    Case("stall-int", "stall:rank={rank}:start={start}:ms=80:{int}", ("host",)),
    Case("data", "data:rank={rank}:start={start}:ms=80", ("dataloader",)),
    Case("data-int", "data:rank={rank}:start={start}:ms=80:{int}", ("dataloader",)),
    Case("gc", "gc:rank={rank}:start={start}", ("gc",)),
    Case("gc-int", "gc:rank={rank}:start={start}:{int}", ("gc",)),
    Case("io", "io:rank={rank}:start={start}:kb=2048:mbps=8", ("io",), note="blkio when root, else a paced pipe"),
    Case("io-int", "io:rank={rank}:start={start}:kb=2048:mbps=8:{int}", ("io",)),
    Case("memory", "memory:rank={rank}:start={start}", ("memory",),
         note="root: the rank's memory cgroup leaves its page cache 32 MB; its mmap-read items fault in from storage"),
    Case("memory-all", "memory:rank=*:start={start}", ("memory",), None,
         note="root: every rank's memory cgroup leaves its page cache 32 MB: short of memory alike, no culprit rank"),
    # the same matmul count everywhere (~100 ms at 0.44 ms each, one thread here): calibrating on
    # every rank at once on shared cores gave one rank twice the work of the others
    Case("everyone-slower", "compute:rank=*:start={start}:n=230", ("regression",), None,
         note="every rank slower: no culprit rank"),
    # two culprits at once: the worse first, and fixing it brings the step down to the other's level,
    # which the top finding says ("then rank 1 holds it"); the other named too
    Case("two-culprits", "compute:rank={rank}:start={start}:ms=150;data:rank=1:start={start}:ms=80", ("compute",), 3,
         also=((1, ("dataloader",)),), note="rank 3 extra compute and rank 1 a slow dataset at once"),
    # half the peer group slow alike: one host finding names both, and its cost is what the job lost (the
    # median of all four, which found them, fell between the slow and the healthy: +77 ms of ~140)
    Case("two-alike", "compute:rank={rank}:start={start}:ms=150;compute:rank=3:start={start}:ms=150", ("compute",),
         also=((3, ("compute",)),), note="ranks 1 and 3 the same extra compute: half the group slow"),
    Case("hang", "hang:rank={rank}:start={start}:seconds=80", ("hang",),
         note="rank stops 80 s, then goes on (eroica's hang floor is 60 s; a 40 s stall is not reported)"),
    Case("link", "mark:rank={rank}:start={start}", ("communication",), needs_netns=True, link_mbit=100,
         note="tbf 100 Mbit/s both ways on the culprit's host"),
    Case("link-int", "mark:rank={rank}:start={start}:{int}", ("communication",), needs_netns=True,
         link_mbit=100, note="tbf on/off with the mark"),
    Case("link-delay", "mark:rank={rank}:start={start}", ("communication",), needs_netns=True,
         link_delay_ms=5.0, note="NFQUEUE 5 ms each way on the culprit's host"),
    Case("link-compute", "mark:rank={rank}:start={start};compute:rank=3:start={start}:ms=150", ("communication",),
         needs_netns=True, link_mbit=100, also=((3, ("compute",)),),
         note="tbf 100 Mbit/s on the culprit's host and rank 3 extra compute at once"),
    # Real frameworks (issue 12): their loops put forward/backward/all-reduce elsewhere than train_bench
    # (Lightning: inside optimizer.step(closure); HF Trainer: prefetched micro-batches, a token-count
    # all-gather in the fetch, gradient accumulation). Same faults, same onset, same scoring.
    Case("lightning-data", "data:rank={rank}:start={start}:ms=80", ("dataloader",), script=TRAIN_LIGHTNING,
         needs_modules=("lightning",), note="Lightning 2.x Trainer, DDP; slow dataset"),
    Case("lightning-compute", "compute:rank={rank}:start={start}:ms=150", ("compute",), script=TRAIN_LIGHTNING,
         needs_modules=("lightning",), note="Lightning 2.x Trainer, DDP; extra compute"),
    Case("hf-data", "data:rank={rank}:start={start}:ms=80", ("dataloader",), script=TRAIN_HF,
         needs_modules=("transformers", "accelerate"), note="HF Trainer, tiny GPT-2, grad accum 2; slow dataset"),
    Case("hf-compute", "compute:rank={rank}:start={start}:ms=150", ("compute",), script=TRAIN_HF,
         needs_modules=("transformers", "accelerate"), note="HF Trainer, tiny GPT-2, grad accum 2; extra compute"),
    # FSDP2 (per-layer all-gathers and reduce-scatters instead of one all-reduce) and torch.compile
    # (inductor's ops instead of the eager ones): train_bench's own loop, wrapped as users wrap theirs
    Case("healthy-fsdp", "", ("",), None, script_args=("--parallel", "fsdp2", "--compile"),
         note="FSDP2 under torch.compile, no fault: expect no finding"),
    Case("fsdp-compute", "compute:rank={rank}:start={start}:ms=150", ("compute",), script_args=("--parallel", "fsdp2"),
         note="FSDP2 (fully_shard per layer); extra compute"),
    Case("fsdp-data", "data:rank={rank}:start={start}:ms=80", ("dataloader",), script_args=("--parallel", "fsdp2"),
         note="FSDP2 (fully_shard per layer); slow dataset"),
    Case("compile-compute", "compute:rank={rank}:start={start}:ms=150", ("compute",),
         script_args=("--parallel", "fsdp2", "--compile"), note="FSDP2 under torch.compile; extra compute"),
    # pipeline parallelism: 2 stages x 2 FSDP2 replicas (rank 1: stage 0, replica 1); only a stage's ranks
    # are alike, and the other stage waits on the culprit in its point-to-point receives
    Case("healthy-pp", "", ("",), None, script=TRAIN_PIPELINE,
         note="2 pipeline stages x 2 replicas (GPipe, FSDP2), no fault: expect no finding"),
    Case("pp-compute", "compute:rank={rank}:start={start}:ms=150", ("compute",), script=TRAIN_PIPELINE,
         note="2 pipeline stages x 2 replicas; extra compute on a stage-0 rank"),
    Case("pp-data", "data:rank={rank}:start={start}:ms=80", ("dataloader",), script=TRAIN_PIPELINE,
         note="2 pipeline stages x 2 replicas; slow dataset on a stage-0 rank"),
    # 4 stages x 1 replica: no rank has a peer of its own stage (rank 1 is the second stage)
    Case("healthy-pp4", "", ("",), None, script=TRAIN_PIPELINE, script_args=("--stages", "4"),
         note="4 pipeline stages, one rank each (GPipe), no fault: expect no finding"),
    Case("pp4-compute", "compute:rank={rank}:start={start}:ms=150", ("compute",), script=TRAIN_PIPELINE,
         script_args=("--stages", "4"), note="4 pipeline stages, one rank each; extra compute on the second stage"),
    Case("pp4-data", "data:rank={rank}:start={start}:ms=80", ("dataloader",), script=TRAIN_PIPELINE,
         script_args=("--stages", "4"), note="4 pipeline stages, one rank each; slow dataset on the second stage"),
    # interleaved schedules (Megatron's placement: 2 stages a rank, stage i on pp rank i mod 2) and the
    # zero-bubble one (a stage's backward split into input- and weight-gradient passes run apart)
    Case("healthy-ipp", "", ("",), None, script=TRAIN_PIPELINE, script_args=("--schedule", "interleaved-1f1b"),
         note="interleaved 1F1B, 2 pipeline ranks x 2 stages each x 2 replicas, no fault: expect no finding"),
    Case("ipp-compute", "compute:rank={rank}:start={start}:ms=150", ("compute",), script=TRAIN_PIPELINE,
         script_args=("--schedule", "interleaved-1f1b"), note="interleaved 1F1B; extra compute on a pp-rank-0 rank"),
    Case("zb-compute", "compute:rank={rank}:start={start}:ms=150", ("compute",), script=TRAIN_PIPELINE,
         script_args=("--schedule", "zero-bubble"), note="interleaved zero-bubble; extra compute on a pp-rank-0 rank"),
    Case("ipp4-compute", "compute:rank={rank}:start={start}:ms=150", ("compute",), script=TRAIN_PIPELINE,
         script_args=("--schedule", "interleaved-1f1b", "--stages", "4"),
         note="interleaved 1F1B, 4 pipeline ranks x 2 stages each, no replicas; extra compute on pp rank 1"),
    # V-shaped zero-bubble (ZBV: pp rank r holds stages r and 2S-1-r, so pp rank 0 holds the first and
    # the last stage, feeds the inputs and computes the loss)
    Case("healthy-zbv", "", ("",), None, script=TRAIN_PIPELINE, script_args=("--schedule", "zbv"),
         note="ZBV zero-bubble, 2 pipeline ranks x 2 stages each (a V) x 2 replicas, no fault: expect no finding"),
    Case("zbv-compute", "compute:rank={rank}:start={start}:ms=150", ("compute",), script=TRAIN_PIPELINE,
         script_args=("--schedule", "zbv"), note="ZBV zero-bubble; extra compute on a pp-rank-0 rank"),
    Case("zbv4-compute", "compute:rank={rank}:start={start}:ms=150", ("compute",), script=TRAIN_PIPELINE,
         script_args=("--schedule", "zbv", "--stages", "4"),
         note="ZBV zero-bubble, 4 pipeline ranks x 2 stages each, no replicas; extra compute on pp rank 1"),
    # tensor parallelism inside the stages (2 pp ranks x 2 tp ranks: rank 1 is stage 0's second tp
    # shard): its tp partner waits for it in the feed-forward's all-reduce, inside forward and backward
    Case("tp-compute", "compute:rank={rank}:start={start}:ms=150", ("compute",), script=TRAIN_PIPELINE,
         script_args=("--tp", "2"), note="2 pipeline stages x 2 tensor-parallel ranks (GPipe); extra compute"),
    Case("tp-data", "data:rank={rank}:start={start}:ms=80", ("dataloader",), script=TRAIN_PIPELINE,
         script_args=("--tp", "2"), note="2 pipeline stages x 2 tensor-parallel ranks (GPipe); slow dataset"),
    Case("zb-data", "data:rank={rank}:start={start}:ms=80", ("dataloader",), script=TRAIN_PIPELINE,
         script_args=("--schedule", "zero-bubble"), note="interleaved zero-bubble; slow dataset on a pp-rank-0 rank"),
]


def compiler_unavailable_reason(script_args: tuple[str, ...]) -> str | None:
    """Why a ``--compile`` job cannot run here: inductor builds its CPU kernels with a C++ compiler
    (``CXX``, else c++/g++/clang++ on PATH), which a machine set up by the README need not have."""
    if "--compile" not in script_args:
        return None
    if any(shutil.which(c) for c in (os.environ.get("CXX", ""), "c++", "g++", "clang++") if c):
        return None
    return "torch.compile needs a C++ compiler for its CPU kernels (CXX, c++, g++ or clang++): none on PATH"


def modules_unavailable_reason(modules: tuple[str, ...]) -> str | None:
    """Why a case's framework cannot run here (None when every module is installed).

    ``find_spec`` rather than an import: the driver stays light (transformers takes seconds to import),
    and an installed but broken framework then fails its launch visibly instead of being skipped.
    """
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    return f"{', '.join(missing)} not installed (pip install -e '.[frameworks]')"


@dataclass
class CaseResult:
    case: str
    fault: str
    expected_rank: int | None
    expected_host: str | None
    expected_categories: list[str]
    argv: list[str] = field(default_factory=list)
    exit_code: int | None = None
    wall_s: float = 0.0
    timed_out: bool = False
    summary: dict[str, Any] | None = None
    fault_events: dict[str, list[Any]] = field(default_factory=dict)
    onset_step: int | None = None
    onset_wall: float | None = None
    diag_lines: dict[str, float] = field(default_factory=dict)  # capture step -> wall time it was printed
    score: dict[str, Any] | None = None
    skipped: str | None = None


# ---------------------------------------------------------------------------------------------- scoring
def _hosts(f: dict[str, Any]) -> list[str]:
    """The host(s) a finding names (a communication finding may name several, comma-joined)."""
    return [h for h in str(f.get("host") or "").split(",") if h]


def _names_culprit(case: Case, f: dict[str, Any], host: str | None) -> bool:
    """Does finding ``f`` blame the planted culprit (rank; host for link cases; no rank for regression)?"""
    if case.needs_netns:
        return host in _hosts(f) or (f.get("rank") == case.rank and case.rank is not None)
    if case.rank is None:
        return f.get("rank") is None
    return f.get("rank") == case.rank or case.rank in _merged(f)


def _merged(f: dict[str, Any]) -> set[int]:
    """The ranks a finding that merges several alike names (a host's: "2 ranks slow in compute")."""
    ranks = (f.get("evidence") or {}).get("ranks")
    return {r for r in ranks if isinstance(r, int)} if isinstance(ranks, list) else set()


def summary_bytes(report_dir: Path) -> list[int]:
    """Sizes of every per-rank summary blob in every captures/<step>.msgpack."""
    import msgpack  # eroica's own dependency

    sizes: list[int] = []
    for p in sorted((report_dir / "captures").glob("*.msgpack")):
        with contextlib.suppress(Exception):
            doc = msgpack.unpackb(p.read_bytes(), raw=False, strict_map_key=False)
            sizes += [len(b) for b in doc.get("summaries", []) if isinstance(b, (bytes, bytearray))]
    return sizes


def score_case(case: Case, res: CaseResult, report_dir: Path) -> dict[str, Any]:
    """Score eroica's report against the planted fault.

    detected: a capture at/after the onset names the culprit (any category); healthy: no finding.
    rank/category/host_ok: of the top finding (highest impact) among captures at/after the onset.
    ttd: from the onset to the first capture whose diagnosis names the culprit with an accepted category
    (else the culprit at all), in steps (capture step - onset step) and seconds (its printed line's
    time - the onset's wall time). false_findings: distinct (rank, host, category) blamed that are not
    the culprit, or anything before the onset / on a healthy run. A case with more culprits (``also``):
    rank_ok also needs a finding at/after the onset naming each of them with an accepted category.
    """
    path = report_dir / "report.json"
    if not path.exists():
        return {"scored": False, "reason": f"no {path.name}", "detected": False, "reported": False}
    rep = json.loads(path.read_text())
    host = res.expected_host
    caps = list(rep.get("captures", []))
    # hang diagnoses are written to hang-<step>.json and printed, but are not in report.json
    for hp in sorted(report_dir.glob("hang-*.json")):
        with contextlib.suppress(ValueError, KeyError, TypeError):
            h = json.loads(hp.read_text())
            if h.get("finding"):
                caps.append({"step": int(h.get("step", hp.stem.split("-")[1])), "trigger": "hang",
                             "findings": [h["finding"]]})
    caps.sort(key=lambda c: c.get("step", 0))
    printed = {**res.diag_lines, **printed_lines(report_dir.parent / "launcher.log")}
    onset = res.onset_step
    false: set[tuple[Any, Any, Any]] = set()
    first_any: dict[str, Any] | None = None
    first_ok: dict[str, Any] | None = None
    also = dict(case.also)
    also_named: set[int] = set()
    for cap in caps:
        after = onset is not None and cap.get("step", 0) >= onset - 2  # a capture may open on the onset step
        for f in cap.get("findings", []):
            blame = (f.get("rank"), f.get("host"), f.get("category"))
            merged = _merged(f)   # a finding that merges ranks alike (a host's) names each of them
            if after:
                also_named.update(r for r in merged if r in also and f.get("category") in also[r])
            if after and case.rank not in merged and f.get("rank") in also and f.get("category") in also[f["rank"]]:
                also_named.add(f["rank"])
                continue
            if case.healthy or not after or not _names_culprit(case, f, host):
                false.add(blame)
                continue
            first_any = first_any or cap
            if f.get("category") in case.categories and first_ok is None:
                first_ok = cap
    # the top finding: the job's first (the report's consolidation, engine.consolidate) over the captures
    # at/after the onset: a finding in the baseline capture that happens to name the culprit is not a diagnosis
    if case.healthy or onset is None:
        top = (rep.get("findings") or [None])[0]
    else:
        merged = consolidate([Diagnosis.from_json(c) for c in caps if c.get("step", 0) >= onset - 2])
        # a hang has no per-step impact, and outranks everything (the sort keeps the impact order)
        ranked = sorted(merged, key=lambda f: f.category != "hang")
        top = ranked[0].to_json() if ranked else None
    out: dict[str, Any] = {
        "scored": True, "reported": top is not None,  # (for fault cases: at/after the onset)
        "captures": [(c.get("step"), c.get("trigger"), len(c.get("findings", []))) for c in caps],
        "top": None if top is None else {**{k: top.get(k) for k in ("rank", "host", "category", "function", "phase",
                                                                     "impact_ms_per_step", "victims")},
                                         # the culprit that holds the step once this one is fixed (engine._what_ifs)
                                         **({"then_held_by": (top.get("evidence") or {}).get("then_held_by")}
                                            if case.also else {}),
                                         # a host finding that merges several ranks alike
                                         **({"ranks": sorted(_merged(top))} if _merged(top) else {})},
        "false_findings": len(false), "false_blamed": sorted(map(str, false)),
        "steps": rep.get("steps") if isinstance(rep.get("steps"), int) else None,
    }
    sizes = summary_bytes(report_dir)
    out["summary_bytes"] = {"n": len(sizes), "median": int(statistics.median(sizes)) if sizes else None,
                            "max": max(sizes) if sizes else None}
    if case.healthy:
        out.update(detected=None, rank_ok=None, category_ok=None, host_ok=None, ok=not false)
        return out
    out["detected"] = first_any is not None
    out["rank_ok"] = top is not None and _names_culprit(case, top, host) and (
        not case.needs_netns or case.rank is None or top.get("rank") in (case.rank, None)) and (
        also_named == set(also))
    if case.also:
        out["also_named"] = sorted(also_named)
    out["category_ok"] = top is not None and top.get("category") in case.categories
    out["host_ok"] = (top is not None and top.get("host") == host) if host else None
    hit = first_ok or first_any
    if hit is not None and onset is not None:
        out["ttd_steps"] = max(0, hit["step"] - onset)  # a hang names the last finished step
        t = printed.get("hang" if hit.get("trigger") == "hang" else str(hit["step"]))
        out["ttd_s"] = round(t - res.onset_wall, 1) if t is not None and res.onset_wall else None
    out["ok"] = bool(out["detected"] and out["rank_ok"] and out["category_ok"])
    # the top finding's estimated cost a step, and what the job measured from its first finding on
    # (report.json job.time_lost, engine/timelost.py): how far the estimate is from what happened
    lost = (rep.get("job") or {}).get("time_lost")
    out["cost"] = {"estimated_ms": top.get("impact_ms_per_step") if top and top.get("category") != "hang" else None,
                   "measured_ms": lost.get("per_step_ms") if isinstance(lost, dict) else None}
    return out


def printed_lines(log: Path) -> dict[str, float]:
    """When rank 0 printed each capture's diagnosis (and a hang's), from the bench's timestamped log."""
    out: dict[str, float] = {}
    if not log.exists():
        return out
    for line in log.read_text(errors="replace").splitlines():
        ts, _, rest = line.partition(" ")
        if not rest.startswith("[rank0]:") and "[rank" in rest[:8]:
            continue
        m = DIAG_RE.search(rest)
        key = m.group(1) if m else ("hang" if "eroica: HANG" in rest else None)
        if key is not None:
            with contextlib.suppress(ValueError):
                out.setdefault(key, float(ts))
    return out


def phases_of(report_dir: Path, step: int | None = None) -> list[str]:
    """Per-rank phase rows of a capture's diagnosis (the evidence for a miss), as text lines."""
    files = sorted(report_dir.glob("diagnosis-*.json"), key=lambda p: int(p.stem.split("-")[1]))
    if step is not None:
        files = [p for p in files if p.stem == f"diagnosis-{step}"]
    lines: list[str] = []
    for p in files:
        d = json.loads(p.read_text())
        pt = d.get("phase_table") or {}
        cols = pt.get("columns", [])
        lines.append(f"capture {d.get('step')} ({d.get('trigger')}): " + "; ".join(
            f"{f.get('category')} r{f.get('rank')}@{f.get('host')} {f.get('function')}" for f in d.get("findings", []))
            + (f" notes={d.get('notes')}" if d.get("notes") else ""))
        lines.append("   " + " ".join(f"{c:>9}" for c in ["row", *cols]))
        for row in pt.get("rows", []):
            lines.append("   " + f"{row.get('label', '')[:9]:>9} " + " ".join(f"{v:9.1f}" for v in row.get("values", [])))
    return lines


# ---------------------------------------------------------------------------------------------- running
def _launcher(args: argparse.Namespace, cluster: netns.Cluster | None, extra: list[str]) -> tuple[list[str], dict[str, str]]:
    """argv prefix (eroica-run + layout flags) and env for one launch."""
    env = dict(RANK_ENV)
    if cluster is None:
        return [EROICA_RUN, "--nproc-per-node", str(args.ranks), *extra], env
    flags, renv = cluster.eroica_run_args()
    env.update(renv)
    return [EROICA_RUN, *flags, *extra], env


def launch(argv: list[str], env: dict[str, str], log_path: Path, timeout: float,
           on_line: Callable[[float, str], None] | None = None) -> tuple[int | None, bool, float, str]:
    """Run one job; every output line is timestamped (wall) for time-to-diagnosis. Never raises on a
    failing or hanging job: it is killed (whole process group) at ``timeout``."""
    t0 = time.monotonic()
    lines: list[str] = []
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                         env={**os.environ, **env}, cwd=ROOT, start_new_session=True)

    def pump() -> None:
        assert p.stdout is not None
        for line in p.stdout:
            now = time.time()
            lines.append(f"{now:.3f} {line}")
            if on_line is not None:
                with contextlib.suppress(Exception):
                    on_line(now, line)

    th = threading.Thread(target=pump, daemon=True)
    th.start()
    timed_out = False
    try:
        rc: int | None = p.wait(timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        for sig, grace in ((15, 15), (9, 15)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, sig)
            try:
                rc = p.wait(grace)
                break
            except subprocess.TimeoutExpired:
                rc = None
    th.join(10)
    text = "".join(lines)
    log_path.write_text(text)
    return rc, timed_out, round(time.monotonic() - t0, 2), text


def _json_tag(text: str, tag: str) -> list[dict[str, Any]]:
    out = []
    for m in re.finditer(re.escape(tag) + " ", text):
        with contextlib.suppress(ValueError):
            out.append(json.JSONDecoder().raw_decode(text, m.end())[0])
    return out


def run_case(case: Case, args: argparse.Namespace, cluster: netns.Cluster | None) -> CaseResult:
    """Run one case under eroica-run and score it; never raises for a failing job."""
    fault = case.fault.format(rank=case.rank, start=args.start, int=INTERMITTENT)
    host = cluster.hosts[case.rank].hostname if cluster is not None and case.rank is not None else None
    res = CaseResult(case.name, fault, case.rank, host, list(case.categories))
    if case.needs_netns and cluster is None:
        res.skipped = netns.unavailable_reason() or "needs fake hosts (--netns)"
        return res
    for spec in faults.parse_specs(fault):
        why = faults.KINDS[spec.kind].unavailable_reason(spec)
        if why:
            res.skipped = why
            return res
    if case.link_delay_ms and netns.delay_unavailable_reason():
        res.skipped = netns.delay_unavailable_reason()
        return res
    why_not = modules_unavailable_reason(case.needs_modules) or compiler_unavailable_reason(case.script_args)
    if why_not:
        res.skipped = why_not
        return res
    cdir = Path(args.out) / case.name
    shutil.rmtree(cdir, ignore_errors=True)  # a stale report from an earlier run must not be scored
    cdir.mkdir(parents=True, exist_ok=True)
    rdir = cdir / "report"
    argv, env = _launcher(args, cluster, ["--report-dir", str(rdir)])
    env["EROICA_BENCH_FAULT"] = fault
    # every capture file stays (retention.py removes old ones from a long job's report directory):
    # the replay tools (scripts/bench/engine_replay.py, trigger_replay.py) re-analyse them all
    env["EROICA_KEEP_CAPTURES"] = os.environ.get("EROICA_KEEP_CAPTURES", "0")
    argv += [str(case.script), *case.script_args, "--steps", str(max(args.steps, case.min_steps)),
             "--out", str(cdir / "steps")]
    res.argv = argv
    marks: list[tuple[float, str]] = []

    def on_line(now: float, line: str) -> None:
        m = DIAG_RE.search(line)
        if m and line.startswith("[rank0]:") or (m and "[rank" not in line):
            res.diag_lines.setdefault(m.group(1), now)
        m = MARK_RE.search(line)
        if m and cluster is not None and case.rank is not None:  # the driver's link fault follows the mark
            on = m.group(3) == "on"
            if case.link_mbit:
                cluster.limit_rate(case.rank, case.link_mbit) if on else cluster.clear_rate(case.rank)
            if case.link_delay_ms:
                cluster.add_delay(case.rank, case.link_delay_ms) if on else cluster.clear_delay(case.rank)
            marks.append((time.time(), m.group(3)))

    try:
        res.exit_code, res.timed_out, res.wall_s, text = launch(argv, env, cdir / "launcher.log", args.case_timeout,
                                                                 on_line)
    finally:
        if cluster is not None and case.rank is not None:
            cluster.clear_rate(case.rank)
            cluster.clear_delay(case.rank)
    sums = _json_tag(text, "BENCH_SUMMARY")
    res.summary = sums[-1] if sums else None
    walls: list[float] = []
    for f in sorted((cdir / "steps").glob("steps-rank*.json")):
        d = json.loads(f.read_text())
        if d.get("fault_events"):
            res.fault_events[str(d["rank"])] = d["fault_events"]
            for (step, _kind, what), w in zip(d["fault_events"], d.get("fault_event_wall", []), strict=False):
                if what == "on" and (res.onset_step is None or step < res.onset_step):
                    res.onset_step = step
                if what == "on":
                    walls.append(w)
    if marks:  # a link fault starts when the driver applied it, not when the rank logged the mark
        walls = [t for t, what in marks if what == "on"]
    res.onset_wall = min(walls) if walls else None
    res.score = score_case(case, res, rdir)
    return res


def run_overhead(args: argparse.Namespace) -> dict[str, Any]:
    """Interleaved healthy runs: no runtime, eroica (dormant apart from its baseline capture) and an
    always-on torch.profiler with a chrome trace per rank. Ratios of the median step time per round."""
    modes = {"none": (["--no-eroica"], TRAIN), "eroica": ([], TRAIN), "profiler": (["--no-eroica"], PROFILE_WRAP)}
    rounds: list[dict[str, Any]] = []
    odir = Path(args.out) / "overhead"
    for r in range(args.overhead_rounds):
        row: dict[str, Any] = {}
        for mode, (extra, script) in modes.items():
            d = odir / f"{mode}-{r}"
            d.mkdir(parents=True, exist_ok=True)
            argv, env = _launcher(args, None, ["--report-dir", str(d / "report"), *extra])
            env["EROICA_BENCH_TRACE_DIR"] = str(d / "traces")
            argv += [str(script), "--steps", str(args.overhead_steps)]
            rc, to, wall, text = launch(argv, env, d / "launcher.log", args.case_timeout)
            sums = _json_tag(text, "BENCH_SUMMARY")
            traces = _json_tag(text, "BENCH_TRACE")
            row[mode] = {"rc": rc, "timed_out": to, "wall_s": wall,
                         "median_step_ms": sums[-1]["median_step_ms"] if sums else None,
                         "trace_bytes": [t["bytes"] for t in traces],
                         "trace_Bps": [t["bytes"] / t["seconds"] for t in traces if t.get("seconds")],
                         "export_s": [t["export_s"] for t in traces]}
            print(f"overhead round {r} {mode:8} rc={rc} wall={wall}s median={row[mode]['median_step_ms']}",
                  flush=True)
        rounds.append(row)
    return summarize_overhead(rounds, args.overhead_steps)


def summarize_overhead(rounds: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """Per-round ratios to the no-runtime run, and the profiler's trace volume."""

    def ratios(mode: str) -> list[float]:
        return [x[mode]["median_step_ms"] / x["none"]["median_step_ms"] for x in rounds
                if x[mode]["median_step_ms"] and x["none"]["median_step_ms"]]

    bps = [b for x in rounds for b in x["profiler"]["trace_Bps"]]
    tb = [b for x in rounds for b in x["profiler"]["trace_bytes"]]
    return {"rounds": rounds, "steps": steps, "eroica_ratio": ratios("eroica"),
            "profiler_ratio": ratios("profiler"),
            "trace_bytes_per_rank_per_s": statistics.median(bps) if bps else None,
            "trace_bytes_per_rank": statistics.median(tb) if tb else None}


# ---------------------------------------------------------------------------------------------- table
def _yn(v: Any) -> str:
    return "–" if v is None else ("yes" if v else "**no**")


def precision_recall(results: list[CaseResult]) -> dict[str, Any]:
    """Case-level, on the job's top finding. recall = fault cases whose top finding is right / fault
    cases run; precision = right / cases where eroica reported any finding (healthy runs included)."""
    ran = [r for r in results if not r.skipped and r.score and r.score.get("scored") is not None]
    faulty = [r for r in ran if r.expected_categories != [""]]
    reported = [r for r in ran if r.score.get("reported")]  # type: ignore[union-attr]
    out: dict[str, Any] = {"fault_cases": len(faulty), "reported_cases": len(reported)}
    for key in ("rank_ok", "category_ok"):
        tp = sum(1 for r in faulty if r.score.get(key))  # type: ignore[union-attr]
        out[key.split("_")[0]] = {"tp": tp, "precision": round(tp / len(reported), 3) if reported else None,
                                  "recall": round(tp / len(faulty), 3) if faulty else None}
    return out


def table(results: list[CaseResult], overhead: dict[str, Any] | None) -> str:
    rows = ["| case | fault (planted on rank 1 at the onset step) | detected | rank | category | host "
            "| top finding | onset → diagnosis | cost a step, estimated / measured | summary bytes/rank (median, max) "
            "| false findings |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    by_name = {c.name: c for c in CASES}
    for r in results:
        c = by_name.get(r.case)
        what = f"`{r.fault or '-'}`" + (f" + tbf {c.link_mbit:g} Mbit/s" if c and c.link_mbit else "") + (
            f" + delay {c.link_delay_ms:g} ms" if c and c.link_delay_ms else "")
        if r.skipped:
            rows.append(f"| {r.case} | {what} | skipped: {r.skipped} | | | | | | | | |")
            continue
        s = r.score or {}
        top = s.get("top")
        fn = str(top["function"]).rsplit("/", 1)[-1] if top else ""  # a hang's function is a file:line
        who = "" if not top else "job-wide" if top.get("rank") is None else \
            "host " + "+".join(f"r{x}" for x in top["ranks"]) if top.get("ranks") else f"r{top['rank']}"
        topt = f"{top['category']} {who} `{fn}`" if top else "none"
        if r.expected_host and top:
            topt += " @" + ",".join(h.split("-")[-1] for h in _hosts(top))
        if c and c.also and top:
            then = top.get("then_held_by")
            topt += (f", then r{then}" if then is not None else "") + "; also " + ", ".join(
                f"r{rank} {'named' if rank in s.get('also_named', []) else 'missed'}" for rank, _ in c.also)
        ttd = (f"{s['ttd_steps']} steps, {s.get('ttd_s')} s" if s.get("ttd_steps") is not None else "–")
        cost = s.get("cost") or {}
        costs = "–" if cost.get("estimated_ms") is None else " / ".join(
            "–" if x is None else f"{x:.0f}" for x in (cost.get("estimated_ms"), cost.get("measured_ms"))) + " ms"
        b = s.get("summary_bytes") or {}
        bytes_ = f"{b.get('median')}, {b.get('max')}" if b.get("n") else "–"
        fail = f" (exit {r.exit_code}{', timed out' if r.timed_out else ''})" if r.exit_code or r.timed_out else ""
        det = _yn(s.get("detected")) if s.get("detected") is not None else ("n/a" if s.get("scored") else "no report")
        rows.append(f"| {r.case}{fail} | {what} | {det} | {_yn(s.get('rank_ok'))} "
                    f"| {_yn(s.get('category_ok'))} | {_yn(s.get('host_ok'))} | {topt} | {ttd} | {costs} | {bytes_} "
                    f"| {s.get('false_findings', '–')} |")
    pr = precision_recall(results)
    lines = ["\n".join(rows), "",
             f"Culprit rank: precision {pr['rank']['precision']}, recall {pr['rank']['recall']} "
             f"({pr['rank']['tp']} right of {pr['fault_cases']} fault cases; {pr['reported_cases']} cases reported "
             f"a finding). Category: precision {pr['category']['precision']}, recall {pr['category']['recall']} "
             f"({pr['category']['tp']} right)."]
    healthy = [r for r in results if not r.skipped and r.expected_categories == [""] and r.score]
    ttds = sorted(r.score["ttd_steps"] for r in results if r.score and r.score.get("ok")
                  and r.score.get("ttd_steps") is not None and r.case != "hang")
    lines += ["", f"Healthy runs: {len(healthy)}, {sum(r.score.get('steps') or 0 for r in healthy)} steps judged, "
                  f"{sum(1 for r in healthy if r.score.get('false_findings'))} with a false finding. "
                  f"Onset → diagnosis (right cases, hang aside): median "
                  f"{statistics.median(ttds) if ttds else '–'} steps (range {ttds[0] if ttds else '–'}–"
                  f"{ttds[-1] if ttds else '–'})."]
    if overhead:
        def med(xs: list[float]) -> str:
            return f"{statistics.median(xs):.3f} (rounds: {', '.join(f'{x:.3f}' for x in xs)})" if xs else "–"
        tb = overhead.get("trace_bytes_per_rank_per_s")
        lines += ["", f"Overhead ({len(overhead['rounds'])} interleaved rounds of {overhead['steps']} healthy steps; "
                  "median step time (max over ranks) relative to `eroica-run --no-eroica`):", "",
                  "| | step-time ratio | trace bytes per rank per second |", "| --- | --- | --- |",
                  f"| eroica, dormant (plus its one baseline capture) | {med(overhead['eroica_ratio'])} | 0 "
                  "(summaries only on a capture) |",
                  f"| always-on torch.profiler, chrome trace per rank | {med(overhead['profiler_ratio'])} | "
                  f"{tb / 1e3:.0f} kB/s ({(overhead.get('trace_bytes_per_rank') or 0) / 1e6:.1f} MB per rank per run) |"
                  if tb else "| always-on torch.profiler | – | – |"]
    return "\n".join(lines)


def write_doc(doc: Path, text: str) -> None:
    """Replace the generated block in the doc (appended at the end the first time)."""
    begin, end = "<!-- fault-bench:begin -->", "<!-- fault-bench:end -->"
    old = doc.read_text() if doc.exists() else ""
    block = f"{begin}\n{text}\n{end}"
    if begin in old and end in old:
        new = old[: old.index(begin)] + block + old[old.index(end) + len(end):]
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    doc.write_text(new)


# ---------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fault-bench", description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--cases", default="all", help="comma list of case names, or 'all' / 'none' (see --list)")
    ap.add_argument("--list", action="store_true", help="list cases and exit")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--start", type=int, default=50, help="fault onset step (eroica needs ~50 healthy steps)")
    ap.add_argument("--netns", action="store_true",
                    help="run every case on fake hosts (default: only the link cases, which need them)")
    ap.add_argument("--out", default="fault-bench-out")
    ap.add_argument("--case-timeout", type=float, default=300)
    ap.add_argument("--overhead-rounds", type=int, default=3, help="0 = skip the overhead runs")
    ap.add_argument("--overhead-steps", type=int, default=100)
    ap.add_argument("--write-doc", default=None, help="put the table into this markdown file")
    ap.add_argument("--merge", action="store_true", help="replace only these cases' rows in OUT/bench.json")
    ap.add_argument("--rescore", action="store_true", help="re-score OUT's stored reports, rewrite the table")
    args = ap.parse_args(argv)
    if args.rescore:  # score the stored reports again (after a scoring change) and rewrite the table
        stored = json.loads(Path(args.out, "bench.json").read_text())
        results = [CaseResult(**r) for r in stored["results"]]
        by_name = {c.name: c for c in CASES}
        for r in results:
            if not r.skipped and r.case in by_name:
                r.score = score_case(by_name[r.case], r, Path(args.out) / r.case / "report")
        old = Path(args.out, "table.md")
        meta = stored.get("meta") or (old.read_text().split("\n\n")[0] if old.exists() else "")
        return _finish(args, results, stored.get("overhead"), meta, argv)
    if args.list:
        for c in CASES:
            job = "" if c.script == TRAIN else f"  [{c.script.name}]"
            print(f"{c.name:17} {c.fault.format(rank=c.rank, start=args.start, int=INTERMITTENT) or '-':58} "
                  f"expect {'/'.join(c.categories) or 'nothing'}  {c.note}{job}")
        return 0
    names = [c.name for c in CASES]
    wanted = names if args.cases == "all" else [] if args.cases == "none" else args.cases.split(",")
    unknown = set(wanted) - set(names)
    if unknown:
        ap.error(f"unknown cases: {sorted(unknown)}")
    cases = [c for c in CASES if c.name in wanted]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: list[CaseResult] = []
    t0 = time.monotonic()
    with contextlib.ExitStack() as stack:
        cluster: netns.Cluster | None = None
        for case in cases:
            use_ns = case.needs_netns or args.netns
            if use_ns and cluster is None and not netns.unavailable_reason():
                cluster = stack.enter_context(netns.cluster(args.ranks))
            r = run_case(case, args, cluster if use_ns else None)
            results.append(r)
            s = r.score or {}
            print(f"{r.case:16} " + (f"skipped: {r.skipped}" if r.skipped else
                  f"exit={r.exit_code} wall={r.wall_s}s onset={r.onset_step} detected={s.get('detected')} "
                  f"rank={s.get('rank_ok')} cat={s.get('category_ok')} host={s.get('host_ok')} "
                  f"ttd={s.get('ttd_steps')}st/{s.get('ttd_s')}s false={s.get('false_findings')} top={s.get('top')}"),
                  flush=True)
            Path(out, "bench-partial.json").write_text(json.dumps({"results": [asdict(x) for x in results]}, indent=1))
    overhead = run_overhead(args) if args.overhead_rounds > 0 else None
    cmd = "scripts/fault-bench " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    now = time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())
    load = f"load average {os.getloadavg()[0]:.1f} at the end; {time.monotonic() - t0:.0f} s"
    if args.merge and Path(out, "bench.json").exists():  # replace these cases' rows in the stored run
        stored = json.loads(Path(out, "bench.json").read_text())
        new = {r.case: r for r in results}
        old = [CaseResult(**r) for r in stored["results"]]
        results = [new.pop(r.case, r) for r in old] + list(new.values())
        if overhead and stored.get("overhead"):  # more interleaved rounds of the same comparison
            overhead = summarize_overhead(stored["overhead"]["rounds"] + overhead["rounds"], overhead["steps"])
        overhead = overhead or stored.get("overhead")
        prev = Path(out, "table.md")
        meta = stored.get("meta") or (prev.read_text().split("\n\n")[0] if prev.exists() else "")
        meta += f" Re-run by `{cmd}` on {now} ({load}): {', '.join(c.name for c in cases)}."
    else:
        longer = ", ".join(f"{c.name} {c.min_steps}" for c in cases if c.min_steps > args.steps)
        meta = (f"Generated by `{cmd}` on {now}, {args.ranks} ranks, {args.steps} steps"
                f"{f' ({longer})' if longer else ''}, onset step {args.start}, "
                f"intermittent = `{INTERMITTENT}`; {os.cpu_count()} cores shared with other jobs, {load} in all.")
    _finish(args, results, overhead, meta, argv)
    failed = [r.case for r in results if not r.skipped and r.timed_out]
    if failed:
        print(f"timed out: {failed}", file=sys.stderr)
    return 1 if failed else 0


def _finish(args: argparse.Namespace, results: list[CaseResult], overhead: dict[str, Any] | None, meta: str,
            argv: list[str] | None) -> int:
    """Write bench.json and table.md, print the table and the evidence for every case not fully right."""
    out = Path(args.out)
    text = meta + "\n\n" + table(results, overhead)
    Path(out, "bench.json").write_text(json.dumps({"meta": meta, "results": [asdict(x) for x in results],
                                                   "overhead": overhead,
                                                   "precision_recall": precision_recall(results)}, indent=1))
    Path(out, "table.md").write_text(text + "\n")
    print(text)
    for r in results:
        if not r.skipped and not (r.score or {}).get("ok", False):
            print(f"\n--- {r.case}: not right; captures (per-rank phases, ms per step):")
            print("\n".join(phases_of(out / r.case / "report")))
    if args.write_doc:
        write_doc(Path(args.write_doc), text)
    return 0
