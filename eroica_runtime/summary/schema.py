"""The summary format: schema constants, validation, and msgpack encoding of summaries and captures.

The layout is specified in docs/summary-schema.md (``eroica.summary/1``). Summaries cross process
boundaries, so they are plain msgpack maps, validated on decode, never pickled.
"""

from __future__ import annotations

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


def validate(obj: Any, *, origin: str = "?") -> None:
    """Check the schema tag and field types; raise SummaryError with a one-line reason."""
    if not isinstance(obj, dict):
        raise SummaryError(f"summary from {origin}: expected a map, got {type(obj).__name__}")
    schema = obj.get("schema")
    if schema != SCHEMA:
        raise SummaryError(f"summary from {origin}: unsupported schema {schema!r} (expected {SCHEMA!r})")
    for field, types in _TOP_FIELDS.items():
        if field not in obj:
            raise SummaryError(f"summary from {origin}: missing field {field!r}")
        if not isinstance(obj[field], types) or isinstance(obj[field], bool):
            raise SummaryError(f"summary from {origin}: field {field!r} has type {type(obj[field]).__name__}")
    for name in PHASES:
        value = obj["phases"].get(name, 0.0)
        if not isinstance(value, _NUM):
            raise SummaryError(f"summary from {origin}: phase {name!r} is not a number")
    for i, fn in enumerate(obj["functions"]):
        if not isinstance(fn, dict):
            raise SummaryError(f"summary from {origin}: functions[{i}] is not a map")
        for field, types in _FUNCTION_FIELDS.items():
            if not isinstance(fn.get(field), types):
                raise SummaryError(f"summary from {origin}: functions[{i}].{field} missing or mistyped")
    for i, st in enumerate(obj["steps"]):
        if not (isinstance(st, dict) and isinstance(st.get("step"), int) and isinstance(st.get("ms"), _NUM)):
            raise SummaryError(f"summary from {origin}: steps[{i}] must be {{step: int, ms: number}}")


def own_work_ms(summary: dict[str, Any]) -> float:
    """Time per step the rank spent on its own work (everything but waiting in communication)."""
    phases = summary["phases"]
    return float(sum(phases.get(p, 0.0) for p in OWN_WORK_PHASES))


def encode_capture(*, step: int, trigger: str, world_size: int, ranks: list[int],
                   summaries: list[bytes], missing: list[int],
                   extra: dict[str, Any] | None = None) -> bytes:
    """One capture file: every rank's summary kept as its own bytes, so one bad rank spoils nothing.

    ``ranks[i]`` is the rank that sent ``summaries[i]`` (so a bad summary can be blamed on it).
    """
    doc = {"schema": CAPTURE_SCHEMA, "step": int(step), "trigger": str(trigger),
           "world_size": int(world_size), "missing": sorted(int(r) for r in missing),
           "ranks": [int(r) for r in ranks], "summaries": [bytes(s) for s in summaries]}
    if extra:
        doc["extra"] = extra
    return msgpack.packb(doc, use_bin_type=True)


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
    return meta, good, errors
