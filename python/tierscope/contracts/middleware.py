"""The clustering middleware's contract (`middleware.json` beside this module, issue 25 item 1): the
read policies and which take weights or always track labels, the write waits, the protocol per
DBMS, the password's environment variable, the recovery table, the command line's defaults and the
stats' keys. `tierscope-engine middleware` is held to the same file by `cargo test`
(engine/src/middleware/contract.rs); the spec's checks (`soft.middleware`) and the lab's service
(`tierscope.services.middleware`) read it from here; tests/test_middleware_contract.py checks a
real middleware's stats against it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_DOC: dict[str, Any] = json.loads(Path(__file__).with_name("middleware.json").read_text(encoding="utf-8"))

#: the read-balancing policies (`--policy`), in the order the docs list them
POLICIES: tuple[str, ...] = tuple(_DOC["policies"])
#: what each policy does, in a few words
POLICY_WORDS: dict[str, str] = dict(_DOC["policies"])
#: the policies that take `--weights` (one per backend)
WEIGHTED_POLICIES: frozenset[str] = frozenset(_DOC["weighted_policies"])
#: the policies that always keep per-label service times (others only with `--labels`)
LABELLED_POLICIES: frozenset[str] = frozenset(_DOC["labelled_policies"])
#: when a write is answered (`--wait`): after the first backend, or all
WAITS: tuple[str, ...] = tuple(_DOC["wait"])
#: the wire protocols it speaks (`--protocol`); which one a DBMS needs: `contracts.dbms`
PROTOCOLS: tuple[str, ...] = tuple(_DOC["protocols"])
#: how writes are ordered (`--scheduler`), and what each does
SCHEDULERS: dict[str, str] = dict(_DOC["schedulers"])
#: the environment variable that carries the backends' password to the middleware (not its argv)
PASSWORD_ENV: str = _DOC["password_env"]
#: the one-row table in which each backend keeps the last recovery-log unit it applied
RECOVERY_TABLE: str = _DOC["recovery_table"]
#: the command line's defaults, by option name (`--heavy-factor` is `heavy_factor`)
DEFAULTS: dict[str, Any] = dict(_DOC["defaults"])
#: the keys of the stats document (`--stats`): its top level, each backend's, `labels`, `series`,
#: `scheduler`
STATS_KEYS: dict[str, frozenset[str]] = {part: frozenset(keys) for part, keys in _DOC["stats"].items()}
