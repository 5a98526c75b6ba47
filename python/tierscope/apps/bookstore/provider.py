"""The bookstore as the runner sees it (`tierscope.apps.AppProvider`): data loaded once per (DBMS,
scale, seed) into a snapshot every database server starts from, the gunicorn app, the static pages
and images nginx serves, and the workload files of the browsing, shopping and ordering mixes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from tierscope import tables
from tierscope.apps.bookstore import datagen, static
from tierscope.apps.bookstore.datagen import customer_a, item_a, scale_named
from tierscope.apps.loaded import LoadedDatabaseApp
from tierscope.apps.snapshot import CACHE
from tierscope.services.appserver import AppServer

APP = "tierscope.apps.bookstore.app:create_app()"


def scale_name(scale: float | str) -> str:
    """A spec's scale as a bookstore scale: a name of `datagen.SCALES`, or a fraction of the 100 k-item
    data set rounded on a log scale (tiny = 1 k items = 0.01, small = 10 k = 0.1, large = 100 k = 1,
    paper = 1 M = 10)."""
    if isinstance(scale, str):
        return scale
    if scale < 0.0316:  # geometric midpoint of 0.01 and 0.1
        return "tiny"
    if scale < 0.316:
        return "small"
    if scale < 3.16:
        return "large"
    return "paper"


#: the draws of the shipped workload files (the tiny data set: 1,000 items, 28,800 customers)
TINY_DRAWS = {"customer": "[4095, 1, 28800]", "author": "[63, 0, 100]", "title": "[63, 0, 200]"}


def scaled_workload(text: str, items: int, customers: int) -> str:
    """A workload file's NURand draws for `items` items and `customers` customers: C_ID =
    NURand(A(customers), 1, customers), author strings DigSyl(NURand(A(items), 0, items/10)),
    title strings DigSyl(NURand(A(items), 0, items/5)) (TPC-W clauses 2.3.2, 2.10.5.1)."""
    new = {
        "customer": f"[{customer_a(customers)}, 1, {customers}]",
        "author": f"[{item_a(items)}, 0, {items // 10}]",
        "title": f"[{item_a(items)}, 0, {items // 5}]",
    }
    for kind, old in TINY_DRAWS.items():
        if old not in text:
            raise ValueError(f"workload file: no {kind} draw {old} to scale")
        text = text.replace(old, new[kind])
    return text


class BookstoreProvider(LoadedDatabaseApp):
    name = "tpcw"
    snapshots = "bookstore"
    database = "tpcw"

    def scale_name(self, scale: float | str) -> str:
        return scale_name(scale)

    def datagen(self) -> Any:
        return datagen

    def app_server(
        self, host: Any, port: int, workdir: Path, *, db: Any, soft: Any, events_dir: Path, name: str | None
    ) -> Any:
        db = self.client_config(db)  # a Galera cluster: every node, the pool spreads over them
        env = {
            "TPCW_DBMS": db.dbms,
            "TPCW_DB_HOST": db.host,
            "TPCW_DB_PORT": str(db.port),
            "TPCW_DB_USER": db.user,
            "TPCW_DB_PASSWORD": db.password,
            "TPCW_DB_NAME": db.database,
            "TPCW_POOL_SIZE": str(soft.db_pool),
        }
        return AppServer(
            host,
            port,
            workdir,
            app=APP,
            app_env=env,
            health_path="/tpcw/health",
            workers=soft.workers,
            threads=soft.threads,
            pool_size=soft.db_pool,
            events_dir=events_dir,
            name=name,
        )

    def static_root(self, directory: Path, config: Any = None) -> Path:
        """The static GIFs and one thumbnail and one image per item of the point's data set."""
        items = datagen.scale_named(scale_name(config.scale))[0] if config is not None else 100_000
        return static.write_static(directory, items=items)

    def workload_file(self, mix: str, config: Any = None) -> Path:
        """The mix's workload file, its customer and search-string draws scaled to the data set of
        `config` (the shipped files draw from the tiny set; see `scaled_workload`)."""
        path = Path(__file__).parent / "workloads" / f"{mix}.toml"
        if not path.exists():
            raise FileNotFoundError(f"no workload file for mix {mix!r} ({path})")
        scale = scale_name(config.scale) if config is not None else "tiny"
        if scale == "tiny":
            return path

        items, ebs = scale_named(scale)
        out = CACHE / "bookstore" / "workloads" / f"{mix}-{scale}.toml"
        out.parent.mkdir(parents=True, exist_ok=True)
        text = scaled_workload(path.read_text(), items, 2880 * ebs)
        if not out.exists() or out.read_text() != text:
            out.write_text(text)
        return out

    def events(self, events_dir: Path) -> pa.Table:
        return tables.empty("events")  # the bookstore records no GC or pause events of its own


PROVIDER = BookstoreProvider()
