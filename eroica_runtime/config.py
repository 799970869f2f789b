"""eroica's settings: one frozen dataclass, read from ``EROICA_*`` variables.

The launcher turns its command-line flags into these variables; every rank reads them back with
:func:`Config.from_env`. The dataclass is the one table: each field carries its help text, metavar and
valid range (``setting()``), and eroica-run builds its flags from it (``flag_fields()``), so a flag,
its variable, its default, its check and its help can never drift apart. Every value is checked
(numbers finite and in range) and a bad one is reported in one line naming the flag and the variable.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields
from typing import Any


class ConfigError(ValueError):
    """A bad EROICA_* value or eroica flag; the message names it."""


def setting(default: Any, help: str = "", *, metavar: str | None = None, lo: float | None = None,
            hi: float | None = None, lo_open: bool = False, choices: tuple[str, ...] = ()) -> Any:
    """A Config field with its help text (fields with help become eroica-run flags) and valid range."""
    meta = {"help": help, "metavar": metavar, "lo": lo, "hi": hi, "lo_open": lo_open, "choices": choices}
    return field(default=default, metadata=meta)


DAY_S = 86400.0
# leader-side reduction with --leader-reduce auto (the default), from this many ranks (docs/benchmarks.md
# section 8): below, rank 0's share of a raw gather is tens of ms, and a capture file of every rank's raw
# summary is worth more for debugging. Above, the model of the live path says it pays: at 100,000 ranks
# rank 0 receives ~37 MB of node blocks instead of 1.14 GB of summaries and prints the diagnosis seconds
# sooner, though it reads the blocks somewhat slower than raw summaries as layout columns
REDUCE_AUTO_RANKS = 1024


@dataclass(frozen=True)
class Config:
    enabled: bool = setting(True)
    report_dir: str = setting("", "Where diagnoses and reports go (default ./eroica-report/<job id>).",
                              metavar="DIR")
    warmup_steps: int = setting(10, "Steps ignored by the detectors at the start. A job of several ranks "
                                "with no collective in them (nor up to step 32, where they made a process "
                                "group) is left alone (its ranks never wait for each other); for local SGD "
                                "averaging less often, set it above the period.", metavar="N", lo=0)
    window_steps: int = setting(3, "Steps profiled per capture.", metavar="K", lo=1, hi=1000)
    baseline: bool = setting(True)
    spike_ratio: float = setting(1.5, "Spike rule: all but one of the last --spike-steps steps above this x "
                                      "the rolling median (and its p90) fires.", metavar="X",
                                 lo=1.0, lo_open=True, hi=1000.0)
    spike_steps: int = setting(4, "Spike rule: how many recent steps must be slow.", metavar="N", lo=1, hi=10000)
    spike_history: int = setting(50, lo=2, hi=100000)
    drift_pct: float = setting(5.0, "Drift rule: mean of the last --drift-window steps this % above the best "
                                    "recent window fires; for 10 windows after a drift capture found healthy "
                                    "(no culprit, no slower than the baseline capture), above no less than the "
                                    "level it opened at; 0 disables.", metavar="PCT", lo=0.0, hi=10000.0)
    drift_window: int = setting(50, "Drift rule window (steps).", metavar="N", lo=2, hi=100000)
    lost_pct: float = setting(10.0, "Throughput rule: the share of time lost to steps slower than the median over "
                                    "the last --lost-window steps (the longest one left out), this many % points "
                                    "above the best such window, fires: repeated long stalls that leave the "
                                    "median alone. After its capture, only this many points above the share "
                                    "that capture saw, or once a whole window was back to normal (a job that "
                                    "evaluates every few dozen steps is captured once, and once more if "
                                    "nothing was found); 0 disables.",
                              metavar="PCT", lo=0.0, hi=100.0)
    lost_window: int = setting(48, "Throughput rule window (steps).", metavar="N", lo=4, hi=100000)
    burst_window_steps: int = setting(16, "Steps profiled when the throughput rule fires: slowness that comes and "
                                          "goes needs a window longer than its gaps.", metavar="K", lo=1, hi=1000)
    capture_at_steps: tuple[int, ...] = setting((), "Also capture at these steps, e.g. 100,500 (a step inside "
                                                    "another capture's window is taken when that window ends).",
                                                metavar="S,S", lo=0)
    cooldown_steps: int = setting(30, "Minimum steps between two captures.", metavar="N", lo=0)
    max_captures: int = setting(8, "Capture budget (baseline included): at most N captures at once; a spent one "
                                   "comes back every --capture-refill-steps steps. While it is spent, rank 0 says "
                                   "so at the first slowdown and at every request it refuses, and the job report "
                                   "counts them.",
                                metavar="N", lo=0, hi=100000)
    capture_refill_steps: int = setting(1000, "One spent capture comes back to the budget every N steps, so a job "
                                              "that runs for days keeps being watched while noise costs it at most "
                                              "one capture per N steps; 0 = never (N captures per job).",
                                        metavar="N", lo=0, hi=10**9)
    keep_captures: int = setting(16, "Capture files kept in <report-dir>/captures: the newest N, plus the "
                                     "baseline capture and the first capture of each finding; an older one's "
                                     "file is removed once it is diagnosed (its diagnosis-<step>.json stays, "
                                     "and `eroica analyze` reads it in the file's place); 0 = keep every file.",
                                 metavar="N", lo=0, hi=10**9)
    max_profiled_fraction: float = setting(0.2, "Cap on the fraction of steps spent profiling (the baseline and "
                                                "the first detector-triggered capture are always allowed).",
                                           metavar="F",
                                           lo=0.0, lo_open=True, hi=1.0)
    # boundaries a vote has to complete (MPICH moves it one stage per MPI call)
    vote_lag: int = setting(3, lo=1, hi=64)
    deadline_s: float = setting(20.0, "Deadline in seconds for every wait on the side channel.", metavar="S",
                                lo=0.0, lo_open=True, hi=DAY_S)
    topology: str = setting("", "Parallel layout for peer grouping, e.g. pp=4,tp=8,dp=* (last dim fastest).",
                            metavar="SPEC")
    hang_timeout_s: float = setting(0.0, "Hang watchdog floor in seconds; 0 = automatic (60). The watchdog "
                                         "looks after max(5 x the median step, this) without a step, and again at "
                                         "2x, 4x, ... that: ranks still moving then (a checkpoint, an evaluation) "
                                         "are a pause, said in one line, not a hang.", metavar="S",
                                    lo=0.0, hi=DAY_S)
    hang_factor: float = setting(5.0, lo=1.0, lo_open=True, hi=1e6)
    # seconds between samples of each rank's anonymous memory (memwatch.py in the rank, oom.MemoryTrail
    # in its wrapper)
    memory_sample_s: float = setting(2.0, lo=0.0, lo_open=True, hi=DAY_S)
    # seconds from a rank's start in which its memory growing until an OOM kill is start-up (loading a
    # model, a checkpoint, a dataset), not a leak (memgrowth.before_kill)
    memory_startup_s: float = setting(120.0, lo=0.0, hi=DAY_S)
    hang_action: str = setting("report", "On a diagnosed hang: report (keep waiting) or abort the job.",
                               metavar="report|abort", choices=("report", "abort"))
    exit_grace_s: float = setting(60.0, "Seconds a rank that finished may spend in interpreter teardown "
                                        "before eroica-run ends it with the exit code it chose (a library "
                                        "thread can deadlock Python's exit); 0 = wait forever.",
                                  metavar="S", lo=0.0, hi=DAY_S)
    leader_reduce: str = setting("auto", "Node leaders decode and validate their node's summaries and send "
                                         "rank 0 one column block each (~30x fewer bytes into rank 0 and a "
                                         "sooner diagnosis on large jobs; rank 0 then keeps raw summaries only "
                                         "of each node's most deviant ranks): auto (the default) = when the job "
                                         f"has >= {REDUCE_AUTO_RANKS} ranks, on, off (every rank's raw summary "
                                         "to rank 0).",
                                 metavar="auto|on|off", choices=("auto", "on", "off"))
    log_level: str = setting("info", choices=("debug", "info", "warning", "error"))
    # EROICA_KEEP_RAW_EVENTS=1: every rank also writes its window's raw profiler events beside the capture
    # (raw/<step>/rank<r>.msgpack, summary/rawevents.py): fixtures for the builder, or a bug report
    keep_raw_events: bool = setting(False)

    def reduces(self, world_size: int) -> bool:
        """Whether node leaders pre-reduce a capture of a ``world_size``-rank job (see REDUCE_AUTO_RANKS)."""
        return self.leader_reduce == "on" or (self.leader_reduce == "auto" and world_size >= REDUCE_AUTO_RANKS)

    @classmethod
    def from_env(cls, env: os._Environ[str] | dict[str, str] | None = None) -> Config:
        """Build from EROICA_* variables; unset ones keep their defaults."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            var = env_name(f.name)
            if var in env and env[var] != "":
                values[f.name] = parse(f.name, env[var])
        cfg = cls(**values)
        cfg.check()
        return cfg

    def check(self) -> None:
        """Reject values that would make the runtime misbehave, naming the flag and the variable."""
        for f in fields(self):
            _check_value(f.name, getattr(self, f.name))

    def to_env(self) -> dict[str, str]:
        """The EROICA_* variables that reproduce this config in a rank."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool):
                text = "1" if value else "0"
            elif isinstance(value, tuple):
                text = ",".join(str(v) for v in value)
            else:
                text = str(value)
            out[env_name(f.name)] = text
        return out


def env_name(field_name: str) -> str:
    """EROICA_<FIELD> (deadline_s -> EROICA_DEADLINE_S)."""
    return "EROICA_" + field_name.upper()


def flag_name(field_name: str) -> str:
    """eroica-run's flag for a field (deadline_s -> --deadline)."""
    return "--" + field_name.removesuffix("_s").replace("_", "-")


def flag_fields() -> list[Any]:
    """The fields that are eroica-run flags (those with help text), in declaration order."""
    return [f for f in fields(Config) if f.metadata.get("help")]


def _where(name: str) -> str:
    meta = _FIELDS[name].metadata
    return f"{flag_name(name)} ({env_name(name)})" if meta.get("help") else env_name(name)


def parse(name: str, text: str) -> Any:
    """One setting from its text (a flag's or a variable's value); ConfigError names both on failure."""
    default = _FIELDS[name].default
    try:
        if isinstance(default, bool):
            low = text.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if isinstance(default, int):
            return int(text.strip())
        if isinstance(default, float):
            return float(text.strip())
        if isinstance(default, tuple):
            return tuple(int(x) for x in text.replace(" ", "").split(",") if x)
        return text
    except ValueError:
        kind = {bool: "1/0, true/false", int: "an integer", float: "a number",
                tuple: "integers separated by commas"}.get(type(default), type(default).__name__)
        raise ConfigError(f"{_where(name)}={text!r}: expected {kind}") from None


def _check_value(name: str, value: Any) -> None:
    meta = _FIELDS[name].metadata
    where = _where(name)
    choices = meta.get("choices") or ()
    if choices and value not in choices:
        raise ConfigError(f"{where}={value!r}: use one of {', '.join(choices)}")
    items = value if isinstance(value, tuple) else (value,)
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            continue
        if not math.isfinite(item):
            raise ConfigError(f"{where}={item!r}: must be a finite number")
        lo, hi = meta.get("lo"), meta.get("hi")
        if lo is not None and (item <= lo if meta.get("lo_open") else item < lo):
            raise ConfigError(f"{where}={item!r}: must be {'>' if meta.get('lo_open') else '>='} {lo:g}")
        if hi is not None and item > hi:
            raise ConfigError(f"{where}={item!r}: must be <= {hi:g}")


_FIELDS = {f.name: f for f in fields(Config)}
