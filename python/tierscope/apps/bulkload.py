"""Loading generated data into a database server, shared by the apps' data generators (RUBBoS,
the bookstore): an app's schema file split into its table and index statements, its database
created when missing, the bulk-load connection to MariaDB, the work after the rows (indexes,
statistics, the database's size) and the report of a load. Each app keeps its own generator, the
order of its tables and its own rules (sequences, counted rows).

Tab-separated table files go into MariaDB by LOAD DATA LOCAL INFILE, or by multi-row INSERTs when
the server or the client refuses LOCAL INFILE (the first refusal switches the rest of the load
over); into PostgreSQL by COPY (the apps write their rows into it themselves)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tierscope.contracts.dbms import DbConfig

LOCAL_INFILE, MULTI_ROW_INSERT = "LOAD DATA LOCAL INFILE", "multi-row INSERT"


def load_tsv_mariadb(cur, table: str, cols: Sequence[str], path: Path, method: str, say: Callable[[str], None]) -> str:
    """Load `path` into `table` by `method`; returns the method the next table should use."""
    import pymysql

    try:
        if method != LOCAL_INFILE:
            raise pymysql.err.OperationalError(0, "LOCAL INFILE already refused")
        cur.execute(
            f"LOAD DATA LOCAL INFILE %s INTO TABLE {table} CHARACTER SET utf8mb4 "
            f"FIELDS TERMINATED BY '\\t' LINES TERMINATED BY '\\n' ({', '.join(cols)})",
            (str(path),),
        )
    except pymysql.err.OperationalError as err:
        if method == LOCAL_INFILE:
            say(f"LOAD DATA LOCAL INFILE refused ({err}); using multi-row INSERT")
        method = MULTI_ROW_INSERT
        insert_batches(cur, table, cols, path)
    return method


def insert_batches(cur, table: str, cols: Sequence[str], path: Path, batch: int = 500) -> None:
    """INSERT the rows of a tab-separated file, `batch` rows per statement."""
    placeholders = "(" + ", ".join(["%s"] * len(cols)) + ")"
    sql = f"INSERT INTO {table} ({', '.join(cols)}) VALUES "
    buf: list[list[str]] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            buf.append(line.rstrip("\n").split("\t"))
            if len(buf) >= batch:
                cur.execute(sql + ", ".join([placeholders] * len(buf)), [v for r in buf for v in r])
                buf = []
    if buf:
        cur.execute(sql + ", ".join([placeholders] * len(buf)), [v for r in buf for v in r])


# --- the schema -------------------------------------------------------------------------------


def schema_parts(directory: Path, dbms: str) -> tuple[list[str], list[str]]:
    """(table statements, index statements) of the schema file for `dbms` in an app's `directory`
    (schema_postgres.sql or schema_mariadb.sql, the indexes after a line `-- @indexes`)."""
    path = directory / ("schema_postgres.sql" if dbms == "postgresql" else "schema_mariadb.sql")
    head, _, tail = path.read_text().partition("\n-- @indexes\n")
    return split_sql(head), split_sql(tail)


def split_sql(text: str) -> list[str]:
    """Statements of a script: comment lines dropped, split at `;` ending a line."""
    out, cur = [], []
    for ln in text.splitlines():
        if ln.strip().startswith("--"):
            continue
        cur.append(ln)
        if ln.rstrip().endswith(";"):
            stmt = "\n".join(cur).strip().rstrip(";").strip()
            if stmt:
                out.append(stmt)
            cur = []
    rest = "\n".join(cur).strip()
    if rest:
        out.append(rest)
    return out


# --- the database -----------------------------------------------------------------------------


def pg_conninfo(cfg: DbConfig) -> str:
    """The libpq connection string of `cfg` (a PostgreSQL database)."""
    import psycopg

    return psycopg.conninfo.make_conninfo(
        host=cfg.host, port=cfg.port, user=cfg.user, dbname=cfg.database, password=cfg.password or None
    )


def ensure_database(cfg: DbConfig) -> None:
    """Create the database when it does not exist."""
    if cfg.dbms == "postgresql":
        import psycopg
        from psycopg import sql as q

        with psycopg.connect(pg_conninfo(replace(cfg, database="postgres")), autocommit=True) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (cfg.database,)).fetchone():
                conn.execute(q.SQL("CREATE DATABASE {}").format(q.Identifier(cfg.database)))
    else:
        import pymysql

        if not cfg.database.replace("_", "").isalnum():
            raise ValueError(f"database name {cfg.database!r}: letters, digits and _ only")
        conn = pymysql.connect(host=cfg.host, port=cfg.port, user=cfg.user, password=cfg.password, autocommit=True)
        try:
            with conn.cursor() as cur:
                cur.execute(f"CREATE DATABASE IF NOT EXISTS `{cfg.database}` CHARACTER SET utf8mb4")
        finally:
            conn.close()


def postgres_size(conn: Any) -> int:
    """The size in bytes of the database a psycopg connection is on."""
    return int(conn.execute("SELECT pg_database_size(current_database())").fetchone()[0])


def connect_mariadb(cfg: DbConfig) -> Any:
    """A PyMySQL connection to `cfg`'s database for a bulk load (autocommit, LOCAL INFILE allowed)."""
    import pymysql

    return pymysql.connect(
        host=cfg.host,
        port=cfg.port,
        user=cfg.user,
        password=cfg.password,
        database=cfg.database,
        autocommit=True,
        local_infile=True,
        charset="utf8mb4",
    )


def begin_mariadb(cur: Any, tables_sql: Iterable[str]) -> None:
    """Create the tables, then turn the unique and foreign key checks off for the rows."""
    for stmt in tables_sql:
        cur.execute(stmt)
    cur.execute("SET unique_checks = 0, foreign_key_checks = 0")


def finish_mariadb(cur: Any, index_sql: Iterable[str], tables: Iterable[str], say: Callable[[str], None]) -> int:
    """After the rows: the checks back on, the indexes built, every table analysed; the size in
    bytes of the database (data and indexes)."""
    cur.execute("SET unique_checks = 1, foreign_key_checks = 1")
    for stmt in index_sql:
        cur.execute(stmt)
    say("indexes built")
    for table in tables:
        cur.execute(f"ANALYZE TABLE {table}")
        cur.fetchall()
    cur.execute(
        "SELECT COALESCE(SUM(data_length + index_length), 0) FROM information_schema.tables "
        "WHERE table_schema = DATABASE()"
    )
    return int(cur.fetchone()[0])


# --- the report -------------------------------------------------------------------------------


@dataclass
class LoadReport:
    """What a load did: rows per table, seconds, bytes of text loaded, the database's size and the
    method (COPY, LOAD DATA LOCAL INFILE or multi-row INSERT). Each app adds its scale."""

    dbms: str
    rows: dict[str, int]
    seconds: float
    bytes_loaded: int
    db_size_bytes: int
    method: str

    @property
    def total_rows(self) -> int:
        return sum(self.rows.values())

    @property
    def rows_per_s(self) -> float:
        return self.total_rows / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes_loaded / 1e6 / self.seconds if self.seconds > 0 else 0.0

    def table_lines(self, width: int) -> list[str]:
        """A line per table, its name `width` wide."""
        return [f"{t:{width}s} {n:>10d} rows" for t, n in self.rows.items()]
