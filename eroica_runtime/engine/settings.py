"""Torch settings a culprit does not share with the other ranks: a switch that makes the same code slower.

A rank can run the same code as its peers and still be slower because of how torch is set up there:
autograd anomaly detection left on (``torch.autograd.set_detect_anomaly(True)`` from a debugging
session, often behind a flag one host's environment sets) records a Python stack trace for every op
in forward and checks every gradient for NaN in backward; fewer intra-op threads (``OMP_NUM_THREADS``
differs on one host, ``torch.set_num_threads``) run the same ops slower; deterministic algorithms
take slower kernels. The comparison of the ranks' ops names what grew, not why: a 4-rank job with
anomaly detection on rank 2 read "compute in aten::reshape [forward]" (+32 ms/step; 7 calls a step that
only it ran, with anomaly detection on), and nothing in the finding said what to change. Every summary carries these settings
at its window's end (telemetry.end.torch, runtime._torch_settings), so a culprit whose settings
differ from what the other ranks share is named for them (``with_settings``).

Only a difference that can make a rank slower is named: anomaly detection or deterministic
algorithms on where the others have them off, or another thread count (fewer threads are slower;
more than its cores allow fight for them). Pure: no MPI, no torch.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from eroica_runtime.engine.model import Finding, in_function
from eroica_runtime.engine.table import Table

SHARED = 0.75     # a value held by at least this share of the other ranks is theirs
ANOMALY_FUNCTION = "(autograd anomaly detection)"   # a finding's function when that switch is what to change
# setting -> whether the culprit's value (first) against the others' (second) can make it slower
SLOWER = {"anomaly": lambda mine, theirs: mine > theirs, "deterministic": lambda mine, theirs: mine > theirs,
          "threads": lambda mine, theirs: mine != theirs}


def settings_evidence(table: Table, row: int) -> dict[str, Any]:
    """``{"settings": {name: [this rank's, the others']}}`` for each torch setting in which this rank
    differs, in a way that can make it slower, from a value at least SHARED of the other ranks that
    recorded it hold; {} when none does (or the summaries predate the settings)."""
    out: dict[str, list[float]] = {}
    others = np.arange(table.n) != row
    for name, slower in SLOWER.items():
        col = table.telemetry.get(f"torch_{name}")
        if col is None or not np.isfinite(col[row]):
            continue
        vals = col[others & np.isfinite(col)]
        if not vals.size:
            continue
        uniq, counts = np.unique(vals, return_counts=True)
        theirs = float(uniq[int(np.argmax(counts))])
        mine = float(col[row])
        if counts.max() >= SHARED * vals.size and slower(mine, theirs):
            out[name] = [mine, theirs]
    return {"settings": out} if out else {}


def settings_action(settings: dict[str, list[float]]) -> str:
    """What to change, one sentence per setting that differs (``settings_evidence``)."""
    said = []
    if "anomaly" in settings:
        said.append("Autograd anomaly detection is on on this rank only (torch.autograd.set_detect_anomaly(True) "
                    "or a detect_anomaly() block, often behind a debug flag): every op records a Python stack "
                    "trace in forward and every gradient is checked for NaN in backward. Turn it off outside "
                    "debugging (Lightning: Trainer(detect_anomaly=False)).")
    if "deterministic" in settings:
        said.append("Deterministic algorithms are on on this rank only (torch.use_deterministic_algorithms(True), "
                    "CUBLAS_WORKSPACE_CONFIG): its ops take slower deterministic kernels; set it alike on every "
                    "rank.")
    if "threads" in settings:
        mine, theirs = (int(x) for x in settings["threads"])
        said.append(f"Its ops run on {mine} intra-op thread{'s' if mine != 1 else ''} vs {theirs} on the other "
                    "ranks (torch.set_num_threads, OMP_NUM_THREADS or MKL_NUM_THREADS in this host's "
                    "environment): give every rank the same count, no more than its cores.")
    return " ".join(said)


def settings_text(settings: Any) -> str:
    """The evidence's settings in a few words for rank 0's log ("autograd anomaly detection on; 2 intra-op
    threads vs 1"), "" for none or anything malformed (a report read back from disk)."""
    if not isinstance(settings, dict):
        return ""
    said = []
    for name, words in (("anomaly", "autograd anomaly detection on"), ("deterministic", "deterministic algorithms on")):
        if name in settings:
            said.append(words)
    threads = settings.get("threads")
    if isinstance(threads, list) and len(threads) == 2 and all(isinstance(x, (int, float)) for x in threads):
        mine = int(threads[0])
        said.append(f"{mine} intra-op thread{'' if mine == 1 else 's'} vs {int(threads[1])}")
    return "; ".join(said)


def with_settings(table: Table, findings: list[Finding]) -> list[Finding]:
    """Each finding that names one rank for its own work (compute, host) carries the torch settings in
    which that rank differs from the others, and leads its action with what to change; anomaly
    detection, the whole cause wherever its ops fell, becomes the finding's function and its action.
    Another thread count or deterministic algorithms lead the action but leave the rest: they make the
    same ops slower, and what the comparison said of them may still hold."""
    out = []
    for f in findings:
        row = None if f.rank is None or f.category not in ("compute", "host") else table.rows_of([int(f.rank)])
        ev = settings_evidence(table, int(row[0])) if row is not None and len(row) else {}
        if ev:
            settings = ev["settings"]
            title, function, action = f.title, f.function, (settings_action(settings) + " " + f.action).strip()
            if "anomaly" in settings:   # the cause: what its ops said of the hardware or the code is moot
                function, action = ANOMALY_FUNCTION, settings_action(settings)
                title = title.replace(f"{f.category}{in_function(f.function)}", f"{f.category}{in_function(function)}", 1)
            f = replace(f, function=function, title=title, evidence={**f.evidence, **ev}, action=action)
        out.append(f)
    return out


def anomaly_text(ranks: Any, world_size: int) -> str:
    """The job summary's line on the ranks that had autograd anomaly detection on while they trained (at a
    capture's close or at the job's end; "" for none): the findings name it only on a rank that had it
    alone, and one on everywhere slows every rank alike, with no peer to stand out from."""
    if not (isinstance(ranks, list) and ranks and all(isinstance(r, int) and not isinstance(r, bool) for r in ranks)):
        return ""
    which = (f"every rank ({len(ranks)})" if len(ranks) == world_size > 1 else
             f"rank {ranks[0]}" if len(ranks) == 1 else
             f"{len(ranks)} of {world_size} ranks (" + ", ".join(map(str, ranks[:8]))
             + (", ..." if len(ranks) > 8 else "") + ")")
    return (f"  autograd anomaly detection was on while it trained on {which}: every op records a Python stack "
            "trace and every gradient is checked for NaN, which slows every step it is on; turn it off outside "
            "debugging (torch.autograd.set_detect_anomaly(False); Lightning: Trainer(detect_anomaly=False))")
