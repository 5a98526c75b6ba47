"""RUBBoS as the runner sees it (`tierscope.apps.AppProvider`): data loaded once per (DBMS, scale,
seed) into a snapshot every database server starts from, the gunicorn app, the static pages, the
workload files of the mixes, and the app's GC and pause events."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa

from tierscope.services.databases import data_dbms, dbms_name


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


class RubbosProvider:
    name = "rubbos"

    def data_key(self, config: Any) -> tuple:
        return (data_dbms(dbms_name(config.dbms)), scale_name(config.scale), config.seed)

    def prepare_data(self, config: Any, work: Path, say: Callable[[str], None]) -> Path:
        from tierscope.apps import snapshot
        from tierscope.apps.rubbos import datagen, system
        from tierscope.services.base import free_port

        dbms, scale = data_dbms(dbms_name(config.dbms)), scale_name(config.scale)
        snap = snapshot.snapshot_for("rubbos", dbms, scale, config.seed, datagen.GENERATOR_VERSION)
        if not snap.fresh():
            say(f"loading RUBBoS data: {dbms}, scale {scale} (once; later runs reuse the snapshot)")
            opts = system.Options(dbms=dbms, scale=scale, seed=config.seed, db_port=free_port(),
                                  run_dir=work / "prepare")
            db, _cfg, report, _restored = system.start_loaded_db(opts, work / "prepare" / scale, say=say)
            db.stop()
            if report is not None:
                say(f"loaded {sum(report.rows.values()):,} rows in {report.seconds:.1f} s")
            shutil.rmtree(work / "prepare", ignore_errors=True)
        return snap.data

    def database_server(self, dbms: str, host: Any, port: int, workdir: Path, *, cache: str,
                        max_connections: int, name: str, fsync: bool = False) -> tuple[Any, Any]:
        from tierscope.services.databases import database_server

        return database_server(dbms, host, port, workdir, database="rubbos", fsync=fsync, cache=cache,
                               max_connections=max_connections, name=name)

    def restore(self, data_dir: Path, server: Any) -> None:
        from tierscope.apps import snapshot

        snapshot.copy_tree(data_dir, server.data_dir)

    def app_server(self, host: Any, port: int, workdir: Path, *, db: Any, soft: Any, events_dir: Path,
                   name: str) -> Any:
        from tierscope.services.appserver import AppServer
        from tierscope.services.databases import client_config

        return AppServer(host, port, workdir, db=client_config(db), workers=soft.workers, threads=soft.threads,
                         pool_size=soft.db_pool, events_dir=events_dir, name=name)

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
