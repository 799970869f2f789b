"""A node's rows as bytes: TableBuilder segments <-> one versioned, validated msgpack column block.

Why: a node leader decodes and validates its node's summaries into the engine's columns
(engine/blocks.py) and forwards those columns instead of ~12 KB of msgpack per rank; rank 0 adds
the decoded segments to its TableBuilder (``add_segment``). The format is msgpack only (never
pickle): every numpy array is a map ``{"dtype", "shape", "data": bin}`` (or ``"fill": bin`` of one
element when every element is the same bits: a CPU job's device columns are all NaN; or, for
float64 numbers that are decimals of at most 4 places, as the summary builder rounds them,
``"dec": places, "idtype", "data"``: the integers n with value = n / 10**places, which give the very
same bits back and compress to a fraction of the floats), and the whole body is zlib-compressed
with its CRC-32 in the envelope. Every field is checked on decode (names,
types, dtypes, shapes, ranges, that the pattern rows partition the segment, that the ranks are the
block's): a corrupt or foreign block raises ``BlockError`` with one line naming the leader and what
is wrong, and spoils only that node. Pure: no MPI, no torch.
"""

from __future__ import annotations

import zlib
from typing import Any

import msgpack
import numpy as np

from eroica_runtime.engine.table import (
    _GPU_GAUGES,
    _HOST_COUNTERS,
    DEVICE_COLUMNS,
    SCHED_COLUMNS,
    FnPattern,
    GroupCodes,
    Segment,
)
from eroica_runtime.summary import PHASES
from eroica_runtime.summary.schema import MAX_NAME, MAX_STEPS_LISTED, MAX_WORLD

BLOCK_SCHEMA = "eroica.block/1"
MAX_BLOCK_BYTES = 256 << 20       # one node's block, decompressed (a node of 64 ranks is ~1 MB)
MAX_ROWS = 1 << 16                # ranks a node leader may speak for
MAX_LIST = 1 << 16                # segments, patterns, functions, groups, hosts in one block
ZLIB_LEVEL = 1                    # measured: level 1 is ~as small as 6 on these columns, 3x faster
DECIMALS = (0, 4)                 # places tried: counts, and summary.build's round(x, 4) (fewer are included)
TELEMETRY = _HOST_COUNTERS + _GPU_GAUGES


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


# ---- segments ----------------------------------------------------------------------------------------------

def pack_segment(seg: Segment) -> dict[str, Any]:
    """One TableBuilder segment as msgpack-ready fields (its ``index`` is not shipped: rank 0 orders
    a block's rows by rank, which is where a capture in rank order puts them). Function names are
    listed per pattern: zlib finds the repeats (a table of names by index measured no smaller)."""
    pats = [{"names": p.names, "phases": p.phases, "kinds": p.kinds, "rows": pack_array(p.rows),
             "ms": pack_array(np.stack(p.ms) if p.ms else np.zeros((0, len(p.rows)))),
             "cnt": pack_array(np.stack(p.cnt) if p.cnt else np.zeros((0, len(p.rows))))} for p in seg.pats]
    return {
        "pats": pats, "rank": pack_array(seg.rank), "badp": pack_array(seg.badp), "phases": pack_array(seg.phases),
        "steps": pack_array(seg.steps), "noise": pack_array(seg.noise), "sched": pack_array(seg.sched),
        "comm": pack_array(seg.comm), "cap_step": pack_array(seg.cap_step), "cap_trigger": list(seg.cap_trigger),
        "hosts": list(seg.hosts), "host_code": pack_array(seg.host_code), "stage": pack_array(seg.stage),
        "groups": [{"alike": g.alike, "gpos": g.gpos, "names": [str(t[0]) for t in g.tuples],
                    "ranks": [pack_array(np.asarray(t[1:], dtype=np.int64)) for t in g.tuples],
                    "code": pack_array(g.code)} for g in seg.groups],
        "tele": {k: pack_array(seg.tele[k]) for k in TELEMETRY},
        "throttle": [[int(k), list(v)] for k, v in sorted(seg.throttle.items())],
        "gc_count": pack_array(seg.gc_count), "device": pack_array(seg.device),
    }


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


def unpack_segment(who: str, doc: Any, world: int) -> Segment:
    """A segment from ``pack_segment``'s fields, every field checked (BlockError naming ``who``)."""
    if not isinstance(doc, dict):
        raise BlockError(f"{who}: a segment must be a map")
    need = ("rank", "badp", "phases", "steps", "noise", "sched", "comm", "cap_step", "cap_trigger", "hosts",
            "host_code", "pats", "stage", "groups", "tele", "throttle", "gc_count", "device")
    absent = [k for k in need if k not in doc]
    if absent:
        raise BlockError(f"{who}: a segment lacks {', '.join(absent)}")

    def arr(key: str, dtype: str, *shape: int | None) -> np.ndarray:
        return unpack_array(who, key, doc[key], dtype, shape)

    rank = arr("rank", "<i8", None)
    m = len(rank)
    if m > MAX_ROWS:
        raise BlockError(f"{who}: a segment of {m} rows (at most {MAX_ROWS})")
    _ints_in(who, "rank", rank, 0, world - 1)
    badp = _ints_in(who, "badp", arr("badp", "<i8", m), -1, len(PHASES) - 1)
    steps = _ints_in(who, "steps", arr("steps", "<i8", m), 0, MAX_STEPS_LISTED)
    comm = arr("comm", "<f8", m, None)
    if comm.shape[1] > MAX_STEPS_LISTED:
        raise BlockError(f"{who}: comm has {comm.shape[1]} steps (at most {MAX_STEPS_LISTED})")
    cap_trigger = _strs(who, "cap_trigger", doc["cap_trigger"], limit=64)
    if len(cap_trigger) not in (1, m):
        raise BlockError(f"{who}: cap_trigger must hold one string or one per row")
    hosts = _strs(who, "hosts", doc["hosts"], limit=255)
    if not hosts and m:
        raise BlockError(f"{who}: a segment with rows names no host")
    host_code = _ints_in(who, "host_code", arr("host_code", "<i8", m), 0, len(hosts) - 1)
    pats = _patterns(who, doc["pats"], m)
    groups = _groups(who, doc["groups"], m, world)
    tele_doc = doc["tele"]
    if not isinstance(tele_doc, dict) or sorted(tele_doc) != sorted(TELEMETRY):
        raise BlockError(f"{who}: tele must hold exactly {', '.join(TELEMETRY)}")
    tele = {k: unpack_array(who, f"tele.{k}", tele_doc[k], "<f8", (m,)) for k in TELEMETRY}
    throttle: dict[int, list[str]] = {}
    raw_t = doc["throttle"]
    if not isinstance(raw_t, list) or len(raw_t) > m:
        raise BlockError(f"{who}: throttle must be a list of [row, reasons]")
    for item in raw_t:
        if (not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], int)
                or isinstance(item[0], bool) or not 0 <= item[0] < m or item[0] in throttle):
            raise BlockError(f"{who}: throttle must be a list of [row, reasons] with distinct rows of the segment")
        throttle[item[0]] = _strs(who, "throttle reasons", item[1])
    return Segment(
        index=rank.copy(), rank=rank, badp=badp, phases=arr("phases", "<f8", m, len(PHASES)), steps=steps,
        noise=arr("noise", "<f8", m), sched=arr("sched", "<f8", m, len(SCHED_COLUMNS)), comm=comm,
        cap_step=_ints_in(who, "cap_step", arr("cap_step", "<i8", m), -1, 2**53), cap_trigger=cap_trigger,
        hosts=hosts, host_code=host_code, pats=pats,
        stage=_ints_in(who, "stage", arr("stage", "<i4", m), -1, MAX_WORLD), groups=groups, tele=tele,
        throttle=throttle, gc_count=arr("gc_count", "<f8", m), device=arr("device", "<f8", m, len(DEVICE_COLUMNS)))


def _patterns(who: str, docs: Any, m: int) -> list[FnPattern]:
    """The function patterns of a segment: every row in exactly one."""
    if not isinstance(docs, list) or len(docs) > max(m, 1):
        raise BlockError(f"{who}: pats must be a list of at most one pattern per row")
    out: list[FnPattern] = []
    seen = np.zeros(m, dtype=np.int64)
    for j, p in enumerate(docs):
        what = f"pats[{j}]"
        if not isinstance(p, dict) or not {"names", "phases", "kinds", "rows", "ms", "cnt"} <= set(p):
            raise BlockError(f"{who}: {what} must be a map of names, phases, kinds, rows, ms, cnt")
        names = _strs(who, f"{what}.names", p["names"])
        phases = _strs(who, f"{what}.phases", p["phases"], len(names), 64)
        kinds = _strs(who, f"{what}.kinds", p["kinds"], len(names), 64)
        rows = _ints_in(who, f"{what}.rows", unpack_array(who, f"{what}.rows", p["rows"], "<i8", (None,)), 0, m - 1)
        ms = unpack_array(who, f"{what}.ms", p["ms"], "<f8", (len(names), len(rows)))
        cnt = unpack_array(who, f"{what}.cnt", p["cnt"], "<f8", (len(names), len(rows)))
        np.add.at(seen, rows, 1)
        keys = list(zip(names, phases, kinds, strict=True))
        out.append(FnPattern(names, phases, kinds, rows, list(ms), list(cnt), len(set(keys)) != len(keys)))
    if m and not (seen == 1).all():
        raise BlockError(f"{who}: the function patterns do not cover every row exactly once")
    return out


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
