"""A rank's output through eroica_launch.output.LineFilter: what the console shows, however the
bytes were split into reads (pure logic; the real-launch behaviour is in test_launch.py)."""

from __future__ import annotations

import pytest

from eroica_launch.output import LineFilter

NOISE = b"USDT:2026-12-01 10:01:03 2986:2986 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
TOGGLE = (b"[W1201 12:55:23.796823256 profiler_kineto.cpp:814] Toggling CPU activity with GPU activity on may "
          b"result in traces with GPU events on arbitrary tracks\n")    # torch 2.13's, at each toggle
# torch's soft assert at the stop of eroica's window inside a job's own waiting profiler's step range
OPEN = b"[W1207 07:01:19.734715178 collection.cpp:664] Warning: Optimizer.step#AdamW.step (function operator())\n"
STREAM = (b"epoch 1\n" + TOGGLE + b"[rank1]:" + TOGGLE + OPEN + b"[rank2]:" + OPEN + b"[W1201 12:55:24.0 init.cpp:9] the job's own warning\n" + NOISE + b"\rloss 3.1 |###   |\rloss 2.9 |######|\n"
          + b"[rank1]:already prefixed\n" + NOISE.replace(b"USDT", b"STAGE") + b"USDT: a user's own line\n"
          + b"STAGE:2026-12-01 10:01:03 2986:2986 GenericActivityProfiler.cpp:806] Completed Stage: Collection\nend")


def _through(chunks: list[bytes], prefix: bytes) -> bytes:
    f = LineFilter(prefix)
    return b"".join(f.feed(c) for c in chunks) + f.flush()


@pytest.mark.parametrize("prefix", [b"", b"[rank1]:"])
def test_any_split_of_the_stream_shows_the_same_lines(prefix: bytes) -> None:
    whole = _through([STREAM], prefix)
    p = prefix
    assert whole == (p + b"epoch 1\n" + p + b"[W1201 12:55:24.0 init.cpp:9] the job's own warning\n" + p + b"\rloss 3.1 |###   |\rloss 2.9 |######|\n" + b"[rank1]:already prefixed\n"
                     + p + b"USDT: a user's own line\n" + p + b"end")
    for cut in range(1, len(STREAM)):
        assert _through([STREAM[:cut], STREAM[cut:]], prefix) == whole, cut
    assert _through([STREAM[i:i + 1] for i in range(len(STREAM))], prefix) == whole


def test_lines_stay_whole_and_a_half_drawn_line_goes_out_when_the_rank_pauses() -> None:
    """A line cut by a pipe read is held for its newline (another rank's line must not land inside
    it); a progress bar the rank stopped at (release: nothing more for PAUSE_S) goes out as it is."""
    f = LineFilter(b"[rank0]:")
    assert f.feed(b"epoch 1 loss") == b"" and f.feed(b" 2.5\nepo") == b"[rank0]:epoch 1 loss 2.5\n"
    assert f.release() == b"[rank0]:epo" and f.feed(b"ch 2\n") == b"ch 2\n"
    assert f.feed(b"\rprogress  50%|#####") == b""
    assert f.release() == b"[rank0]:\rprogress  50%|#####"
    assert f.feed(b"\rprogress 100%|##########|\n") == b"\rprogress 100%|##########|\n"
    assert f.feed(b"[ra") == b"" and f.release() == b""     # could be torch's own prefix: wait for more
    assert f.feed(b"nk0]:done\n") == b"[rank0]:done\n"
    assert f.feed(b"USDT:") == b"" and f.release() == b""   # could be kineto's: wait for its newline
    assert f.feed(b" held until its newline") == b"" and f.release() == b""
    assert f.flush() == b"[rank0]:USDT: held until its newline"


def test_a_console_that_went_away_does_not_stop_the_draining() -> None:
    """eroica-run piped into `head`: the console write fails, but the rank's pipe must still be read
    and stay open, or the rank would block on a full pipe or die of a broken one."""
    import io
    import os

    from eroica_launch.output import Pump

    class Gone(io.RawIOBase):
        def writable(self) -> bool:
            return True

        def write(self, b: object) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    import threading

    r, w = os.pipe()
    pump = Pump(os.fdopen(r, "rb"), Gone(), None, b"[rank0]:")
    pump.start()

    wrote: list[int] = []

    def rank() -> None:
        for _ in range(2000):           # 2 MB, far more than a pipe holds: blocks unless drained
            os.write(w, b"x" * 1000 + b"\n")
            wrote.append(1)
        os.close(w)

    writer = threading.Thread(target=rank, daemon=True)
    writer.start()
    writer.join(10)
    assert not writer.is_alive(), "the rank blocked on a full pipe"
    assert len(wrote) == 2000, "the rank's output pipe was closed under it"
    pump.join(10)
    assert not pump.is_alive()


def test_a_bar_redrawn_faster_than_the_pause_still_reaches_the_console() -> None:
    """tqdm redraws about every 0.1 s, so the pipe is never quiet for PAUSE_S: a partial line goes
    out once it has been held that long, not only after a silence."""
    import os
    import time

    from eroica_launch.output import Pump

    class Console:
        def __init__(self) -> None:
            self.first: float | None = None
            self.data = b""

        def write(self, b: bytes) -> int:
            self.first = self.first or time.monotonic()
            self.data += b
            return len(b)

        def flush(self) -> None:
            pass

    r, w = os.pipe()
    console = Console()
    pump = Pump(os.fdopen(r, "rb"), console, None, b"[rank0]:")
    pump.start()
    for i in range(40):                 # 2 s of redraws, one every 0.05 s, no newline until the end
        os.write(w, b"\rprogress %3d%%" % (i * 2.5))
        time.sleep(0.05)
    finished = time.monotonic()
    os.write(w, b"\rprogress 100%\n")
    os.close(w)
    pump.join(10)
    assert console.first is not None and console.first < finished - 1.0, "the bar was held until its newline"
    assert console.data.startswith(b"[rank0]:\rprogress") and console.data.endswith(b"\rprogress 100%\n")
