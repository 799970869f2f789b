"""Columnar view of one capture: every rank's summary turned into numpy arrays once.

The analyses then work on whole columns (vectorised over ranks) instead of looping over 100k dicts.
Building the table is one pass over the summaries, so it can consume a generator (decode one, keep
its numbers, drop the dict) and memory stays proportional to ranks × functions floats.
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
# telemetry counters (delta end-start) and gauges (value at the end of the window)
_HOST_COUNTERS = ("cpu_s", "wall_s", "ctx_vol", "ctx_invol", "tcp_retrans", "net_drops", "io_read_bytes",
                  "io_write_bytes")
_GPU_GAUGES = ("sm_mhz", "sm_max_mhz", "temp_c", "power_w", "power_limit_w", "pcie_gen", "pcie_gen_max",
               "pcie_width", "pcie_width_max")
# the device timeline (summary "device_phases", ms or MB per step); NaN for ranks without one
DEVICE_COLUMNS = ("busy", "compute", "comm", "comm_exposed", "transfer", "idle", "forward", "backward",
                  "optimizer", "htod_ms", "htod_mb", "htod_pageable_mb", "dtoh_ms", "dtoh_mb", "dtoh_pageable_mb")
DEVICE_INDEX = {c: i for i, c in enumerate(DEVICE_COLUMNS)}
# the training thread's time from the step clock, ms per step: in the window ("cpu", "runq") and
# in the last HISTORY_RECENT steps before it ("hist_*", data = ms in DataLoader next(), gc = GC pauses); over the window and all the history shipped:
# steps in which the process was stopped and continued ("stops"), their ms beyond the rank's median
# step ("stop_ms", total) and the steps seen; NaN for ranks that did not record it
SCHED_COLUMNS = ("cpu", "runq", "hist_ms", "hist_cpu", "hist_runq", "hist_data", "hist_gc", "stops", "stop_ms",
                 "steps_seen")
SCHED_INDEX = {c: i for i, c in enumerate(SCHED_COLUMNS)}
HISTORY_RECENT = 8     # a burst is seen by the vote 6-7 steps before the window opens


@dataclass
class Table:
    """One capture as arrays; row i describes rank ``rank[i]`` (rows sorted by rank)."""

    rank: np.ndarray                 # (R,) int64
    host_idx: np.ndarray             # (R,) int32 into ``hosts``
    hosts: list[str]
    phases: np.ndarray               # (R, len(PHASES)) float64, columns in summary.PHASES order
    fn_names: list[str]
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
    capture_step: int | None = None
    capture_trigger: str | None = None
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    _fn_index: dict[str, int] = field(default_factory=dict)

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

    def fn(self, name: str) -> int | None:
        """Column of function ``name`` or None."""
        if not self._fn_index:
            self._fn_index = {n: i for i, n in enumerate(self.fn_names)}
        return self._fn_index.get(name)

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
    have passed ``summary.validate`` (decode does that).
    """
    ranks: list[int] = []
    host_ids: dict[str, int] = {}
    host_idx: list[int] = []
    phase_rows: list[list[float]] = []
    fn_ids: dict[str, int] = {}
    fn_phase: list[str] = []
    fn_kind: list[str] = []
    # Rows that list the same function names in the same order (the common case) share a
    # "pattern": their values go to per-pattern buffers and land in the dense matrix with one
    # block assignment. Other rows (too many patterns, repeated names) go through COO triplets.
    pat_ids: dict[tuple[str, ...], int] = {}
    pat_cols: list[np.ndarray] = []
    pat_rows: list[array] = []
    pat_ms: list[array] = []
    pat_cnt: list[array] = []
    f_row, f_col = array("q"), array("q")
    f_ms, f_cnt = array("d"), array("d")
    stage: list[int] = []
    alike: dict[tuple[Any, ...], tuple[int, ...]] = {}
    unknown: set[tuple[Any, ...]] = set()
    tele: dict[str, list[float]] = {k: [] for k in _HOST_COUNTERS + _GPU_GAUGES}
    throttle: dict[int, list[str]] = {}
    gc_count: list[float] = []
    noise: list[float] = []
    device_rows: list[list[float]] = []
    sched_rows: list[list[float]] = []
    comm_rows: list[list[float]] = []
    seen: set[int] = set()
    errors: list[str] = []
    cap_step: int | None = None
    cap_trigger: str | None = None

    for s in summaries:
        r = int(s["rank"])
        if r in seen:
            errors.append(f"summary from rank {r}: duplicate rank, kept the first one")
            continue
        ph = s["phases"]
        vals = [float(ph.get(p, 0.0)) for p in PHASES]
        samples = [float(x["ms"]) for x in s["steps"]]
        if not all(map(math.isfinite, vals)):   # one NaN would blind its whole peer group's medians
            bad = next(p for p, v in zip(PHASES, vals, strict=True) if not math.isfinite(v))
            errors.append(f"summary from rank {r}: phase {bad!r} is not a finite number; rank skipped")
            continue
        seen.add(r)
        row = len(ranks)
        ranks.append(r)
        h = str(s.get("host", "?"))
        host_idx.append(host_ids.setdefault(h, len(host_ids)))
        k = len(samples)
        mean = sum(samples) / k if k else 0.0
        if vals[0] <= 0.0 and k:
            vals[0] = mean
        noise.append(math.sqrt(sum((x - mean) ** 2 for x in samples) / (k - 1) / k) if k > 1 else 0.0)
        phase_rows.append(vals)
        sched_rows.append(_sched_row(s))
        comm_rows.append([float(x.get("comm", math.nan)) for x in s["steps"]])
        cap = s.get("capture") or {}
        if cap_step is None and isinstance(cap.get("step"), int):
            cap_step, cap_trigger = cap["step"], str(cap.get("trigger", ""))

        fns = s["functions"]
        names = tuple([f["name"] for f in fns])
        pid = pat_ids.get(names)
        if pid is None:
            cols_l = []
            for f in fns:
                c = fn_ids.get(f["name"])
                if c is None:
                    c = fn_ids[f["name"]] = len(fn_phase)
                    fn_phase.append(str(f["phase"]))
                    fn_kind.append(str(f["kind"]))
                cols_l.append(c)
            if len(pat_ids) < 4096 and len(set(cols_l)) == len(cols_l):
                pid = pat_ids[names] = len(pat_cols)
                pat_cols.append(np.asarray(cols_l, dtype=np.int64))
                pat_rows.append(array("q"))
                pat_ms.append(array("d"))
                pat_cnt.append(array("d"))
            else:
                f_col.extend(cols_l)
                f_row.extend([row] * len(fns))
                f_ms.extend([float(f["ms"]) for f in fns])
                f_cnt.extend([float(f["count"]) for f in fns])
        if pid is not None:
            pat_rows[pid].append(row)
            pat_ms[pid].extend([f["ms"] for f in fns])
            pat_cnt[pid].extend([f["count"] for f in fns])

        st = -1
        for g in s["groups"]:
            if not isinstance(g, dict):
                continue
            gname = str(g.get("name", "")).lower()
            granks = g.get("ranks")
            if not isinstance(granks, list) or not granks:
                continue
            key = (gname, granks[0], granks[-1], len(granks))
            if gname in ROLE_DIMS:
                if r in granks:
                    st = granks.index(r)
            elif gname in ALIKE_DIMS:
                if key not in alike:
                    alike[key] = tuple(int(x) for x in granks)
            else:
                unknown.add(key)
        stage.append(st)

        t = s.get("telemetry") or {}
        t0 = (t.get("start") or {}).get("host") or {}
        t1 = (t.get("end") or {}).get("host") or {}
        for k in _HOST_COUNTERS:
            tele[k].append(_num(t1.get(k)) - _num(t0.get(k)))
        g1 = (t.get("end") or {}).get("gpu") or {}
        for k in _GPU_GAUGES:
            tele[k].append(_num(g1.get(k)))
        reasons = g1.get("throttle") if isinstance(g1, dict) else None
        if isinstance(reasons, list) and reasons:
            throttle[row] = [str(x) for x in reasons]
        gcd = s.get("gc") or {}
        gc_count.append(_num(gcd.get("count")))
        dp = s.get("device_phases")
        if isinstance(dp, dict):
            row_dev = [_num(dp.get(c)) for c in DEVICE_COLUMNS]
            for i, c in enumerate(DEVICE_COLUMNS):   # directions without copies: none moved
                if c.startswith(("htod", "dtoh")) and math.isnan(row_dev[i]):
                    row_dev[i] = 0.0
            device_rows.append(row_dev)
        else:
            device_rows.append([float("nan")] * len(DEVICE_COLUMNS))

    n, nf = len(ranks), len(fn_phase)
    names_by_id = [""] * nf
    for name, i in fn_ids.items():
        names_by_id[i] = name
    fn_ms = np.zeros((n, nf))
    fn_count = np.zeros((n, nf), dtype=np.float32)
    for cols, rows_a, ms_a, cnt_a in zip(pat_cols, pat_rows, pat_ms, pat_cnt, strict=True):
        rows_np = np.frombuffer(rows_a, dtype=np.int64)
        if len(cols) and len(rows_np):
            fn_ms[rows_np[:, None], cols[None, :]] = np.frombuffer(ms_a, dtype=np.float64).reshape(-1, len(cols))
            fn_count[rows_np[:, None], cols[None, :]] = np.frombuffer(cnt_a, dtype=np.float64).reshape(-1, len(cols))
    if len(f_row) and nf:
        flat = np.frombuffer(f_row, dtype=np.int64) * nf + np.frombuffer(f_col, dtype=np.int64)
        fn_ms += np.bincount(flat, weights=np.frombuffer(f_ms, dtype=np.float64), minlength=n * nf).reshape(n, nf)
        fn_count += np.bincount(flat, weights=np.frombuffer(f_cnt, dtype=np.float64),
                                minlength=n * nf).reshape(n, nf).astype(np.float32)

    for m in (fn_ms, fn_count):      # a broken function entry must not poison its column's medians
        if not np.isfinite(m).all():
            np.nan_to_num(m, copy=False, nan=0.0, posinf=0.0, neginf=0.0)

    rank_arr = np.asarray(ranks, dtype=np.int64)
    order = np.argsort(rank_arr, kind="stable")
    perm = order if not np.all(order[:-1] < order[1:]) or n < 2 else None
    inv_throttle = throttle
    if perm is not None:
        pos = np.empty(n, dtype=np.int64)
        pos[order] = np.arange(n)
        inv_throttle = {int(pos[k]): v for k, v in throttle.items()}

    def _p(a: np.ndarray) -> np.ndarray:
        return a[perm] if perm is not None else a

    phase_arr = np.asarray(phase_rows, dtype=np.float64).reshape(n, len(PHASES))
    notes = _fit_separate_phases(phase_arr, ranks)

    return Table(
        rank=_p(rank_arr), host_idx=_p(np.asarray(host_idx, dtype=np.int32)),
        hosts=list(host_ids), phases=_p(phase_arr),
        fn_names=names_by_id, fn_phase=fn_phase, fn_kind=fn_kind, fn_ms=_p(fn_ms), fn_count=_p(fn_count),
        stage=_p(np.asarray(stage, dtype=np.int32)), alike_groups=list(alike.values()),
        unknown_groups=len(unknown),
        telemetry={k: _p(np.asarray(v, dtype=np.float64)) for k, v in tele.items()},
        throttle=inv_throttle, gc_count=_p(np.asarray(gc_count, dtype=np.float64)),
        step_noise=_p(np.nan_to_num(np.asarray(noise, dtype=np.float64))),
        device=_p(np.asarray(device_rows, dtype=np.float64).reshape(n, len(DEVICE_COLUMNS)))
        if any(math.isfinite(r[1]) for r in device_rows) else None,
        sched=_p(np.asarray(sched_rows, dtype=np.float64).reshape(n, len(SCHED_COLUMNS)))
        if any(math.isfinite(x) for r in sched_rows for x in r) else None,
        step_comm=_p(_ragged(comm_rows)) if any(math.isfinite(x) for r in comm_rows for x in r) else None,
        capture_step=cap_step, capture_trigger=cap_trigger, errors=errors, notes=notes)


def _mean(xs: list[Any]) -> float:
    return sum(float(x) for x in xs) / len(xs) if xs else math.nan


def _sched_row(s: dict[str, Any]) -> list[float]:
    """SCHED_COLUMNS of one summary: means over the window's steps and the recent history."""
    win = [x for x in s["steps"] if "cpu" in x and "runq" in x]
    hist = s.get("history") or {}
    recent = {c: list(hist.get(c) or [])[-HISTORY_RECENT:] for c in ("ms", "cpu", "runq", "data", "gc")}
    ms = [float(x) for x in hist.get("ms") or []] + [float(x["ms"]) for x in win]
    stops = [bool(x) for x in hist.get("stops") or [0] * len(hist.get("ms") or [])] + \
        [bool(x.get("stops")) for x in win]
    normal = sorted(m for m, st in zip(ms, stops, strict=False) if not st)
    typical = normal[len(normal) // 2] if normal else math.nan
    stop_ms = sum(max(m - typical, 0.0) for m, st in zip(ms, stops, strict=False) if st) if normal else math.nan
    return [_mean([x["cpu"] for x in win]), _mean([x["runq"] for x in win]),
            _mean(recent["ms"]), _mean(recent["cpu"]), _mean(recent["runq"]), _mean(recent["data"]),
            _mean(recent["gc"]),
            float(sum(stops)) if win else math.nan, stop_ms if win else math.nan, float(len(ms)) if win else math.nan]


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
