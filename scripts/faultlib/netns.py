"""Fake hosts for one machine: network namespaces on a bridge, each with its own hostname and address.

Why: eroica must name the culprit *host* and tell link faults from compute faults, so the bench needs
ranks that MPI and gloo treat as living on different machines, talking over a link we can slow down.

Layout (everything but one veth lives inside namespaces this module creates, so cleanup is deleting
them)::

    root ns: <prefix>-r (10.X.Y.254) ──┐
    <prefix>-sw:  bridge br0 ── r, s0, s1, …   (br_netfilter on; FORWARD rules for delays)
    <prefix>-h<i>: eth0 (10.X.Y.<i+1>)  ── veth peer of s<i>;  hostname "<prefix>-h<i>"

Hostnames: commands run as ``ip netns exec <ns> unshare --uts sh -c 'hostname <name>; exec …'`` and
``/etc/netns/<ns>/hosts`` (bind-mounted over /etc/hosts by ``ip netns exec``) resolves every fake
host plus the root namespace's own hostname to its address on this network.

Faults: :meth:`Cluster.limit_rate` (tbf on both ends of the host's veth, i.e. both directions),
:meth:`Cluster.add_delay` (iptables NFQUEUE on the switch's FORWARD chain + :mod:`nfq_delay`),
:meth:`Cluster.cut_link` (iptables DROP: a dead link, for hang tests).

Needs root, iproute2, util-linux ``unshare``; delays also need the ``iptables`` Debian package.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import json
import os
import random
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
STATE_DIR = Path("/run/eroica-faultlib")
PREFIX_RE = re.compile(r"^(erf[0-9a-f]{6})-")
NS_IFACE = "eth0"  # the interface name inside every host namespace (GLOO_SOCKET_IFNAME)


def _run(argv: Sequence[str], timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=check)


def unavailable_reason() -> str | None:
    """Why namespaces cannot be built here (None when they can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth, tc, iptables)"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"'{tool}' not installed"
    return None


def delay_unavailable_reason() -> str | None:
    """Why NFQUEUE delays cannot be used here (None when they can)."""
    return unavailable_reason() or (None if shutil.which("iptables") else "'iptables' not installed (apt-get install iptables)")


@dataclass
class Host:
    """One fake host: its namespace, hostname, address and the switch-side veth name."""

    index: int
    ns: str
    hostname: str
    addr: str
    switch_port: str


@dataclass
class Cluster:
    """A set of fake hosts on one bridge. Build with :func:`cluster`; every resource is torn down by close()."""

    prefix: str
    n_hosts: int
    subnet: ipaddress.IPv4Network = field(init=False)
    hosts: list[Host] = field(default_factory=list)
    switch_ns: str = ""
    root_if: str = ""
    root_addr: str = ""
    workdir: Path = field(init=False)
    launcher: Path = field(init=False)
    _helpers: list[subprocess.Popen[str]] = field(default_factory=list)
    _delays: dict[int, subprocess.Popen[str]] = field(default_factory=dict)
    _closed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # ---------------------------------------------------------------- build / teardown
    def _build(self) -> None:
        self.subnet = _free_subnet()
        base = self.subnet.network_address
        self.switch_ns = f"{self.prefix}-sw"
        self.root_if = f"{self.prefix}-r"
        self.root_addr = str(base + 254)
        self.workdir = Path(tempfile.mkdtemp(prefix=f"{self.prefix}-"))
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        (STATE_DIR / f"{self.prefix}.json").write_text(json.dumps({"pid": os.getpid(), "n": self.n_hosts}))
        sw = self.switch_ns
        _run(["ip", "netns", "add", sw])
        _run(["ip", "-n", sw, "link", "set", "lo", "up"])
        _run(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", sw, "link", "set", "br0", "up"])
        _run(["ip", "netns", "exec", sw, "sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1"])
        for i in range(self.n_hosts):
            h = Host(i, f"{self.prefix}-h{i}", f"{self.prefix}-h{i}", str(base + i + 1), f"s{i}")
            self.hosts.append(h)
            _run(["ip", "netns", "add", h.ns])
            _run(["ip", "-n", sw, "link", "add", h.switch_port, "type", "veth", "peer", "name", NS_IFACE, "netns", h.ns])
            _run(["ip", "-n", sw, "link", "set", h.switch_port, "master", "br0", "up"])
            _run(["ip", "-n", h.ns, "addr", "add", f"{h.addr}/24", "dev", NS_IFACE])
            _run(["ip", "-n", h.ns, "link", "set", NS_IFACE, "up"])
            _run(["ip", "-n", h.ns, "link", "set", "lo", "up"])
        _run(["ip", "link", "add", self.root_if, "type", "veth", "peer", "name", "r", "netns", sw])
        _run(["ip", "-n", sw, "link", "set", "r", "master", "br0", "up"])
        _run(["ip", "addr", "add", f"{self.root_addr}/24", "dev", self.root_if])
        _run(["ip", "link", "set", self.root_if, "up"])
        lines = ["127.0.0.1 localhost", f"{self.root_addr} {os.uname().nodename}"]
        lines += [f"{h.addr} {h.hostname}" for h in self.hosts]
        for h in self.hosts:
            d = Path("/etc/netns") / h.ns
            d.mkdir(parents=True, exist_ok=True)
            (d / "hosts").write_text("\n".join(lines) + "\n")
        self._write_launcher()

    def close(self) -> None:
        """Tear everything down; idempotent, never raises."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for p in list(self._delays.values()) + self._helpers:
            _stop_proc(p)
        self._delays.clear()
        self._helpers.clear()
        _destroy_prefix(self.prefix)
        with contextlib.suppress(OSError):
            shutil.rmtree(self.workdir)

    # ---------------------------------------------------------------- running things on a host
    def wrap(self, i: int, argv: Sequence[str]) -> list[str]:
        """argv that runs ``argv`` on host i: inside its namespace, under its own hostname."""
        h = self.hosts[i]
        return ["ip", "netns", "exec", h.ns, "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', h.hostname, *argv]

    def run(self, i: int, argv: Sequence[str], timeout: float = 60, **kw: object) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on host i and wait (capture_output, text)."""
        return subprocess.run(self.wrap(i, argv), capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload]

    def popen(self, i: int, argv: Sequence[str], **kw: object) -> subprocess.Popen[str]:
        """Start ``argv`` on host i; the process is killed by close()."""
        kw.setdefault("text", True)
        p: subprocess.Popen[str] = subprocess.Popen(self.wrap(i, argv), **kw)  # type: ignore[call-overload]
        self._helpers.append(p)
        return p

    # ---------------------------------------------------------------- link faults
    def limit_rate(self, i: int, mbit: float, direction: str = "both", latency_ms: float = 100) -> None:
        """tbf rate limit on host i's link. direction: 'egress' (host->bridge), 'ingress', or 'both'."""
        burst = max(16_000, int(mbit * 1e6 / 8 / 250))  # ~4 ms of traffic, at least 16 kB
        spec = ["root", "tbf", "rate", f"{mbit}mbit", "burst", str(burst), "latency", f"{latency_ms}ms"]
        h = self.hosts[i]
        if direction in ("egress", "both"):
            _run(["tc", "-n", h.ns, "qdisc", "replace", "dev", NS_IFACE, *spec])
        if direction in ("ingress", "both"):
            _run(["tc", "-n", self.switch_ns, "qdisc", "replace", "dev", h.switch_port, *spec])

    def clear_rate(self, i: int) -> None:
        """Remove host i's rate limits (both ends)."""
        h = self.hosts[i]
        _run(["tc", "-n", h.ns, "qdisc", "del", "dev", NS_IFACE, "root"], check=False)
        _run(["tc", "-n", self.switch_ns, "qdisc", "del", "dev", h.switch_port, "root"], check=False)

    def add_delay(self, i: int, ms: float, direction: str = "both") -> None:
        """Hold every packet to/from host i for ``ms`` on the bridge (RTT grows by 2*ms with 'both')."""
        reason = delay_unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        self.clear_delay(i)
        queue = 100 + i
        p = subprocess.Popen(
            ["ip", "netns", "exec", self.switch_ns, sys.executable, str(HERE / "nfq_delay.py"),
             "--queue", str(queue), "--delay-ms", str(ms)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self._delays[i] = p
        line = _readline_timeout(p, 10)
        if line.strip() != "ready":
            _stop_proc(p)
            raise RuntimeError(f"nfq delayer did not start: {line!r} {p.stderr.read() if p.stderr else ''}")
        for rule in self._delay_rules(i, queue, direction):
            _run(["ip", "netns", "exec", self.switch_ns, "iptables", "-w", "-A", *rule])

    def clear_delay(self, i: int) -> None:
        """Remove host i's delay rules, then stop its delayer (which releases what it holds)."""
        queue = 100 + i
        for rule in self._delay_rules(i, queue, "both"):
            _run(["ip", "netns", "exec", self.switch_ns, "iptables", "-w", "-D", *rule], check=False)
        p = self._delays.pop(i, None)
        if p is not None:
            _stop_proc(p)
            if p.stderr is not None:
                print(f"[nfq_delay h{i}] " + " / ".join(p.stderr.read().split("\n")).strip(" /"), flush=True)

    def cut_link(self, i: int) -> None:
        """Drop every packet to and from host i on the bridge (a dead link / NIC, for hang tests)."""
        reason = delay_unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        for rule in self._cut_rules(i):
            _run(["ip", "netns", "exec", self.switch_ns, "iptables", "-w", "-I", *rule])

    def restore_link(self, i: int) -> None:
        """Undo cut_link(i)."""
        for rule in self._cut_rules(i):
            _run(["ip", "netns", "exec", self.switch_ns, "iptables", "-w", "-D", *rule], check=False)

    def _cut_rules(self, i: int) -> list[list[str]]:
        port = self.hosts[i].switch_port
        return [["FORWARD", "-m", "physdev", f"--physdev-{d}", port, "-j", "DROP"] for d in ("in", "out")]

    def forward_rules(self) -> list[str]:
        """The switch's FORWARD rules (to check that faults were removed)."""
        out = _run(["ip", "netns", "exec", self.switch_ns, "iptables", "-w", "-S", "FORWARD"], check=False).stdout
        return [line for line in out.splitlines() if not line.startswith("-P")]

    def _delay_rules(self, i: int, queue: int, direction: str) -> list[list[str]]:
        port = self.hosts[i].switch_port
        tail = ["-j", "NFQUEUE", "--queue-num", str(queue), "--queue-bypass"]
        rules = []
        if direction in ("egress", "both"):
            rules.append(["FORWARD", "-m", "physdev", "--physdev-in", port, *tail])
        if direction in ("ingress", "both"):
            rules.append(["FORWARD", "-m", "physdev", "--physdev-out", port, *tail])
        return rules

    # ---------------------------------------------------------------- MPI / gloo layout
    def _write_launcher(self) -> None:
        """Write the hydra launcher-exec script that maps a fake hostname to ``ip netns exec``."""
        cases = "\n".join(
            f'  {h.hostname}) exec ip netns exec {h.ns} unshare --uts sh -c \'hostname {h.hostname} && exec sh -c "$0"\' "$cmd" ;;'
            for h in self.hosts
        )
        script = f"""#!/bin/sh
# hydra "ssh" launcher for fake hosts (generated by scripts/faultlib/netns.py).
# hydra calls: <this> [-x] <host> <command string>; run the command string in that host's namespace.
while [ $# -gt 0 ]; do case "$1" in -x|-q|-T|-n) shift ;; -o|-p|-l) shift 2 ;; *) break ;; esac; done
host="$1"; shift
cmd="$*"
case "$host" in
{cases}
  *) echo "netns launcher: unknown host $host" >&2; exit 127 ;;
esac
"""
        path = self.workdir / "launcher.sh"
        path.write_text(script)
        path.chmod(0o755)
        self.launcher = path

    def hostfile(self, ranks_per_host: int = 1) -> Path:
        """An MPICH hostfile listing the fake hosts."""
        path = self.workdir / f"hosts.{ranks_per_host}"
        path.write_text("".join(f"{h.hostname}:{ranks_per_host}\n" for h in self.hosts))
        return path

    def mpiexec_layout(self, ranks_per_host: int = 1, mpiexec: str | None = None) -> tuple[list[str], dict[str, str]]:
        """(argv_prefix, env) to run ranks across the fake hosts with MPICH hydra.

        Append ``-n N <program> …`` to argv_prefix (N <= n_hosts*ranks_per_host, filled host by host).
        env must be merged into the mpiexec environment; hydra passes it on to every rank. It makes MPI
        use TCP over the namespace network and points gloo/TCPStore at host 0.
        """
        exe = mpiexec or shutil.which("mpiexec") or str(Path(sys.executable).parent / "mpiexec")
        argv = [exe, "-launcher", "ssh", "-launcher-exec", str(self.launcher),
                "-f", str(self.hostfile(ranks_per_host)), "-iface", self.root_if]
        return argv, self.rank_env()

    def eroica_run_args(self, nproc_per_host: int = 1) -> tuple[list[str], dict[str, str]]:
        """(flags, env) for ``eroica-run <flags> train.py``: one node per fake host, via its mpiexec plan.

        eroica-run turns ``--hostfile``/``--mpiexec-args`` into ``mpiexec -n N -ppn k -f HOSTFILE <args>``
        and takes MASTER_ADDR from the hostfile's first host (resolvable inside every fake host).
        """
        argv, env = self.mpiexec_layout(nproc_per_host)
        extra = argv[1:]
        hostfile = extra[extra.index("-f") + 1]
        del extra[extra.index("-f"): extra.index("-f") + 2]
        flags = ["--nnodes", str(self.n_hosts), "--nproc-per-node", str(nproc_per_host), "--hostfile", hostfile,
                 "--mpiexec-args", shlex.join(extra)]
        return flags, env

    def rank_env(self) -> dict[str, str]:
        """Environment that makes MPICH (ofi/tcp) and gloo use the namespace network."""
        return {
            "MPIR_CVAR_CH4_NETMOD": "ofi",
            "FI_PROVIDER": "tcp",
            "FI_TCP_IFACE": NS_IFACE,
            "GLOO_SOCKET_IFNAME": NS_IFACE,
            "MASTER_ADDR": self.hosts[0].addr,
        }


# -------------------------------------------------------------------- module helpers
def _free_subnet() -> ipaddress.IPv4Network:
    """A 10.x.y.0/24 that no interface or route on this machine (or another cluster) uses."""
    used = _run(["ip", "-4", "route", "show", "table", "all"], check=False).stdout
    used += _run(["ip", "-4", "addr"], check=False).stdout
    taken = {ipaddress.ip_network(m, strict=False) for m in re.findall(r"(\d+\.\d+\.\d+\.\d+(?:/\d+)?)", used)}
    rng = random.Random(secrets.randbits(32))
    for _ in range(200):
        net = ipaddress.ip_network(f"10.{rng.randint(200, 250)}.{rng.randint(0, 255)}.0/24")
        if not any(net.overlaps(t) for t in taken if t.prefixlen > 0):
            return net
    raise RuntimeError("no free 10.x.y.0/24")


def _readline_timeout(p: subprocess.Popen[str], timeout: float) -> str:
    out: list[str] = []
    t = threading.Thread(target=lambda: out.append(p.stdout.readline() if p.stdout else ""), daemon=True)
    t.start()
    t.join(timeout)
    return out[0] if out else ""


def _stop_proc(p: subprocess.Popen[str], grace: float = 3) -> None:
    if p.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            p.terminate()
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(grace)


def _kill_ns_pids(ns: str) -> None:
    """Kill every process still inside namespace ns (they keep its veths alive)."""
    for _ in range(3):
        out = _run(["ip", "netns", "pids", ns], check=False).stdout.split()
        pids = [int(x) for x in out if x.isdigit() and int(x) != os.getpid()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)


def _destroy_prefix(prefix: str) -> None:
    """Delete every namespace, veth, hosts file and state file of one cluster prefix."""
    for ns in list_namespaces(prefix):
        _kill_ns_pids(ns)
        _run(["ip", "netns", "del", ns], check=False)
        with contextlib.suppress(OSError):
            shutil.rmtree(Path("/etc/netns") / ns)
    _run(["ip", "link", "del", f"{prefix}-r"], check=False)
    for d in Path("/etc/netns").glob(f"{prefix}-*") if Path("/etc/netns").exists() else []:
        with contextlib.suppress(OSError):
            shutil.rmtree(d)
    with contextlib.suppress(OSError):
        (STATE_DIR / f"{prefix}.json").unlink()


def list_namespaces(prefix: str = "erf") -> list[str]:
    """Names of existing namespaces starting with prefix."""
    out = _run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.split() and line.split()[0].startswith(prefix)]


def leftovers(prefix: str) -> list[str]:
    """Everything a cluster with this prefix could leave behind that still exists (for tests)."""
    left = [f"netns {n}" for n in list_namespaces(prefix)]
    links = _run(["ip", "-o", "link"], check=False).stdout
    left += [f"link {m}" for m in re.findall(rf"\d+: ({re.escape(prefix)}[^:@ ]*)", links)]
    if Path("/etc/netns").exists():
        left += [f"file {p}" for p in Path("/etc/netns").glob(f"{prefix}-*")]
    if (STATE_DIR / f"{prefix}.json").exists():
        left.append(f"state {prefix}")
    return left


def cleanup_stale() -> list[str]:
    """Destroy clusters whose creating process is gone (after a SIGKILL); returns their prefixes."""
    prefixes = {m.group(1) for n in list_namespaces() if (m := PREFIX_RE.match(n))}
    if STATE_DIR.exists():
        prefixes |= {p.stem for p in STATE_DIR.glob("erf*.json")}
    gone = []
    for prefix in sorted(prefixes):
        try:
            pid = json.loads((STATE_DIR / f"{prefix}.json").read_text())["pid"]
            os.kill(pid, 0)
            continue  # owner alive
        except (OSError, ValueError, KeyError):
            pass
        _destroy_prefix(prefix)
        gone.append(prefix)
    return gone


@contextlib.contextmanager
def cluster(n_hosts: int = 4) -> Iterator[Cluster]:
    """Build ``n_hosts`` fake hosts; tear them down on exit, on an exception, on SIGTERM and at exit."""
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    cleanup_stale()
    c = Cluster(prefix=f"erf{secrets.token_hex(3)}", n_hosts=n_hosts)
    atexit.register(c.close)
    prev = None
    if threading.current_thread() is threading.main_thread():
        def _on_term(signum: int, frame: object) -> None:
            c.close()
            if callable(prev):
                prev(signum, frame)
            raise SystemExit(128 + signum)

        prev = signal.signal(signal.SIGTERM, _on_term)
    try:
        c._build()
        yield c
    finally:
        c.close()
        atexit.unregister(c.close)
        if prev is not None:
            signal.signal(signal.SIGTERM, prev)


def main(argv: list[str] | None = None) -> int:
    """CLI: ``netns.py up N`` (hold hosts until Ctrl-C, printing the layout) or ``netns.py cleanup``."""
    import argparse

    ap = argparse.ArgumentParser(description="fake hosts in network namespaces")
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up")
    up.add_argument("n", type=int)
    sub.add_parser("cleanup")
    a = ap.parse_args(argv)
    if a.cmd == "cleanup":
        print("removed:", cleanup_stale())
        return 0
    with cluster(a.n) as c:
        prefix, env = c.mpiexec_layout()
        print("hosts:", [(h.hostname, h.addr) for h in c.hosts])
        print("env:", " ".join(f"{k}={v}" for k, v in env.items()), shlex.join(prefix), flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
