"""A node's rows as bytes: a TableBuilder segment <-> one versioned, validated msgpack column block.

Why: a node leader decodes and validates its node's summaries into the engine's columns
(engine/blocks.py) and forwards those columns instead of ~12 KB of msgpack per rank; rank 0 merges
every block's columns into one segment of its TableBuilder. Rank 0 receives one block per node
(12,500 at 100,000 ranks), so what it does per block must be a handful of operations: a block's
numbers travel as a few int64 matrices (per-row fields, window steps, each function pattern's
values; float columns as 4-place decimals where they are, as summary.build rounds them, else as
their bits, lossless either way), which rank 0 concatenates over all blocks and checks and decodes
in one vectorised pass (``check_parts``, ``merge_parts``); only the structure (which fields, how
many bytes, the strings) is checked block by block, and a function list already checked is not
checked again. The format is msgpack only (never pickle); the whole body is zlib-compressed with
its CRC-32 in the envelope. A corrupt or foreign block raises ``BlockError`` (or is flagged by
``check_parts``) with one line naming the leader and what is wrong, and spoils only that node.
Pure: no MPI, no torch.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from eroica_runtime.engine.table import (
    DEVICE_COLUMNS,
    SCHED_COLUMNS,
    TELEMETRY_KEYS,
    FnKey,
    FnPattern,
    GroupCodes,
    Segment,
    union_patterns,
)
from eroica_runtime.summary import PHASES
from eroica_runtime.summary.schema import MAX_NAME, MAX_STEPS_LISTED, MAX_WORLD

BLOCK_SCHEMA = "eroica.block/8"     # /7 (no torch settings), /6 (no lateness columns), /5 (no memory telemetry), /4 (no span_busy_sd), /3 (no span columns), /2 (no CPU quota columns), /1: not read
MAX_BLOCK_BYTES = 256 << 20       # one node's block, decompressed (a node of 64 ranks is ~1 MB)
MAX_ROWS = 1 << 16                # ranks a node leader may speak for
MAX_LIST = 1 << 16                # segments, patterns, functions, groups, hosts in one block
UNION_ABOVE = 16                  # rank 0 joins its blocks' function lists into one above this many
ZLIB_LEVEL = 1                    # measured: level 1 is ~as small as 6 on these columns, 3x faster
DECIMALS = (0, 4)                 # places tried: counts, and summary.build's round(x, 4) (fewer are included)
TELEMETRY = TELEMETRY_KEYS


class BlockError(ValueError):
    """A column block that cannot be used; the message is one line naming its leader."""


# ---- arrays ------------------------------------------------------------------------------------------------

def pack_array(a: np.ndarray) -> dict[str, Any]:
    """A numpy array as msgpack-ready fields: dtype, shape and little-endian bytes (one element when
    every element has the same bits)."""
    a = np.ascontiguousarray(a)
    dt = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
    a = a.astype(dt, copy=False)
    out: dict[str, Any] = {"dtype": dt.str, "shape": list(a.shape)}
    flat = a.reshape(-1).view(np.uint8).reshape(a.size, dt.itemsize) if a.size else None
    if flat is not None and a.size > 1 and bool((flat == flat[0]).all()):
        out["fill"] = flat[0].tobytes()
        return out
    places = _decimal_places(a) if dt == np.dtype("<f8") and a.size > 1 else None
    if places is None:
        out["data"] = a.tobytes()
        return out
    n = np.round(a * 10.0 ** places)
    ints = n.astype("<i4" if float(np.abs(n).max()) < 2**31 else "<i8")
    out.update(dec=places, idtype=ints.dtype.str, data=ints.tobytes())
    return out


def _decimal_places(a: np.ndarray) -> int | None:
    """The fewest DECIMALS places p with every element exactly n / 10**p for an integer n (the same
    bits, the sign of zero included), or None."""
    if not np.isfinite(a).all():
        return None
    bits = a.view(np.uint64)
    for places in DECIMALS:
        n = np.round(a * 10.0 ** places)
        if float(np.abs(n).max()) >= 2**53:
            return None
        back = n.astype(np.int64).astype(np.float64) / 10.0 ** places    # as unpack_array computes it
        if np.array_equal(back.view(np.uint64), bits):
            return places
    return None


def unpack_array(who: str, what: str, doc: Any, dtype: str, shape: tuple[int | None, ...]) -> np.ndarray:
    """The array ``pack_array`` made, checked: exactly ``dtype``, ``shape`` (None: any length up to the
    limits) and as many bytes as that needs."""
    if not isinstance(doc, dict) or doc.get("dtype") != dtype:
        got = doc.get("dtype") if isinstance(doc, dict) else type(doc).__name__
        raise BlockError(f"{who}: {what} must be an array of {dtype}, got {got!r}")
    got_shape = doc.get("shape")
    if (not isinstance(got_shape, list) or len(got_shape) != len(shape)
            or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_BLOCK_BYTES for x in got_shape)
            or any(w is not None and w != x for w, x in zip(shape, got_shape, strict=True))):
        raise BlockError(f"{who}: {what} has shape {got_shape!r}, expected {list(shape)!r}"[:300])
    dt = np.dtype(dtype)
    size = int(np.prod(got_shape)) if got_shape else 1
    if size * dt.itemsize > MAX_BLOCK_BYTES:
        raise BlockError(f"{who}: {what} is larger than a block may be")
    fill, data = doc.get("fill"), doc.get("data")
    if "dec" in doc:
        places, idt = doc.get("dec"), doc.get("idtype")
        if (dtype != "<f8" or places not in DECIMALS or idt not in ("<i4", "<i8") or fill is not None
                or not isinstance(data, bytes) or len(data) != size * np.dtype(idt).itemsize):
            raise BlockError(f"{who}: {what} has a bad decimal encoding")
        return (np.frombuffer(data, dtype=idt).astype(np.float64) / 10.0 ** places).reshape(got_shape)
    if isinstance(fill, bytes) and data is None and len(fill) == dt.itemsize:
        return np.frombuffer(fill * size, dtype=dt).reshape(got_shape).copy()   # the very bits, NaN too
    if isinstance(data, bytes) and fill is None and len(data) == size * dt.itemsize:
        return np.frombuffer(data, dtype=dt).reshape(got_shape).copy()
    raise BlockError(f"{who}: {what} holds the wrong number of bytes for shape {got_shape} of {dtype}")


def _strs(who: str, what: str, x: Any, n: int | None = None, limit: int = MAX_NAME) -> list[str]:
    if (not isinstance(x, list) or len(x) > MAX_LIST or (n is not None and len(x) != n)
            or not all(isinstance(s, str) and len(s) <= limit for s in x)):
        need = f"{n} " if n is not None else ""
        raise BlockError(f"{who}: {what} must be a list of {need}strings of at most {limit} characters")
    return list(x)


def _ints_in(who: str, what: str, a: np.ndarray, lo: int, hi: int) -> np.ndarray:
    if a.size and (int(a.min()) < lo or int(a.max()) > hi):
        raise BlockError(f"{who}: {what} has values outside [{lo}, {hi}]")
    return a


# ---- columns: a matrix of numbers as int64, byte-shuffled --------------------------------------------------
#
# A block's numbers travel as matrices (C columns of n values: one column per field, per window step or per
# function), each column as int64: an integer field as it is; a float column either as the integers n with
# value = n / 10**4 (every value a decimal of at most 4 places, as summary.build rounds them: these compress
# to a fraction of the float bits) or as its float bits. The bytes of the int64s are grouped by byte
# position (the "shuffle" of blosc: the high bytes of small integers are long runs of zeros for zlib).
# Rank 0 concatenates every block's matrices and decodes and checks them in one pass (``decode_floats``).

DEC = 4                           # places of summary.build's round(x, 4)
KIND_DEC, KIND_BITS = 4, -1       # a float column's kind: decimals, or the float bits
KIND_SAME = 2                     # ... or one value for every row, sent once (a CPU job's device columns)
_KIND_BYTES = {KIND_DEC & 0xFF, KIND_BITS & 0xFF, KIND_SAME}
Cols = tuple[bytes, bytes, bytes]   # a float matrix as sent: (kinds, the same-valued columns' bits, shuffled rest)


def encode_floats(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(kinds (C,) int8, values (C, n) int64) of a float64 matrix (C, n), lossless to the bit."""
    a = np.ascontiguousarray(a, dtype=np.float64)
    with np.errstate(all="ignore"):
        n = np.round(a * 10.0 ** DEC)
        ok = np.isfinite(n) & (np.abs(n) < 2.0 ** 53)
        ints = np.where(ok, n, 0.0).astype(np.int64)
        back = ints.astype(np.float64) / 10.0 ** DEC         # as decode_floats computes it
    dec = (ok & (back.view(np.uint64) == a.view(np.uint64))).all(axis=1) if a.shape[1] else np.ones(len(a), bool)
    out = np.where(dec[:, None], ints, a.view(np.int64))
    return np.where(dec, KIND_DEC, KIND_BITS).astype(np.int8), out


def decode_floats(kinds: np.ndarray, ints: np.ndarray) -> np.ndarray:
    """The float64 matrix of ``encode_floats``' columns; ``kinds`` (C,) or one per value (C, n)."""
    k = kinds if kinds.ndim == 2 else kinds[:, None]
    return np.where(k == KIND_DEC, ints.astype(np.float64) / 10.0 ** DEC, ints.view(np.float64))


def shuffle(ints: np.ndarray) -> bytes:
    """int64 values as bytes grouped by byte position (little-endian), after one byte saying how
    many low byte planes follow: the high planes that are only the sign's extension are left out
    (4-place decimals fit in 3-4 bytes; rank 0 then inflates and copies half the bytes)."""
    flat = np.ascontiguousarray(ints, dtype="<i8").reshape(-1)
    planes = 8
    if flat.size:
        lo, hi = int(flat.min()), int(flat.max())
        planes = next(p for p in range(1, 9) if p == 8 or (-(1 << (8 * p - 1)) <= lo and hi < 1 << (8 * p - 1)))
    u = flat.view(np.uint8).reshape(-1, 8).T[:planes]
    return bytes([planes]) + u.tobytes()


def _planes(who: str, what: str, data: Any, count: int) -> int:
    """The byte planes of ``shuffle``'s bytes of ``count`` values; BlockError unless exactly so many."""
    planes = data[0] if isinstance(data, bytes) and data else 0
    if not 1 <= planes <= 8 or len(data) != 1 + planes * count:
        raise BlockError(f"{who}: {what} must hold {count} values (a plane count of 1-8, then the planes)")
    return planes


def _widen(planes: list[np.ndarray], out: np.ndarray) -> np.ndarray:
    """Low byte planes (uint8, each shaped like ``out``) into ``out`` (int64), the high planes the
    sign's extension: one shift-and-or pass per plane (byte transposes measured 3x slower)."""
    out[...] = planes[0]
    for k, plane in enumerate(planes[1:], start=1):
        tmp = plane.astype(np.int64)
        tmp <<= 8 * k
        out |= tmp
    if len(planes) < 8:               # arithmetic shifts: the top kept bit fills the planes left out
        shift = 64 - 8 * len(planes)
        out <<= shift
        out >>= shift
    return out


def unshuffle(who: str, what: str, data: Any, count: int) -> np.ndarray:
    """``count`` int64 values from ``shuffle``'s bytes; BlockError when there are not exactly that many."""
    planes = _planes(who, what, data, count)
    raw = np.frombuffer(data, dtype=np.uint8, offset=1).reshape(planes, count)
    return _widen(list(raw), np.empty(count, dtype=np.int64))


def _shuffled(who: str, what: str, data: Any, count: int) -> bytes:
    """``shuffle``'s bytes of ``count`` values, their length checked (decoded with every block's)."""
    _planes(who, what, data, count)
    return data


def unshuffle_many(bufs: list[bytes], c: int, ns: list[int]) -> np.ndarray:
    """(c, sum(ns)) int64: the (c, n_i) matrices ``shuffle`` made of ``bufs`` (checked by
    ``_shuffled``), side by side; one numpy pass for all blocks of one size and plane count (a job's
    nodes mostly are), not a few calls per block."""
    total = sum(ns)
    out = np.empty((c, total), dtype=np.int64)
    if not total or not c:
        return out
    offs = np.cumsum([0, *ns])
    by_n: dict[tuple[int, int], list[int]] = {}
    for i, n in enumerate(ns):
        if n:
            by_n.setdefault((n, bufs[i][0]), []).append(i)
    for (n, planes), idx in by_n.items():
        raw = np.frombuffer(b"".join([memoryview(bufs[i])[1:] for i in idx]), dtype=np.uint8)
        raw = raw.reshape(len(idx), planes, c, n)
        every = len(idx) == len(ns)              # the usual case: straight into ``out``, no scatter
        dst = out.reshape(c, len(idx), n) if every else np.empty((c, len(idx), n), dtype=np.int64)
        _widen([raw[:, k].transpose(1, 0, 2) for k in range(planes)], dst)
        if not every:
            out[:, np.concatenate([np.arange(offs[i], offs[i + 1]) for i in idx])] = dst.reshape(c, len(idx) * n)
    return out


def pack_floats(a: np.ndarray) -> list[bytes]:
    """A float64 matrix (C, n) as [kinds, bits of the columns whose every value is the same, the
    other columns shuffled]: lossless; rank 0 neither inflates nor decodes the constant columns."""
    a = np.ascontiguousarray(a, dtype=np.float64)
    kinds, ints = encode_floats(a)
    bits = a.view(np.int64)
    same = (bits == bits[:, :1]).all(axis=1) if a.shape[1] else np.zeros(len(a), dtype=bool)
    kinds = np.where(same, KIND_SAME, kinds).astype(np.int8)
    return [kinds.tobytes(), bits[same, 0].astype("<i8").tobytes(), shuffle(ints[~same])]


def _floats(who: str, what: str, doc: Any, c: int, n: int) -> Cols:
    """``pack_floats``' fields of a (c, n) matrix, their sizes checked (decoded with every block's)."""
    if not isinstance(doc, list) or len(doc) != 3 or not all(isinstance(x, bytes) for x in doc):
        raise BlockError(f"{who}: {what} must be [kinds, same, values] bytes")
    kinds, same, data = doc
    if len(kinds) != c or not set(kinds) <= _KIND_BYTES:
        raise BlockError(f"{who}: {what} must have {c} kinds of {KIND_DEC} (decimals), {KIND_BITS} (float bits) "
                         f"or {KIND_SAME} (one value)")
    k_same = kinds.count(KIND_SAME)
    if len(same) != 8 * k_same:
        raise BlockError(f"{who}: {what} must hold {k_same} same values")
    _shuffled(who, what, data, (c - k_same) * n)
    return kinds, same, data


def decode_many(items: list[Cols], c: int, ns: list[int]) -> np.ndarray:
    """(c, sum(ns)) float64: the (c, n_i) matrices ``pack_floats`` made, side by side, decoded with a
    few numpy passes per distinct kinds (a job's nodes mostly share theirs)."""
    total = sum(ns)
    out = np.empty((c, total))
    if not total or not c:
        return out
    offs = np.cumsum([0, *ns])
    groups: dict[bytes, list[int]] = {}
    for i, it in enumerate(items):
        groups.setdefault(it[0], []).append(i)
    for kb, idx in groups.items():
        kinds = np.frombuffer(kb, dtype=np.int8)
        var = kinds != KIND_SAME
        sizes = [ns[i] for i in idx]
        every = len(idx) == len(items)
        block = out if every else np.empty((c, sum(sizes)))
        if var.any():
            block[var] = decode_floats(kinds[var], unshuffle_many([items[i][2] for i in idx], int(var.sum()), sizes))
        if not var.all():
            same = np.frombuffer(b"".join([items[i][1] for i in idx]), dtype="<i8").view(np.float64)
            block[~var] = np.repeat(same.reshape(len(idx), -1), sizes, axis=0).T
        if not every:
            out[:, np.concatenate([np.arange(offs[i], offs[i + 1]) for i in idx])] = block
    return out


# ---- a node's segment --------------------------------------------------------------------------------------

INT_FIELDS = ("rank", "badp", "steps", "cap_step", "host_code", "stage")
FLOAT_FIELDS = (tuple(f"phases.{p}" for p in PHASES) + ("noise",) + tuple(f"sched.{c}" for c in SCHED_COLUMNS)
                + tuple(f"tele.{k}" for k in TELEMETRY) + ("gc_count",) + tuple(f"device.{c}" for c in DEVICE_COLUMNS))
_PH = slice(0, len(PHASES))
_NOISE = len(PHASES)
_SCHED = slice(_NOISE + 1, _NOISE + 1 + len(SCHED_COLUMNS))
_TELE0 = _SCHED.stop
_GC = _TELE0 + len(TELEMETRY)
_DEV = slice(_GC + 1, _GC + 1 + len(DEVICE_COLUMNS))


def pack_segment(seg: Segment) -> dict[str, Any]:
    """A node's rows (one segment, ``table.merge_segments(..., canonical=True)``) as msgpack-ready fields.

    Its ``index`` is not shipped: rank 0 orders a block's rows by rank, which is where a capture in
    rank order puts them. A pattern's ``rows`` are left out when it holds every row in order, its
    ``order`` when every row listed its functions as the pattern does."""
    m = seg.m
    ints = np.stack([seg.rank, seg.badp, seg.steps, seg.cap_step, seg.host_code, seg.stage.astype(np.int64)])
    floats = np.concatenate([seg.phases.T, seg.noise[None], seg.sched.T, np.stack([seg.tele[k] for k in TELEMETRY]),
                             seg.gc_count[None], seg.device.T]) if m else np.zeros((len(FLOAT_FIELDS), 0))
    pats = []
    for p in seg.pats:
        nk, k = len(p.names), len(p.rows)
        vals = pack_floats(np.stack(p.ms + p.cnt) if nk else np.zeros((0, k)))
        every = k == m and bool((p.rows == np.arange(m)).all())
        order = None
        if p.order is not None and not (p.order == np.arange(nk)[:, None]).all():
            order = np.ascontiguousarray(p.order + 1, dtype=np.uint8 if nk < 256 else "<u2").tobytes()   # 0: not listed
        # compressed on its own: rank 0 knows a list by these bytes and inflates only lists it has not seen
        pats.append({"keys": zlib.compress(msgpack.packb([p.names, p.phases, p.kinds], use_bin_type=True), ZLIB_LEVEL),
                     "rows": None if every else p.rows.astype("<i4").tobytes(),
                     "vals": vals, "order": order})
    return {
        "m": m, "ints": shuffle(ints), "floats": pack_floats(floats),
        "K": int(seg.comm.shape[1]), "comm": pack_floats(seg.comm.T), "ms": pack_floats(seg.ms.T),
        "cap_trigger": list(seg.cap_trigger), "hosts": list(seg.hosts), "pats": pats,
        "groups": [{"alike": g.alike, "gpos": g.gpos, "names": [str(t[0]) for t in g.tuples],
                    "ranks": [pack_array(np.asarray(t[1:], dtype=np.int64)) for t in g.tuples],
                    "code": pack_array(g.code)} for g in seg.groups],
        "throttle": [[int(k), list(v)] for k, v in sorted(seg.throttle.items())],
    }


@dataclass(frozen=True)
class Part:
    """One block's segment with its structure checked and its numbers still encoded: rank 0 checks
    and decodes the numbers of every block at once (``merge_parts``)."""

    who: str
    allowed: list[int]            # ranks the block may have rows of (received, not rejected)
    m: int
    ints: bytes                   # (len(INT_FIELDS), m) int64, shuffled
    floats: Cols                  # (len(FLOAT_FIELDS), m), pack_floats
    big_k: int                    # window steps
    comm: Cols                    # (K, m)
    ms: Cols | None               # (K, m) each step's time; None from a leader that did not ship it
    cap_trigger: list[str]
    hosts: list[str]
    # (keys, repeats, rows or None (all), values (2 * len(keys), k) as pack_floats, order, k)
    pats: list[tuple[tuple[FnKey, ...], bool, np.ndarray | None, Cols, np.ndarray | None, int]]
    groups: list[GroupCodes]
    throttle: dict[int, list[str]]



def parse_segment(who: str, doc: Any, world: int, allowed: list[int],
                  known: dict[bytes, tuple[tuple[FnKey, ...], bool]] | None = None) -> Part:
    """A block's segment fields, their structure checked (BlockError naming ``who``); the numbers'
    values are checked by ``check_parts``. ``known`` caches function lists already checked, by their
    bytes (a job's nodes share them: rank 0 neither decodes nor checks them again)."""
    if not isinstance(doc, dict):
        raise BlockError(f"{who}: a segment must be a map")
    need = ("m", "ints", "floats", "K", "comm", "cap_trigger", "hosts", "pats", "groups",
            "throttle")
    absent = [k for k in need if k not in doc]
    if absent:
        raise BlockError(f"{who}: a segment lacks {', '.join(absent)}")
    m, big_k = doc["m"], doc["K"]
    if not isinstance(m, int) or isinstance(m, bool) or not 0 <= m <= min(MAX_ROWS, len(allowed)):
        raise BlockError(f"{who}: a segment of {m!r} rows (at most one per rank it received)")
    if not isinstance(big_k, int) or isinstance(big_k, bool) or not 0 <= big_k <= MAX_STEPS_LISTED:
        raise BlockError(f"{who}: comm has {big_k!r} steps (at most {MAX_STEPS_LISTED})")
    ints = _shuffled(who, "ints", doc["ints"], len(INT_FIELDS) * m)
    floats = _floats(who, "floats", doc["floats"], len(FLOAT_FIELDS), m)
    comm = _floats(who, "comm", doc["comm"], big_k, m)
    ms = _floats(who, "ms", doc["ms"], big_k, m) if "ms" in doc else None
    cap_trigger = _strs(who, "cap_trigger", doc["cap_trigger"], limit=64)
    if len(cap_trigger) not in (1, m):
        raise BlockError(f"{who}: cap_trigger must hold one string or one per row")
    hosts = _strs(who, "hosts", doc["hosts"], limit=255)
    if not hosts and m:
        raise BlockError(f"{who}: a segment with rows names no host")
    raw_p = doc["pats"]
    if not isinstance(raw_p, list) or len(raw_p) > max(m, 1):
        raise BlockError(f"{who}: pats must be a list of at most one pattern per row")
    known = {} if known is None else known
    pats = []
    for j, p in enumerate(raw_p):
        what = f"pats[{j}]"
        if not isinstance(p, dict) or not {"keys", "rows", "vals", "order"} <= set(p):
            raise BlockError(f"{who}: {what} must be a map of keys, rows, vals, order")
        kb = p["keys"]
        cached = known.get(kb) if isinstance(kb, bytes) else None
        if cached is None:            # a function list not seen in this capture yet: check it
            try:
                z = zlib.decompressobj()
                raw = z.decompress(kb, MAX_BLOCK_BYTES) if isinstance(kb, bytes) else b""
                lists = msgpack.unpackb(raw, raw=False) if z.eof and not z.unconsumed_tail else None
            except Exception:
                lists = None
            if not isinstance(lists, list) or len(lists) != 3:
                raise BlockError(f"{who}: {what}.keys must be zlib of msgpack [names, phases, kinds]")
            names = _strs(who, f"{what}.names", lists[0])
            phases = _strs(who, f"{what}.phases", lists[1], len(names), 64)
            kinds = _strs(who, f"{what}.kinds", lists[2], len(names), 64)
            keys = tuple(zip(names, phases, kinds, strict=True))
            cached = known[kb] = (keys, len(set(keys)) != len(keys))
        keys, repeats = cached
        nk = len(keys)
        rows_b = p["rows"]
        if rows_b is None:
            rows, k = None, m
        elif isinstance(rows_b, bytes) and len(rows_b) % 4 == 0 and len(rows_b) <= 4 * m:
            rows = np.frombuffer(rows_b, dtype="<i4").astype(np.int64)
            k = len(rows)
        else:
            raise BlockError(f"{who}: {what}.rows must be nil or at most {m} int32 rows")
        vals = _floats(who, f"{what}.vals", p["vals"], 2 * nk, k)
        order_b = p["order"]
        order = None
        if order_b is not None:
            dt = np.dtype(np.uint8 if nk < 256 else "<u2")
            if not isinstance(order_b, bytes) or len(order_b) != nk * k * dt.itemsize:
                raise BlockError(f"{who}: {what}.order must be nil or {nk} x {k} positions")
            order = np.frombuffer(order_b, dtype=dt).reshape(nk, k).astype(np.int32) - 1
        pats.append((keys, repeats, rows, vals, order, k))
    groups = _groups(who, doc["groups"], m, world)
    throttle: dict[int, list[str]] = {}
    raw_t = doc["throttle"]
    if not isinstance(raw_t, list) or len(raw_t) > m:
        raise BlockError(f"{who}: throttle must be a list of [row, reasons]")
    for item in raw_t:
        if (not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], int)
                or isinstance(item[0], bool) or not 0 <= item[0] < m or item[0] in throttle):
            raise BlockError(f"{who}: throttle must be a list of [row, reasons] with distinct rows of the segment")
        throttle[item[0]] = _strs(who, "throttle reasons", item[1])
    return Part(who, allowed, m, ints, floats, big_k, comm, ms, cap_trigger, hosts, pats, groups, throttle)


def _by_part(parts: list[Part], offs: np.ndarray, bad_rows: np.ndarray) -> list[int]:
    """The parts that hold any of the rows ``bad_rows`` (a boolean mask over all rows)."""
    if not bad_rows.any():
        return []
    return sorted(set((np.searchsorted(offs, np.flatnonzero(bad_rows), side="right") - 1).tolist()))


def check_parts(parts: list[Part], world: int) -> dict[int, str]:
    """Every value check of the blocks' numbers at once: {part: one line naming its leader} for each
    block with a value out of range, a row of a rank it may not speak for, a rank twice, function
    patterns that do not cover its rows exactly once, or a row order that is not a permutation."""
    bad: dict[int, str] = {}

    def flag(rows: np.ndarray, what: str) -> None:
        for i in _by_part(parts, offs, rows):
            bad.setdefault(i, f"{parts[i].who}: {what}")

    offs = np.cumsum([0] + [p.m for p in parts])
    n = int(offs[-1])
    if not n:
        return bad
    part_of = np.repeat(np.arange(len(parts)), [p.m for p in parts])
    ints = unshuffle_many([p.ints for p in parts], len(INT_FIELDS), [p.m for p in parts])
    rank, badp, steps, cap_step, host_code, stage = ints
    nhost = np.asarray([len(p.hosts) for p in parts], dtype=np.int64)[part_of]
    for name, v, lo, hi in (("rank", rank, 0, world - 1), ("badp", badp, -1, len(PHASES) - 1),
                            ("steps", steps, 0, MAX_STEPS_LISTED), ("cap_step", cap_step, -1, 2 ** 53),
                            ("stage", stage, -1, MAX_WORLD)):
        flag((v < lo) | (v > hi), f"{name} has values outside [{lo}, {hi}]")
    flag((host_code < 0) | (host_code >= nhost), "host_code names a host it does not list")
    owner = np.full(world, -1, dtype=np.int64)
    for i, p in enumerate(parts):
        owner[p.allowed] = i
    ok_rank = (rank >= 0) & (rank < world)
    mine = ok_rank & (owner[np.where(ok_rank, rank, 0)] == part_of)
    flag(ok_rank & ~mine, "rows of ranks it does not list as received and accepted")
    # blocks speak for disjoint ranks (the caller's check): a rank twice among rows a block may
    # have is twice in that block, never one block's row blamed on another
    srt = np.flatnonzero(mine)[np.argsort(rank[mine], kind="stable")]
    dup = np.zeros(n, dtype=bool)
    dup[srt[1:][rank[srt][1:] == rank[srt][:-1]]] = True
    flag(dup, "a rank has two rows")
    seen = np.zeros(n, dtype=np.int64)
    orders: dict[int, list[tuple[int, np.ndarray]]] = {}     # by list length: (part, order) to check at once
    for i, p in enumerate(parts):
        o = int(offs[i])
        for _, _, rows, _, order, _ in p.pats:
            if rows is None:
                seen[o:o + p.m] += 1
            elif len(rows):
                if int(rows.min()) < 0 or int(rows.max()) >= p.m:
                    bad.setdefault(i, f"{p.who}: a pattern's rows are not rows of the segment")
                    continue
                np.add.at(seen, rows + o, 1)
            if order is not None and order.size:
                orders.setdefault(len(order), []).append((i, order))
    for nk, got in orders.items():          # each row: the functions it listed at places 0..c-1
        allo = np.concatenate([x for _, x in got], axis=1)
        absent = (allo < 0).sum(axis=0)
        want = np.maximum(np.arange(nk, dtype=np.int64)[:, None] - absent[None, :], -1)
        wrong = (np.sort(allo, axis=0) != want).any(axis=0)
        if wrong.any():
            owner_col = np.repeat([i for i, _ in got], [x.shape[1] for _, x in got])
            for i in sorted(set(owner_col[wrong].tolist())):
                bad.setdefault(i, f"{parts[i].who}: a pattern's order is not each row's list of its functions")
    flag(seen != 1, "the function patterns do not cover every row exactly once")
    return bad


def _per_step(parts: list[Part], get: Callable[[Part], Cols | None], n: int, width: int, offs: np.ndarray,
              counts: list[int]) -> np.ndarray:
    """One per-step matrix (n, width) of every part's rows, decoded with one pass per step count; NaN
    for the steps of parts that shipped none."""
    out = np.full((n, width), np.nan)
    by_k: dict[int, list[int]] = {}
    for i, p in enumerate(parts):
        if get(p) is not None:
            by_k.setdefault(p.big_k, []).append(i)
    for big_k, idx in by_k.items():
        if not big_k:
            continue
        sub = decode_many([get(parts[i]) for i in idx], big_k, [counts[i] for i in idx])
        if len(idx) == len(parts):
            out[:, :big_k] = sub.T
        else:
            out[np.concatenate([np.arange(offs[i], offs[i + 1]) for i in idx]), :big_k] = sub.T
    return out


def merge_parts(parts: list[Part]) -> Segment:
    """One Segment of every row of ``parts`` (checked by ``check_parts``), the rows' index their rank:
    the numbers decoded with one pass per matrix, the function patterns concatenated per function
    list (``table.merge_segments``' result, from encoded columns)."""
    offs = np.cumsum([0] + [p.m for p in parts])
    n = int(offs[-1])
    counts = [p.m for p in parts]
    ints = unshuffle_many([p.ints for p in parts], len(INT_FIELDS), counts)
    floats = decode_many([p.floats for p in parts], len(FLOAT_FIELDS), counts)
    width = max((p.big_k for p in parts), default=0)
    comm = _per_step(parts, lambda p: p.comm, n, width, offs, counts)
    ms = _per_step(parts, lambda p: p.ms, n, width, offs, counts)
    trig = {t for p in parts for t in p.cap_trigger}
    cap_trigger = list(trig) if len(trig) == 1 and all(len(p.cap_trigger) == 1 for p in parts) else \
        [t for p in parts for t in (p.cap_trigger if len(p.cap_trigger) == p.m else p.cap_trigger * p.m)]
    hosts = [h for p in parts for h in p.hosts]
    hbase = np.repeat(np.cumsum([0] + [len(p.hosts) for p in parts])[:-1], counts)
    by_keys: dict[tuple[FnKey, ...], list[tuple[int, Any]]] = {}
    for i, p in enumerate(parts):
        for pat in p.pats:
            by_keys.setdefault(pat[0], []).append((i, pat))
    pats = []
    for keys, members in by_keys.items():
        nk = len(keys)
        rows = np.concatenate([(np.arange(parts[i].m) if pat[2] is None else pat[2]) + offs[i] for i, pat in members])
        sizes = [pat[5] for _, pat in members]
        vals = decode_many([pat[3] for _, pat in members], 2 * nk, sizes)
        order = None
        if any(pat[4] is not None for _, pat in members):
            order = np.concatenate([pat[4] if pat[4] is not None else np.repeat(
                np.arange(nk, dtype=np.int32)[:, None], s, axis=1) for (_, pat), s in zip(members, sizes, strict=True)],
                axis=1)
        pats.append(FnPattern([k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys], rows,
                              list(vals[:nk]), list(vals[nk:]), members[0][1][1], order))
    plain = [p for p in pats if not p.repeats]
    if len(plain) > UNION_ABOVE:          # nodes with lists of their own: finish costs per pattern
        pats = [union_patterns(plain)] + [p for p in pats if p.repeats]
    groups_by: dict[tuple[int, bool], tuple[dict[tuple[Any, ...], int], np.ndarray]] = {}
    for i, p in enumerate(parts):
        o = int(offs[i])
        for g in p.groups:
            known, code = groups_by.setdefault((g.gpos, g.alike), ({}, np.full(n, -1, dtype=np.int64)))
            remap = np.asarray([known.setdefault(t, len(known)) for t in g.tuples] + [-1], dtype=np.int64)
            code[o:o + p.m] = remap[g.code]
    rank = ints[0].copy()
    return Segment(
        index=rank.copy(), rank=rank, badp=ints[1].copy(), phases=np.ascontiguousarray(floats[_PH].T),
        steps=ints[2].copy(), noise=floats[_NOISE].copy(), sched=np.ascontiguousarray(floats[_SCHED].T), comm=comm, ms=ms,
        cap_step=ints[3].copy(), cap_trigger=cap_trigger, hosts=hosts, host_code=ints[4] + hbase, pats=pats,
        stage=ints[5].astype(np.int32),
        groups=[GroupCodes(alike, gpos, list(known), code) for (gpos, alike), (known, code) in groups_by.items()],
        tele={k: floats[_TELE0 + j].copy() for j, k in enumerate(TELEMETRY)},
        throttle={int(loc + offs[i]): v for i, p in enumerate(parts) for loc, v in p.throttle.items()},
        gc_count=floats[_GC].copy(), device=np.ascontiguousarray(floats[_DEV].T))


def _groups(who: str, docs: Any, m: int, world: int) -> list[GroupCodes]:
    """The recorded groups of a segment: distinct rank lists and each row's code into them."""
    if not isinstance(docs, list) or len(docs) > MAX_LIST:
        raise BlockError(f"{who}: groups must be a list")
    out: list[GroupCodes] = []
    for j, g in enumerate(docs):
        what = f"groups[{j}]"
        if (not isinstance(g, dict) or not isinstance(g.get("alike"), bool) or not isinstance(g.get("gpos"), int)
                or isinstance(g.get("gpos"), bool) or not 0 <= g["gpos"] < MAX_LIST
                or not isinstance(g.get("ranks"), list) or "code" not in g):
            raise BlockError(f"{who}: {what} must be a map of alike, gpos, names, ranks, code")
        names = _strs(who, f"{what}.names", g.get("names"), len(g["ranks"]), 255)
        tuples = []
        for k, (name, r) in enumerate(zip(names, g["ranks"], strict=True)):
            ranks = _ints_in(who, f"{what}.ranks[{k}]", unpack_array(who, f"{what}.ranks[{k}]", r, "<i8", (None,)),
                             0, world - 1)
            if not len(ranks):
                raise BlockError(f"{who}: {what}.ranks[{k}] is empty")
            tuples.append((name, *ranks.tolist()))
        code = _ints_in(who, f"{what}.code", unpack_array(who, f"{what}.code", g["code"], "<i8", (m,)),
                        -1, len(tuples) - 1)
        out.append(GroupCodes(g["alike"], g["gpos"], tuples, code))   # type: ignore[arg-type]
    return out


# ---- the envelope ------------------------------------------------------------------------------------------

def seal(body: dict[str, Any]) -> bytes:
    """A block's fields as the bytes a leader sends: {schema, codec, crc32, body: zlib(msgpack)}."""
    raw = msgpack.packb(body, use_bin_type=True)
    packed = zlib.compress(raw, ZLIB_LEVEL)
    return msgpack.packb({"schema": BLOCK_SCHEMA, "codec": "zlib", "crc32": zlib.crc32(raw), "body": packed},
                         use_bin_type=True)


def unseal(who: str, data: Any) -> dict[str, Any]:
    """A block's fields from ``seal``'s bytes; BlockError (one line naming ``who``) when the bytes are
    not a block of this version, are damaged, or expand beyond MAX_BLOCK_BYTES."""
    if not isinstance(data, (bytes, bytearray)):
        raise BlockError(f"{who}: a block must be bytes, got {type(data).__name__}")
    try:
        env = msgpack.unpackb(data, raw=False, strict_map_key=False, max_bin_len=MAX_BLOCK_BYTES)
    except Exception as exc:
        raise BlockError(f"{who}: not valid msgpack ({type(exc).__name__})") from None
    if not isinstance(env, dict) or env.get("schema") != BLOCK_SCHEMA:
        got = env.get("schema") if isinstance(env, dict) else type(env).__name__
        raise BlockError(f"{who}: unsupported block schema {got!r} (expected {BLOCK_SCHEMA!r})"[:300])
    body, crc = env.get("body"), env.get("crc32")
    if env.get("codec") not in ("zlib", "none") or not isinstance(body, bytes) or not isinstance(crc, int):
        raise BlockError(f"{who}: block envelope must hold codec zlib|none, crc32 and body bytes")
    if env["codec"] == "zlib":
        try:
            z = zlib.decompressobj()
            raw = z.decompress(body, MAX_BLOCK_BYTES)
            if z.unconsumed_tail or not z.eof:
                raise BlockError(f"{who}: block body is truncated or expands beyond {MAX_BLOCK_BYTES} bytes")
        except zlib.error as exc:
            raise BlockError(f"{who}: block body does not decompress ({exc})") from None
    else:
        raw = body
    if zlib.crc32(raw) != crc:
        raise BlockError(f"{who}: block body fails its CRC-32 check (damaged)")
    try:
        doc = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception as exc:
        raise BlockError(f"{who}: block body is not valid msgpack ({type(exc).__name__})") from None
    if not isinstance(doc, dict):
        raise BlockError(f"{who}: block body must be a map")
    return doc
