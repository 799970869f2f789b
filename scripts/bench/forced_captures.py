#!/usr/bin/env python3
"""False and missed findings in captures taken where nobody asked: jobs with forced captures.

The fault bench judges a 4-rank job with the captures its detectors take. This runs N-rank jobs of
tests/data/runtime/train.py (gloo DDP on CPU) under eroica-run with the detectors off and captures
forced at fixed steps (``--capture-at-steps``), healthy or with one planted fault, then reads every
capture back through the engine in this checkout (``eroica analyze``'s pipeline, on a copy) and
prints, per job, what each capture named. On a healthy job every finding is a false one; on a
faulty job, a capture after the onset that names nobody, or names another rank, is a miss.

  flock /tmp/eroica-multirank.lock .venv/bin/python scripts/bench/forced_captures.py \\
      --ranks 8 --jobs 4 --out /tmp/fc8
  .venv/bin/python scripts/bench/forced_captures.py --reanalyse /tmp/fc8   # after an engine change
  git worktree add /tmp/old <commit> && ... forced_captures.py --checkout /tmp/old --out /tmp/fc8-old

Jobs run one after another; nothing else should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from eroica_launch.offline import run_analysis  # noqa: E402

TRAIN = ROOT / "tests" / "data" / "runtime" / "train.py"
BIN = Path(sys.executable).parent
RANK_ENV = {"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1", "MPIR_CVAR_POLLS_BEFORE_YIELD": "10", "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1"}


def run_job(out: Path, ranks: int, steps: int, captures: str, fault: dict[str, str], timeout: float,
            checkout: Path | None) -> int:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **RANK_ENV, "STEPS": str(steps), **fault}
    if checkout is not None:   # another checkout's launcher and runtime (a before/after comparison)
        env["PYTHONPATH"] = os.pathsep.join([str(checkout), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    argv = [str(BIN / "eroica-run"), "--nproc-per-node", str(ranks), "--report-dir", str(out / "report"),
            "--warmup-steps", "6", "--capture-at-steps", captures, "--cooldown-steps", "0",
            "--max-captures", "16", "--max-profiled-fraction", "0.9", "--spike-ratio", "100",
            "--drift-pct", "0", "--lost-pct", "0", str(TRAIN)]
    (out / "job.json").write_text(json.dumps({"ranks": ranks, "fault": fault, "argv": argv,
                                              "checkout": str(checkout or ROOT)}))
    with open(out / "launcher.log", "w") as log:
        try:
            return subprocess.run(argv, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            return 124


def analyse(job: Path) -> list[tuple[int, str]]:
    """(capture step, what it named) for every capture of one job, by this checkout's engine."""
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(job / "report" / "captures", Path(tmp) / "captures")
        diagnoses, _, _ = run_analysis(Path(tmp))
    out = []
    for d in sorted(diagnoses, key=lambda d: d.step):
        named = ", ".join(f"{f.rank}:{f.category}" for f in d.findings) or \
            ("slower" if "unexplained_ms" in d.step_ms else "-")
        out.append((d.step, named))
    return out


def score(root: Path) -> int:
    false = missed = found = healthy_caps = 0
    for job in sorted(p for p in root.iterdir() if (p / "job.json").exists()):
        meta = json.loads((job / "job.json").read_text())
        fault = meta["fault"]
        culprit, onset = (int(fault["FAULT_RANK"]), int(fault["FAULT_FROM"])) if fault else (None, None)
        rows = analyse(job) if (job / "report" / "captures").exists() else []
        marks = []
        for step, named in rows:
            after = onset is not None and step >= onset
            if not after:
                healthy_caps += 1
                false += named not in ("-", "slower")
            elif named.split(",")[0].split(":")[0] == str(culprit):
                found += 1
            else:
                missed += 1
            marks.append(f"{step}={named}")
        print(f"{job.name:16} {meta['ranks']:>3} ranks  {' '.join(marks)}")
    print(f"captures before any fault: {healthy_caps}, with a finding: {false}; "
          f"after the onset: {found} named the culprit, {missed} did not")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=4, help="healthy jobs")
    ap.add_argument("--faulty", type=int, default=1, help="jobs with a slow dataset on one rank from step 20")
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--captures", default="20,35,50,65")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out", type=Path, default=Path("forced-captures-out"))
    ap.add_argument("--reanalyse", type=Path, default=None, help="only read DIR's captures back again")
    ap.add_argument("--checkout", type=Path, default=None,
                    help="run the jobs with the eroica of this checkout (e.g. a `git worktree` of an older commit); "
                         "the captures are still read by this one's engine")
    args = ap.parse_args()
    if args.reanalyse is not None:
        if not (args.reanalyse / "").is_dir():
            ap.error(f"--reanalyse {args.reanalyse}: no such directory")
        return score(args.reanalyse)
    if args.ranks < 2 or (args.faulty and args.ranks < 4):
        ap.error(f"--ranks {args.ranks}: at least 2, and 4 with --faulty (the culprit is rank ranks-3)")
    if args.checkout is not None and not (args.checkout / "eroica_launch").is_dir():
        ap.error(f"--checkout {args.checkout}: not an eroica checkout (no eroica_launch/ in it)")
    culprit = str(args.ranks - 3)
    jobs = [(f"healthy{args.ranks}-{i + 1}", {}) for i in range(args.jobs)] + \
        [(f"data{args.ranks}-{i + 1}", {"FAULT": "data", "FAULT_RANK": culprit, "FAULT_FROM": "20"})
         for i in range(args.faulty)]
    for name, fault in jobs:
        rc = run_job(args.out / name, args.ranks, args.steps, args.captures, fault, args.timeout, args.checkout)
        print(f"{name}: exit {rc}", flush=True)
    return score(args.out)


if __name__ == "__main__":
    sys.exit(main())
