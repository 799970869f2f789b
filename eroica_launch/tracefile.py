"""One torch.profiler chrome trace on disk: which rank and job it is from, which steps it holds, its events.

Why a module of its own: traces are big (hundreds of MB to GBs, plain or gzip) and come from other
tools, so reading one is careful work. ``inspect`` takes a cheap first look (the JSON header up to
``traceEvents`` and a byte scan for ``ProfilerStep#N``) so that a wrong or mismatched file is refused
before the expensive read; ``read`` streams the events with ijson (never the whole document in memory)
into a ``summary.chrome.Reader``. Long reads report progress; anything that is not a Kineto/chrome
trace is a ``TraceError``: one line naming the file.

Kineto writes event names into the JSON without escaping their quotes (pytorch/pytorch#146900): a
``record_function("load \"batch\"")`` range, or any Python frame whose file name holds a quote under
``with_stack=True``, makes the whole file invalid JSON, and one stray frame is enough to lose a rank's
trace. A trace that does not parse is therefore read once more through ``_Reescaped``, which escapes
the ``"name"`` values that are not valid JSON strings, and nothing else; a valid trace is never touched.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import stat
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import ijson
from ijson.common import ObjectBuilder

from eroica_runtime.summary.chrome import Reader

Say = Callable[[str], None]
PROGRESS_EVERY_S = 5.0
_HEADER_KEYS = frozenset(("distributedInfo", "host_name", "deviceProperties", "schemaVersion"))
_STEP_RE = re.compile(rb'"ProfilerStep#(\d+)"')
# rank3 / rank-3 / rank_3 anywhere; worker3.<timestamp>.pt.trace.json (tensorboard_trace_handler with
# worker_name=f"worker{rank}", as PyTorch's profiler tutorials name them); a trailing -3.json / _3.json
_RANK_RES = (re.compile(r"rank[-_]?(\d+)", re.IGNORECASE), re.compile(r"^worker[-_]?(\d+)(?:\.|$)", re.IGNORECASE),
             re.compile(r"[-_](\d+)\.json(?:\.gz)?$", re.IGNORECASE))
_BAD_INPUT = (ijson.JSONError, OSError, EOFError, zlib.error, UnicodeDecodeError)
# A "name" value holding a quote, backslash or control character, laid out as Kineto writes it: alone
# on its line, ending the line (`    "name": "...",`, torch >= 2.1), or third on an event's first line,
# the pid after it (`  "ph": "X", "cat": "cpu_op", "name": "...", "pid": 7,`, older torch). Anchored at
# the line's start, so JSON that another tool wrote on one line is never rewritten.
_SUSPECT_NAME = re.compile(
    rb'^([ \t]*"name": ")([^\n]*?["\\\x00-\x09\x0b-\x1f][^\n]*)("[ \t]*,?[ \t]*\r?)$'
    rb'|^([ \t]*"ph": "[^"\n]*", "cat": "[^"\n]*", "name": ")([^\n]*?["\\\x00-\x09\x0b-\x1f][^\n]*?)(", "pid": )',
    re.MULTILINE)


class TraceError(ValueError):
    """A trace file that cannot be used; the message is one line and names the file."""


@dataclass
class TraceFile:
    """What the first look at one trace found."""

    path: Path
    size: int
    prefix: str                          # ijson prefix of the events: "traceEvents.item" or "item"
    dist: dict[str, Any]                 # the trace's distributedInfo ({} when absent)
    rank: int | None                     # from distributedInfo, else the file name
    rank_from: str                       # "distributedInfo" | "file name" | "taken" (a lone trace: 0) | ""
    world_size: int | None               # from distributedInfo only
    host: str = ""
    device_names: dict[int, str] = field(default_factory=dict)
    steps: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.name


class _Counted:
    """A binary file wrapper counting the bytes read, saying how far it got every few seconds."""

    def __init__(self, raw: BinaryIO, total: int, label: str, say: Say | None) -> None:
        self.raw, self.total, self.label, self.say = raw, total, label, say
        self.done = 0
        self._next = time.monotonic() + PROGRESS_EVERY_S

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.done += len(data)
        if self.say is not None and time.monotonic() >= self._next:
            self._next = time.monotonic() + PROGRESS_EVERY_S
            self.say(f"{self.label}: {self.done / 1e6:.0f} of {self.total / 1e6:.0f} MB")
        return data


@contextlib.contextmanager
def _open(path: Path, label: str = "", say: Say | None = None) -> Iterator[Any]:
    """A binary stream of the JSON text: regular files only (a FIFO cannot hang us), gzip recognised
    by its magic bytes whatever the file is called, progress said every few seconds."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise TraceError(f"{path}: cannot open ({exc.strerror or exc})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise TraceError(f"{path}: not a regular file")
    os.set_blocking(fd, True)
    with os.fdopen(fd, "rb", buffering=1 << 20) as raw:
        counted = _Counted(raw, st.st_size, label, say)
        if raw.peek(2)[:2] == b"\x1f\x8b":
            with gzip.GzipFile(fileobj=counted, mode="rb") as gz:  # type: ignore[arg-type]
                yield gz
        else:
            yield counted


class _Reescaped:
    """A binary stream of a Kineto trace's text with each ``"name"`` value that is not a valid JSON
    string escaped (``fixed`` counts them); everything else passes through byte for byte."""

    CHUNK = 4 << 20

    def __init__(self, raw: Any) -> None:
        self.raw, self.fixed = raw, 0
        self._out, self._tail, self._eof = bytearray(), b"", False

    def _escape(self, m: re.Match[bytes]) -> bytes:
        head, body, end = m.group(1, 2, 3) if m.group(1) is not None else m.group(4, 5, 6)
        try:
            json.loads(b'"' + body + b'"')
            return m.group(0)                     # escaped already (a newer torch, or another writer)
        except ValueError:
            self.fixed += 1
            return head + json.dumps(body.decode("utf-8", "replace"))[1:-1].encode() + end

    def read(self, n: int = -1) -> bytes:
        while not self._eof and (n < 0 or len(self._out) < n):
            chunk = self.raw.read(self.CHUNK)
            text = self._tail + chunk
            if chunk:
                cut = text.rfind(b"\n") + 1      # whole lines only: a name never spans two reads
                text, self._tail = text[:cut], text[cut:]
            else:
                self._eof, self._tail = True, b""
            self._out += _SUSPECT_NAME.sub(self._escape, text)
        size = len(self._out) if n < 0 else min(n, len(self._out))
        data = bytes(self._out[:size])
        del self._out[:size]
        return data


def _why(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:160] or type(exc).__name__


def _header(fh: Any, path: Path) -> tuple[str, dict[str, Any]]:
    """(events prefix, the top-level fields before traceEvents that matter: distributedInfo...).

    Kineto writes its metadata before ``traceEvents``, so this reads only the file's first bytes.
    """
    events = ijson.parse(fh, use_float=True)
    try:
        _, kind, _ = next(events)
    except StopIteration:
        raise TraceError(f"{path}: empty file, not a chrome trace") from None
    if kind == "start_array":
        return "item", {}          # the JSON Array Format: a bare list of events
    if kind != "start_map":
        raise TraceError(f"{path}: not a chrome trace (a JSON {kind}, not an object with traceEvents)")
    meta: dict[str, Any] = {}
    key, builder = "", None
    for prefix, kind, value in events:
        if prefix != "":
            if builder is not None:
                builder.event(kind, value)
            continue
        if builder is not None:
            meta[key], builder = builder.value, None
        if kind != "map_key":
            break
        if value == "traceEvents":
            return "traceEvents.item", meta
        key = value
        builder = ObjectBuilder() if value in _HEADER_KEYS else None
    raise TraceError(f"{path}: not a chrome trace (no traceEvents in it)")


def _scan_steps(path: Path, say: Say | None) -> list[int]:
    """ProfilerStep numbers anywhere in the file: a byte scan, much cheaper than parsing."""
    found: set[int] = set()
    tail = b""
    with _open(path, f"eroica: analyze: looking at {path.name}", say) as fh:
        while chunk := fh.read(4 << 20):
            buf = tail + chunk
            found.update(int(m.group(1)) for m in _STEP_RE.finditer(buf))
            tail = buf[-64:]
    return sorted(found)


def rank_from_name(path: Path) -> int | None:
    """3 for trace-rank3.json, rank-3.json.gz, rank_3.json, worker_3.json, worker3.1623143089861.pt.trace.json.gz;
    None when the name says nothing (hostname_pid.<timestamp>.pt.trace.json, the handler's default)."""
    for rx in _RANK_RES:
        m = rx.search(path.name)
        if m:
            return int(m.group(1))
    return None


def _small_int(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 10_000_000 else None


def inspect(path: Path, say: Say | None = None) -> TraceFile:
    """The first look: header fields, rank and world, ProfilerStep numbers. Raises TraceError."""
    try:
        with _open(path) as fh:
            prefix, meta = _header(fh, path)
        size = path.stat().st_size
        steps = _scan_steps(path, say)
    except TraceError:
        raise
    except _BAD_INPUT as exc:
        raise TraceError(f"{path}: not a readable chrome trace ({_why(exc)})") from None
    dist = meta.get("distributedInfo")
    dist = dist if isinstance(dist, dict) else {}
    rank, rank_from = _small_int(dist.get("rank")), "distributedInfo"
    if rank is None:
        rank, rank_from = rank_from_name(path), "file name"
    devices = meta.get("deviceProperties")
    names = {int(d["id"]): str(d.get("name", ""))[:128] for d in devices if isinstance(d, dict)
             and _small_int(d.get("id")) is not None} if isinstance(devices, list) else {}
    host = meta.get("host_name")
    return TraceFile(path=path, size=size, prefix=prefix, dist=dist, rank=rank,
                     rank_from=rank_from if rank is not None else "",
                     world_size=_small_int(dist.get("world_size")) or None,
                     host=str(host)[:255] if isinstance(host, str) else "", device_names=names, steps=steps)


def _events(trace: TraceFile, say: Say | None, *, reescape: bool) -> tuple[Reader, int]:
    """One streaming pass over the trace's events: (the reader, names re-escaped)."""
    reader = Reader()
    with _open(trace.path, f"eroica: analyze: reading {trace.name}", say) as fh:
        stream = _Reescaped(fh) if reescape else fh
        for event in ijson.items(stream, trace.prefix, use_float=True):
            reader.add(event)
    return reader, stream.fixed if isinstance(stream, _Reescaped) else 0


def read(trace: TraceFile, say: Say | None = None) -> Reader:
    """Stream every event of the trace into a Reader (the expensive pass); raises TraceError."""
    t0 = time.monotonic()
    try:
        reader, _ = _events(trace, say, reescape=False)
    except ijson.JSONError as exc:
        first = exc                                # kept: the re-escaped read may fail the same way
        try:
            reader, fixed = _events(trace, say, reescape=True)
        except _BAD_INPUT:
            fixed = 0
        if not fixed:
            raise TraceError(f"{trace.path}: not a readable chrome trace ({_why(first)})") from None
        if say is not None:
            say(f"eroica: analyze: {trace.name}: {fixed:,} event name{'s' if fixed > 1 else ''} with unescaped "
                "quotes (torch.profiler's export, pytorch/pytorch#146900); read with them escaped")
    except _BAD_INPUT as exc:
        raise TraceError(f"{trace.path}: not a readable chrome trace ({_why(exc)})") from None
    reader.finish()
    if not reader.events:
        raise TraceError(f"{trace.path}: no host or device events in it (not a torch.profiler trace?)")
    if say is not None:
        say(f"eroica: analyze: read {trace.name}: rank {trace.rank}, {len(reader.events):,} events, "
            f"{len(reader.steps)} steps, {trace.size / 1e6:.1f} MB in {time.monotonic() - t0:.1f} s")
    return reader
