"""The summary format: schema constants, validation, and msgpack encoding of summaries and captures.

The layout is specified in docs/summary-schema.md (``eroica.summary/1``). Summaries cross process
boundaries, so they are plain msgpack maps, validated on decode, never pickled.
"""

from __future__ import annotations

import math
from typing import Any

import msgpack

SCHEMA = "eroica.summary/1"
CAPTURE_SCHEMA = "eroica.capture/1"
MAX_SUMMARY_BYTES = 256 * 1024

PHASES = ("step", "data", "forward", "backward", "optimizer", "comm", "comm_total",
          "host_gap", "gc", "io", "overlap")
OWN_WORK_PHASES = ("data", "forward", "backward", "optimizer", "host_gap", "gc", "io")
KINDS = ("cpu_op", "kernel", "memcpy", "memset", "collective", "annotation", "optimizer",
         "dataloader", "other")
FUNCTION_PHASES = ("data", "forward", "backward", "optimizer", "comm", "other")

# field -> accepted python types after msgpack decoding (floats may arrive as ints).
_NUM = (int, float)
_TOP_FIELDS: dict[str, tuple[type, ...]] = {
    "schema": (str,), "rank": (int,), "local_rank": (int,), "world_size": (int,), "pid": (int,),
    "host": (str,), "device": (dict,), "groups": (list,), "versions": (dict,), "capture": (dict,),
    "steps": (list,), "functions": (list,), "phases": (dict,), "gc": (dict,), "telemetry": (dict,),
}
_FUNCTION_FIELDS: dict[str, tuple[type, ...]] = {
    "name": (str,), "kind": (str,), "phase": (str,), "count": _NUM, "ms": _NUM, "mean": _NUM,
    "p50": _NUM, "p90": _NUM, "p99": _NUM, "max": _NUM, "std": _NUM,
}


class SummaryError(ValueError):
    """A summary (or capture file) that cannot be trusted; the message names its origin."""


def encode(summary: dict[str, Any]) -> bytes:
    """Encode a summary dict as msgpack bytes (validating it first, so bad data fails at the source)."""
    validate(summary, origin=f"rank {summary.get('rank', '?')}")
    return msgpack.packb(summary, use_bin_type=True)


def decode(data: bytes, *, origin: str = "?", max_bytes: int = MAX_SUMMARY_BYTES) -> dict[str, Any]:
    """Decode and validate one summary; raise SummaryError naming ``origin`` (e.g. "rank 3")."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise SummaryError(f"summary from {origin}: expected bytes, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise SummaryError(f"summary from {origin}: {len(data)} bytes exceeds the {max_bytes}-byte limit")
    try:
        # (unpackb takes no max_buffer_size; the length was checked above and msgpack derives
        # its max_*_len limits from the input length)
        obj = msgpack.unpackb(bytes(data), raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for garbage
        raise SummaryError(f"summary from {origin}: not valid msgpack ({type(exc).__name__}: {exc})") from None
    validate(obj, origin=origin)
    return obj


# Plausibility bounds: a value outside them is a corrupt or hostile summary, never a measurement.
MAX_MS = 1e7                 # ~2.8 hours, per step or per call
MAX_COUNT = 1e9              # calls per step
MAX_WORLD = 10_000_000
MAX_FUNCTIONS_LISTED = 4096
MAX_STEPS_LISTED = 100_000
MAX_GROUPS = 256
MAX_HISTORY = 4096
# per window step, besides {step, ms}: the training thread's CPU ms and run-queue ms (step clock),
# and ms blocked in collectives (the profiled timeline), ms the process was held throttled by its
# CPU quota (present when it was)
STEP_EXTRAS = ("cpu", "runq", "comm", "stops", "data", "gc", "thr")
# the steps before the window, one column each: wall ms, thread CPU ms, run-queue ms; optional:
# SIGCONTs received in the step (present when there were some), ms in DataLoader next(), ms in
# GC pauses, ms held throttled by a CPU quota (present when some step was), ms it came late to the
# step's collectives against the earliest rank (lateness.py; present in jobs of more than one rank)
HISTORY_COLUMNS = ("ms", "cpu", "runq")
HISTORY_OPTIONAL = ("stops", "data", "gc", "thr", "late")
MAX_NAME = 4096
MAX_TELEMETRY_DEPTH = 4
MAX_TELEMETRY_LEAVES = 4096


def _bad(origin: str, what: str) -> SummaryError:
    return SummaryError(f"summary from {origin}: {what}")


def _is_num(x: Any) -> bool:
    return isinstance(x, _NUM) and not isinstance(x, bool)


def _check_ms(origin: str, where: str, x: Any, hi: float = MAX_MS) -> None:
    """A finite, non-negative number no larger than ``hi`` (booleans are not numbers)."""
    if not _is_num(x):
        raise _bad(origin, f"{where} is not a number ({type(x).__name__})")
    if not (0.0 <= float(x) <= hi):   # also False for NaN
        raise _bad(origin, f"{where}={x!r} is outside [0, {hi:g}]")


def _check_int(origin: str, where: str, x: Any, lo: int, hi: int) -> None:
    if not isinstance(x, int) or isinstance(x, bool) or not lo <= x <= hi:
        raise _bad(origin, f"{where}={x!r} must be an integer in [{lo}, {hi}]")


def _check_str(origin: str, where: str, x: Any, limit: int = MAX_NAME) -> None:
    if not isinstance(x, str) or len(x) > limit:
        raise _bad(origin, f"{where} must be a string of at most {limit} characters")


def _check_tree(origin: str, where: str, x: Any, depth: int = 0, budget: list[int] | None = None) -> None:
    """Free-form maps (telemetry, device, versions): small, shallow, finite numbers, short strings."""
    budget = budget if budget is not None else [MAX_TELEMETRY_LEAVES]
    if depth > MAX_TELEMETRY_DEPTH:
        raise _bad(origin, f"{where} is nested deeper than {MAX_TELEMETRY_DEPTH} levels")
    if isinstance(x, dict):
        items = x.items()
    elif isinstance(x, list):
        items = enumerate(x)
    else:
        budget[0] -= 1
        if budget[0] < 0:
            raise _bad(origin, f"{where}: more than {MAX_TELEMETRY_LEAVES} values")
        if _is_num(x) and not math.isfinite(float(x)):
            raise _bad(origin, f"{where}={x!r} is not finite")
        if not (x is None or isinstance(x, (bool, int, float, str))) or (isinstance(x, str) and len(x) > MAX_NAME):
            raise _bad(origin, f"{where} holds an unexpected {type(x).__name__}")
        return
    for k, v in items:
        if not isinstance(k, (str, int)) or isinstance(k, bool):
            raise _bad(origin, f"{where} has a {type(k).__name__} key")
        _check_tree(origin, f"{where}.{_key(k)}", v, depth + 1, budget)


def _key(k: str | int) -> str:
    """A map key as an error message names it: as it is when short and printable, else escaped and cut
    (a key holding a newline made the one-line error two lines: the fuzz test found it)."""
    return str(k) if isinstance(k, int) or (k.isprintable() and len(k) <= 40) else ascii(k)[:40]


def validate(obj: Any, *, origin: str = "?") -> None:
    """Check the schema tag, field types, finiteness and ranges; raise SummaryError with a one-line reason.

    A summary is input from another process: one that passes here cannot make the engine raise or
    distort the others' diagnosis (every phase present, every number finite and plausible, groups
    and telemetry well-formed).
    """
    if not isinstance(obj, dict):
        raise SummaryError(f"summary from {origin}: expected a map, got {type(obj).__name__}")
    schema = obj.get("schema")
    if schema != SCHEMA:
        raise SummaryError(f"summary from {origin}: unsupported schema {schema!r} (expected {SCHEMA!r})")
    for field, types in _TOP_FIELDS.items():
        if field not in obj:
            raise _bad(origin, f"missing field {field!r}")
        if not isinstance(obj[field], types) or isinstance(obj[field], bool):
            raise _bad(origin, f"field {field!r} has type {type(obj[field]).__name__}")
    _check_int(origin, "world_size", obj["world_size"], 1, MAX_WORLD)
    _check_int(origin, "rank", obj["rank"], 0, obj["world_size"] - 1)
    _check_int(origin, "local_rank", obj["local_rank"], 0, MAX_WORLD)
    _check_str(origin, "host", obj["host"], 255)
    phases = obj["phases"]
    for name in PHASES:
        if name not in phases:
            raise _bad(origin, f"phase {name!r} is missing")
        _check_ms(origin, f"phase {name!r}", phases[name])
    fns = obj["functions"]
    if len(fns) > MAX_FUNCTIONS_LISTED:
        raise _bad(origin, f"{len(fns)} functions (at most {MAX_FUNCTIONS_LISTED})")
    for i, fn in enumerate(fns):
        if not isinstance(fn, dict):
            raise _bad(origin, f"functions[{i}] is not a map")
        for field, types in _FUNCTION_FIELDS.items():
            if not isinstance(fn.get(field), types) or isinstance(fn.get(field), bool):
                raise _bad(origin, f"functions[{i}].{field} missing or mistyped")
        _check_str(origin, f"functions[{i}].name", fn["name"])
        if "launcher" in fn:
            _check_str(origin, f"functions[{i}].launcher", fn["launcher"])
        if fn["kind"] not in KINDS or fn["phase"] not in FUNCTION_PHASES:
            raise _bad(origin, f"functions[{i}] has unknown kind/phase {fn['kind']!r}/{fn['phase']!r}")
        _check_ms(origin, f"functions[{i}].count", fn["count"], MAX_COUNT)
        for field in ("ms", "mean", "p50", "p90", "p99", "max", "std"):
            _check_ms(origin, f"functions[{i}].{field}", fn[field])
    steps = obj["steps"]
    if len(steps) > MAX_STEPS_LISTED:
        raise _bad(origin, f"{len(steps)} steps (at most {MAX_STEPS_LISTED})")
    for i, st in enumerate(steps):
        if not (isinstance(st, dict) and isinstance(st.get("step"), int) and not isinstance(st.get("step"), bool)
                and st["step"] >= 0):
            raise _bad(origin, f"steps[{i}] must be {{step: int >= 0, ms: number}}")
        _check_ms(origin, f"steps[{i}].ms", st.get("ms"))
        for field in STEP_EXTRAS:
            if field in st:
                _check_ms(origin, f"steps[{i}].{field}", st[field])
    hist = obj.get("history")
    if hist is not None:
        _check_history(origin, hist)
    if "python" in obj:
        _check_python(origin, obj["python"])
    groups = obj["groups"]
    if len(groups) > MAX_GROUPS:
        raise _bad(origin, f"{len(groups)} groups (at most {MAX_GROUPS})")
    for i, g in enumerate(groups):
        if not isinstance(g, dict) or not isinstance(g.get("ranks"), list):
            raise _bad(origin, f"groups[{i}] must be {{name: str, ranks: [int]}}")
        _check_str(origin, f"groups[{i}].name", g.get("name"), 255)
        if len(g["ranks"]) > obj["world_size"] or not all(
                isinstance(r, int) and not isinstance(r, bool) and 0 <= r < obj["world_size"] for r in g["ranks"]):
            raise _bad(origin, f"groups[{i}].ranks must be ranks of this world (0..{obj['world_size'] - 1})")
    gc = obj["gc"]
    for field in ("count", "ms"):
        if field in gc:
            _check_ms(origin, f"gc.{field}", gc[field], MAX_COUNT if field == "count" else MAX_MS)
    cap = obj["capture"]
    if "step" in cap:
        _check_int(origin, "capture.step", cap["step"], 0, 2**53)
    if "k" in cap:
        _check_int(origin, "capture.k", cap["k"], 0, MAX_STEPS_LISTED)
    if "trigger" in cap:
        _check_str(origin, "capture.trigger", cap["trigger"], 64)
    dev = obj.get("device_phases")
    if dev is not None:
        if not isinstance(dev, dict):
            raise _bad(origin, "device_phases must be a map")
        for k, v in dev.items():
            _check_str(origin, "device_phases key", k, 64)
            _check_ms(origin, f"device_phases.{_key(k)}", v, MAX_COUNT * 1e3)
    tele = obj["telemetry"]
    for edge in ("start", "end"):
        sample = tele.get(edge)
        if sample is None:
            continue
        if not isinstance(sample, dict):
            raise _bad(origin, f"telemetry.{edge} must be a map")
        for part in ("host", "gpu"):
            if sample.get(part) is not None and not isinstance(sample[part], dict):
                raise _bad(origin, f"telemetry.{edge}.{part} must be a map")
        gpu = sample.get("gpu") or {}
        if "throttle" in gpu and gpu["throttle"] is not None and not (
                isinstance(gpu["throttle"], list) and all(isinstance(x, str) for x in gpu["throttle"])):
            raise _bad(origin, f"telemetry.{edge}.gpu.throttle must be a list of strings")
    for field in ("telemetry", "device", "versions"):
        _check_tree(origin, field, obj[field])
    if "profile" in obj:
        _check_tree(origin, "profile", obj["profile"])


MAX_PYTHON_FRAMES = 16
MAX_PYTHON_SAMPLES = 2**31


def _check_python(origin: str, py: Any) -> None:
    """``python``: {samples: int, ms: float, frames: [[frame text, ms], ...]} (pysample.FrameSampler)."""
    if not isinstance(py, dict):
        raise _bad(origin, "python must be a map")
    _check_int(origin, "python.samples", py.get("samples"), 0, MAX_PYTHON_SAMPLES)
    _check_ms(origin, "python.ms", py.get("ms"))
    frames = py.get("frames")
    if not isinstance(frames, list) or len(frames) > MAX_PYTHON_FRAMES:
        raise _bad(origin, f"python.frames must be a list of at most {MAX_PYTHON_FRAMES} [frame, ms] pairs")
    for i, pair in enumerate(frames):
        if not (isinstance(pair, list) and len(pair) == 2):
            raise _bad(origin, f"python.frames[{i}] must be a [frame, ms] pair")
        _check_str(origin, f"python.frames[{i}][0]", pair[0], 1024)
        _check_ms(origin, f"python.frames[{i}][1]", pair[1])


def _check_history(origin: str, hist: Any) -> None:
    if not isinstance(hist, dict):
        raise _bad(origin, "history must be a map")
    _check_int(origin, "history.first", hist.get("first"), 0, 2**53)
    cols = [hist.get(c) for c in HISTORY_COLUMNS]
    if not all(isinstance(c, list) for c in cols) or len({len(c) for c in cols}) != 1:
        raise _bad(origin, f"history needs lists {', '.join(HISTORY_COLUMNS)} of one length")
    if len(cols[0]) > MAX_HISTORY:
        raise _bad(origin, f"history of {len(cols[0])} steps (at most {MAX_HISTORY})")
    for name, col in zip(HISTORY_COLUMNS, cols, strict=True):
        for j, x in enumerate(col):
            _check_ms(origin, f"history.{name}[{j}]", x)
    for name in HISTORY_OPTIONAL:
        if name in hist:
            col = hist[name]
            if not isinstance(col, list) or len(col) != len(cols[0]):
                raise _bad(origin, f"history.{name} must be a list as long as history.ms")
            for j, x in enumerate(col):
                _check_ms(origin, f"history.{name}[{j}]", x, MAX_COUNT)


def own_work_ms(summary: dict[str, Any]) -> float:
    """Time per step the rank spent on its own work (everything but waiting in communication)."""
    phases = summary["phases"]
    return float(sum(phases.get(p, 0.0) for p in OWN_WORK_PHASES))


def encode_capture(*, step: int, trigger: str, world_size: int, ranks: list[int],
                   summaries: list[bytes], missing: list[int],
                   extra: dict[str, Any] | None = None) -> bytes:
    """One capture file: every rank's summary kept as its own bytes, so one bad rank spoils nothing.

    ``ranks[i]`` is the rank that sent ``summaries[i]`` (so a bad summary can be blamed on it).
    The bytes are msgpack's for that map; the summaries are joined in one copy (msgpack's packer
    grows its buffer as it goes: 3.4 s for a 100,000-rank capture against 0.3 s joined).
    """
    blobs = [bytes(s) for s in summaries]
    head = {"schema": CAPTURE_SCHEMA, "step": int(step), "trigger": str(trigger),
            "world_size": int(world_size), "missing": sorted(int(r) for r in missing),
            "ranks": [int(r) for r in ranks]}
    packer = msgpack.Packer(use_bin_type=True)
    parts = [packer.pack_map_header(len(head) + 1 + (1 if extra else 0))]
    parts += [packer.pack(k) + packer.pack(v) for k, v in head.items()]
    parts += [packer.pack("summaries"), packer.pack_array_header(len(blobs))]
    for blob in blobs:
        n = len(blob)
        parts.append(bytes((0xC4, n)) if n < 0x100 else b"\xc5" + n.to_bytes(2, "big") if n < 0x10000
                     else b"\xc6" + n.to_bytes(4, "big"))
        parts.append(blob)
    if extra:
        parts += [packer.pack("extra"), packer.pack(extra)]
    return b"".join(parts)


def decode_capture(data: bytes, *, origin: str = "capture",
                   max_bytes_per_summary: int = MAX_SUMMARY_BYTES,
                   ) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
    """Decode a capture file into (meta, good summaries, one-line errors for the bad ones)."""
    try:
        doc = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:
        raise SummaryError(f"{origin}: not valid msgpack ({type(exc).__name__}: {exc})") from None
    if not isinstance(doc, dict) or doc.get("schema") != CAPTURE_SCHEMA:
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise SummaryError(f"{origin}: unsupported capture schema {got!r} (expected {CAPTURE_SCHEMA!r})")
    blobs = doc.get("summaries")
    if not isinstance(blobs, list):
        raise SummaryError(f"{origin}: 'summaries' must be a list")
    ranks = doc.get("ranks")
    if not isinstance(ranks, list) or len(ranks) != len(blobs):
        ranks = [None] * len(blobs)
    good: list[dict[str, Any]] = []
    errors: list[str] = []
    for i, blob in enumerate(blobs):
        who = f"rank {ranks[i]}" if isinstance(ranks[i], int) else f"{origin} entry {i}"
        try:
            summary = decode(blob, origin=who, max_bytes=max_bytes_per_summary)
            if isinstance(ranks[i], int) and summary["rank"] != ranks[i]:
                raise SummaryError(f"summary from {who}: claims to be rank {summary['rank']}")
            good.append(summary)
        except SummaryError as exc:
            errors.append(str(exc))
    meta = {k: doc.get(k) for k in ("step", "trigger", "world_size", "missing", "extra")}
    check_capture_meta(meta, origin)
    return meta, good, errors


def check_capture_meta(meta: dict[str, Any], origin: str) -> None:
    """The capture file's own fields (written by rank 0; read back by `eroica analyze` from disk)."""
    def bad(what: str) -> SummaryError:
        return SummaryError(f"{origin}: {what}")

    step, world = meta.get("step"), meta.get("world_size")
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= 2**53:
        raise bad(f"'step' must be a non-negative integer, got {step!r}")
    if not isinstance(world, int) or isinstance(world, bool) or not 1 <= world <= MAX_WORLD:
        raise bad(f"'world_size' must be an integer in [1, {MAX_WORLD}], got {world!r}")
    trigger = meta.get("trigger")
    if not isinstance(trigger, str) or not trigger or len(trigger) > 64 or not trigger.isprintable():
        raise bad(f"'trigger' must be a short printable string, got {trigger!r}")
    missing = meta.get("missing")
    if missing is None:
        meta["missing"] = []
    elif not isinstance(missing, list) or not all(
            isinstance(r, int) and not isinstance(r, bool) and 0 <= r < world for r in missing):
        raise bad(f"'missing' must be a list of ranks below world_size {world}, got {missing!r}"[:300])
    extra = meta.get("extra")
    if extra is not None:
        if not isinstance(extra, dict):
            raise bad("'extra' must be a map")
        try:
            _check_tree(origin, "extra", extra)
        except SummaryError as exc:
            raise bad(str(exc).split(": ", 1)[-1]) from None
