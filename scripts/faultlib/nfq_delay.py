"""NFQUEUE packet delayer: holds every packet of one netfilter queue for a fixed time, then accepts it.

Why this exists: the kernel here has no netem, so a fixed link delay is made by an iptables
``-j NFQUEUE`` rule on a bridge's FORWARD chain plus this process, which sees each queued packet and
gives the ACCEPT verdict ``delay`` seconds later. It talks the nfnetlink_queue protocol directly over
an AF_NETLINK socket, so it needs no libnetfilter_queue and no PyPI package.

Packets are released in arrival order with a *batch* verdict (NFQNL_MSG_VERDICT_BATCH accepts every id
up to the given one), so a lost netlink message can never strand a packet. Queue entries carry only
metadata (NFQNL_COPY_META) and GSO super-packets are queued whole (NFQA_CFG_F_GSO), which keeps a
Python loop fast enough for a TCP stream of several hundred Mbit/s.

Run it inside the namespace that owns the rule:
``ip netns exec <ns> python -m faultlib.nfq_delay --queue 101 --delay-ms 20``.
It prints ``ready`` once bound, and exits cleanly (unbinding) on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import collections
import os
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_NO_ENOBUFS = 5
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = 0
NFQNL_MSG_VERDICT_BATCH = 3
NFQNL_MSG_CONFIG = 2
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQA_CFG_MASK = 4
NFQA_CFG_FLAGS = 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_CFG_CMD_UNBIND = 2
NFQNL_COPY_META = 1
NFQA_CFG_F_GSO = 1 << 2
NF_ACCEPT = 1
NLM_F_REQUEST = 1
NLM_F_ACK = 4
NLMSG_ERROR = 2
NLMSG_HDR = struct.Struct("=IHHII")


def _attr(kind: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * ((4 - length % 4) % 4)


class NfQueue:
    """A bound nfnetlink_queue: receive packet ids, send batch ACCEPT verdicts."""

    def __init__(self, queue: int, maxlen: int = 65536) -> None:
        self.queue = queue
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)  # SO_RCVBUFFORCE (root)
        except OSError:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
        self.sock.bind((0, 0))
        self.seq = 0
        self._config(_attr(NFQA_CFG_CMD, struct.pack("!BBH", NFQNL_CFG_CMD_BIND, 0, 0)))
        self._config(
            _attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))
            + _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", maxlen))
            + _attr(NFQA_CFG_MASK, struct.pack("!I", NFQA_CFG_F_GSO))
            + _attr(NFQA_CFG_FLAGS, struct.pack("!I", NFQA_CFG_F_GSO))
        )

    def _send(self, msg_type: int, body: bytes, flags: int) -> int:
        self.seq += 1
        nfgen = struct.pack("!BBH", socket.AF_UNSPEC, 0, self.queue)
        payload = nfgen + body
        hdr = NLMSG_HDR.pack(NLMSG_HDR.size + len(payload), (NFNL_SUBSYS_QUEUE << 8) | msg_type, flags, self.seq, 0)
        self.sock.send(hdr + payload)
        return self.seq

    def _config(self, body: bytes) -> None:
        """Send a config message and wait for its ack, so a failed bind is an error, not a stall."""
        seq = self._send(NFQNL_MSG_CONFIG, body, NLM_F_REQUEST | NLM_F_ACK)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            data = self.sock.recv(1 << 16)
            off = 0
            while off + NLMSG_HDR.size <= len(data):
                length, mtype, _flags, mseq, _pid = NLMSG_HDR.unpack_from(data, off)
                if mtype == NLMSG_ERROR and mseq == seq:
                    (err,) = struct.unpack_from("=i", data, off + NLMSG_HDR.size)
                    if err:
                        raise OSError(-err, f"nfqueue config failed: {os.strerror(-err)}")
                    return
                off += (length + 3) & ~3
        raise TimeoutError("no ack from nfnetlink_queue")

    def fileno(self) -> int:
        return self.sock.fileno()

    def read_ids(self) -> list[int]:
        """Drain the socket without blocking; return the packet ids in arrival order."""
        ids: list[int] = []
        while True:
            try:
                data = self.sock.recv(1 << 20, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return ids
            off = 0
            while off + NLMSG_HDR.size <= len(data):
                length, mtype, _flags, _seq, _pid = NLMSG_HDR.unpack_from(data, off)
                if length < NLMSG_HDR.size:
                    break
                if mtype == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                    a = off + NLMSG_HDR.size + 4  # skip nfgenmsg
                    end = off + length
                    while a + 4 <= end:
                        alen, atype = struct.unpack_from("=HH", data, a)
                        if alen < 4:
                            break
                        if (atype & 0x7FFF) == NFQA_PACKET_HDR:
                            ids.append(struct.unpack_from("!I", data, a + 4)[0])
                            break
                        a += (alen + 3) & ~3
                off += (length + 3) & ~3

    def accept_upto(self, packet_id: int) -> None:
        """ACCEPT every queued packet with id <= packet_id."""
        self._send(NFQNL_MSG_VERDICT_BATCH, _attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, packet_id)), NLM_F_REQUEST)

    def close(self) -> None:
        try:
            self._send(NFQNL_MSG_CONFIG, _attr(NFQA_CFG_CMD, struct.pack("!BBH", NFQNL_CFG_CMD_UNBIND, 0, 0)), NLM_F_REQUEST)
        except OSError:
            pass
        self.sock.close()


def run(queue: int, delay_s: float, stop_after: float | None = None) -> int:
    """Delay every packet of ``queue`` by ``delay_s``; return the number of packets released."""
    q = NfQueue(queue)
    stopping = False

    def _stop(_sig: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    print("ready", flush=True)
    pending: collections.deque[tuple[float, int]] = collections.deque()
    released = 0
    late: list[float] = []   # seconds each verdict came after its due time (this process's own lag)
    t_end = time.monotonic() + stop_after if stop_after else None
    try:
        while not stopping:
            now = time.monotonic()
            if t_end is not None and now >= t_end:
                break
            timeout = 0.2 if not pending else max(0.0, pending[0][0] - now)
            try:
                ready, _, _ = select.select([q], [], [], timeout)
            except InterruptedError:
                continue
            now = time.monotonic()
            if ready:
                for pid in q.read_ids():
                    pending.append((now + delay_s, pid))
            last = -1
            while pending and pending[0][0] <= now:
                due, last = pending.popleft()
                late.append(now - due)
                released += 1
            if last >= 0:
                q.accept_upto(last)
    finally:
        if pending:  # never strand packets: release everything still held
            q.accept_upto(pending[-1][1])
            released += len(pending)
        q.close()
    if late:
        late.sort()
        pick = [late[min(int(f * len(late)), len(late) - 1)] * 1e3 for f in (0.5, 0.9, 0.99)]
        print(f"late ms p50 {pick[0]:.2f} p90 {pick[1]:.2f} p99 {pick[2]:.2f} max {late[-1] * 1e3:.2f}",
              file=sys.stderr)
    return released


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queue", type=int, required=True)
    ap.add_argument("--delay-ms", type=float, required=True)
    ap.add_argument("--stop-after", type=float, default=None, help="seconds (for tests)")
    a = ap.parse_args(argv)
    n = run(a.queue, a.delay_ms / 1000.0, a.stop_after)
    print(f"released {n}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
