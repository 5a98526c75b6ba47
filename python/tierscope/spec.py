"""The experiment spec: one TOML file that says which system to build, how to drive and watch it,
what to inject, and which configurations to sweep (docs/spec.md is the reference).

`load_spec(path)` reads and validates a spec (every sweep point is checked, so a bad value fails
at load time with the file, the key path and what was expected); `expand(spec)` turns it into the
list of `Point`s the runner executes, each a fully resolved configuration with a stable id.

The topology notation of the papers is `#W/#A/#C/#D` (web / app / clustering middleware / database
server counts), each count optionally followed by a node-type letter, the database field also by a
DBMS letter (M = MariaDB, P = PostgreSQL, G = a Galera cluster of MariaDB nodes): `1/2/0/1L`,
`1L/2S/0/1S-P`, `1/1/1/2ML`, `1/1/0/3G`.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import itertools
import json
import math
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from tierscope.analysis import DEFAULT_WINDOW_NS
from tierscope.tiers import SERVER_PREFIX, TIERS

DBMS = {"M": "mariadb", "P": "postgres", "G": "galera"}
DBMS_LETTER = {v: k for k, v in DBMS.items()}
#: node-type letters must not collide with DBMS letters in the notation
RESERVED_LETTERS = set(DBMS)
MIXES = {"rubbos": ("browse_only", "read_write"), "tpcw": ("browsing", "shopping", "ordering")}
#: how messages name a benchmark
BENCHMARK_NAMES = {"rubbos": "RUBBoS", "tpcw": "the bookstore"}
#: named data sets per benchmark (tierscope.apps.rubbos.datagen.PRESETS)
SCALE_PRESETS = {"rubbos": ("tiny", "small", "paper"), "tpcw": ("tiny", "small", "paper")}

BUILTIN_NODE_TYPES: dict[str, dict[str, Any]] = {
    "S": {"cpu": 1.0, "memory": "2GiB", "description": "standard (normal) node: one core, 2 GiB"},
    "L": {
        "cpu": 0.25,
        "memory": "512MiB",
        "description": "low-cost node: a quarter of a core, 512 MiB",
    },
}


class SpecError(ValueError):
    """A spec that cannot be used; the message names the file, the key path and what was expected."""


# --- scalar parsers: durations and sizes -------------------------------------------------------

_DURATION_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_DURATION_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(us|ms|s|min|m|h)?\s*$")


def parse_duration(value: Any) -> float:
    """Seconds from a number (seconds) or a string with a unit: "50ms", "1.5s", "2m", "1h", "100us"."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 30, \"50ms\" or \"2m\", got a boolean")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        m = _DURATION_RE.match(value)
        if not m:
            raise ValueError(
                f"expected a duration such as 30, \"50ms\", \"1.5s\" or \"2m\", got {value!r}"
            )
        seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2) or "s"]
    else:
        raise ValueError(f"expected a duration such as 30, \"50ms\" or \"2m\", got {value!r}")
    if seconds < 0 or not math.isfinite(seconds):
        raise ValueError(f"expected a non-negative duration, got {value!r}")
    return seconds


_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1024, "kib": 1024, "kb": 1000,
    "m": 1024**2, "mib": 1024**2, "mb": 1000**2,
    "g": 1024**3, "gib": 1024**3, "gb": 1000**3,
    "t": 1024**4, "tib": 1024**4, "tb": 1000**4,
}  # fmt: skip
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(value: Any) -> int:
    """Bytes from an integer or a string: "512MiB" (= "512M", binary), "100MB" (decimal), "2G"."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as \"512MiB\" or 1048576, got a boolean")
    if isinstance(value, (int, float)):
        size = float(value)
    elif isinstance(value, str):
        m = _SIZE_RE.match(value)
        unit = m.group(2).lower() if m else None
        if not m or unit not in _SIZE_UNITS:
            raise ValueError(
                f"expected a size such as \"512MiB\", \"2G\", \"100MB\" or a byte count, got {value!r}"
            )
        size = float(m.group(1)) * _SIZE_UNITS[unit]
    else:
        raise ValueError(f"expected a size such as \"512MiB\" or a byte count, got {value!r}")
    if size < 0:
        raise ValueError(f"expected a non-negative size, got {value!r}")
    return int(size)


def _parse_users(value: Any) -> list[int]:
    """Users as an int, a list of ints, {from, to, step} or the string "1000..13000 step 1000"."""
    if isinstance(value, bool):
        raise ValueError("expected users as a number, a list or a range, got a boolean")
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        if not value:
            raise ValueError("expected at least one workload level, got an empty list")
        return value
    if isinstance(value, str):
        m = re.match(r"^\s*(\d+)\s*\.\.\s*(\d+)\s*(?:step\s*(\d+))?\s*$", value)
        if not m:
            raise ValueError(f"expected a range such as \"1000..13000 step 1000\", got {value!r}")
        value = {"from": int(m.group(1)), "to": int(m.group(2)), "step": int(m.group(3) or 1)}
    if isinstance(value, dict):
        unknown = set(value) - {"from", "to", "step"}
        if unknown or "from" not in value or "to" not in value:
            raise ValueError(
                "expected a range table { from = 1000, to = 13000, step = 1000 }, got "
                f"{value!r}"
            )
        start, stop, step = value["from"], value["to"], value.get("step", 1)
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (start, stop, step)):
            raise ValueError(f"expected integers in the users range, got {value!r}")
        if step <= 0 or stop < start:
            raise ValueError(f"expected from <= to and step > 0 in the users range, got {value!r}")
        return list(range(start, stop + 1, step))
    raise ValueError(f"expected users as a number, a list or a range, got {value!r}")


def _parse_scale(value: Any) -> float | str:
    """A data scale: a fraction of the paper's data set (0 < scale <= 100) or a preset name."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 100:
        return float(value)
    names = sorted({n for p in SCALE_PRESETS.values() for n in p})
    raise ValueError(
        f"expected a fraction of the paper's data set (0 < scale <= 100) or one of "
        f"{', '.join(names)}, got {value!r}"
    )


Duration = Annotated[float, BeforeValidator(parse_duration)]
Size = Annotated[int, BeforeValidator(parse_size)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


# --- topology ----------------------------------------------------------------------------------

_FIELD_RE = re.compile(r"^(\d+)([A-Z]?)$")
_DB_FIELD_RE = re.compile(r"^(\d+)(?:([MPG])([A-Z]?)|([A-Z]?)(?:-([A-Z]))?)$")


def parse_notation(text: str, default_dbms: str | None = None) -> dict[str, Any]:
    """The papers' `#W/#A/#C/#D` notation as an explicit topology table (node types None = default).

    Grammar (docs/spec.md): four fields separated by `/`; each is a count optionally followed by
    one node-type letter; the database field may also carry the DBMS letter, either right after
    the count (`1M`, `9ML`, as in the papers) or after a dash (`1S-P`).
    """
    if not isinstance(text, str):
        raise ValueError(f"expected a topology string such as \"1/2/0/1L\", got {text!r}")
    fields = [f.strip() for f in text.split("/")]
    if len(fields) != 4:
        raise ValueError(
            f"expected four fields #W/#A/#C/#D such as \"1/2/0/1L\" or \"1L/2S/0/1S-P\", got "
            f"{text!r} ({len(fields)} field{'s' if len(fields) != 1 else ''})"
        )
    out: dict[str, Any] = {}
    for tier, field in zip(TIERS, fields):
        if tier == "db":
            m = _DB_FIELD_RE.match(field)
            if not m:
                raise ValueError(
                    f"{text!r}: database field {field!r}: expected a count, an optional node-type "
                    "letter and an optional DBMS letter M, P or G, e.g. \"1\", \"2L\", \"1M\", \"1S-P\", \"3G\""
                )
            count = int(m.group(1))
            letter = m.group(2) or m.group(5) or default_dbms
            node_type = m.group(3) or m.group(4) or None
            if letter is not None and letter not in DBMS:
                raise ValueError(
                    f"{text!r}: DBMS letter {letter!r}: expected M (MariaDB) or P (PostgreSQL) or G (Galera)"
                )
            if node_type in RESERVED_LETTERS:
                raise ValueError(
                    f"{text!r}: database field {field!r}: {node_type} after a dash is read as a "
                    "node type, but M, P and G are DBMS letters; write e.g. \"1S-P\" or \"1P\""
                )
            out[tier] = {"count": count, "node_type": node_type, "dbms": DBMS.get(letter or "")}
        else:
            m = _FIELD_RE.match(field)
            if not m:
                raise ValueError(
                    f"{text!r}: {tier} field {field!r}: expected a count optionally followed by one "
                    "node-type letter, e.g. \"1\" or \"2L\""
                )
            if m.group(2) in RESERVED_LETTERS:
                raise ValueError(
                    f"{text!r}: {tier} field {field!r}: {m.group(2)} is a DBMS letter, only allowed "
                    "in the database field"
                )
            out[tier] = {"count": int(m.group(1)), "node_type": m.group(2) or None}
    return out


class TierSpec(_Model):
    """One tier: how many servers, their node type(s) (one letter, or one per server)."""

    count: int = Field(ge=0, le=32)
    node_type: str | list[str] | None = None
    dbms: Literal["postgres", "mariadb", "galera"] | None = None

    @field_validator("dbms", mode="before")
    @classmethod
    def _dbms_letter(cls, v: Any) -> Any:
        if isinstance(v, str) and v.upper() in DBMS:
            return DBMS[v.upper()]
        if isinstance(v, str):
            return v.lower()
        return v

    @model_validator(mode="after")
    def _per_server_types(self) -> "TierSpec":
        if isinstance(self.node_type, list) and len(self.node_type) != self.count:
            raise ValueError(
                f"node_type lists one type per server: expected {self.count} entries, got "
                f"{len(self.node_type)}"
            )
        return self

    def types(self, default: str) -> list[str]:
        if isinstance(self.node_type, list):
            return list(self.node_type)
        return [self.node_type or default] * self.count


def _topology_input(value: Any) -> Any:
    if isinstance(value, str):
        return {"notation": value, **parse_notation(value)}
    return value


class Topology(_Model):
    """The servers per tier. Written as the notation string or as a table per tier."""

    web: TierSpec = Field(default_factory=lambda: TierSpec(count=1))
    app: TierSpec = Field(default_factory=lambda: TierSpec(count=1))
    middleware: TierSpec = Field(default_factory=lambda: TierSpec(count=0))
    db: TierSpec = Field(default_factory=lambda: TierSpec(count=1))
    notation: str | None = Field(default=None, exclude=True)


class Server(_Model):
    """One server of a resolved topology: `db1` of tier `db`, node type `L`, on PostgreSQL."""

    name: str
    tier: str
    index: int
    node_type: str
    dbms: str | None = None


# --- node types, soft resources, workload, monitor, interference ------------------------------


class NodeType(_Model):
    """What a host of this type gets: CPU share or dedicated CPUs, memory, disk limits (None = none)."""

    description: str = ""
    cpu: float | None = Field(default=None, gt=0, le=1024)  # cores, as a CFS quota
    cpus: str | None = None  # dedicated CPUs (cpuset), e.g. "1" or "0-1"
    cpu_period: Duration = 0.1  # CFS period (seconds); quota = cpu x period
    memory: Size | None = None
    disk_read_bps: Size | None = None
    disk_write_bps: Size | None = None
    disk_read_iops: int | None = Field(default=None, gt=0)
    disk_write_iops: int | None = Field(default=None, gt=0)
    disk_device: str | None = None  # "/dev/vda" or "254:0"; default: the disk of the work dir

    @field_validator("cpus")
    @classmethod
    def _cpuset(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", v.replace(" ", "")):
            raise ValueError(f"expected a CPU list such as \"1\", \"0-1\" or \"0,2\", got {v!r}")
        return v.replace(" ", "") if v else v

    @field_validator("cpu_period")
    @classmethod
    def _period(cls, v: float) -> float:
        if not 0.001 <= v <= 1.0:
            raise ValueError(f"expected a CFS period between 1ms and 1s, got {v}s")
        return v

    @field_validator("memory")
    @classmethod
    def _memory(cls, v: int | None) -> int | None:
        if v is not None and v < 4 * 1024**2:
            raise ValueError(f"expected a memory limit of at least 4MiB, got {v} bytes")
        return v

    def cpuset_cpus(self) -> list[int]:
        """The dedicated CPU numbers ([] when not pinned)."""
        out: list[int] = []
        for part in (self.cpus or "").split(","):
            if not part:
                continue
            lo, _, hi = part.partition("-")
            out.extend(range(int(lo), int(hi or lo) + 1))
        return out

    def cores(self, machine_cores: int) -> float:
        """The CPU allowance in cores: the quota, or the cpuset size, or the whole machine."""
        allowance = float(machine_cores)
        if self.cpus:
            allowance = float(len(self.cpuset_cpus()))
        if self.cpu is not None:
            allowance = min(allowance, self.cpu)
        return allowance


class WebSoft(_Model):
    workers: int = Field(default=1, ge=1, le=256)  # nginx worker processes
    connections: int = Field(default=1024, ge=16, le=1_000_000)  # nginx worker_connections


class AppSoft(_Model):
    workers: int = Field(default=1, ge=1, le=256)  # app server processes
    threads: int = Field(default=8, ge=1, le=4096)  # threads per worker
    db_pool: int = Field(default=8, ge=1, le=4096)  # database connection pool size per worker


class MiddlewareSoft(_Model):
    pool: int = Field(default=16, ge=1, le=4096)  # connections to each database server
    policy: Literal["lprf", "rr", "wrr", "lrt", "aware"] = "lprf"  # read balancing (docs/middleware.md)
    weights: list[Annotated[float, Field(ge=0)]] | None = None  # wrr: one per database server
    wait: Literal["first", "all"] = "first"  # a write is answered after the first / all backends


class DbSoft(_Model):
    max_connections: int = Field(default=100, ge=5, le=100_000)
    cache: Size = parse_size("128MiB")  # shared_buffers / innodb_buffer_pool_size
    fsync: bool = False  # commits reach the disk (on for studies of the disk; off is faster)
    warm: bool = False  # the db host reads its data files before the load (a site that has run a while)


class Soft(_Model):
    """Soft resources per tier (thread pools, connection pools, caches)."""

    web: WebSoft = Field(default_factory=WebSoft)
    app: AppSoft = Field(default_factory=AppSoft)
    middleware: MiddlewareSoft = Field(default_factory=MiddlewareSoft)
    db: DbSoft = Field(default_factory=DbSoft)


class Workload(_Model):
    """Closed-loop emulated users; `users` is the list of workload levels (one point each)."""

    users: Annotated[list[Annotated[int, Field(ge=1, le=1_000_000)]], BeforeValidator(_parse_users)]
    think_time: Duration = 7.0  # mean, negative exponential (RUBBoS/TPC-W)
    dispersion: float = Field(default=1.0, ge=1.0, le=100_000)  # index of dispersion I; 1 = not bursty
    ramp_up: Duration = 10.0
    run: Duration = 60.0
    ramp_down: Duration = 5.0

    @field_validator("run")
    @classmethod
    def _run(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("expected a run phase longer than 0 s")
        return v


class Monitor(_Model):
    """How the lab watches: resource interval, packet capture, analysis window."""

    interval: Duration = 1.0
    capture: bool = True
    snaplen: int = Field(default=512, ge=64, le=262_144)
    window: Duration = DEFAULT_WINDOW_NS / 1e9

    @field_validator("interval")
    @classmethod
    def _interval(cls, v: float) -> float:
        if not 0.05 - 1e-9 <= v <= 60:
            raise ValueError(f"expected a resource interval between 50ms and 60s, got {v:g}s")
        return v

    @field_validator("window")
    @classmethod
    def _window(cls, v: float) -> float:
        if not 0.001 - 1e-12 <= v <= 60:
            raise ValueError(f"expected an analysis window between 1ms and 60s, got {v:g}s")
        return v


class _Target(_Model):
    tier: str | None = None
    server: str | None = None

    @model_validator(mode="after")
    def _one_target(self):
        if (self.tier is None) == (self.server is None):
            raise ValueError("expected exactly one of tier (e.g. \"app\") or server (e.g. \"app1\")")
        if self.tier is not None and self.tier not in TIERS:
            raise ValueError(f"tier: expected one of {', '.join(TIERS)}, got {self.tier!r}")
        return self


class Pause(_Target):
    """Stop-the-world pauses (SIGSTOP ... SIGCONT of the target's processes) on a schedule."""

    period: Duration  # from the start of one pause to the start of the next
    duration: Duration  # how long each pause lasts
    start: Duration = 0.0  # offset of the first pause after the injector starts
    jitter: float = Field(default=0.0, ge=0.0, le=1.0)  # period varies uniformly by +- jitter x period

    @model_validator(mode="after")
    def _fits(self):
        if self.duration <= 0 or self.duration >= self.period:
            raise ValueError(
                f"expected 0 < duration < period, got duration {self.duration:g}s and period "
                f"{self.period:g}s"
            )
        return self


class NoisyNeighbour(_Target):
    """A bursty CPU burner in the target host's cgroup: 2-state MMPP of CPU work (seed 001 §5)."""

    utilization: float = Field(gt=0, le=64)  # mean CPU demand, cores
    burstiness: float = Field(default=1.0, ge=1.0, le=100_000)  # index of dispersion I
    job: Duration = 0.001  # CPU time of one unit of work (seconds)
    peak: float = Field(default=1.0, gt=0, le=64)  # demand while ON, cores (the burner is one thread)

    @model_validator(mode="after")
    def _peak(self):
        if self.utilization > self.peak:
            raise ValueError(
                f"expected utilization <= peak ({self.peak:g} cores), got {self.utilization:g}"
            )
        if self.peak > 1.0:
            raise ValueError("expected peak <= 1 core (the burner is one thread)")
        return self


class Interference(_Model):
    pause: list[Pause] = []
    noisy_neighbour: list[NoisyNeighbour] = []


class Sweep(_Model):
    """The cartesian product of `matrix` lists, then `filters` (all must hold), then `repeats`."""

    matrix: dict[str, Any] = {}
    filters: list[str] = []
    repeats: int = Field(default=1, ge=1, le=1000)


class Client(_Model):
    count: int = Field(default=1, ge=1, le=1)
    node_type: str | None = None  # None: the generator runs without limits
    #: generators driven as one: each runs a share of the users; their logs become one table
    hosts: int = Field(default=1, ge=1, le=64)


def db_topology_problem(dbms: str | None, n_db: int, n_middleware: int) -> str | None:
    """Why the lab cannot build this database tier (None when it can).

    Several database servers are replicas behind a clustering middleware (PostgreSQL only), or the
    nodes of a Galera cluster, which replicates by itself and takes no middleware."""
    if n_middleware and dbms == "galera":
        return (f"the topology has {n_middleware} clustering middleware server(s) with galera: a Galera cluster "
                "replicates by itself (the app servers use its nodes directly), set #C = 0, e.g. 1/1/0/3G")
    if n_middleware and dbms not in (None, "postgres"):
        return (f"the topology has {n_middleware} clustering middleware server(s) with {dbms}: the middleware "
                "speaks the PostgreSQL protocol only (use dbms = postgres, letter P)")
    if n_db > 1 and not n_middleware and dbms != "galera":
        return (f"the topology has {n_db} database servers and no clustering middleware: several database "
                "servers are replicas behind a middleware (e.g. 1/2/1/2), set #C >= 1, or the nodes of a "
                "Galera cluster (DBMS letter G, e.g. 1/1/0/3G)")
    return None


class PointConfig(_Model):
    """A fully resolved configuration: what one sweep point builds, drives, watches and injects."""

    name: str
    description: str = ""
    seed: int = Field(default=1, ge=0)
    benchmark: Literal["rubbos", "tpcw"] = "rubbos"
    mix: str | None = None  # the benchmark's first mix when not given
    scale: Annotated[float | str, BeforeValidator(_parse_scale)] = 0.01  # fraction of the paper's, or a preset
    dbms: Literal["postgres", "mariadb", "galera"] = "postgres"
    default_node_type: str = "S"
    topology: Annotated[Topology, BeforeValidator(_topology_input)] = Field(
        default_factory=Topology
    )
    node_types: dict[str, NodeType] = Field(default_factory=dict)
    client: Client = Field(default_factory=Client)
    soft: Soft = Field(default_factory=Soft)
    workload: Workload
    monitor: Monitor = Field(default_factory=Monitor)
    interference: Interference = Field(default_factory=Interference)

    @field_validator("dbms", mode="before")
    @classmethod
    def _dbms(cls, v: Any) -> Any:
        if isinstance(v, str) and v.upper() in DBMS:
            return DBMS[v.upper()]
        return v.lower() if isinstance(v, str) else v

    @field_validator("node_types", mode="before")
    @classmethod
    def _builtins(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            return v
        merged: dict[str, Any] = {k: dict(t) for k, t in BUILTIN_NODE_TYPES.items()}
        for name, table in v.items():
            if not re.fullmatch(r"[A-Z]", name) or name in RESERVED_LETTERS:
                raise ValueError(
                    f"node type {name!r}: expected one upper-case letter other than M and P "
                    "(MariaDB, PostgreSQL) and G (Galera): those are DBMS letters"
                )
            if isinstance(table, dict) and name in merged:
                changed = {k: v for k, v in table.items() if k != "description"}
                base = dict(merged[name])
                if changed and "description" not in table:
                    base["description"] = f"built-in {name}, changed: " + ", ".join(
                        f"{k}={v}" for k, v in changed.items()
                    )
                merged[name] = {**base, **table}
            else:
                merged[name] = table
        return merged

    @model_validator(mode="after")
    def _consistent(self) -> "PointConfig":
        allowed = MIXES[self.benchmark]
        if self.mix is None:
            self.mix = allowed[0]
        if self.mix not in allowed:
            raise ValueError(f"mix: expected one of {', '.join(allowed)}, got {self.mix!r}")
        presets = SCALE_PRESETS[self.benchmark]
        if isinstance(self.scale, str) and self.scale not in presets:
            raise ValueError(
                f"scale: expected a fraction of the paper's data set (0 < scale <= 100) or one of "
                f"{', '.join(presets)}, got {self.scale!r}"
            )
        if self.topology.db.dbms is None:
            self.topology.db.dbms = self.dbms
        else:  # the topology's DBMS letter names the point's DBMS (what the runner and the apps start)
            self.dbms = self.topology.db.dbms
        for tier in TIERS:
            for t in getattr(self.topology, tier).types(self.default_node_type):
                if t not in self.node_types:
                    raise ValueError(
                        f"topology.{tier}: node type {t!r} is not defined (defined: "
                        f"{', '.join(sorted(self.node_types))}; add a [node_types.{t}] table)"
                    )
        if self.client.node_type and self.client.node_type not in self.node_types:
            raise ValueError(f"client.node_type: node type {self.client.node_type!r} is not defined")
        mw = self.soft.middleware
        if mw.weights is not None and (len(mw.weights) != self.topology.db.count or not any(w > 0 for w in mw.weights)):
            raise ValueError(f"soft.middleware.weights: expected one weight per database server "
                             f"({self.topology.db.count}), one of them > 0, got {mw.weights}")
        if mw.weights is not None and mw.policy != "wrr":
            raise ValueError(f"soft.middleware.weights: only with policy = \"wrr\" (policy is {mw.policy!r})")
        problem = db_topology_problem(self.topology.db.dbms, self.topology.db.count, self.topology.middleware.count)
        if problem:
            raise ValueError(f"topology: {problem}")
        for tier in ("web", "app", "db"):
            if getattr(self.topology, tier).count < 1:
                raise ValueError(f"topology.{tier}: {BENCHMARK_NAMES[self.benchmark]} needs at least one {tier} server")
        names = {s.name for s in self.servers()}
        for kind, items in (("pause", self.interference.pause),
                            ("noisy_neighbour", self.interference.noisy_neighbour)):  # fmt: skip
            for i, item in enumerate(items):
                if item.server is not None and item.server not in names:
                    raise ValueError(
                        f"interference.{kind}[{i}].server: no server {item.server!r} in this "
                        f"topology (servers: {', '.join(sorted(names))})"
                    )
                if item.tier is not None and getattr(self.topology, item.tier).count == 0:
                    raise ValueError(
                        f"interference.{kind}[{i}].tier: the {item.tier} tier has no servers"
                    )
        return self

    def servers(self) -> list[Server]:
        """Every server of the topology in tier order: web1, app1, app2, mw1, db1..."""
        out = []
        for tier in TIERS:
            spec = getattr(self.topology, tier)
            for i, t in enumerate(spec.types(self.default_node_type), start=1):
                out.append(
                    Server(
                        name=f"{SERVER_PREFIX[tier]}{i}",
                        tier=tier,
                        index=i,
                        node_type=t,
                        dbms=spec.dbms if tier == "db" else None,
                    )
                )
        return out

    def tier_servers(self, tier: str) -> list[Server]:
        return [s for s in self.servers() if s.tier == tier]

    def notation(self) -> str:
        """The topology in the papers' notation, node types and DBMS letter spelled out."""
        parts = []
        for tier in TIERS:
            spec = getattr(self.topology, tier)
            types = spec.types(self.default_node_type)
            letter = types[0] if types and len(set(types)) == 1 else ""
            field = f"{spec.count}{letter}"
            if tier == "db":
                field += f"-{DBMS_LETTER[spec.dbms or self.dbms]}"
            parts.append(field)
        return "/".join(parts)


class Spec(_Model):
    """A whole experiment: a base configuration plus the sweep; `expand` gives its points."""

    name: str
    path: str | None = None
    base: dict[str, Any]
    sweep: Sweep = Field(default_factory=Sweep)


class Point(_Model):
    """One run of the sweep: a fully resolved configuration, its swept parameters and stable id."""

    id: str
    index: int
    repeat: int
    params: dict[str, Any]
    seed: int
    config: PointConfig


# --- loading and errors ------------------------------------------------------------------------


def _loc_str(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and (
            "[" in part or part.startswith("function-") or part in ("list", "dict", "str")
        ):
            continue  # pydantic's union / validator tags, not a key
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _model_at(model: type[BaseModel] | None, loc: tuple) -> type[BaseModel] | None:
    """The model class found by following the key path `loc` from `model` (None when unknown)."""
    import typing

    skip_key = False  # the next part is a key of a dict of models (e.g. a node type's letter)
    for part in loc:
        if isinstance(part, int):
            continue
        if skip_key:
            skip_key = False
            continue
        field = model.model_fields.get(part) if model is not None else None
        if field is None:
            return None
        models = _classes_in(field.annotation)
        model = models[0] if models else None
        skip_key = typing.get_origin(field.annotation) is dict
    return model


def _classes_in(ann: Any) -> list[type[BaseModel]]:
    """The pydantic model classes named in a type annotation (list[X], dict[str, X], X | None)."""
    out = []
    stack = [ann]
    while stack:
        a = stack.pop()
        if isinstance(a, type) and issubclass(a, BaseModel):
            out.append(a)
        stack.extend(getattr(a, "__args__", ()) or ())
    return out


def _format_errors(err: ValidationError, where: str, root: type[BaseModel]) -> str:
    lines = []
    for e in err.errors():
        loc = e["loc"]
        path = _loc_str(loc)
        if e["type"] == "extra_forbidden":
            parent = _model_at(root, tuple(loc[:-1]))
            expected = (
                f" (expected one of: {', '.join(k for k, f in parent.model_fields.items() if not f.exclude)})"
                if parent is not None
                else ""
            )
            lines.append(f"{where}: {path}: unknown key{expected}")
        elif e["type"] == "missing":
            lines.append(f"{where}: {path}: missing required key")
        else:
            msg = e["msg"]
            msg = msg.removeprefix("Value error, ")
            got = e.get("input")
            suffix = ""
            if not isinstance(got, (dict, list)) and "got" not in msg and repr(got) not in msg:
                suffix = f" (got {got!r})"
            if not loc or path == "(top level)":
                lines.append(f"{where}: {msg}{suffix if loc else ''}")
            else:
                lines.append(f"{where}: {path}: {msg}{suffix}")
    return "\n".join(lines)


def _set_path(tree: dict, path: str, value: Any) -> None:
    keys = path.split(".")
    node = tree
    for k in keys[:-1]:
        nxt = node.get(k)
        if not isinstance(nxt, dict):
            nxt = {}
            node[k] = nxt
        node = nxt
    node[keys[-1]] = value


def _get_path(tree: Any, path: str) -> Any:
    node = tree
    for k in path.split("."):
        if not isinstance(node, dict) or k not in node:
            raise KeyError(path)
        node = node[k]
    return node


def _flatten_matrix(matrix: dict, prefix: str = "") -> dict[str, list]:
    """Dotted key -> list of values; nested TOML tables (`workload.users = [...]`) are flattened."""
    out: dict[str, list] = {}
    for k, v in matrix.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten_matrix(v, key + "."))
        elif isinstance(v, list):
            if not v:
                raise SpecError(f"sweep.matrix.{key}: expected a non-empty list of values")
            out[key] = v
        else:
            raise SpecError(
                f"sweep.matrix.{key}: expected a list of values to sweep, got {v!r} (write [{v!r}])"
            )
    return out


def load_spec(path: str | Path) -> Spec:
    """Read and validate a spec file; every sweep point is validated. Raises SpecError."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise SpecError(f"{path}: cannot read: {err.strerror or err}") from err
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise SpecError(f"{path}:{line}:{column}: not UTF-8 (byte 0x{data[err.start]:02x}); a spec is TOML, "
                        f"which is UTF-8 text") from None
    return parse_spec(text, where=str(path), name=path.stem)


def parse_spec(text: str, where: str = "<spec>", name: str = "spec") -> Spec:
    """Validate a spec given as TOML text (`where` names it in errors)."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise SpecError(f"{where}: not valid TOML: {err}") from err
    return spec_from_dict(raw, where=where, name=name)


def spec_from_dict(raw: dict[str, Any], where: str = "<spec>", name: str = "spec") -> Spec:
    raw = copy.deepcopy(raw)
    raw.setdefault("name", name)
    sweep_raw = raw.pop("sweep", {})
    if not isinstance(sweep_raw, dict):
        raise SpecError(f"{where}: sweep: expected a table ([sweep]), got {sweep_raw!r}")
    try:
        sweep = Sweep.model_validate(sweep_raw)
    except ValidationError as err:
        raise SpecError(_format_errors(err, where, Sweep).replace(f"{where}: ", f"{where}: sweep.")) from err
    try:
        axes = _flatten_matrix(sweep.matrix)
    except SpecError as err:
        raise SpecError(f"{where}: {err}") from None
    sweep = Sweep(matrix=axes, filters=sweep.filters, repeats=sweep.repeats)
    for i, expr in enumerate(sweep.filters):
        try:
            _compile_filter(expr)
        except ValueError as err:
            raise SpecError(f"{where}: sweep.filters[{i}]: {err}") from None
    spec = Spec(name=str(raw["name"]), path=where, base=raw, sweep=sweep)
    points = expand(spec, where=where)  # validates every point
    if not points:
        raise SpecError(f"{where}: sweep.filters: no point is left after the filters")
    return spec


# --- sweep filters: a tiny safe expression language --------------------------------------------

_ALLOWED = (
    ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.Compare,
    ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.Name, ast.Load,
    ast.Attribute, ast.Constant, ast.List, ast.Tuple, ast.BinOp, ast.Add, ast.Sub, ast.Mult,
    ast.Div, ast.Mod,
)  # fmt: skip


def _compile_filter(expr: str) -> ast.Expression:
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as err:
        raise ValueError(f"not a valid expression: {expr!r} ({err.msg})") from None
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED):
            raise ValueError(
                f"{expr!r}: {type(node).__name__} is not allowed (use comparisons, and/or/not, "
                "in, arithmetic, names such as users or workload.users)"
            )
    return tree


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr}" if head else None
    return None


def _eval_filter(tree: ast.AST, names: dict[str, Any], raw: dict[str, Any], expr: str) -> Any:
    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.Name, ast.Attribute)):
            key = _dotted(node)
            if key in names:
                return names[key]
            try:
                return _get_path(raw, key or "")
            except KeyError:
                raise ValueError(
                    f"{expr!r}: unknown name {key!r} (use a spec key such as workload.users, or "
                    f"one of: {', '.join(sorted(names))})"
                ) from None
        if isinstance(node, (ast.List, ast.Tuple)):
            return [ev(e) for e in node.elts]
        if isinstance(node, ast.BoolOp):
            vals = [ev(v) for v in node.values]
            return all(vals) if isinstance(node.op, ast.And) else any(vals)
        if isinstance(node, ast.UnaryOp):
            v = ev(node.operand)
            return (not v) if isinstance(node.op, ast.Not) else -v
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
                   ast.Div: lambda: a / b, ast.Mod: lambda: a % b}  # fmt: skip
            return ops[type(node.op)]()
        if isinstance(node, ast.Compare):
            left = ev(node.left)
            for op, comp in zip(node.ops, node.comparators):
                right = ev(comp)
                ok = {
                    ast.Eq: lambda: left == right, ast.NotEq: lambda: left != right,
                    ast.Lt: lambda: left < right, ast.LtE: lambda: left <= right,
                    ast.Gt: lambda: left > right, ast.GtE: lambda: left >= right,
                    ast.In: lambda: left in right, ast.NotIn: lambda: left not in right,
                }[type(op)]()  # fmt: skip
                if not ok:
                    return False
                left = right
            return True
        raise ValueError(f"{expr!r}: {type(node).__name__} is not allowed")

    return ev(tree)


# --- expansion ---------------------------------------------------------------------------------


def _slug(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return re.sub(r"[^A-Za-z0-9.]+", "_", text).strip("_")[:24] or "x"


def expand(spec: Spec, where: str | None = None) -> list[Point]:
    """Every point of the spec: repeats x matrix (in key order) x workload levels, filtered.

    A point's id is stable: the swept values in words plus a hash of its resolved configuration,
    so the same configuration gets the same id in every run (what `--resume` relies on).
    """
    where = where or spec.path or "<spec>"
    axes = spec.sweep.matrix
    filters = [_compile_filter(f) for f in spec.sweep.filters]
    keys = list(axes)
    points: list[Point] = []
    cache: dict[str, PointConfig] = {}
    for repeat in range(spec.sweep.repeats):
        for combo in itertools.product(*(axes[k] for k in keys)):
            raw = copy.deepcopy(spec.base)
            for k, v in zip(keys, combo):
                _set_path(raw, k, copy.deepcopy(v))
            ck = json.dumps(raw, sort_keys=True, default=str)
            if ck not in cache:
                try:
                    cache[ck] = PointConfig.model_validate(raw)
                except ValidationError as err:
                    context = ""
                    if keys:
                        context = " [sweep point " + ", ".join(
                            f"{k}={v!r}" for k, v in zip(keys, combo)
                        ) + "]"
                    msg = _format_errors(err, where, PointConfig)
                    raise SpecError(
                        "\n".join(line + context for line in msg.splitlines())
                    ) from None
            base_cfg = cache[ck]
            for users in base_cfg.workload.users:
                cfg = base_cfg.model_copy(deep=True)
                cfg.workload.users = [users]
                params = {k: v for k, v in zip(keys, combo)}
                params["workload.users"] = users
                names = {
                    "users": users,
                    "repeat": repeat,
                    "topology": cfg.notation(),
                    "dbms": cfg.topology.db.dbms,
                    **{t: getattr(cfg.topology, t).count for t in TIERS},
                    **params,
                }
                keep = True
                for i, tree in enumerate(filters):
                    try:
                        keep = keep and bool(_eval_filter(tree, names, raw, spec.sweep.filters[i]))
                    except ValueError as err:
                        raise SpecError(f"{where}: sweep.filters[{i}]: {err}") from None
                    except TypeError as err:
                        raise SpecError(
                            f"{where}: sweep.filters[{i}]: {spec.sweep.filters[i]!r}: {err}"
                        ) from None
                if not keep:
                    continue
                points.append(_make_point(cfg, params, repeat, len(points), spec))
    return points


def _make_point(cfg: PointConfig, params: dict, repeat: int, index: int, spec: Spec) -> Point:
    dumped = cfg.model_dump(mode="json")
    dumped.pop("description", None)  # words do not change what runs: ids survive edits to them
    for nt in dumped.get("node_types", {}).values():
        nt.pop("description", None)
    canonical = json.dumps({"config": dumped, "repeat": repeat}, sort_keys=True)
    digest = hashlib.sha256(canonical.encode()).hexdigest()
    words = []
    for k, v in params.items():
        short = "users" if k == "workload.users" else k.rsplit(".", 1)[-1]
        if k == "topology" and not isinstance(v, str):
            v = cfg.notation()  # an explicit table reads better as its notation
        words.append(f"{short}{_slug(v)}")
    if spec.sweep.repeats > 1:
        words.append(f"r{repeat}")
    pid = "-".join(words + [digest[:8]])
    seed = (cfg.seed * 1_000_003 + int(digest[:8], 16)) % (2**31 - 1)
    return Point(id=pid, index=index, repeat=repeat, params=params, seed=seed, config=cfg)


def points_of(path: str | Path) -> list[Point]:
    """Load a spec file and expand it."""
    return expand(load_spec(path))
