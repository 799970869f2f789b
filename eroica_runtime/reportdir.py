"""The report directory's one owner: where every file goes, and how it is written and read safely.

Every writer (rank 0's analyst and job end, the gather, the hang watchdog, the launcher's rank
status, the error file, ``eroica analyze``/``synth``) goes through here, so that:

- a write is atomic: a unique temp file made with ``mkstemp`` in the target directory (never a
  predictable name, never following a planted symlink), fsynced, renamed over the target, and
  removed again if anything fails (a full or read-only disk leaves no ``.tmp`` behind);
- ``report.json``/``report.html`` have one writer at a time (the analyst thread, the hang
  watchdog and the SIGUSR2 flusher may all want to write them);
- a directory anyone can write to without the sticky bit, or owned by another user, is refused
  (someone else could swap files under us);
- a read takes regular files only, opened without blocking (a FIFO named like a capture cannot
  hang ``eroica analyze``) and capped in size.

Light on imports: the error-file hook uses it from ``sitecustomize`` in every rank.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
import tempfile
import threading
import time
from pathlib import Path

CAPTURES = "captures"
RAW = "raw"
REPORT_JSON = "report.json"
REPORT_HTML = "report.html"
STEPS = "steps.msgpack"
TRIGGER = "trigger"
MAX_CAPTURE_BYTES = 2 << 30        # a 100,000-rank capture (~16 KB a summary) fits
MAX_REPORT_BYTES = 256 << 20
MAP_FROM_BYTES = 64 << 20          # a capture this large is mapped, not copied (read_capture)

_write_lock = threading.RLock()    # one writer of the job-level files per process


class InputError(ValueError):
    """An input file that cannot be used; the message names it and says why (one line)."""


class UnsafeDirectory(OSError):
    """A report directory others could tamper with."""


def capture_path(root: str | os.PathLike[str], step: int) -> Path:
    return Path(root) / CAPTURES / f"{int(step)}.msgpack"


def diagnosis_path(root: str | os.PathLike[str], step: int) -> Path:
    return Path(root) / f"diagnosis-{int(step)}.json"


def raw_events_path(root: str | os.PathLike[str], step: int, rank: int) -> Path:
    """A rank's raw profiler events of one capture (EROICA_KEEP_RAW_EVENTS=1; summary/rawevents.py)."""
    return Path(root) / RAW / str(int(step)) / f"rank{int(rank)}.msgpack"


def hang_path(root: str | os.PathLike[str], step: int) -> Path:
    return Path(root) / f"hang-{int(step)}.json"


EARLIER = "earlier"


def set_aside_earlier_job(root: str | os.PathLike[str]) -> Path | None:
    """Move an earlier job's reports out of the way of this one's: into ``earlier/<when it ended>/``.

    The default directory is named after ``--rdzv-id`` or the Slurm job (a requeued job keeps its id),
    and ``--report-dir`` is often given again, so a directory may hold a finished job's captures,
    diagnoses and reports. Left there, ``eroica analyze`` of the directory read both jobs' captures
    as one job's, and a capture of the old job at a step the new one never captured stayed beside
    the new job's report. Nothing is deleted (an earlier diagnosis is kept); ``launch/`` (the rank
    records, which the launcher renews) and a ``trigger`` file (a capture asked for this job) stay.
    Returns where they went, or None when there was nothing to move."""
    root = Path(root)
    names = [n for n in (CAPTURES, RAW, REPORT_JSON, REPORT_HTML, STEPS) if os.path.lexists(root / n)]
    with contextlib.suppress(OSError):
        names += sorted(e.name for e in os.scandir(root) if e.name.startswith(("diagnosis-", "hang-"))
                        and e.name.endswith(".json"))
    if not names:
        return None
    newest = max(os.lstat(root / n).st_mtime for n in names)
    base = root / EARLIER / time.strftime("%Y%m%d-%H%M%S", time.localtime(newest))
    dest, n = base, 1
    while os.path.lexists(dest):
        n += 1
        dest = base.with_name(f"{base.name}-{n}")
    dest.mkdir(parents=True)
    for name in names:
        os.replace(root / name, dest / name)
    return dest


def check_directory(path: str | os.PathLike[str]) -> None:
    """Refuse a directory writable by others without the sticky bit, or owned by another user
    (root may use any directory it owns or that is root's); raise UnsafeDirectory naming it."""
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectory(f"{path}: not a directory")
    if st.st_uid != os.geteuid():
        raise UnsafeDirectory(f"{path}: owned by uid {st.st_uid}, not by this user ({os.geteuid()})")
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise UnsafeDirectory(f"{path}: writable by every user without the sticky bit")


def ensure_directory(path: str | os.PathLike[str]) -> Path:
    """Create (as the umask allows) and check a report directory; its parents are created as needed."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    check_directory(path)
    return path


def atomic_write(path: str | os.PathLike[str], data: str | bytes, *, mode: int = 0o644) -> Path:
    """Write ``data`` to ``path`` atomically, never through a symlink, leaving no temp file on failure."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        # rename replaces a symlink itself, never what it points to
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


@contextlib.contextmanager
def job_files_lock():  # type: ignore[no-untyped-def]
    """Held while report.json/report.html/steps.msgpack are written (one writer per process)."""
    with _write_lock:
        yield


def _open_regular(path: Path, limit: int) -> tuple[int, int]:
    """(fd, size) of a regular file of at most ``limit`` bytes, opened without blocking; InputError
    naming the file otherwise (the fd is closed then)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputError(f"{path}: cannot open ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{path}: not a regular file")
        if st.st_size > limit:
            raise InputError(f"{path}: {st.st_size} bytes is over the {limit}-byte limit")
    except OSError as exc:
        os.close(fd)
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except InputError:
        os.close(fd)
        raise
    return fd, int(st.st_size)


def read_capped(path: str | os.PathLike[str], limit: int) -> bytes:
    """A regular file's bytes (at most ``limit``); InputError naming the file otherwise."""
    path = Path(path)
    fd, size = _open_regular(path, limit)
    try:
        return _read_open(fd, path, size, limit)
    finally:
        os.close(fd)


def _read_open(fd: int, path: Path, size: int, limit: int) -> bytes:
    try:
        # one read sized to the file fills the result in place (a 1 GB capture read in 1 MB chunks
        # and joined cost a second copy: ~1.7 s of a 100,000-rank analysis); the loop is for the rare
        # short read and for a file that grew since fstat
        chunks, left = [], limit + 1
        want = min(left, size + 1)
        while left > 0:
            chunk = os.read(fd, want)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
            want = min(left, 1 << 20)
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if len(data) > limit:
            raise InputError(f"{path}: over the {limit}-byte limit")
        return data
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None


def read_capture(path: str | os.PathLike[str], limit: int = MAX_CAPTURE_BYTES, *,
                 map_from: int | None = None) -> bytes | mmap.mmap:
    """A capture file's bytes for ``eroica analyze``: read like ``read_capped`` below ``map_from``
    bytes, mapped read-only from ``map_from`` on (an ``mmap`` the engine reads like bytes).

    Why: a copy of a large file costs a fresh page of memory for every 4 kB of it. A 100,000-rank
    capture is 1.15 GB: 280,000 page faults and ~1 s of kernel time on this VM to read it, and two
    such files are held at once (the next is read ahead); mapped, the pages are the page cache's own
    (~20,000 faults, 0.2 s; docs/benchmarks.md §8). The mapping is populated at once, so the
    reader's thread, not the analysis, waits for the disk. eroica replaces a capture file by rename,
    never in place, so a running job cannot change a mapped file; but a file someone else truncates
    while it is mapped would end the process with SIGBUS, so files below ``map_from`` (default
    MAP_FROM_BYTES: every job below ~5,000 ranks) are copied as before."""
    path = Path(path)
    map_from = MAP_FROM_BYTES if map_from is None else map_from
    fd, size = _open_regular(path, limit)
    try:
        if size < max(map_from, 1):
            return _read_open(fd, path, size, limit)
        flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_POPULATE", 0)
        return mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ)
    except InputError:
        raise
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot map ({getattr(exc, 'strerror', None) or exc})") from None
    finally:
        os.close(fd)


def capture_files(root: str | os.PathLike[str]) -> list[Path]:
    """``captures/<step>.msgpack`` under ``root``, in step order (names that are not a step last)."""
    folder = Path(root) / CAPTURES
    try:
        names = [p for p in folder.iterdir() if p.suffix == ".msgpack"]
    except OSError:
        return []

    def key(p: Path) -> tuple[int, str]:
        return (int(p.stem), p.name) if p.stem.isdigit() else (2**63, p.name)

    return sorted(names, key=key)


def _by_step(root: str | os.PathLike[str], prefix: str) -> dict[int, Path]:
    """``<prefix><step>.json`` under ``root`` by step, in step order (other names left out)."""
    out = {}
    try:
        for p in Path(root).iterdir():
            step = p.name[len(prefix):-len(".json")] if p.name.startswith(prefix) else ""
            if p.name.endswith(".json") and step.isdigit():
                out[int(step)] = p
    except OSError:
        return {}
    return dict(sorted(out.items()))


def diagnosis_files(root: str | os.PathLike[str]) -> dict[int, Path]:
    """``diagnosis-<step>.json`` under ``root`` by step."""
    return _by_step(root, "diagnosis-")


def hang_files(root: str | os.PathLike[str]) -> dict[int, Path]:
    """``hang-<step>.json`` under ``root`` by step."""
    return _by_step(root, "hang-")


def remove_capture(root: str | os.PathLike[str], step: int) -> bool:
    """Remove ``captures/<step>.msgpack`` (retention.py decides which), and the raw profiler events the
    ranks kept of that capture (``raw/<step>/``, EROICA_KEEP_RAW_EVENTS=1: ~50 KB a rank of the bench
    job's 3-step window, more with more events), so a long job that keeps them is bounded too (those
    written to another host's disk stay there). A symlink is removed, never what it points to; True
    when the capture file was removed, False when there was none. OSError when something cannot be."""
    raw = Path(root) / RAW / str(int(step))
    if raw.is_symlink():
        raw.unlink()
    elif raw.is_dir():
        for entry in raw.iterdir():   # only the ranks' files (and a write's leftover temporary) are here
            entry.unlink()
        raw.rmdir()
    try:
        os.unlink(capture_path(root, step))
    except FileNotFoundError:
        return False
    return True


def take_trigger(root: str | os.PathLike[str]) -> bool | None:
    """Consume ``<root>/trigger`` (a manual capture request). True: taken; False: none; None: a
    trigger file that cannot be removed (the caller must stop looking, or it would fire forever)."""
    path = Path(root) / TRIGGER
    if not os.path.lexists(path):
        return False
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    except OSError:
        return None
    return True
