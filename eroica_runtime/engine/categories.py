"""Which kind of fault: the phase holding the culprit's excess, refined by names and telemetry."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from eroica_runtime.engine.baseline import column_reference
from eroica_runtime.engine.table import Table

# phase of own work -> category (forward/backward/optimizer are compared as one compute bucket)
PHASE_CATEGORY = {"data": "dataloader", "gc": "gc", "io": "io", "host_gap": "host",
                  "forward": "compute", "backward": "compute", "optimizer": "compute",
                  "device_other": "compute", "transfer": "transfer"}
COMPUTE_PHASES = ("forward", "backward", "optimizer")
_MEMORY_RE = re.compile(r"malloc|free|empty_cache|caching_allocator|\[memory\]|cudaHostAlloc|mem_alloc",
                        re.IGNORECASE)
_IO_RE = re.compile(r"\bread\b|\bwrite\b|save|load|checkpoint|torch\.load|torch\.save|fsync|open", re.I)
_BENIGN_THROTTLE = {"gpu_idle", "none", "applications_clocks_setting", "clocks_event_reason_gpu_idle"}

# what a job-wide regression's action advises after its first words, the same for every rank of a job
# or for the one rank of a job of one
_GC_FIX = "freeze long-lived state with gc.freeze(), raise gc thresholds, or collect at a fixed step."
_COPY_FIX = ("copy from pinned memory (DataLoader pin_memory=True, tensor.pin_memory()) with non_blocking=True, "
             "and look for copies added to the loop (.item(), .cpu(), .to()).")

ACTIONS = {
    "compute": "Compare this rank's GPU/CPU with its peers (clocks, thermals, co-located jobs); "
               "drain the node if it stays slow.",
    "dataloader": "The input pipeline on this rank is slow: check its storage/network path to the "
                  "dataset, num_workers, CPU load on the host and per-sample transforms.",
    "gc": "Python GC pauses on this rank: look for objects piling up (freeze long-lived state with "
          "gc.freeze(), raise gc thresholds, or collect manually at a fixed step on all ranks).",
    "host": "CPU-side stalls on this rank (launch gaps / Python overhead / contention): check other "
            "processes on the host, CPU pinning and cgroup limits.",
    "io": "Storage reads/writes stall this rank: check the filesystem and checkpoint settings.",
    "transfer": "Host<->device copies grew on this rank: copy from pinned memory (DataLoader "
                "pin_memory=True, tensor.pin_memory()) with non_blocking=True; if they already are, "
                "check its PCIe link (generation and width below their maximum: slot, riser, BIOS).",
    "memory": "Allocator stalls on this rank: look for fragmentation / empty_cache calls; consider "
              "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.",
    "communication": "Collectives are slow with no late rank to blame: check the NICs, links and "
                     "switch ports of the named host(s) (error counters, link speed, retransmits).",
    # every rank on one host: no NIC or switch carries the job's collectives
    "communication_one_host": "Collectives are slow with no late rank to blame, and all ranks run on this "
                              "one host: no NIC or switch is involved. Check what else uses its CPUs and "
                              "GPUs (top, nvidia-smi), CPU pinning and cgroup limits; on GPUs, NVLink state "
                              "and errors (nvidia-smi nvlink -s / -e) and peer-to-peer in the topology "
                              "(nvidia-smi topo -m).",
    "regression": "Every rank is slower than this job's own healthy baseline: check what changed "
                  "(code, input shapes, library versions, clocks) in the functions that grew.",
    # a job-wide regression whose growth is not compute: what every rank shares in that phase
    "regression_dataloader": "Every rank waits longer for its next batch than in this job's own healthy "
                             "baseline: something all ranks share slowed, most often the storage or network "
                             "path to the dataset (a shared filesystem, an object store), or the samples got "
                             "bigger or costlier to transform; also check DataLoader num_workers and "
                             "prefetch_factor against the CPUs each rank has.",
    "regression_gc": "Python GC pauses grew on every rank against this job's own healthy baseline: objects pile "
                     "up on all ranks alike (a growing cache, tensors or losses kept for logging); " + _GC_FIX,
    "regression_io": "Storage reads/writes grew on every rank against this job's own healthy baseline: check "
                     "the filesystem they share and the checkpoint settings (how often, synchronous saves).",
    "regression_host": "CPU-side time outside any op grew on every rank against this job's own healthy "
                       "baseline: check what else runs on the hosts, CPU limits and pinning, and Python work "
                       "added to the training loop (logging, metrics).",
    "regression_transfer": "Host<->device copies grew on every rank against this job's own healthy baseline: "
                           + _COPY_FIX,
    # the same, for a job of one rank (or one rank compared): no peer, so no "every rank" or "all ranks share"
    "regression_one": "The rank is slower than its own healthy baseline: check what changed (code, input shapes, "
                      "library versions, clocks) in the functions that grew.",
    "regression_one_dataloader": "The rank waits longer for its next batch than in its own healthy baseline: most "
                                 "often the storage or network path to the dataset slowed (a shared filesystem, an "
                                 "object store), or the samples got bigger or costlier to transform; also check "
                                 "DataLoader num_workers and prefetch_factor against the CPUs the rank has.",
    "regression_one_gc": "Python GC pauses grew against the rank's own healthy baseline: objects pile up (a growing "
                         "cache, tensors or losses kept for logging); " + _GC_FIX,
    "regression_one_io": "Storage reads/writes grew against the rank's own healthy baseline: check its filesystem "
                         "and the checkpoint settings (how often, synchronous saves).",
    "regression_one_host": "CPU-side time outside any op grew against the rank's own healthy baseline: check what "
                           "else runs on the host, CPU limits and pinning, and Python work added to the training "
                           "loop (logging, metrics).",
    "regression_one_transfer": "Host<->device copies grew against the rank's own healthy baseline: " + _COPY_FIX,
    "hang": "Ranks stopped making progress: collect stacks (py-spy dump) on the named rank(s).",
}


def pick_category(phase_excess: dict[str, float]) -> tuple[str, str]:
    """(category, phase) holding the largest excess; compute phases count together."""
    buckets: dict[str, float] = {}
    for ph, ex in phase_excess.items():
        cat = PHASE_CATEGORY.get(ph)
        if cat:
            buckets[cat] = buckets.get(cat, 0.0) + max(ex, 0.0)
    cat = max(buckets, key=lambda c: buckets[c]) if buckets else "compute"
    phases = [p for p in phase_excess if PHASE_CATEGORY.get(p) == cat]
    phase = max(phases, key=lambda p: phase_excess[p]) if phases else "forward"
    return cat, phase


def function_candidates(table: Table, category: str) -> np.ndarray:
    """Columns whose functions can explain an excess of ``category``."""
    ok = []
    for name, ph, kind in zip(table.fn_names, table.fn_phase, table.fn_kind, strict=True):
        if name == "<other>" or kind in ("collective", "annotation") or ph == "comm":
            ok.append(False)   # annotations nest other ops; collectives are waits, not own work
            continue
        if category == "compute":
            good = ph in COMPUTE_PHASES or kind in ("kernel", "cpu_op", "optimizer", "memcpy", "memset")
        elif category == "transfer":
            good = kind in ("memcpy", "memset") or "copy" in name.lower() or name.startswith(("aten::to", "cudaMemcpy"))
        elif category == "dataloader":
            good = ph == "data" or kind == "dataloader"
        elif category == "io":
            good = bool(_IO_RE.search(name))
        elif category == "host":
            good = kind in ("cpu_op", "other")
        else:  # gc: no profiled function represents a GC pause
            good = False
        ok.append(good)
    return np.flatnonzero(np.asarray(ok, dtype=bool)) if ok else np.zeros(0, dtype=np.int64)


def is_memory_function(name: str | None) -> bool:
    """Allocator calls (cudaMalloc/cudaFree/empty_cache...) turn a compute excess into `memory`."""
    return bool(name) and bool(_MEMORY_RE.search(name or ""))


def _median(values: np.ndarray) -> float:
    """Median of the finite values; NaN when there are none (no warning: absent telemetry is normal)."""
    finite = values[np.isfinite(values)]
    return float(np.median(finite)) if len(finite) else float("nan")


def _per_cpu_s(t: dict[str, np.ndarray], key: str, rows: np.ndarray) -> np.ndarray:
    """Counter per CPU-second used: a rank that computes more is preempted more, contention
    shows as many more preemptions for the same CPU use."""
    cpu = t["cpu_s"][rows]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(cpu > 0, t[key][rows] / cpu, np.nan)


def _cpu_share(t: dict[str, np.ndarray], rows: np.ndarray) -> np.ndarray:
    """CPU seconds the process got per wall second of the window."""
    wall = t["wall_s"][rows]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(wall > 0, t["cpu_s"][rows] / wall, np.nan)


def storage_io(table: Table, row: int, peers: np.ndarray) -> dict[str, Any]:
    """``{"io_bytes": [rank's, peers' median], "io": True}`` when this rank read and wrote far more than
    its peers in the window (4x, and 1 MiB more), else {}: a plain read() is no profiled op, so a host
    stall (or a rank late to its collectives, history.py) while it did is storage I/O."""
    t = table.telemetry
    if "io_read_bytes" not in t:
        return {}
    io = t["io_read_bytes"][row] + t["io_write_bytes"][row]
    peer_vals = t["io_read_bytes"][peers] + t["io_write_bytes"][peers]
    peer_vals = peer_vals[np.isfinite(peer_vals)]
    peer_io = float(np.median(peer_vals)) if peer_vals.size else float("nan")
    if math.isfinite(io) and math.isfinite(peer_io) and io > 4.0 * peer_io + (1 << 20):
        return {"io_bytes": [float(io), peer_io], "io": True}
    return {}


def telemetry_refinement(table: Table, row: int, peer_rows: np.ndarray, category: str,
                         quota_named: bool = False, blocked: bool = False) -> tuple[dict[str, Any], str]:
    """Evidence and action from telemetry: GPU throttling, CPU contention / CPU share below peers
    (not when ``quota_named``: the CPU quota that throttled the rank is named by ``quota_action``; nor
    when ``blocked``: a thread blocked off the CPU gets less of it for that, engine/offcpu.py)."""
    t = table.telemetry
    ev: dict[str, Any] = {}
    hints: list[str] = []
    peers = peer_rows[peer_rows != row]
    if category in ("compute", "memory"):
        sm, smax = t["sm_mhz"][row], t["sm_max_mhz"][row]
        reasons = [r for r in table.throttle.get(row, []) if r.lower() not in _BENIGN_THROTTLE]
        if math.isfinite(sm) and math.isfinite(smax) and smax > 0:
            peer_sm = _median(t["sm_mhz"][peers])
            ev["sm_mhz"] = [float(sm), peer_sm]
            ev["sm_max_mhz"] = float(smax)
            if sm < 0.85 * smax and (reasons or (math.isfinite(peer_sm) and sm < 0.85 * peer_sm)):
                ev["hardware_throttle"] = reasons or ["clock below peers"]
                hints.append(f"GPU clock {sm:.0f} MHz of {smax:.0f} MHz max (peers {peer_sm:.0f})"
                             + (f", throttle reasons: {', '.join(reasons)}" if reasons else "")
                             + ": hardware throttling — check cooling/power capping, drain the node.")
    io = storage_io(table, row, peers) if category == "host" else {}
    if io:
        ev.update(io)
        mine, theirs = io["io_bytes"]
        hints.append(f"{mine / 2**20:.1f} MiB read/written in the window vs peers' {theirs / 2**20:.1f} MiB: "
                     "the stall is storage I/O.")
    if category in ("compute", "host", "dataloader", "gc"):
        with np.errstate(all="ignore"):
            inv = _per_cpu_s(t, "ctx_invol", np.asarray([row]))[0]
            peer_inv = _median(_per_cpu_s(t, "ctx_invol", peers))
            share = _cpu_share(t, np.asarray([row]))[0]
            peer_share = _median(_cpu_share(t, peers))
        if math.isfinite(inv) and math.isfinite(peer_inv):
            ev["ctx_invol_per_cpu_s"] = [float(inv), peer_inv]
            if inv > 5.0 * peer_inv and inv - peer_inv > 200.0:
                ev["cpu_contention"] = True
                hints.append(f"{inv:.0f} involuntary context switches per CPU-second vs peers' {peer_inv:.0f}: "
                             "CPU contention — another process shares this rank's cores.")
        # A rank busy while its peers wait normally uses MORE CPU than they do; one that gets
        # well under half of what its (waiting) peers get is being starved.
        if math.isfinite(share) and math.isfinite(peer_share) and peer_share > 0:
            ev["cpu_s_per_wall_s"] = [float(share), peer_share]
            if category in ("host", "compute") and share < 0.5 * peer_share and not (quota_named or blocked):
                ev["cpu_throttled"] = True
                hints.append(f"The process got {share:.2f} CPU-s per second vs peers' {peer_share:.2f}: "
                             "CPU throttling (cgroup quota / frequency) or contention.")
    return ev, " ".join(hints)


MORE_CALLS = 1.2     # calls per step at least this x the peers' (and one more) is more work
SAME_CALLS = 0.1     # calls within this share of the peers' (and half a call) are the same work
SLOWER_CALL = 1.2    # each call at least this x the peers' time is the same work done slower


def work_verdict(calls: float, ms: float, ref_calls: float, ref_ms: float) -> str | None:
    """'more' (more calls per step than the reference: more work), 'slower' (the same calls, each
    slower) or None (neither clearly), for one function against its peers or the job's baseline.
    The extra calls need not be the reference's size (a rank-only loop over bigger matrices): their
    count is the evidence; slower hardware or a co-located job does not add calls of a function."""
    if not all(math.isfinite(v) for v in (calls, ms, ref_calls, ref_ms)) or calls <= 0:
        return None
    if calls >= MORE_CALLS * ref_calls + 1.0 and ms > ref_ms:
        return "more"
    if ref_calls > 0 and abs(calls - ref_calls) <= SAME_CALLS * ref_calls + 0.5 \
            and ms / calls >= SLOWER_CALL * ref_ms / ref_calls:
        return "slower"
    return None


def work_evidence(table: Table, row: int, peer_rows: np.ndarray, col: int) -> tuple[dict[str, Any], str]:
    """More work, or the same work slower? Calls per step of the named function on the culprit vs its
    peers (median), and the time per call (``work_verdict``). A rank that runs more calls (an extra code
    path, a loop over a rank-dependent count) needs a code or data fix; the same calls each slower point
    at the hardware or co-located load (or larger inputs: shapes are not recorded). Draining a node for
    the first would be the wrong action. Returns (evidence, a sentence for the action; '' when neither)."""
    peers_calls = float(column_reference(table.fn_count[:, [col]], peer_rows)[0])
    peers_ms = float(column_reference(table.fn_ms[:, [col]], peer_rows)[0])
    return work_against(table.fn_names[col], float(table.fn_count[row, col]), float(table.fn_ms[row, col]),
                        peers_calls, peers_ms)


def work_against(name: str, calls: float, ms: float, ref_calls: float, ref_ms: float,
                 baseline: bool = False) -> tuple[dict[str, Any], str]:
    """``work_evidence`` for one function's calls and ms per step on the culprit against a reference: its
    peers' (median), or with ``baseline`` its own in the baseline capture (a rank without peers)."""
    if not all(math.isfinite(v) for v in (calls, ms, ref_calls, ref_ms)) or calls <= 0:
        return {}, ""
    per_call = ms / calls
    ref_per_call = ref_ms / ref_calls if ref_calls > 0 else None
    ev: dict[str, Any] = {"calls": [calls, ref_calls], "per_call_ms": [per_call, ref_per_call]}
    verdict = work_verdict(calls, ms, ref_calls, ref_ms)
    if verdict == "more":
        ev["work"] = "more"
        than = ("in its baseline capture: it does more work than it did, not the same work slower. Look for "
                "work this rank started doing or gets more of: " if baseline else
                "on its peers: it does more work than they do, not the same work slower. Look for work only this "
                "rank does or gets more of: a code path taken on this rank alone (logging, metrics, evaluation, "
                "checkpoint helpers), ")
        return ev, (f"{name} ran {_count(calls)} times a step on this rank vs {_count(ref_calls)} {than}"
                    "a loop whose count depends on the rank or its data (micro-batches, experts routed "
                    "to it), leftover debug code.")
    if verdict == "slower":
        ev["work"] = "slower"
        than = "in its baseline capture" if baseline else "as its peers"
        return ev, (f"{_the_same_calls(calls)} of {name} a step {than}{', each' if calls != 1 else ','} slower "
                    f"({per_call:.3g} vs "
                    f"{ref_per_call:.3g} ms): the same work runs slower on this rank (throttled or slower "
                    "hardware, another job on its GPU/CPU) or on larger inputs (shapes are not recorded).")
    return ev, ""


# what the same calls of a function, each slower on every rank (``whose``: "every rank's", or "the
# rank's" in a job of one), say, by the category of its phase (the regression's action then says what
# to check)
_SLOWER_BECAUSE = {
    "compute": "clocks or thermals on {whose} node, a library version, or larger inputs",
    "dataloader": "{whose} batches take longer to fetch or prepare",
    "io": "{whose} reads or writes take longer",
    "gc": "{whose} collections take longer",
    "host": "{whose} CPU-side work takes longer",
    "transfer": "{whose} copies take longer",
}
SPARED_SHOWN = 8   # ranks a regression spared, named in its action


def host_lead(host: str, slow: int, on_host: int, hosts: int, more_work: bool) -> str:
    """The first sentence of a host finding's action (``slow`` of the ``on_host`` ranks of ``host`` named
    alike, in a job on ``hosts`` hosts): the host is the suspect only where something else could be.
    Ranks that each run more calls than their peers do more work, whatever host they are on; in a job on
    one host there is no other host to compare it with (ranks 1 and 3 of a one-host job, each running
    150 ms of extra matmuls a step, read "2 of 4 ranks on vm are slow alike: suspect the host"); some of
    a host's ranks slow, the others not, point at what those ranks share on it."""
    if more_work:
        return (f"{slow} of {on_host} ranks on {host} are slow alike, each running more calls than its peers: "
                "more work, not the host. ")
    share = ("what those ranks share (GPUs behind one PCIe switch or on one NUMA node, their CPU cores) or "
             "the work they are given")
    if hosts == 1:
        return f"{slow} of {on_host} ranks are slow alike, the others not: suspect {share}. "
    if slow < on_host:
        return f"{slow} of {on_host} ranks on {host} are slow alike: suspect the host, or {share}. "
    return f"All {on_host} ranks on {host} are slow alike: suspect the host. "


def regression_action(phase: str, spared: list[int] | None = None, slow: int = 0,
                      hosts: list[str] | None = None, more_work: bool = False, one: bool = False) -> str:
    """The action of a job-wide regression whose own work grew most in ``phase``: a shared input
    pipeline that slowed on every rank is no matter of clocks or library versions. ``spared``: ranks
    that did not slow (``slow`` ranks did): what differs between the two sets is the lead; ``hosts``:
    the slow ranks are every rank of these hosts and of no other, the host the suspect unless they run
    more calls (``more_work``). ``one``: one rank was compared (a job of one process), which shares
    nothing with any other ("every rank ... something all ranks share" read odd for it)."""
    if one:
        return ACTIONS.get(f"regression_one_{PHASE_CATEGORY.get(phase, 'compute')}", ACTIONS["regression_one"])
    if spared and hosts:
        where = ", ".join(hosts[:SPARED_SHOWN]) + (" and more" if len(hosts) > SPARED_SHOWN else "")
        lead = f"{slow} ranks slowed alike against this job's own healthy baseline, every rank on {where} and none elsewhere"
        if more_work:
            return (lead + ", each running more calls: what only those ranks run (a code path or data that depends "
                    "on the node or its local ranks), not the host.")
        return (lead + ": suspect the host (GPU clocks, thermals and power: nvidia-smi -q -d PERFORMANCE; a "
                "co-located job; its CPU governor, memory or links).")
    if spared:
        them = ", ".join(str(r) for r in spared[:SPARED_SHOWN]) + (" and more" if len(spared) > SPARED_SHOWN else "")
        return (f"{slow} ranks slowed alike against this job's own healthy baseline, rank{'s' if len(spared) > 1 else ''} "
                f"{them} did not: too many alike for their peers to single them out. Compare the slow ranks with the "
                "others: the hosts and GPUs they run on (clocks, power, a node or rack they share), the code path "
                "or data they take.")
    return ACTIONS.get(f"regression_{PHASE_CATEGORY.get(phase, 'compute')}", ACTIONS["regression"])


def _regression_calls(fn: dict[str, Any]) -> tuple[float, float, float, float] | None:
    """(calls, ms now; calls, ms in the baseline) a step of a regression's grown function, or None."""
    try:
        return float(fn["now_calls"]), float(fn["now_ms"]), float(fn["baseline_calls"]), float(fn["baseline_ms"])
    except (KeyError, TypeError, ValueError):
        return None


def regression_verdict(fn: dict[str, Any]) -> str | None:
    """``work_verdict`` of a regression's grown function, now against the baseline ("more", "slower")."""
    got = _regression_calls(fn)
    return work_verdict(*got) if got is not None else None


def regression_work(fn: dict[str, Any], spared: bool = False, one: bool = False) -> str:
    """A sentence for a job-wide regression from its top grown function's calls now and in the baseline
    (``_function_growth``), or '' when they do not tell; ``spared``: some ranks did not slow; ``one``:
    one rank was compared."""
    got = _regression_calls(fn)
    if got is None:
        return ""
    now_calls, now_ms, was_calls, was_ms = got
    verdict = work_verdict(now_calls, now_ms, was_calls, was_ms)
    if verdict == "more":
        return (f"{fn['name']} runs {_count(now_calls)} times a step now vs {_count(was_calls)} in the baseline: "
                f"{'the slow ranks do' if spared else 'the rank does' if one else 'every rank does'} more work per "
                "step (a code, configuration "
                "or data change), not the same work slower.")
    if verdict == "slower":
        because = "on the slow ranks only: their hardware, its clocks, or their inputs" if spared else \
            _SLOWER_BECAUSE.get(PHASE_CATEGORY.get(str(fn.get("phase")), "compute"), _SLOWER_BECAUSE["compute"]) \
            .format(whose="the rank's" if one else "every rank's")
        return (f"{_the_same_calls(now_calls)} of {fn['name']} a step as in the baseline"
                f"{', each' if now_calls != 1 else ','} slower ({now_ms / now_calls:.3g} vs {was_ms / was_calls:.3g} ms): "
                f"{because}.")
    return ""


def _the_same_calls(calls: float) -> str:
    """"The same 3 calls", or "The same call" for one a step ("The same 1 calls of enumerate(DataLoader)")."""
    return "The same call" if calls == 1 else f"The same {_count(calls)} calls"


def _count(calls: float) -> str:
    """Calls per step (a window's mean: 0.33 when once in three steps)."""
    return f"{calls:.0f}" if calls >= 10 or calls == int(calls) else f"{calls:.2g}"


def work_action(ev: dict[str, Any], sentence: str, action: str, hint: str = "") -> str:
    """The action for a compute finding given ``work_evidence``: more work is not the node's fault (no
    "drain the node"; telemetry's ``hint`` still added), the same work slower keeps ``action``."""
    if ev.get("work") == "more":
        return sentence + (" Also: " + hint if hint else "")
    return (sentence + " " + action) if sentence else action


def transfer_evidence(table: Table, row: int, peer_rows: np.ndarray) -> dict[str, Any]:
    """Copies by direction on the culprit vs its peers (MB and ms per step, how much was pageable),
    and its PCIe link against the link's maximum (NVML), for a `transfer` finding."""
    ev: dict[str, Any] = {}
    peers = peer_rows[peer_rows != row] if len(peer_rows) > 1 else peer_rows
    for col in ("htod_mb", "htod_pageable_mb", "htod_ms", "dtoh_mb", "dtoh_pageable_mb", "dtoh_ms"):
        mine, ref = float(table.dev(col)[row]), table.dev(col)[peers]
        ref = ref[np.isfinite(ref)]
        if math.isfinite(mine) and (mine > 0 or (len(ref) and float(np.median(ref)) > 0)):
            ev[col] = [mine, float(np.median(ref)) if len(ref) else None]
    t = table.telemetry
    link = {k: float(t[k][row]) for k in ("pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max")
            if k in t and math.isfinite(float(t[k][row]))}
    if link:
        ev["pcie"] = link
        if link.get("pcie_gen", 0) < link.get("pcie_gen_max", 0) or \
                link.get("pcie_width", 0) < link.get("pcie_width_max", 0):
            ev["pcie_degraded"] = True
    return ev
