"""The experiment spec: one TOML file that says which system to build, how to drive and watch it,
what to inject, and which configurations to sweep (docs/spec.md is the reference).

`load_spec(path)` reads and validates a spec (every sweep point is checked, so a bad value fails
at load time with the file, the key path and what was expected); `expand(spec)` turns it into the
list of `Point`s the runner executes, each a fully resolved configuration with a stable id.

The topology notation of the papers is `#W/#A/#C/#D` (web / app / clustering middleware / database
server counts), each count optionally followed by a node-type letter, the database field also by a
DBMS letter (M = MariaDB, P = PostgreSQL, G = a Galera cluster of MariaDB nodes): `1/2/0/1L`,
`1L/2S/0/1S-P`, `1/1/1/2ML`, `1/1/0/3G`.

The package, one idea per module: `units` (durations, sizes, levels, scales), `notation` (the
topology notation), `model` (the tables of a spec and the resolved configuration of a point),
`paths` (dotted key paths), `filters` (the sweep filters' expression language), `expand` (the
sweep as points), `load` (reading and validating), `errors` (the one error type and its messages).
"""

from tierscope.tiers import SERVER_PREFIX, TIERS

from .errors import SpecError
from .expand import expand
from .load import load_spec, parse_spec, points_of, spec_from_dict
from .model import (
    BENCHMARK_NAMES,
    BUILTIN_NODE_TYPES,
    MIXES,
    AppSoft,
    Client,
    DbSoft,
    Interference,
    MiddlewareSoft,
    Monitor,
    NodeType,
    NoisyNeighbour,
    Pause,
    Point,
    PointConfig,
    Server,
    Soft,
    Spec,
    Sweep,
    TierSpec,
    Topology,
    WebSoft,
    Workload,
    db_topology_problem,
)
from .notation import DBMS, DBMS_LETTER, RESERVED_LETTERS, parse_notation
from .units import SCALE_PRESETS, Duration, Size, parse_duration, parse_size

__all__ = [
    "AppSoft",
    "BENCHMARK_NAMES",
    "BUILTIN_NODE_TYPES",
    "Client",
    "DBMS",
    "DBMS_LETTER",
    "DbSoft",
    "Duration",
    "Interference",
    "MIXES",
    "MiddlewareSoft",
    "Monitor",
    "NodeType",
    "NoisyNeighbour",
    "Pause",
    "Point",
    "PointConfig",
    "RESERVED_LETTERS",
    "SCALE_PRESETS",
    "SERVER_PREFIX",
    "Server",
    "Size",
    "Soft",
    "Spec",
    "SpecError",
    "Sweep",
    "TIERS",
    "TierSpec",
    "Topology",
    "WebSoft",
    "Workload",
    "db_topology_problem",
    "expand",
    "load_spec",
    "parse_duration",
    "parse_notation",
    "parse_size",
    "parse_spec",
    "points_of",
    "spec_from_dict",
]
