"""Tiny TCP probe (server + client) to measure what a link fault really does: RTT and bulk throughput.

Why not ping/iperf: neither is guaranteed installed; this needs only the Python that runs the ranks.
Server: ``python netprobe.py serve --port P`` (prints ``ready``; handles ``rtt`` and ``bulk`` clients).
Client: ``python netprobe.py rtt --host H --port P --count 50`` or
``python netprobe.py bulk --host H --port P --mbytes 20`` (``--reverse`` makes the server send); each
prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import threading
import time

CHUNK = 1 << 16


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        got = s.recv(n - len(buf))
        if not got:
            raise ConnectionError("peer closed")
        buf += got
    return bytes(buf)


def _handle(conn: socket.socket) -> None:
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        mode = _recv_exact(conn, 1)
        if mode == b"r":  # echo 1-byte pings until closed
            while True:
                b = conn.recv(1)
                if not b:
                    return
                conn.sendall(b)
        elif mode == b"b":  # client sends N bytes, we ack with 1 byte
            n = int.from_bytes(_recv_exact(conn, 8), "big")
            left = n
            while left:
                got = conn.recv(min(CHUNK * 4, left))
                if not got:
                    return
                left -= len(got)
            conn.sendall(b"k")
        elif mode == b"s":  # we send N bytes
            n = int.from_bytes(_recv_exact(conn, 8), "big")
            payload = b"\0" * CHUNK
            left = n
            while left:
                k = min(CHUNK, left)
                conn.sendall(payload[:k])
                left -= k
            _recv_exact(conn, 1)


def serve(port: int, host: str = "0.0.0.0") -> None:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, port))
    srv.listen(16)
    print("ready", flush=True)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=_handle, args=(conn,), daemon=True).start()


def rtt(host: str, port: int, count: int, timeout: float = 30) -> dict[str, float]:
    """Round-trip times of 1-byte TCP ping-pongs (ms)."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(b"r")
        samples = []
        for _ in range(count):
            t0 = time.perf_counter()
            s.sendall(b"x")
            _recv_exact(s, 1)
            samples.append((time.perf_counter() - t0) * 1e3)
    samples.sort()
    return {"rtt_ms_median": statistics.median(samples), "rtt_ms_min": samples[0], "rtt_ms_max": samples[-1]}


def bulk(host: str, port: int, mbytes: float, reverse: bool = False) -> dict[str, float]:
    """Throughput of one TCP stream (Mbit/s), client->server or, with reverse, server->client."""
    n = int(mbytes * 1e6)
    with socket.create_connection((host, port), timeout=120) as s:
        t0 = time.perf_counter()
        if not reverse:
            s.sendall(b"b" + n.to_bytes(8, "big"))
            payload = b"\0" * CHUNK
            left = n
            while left:
                k = min(CHUNK, left)
                s.sendall(payload[:k])
                left -= k
            _recv_exact(s, 1)
        else:
            s.sendall(b"s" + n.to_bytes(8, "big"))
            left = n
            while left:
                got = s.recv(min(CHUNK * 4, left))
                if not got:
                    raise ConnectionError("server closed")
                left -= len(got)
            s.sendall(b"k")
        dt = time.perf_counter() - t0
    return {"mbit_s": n * 8 / dt / 1e6, "seconds": dt, "bytes": n}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("serve")
    p.add_argument("--port", type=int, required=True)
    p = sub.add_parser("rtt")
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--count", type=int, default=50)
    p.add_argument("--timeout", type=float, default=30)
    p = sub.add_parser("bulk")
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--mbytes", type=float, default=20)
    p.add_argument("--reverse", action="store_true")
    a = ap.parse_args(argv)
    if a.cmd == "serve":
        serve(a.port)
    elif a.cmd == "rtt":
        print(json.dumps(rtt(a.host, a.port, a.count, a.timeout)))
    else:
        print(json.dumps(bulk(a.host, a.port, a.mbytes, a.reverse)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
