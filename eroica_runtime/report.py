"""Reports: the text block in the rank-0 log, diagnosis-<step>.json, report.json and report.html.

Files are written atomically (through ``reportdir``, the directory's one owner) before anything is printed, so a job killed right after
a diagnosis still leaves it on disk. Text leads with the answer (who, what, how much) for an SRE
reading it at 3 a.m.; numbers are shown next to the peers' median.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from eroica_runtime import reportdir
from eroica_runtime.engine import Diagnosis, Finding, consolidate, finding_key, longsteps
from eroica_runtime.engine.categories import SAME_CALLS
from eroica_runtime.engine.hang import HANG_TRIGGER
from eroica_runtime.engine.model import conclusive, count_ranks
from eroica_runtime.engine.settings import settings_text
from eroica_runtime.engine.transient import split_transient

REPORT_SCHEMA = "eroica.report/1"
STEPS_SCHEMA = "eroica.steps/1"


DRILL_RANKS = 8          # named ranks shown in detail per capture (a host finding names a node)
DRILL_FUNCTIONS = 12     # of each, its functions with the most self time
_STEP_KEYS = ("step", "ms", "cpu", "runq", "data", "gc", "comm", "stops")
_FUNCTION_KEYS = ("name", "phase", "kind", "count", "ms", "self")


def _plain(v: Any, depth: int = 0) -> Any:
    """JSON-safe copy of summary data: validation checks the fields the engine reads, not every
    nested value, and one NaN or byte string in a rank's device map must not cost the diagnosis
    file (``allow_nan=False``)."""
    if isinstance(v, dict) and depth < 4:
        return {str(k): _plain(x, depth + 1) for k, x in v.items()}
    if isinstance(v, (list, tuple)) and depth < 4:
        return [_plain(x, depth + 1) for x in v]
    if isinstance(v, float):
        return round(v, 4) if math.isfinite(v) else None
    if v is None or isinstance(v, (bool, int)):
        return v
    return _text(v) if isinstance(v, str) else None


def finite(v: Any) -> bool:
    """A number a report may print: report.json is read back from disk, its fields may be anything."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _self_ms(f: Mapping[str, Any]) -> float:
    v = f.get("self")
    return float(v) if finite(v) else float(f.get("ms") or 0.0)


def drill_down(summaries: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """The named ranks' own numbers, from their raw summaries (``pipeline.Analysed.summaries``).

    A finding compares a rank with its peers phase by phase; what it leaves out is how the rank
    looked step by step (steady or bursty; its thread on the CPU, queued, or in the data loader),
    the steps before the window, and everything it ran, not only what grew. Ranks in the order the
    findings name them; validated summaries, so every field read here exists with its type.
    """
    out: dict[str, Any] = {}
    for rank, s in list(summaries.items())[:DRILL_RANKS]:
        fns = sorted(s.get("functions") or [], key=lambda f: -_self_ms(f))
        out[str(rank)] = _plain({
            "host": s.get("host"), "pid": s.get("pid"), "local_rank": s.get("local_rank"),
            "device": s.get("device"), "capture": s.get("capture"),
            "steps": [{k: st[k] for k in _STEP_KEYS if k in st} for st in s.get("steps") or []],
            "history": s.get("history"), "phases": s.get("phases"), "gc": s.get("gc"),
            "functions": [{k: f[k] for k in _FUNCTION_KEYS if k in f} for f in fns[:DRILL_FUNCTIONS]],
            "functions_listed": len(s.get("functions") or []),
        })
    return out


def write_capture(report_dir: str | os.PathLike[str], diagnosis: Diagnosis,
                  drill: Mapping[str, Any] | None = None) -> Path:
    """``<report-dir>/diagnosis-<step>.json`` for one capture, with the named ranks' ``drill_down``."""
    doc = diagnosis.to_json()
    if drill:
        doc["drill_down"] = dict(drill)
    return reportdir.atomic_write(reportdir.diagnosis_path(report_dir, diagnosis.step),
                                  json.dumps(doc, indent=1, allow_nan=False))


def load_steps(report_dir: str | os.PathLike[str]) -> dict[str, list] | None:
    """Rank 0's step history (``steps.msgpack``) or None when absent or unreadable. Checked in numpy:
    a long job's file holds a million steps and is read back at every capture (report.html's plot)."""
    try:
        raw = reportdir.read_capped(Path(report_dir) / reportdir.STEPS, reportdir.MAX_REPORT_BYTES)
        doc = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except (reportdir.InputError, ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
        return None
    if not isinstance(doc, dict) or doc.get("schema") != STEPS_SCHEMA:
        return None
    steps, ms = doc.get("steps"), doc.get("ms")
    if not isinstance(steps, list) or not isinstance(ms, list) or len(steps) != len(ms):
        return None
    try:
        step_arr = np.array(steps, dtype=np.int64)
        ms_arr = np.array(ms, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        return None
    if ms_arr.ndim != 1 or step_arr.ndim != 1 or not (np.isfinite(ms_arr).all() and (ms_arr >= 0).all()):
        return None
    return {"steps": step_arr.tolist(), "ms": ms_arr.tolist()}


def load_job(report_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The job report in ``report_dir`` (report.json), None where there is none yet. InputError, one
    line naming the file and what is wrong, where it is unreadable or not an eroica report."""
    path = Path(report_dir) / reportdir.REPORT_JSON
    if not path.is_file():
        return None
    raw = reportdir.read_capped(path, reportdir.MAX_REPORT_BYTES)
    try:
        doc = json.loads(raw)
    except RecursionError:
        raise reportdir.InputError(f"{path}: unreadable report (nested too deeply)") from None
    except ValueError as exc:
        raise reportdir.InputError(f"{path}: unreadable report ({' '.join(str(exc).split())[:200]})") from None
    if not isinstance(doc, dict) or doc.get("schema") != REPORT_SCHEMA:
        said = repr(doc.get("schema")) if isinstance(doc, dict) else type(doc).__name__
        raise reportdir.InputError(f"{path}: unreadable report (schema is {said}, expected {REPORT_SCHEMA!r})")
    return doc


def write_steps(report_dir: str | os.PathLike[str], history: Sequence[float]) -> Path:
    """``steps.msgpack``: rank 0's step-time history (for plots); rounded to 0.1 µs in numpy (a long
    job's million steps are rewritten at every capture)."""
    ms = np.round(np.asarray(history, dtype=np.float64), 4)
    data = msgpack.packb({"schema": STEPS_SCHEMA, "steps": np.arange(1, len(ms) + 1).tolist(),
                          "ms": ms.tolist()}, use_bin_type=True)
    with reportdir.job_files_lock():
        return reportdir.atomic_write(Path(report_dir) / reportdir.STEPS, data)


def build_report(*, diagnoses: Sequence[Diagnosis], world_size: int, steps: int,
                 job: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report.json document: findings consolidated over the job, sorted by impact, less the CPU
    contention that came once and went (``transient``, engine/transient.py). A rank the job's
    statistics name as busier than its peers over the whole job (``steady_work``) that a finding
    names too is left to the finding: the demo's compute fault read twice, once with the function."""
    caps = []
    for d in sorted(diagnoses, key=lambda x: x.step):
        doc = d.to_json()
        caps.append({"step": d.step, "trigger": d.trigger, "findings": doc["findings"],
                     "missing": doc["missing"], "errors": doc["errors"], "notes": doc["notes"],
                     "ranks_analysed": d.ranks_analysed, "step_ms": doc["step_ms"], "peers": doc["peers"]})
    findings, transient = split_transient(consolidate(list(diagnoses)), list(diagnoses))
    steady = (job or {}).get("steady_work")
    if isinstance(steady, dict) and any(f.rank == steady.get("rank") for f in findings):
        job = {k: v for k, v in (job or {}).items() if k != "steady_work"}
    return {"schema": REPORT_SCHEMA, "world_size": int(world_size), "steps": int(steps),
            "job": job or {}, "captures": caps,
            "findings": [f.to_json() for f in findings], "transient": [f.to_json() for f in transient]}


def write_job(report_dir: str | os.PathLike[str], *, diagnoses: Sequence[Diagnosis], world_size: int,
              steps: int, job: dict[str, Any] | None = None,
              drill: Mapping[int, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """Write ``report.json`` and ``report.html`` (atomically) and return the report document.

    ``drill``: per capture step, its ``drill_down`` (shown in report.html; the JSON keeps it in
    diagnosis-<step>.json). Print ``format_job(report)`` only after this returns.
    """
    from eroica_runtime.report_html import render_html

    report = build_report(diagnoses=diagnoses, world_size=world_size, steps=steps, job=job)
    root = Path(report_dir)
    docs = []
    for d in sorted(diagnoses, key=lambda x: x.step):
        doc = d.to_json()
        if drill and drill.get(d.step):
            doc["drill_down"] = drill[d.step]
        docs.append(doc)
    with reportdir.job_files_lock():
        reportdir.atomic_write(root / reportdir.REPORT_JSON, json.dumps(report, indent=1, allow_nan=False))
        html = render_html(report, docs, load_steps(root))
        reportdir.atomic_write(root / reportdir.REPORT_HTML, html)
    return report


# ---------------------------------------------------------------------------------------- text

def _ms(x: Any) -> str:
    return f"{x:.1f}" if isinstance(x, (int, float)) else "?"


def calls_text(rank: Any, peers: Any) -> str:
    """", 133 vs 2 calls" when a function's calls per step differ from its peers' (or the baseline's):
    more work, not slower work; nothing when they are about the same or unknown (an older report)."""
    if not all(finite(x) for x in (rank, peers)):
        return ""
    if abs(rank - peers) <= SAME_CALLS * peers + 0.5:   # the engine's 'same calls' (work_verdict)
        return ""
    return f", {rank:.0f} vs {peers:.0f} calls" if max(rank, peers) >= 10 else f", {rank:.1f} vs {peers:.1f} calls"


PROFILE_ROWS = 5   # functions of each side (host, device) in a lone rank's profile


def _fine(x: Any) -> str:
    """ms or MB for a profile: a tenth from 1 up, two decimals below (a toy trace's kernels)."""
    return "?" if not finite(x) else f"{x:.1f}" if abs(x) >= 1 or x == 0 else f"{x:.2f}"


def _device_row(f: Mapping[str, Any]) -> bool:
    """A function row of device work: kernels, copies, memsets, and collective kernels: rows that
    name a launching op (the host's collective records do not), or NCCL/RCCL kernels by name
    (ncclDevKernel_..., never the host's nccl:all_reduce) when no launcher was recorded for them."""
    if f.get("kind") in ("kernel", "memcpy", "memset"):
        return True
    name = str(f.get("name") or "")
    return f.get("kind") == "collective" and ("launcher" in f or (name[:4] in ("nccl", "rccl") and name[4:5] != ":"))


def format_profile(s: Mapping[str, Any]) -> list[str]:
    """Where one rank's step went, from its summary alone: for a rank with nothing to compare it with
    (`eroica analyze --traces` over one rank's trace, which is often all a team kept). No culprit can
    be named without peers, but the split of the step, the device's busy and idle time and the
    heaviest host ops and kernels say where to look. ``s`` is a validated summary."""
    ph = s.get("phases") or {}
    steps = [st.get("step") for st in s.get("steps") or [] if isinstance(st.get("step"), int)]
    span = f"steps {steps[0]}-{steps[-1]}" if len(steps) > 1 else (f"step {steps[0]}" if steps else "its window")
    n = (s.get("profile") or {}).get("steps")
    counted = f", {n} counted" if isinstance(n, int) and steps and n != len(steps) else ""
    out = [f"eroica: rank {_text(s.get('rank'))} alone, {span}{counted}: {_ms(ph.get('step'))} ms a step "
           "(no peer to compare it with: where its step went, not a diagnosis)"]
    parts = [f"{k} {_ms(ph.get(k))}" for k in ("data", "forward", "backward", "optimizer") if finite(ph.get(k))]
    parts.append(f"waiting in collectives {_ms(ph.get('comm'))} (collectives in flight {_ms(ph.get('comm_total'))})")
    parts += [f"{label} {_ms(ph.get(k))}" for k, label in (("host_gap", "outside any op"), ("gc", "gc"), ("io", "io"))
              if finite(ph.get(k)) and ph.get(k)]
    out.append("  host ms a step: " + ", ".join(parts))
    dev = s.get("device_phases")
    if isinstance(dev, Mapping) and finite(dev.get("busy")):
        step = ph.get("step")
        share = f" ({100 * dev['busy'] / step:.0f}% of the step)" if finite(step) and step > 0 else ""
        line = (f"  device ms a step: busy {_fine(dev.get('busy'))}{share}: compute {_fine(dev.get('compute'))}, "
                f"collectives {_fine(dev.get('comm'))} ({_fine(dev.get('comm_exposed'))} with no compute or copy "
                f"beside them), copies {_fine(dev.get('transfer'))}; idle {_fine(dev.get('idle'))}")
        copies = []
        for way in ("HtoD", "DtoH", "DtoD", "PtoP"):
            ms, mb, pageable = (dev.get(f"{way.lower()}{k}") for k in ("_ms", "_mb", "_pageable_mb"))
            if finite(ms) and (ms >= 0.005 or (finite(mb) and mb >= 0.005)):
                copies.append(f"{way} {_fine(ms)} ms {_fine(mb)} MB"
                              + (f" ({_fine(pageable)} MB of it pageable)" if finite(pageable) and pageable >= 0.005
                                 else ""))
        out.append(line + (f"; {', '.join(copies)}" if copies else ""))
    fns = [f for f in s.get("functions") or [] if f.get("kind") not in ("annotation", "other")]
    host = sorted((f for f in fns if not _device_row(f)), key=lambda f: -_self_ms(f))[:PROFILE_ROWS]
    device = sorted((f for f in fns if _device_row(f)), key=lambda f: -float(f.get("ms") or 0.0))[:PROFILE_ROWS]
    if host:
        out.append("  heaviest host ops (own time, ms a step): " + "; ".join(
            f"{_text(f.get('name'), 80)} {_fine(_self_ms(f))} [{_text(f.get('phase'))}]" for f in host))
    if device:
        out.append("  heaviest device work (ms a step): " + "; ".join(
            f"{_text(f.get('name'), 80)} {_fine(f.get('ms'))} [{_text(f.get('phase'))}"
            + (f", from {_text(f.get('launcher'), 60)}" if f.get("launcher") else "") + "]" for f in device))
    return out


def format_time_lost(doc: Any) -> str:
    """The job summary's line for ``engine.timelost.TimeLost.to_json()``: measured, next to the
    findings' estimates, so a reader sees how much of the slowdown they account for. Empty for a
    value that is not one (report.json is read back from disk by ``eroica analyze``)."""
    try:
        first, last = (int(x) for x in doc["before_steps"])
        since, end, steps = int(doc["since_step"]), int(doc["last_step"]), int(doc["steps"])
        mean, before, per_step, total = (float(doc[k]) for k in ("mean_ms", "before_ms", "per_step_ms", "total_s"))
    except (KeyError, TypeError, ValueError):
        return ""
    lost = "none measured" if per_step <= 0 else f"{total:.1f} s, +{per_step:.1f} ms a step over {steps} steps"
    own = doc.get("eroica_steps")
    own_ms = doc.get("eroica_ms")
    if isinstance(own, int) and not isinstance(own, bool) and own > 0 and finite(own_ms):
        # eroica's own cost, said where its steps are left out (a report from before it: the old words)
        left_out = f"left out: the {own} steps eroica profiled or summarised in, mean {float(own_ms):.1f} ms"
    else:
        left_out = "profiled steps left out"
    start = doc.get("onset_step")
    if isinstance(start, int) and not isinstance(start, bool) and start < since:
        origin = f"step {start} (the slowdown's onset in rank 0's step times; first finding at {since})"
    else:
        origin = f"step {since} (first finding)"
    return (f"  time lost from {origin} to {end}: {lost} (mean step {mean:.1f} ms vs "
            f"{before:.1f} ms in steps {first}-{last}; rank 0's step times, {left_out})")


def _num3(x: Any) -> str:
    return f"{x:.3g}" if isinstance(x, (int, float)) else "?"


def _text(x: Any, limit: int = 200) -> str:
    """One printable line: names come from other processes and traces, and a newline (or an escape
    sequence) in a host or function name must not forge lines or colours in the rank-0 log."""
    text = str(x)
    if not text.isprintable():
        text = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _pair(ev: dict[str, Any], key: str) -> str | None:
    """"12.3 vs peers 4.5 ms"; "vs baseline" for a rank without peers, compared with its baseline self."""
    v = ev.get(key)
    if isinstance(v, list) and len(v) == 2:
        ref = "baseline" if ev.get("compared_with") else "peers"
        return f"{_ms(v[0])} vs {ref} {_ms(v[1])} ms"
    return None


def _ranks(ranks: Sequence[int], limit: int = 8) -> str:
    shown = ", ".join(_text(r) for r in list(ranks)[:limit])
    return shown + (f", … (+{len(ranks) - limit})" if len(ranks) > limit else "")


def if_fixed_text(f: dict[str, Any]) -> str:
    """"step → 41.2 ms if fixed" ("" without a what-if); with another culprit, which one holds the step
    then, or holds it as long or longer now (engine._what_ifs), or that slow collectives do
    (engine._beside_the_network): the order to fix them in."""
    what_if, ev = f.get("what_if_step_ms"), f.get("evidence") or {}
    if not isinstance(what_if, (int, float)):
        return ""
    if isinstance(ev.get("held_by"), int):
        return f"fixed alone, the step stays {_ms(what_if)} ms: rank {ev['held_by']} holds it too"
    if isinstance(ev.get("then_held_by"), int):
        return f"step → {_ms(what_if)} ms if fixed, then rank {ev['then_held_by']} holds it"
    if ev.get("then_collectives") is True:
        return f"step → {_ms(what_if)} ms if fixed, then the slow collectives hold it"
    return f"step → {_ms(what_if)} ms if fixed"


def _count(v: Any) -> int:
    """A count from a report's evidence, 0 when it is none (a report.json edited or from elsewhere)."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0


def ranks_text(f: dict[str, Any]) -> str:
    """Whom a finding names, as the HTML findings table's rank column and the text's head say it: its
    rank, the ranks a host finding merges ("1, 3"), or for one of all ranks "all", or how many of them
    slowed where it spared some ("3 of 4"); "–" for none (a communication finding)."""
    ev = f.get("evidence") or {}
    if (f.get("category") == "regression" or ev.get("all_ranks")) and f.get("rank") is None:
        spared, n = _count(ev.get("ranks_spared_count")), _count(ev.get("ranks_compared"))
        return f"{n - spared} of {n}" if 0 < spared < n else "all"
    if isinstance(ev.get("ranks"), list) and ev["ranks"]:
        return _ranks(ev["ranks"])
    return _text(f["rank"]) if f.get("rank") is not None else "–"


def impact_text(f: dict[str, Any]) -> str:
    """"+41.2 ms/step"; for a hang, how long the job went without a step (its impact is that time, in
    ms, so that it ranks first: "+62000.0 ms/step" read as a per-step cost)."""
    if f.get("category") == "hang":
        stalled = (f.get("evidence") or {}).get("stalled_s")
        ok = isinstance(stalled, (int, float)) and not isinstance(stalled, bool) and math.isfinite(stalled)
        return f"no step for {stalled:.0f} s" if ok else "no step"
    return f"+{_ms(f.get('impact_ms_per_step'))} ms/step"


def format_finding(f: dict[str, Any] | Finding, index: int = 1) -> list[str]:
    """A few lines for one finding: answer first, then evidence, then what to do."""
    f = f.to_json() if isinstance(f, Finding) else f
    ev = f.get("evidence") or {}
    who = f"rank {_text(f['rank'])}" if f.get("rank") is not None else "no single rank"
    ranks = ev.get("ranks")
    if f.get("rank") is None and isinstance(ranks, list) and ranks:
        # a host finding that merges its ranks: "4 of 4 ranks on node-b" (listed below), not "no single
        # rank", which reads as if nobody were to blame
        on = _count(ev.get("ranks_on_host"))
        who = f"{len(ranks)} of {on} ranks" if on >= len(ranks) else count_ranks(len(ranks))
    where = f" on {_text(f['host'])}" if f.get("host") else ""
    if (f.get("category") == "regression" or ev.get("all_ranks")) and f.get("rank") is None:
        who = f"{ranks_text(f)} ranks"   # a regression of one rank compared names it
    head = (f"  #{index} {_text(f.get('category', '?')).upper()}: {who}{where} — "
            f"{_text(f.get('function') or '?')} [{_text(f.get('phase') or '-')}], "
            f"{impact_text(f)}" + (f" ({if_fixed_text(f)})" if if_fixed_text(f) else ""))
    lines = [head]
    facts = []
    if f.get("category") == "regression" or ev.get("all_ranks") or "baseline_step" in ev:
        for key, label in (("own_work_ms", "own work"), ("comm_wait_ms", "comm wait"), ("step_ms", "step")):
            v = ev.get(key)
            if isinstance(v, list) and len(v) == 2:
                facts.append(f"{label} {_ms(v[0])} vs baseline {_ms(v[1])} ms")
        spared = ev.get("ranks_spared")
        if isinstance(spared, list) and spared:
            more = max(_count(ev.get("ranks_spared_count")), len(spared)) - len(spared)
            facts.append(f"not slower: rank{'s' if len(spared) + more > 1 else ''} "
                         + ", ".join(_text(r) for r in spared) + (f" and {more} more" if more > 0 else ""))
    elif "cpu_ms" in ev:
        # named from the step clock's steps before the window: every rank's step is alike there (the
        # others waited); what differs is where the rank's own time went
        for key, label in (("late_ms", "late to its collectives"), ("cpu_ms", "on CPU"),
                           ("run_queue_ms", "waiting for a CPU"), ("data_ms", "waiting for data"), ("gc_ms", "in GC")):
            v = ev.get(key)
            if isinstance(v, list) and len(v) == 2 and all(isinstance(x, (int, float)) for x in v) \
                    and v[0] - v[1] >= 1.0:
                facts.append(f"{label} {_pair(ev, key)}")
        if facts:
            facts[0] = "before the window: " + facts[0]
    else:
        for key, label in (("own_work_ms", "own work"), ("comm_wait_ms", "comm wait"), ("step_ms", "step")):
            p = _pair(ev, key)
            if p:
                facts.append(f"{label} {p}")
    if facts:
        lines.append("     " + " | ".join(facts))
    if all(finite(ev.get(k)) for k in ("average_ms", "excess_ms", "average_steps")):
        # a burst: the finding's cost is its average; what a slow step cost is said here
        lines.append(f"     in bursts: +{_ms(ev['excess_ms'])} ms/step in the slow steps the vote caught, "
                     f"+{_ms(ev['average_ms'])} on average over the {int(ev['average_steps'])} steps before the window")
    fns = ev.get("functions") or []
    if fns:
        parts = []
        for fn in fns[:3]:
            if "rank_ms" in fn:
                parts.append(f"{_text(fn.get('name'))} {_ms(fn['rank_ms'])} vs {_ms(fn.get('peers_ms'))} ms"
                             + calls_text(fn.get("rank_calls"), fn.get("peers_calls")))
            elif "now_ms" in fn:
                parts.append(f"{_text(fn.get('name'))} {_ms(fn['now_ms'])} vs baseline {_ms(fn.get('baseline_ms'))} ms"
                             + calls_text(fn.get("now_calls"), fn.get("baseline_calls")))
        lines.append("     grew most: " + "; ".join(parts))
    settings = settings_text(ev.get("settings"))
    if settings:   # the action says what to change; cut at 400 characters, it must not hide this
        lines.append(f"     set on this rank only: {settings}")
    if ev.get("ranks"):
        lines.append(f"     ranks: {_ranks(ev['ranks'])}")
    if ev.get("hosts"):
        by = "the job's only host" if ev.get("one_host") else f"by {_text(ev.get('localized_by', '?'))}"
        lines.append(f"     hosts: {', '.join(_text(h) for h in ev['hosts'][:8])} "
                     f"({by}{_probe_figures(ev.get('probe'))})")
    victims = f.get("victims") or []
    if victims:
        lines.append(f"     victims: {count_ranks(len(victims))} only waited on it ({_ranks(victims)})")
    if f.get("action"):
        lines.append(f"     action: {_text(f['action'], 400)}")
    return lines


def _probe_figures(probe: Any) -> str:
    """': h1 0.09 Gbps vs the hosts' 1.9' — what the link probe measured on the hosts it named."""
    if not isinstance(probe, dict):
        return ""
    parts = []
    for host, m in list(probe.items())[:4]:
        if not isinstance(m, dict):
            continue
        if isinstance(m.get("bandwidth_gbps"), (int, float)):
            parts.append(f"{_text(host)} {_num3(m['bandwidth_gbps'])} Gbps vs the hosts' "
                         f"{_num3(m.get('hosts_median_bandwidth_gbps'))}")
        elif isinstance(m.get("latency_us"), (int, float)):
            parts.append(f"{_text(host)} {_num3(m['latency_us'])} µs vs the hosts' "
                         f"{_num3(m.get('hosts_median_latency_us'))}")
    return (": " + "; ".join(parts)) if parts else ""


MAX_SLOWER_NOTES = 4   # lines of the engine's notes under a capture that was slower with no culprit


def _unexplained(d: dict[str, Any]) -> bool:
    """A capture slower than the baseline with nothing to blame (engine: step_ms.unexplained_ms)."""
    sm = d.get("step_ms")
    return isinstance(sm, dict) and not d.get("findings") and all(isinstance(sm.get(k), (int, float)) and not isinstance(sm.get(k), bool)
                                         for k in ("median", "baseline", "unexplained_ms"))


def stood_down_text(report: dict[str, Any]) -> str:
    """"nothing diagnosed: eroica stood down at step N: <why>" for a job eroica switched itself off for
    (runtime._check_synchronised: its ranks never wait for each other) and so took no capture, else "":
    the text report's head and report.html say why, not "no capture" or "no findings", which read as
    eroica failing or as a verdict on ranks it never compared."""
    job = report.get("job")
    stood = job.get("stood_down") if isinstance(job, dict) else None
    if report.get("findings") or report.get("captures") or not isinstance(stood, dict) \
            or not isinstance(stood.get("why"), str):
        return ""
    return f"nothing diagnosed: eroica stood down at step {_text(stood.get('step'))}: {_text(stood['why'], 600)}"


def slower_text(d: dict[str, Any]) -> str:
    """What a capture slower than the baseline with no culprit looked like ("" for any other capture):
    the text line and report.html say it instead of "healthy"."""
    if not _unexplained(d):
        return ""
    med, base = d["step_ms"]["median"], d["step_ms"]["baseline"]
    return (f"median step {_ms(med)} ms vs {_ms(base)} ms in the baseline capture (+{_ms(med - base)} ms), and "
            "neither own work nor communication wait explains it on most ranks")


def passing_text(d: dict[str, Any]) -> str:
    """What a capture no detector asked for looked like when its window alone was slower ("" for any
    other capture; engine: step_ms.before_window_ms): said instead of "healthy", which its slow
    median step would belie, and of a finding, which the steps before it do not support."""
    sm = d.get("step_ms")
    if d.get("findings") or not isinstance(sm, dict):
        return ""
    before = sm.get("before_window_ms")
    if not (isinstance(before, list) and len(before) == 2 and all(finite(x) for x in [*before, sm.get("median"),
                                                                                       sm.get("baseline")])):
        return ""
    return (f"median step {_ms(sm['median'])} ms vs {_ms(sm['baseline'])} ms in the baseline capture, but the steps "
            f"just before this window {before[0] - before[1]:+.1f} ms vs those before the baseline's")


def one_off_text(d: dict[str, Any]) -> str:
    """What a capture whose window one rank's one-off work made long looked like ("" for any other
    capture; engine: step_ms.one_off): said instead of "healthy" (its median step belies it) or
    "slower, no culprit" (there is one, once), and of a per-step finding, which one step does not make."""
    sm = d.get("step_ms")
    one = sm.get("one_off") if isinstance(sm, dict) and not d.get("findings") else None
    if not (isinstance(one, dict) and isinstance(one.get("rank"), int) and finite(one.get("ms"))
            and isinstance(one.get("steps"), list) and one["steps"]):
        return ""
    on = f" on {_text(one['host'])}" if isinstance(one.get("host"), str) else ""
    ms = float(one["ms"])
    alone = f"{ms / 1e3:.2f} s" if ms >= 1e3 else f"{ms:.0f} ms"
    more = one.get("ranks")
    others = f" (and {more - 1} other rank(s) alike)" if isinstance(more, int) and more > 1 else ""
    # a step that long is among those the job summary lists, with where the rank was (engine/longsteps.py)
    base = sm.get("baseline")
    listed = finite(base) and ms + float(base) >= max(longsteps.LONG_RATIO * float(base), longsteps.LONG_MIN_MS)
    return (f"rank {one['rank']}{on} worked {alone} alone in step {', '.join(_text(s) for s in one['steps'][:8])} "
            f"while its peers waited{others}, and the steps before the window show no such work: a one-off, not a "
            f"per-step cost (median step {_ms(sm.get('median'))} ms"
            + ("; the job summary's longest steps say where it was)" if listed else ")"))


def is_healthy(d: dict[str, Any]) -> bool:
    """What ``format_capture`` calls "healthy": no finding, enough ranks to compare (more than one), not
    slower than the baseline, no passing slowdown and no one-off."""
    n, ws = int(d.get("ranks_analysed") or 0), int(d.get("world_size") or 0)
    return (not d.get("findings") and conclusive(n, ws) and n != 1 and not slower_text(d)
            and not passing_text(d) and not one_off_text(d))


def format_capture(diagnosis: Diagnosis | dict[str, Any], before: Mapping[tuple[Any, ...], int] | None = None) -> str:
    """Text block for one capture (one line when nothing is wrong). ``before`` (``engine.first_named``
    of the job's earlier captures): a finding named before is one line pointing at the capture that named
    it first, not its whole block again. Why: a long job's refilled captures name a steady fault
    every refill period, and rank 0's log would repeat the same eight lines each time; the full
    block is in the capture's diagnosis-<step>.json."""
    d = diagnosis.to_json() if isinstance(diagnosis, Diagnosis) else diagnosis
    n, ws = d.get("ranks_analysed", 0), d.get("world_size", 0)
    med = (d.get("step_ms") or {}).get("median")
    tail = []
    if d.get("missing"):
        tail.append(f"     missing ranks: {_ranks(d['missing'])}")
    for e in (d.get("errors") or [])[:5]:
        tail.append(f"     rejected: {_text(e, 400)}")
    if len(d.get("errors") or []) > 5:
        tail.append(f"     … {len(d['errors']) - 5} more rejected summaries")
    findings = d.get("findings") or []
    if not findings and not conclusive(int(n or 0), int(ws or 0)):
        rejected, missing = len(d.get("errors") or []), len(d.get("missing") or [])
        line = (f"eroica: step {_text(d.get('step'))} ({_text(d.get('trigger'))}): not diagnosed — only "
                f"{n}/{ws} ranks sent a usable summary ({rejected} rejected, {missing} missing)")
        return "\n".join([line, *tail])
    if one_off_text(d):
        line = (f"eroica: step {_text(d.get('step'))} ({_text(d.get('trigger'))}): a one-off stall, no steady "
                f"culprit — {one_off_text(d)} ({n}/{ws} ranks analysed)")
        return "\n".join([line, *tail])
    if slower_text(d):
        line = (f"eroica: step {_text(d.get('step'))} ({_text(d.get('trigger'))}): slower, no culprit found — "
                f"{slower_text(d)} ({n}/{ws} ranks analysed)")
        # nothing to blame: what the engine looked at and left out is all the reader has to go on
        notes = [x for x in d.get("notes") or [] if isinstance(x, str)][:MAX_SLOWER_NOTES]
        return "\n".join([line, *(f"     {_text(x, 400)}" for x in notes), *tail])
    if not findings and n == 1:
        # a one-rank job (or one trace): nothing alike to compare it with, so no claim either way
        line = (f"eroica: step {_text(d.get('step'))} ({_text(d.get('trigger'))}): one rank, no peer to compare "
                f"it with — nothing diagnosed (step {_ms(med)} ms)")
        return "\n".join([line, *tail])
    if passing_text(d):
        line = (f"eroica: step {_text(d.get('step'))} ({_text(d.get('trigger'))}): a passing slowdown, no finding — "
                f"{passing_text(d)} ({n}/{ws} ranks analysed)")
        return "\n".join([line, *tail])
    if not findings:
        line = (f"eroica: step {_text(d.get('step'))} ({_text(d.get('trigger'))}): healthy — {n}/{ws} ranks "
                f"agree, no culprit (median step {_ms(med)} ms)")
        return "\n".join([line, *tail])
    top = findings[0]
    more = f" [+{len(findings) - 1} more finding(s)]" if len(findings) > 1 else ""
    lines = [f"eroica: step {_text(d.get('step'))} ({_text(d.get('trigger'))}): "
             f"{_text(top.get('title') or top.get('category'))}"
             f"{more} — {n}/{ws} ranks analysed, median step {_ms(med)} ms"]
    firsts = [(before or {}).get(finding_key(Finding.from_json(f))) if isinstance(f, dict) else None
              for f in findings]
    firsts = [None if s == d.get("step") else s for s in firsts]
    where = f"diagnosis-{_text(d.get('step'))}.json"
    if all(s is not None for s in firsts):   # nothing new: the head line says where it was named first
        steps = sorted(set(firsts))
        lines[0] += (f"; named before, at step{'s' if len(steps) > 1 else ''} {_ranks(steps)} "
                     f"(this capture in full: {where})")
        return "\n".join(lines + tail)
    for i, (f, first) in enumerate(zip(findings, firsts, strict=True), 1):
        if first is not None:
            lines.append(f"  #{i} {_text(f.get('title') or f.get('category'))} — named before, at step {first} "
                         f"(this capture in full: {where})")
        else:
            lines.extend(format_finding(f, i))
    return "\n".join(lines + tail)


def _steps_text(report: dict[str, Any]) -> str:
    """"140 steps"; for a report from chrome traces, which hold no job length, the traced steps."""
    job = report.get("job")
    traced = job.get("traced_steps") if isinstance(job, dict) else None
    if isinstance(traced, list) and traced and all(
            isinstance(r, list) and len(r) == 2 and all(type(n) is int for n in r) for r in traced):
        shown = ", ".join(f"{a}-{b}" if b != a else f"{a}" for a, b in traced[:8])
        return f"traced steps {shown}" + (f" and {len(traced) - 8} more windows" if len(traced) > 8 else "")
    steps = report.get("steps")
    return "1 step" if steps == 1 else f"{_text(steps)} steps"


def capture_label(capture: Mapping[str, Any]) -> str:
    """One entry of the job's capture list: "step 29 (baseline)", or one whose window gave way to the
    job's own profiler (not taken: runtime._gather_pending). Text and report.html."""
    gave = ", given way to the job's own profiler" if capture.get("gave_way") else ""
    return f"step {capture.get('step')} ({capture.get('trigger')}{gave})"


def job_profiler_text(seen: Any) -> str:
    """The job summary's line for the job's own torch.profiler ("" if it was never on): the steps
    eroica held its captures for, and where the job's own traces can be read instead."""
    if not (isinstance(seen, dict) and all(type(seen.get(k)) is int for k in ("steps", "first_step"))):
        return ""
    last = _text(seen.get("last_step", seen["first_step"]))
    return (f"  the job's own torch.profiler was on in {seen['steps']} step(s), {seen['first_step']}-{last} "
            f"({_text(seen.get('ranks', '?'))}): eroica took no capture then; `eroica analyze --traces DIR` "
            "reads its traces")


def refused_summary(refused: Any) -> str:
    """The job report's line for captures the budget refused ("" for none; text and report.html)."""
    if not isinstance(refused, dict):
        return ""

    def num(key: str) -> int | None:
        value = refused.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    n, asked, first, cap, refill = (num(k) for k in ("slowdowns", "requests", "first_step", "max_captures",
                                                     "refill_steps"))
    if n is None or asked is None or not (n or asked):
        return ""
    what = " and ".join(x for x in (f"{n} slowdown(s)" if n else "", f"{asked} request(s)" if asked else "") if x)
    since = f" from step {first} on" if first is not None else ""
    budget = f" of {cap}" if cap is not None else ""
    if refill:
        return (f"  not captured: {what}{since}: the capture budget{budget} was spent at the time (one comes "
                f"back every {refill} steps; --max-captures / --capture-refill-steps)")
    return (f"  not captured: {what}{since}: the capture budget{budget} was spent (--max-captures / "
            "EROICA_MAX_CAPTURES; --capture-refill-steps 0: it never refills); raise it to keep watching a long job")


def transient_lines(report: dict[str, Any]) -> list[str]:
    """The job report's lines for CPU contention seen once and not since (report.json "transient";
    none in a report from before it, or a foreign value)."""
    out = []
    for f in report.get("transient") or []:
        ev = f.get("evidence") if isinstance(f, dict) else None
        caps, after = (f.get("captures"), ev.get("not_seen_after")) if isinstance(ev, dict) else (None, None)
        if not (isinstance(caps, list) and caps and isinstance(after, list)):
            continue
        out.append(f"  transient, not a finding: rank {_text(f.get('rank'))} on {_text(f.get('host'))} was starved "
                   f"of CPU around step {_text(caps[0])} (+{_ms(f.get('impact_ms_per_step'))} ms/step), and not in "
                   f"the {len(after)} detector capture(s) after it: contention on its host that came and went")
    return out


def format_job(report: dict[str, Any], report_dir: str | os.PathLike[str] | None = None) -> str:
    """Text block at job end (also what `eroica show` prints)."""
    findings = report.get("findings") or []
    caps = report.get("captures") or []
    where = f" — {Path(report_dir) / 'report.html'}" if report_dir else ""
    steps = _steps_text(report)
    job = report.get("job")
    early = job.get("flushed_by") if isinstance(job, dict) else None
    # written before the job's end (a failing or interrupted rank 0, SIGUSR2): what was seen up to then;
    # "healthy" right above a launcher's "job.py FAILED" read as a verdict on the failure
    title = (f"eroica: job report so far, written early ({_text(early)})" if isinstance(early, str) and early
             else "eroica: job report")
    head = (f"{title}: {len(findings)} finding(s) over {len(caps)} capture(s), "
            f"world size {report.get('world_size')}, {steps}{where}")
    looked = [c for c in caps if c.get("trigger") == HANG_TRIGGER
              or conclusive(int(c.get("ranks_analysed") or 0), int(report.get("world_size") or 0))]
    slower = [c for c in looked if _unexplained(c)]   # slower than the baseline, no culprit found
    stood = stood_down_text(report)
    if stood:
        head = f"{title}: {stood} — world size {report.get('world_size')}{where}"
    elif not findings and not caps:
        head = (f"{title}: no capture was taken, so nothing was diagnosed — world size "
                f"{report.get('world_size')}, {steps}{where}")
    elif not findings and not looked:
        head = (f"{title}: not diagnosed — none of the {len(caps)} capture(s) had enough usable "
                f"summaries, world size {report.get('world_size')}, {steps}{where}")
    elif not findings and slower:
        head = (f"{title}: no findings over {len(looked)} capture(s), but {len(slower)} of them "
                f"(step{'s' if len(slower) > 1 else ''} {_ranks([c.get('step') for c in slower])}) "
                f"{'were' if len(slower) > 1 else 'was'} slower than "
                f"the baseline with no culprit found — world size {report.get('world_size')}, {steps}{where}")
    elif not findings and report.get("world_size") == 1:
        head = (f"{title}: one rank, no peer to compare it with — nothing diagnosed over "
                f"{len(looked)} capture(s), {steps}{where}")
    elif not findings and (held := job_held_text(report.get("job"))):
        head = (f"{title}: no findings over {len(looked)} capture(s), but {held} (the job summary above) — world "
                f"size {report.get('world_size')}, {steps}{where}")
    elif not findings:
        head = (f"{title}: healthy — no findings over {len(looked)} capture(s), world size "
                f"{report.get('world_size')}, {steps}{where}")
    lines = [head]
    for i, f in enumerate(findings, 1):
        lines.extend(format_finding(f, i))
        if f.get("captures"):
            one = len(f["captures"]) == 1
            lines.append(f"     seen in {'the capture at step' if one else 'captures at steps'} {_ranks(f['captures'])}")
    lines.extend(transient_lines(report))
    lost = format_time_lost((report.get("job") or {}).get("time_lost")) if findings else ""
    if lost:
        lines.append(lost)
    refused = refused_summary((report.get("job") or {}).get("captures_refused"))
    if refused:
        lines.append(refused)
    removed = (report.get("job") or {}).get("capture_files_removed")
    if isinstance(removed, list) and removed:
        lines.append(f"  ({len(removed)} older capture file{'s were' if len(removed) > 1 else ' was'} removed from "
                     "captures/ once diagnosed (--keep-captures); the diagnosis-<step>.json files keep what each "
                     "capture showed)")
    errors = sum(len(c.get("errors") or []) for c in caps)
    missing = sum(len(c.get("missing") or []) for c in caps)
    if errors or missing:
        lines.append(f"  ({errors} rejected summaries, {missing} missing rank-captures; see report.json)")
    return "\n".join(lines)


# the job's longest steps cost at least this share of its time (steps x median step): the job report's
# head says so instead of "healthy"
HELD_SHARE = 0.05


def _job_ms(job: Any) -> float | None:
    """The job's time in steps as its summary has it (steps x median step), None when it has none."""
    try:
        total = float(job["steps"]) * float(job["median_step_ms"])
    except (KeyError, TypeError, ValueError):
        return None
    return total if math.isfinite(total) and total > 0 else None


def long_steps_held(job: Any) -> str:
    """'its longest steps held every rank 2.4 s, 65% of the job's time' (its start, when that is all) when
    the job summary's longest steps cost HELD_SHARE of the job or more, else ''."""
    if not isinstance(job, dict) or not isinstance(job.get("long_steps"), list):
        return ""
    total = _job_ms(job)
    if total is None:
        return ""
    listed = [longsteps.LongStep.from_json(s) for s in job["long_steps"] if isinstance(s, dict)]
    held = longsteps.held_ms(listed)
    if held < HELD_SHARE * total:
        return ""
    what = ("its start" if all(s.step == 0 for s in listed) else "its start and longest steps"
            if any(s.step == 0 for s in listed) else "its longest steps")
    return f"{what} held every rank {held / 1e3:.1f} s, {100 * held / (total + held):.0f}% of the job's time"


def job_held_text(job: Any) -> str:
    """What held a job whose captures found nothing, from its summary ('' when nothing did): the text
    and HTML reports' heads say it instead of "healthy", above the summary line that tells it.

    One rank's own work over the whole job (engine/steadywork.py); the ranks taking turns being the
    slowest (engine/imbalance.py); the longest steps, a stall being over before a capture can open (2
    checkpoint writes of 1.2 s in a 3.7 s job read "healthy"); ranks launched late (engine/launchskew.py).
    """
    if not isinstance(job, dict):
        return ""
    if isinstance(job.get("steady_work"), dict):
        return (f"rank {_text(job['steady_work'].get('rank'))} was busier than its peers over the whole job, and they "
                "waited for it")
    if isinstance(job.get("imbalance"), dict):
        return "the ranks took turns being the slowest, each step waiting for the busiest"
    held = long_steps_held(job)
    if held:
        return held
    if isinstance(job.get("launch"), dict) and _launch_held(job):
        return f"its ranks started up to {float(job['launch']['spread_s']):.1f} s apart"
    return ""


def _launch_held(job: dict[str, Any]) -> bool:
    """Whether the ranks' late start (engine/launchskew.py) held the job HELD_SHARE of its time or more."""
    total = _job_ms(job)
    try:
        spread = float(job["launch"]["spread_s"]) * 1e3
    except (KeyError, TypeError, ValueError):
        return False
    return total is not None and math.isfinite(spread) and spread >= HELD_SHARE * (total + spread)


def _list(x: Any) -> list[Any]:
    """``x`` where it is a list, else [] (a report.json field another writer got wrong)."""
    return x if isinstance(x, list) else []


def until_stopped_text(report_dir: str | os.PathLike[str], shown: int = 3) -> str:
    """What eroica had found when the job was stopped from outside (scancel, a time limit, ^C), for
    the launcher's last words: a rank stopped by SIGTERM writes nothing more (no handler: runtime.py
    says why), so the job summary never comes, but rank 0 rewrote report.json after every capture."""
    try:
        doc = load_job(report_dir)
    except reportdir.InputError as exc:
        return f"eroica: {exc}"
    if doc is None:
        return (f"eroica: no report in {report_dir} (rank 0 writes report.json at its first capture, "
                "after the warm-up steps)")
    findings = [f for f in _list(doc.get("findings")) if isinstance(f, dict)]
    captures = _list(doc.get("captures"))
    head = (f"eroica until the stop: {_count(doc.get('steps'))} steps on {_count(doc.get('world_size'))} "
            f"ranks, {len(captures)} capture(s)")
    where = Path(report_dir) / reportdir.REPORT_HTML
    if not captures:
        return f"{head}: none yet (the first comes after the warm-up steps)"
    if not findings:
        return f"{head}, no findings — {where}"
    lines = [f"{head}, {len(findings)} finding(s):"]
    for i, f in enumerate(findings[:shown], start=1):
        seen = [s for s in _list(f.get("captures")) if isinstance(s, int) and not isinstance(s, bool)]
        at = f" (step{'s' if len(seen) > 1 else ''} {', '.join(map(str, seen[:6]))})" if seen else ""
        lines.append(f"  #{i} {_text(f.get('title'))}{at}")
    if len(findings) > shown:
        lines.append(f"  and {len(findings) - shown} more")
    lines.append(f"  in full: eroica show {report_dir} (or {where})")
    return "\n".join(lines)


def format_pause(doc: dict[str, Any], stalled_s: float, again_s: float) -> str:
    """Rank 0's line for a stall that is no hang (``engine.hang.analyse``'s ``busy``): who is busy
    where, and where the others wait; no culprit. Why a line at all: minutes without a step are what a
    person looks for at 3 a.m., and "rank 0 busy in torch.save" tells a checkpoint from a hang."""
    busy = [b for b in doc.get("busy") or [] if isinstance(b, dict)]
    places: dict[str, list[Any]] = {}
    for b in busy:
        places.setdefault(str(b.get("where")), []).append(b.get("rank"))
    why = "; ".join(_text(w) for w in dict.fromkeys(w for b in busy for w in b.get("why") or []))
    at = ", ".join(f"{_text(place)} ({'rank' if len(ranks) == 1 else 'ranks'} {_ranks(ranks)})"
                   for place, ranks in list(places.items())[:3])
    total = sum(len(p.get("ranks") or []) for p in doc.get("positions") or [] if isinstance(p, dict))
    if len(busy) == 1:
        b = busy[0]
        stored = b.get("storage_bytes")
        if isinstance(stored, int) and "storage I/O" in (b.get("why") or []):
            why += f": {stored / 2**20:.0f} MB in {_text(b.get('seconds'))} s"
        said = f"rank {_text(b.get('rank'))} on {_text(b.get('host'))} is busy at {_text(b.get('where'))} ({why})"
    elif len(busy) == total:
        said = f"every rank is busy ({why}) at {at}"
    else:
        said = f"{len(busy)} ranks are busy ({why}) at {at}"
    named = {b.get("rank") for b in busy}
    waits: dict[str, int] = {}
    for pos in doc.get("positions") or []:
        if isinstance(pos, dict):
            n = sum(r not in named for r in pos.get("ranks") or [])
            if n:
                waits[str(pos.get("where"))] = waits.get(str(pos.get("where")), 0) + n
    said += "".join(f"; {n} {'rank waits' if n == 1 else 'ranks wait'} at {_text(place)}"
                    for place, n in list(waits.items())[:2])
    return (f"eroica: no step for {stalled_s:.0f} s, but no hang: {said} — a checkpoint or an evaluation? "
            f"Looked at again at {again_s:.0f} s without a step")


def _waiting_at(doc: dict[str, Any], f: dict[str, Any]) -> str:
    """Where a hang's victims wait: their one position, or each of theirs (up to 3) with its ranks, as
    when the culprit is the rank behind in the collective sequence and the others are in different
    places of the step it never came to (engine.hang._behind)."""
    victims = set(f.get("victims") or [])
    places: dict[str, list[int]] = {}
    for pos in doc.get("positions") or []:
        if isinstance(pos, dict):
            mine = [r for r in pos.get("ranks") or [] if r in victims]
            if mine:
                places.setdefault(str(pos.get("where")), []).extend(mine)
    if len(places) <= 1:
        return _text((f.get("evidence") or {}).get("majority_position"))
    return ", ".join(f"{_text(w)} ({'rank' if len(rs) == 1 else 'ranks'} {_ranks(sorted(rs))})"
                     for w, rs in sorted(places.items(), key=lambda kv: -len(kv[1]))[:3]) + \
        (f" and {len(places) - 3} more places" if len(places) > 3 else "")


def format_hang(doc: dict[str, Any], stalled_s: float) -> str:
    """The HANG block in the rank-0 log (engine.hang.analyse's document)."""
    lines = [f"eroica: HANG: no step progress for {stalled_s:.0f}s"]
    f = doc.get("finding")
    if f:
        ev = f.get("evidence") or {}
        lines.append(f"  culprit: rank {_text(f['rank'])} on {_text(f.get('host'))} — at {_text(f['function'])}")
        lines.append(f"  the other {len(f['victims'])} rank(s) wait at {_waiting_at(doc, f)}"
                     if ev.get("majority_position") else f"  {_text(f['action'], 400)}")
        for frame in ev.get("stack", [])[-6:]:
            lines.append(f"     {_text(frame, 300)}")
        lines.append(f"  action: {_text(f['action'], 800)}")   # a hang's action is read in full, once
    else:
        lines.append("  every rank is at the same place: " + ", ".join(
            f"{_text(p['where'])} ({len(p['ranks'])} ranks)" for p in doc["positions"][:3]))
    return "\n".join(lines)
