"""A capture file straight into the engine's columns: decode, validate and tabulate in one pass.

Why: ``summary.decode_capture`` returns every summary as a Python dict; at 100,000 ranks that is
~0.5 ms and ~40 KB of objects a summary (75 s and 9 GB for a synthetic job), twenty times the
engine's own cost. Here the capture's summaries stay bytes: those that share a msgpack layout with
one already validated are checked and read many at a time with numpy (summary/layout.py) into a
``TableBuilder``; the others are decoded one at a time with ``summary.decode`` (the same checks,
the same one-line errors naming the rank) and added as dicts, then dropped. The result is the Table
``build_table`` makes of ``decode_capture``'s summaries, with the same rejected-summary lines in
the same order, and one bad summary still spoils nothing but itself.

The raw capture file layout (``eroica.capture/1``: every summary its own msgpack bin in one array)
is already readable column-wise: the summaries' offsets are found with a walk over the array's
headers, never copying them; files of any other shape go through the plain decoder. A capture of
node blocks (``eroica.capture/2``, written when node leaders pre-reduce, engine/blocks.py) is read
here too: every block's rows are checked and decoded together into one TableBuilder segment, so
both layouts give the same Table.
Pure: no MPI, no torch.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from eroica_runtime.engine import blockcodec
from eroica_runtime.engine import blocks as blocks_mod
from eroica_runtime.engine.blockcodec import BlockError
from eroica_runtime.engine.table import Table, TableBuilder, block_wants
from eroica_runtime.summary import schema
from eroica_runtime.summary.layout import Layout, Rows, Unsupported

# a capture file's bytes: read, or a large file mapped read-only (reportdir.read_capture); the reader
# only indexes, slices and takes buffer views of it, which both offer
CaptureBytes = bytes | mmap.mmap

CHUNK_BYTES = 12 << 20        # summaries compared and read at once: ~1,000, cache-sized (measured best)
MAX_LAYOUTS = 32              # per summary length; more distinct layouts: one at a time
# layouts derived (~4 ms each, 8x a plain decode) that matched no other summary, per capture: a job
# whose every summary has a layout of its own pays at most this much for trying
MAX_USELESS = 16
DRILL_DOWN = 64               # raw summaries kept per capture for the findings' ranks


@dataclass
class Ingested:
    """One capture file read into columns (see the module docstring)."""

    meta: dict[str, Any]                 # step, trigger, world_size, missing, extra (checked)
    errors: list[str]                    # one line per rejected summary, in capture order
    builder: TableBuilder
    good_ranks: np.ndarray               # rank of every summary that passed validation (duplicates too)
    fast: int = 0                        # summaries read as layout columns
    layouts: int = 0
    useless: int = 0                     # layouts derived that matched nothing else
    error_index: list[int] = field(default_factory=list)   # capture position of each line in errors
    drill: dict[int, bytes] | None = None  # capture/2: the raw summaries the leaders forwarded, by rank
    _data: CaptureBytes = b""
    _starts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    _lens: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    _blobs: list[Any] | None = None      # the file's summaries when it was decoded whole
    _ranks: list[Any] = field(default_factory=list)
    _origin: str = "capture"
    _table: Table | None = None
    _row_index: np.ndarray | None = None

    def who(self, i: int) -> str:
        """How summary ``i`` is named in its errors: "rank N", or the entry when the file says no rank."""
        r = self._ranks[i]
        return f"rank {r}" if isinstance(r, int) else f"{self._origin} entry {i}"

    def blob(self, i: int) -> Any:
        """Summary ``i``'s bytes (whatever the file holds there when it was decoded whole)."""
        if self._blobs is not None:
            return self._blobs[i]
        a = int(self._starts[i])
        return self._data[a:a + int(self._lens[i])]

    def table(self, exclude: set[int] | frozenset[int] = frozenset()) -> Table:
        """The capture's Table (less the ranks in ``exclude``: the baseline without its culprits)."""
        if exclude:
            return self.builder.finish(exclude)
        if self._table is None:
            self._table = self.builder.finish()
            self._row_index = self.builder.row_index
        return self._table

    def summaries(self, ranks: list[int]) -> dict[int, dict[str, Any]]:
        """The raw decoded summaries of ``ranks`` (at most DRILL_DOWN): what the report's drill-down
        shows for a finding's ranks, without keeping every rank's dict."""
        table = self.table()
        assert self._row_index is not None
        out: dict[int, dict[str, Any]] = {}
        if self.drill is not None:       # capture/2: only what the leaders forwarded (blocks.pick_drill)
            for r in table.rank[table.rows_of(ranks[:DRILL_DOWN])].tolist():
                if int(r) in self.drill:
                    try:
                        out[int(r)] = schema.decode(self.drill[int(r)], origin=f"rank {r}")
                    except schema.SummaryError:     # rank 0 never decoded it: a bad one is just not shown
                        continue
            return out
        for row in table.rows_of(ranks[:DRILL_DOWN]).tolist():
            i = int(self._row_index[row])
            try:
                out[int(table.rank[row])] = schema.decode(self.blob(i), origin=self.who(i))
            except schema.SummaryError:   # it was accepted once: only a changed buffer could do this
                continue
        return out

    def release(self) -> None:
        """Drop the capture's bytes (the Table and the builder stay)."""
        self._data, self._blobs = b"", None
        if self.drill is not None:
            self.drill = {}
        self._starts = self._lens = np.zeros(0, dtype=np.int64)


def read_capture(data: CaptureBytes, *, origin: str = "capture",
                 max_bytes_per_summary: int = schema.MAX_SUMMARY_BYTES) -> Ingested:
    """Decode and validate one capture file's bytes into columns; SummaryError when the file itself
    is unusable (the message ``decode_capture`` gives)."""
    outer = _outer(data)
    blobs: list[Any] | None = None
    starts = lens = np.zeros(0, dtype=np.int64)
    if outer is None:                    # not the usual shape: let msgpack have the last word
        try:
            doc = msgpack.unpackb(data, raw=False, strict_map_key=False)
        except Exception as exc:
            raise schema.SummaryError(f"{origin}: not valid msgpack ({type(exc).__name__}: {exc})") from None
        fields = doc if isinstance(doc, dict) else None
    else:
        fields, (starts, lens) = outer
        doc = fields
    if isinstance(fields, dict) and fields.get("schema") == blocks_mod.CAPTURE_SCHEMA_V2:
        return _read_blocks(fields, origin)   # no "summaries" array: _outer left it to msgpack
    if not isinstance(fields, dict) or fields.get("schema") != schema.CAPTURE_SCHEMA:
        got = fields.get("schema") if isinstance(fields, dict) else type(doc).__name__
        raise schema.SummaryError(f"{origin}: unsupported capture schema {got!r} "
                                  f"(expected {schema.CAPTURE_SCHEMA!r})")
    if outer is None:
        blobs = fields.get("summaries")
        if not isinstance(blobs, list):
            raise schema.SummaryError(f"{origin}: 'summaries' must be a list")
        count = len(blobs)
    else:
        count = len(starts)
    meta = {k: fields.get(k) for k in ("step", "trigger", "world_size", "missing", "extra")}
    # decode_capture checks these after the summaries; none of a summary's errors raises, so the
    # outcome is the same, and a bad file costs no decoding
    schema.check_capture_meta(meta, origin)
    ranks = fields.get("ranks")
    if not isinstance(ranks, list) or len(ranks) != count:
        ranks = [None] * count
    ing = Ingested(meta=meta, errors=[], builder=TableBuilder(), good_ranks=np.zeros(0, dtype=np.int64),
                   _data=data, _starts=starts, _lens=lens, _blobs=blobs, _ranks=ranks, _origin=origin)
    errors: dict[int, str] = {}
    good: list[np.ndarray] = []

    def one(i: int) -> dict[str, Any] | None:
        """Summary ``i`` the plain way: decode + validate, or its one-line error."""
        who = ing.who(i)
        try:
            s = schema.decode(ing.blob(i), origin=who, max_bytes=max_bytes_per_summary)
            if isinstance(ranks[i], int) and s["rank"] != ranks[i]:
                raise schema.SummaryError(f"summary from {who}: claims to be rank {s['rank']}")
        except schema.SummaryError as exc:
            errors[i] = str(exc)
            return None
        ing.builder.add(s, index=i)
        good.append(np.asarray([int(s["rank"])], dtype=np.int64))
        return s

    if blobs is not None:
        for i in range(count):
            one(i)
    else:
        claimed = _claims(ranks)
        buf = np.frombuffer(data, dtype=np.uint8)
        small = lens <= max_bytes_per_summary
        for i in np.flatnonzero(~small).tolist():
            one(i)                       # the size error, named as decode names it
        for size in np.unique(lens[small]).tolist():
            idx = np.flatnonzero(small & (lens == size))
            _by_layout(ing, buf, starts, idx, int(size), claimed, one, good)
    ing.error_index = sorted(errors)
    ing.errors = [errors[i] for i in ing.error_index]
    ing.good_ranks = np.concatenate(good) if good else np.zeros(0, dtype=np.int64)
    return ing


def _read_blocks(fields: dict[Any, Any], origin: str) -> Ingested:
    """A capture of node blocks (``eroica.capture/2``) into columns: each block's structure checked
    (blocks.decode_node_block), then every block's numbers checked and decoded at once and merged
    into one TableBuilder segment (blockcodec.check_parts, merge_parts: a few numpy passes over all
    rows, not a segment per block: 12,500 segments cost ~20 s at 100,000 ranks), its rejected-summary
    lines merged in rank order (where the raw capture, in rank order, has them). A block that cannot
    be used, or speaks for a rank another block already did, adds one line naming its leader and its
    ranks count as missing; so do the ranks no block speaks for (leaders that sent none)."""
    meta = {k: fields.get(k) for k in ("step", "trigger", "world_size", "missing", "extra")}
    schema.check_capture_meta(meta, origin)
    world, step = int(meta["world_size"]), int(meta["step"])
    leaders, raw = fields.get("leaders"), fields.get("blocks")
    if not isinstance(raw, list) or not isinstance(leaders, list) or len(leaders) != len(raw) or not all(
            isinstance(r, int) and not isinstance(r, bool) and 0 <= r < world for r in leaders):
        raise schema.SummaryError(f"{origin}: 'blocks' and 'leaders' must be lists of equal length "
                                  f"(leaders: ranks below world_size {world})")
    ing = Ingested(meta=meta, errors=[], builder=TableBuilder(), good_ranks=np.zeros(0, dtype=np.int64),
                   _origin=origin, drill={})
    lines: list[tuple[int, str]] = []
    covered = np.zeros(world, dtype=bool)
    missing: set[int] = set(meta["missing"])
    known: dict[bytes, Any] = {}                 # function lists checked once for all blocks
    accepted: list[blocks_mod.NodeBlock] = []
    for leader, data in zip(leaders, raw, strict=True):
        try:
            blk = blocks_mod.decode_node_block(data, leader=int(leader), step=step, world_size=world, known=known)
            if covered[blk.ranks].any():
                twice = [r for r in blk.ranks if covered[r]][:8]
                raise BlockError(f"block from node leader rank {leader}: speaks for ranks {twice} that another "
                                 "block already did (foreign)")
        except BlockError as exc:
            lines.append((int(leader), f"{exc}; its node's ranks count as missing"))
            continue
        covered[blk.ranks] = True
        missing.update(blk.missing)
        if blk.failure:
            lines.append((blk.leader, f"block from node leader rank {blk.leader}: the leader could not reduce "
                                      f"its node ({blk.failure}); ranks {blk.ranks} count as missing"))
            missing.update(blk.ranks)
            continue
        accepted.append(blk)
    # the rows' values, every block at once: a block with a bad value costs its node, as above
    with_rows = [b for b in accepted if b.part is not None]
    bad = blockcodec.check_parts([b.part for b in with_rows if b.part is not None], world)
    spoiled = {id(with_rows[i]) for i in bad}
    for i, why in bad.items():
        lines.append((with_rows[i].leader, f"{why}; its node's ranks count as missing"))
        missing.update(with_rows[i].ranks)
    parts = []
    for blk in accepted:
        if id(blk) in spoiled:
            continue
        lines += blk.errors
        if blk.part is not None:
            parts.append(blk.part)
        assert ing.drill is not None
        ing.drill.update(blk.drill)
    if parts:
        seg = blockcodec.merge_parts(parts)
        ing.builder.add_segment(seg)
        ing.good_ranks = seg.rank
    missing.update(np.flatnonzero(~covered).tolist())
    meta["missing"] = sorted(int(r) for r in missing)
    lines.sort(key=lambda x: x[0])          # stable: a rank's lines keep their order
    ing.errors = [line for _, line in lines]
    ing.error_index = [r for r, _ in lines]
    return ing


def _claims(ranks: list[Any]) -> np.ndarray:
    """The rank the capture file says each summary came from: -1 none said, -2 one no summary can
    have (the one-at-a-time path then names the mismatch)."""
    try:
        arr = np.asarray(ranks)
        if arr.dtype.kind in "iub" and arr.ndim == 1:
            arr = arr.astype(np.int64)
            return np.where((arr >= 0) & (arr <= schema.MAX_WORLD), arr, -2)
    except (OverflowError, ValueError, TypeError):
        pass
    return np.asarray([(int(r) if 0 <= r <= schema.MAX_WORLD else -2) if isinstance(r, int) else -1
                       for r in ranks], dtype=np.int64)


def _rows(buf: np.ndarray, starts: np.ndarray, size: int) -> Rows:
    """Summaries starting at ``starts`` (all ``size`` bytes) as evenly spaced rows: a view of the
    capture's bytes when they already are (summaries of one size side by side), else a packed copy."""
    m = len(starts)
    if m == 1 or (m > 1 and np.all(np.diff(starts) == starts[1] - starts[0]) and starts[1] > starts[0]):
        stride = int(starts[1] - starts[0]) if m > 1 else max(size, 1)
        return Rows(buf, int(starts[0]), stride, m)
    packed = np.empty(m * size, dtype=np.uint8)
    for j, s in enumerate(starts.tolist()):
        packed[j * size:(j + 1) * size] = buf[s:s + size]
    return Rows(packed, 0, size, m)


@dataclass
class _Pending:
    """Rows of one layout read so far: given to the builder as one block at the end."""

    index: list[np.ndarray] = field(default_factory=list)
    num: list[np.ndarray] = field(default_factory=list)     # (len(paths), rows) each
    strs: list[dict[tuple[Any, ...], np.ndarray]] = field(default_factory=list)


One = Callable[[int], "dict[str, Any] | None"]   # decode + validate + add summary i, or record its error


def _by_layout(ing: Ingested, buf: np.ndarray, starts: np.ndarray, idx: np.ndarray, size: int,
               claimed: np.ndarray, one: One, good: list[np.ndarray]) -> None:
    """Summaries ``idx`` (capture positions, all ``size`` bytes): blocks of a shared layout where
    one exists (deriving layouts from summaries validated the plain way), the rest one at a time."""
    layouts: list[Layout] = []
    pending: dict[int, _Pending] = {}
    chunk = max(16, CHUNK_BYTES // max(size, 1))
    for lo in range(0, len(idx), chunk):
        part = idx[lo:lo + chunk]
        rows = _rows(buf, starts[part], size)
        left = np.ones(len(part), dtype=bool)
        for lay in list(layouts):
            if not left.any():
                break
            _take(ing, lay, rows, part, left, claimed, one, good, pending)
        while left.any():
            j = int(np.argmax(left))
            left[j] = False
            s = one(int(part[j]))
            more = left.any() or lo + chunk < len(idx)    # a layout only pays with others to match
            if s is None or not more or len(layouts) >= MAX_LAYOUTS or ing.useless >= MAX_USELESS:
                continue
            a = int(starts[part[j]])
            try:
                lay = Layout.derive(ing._data[a:a + size], s)
            except Unsupported:
                ing.useless += 1
                continue
            ing.layouts += 1
            if _take(ing, lay, rows, part, left, claimed, one, good, pending):
                layouts.insert(0, lay)
            else:
                ing.useless += 1
    for lay in layouts:
        got = pending.get(id(lay))
        if got is None or not got.index:
            continue
        num = np.concatenate(got.num, axis=1)
        ing.builder.add_block(lay.doc, np.concatenate(got.index),
                              dict(zip(lay.kept(block_wants), num, strict=True)),
                              {p: np.concatenate([n[p] for n in got.strs]) for p in got.strs[0]})


def _take(ing: Ingested, lay: Layout, rows: Rows, part: np.ndarray, left: np.ndarray, claimed: np.ndarray,
          one: One, good: list[np.ndarray], pending: dict[int, _Pending]) -> int:
    """Rows of ``part`` still ``left`` that match ``lay``: the valid ones are kept for the layout's
    block, the others decoded one at a time (for their exact verdict); returns how many matched."""
    hit = lay.match(rows) & left
    count = int(hit.sum())
    if not count:
        return 0
    ok, num, strs = lay.read(rows, block_wants)
    rank = num[lay.kept(block_wants).index(("rank",))]
    claim = claimed[part]
    ok &= hit & ((claim == -1) | (claim == rank))
    if ok.any():
        sel = np.flatnonzero(ok)
        every = len(sel) == len(part)
        got = pending.setdefault(id(lay), _Pending())
        got.index.append(part[sel])
        got.num.append(num if every else num[:, sel])
        got.strs.append(strs if every else {p: c[sel] for p, c in strs.items()})
        good.append(rank[sel].astype(np.int64))
        ing.fast += len(sel)
        lay.matched += len(sel)
    left &= ~hit
    for j in np.flatnonzero(hit & ~ok).tolist():
        one(int(part[j]))
    return count


# ---- the capture file's outer map, without copying its summaries --------------------------------------

def _outer(data: CaptureBytes) -> tuple[dict[Any, Any], tuple[np.ndarray, np.ndarray]] | None:
    """(every field but the summaries, (start, length) of each summary) of a capture file whose
    summaries are one array of msgpack bin; None for anything else (decoded whole by the caller,
    so malformed files get msgpack's own verdict)."""
    try:
        p, count = _header(data, 0, 0x80, 0xDE)
        fields: dict[Any, Any] = {}
        spans: tuple[None, np.ndarray, np.ndarray] | None = None
        for _ in range(count):
            key, p = _value(data, p)
            if key == "summaries":
                p, n = _header(data, p, 0x90, 0xDC)
                spans = _bins(data, p, n)
                if spans is None:
                    return None
                p = int(spans[1][-1] + spans[2][-1]) if n else p
                fields[key] = None
            else:
                fields[key], p = _value(data, p)
        if p != len(data) or spans is None:
            return None
        return fields, (spans[1], spans[2])
    except Exception:   # anything unusual: the whole-file decode gives the verdict
        return None


def _bins(data: CaptureBytes, p: int, n: int) -> tuple[None, np.ndarray, np.ndarray] | None:
    """(None, starts, lengths) of ``n`` consecutive msgpack bin values from ``p``; None if they are not.

    A run of summaries of one size (a job's ranks mostly share a layout) is found with numpy: where
    the next header sits one stride on and equals this one, so does the value. Else one at a time."""
    starts = np.empty(n, dtype=np.int64)
    lens = np.empty(n, dtype=np.int64)
    u16, u32 = struct.Struct(">H").unpack_from, struct.Struct(">I").unpack_from
    buf = np.frombuffer(data, dtype=np.uint8)
    end = len(data)
    i, probe = 0, 8
    while i < n:
        t = data[p]
        if t == 0xC5:
            size, hdr = u16(data, p + 1)[0], 3
        elif t == 0xC6:
            size, hdr = u32(data, p + 1)[0], 5
        elif t == 0xC4:
            size, hdr = data[p + 1], 2
        else:
            return None
        stride = hdr + size
        run = 1
        if probe and n - i > 1:          # how many of the next values have this very header?
            k = min(n - i - 1, probe, (end - p - stride) // stride)
            if k > 0:
                at = p + stride * np.arange(1, k + 1, dtype=np.int64)
                same = np.ones(k, dtype=bool)
                for b in range(hdr):
                    same &= buf[at + b] == data[p + b]
                run += k if same.all() else int(np.argmin(same))
            probe = probe * 4 if run > k else (8 if run > 1 else max(probe // 2, 0))
        elif not probe and i % 64 == 0:
            probe = 8                    # try runs again now and then
        starts[i:i + run] = p + hdr + stride * np.arange(run, dtype=np.int64)
        lens[i:i + run] = size
        i += run
        p += stride * run
        if p > end:
            return None
    return None, starts, lens


class _From:
    """A file-like view of ``data`` from ``p`` (msgpack's Unpacker reads it a chunk at a time)."""

    def __init__(self, data: CaptureBytes, p: int) -> None:
        self.view, self.p = memoryview(data), p

    def read(self, n: int = -1) -> bytes:
        end = len(self.view) if n is None or n < 0 else min(len(self.view), self.p + n)
        out = bytes(self.view[self.p:end])
        self.p = end
        return out


def _value(data: CaptureBytes, p: int) -> tuple[Any, int]:
    """The msgpack value at ``p`` and the offset after it (decoded in C; raises on anything malformed)."""
    up = msgpack.Unpacker(_From(data, p), raw=False, strict_map_key=False, read_size=1 << 16,
                          max_buffer_size=len(data))
    value = up.unpack()
    return value, p + up.tell()


def _header(data: CaptureBytes, p: int, fix: int, first16: int) -> tuple[int, int]:
    """A map (fix=0x80, first16=0xde) or array (0x90, 0xdc) header at ``p``: (offset after, count)."""
    t = data[p]
    if fix <= t <= fix + 0x0F:
        return p + 1, t & 0x0F
    if t == first16:
        return p + 3, int.from_bytes(data[p + 1:p + 3], "big")
    if t == first16 + 1:
        return p + 5, int.from_bytes(data[p + 1:p + 5], "big")
    raise ValueError("not the expected container")
