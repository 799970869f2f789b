"""A window's raw profiler events kept as data, and read back as events the builder takes as it took them.

Why: the builder's GPU paths (kernels and the ops that launched them, NCCL kernels, copies by direction
and host memory, memsets, device-side annotations) are only exercised by events a GPU recorded. With
``EROICA_KEEP_RAW_EVENTS=1`` every rank writes its window's events beside the capture
(``raw/<step>/rank<r>.msgpack``, reportdir); committed as fixtures, CI builds summaries from them on a
machine without a GPU, through the same ``summary.build`` as live (``Recorded`` has the methods of a
kineto event that ``events.normalize_raw_steps`` calls). Also something a user can attach to a bug report.

Format ``eroica.rawevents/1``: a msgpack map ``{schema, rank, step, n, strings: [str], cols: {name: bytes},
meta: {index: str}}``, zlib-compressed; every column is n little-endian values (numpy), strings are indices
into ``strings``, ``meta`` holds the JSON metadata of device copies only (their bytes). Never pickle.
Written in the closing step, so only when asked for: ~7 µs and ~7 bytes an event (docs/benchmarks.md §6).
"""

from __future__ import annotations

import zlib
from typing import Any

import msgpack
import numpy as np

from eroica_runtime.summary.build import build
from eroica_runtime.summary.events import GPU_DEVICE_TYPES, demangle, device_type_name
from eroica_runtime.summary.schema import decode, encode

SCHEMA = "eroica.rawevents/1"
MAX_EVENTS = 5_000_000
MAX_BYTES = 512 << 20
# column -> dtype; strings (name, device type, activity) are int32 indices into the string table
COLUMNS = {"name": "<i4", "device_type": "<i4", "activity": "<i4", "start_ns": "<i8", "end_ns": "<i8",
           "device_index": "<i8", "resource_id": "<i8", "thread": "<i8", "corr": "<i8", "linked": "<i8",
           "scope": "<i8", "annotation": "u1", "hidden": "u1"}
_STRINGS = ("name", "device_type", "activity")


class RawEventsError(ValueError):
    """A raw-events file that is not one (the message names the file and what is wrong)."""


def _call(ev: Any, method: str, default: Any) -> Any:
    fn = getattr(ev, method, None)
    return fn() if callable(fn) else default


def dump(events: Any, *, rank: int, step: int) -> bytes:
    """The events (raw kineto events, as ``Capture.stop()`` hands them over) as an ``eroica.rawevents/1``
    document. Device kernel names are stored demangled, as the builder shows them."""
    table: dict[str, int] = {}
    cols: dict[str, list[int]] = {c: [] for c in COLUMNS}
    meta: dict[int, str] = {}

    def intern(text: str) -> int:
        return table.setdefault(text, len(table))

    for i, ev in enumerate(events):
        dtype = device_type_name(ev.device_type())
        gpu = dtype in GPU_DEVICE_TYPES
        name = ev.name()
        activity = str(_call(ev, "activity_type", "")) if gpu else ""
        cols["name"].append(intern(demangle(name) if gpu else name))
        cols["device_type"].append(intern(dtype))
        cols["activity"].append(intern(activity))
        cols["start_ns"].append(int(ev.start_ns()))
        cols["end_ns"].append(int(ev.end_ns()))
        cols["device_index"].append(int(_call(ev, "device_index", 0) or 0))
        cols["resource_id"].append(int(_call(ev, "device_resource_id", 0) or 0))
        cols["thread"].append(int(_call(ev, "start_thread_id", 0) or 0))
        cols["corr"].append(int(_call(ev, "correlation_id", 0) or 0))
        cols["linked"].append(int(_call(ev, "linked_correlation_id", 0) or 0))
        cols["scope"].append(int(_call(ev, "scope", 0) or 0))
        cols["annotation"].append(1 if _call(ev, "is_user_annotation", False) else 0)
        cols["hidden"].append(1 if _call(ev, "is_hidden_event", False) else 0)
        if gpu and (activity == "gpu_memcpy" or name.startswith("Memcpy")):
            meta[i] = str(_call(ev, "metadata_json", "") or "")
    n = len(cols["name"])
    doc = {"schema": SCHEMA, "rank": int(rank), "step": int(step), "n": n, "strings": list(table),
           "cols": {c: np.asarray(v, dtype=COLUMNS[c]).tobytes() for c, v in cols.items()}, "meta": meta}
    return zlib.compress(msgpack.packb(doc, use_bin_type=True), 6)


class Recorded:
    """One event read back from ``dump``: the methods of a raw kineto event the builder calls."""

    __slots__ = ("_name", "_dtype", "_activity", "_start", "_end", "_index", "_resource", "_thread", "_corr",
                 "_linked", "_scope", "_annotation", "_hidden", "_meta")

    def __init__(self, values: tuple[Any, ...]) -> None:
        (self._name, self._dtype, self._activity, self._start, self._end, self._index, self._resource,
         self._thread, self._corr, self._linked, self._scope, self._annotation, self._hidden, self._meta) = values

    def name(self) -> str:
        return self._name

    def device_type(self) -> str:
        return self._dtype

    def activity_type(self) -> str:
        return self._activity

    def start_ns(self) -> int:
        return self._start

    def end_ns(self) -> int:
        return self._end

    def device_index(self) -> int:
        return self._index

    def device_resource_id(self) -> int:
        return self._resource

    def start_thread_id(self) -> int:
        return self._thread

    def correlation_id(self) -> int:
        return self._corr

    def linked_correlation_id(self) -> int:
        return self._linked

    def scope(self) -> int:
        return self._scope

    def is_user_annotation(self) -> bool:
        return self._annotation

    def is_hidden_event(self) -> bool:
        return self._hidden

    def metadata_json(self) -> str:
        return self._meta


def load(data: bytes, origin: str = "raw events") -> tuple[dict[str, Any], list[Recorded]]:
    """({schema, rank, step, n}, the events) from ``dump``'s bytes; RawEventsError naming ``origin`` and
    the first thing wrong."""
    def bad(what: str) -> RawEventsError:
        return RawEventsError(f"{origin}: not an {SCHEMA} document: {what}")

    try:
        raw = zlib.decompressobj().decompress(data, MAX_BYTES)
        doc = msgpack.unpackb(raw, raw=False, strict_map_key=False, max_bin_len=MAX_BYTES)
    except (zlib.error, ValueError, msgpack.exceptions.ExtraData, msgpack.exceptions.FormatError,
            msgpack.exceptions.StackError) as exc:
        raise bad(f"cannot be read ({type(exc).__name__})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise bad(f"schema {doc.get('schema') if isinstance(doc, dict) else type(doc).__name__!r}")
    n = doc.get("n")
    if type(n) is not int or not 0 <= n <= MAX_EVENTS:
        raise bad(f"event count {n!r}")
    for key in ("rank", "step"):
        if type(doc.get(key)) is not int or doc[key] < 0:
            raise bad(f"{key} {doc.get(key)!r}")
    strings, cols, meta = doc.get("strings"), doc.get("cols"), doc.get("meta")
    if not isinstance(strings, list) or not all(isinstance(s, str) for s in strings):
        raise bad("strings")
    if not isinstance(cols, dict) or set(cols) != set(COLUMNS):
        raise bad(f"columns {sorted(cols) if isinstance(cols, dict) else cols!r}")
    if not isinstance(meta, dict) or not all(type(k) is int and 0 <= k < n and isinstance(v, str)
                                             for k, v in meta.items()):
        raise bad("meta")
    arrays: dict[str, np.ndarray] = {}
    for c, dtype in COLUMNS.items():
        buf = cols[c]
        if not isinstance(buf, bytes) or len(buf) != n * np.dtype(dtype).itemsize:
            raise bad(f"column {c} does not hold {n} values")
        arrays[c] = np.frombuffer(buf, dtype=dtype)
    for c in _STRINGS:
        if n and (int(arrays[c].min()) < 0 or int(arrays[c].max()) >= len(strings)):
            raise bad(f"column {c} points outside the string table")
    names = [strings[i] for i in arrays["name"].tolist()]
    dtypes = [strings[i] for i in arrays["device_type"].tolist()]
    acts = [strings[i] for i in arrays["activity"].tolist()]
    rows = zip(names, dtypes, acts, *(arrays[c].tolist() for c in COLUMNS if c not in _STRINGS), strict=True)
    events = [Recorded((nm, dt, act, s, e, di, rid, th, co, li, sc, bool(an), bool(hi), meta.get(i, "")))
              for i, (nm, dt, act, s, e, di, rid, th, co, li, sc, an, hi) in enumerate(rows)]
    return {"schema": SCHEMA, "rank": doc["rank"], "step": doc["step"], "n": n}, events



def rebuild(sent: dict[str, Any], events: list[Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the summary ``build`` makes of ``events`` with every other input taken from ``sent``, ``sent``),
    both through encode/decode and without their build times. The inputs taken from ``sent`` (step
    times, GC ms, the sampled frames) are its rounded values, so numbers may differ in the last places: compare with
    ``differences``. How kept raw events are checked (tests/test_runtime.py, scripts/gpu-check, the GPU
    fixtures' tests)."""
    identity = {k: sent[k] for k in ("rank", "local_rank", "world_size", "pid", "host", "device", "groups",
                                     "versions")}
    again = build(events, identity=identity, capture=sent["capture"], steps=sent["steps"],
                  history=sent.get("history"), gc=sent["gc"], telemetry=sent["telemetry"],
                  python=sent.get("python"))
    docs = decode(encode(again)), decode(encode(sent))
    for doc in docs:
        doc["profile"].pop("build_ms")
    return docs


def differences(a: Any, b: Any, where: str = "", tol_ms: float = 1e-3) -> list[str]:
    """Where two summaries differ (paths like ``phases.host_gap``): numbers beyond ``tol_ms`` (plus a
    millionth of their size), anything else when not equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str)
                for d in (differences(a[k], b[k], f"{where}.{k}".lstrip("."), tol_ms) if k in a and k in b
                          else [f"{where}.{k}".lstrip(".")])]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where} (length {len(a)} vs {len(b)})"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{where}[{i}]", tol_ms)]
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b))
    if numbers and abs(a - b) <= tol_ms + 1e-6 * max(abs(a), abs(b)):
        return []
    return [] if a == b else [f"{where} ({a!r} vs {b!r})"]
