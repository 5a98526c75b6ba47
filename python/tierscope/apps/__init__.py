"""Applications tierscope builds and serves as systems under test.

The runner knows no application: it asks the spec's `benchmark` for its `AppProvider` (`provider`;
the Protocol is tierscope.contracts.apps's), which says how to load the data once, put it into each
database server, run the app server, write the static pages nginx serves, which workload file
drives a mix, and where the app's own events (GC, injected pauses) are. RUBBoS is
`apps.rubbos.provider`, the TPC-W-like bookstore `apps.bookstore.provider`; a new system plugs in
by adding its provider to `PROVIDERS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from tierscope.contracts.apps import AppProvider

__all__ = ["PROVIDERS", "AppProvider", "WsgiApp", "provider"]


@dataclass(frozen=True)
class WsgiApp:
    """A WSGI application (`tierscope.contracts.apps.WsgiApp`) as the app server
    (`services.appserver.AppServer`) runs it against a database: its entry point
    ("module:factory()"), the path that answers 200 once it serves, the environment that configures
    it for one server (`env(server)`: from the server's `db`, name, events directory and pauses)
    and the reader of the events it records (`events(events_dir)`)."""

    entry: str
    health_path: str
    env: Callable[[Any], dict[str, str]]
    events: Callable[[Path], pa.Table]


def _rubbos() -> AppProvider:
    # late: the provider imports WsgiApp from this module (a cycle), and loads only when asked for
    from tierscope.apps.rubbos.provider import PROVIDER

    return PROVIDER


def _bookstore() -> AppProvider:
    # late: the provider imports WsgiApp from this module (a cycle), and loads only when asked for
    from tierscope.apps.bookstore.provider import PROVIDER

    return PROVIDER


#: benchmark name (a spec's `benchmark`) -> its provider, imported when asked for
PROVIDERS: dict[str, Callable[[], AppProvider]] = {"rubbos": _rubbos, "tpcw": _bookstore}


def provider(benchmark: str) -> AppProvider:
    """The provider of `benchmark`; ValueError naming the known ones otherwise."""
    try:
        return PROVIDERS[benchmark]()
    except KeyError:
        raise ValueError(f"benchmark {benchmark!r}: expected one of {', '.join(PROVIDERS)}") from None
