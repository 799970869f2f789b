"""Hang analysis (pure): where each rank is stuck, and which rank the others are waiting for.

A hung job produces no slow step to compare, and every rank sits in a collective except the one that
never arrived. Each rank's report (``eroica_runtime.hang`` collects it: Python stacks, the last
collectives from torch's Flight Recorder) says where it is; ranks are grouped by position and
collective sequence, and the minority are the outliers to blame, unless the sequence says who is
behind (``_behind``). No MPI, no torch.
"""

from __future__ import annotations

from typing import Any

from eroica_runtime.engine.model import Diagnosis, Finding

HANG_SCHEMA = "eroica.hang/1"
MOVED_BYTES = 1 << 20   # storage traffic while a rank watched itself that makes it busy (``moved``)
# the trigger of a hang's diagnosis: a capture of no steps, with no capture file (retention.py)
HANG_TRIGGER = "hang"


FINISHED = "the end of the program"   # where a rank whose program returned is (eroica_runtime.hang.finish)


def main_frames(report: dict[str, Any]) -> list[dict[str, Any]]:
    """A rank's main thread's frames, outermost first ([] when its report has none)."""
    main = next((s for s in report.get("stacks", []) if s.get("main")), None)
    return list(main.get("frames") or []) if isinstance(main, dict) else []


def where(report: dict[str, Any], user_roots: tuple[str, ...] = ()) -> str:
    """A rank's position: the innermost frame of its main thread outside Python's and torch's own code."""
    if report.get("finished") is True:
        return FINISHED
    frames = main_frames(report)
    if not frames:
        return "unknown"
    library = ("/torch/", "/site-packages/", "/lib/python3", "eroica_runtime/")
    for f in reversed(frames):
        if not any(part in f["file"] for part in library):
            return f"{f['file']}:{f['line']} in {f['function']}"
    f = frames[-1]
    return f"{f['file']}:{f['line']} in {f['function']}"


def moved(report: dict[str, Any]) -> list[str]:
    """Why a rank's report says it was busy while it watched itself (``eroica_runtime.hang.watch``),
    not stuck ("stack moving", "storage I/O", "collectives done"); [] when nothing moved (or the
    report does not say). Storage traffic counts from ``MOVED_BYTES``: less is what eroica itself may
    write meanwhile (rank 0's reports)."""
    m = report.get("moving")
    if not isinstance(m, dict):
        return []
    stored, done = m.get("storage_bytes"), m.get("collectives")
    return [why for why, yes in (
        ("stack moving", m.get("stack_moved") is True),
        ("storage I/O", isinstance(stored, int) and not isinstance(stored, bool) and stored >= MOVED_BYTES),
        ("collectives done", isinstance(done, int) and not isinstance(done, bool) and done > 0)) if yes]


def analyse(reports: dict[int, dict[str, Any]], world_size: int) -> dict[str, Any]:
    """Group ranks by position (and collective sequence); the minority are the outliers to blame.

    Unless a rank moved while it watched itself (``moved``): then the job is busy outside its
    optimizer steps (a checkpoint, an evaluation), not hung, and nobody is blamed: ``busy`` lists
    the ranks that moved, where and why, and ``positions`` where the others wait. A rank that did not
    answer is still a hang's culprit (dead or frozen), busy peers or not. A rank whose program
    returned (``finished``) is neither busy nor a culprit by its position; when every other rank
    that answered is still and inside torch, they wait for it in a collective it will never join
    (``_returned``); one still outside torch (a sleep, a subprocess uploading the final model) is
    busy "not in a collective", a pause."""
    groups: dict[tuple[str, Any], list[int]] = {}
    for rank, rep in sorted(reports.items()):
        fr = rep.get("flight_recorder") or {}
        # ranks whose program returned are all at its end, whichever collective each ran last
        groups.setdefault((where(rep), None if rep.get("finished") is True else fr.get("seq")), []).append(rank)
    missing = sorted(set(range(world_size)) - set(reports))
    ordered = sorted(groups.items(), key=lambda kv: -len(kv[1]))
    finished = sorted(rank for rank, rep in reports.items() if rep.get("finished") is True)
    why = {rank: [] if rank in finished else moved(rep) for rank, rep in reports.items()}
    busy = [{"rank": rank, "host": rep.get("host"), "where": where(rep), "why": why[rank],
             "storage_bytes": rep["moving"].get("storage_bytes"), "seconds": rep["moving"].get("seconds")}
            for rank, rep in sorted(reports.items()) if why[rank]]
    finding: dict[str, Any] | None = None
    waiting = [rank for rank in sorted(reports) if rank not in finished]
    outside = [rank for rank in waiting if not _in_torch(reports[rank])]
    # a rank that did not answer may be the one the others wait for: then who is behind says nothing
    behind = [] if missing or finished else _behind(reports, waiting)
    if not busy and finished and outside:
        # still, but not inside torch: sleeping, waiting for a subprocess (an upload of the final
        # model), not for a collective the returned ranks will never join; a pause, never the job's end
        busy = [{"rank": rank, "host": reports[rank].get("host"), "where": where(reports[rank]),
                 "why": ["not in a collective"], "storage_bytes": None, "seconds": None} for rank in outside]
    elif not busy and finished and waiting:
        finding = _returned(reports, finished, waiting)
    elif not busy and (behind or (len(ordered) > 1 and len(ordered[0][1]) > len(ordered[1][1]))):
        if behind:
            outliers = behind
            ahead = [(key, [r for r in ranks if r not in behind]) for key, ranks in ordered]
            (majority_where, majority_seq), _ = max((kv for kv in ahead if kv[1]), key=lambda kv: len(kv[1]))
            victims = sorted(r for _, ranks in ahead for r in ranks)
        else:
            (majority_where, majority_seq), victims = ordered[0][0], sorted(ordered[0][1])
            outliers = sorted(r for key, ranks in ordered[1:] for r in ranks)
        culprit = outliers[0]
        rep = reports[culprit]
        finding = {
            "category": "hang", "rank": culprit, "host": rep.get("host"), "function": where(rep),
            "phase": "hang", "impact_ms_per_step": None, "victims": victims,
            "evidence": {"stalled_s": rep.get("stalled_s"), "last_step": rep.get("step"),
                         "outliers": outliers, "majority_position": majority_where,
                         "majority_collective_seq": majority_seq,
                         "outlier_collective_seq": (rep.get("flight_recorder") or {}).get("seq"),
                         "stack": [f"{f['file']}:{f['line']} {f['function']}: {f['code']}"
                                   for f in main_frames(rep)[-12:]]},
            "action": (f"rank {culprit} never reached the collective the other {len(victims)} ranks wait "
                       f"in; look at its stack (a stuck data read, a deadlock, a rank-dependent branch that "
                       f"skips a collective)"),
        }
        mine = _collective(rep)
        theirs = next((_collective(reports[r]) or _pending(reports[r]) for r in victims
                       if where(reports[r]) == majority_where), None)
        if _waits_for_a_batch(rep):
            workers = _workers(rep)
            finding["evidence"]["workers"] = workers
            finding["action"] = _loader_action(culprit, rep.get("host"), len(victims), workers)
        elif mine and theirs and not behind:
            # each side waits inside a collective the other never calls: the ranks took different branches
            finding["evidence"]["collectives"] = [mine, theirs]
            finding["action"] = (
                f"rank {culprit} waits in {mine}() at {where(rep)} while the other {len(victims)} ranks wait "
                f"in {theirs}() at {majority_where}: different collective{' calls' if mine == theirs else 's'}, so "
                "none of them can complete. A branch taken on some ranks only (if rank == 0, a condition on a "
                "rank's own data or loss) must call the same collectives in the same order on every rank; "
                "logging a metric with sync_dist=True (Lightning) or reducing one (torchmetrics' compute) is a "
                "collective too (TORCH_DISTRIBUTED_DEBUG=DETAIL checks each call against the other ranks')")
    elif missing:
        finding = {"category": "hang", "rank": missing[0], "host": None, "function": "unknown",
                   "phase": "hang", "impact_ms_per_step": None, "victims": sorted(reports),
                   "evidence": {"missing": missing},
                   "action": f"ranks {missing} did not answer over the side channel: they are dead or "
                             f"frozen (SIGSTOP, D state); check their hosts"}
    return {"schema": HANG_SCHEMA, "world_size": world_size, "missing": missing,
            "positions": [{"where": w, "collective_seq": s, "ranks": r} for (w, s), r in ordered],
            "finding": finding, "busy": busy if finding is None else [],
            **({"end_job": True} if finding is not None and finding["function"] == FINISHED else {}),
            # every rank's program returned: the job is ending (its last reports are being written)
            **({"ending": True} if len(finished) == world_size else {})}


def _last_collective(report: dict[str, Any]) -> tuple[int, Any] | None:
    """(sequence number, process group) of the last collective torch's Flight Recorder holds for a rank,
    None when unknown (the recorder off, or a report without it)."""
    fr = report.get("flight_recorder")
    if not isinstance(fr, dict):
        return None
    seq = fr.get("seq")
    if type(seq) is not int:
        return None
    last = fr.get("last")
    pg = last[-1].get("pg") if isinstance(last, list) and last and isinstance(last[-1], dict) else None
    return seq, pg if isinstance(pg, (str, int)) else None


def _behind(reports: dict[int, dict[str, Any]], waiting: list[int]) -> list[int]:
    """The ranks whose last collective comes earliest in the sequence, when every still rank's is known,
    on one process group, and some are further on: the others made a collective these never reached,
    and wait in it for them (lowest rank first; [] otherwise). Why: positions alone named the wrong
    rank. A real 4-rank Lightning DDP job (2026-12-07) whose rank 3 deadlocked in a callback after its
    optimizer step: its peers, on to the next step's backward, had made DDP's first bucket's
    all-reduce (one of them, sequence 117) or both buckets' (the two others, 118), while rank 3's last
    was 116. Grouped by position, the two at 118 were the majority and the lowest other rank, rank 1,
    was named. Per process group: a pipeline stage's or a tensor-parallel group's sequence says nothing
    about another group's."""
    last = {r: _last_collective(reports[r]) for r in waiting}
    known = [v for v in last.values() if v is not None]
    if len(known) < 2 or len(known) < len(waiting) or len({pg for _, pg in known}) > 1:
        return []
    lo = min(seq for seq, _ in known)
    if all(seq == lo for seq, _ in known):
        return []
    return sorted(r for r, v in last.items() if v is not None and v[0] == lo)


def _collective(report: dict[str, Any]) -> str | None:
    """The torch.distributed collective a rank's main thread waits in (``barrier``, ``all_reduce``: its
    innermost frame in distributed_c10d.py), None when it is in none (the autograd engine waiting for
    DDP's all-reduce shows no such frame)."""
    for f in reversed(main_frames(report)):
        if str(f.get("file", "")).endswith("torch/distributed/distributed_c10d.py"):
            return str(f.get("function") or "") or None
    return None


def _pending(report: dict[str, Any]) -> str | None:
    """The collective a rank's last Flight Recorder entry says it has made and not completed
    (``all_reduce`` of "gloo:all_reduce"), None when that entry completed or is unknown. Why: ranks in
    DDP's backward wait for its gradient all-reduce inside the autograd engine, whose stack shows no
    frame of torch.distributed (``_collective``): a real 4-rank Lightning job whose rank 0 alone logged a
    metric with sync_dist=True (a barrier, then an all-reduce) read "rank 0 never reached the collective
    the other 3 ranks wait in", though it waited in one of its own."""
    fr = report.get("flight_recorder")
    last = fr.get("last") if isinstance(fr, dict) else None
    entry = last[-1] if isinstance(last, list) and last and isinstance(last[-1], dict) else {}
    name = entry.get("name")
    if not isinstance(name, str) or not name or entry.get("state") == "completed":
        return None
    return name.rsplit(":", 1)[-1][:64] or None


def _waits_for_a_batch(report: dict[str, Any]) -> bool:
    """Whether a rank's main thread waits for its DataLoader's worker processes (innermost frames in
    the loader's queue), not in a dataset's code of its own."""
    frames = main_frames(report)
    return any(str(f.get("file", "")).endswith("torch/utils/data/dataloader.py")
               and f.get("function") in ("_try_get_data", "_get_data") for f in frames[-8:])


def _workers(report: dict[str, Any]) -> list[dict[str, Any]]:
    """A rank's DataLoader workers as it watched itself (eroica_runtime.hang._watched), the well-formed ones."""
    out = []
    for w in report.get("workers") or []:
        if (isinstance(w, dict) and type(w.get("pid")) is int and isinstance(w.get("state"), str)
                and isinstance(w.get("cpu_s"), (int, float)) and not isinstance(w.get("cpu_s"), bool)):
            out.append({"pid": w["pid"], "state": w["state"][:16], "cpu_s": float(w["cpu_s"])})
    return out[:16]


# a worker that used less CPU than this while its rank watched itself (2 s) did no work
IDLE_CPU_S = 0.05
DISK_SLEEP = "disk-sleep"   # a worker's state in uninterruptible I/O (psutil's name for Linux's D)


def _loader_action(rank: int, host: Any, waiting: int, workers: list[dict[str, Any]]) -> str:
    """What to do about a rank held by its DataLoader's workers: which of them did nothing, and how to
    look inside one (its stack is in another process, which eroica does not sample)."""
    on = f" on {host}" if host else ""
    head = (f"rank {rank} waits for its next batch from its DataLoader's worker processes while the other "
            f"{waiting} ranks wait for it in a collective")
    if workers:
        stuck = [w for w in workers if w["cpu_s"] < IDLE_CPU_S]
        io = [w for w in stuck if w["state"] == DISK_SLEEP]
        pids = ", ".join(str(w["pid"]) for w in (stuck or workers)[:8])
        if io:
            seen = (f": {len(io)} of its {len(workers)} workers are in uninterruptible I/O (state D), a read from "
                    "storage or a network mount that does not return")
        elif len(stuck) == len(workers):
            seen = (f": none of its {len(workers)} workers used CPU while it watched (pids {pids}): one is blocked (a "
                    "read that never returns, a lock, a request without a timeout), the others wait with their "
                    "batches ready, as the loader takes them in order")
        elif stuck:
            seen = (f": {len(stuck)} of its {len(workers)} workers used no CPU while it watched (pids {pids}): "
                    "blocked (a read that never returns, a lock, a request without a timeout)")
        else:
            seen = (f": its {len(workers)} workers kept running (pids {pids}): a sample or transform that never "
                    "finishes (an endless loop) or workers too slow for the loader's pace")
    else:
        pids, seen = "<worker pid>", ": no worker of it was seen (one may have died without the loader noticing)"
    return (head + seen + f". py-spy dump --pid {pids.split(', ')[0]}{on} shows where a worker is; "
            "DataLoader(timeout=...) makes such a wait an error")


def _in_torch(report: dict[str, Any]) -> bool:
    """Whether a rank's main thread is inside torch (its innermost Python frame: a collective, the
    autograd engine running DDP's gradient all-reduce, a device synchronize), as a rank that waits for
    a collective is."""
    frames = main_frames(report)
    return bool(frames) and "/torch/" in str(frames[-1].get("file", ""))


def _returned(reports: dict[int, dict[str, Any]], finished: list[int], waiting: list[int]) -> dict[str, Any]:
    """The finding for ranks whose program returned while the others are still in theirs, not
    moving: those wait in a collective the returned ranks will never join. Ending the job is the only
    way on (the document's ``end_job``): under torchrun the returned rank's exit closes its
    connections and the others' collectives fail at once; under eroica its process lives on until
    every rank is done. Found by a DDP job whose rank 2 ran out of batches 50 steps before its peers
    (uneven inputs): torchrun's job failed in 7 s, eroica's hung until its launcher was killed."""
    culprit = finished[0]
    rep = reports[culprit]
    places: dict[str, list[int]] = {}
    for rank in waiting:
        places.setdefault(where(reports[rank]), []).append(rank)
    majority = max(places.items(), key=lambda kv: len(kv[1]))[0]
    last = [reports[r].get("step") for r in waiting]
    named = f"rank {culprit}" if len(finished) == 1 else f"ranks {', '.join(map(str, finished))}"
    return {
        "category": "hang", "rank": culprit, "host": rep.get("host"), "function": FINISHED,
        "phase": "hang", "impact_ms_per_step": None, "victims": waiting,
        "evidence": {"stalled_s": rep.get("stalled_s"), "last_step": rep.get("step"), "finished": finished,
                     "waiting_last_steps": last, "majority_position": majority, "stack": []},
        "action": (f"{named}'s program returned after step {rep.get('step')} while the other ranks wait in a "
                   f"collective{_after(rep.get('step'), last)} that it will never join: it ran fewer steps or "
                   "collectives than they. Uneven inputs (a rank "
                   "with fewer batches): give every rank as many (DistributedSampler with drop_last, "
                   "the same number of steps) or train inside DDP's join() context manager; a branch that "
                   "skips a collective on some ranks does this too. eroica ended the job."),
    }


def _after(step: Any, last: list[Any]) -> str:
    """" of the next step" when the waiting ranks stopped where the returned rank did, else where."""
    steps = sorted({s for s in last if isinstance(s, int)})
    if steps == [step]:
        return " of the next step"
    return f" after step {', '.join(map(str, steps))}" if steps else ""


def hang_diagnosis(doc: dict[str, Any], step: int) -> Diagnosis:
    """A diagnosed hang (``analyse``'s document) as a Diagnosis, to join the job's findings like any other."""
    f = doc.get("finding")
    missing = tuple(int(m) for m in doc.get("missing") or ())
    world = int(doc.get("world_size") or 0)
    findings: tuple[Finding, ...] = ()
    if f:
        stalled = (f.get("evidence") or {}).get("stalled_s")
        findings = (Finding(category="hang", rank=f.get("rank"), host=f.get("host"), function=f.get("function"),
                            phase="hang", impact_ms_per_step=float(stalled or 0) * 1e3, what_if_step_ms=None,
                            victims=tuple(f.get("victims") or ()), evidence=dict(f.get("evidence") or {}),
                            action=str(f.get("action") or ""),
                            title=f"hang: rank {f.get('rank')} at {f.get('function')}", captures=(step,)),)
    return Diagnosis(step=step, trigger=HANG_TRIGGER, world_size=world, ranks_analysed=world - len(missing),
                     findings=findings, missing=missing)

