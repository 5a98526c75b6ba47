"""RUBBoS as the runner sees it (`tierscope.apps.AppProvider`): data loaded once per (DBMS, scale,
seed) into a snapshot every database server starts from, the gunicorn app, the static pages, the
workload files of the mixes, and the app's GC and pause events."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from tierscope.apps.loaded import LoadedDatabaseApp


def scale_name(scale: float | str) -> str:
    """The RUBBoS data preset for a spec's `scale`: a preset name, or a fraction of the paper's data
    set rounded to the nearest preset on a log scale (tiny = 0.002, small = 0.2, paper = 1 by users;
    the boundaries are the geometric midpoints 0.02 and 0.45)."""
    if isinstance(scale, str):
        return scale
    if scale < 0.02:
        return "tiny"
    if scale < 0.45:
        return "small"
    return "paper"


class RubbosProvider(LoadedDatabaseApp):
    name = "rubbos"
    snapshots = "rubbos"
    database = "rubbos"

    def scale_name(self, scale: float | str) -> str:
        return scale_name(scale)

    def datagen(self) -> Any:
        from tierscope.apps.rubbos import datagen

        return datagen

    def app_server(
        self, host: Any, port: int, workdir: Path, *, db: Any, soft: Any, events_dir: Path, name: str
    ) -> Any:
        from tierscope.services.appserver import AppServer

        return AppServer(
            host,
            port,
            workdir,
            db=self.client_config(db),
            workers=soft.workers,
            threads=soft.threads,
            pool_size=soft.db_pool,
            events_dir=events_dir,
            name=name,
        )

    def static_root(self, directory: Path, config: Any = None) -> Path:
        from tierscope.apps.rubbos import pages

        return pages.write_static(directory)

    def workload_file(self, mix: str, config: Any = None) -> Path:
        from tierscope.apps.rubbos import mixes

        path = Path(mixes.__file__).parent / "workloads" / f"{mix}.toml"
        if not path.exists():
            raise FileNotFoundError(f"no workload file for mix {mix!r} ({path})")
        return path

    def events(self, events_dir: Path) -> pa.Table:
        from tierscope.apps.rubbos import events

        return events.collect(events_dir)


PROVIDER = RubbosProvider()
