"""Rank 0's analyst: diagnoses gathered captures off the training thread, and writes the job report.

The training thread only enqueues a persisted capture; a background thread decodes it, runs the pure
engine, writes ``diagnosis-<step>.json`` and then prints the block. At job end (or on a flush signal)
it writes ``steps.msgpack``, ``report.json`` and ``report.html`` before printing the job summary.
"""

from __future__ import annotations

import math
import queue
import statistics
import sys
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from eroica_runtime import engine, report, reportdir, retention, stepclock
from eroica_runtime.engine import (
    epochs,
    imbalance,
    launchskew,
    longsteps,
    memgrowth,
    settings,
    steadywork,
    timelost,
)
from eroica_runtime.engine.hang import HANG_TRIGGER, hang_diagnosis
from eroica_runtime.engine.model import count_ranks
from eroica_runtime.gather import Gathered
from eroica_runtime.pipeline import Pipeline
from eroica_runtime.trigger import DETECTED, Refusal


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def refused_text(refused: Refusal, max_captures: int, refill_steps: int) -> str:
    """Rank 0's line when the capture budget refuses a capture: every time for a person's request,
    and for a slowdown the first time since a capture was last taken (``refused.what`` is the
    detector that voted)."""
    spent = (f"the capture budget is spent ({max_captures} capture{'' if max_captures == 1 else 's'}, "
             "--max-captures / EROICA_MAX_CAPTURES)")
    step, back = refused.step, refused.back_at
    if refused.what == "request":
        again = f"; the budget has one again at step {back}" if back is not None else ""
        return (f"eroica: step {step}: capture requested (SIGUSR1, the trigger file or --capture-at-steps), "
                f"but {spent}: not captured{again}")
    if back is None:
        return (f"eroica: step {step}: steps slowed ({refused.what}), but {spent}: nothing more is captured in "
                "this job (step times are still recorded; the job report counts what was not captured)")
    return (f"eroica: step {step}: steps slowed ({refused.what}), but {spent}: not captured; one comes back "
            f"at step {back} (every {refill_steps} steps, --capture-refill-steps), and a slowdown that is still "
            "there then is captured")


def healthy_against_baseline(d: engine.Diagnosis) -> bool:
    """A capture that could show something found nothing, and its step was no slower than in the
    baseline capture (the engine compared them: step_ms has "baseline" but no "unexplained_ms").
    Without a baseline to compare with (--no-baseline), "no finding" says nothing about the step's
    level: a slowdown every rank shares names no rank. A window one rank's one-off work made long
    (step_ms.one_off) is no level to learn either."""
    return d.healthy and "baseline" in d.step_ms and "unexplained_ms" not in d.step_ms and "one_off" not in d.step_ms


class Analyst:
    def __init__(self, report_dir: str, world_size: int, topology: str = "", keep_captures: int = 0) -> None:
        self.report_dir = Path(report_dir)
        self.world_size = world_size
        self.topology = topology or None
        self.keep_captures = keep_captures   # retention.py; 0: every capture file stays
        self.removed: list[int] = []   # capture steps whose file retention removed
        self.diagnoses: list[engine.Diagnosis] = []
        self.drill: dict[int, dict[str, Any]] = {}    # capture step -> report.drill_down
        self.captures: list[dict[str, Any]] = []   # step, trigger for every capture taken
        # decode -> validate -> baseline policy -> diagnose: the same as `eroica analyze` runs
        self.pipeline = Pipeline(world_size=world_size, topology=topology)
        self.history_source: Any = None   # callable -> a copy of rank 0's step history (set by the runtime)
        # callable -> {"time_lost": ...} measured so far, or {} (set by the runtime: Runtime._time_lost)
        self.time_lost_source: Any = None
        self._lock = threading.Lock()
        self._unexplained = threading.Event()   # a detector's capture found no culprit (take_unexplained)
        self._healthy: int | None = None   # first step of a detector capture found healthy (take_healthy)
        self._said_transient: set[tuple[Any, ...]] = set()   # (rank, captures) of transient lines said
        self._queue: queue.Queue[Gathered | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="eroica-analyst", daemon=True)
        self._thread.start()

    def submit(self, gathered: Gathered) -> None:
        with self._lock:
            self.captures.append({"step": gathered.step, "trigger": gathered.trigger,
                                  "missing": gathered.missing})
        self._queue.put(gathered)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._analyse(item)
            except Exception as exc:  # never let the analysis take the rank down
                say(f"eroica: analysis of the capture at step {getattr(item, 'step', '?')} failed: "
                    f"{type(exc).__name__}: {exc}")
            finally:
                self._queue.task_done()

    def _analyse(self, g: Gathered) -> None:
        result = self.pipeline.analyse(g.data, origin=f"capture {g.step}")
        for err in result.errors:
            say(f"eroica: rejected {err}")
        self.record(result.diagnosis, report.drill_down(result.summaries))

    def record(self, diagnosis: engine.Diagnosis, drill: dict[str, Any]) -> None:
        """A capture's diagnosis joins the job: its files are written, then its block is printed, with
        a line for each CPU contention an earlier capture named that this one shows came and went."""
        with self._lock:
            before = engine.first_named(self.diagnoses)
            self.diagnoses.append(diagnosis)
            self.drill[diagnosis.step] = drill
        report.write_capture(self.report_dir, diagnosis, drill)   # on disk before it is printed
        self._prune()
        doc = self._write_partial()  # a job killed from now on still leaves a report.json
        say(report.format_capture(diagnosis, before))
        for line in self._newly_transient(doc):
            say(f"eroica: step {diagnosis.step}: {line.strip()}")
        lost = self._time_lost()
        if diagnosis.findings and lost.get("since_step", diagnosis.step) < diagnosis.step:
            # a later capture of a job already slowed: what the job has lost so far, measured
            say(report.format_time_lost(lost))
        if diagnosis.trigger in DETECTED and not diagnosis.findings:
            self._unexplained.set()
            if healthy_against_baseline(diagnosis):
                with self._lock:
                    self._healthy = diagnosis.step

    def _prune(self) -> None:
        """Remove the capture files retention.py does not keep (their diagnoses are on disk); a file
        that cannot be removed is said once and every file is kept from then on."""
        if self.keep_captures <= 0:
            return
        with self._lock:
            diagnoses, gone = list(self.diagnoses), set(self.removed)
        try:
            removed = retention.prune(self.report_dir, diagnoses, self.keep_captures, gone)
        except retention.PruneError as exc:
            removed = exc.removed
            say(f"eroica: cannot remove an old capture file in {self.report_dir / reportdir.CAPTURES} "
                f"({exc.strerror or exc}): every capture file is kept from now on (--keep-captures)")
            self.keep_captures = 0
        with self._lock:
            self.removed.extend(removed)

    def take_unexplained(self) -> bool:
        """Whether a capture a slowdown opened found no culprit since the last call (then the
        runtime lets rank 0's detector capture that slowdown again: Detector.retry)."""
        if not self._unexplained.is_set():
            return False
        self._unexplained.clear()
        return True

    def take_healthy(self) -> int | None:
        """The first step of the latest capture a slowdown opened that was found healthy since the
        last call, or None. The runtime sends it to every rank in its next vote, so every rank's drift
        rule stops taking that level for a drift at the same step (Trigger.found_healthy)."""
        with self._lock:
            step, self._healthy = self._healthy, None
        return step

    def add_hang(self, doc: dict[str, Any], step: int) -> None:
        """A diagnosed hang (engine.hang.analyse's document) joins the job's findings in report.json."""
        if not doc.get("finding"):
            return
        diagnosis = hang_diagnosis(doc, step)
        with self._lock:
            self.diagnoses.append(diagnosis)
            self.captures.append({"step": step, "trigger": HANG_TRIGGER, "missing": list(diagnosis.missing)})
        self._write_partial()

    def add_gave_way(self, step: int, trigger: str, ranks: str) -> None:
        """The capture whose window began at ``step`` was not taken: its window gave way to the job's
        own profiler on ``ranks`` (runtime._gather_pending). Said now, and listed in report.json."""
        with self._lock:
            self.captures.append({"step": step, "trigger": trigger, "missing": [], "gave_way": ranks})
        say(f"eroica: capture at step {step} ({trigger}) not taken: the job's own torch.profiler started during "
            f"its window ({ranks}), and a process runs one profiler at a time; eroica captures again once the "
            "job's profiler has stopped")
        self._write_partial()

    def first_finding_step(self) -> int | None:
        """The first step of the earliest capture, other than the baseline, whose diagnosis named
        something (None without one): where a job's measured time lost starts (engine.timelost)."""
        with self._lock:
            return timelost.since_step([(d.step, d.trigger, bool(d.findings)) for d in self.diagnoses])

    def wait(self, timeout_s: float) -> bool:
        """Let queued analyses finish (bounded); True when the queue drained."""
        done = threading.Event()

        def join() -> None:
            self._queue.join()
            done.set()

        threading.Thread(target=join, daemon=True).start()
        return done.wait(timeout_s)

    def write_job(self, *, steps: int, job: dict[str, Any], history: Sequence[float]) -> dict[str, Any]:
        """steps.msgpack, report.json, report.html — all before the caller prints anything."""
        with self._lock:
            diagnoses, drill = list(self.diagnoses), dict(self.drill)
            job = {**job, "captures_taken": list(self.captures)}
            if self.removed:
                job["capture_files_removed"] = sorted(self.removed)
        with reportdir.job_files_lock():   # the analyst, the hang watchdog and the flusher all write here
            report.write_steps(self.report_dir, history)
            return report.write_job(self.report_dir, diagnoses=diagnoses, world_size=self.world_size,
                                    steps=steps, job=job, drill=drill)

    def _time_lost(self) -> dict[str, Any]:
        """The time lost so far (engine/timelost.py's document), or {}: never fails an analysis."""
        try:
            got = self.time_lost_source() if self.time_lost_source else {}
            return got.get("time_lost") or {}
        except Exception as exc:
            say(f"eroica: time lost so far not measured: {type(exc).__name__}: {exc}")
            return {}

    def _write_partial(self) -> dict[str, Any]:
        """report.json/html with what is known so far (rank 0's own step history only), with the time
        lost so far: a job killed from now on keeps it. Returns the report document."""
        history = self.history_source() if self.history_source else []
        lost = self._time_lost()
        return self.write_job(steps=len(history) + 1 if history else 0,
                              job={"partial": True, **({"time_lost": lost} if lost else {})}, history=history)

    def _newly_transient(self, doc: dict[str, Any]) -> list[str]:
        """The job report's lines (``report.transient_lines``) for the CPU contention that became
        transient with the latest capture (engine/transient.py), each said once.

        Why: rank 0's line at a capture names a rank the scheduler or a co-located process starved
        for a dozen steps once (a healthy 5,000-step job here: rank 1 at step 655, "host"), and only
        the job report, at the end, said it never came back; a person reading the log hours in took
        it for the job's culprit. Now the log says so as soon as the captures after it show it."""
        fresh = []
        for f in doc.get("transient") or []:
            key = (f.get("rank"), tuple(f.get("captures") or ()))
            if key not in self._said_transient:
                self._said_transient.add(key)
                fresh.append(f)
        return report.transient_lines({"transient": fresh})

    def stop(self) -> None:
        self._queue.put(None)


def _no_steps_why(unsynced: Any) -> str:
    """The job summary's line on why no step was counted: where steps are counted, or (``unsynced``:
    "batch", "backward") that the job's loop had no collective (runtime._adopt_gate)."""
    if unsynced in ("batch", "backward"):
        what = "DataLoader batches" if unsynced == "batch" else "backward() calls"
        return (f"  its loop ({what}, no torch.optim optimizer step) has no collective: its ranks never wait for "
                "each other, and a step counted at each would make them wait for each other's votes; "
                "eroica_runtime.mark_step() once per step counts them all the same")
    return ("  eroica counts a step at each torch.optim optimizer step, or, in a job without one, at each "
            f"backward() or DataLoader batch once {stepclock.ADOPT_AFTER} passed; a loop with none of these should "
            "call eroica_runtime.mark_step() once per step")


def job_stats(per_rank: dict[int, dict[str, Any]], world_size: int,
              seen: Mapping[int, longsteps.StepSeen] | None = None,
              busy: imbalance.BusySteps | None = None) -> dict[str, Any]:
    """Job-level step-time statistics from every rank's end-of-job numbers. Ranks are compared by their
    pace (``pace_ms``) when every rank sent one (``pace_ms``: the list, in rank order), else by median.
    ``seen``: the ranks' longest steps as their node leaders reduced them (jobend.py); None: read from
    each rank's own ``long_steps`` records. The ranks' DataLoader turnovers (``loader``) become one
    ``epoch_starts`` when they cost the job a share of its steps (engine/epochs.py), and their own work
    (``own``) one ``steady_work`` when a rank was busier than its peers over the job (engine/steadywork.py),
    not a map a rank. ``busy``: the ranks' last steps as the node leaders reduced them (jobend.py), one
    ``imbalance`` when the ranks took turns being the slowest (engine/imbalance.py)."""
    ranks = [{k: v for k, v in per_rank[r].items()
              if k not in ("long_steps", "loader", "own", "steps_at", "busy_steps", "memory", "anomaly")}
             for r in sorted(per_rank)]
    # ranks whose anonymous memory kept growing (memwatch.py's series, engine/memgrowth.py)
    grown = memgrowth.summarize({r: memgrowth.Growth.from_json(d.get("memory")) for r, d in per_rank.items()})
    # where the ranks counted their steps (stepclock.COUNTED_AT): the same on every rank of one script
    steps_at = Counter(d.get("steps_at") for d in per_rank.values()
                       if d.get("steps_at") in stepclock.COUNTED_AT).most_common(1)
    # optimizer steps a GradScaler skipped (inf/NaN gradients; stepclock._count_skipped_steps): the same
    # on every rank of a data-parallel job, whose gradients are all-reduced before the check
    skips = max((d["skips"] for d in per_rank.values() if isinstance(d.get("skips"), int)
                 and not isinstance(d.get("skips"), bool) and d["skips"] > 0), default=0)
    # ranks that had autograd anomaly detection on at a capture's close or the job's end (runtime._torch_settings)
    anomaly = sorted(r for r, d in per_rank.items() if d.get("anomaly") == 1)
    starts = epochs.epoch_starts(per_rank)
    steady = steadywork.steady_work(per_rank)
    late = launchskew.launch_skew(per_rank)
    turns = imbalance.from_steps(busy, world_size, _busy_means(per_rank, world_size))
    medians = [r["median_ms"] for r in ranks if r.get("median_ms") is not None]
    median = statistics.median(medians) if medians else None
    paces = [pace_ms(r) for r in ranks]
    by_pace: list[float] | None = [p for p in paces if p is not None] if ranks and None not in paces else None
    order = sorted(range(len(ranks)), key=lambda i: -((by_pace[i] if by_pace else ranks[i].get("median_ms")) or 0))
    return {
        "ranks_reporting": len(ranks), "world_size": world_size,
        "steps": max((r["steps"] for r in ranks), default=0),
        "median_step_ms": median,
        "p99_step_ms": max((r["p99_ms"] for r in ranks if r.get("p99_ms") is not None), default=None),
        "per_rank": ranks,
        "pace_ms": [round(p, 3) for p in by_pace] if by_pace else None,
        "slowest": [{"rank": ranks[i]["rank"], "host": ranks[i]["host"], "median_ms": ranks[i]["median_ms"],
                     **({"pace_ms": round(by_pace[i], 3)} if by_pace else {})} for i in order[:3]],
        "long_steps": [s.to_json() for s in longsteps.long_steps(
            longsteps.reduce_records({r: d.get("long_steps") for r, d in per_rank.items()}, keep=None)
            if seen is None else seen, per_rank, median)],
        **({"steps_at": steps_at[0][0]} if steps_at else {}),
        **({"skipped_steps": skips} if skips else {}),
        **({"anomaly_ranks": anomaly} if anomaly else {}),
        **({"memory_growth": grown} if grown is not None else {}),
        **({"epoch_starts": starts.to_json()} if starts is not None else {}),
        **({"steady_work": steady.to_json()} if steady is not None else {}),
        **({"imbalance": turns.to_json()} if turns is not None else {}),
        **({"launch": late.to_json()} if late is not None else {}),
    }


def _busy_means(per_rank: Mapping[int, Mapping[str, Any]], world_size: int) -> list[float] | None:
    """Every rank's busy ms a step over the job (CPU and batch wait, its ``own`` totals) for
    engine/imbalance.py, or None unless every rank sent them."""
    out = []
    for stats in per_rank.values():
        own = stats.get("own") if isinstance(stats, Mapping) else None
        try:
            steps = int(own["steps"])
            if steps > 0:
                out.append((float(own["cpu"]) + float(own["data"])) / steps)
        except (KeyError, TypeError, ValueError):
            pass
    return out if len(out) == world_size and all(math.isfinite(x) for x in out) else None


def pace_ms(rank: dict[str, Any]) -> float | None:
    """A rank's mean wall time a step: its step times plus eroica's own boundary work (which the step
    clock leaves out), over its steps; None when the rank sent no totals (an older eroica).

    This, not the median, says which rank is slower: in synchronous training every rank spends the
    same wall time per step (each waits for the slowest in the collectives), while medians spread with
    where a rank's step clock falls against the waits (the demo's "slowest by median" was a victim).
    ``steps`` counts step boundaries: a rank's step times are ``steps - 1``."""
    total, own, steps = rank.get("total_ms"), rank.get("eroica_ms", 0.0), rank.get("steps")
    if not (report.finite(total) and report.finite(own) and isinstance(steps, int) and not isinstance(steps, bool)
            and steps > 1 and total > 0 and own >= 0):
        return None
    return (float(total) + float(own)) / (steps - 1)


# per-rank paces (or medians) within this factor of each other are alike (synchronous training)
ALIKE_STEPS = 1.05


def format_job_stats(stats: dict[str, Any], captures: list[dict[str, Any]], findings: bool = True) -> str:
    """The job summary block: steps, step-time median/p99, captures and why. ``findings``: whether the
    job report below it names anything (a healthy job's summary must not point at findings it has none
    of: a checkpointing job's read "one slow rank slows all; the findings name it" above "healthy")."""
    def ms(x: Any) -> str:
        return "n/a" if x is None else f"{x:.1f} ms"

    caps = ", ".join(report.capture_label(c) for c in captures) or "none"
    missing = stats["world_size"] - stats["ranks_reporting"]
    if stats.get("pace_ms"):
        values, what = stats["pace_ms"], "{} ms a step on average, eroica's boundary work included"
        slow = ", ".join(f"rank {r['rank']} ({r['host']}) {ms(r['pace_ms'])}" for r in stats["slowest"])
        by_rank = f"  slowest ranks by mean step: {slow}"
    else:   # an older eroica's ranks sent no totals: their medians are all there is
        values = [r["median_ms"] for r in stats.get("per_rank", []) if isinstance(r.get("median_ms"), (int, float))]
        what = "median step {} ms"
        slow = ", ".join(f"rank {r['rank']} ({r['host']}) {ms(r['median_ms'])}" for r in stats["slowest"])
        by_rank = f"  slowest ranks by median step: {slow or 'n/a'}"
    if len(values) == 1 and stats["world_size"] == 1:   # a one-rank job: no ranking to make
        by_rank = f"  {what.format(f'{values[0]:.1f}')}"
    elif len(values) > 1 and max(values) <= ALIKE_STEPS * min(values):
        # in synchronous training every rank waits for the slowest each step: a ranking of alike step
        # times is noise, and at 3 a.m. "slowest: rank 0" reads as a culprit
        lo, hi = f"{min(values):.1f}", f"{max(values):.1f}"
        named = ("a line below names the one they waited for" if stats.get("steady_work") else
                 "a line below says why" if stats.get("imbalance") else "the findings name it" if findings else "")
        by_rank = f"  step time alike on every rank ({what.format(lo if lo == hi else f'{lo}-{hi}')})" + (
            f": ranks wait for each other, so one slow rank slows all; {named}" if named else "")
    if not stats["steps"]:
        # a job that ran for hours with eroica silent must say why: steps are counted at optimizer steps
        lines = [f"eroica: job summary: no training step was seen on {count_ranks(stats['world_size'])}, so there was "
                 "nothing to time or diagnose",
                 _no_steps_why(stats.get("unsynced_loop")),
                 f"  captures: {caps}"]
    elif stats.get("median_step_ms") is None:
        # one step: a step is timed from the end of the one before it, and the first has none
        lines = [f"eroica: job summary: {stats['steps']} step{'s' if stats['steps'] != 1 else ''} on "
                 f"{count_ranks(stats['world_size'])}, too few to time: a step's time runs from the end of "
                 "the one before it",
                 f"  captures: {caps}"]
    else:
        at = {"backward": " (counted at each backward(): no torch.optim optimizer stepped)",
              "batch": " (counted at each DataLoader batch: no optimizer step or backward())"}.get(stats.get("steps_at"), "")
        lines = [f"eroica: job summary: {stats['steps']} steps{at} on {count_ranks(stats['world_size'])}; step time median "
                 f"{ms(stats['median_step_ms'])}, p99 {ms(stats['p99_step_ms'])}",
                 by_rank,
                 f"  captures: {caps}"]
    skipped = skipped_text(stats)
    if skipped:
        lines.append(skipped)
    anomaly = settings.anomaly_text(stats.get("anomaly_ranks"), stats["world_size"])
    if anomaly:
        lines.append(anomaly)
    leak = memgrowth.format_summary(stats.get("memory_growth"))
    if leak:
        lines.append(leak)
    held = report.job_profiler_text(stats.get("job_profiler"))
    if held:
        lines.append(held)
    own = own_time_text(stats.get("per_rank", []))
    if own:
        lines.append(own)
    late = launchskew.LaunchSkew.from_json(stats.get("launch"))
    if late is not None:
        lines.append(launchskew.format_launch_skew(late))
    steady = steadywork.SteadyWork.from_json(stats.get("steady_work"))
    if steady is not None:
        lines.append(steadywork.format_steady_work(steady))
    turns = imbalance.Imbalance.from_json(stats.get("imbalance"))
    if turns is not None:
        lines.append(imbalance.format_imbalance(turns))
    starts = epochs.EpochStarts.from_json(stats.get("epoch_starts"))
    if starts is not None:
        lines.append(epochs.format_epoch_starts(starts))
    long = [s for s in stats.get("long_steps") or [] if isinstance(s, dict)]
    if long:
        among = longsteps.LongStep.from_json(long[0]).among
        lines.append(("  longest steps:" if len(long) > 1 else "  longest step:") if among <= len(long) else
                     f"  longest steps ({len(long)} of {among} over {longsteps.LONG_RATIO:.0f}x the median):")
        lines += [f"    {line}" for line in longsteps.format_long_steps([longsteps.LongStep.from_json(s) for s in long])]
    if missing:
        lines.append(f"  {missing} rank(s) did not report at job end")
    return "\n".join(lines)


def stored_job_stats_text(doc: dict[str, Any]) -> str:
    """The job summary block rank 0 printed at job end, again from a report.json (``eroica show``,
    ``eroica analyze``): its step times, captures, eroica's own cost and longest steps ("" when the
    report holds no job-end statistics: a partial or flushed one, traces, or a foreign file). Why:
    the person who reads the report after the job, not its log, must see the same lines."""
    job = doc.get("job")
    if not (isinstance(job, dict) and not job.get("partial") and not job.get("flushed_by")
            and all(isinstance(job.get(k), int) and not isinstance(job.get(k), bool)
                    for k in ("steps", "world_size", "ranks_reporting"))):
        return ""
    taken = job.get("captures_taken")
    caps = [c for c in taken if isinstance(c, dict)] if isinstance(taken, list) else []
    try:
        return format_job_stats(job, caps, findings=bool(doc.get("findings")))
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):   # a report edited by hand
        return ""


# a GradScaler's skipped steps worth a line in the job summary: an fp16 job's few while its loss scale
# settles, and one each time the scale grows (every 2,000 steps by default), are its normal course
SKIPPED_SHARE = 0.01


def skipped_text(stats: Mapping[str, Any]) -> str:
    """The job summary's line on the optimizer steps a mixed-precision GradScaler skipped, when they
    were SKIPPED_SHARE of the steps or more ("" otherwise): each such iteration's forward and backward
    updated no weight, throughput the step times do not show as lost."""
    skips, steps = stats.get("skipped_steps"), stats.get("steps")
    if not (isinstance(skips, int) and isinstance(steps, int) and steps > 0 and skips >= SKIPPED_SHARE * steps):
        return ""
    return (f"  the mixed-precision GradScaler skipped {skips} of {steps} optimizer steps ({100 * skips / steps:.1f}%): "
            "their gradients held an inf or NaN, so their forward and backward updated no weight. So many mean a "
            "loss that diverges (NaN) or a loss scale set to grow too often (GradScaler's growth_interval); bf16 "
            "autocast needs no scaler")


def own_time_text(per_rank: list[Any]) -> str:
    """What eroica itself took on each rank: its work at the step boundaries (votes, a window's close,
    the summary's slices, the gathers), which the step clock leaves out of the step times, against
    the rank's time in steps. So the reader of a healthy job's log knows what watching it cost."""
    own = [(float(r["eroica_ms"]), float(r["total_ms"])) for r in per_rank
           if isinstance(r, dict) and report.finite(r.get("eroica_ms")) and report.finite(r.get("total_ms"))
           and r["eroica_ms"] >= 0 and r["total_ms"] > 0]
    if not own:
        return ""
    ms = sorted(e for e, _ in own)
    shares = sorted(100.0 * e / (e + t) for e, t in own)

    def span(lo: float, hi: float, fmt: str) -> str:
        return format(lo, fmt) if format(lo, fmt) == format(hi, fmt) else f"{lo:{fmt}}-{hi:{fmt}}"

    # in ms when a tenth of a second is too coarse: a short job's "0.0 s a rank, 14% of its time" said
    # nothing of the amount
    amount = (f"{span(ms[0], ms[-1], '.0f')} ms" if ms[-1] < 100 else
              f"{span(ms[0] / 1e3, ms[-1] / 1e3, '.1f')} s")
    return (f"  eroica's own work at step boundaries: {amount} a rank, "
            f"{span(shares[0], shares[-1], '.1f')}% of its time")
