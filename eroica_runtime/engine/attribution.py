"""Culprits versus victims inside each peer group, and the function that grew most on a culprit.

In synchronous training a late rank makes everyone else wait in the next collective. Against the
peers' median the culprit therefore shows MORE own work (data+forward+backward+optimizer+host_gap+
gc+io) and LESS communication wait, while its victims show the opposite: normal own work, a wait
that grew by about the culprit's excess. Only culprits become findings; victims are listed on them.
The median finds the culprits; once found, they are measured against the members that were not.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from eroica_runtime.engine.baseline import (
    Thresholds,
    center,
    column_center,
    column_reference,
    group_bars,
    median_of_others,
    significant,
)
from eroica_runtime.engine.categories import (
    SAME_CALLS,
    function_candidates,
    is_memory_function,
    pick_category,
    work_verdict,
)
from eroica_runtime.engine.lonework import LoneWork, one_off_note, periodic, robust_levels, taken_out_note
from eroica_runtime.engine.peers import Peers
from eroica_runtime.engine.quota import throttled_ms
from eroica_runtime.engine.table import Table
from eroica_runtime.summary import OWN_WORK_PHASES

LUCK_SHARE = 0.25   # scheduler luck is judged only when it is at least this share of the excess
LUCK_SWING = 2.0    # run-queue excess up to this x the rank's excess before the window is contention, not luck
# a rank's run-queue excess over the steps before the window is contention that persists from this share
# of the step (the rule of history._persistent_contention too)
CONTENTION_SHARE = 0.15
# window-only CPU (window_only_cpu): the rank's extra CPU a step in the window is at least this share of
# its excess, and its extra CPU a step before the window at most WINDOW_BEFORE_SHARE of that
WINDOW_CPU_SHARE = 0.5
WINDOW_BEFORE_SHARE = 0.25
WAIT_SHARE = 0.5         # a rank whose wait shrank by this share of its own-work excess is corroborated
# cpu_backed: the rank's extra CPU a step is at least this share of its excess in the window and before it
CPU_BACKED_SHARE = 0.5
PART_WAIT_SHARE = 0.25   # ... and by this share of one part's excess (one_part_stragglers)


@dataclass
class Culprit:
    """A rank whose own work grew against its peers while its wait did not."""

    row: int
    group: int
    excess_ms: float
    z: float
    own: float
    own_ref: float
    comm: float
    comm_ref: float
    step: float
    step_ref: float
    phase_excess: dict[str, float]
    phase_ref: dict[str, float]
    category: str = "compute"
    phase: str = "forward"
    function: str | None = None
    function_col: int | None = None   # the named function's column in the table, when one is named
    functions: list[dict] = field(default_factory=list)
    victims: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    device: bool = False        # compared on the device timeline (a GPU job)
    waited_ms: float | None = None   # how much longer its victims waited than it did (median), ms per step
    sched: dict[str, Any] | None = None   # run-queue evidence (scheduler_luck), host timeline only
    baseline_step: int | None = None   # compared with its own row in the baseline capture at this step
                                       # (a rank without peers: ownbaseline.py), not with peers
    alone: dict[str, Any] | None = None   # worked alone in a window step, as before it (lonework.periodic)
    ref_rows: np.ndarray | None = None   # the peers it is measured against (measured_against); None: its group

    @property
    def cost_ms(self) -> float:
        """What the rank costs the job per step: its own-work excess, but no more than its victims
        waited for it. On shared cores the two differ (a rank collecting garbage for 211 ms left its
        peers the CPU; its excess over their 26 ms was 201 ms, the job's step grew 166 ms, and they
        waited 170 ms longer than it did), and "step -> X ms if fixed" must not fall below the
        healthy step. Work alone in a step of the window that recurs (``alone``) costs its average
        over every step seen."""
        if self.alone is not None:
            return float(self.alone["average_ms"])
        if self.waited_ms is not None and 0.0 < self.waited_ms < self.excess_ms:
            return self.waited_ms
        return self.excess_ms

    @property
    def level_ms(self) -> float:
        """How far above its peers' own work this rank holds the step: its cost, but no more than its
        whole own work's excess. The two differ for a rank named on one part whose other parts ran
        faster (on the cores its waiting peers left free, or overlapped by a pipeline schedule: the
        fault bench's zb-data, run 49, named rank 1's batches at +81.6 ms a step, its whole own work
        +47.4 ms). With two culprits (2026-12-06: rank 3's extra matmuls, rank 1's slow batches),
        fixing rank 3 brings the step down to rank 1's level (the job with rank 1's fault alone ran
        121 ms a step), not by the difference between their costs (which said 164 ms of 195)."""
        if self.alone is not None:
            return self.cost_ms
        return max(min(self.cost_ms, self.own - self.own_ref), 0.0)

    def peer_rows(self, peers: Peers) -> np.ndarray:
        """The table rows it is compared with: ``ref_rows``, or its whole peer group."""
        return self.ref_rows if self.ref_rows is not None else peers.groups[self.group]


# On a GPU the host runs ahead and its phases do not show who made whom wait; the device does.
# A rank's own work there is the step minus its exposed collective wait (an NCCL kernel spinning
# with nothing else running): what its device computed and copied, plus the time the device sat
# idle waiting for the host (input, GC, launches). Its parts say which kind of fault it is.


def views(table: Table, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """(own work, wait, parts of own work) for every table row, on the device when the whole peer
    group has a device timeline (a GPU job), else on the host timeline (summary phases)."""
    if table.has_device(rows):
        step = table.col("step")
        wait = table.dev("comm_exposed")
        compute = table.dev("compute")
        by_phase = {p: table.dev(p) for p in ("forward", "backward", "optimizer")}
        parts = {**by_phase, "device_other": np.maximum(compute - sum(by_phase.values()), 0.0),
                 "transfer": table.dev("transfer"),
                 **{p: table.col(p) for p in ("data", "gc", "io", "host_gap")}}
        return np.maximum(step - wait, 0.0), wait, parts
    own, wait = table.own, table.col("comm")
    parts = {p: table.col(p) for p in OWN_WORK_PHASES}
    busy = table.sch("cpu") + table.sch("runq")
    if np.isfinite(busy[rows]).all():
        # The profiler books the time a CPU-starved thread (a CPU quota, co-located hogs) spends
        # waiting for a CPU to whatever op it is in, collective launches included; a wait for peers
        # is spent asleep, never running or runnable. So the training thread's CPU plus run-queue
        # time is own work whatever op it fell in: what the timeline booked as comm beyond
        # step - (cpu + runq) was the rank's own starvation (booked as host_gap here).
        hidden = np.nan_to_num(np.clip(np.minimum(busy, table.col("step")) - own, 0.0, None))
        own, wait = own + hidden, np.maximum(wait - hidden, 0.0)
        parts["host_gap"] = parts["host_gap"] + hidden
    throttled = throttled_ms(table)
    if np.isfinite(throttled[rows]).any():
        # A CPU quota throttles the whole process, its collective threads too: the training thread
        # then sleeps in a collective that its own rank holds up, which neither its CPU nor its run
        # queue shows. The cgroup's throttled time beyond the thread's own run-queue time (throttled
        # while runnable itself, counted above) is that. Without a run queue, the throttled time is
        # taken as spread over the step like the rest of it.
        runq = table.sch("runq")
        step = table.col("step")
        with np.errstate(divide="ignore", invalid="ignore"):
            spread = np.where(step > 0, throttled * wait / step, 0.0)
        extra = np.where(np.isfinite(runq), throttled - runq, spread)
        extra = np.minimum(np.nan_to_num(np.clip(extra, 0.0, None)), wait)
        own, wait = own + extra, wait - extra
        parts["host_gap"] = parts["host_gap"] + extra
    return own, wait, parts


def _only_lone(table: Table, work: LoneWork | None, excess: float, rest_bar: float | None) -> bool:
    """Whether a lone rank's window excess is its one lone step's work and nothing else: on the
    window's other steps it was not slower than its peers by ``rest_bar`` (the share of the step a
    rank must lose to be worth a finding, ``rel_step`` of the group's step without lone work). Such a
    rank is judged as lone work (recurring or a one-off: lonework.periodic), never at the window's
    cost a step. Why: one step's work alone sets the rank's excess and every rank's std error of its
    mean step alike (one b among n - 1 a: both (b - a) / n), so the whole window's noise bar
    (noise_k = 1) was a coin toss. A 4-rank job whose rank 3 slept 2 s once in a manual capture's
    3-step window (2026-12-07), run twice: "HOST: rank 3 ... +667.0 ms/step (step -> 13.9 ms if
    fixed)" once, "healthy" the other time. A rank short of memory, 81 ms alone in one step and 14 ms
    a step slower in the other two (tests/data/memory/short-rank1), is no such rank."""
    if work is None or len(work.steps) != 1 or table.step_ms is None or rest_bar is None:
        return False
    n = int(np.isfinite(table.step_ms[work.row]).sum())
    return n > 1 and (excess * n - work.ms) / (n - 1) < rest_bar


def find_culprits(table: Table, peers: Peers, th: Thresholds, notes: list[str] | None = None,
                  alone: dict[int, LoneWork] | None = None, below_bar: bool = False,
                  one_offs_out: list[LoneWork] | None = None) -> list[Culprit]:
    """Scan every peer group (vectorised within a group) for culprits; what was left out and why is
    appended to ``notes``. ``alone``: the window steps a rank worked alone in (lonework.lone_steps):
    the other ranks are judged on the window's other steps, and a lone rank whose excess does not
    clear the whole window's noise is named only when its work recurs (lonework.periodic).
    ``below_bar``: a lone rank whose window excess is under the share of the step a window must
    show is named too when its work recurs at that share on average (engine.diagnose asks when
    nothing else was named: a window can hold fewer of its lone steps than it does on average)."""
    step_all = table.col("step")
    alone = alone or {}
    out: list[Culprit] = []
    luck: list[tuple[int, float, dict[str, Any]]] = []
    window_only: list[tuple[int, float, dict[str, float]]] = []   # window_only_cpu
    taken_out: list[LoneWork] = []   # lone work the group's other ranks were judged without
    one_offs: list[LoneWork] = []    # lone work under the noise that the steps before the window do not show
    cpu_named: list[tuple[int, float, int, dict[str, float]]] = []   # (row, share of the step, group size, cpu_backed)
    for gi, rows in enumerate(peers.groups):
        if len(rows) < 2:
            continue
        own_all, comm_all, parts = views(table, rows)
        part_names = list(parts)
        part_matrix = np.stack([parts[p] for p in part_names], axis=1)
        own = own_all[rows]
        c_own = center(own, th.sigma_floor_rel)
        step_ref = float(np.median(step_all[rows]))
        # how much a K-step average wobbles on this machine: the peers' typical std error
        noise = th.noise_k * float(np.median(table.step_noise[rows]))
        limit = max(th.abs_ms, min(th.rel_step, th.small_rel_step) * step_ref, noise)
        # (step reference, noise, limit) each member is judged by: a step a rank worked alone in sets
        # every rank's step time, so the others are judged on the window's other steps
        levels = [(step_ref, noise, limit)] * len(rows)
        robust = robust_levels(table, rows, alone, th)
        if robust is not None:
            taken_out += [alone[int(r)] for r in rows.tolist() if int(r) in alone]
            r_ref, r_noise = robust
            r_level = (r_ref, r_noise, max(th.abs_ms, min(th.rel_step, th.small_rel_step) * r_ref, r_noise))
            levels = [(step_ref, noise, limit) if int(r) in alone else r_level for r in rows.tolist()]
        rest_bar = max(th.abs_ms, th.rel_step * robust[0]) if robust is not None else None
        # a lone rank is a candidate from the share of the step alone: its lone step is most of the noise
        lim_v = np.asarray([max(th.abs_ms, min(th.rel_step, th.small_rel_step) * lv[0]) if int(r) in alone else lv[2]
                            for r, lv in zip(rows.tolist(), levels, strict=True)])
        c_comm = center(comm_all[rows], th.sigma_floor_rel)
        wait = comm_all[rows]
        # (excess, its spread, the part it was found on or None for the whole own work, the wait it is
        # corroborated by, and the share of the excess that wait must reach)
        found: dict[int, tuple[float, float, int | None, float, float]] = {}
        recurring: dict[int, dict[str, Any]] = {}
        lone_v = np.asarray([int(r) in alone for r in rows.tolist()], dtype=bool)
        for k in np.flatnonzero((own - c_own.ref >= lim_v) | (below_bar & lone_v & (own > c_own.ref))).tolist():
            excess = float(own[k] - c_own.ref)
            d_wait = float(wait[k]) - _wait_ref(wait, c_comm.ref, k)
            z = excess / c_own.sigma if c_own.sigma > 0 else float("inf")
            sref, nz, _ = levels[k]
            corroborated = d_wait <= -WAIT_SHARE * excess
            over = excess >= lim_v[k]
            passes = over and significant(excess, z, sref, th, len(rows), corroborated)
            if over and not passes and corroborated:
                backed = cpu_backed(table, rows, int(rows[k]), excess, sref, z, th)
                if backed is not None:
                    passes = True
                    cpu_named.append((int(rows[k]), excess / sref, len(rows), backed))
            if d_wait < excess and passes and excess >= nz and not _only_lone(table, alone.get(int(rows[k])),
                                                                                excess, rest_bar):
                found[k] = (excess, c_own.sigma, None, d_wait, WAIT_SHARE)
            elif lone_v[k] and d_wait < excess and (passes or (below_bar and corroborated)):
                # under the noise its own lone step made, or under the share of the step a window must
                # show (a 4-rank job whose rank 0 logged metrics for 40 ms every 10 steps, 2026-12-05:
                # its 16-step window held one such step, +2.6 ms a step against a 3.0 bar, 3.7 on
                # average): named if it recurs, at what it costs on average
                again = periodic(table, rows, alone[int(rows[k])], excess, (robust or (step_ref,))[0], th)
                if again is not None:
                    found[k] = (excess, c_own.sigma, None, d_wait, WAIT_SHARE)
                    recurring[k] = again
                elif passes:
                    one_offs.append(alone[int(rows[k])])
        # one part alone only where a wait for a CPU is told from work (the device, or the step clock's run
        # queue): without it, a rank preempted in one phase of a healthy window looks like its straggler
        parts_ok = table.has_device(rows) or bool(np.isfinite(table.sch("cpu")[rows] + table.sch("runq")[rows]).all())
        for lv in sorted(set(levels)) if parts_ok else ():
            sref, nz, lim = lv
            for k, (excess, sigma, part, d_wait) in one_part_stragglers(part_matrix[rows], wait, lim, sref,
                                                                        th).items():
                if levels[k] == lv and k not in found and excess >= nz and not _only_lone(
                        table, alone.get(int(rows[k])), float(own[k] - c_own.ref), rest_bar):
                    found[k] = (excess, sigma, part, d_wait, PART_WAIT_SHARE)
        found.update(among_the_rest(own, wait, found, lone_v, lim_v, levels, th))
        ref_rows = measured_against(rows, found)
        r_own, *r_parts, r_wait = column_reference(np.column_stack(
            [own_all[ref_rows], part_matrix[ref_rows], comm_all[ref_rows]]), np.arange(len(ref_rows))).tolist()
        for k, (excess, sigma, part, d_wait, share) in sorted(found.items()):
            row = int(rows[k])
            sref, lim = levels[k][0], float(lim_v[k])
            z = excess / sigma if sigma > 0 else float("inf")
            sched = None if table.has_device(rows) else scheduler_luck(table, rows, row)
            # a few ms more run queue than the peers is their normal spread, not what made it slow
            if sched is not None and sched["luck_ms"] >= LUCK_SHARE * excess:
                left = excess - sched["luck_ms"]
                if left < lim or not significant(left, left / sigma if sigma > 0 else float("inf"),
                                                 sref, th, len(rows), d_wait <= -share * left):
                    luck.append((row, excess, sched))
                    continue
            spell = None if table.has_device(rows) else window_only_cpu(table, rows, row, excess, th)
            if spell is not None:
                window_only.append((row, excess, spell))
                continue
            if part is not None and notes is not None:
                whole = float(own[k] - c_own.ref)
                notes.append(f"rank {int(table.rank[row])} named on its {part_names[part]} alone: +{excess:.1f} ms/step "
                             f"against its peers (z {z:.1f}) while it waited {-d_wait:.1f} ms less; its whole own "
                             f"work, {whole:+.1f} ms (z {whole / c_own.sigma if c_own.sigma > 0 else 0.0:.1f}), "
                             "did not stand out from the peers' spread")
            measured = float(own[k] - r_own) if part is None else float(part_matrix[row, part] - r_parts[part])
            pex = {p: float(part_matrix[row, i] - r_parts[i]) for i, p in enumerate(part_names)}
            out.append(Culprit(row=row, group=gi, excess_ms=measured, z=float(z), own=float(own[k]),
                               own_ref=r_own, comm=float(comm_all[row]), comm_ref=r_wait,
                               step=float(step_all[row]), step_ref=step_ref, phase_excess=pex,
                               phase_ref={p: float(r_parts[i]) for i, p in enumerate(part_names)},
                               device=table.has_device(rows), sched=sched, alone=recurring.get(k),
                               ref_rows=ref_rows))
    if one_offs_out is not None:
        one_offs_out.extend(one_offs)
    if notes is not None:
        named = {c.row for c in out}
        notes += ([taken_out_note(table, taken_out)] if taken_out else []) + \
            ([one_off_note(table, one_offs)] if one_offs else []) + \
            [f"rank {int(table.rank[r])} named from {_share_below(share, th.small_rel_step)} of the step, not the "
             f"{th.small_rel_step:.0%} a group "
             f"of {n} asks: its training thread was on a CPU {bk['cpu_ms'] - bk['peers_cpu_ms']:.1f} ms a step "
             f"longer than its peers' in the window and {bk['cpu_before_ms'] - bk['peers_cpu_before_ms']:.1f} ms "
             "in the steps before it, and its peers waited for it" for r, share, n, bk in cpu_named if r in named]
    if luck and notes is not None:
        notes.append(
            f"{len(luck)} rank(s) slow in this window only because they waited for a CPU (run queue) more "
            "than their peers, unlike the steps before it (scheduler noise on a shared host), were not reported: "
            + ", ".join(f"rank {int(table.rank[r])} +{ex:.1f} ms, {sc['runq_ms'][0]:.1f} ms run queue vs "
                        f"peers {sc['runq_ms'][1]:.1f}" for r, ex, sc in luck[:5]))
    if window_only and notes is not None:
        notes.append(
            f"{len(window_only)} rank(s) slow in this window only because the same calls cost them more CPU "
            "in the profiled steps than in the steps before them, unlike their peers (a spell on a shared host, "
            "or the profiler's own effect on that process), were not reported: "
            + ", ".join(f"rank {int(table.rank[r])} +{ex:.1f} ms, CPU {sp['cpu_ms']:.1f} ms a step vs "
                        f"{sp['cpu_before_ms']:.1f} before the window (peers {sp['peers_cpu_ms']:.1f})"
                        for r, ex, sp in window_only[:5]))
    return out


def _share_below(share: float, bar: float) -> str:
    """``share`` of the step as a percentage, with a decimal where the whole number would read as the
    ``bar`` it fell short of ("named from 25% of the step, not the 25% a group of 2 asks")."""
    return f"{share:.1%}" if f"{share:.0%}" == f"{bar:.0%}" else f"{share:.0%}"


def cpu_backed(table: Table, rows: np.ndarray, row: int, excess: float, step_ref: float, z: float,
               th: Thresholds) -> dict[str, float] | None:
    """The CPU evidence that lets a member of a small group be named from ``th.rel_step`` of the step
    instead of ``th.small_rel_step``, or None.

    Why: a small group asks a quarter of the step because its MAD is noise and a rank on shared cores
    can lose a fifth of a window to preemption. That bar is a share of the step, and in a job whose
    step is mostly communication the straggler's whole excess is a small share of it. A 4-rank FSDP2
    job on gloo (2026-12-05, tests/data/engine/fsdp-forward-rank1.msgpack): rank 1 did 100 extra
    matmuls a step before its forward, its training thread was on a CPU 49.5 ms a step against its
    peers' 24.6-26.9 (51.3 against 25.3-28.9 in the 8 steps before the window), it waited 23 ms less
    than they did, the job's step went from 111 to 140 ms, and its +21 ms (z 34) was 15% of the step:
    "no culprit found". Preemption (run queue) and slow memory are not CPU time; the profiler's own
    effect on one process shows in the window only (``window_only_cpu``). So a rank whose extra own
    work is matched by extra CPU time of its training thread in the window and in the steps before
    it (each at least ``CPU_BACKED_SHARE`` of the excess), whose wait shrank by about its excess (the
    caller's ``corroborated``), is held to a large group's share of the step and a small group's z.
    Host timeline only: a GPU's work is not host CPU."""
    if table.has_device(rows) or len(rows) >= th.small_group:
        return None
    if excess < max(th.abs_ms, th.rel_step * step_ref) or z < th.small_z:
        return None
    got = cpu_against_peers(table, rows, row)
    if got is None:
        return None
    cpu, before, peer_cpu, peer_before = got
    if min(cpu - peer_cpu, before - peer_before) < CPU_BACKED_SHARE * excess:
        return None
    return {"cpu_ms": cpu, "cpu_before_ms": before, "peers_cpu_ms": peer_cpu, "peers_cpu_before_ms": peer_before}


def cpu_against_peers(table: Table, rows: np.ndarray, row: int) -> tuple[float, float, float, float] | None:
    """(the rank's training-thread CPU ms a step in the window, in the steps before it, its peers' median
    of each), or None without the step clock's numbers for the rank and some peer."""
    cpu, before = table.sch("cpu"), table.sch("hist_cpu")
    peers = rows[rows != row]
    if not (np.isfinite(cpu[row]) and np.isfinite(before[row]) and np.isfinite(cpu[peers]).any()
            and np.isfinite(before[peers]).any()):
        return None
    return (float(cpu[row]), float(before[row]), float(np.nanmedian(cpu[peers])),
            float(np.nanmedian(before[peers])))


def window_only_cpu(table: Table, rows: np.ndarray, row: int, excess: float,
                    th: Thresholds) -> dict[str, float] | None:
    """The rank's excess was CPU its same calls burned in the profiled steps only, or None.

    Why: on a host without a device timeline, the profiler itself sometimes makes one process's
    ops cost far more CPU for a step or two. In a healthy 4-rank job on this 2-core VM (2026-12-04,
    tests/test_runtime.py's healthy job failed 2 runs in 5) one rank per window at random had the
    same 4 calls of AddmmBackward0 a step take 4.45 ms each instead of 0.73: its training thread's
    CPU went from 6 ms a step before the window to 19-33 ms in the window's second and third steps,
    its resident memory grew 13.5 MB in the window (its peers' not at all), and rank 0's step times
    were back to normal the step after the window. Named, that is a "compute" culprit of a healthy job.

    So: a rank whose extra CPU a step in the window is at least WINDOW_CPU_SHARE of its excess, whose
    CPU a step in the steps just before the window was within WINDOW_BEFORE_SHARE of that of its
    peers', and whose functions that grew were called as often as its peers' (the same work, not
    more), is not named from this window. A fault that was there before the window, as a detector's
    capture has by construction (its steps made the detector fire), shows in those steps and is
    named; one that starts inside a person's window is named by the next capture. Not for ranks
    with a device timeline (a GPU's work is not host CPU). A rank that worked alone in a window step
    (lonework.py) is judged the same way: its checkpoint or evaluation is other calls, not the same
    work (the window above had rank 1's slowest step read as work alone)."""
    got = cpu_against_peers(table, rows, row)
    if got is None:
        return None
    cpu, before, peer_cpu, peer_before = got
    d_cpu, d_before = cpu - peer_cpu, before - peer_before
    if d_cpu < WINDOW_CPU_SHARE * excess or d_before > WINDOW_BEFORE_SHARE * d_cpu:
        return None
    if not same_work(table, rows, row, excess, th):
        return None
    return {"cpu_ms": cpu, "cpu_before_ms": before, "peers_cpu_ms": peer_cpu}


def same_work(table: Table, rows: np.ndarray, row: int, excess: float, th: Thresholds) -> bool:
    """The functions that carry a rank's excess (each grew by at least a tenth of it, half of it in all)
    were called as often as its peers call them (categories.SAME_CALLS): the same work, done slower."""
    if not table.fn_names:
        return False
    ref_ms = column_reference(table.fn_ms, rows)
    delta = table.fn_ms[row] - ref_ms
    grew = np.flatnonzero(delta >= max(0.5 * th.abs_ms, 0.1 * excess))
    if not len(grew) or float(delta[grew].sum()) < 0.5 * excess:
        return False
    calls, ref_calls = table.fn_count[row, grew], column_reference(table.fn_count[:, grew], rows)
    return bool((np.abs(calls - ref_calls) <= SAME_CALLS * ref_calls + 0.5).all() and (ref_calls > 0).all())



def among_the_rest(own: np.ndarray, wait: np.ndarray, found: dict[int, Any], lone: np.ndarray, limit: np.ndarray,
                   levels: list[tuple[float, float, float]],
                   th: Thresholds) -> dict[int, tuple[float, float, None, float, float]]:
    """More culprits of one peer group (positions in its ``own`` work and ``wait`` arrays), judged against
    the members not ``found`` yet, with the bars the group's median asked of the first: {member:
    (excess, spread, None, wait against the rest's, WAIT_SHARE)}, as ``find_culprits``' own.

    Half a group slow alike puts the median between the slow and the healthy, and one culprit can miss
    the bars by the excess the other hid: a real 4-rank job whose ranks 1 and 3 each ran 150 ms of
    extra matmuls a step (the fault bench's two-alike) had own work 50, 190, 45 and 157 ms, a median of
    103.5, and rank 3's +53.3 ms missed the quarter of the 215 ms step a group of 4 asks by 0.4 ms;
    against ranks 0 and 2 it is +110 ms. Repeated while the culprits stay at most half the group (more
    than half slow alike is the healthy ranks standing out); ranks that worked alone in a window step
    are judged by lonework's rules only."""
    out: dict[int, tuple[float, float, None, float, float]] = {}
    n = len(own)
    taken = np.zeros(n, dtype=bool)
    taken[list(found)] = True
    while found and 2 * (len(found) + len(out) + 1) <= n:
        rest = np.flatnonzero(~taken)
        c_own, c_wait = center(own[rest], th.sigma_floor_rel), center(wait[rest], th.sigma_floor_rel)
        more = {}
        for k in rest[(own[rest] - c_own.ref >= limit[rest]) & ~lone[rest]].tolist():
            excess, d_wait = float(own[k] - c_own.ref), float(wait[k] - c_wait.ref)
            z = excess / c_own.sigma if c_own.sigma > 0 else float("inf")
            if d_wait < excess and excess >= levels[k][1] and \
                    significant(excess, z, levels[k][0], th, n, d_wait <= -WAIT_SHARE * excess):
                more[k] = (excess, c_own.sigma, None, d_wait, WAIT_SHARE)
        if not more or 2 * (len(found) + len(out) + len(more)) > n:
            break
        out.update(more)
        taken[list(more)] = True
    return out


def measured_against(rows: np.ndarray, found: Collection[int]) -> np.ndarray:
    """The members of a peer group (``rows``) that its culprits are measured against once they are
    known: those not ``found`` (positions in ``rows``); the whole group when every member was.

    The median of the whole group finds the culprits, but it falls between the slow and the healthy
    when half the group is slow: ranks 1 and 3 of 4 each ran 150 ms of extra matmuls a step (own work
    29, 175, 27 and 168 ms, tests/data/faultbench/two-alike), the median said 98.6 ms, and their host
    finding +77 ms a step of the ~140 the job lost (64.7 -> 205.0 ms). The ranks that waited for them
    are what their work should have been: their ``column_reference`` sets a culprit's excess, its
    parts' and functions' references, and the evidence it is compared on."""
    rest = np.ones(len(rows), dtype=bool)
    rest[list(found)] = False
    return rows[rest] if rest.any() else rows


def _wait_ref(wait: np.ndarray, ref: float, k: int) -> float:
    """The wait a group member is compared with: the peers' median, or simply the other rank of two."""
    return float(wait[1 - k]) if len(wait) == 2 else ref


def part_deviations(parts: np.ndarray, wait: np.ndarray,
                    th: Thresholds) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For one peer group (rows of ``parts``, one column per part of own work; ``wait`` their waits):
    each part's reference and robust spread (``column_center``), every member's excess in each part,
    and every member's wait minus the median of the others'."""
    ref, sigma = column_center(parts, th.sigma_floor_rel)
    return ref, sigma, parts - ref[None, :], wait - median_of_others(wait)


def one_part_stragglers(parts: np.ndarray, wait: np.ndarray, limit: float, step_ref: float,
                        th: Thresholds) -> dict[int, tuple[float, float, int, float]]:
    """Members of one peer group (rows of ``parts``, one column per part of own work; ``wait`` their
    waits) made late by one part alone: {member: (that part's excess, its robust spread, its column,
    the member's wait minus the median of the others')}, the largest such part per member.

    Own work is compared as a whole first, but its spread across peers is the sum of every part's.
    On shared cores the peers of a straggler lose CPU to it, and the time they wait for a CPU is
    booked as their own work, in whatever phase it fell. In a real 4-rank job whose rank 2 did 40 ms
    of extra matmuls a step, rank 2's forward was 50 ms against 8-11 ms on its peers, but rank 0 had
    waited 43 ms a step for a CPU: rank 2's whole own work (67.5 ms) was 12.3 ms above the peers'
    median with a spread of 14 ms, and nobody was named. One part alone has its own, far smaller,
    spread. So a part must pass the test a whole rank does (``significant``: the share of the step
    and the robust z of a group this size, in a small group too), and the member must have waited
    less than the median of the others by ``PART_WAIT_SHARE`` of that part's excess: in a
    synchronous job the rank that arrives last waits least, while a part that grew as another shrank
    (time booked to another phase) does not change when the rank arrives. The share is lower than
    the whole own work's because the straggler's peers, losing CPU to it, also waited less.
    """
    n = len(parts)
    if n < 2 or parts.shape[1] == 0:
        return {}
    _, sigma, excess, d_wait = part_deviations(parts, wait, th)
    hit = (excess >= limit) & (d_wait[:, None] <= -PART_WAIT_SHARE * excess)
    out: dict[int, tuple[float, float, int, float]] = {}
    for k, j in zip(*np.nonzero(hit), strict=True):
        ex, sg = float(excess[k, j]), float(sigma[j])
        if significant(ex, ex / sg, step_ref, th, n) and (int(k) not in out or ex > out[int(k)][0]):
            out[int(k)] = (ex, sg, int(j), float(d_wait[k]))
    return out


def closest_straggler(table: Table, peers: Peers, th: Thresholds) -> str | None:
    """A note on the rank that came closest to being a culprit, for a capture slower than the baseline
    that named nobody: of the ranks that waited less than the median of their peers (they arrived
    later), the one with the largest excess in one part of its own work, and which of the bars of
    ``one_part_stragglers`` it missed. None when no rank waited less with a part at least 5% of the
    step above its peers'. A hint for the person reading the log, never a finding."""
    best: tuple[float, str] | None = None
    step_all = table.col("step")
    for rows in peers.groups:
        if len(rows) < 2:
            continue
        _, wait_all, parts = views(table, rows)
        names = list(parts)
        ref, sigma, excess, d_wait = part_deviations(np.stack([parts[p][rows] for p in names], axis=1),
                                                     wait_all[rows], th)
        step_ref = float(np.median(step_all[rows]))
        noise = th.noise_k * float(np.median(table.step_noise[rows]))
        share, z_min = group_bars(len(rows), th)
        for k in np.flatnonzero(d_wait < 0).tolist():
            j = int(np.argmax(excess[k]))
            ex, z, less = float(excess[k, j]), float(excess[k, j] / sigma[j]), -float(d_wait[k])
            if not np.isfinite(ex) or ex < max(th.abs_ms, 0.05 * step_ref) or (best is not None and ex <= best[0]):
                continue
            missed = [what for what, short in (
                (f"{share:.0%} of the step", ex < share * step_ref), (f"z {z_min:.1f}", z < z_min),
                (f"more than the window's step noise ({noise:.1f} ms)", ex < noise),
                (f"a wait shorter than its peers' by {PART_WAIT_SHARE:.0%} of the excess", less < PART_WAIT_SHARE * ex))
                if short]
            why = (f"a rank among {len(rows)} peers is named from " + " and ".join(missed)) if missed else \
                "it cleared the bars, and the notes above say why it was not named"
            row = int(rows[k])
            best = (ex, f"closest to a culprit: rank {int(table.rank[row])} on {table.hosts[int(table.host_idx[row])]}, "
                        f"{names[j]} +{ex:.1f} ms/step against its peers' {float(ref[j]):.1f} (z {z:.1f}), "
                        f"{ex / step_ref:.0%} of the {step_ref:.1f} ms step, and it waited {less:.1f} ms less than "
                        f"they did; {why}")
    return best[1] if best is not None else None


def scheduler_luck(table: Table, rows: np.ndarray, row: int) -> dict[str, Any] | None:
    """How much of a rank's extra own work was scheduler luck (None without step-clock data).

    On a host with more runnable threads than cores, which rank waits longest for a CPU is chance,
    and in a 3-step window one rank can lose a quarter of its step to it. Extra run-queue wait in
    the window counts as luck unless the same rank also waited more than its peers in the steps
    just before the window (a co-located process, a CPU quota: contention that persists).

    Persistent contention swings: the co-located processes' own scheduling made a rank queue 21 ms
    a step more than its peers over the 8 steps before the window and 40 ms more in it (the fault
    bench's "contend", two hogs on the rank's core). So the window may show up to twice the rank's
    earlier excess before any of it counts as luck; a rank that did not queue more before the window
    (the CI flake this rule exists for) still has all of its window excess counted as luck.

    Nor is the queueing a rank's own extra work brings luck: on a loaded host every runnable thread
    waits for a CPU in proportion to the CPU it wants. A rank doing 15 ms more matmuls a step queued
    28 ms a step more than its peers, who queued 0.82 ms per ms on a CPU: 12 ms of that was its work's.
    Counting all 28 ms as luck left it 8 ms of excess and named nobody (tests/data/engine/
    slower-luck-rank2.msgpack). So the peers' rate times the rank's extra CPU is not counted as luck.

    A run-queue excess before the window counts as persistent only from CONTENTION_SHARE of the step:
    in a healthy 4-rank job on 2 cores rank 1 queued 3.4 ms a step more than its peers before the
    window (14% of a 24 ms step) and 7.7 ms more in it, and twice the 3.4 ms shielded all of it: a
    CI run named it "host" for 7 ms a step.
    """
    runq, hist, cpu = table.sch("runq"), table.sch("hist_runq"), table.sch("cpu")
    peers = rows[rows != row]
    if not (np.isfinite(runq[row]) and np.isfinite(runq[peers]).any()):
        return None
    d_runq = float(runq[row] - np.nanmedian(runq[peers]))
    d_hist = float(hist[row] - np.nanmedian(hist[peers])) if np.isfinite(hist[row]) and \
        np.isfinite(hist[peers]).any() else 0.0
    hist_ms = table.sch("hist_ms")[rows]
    if np.isfinite(hist_ms).any() and d_hist < CONTENTION_SHARE * float(np.nanmedian(hist_ms)):
        d_hist = 0.0    # a few ms before the window is the spread of a shared host, not contention
    d_cpu = float(cpu[row] - np.nanmedian(cpu[peers])) if np.isfinite(cpu[row]) else 0.0
    # a rank that computes more also queues more, at the rate its peers queue per ms on a CPU here
    peer_cpu = float(np.nanmedian(cpu[peers])) if np.isfinite(cpu[peers]).any() else 0.0
    per_cpu_ms = float(np.nanmedian(runq[peers])) / peer_cpu if peer_cpu > 0 else 0.0
    return {"runq_ms": [float(runq[row]), float(np.nanmedian(runq[peers]))],
            "runq_before_ms": [float(hist[row]), float(np.nanmedian(hist[peers]))] if np.isfinite(hist[row])
            else [],
            "luck_ms": max(0.0, d_runq - LUCK_SWING * max(0.0, d_hist) - per_cpu_ms * max(d_cpu, 0.0)),
            # starved: its run-queue wait grew far more than its CPU time. A rank that computes more
            # also queues more on a loaded host (its peers sleep in the collective and hardly
            # queue): that is a compute culprit, not contention
            "starved": d_runq >= 2.0 * max(d_cpu, 0.0)}


def grown_functions(table: Table, row: int, ref: np.ndarray, category: str, excess_ms: float,
                    th: Thresholds, rows: np.ndarray) -> tuple[int | None, str | None, list[dict[str, Any]]]:
    """(column of the function, its phase, top grown functions) of a rank against its peers ``rows``,
    whose function table's ``column_reference`` is ``ref``: the function that can explain an excess of
    ``category`` and grew most, when it grew by at least ``th.fn_share`` of the excess. The phase is
    None when the category's own phase should stand (an allocator call named for a compute excess).
    Each listed function carries the rank's calls per step and its peers' (``column_reference``),
    which tell more work (more calls) from the same work done slower."""
    if not table.fn_names:
        return None, None, []
    delta = table.fn_ms[row] - ref
    listable = np.asarray([k not in ("annotation", "collective") and p != "comm"
                           for k, p in zip(table.fn_kind, table.fn_phase, strict=True)], dtype=bool)
    shown = np.where(listable, delta, -np.inf)
    top = [j for j in np.argsort(-shown)[: th.top_functions].tolist()
           if shown[j] >= max(0.5 * th.abs_ms, 0.05 * excess_ms)]
    calls_ref = column_reference(table.fn_count[:, top], rows) if top else np.zeros(0)
    functions = [{"name": table.fn_names[j], "phase": table.fn_phase[j], "kind": table.fn_kind[j],
                  "rank_ms": float(table.fn_ms[row, j]), "peers_ms": float(ref[j]),
                  "rank_calls": float(table.fn_count[row, j]), "peers_calls": float(calls_ref[i])}
                 for i, j in enumerate(top)]
    cols = function_candidates(table, category)
    if len(cols):
        best = int(cols[np.argmax(delta[cols])])
        if delta[best] >= th.fn_share * excess_ms:
            if category == "compute":
                best = _more_inside(table, row, rows, ref, cols, delta, best)
            return best, table.fn_phase[best], functions
    if category == "compute":
        best = int(np.argmax(delta))
        if delta[best] >= th.fn_share * excess_ms and is_memory_function(table.fn_names[best]):
            return best, None, functions
    return None, None, functions


NESTED_SHARE = 0.5   # a function with more calls, grown this share of the named one's growth, is what grew in it


def _more_inside(table: Table, row: int, rows: np.ndarray, ref: np.ndarray, cols: np.ndarray, delta: np.ndarray,
                 best: int) -> int:
    """The column to name for a compute excess: ``best`` (the candidate that grew most), unless it ran
    the same calls as its peers, each slower, while another candidate ran more calls and grew by at
    least NESTED_SHARE of its growth; then that one (the most grown such).

    Why: an op's time includes the ops it calls, and more work can run inside an op whose own calls did
    not change. Under activation checkpointing (torch.utils.checkpoint) a block's forward is recomputed
    inside the first backward node that needs its activations: a rank running 60 extra matmuls in each
    checkpointed block read "autograd::engine::evaluate_function: AddmmBackward0 [backward], the same 10
    calls each slower (6.72 vs 2.06 ms): throttled or slower hardware ... drain the node", while aten::mm
    ran 389 calls a step there against its peers' 29. The same calls each slower is a hardware sign only
    when nothing inside them got more calls; a throttled rank's ops all keep their counts."""
    near = [int(j) for j in cols if int(j) != best and delta[j] >= NESTED_SHARE * delta[best]]
    if not near:
        return best
    both = [best, *near]
    calls_ref = column_reference(table.fn_count[:, both], rows)

    def verdict(i: int) -> str | None:
        j = both[i]
        return work_verdict(float(table.fn_count[row, j]), float(table.fn_ms[row, j]), float(calls_ref[i]),
                            float(ref[j]))

    if verdict(0) != "slower":
        return best
    more = [both[i] for i in range(1, len(both)) if verdict(i) == "more"]
    return max(more, key=lambda j: float(delta[j])) if more else best


def attribute(table: Table, peers: Peers, culprits: list[Culprit], th: Thresholds) -> None:
    """Fill category, phase, named function and top grown functions of each culprit (in place)."""
    fn_ref_cache: dict[int, np.ndarray] = {}
    for c in culprits:
        c.category, c.phase = pick_category(c.phase_excess)
        col = phase = None
        if table.fn_names:
            rows = c.peer_rows(peers)
            ref = fn_ref_cache.get(c.group)
            if ref is None:
                ref = fn_ref_cache[c.group] = column_reference(table.fn_ms, rows)
            col, phase, c.functions = grown_functions(table, c.row, ref, c.category, c.excess_ms, th, rows)
        settle_function(table, c, col, phase)


def settle_function(table: Table, c: Culprit, col: int | None, phase: str | None) -> None:
    """Name a culprit's function from ``grown_functions``' column and phase (in place): the phase it ran
    in, "memory" for a compute excess in an allocator call, and "(<phase>)" when no function was named."""
    c.function_col = col
    if col is not None:
        c.function = table.fn_names[col]
    if phase in c.phase_excess:
        c.phase = phase
    if c.category == "compute" and is_memory_function(c.function):
        c.category = "memory"
    if c.function is None:
        c.function = f"({c.phase})"


def find_victims(table: Table, culprits: list[Culprit], th: Thresholds) -> None:
    """Ranks that waited about the culprit's excess longer than the culprit did (in place), on the
    timeline the culprit was found on (the device's exposed collective wait on a GPU job).

    Waits are compared as shares of each rank's own mean step: the ranks' windows are not cut at
    exactly the same instants (a preempted rank's steps run a few ms longer or shorter), and in
    absolute terms that skew could push a real victim under the bar. Culprits are never victims.
    How much longer they waited (``waited_ms``) is that share of the victims' own step, not the
    culprit's: a rank held by its CPU quota had its window's steps cut 28 ms longer than its peers'
    (195 vs 167 ms), which made its victims' wait 162.8 ms a step where their steps hold 134.
    """
    culprit_rows = np.asarray([c.row for c in culprits], dtype=np.int64)
    step = table.col("step")
    for c in culprits:
        comm = table.dev("comm_exposed") if c.device else table.col("comm")
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(step > 0, comm / step, np.nan)
            bar = th.victim_frac * c.excess_ms / c.step if c.step > 0 else np.inf
            waited = np.nan_to_num(share - (c.comm / c.step if c.step > 0 else 0.0), nan=-np.inf) >= bar
        waited[culprit_rows] = False
        c.victims = table.rank[waited]
        if waited.any() and c.step > 0:
            c.waited_ms = float(np.median(share[waited]) - c.comm / c.step) * float(np.median(step[waited]))
