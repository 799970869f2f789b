"""Columnar view of one capture: every rank's summary turned into numpy arrays once.

The analyses then work on whole columns (vectorised over ranks) instead of looping over 100k dicts.
A ``TableBuilder`` takes summaries one at a time (a decoded dict: keep its numbers, drop the dict)
or a block at a time (the columns of many summaries sharing one msgpack layout, engine/ingest.py),
so memory stays proportional to ranks × functions floats and the result does not depend on how a
row arrived.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from eroica_runtime.summary import OWN_WORK_PHASES, PHASES

PHASE_INDEX = {p: i for i, p in enumerate(PHASES)}
OWN_IDX = [PHASE_INDEX[p] for p in OWN_WORK_PHASES]
ROLE_DIMS = frozenset({"pp", "pipe", "pipeline", "stage", "pp_group", "pipeline_parallel"})
ALIKE_DIMS = frozenset({"dp", "tp", "cp", "sp", "ep", "fsdp", "ddp", "shard", "replicate", "data",
                        "tensor", "dp_shard", "dp_replicate", "dp_cp", "context", "expert", "world",
                        "default", "mp", "model"})
# telemetry counters (delta end-start) and gauges (value at the end of the window); the memory ones
# (major faults, the memory cgroup's refaults, limit and headroom) are engine/memory.py's evidence
_HOST_COUNTERS = ("cpu_s", "wall_s", "ctx_vol", "ctx_invol", "tcp_retrans", "net_drops", "io_read_bytes",
                  "io_write_bytes", "cpu_throttled_ms", "majflt", "refaults")
_HOST_GAUGES = ("cpu_quota", "mem_limit_mb", "mem_free_mb")
_GPU_GAUGES = ("sm_mhz", "sm_max_mhz", "temp_c", "power_w", "power_limit_w", "pcie_gen", "pcie_gen_max",
               "pcie_width", "pcie_width_max")
# the device timeline (summary "device_phases", ms or MB per step); NaN for ranks without one
DEVICE_COLUMNS = ("busy", "compute", "comm", "comm_exposed", "transfer", "idle", "forward", "backward",
                  "optimizer", "htod_ms", "htod_mb", "htod_pageable_mb", "dtoh_ms", "dtoh_mb", "dtoh_pageable_mb")
DEVICE_INDEX = {c: i for i, c in enumerate(DEVICE_COLUMNS)}
# torch settings at the window's end (telemetry.end.torch: runtime._torch_settings; engine/settings.py),
# as "torch_<name>" here
_TORCH_SETTINGS = ("anomaly", "threads", "deterministic")
TORCH_KEYS = tuple(f"torch_{k}" for k in _TORCH_SETTINGS)
TELEMETRY_KEYS = _HOST_COUNTERS + _HOST_GAUGES + _GPU_GAUGES + TORCH_KEYS
# the training thread's time from the step clock, ms per step: in the window ("cpu", "runq") and
# in the last HISTORY_RECENT steps before it ("hist_*", data = ms in DataLoader next(), gc = GC pauses,
# thr = held throttled by a CPU quota, NaN where the history has no such column); over the window and all the history shipped:
# steps in which the process was stopped and continued ("stops"), their ms beyond the rank's median
# step ("stop_ms", total) and the steps seen; the same means as "hist_*" over every step of the history
# shipped (up to 32, not only the recent ones: "span_*", what a burst costs on average) and how many
# steps that is ("span_steps"), and how much the rank's busy time (CPU + run-queue + batch wait) varied from
# step to step over them, less a pause ("span_busy_sd", the sample standard deviation: engine/turns.py);
# ms a step it came late to its collectives against the earliest rank ("hist_late", "span_late":
# lateness.py); NaN for ranks that did not record it
SCHED_COLUMNS = ("cpu", "runq", "hist_ms", "hist_cpu", "hist_runq", "hist_data", "hist_gc", "stops", "stop_ms",
                 "steps_seen", "hist_thr", "span_ms", "span_cpu", "span_runq", "span_thr", "span_data", "span_late",
                 "span_steps", "span_busy_sd", "hist_late")
SPAN_OF = ("ms", "cpu", "runq", "thr", "data", "late")   # the "span_*" columns, in order
SCHED_INDEX = {c: i for i, c in enumerate(SCHED_COLUMNS)}
HISTORY_RECENT = 8     # a burst is seen by the vote 6-7 steps before the window opens
# the one step of the history shipped this many times the rank's median step is a pause outside its
# steps' work (rank 0 writing a checkpoint while its peers wait in a barrier, an evaluation, a one-off
# hiccup): left out of the "hist_*" means, the steps a burst is looked for in (``_pauses``); two or
# more such steps are a pattern and stay. The "span_*" means keep it: a checkpoint every N steps is
# the cost lonework.py names. The trigger's spike rule holds such a step back too (Detector._spike)
PAUSE_RATIO = 10.0


@dataclass
class Table:
    """One capture as arrays; row i describes rank ``rank[i]`` (rows sorted by rank)."""

    rank: np.ndarray                 # (R,) int64
    host_idx: np.ndarray             # (R,) int32 into ``hosts``
    hosts: list[str]
    phases: np.ndarray               # (R, len(PHASES)) float64, columns in summary.PHASES order
    fn_names: list[str]              # one function column per (name, phase, kind) the summaries list
    fn_phase: list[str]
    fn_kind: list[str]
    fn_ms: np.ndarray                # (R, F) float64, ms per step (0 where the rank did not list it)
    fn_count: np.ndarray             # (R, F) float32, calls per step
    stage: np.ndarray                # (R,) int32, pipeline stage from recorded "pp" groups, -1 unknown
    alike_groups: list[tuple[int, ...]]   # recorded groups of interchangeable ranks (dp/tp/...)
    unknown_groups: int              # recorded groups with names we cannot interpret
    telemetry: dict[str, np.ndarray]  # counters as deltas, gauges at window end; NaN when absent
    throttle: dict[int, list[str]]   # row -> GPU throttle reasons (only rows that reported some)
    gc_count: np.ndarray             # (R,) GC collections per step
    step_noise: np.ndarray           # (R,) std error of the window's mean step (std / sqrt(K)), 0 if K<2
    device: np.ndarray | None = None  # (R, len(DEVICE_COLUMNS)) device timeline, NaN where absent
    sched: np.ndarray | None = None   # (R, len(SCHED_COLUMNS)) thread CPU / run-queue, NaN where absent
    step_comm: np.ndarray | None = None  # (R, K) ms blocked in collectives in each window step, NaN where absent
    step_ms: np.ndarray | None = None    # (R, K) each window step's time, NaN where absent
    capture_step: int | None = None
    capture_trigger: str | None = None
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    _fn_index: dict[tuple[str, str | None], int] = field(default_factory=dict)

    @property
    def n(self) -> int:
        """Number of ranks (rows)."""
        return int(self.rank.shape[0])

    def col(self, phase: str) -> np.ndarray:
        """One phase column (ms per step)."""
        return self.phases[:, PHASE_INDEX[phase]]

    @property
    def own(self) -> np.ndarray:
        """Own work per rank: everything but waiting in communication (summary.own_work_ms)."""
        return self.phases[:, OWN_IDX].sum(axis=1)

    def sch(self, column: str) -> np.ndarray:
        """One step-clock column (NaN for ranks that did not record it, or all when none did)."""
        if self.sched is None:
            return np.full(self.n, np.nan)
        return self.sched[:, SCHED_INDEX[column]]

    def dev(self, column: str) -> np.ndarray:
        """One device-timeline column (NaN for ranks without device events)."""
        if self.device is None:
            return np.full(self.n, np.nan)
        return self.device[:, DEVICE_INDEX[column]]

    def has_device(self, rows: np.ndarray) -> bool:
        """Every given rank has a device timeline (a GPU job): compare them on the device."""
        if self.device is None or not len(rows):
            return False
        cols = self.device[np.asarray(rows)][:, [DEVICE_INDEX["compute"], DEVICE_INDEX["comm_exposed"]]]
        return bool(np.isfinite(cols).all())

    def fn(self, name: str, phase: str | None = None) -> int | None:
        """Column of function ``name`` (in ``phase``; else its first column) or None.

        A function is a column per (name, phase, kind): ``aten::mm`` in the forward and in the
        backward are two columns, so a finding names the phase its time grew in."""
        if not self._fn_index:
            for i, key in enumerate(zip(self.fn_names, self.fn_phase, strict=True)):
                self._fn_index.setdefault(key, i)
                self._fn_index.setdefault((key[0], None), i)
        return self._fn_index.get((name, phase))

    def rows_of(self, ranks: Iterable[int]) -> np.ndarray:
        """Row indices of the given ranks (ranks not in the table are dropped)."""
        want = np.asarray(list(ranks), dtype=np.int64)
        pos = np.searchsorted(self.rank, want)
        pos = np.clip(pos, 0, max(self.n - 1, 0))
        ok = (self.n > 0) & (self.rank[pos] == want) if self.n else np.zeros(len(want), bool)
        return pos[ok]


def _num(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else float("nan")


def build_table(summaries: Iterable[dict[str, Any]]) -> Table:
    """Turn decoded summaries (any iterable, consumed once) into a Table.

    Duplicate ranks keep the first summary and add an error line; the summaries are assumed to
    have passed ``summary.validate`` (decode does that). Same as feeding a ``TableBuilder`` one
    summary at a time.
    """
    builder = TableBuilder()
    for s in summaries:
        builder.add(s)
    return builder.finish()


FnKey = tuple[str, str, str]    # a function column: (name, phase, kind), as summaries list them


@dataclass
class FnPattern:
    """Rows of one segment that list the same functions ((name, phase, kind)) in the same order; or,
    with ``order``, rows that each list some of ``names`` in an order of their own (a node leader's
    rows: ``union_patterns``), which ``finish`` reads as the rows' own lists."""

    names: list[str]
    phases: list[str]
    kinds: list[str]
    rows: np.ndarray            # (k,) local rows
    ms: list[np.ndarray]        # per listed name, (k,) ms per step
    cnt: list[np.ndarray]       # per listed name, (k,) calls per step
    repeats: bool               # a function listed twice: its entries are summed, in list order
    # (len(names), k): where each row listed each name, -1 where it did not (its ms and count are 0);
    # None: every row listed them as ``names`` does
    order: np.ndarray | None = None

    @property
    def keys(self) -> list[FnKey]:
        return list(zip(self.names, self.phases, self.kinds, strict=True))


@dataclass
class GroupCodes:
    """One recorded group position of a segment's rows, as distinct rank lists."""

    alike: bool                 # dp/tp/...: a set of interchangeable ranks; else a group we cannot read
    gpos: int                   # its place in the summary's group list
    tuples: list[tuple[int, ...]]
    code: np.ndarray            # (m,) index into tuples, -1 where the row has no such group


@dataclass
class Segment:
    """Rows added together (one block of a shared layout, the rows added one at a time, or a node
    leader's rows: engine/blockcodec.py ships segments as they are, so every field is plain data)."""

    index: np.ndarray           # (m,) position of each row in the capture (a node block's rows: their rank)
    rank: np.ndarray            # (m,) int64
    badp: np.ndarray            # (m,) first phase that is not a finite number, -1 if none
    phases: np.ndarray          # (m, len(PHASES))
    steps: np.ndarray           # (m,) number of window steps
    noise: np.ndarray
    sched: np.ndarray           # (m, len(SCHED_COLUMNS))
    comm: np.ndarray            # (m, K) NaN-padded
    ms: np.ndarray              # (m, K) each window step's time, NaN-padded
    cap_step: np.ndarray        # (m,) int64, -1 where none
    cap_trigger: list[str]      # per row (or one for every row)
    hosts: list[str]
    host_code: np.ndarray
    pats: list[FnPattern]
    stage: np.ndarray
    groups: list[GroupCodes]
    tele: dict[str, np.ndarray]
    throttle: dict[int, list[str]]
    gc_count: np.ndarray
    device: np.ndarray          # (m, len(DEVICE_COLUMNS))

    @property
    def m(self) -> int:
        return int(self.index.shape[0])


def union_patterns(pats: list[FnPattern]) -> FnPattern:
    """One pattern of the rows of ``pats`` (none listing a function twice) over the union of their
    functions, sorted by (name, phase, kind), each row's own order in ``order`` (-1 and values 0 where
    a row does not list a function: what ``finish`` gives a rank that did not list it).

    Why: real summaries list their top functions by time, so a node's ranks list mostly the same
    functions in orders (and sets) of their own; as one pattern, the node's names travel once."""
    keys = sorted({k for p in pats for k in p.keys})
    at = {k: j for j, k in enumerate(keys)}
    nk, total = len(keys), sum(len(p.rows) for p in pats)
    ms, cnt = np.zeros((nk, total)), np.zeros((nk, total))
    order = np.full((nk, total), -1, dtype=np.int32)
    o = 0
    for p in pats:
        k = len(p.rows)
        idx = np.asarray([at[x] for x in p.keys], dtype=np.int64)
        if len(idx) and k:
            ms[idx, o:o + k] = np.stack(p.ms)
            cnt[idx, o:o + k] = np.stack(p.cnt)
            order[idx, o:o + k] = p.order if p.order is not None else np.arange(len(idx), dtype=np.int32)[:, None]
        o += k
    same = bool((order == np.arange(nk, dtype=np.int32)[:, None]).all())
    return FnPattern([k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys],
                     np.concatenate([p.rows for p in pats]), list(ms), list(cnt), False, None if same else order)


def merge_segments(segs: list[Segment], *, canonical: bool = False) -> Segment:
    """One segment holding every row of ``segs`` (their ``index`` kept), with one function pattern
    per distinct (name, phase, kind) list and one host and group list.

    Why: ``finish`` costs a few numpy calls per segment and per pattern, so rank 0 merging 12,500
    node blocks wants one segment, not 25,000 (engine/ingest.py does the same in columns). With
    ``canonical`` (a node leader) the patterns become one over the union of their functions, sorted
    by (name, phase, kind), each row's own list kept in ``FnPattern.order`` (``union_patterns``):
    real summaries list functions by time, in an order of each rank's own, so without it every rank
    is a pattern of its own and its names travel once per rank. A pattern listing a function twice
    keeps its list (its entries are summed in list order). ``finish`` gives the same Table from the
    merged segment as from the parts."""
    if len(segs) == 1 and not canonical:
        return segs[0]
    offs = np.cumsum([0] + [s.m for s in segs])
    m = int(offs[-1])
    cat = np.concatenate
    host_ids: dict[str, int] = {}
    host_code = []
    for s in segs:
        remap = np.asarray([host_ids.setdefault(h, len(host_ids)) for h in s.hosts] or [0], dtype=np.int64)
        host_code.append(remap[s.host_code] if s.m else np.zeros(0, dtype=np.int64))
    width = max((s.comm.shape[1] for s in segs), default=0)
    comm, ms = np.full((m, width), np.nan), np.full((m, width), np.nan)
    for s, o in zip(segs, offs.tolist(), strict=False):
        comm[o:o + s.m, :s.comm.shape[1]] = s.comm
        ms[o:o + s.m, :s.ms.shape[1]] = s.ms
    trig = {t for s in segs for t in s.cap_trigger}
    cap_trigger = list(trig) if len(trig) == 1 and all(len(s.cap_trigger) == 1 for s in segs) else \
        [t for s in segs for t in (s.cap_trigger if len(s.cap_trigger) == s.m else s.cap_trigger * s.m)]
    # function patterns: one per distinct key list; a leader's (canonical) as one union pattern
    moved = [(o, pat) for s, o in zip(segs, offs.tolist(), strict=False) for pat in s.pats]
    shifted = [FnPattern(p.names, p.phases, p.kinds, p.rows + o, p.ms, p.cnt, p.repeats, p.order) for o, p in moved]
    pats = []
    if canonical:
        plain = [p for p in shifted if not p.repeats]
        if plain:
            pats.append(union_patterns(plain))
        shifted = [p for p in shifted if p.repeats]    # a function listed twice: its list as it is
    by_keys: dict[tuple[FnKey, ...], list[FnPattern]] = {}
    for p in shifted:
        by_keys.setdefault(tuple(p.keys), []).append(p)
    for keys, group in by_keys.items():
        nk = len(keys)
        if any(p.order is not None for p in group):
            order: np.ndarray | None = cat([p.order if p.order is not None else np.repeat(
                np.arange(nk, dtype=np.int32)[:, None], len(p.rows), axis=1) for p in group], axis=1)
        else:
            order = None
        pats.append(FnPattern([k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys],
                              cat([p.rows for p in group]), [cat([p.ms[j] for p in group]) for j in range(nk)],
                              [cat([p.cnt[j] for p in group]) for j in range(nk)], group[0].repeats, order))
    groups_by: dict[tuple[int, bool], tuple[dict[tuple[int, ...], int], np.ndarray]] = {}
    for s, o in zip(segs, offs.tolist(), strict=False):
        for g in s.groups:
            known, code = groups_by.setdefault((g.gpos, g.alike), ({}, np.full(m, -1, dtype=np.int64)))
            remap = np.asarray([known.setdefault(t, len(known)) for t in g.tuples] + [-1], dtype=np.int64)
            code[o:o + s.m] = remap[g.code]          # -1 (no such group) picks the -1 at the end
    return Segment(
        index=cat([s.index for s in segs]), rank=cat([s.rank for s in segs]), badp=cat([s.badp for s in segs]),
        phases=cat([s.phases for s in segs]), steps=cat([s.steps for s in segs]),
        noise=cat([s.noise for s in segs]), sched=cat([s.sched for s in segs]), comm=comm, ms=ms,
        cap_step=cat([s.cap_step for s in segs]), cap_trigger=cap_trigger, hosts=list(host_ids),
        host_code=cat(host_code), pats=pats, stage=cat([s.stage for s in segs]),
        groups=[GroupCodes(alike, gpos, list(known), code) for (gpos, alike), (known, code) in groups_by.items()],
        tele={k: cat([s.tele[k] for s in segs]) for k in TELEMETRY_KEYS},
        throttle={int(loc + o): v for s, o in zip(segs, offs.tolist(), strict=False) for loc, v in s.throttle.items()},
        gc_count=cat([s.gc_count for s in segs]), device=cat([s.device for s in segs]))


def block_wants(path: tuple[Any, ...]) -> bool:
    """Whether ``TableBuilder.add_block`` reads the number at ``path`` (the caller keeps only these
    columns of a block; every other number is only checked)."""
    top = path[0] if path else None
    if top in ("rank", "phases", "steps", "history", "groups", "gc", "device_phases", "capture"):
        return True
    if top == "functions":
        return len(path) == 3 and path[2] in ("ms", "count")
    if top == "telemetry" and len(path) == 4 and path[1] in ("start", "end"):
        return (path[2] == "host" and path[3] in _HOST_COUNTERS) or \
            (path[1] == "end" and path[2] == "host" and path[3] in _HOST_GAUGES) or \
            (path[2] == "gpu" and path[3] in _GPU_GAUGES) or \
            (path[1] == "end" and path[2] == "torch" and path[3] in _TORCH_SETTINGS)
    return False


class TableBuilder:
    """Builds a Table from validated summaries added one at a time (``add``: a decoded dict) or a
    block at a time (``add_block``: columns of many summaries that share one layout, see
    summary/layout.py), without holding the dicts.

    Why both: a 100,000-rank capture is decoded as blocks of columns (seconds), while summaries
    whose layout is their own still come one at a time, and the Table must not depend on how a row
    arrived. Every row carries its position in the capture, and ``finish`` applies what
    ``build_table`` always did in capture order (a duplicate rank keeps the first summary; hosts and
    functions are numbered in order of first appearance), with the same arithmetic (sums taken in
    the same order), so the same summaries give the same Table bit for bit. ``finish`` may be
    called again with ranks to leave out (the baseline without its culprits) without decoding again.
    """

    def __init__(self) -> None:
        self._segs: list[Segment] = []
        self._next = 0
        # rows added one at a time, as python lists (converted into one segment by finish)
        self._d: dict[str, list[Any]] = {k: [] for k in (
            "index", "rank", "badp", "phases", "steps", "noise", "sched", "comm", "ms", "cap_step", "cap_trigger", "host",
            "stage", "groups", "gc", "device")}
        self._d_tele: dict[str, list[float]] = {k: [] for k in TELEMETRY_KEYS}
        self._d_throttle: dict[int, list[str]] = {}
        self._d_pats: dict[tuple[FnKey, ...], tuple[array, array, array]] = {}
        self._d_cache: Segment | None = None
        self.row_index = np.zeros(0, dtype=np.int64)   # set by finish: each row's place in the capture

    @property
    def rows(self) -> int:
        """Summaries added so far (duplicates included)."""
        return sum(s.m for s in self._segs) + len(self._d["index"])

    # ---- segments: rows another builder made ---------------------------------------------------------
    def segments(self) -> list[Segment]:
        """Every row added so far as segments (what a node leader ships in its block, engine/blocks.py).

        The segments are this builder's own (not copies): the caller must not change them."""
        dseg = self._dict_segment()
        return [*self._segs, dseg] if dseg is not None else list(self._segs)

    def add_segment(self, seg: Segment) -> None:
        """Rows another builder made (a node leader's block, decoded and checked by
        engine/blockcodec.py), as if they had been added here: ``seg.index`` must order them among
        the other rows as the capture would (the ranks, in a capture whose summaries are in rank
        order, as rank 0 writes them). Since ``finish`` numbers hosts and functions by first
        appearance in that order and sums in the same order whatever the segments, the Table is the
        one the rows' summaries added here would give, bit for bit."""
        self._segs.append(seg)
        if seg.m:
            self._next = max(self._next, int(seg.index.max()) + 1)

    # ---- one summary ------------------------------------------------------------------------------
    def add(self, s: dict[str, Any], index: int | None = None) -> None:
        """One decoded, validated summary at position ``index`` of its capture (default: after the
        last one added)."""
        d = self._d
        idx = self._next if index is None else int(index)
        self._next = max(self._next, idx + 1)
        r = int(s["rank"])
        ph = s["phases"]
        vals = [float(ph.get(p, 0.0)) for p in PHASES]
        samples = [float(x["ms"]) for x in s["steps"]]
        badp = next((i for i, v in enumerate(vals) if not math.isfinite(v)), -1)
        k = len(samples)
        mean = sum(samples) / k if k else 0.0
        if vals[0] <= 0.0 and k:
            vals[0] = mean
        self._d_cache = None
        row = len(d["index"])
        d["index"].append(idx)
        d["rank"].append(r)
        d["badp"].append(badp)
        d["phases"].append(vals)
        d["steps"].append(k)
        d["noise"].append(math.sqrt(sum((x - mean) ** 2 for x in samples) / (k - 1) / k) if k > 1 else 0.0)
        d["sched"].append(_sched_row(s))
        d["comm"].append([float(x.get("comm", math.nan)) for x in s["steps"]])
        d["ms"].append(samples)
        cap = s.get("capture") or {}
        step = cap.get("step")
        d["cap_step"].append(int(step) if isinstance(step, int) else -1)
        d["cap_trigger"].append(str(cap.get("trigger", "")))
        d["host"].append(str(s.get("host", "?")))

        fns = s["functions"]
        keys_f = tuple([(str(f["name"]), str(f["phase"]), str(f["kind"])) for f in fns])
        pat = self._d_pats.get(keys_f)
        if pat is None:
            pat = self._d_pats[keys_f] = (array("q"), array("d"), array("d"))
        pat[0].append(row)
        pat[1].extend([float(f["ms"]) for f in fns])
        pat[2].extend([float(f["count"]) for f in fns])

        st = -1
        keys: list[tuple[int, bool, tuple[int, ...]]] = []
        for gpos, gname, granks in _recorded_groups(s["groups"]):
            if gname in ROLE_DIMS:
                if r in granks:
                    st = granks.index(r)
            else:
                keys.append((gpos, gname in ALIKE_DIMS, (gname, *granks)))   # type: ignore[arg-type]
        d["stage"].append(st)
        d["groups"].append(keys)

        t = s.get("telemetry") or {}
        t0 = (t.get("start") or {}).get("host") or {}
        t1 = (t.get("end") or {}).get("host") or {}
        for key in _HOST_COUNTERS:
            self._d_tele[key].append(_num(t1.get(key)) - _num(t0.get(key)))
        for key in _HOST_GAUGES:
            self._d_tele[key].append(_num(t1.get(key)))
        g1 = (t.get("end") or {}).get("gpu") or {}
        for key in _GPU_GAUGES:
            self._d_tele[key].append(_num(g1.get(key)))
        ts = (t.get("end") or {}).get("torch") or {}
        for key in _TORCH_SETTINGS:
            self._d_tele[f"torch_{key}"].append(_num(ts.get(key)) if isinstance(ts, dict) else math.nan)
        reasons = g1.get("throttle") if isinstance(g1, dict) else None
        if isinstance(reasons, list) and reasons:
            self._d_throttle[row] = [str(x) for x in reasons]
        gcd = s.get("gc") or {}
        d["gc"].append(_num(gcd.get("count")))
        dp = s.get("device_phases")
        if isinstance(dp, dict):
            row_dev = [_num(dp.get(c)) for c in DEVICE_COLUMNS]
            for i, c in enumerate(DEVICE_COLUMNS):   # directions without copies: none moved
                if c.startswith(("htod", "dtoh")) and math.isnan(row_dev[i]):
                    row_dev[i] = 0.0
            d["device"].append(row_dev)
        else:
            d["device"].append([math.nan] * len(DEVICE_COLUMNS))

    def _dict_segment(self) -> Segment | None:
        d = self._d
        m = len(d["index"])
        if not m:
            return None
        if self._d_cache is not None:
            return self._d_cache
        hosts: dict[str, int] = {}
        code = np.asarray([hosts.setdefault(h, len(hosts)) for h in d["host"]], dtype=np.int64)
        pats = []
        for keys_f, (rows, ms, cnt) in self._d_pats.items():
            rows_np = np.frombuffer(rows, dtype=np.int64).copy()
            nk = len(keys_f)
            ms_m = np.frombuffer(ms, dtype=np.float64).reshape(len(rows_np), nk)
            cnt_m = np.frombuffer(cnt, dtype=np.float64).reshape(len(rows_np), nk)
            pats.append(FnPattern([k[0] for k in keys_f], [k[1] for k in keys_f], [k[2] for k in keys_f], rows_np,
                             [ms_m[:, j] for j in range(nk)], [cnt_m[:, j] for j in range(nk)],
                             len(set(keys_f)) != nk))
        groups: list[GroupCodes] = []
        by_key: dict[tuple[int, bool], tuple[dict[tuple[Any, ...], int], np.ndarray]] = {}
        for row, keys in enumerate(d["groups"]):
            for gpos, alike, tup in keys:
                known, codes = by_key.get((gpos, alike)) or by_key.setdefault(
                    (gpos, alike), ({}, np.full(m, -1, dtype=np.int64)))
                codes[row] = known.setdefault(tup, len(known))
        for (gpos, alike), (known, codes) in by_key.items():
            groups.append(GroupCodes(alike, gpos, list(known), codes))
        self._d_cache = Segment(
            index=np.asarray(d["index"], dtype=np.int64), rank=np.asarray(d["rank"], dtype=np.int64),
            badp=np.asarray(d["badp"], dtype=np.int64),
            phases=np.asarray(d["phases"], dtype=np.float64).reshape(m, len(PHASES)),
            steps=np.asarray(d["steps"], dtype=np.int64), noise=np.asarray(d["noise"], dtype=np.float64),
            sched=np.asarray(d["sched"], dtype=np.float64).reshape(m, len(SCHED_COLUMNS)),
            comm=_ragged(d["comm"]), ms=_ragged(d["ms"]), cap_step=np.asarray(d["cap_step"], dtype=np.int64),
            cap_trigger=d["cap_trigger"], hosts=list(hosts), host_code=code, pats=pats,
            stage=np.asarray(d["stage"], dtype=np.int32), groups=groups,
            tele={k: np.asarray(v, dtype=np.float64) for k, v in self._d_tele.items()},
            throttle=dict(self._d_throttle), gc_count=np.asarray(d["gc"], dtype=np.float64),
            device=np.asarray(d["device"], dtype=np.float64).reshape(m, len(DEVICE_COLUMNS)))
        return self._d_cache

    # ---- a block of summaries sharing one layout ------------------------------------------------------
    def add_block(self, doc: dict[str, Any], index: np.ndarray, num: dict[tuple[Any, ...], np.ndarray],
                  strs: dict[tuple[Any, ...], np.ndarray]) -> None:
        """Rows at capture positions ``index`` that share the layout of ``doc`` (a validated summary):
        ``num`` holds their numbers at every path ``block_wants`` (float64 columns), ``strs`` their
        host (numpy bytes); everything else is ``doc``'s. Same result as ``add`` of each row."""
        index = np.asarray(index, dtype=np.int64)
        m = len(index)
        self._next = max(self._next, int(index.max()) + 1 if m else 0)

        def col(path: tuple[Any, ...]) -> np.ndarray:
            c = num.get(path)
            return c if c is not None else np.full(m, _num(_lookup(doc, path)))

        rank = col(("rank",)).astype(np.int64)
        ph = doc["phases"]
        phases = np.empty((m, len(PHASES)))
        for i, p in enumerate(PHASES):
            phases[:, i] = col(("phases", p)) if p in ph else 0.0
        fin = np.isfinite(phases)
        badp = np.where(fin.all(axis=1), -1, np.argmin(fin, axis=1))
        steps = doc["steps"]
        k = len(steps)
        samples = [col(("steps", i, "ms")) for i in range(k)]
        total = np.zeros(m)
        for x in samples:                      # in order, as python's sum()
            total = total + x
        mean = total / k if k else np.zeros(m)
        if k:
            phases[:, 0] = np.where(phases[:, 0] <= 0.0, mean, phases[:, 0])
        if k > 1:
            dev = np.zeros(m)
            for x in samples:
                dev = dev + _py_square(x - mean)
            noise = np.sqrt(dev / (k - 1) / k)
        else:
            noise = np.zeros(m)
        comm = np.full((m, k), np.nan)
        for i, x in enumerate(steps):
            if "comm" in x:
                comm[:, i] = col(("steps", i, "comm"))
        cap = doc.get("capture") or {}
        cap_step = col(("capture", "step")).astype(np.int64) if isinstance(cap.get("step"), int) \
            else np.full(m, -1, dtype=np.int64)
        host = strs.get(("host",))
        if host is not None:
            uniq, code = np.unique(host, return_inverse=True)
            hosts = [h.decode("ascii") for h in uniq.tolist()]
        else:
            hosts, code = [str(doc.get("host", "?"))], np.zeros(m, dtype=np.int64)

        fns = doc["functions"]
        keys_f = [(str(f["name"]), str(f["phase"]), str(f["kind"])) for f in fns]
        pat = FnPattern([k[0] for k in keys_f], [k[1] for k in keys_f], [k[2] for k in keys_f], np.arange(m),
                   [col(("functions", i, "ms")) for i in range(len(fns))],
                   [col(("functions", i, "count")) for i in range(len(fns))], len(set(keys_f)) != len(keys_f))

        stage = np.full(m, -1, dtype=np.int32)
        groups: list[GroupCodes] = []
        for gpos, gname, granks in _recorded_groups(doc["groups"]):
            ranks_of = np.stack([col(("groups", gpos, "ranks", j)) for j in range(len(granks))],
                                axis=1).astype(np.int64)
            if gname in ROLE_DIMS:
                eq = ranks_of == rank[:, None]
                stage = np.where(eq.any(axis=1), eq.argmax(axis=1), stage).astype(np.int32)
            else:
                uniq_r, inv = np.unique(ranks_of, axis=0, return_inverse=True)
                groups.append(GroupCodes(gname in ALIKE_DIMS, gpos,
                                      [(gname, *row) for row in uniq_r.tolist()], inv.reshape(-1)))

        tele = {key: col(("telemetry", "end", "host", key)) - col(("telemetry", "start", "host", key))
                for key in _HOST_COUNTERS}
        tele.update({key: col(("telemetry", "end", "host", key)) for key in _HOST_GAUGES})
        tele.update({key: col(("telemetry", "end", "gpu", key)) for key in _GPU_GAUGES})
        tele.update({f"torch_{key}": col(("telemetry", "end", "torch", key)) for key in _TORCH_SETTINGS})
        g1 = _lookup(doc, ("telemetry", "end", "gpu"))
        reasons = g1.get("throttle") if isinstance(g1, dict) else None
        throttle = {row: [str(x) for x in reasons] for row in range(m)} \
            if isinstance(reasons, list) and reasons else {}
        dp = doc.get("device_phases")
        device = np.full((m, len(DEVICE_COLUMNS)), np.nan)
        if isinstance(dp, dict):
            for i, c in enumerate(DEVICE_COLUMNS):
                device[:, i] = col(("device_phases", c))
                if c.startswith(("htod", "dtoh")):
                    device[:, i] = np.where(np.isnan(device[:, i]), 0.0, device[:, i])
        self._segs.append(Segment(
            index=index, rank=rank, badp=badp, phases=phases, steps=np.full(m, k, dtype=np.int64), noise=noise,
            sched=_sched_block(doc, col, m), comm=comm, ms=np.stack(samples, axis=1) if k else np.zeros((m, 0)),
            cap_step=cap_step,
            cap_trigger=[str(cap.get("trigger", ""))], hosts=hosts, host_code=code.reshape(-1),
            pats=[pat], stage=stage, groups=groups, tele=tele, throttle=throttle,
            gc_count=col(("gc", "count")), device=device))

    # ---- the table ---------------------------------------------------------------------------------
    def finish(self, exclude: Iterable[int] = ()) -> Table:
        """The Table of every row added, less the ranks in ``exclude`` (as if never added)."""
        segs = list(self._segs)
        dseg = self._dict_segment()
        if dseg is not None:
            segs.append(dseg)
        drop = np.asarray(sorted({int(r) for r in exclude}), dtype=np.int64)
        # every row in capture order: which is kept, which is a duplicate, which has a bad phase
        seg_of = np.concatenate([np.full(s.m, i, dtype=np.int64) for i, s in enumerate(segs)] or
                                [np.zeros(0, dtype=np.int64)])
        local = np.concatenate([np.arange(s.m) for s in segs] or [np.zeros(0, dtype=np.int64)])
        index = np.concatenate([s.index for s in segs] or [np.zeros(0, dtype=np.int64)])
        rank_all = np.concatenate([s.rank for s in segs] or [np.zeros(0, dtype=np.int64)])
        finite = np.concatenate([s.badp < 0 for s in segs] or [np.zeros(0, dtype=bool)])
        live = ~np.isin(rank_all, drop) if len(drop) else np.ones(len(rank_all), dtype=bool)
        order = np.flatnonzero(live)[np.argsort(index[live], kind="stable")]
        r_o, f_o = rank_all[order], finite[order]
        uniq, inv = np.unique(r_o, return_inverse=True)
        first_ok = np.full(len(uniq), len(order), dtype=np.int64)   # first finite row of each rank
        fin_pos = np.flatnonzero(f_o)
        np.minimum.at(first_ok, inv[fin_pos], fin_pos)
        pos = np.arange(len(order))
        accepted = first_ok[inv] == pos
        errors: list[str] = []
        for p in np.flatnonzero(~accepted).tolist():
            r = int(r_o[p])
            if p > first_ok[inv[p]]:
                errors.append(f"summary from rank {r}: duplicate rank, kept the first one")
            else:
                bad = PHASES[int(segs[int(seg_of[order[p]])].badp[int(local[order[p]])])]
                errors.append(f"summary from rank {r}: phase {bad!r} is not a finite number; rank skipped")
        rows_acc = order[accepted]                  # accepted rows in capture order = the table's rows
        n = len(rows_acc)
        gpos = [np.full(s.m, -1, dtype=np.int64) for s in segs]
        seg_acc, loc_acc = seg_of[rows_acc], local[rows_acc]
        for i in range(len(segs)):
            sel = seg_acc == i
            gpos[i][loc_acc[sel]] = np.flatnonzero(sel)

        def gather(get: Any, width: int | None = None, dtype: Any = np.float64, fill: float = 0.0) -> np.ndarray:
            out = np.full((n,) if width is None else (n, width), fill, dtype=dtype)
            for i, s in enumerate(segs):
                g = gpos[i]
                ok = g >= 0
                if ok.any():
                    v = get(s)
                    if width is not None and v.shape[1] < width:
                        pad = np.full((s.m, width), fill, dtype=dtype)
                        pad[:, :v.shape[1]] = v
                        v = pad
                    out[g[ok]] = v[ok]
            return out

        ranks = rank_all[rows_acc]
        phase_arr = gather(lambda s: s.phases, len(PHASES))
        notes = _fit_separate_phases(phase_arr, ranks.tolist())

        # hosts and functions: numbered in order of first appearance, as one pass in capture order would
        host_first: dict[str, int] = {}
        for i, s in enumerate(segs):
            g = gpos[i]
            ok = g >= 0
            if not ok.any():
                continue
            first = np.full(len(s.hosts), n, dtype=np.int64)
            np.minimum.at(first, s.host_code[ok], g[ok])
            for h, f in zip(s.hosts, first.tolist(), strict=True):
                if f < n and f < host_first.get(h, n + 1):
                    host_first[h] = f
        hosts = sorted(host_first, key=host_first.__getitem__)
        host_id = {h: j for j, h in enumerate(hosts)}
        host_idx = gather(lambda s: np.asarray([host_id.get(h, -1) for h in s.hosts], dtype=np.int64)[s.host_code],
                          dtype=np.int32, fill=-1)

        # functions are numbered by first appearance: by the first accepted row listing each, then by
        # its place in that row's own list (a pattern's rows share one list, or carry their own order)
        units = []     # (segment, pattern)
        key_ids: dict[FnKey, int] = {}
        cand: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []      # (row, place, key) of each first
        for i, s in enumerate(segs):
            g = gpos[i]
            for pat in s.pats:
                pg = g[pat.rows]
                okp = pg >= 0
                if not okp.any():
                    continue
                kid = np.asarray([key_ids.setdefault(k, len(key_ids)) for k in pat.keys], dtype=np.int64)
                if pat.order is None:
                    j = int(np.argmin(np.where(okp, pg, n)))
                    cand.append((np.full(len(kid), pg[j]), np.arange(len(kid)), kid))
                else:                            # -1: the row does not list it
                    masked = np.where((pat.order >= 0) & okp[None, :], pg[None, :], n)
                    jmin = np.argmin(masked, axis=1) if masked.size else np.zeros(0, dtype=np.int64)
                    first = masked[np.arange(len(kid)), jmin]
                    has = first < n
                    cand.append((first[has], pat.order[np.arange(len(kid)), jmin][has], kid[has]))
                units.append((i, pat))
        if cand:
            c_row, c_pos, c_key = (np.concatenate([c[x] for c in cand]) for x in range(3))
            ks = c_key[np.lexsort((c_pos, c_row))]
            _, at = np.unique(ks, return_index=True)
            all_keys = list(key_ids)
            fn_ids: dict[FnKey, int] = {all_keys[k]: j for j, k in enumerate(ks[np.sort(at)].tolist())}
        else:
            fn_ids = {}
        nf = len(fn_ids)
        fn_ms = np.zeros((n, nf))
        fn_count = np.zeros((n, nf), dtype=np.float32)
        for i, pat in units:
            pg = gpos[i][pat.rows]
            ok = pg >= 0
            every = bool(ok.all())
            rows_t = pg if every else pg[ok]
            cols = [fn_ids.get(x, -1) for x in pat.keys]     # -1: listed by no accepted row (values 0)
            ms = pat.ms if every else [c[ok] for c in pat.ms]
            cnt = pat.cnt if every else [c[ok] for c in pat.cnt]
            if pat.repeats:                  # sum the entries of a name, in list order
                acc_ms: dict[int, np.ndarray] = {}
                acc_cnt: dict[int, np.ndarray] = {}
                for j, c in enumerate(cols):
                    acc_ms[c] = acc_ms.get(c, np.zeros(len(rows_t))) + ms[j]
                    acc_cnt[c] = acc_cnt.get(c, np.zeros(len(rows_t))) + cnt[j]
                cols = list(acc_ms)
                ms, cnt = [acc_ms[c] for c in cols], [acc_cnt[c] for c in cols]
            for c, v_ms, v_cnt in zip(cols, ms, cnt, strict=True):   # a column at a time: no copies
                if c < 0:
                    continue
                fn_ms[rows_t, c] = v_ms
                fn_count[rows_t, c] = v_cnt
        for mat in (fn_ms, fn_count):      # a broken function entry must not poison its column's medians
            if not np.isfinite(mat).all():
                np.nan_to_num(mat, copy=False, nan=0.0, posinf=0.0, neginf=0.0)

        # recorded groups: dp/tp/... sets in order of first appearance; names we cannot read counted
        alike: dict[tuple[Any, ...], tuple[int, int, tuple[int, ...]]] = {}
        unknown: set[tuple[Any, ...]] = set()
        for i, s in enumerate(segs):
            g = gpos[i]
            for grp in s.groups:
                ok = (g >= 0) & (grp.code >= 0)
                if not ok.any():
                    continue
                first = np.full(len(grp.tuples), n, dtype=np.int64)
                np.minimum.at(first, grp.code[ok], g[ok])
                for tup, f in zip(grp.tuples, first.tolist(), strict=True):
                    if f >= n:
                        continue
                    key = (tup[0], tup[1], tup[-1], len(tup) - 1)
                    if not grp.alike:
                        unknown.add(key)
                    elif key not in alike or (f, grp.gpos) < alike[key][:2]:
                        alike[key] = (f, grp.gpos, tuple(int(x) for x in tup[1:]))
        alike_groups = [v[2] for v in sorted(alike.values(), key=lambda v: (v[0], v[1]))]

        cap_step: int | None = None
        cap_trigger: str | None = None
        steps_g = gather(lambda s: s.cap_step, dtype=np.int64, fill=-1)
        has = np.flatnonzero(steps_g >= 0)
        if len(has):
            row0 = int(has[0])
            i, loc = int(seg_acc[row0]), int(loc_acc[row0])
            cap_step = int(steps_g[row0])
            trig = segs[i].cap_trigger
            cap_trigger = trig[loc] if len(trig) > 1 else trig[0]

        throttle: dict[int, list[str]] = {}
        for i, s in enumerate(segs):
            for loc, reasons in s.throttle.items():
                if gpos[i][loc] >= 0:
                    throttle[int(gpos[i][loc])] = reasons
        throttle = dict(sorted(throttle.items()))    # in row order, however the rows were split
        device_rows = gather(lambda s: s.device, len(DEVICE_COLUMNS), fill=np.nan)
        sched_rows = gather(lambda s: s.sched, len(SCHED_COLUMNS), fill=np.nan)
        width = int(gather(lambda s: s.steps, dtype=np.int64).max()) if n else 0
        comm_rows = gather(lambda s: s.comm[:, :width] if s.comm.shape[1] > width else s.comm, width, fill=np.nan)
        ms_rows = gather(lambda s: s.ms[:, :width] if s.ms.shape[1] > width else s.ms, width, fill=np.nan)

        order_r = np.argsort(ranks, kind="stable")
        perm = order_r if not np.all(order_r[:-1] < order_r[1:]) or n < 2 else None
        inv_throttle = throttle
        if perm is not None:
            where = np.empty(n, dtype=np.int64)
            where[order_r] = np.arange(n)
            inv_throttle = dict(sorted((int(where[k]), v) for k, v in throttle.items()))

        def _p(a: np.ndarray) -> np.ndarray:
            return a[perm] if perm is not None else a

        self.row_index = _p(index[rows_acc])   # each table row's position in the capture
        return Table(
            rank=_p(ranks), host_idx=_p(host_idx), hosts=hosts, phases=_p(phase_arr),
            fn_names=[k[0] for k in fn_ids], fn_phase=[k[1] for k in fn_ids], fn_kind=[k[2] for k in fn_ids],
            fn_ms=_p(fn_ms), fn_count=_p(fn_count),
            stage=_p(gather(lambda s: s.stage, dtype=np.int32, fill=-1)), alike_groups=alike_groups,
            unknown_groups=len(unknown),
            telemetry={k: _p(gather(lambda s, k=k: s.tele[k])) for k in TELEMETRY_KEYS},
            throttle=inv_throttle, gc_count=_p(gather(lambda s: s.gc_count)),
            step_noise=_p(np.nan_to_num(gather(lambda s: s.noise))),
            device=_p(device_rows) if n and np.isfinite(device_rows[:, 1]).any() else None,
            sched=_p(sched_rows) if n and np.isfinite(sched_rows).any() else None,
            step_comm=_p(comm_rows) if n and np.isfinite(comm_rows).any() else None,
            step_ms=_p(ms_rows) if n and np.isfinite(ms_rows).any() else None,
            capture_step=cap_step, capture_trigger=cap_trigger, errors=errors, notes=notes)


def _recorded_groups(groups: list[Any]) -> list[tuple[int, str, list[Any]]]:
    """(position, lower-case name, ranks) of each usable process group a summary recorded: how the
    one-at-a-time and the block paths both read ``groups`` (a pipeline dimension in ROLE_DIMS gives
    the rank's stage; the others are groups of ranks, interchangeable when in ALIKE_DIMS)."""
    out = []
    for gpos, g in enumerate(groups):
        if not isinstance(g, dict):
            continue
        granks = g.get("ranks")
        if isinstance(granks, list) and granks:
            out.append((gpos, str(g.get("name", "")).lower(), granks))
    return out


def _lookup(doc: Any, path: tuple[Any, ...]) -> Any:
    """The value at ``path`` in a decoded summary, None where a step of it is absent."""
    cur = doc
    for k in path:
        if isinstance(cur, dict):
            cur = cur.get(k)
        elif isinstance(cur, list) and isinstance(k, int) and 0 <= k < len(cur):
            cur = cur[k]
        else:
            return None
    return cur


def _py_square(a: np.ndarray) -> np.ndarray:
    """``x ** 2`` as python computes it for each float (libm's pow, which differs from x * x in the
    last bit for ~0.1% of values), so a block's step noise is the one-at-a-time path's to the bit."""
    return np.fromiter((v ** 2 for v in a.tolist()), dtype=np.float64, count=len(a))


def _seq_mean(cols: list[np.ndarray], m: int) -> np.ndarray:
    """Row-wise mean of columns summed in order (python's sum over a list), NaN with no column."""
    if not cols:
        return np.full(m, np.nan)
    total = np.zeros(m)
    for c in cols:
        total = total + c
    return total / len(cols)


def _kept_mean(cols: list[np.ndarray], pause: list[np.ndarray], m: int) -> np.ndarray:
    """Row-wise mean of the history columns ``cols`` less the steps ``pause`` marks (aligned from the
    end), summed in order as ``_sched_row`` sums them: a left-out step adds 0.0, which changes no sum.
    NaN where nothing is left."""
    marks = pause[len(pause) - len(cols):] if len(cols) <= len(pause) else \
        [np.zeros(m, dtype=bool)] * (len(cols) - len(pause)) + pause
    total, n = np.zeros(m), np.zeros(m)
    for c, out in zip(cols, marks, strict=True):
        total = total + np.where(out, 0.0, c)
        n = n + ~out
    return np.where(n > 0, total / np.maximum(n, 1.0), np.nan)


def _busy_sd(cpu: list[np.ndarray], runq: list[np.ndarray], data: list[np.ndarray], pause: list[np.ndarray],
             m: int) -> np.ndarray:
    """Row-wise sample standard deviation of the history's busy ms a step (CPU + run-queue + batch wait; no
    batch wait shipped counts 0), less the steps ``pause`` marks (aligned from the end, as ``_kept_mean``),
    to the µs; NaN with fewer than 2 steps. The block path and the one-summary path (one row) both call
    this, so they agree to the bit."""
    n_hist = len(cpu)
    if n_hist < 2 or len(runq) != n_hist or len(data) not in (0, n_hist):
        return np.full(m, np.nan)
    data = data or [np.zeros(m)] * n_hist
    marks = pause[len(pause) - n_hist:] if n_hist <= len(pause) else \
        [np.zeros(m, dtype=bool)] * (n_hist - len(pause)) + pause
    busy = [c + r + d for c, r, d in zip(cpu, runq, data, strict=True)]
    total, n = np.zeros(m), np.zeros(m)
    for b, out in zip(busy, marks, strict=True):
        total = total + np.where(out, 0.0, b)
        n = n + ~out
    mean = total / np.maximum(n, 1.0)
    sq = np.zeros(m)
    for b, out in zip(busy, marks, strict=True):
        d = np.where(out, 0.0, b - mean)
        sq = sq + d * d
    return np.where(n >= 2, _span_round(np.sqrt(sq / np.maximum(n - 1.0, 1.0))), np.nan)


def _pauses(ms: list[float]) -> list[bool]:
    """Which step of a rank's history is a pause: the only one above ``PAUSE_RATIO`` x its median step
    (the upper median), if there is exactly one."""
    if not ms:
        return []
    bar = PAUSE_RATIO * sorted(ms)[len(ms) // 2]
    over = [x > bar for x in ms]
    return over if sum(over) == 1 else [False] * len(ms)


def _pause_cols(ms: list[np.ndarray]) -> list[np.ndarray]:
    """``_pauses`` for a block's rows, one boolean column per history step."""
    if not ms:
        return []
    stacked = np.stack(ms, axis=1)
    over = stacked > PAUSE_RATIO * np.sort(stacked, axis=1)[:, len(ms) // 2][:, None]
    one = over.sum(axis=1) == 1
    return [over[:, j] & one for j in range(len(ms))]


def _span_round(x: Any) -> Any:
    """The span means to the µs: the block codec stores such decimals as small integers (with these
    columns, recorded nodes of 8 ranks grew 12.5 bytes a rank, 2%; unrounded, four such columns cost 23
    against 11); one numpy rounding for both of the table's paths, which must agree bit for bit."""
    return np.round(x, 3)


def _sched_block(doc: dict[str, Any], col: Any, m: int) -> np.ndarray:
    """``_sched_row`` for a block of rows sharing ``doc``'s layout, column by column."""
    steps = doc["steps"]
    win = [i for i, x in enumerate(steps) if "cpu" in x and "runq" in x]
    hist = doc.get("history") or {}

    def hist_cols(c: str) -> list[np.ndarray]:
        return [col(("history", c, j)) for j in range(len(list(hist.get(c) or [])))]

    pause = _pause_cols(hist_cols("ms"))
    recent = {c: hist_cols(c)[-HISTORY_RECENT:] for c in ("ms", "cpu", "runq", "data", "gc", "thr", "late")}
    ms = hist_cols("ms") + [col(("steps", i, "ms")) for i in win]
    if hist.get("stops"):
        stops = [c != 0 for c in hist_cols("stops")]
    else:
        stops = [np.zeros(m, dtype=bool)] * len(hist.get("ms") or [])
    stops = stops + [(col(("steps", i, "stops")) != 0) if "stops" in steps[i] else np.zeros(m, dtype=bool)
                     for i in win]
    t = min(len(ms), len(stops))
    out = np.full((m, len(SCHED_COLUMNS)), np.nan)
    out[:, SCHED_INDEX["cpu"]] = _seq_mean([col(("steps", i, "cpu")) for i in win], m)
    out[:, SCHED_INDEX["runq"]] = _seq_mean([col(("steps", i, "runq")) for i in win], m)
    for c in ("ms", "cpu", "runq", "data", "gc", "thr", "late"):
        out[:, SCHED_INDEX[f"hist_{c}"]] = _kept_mean(recent[c], pause, m)
    n_hist = len(hist_cols("cpu"))
    for c in SPAN_OF:   # thr only where the process was held: none shipped is none held
        cols = hist_cols(c) or ([np.zeros(m)] * n_hist if c == "thr" else [])
        out[:, SCHED_INDEX[f"span_{c}"]] = _span_round(_seq_mean(cols, m))
    out[:, SCHED_INDEX["span_steps"]] = float(n_hist) if n_hist else np.nan
    out[:, SCHED_INDEX["span_busy_sd"]] = _busy_sd(hist_cols("cpu"), hist_cols("runq"), hist_cols("data"), pause, m)
    if win:
        if t:
            vals = np.stack(ms[:t], axis=1)
            stopped = np.stack(stops[:t], axis=1)
            normal = (~stopped).sum(axis=1)
            srt = np.sort(np.where(stopped, np.inf, vals), axis=1)
            typical = np.where(normal > 0, srt[np.arange(m), np.minimum(normal // 2, t - 1)], np.nan)
            total = np.zeros(m)
            for j in range(t):
                total = np.where(stopped[:, j], total + np.maximum(vals[:, j] - typical, 0.0), total)
            out[:, SCHED_INDEX["stop_ms"]] = np.where(normal > 0, total, np.nan)
        out[:, SCHED_INDEX["stops"]] = np.sum(np.stack(stops, axis=1), axis=1) if stops else 0.0
        out[:, SCHED_INDEX["steps_seen"]] = float(len(ms))
    return out


def _mean(xs: list[Any]) -> float:
    return sum(float(x) for x in xs) / len(xs) if xs else math.nan


def _sched_row(s: dict[str, Any]) -> list[float]:
    """SCHED_COLUMNS of one summary: means over the window's steps and the recent history."""
    win = [x for x in s["steps"] if "cpu" in x and "runq" in x]
    hist = s.get("history") or {}
    pause = _pauses([float(x) for x in hist.get("ms") or []])

    def kept(xs: list[Any]) -> list[Any]:   # less the pauses (aligned from the end, as _kept_mean)
        marks = pause[len(pause) - len(xs):] if len(xs) <= len(pause) else [False] * (len(xs) - len(pause)) + pause
        return [x for x, out in zip(xs, marks, strict=True) if not out]

    recent = {c: kept(list(hist.get(c) or [])[-HISTORY_RECENT:])
              for c in ("ms", "cpu", "runq", "data", "gc", "thr", "late")}
    ms = [float(x) for x in hist.get("ms") or []] + [float(x["ms"]) for x in win]
    stops = [bool(x) for x in hist.get("stops") or [0] * len(hist.get("ms") or [])] + \
        [bool(x.get("stops")) for x in win]
    normal = sorted(m for m, st in zip(ms, stops, strict=False) if not st)
    typical = normal[len(normal) // 2] if normal else math.nan
    stop_ms = sum(max(m - typical, 0.0) for m, st in zip(ms, stops, strict=False) if st) if normal else math.nan
    n_hist = len(hist.get("cpu") or [])
    span = [list(hist.get(c) or ([0.0] * n_hist if c == "thr" else [])) for c in SPAN_OF]
    busy_sd = float(_busy_sd(*([np.array([float(x)]) for x in hist.get(c) or []] for c in ("cpu", "runq", "data")),
                             [np.array([x]) for x in pause], 1)[0])
    return [_mean([x["cpu"] for x in win]), _mean([x["runq"] for x in win]),
            _mean(recent["ms"]), _mean(recent["cpu"]), _mean(recent["runq"]), _mean(recent["data"]),
            _mean(recent["gc"]),
            float(sum(stops)) if win else math.nan, stop_ms if win else math.nan, float(len(ms)) if win else math.nan,
            _mean(recent["thr"]), *(float(_span_round(_mean(xs))) for xs in span),
            float(n_hist) if n_hist else math.nan, busy_sd, _mean(recent["late"])]


def _ragged(rows: list[list[float]]) -> np.ndarray:
    """Rows of different lengths as one NaN-padded matrix."""
    width = max((len(r) for r in rows), default=0)
    out = np.full((len(rows), width), np.nan)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


_TIMELINE = [PHASE_INDEX[p] for p in ("data", "forward", "backward", "optimizer", "host_gap")]
_SEPARATE = [PHASE_INDEX[p] for p in ("gc", "io")]


def _fit_separate_phases(ph: np.ndarray, ranks: list[int]) -> list[str]:
    """gc and io are measured apart from the profiler timeline (callbacks, counters). When they do
    not fit in the step (own work far above step - comm), they counted time outside the window's
    steps: scale them down to the room the timeline leaves, in place, and say so."""
    if ph.shape[0] == 0:
        return []
    avail = np.maximum(ph[:, PHASE_INDEX["step"]] - ph[:, PHASE_INDEX["comm"]], 0.0)
    timeline = ph[:, _TIMELINE].sum(axis=1)
    extra = ph[:, _SEPARATE].sum(axis=1)
    bad = (extra > 0) & (timeline + extra > 1.25 * avail + 1.0)
    if not bad.any():
        return []
    rows = np.flatnonzero(bad)
    scale = np.clip((avail[rows] - timeline[rows]) / extra[rows], 0.0, 1.0)
    before = ph[rows][:, PHASE_INDEX["gc"]].copy()
    for c in _SEPARATE:
        ph[rows, c] *= scale
    shown = ", ".join(f"rank {ranks[r]} gc {b:.1f}→{ph[r, PHASE_INDEX['gc']]:.1f} ms (step {ph[r, 0]:.1f})"
                      for r, b in zip(rows[:5].tolist(), before[:5].tolist(), strict=True))
    more = f" and {len(rows) - 5} more" if len(rows) > 5 else ""
    return [f"gc/io phases larger than the step (own work > step - comm) were capped: {shown}{more}"]
