"""Job level: the job's longest steps, and which rank the others waited for in each.

A stall that happens once leaves the median, the detectors and every capture alone: by the time a
capture could start, it is over. Yet it can cost a job more than a steady straggler. A 4-rank DDP job
whose model was ``torch.compile``-d, in which rank 2's batch shape changed at step 200 (2026-12-05):
rank 2 recompiled its forward while the other three waited in the all-reduce, step 200 took 1.45 s
on every rank against a 15 ms median, and eroica said nothing about it. Recompiles, a rank that saves
a checkpoint or uploads alone, a long GC pause, a storage hiccup in one rank's data loader: the person
reading the job's log wants to know which rank held the others, doing what, and where.

Each rank keeps its few longest steps with what its training thread did in them (step clock: CPU,
run-queue wait, batch wait, GC pauses, stops) and, when the hang watchdog runs, where its main
thread was while the step ran long (a stack sampled once per long step). At job end rank 0 reads
them side by side: in a step every rank waited out, the rank that was busy through a good part of it
(BUSY_SHARE) while the others were asleep in a collective is the one they waited for; when every rank
was busy, or none, the line says so. Pure: no MPI, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

LONG_RATIO = 10.0    # a step this many times the job's median step ...
LONG_MIN_MS = 100.0  # ... and at least this long is a stall worth a line
MAX_SHOWN = 3        # the longest this many stalls are reported
MAX_SENT = 8         # a rank sends at most this many (stepclock.LONGEST keeps as many)
# the rank held the others: busy (CPU, run queue, batch wait) at least this share of the step, while no
# other rank was busy more than ALONE_SHARE of its busy time. Not most of the step: a rank recompiling
# its torch.compile-d forward (2026-12-05) was busy 412 ms of a 948 ms step, the rest waiting for
# inductor's compile workers (subprocesses), while its peers were busy 5 ms at most, asleep in the
# all-reduce
BUSY_SHARE = 0.25
ALONE_SHARE = 0.25
WHAT = {"cpu": "on a CPU", "data": "waiting for its next batch", "gc": "in garbage-collection pauses"}


@dataclass(frozen=True)
class LongStep:
    """One of the job's longest steps: how long, and who the others waited for (``rank`` None: no one
    rank; ``why`` then says what was seen)."""

    step: int
    ms: float
    median_ms: float
    ranks_seen: int                   # ranks whose records hold this step
    rank: int | None = None
    host: str | None = None
    what: str | None = None           # cpu | data | gc (WHAT), for a named rank
    busy_ms: float = 0.0              # the named rank's busy time in the step
    others_ms: float = 0.0            # the most any other rank was busy in it
    where: tuple[str, ...] = ()       # the named rank's main-thread stack while the step ran long, innermost last
    why: str = ""                     # when no rank is named
    stopped: tuple[int, ...] = field(default_factory=tuple)   # ranks stopped and continued (SIGSTOP) in it
    among: int = 1                    # steps of the job past the bar, this one included (ranks' records)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> LongStep:
        """Back from ``to_json`` (report.json's job.long_steps)."""
        rank, host, what = doc.get("rank"), doc.get("host"), doc.get("what")
        return cls(step=int(_num(doc.get("step"))), ms=_num(doc.get("ms")), median_ms=_num(doc.get("median_ms")) or 1.0,
                   ranks_seen=int(_num(doc.get("ranks_seen"))),
                   rank=rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
                   host=host if isinstance(host, str) else None, what=what if isinstance(what, str) else None,
                   busy_ms=_num(doc.get("busy_ms")), others_ms=_num(doc.get("others_ms")),
                   where=tuple(str(f) for f in doc.get("where") or () if isinstance(f, str)),
                   why=str(doc.get("why") or ""), stopped=tuple(r for r in doc.get("stopped") or ()
                                                                  if isinstance(r, int)),
                   among=max(1, int(_num(doc.get("among")))))

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "ms": round(self.ms, 3), "median_ms": round(self.median_ms, 3),
                "ranks_seen": self.ranks_seen, "rank": self.rank, "host": self.host, "what": self.what,
                "busy_ms": round(self.busy_ms, 3), "others_ms": round(self.others_ms, 3), "where": list(self.where),
                "why": self.why, "stopped": list(self.stopped), "among": self.among}


def _num(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else 0.0


def _busy(rec: Mapping[str, Any]) -> float:
    """Time the rank's training thread spent on its own account: on a CPU, runnable but waiting for
    one, or waiting for its next batch (a wait for peers is spent asleep in a collective: none of them)."""
    return _num(rec.get("cpu")) + _num(rec.get("runq")) + _num(rec.get("data"))


def _what(rec: Mapping[str, Any]) -> str:
    busy = _busy(rec)
    if _num(rec.get("data")) >= 0.5 * busy:
        return "data"
    if _num(rec.get("gc")) >= 0.5 * busy:
        return "gc"
    return "cpu"


def to_send(records: list[dict[str, Any]], median_ms: float | None) -> list[dict[str, Any]]:
    """What a rank sends of its kept longest steps (``StepClock.long_steps``, longest first) at job end:
    only steps past the bar against its own median, at most MAX_SENT (of 5 checkpoints alike, which 3
    a rank would send differs between ranks: the saving rank's and its peers' must meet), and the
    stack only with a step it was busy through (the rank the others waited for); a healthy job sends
    nothing, and the victims of a stall send ~100 bytes a step each."""
    if not median_ms or median_ms <= 0:
        return []
    bar = max(LONG_RATIO * median_ms, LONG_MIN_MS)
    out = []
    for rec in records:
        if _num(rec.get("ms")) < bar or len(out) >= MAX_SENT:
            continue
        busy = _busy(rec) >= BUSY_SHARE * _num(rec.get("ms"))
        out.append({k: v for k, v in rec.items() if k != "where" or busy})
    return out


def long_steps(per_rank: Mapping[int, Mapping[str, Any]], median_ms: float | None) -> list[LongStep]:
    """The job's longest steps (at least LONG_RATIO x ``median_ms`` and LONG_MIN_MS), longest first, at
    most MAX_SHOWN, from every rank's job-end records: ``per_rank[r]["long_steps"]``, each a dict with
    step, ms, cpu, runq, data, gc, stops and optionally where (a list of frames, innermost last)."""
    if not median_ms or median_ms <= 0:
        return []
    bar = max(LONG_RATIO * median_ms, LONG_MIN_MS)
    by_step: dict[int, dict[int, Mapping[str, Any]]] = {}
    for r, doc in per_rank.items():
        recs = doc.get("long_steps") if isinstance(doc, Mapping) else None
        for rec in recs if isinstance(recs, list) else []:
            if isinstance(rec, Mapping) and isinstance(rec.get("step"), int) and _num(rec.get("ms")) >= bar:
                by_step.setdefault(int(rec["step"]), {})[r] = rec
    ranked = sorted(by_step.items(), key=lambda kv: -max(_num(x.get("ms")) for x in kv[1].values()))
    return [replace(_judge(step, recs, per_rank, median_ms), among=len(ranked)) for step, recs in ranked[:MAX_SHOWN]]


def _incomplete(recs: Mapping[int, Mapping[str, Any]], per_rank: Mapping[int, Mapping[str, Any]]) -> str:
    """' (only N of M ranks kept this step: ...)' when ranks that reported at job end hold no record of it."""
    if len(recs) >= len(per_rank):
        return ""
    return (f" (only {len(recs)} of the {len(per_rank)} ranks that reported kept this step among their "
            f"{MAX_SENT} longest)")


def _judge(step: int, recs: Mapping[int, Mapping[str, Any]], per_rank: Mapping[int, Mapping[str, Any]],
           median_ms: float) -> LongStep:
    ms = max(_num(x.get("ms")) for x in recs.values())
    stopped = tuple(sorted(r for r, x in recs.items() if _num(x.get("stops")) > 0))
    base = {"step": step, "ms": ms, "median_ms": median_ms, "ranks_seen": len(recs), "stopped": stopped}
    busy = {r: _busy(x) for r, x in recs.items()}
    top = max(busy, key=lambda r: busy[r])
    others = max((b for r, b in busy.items() if r != top), default=0.0)
    if busy[top] >= BUSY_SHARE * _num(recs[top].get("ms")) and others <= ALONE_SHARE * busy[top] and len(recs) > 1:
        where = recs[top].get("where")
        host = per_rank.get(top, {}).get("host")
        return LongStep(**base, rank=top, host=host if isinstance(host, str) else None, what=_what(recs[top]),
                        busy_ms=busy[top], others_ms=others,
                        where=tuple(str(f) for f in where) if isinstance(where, list) else ())
    # every rank present busy alike: the ranks that kept no record of the step would not change that
    alike = len(recs) > 1 and others >= BUSY_SHARE * ms
    if alike and all(_what(x) == "data" for x in recs.values()):
        why = ("every rank waited for its next batch through it: DataLoader workers starting anew at an "
               "epoch's start (persistent_workers=True keeps them), or a store every rank reads from stalled")
    elif alike:
        why = "every rank was busy through it (an evaluation, a job-wide pause)"
    elif stopped:
        why = f"rank{'s' if len(stopped) > 1 else ''} {', '.join(map(str, stopped))} stopped and continued in it (SIGSTOP)"
    elif len(per_rank) == 1:
        why = f"the job's one rank was busy {busy[top] / 1e3:.2f} s of it"
    else:
        why = "no rank was busy on a CPU or waiting for a batch for a quarter of it (storage, a sleep, a subprocess, " \
              "the network)"
    return LongStep(**base, busy_ms=busy[top], others_ms=others, why=why + ("" if alike else _incomplete(recs, per_rank)))


def short_frame(frame: str) -> str:
    """'…/site-packages/torch/_dynamo/convert_frame.py:1234 _compile' -> 'torch/_dynamo/convert_frame.py:1234 _compile'."""
    for mark in ("site-packages/", "dist-packages/"):
        if mark in frame:
            return frame.split(mark, 1)[1]
    return frame


def _stdlib(frame: str) -> bool:
    """Python's own library (threading, concurrent.futures...) or frozen/generated frames."""
    return frame.startswith("<") or ("/lib/python3" in frame and not any(m in frame for m in PACKAGES))


PACKAGES = ("site-packages/", "dist-packages/")


def is_user_frame(frame: str) -> bool:
    """A frame of the user's own code: not Python's library, not an installed package, not code torch
    generated (inductor's compiled modules live in a torchinductor_<user> cache directory)."""
    return not (_stdlib(frame) or any(m in frame for m in PACKAGES) or "/torchinductor_" in frame)


def where_text(frames: tuple[str, ...]) -> str:
    """'in <innermost frame outside Python's library>, from <innermost frame of the user's own code>'
    (``frames`` innermost last): a rank waiting in threading.wait says nothing; the torch frame that
    waits, and the line of the training script it came from, do."""
    if not frames:
        return ""
    inner = next((f for f in reversed(frames) if not _stdlib(f)), frames[-1])
    user = next((f for f in reversed(frames) if is_user_frame(f)), None)
    if user is None or user == inner:
        return f"in {short_frame(inner)}"
    return f"in {short_frame(inner)}, from {short_frame(user)}"


# what a stack says the rank was doing, for the person who reads the line (first match wins)
DOING = ((("torch/_dynamo/", "torch/_inductor/"),
          "torch.compile was compiling on that rank: a recompilation (TORCH_LOGS=recompiles says which guard "
          "failed; mark_dynamic or padding keeps shapes from changing)"),
         (("torch/serialization.py",), "it was saving or loading with torch.save/torch.load"),
         (("torch/distributed/checkpoint/",), "it was saving or loading a distributed checkpoint"))


def doing(frames: tuple[str, ...]) -> str:
    """What the stack says the rank was doing ('' when it says nothing known)."""
    return next((what for marks, what in DOING if any(m in f for m in marks for f in frames)), "")


def _took(ms: list[float]) -> str:
    lo, hi = min(ms), max(ms)
    if hi >= 1e3:
        return f"{lo / 1e3:.2f} s" if f"{lo / 1e3:.2f}" == f"{hi / 1e3:.2f}" else f"{lo / 1e3:.2f}-{hi / 1e3:.2f} s"
    return f"{lo:.0f} ms" if f"{lo:.0f}" == f"{hi:.0f}" else f"{lo:.0f}-{hi:.0f} ms"


def _times(ms: list[float], median_ms: float) -> str:
    lo, hi = f"{min(ms) / median_ms:.0f}", f"{max(ms) / median_ms:.0f}"
    return f"{lo}x" if lo == hi else f"{lo}-{hi}x"


def format_long_steps(steps: list[LongStep]) -> list[str]:
    """The job summary's lines: one per stall, and one for stalls with the same verdict (the same rank
    doing the same thing, or every rank alike: a checkpoint every 50 steps, workers started at every
    epoch), longest first."""
    groups: dict[tuple[Any, ...], list[LongStep]] = {}
    for s in steps:
        key = (s.rank, s.what, doing(s.where)) if s.rank is not None else (None, s.why)
        groups.setdefault(key, []).append(s)
    return [format_long_step(g[0]) if len(g) == 1 else _format_group(g) for g in groups.values()]


def _format_group(g: list[LongStep]) -> str:
    ms = [s.ms for s in g]
    head = (f"steps {', '.join(str(s.step) for s in g)} took {_took(ms)} each ({_times(ms, g[0].median_ms)} the "
            f"median {g[0].median_ms:.1f} ms)")
    s = g[0]
    if s.rank is None:
        return f"{head}: {s.why}"
    return f"{head}: {_named(s, [x.busy_ms for x in g], max(x.others_ms for x in g))}"


def _named(s: LongStep, busy: list[float], others: float) -> str:
    on = f" on {s.host}" if s.host else ""
    where, what = where_text(s.where), doing(s.where)
    return (f"rank {s.rank}{on} {WHAT.get(s.what or 'cpu', 'busy')} {_took(busy)} of it, the others "
            f"{_took([others])} at most: they waited for it" + (f"; {where}" if where else "")
            + (f"; {what}" if what else ""))


def format_long_step(s: LongStep) -> str:
    """One stall's line."""
    head = f"step {s.step} took {_took([s.ms])} ({_times([s.ms], s.median_ms)} the median {s.median_ms:.1f} ms)"
    if s.rank is None:
        return f"{head}: {s.why}"
    return f"{head}: {_named(s, [s.busy_ms], s.others_ms)}"
