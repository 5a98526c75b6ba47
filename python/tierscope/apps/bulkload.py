"""Bulk loading of tab-separated table files into MariaDB, shared by the apps' data generators
(RUBBoS, the bookstore): LOAD DATA LOCAL INFILE, or multi-row INSERTs when the server or the
client refuses LOCAL INFILE (the first refusal switches the rest of the load over)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

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
