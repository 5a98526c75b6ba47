"""What one point of a run is while it runs: its context (everything it starts, so that teardown
stops exactly that), its status words, the live display's state, and its workload level and
phase times. Shared by the local runner and the `--hosts` runner (tierscope.remote)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from tierscope.runner.activity import ActivitySampler
from tierscope.spec import Point
from tierscope.testbed.lab import Interference, Testbed
from tierscope.testbed.monitor import Monitor
from tierscope.trace.capture import LiveCapture

DONE, FAILED = "done", "failed"


class PointFailed(RuntimeError):
    """A point could not finish (a tier died, a service did not start); the sweep goes on."""


@dataclass
class Progress:
    """What the live display shows; updated by the runner, read by the display thread."""

    points_total: int = 0
    point_index: int = 0
    point_id: str = ""
    phase: str = "starting"
    users: int = 0
    active_users: int = 0
    rps: float = 0.0
    p90_ms: float | None = None
    errors: int = 0
    point_started: float = 0.0
    point_seconds: float = 0.0
    finished: list[tuple[str, str, str]] = field(default_factory=list)  # (id, status, note)
    messages: list[str] = field(default_factory=list)  # the latest few
    messages_said: int = 0  # all messages so far (the list keeps only the latest)

    def say(self, message: str) -> None:
        self.messages.append(message)
        self.messages_said += 1
        del self.messages[:-6]


@dataclass
class Placement:
    """Where a point's hosts are when no local testbed holds them (a `--hosts` run,
    tierscope.remote): the manifest's testbed mode and the hosts lost on the way."""

    mode: str
    lost: list[str] = field(default_factory=list)


@dataclass
class PointContext:
    """Everything one point starts, so that teardown can stop exactly that, in reverse."""

    point: Point
    dir: Path
    testbed: Testbed | Placement | None = None
    hosts: dict = field(default_factory=dict)
    services: list = field(default_factory=list)
    capture: LiveCapture | None = None
    monitor: Monitor | None = None
    activity: ActivitySampler | None = None
    interference: Interference | None = None
    phases: dict = field(default_factory=dict)
    events: list[pa.Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    server_map: list[tuple[str, str, str, str]] = field(default_factory=list)  # addr:port tier name proto


def users_of(point: Point) -> int:
    """The point's workload level (`expand` gives every point exactly one)."""
    return int(point.config.workload.users[0])


def phase_times(t0: int, ramp_up: float, run: float, ramp_down: float) -> dict:
    """The ramp-up, run and ramp-down of a generator started at `t0` (ns), as the manifest keeps them."""
    s = lambda x: int(x * 1e9)  # noqa: E731
    return {
        "ramp_up": {"start_ns": t0, "end_ns": t0 + s(ramp_up)},
        "run": {"start_ns": t0 + s(ramp_up), "end_ns": t0 + s(ramp_up + run)},
        "ramp_down": {"start_ns": t0 + s(ramp_up + run), "end_ns": t0 + s(ramp_up + run + ramp_down)},
    }
