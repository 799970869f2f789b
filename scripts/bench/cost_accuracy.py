#!/usr/bin/env python3
"""How close a finding's estimated cost a step is to what the job lost: over a fault bench's output.

For every fault case of a ``scripts/fault-bench --out DIR`` run: the top finding's
``impact_ms_per_step`` (the engine's estimate from the profiled window) against the job's measured
loss a step from its first finding on (``engine/timelost.py``: rank 0's mean step after it against
the mean before the slowdown, the steps eroica profiled or built its summaries in left out). A report
written before job.time_lost existed is measured here from its steps.msgpack and captures with the
same function, the capture windows taken at the default sizes (3 steps, 16 for a throughput capture);
it has no record of the steps its summaries were built in, so those count as the job's there (as in
every report before 2026-12-02 17:20 UTC).

  .venv/bin/python scripts/bench/cost_accuracy.py /tmp/fb23
  .venv/bin/python scripts/bench/cost_accuracy.py /tmp/fb36 --from-first-finding   # the old yardstick

With ``--reanalyse-with CHECKOUT`` every case's report directory is first copied under ``--work`` and
re-analysed by ``eroica analyze`` run from that checkout (a ``git worktree`` of any revision: its
engine, not the installed one, reads the captures), and its report's top finding is scored instead
of the bench's. Several runs are pooled; an engine change is compared by running this twice:

  git worktree add /tmp/before <rev>
  .venv/bin/python scripts/bench/cost_accuracy.py /tmp/fb2{2..8} --reanalyse-with /tmp/before --work /tmp/ca-before
  .venv/bin/python scripts/bench/cost_accuracy.py /tmp/fb2{2..8} --reanalyse-with . --work /tmp/ca-after
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from eroica_runtime.config import Config  # noqa: E402
from eroica_runtime.engine.timelost import lookback, onset_reach, since_step, time_lost  # noqa: E402


def measured(report_dir: Path, cfg: Config) -> dict[str, Any] | None:
    rep = json.loads((report_dir / "report.json").read_text())
    kept = (rep.get("job") or {}).get("time_lost")
    if isinstance(kept, dict):
        return kept
    steps = msgpack.unpackb((report_dir / "steps.msgpack").read_bytes(), raw=False, strict_map_key=False)
    history = list(steps["ms"])
    caps = [c for c in rep.get("captures") or [] if c.get("trigger") != "hang"]
    windows = [(int(c["step"]), cfg.burst_window_steps if c["trigger"] == "throughput" else cfg.window_steps)
               for c in caps]
    since = since_step((int(c["step"]), c["trigger"], bool(c.get("findings"))) for c in caps)
    if since is None:
        return None
    lost = time_lost(history, windows, since, warmup=cfg.warmup_steps, lookback=lookback(cfg.spike_steps, cfg.vote_lag),
                     reach=onset_reach(cfg.spike_steps, cfg.vote_lag, cfg.drift_window, cfg.lost_window))
    return None if lost is None else lost.to_json()


def from_first_finding(report_dir: Path, lost: dict[str, Any], cfg: Config) -> dict[str, Any]:
    """``lost`` (report.json job.time_lost, counted from the slowdown's onset) counted the old way, from
    the first finding: the steps from the onset to the capture's lead-in step taken out of the after
    side, the spike rule's lookback before the capture out of the healthy side (their positions are in
    steps.msgpack; eroica's own steps stay out as the report left them out). A report without an onset
    is returned as it is."""
    onset, since = lost.get("onset_step"), int(lost["since_step"])
    if not isinstance(onset, int) or onset >= since:
        return lost
    ms = list(msgpack.unpackb((report_dir / "steps.msgpack").read_bytes(), raw=False, strict_map_key=False)["ms"])
    gone_after = [ms[s - 1] for s in range(onset, since - 1)]          # since - 1 is the lead-in (eroica's)
    gone_before = [ms[s - 1] for s in range(since - lookback(cfg.spike_steps, cfg.vote_lag), onset)]
    n_after, n_before = lost["steps"] - len(gone_after), lost["before_count"] - len(gone_before)
    mean = (lost["mean_ms"] * lost["steps"] - sum(gone_after)) / n_after
    before = (lost["before_ms"] * lost["before_count"] - sum(gone_before)) / n_before
    return {**lost, "onset_step": None, "steps": n_after, "mean_ms": mean, "before_count": n_before,
            "before_ms": before, "per_step_ms": mean - before}


def reanalysed_top(report_dir: Path, checkout: Path, work: Path) -> dict[str, Any] | None:
    """The top finding of ``report_dir`` re-analysed by ``checkout``'s engine, in a copy under ``work``."""
    work.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(report_dir, work)
    run = subprocess.run([sys.executable, "-c", "from eroica_launch.tool import cli; cli()", "analyze", str(work)],
                         cwd=checkout, capture_output=True, text=True, timeout=600)
    if run.returncode != 0:   # said, and the case left out, rather than the whole comparison lost
        print(f"{report_dir}: eroica analyze failed ({run.returncode}): {run.stderr.strip()[-300:]}", file=sys.stderr)
        return None
    findings = json.loads((work / "report.json").read_text()).get("findings") or []
    return findings[0] if findings else None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="+", type=Path, help="fault-bench --out directories")
    ap.add_argument("--reanalyse-with", type=Path, default=None, metavar="CHECKOUT")
    ap.add_argument("--work", type=Path, default=Path("/tmp/cost-accuracy"), help="where the copies go")
    ap.add_argument("--from-first-finding", action="store_true",
                    help="measure the loss from the first finding, as reports before 2026-12-04 did, not from "
                         "the slowdown's onset (the yardstick's change, apart from the estimates')")
    args = ap.parse_args(argv)
    cfg = Config()
    ratios: dict[str, list[float]] = {"steady": [], "bursts": []}
    for out in args.out:
        bench = json.loads((out / "bench.json").read_text())
        print(f"\n{out}\n")
        print("| case | fault | top finding | estimated ms/step | measured ms/step | estimated / measured |")
        print("| --- | --- | --- | --- | --- | --- |")
        for r in bench["results"]:
            report_dir = out / r["case"] / "report"
            top = (r.get("score") or {}).get("top")
            if args.reanalyse_with is not None and r.get("fault") and (report_dir / "captures").is_dir():
                top = reanalysed_top(report_dir, args.reanalyse_with.resolve(), args.work / out.name / r["case"])
            if not r.get("fault") or not top or top.get("category") == "hang":
                continue
            got = measured(report_dir, cfg)
            if got and args.from_first_finding:
                got = from_first_finding(report_dir, got, cfg)
            est, meas = top.get("impact_ms_per_step"), got and got.get("per_step_ms")
            ratio = est / meas if est is not None and meas and meas > 0 else None
            if ratio is not None:
                ratios["bursts" if r["case"].endswith("-int") else "steady"].append(ratio)
            who = "job-wide" if top["rank"] is None else f"r{top['rank']}"
            print(f"| {r['case']} | `{r['fault']}` | {top['category']} {who} | "
                  f"{est:.1f} | {'–' if meas is None else f'{meas:.1f}'} | "
                  f"{'–' if ratio is None else f'{ratio:.2f}'} |")
    print()
    for kind, xs in ratios.items():
        if xs:
            spread = sum(abs(math.log(x)) for x in xs if x > 0) / len(xs)
            print(f"{kind}: {len(xs)} cases, estimated / measured median {statistics.median(xs):.2f} "
                  f"(range {min(xs):.2f}-{max(xs):.2f}), mean |log| {spread:.3f}")


if __name__ == "__main__":
    main()
