"""Shared helpers: launch real ranks under the real launchers, always with a timeout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from eroica_runtime import summary

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
BIN = Path(sys.executable).parent

# Multi-rank tests share 2 cores: keep MPICH from spinning and torch from oversubscribing.
RANK_ENV = {"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1", "MPIR_CVAR_POLLS_BEFORE_YIELD": "10",
            "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def captures(report_dir: Path) -> dict[int, tuple[dict, list[dict], list[str]]]:
    """A finished job's capture files, decoded, by step: step -> (meta, summaries, errors)."""
    return {int(p.stem): summary.decode_capture(p.read_bytes())
            for p in sorted((report_dir / "captures").glob("*.msgpack"), key=lambda p: int(p.stem))}


def launch(argv: list[str], *, timeout: float = 180, env: dict[str, str] | None = None,
           cwd: str | Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command (eroica-run, torchrun, mpiexec...) to completion; a hang fails the test."""
    full_env = {**os.environ, **RANK_ENV, **(env or {})}
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout
        err = (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr
        pytest.fail(f"timed out after {timeout}s: {' '.join(map(str, argv))}\n--- stdout\n{out}\n--- stderr\n{err}")


def eroica_run(*args: str | Path, timeout: float = 180, env: dict[str, str] | None = None,
               cwd: str | Path | None = None) -> subprocess.CompletedProcess[str]:
    return launch([str(BIN / "eroica-run"), *map(str, args)], timeout=timeout, env=env, cwd=cwd)


def explain(proc: subprocess.CompletedProcess[str]) -> str:
    return f"rc={proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}"

