"""Make a big per-rank chrome trace by repeating the profiled steps of a real one.

Why: `eroica analyze --traces` must read traces of hundreds of MB to GBs in bounded memory and
reasonable time (docs/benchmarks.md, "Analysing existing traces"); real traces that big are not in
the repository, so this writes one from a real one: the events of its ProfilerStep window are
repeated, shifted in time by the window's length, with step numbers, External ids, correlation
ids and flow ids made unique per copy (so kernels still find their launching ops). Everything
before traceEvents (distributedInfo...) is kept. Written as a stream; the input is loaded whole
(it is small).

    python scripts/bench/big_trace.py --src tests/data/traces/hta-sampled_rank-0.json.gz \\
        --mb 250 --out /tmp/big/rank-0.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Any

STEP = "ProfilerStep#"
_ID_ARGS = ("External id", "correlation")


def _load(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise SystemExit(f"{path}: not a chrome trace with traceEvents")
    return doc


def _unit(events: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], float, int, list[int]]:
    """(events of the step window, window length in us, id span, step numbers)."""
    steps = [e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith(STEP)
             and e.get("cat") == "user_annotation"]
    if not steps:
        raise SystemExit("the source trace has no ProfilerStep#N annotations")
    lo = min(e["ts"] for e in steps)
    hi = max(e["ts"] + e["dur"] for e in steps)
    unit = [e for e in events if e.get("ph") in ("X", "s", "f") and isinstance(e.get("ts"), int | float)
            and lo <= e["ts"] < hi]
    ids = [int(v) for e in unit for v in [*((e.get("args") or {}).get(k) for k in _ID_ARGS), e.get("id")]
           if isinstance(v, int | float)]
    numbers = sorted({int(e["name"][len(STEP):]) for e in steps})
    return unit, hi - lo, (max(ids) + 1) if ids else 1, numbers


def _copy(e: dict[str, Any], k: int, shift: float, id_span: int, renumber: dict[int, int]) -> dict[str, Any]:
    out = dict(e)
    out["ts"] = e["ts"] + k * shift
    if isinstance(e.get("id"), int | float):
        out["id"] = int(e["id"]) + k * id_span
    args = e.get("args")
    if isinstance(args, dict):
        args = dict(args)
        for key in _ID_ARGS:
            if isinstance(args.get(key), int | float):
                args[key] = int(args[key]) + k * id_span
        out["args"] = args
    name = str(e.get("name", ""))
    if name.startswith(STEP) and name[len(STEP):].isdigit():
        out["name"] = f"{STEP}{renumber[int(name[len(STEP):])] + k * len(renumber)}"
    return out


def write(src: Path, out: Path, target_bytes: int) -> tuple[int, int, int]:
    """Write ``out`` (at least ``target_bytes``); return (bytes, events, steps)."""
    doc = _load(src)
    unit, shift, id_span, numbers = _unit(doc["traceEvents"])
    renumber = {n: numbers[0] + i for i, n in enumerate(numbers)}
    meta = [e for e in doc["traceEvents"] if e.get("ph") == "M"]
    out.parent.mkdir(parents=True, exist_ok=True)
    written = events = copies = 0
    with out.open("w") as fh:
        head = {k: v for k, v in doc.items() if k != "traceEvents"}
        text = json.dumps(head)[:-1] + (', "traceEvents": [' if head else '{"traceEvents": [')
        fh.write(text)
        written += len(text)
        first = True
        for e in meta:
            text = ("" if first else ",\n") + json.dumps(e)
            fh.write(text)
            written, first, events = written + len(text), False, events + 1
        while written < target_bytes:
            for e in unit:
                text = ",\n" + json.dumps(_copy(e, copies, shift, id_span, renumber))
                fh.write(text)
                written += len(text)
            events += len(unit)
            copies += 1
        fh.write("\n]}\n")
    return written + 4, events, copies * len(numbers)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, required=True, help="a real chrome trace (.json or .json.gz)")
    ap.add_argument("--out", type=Path, required=True, help="the big trace to write (plain JSON)")
    ap.add_argument("--mb", type=float, default=250.0, help="size to reach, in MB (default 250)")
    args = ap.parse_args(argv)
    size, events, steps = write(args.src, args.out, int(args.mb * 1e6))
    print(f"{args.out}: {size / 1e6:.0f} MB, {events:,} events, {steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
