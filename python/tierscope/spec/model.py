"""The spec's model: the topology, node types, soft resources, workload, monitoring, interference,
sweep and client tables, the resolved configuration of one point (`PointConfig`) and the spec."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from tierscope.contracts import DEFAULT_WINDOW_NS, MAX_WINDOW_NS, MIN_WINDOW_NS
from tierscope.contracts.middleware import DEFAULTS as MIDDLEWARE_DEFAULTS
from tierscope.contracts.middleware import POLICIES, SCHEDULERS, WAITS, WEIGHTED_POLICIES
from tierscope.tiers import SERVER_PREFIX, TIERS

from .notation import DBMS, DBMS_LETTER, RESERVED_LETTERS, parse_notation
from .units import SCALE_PRESETS, Duration, Size, parse_scale, parse_size, parse_users

MIXES = {"rubbos": ("browse_only", "read_write", "read_write_paged"), "tpcw": ("browsing", "shopping", "ordering")}
#: how messages name a benchmark
BENCHMARK_NAMES = {"rubbos": "RUBBoS", "tpcw": "the bookstore"}

BUILTIN_NODE_TYPES: dict[str, dict[str, Any]] = {
    "S": {"cpu": 1.0, "memory": "2GiB", "description": "standard (normal) node: one core, 2 GiB"},
    "L": {
        "cpu": 0.25,
        "memory": "512MiB",
        "description": "low-cost node: a quarter of a core, 512 MiB",
    },
}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


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
    def _per_server_types(self) -> TierSpec:
        if isinstance(self.node_type, list) and len(self.node_type) != self.count:
            raise ValueError(
                f"node_type lists one type per server: expected {self.count} entries, got {len(self.node_type)}"
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
    # a disk of one arm: a read that misses the page cache holds it this long, one read at a time
    # (testbed.serialdisk); the read rate is then also limited to 1000 / disk_read_ms per second
    disk_read_ms: float | None = Field(default=None, gt=0, le=10_000)
    disk_device: str | None = None  # "/dev/vda" or "254:0"; default: the disk of the work dir

    def read_iops_limit(self) -> int | None:
        """The disk's read operations per second: `disk_read_iops`, else what one arm taking
        `disk_read_ms` per read can do (the monitor's `disk_util` is the rate against it)."""
        if self.disk_read_iops is not None or self.disk_read_ms is None:
            return self.disk_read_iops
        return max(1, round(1000 / self.disk_read_ms))

    @field_validator("cpus")
    @classmethod
    def _cpuset(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", v.replace(" ", "")):
            raise ValueError(f'expected a CPU list such as "1", "0-1" or "0,2", got {v!r}')
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


def _one_of(choices: tuple[str, ...]) -> str:
    """pydantic's words for a choice: "'a', 'b' or 'c'"."""
    quoted = [repr(c) for c in choices]
    return ", ".join(quoted[:-1]) + " or " + quoted[-1] if len(quoted) > 1 else quoted[0]


class MiddlewareSoft(_Model):
    # the choices and defaults are the middleware's contract's (tierscope.contracts.middleware)
    pool: int = Field(default=MIDDLEWARE_DEFAULTS["pool"], ge=1, le=4096)  # connections to each database server
    policy: str = MIDDLEWARE_DEFAULTS["policy"]  # read balancing (docs/middleware.md): one of POLICIES
    weights: list[Annotated[float, Field(ge=0)]] | None = None  # wrr: one per database server
    wait: str = MIDDLEWARE_DEFAULTS["wait"]  # a write is answered after the first / all backends
    # the middleware is `tierscope-engine middleware` (Rust; PostgreSQL and MariaDB): "rust", the only
    # value, is still accepted; "python" is refused with a message saying that middleware was removed
    implementation: Literal["rust"] = "rust"
    # keep per-statement service times and heavy reads per backend under any policy (`--labels`;
    # `aware` always does): the 50 ms series then shows where the heavy reads went
    labels: bool = False
    # how writes keep one order on every database server (`--scheduler`, docs/middleware.md): "lock",
    # one write lock, or "rows", write transactions side by side where their rows differ
    # (PostgreSQL only)
    scheduler: str = MIDDLEWARE_DEFAULTS["scheduler"]

    @field_validator("policy", "wait", "scheduler")
    @classmethod
    def _one_of_the_contracts(cls, v: str, info: ValidationInfo) -> str:
        choices = {"policy": POLICIES, "wait": WAITS, "scheduler": tuple(SCHEDULERS)}[info.field_name or ""]
        if v not in choices:
            raise ValueError(f"Input should be {_one_of(choices)}")
        return v

    @field_validator("implementation", mode="before")
    @classmethod
    def _only_rust(cls, v: Any) -> Any:
        if v == "python":
            raise ValueError(
                "the Python middleware (`python -m tierscope.middleware`) was removed (issue 25): the "
                'middleware is `tierscope-engine middleware`; drop this key or set it to "rust"'
            )
        if v != "rust":
            raise ValueError(f'expected "rust" (the only middleware, `tierscope-engine middleware`), got {v!r}')
        return v


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

    users: Annotated[list[Annotated[int, Field(ge=1, le=1_000_000)]], BeforeValidator(parse_users)]
    think_time: Duration = 7.0  # mean, negative exponential (RUBBoS/TPC-W)
    dispersion: float = Field(default=1.0, ge=1.0, le=100_000)  # index of dispersion I; 1 = not bursty
    # mean of a user session's minimum duration (TPC-W's 15 min, cut at 4x); shorter: users
    # change sessions (and customers) within a run; None = the workload file's
    session_min: Duration | None = None
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
        if not MIN_WINDOW_NS / 1e9 - 1e-12 <= v <= MAX_WINDOW_NS / 1e9:
            raise ValueError(
                f"expected an analysis window between {MIN_WINDOW_NS / 1e6:g}ms and {MAX_WINDOW_NS / 1e9:g}s, got {v:g}s"
            )
        return v


class _Target(_Model):
    tier: str | None = None
    server: str | None = None

    @model_validator(mode="after")
    def _one_target(self) -> Self:
        if (self.tier is None) == (self.server is None):
            raise ValueError('expected exactly one of tier (e.g. "app") or server (e.g. "app1")')
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
    def _fits(self) -> Self:
        if self.duration <= 0 or self.duration >= self.period:
            raise ValueError(
                f"expected 0 < duration < period, got duration {self.duration:g}s and period {self.period:g}s"
            )
        return self


class NoisyNeighbour(_Target):
    """A bursty CPU burner in the target host's cgroup: 2-state MMPP of CPU work (seed 001 §5)."""

    utilization: float = Field(gt=0, le=64)  # mean CPU demand, cores
    burstiness: float = Field(default=1.0, ge=1.0, le=100_000)  # index of dispersion I
    job: Duration = 0.001  # CPU time of one unit of work (seconds)
    peak: float = Field(default=1.0, gt=0, le=64)  # demand while ON, cores (the burner is one thread)
    regular: bool = False  # ON and OFF last exactly their means: the same mean over any run (seed 001 §5)
    # the burner's nice value: below 0 it outweighs the host's own threads in the CPU scheduler, as a
    # collocated VM gets its share of a shared core however many threads the other runs (needs root)
    nice: int = Field(default=0, ge=-20, le=19)

    @model_validator(mode="after")
    def _peak(self) -> Self:
        if self.utilization > self.peak:
            raise ValueError(f"expected utilization <= peak ({self.peak:g} cores), got {self.utilization:g}")
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

    Several database servers are replicas behind a clustering middleware (PostgreSQL or MariaDB: it
    speaks either protocol), or the nodes of a Galera cluster, which replicates by itself and takes
    no middleware."""
    if n_middleware and dbms == "galera":
        return (
            f"the topology has {n_middleware} clustering middleware server(s) with galera: a Galera cluster "
            "replicates by itself (the app servers use its nodes directly), set #C = 0, e.g. 1/1/0/3G"
        )
    if n_db > 1 and not n_middleware and dbms != "galera":
        return (
            f"the topology has {n_db} database servers and no clustering middleware: several database "
            "servers are replicas behind a middleware (e.g. 1/2/1/2), set #C >= 1, or the nodes of a "
            "Galera cluster (DBMS letter G, e.g. 1/1/0/3G)"
        )
    return None


class PointConfig(_Model):
    """A fully resolved configuration: what one sweep point builds, drives, watches and injects."""

    name: str
    description: str = ""
    seed: int = Field(default=1, ge=0)
    benchmark: Literal["rubbos", "tpcw"] = "rubbos"
    mix: str | None = None  # the benchmark's first mix when not given
    scale: Annotated[float | str, BeforeValidator(parse_scale)] = 0.01  # fraction of the paper's, or a preset
    dbms: Literal["postgres", "mariadb", "galera"] = "postgres"
    default_node_type: str = "S"
    topology: Annotated[Topology, BeforeValidator(_topology_input)] = Field(default_factory=Topology)
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
    def _consistent(self) -> PointConfig:
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
            raise ValueError(
                f"soft.middleware.weights: expected one weight per database server "
                f"({self.topology.db.count}), one of them > 0, got {mw.weights}"
            )
        if mw.weights is not None and mw.policy not in WEIGHTED_POLICIES:
            weighted = " or ".join(f'"{p}"' for p in sorted(WEIGHTED_POLICIES))
            raise ValueError(f"soft.middleware.weights: only with policy = {weighted} (policy is {mw.policy!r})")
        if mw.scheduler == "rows" and self.topology.db.dbms != "postgres":
            raise ValueError(
                f'soft.middleware.scheduler: "rows" needs PostgreSQL database servers (the DBMS is '
                f'{self.topology.db.dbms}; the MySQL side keeps the one write lock: scheduler = "lock")'
            )
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
                    raise ValueError(f"interference.{kind}[{i}].tier: the {item.tier} tier has no servers")
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
