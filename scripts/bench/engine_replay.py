"""Replay recorded captures through the engine: which findings each capture gives, per revision.

    python scripts/bench/engine_replay.py --base 3f4de1f /tmp/fb*/

Each argument is a fault-bench output directory (``scripts/fault-bench --out``); every case in it
with captures (``<case>/report/captures/*.msgpack``) goes through ``Pipeline`` in step order, the
way rank 0's analyst and ``eroica analyze`` do (the baseline capture is the reference for the later
ones; the capture's own link probe is used). ``--base REV`` runs the same over the engine at a git
revision (a temporary worktree on ``PYTHONPATH``) and prints only the captures whose findings
differ, with a count of the captures compared. The recorded captures carry what the live runs
measured (their probe ran when that revision's runtime ran it), so this judges the engine, not the
runtime. ``--job`` compares each case's job report instead (``report.build_report`` over its
captures' diagnoses: the job's findings, and what it lists as transient).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _hosts(host: str | None) -> str:
    """'h1,h3' for 'erf6dd157-h1,erf6dd157-h3' (the fake hosts' random prefix differs per run)."""
    return ",".join(h.rsplit("-", 1)[-1] for h in (host or "-").split(","))


def _text(f: dict) -> str:
    return f"{f['category']} r{f['rank']}@{_hosts(f['host'])} {f['function']}"


def findings(dirs: list[str], job: bool = False) -> dict[str, list[str]]:
    """{"run/case@step trigger": ["category rRANK@HOST function", ...]} over every capture; with
    ``job``, {"run/case job": [...the job report's findings, then "transient: ..." ones]}."""
    from eroica_runtime import report, summary
    from eroica_runtime.pipeline import Pipeline

    out: dict[str, list[str]] = {}
    for d in dirs:
        for case in sorted(p for p in Path(d).iterdir() if (p / "report" / "captures").is_dir()):
            caps = sorted((case / "report" / "captures").glob("*.msgpack"), key=lambda p: int(p.stem))
            if not caps:
                continue
            meta, _, _ = summary.decode_capture(caps[0].read_bytes())
            pipe = Pipeline(world_size=int(meta.get("world_size") or 0) or None)
            diagnoses = []
            for path in caps:
                got = pipe.analyse(path.read_bytes(), origin=str(path))
                diag = got.diagnosis
                diagnoses.append(diag)
                key = f"{Path(d).name}/{case.name}@{diag.step} {diag.trigger}"
                # a capture slower than the baseline that nothing explains is a verdict of its own (rank 0 then
                # lets the detector capture again), not "healthy"
                slower = ["slower than the baseline, no culprit"] if "unexplained_ms" in (diag.step_ms or {}) else []
                # so is one rank's one-off work alone in a window step (engine: step_ms.one_off)
                one = (diag.step_ms or {}).get("one_off")
                once = [f"one-off r{one['rank']} in step(s) {one['steps']}"] if isinstance(one, dict) else []
                out[key] = [_text(f.to_json()) for f in diag.findings] + slower + once
            if job:
                for key in [k for k in out if k.startswith(f"{Path(d).name}/{case.name}@")]:
                    del out[key]
                doc = report.build_report(diagnoses=diagnoses, world_size=diagnoses[0].world_size, steps=0)
                out[f"{Path(d).name}/{case.name} job"] = ([_text(f) for f in doc["findings"]]
                                                          + [f"transient: {_text(f)}" for f in doc.get("transient", [])])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--base", help="git revision to compare with")
    ap.add_argument("--job", action="store_true", help="compare the job reports, not each capture's findings")
    ap.add_argument("--json", action="store_true", help="print this tree's findings as JSON (used by --base)")
    args = ap.parse_args()
    missing = [d for d in args.dirs if not Path(d).is_dir()]
    if missing:
        raise SystemExit(f"engine_replay: not a fault-bench output directory: {', '.join(missing)}")
    now = findings(args.dirs, args.job)
    if args.json:
        print(json.dumps(now))
        return
    if not args.base:
        for key, fs in now.items():
            print(f"{key}: {'; '.join(fs) or '-'}")
        return
    with tempfile.TemporaryDirectory(prefix="engine-replay-") as tmp:
        tree = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), args.base], check=True)
        try:
            env = {**os.environ, "PYTHONPATH": str(tree)}
            text = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--json",
                                   *(["--job"] if args.job else []), *args.dirs],
                                  env=env, check=True, capture_output=True, text=True, cwd=tmp).stdout
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
    was = json.loads(text)
    differ = [k for k in now if was.get(k) != now[k]]
    for key in differ:
        print(f"{key}:\n  {args.base}: {'; '.join(was.get(key) or []) or '-'}\n  now: {'; '.join(now[key]) or '-'}")
    print(f"{len(differ)} of {len(now)} {'job reports' if args.job else 'captures'} differ")


if __name__ == "__main__":
    main()
