"""Per-step cost of the step clock and the local detector: a git revision against the working tree.

    python scripts/bench/pieces_ab.py --base 4bc8954 --rounds 5

Loads ``eroica_runtime/stepclock.py`` and ``trigger.py`` as they were at ``--base`` (git show) next
to the current ones and times, interleaved round by round in one process: an optimizer step with the
clock's post-hook minus a bare one (3,000 steps each, medians), and ``Trigger.local_flags`` per
step. Prints the per-round figures and the median difference.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from eroica_runtime import stepclock, trigger
from eroica_runtime.config import Config

ROOT = Path(__file__).resolve().parents[2]
N = 3000


def _load(rev: str, rel: str, name: str, tmp: Path) -> ModuleType:
    path = tmp / f"{name}.py"
    path.write_text(subprocess.check_output(["git", "-C", str(ROOT), "show", f"{rev}:{rel}"], text=True))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod          # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def hook_us(step_clock: Any) -> float:
    p = torch.nn.Parameter(torch.zeros(4))
    opt = torch.optim.SGD([p], lr=0.1)
    p.grad = torch.zeros(4)

    def timed() -> float:
        out = []
        for _ in range(N):
            t = time.perf_counter()
            opt.step()
            out.append(time.perf_counter() - t)
        return statistics.median(out)

    bare = timed()
    clock = step_clock(lambda step, ms: None)
    clock.install()
    hooked = timed()
    clock.uninstall()
    return (hooked - bare) * 1e6


def detector_us(trig_cls: Any) -> float:
    trig = trig_cls(Config())
    out = []
    for i in range(N):
        t = time.perf_counter()
        trig.local_flags(100 + i, 20.0 + (i % 7) * 0.1, False)
        out.append(time.perf_counter() - t)
    return statistics.median(out) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="git revision to compare with")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old_clock = _load(args.base, "eroica_runtime/stepclock.py", "base_stepclock", Path(tmp))
        old_trig = _load(args.base, "eroica_runtime/trigger.py", "base_trigger", Path(tmp))
        rows: dict[str, list[float]] = {k: [] for k in ("clock_base", "clock_now", "det_base", "det_now")}
        for _ in range(args.rounds):
            rows["clock_base"].append(hook_us(old_clock.StepClock))
            rows["clock_now"].append(hook_us(stepclock.StepClock))
            rows["det_base"].append(detector_us(old_trig.Trigger))
            rows["det_now"].append(detector_us(trigger.Trigger))
    for k, v in rows.items():
        print(f"{k:10s} µs/step per round: {', '.join(f'{x:.2f}' for x in v)}  median {statistics.median(v):.2f}")
    extra = (statistics.median(rows["clock_now"]) - statistics.median(rows["clock_base"])
             + statistics.median(rows["det_now"]) - statistics.median(rows["det_base"]))
    print(f"added per step (clock + detector, medians): {extra:.2f} µs")


if __name__ == "__main__":
    main()
