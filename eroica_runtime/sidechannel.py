"""The MPI side channel: the only module that touches MPI.

eroica talks over a duplicate of MPI_COMM_WORLD, never over the training's process groups, so it keeps
working while NCCL/gloo is stuck. Every wait here is bounded: nonblocking call + Test polling with a
deadline. A miss raises DeadlineMissed (naming the missing ranks where the operation can tell), and
the runtime then switches itself off on that rank while training continues.

Payloads are bytes (msgpack produced by the caller) or small numpy int arrays — never pickled objects.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

TAG_GATHER = 7100
TAG_PROBE = 30300   # and TAG_PROBE + 1 for the results


class SideChannelError(RuntimeError):
    """MPI cannot be used here (not available, wrong launch, or a peer is gone)."""


class DeadlineMissed(SideChannelError):
    def __init__(self, what: str, missing: list[int] | None = None) -> None:
        self.what = what
        self.missing = missing or []
        who = f"; missing ranks: {self.missing}" if self.missing else ""
        super().__init__(f"side-channel deadline missed in {what}{who}")


def _poll(test: Callable[[], bool], deadline: float) -> bool:
    """Spin politely until test() is true or the deadline passes (sleeping, so no core is burnt)."""
    pause = 0.0001
    while not test():
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.005)
    return True


def leave_mpi(*, failing: bool) -> None:
    """At exit of a rank whose side channel never came up: finalize MPI if it was initialized.

    Under MPICH's hydra a rank that exits without MPI_Finalize makes it kill every other rank at
    once, so a healthy rank must finalize whatever state eroica is in; a failing one must not (its
    failure should end the job, and finalizing would wait for the healthy ranks to finish).
    """
    mpi = sys.modules.get("mpi4py.MPI")
    if failing or mpi is None:
        return
    try:
        if mpi.Is_initialized() and not mpi.Is_finalized():
            mpi.Finalize()
    except Exception:
        pass


@dataclass(slots=True, eq=False)
class Vote:
    """One Iallreduce in flight (its buffers must live until it completes). Equal only to itself: a
    vote removed from behind others (``wait_vote``) was compared field by field, numpy buffers and all."""

    req: object
    send: np.ndarray
    recv: np.ndarray
    done: bool = False


class SideChannel:
    """World / node / leader communicators and deadline-bounded operations on them."""

    def __init__(self, deadline_s: float = 20.0) -> None:
        try:
            import mpi4py

            # eroica decides at exit whether finalizing is safe: MPICH's MPI_Finalize waits for every
            # rank, so a failing rank that finalized would sit there until the healthy ones finish
            mpi4py.rc.finalize = False
            from mpi4py import MPI
        except Exception as exc:  # ImportError, RuntimeError from a broken libmpi, ...
            reason = " ".join(str(exc).split())  # one line, whatever the loader printed
            raise SideChannelError(f"MPI unavailable ({type(exc).__name__}: {reason})") from None
        self.MPI = MPI
        self._finalize = MPI.Finalize   # MPI_Finalize itself (the job's MPI.Finalize is wrapped: before_job_finalize)
        world = MPI.COMM_WORLD
        expected = os.environ.get("WORLD_SIZE")
        if expected and int(expected) != world.Get_size():
            raise SideChannelError(
                f"MPI world size {world.Get_size()} != WORLD_SIZE {expected}: the ranks were not started "
                "as one MPI job (e.g. srun --mpi=none); start them with eroica-run or srun --mpi=pmi2")
        # the hang watchdog talks from its own thread while the main thread may be inside MPI too
        self.thread_multiple = MPI.Query_thread() == MPI.THREAD_MULTIPLE
        # requests given up on (a deadline passed), with the buffers MPI may still write or read; each
        # with whether it is a receive (the only kind ``drain`` cancels)
        self._pending: list[tuple[Any, tuple[Any, ...], bool]] = []
        self._votes: list[Vote] = []   # in flight, oldest first
        # Creating communicators is blocking and has no deadline: only start once every rank is known
        # to be here and to go on (a barrier, then an agreement, each bounded; a rank that gave up on
        # the first never posts the second, so nobody proceeds into a blocking call alone).
        deadline = time.monotonic() + deadline_s
        if not _poll(world.Ibarrier().Test, deadline):
            raise SideChannelError(f"not every rank started eroica within {deadline_s:.0f}s")
        if not self._agree_on(world, True, deadline):
            raise SideChannelError(f"not every rank started eroica within {deadline_s:.0f}s")
        self.world = world.Dup()
        # the end-of-job barrier's and the votes' own communicators: collectives match in the order each
        # rank calls them on a communicator, and a rank that voted on steps its peers never took (rank 0
        # stepping alone through a DataLoader while the others waited, or taking more steps than they
        # did) leaves votes in flight they never match. With the votes on the world, the end's barrier
        # there met one of them and never completed: a job whose ranks had all finished never ended
        self.end = world.Dup()
        self.voting = world.Dup()
        # the agreements to count steps at backward()s or batches (runtime._adopt_gate) and to follow
        # another optimizer (runtime._switch_gate): a communicator each, since only the ranks that reach
        # one post it, and a request one rank posted alone must never meet its peers' other request
        self.agreements = {"adopt": world.Dup(), "switch": world.Dup()}
        self.rank = self.world.Get_rank()
        self.size = self.world.Get_size()
        split = os.environ.get("EROICA_NODE_SPLIT", "shared")
        if split == "host":
            # a launcher that makes shared-memory splitting meaningless (containers sharing /dev/shm)
            import zlib
            self.node = self.world.Split(zlib.crc32(MPI.Get_processor_name().encode()) & 0x7FFFFFFF, self.rank)
        elif split.isdigit() and int(split) > 0:
            # emulated nodes of N consecutive ranks (benchmarks and tests of the hierarchy on one machine)
            self.node = self.world.Split(self.rank // int(split), self.rank)
        else:
            self.node = self.world.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.is_leader = self.node.Get_rank() == 0
        self.leaders = self.world.Split(0 if self.is_leader else MPI.UNDEFINED, self.rank)
        # world ranks of this node's members (buffer collectives: nothing is ever pickled)
        mine = np.array([self.rank], dtype=np.int64)
        members = np.zeros(self.node.Get_size(), dtype=np.int64)
        self.node.Allgather(mine, members)
        self.node_ranks = [int(r) for r in members]
        self.leader_world_rank = self.node_ranks[0]

    def _agree_on(self, comm: object, ok: bool, deadline: float) -> bool:
        """True when every rank of ``comm`` says ok before ``deadline`` (Iallreduce MIN, bounded)."""
        send = np.array([1 if ok else 0], dtype=np.int64)
        recv = np.zeros_like(send)
        req = comm.Iallreduce(send, recv, op=self.MPI.MIN)  # type: ignore[attr-defined]
        if not _poll(req.Test, deadline):
            self._pending.append((req, (send, recv), False))
            raise DeadlineMissed("agreement")
        return bool(recv[0])

    def agree(self, ok: bool, deadline_s: float, what: str = "agreement") -> bool:
        """Whether every rank says ok (a bounded Iallreduce MIN on the side channel)."""
        try:
            return self._agree_on(self.world, ok, time.monotonic() + deadline_s)
        except DeadlineMissed:
            raise DeadlineMissed(what) from None

    # ---- nonblocking vote -------------------------------------------------------------------------
    def post_vote(self, values: np.ndarray) -> Vote:
        """Start an Iallreduce(MAX) of a small int64 array; complete it later with wait_vote().

        Posting also advances every vote still in flight by one Test each. MPICH moves a nonblocking
        collective on only inside MPI calls, one stage per call at most, and the training's own
        collectives (gloo, NCCL) never enter MPI: a vote touched only when it is due would still be
        at its first stage then, and completing it would wait for the slowest rank's boundary (a
        2-3 ms barrier per step, measured). Touched at every boundary, it is (nearly) done when due.
        """
        for vote in self._votes:
            if not vote.done:
                vote.done = vote.req.Test()  # type: ignore[attr-defined]
        send = np.ascontiguousarray(values, dtype=np.int64)
        recv = np.zeros_like(send)
        vote = Vote(self.voting.Iallreduce(send, recv, op=self.MPI.MAX), send, recv)
        self._votes.append(vote)
        return vote

    def post_min(self, values: np.ndarray) -> Vote:
        """Start an Iallreduce(MIN) of a small float64 array on the voting communicator, moved on by
        every later ``post_vote``; complete it with ``wait_vote``. Every rank posts it at the same step
        boundary (a window's close), so its order among the votes is the same everywhere."""
        send = np.ascontiguousarray(values, dtype=np.float64)
        recv = np.zeros_like(send)
        vote = Vote(self.voting.Iallreduce(send, recv, op=self.MPI.MIN), send, recv)
        self._votes.append(vote)
        return vote

    def post_max(self, values: np.ndarray, about: str) -> Vote:
        """Start an Iallreduce(MAX) on the communicator of the agreement ``about`` ("adopt", "switch");
        ``done`` says when every rank posted it."""
        send = np.ascontiguousarray(values, dtype=np.int64)
        recv = np.zeros_like(send)
        return Vote(self.agreements[about].Iallreduce(send, recv, op=self.MPI.MAX), send, recv)

    @staticmethod
    def done(vote: Vote) -> bool:
        """One Test of ``vote`` (never waits): True once it completed."""
        if not vote.done:
            vote.done = bool(vote.req.Test())  # type: ignore[attr-defined]
        return vote.done

    def settle(self, vote: Vote) -> bool:
        """``done`` once more than ``vote``'s collective has stages, never waiting: whether it completed.

        MPICH moves a nonblocking collective on one stage per MPI call, so a request whose peers' parts
        are all in completes only at the call after its last stage's. An agreement rank 0 of 2 posted
        first, its peer posting it 0.1 s later while rank 0 paused, never completed on rank 0: its one
        Test a pass found the peer's part but not the end (a second Test did, in 3 of 3 trials), and the
        peer, past the margin, called MPI no more: rank 0 never said why it counted no steps in a loop
        without a collective (the copy-on-read launch test, 2 of 90 runs here)."""
        for _ in range(max(self.size - 1, 1).bit_length() + 1):
            if self.done(vote):
                return True
        return False

    def progress(self, vote: Vote, deadline: float) -> bool:
        """Test ``vote`` until it completes or ``deadline`` (time.monotonic()) passes; whether it did."""
        return _poll(lambda: self.done(vote), deadline)

    def abandon(self, vote: Vote) -> None:
        """A request that may never complete (peers never post it): its buffers live until ``drain``."""
        if not vote.done:
            self._pending.append((vote.req, (vote.send, vote.recv), False))

    def wait_vote(self, vote: Vote, deadline_s: float) -> np.ndarray:
        if not vote.done and not _poll(vote.req.Test, time.monotonic() + deadline_s):  # type: ignore[attr-defined]
            raise DeadlineMissed("vote (Iallreduce)")
        self._votes.remove(vote)
        return vote.recv

    def barrier(self, deadline_s: float, what: str = "barrier", comm: object = None) -> None:
        """Ibarrier on ``comm`` (the world by default), completed within ``deadline_s`` seconds."""
        req = (self.world if comm is None else comm).Ibarrier()  # type: ignore[attr-defined]
        if not _poll(req.Test, time.monotonic() + deadline_s):
            self._pending.append((req, (), False))
            raise DeadlineMissed(what)

    # ---- bytes to a root, point to point (so a missing rank can be named) -----------------------------
    def _send(self, comm: object, data: bytes, dest: int, tag: int, deadline: float, what: str) -> None:
        buf = np.frombuffer(data, dtype=np.uint8) if data else np.zeros(0, dtype=np.uint8)
        req = comm.Isend([buf, self.MPI.BYTE], dest=dest, tag=tag)  # type: ignore[attr-defined]
        if not _poll(req.Test, deadline):
            self._pending.append((req, (buf,), False))
            raise DeadlineMissed(what, [dest])

    def _recv_all(self, comm: object, sources: list[int], tag: int, deadline: float) -> dict[int, bytes]:
        """Receive one message from each source (any order) until the deadline."""
        MPI = self.MPI
        got: dict[int, bytes] = {}
        status = MPI.Status()
        waiting = set(sources)

        def step() -> bool:
            while waiting and comm.Iprobe(source=MPI.ANY_SOURCE, tag=tag, status=status):  # type: ignore[attr-defined]
                src = status.Get_source()
                n = status.Get_count(MPI.BYTE)
                buf = np.empty(n, dtype=np.uint8)
                comm.Recv([buf, MPI.BYTE], source=src, tag=tag)  # type: ignore[attr-defined]
                if src in waiting:
                    got[src] = buf.tobytes()
                    waiting.discard(src)
            return not waiting

        _poll(step, deadline)
        return got

    def _node_bundle(self, data: bytes, deadline: float, deadline_s: float, tag: int,
                     ) -> tuple[dict[int, bytes], list[int]] | None:
        """Node level of a gather: a member sends ``data`` to its leader (None); the leader returns
        its node's {world rank: bytes} (its own included) and the members it did not hear from,
        giving up a quarter of the deadline early so it can still forward in time."""
        if not self.is_leader:
            self._send(self.node, data, 0, tag, deadline, "gather (to node leader)")
            return None
        others = list(range(1, self.node.Get_size()))
        got = self._recv_all(self.node, others, tag, deadline - 0.25 * deadline_s)
        bundle = {self.node_ranks[0]: data}
        bundle.update({self.node_ranks[i]: b for i, b in got.items()})
        return bundle, [self.node_ranks[i] for i in others if i not in got]

    def _from_leaders(self, payload: bytes, deadline: float, deadline_s: float, tag: int) -> dict[int, bytes] | None:
        """Leader level: every leader but rank 0 sends ``payload`` (None); rank 0 returns each leader's
        payload by world rank (its own included; leaders that missed the deadline absent)."""
        if self.rank != 0:
            # leaders' communicator: world rank 0 is a leader and has leaders-rank 0
            self._send(self.leaders, payload, 0, tag, deadline + 0.25 * deadline_s, "gather (to rank 0)")
            return None
        n_leaders = self.leaders.Get_size()
        sub = self._recv_all(self.leaders, list(range(1, n_leaders)), tag, deadline)
        srcs = list(sub)
        out = {0: payload}
        for src, w in zip(srcs, self._leader_world_ranks(srcs), strict=True):
            out[w] = sub.pop(src)
        return out

    def _leader_world_ranks(self, ranks: list[int]) -> list[int]:
        """World ranks of leaders-communicator ranks (a local lookup, no communication)."""
        if not ranks:
            return []
        mine, world = self.leaders.Get_group(), self.world.Get_group()
        try:
            return [int(w) for w in mine.Translate_ranks(ranks, world)]
        finally:
            mine.Free()
            world.Free()

    def gather_bytes(self, data: bytes, deadline_s: float, tag_base: int = TAG_GATHER,
                     ) -> tuple[dict[int, bytes], list[int]] | None:
        """Hierarchical gather: node ranks -> node leader -> world rank 0.

        Returns ({world rank: bytes}, missing world ranks) on rank 0, None elsewhere. Leaders forward
        what they have when their deadline passes, so one dead rank costs one deadline, not a hang.
        """
        import msgpack

        deadline = time.monotonic() + deadline_s
        node = self._node_bundle(data, deadline, deadline_s, tag_base)
        if node is None:
            return None
        bundle, missing = node
        packed = msgpack.packb({"blobs": bundle, "missing": missing}, use_bin_type=True)
        sub = self._from_leaders(packed, deadline, deadline_s, tag_base + 1)
        if sub is None:
            return None
        sub.pop(0)
        all_blobs: dict[int, bytes] = dict(bundle)
        all_missing = set(missing)
        for src in list(sub):
            # drop each bundle once merged: at 100,000 ranks the bundles, the merged map and the
            # capture file rank 0 then writes are 1.1 GB each; never all three at once
            doc = msgpack.unpackb(sub.pop(src), raw=False, strict_map_key=False)
            all_blobs.update({int(k): v for k, v in doc["blobs"].items()})
            all_missing.update(int(r) for r in doc["missing"])
        all_missing.update(r for r in range(self.size) if r not in all_blobs)
        return all_blobs, sorted(all_missing - set(all_blobs))

    def gather_reduced(self, data: bytes, deadline_s: float, reduce: Callable[[dict[int, bytes], list[int]], bytes],
                       tag_base: int = TAG_GATHER) -> tuple[dict[int, bytes], list[int]] | None:
        """Hierarchical gather with leader-side reduction: each node leader turns its node's
        {world rank: bytes} and missing ranks into one payload with ``reduce`` (pure code, passed in:
        this module only moves bytes) and forwards that. Returns ({leader world rank: payload},
        world ranks of the leaders that sent nothing in time) on rank 0, None elsewhere; the same
        deadlines as ``gather_bytes``."""
        deadline = time.monotonic() + deadline_s
        node = self._node_bundle(data, deadline, deadline_s, tag_base)
        if node is None:
            return None
        payload = reduce(*node)
        got = self._from_leaders(payload, deadline, deadline_s, tag_base + 1)
        if got is None:
            return None
        leaders = self._leader_world_ranks(list(range(self.leaders.Get_size())))
        return got, sorted(w for w in leaders if w not in got)

    # ---- link probe (node leaders) -----------------------------------------------------------------
    def probe_links(self, deadline_s: float, small: int = 8, large: int = 1 << 20, reps: int = 5,
                    large_reps: int = 3) -> dict[str, dict[str, float]] | None:
        """Latency and bandwidth of every node leader's links, in ring-shift rounds.

        Collective over all ranks (non-leaders return at once). In each round every leader sends to
        the leader ``shift`` places ahead while receiving from the one ``shift`` behind (shifts 1 and
        n/2), so a slow host is slow in every round while its neighbours are slow in one only: the
        per-host figure is its best round (min latency, max bandwidth), and within a round its best
        exchange: a slow link is slow in every exchange, while a leader that was not scheduled in time
        (shared cores) makes one exchange slow. With the middle of two exchanges instead, healthy links
        on this 2-core machine read 0.37-6.5 Gbps, so that one of them could stand as far below the
        others as a 100 Mbit/s link (0.08 Gbps) does. Returns {host: {latency_us, bandwidth_gbps}} on
        world rank 0, None elsewhere.
        """
        import socket

        import msgpack

        if not self.is_leader:
            return None
        comm = self.leaders
        n, me = comm.Get_size(), comm.Get_rank()
        if n < 2:
            return None
        deadline = time.monotonic() + deadline_s
        lat, bw = [], []
        for shift in sorted({1, n // 2} if n > 3 else {1}):
            for size, count, sink in ((small, reps, lat), (large, large_reps, bw)):
                buf = np.zeros(size, dtype=np.uint8)
                times = []
                for _ in range(count):
                    # start every exchange together: otherwise a slow host makes its neighbours late
                    # for their next exchange, and the lateness travels round the ring
                    self.barrier(deadline - time.monotonic(), "link probe (barrier)", comm)
                    times.append(self._shift(comm, buf, (me + shift) % n, (me - shift) % n, deadline))
                best = min(times)
                sink.append(best * 1e6 if size == small else size * 8 / best / 1e9)
        mine = msgpack.packb({"host": socket.gethostname(), "latency_us": min(lat),
                              "bandwidth_gbps": max(bw)})
        rows = self._recv_all(comm, list(range(1, n)), TAG_PROBE + 1, deadline) if me == 0 else None
        if me != 0:
            self._send(comm, mine, 0, TAG_PROBE + 1, deadline, "link probe (to rank 0)")
            return None
        out: dict[str, dict[str, float]] = {}
        for raw in [mine, *(rows or {}).values()]:
            doc = msgpack.unpackb(raw, raw=False)
            out[str(doc["host"])] = {"latency_us": round(float(doc["latency_us"]), 2),
                                     "bandwidth_gbps": round(float(doc["bandwidth_gbps"]), 4)}
        return out

    def _shift(self, comm: object, buf: np.ndarray, dest: int, source: int, deadline: float) -> float:
        """Send ``buf`` to ``dest`` while receiving as much from ``source``; seconds until both are done."""
        MPI = self.MPI
        recv = np.empty_like(buf)
        t0 = time.perf_counter()
        rreq = comm.Irecv([recv, MPI.BYTE], source=source, tag=TAG_PROBE)  # type: ignore[attr-defined]
        sreq = comm.Isend([buf, MPI.BYTE], dest=dest, tag=TAG_PROBE)  # type: ignore[attr-defined]
        if not _poll(lambda: bool(MPI.Request.Testall([rreq, sreq])), deadline):
            self._pending += [(rreq, (recv,), True), (sreq, (buf,), False)]
            raise DeadlineMissed("link probe", [dest, source])
        return time.perf_counter() - t0

    # ---- shutdown ------------------------------------------------------------------------------------
    def wait_all_at_end(self, every_s: float = 0.05, quick_s: float = 2.0) -> None:
        """Return once every rank has called this: a nonblocking barrier, polled with no deadline.

        Why no deadline: a rank still working after its program's last step (rank 0 saving the final
        model for minutes) must not be cut short, as MPI_Finalize, which waits for every rank too,
        would not. Why not MPI_Finalize itself: a rank inside it cannot take part in the hang
        watchdog's looks, so peers that wait for it in a collective forever (a rank that ran fewer
        steps) were read as "dead or frozen" and never ended; meanwhile its watchdog answers that this
        rank's program has returned (eroica_runtime.hang), and rank 0's ends the job when the others
        can never get past their collective. Polled as ``_poll`` does (from 0.1 ms up to 5 ms) for its
        first ``quick_s``, then every ``every_s``: the barrier's rounds move only when both sides Test,
        and at a flat 50 ms every rank of a 4-rank job here stayed 0.45 s in it after the last one
        had arrived; at up to 50 ms from the start, two of them still stayed 0.25 s (their peers,
        out already, spun in MPI_Finalize meanwhile) and the job ended 0.28 s later than at 5 ms."""
        req = self.end.Ibarrier()
        pause, slow_from = 0.0001, time.monotonic() + quick_s
        while not req.Test():
            time.sleep(pause)
            pause = min(pause * 2, 0.005 if time.monotonic() < slow_from else every_s)

    def drain(self, timeout_s: float = 2.0) -> None:
        """Give the requests left behind by a missed deadline until ``timeout_s`` to complete, then
        cancel the receives among them and leave the rest to MPI_Finalize.

        Why only receives: MPICH crashed the rank in MPI_Cancel of a send. A rank that reached a gather
        after its root had given up on it (a stall past the deadline on its way there) left its
        summary's Isend unreceived; cancelling it at the job's end was a SIGSEGV, and a job whose every
        rank had trained to the end failed (rc 139). MPI 4.0 deprecates cancelling sends, and a
        nonblocking collective may never be cancelled; MPI_Finalize with them still in flight is
        quiet (MPICH 5.0, tests/test_runtime.py)."""
        deadline = time.monotonic() + timeout_s
        self._pending += [(v.req, (v.send, v.recv), False) for v in self._votes if not v.done]
        self._votes.clear()
        unfinished = []
        for req, buffers, receive in self._pending:
            try:
                if not _poll(req.Test, deadline):
                    if receive:
                        req.Cancel()
                    unfinished.append((req, buffers, receive))
            except Exception:
                pass
        self._pending = unfinished   # their buffers live as long as MPI may use them

    def finalize(self) -> None:
        """MPI_Finalize (waits for every rank: call it only on a normal, collective exit)."""
        if not self.MPI.Is_finalized():
            self._finalize()

    def before_job_finalize(self, job_end: Callable[[], None]) -> None:
        """Run ``job_end`` (eroica's own end of job, which finalizes MPI) when the job calls
        ``MPI.Finalize()`` itself, then finalize only if that did not.

        A script that uses mpi4py too (rank discovery, its own MPI collectives) may finalize MPI at its
        end; eroica's job end at exit then used MPI after MPI_Finalize, MPICH aborted every rank
        ("Attempting to use an MPI routine ... after finalizing MPICH") and a healthy job failed. Every
        rank calls MPI_Finalize (it is collective), so eroica's collective job end runs there instead.
        A job that calls ``MPI.Finalize`` through another name it took before eroica started cannot
        be seen (none: sitecustomize starts eroica before the script's imports)."""
        mpi, original = self.MPI, self._finalize

        def Finalize() -> None:   # noqa: N802 - mpi4py's name
            try:
                job_end()
            finally:
                if not mpi.Is_finalized():
                    original()

        Finalize.__doc__ = getattr(original, "__doc__", None)
        mpi.Finalize = Finalize
