"""The tiers of an N-tier system: their names, their order front to back, and how a server's or a
host's name maps to its tier. Every module that needs a tier's rank or the tier of a name asks
here (the spec, the linker, the bottleneck map, the summary)."""

from __future__ import annotations

import re

#: the tiers of a topology, front to back (the `#W/#A/#C/#D` notation's order)
TIERS = ("web", "app", "middleware", "db")

#: the prefix of a tier's server names (web1, app2, mw1, db3)
SERVER_PREFIX = {"web": "web", "app": "app", "middleware": "mw", "db": "db"}

#: position in the chain of calls, upstream first (the emulated users' client is 0)
RANK = {"client": 0, "web": 1, "app": 2, "middleware": 3, "db": 4}

_HOST_PREFIX = (("mw", "middleware"), ("middleware", "middleware"), ("web", "web"), ("app", "app"), ("db", "db"))


def rank(tier: str | None, protocol: str | None = None) -> int:
    """A tier's position in the chain, upstream first; another tier name counts as app when it
    speaks HTTP and as db when it speaks a database protocol (postgres, mysql)."""
    if tier in RANK:
        return RANK[tier]
    return RANK["db"] if protocol in ("postgres", "mysql") else RANK["app"]


def tier_of_host(host: str) -> str:
    """The tier a host or server name belongs to by its prefix (web1 -> web, mw1 -> middleware,
    db2 -> db); else the name without its trailing number."""
    name = host.lower()
    for prefix, tier in _HOST_PREFIX:
        if re.match(rf"^{prefix}\d*($|[-_@.])", name) or name == prefix:
            return tier
    return re.sub(r"\d+$", "", name) or name
