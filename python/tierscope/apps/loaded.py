"""What the apps on a database share as providers (`tierscope.apps.AppProvider`): their data is
loaded once per (DBMS, scale, seed) into a snapshot (`apps.snapshot`), every database server of a
point starts from a copy of it, and the app server reaches the database through
`services.databases` (a Galera cluster: every node)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tierscope.apps import snapshot
from tierscope.services.base import free_port
from tierscope.services.databases import client_config, data_dbms, database_server, dbms_name
from tierscope.testbed.host import Host


class LoadedDatabaseApp:
    """An app provider whose data set is one database. Subclasses say which (`snapshots`: the
    snapshot family, `database`: the database's name), how a spec's scale names a data set
    (`scale_name`) and give the data generator (`datagen()`: a module with GENERATOR_VERSION and
    `load(db_config, scale, seed, progress)` returning a report with `rows`, `total_rows`,
    `seconds` and `db_size_bytes`)."""

    name: str
    snapshots: str
    database: str

    def scale_name(self, scale: float | str) -> str:
        raise NotImplementedError

    def datagen(self) -> Any:
        raise NotImplementedError

    def data_key(self, config: Any) -> tuple:
        return (data_dbms(dbms_name(config.dbms)), self.scale_name(config.scale), config.seed)

    def prepare_data(self, config: Any, work: Path, say: Callable[[str], None]) -> Path:
        """The snapshot's data directory, loading it first when there is none (or an outdated one)."""
        datagen = self.datagen()
        dbms, scale = data_dbms(dbms_name(config.dbms)), self.scale_name(config.scale)
        snap = snapshot.snapshot_for(self.snapshots, dbms, scale, config.seed, datagen.GENERATOR_VERSION)
        if snap.fresh():
            return snap.data
        say(f"loading {self.snapshots} data: {dbms}, scale {scale} (once; later runs reuse the snapshot)")
        workdir = work / f"prepare-{self.snapshots}"
        db, cfg = self.database_server(
            dbms, Host.loopback("db"), free_port(), workdir / scale, cache="256M", max_connections=50, name="load"
        )
        db.start()
        try:
            report = datagen.load(cfg, scale, config.seed, progress=say)
            say(f"loaded {report.total_rows:,} rows in {report.seconds:.1f} s")
            snapshot.take(
                db,
                snap,
                {
                    "dbms": dbms,
                    "scale": scale,
                    "seed": config.seed,
                    "loaded_at": time.time(),
                    "generator": datagen.GENERATOR_VERSION,
                    "rows": report.rows,
                    "db_size_bytes": report.db_size_bytes,
                },
            )
        finally:
            db.stop()
            shutil.rmtree(workdir, ignore_errors=True)
        return snap.data

    def database_server(
        self,
        dbms: str,
        host: Any,
        port: int,
        workdir: Path,
        *,
        cache: str,
        max_connections: int,
        name: str | None,
        fsync: bool = False,
    ) -> tuple[Any, Any]:
        return database_server(
            dbms,
            host,
            port,
            workdir,
            database=self.database,
            fsync=fsync,
            cache=cache,
            max_connections=max_connections,
            name=name,
        )

    def restore(self, data_dir: Path, server: Any) -> None:
        snapshot.copy_tree(data_dir, server.data_dir)

    def client_config(self, db: Any) -> Any:
        """What the app server connects to for database `db` (a Galera cluster: every node)."""
        return client_config(db)
