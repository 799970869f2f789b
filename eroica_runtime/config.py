"""eroica's settings: one frozen dataclass, read from ``EROICA_*`` variables.

The launcher turns its command-line flags into these variables; every rank reads them back with
:func:`Config.from_env`. One table (``FIELDS``) drives both directions and the help text, so a flag,
its variable and its default can never drift apart.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any


class ConfigError(ValueError):
    """A bad EROICA_* value; the message names the variable."""


@dataclass(frozen=True)
class Config:
    enabled: bool = True
    report_dir: str = ""
    warmup_steps: int = 10
    window_steps: int = 3
    baseline: bool = True
    spike_ratio: float = 1.5
    spike_steps: int = 4
    spike_history: int = 50
    drift_pct: float = 5.0
    drift_window: int = 50
    capture_at_steps: tuple[int, ...] = ()
    cooldown_steps: int = 30
    max_captures: int = 8
    max_profiled_fraction: float = 0.2
    vote_lag: int = 3               # boundaries a vote has to complete (MPICH moves it one stage per MPI call)
    deadline_s: float = 20.0
    topology: str = ""
    hang_timeout_s: float = 0.0
    hang_factor: float = 5.0
    hang_action: str = "report"
    log_level: str = "info"

    @classmethod
    def from_env(cls, env: os._Environ[str] | dict[str, str] | None = None) -> Config:
        """Build from EROICA_* variables; unset ones keep their defaults."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            var = env_name(f.name)
            if var in env and env[var] != "":
                values[f.name] = _parse(f.name, env[var], f.default)
        cfg = cls(**values)
        cfg.check()
        return cfg

    def check(self) -> None:
        """Reject values that would make the runtime misbehave, naming the variable."""
        if self.window_steps < 1:
            raise ConfigError(f"{env_name('window_steps')}={self.window_steps}: must be >= 1")
        if self.vote_lag < 1:
            raise ConfigError(f"{env_name('vote_lag')}={self.vote_lag}: must be >= 1")
        if self.spike_ratio <= 1.0:
            raise ConfigError(f"{env_name('spike_ratio')}={self.spike_ratio}: must be > 1")
        if self.deadline_s <= 0:
            raise ConfigError(f"{env_name('deadline_s')}={self.deadline_s}: must be > 0")
        if self.hang_action not in ("report", "abort"):
            raise ConfigError(f"{env_name('hang_action')}={self.hang_action!r}: use report or abort")
        if not 0 < self.max_profiled_fraction <= 1:
            raise ConfigError(f"{env_name('max_profiled_fraction')}: must be in (0, 1]")

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


def env_name(field: str) -> str:
    """EROICA_<FIELD> (deadline_s -> EROICA_DEADLINE_S)."""
    return "EROICA_" + field.upper()


def _parse(name: str, text: str, default: Any) -> Any:
    try:
        if isinstance(default, bool):
            low = text.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
        if isinstance(default, tuple):
            return tuple(int(x) for x in text.replace(" ", "").split(",") if x)
        return text
    except ValueError:
        raise ConfigError(f"{env_name(name)}={text!r}: expected {type(default).__name__}") from None
