"""The point manifest (`manifest.json`): the contract between what writes an experiment point (the
runner, the simulator) and what reads it (the report). docs/tables.md lists the fields.

One file per point, beside its tables. Times are integer nanoseconds since the epoch (`*_ns`),
durations seconds (`*_s`). Readers use the typed fields below and nothing else; the model keeps
any other key a producer adds (the generator's summary, the machine, the simulator's spec) so a
manifest read and written again loses nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class Interval(_Model):
    start_ns: int
    end_ns: int


class Phases(_Model):
    """When the point's parts happened: the point's start, the load's start, and the generator's
    three phases (only `run` is measured)."""

    point_start_ns: int | None = None
    load_start_ns: int | None = None
    ramp_up: Interval | None = None
    run: Interval | None = None
    ramp_down: Interval | None = None


class PointInfo(_Model):
    """Which point of the sweep: its id, the swept values (`params`, dotted spec keys), the seed, and
    the workload level (closed-loop users, mean think time in seconds)."""

    id: str | None = None
    index: int | None = None
    repeat: int = 0
    params: dict[str, Any] = Field(default_factory=dict)
    seed: int | None = None
    users: float | None = None
    think_time_s: float | None = None


class Server(_Model):
    """A server the capture saw: its address (`ip:port`), tier, name and wire protocol."""

    address: str
    tier: str
    server: str
    protocol: str


class CaptureInfo(_Model):
    """Which capture recorded the point's traffic (issue 24): `engine` (tierscope-engine capture,
    without the outgoing copies) or `tcpdump`, what was asked for (`auto`, `engine`, `tcpdump`),
    why the engine's was not used when it was not, how the engine's took packets (`via`: `ebpf`,
    a program on the TC hook, or `packet`, an AF_PACKET socket, with `ebpf_unavailable` saying
    why), and the capture's own counts."""

    method: str | None = None
    requested: str | None = None
    interface: str | None = None
    listening: str | None = None
    fallback_reason: str | None = None
    via: str | None = None
    ebpf_unavailable: str | None = None
    captured: int | None = None
    received_by_filter: int | None = None
    dropped_by_kernel: int | None = None


class Manifest(_Model):
    """A point's manifest. Simulator manifests written before this model (top-level `start_ns` and
    `end_ns`, `rows`, the workload level only inside `spec`) are read as the same fields."""

    kind: Literal["run", "simulation"] = "run"
    status: Literal["done", "failed"] = "done"
    #: why a failed point failed
    reason: str | None = None
    point: PointInfo = Field(default_factory=PointInfo)
    #: the topology in the papers' notation with node types and DBMS (`1W/1A/0/1D-P`)
    topology: str | None = None
    #: servers per tier (`web`, `app`, `middleware`, `db`)
    tiers: dict[str, int] | None = None
    phases: Phases = Field(default_factory=Phases)
    #: rows written per table
    tables: dict[str, int] = Field(default_factory=dict)
    servers: list[Server] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    #: wall time of the whole point
    seconds: float | None = None
    #: program -> its version line
    versions: dict[str, str | None] = Field(default_factory=dict)
    #: the capture that ran (None: no capture, or a manifest older than the field)
    capture: CaptureInfo | None = None

    @model_validator(mode="before")
    @classmethod
    def _older_simulator_shape(cls, raw: Any) -> Any:
        if not isinstance(raw, dict) or raw.get("kind") != "simulation" or "phases" in raw:
            return raw
        raw = dict(raw)
        if isinstance(raw.get("start_ns"), int) and isinstance(raw.get("end_ns"), int):
            raw["phases"] = {"run": {"start_ns": raw.pop("start_ns"), "end_ns": raw.pop("end_ns")}}
        if "tables" not in raw and isinstance(raw.get("rows"), dict):
            raw["tables"] = raw.pop("rows")
        spec = raw.get("spec")
        spec = spec if isinstance(spec, dict) else {}
        workload = spec.get("workload")
        workload = workload if isinstance(workload, dict) else {}
        if "point" not in raw and "users" in workload:
            raw["point"] = {
                "users": workload["users"],
                "think_time_s": workload.get("think_time_s"),
                "seed": spec.get("seed"),
            }
        if "tiers" not in raw and isinstance(spec.get("tier"), list):
            raw["tiers"] = {
                t["name"]: t["servers"] for t in spec["tier"] if isinstance(t, dict) and "name" in t and "servers" in t
            }
        return raw

    def configuration(self) -> str | None:
        """The point's configuration: its topology plus every swept value but the workload level,
        so a sweep over, say, the database host's memory gives one configuration (one load curve,
        one row of the bottleneck map) per memory size: ``1W/1A/0/1D-P node_types.D.memory=150MiB``."""
        swept = [f"{k}={v}" for k, v in self.point.params.items() if k not in ("workload.users", "topology")]
        if not swept:
            return self.topology
        return " ".join(([self.topology] if self.topology else []) + swept)

    def run_interval(self) -> tuple[int, int] | None:
        """The measured interval ``(start_ns, end_ns)``, None when not recorded."""
        run = self.phases.run
        return (run.start_ns, run.end_ns) if run is not None else None


def read(path: str | Path) -> Manifest:
    """A manifest file; ValueError naming the file and the field when it is not one."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except ValueError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None
    try:
        return Manifest.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise ValueError(f"{path}: {where}: {first['msg']} (got {first.get('input')!r})") from None


#: what `trace.capture.LiveCapture` writes beside the capture it ran
CAPTURE_INFO = "capture.pcap.capture.json"


def write(manifest: Manifest, path: str | Path) -> None:
    """Write `manifest` to `path`. A manifest without `capture` takes it from the capture's own
    record beside it (`capture.pcap.capture.json`, written by the capture), so whichever code
    wrote the point says which capture ran."""
    path = Path(path)
    info = path.parent / CAPTURE_INFO
    if manifest.capture is None and info.is_file():
        try:
            manifest.capture = CaptureInfo.model_validate(json.loads(info.read_text()))
        except (ValueError, ValidationError):
            manifest.notes.append(f"{CAPTURE_INFO}: not readable, the capture used is not recorded")
    path.write_text(json.dumps(manifest.model_dump(mode="json"), indent=1, default=str) + "\n")
