"""One job on two fake hosts, four ranks each, with a fault planted on every rank of the second host.

    sudo .venv/bin/python scripts/bench/two_hosts.py OUT [--kind compute:ms=100] [--ranks 4,5,6,7]

Why: the fault bench puts one rank on each fake host, so a node whose ranks all slowed alike (a bad
node, a node's CPU limit) is never seen there. This runs ``scripts/faultlib/train_bench.py`` under
eroica-run on two :mod:`faultlib.netns` hosts (``--nnodes 2 --nproc-per-node 4``, MPICH over the
namespaces' network, gloo DDP), the fault ``KIND:rank=R:start=50[:params]`` on each of ``--ranks``
from step 50, and keeps every capture in ``OUT/report``; ``OUT/launcher.log`` has the job's output with
wall-clock stamps. ``--kind mark --link-mbit M``: the second host's link is rate-limited (tbf, both
ways) when its ranks log the mark, as the fault bench's link case does for one rank's host.
Root (namespaces, and the cgroups of a throttle fault). Recorded with it:
tests/data/faultbench/two-hosts-slow-node and two-hosts-throttled-node.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from faultlib import bench, faults, netns  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--kind", default="compute:ms=100", help="fault kind and params, e.g. throttle:quota=0.1")
    ap.add_argument("--ranks", default="4,5,6,7", help="the ranks that get the fault")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--timeout", type=float, default=400)
    ap.add_argument("--link-mbit", type=float, default=0.0, help="with --kind mark: the second host's rate limit")
    a = ap.parse_args(argv)
    why = netns.unavailable_reason()
    if why:
        print(f"two_hosts: fake hosts unavailable: {why}", file=sys.stderr)
        return 2
    try:
        ranks = [int(r) for r in a.ranks.split(",")]
    except ValueError:
        ap.error(f"--ranks {a.ranks!r}: a comma list of rank numbers (0-7), e.g. 4,5,6,7")
    if not ranks or any(not 0 <= r < 8 for r in ranks):
        ap.error(f"--ranks {a.ranks!r}: ranks of the 8 (0-7)")
    kind, _, params = a.kind.partition(":")
    fault = ";".join(f"{kind}:rank={r}:start=50" + (f":{params}" if params else "") for r in ranks)
    try:
        faults.parse_specs(fault)
    except ValueError as exc:
        ap.error(f"--kind {a.kind!r}: {exc}")
    a.out.mkdir(parents=True, exist_ok=True)
    with netns.cluster(2) as c:
        flags, env = c.eroica_run_args(4)
        env.update(bench.RANK_ENV, EROICA_BENCH_FAULT=fault, EROICA_KEEP_CAPTURES="1")
        argv_ = [bench.EROICA_RUN, *flags, "--report-dir", str(a.out / "report"), str(bench.TRAIN),
                 "--steps", str(a.steps), "--out", str(a.out / "steps")]
        limited: list[bool] = []

        def on_line(_now: float, line: str) -> None:
            m = bench.MARK_RE.search(line)
            if m and a.link_mbit > 0 and (m.group(3) == "on") != bool(limited):
                c.limit_rate(1, a.link_mbit) if m.group(3) == "on" else c.clear_rate(1)
                limited[:] = [True] if m.group(3) == "on" else []

        try:
            rc, timed_out, wall, _ = bench.launch(argv_, env, a.out / "launcher.log", a.timeout, on_line)
        finally:
            c.clear_rate(1)
    print(f"two_hosts: {fault}: rc={rc} timed_out={timed_out} wall={wall}s; hosts {[h.hostname for h in c.hosts]}; "
          f"report in {a.out / 'report'}")
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
