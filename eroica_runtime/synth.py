"""Synthetic captures of an N-rank job with one planted fault (for `eroica synth`, tests, benchmarks).

The generative model is that of synchronous data/pipeline-parallel training: every rank does its own
work (data, forward, backward, optimizer, host gaps, GC) and then waits in the step's collectives
until the slowest rank arrives, so ``comm_r = comm_base + (max own - own_r)`` and all step times
agree. A culprit's extra own work therefore shows up as everyone else's wait (victims).

Speed: summaries of a stage share one msgpack layout, so each is produced by filling float/int
slots of a byte template with numpy (no per-rank dicts); 100k ranks take seconds. Summaries list the
top 64 functions of the stage (like a real summary) plus an ``<other>`` bucket, out of a vocabulary
of ``functions`` names. The files decode with ``summary.decode_capture``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from eroica_runtime.summary import CAPTURE_SCHEMA, PHASES, SCHEMA

FAULTS = ("none", "compute", "dataloader", "gc", "host", "communication", "regression")
TOP_FUNCTIONS = 64
BASELINE_STEP, FAULT_STEP, K = 100, 500, 5
_BASE = {"data": 3.0, "forward": 30.0, "backward": 45.0, "optimizer": 8.0, "host_gap": 4.0, "gc": 0.5,
         "io": 0.0}
_COMM_BASE = 10.0
_NAMED = [
    ("aten::addmm", "forward"), ("autograd::engine::evaluate_function: AddmmBackward0", "backward"),
    ("aten::mm", "forward"), ("autograd::engine::evaluate_function: MmBackward0", "backward"),
    ("aten::bmm", "forward"), ("autograd::engine::evaluate_function: BmmBackward0", "backward"),
    ("aten::_softmax", "forward"), ("aten::layer_norm", "forward"), ("aten::gelu", "forward"),
    ("autograd::engine::evaluate_function: NativeLayerNormBackward0", "backward"),
    ("Optimizer.step#AdamW.step", "optimizer"), ("aten::_foreach_add_", "optimizer"),
    ("aten::_foreach_mul_", "optimizer"), ("aten::copy_", "forward"), ("aten::add", "forward"),
]
DATALOADER_FN = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"


# Decimal places of a float as a real summary has it: summary.build rounds every time, count and
# phase to 4 places (``_num``); telemetry is as read: CPU seconds in clock ticks (0.01 s), context
# switches and TCP retransmits as integers, wall-clock seconds (time.time()) at full precision (None).
# Why: the numbers' precision decides how small a node leader's block is (engine/blockcodec.py), so
# synthetic jobs must not carry 16 digits real ones do not have.
_PLACES: dict[str, int | None] = {"wall_s": None, "cpu_s": 2, "ctx_invol": 0, "tcp_retrans": 0}


class _Slot:
    """Placeholder for a per-rank value in a msgpack template."""

    __slots__ = ("key", "kind")

    def __init__(self, key: str, kind: str) -> None:
        self.key, self.kind = key, kind


class _Template:
    """msgpack bytes of one summary layout with the byte offsets of its per-rank slots."""

    def __init__(self, obj: Any) -> None:
        self.buf = bytearray()
        self.slots: list[tuple[str, int, str]] = []
        self._emit(obj)

    def _emit(self, o: Any) -> None:
        p = msgpack.Packer(use_bin_type=True)
        if isinstance(o, _Slot):
            if o.kind == "f8":
                self.buf += b"\xcb"
                self.slots.append((o.key, len(self.buf), "f8"))
                self.buf += bytes(8)
            elif o.kind == "u4":
                self.buf += b"\xce"
                self.slots.append((o.key, len(self.buf), "u4"))
                self.buf += bytes(4)
            else:                      # fixed-width string "s<n>"
                n = int(o.kind[1:])
                packed = p.pack("x" * n)
                self.buf += packed[: len(packed) - n]
                self.slots.append((o.key, len(self.buf), o.kind))
                self.buf += bytes(n)
        elif isinstance(o, dict):
            self.buf += p.pack_map_header(len(o))
            for k, v in o.items():
                self.buf += p.pack(k)
                self._emit(v)
        elif isinstance(o, list):
            self.buf += p.pack_array_header(len(o))
            for v in o:
                self._emit(v)
        else:
            self.buf += p.pack(o)

    def fill(self, values: dict[str, np.ndarray], n: int) -> np.ndarray:
        """(n, len) uint8 array: the template repeated with every slot written from ``values``, each
        float with the precision a real summary gives it (``_PLACES``)."""
        tpl = np.frombuffer(bytes(self.buf), dtype=np.uint8)
        out = np.tile(tpl, (n, 1))
        for key, off, kind in self.slots:
            v = values[key]
            if kind == "f8":
                places = _PLACES.get(key, 4)
                if places is not None:
                    v = np.rint(np.asarray(v, dtype=np.float64) * 10.0 ** places) / 10.0 ** places
                out[:, off:off + 8] = np.asarray(v, dtype=">f8").reshape(n, 1).view(np.uint8)
            elif kind == "u4":
                out[:, off:off + 4] = np.asarray(v, dtype=">u4").reshape(n, 1).view(np.uint8)
            else:
                w = int(kind[1:])
                out[:, off:off + w] = np.asarray(v, dtype=f"S{w}").reshape(n, 1).view(np.uint8).reshape(n, w)
        return out


@dataclass(frozen=True)
class Vocab:
    """The job's function vocabulary for one pipeline stage."""

    names: list[str]
    phase: list[str]
    kind: list[str]
    count: np.ndarray     # calls per step
    share: np.ndarray     # share of its phase's time


def _vocab(functions: int, stage: int, stages: int, rng: np.random.Generator) -> Vocab:
    names, phase, kind = [], [], []
    for n, ph in _NAMED:
        names.append(n)
        phase.append(ph)
        kind.append("cpu_op")
    names.append(DATALOADER_FN)
    phase.append("data")
    kind.append("dataloader")
    if stage == 0:
        names.append("aten::embedding")
        phase.append("forward")
        kind.append("cpu_op")
    if stage == stages - 1:
        names.append("aten::cross_entropy_loss")
        phase.append("forward")
        kind.append("cpu_op")
    cycle = ("forward", "backward", "optimizer")
    j = 0
    while len(names) < max(functions, len(names)):
        names.append(f"aten::op{j:03d}")
        phase.append(cycle[j % 3])
        kind.append("cpu_op")
        j += 1
    names = names[:max(functions, 1)] if functions >= len(_NAMED) + 1 else names
    f = len(names)
    phase, kind = phase[:f], kind[:f]
    share = np.zeros(f)
    for ph in ("forward", "backward", "optimizer", "data"):
        idx = [i for i in range(f) if phase[i] == ph]
        w = 1.0 / np.power(np.arange(1, len(idx) + 1), 1.2)
        share[idx] = w / w.sum()
    layers = 4 + stage
    base_calls = rng.integers(1, 7, size=f).astype(np.float64)
    count = np.where(np.array(phase) == "optimizer", base_calls, base_calls * layers)
    count[np.array(phase) == "data"] = 1.0
    return Vocab(names, phase, kind, count, share)


def _summary_layout(v: Vocab, top: np.ndarray, world: int, stages: int, host_w: int,
                    trigger: str) -> _Template:
    fns = []
    for j in top.tolist():
        fns.append({"name": v.names[j], "kind": v.kind[j], "phase": v.phase[j],
                    **{k: _Slot(f"fn{j}.{k}", "f8") for k in ("count", "ms", "mean", "p50", "p90", "p99",
                                                               "max", "std")}})
    colls = [("gloo:all_reduce", 0.85), ("gloo:broadcast", 0.05)] + (
        [("gloo:send", 0.05), ("gloo:recv", 0.05)] if stages > 1 else [])
    for name, _ in colls:
        fns.append({"name": name, "kind": "collective", "phase": "comm",
                    **{k: _Slot(f"{name}.{k}", "f8") for k in ("count", "ms", "mean", "p50", "p90", "p99",
                                                               "max", "std")}})
    fns.append({"name": "<other>", "kind": "other", "phase": "other",
                **{k: _Slot(f"other.{k}", "f8") for k in ("count", "ms", "mean", "p50", "p90", "p99",
                                                          "max", "std")}})
    host0 = {k: 0.0 for k in ("cpu_s", "wall_s", "ctx_vol", "ctx_invol", "load1", "cpu_mhz", "mem_rss_mb",
                               "mem_avail_mb", "tcp_retrans", "net_bytes_sent", "net_bytes_recv", "net_drops",
                               "cpu_throttled_ms", "majflt", "refaults")}
    host0["cpu_quota"] = None    # no CPU limit: never throttled (telemetry.cgroup_cpu)
    host0["mem_limit_mb"], host0["mem_free_mb"] = 2.0**20, 614400.0   # a 1 TiB host with 600 GiB free
    host1 = dict(host0, cpu_s=_Slot("cpu_s", "f8"), wall_s=_Slot("wall_s", "f8"),
                 ctx_invol=_Slot("ctx_invol", "f8"), tcp_retrans=_Slot("tcp_retrans", "f8"))
    groups = [{"name": "pp", "ranks": [_Slot(f"pp{s}", "u4") for s in range(stages)]}] if stages > 1 else []
    doc = {"schema": SCHEMA, "rank": _Slot("rank", "u4"), "local_rank": _Slot("local_rank", "u4"),
           "world_size": world, "pid": _Slot("pid", "u4"), "host": _Slot("host", f"s{host_w}"),
           "device": {"index": None, "uuid": None, "name": None}, "groups": groups,
           "versions": {"eroica": "synth", "torch": "synth"},
           "capture": {"step": _Slot("cap_step", "u4"), "trigger": trigger, "k": K},
           "steps": [{"step": _Slot(f"st{i}", "u4"), "ms": _Slot(f"st{i}.ms", "f8")} for i in range(K)],
           "functions": fns, "phases": {p: _Slot(f"ph.{p}", "f8") for p in PHASES},
           "gc": {"count": _Slot("gc.count", "f8"), "ms": _Slot("ph.gc", "f8")},
           "telemetry": {"start": {"host": host0, "gpu": None}, "end": {"host": host1, "gpu": None}}}
    return _Template(doc)


@dataclass(frozen=True)
class Plan:
    """What synth planted (returned to callers and tests)."""

    ranks: int
    fault: str
    culprit: int | None
    culprit_host: str | None
    function: str | None
    category: str | None
    stages: int
    topology: str | None


def host_name(rank: int | np.ndarray, ranks_per_host: int) -> Any:
    """node00000-style host of a rank."""
    return np.char.add("node", np.char.zfill((np.asarray(rank) // ranks_per_host).astype(str), 5))


def _capture(path: Path, *, ranks: int, stages: int, vocabs: list[Vocab], rng: np.random.Generator,
             persist: np.ndarray, fault: str, culprit: int | None, cap_step: int, trigger: str,
             ranks_per_host: int, extra: dict[str, Any] | None, chunk: int = 4096) -> None:
    """Write one capture file, streaming summaries in chunks."""
    per_stage = ranks // stages
    stage_of = np.minimum(np.arange(ranks) // max(per_stage, 1), stages - 1)
    own_names = list(_BASE)
    stage_scale = 1.0 + 0.1 * stage_of           # later stages carry more layers (pipeline imbalance)
    ph = {p: _BASE[p] * stage_scale * persist[:, i] * rng.uniform(0.98, 1.02, ranks)
          for i, p in enumerate(own_names)}
    fn_extra: dict[int, tuple[str, float]] = {}     # rank -> (function, extra ms)
    E = 0.4 * sum(_BASE.values())                   # size of a planted fault, ms per step
    comm_base = _COMM_BASE * rng.uniform(0.95, 1.05, ranks)
    ctx_invol = rng.uniform(5, 15, ranks)
    cpu_share = rng.uniform(0.95, 1.0, ranks)
    retrans = np.zeros(ranks)
    gc_count = rng.uniform(0.1, 0.3, ranks)
    ph_fn = {p_: v.copy() for p_, v in ph.items()}  # functions share the pre-fault phase time ...
    if fault != "none" and culprit is not None:     # ... and the planted extra goes to one function
        c = culprit
        if fault == "compute":
            ph["backward"][c] += E
            fn_extra[c] = ("autograd::engine::evaluate_function: MmBackward0", E)
        elif fault == "dataloader":
            ph["data"][c] += E
            fn_extra[c] = (DATALOADER_FN, E)
        elif fault == "gc":
            ph["gc"][c] += E
            gc_count[c] *= 20
        elif fault == "host":
            ph["host_gap"][c] += E
            ctx_invol[c] *= 30
            cpu_share[c] *= 0.4
        elif fault == "communication":
            comm_base += E
            hosts = np.arange(ranks) // ranks_per_host
            retrans[hosts == c // ranks_per_host] = 5000.0
    if fault == "regression":
        ph["forward"] += E
    own = sum(ph.values())
    comm = comm_base + (own.max() - own)
    step = own + comm
    if fault == "regression":
        fn_extra = {-1: ("aten::bmm", E)}
    gc_ms = ph["gc"]
    hosts = host_name(np.arange(ranks), ranks_per_host)
    host_w = len(hosts[0]) if ranks else 9
    tops = []
    layouts = []
    for v in vocabs:
        ntop = min(TOP_FUNCTIONS, len(v.names))
        size = v.share * np.array([_BASE.get(p, 0.0) for p in v.phase])
        top = np.argsort(-size, kind="stable")[:ntop]
        tops.append(top)
        layouts.append(_summary_layout(v, top, ranks, stages, host_w, trigger))

    with open(path, "wb") as fh:
        p = msgpack.Packer(use_bin_type=True)
        doc_head = {"schema": CAPTURE_SCHEMA, "step": cap_step, "trigger": trigger, "world_size": ranks,
                    "missing": [], "ranks": list(range(ranks))}
        fh.write(p.pack_map_header(len(doc_head) + 1 + (1 if extra else 0)))
        for k, val in doc_head.items():
            fh.write(p.pack(k))
            fh.write(p.pack(val))
        if extra:
            fh.write(p.pack("extra"))
            fh.write(p.pack(extra))
        fh.write(p.pack("summaries"))
        fh.write(p.pack_array_header(ranks))
        for lo in range(0, ranks, chunk):
            rows = np.arange(lo, min(lo + chunk, ranks))
            blobs: dict[int, bytes] = {}
            for s in np.unique(stage_of[rows]).tolist():
                r = rows[stage_of[rows] == s]
                v, top, tpl = vocabs[s], tops[s], layouts[s]
                n = len(r)
                vals: dict[str, Any] = {"rank": r, "local_rank": r % ranks_per_host, "pid": 1000 + r,
                                        "host": hosts[r], "cap_step": np.full(n, cap_step)}
                for i in range(K):
                    vals[f"st{i}"] = np.full(n, cap_step + i)
                    vals[f"st{i}.ms"] = step[r] * rng.uniform(0.97, 1.03, n)
                phv = {p_: np.zeros(n) for p_ in PHASES}
                for p_ in own_names:
                    phv[p_] = ph[p_][r]
                phv["comm"] = comm[r]
                phv["comm_total"] = comm[r] + 15.0
                phv["overlap"] = np.full(n, 15.0)
                phv["step"] = step[r]
                for p_ in PHASES:
                    vals[f"ph.{p_}"] = phv[p_]
                vals["ph.gc"] = gc_ms[r]
                vals["gc.count"] = gc_count[r]
                wall = step[r] * K / 1000.0
                vals["wall_s"] = wall
                vals["cpu_s"] = wall * cpu_share[r]
                vals["ctx_invol"] = ctx_invol[r] * wall
                vals["tcp_retrans"] = retrans[r]
                for si in range(stages):
                    vals[f"pp{si}"] = si * per_stage + (r - s * per_stage)
                rest = np.zeros(n)
                in_top = set(top.tolist())
                slot_keys = {key for key, _, _ in tpl.slots}
                for j in range(len(v.names)):
                    ph_name = v.phase[j]
                    base = v.share[j] * (ph_fn[ph_name][r] if ph_name in ph_fn else 0.0)
                    ms = base * rng.uniform(0.97, 1.03, n)
                    for cr, (fname, extra_ms) in fn_extra.items():
                        if v.names[j] == fname:
                            ms = ms + (extra_ms if cr < 0 else np.where(r == cr, extra_ms, 0.0))
                    if j not in in_top:
                        rest += ms
                        continue
                    _fill_fn(vals, f"fn{j}", ms, v.count[j])
                _fill_fn(vals, "other", rest, max(1.0, float(len(v.names) - len(top))))
                coll_count = {"gloo:all_reduce": 12.0, "gloo:broadcast": 1.0, "gloo:send": 4.0, "gloo:recv": 4.0}
                for name, share in [("gloo:all_reduce", 0.85), ("gloo:broadcast", 0.05), ("gloo:send", 0.05),
                                    ("gloo:recv", 0.05)]:
                    if f"{name}.ms" in slot_keys:
                        _fill_fn(vals, name, comm[r] * share, coll_count[name])
                arr = tpl.fill(vals, n)
                for i, rr in enumerate(r.tolist()):
                    blobs[rr] = arr[i].tobytes()
            for rr in rows.tolist():
                fh.write(p.pack(blobs[rr]))


def _fill_fn(vals: dict[str, Any], key: str, ms: np.ndarray, count: float) -> None:
    mean = ms / count
    vals.update({f"{key}.count": np.full(len(ms), count), f"{key}.ms": ms, f"{key}.mean": mean,
                 f"{key}.p50": mean * 0.98, f"{key}.p90": mean * 1.1, f"{key}.p99": mean * 1.3,
                 f"{key}.max": mean * 1.5, f"{key}.std": mean * 0.1})


def generate(out: str | os.PathLike[str], *, ranks: int, fault: str = "compute", culprit: int | None = None,
             functions: int = 200, seed: int = 0, stages: int = 1, ranks_per_host: int = 8,
             jitter: float = 0.10) -> Plan:
    """Write ``out/captures/{100,500}.msgpack`` (baseline + faulty) and ``out/steps.msgpack``."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; choose from {', '.join(FAULTS)}")
    if ranks < 2 or stages < 1 or ranks % stages:
        raise ValueError("need ranks >= 2 and ranks divisible by stages")
    rng = np.random.default_rng(seed)
    if fault in ("none", "regression"):
        culprit = None
    elif culprit is None:
        culprit = int(rng.integers(0, ranks))
    elif not 0 <= culprit < ranks:
        raise ValueError(f"culprit {culprit} is not a rank of a {ranks}-rank job")
    root = Path(out)
    (root / "captures").mkdir(parents=True, exist_ok=True)
    vocabs = [_vocab(functions, s, stages, np.random.default_rng(seed + 1000 + s)) for s in range(stages)]
    persist = rng.uniform(1 - jitter, 1 + jitter, size=(ranks, len(_BASE)))
    link_probe = None
    if fault == "communication" and culprit is not None:
        nh = (ranks + ranks_per_host - 1) // ranks_per_host
        hn = host_name(np.arange(nh) * ranks_per_host, ranks_per_host)
        lat = rng.uniform(20, 30, nh)
        lat[culprit // ranks_per_host] *= 10
        link_probe = {"hosts": {str(h): {"latency_us": float(x), "bandwidth_gbps": 90.0} for h, x in zip(hn, lat, strict=True)}}
    _capture(root / "captures" / f"{BASELINE_STEP}.msgpack", ranks=ranks, stages=stages, vocabs=vocabs, rng=rng,
             persist=persist, fault="none", culprit=None, cap_step=BASELINE_STEP, trigger="baseline",
             ranks_per_host=ranks_per_host, extra=None)
    _capture(root / "captures" / f"{FAULT_STEP}.msgpack", ranks=ranks, stages=stages, vocabs=vocabs, rng=rng,
             persist=persist, fault=fault, culprit=culprit, cap_step=FAULT_STEP, trigger="slow_step",
             ranks_per_host=ranks_per_host, extra={"link_probe": link_probe} if link_probe else None)
    base_ms = sum(_BASE.values()) * 1.05 + _COMM_BASE
    steps = np.arange(0, 600)
    ms = base_ms * rng.uniform(0.97, 1.03, len(steps))
    if fault != "none":
        ms[steps >= 450] += 0.4 * sum(_BASE.values())
    tmp = root / "steps.msgpack.tmp"
    tmp.write_bytes(msgpack.packb({"schema": "eroica.steps/1", "steps": steps.tolist(), "ms": ms.tolist()}))
    os.replace(tmp, root / "steps.msgpack")
    fn = {"compute": "autograd::engine::evaluate_function: MmBackward0", "dataloader": DATALOADER_FN,
          "gc": "(gc)", "host": "(host_gap)", "communication": "(comm)", "regression": "aten::bmm"}.get(fault)
    cat = {"compute": "compute", "dataloader": "dataloader", "gc": "gc", "host": "host",
           "communication": "communication", "regression": "regression"}.get(fault)
    chost = str(host_name(culprit, ranks_per_host)) if culprit is not None else None
    return Plan(ranks=ranks, fault=fault, culprit=culprit, culprit_host=chost, function=fn, category=cat,
                stages=stages, topology=f"pp={stages},dp=*" if stages > 1 else None)
