"""Summary layouts: check and read many summaries that share one msgpack layout at once, as columns.

Why: decoding a 100,000-rank capture one summary at a time into Python dicts and walking every
field costs ~0.5 ms a summary (msgpack builds ~1,500 objects, ``validate`` checks ~800 numbers),
minutes in all, and holding the dicts takes gigabytes. Summaries of one job mostly share their
*layout*: the same keys, strings, list lengths and msgpack type bytes in the same order, differing
only in their numbers (and host or device strings). Two summaries with one layout have the same
length and equal bytes everywhere except in the payloads of those values (the *slots*), because
msgpack is a prefix-free encoding whose every token's size follows from its type byte.

A ``Layout`` is derived from one summary that passed ``schema.validate`` (the *representative*). For
every other summary of the same length numpy then checks, many rows at once, that every fixed byte
equals the representative's (so the structure, every key, every string and every type is the one
that was validated) and reads every slot as a column; each slot is then checked with the rule
``validate`` applies at its path (a phase or a per-call time: finite and in [0, 10^7]; ``rank``
below the row's ``world_size``; a telemetry number finite; ...). The rules are a *sufficient*
condition: a row that fails any of them is handed back to the caller, which decodes it one at a
time with ``schema.decode`` and gets the exact verdict and one-line message. So a summary is never
accepted here that ``validate`` would reject, and a rejected one is named exactly as before.

Pure: msgpack bytes in, numpy arrays out; no MPI, no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from eroica_runtime.summary.schema import (
    HISTORY_COLUMNS,
    HISTORY_OPTIONAL,
    MAX_COUNT,
    MAX_MS,
    MAX_NAME,
    MAX_PYTHON_SAMPLES,
    MAX_STEPS_LISTED,
    MAX_WORLD,
    PHASES,
    STEP_EXTRAS,
)

Path = tuple[Any, ...]

# msgpack type byte -> (numpy dtype of the payload, payload bytes)
_FIXED: dict[int, tuple[str, int]] = {
    0xCA: (">f4", 4), 0xCB: (">f8", 8), 0xCC: ("u1", 1), 0xCD: (">u2", 2), 0xCE: (">u4", 4), 0xCF: (">u8", 8),
    0xD0: ("i1", 1), 0xD1: (">i2", 2), 0xD2: (">i4", 4), 0xD3: (">i8", 8),
}
_FIXEXT = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}
_MAX_DEPTH = 32
_EXACT = float(2**53)        # integers above it do not survive a float64 column exactly

# slot rules (what ``validate`` asks of the value at the slot's path)
R_FINITE, R_MS, R_INT, R_RANK, R_ANY = range(5)


class Unsupported(Exception):
    """This summary's bytes cannot be turned into a layout (the caller decodes it one at a time)."""


@dataclass(frozen=True)
class Slot:
    """One value whose payload may differ between summaries of a layout."""

    path: Path
    dtype: str          # numpy dtype of the payload; "str" for a string's bytes
    offset: int         # first payload byte (for a fixint, its type byte)
    width: int
    fix: int = 0        # +1 positive fixint (byte < 0x80), -1 negative fixint (byte >= 0xe0)


def _str_slot_limit(path: Path) -> int | None:
    """Strings that differ from rank to rank (host, GPU uuid/name) are slots; all others are fixed."""
    if path == ("host",):
        return 255
    if len(path) == 2 and path[0] == "device":
        return MAX_NAME
    return None


def _scan(buf: bytes, p: int, path: Path, out: list[Slot], depth: int) -> int:
    """Walk one msgpack value at ``p``; append its slots; return the offset after it."""
    if depth > _MAX_DEPTH:
        raise Unsupported("nested too deeply")
    t = buf[p]
    if t < 0x80:
        out.append(Slot(path, "u1", p, 1, fix=1))
        return p + 1
    if t >= 0xE0:
        out.append(Slot(path, "i1", p, 1, fix=-1))
        return p + 1
    if t <= 0x8F:
        return _scan_map(buf, p + 1, t & 0x0F, path, out, depth)
    if t <= 0x9F:
        return _scan_array(buf, p + 1, t & 0x0F, path, out, depth)
    if t <= 0xBF:
        return _scan_str(buf, p + 1, t & 0x1F, path, out)
    if t in (0xC0, 0xC2, 0xC3):
        return p + 1
    fixed = _FIXED.get(t)
    if fixed is not None:
        out.append(Slot(path, fixed[0], p + 1, fixed[1]))
        return p + 1 + fixed[1]
    if t in (0xD9, 0xDA, 0xDB):
        w = {0xD9: 1, 0xDA: 2, 0xDB: 4}[t]
        return _scan_str(buf, p + 1 + w, int.from_bytes(buf[p + 1:p + 1 + w], "big"), path, out)
    if t in (0xC4, 0xC5, 0xC6):          # bin: fixed bytes
        w = {0xC4: 1, 0xC5: 2, 0xC6: 4}[t]
        return _end(buf, p + 1 + w + int.from_bytes(buf[p + 1:p + 1 + w], "big"))
    if t in (0xC7, 0xC8, 0xC9):          # ext: fixed bytes
        w = {0xC7: 1, 0xC8: 2, 0xC9: 4}[t]
        return _end(buf, p + 2 + w + int.from_bytes(buf[p + 1:p + 1 + w], "big"))
    if t in _FIXEXT:
        return _end(buf, p + 2 + _FIXEXT[t])
    if t in (0xDC, 0xDD):
        w = 2 if t == 0xDC else 4
        return _scan_array(buf, p + 1 + w, int.from_bytes(buf[p + 1:p + 1 + w], "big"), path, out, depth)
    if t in (0xDE, 0xDF):
        w = 2 if t == 0xDE else 4
        return _scan_map(buf, p + 1 + w, int.from_bytes(buf[p + 1:p + 1 + w], "big"), path, out, depth)
    raise Unsupported(f"type byte 0x{t:02x}")


def _end(buf: bytes, p: int) -> int:
    if p > len(buf):
        raise Unsupported("truncated")
    return p


def _scan_str(buf: bytes, p: int, n: int, path: Path, out: list[Slot]) -> int:
    end = _end(buf, p + n)
    limit = _str_slot_limit(path)
    if limit is not None and n <= limit:
        out.append(Slot(path, "str", p, n))
    return end


def _scan_array(buf: bytes, p: int, n: int, path: Path, out: list[Slot], depth: int) -> int:
    for i in range(n):
        p = _scan(buf, p, (*path, i), out, depth + 1)
    return p


def _key(buf: bytes, p: int) -> tuple[Any, int]:
    """A map key (a string or an integer, as msgpack decodes it); keys are always fixed bytes."""
    t = buf[p]
    if 0xA0 <= t <= 0xBF or t in (0xD9, 0xDA, 0xDB):
        w = 0 if t >= 0xA0 and t <= 0xBF else {0xD9: 1, 0xDA: 2, 0xDB: 4}[t]
        n = t & 0x1F if w == 0 else int.from_bytes(buf[p + 1:p + 1 + w], "big")
        start = p + 1 + w
        end = _end(buf, start + n)
        try:
            return buf[start:end].decode("utf-8"), end
        except UnicodeDecodeError:
            raise Unsupported("key is not UTF-8") from None
    if t < 0x80:
        return t, p + 1
    if t >= 0xE0:
        return t - 0x100, p + 1
    fixed = _FIXED.get(t)
    if fixed is not None and not fixed[0].startswith(">f"):
        end = _end(buf, p + 1 + fixed[1])
        return int(np.frombuffer(buf, dtype=fixed[0], count=1, offset=p + 1)[0]), end
    raise Unsupported("map key is neither a string nor an integer")


def _scan_map(buf: bytes, p: int, n: int, path: Path, out: list[Slot], depth: int) -> int:
    seen: set[Any] = set()
    for _ in range(n):
        key, p = _key(buf, p)
        if key in seen:                  # a repeated key: msgpack keeps the last one; not worth a layout
            raise Unsupported("repeated key")
        seen.add(key)
        p = _scan(buf, p, (*path, key), out, depth + 1)
    return p


def lookup(doc: Any, path: Path, default: Any = None) -> Any:
    """The value at ``path`` inside a decoded summary (``default`` when a step of it is absent)."""
    cur = doc
    for k in path:
        if isinstance(cur, dict):
            if k not in cur:
                return default
            cur = cur[k]
        elif isinstance(cur, list) and isinstance(k, int) and 0 <= k < len(cur):
            cur = cur[k]
        else:
            return default
    return cur


def rule(path: Path) -> tuple[int, float, float]:
    """The check ``schema.validate`` makes of a number at ``path``: (kind, lo, hi).

    R_MS: a number in [lo, hi]; R_INT: an integer in [lo, hi]; R_RANK: an integer rank of the row's
    world; R_ANY: any integer (``pid``); R_FINITE: any finite number (telemetry, versions, device,
    profile, and numbers ``validate`` does not look at: being stricter there only sends a row to
    the one-at-a-time path, which then accepts it).
    """
    n = len(path)
    top = path[0] if n else None
    if n == 1:
        if top == "rank":
            return R_RANK, 0.0, 0.0
        if top == "local_rank":
            return R_INT, 0.0, float(MAX_WORLD)
        if top == "world_size":
            return R_INT, 1.0, float(MAX_WORLD)
        if top == "pid":
            return R_ANY, 0.0, 0.0
    elif n == 2:
        if top == "phases" and path[1] in PHASES:
            return R_MS, 0.0, MAX_MS
        if top == "gc" and path[1] in ("count", "ms"):
            return R_MS, 0.0, MAX_COUNT if path[1] == "count" else MAX_MS
        if top == "capture" and path[1] == "step":
            return R_INT, 0.0, _EXACT
        if top == "capture" and path[1] == "k":
            return R_INT, 0.0, float(MAX_STEPS_LISTED)
        if top == "device_phases":
            return R_MS, 0.0, MAX_COUNT * 1e3
        if top == "history" and path[1] == "first":
            return R_INT, 0.0, _EXACT
        if top == "python" and path[1] == "samples":
            return R_INT, 0.0, float(MAX_PYTHON_SAMPLES)
        if top == "python" and path[1] == "ms":
            return R_MS, 0.0, MAX_MS
    elif n == 3:
        if top == "functions" and isinstance(path[1], int):
            if path[2] == "count":
                return R_MS, 0.0, MAX_COUNT
            if path[2] in ("ms", "mean", "p50", "p90", "p99", "max", "std"):
                return R_MS, 0.0, MAX_MS
        if top == "steps" and isinstance(path[1], int):
            if path[2] == "step":
                return R_INT, 0.0, _EXACT
            if path[2] == "ms" or path[2] in STEP_EXTRAS:
                return R_MS, 0.0, MAX_MS
        if top == "history" and isinstance(path[2], int):
            if path[1] in HISTORY_COLUMNS:
                return R_MS, 0.0, MAX_MS
            if path[1] in HISTORY_OPTIONAL:
                return R_MS, 0.0, MAX_COUNT
    elif n == 4 and top == "groups" and path[2] == "ranks":
        return R_RANK, 0.0, 0.0
    elif n == 4 and top == "python" and path[1] == "frames" and path[3] == 1:
        return R_MS, 0.0, MAX_MS
    return R_FINITE, -np.inf, np.inf


@dataclass
class Rows:
    """Summaries of one length, laid out ``stride`` bytes apart in ``buf`` from ``start`` (a view
    of the capture's bytes when they sit evenly spaced there, else a packed copy)."""

    buf: np.ndarray      # 1-D uint8
    start: int
    stride: int
    m: int

    def col(self, offset: int, dtype: str) -> np.ndarray:
        """The value of dtype ``dtype`` at byte ``offset`` of every row."""
        return np.ndarray((self.m,), dtype=dtype, buffer=self.buf, offset=self.start + offset,
                          strides=(self.stride,))

    def block(self, offset: int, width: int, dtype: str = "u1") -> np.ndarray:
        """(m, width) items of ``dtype`` from byte ``offset`` of every row."""
        size = np.dtype(dtype).itemsize
        return np.ndarray((self.m, width), dtype=dtype, buffer=self.buf, offset=self.start + offset,
                          strides=(self.stride, size))


@dataclass
class Layout:
    """A validated summary's byte layout: its fixed bytes and its slots, each with its rule."""

    size: int
    doc: dict[str, Any]                   # the representative, decoded (structure and fixed values)
    slots: list[Slot]
    numeric: list[int] = field(default_factory=list)    # indices into slots
    strings: list[int] = field(default_factory=list)
    _words: np.ndarray | None = None      # fixed bytes as little-endian uint64 words (slot bytes 0)
    _wmask: np.ndarray | None = None
    _tail: np.ndarray | None = None
    _tmask: np.ndarray | None = None
    _kind: np.ndarray | None = None       # per numeric slot: rule kind, lo, hi
    _lo: np.ndarray | None = None
    _hi: np.ndarray | None = None
    _wide_int: np.ndarray | None = None   # numeric slots holding 8-byte integers with an R_INT/R_RANK rule
    _world: int = -1                      # index (into numeric) of world_size
    _bounds: tuple[int, ...] = ()         # where each check class starts in numeric (see _prepare)
    _keep_cache: dict[Any, tuple[list[int], list[Path]]] = field(default_factory=dict)
    _group_max: int = 0                   # the longest recorded group's rank count
    index: dict[Path, int] = field(default_factory=dict)   # path -> index into numeric
    matched: int = 0

    @staticmethod
    def derive(blob: bytes, doc: dict[str, Any]) -> Layout:
        """The layout of ``blob``, whose decoded and validated form is ``doc``; Unsupported if none."""
        slots: list[Slot] = []
        try:
            end = _scan(blob, 0, (), slots, 0)
        except IndexError:
            raise Unsupported("truncated") from None
        if end != len(blob):
            raise Unsupported("trailing bytes")
        lay = Layout(size=len(blob), doc=doc, slots=slots)
        lay._prepare(blob)
        return lay

    def _prepare(self, blob: bytes) -> None:
        size = self.size
        tpl = np.frombuffer(blob, dtype=np.uint8).copy()
        var = np.zeros(size, dtype=bool)
        for s in self.slots:
            var[s.offset:s.offset + s.width] = True
        tpl[var] = 0
        nw = size // 8
        self._words = tpl[:nw * 8].view("<u8").copy()
        self._wmask = np.where(var, 0, 0xFF).astype(np.uint8)[:nw * 8].view("<u8").copy()
        self._tail = tpl[nw * 8:].copy()
        self._tmask = ~var[nw * 8:]
        entries: list[tuple[int, int, int, float, float]] = []    # (check class, slot, kind, lo, hi)
        one = Rows(np.frombuffer(blob, dtype=np.uint8), 0, size, 1)
        for i, s in enumerate(self.slots):
            if s.dtype == "str":
                self.strings.append(i)
                try:
                    blob[s.offset:s.offset + s.width].decode("utf-8")
                except UnicodeDecodeError:
                    raise Unsupported("string slot is not UTF-8") from None
                continue
            want = lookup(self.doc, s.path, default=_MISSING)
            got = one.col(s.offset, s.dtype)[0]
            # the walk above must read the bytes as msgpack did: same value at the same path
            if isinstance(want, bool) or not isinstance(want, (int, float)) or not _same(got, want):
                raise Unsupported(f"slot {s.path!r} does not match the decoded summary")
            k, lo, hi = rule(s.path)
            if k in (R_INT, R_RANK) and not isinstance(want, int):
                raise Unsupported(f"{s.path!r}: expected an integer")
            # check classes, so ``read`` checks contiguous rows of its value matrix: bounded values
            # (NaN and inf fail the bounds), then floats that need only be finite, then integers
            # with nothing to check (always finite), then ranks (below the row's world size)
            if k in (R_MS, R_INT):
                cls = 0
            elif k == R_FINITE and s.dtype.startswith(">f"):
                cls = 1
            elif k == R_RANK:
                cls = 3
            else:
                cls = 2
            entries.append((cls, i, k, lo, hi))
        entries.sort(key=lambda e: e[0])        # stable: slot order within a class
        wide = []
        for pos, (_, i, k, _lo, _hi) in enumerate(entries):
            s = self.slots[i]
            self.index[s.path] = pos
            self.numeric.append(i)
            wide.append(k in (R_INT, R_RANK) and s.width == 8)
            if s.path == ("world_size",):
                self._world = pos
        if self._world < 0:
            raise Unsupported("no world_size slot")
        classes = [e[0] for e in entries]
        self._bounds = tuple(int(np.searchsorted(classes, c, side="left")) for c in range(5))
        self._kind = np.asarray([e[2] for e in entries], dtype=np.int8)
        self._lo = np.asarray([e[3] for e in entries], dtype=np.float64)
        self._hi = np.asarray([e[4] for e in entries], dtype=np.float64)
        self._wide_int = np.flatnonzero(np.asarray(wide, dtype=bool))
        groups = self.doc.get("groups")
        self._group_max = max((len(g["ranks"]) for g in groups if isinstance(g, dict)
                               and isinstance(g.get("ranks"), list)), default=0) if isinstance(groups, list) else 0

    def match(self, rows: Rows) -> np.ndarray:
        """(m,) bool: rows whose every fixed byte is the representative's (same structure and types)."""
        assert self._words is not None and self._wmask is not None and self._tail is not None
        nw = len(self._words)
        ok = np.ones(rows.m, dtype=bool)
        chunk = max(1, (2 << 20) // max(self.size, 1))   # ~2 MB at a time: the temporaries stay in cache
        for lo in range(0, rows.m, chunk):
            sub = Rows(rows.buf, rows.start + lo * rows.stride, rows.stride, min(chunk, rows.m - lo))
            if nw:
                w = sub.block(0, nw, "<u8")
                diff = np.bitwise_xor(w, self._words)
                np.bitwise_and(diff, self._wmask, out=diff)
                ok[lo:lo + sub.m] &= np.bitwise_or.reduce(diff, axis=1) == 0
            if len(self._tail):
                t = sub.block(nw * 8, len(self._tail))
                ok[lo:lo + sub.m] &= ((t == self._tail) | ~self._tmask).all(axis=1)
        for s in self.slots:
            if s.fix:
                b = rows.col(s.offset, "u1")
                ok &= (b < 0x80) if s.fix > 0 else (b >= 0xE0)
        return ok

    def _kept(self, keep: Callable[[Path], bool]) -> tuple[list[int], list[Path]]:
        got = self._keep_cache.get(keep)
        if got is None:
            rows = [j for j, i in enumerate(self.numeric) if keep(self.slots[i].path)]
            got = self._keep_cache[keep] = (rows, [self.slots[self.numeric[j]].path for j in rows])
        return got

    def kept(self, keep: Callable[[Path], bool]) -> list[Path]:
        """The paths of the numeric slots ``keep`` wants, in the order ``read`` returns them."""
        return self._kept(keep)[1]

    def read(self, rows: Rows, keep: Callable[[Path], bool]) -> tuple[np.ndarray, np.ndarray,
                                                                    dict[Path, np.ndarray]]:
        """Check every slot of rows that ``match``ed; return (ok (m,), the numeric slots ``keep`` wants
        as one float64 array (len(self.kept(keep)), m), string slots as numpy bytes). Rows not ok must
        be decoded one at a time by the caller."""
        assert self._kind is not None and self._lo is not None and self._hi is not None
        m = rows.m
        vals = np.empty((len(self.numeric), m), dtype=np.float64)
        for j, i in enumerate(self.numeric):
            s = self.slots[i]
            vals[j] = rows.col(s.offset, s.dtype)
        b0, b1, b2, b3, _ = self._bounds
        bounded = vals[b0:b1]
        ok = np.logical_and(bounded >= self._lo[b0:b1, None], bounded <= self._hi[b0:b1, None]).all(axis=0)
        if b2 > b1:
            ok &= np.isfinite(vals[b1:b2]).all(axis=0)
        world = vals[self._world]
        if len(vals) > b3:
            r = vals[b3:]
            ok &= np.logical_and(r >= 0, r < world).all(axis=0)
        for j in self._wide_int.tolist():    # 8-byte integers: exact below 2**53 only
            s = self.slots[self.numeric[j]]
            raw = rows.col(s.offset, s.dtype)
            ok &= (raw <= 2**53) if s.dtype == ">u8" else (raw >= -(2**53)) & (raw <= 2**53)
        if self._group_max:              # a group lists no more ranks than the world has
            ok &= world >= self._group_max
        strs: dict[Path, np.ndarray] = {}
        for i in self.strings:
            s = self.slots[i]
            raw = rows.block(s.offset, s.width)
            ok &= ((raw >= 0x20) & (raw <= 0x7E)).all(axis=1)   # printable ASCII: exact as numpy bytes
            strs[s.path] = rows.col(s.offset, f"S{s.width}") if s.width else np.full(m, b"", dtype="S1")
        # a copy: the columns only checked are freed with ``vals``
        return ok, vals[self._kept(keep)[0]], {p: c.copy() for p, c in strs.items()}


_MISSING = object()


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, float):
        return bool(float(got) == want or (want != want and got != got))
    return bool(int(got) == want)
