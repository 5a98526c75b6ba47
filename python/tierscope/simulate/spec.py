"""The simulation spec: a small TOML file (reference: docs/simulate.md).

seed = 1
duration_s = 20
warmup_s = 1

[workload]
users = 300
think_time_s = 0.5            # mean of an exponential think time
mix = { ViewStory = 0.7, StoriesOfTheDay = 0.3 }
index_of_dispersion = 1       # 1 = Poisson; > 1 = bursty (MMPP, Mi et al. 2009)

[[tier]]
name = "app"
servers = 1
threads = 64
cores = 2
service_ms = { default = 1.0, ViewStory = 2.0 }
calls = 1
distribution = "exponential"
freeze = { period_s = 1.0, duration_s = 0.2 }
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tierscope.textfile import read_utf8

#: The default start of simulated time: an epoch-sized instant, so the tables look like a real run's.
DEFAULT_START_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z


class SpecError(ValueError):
    """A spec that cannot be simulated; the message names the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Freeze(_Strict):
    """Stop-the-world pauses of every server of a tier: nothing runs on its CPU while frozen."""

    period_s: float = Field(gt=0, description="mean time between pause starts")
    duration_s: float = Field(gt=0, description="length of each pause")
    jitter: float = Field(0.2, ge=0, le=1, description="uniform jitter of the period, as a share of it")
    offset_s: float = Field(0.0, ge=0, description="time of the first pause (plus jitter)")

    @model_validator(mode="after")
    def _shorter_than_period(self) -> Freeze:
        if self.duration_s >= self.period_s * (1 - self.jitter):
            raise ValueError("duration_s must be shorter than the shortest period, period_s·(1 - jitter)")
        return self


class Tier(_Strict):
    """One tier: `servers` identical servers, each a thread pool in front of `cores` CPUs."""

    name: str = Field(min_length=1)
    servers: int = Field(1, ge=1, le=64)
    threads: int = Field(64, ge=1, description="worker threads per server (soft resource)")
    cores: int = Field(1, ge=1, le=256, description="CPUs per server")
    service_ms: float | dict[str, float] = Field(
        description="CPU time per request in ms; a number, or a table by label with an optional `default`"
    )
    calls: int | dict[str, int] = Field(
        1, description="synchronous calls to the next tier per request (ignored at the last tier)"
    )
    distribution: Literal["exponential", "deterministic"] = "exponential"
    freeze: Freeze | None = None

    @field_validator("service_ms")
    @classmethod
    def _positive_service(cls, v):
        values = v.values() if isinstance(v, dict) else [v]
        if any(x < 0 for x in values):
            raise ValueError("service times must be >= 0 ms")
        return v

    @field_validator("calls")
    @classmethod
    def _nonnegative_calls(cls, v):
        values = v.values() if isinstance(v, dict) else [v]
        if any(x < 0 for x in values):
            raise ValueError("calls must be >= 0")
        return v

    def service_for(self, label: str) -> float:
        """Mean CPU time in seconds of a request of `label` at this tier."""
        if isinstance(self.service_ms, dict):
            if label in self.service_ms:
                return self.service_ms[label] / 1e3
            if "default" in self.service_ms:
                return self.service_ms["default"] / 1e3
            raise SpecError(f"tier {self.name!r}: no service_ms for label {label!r} and no default")
        return self.service_ms / 1e3

    def calls_for(self, label: str) -> int:
        if isinstance(self.calls, dict):
            return int(self.calls.get(label, self.calls.get("default", 1)))
        return int(self.calls)


class Workload(_Strict):
    """Closed-loop emulated users: think, send one request to the first tier, wait, repeat."""

    users: int = Field(ge=1, le=1_000_000)
    think_time_s: float = Field(ge=0, description="mean think time (exponential)")
    mix: dict[str, float] = Field(default_factory=lambda: {"request": 1.0})
    index_of_dispersion: float = Field(1.0, ge=1.0, description="I of the offered arrivals; 1 = Poisson")
    surge_share: float = Field(0.1, gt=0, lt=1, description="share of time in the surge state (I > 1)")
    surge_factor: float = Field(5.0, gt=1, description="think rate in a surge / outside it (I > 1)")

    @field_validator("mix")
    @classmethod
    def _mix(cls, v: dict[str, float]) -> dict[str, float]:
        if not v:
            raise ValueError("mix needs at least one label")
        if any(p < 0 for p in v.values()) or sum(v.values()) <= 0:
            raise ValueError("mix weights must be >= 0 with a positive sum")
        return v


class Spec(_Strict):
    """A closed N-tier system, its users, and how long to simulate it."""

    seed: int = 1
    duration_s: float = Field(gt=0, le=86_400)
    warmup_s: float = Field(0.0, ge=0, description="simulated but not written")
    start_ns: int = Field(DEFAULT_START_NS, ge=0, description="epoch ns of simulated time 0")
    workload: Workload
    tier: list[Tier] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> Spec:
        names = [t.name for t in self.tier]
        if len(set(names)) != len(names):
            raise ValueError(f"tier names must be unique, got {names}")
        if self.warmup_s >= self.duration_s:
            raise ValueError("warmup_s must be shorter than duration_s")
        for t in self.tier:
            for label in self.workload.mix:
                t.service_for(label)
        return self


def parse_spec(data: dict, source: str = "<spec>") -> Spec:
    """Validate a spec given as a dict; errors name the source and every bad field."""
    try:
        return Spec.model_validate(data)
    except ValidationError as err:
        lines = []
        for e in err.errors():
            where = ".".join(str(p) for p in e["loc"]) or "(top level)"
            lines.append(f"{source}: {where}: {e['msg']}")
        raise SpecError("\n".join(lines)) from None
    except SpecError as err:
        raise SpecError(f"{source}: {err}") from None


def load_spec(path: str | Path) -> Spec:
    """Read and validate a spec TOML file."""
    path = Path(path)
    try:
        text = read_utf8(path, "a simulator spec is TOML, which")
    except ValueError as err:
        raise SpecError(str(err)) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise SpecError(f"{path}: not valid TOML: {err}") from None
    return parse_spec(data, str(path))
