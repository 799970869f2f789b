"""Replay recorded step times through the capture trigger: a git revision against the working tree.

    python scripts/bench/trigger_replay.py --base 70e029b /tmp/fb*/

Each argument is a fault-bench output directory (``scripts/fault-bench --out``); every case in it
with per-rank step times (``<case>/steps/steps-rank*.json``) is replayed through one ``Trigger``
per rank the way ``Runtime._boundary`` drives them: each rank's flags, their MAX as the vote,
``vote_lag`` steps late, no detector input while a window is open. The recorded steps include the
slowdown of the windows the live run took, so this judges the trigger's schedule, not the engine;
SIGCONT marks are not recorded, so the freeze cases rely on lost time alone.

``--quiet-after N`` also skips N steps after each window, as the runtime does while the summary is
built and gathered (15-16 steps in the demo); without it only the window is skipped. ``--verdicts``
plays rank 0's analyst too: every detector capture of a healthy case, and every one before the onset
of a fault case, is found healthy (``Trigger.found_healthy``) ``vote_lag`` + 2 steps after those quiet
steps, as the gather, the analysis and the vote that carries the verdict take. A directory may
also hold a ``demo/steps`` case (per-rank step times of ``./scripts/demo``, same file format).

``--budget N`` replays with that capture budget (``--max-captures``; a large one counts every capture
a long job's noise would open), ``--refill N`` with a spent capture back every N steps
(``--capture-refill-steps``; 0: never). ``--plant F,F --onsets S,S`` also replays every healthy case with its
steps from each onset on, on every rank, F x slower (a job-wide slowdown), with verdicts for the
captures before the onset when ``--verdicts`` is given, and prints how many of those were not captured
within ``--within`` steps and the onset -> capture steps. An onset closer than 100 steps to a
recording's end is skipped. A recording made outside the bench (``train_bench.py --out
DIR/<case>/steps``, a case name starting with ``healthy``) is read the same way.

Prints, per revision: fault cases with a detector capture at or after the onset (step 50), detector
captures in healthy cases, repeated captures of a steady fault (one capture is enough for a slowdown
that stays the same), captures of an intermittent fault after the onset (each is a chance to catch a
burst), and every case where the two schedules differ.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from eroica_runtime import trigger
from eroica_runtime.config import Config

ROOT = Path(__file__).resolve().parents[2]
ONSET = 50
# fault cases whose slowdown, once started, stays the same to the end (not bursts, not a hang)
STEADY = frozenset({"compute", "throttle", "contend", "data", "gc", "io", "link", "link-delay", "everyone-slower",
                    "hf-compute", "hf-data", "lightning-compute", "lightning-data", "demo"})


def _load_base(rev: str, tmp: Path) -> ModuleType:
    path = tmp / "trigger_base.py"
    path.write_text(subprocess.check_output(["git", "-C", str(ROOT), "show", f"{rev}:eroica_runtime/trigger.py"],
                                            text=True))
    spec = importlib.util.spec_from_file_location("trigger_base", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["trigger_base"] = mod          # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def replay(series: list[list[float]], trigger_cls: Any, cfg: Config, quiet_after: int = 0,
           healthy_before: int | None = None) -> list[tuple[int, str]]:
    """(first profiled step, trigger) of every capture the ranks agree on. ``quiet_after``: steps
    after each window that the detectors do not judge either (the runtime holds back the steps its
    summary is built in, and ``vote_lag`` + 1 after the gather: 15-16 steps in the demo).
    ``healthy_before``: detector captures whose window begins before this step are found healthy
    (``Trigger.found_healthy``, on every rank at once, as the vote carries rank 0's verdict); None:
    no verdicts (a revision without them)."""
    trigs = [trigger_cls(cfg) for _ in series]
    votes: list[np.ndarray] = []
    started: list[tuple[int, str]] = []
    verdicts: dict[int, int] = {}   # step the verdict arrives -> the capture's first step
    quiet_end = -1
    for step in range(min(len(s) for s in series)):
        in_window = step <= quiet_end
        votes.append(np.max([t.local_flags(step, s[step], in_window) for t, s in zip(trigs, series, strict=True)],
                            axis=0))
        voted = votes.pop(0) if len(votes) > cfg.vote_lag else None
        if step in verdicts and hasattr(trigs[0], "found_healthy"):
            for t in trigs:
                t.found_healthy(verdicts[step])
        if in_window:
            continue
        decisions = [t.decide(step, voted) for t in trigs]
        d = decisions[0]
        if d is not None:
            started.append((d.start_step + 1, d.trigger))
            quiet_end = d.start_step + d.k + quiet_after
            if healthy_before is not None and d.trigger in trigger.DETECTED and d.start_step + 1 < healthy_before:
                verdicts[quiet_end + cfg.vote_lag + 2] = d.start_step + 1
    return started


def planted(series: list[list[float]], trigger_cls: Any, cfg: Config, quiet_after: int, verdicts: bool,
            onsets: list[int], factors: list[float]) -> list[tuple[float, int | None]]:
    """(factor, onset -> first detector capture in steps, or None) for every onset that leaves 100
    steps of the recording and every factor: the healthy steps from the onset on, every rank's, that
    many times slower."""
    out: list[tuple[float, int | None]] = []
    n = min(map(len, series))
    for onset in onsets:
        if onset + 100 > n:
            continue
        for f in factors:
            slowed = [r[:onset] + [ms * f for ms in r[onset:]] for r in series]
            caps = replay(slowed, trigger_cls, cfg, quiet_after, onset if verdicts else None)
            after = [s - onset for s, t in caps if t in trigger.DETECTED and s >= onset]
            out.append((f, after[0] if after else None))
    return out


def _numbers(text: str, kind: type, what: str, ap: argparse.ArgumentParser) -> list[Any]:
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        ap.error(f"{what} must be a comma list of numbers, not {text!r}")
    if not values or min(values) <= 0:
        ap.error(f"{what} must list numbers above 0, not {text!r}")
    return values


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="git revision whose trigger.py to compare with")
    ap.add_argument("--quiet-after", type=int, default=0, metavar="N",
                    help="steps after each window the detectors skip, as the runtime's deferred build does "
                         "(default 0: the window only)")
    ap.add_argument("--verdicts", action="store_true",
                    help="play rank 0's analyst: detector captures in healthy cases and before a fault's onset "
                         "are found healthy")
    ap.add_argument("--budget", type=int, default=Config().max_captures, metavar="N",
                    help="capture budget to replay with (default: --max-captures' default)")
    ap.add_argument("--refill", type=int, default=Config().capture_refill_steps, metavar="N",
                    help="steps a spent capture takes to come back (--capture-refill-steps; a revision without a "
                         "refilling budget ignores it; default: its default)")
    ap.add_argument("--plant", default="", metavar="F,F", help="also replay healthy cases this many times slower "
                    "from each --onsets step on")
    ap.add_argument("--onsets", default="700,1000,1500,2000,2400", metavar="S,S")
    ap.add_argument("--within", type=int, default=300, metavar="N",
                    help="a planted slowdown not captured within N steps counts as missed (default 300)")
    ap.add_argument("runs", nargs="+", type=Path, help="fault-bench output directories")
    args = ap.parse_args()
    if args.quiet_after < 0:
        ap.error(f"--quiet-after must be 0 or more, not {args.quiet_after}")
    if args.budget < 1 or args.within < 1:
        ap.error(f"--budget and --within must be 1 or more, not {args.budget} and {args.within}")
    if args.refill < 0:
        ap.error(f"--refill must be 0 (never) or more, not {args.refill}")
    factors = _numbers(args.plant, float, "--plant", ap) if args.plant else []
    onsets = _numbers(args.onsets, int, "--onsets", ap)
    cfg = Config(max_captures=args.budget, capture_refill_steps=args.refill)
    delays: dict[str, list[tuple[float, int | None]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        revisions = {args.base: _load_base(args.base, Path(tmp)).Trigger, "working tree": trigger.Trigger}
        totals = {name: {"fault cases": 0, "caught after onset": 0, "healthy cases": 0, "healthy captures": 0,
                         "of them drift": 0,
                         "repeats of a steady fault": 0, "captures of an intermittent fault": 0}
                  for name in revisions}
        differ = []
        for run in args.runs:
            for steps_dir in sorted(run.glob("*/steps")):
                case = steps_dir.parent.name
                series = [json.loads(p.read_text())["step_ms"] for p in sorted(steps_dir.glob("steps-rank*.json"))]
                if case == "hang" or len(series) < 2 or min(map(len, series)) < 2 * ONSET:
                    continue
                healthy = case.startswith("healthy") or case == "overhead"
                seen = {}
                for name, cls in revisions.items():
                    verdict_from = (1 << 62 if healthy else ONSET) if args.verdicts else None
                    caps = [c for c in replay(series, cls, cfg, args.quiet_after, verdict_from)
                            if c[1] != "baseline"]
                    seen[name] = caps
                    t = totals[name]
                    if healthy:
                        t["healthy cases"] += 1
                        t["healthy captures"] += len(caps)
                        t["of them drift"] += sum(t_ == "drift" for _, t_ in caps)
                        if factors:
                            delays.setdefault(name, []).extend(
                                planted(series, cls, cfg, args.quiet_after, args.verdicts, onsets, factors))
                    else:
                        t["fault cases"] += 1
                        t["caught after onset"] += any(s >= ONSET for s, _ in caps)
                        if case.endswith("-int"):   # bursts: each capture after the onset is a chance
                            t["captures of an intermittent fault"] += sum(s >= ONSET for s, _ in caps)
                        if case in STEADY:   # the same slowdown all along: one capture is enough
                            t["repeats of a steady fault"] += max(0, sum(s >= ONSET for s, _ in caps) - 1)
                if len({str(v) for v in seen.values()}) > 1:
                    differ.append(f"{run.name}/{case}: " + "; ".join(f"{n} {v}" for n, v in seen.items()))
    for name, t in totals.items():
        print(f"{name}: " + ", ".join(f"{k} {v}" for k, v in t.items()))
    for name, got in delays.items():
        caught = sorted(d for _, d in got if d is not None and d <= args.within)
        print(f"{name}: planted {len(got)}, not captured within {args.within} steps {len(got) - len(caught)}, "
              f"onset -> capture median {statistics.median(caught) if caught else '-'} steps; by factor: "
              + ", ".join(f"x{f:g} {sorted(d for g, d in got if g == f and d is not None and d <= args.within)}"
                          for f in factors))
    print(f"{len(differ)} case(s) where the schedules differ:")
    for line in differ:
        print("  " + line)


if __name__ == "__main__":
    main()
