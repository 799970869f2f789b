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
thread was while the step ran long (a stack sampled once per long step). At job end the node
leaders reduce them to one record a step (``StepSeen``) and rank 0 judges each step from those as
from every rank's records side by side: in a step every rank waited out, the rank that was busy
through a good part of it (BUSY_SHARE) while the others were asleep in a collective for more than
half of its busy time (ALONE_SHARE) is the one they waited for. When no rank was busy, the stacks say it: every other rank's main thread sat at one
place (the collective they waited in) and one rank's elsewhere (a write to a slow filesystem, an
upload, a sleep: off the CPU, so its busy time is as small as its victims'). A 3-rank DDP job
whose rank 1 blocked 1.2 s writing a checkpoint shard at steps 60 and 120 (2026-12-07) read "no
rank was busy on a CPU or waiting for a batch for a quarter of it" before. When every rank was
busy, or none and the stacks do not single one out, the line says so.

The job's start (step 0: imports, the model's build, a checkpoint's load, the first batch and step)
goes the same way, and is said only when it names the rank the others waited for: a 3-rank job whose
rank 2 read its data shard 12 s before building its model (2026-12-07) spent 12 of its 17.6 s with
ranks 0 and 1 waiting in DDP's first broadcast, and read "healthy". Pure: no MPI, no torch.
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
# all-reduce. Not alone either: every rank evaluating, rank 2 on a shard 3x the others' (2026-12-07),
# was busy 421 ms of a 441 ms step and the others 189 at most, waiting for it the rest; at a quarter
# it read "every rank was busy through it (an evaluation, a job-wide pause)", which hid who held it
BUSY_SHARE = 0.25
ALONE_SHARE = 0.5
WHAT = {"cpu": "on a CPU", "data": "waiting for its next batch", "gc": "in garbage-collection pauses"}
# a step's records are counted by where each rank's main thread was (its stack's innermost frame): at
# most this many places, or the step's stacks are too scattered to single out one rank (a node leader
# then forwards none; see StepSeen)
MAX_PLACES = 3
AWAY = "away"   # LongStep.what of a rank named by its stack alone: elsewhere than where all the others waited


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
    what: str | None = None           # cpu | data | gc (WHAT) or AWAY, for a named rank
    busy_ms: float = 0.0              # the named rank's busy time in the step
    others_ms: float = 0.0            # the most any other rank was busy in it
    where: tuple[str, ...] = ()       # the named rank's main-thread stack while the step ran long, innermost last
    why: str = ""                     # when no rank is named
    stopped: tuple[int, ...] = field(default_factory=tuple)   # ranks stopped and continued (SIGSTOP) in it
    among: int = 1                    # steps of the job past the bar, this one included (ranks' records)
    waited_at: str = ""               # AWAY: the place (innermost frame) where all the other ranks waited ...
    waiting: int = 0                  # ... and how many they were

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
                   among=max(1, int(_num(doc.get("among")))),
                   waited_at=str(doc.get("waited_at") or ""), waiting=int(_num(doc.get("waiting"))))

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "ms": round(self.ms, 3), "median_ms": round(self.median_ms, 3),
                "ranks_seen": self.ranks_seen, "rank": self.rank, "host": self.host, "what": self.what,
                "busy_ms": round(self.busy_ms, 3), "others_ms": round(self.others_ms, 3), "where": list(self.where),
                "why": self.why, "stopped": list(self.stopped), "among": self.among,
                **({"waited_at": self.waited_at, "waiting": self.waiting} if self.what == AWAY else {})}


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


def to_send(records: list[dict[str, Any]], median_ms: float | None,
            startup: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """What a rank sends of its kept longest steps (``StepClock.long_steps``, longest first) at job end:
    only steps past the bar against its own median, at most MAX_SENT (of 5 checkpoints alike, which 3
    a rank would send differs between ranks: the saving rank's and its peers' must meet), each with
    its stack (~1 kB) to its node leader, who forwards a count of ranks a place and the stack of a
    rank alone at its place only (StepSeen); a healthy job sends nothing. ``startup``: step 0's record
    (the job's start, ``StepClock.startup``), sent first when past the bar as well."""
    if not median_ms or median_ms <= 0:
        return []
    bar = max(LONG_RATIO * median_ms, LONG_MIN_MS)
    first = [startup] if isinstance(startup, dict) and _num(startup.get("ms")) >= bar else []
    return first + [rec for rec in records if _num(rec.get("ms")) >= bar and rec.get("step") != 0][:MAX_SENT]


# one place a step's records were counted at: (innermost frame, ranks there, the least of them, its
# stack and busy ms while it is alone there, else () and 0.0)
Place = tuple[str, int, int, tuple[str, ...], float]


def _place(rank: int, rec: Mapping[str, Any]) -> Place | None:
    where = rec.get("where")
    if not (isinstance(where, list) and where and all(isinstance(f, str) for f in where)):
        return None
    return (where[-1], 1, rank, tuple(where), _busy(rec))


def _merge_places(a: tuple[Place, ...] | None, b: tuple[Place, ...] | None) -> tuple[Place, ...] | None:
    """Two steps' place counts as one; None (too scattered) past MAX_PLACES places. Associative: the
    result is None exactly when the records hold more than MAX_PLACES places in all, and a rank's
    stack is kept exactly when no other rank was at its place."""
    if a is None or b is None:
        return None
    by = {p[0]: p for p in a}
    for p in b:
        q = by.get(p[0])
        by[p[0]] = p if q is None else (p[0], p[1] + q[1], min(p[2], q[2]), (), 0.0)
    return tuple(sorted(by.values())) if len(by) <= MAX_PLACES else None


MAX_STOPPED = 16   # ranks stopped in a step listed by number (the rest counted): a suspended job stops all


@dataclass(frozen=True)
class StepSeen:
    """What the ranks' records of one long step add up to, for a node (its leader reduces them) or the
    job: all ``_judge`` needs, without every rank's record. Why: an evaluation every rank works
    through puts a stack in each of its 8 records (~9 kB a rank): 940 MB into rank 0 at 100,000
    ranks, where one record a step per node holds the same verdict. ``merge`` is associative, so
    leaders and rank 0 reduce alike; the busiest rank's stack is dropped as soon as another rank was
    busy more than ALONE_SHARE of its time (it can then never be the one rank the others waited for,
    however many records join later)."""

    step: int
    ms: float                    # the longest record of the step
    ranks: int                   # ranks with a record of it
    top: int                     # the busiest of them
    top_rec: Mapping[str, Any]   # its record
    second: float = 0.0          # the most any other rank was busy in it
    data_all: bool = True        # every record mostly a wait for the next batch
    stopped: tuple[int, ...] = ()   # ranks stopped and continued in it (the first MAX_STOPPED)
    stopped_n: int = 0
    eroica: bool = False         # eroica's own work held it up (a capture: stepclock's "eroica" mark)
    places: tuple[Place, ...] | None = ()   # where the sampled ranks' main threads were (None: > MAX_PLACES)
    unsampled: int = 0           # records with no stack (the hang watchdog off, or it did not look in time)

    @classmethod
    def of(cls, rank: int, rec: Mapping[str, Any]) -> StepSeen:
        """One rank's record of a step."""
        stopped = _num(rec.get("stops")) > 0
        place = _place(rank, rec)
        busy = _busy(rec) >= BUSY_SHARE * _num(rec.get("ms"))   # only such a rank's stack can name it as busy
        return cls(step=int(rec["step"]), ms=_num(rec.get("ms")), ranks=1, top=rank,
                   top_rec=rec if busy else {k: v for k, v in rec.items() if k != "where"},
                   data_all=_what(rec) == "data", stopped=(rank,) if stopped else (), stopped_n=int(stopped),
                   eroica=bool(rec.get("eroica")), places=(place,) if place else (), unsampled=int(place is None))

    def merge(self, other: StepSeen) -> StepSeen:
        """The two sets of records together (the same step)."""
        hi, lo = (self, other) if (_busy(self.top_rec), -self.top) >= (_busy(other.top_rec), -other.top) else (other, self)
        second = max(hi.second, lo.second, _busy(lo.top_rec))
        rec = hi.top_rec
        if "where" in rec and second > ALONE_SHARE * _busy(rec):
            rec = {k: v for k, v in rec.items() if k != "where"}
        return StepSeen(step=self.step, ms=max(self.ms, other.ms), ranks=self.ranks + other.ranks, top=hi.top,
                        top_rec=rec, second=second, data_all=self.data_all and other.data_all,
                        stopped=tuple(sorted(self.stopped + other.stopped)[:MAX_STOPPED]),
                        stopped_n=self.stopped_n + other.stopped_n, eroica=self.eroica or other.eroica,
                        places=_merge_places(self.places, other.places), unsampled=self.unsampled + other.unsampled)

    def to_wire(self) -> dict[str, Any]:
        return {"step": self.step, "ms": self.ms, "ranks": self.ranks, "top": self.top, "rec": dict(self.top_rec),
                "second": self.second, "data_all": self.data_all, "stopped": list(self.stopped),
                "stopped_n": self.stopped_n, "eroica": self.eroica, "unsampled": self.unsampled,
                "places": None if self.places is None else [[k, n, r, list(f), b] for k, n, r, f, b in self.places]}

    @classmethod
    def from_wire(cls, doc: Any) -> StepSeen | None:
        """Back from ``to_wire`` (a node leader's payload); None for anything else."""
        if not isinstance(doc, Mapping):
            return None
        rec, step, ranks, top = doc.get("rec"), doc.get("step"), doc.get("ranks"), doc.get("top")
        if not (_int(step) and _int(ranks) and _int(top) and ranks > 0 and isinstance(rec, Mapping)):
            return None
        where = rec.get("where")
        rec = {k: _num(rec.get(k)) for k in ("ms", "cpu", "runq", "data", "gc", "stops")} | (
            {"where": [str(f) for f in where if isinstance(f, str)]} if isinstance(where, list) else {})
        stopped = doc.get("stopped")
        return cls(step=step, ms=_num(doc.get("ms")), ranks=ranks, top=top, top_rec={"step": step, **rec},
                   second=_num(doc.get("second")), data_all=doc.get("data_all") is True,
                   stopped=tuple(r for r in stopped if _int(r))[:MAX_STOPPED] if isinstance(stopped, list) else (),
                   stopped_n=int(_num(doc.get("stopped_n"))), eroica=doc.get("eroica") is True,
                   places=_places_from_wire(doc.get("places")), unsampled=int(_num(doc.get("unsampled"))))


def _int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _places_from_wire(doc: Any) -> tuple[Place, ...] | None:
    """A leader's place counts; None (nothing to single a rank out by) for anything malformed."""
    if not isinstance(doc, list) or len(doc) > MAX_PLACES:
        return None
    out = []
    for p in doc:
        if not (isinstance(p, list) and len(p) == 5 and isinstance(p[0], str) and _int(p[1]) and p[1] > 0
                and _int(p[2]) and isinstance(p[3], list)):
            return None
        out.append((p[0], p[1], p[2], tuple(str(f) for f in p[3] if isinstance(f, str)), _num(p[4])))
    return tuple(sorted(out))


def reduce_records(records: Mapping[int, Any], keep: int | None = MAX_SENT) -> dict[int, StepSeen]:
    """Ranks' job-end records (``{rank: to_send(...)}``) as one StepSeen a step, the ``keep`` longest
    (None: all). A node leader keeps its node's MAX_SENT longest, as each rank keeps its own: the
    steps every rank waited out are about as long on every rank."""
    seen: dict[int, StepSeen] = {}
    for rank, recs in records.items():
        for rec in recs if isinstance(recs, list) else []:
            if isinstance(rec, Mapping) and _int(rec.get("step")):
                one = StepSeen.of(rank, rec)
                seen[one.step] = seen[one.step].merge(one) if one.step in seen else one
    return _longest(seen, keep)


def merge_seen(parts: list[Mapping[int, StepSeen]]) -> dict[int, StepSeen]:
    """Several reductions (node leaders') as one, every step kept (rank 0 counts them)."""
    seen: dict[int, StepSeen] = {}
    for part in parts:
        for step, one in part.items():
            seen[step] = seen[step].merge(one) if step in seen else one
    return seen


def _longest(seen: dict[int, StepSeen], keep: int | None) -> dict[int, StepSeen]:
    if keep is None or len(seen) <= keep:
        return seen
    # ties (the same stall on every rank, rounded alike): every node keeps the same, earliest steps
    return {s.step: s for s in sorted(seen.values(), key=lambda s: (-s.ms, s.step))[:keep]}


def long_steps(seen: Mapping[int, StepSeen], per_rank: Mapping[int, Mapping[str, Any]],
               median_ms: float | None) -> list[LongStep]:
    """The job's longest steps (at least LONG_RATIO x ``median_ms`` and LONG_MIN_MS), longest first, at
    most MAX_SHOWN, from every rank's job-end records reduced a step each (``reduce_records``,
    ``merge_seen``); ``per_rank``: the ranks that reported at job end (their hosts).

    A step eroica's own capture held up is left out unless one rank stalled in it alone: its ranks
    waited for a node leader's link probe or a peer's summary slices (a 112 ms lead-in step on 4
    ranks sharing 2 cores, the others' steps 11 ms, read "no rank was busy ... (only 2 of the 4 ranks
    kept this step)"), which is no stall of the job's."""
    if not median_ms or median_ms <= 0:
        return []
    bar = max(LONG_RATIO * median_ms, LONG_MIN_MS)
    ranked = sorted((s for s in seen.values() if s.ms >= bar), key=lambda s: -s.ms)
    # a step eroica held up only when one rank stalled in it alone; the job's start (every rank imports,
    # builds, loads) only when one rank held the others in it (_held_the_start)
    kept = [j for j, s in ((_judge(s, per_rank, median_ms), s) for s in ranked)
            if (not s.eroica or j.rank is not None) and (s.step != 0 or _held_the_start(j))]
    return [replace(j, among=len(kept)) for j in kept[:MAX_SHOWN]]


# where ranks wait for a peer at the job's start: its rendezvous, a barrier, DDP's or FSDP's first broadcast
START_WAITS = ("/torch/distributed/", "torch/nn/parallel/distributed.py")


def _held_the_start(j: LongStep) -> bool:
    """Whether the job's start is worth a line: one rank named, the others waiting through half of it or
    more, and, when named by its stack alone, they waited inside torch.distributed. Ranks starting alike
    are busy through theirs, each sampled somewhere in its imports or its model's build: two of three at
    one line by chance would otherwise name the third."""
    if j.rank is None or j.others_ms > 0.5 * j.ms:
        return False
    return j.what != AWAY or any(m in j.waited_at for m in START_WAITS)


def _incomplete(seen: StepSeen, reporting: int) -> str:
    """' (only N of M ranks kept this step: ...)' when ranks that reported at job end hold no record of it."""
    if seen.ranks >= reporting:
        return ""
    return (f" (only {seen.ranks} of the {reporting} ranks that reported kept this step among their "
            f"{MAX_SENT} longest)")


def _stopped_text(seen: StepSeen) -> str:
    listed = ", ".join(map(str, seen.stopped))
    if seen.stopped_n > len(seen.stopped):
        return f"{seen.stopped_n} ranks ({listed}, ...) stopped and continued in it (SIGSTOP)"
    return f"rank{'s' if len(seen.stopped) > 1 else ''} {listed} stopped and continued in it (SIGSTOP)"


def _judge(seen: StepSeen, per_rank: Mapping[int, Mapping[str, Any]], median_ms: float) -> LongStep:
    top, rec, others = seen.top, seen.top_rec, seen.second
    base = {"step": seen.step, "ms": seen.ms, "median_ms": median_ms, "ranks_seen": seen.ranks,
            "stopped": seen.stopped}
    busy = _busy(rec)
    if busy >= BUSY_SHARE * _num(rec.get("ms")) and others <= ALONE_SHARE * busy and seen.ranks > 1:
        where = rec.get("where")
        host = per_rank.get(top, {}).get("host")
        return LongStep(**base, rank=top, host=host if isinstance(host, str) else None, what=_what(rec),
                        busy_ms=busy, others_ms=others,
                        where=tuple(str(f) for f in where) if isinstance(where, list) else ())
    # every rank present busy alike: the ranks that kept no record of the step would not change that. At
    # the job's start every rank imports and builds for seconds: a quarter of it is no sign of alike (a
    # rank that prepared the data alone 8 s of an 11 s start, its peers busy 2.8 s, read "every rank
    # was busy through it"), and the stacks say more: the others waiting inside torch.distributed while
    # one rank is elsewhere held it (a rank that slept 10 s reading its shard, every rank busy 3.4-3.6 s
    # importing on 2 shared cores of a 13.7 s start, read "every rank was busy through it" in 1 run of 5)
    away = _away(seen, len(per_rank))
    started = seen.step == 0 and away is not None and any(m in away[1][0] for m in START_WAITS)
    alike = not started and seen.ranks > 1 and others >= BUSY_SHARE * seen.ms and \
        (seen.step != 0 or others >= 0.5 * busy)
    if alike and seen.data_all:
        why = ("every rank waited for its next batch through it: DataLoader workers starting anew at an "
               "epoch's start (persistent_workers=True keeps them), or a store every rank reads from stalled")
    elif alike:
        why = "every rank was busy through it (an evaluation, a job-wide pause)"
    elif seen.stopped_n:
        why = _stopped_text(seen)
    elif away is not None:
        (_, _, rank, where, busy), (at, waiting, *_) = away
        host = per_rank.get(rank, {}).get("host")
        return LongStep(**base, rank=rank, host=host if isinstance(host, str) else None, what=AWAY, busy_ms=busy,
                        others_ms=others if rank == top else _busy(rec), where=where, waited_at=at, waiting=waiting)
    elif len(per_rank) == 1:
        why = f"the job's one rank was busy {busy / 1e3:.2f} s of it"
    else:
        why = "no rank was busy on a CPU or waiting for a batch for a quarter of it (storage, a sleep, a subprocess, " \
              "the network)"
    return LongStep(**base, busy_ms=busy, others_ms=others,
                    why=why + ("" if alike else _incomplete(seen, len(per_rank))))


def _away(seen: StepSeen, reporting: int) -> tuple[Place, Place] | None:
    """(the lone rank's place, the others' place) when every reporting rank's stack was sampled in the
    step, all but one at the same place (at least 2 of them: with 2 ranks neither is the odd one) and
    that one elsewhere: where the others waited for it. None otherwise, and when the lone rank was in
    eroica's own work (``eroicas_work``: a node leader's link probe is elsewhere than the ranks
    waiting for it). A step in a capture's window carries eroica's mark, yet a rank asleep in its
    own code there held the others as anywhere: a 4-rank job whose rank 3 slept 2 s at step 70,
    inside a window opened at step 68 by a noise spike (CI, 2026-12-07), listed no long step."""
    if seen.unsampled or seen.places is None or len(seen.places) != 2 or seen.ranks < reporting:
        return None
    lone, rest = sorted(seen.places, key=lambda p: p[1])
    if lone[1] != 1 or rest[1] < 2 or not lone[3] or (seen.eroica and any(map(eroicas_work, lone[3]))):
        return None
    return lone, rest


# eroica's step clock (stepclock.py) wraps backward() and the DataLoader, and so sits in the stacks of
# ranks doing the job's own work: its frames are no sign of eroica's work
EROICA_CODE, EROICA_CLOCK = "/eroica_runtime/", "/eroica_runtime/stepclock.py:"


def eroicas_work(frame: str) -> bool:
    """A frame of eroica's own work (a capture's lead-in, a window's close, a summary, the gather)."""
    return EROICA_CODE in frame and EROICA_CLOCK not in frame


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
    generated (inductor's compiled modules live in a torchinductor_<user> cache directory), not eroica's
    (installed in place, as for its own tests, it is outside site-packages)."""
    return not (_stdlib(frame) or any(m in frame for m in PACKAGES) or "/torchinductor_" in frame
                or EROICA_CODE in frame)


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
DOING = ((("torch/_dynamo/", "torch/_inductor/", "torch/_functorch/_aot_autograd/"),
          "torch.compile was compiling on that rank: a recompilation (TORCH_LOGS=recompiles says which guard "
          "failed; mark_dynamic or padding keeps shapes from changing)"),
         (("torch/serialization.py",), "it was saving or loading with torch.save/torch.load"),
         (("torch/distributed/checkpoint/",), "it was saving or loading a distributed checkpoint"),
         # a framework's checkpoint code by its functions' names (a frame is "file:line function"):
         # Lightning's ModelCheckpoint writing the bytes torch.save made (fsspec, outside torch.save),
         # Hugging Face's Trainer._save_checkpoint, accelerate's save_state, a script's own
         ((" save_checkpoint", " _save_checkpoint", " save_state", " _atomic_save"), "it was saving a checkpoint"))


def landmark(frame: str) -> bool:
    """A frame that says what the rank was doing (``DOING``) wherever it sits in the stack: kept by
    the stack sampler even when it is neither among the innermost frames nor the user's."""
    return any(m in frame for marks, _ in DOING for m in marks)


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


def held_ms(steps: list[LongStep]) -> float:
    """What the listed stalls cost every rank: their time past the median step (the job's start: past
    the most any other rank was busy in it, its own start)."""
    return sum(max(s.ms - (s.others_ms if s.step == 0 else s.median_ms), 0.0) for s in steps)


def format_long_steps(steps: list[LongStep]) -> list[str]:
    """The job summary's lines: one per stall, and one for stalls with the same verdict (the same rank
    doing the same thing, or every rank alike: a checkpoint every 50 steps, workers started at every
    epoch), longest first."""
    groups: dict[tuple[Any, ...], list[LongStep]] = {}
    out = [format_long_step(s) for s in steps if s.step == 0]   # the job's start: its own line, first
    for s in steps:
        if s.step == 0:
            continue
        key = (s.rank, s.what, doing(s.where)) if s.rank is not None else (None, s.why)
        groups.setdefault(key, []).append(s)
    return out + [format_long_step(g[0]) if len(g) == 1 else _format_group(g) for g in groups.values()]


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
    if s.what == AWAY:
        state = (f"was busy {_took(busy)} of it" if min(busy) >= BUSY_SHARE * s.ms else
                 f"was off the CPU through it (busy {_took(busy)})")
        head = (f"rank {s.rank}{on} {state}, not where the {s.waiting} others waited ({short_frame(s.waited_at)}): "
                "they waited for it")
    else:
        head = (f"rank {s.rank}{on} {WHAT.get(s.what or 'cpu', 'busy')} {_took(busy)} of it, the others "
                f"{_took([others])} at most: they waited for it")
    return head + (f"; {where}" if where else "") + (f"; {what}" if what else "")


def format_long_step(s: LongStep) -> str:
    """One stall's line."""
    head = (f"the job's start took {_took([s.ms])} to its first step" if s.step == 0 else
            f"step {s.step} took {_took([s.ms])} ({_times([s.ms], s.median_ms)} the median {s.median_ms:.1f} ms)")
    if s.rank is None:
        return f"{head}: {s.why}"
    return f"{head}: {_named(s, [s.busy_ms], s.others_ms)}"
