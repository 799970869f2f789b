"""Memory a rank keeps taking: a leak, said before the OOM killer ends the job.

A training loop that keeps what it should drop (losses appended for logging with their autograd
graph, a list or cache that grows every step, tensors held by a hook) grows its process's anonymous
memory step after step, until hours in the kernel's OOM killer ends the rank with nothing in the log
but "Signal 9 (SIGKILL)". Each rank samples its anonymous resident memory every few seconds
(memwatch.py, at the step boundary) into a series thinned to at most MAX_SAMPLES; this module judges
it, for the rank's own warning while there is time and for rank 0's job summary alike.

A rank's memory grows by GROWTH_MB or more, and by GROWTH_SHARE of what it held at the first sample
after warm-up, steadily: over the series' second half at STEADY or more of its rate over the whole (a
cache or pool that filled early and stopped is no leak). It is warned about when at that rate the
memory it may still take (its cgroup's limit less what the cgroup holds, or what the host has
available) runs out before the job has run as long again as it has.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

MAX_SAMPLES = 64
GROWTH_MB = 256.0
GROWTH_SHARE = 0.25
STEADY = 0.5


@dataclass(frozen=True)
class Growth:
    """How a rank's anonymous memory grew over its samples (step, MB)."""

    first_step: int
    first_mb: float
    last_step: int
    last_mb: float
    recent_mb_per_step: float     # the rate over the series' second half

    @property
    def grown_mb(self) -> float:
        return self.last_mb - self.first_mb

    @property
    def mb_per_step(self) -> float:
        return self.grown_mb / max(self.last_step - self.first_step, 1)

    def to_json(self) -> dict[str, Any]:
        return {"first": [self.first_step, round(self.first_mb, 1)], "last": [self.last_step, round(self.last_mb, 1)],
                "recent_mb_per_step": round(self.recent_mb_per_step, 4)}

    @classmethod
    def from_json(cls, doc: Any) -> Growth | None:
        try:
            (s0, m0), (s1, m1) = doc["first"], doc["last"]
            g = cls(int(s0), float(m0), int(s1), float(m1), float(doc["recent_mb_per_step"]))
        except (KeyError, TypeError, ValueError):
            return None
        return g if all(math.isfinite(v) for v in (g.first_mb, g.last_mb, g.recent_mb_per_step)) else None


def growth(samples: Sequence[tuple[int, float]]) -> Growth | None:
    """The series' growth (None with fewer than 4 samples or not over at least 2 steps)."""
    if len(samples) < 4 or samples[-1][0] - samples[0][0] < 2:
        return None
    mid = samples[len(samples) // 2]
    (s0, m0), (s1, m1) = samples[0], samples[-1]
    recent = (m1 - mid[1]) / max(s1 - mid[0], 1)
    return Growth(int(s0), float(m0), int(s1), float(m1), recent)


def leaking(g: Growth | None) -> bool:
    """Grown enough, and still growing at the end."""
    return (g is not None and g.grown_mb >= max(GROWTH_MB, GROWTH_SHARE * g.first_mb)
            and g.recent_mb_per_step >= STEADY * g.mb_per_step > 0)


def steps_left(g: Growth, room_mb: float | None) -> float | None:
    """Steps until ``room_mb`` more is taken at the recent rate (None without a room or a rate)."""
    if room_mb is None or not math.isfinite(room_mb) or g.recent_mb_per_step <= 0:
        return None
    return max(room_mb, 0.0) / g.recent_mb_per_step


def _mb(v: float) -> str:
    return f"{v / 1024:.1f} GB" if abs(v) >= 1024 else f"{v:.0f} MB"


def _rate(g: Growth) -> str:
    per = g.recent_mb_per_step
    return f"{per * 1000:.0f} MB per 1,000 steps" if per < 1 else f"{per:.1f} MB a step"


LEAK_HINT = ("a leak? (tensors kept with their autograd graph, such as losses appended for logging without "
             ".item() or .detach(); a list, dict or cache that grows every step; tensors held by hooks)")


def warning(g: Growth | None, room_mb: float | None, step_ms: float | None) -> str | None:
    """The rank's warning when it leaks and at this rate runs out of room before the job has run as long
    again as it has since the first sample; None otherwise."""
    if g is None or not leaking(g):
        return None
    left = steps_left(g, room_mb)
    if left is None or left > g.last_step - g.first_step:
        return None
    when = f" (~{left * step_ms / 60e3:.0f} min at {step_ms:.0f} ms a step)" if step_ms and step_ms > 0 else ""
    return (f"memory: this rank's anonymous memory grew {_mb(g.grown_mb)} in steps {g.first_step:,}-{g.last_step:,} "
            f"({_mb(g.first_mb)} -> {_mb(g.last_mb)}), {_rate(g)} lately; at this rate the {_mb(max(room_mb or 0.0, 0.0))} it may "
            f"still take runs out in ~{left:,.0f} steps{when} and the kernel's OOM killer ends it: {LEAK_HINT}")


SPIKE_MB = 256.0      # reached this much more than any sample taken jump_s or more before,
SPIKE_SHARE = 0.5     # and this share of it more: one allocation


def _span(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def before_kill(samples: Sequence[tuple[float, float]], killed_mb: float | None, died_at: float, *,
                startup_s: float, jump_s: float) -> str:
    """What a rank's anonymous memory did before the OOM killer ended it: ``samples`` (wall time s, MB)
    taken by its wrapper from the rank's start, ``killed_mb`` the kernel's anon-rss at the kill (None
    where its log could not be read), ``died_at`` when it died. The kernel's record gives one size;
    whether the memory grew while the rank started (killed within ``startup_s`` of its start,
    EROICA_MEMORY_STARTUP_S: every rank of a host loading a full checkpoint), all at once (within
    ``jump_s``, three of the wrapper's sampling intervals: one allocation far larger than the others, a
    long batch, an evaluation, a gathered state dict) or for an hour (a leak: free what is kept) is what
    says what to change; the last two are judged on the samples from ``startup_s`` on. "" with fewer
    than 3 samples to judge."""
    if len(samples) < 3:
        return ""
    mbs = [mb for _, mb in samples]
    end_t, end = (died_at, killed_mb) if killed_mb is not None else samples[-1]
    top = max(*mbs, end)
    if died_at - samples[0][0] < startup_s and top - mbs[0] >= GROWTH_MB:
        return (f"its anonymous memory grew {_mb(mbs[0])} -> {_mb(top)} in the {_span(died_at - samples[0][0])} "
                "since it started: it ran out while starting up or in its first steps (loading a model, a checkpoint "
                "or a dataset into memory; every rank of a host loading the full checkpoint at once is a common "
                "cause: load it memory-mapped, torch.load(..., mmap=True), or on one rank and broadcast it)")
    # judged from when the rank had started up (its first samples hold its imports and model loading)
    samples = [(t, mb) for t, mb in samples if t >= samples[0][0] + startup_s]
    if len(samples) < 3:
        return ""
    mbs = [mb for _, mb in samples]
    # a jump: the end over every sample taken more than jump_s before it
    earlier = [(t, mb) for t, mb in samples if t <= end_t - jump_s]
    level = max((mb for _, mb in earlier), default=end)
    if len(earlier) >= 2 and end - level >= max(SPIKE_MB, SPIKE_SHARE * level):
        g = growth([(int(round(t)), mb) for t, mb in earlier])
        span = _span(earlier[-1][0] - earlier[0][0])
        held = (f"had grown for {span}, {_mb(g.first_mb)} -> {_mb(g.last_mb)} (a leak as well?),"
                if g is not None and leaking(g) else
                f"stayed at or below {_mb(level)} over the {span} sampled,")
        return (f"its anonymous memory {held} then reached {_mb(end)} within {end_t - earlier[-1][0]:.0f} s: one "
                "allocation far larger than the others (a batch or sequence much longer than the rest, an evaluation "
                "pass, a full state dict or checkpoint gathered on this rank)")
    span = _span(samples[-1][0] - samples[0][0])
    g = growth([(int(round(t)), mb) for t, mb in samples])
    if g is not None and leaking(g):
        at_kill = f", {_mb(killed_mb)} when killed" if killed_mb is not None else ""
        return (f"its anonymous memory had grown for {span}, {_mb(g.first_mb)} -> {_mb(g.last_mb)} at its last sample "
                f"({_mb(g.recent_mb_per_step * 60)} a minute at the end{at_kill}): {LEAK_HINT}")
    return (f"its anonymous memory over the {span} sampled: {_mb(mbs[0])} at first, {_mb(max(mbs))} at most, "
            f"{_mb(mbs[-1])} at its last sample, {died_at - samples[-1][0]:.0f} s before it died")


class ChildMemory(NamedTuple):
    """One child process of a rank (its DataLoader worker, most often) as its wrapper read it last
    (oom.MemoryTrail): its own memory (USS: pages no other process maps) and anonymous resident size,
    and the rank's anonymous resident size, its largest in the wrapper's recent samples."""

    first_s: float        # wall time of its first read
    first_uss_mb: float
    s: float              # wall time of its last read
    uss_mb: float
    anon_mb: float
    rank_anon_mb: float


CHILDREN_MB = 64.0     # the rank's children holding this much memory of their own or more,
CHILDREN_SHARE = 0.1   # and this share of the rank's at the kill, are said to have taken it
COPIED = 0.5           # copied pages this share of their own memory or more: copy-on-read
# copied pages this share of the rank's own memory (and CHILDREN_MB or more) are said while the rank runs:
# see copies_while_running
WARN_SHARE = 0.25
COPY_FIX = ("keep the dataset in numpy arrays, torch tensors or a memory-mapped file rather than Python objects, "
            "or use fewer workers")
COPY_WHY = ("copy-on-read: reading a Python object writes its reference count, so a forked worker that reads the "
            "dataset's lists, dicts and strings makes each page of them its own")


def copied_mb(kids: Sequence[ChildMemory]) -> float:
    """The rank's pages its children hold copies of: each one's own memory (USS) beyond what it maps over
    the rank's size (its anonymous resident size less the rank's); the rest is memory it took itself."""
    return sum(max(k.uss_mb - max(k.anon_mb - k.rank_anon_mb, 0.0), 0.0) for k in kids)


def _who(n: int) -> tuple[str, str]:
    return (("its child process (its DataLoader worker, most often)", "its") if n == 1 else
            (f"its {n} child processes (its DataLoader workers, most often)", "their"))


def copies_while_running(children: Sequence[tuple[float, ...]]) -> str | None:
    """What to say while the rank runs when its children (``children``: ChildMemory's fields each, one
    round of the wrapper's reads) hold copies of its pages worth WARN_SHARE of its own memory, and
    CHILDREN_MB or more, most of what they hold (COPIED); None otherwise.

    Copy-on-read kills a job late: each worker's copies grow as it reads through the dataset (and start
    again with every epoch's new workers), the host's or the job's memory limit charges every copy, and
    the OOM killer then ends the largest process, the rank, whose own memory never grew. The one sign
    before is its workers' memory, which neither the rank's own samples nor a job's usual metrics show
    (a fork's copied pages leave its resident size as it was). The bar is the rank's own size, not an
    absolute one: a worker allocating in heap pages it inherited copies some too, tens of MB against a
    training process's GBs, while a dataset of Python objects read by its workers is copied at its own
    size, once per worker."""
    kids = [ChildMemory(*c) for c in children]
    rank_mb = max((k.rank_anon_mb for k in kids), default=0.0)
    copied = copied_mb(kids)
    if rank_mb <= 0 or copied < max(CHILDREN_MB, WARN_SHARE * rank_mb) or \
            copied < COPIED * sum(k.uss_mb for k in kids):
        return None
    who, _ = _who(len(kids))
    return (f"{who} hold {_mb(copied)} of pages copied from the rank's memory as they read them, "
            f"{copied / rank_mb:.1f}x the rank's own {_mb(rank_mb)} ({COPY_WHY}); every worker's copies count "
            "against the memory limit of the host or the job, and the OOM killer ends the rank once they fill it: "
            f"{COPY_FIX}")


def children_before_kill(children: Sequence[tuple[float, ...]], rank_mb: float | None,
                         died_at: float) -> tuple[str, bool]:
    """What the rank's child processes (its DataLoader workers, most often) held of their own memory at
    the wrapper's last read of them before the kill: ``children`` ChildMemory's fields each; ``rank_mb``
    the killed process's size, when known. The OOM killer ends the largest process of the cgroup, the
    rank itself most often, though what filled it was its workers: a forked worker shares the rank's
    pages until it writes one, and reading a Python object writes its reference count. A page it copied
    so is its own (USS) without making it larger (RSS): its own memory beyond what it maps over the
    rank's size is copied pages (copy-on-read; fix: a dataset of no Python objects), the rest memory it
    took itself (a spawned worker's, or a cache). The words, and whether they copied the rank's pages
    (then the rank's memory was only what they copied, and what it did is beside the point); ("", False)
    when they held less than CHILDREN_MB, or less than CHILDREN_SHARE of ``rank_mb``."""
    kids = [ChildMemory(*c) for c in children]
    if not kids:
        return "", False
    own = sum(k.uss_mb for k in kids)
    if own < max(CHILDREN_MB, CHILDREN_SHARE * (rank_mb or 0.0)):
        return "", False
    copied = copied_mb(kids)
    n, at, since = len(kids), max(k.s for k in kids), min(k.first_s for k in kids)
    first = sum(k.first_uss_mb for k in kids)
    who, their = _who(n)
    held = (f"{who} held {_mb(own)} of {their} own memory (USS) {max(died_at - at, 0.0):.0f} s before the kill"
            + (f", {_mb(first)} when first read {_span(at - since)} earlier" if at - since >= 1.0 else ""))
    if copied >= COPIED * own:
        return (f"{held}, about {_mb(copied)} of it pages of the rank's memory copied as {'it' if n == 1 else 'they'} "
                f"read them ({COPY_WHY}); {COPY_FIX}"), True
    return (f"{held}: memory {'it' if n == 1 else 'they'} took {'itself' if n == 1 else 'themselves'} (a dataset "
            "loaded again in each worker, a cache in the Dataset, items kept across batches)"), False


SHOWN = 8   # leaking ranks a job summary keeps (the most grown)


def summarize(per_rank: Mapping[int, Growth | None]) -> dict[str, Any] | None:
    """The job summary's record of ranks whose memory kept growing: the SHOWN most grown, how many in all,
    and how much the others grew (min, max MB); None when none leaked."""
    grew = {r: g for r, g in per_rank.items() if g is not None and leaking(g)}
    if not grew:
        return None
    others = [g.grown_mb for r, g in per_rank.items() if g is not None and r not in grew]
    top = sorted(grew, key=lambda r: -grew[r].grown_mb)[:SHOWN]
    return {"ranks": [[r, grew[r].to_json()] for r in top], "count": len(grew),
            **({"others_mb": [round(min(others), 1), round(max(others), 1)]} if others else {})}


def format_summary(doc: Any) -> str | None:
    """The job summary's line for ``summarize``'s record (None for none, or a record it cannot read)."""
    try:
        rank, g = int(doc["ranks"][0][0]), Growth.from_json(doc["ranks"][0][1])
        count = int(doc["count"])
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    if g is None:
        return None
    said = (f"rank {rank}'s anonymous memory grew {_mb(g.grown_mb)} in steps {g.first_step:,}-{g.last_step:,} "
            f"({_mb(g.first_mb)} -> {_mb(g.last_mb)}), still {_rate(g)} at the end")
    if count > 1:
        said += f"; {count - 1} other rank(s) grew too"
    others = doc.get("others_mb")
    if isinstance(others, list) and len(others) == 2:
        said += f"; the other ranks {_mb(float(others[0]))} to {_mb(float(others[1]))}"
    return f"  memory kept growing: {said}: {LEAK_HINT}"
