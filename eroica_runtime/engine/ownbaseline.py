"""Ranks that have no peers, compared with themselves in the job's baseline capture.

Differential observability compares a rank with the ranks that should behave alike. Some jobs have
ranks that nothing is alike to: a pipeline with one rank per stage (4 stages on 4 ranks) runs a
different slice of the model on every rank. With a straggler on its second stage, every capture
said "4 rank(s) have no peers to compare with" and named nobody. The straggler's forward had grown
from 2 to 154 ms a step, and the other three ranks' waits had grown by as much (the fault bench's
pp4-compute, 2026-12-03).

Such a rank can still be compared with itself. The baseline capture, taken right after warm-up,
holds its healthy step. A peerless rank whose own work grew against its baseline row, while its wait
did not grow with it, is a culprit candidate. It is reported only if other ranks waited for it
(``attribution.find_victims``, as for every culprit): a job-wide slowdown grows every rank's own work
alike, and nobody waits for anybody then.
"""

from __future__ import annotations

import math

import numpy as np

from eroica_runtime.engine.attribution import WAIT_SHARE, Culprit, grown_functions, settle_function, views
from eroica_runtime.engine.baseline import Thresholds
from eroica_runtime.engine.categories import pick_category
from eroica_runtime.engine.peers import Peers
from eroica_runtime.engine.table import Table


def lone_culprits(table: Table, base: Table | None, peers: Peers, th: Thresholds) -> list[Culprit]:
    """Culprits among the ranks without peers, each against its own row in the baseline capture.

    The bars are a small group's: ``small_rel_step`` of the rank's baseline step, more than the
    noise of the two windows' mean steps (``regression_noise_k`` standard errors), and a wait that
    grew by less than ``WAIT_SHARE`` of the excess. A rank that makes others wait arrives last and
    waits least.
    """
    lone = [(gi, int(g[0])) for gi, g in enumerate(peers.groups) if len(g) == 1]
    if not lone or base is None or not base.n or table.n < 2:
        return []   # (one rank alone: nobody can wait for it; a slower job is commonmode's regression)
    rows = np.asarray([r for _, r in lone], dtype=np.int64)
    own, wait, parts = views(table, rows)
    base_rows = base.rows_of(table.rank[rows])
    if not len(base_rows):
        return []
    b_own, b_wait, b_parts = views(base, base_rows)
    b_of = {int(base.rank[b]): int(b) for b in base_rows}
    step, b_step = table.col("step"), base.col("step")
    out: list[Culprit] = []
    for gi, row in lone:
        b = b_of.get(int(table.rank[row]))
        if b is None or not set(parts) <= set(b_parts):   # (a host row against a device row: not alike)
            continue
        noise = th.regression_noise_k * math.hypot(float(table.step_noise[row]), float(base.step_noise[b]))
        limit = max(th.abs_ms, th.small_rel_step * float(b_step[b]), noise)
        excess = float(own[row] - b_own[b])
        d_wait = float(wait[row] - b_wait[b])
        if not (excess >= limit and d_wait < WAIT_SHARE * excess):
            continue
        sigma = max(noise / th.regression_noise_k, th.sigma_floor_rel * float(b_own[b]), 0.05)
        pex = {p: float(parts[p][row] - b_parts[p][b]) for p in parts}
        c = Culprit(row=row, group=gi, excess_ms=excess, z=excess / sigma, own=float(own[row]),
                    own_ref=float(b_own[b]), comm=float(wait[row]), comm_ref=float(b_wait[b]),
                    step=float(step[row]), step_ref=float(b_step[b]), phase_excess=pex,
                    phase_ref={p: float(b_parts[p][b]) for p in parts}, device=table.has_device(rows),
                    baseline_step=base.capture_step)
        _attribute(table, base, c, b, th)
        out.append(c)
    return out


def _attribute(table: Table, base: Table, c: Culprit, b: int, th: Thresholds) -> None:
    """Category, phase and grown functions against the rank's own baseline row (functions matched by
    name and phase; one the baseline did not have counts from zero)."""
    c.category, c.phase = pick_category(c.phase_excess)
    col = phase = None
    if table.fn_names:
        bidx = {k: i for i, k in enumerate(zip(base.fn_names, base.fn_phase, strict=True))}
        cols = [bidx.get(k) for k in zip(table.fn_names, table.fn_phase, strict=True)]
        ref = np.asarray([base.fn_ms[b, j] if j is not None else 0.0 for j in cols], dtype=np.float64)
        calls = np.asarray([base.fn_count[b, j] if j is not None else 0.0 for j in cols], dtype=np.float64)
        col, phase, grown = grown_functions(table, c.row, ref, c.category, c.excess_ms, th, np.asarray([c.row]))
        # against itself then, in the shape the reports print as "now vs baseline" (commonmode's)
        col_of = {k: j for j, k in enumerate(zip(table.fn_names, table.fn_phase, strict=True))}
        c.functions = [{"name": f["name"], "phase": f["phase"], "kind": f["kind"], "now_ms": f["rank_ms"],
                        "baseline_ms": f["peers_ms"], "now_calls": f["rank_calls"],
                        "baseline_calls": float(calls[col_of[(f["name"], f["phase"])]])} for f in grown]
    settle_function(table, c, col, phase)
