"""The log service's tables and its clients' tokens.

`clients(id, token)`: who may post (a token per client, checked on every request or through the
authentication cache); `logs(id, client_id, level, message, received_ns)`: one row per stored
record, `id` the record's unique id chosen by the client (so a record stored twice, e.g. redelivered
by the durable queue after a crash, is one row, and loss is counted by id).
"""

from __future__ import annotations

import hashlib

from tierscope.apps.dal import Database

TABLES = {
    "postgresql": [
        "CREATE TABLE IF NOT EXISTS clients (id integer PRIMARY KEY, token varchar(64) NOT NULL UNIQUE)",
        "CREATE TABLE IF NOT EXISTS logs (id varchar(64) PRIMARY KEY, client_id integer NOT NULL, "
        "level smallint NOT NULL, message text NOT NULL, received_ns bigint NOT NULL)",
        "CREATE INDEX IF NOT EXISTS logs_client ON logs (client_id)",
    ],
    "mariadb": [
        "CREATE TABLE IF NOT EXISTS clients (id int PRIMARY KEY, token varchar(64) NOT NULL UNIQUE) ENGINE=InnoDB",
        "CREATE TABLE IF NOT EXISTS logs (id varchar(64) PRIMARY KEY, client_id int NOT NULL, "
        "level smallint NOT NULL, message text NOT NULL, received_ns bigint NOT NULL, KEY logs_client (client_id)) "
        "ENGINE=InnoDB",
    ],
}


def token(client: int, secret: str = "tierscope") -> str:
    """The token of client `client` (deterministic, so the driver and the database agree)."""
    return hashlib.sha256(f"{secret}:{client}".encode()).hexdigest()[:32]


def create(db: Database, clients: int) -> None:
    """Create the tables (idempotent), empty `logs`, and register clients 1..`clients`."""
    with db.session() as s:
        for sql in TABLES[db.dbms]:
            s.execute(sql)
        s.execute("DELETE FROM logs")
        s.execute("DELETE FROM clients")
        for start in range(1, clients + 1, 1000):
            ids = range(start, min(clients, start + 999) + 1)
            s.execute(
                "INSERT INTO clients (id, token) VALUES " + ",".join(["(%s, %s)"] * len(ids)),
                tuple(x for i in ids for x in (i, token(i))),
            )


def stored_ids(db: Database) -> set[str]:
    """The ids of every stored record."""
    with db.session() as s:
        return {r["id"] for r in s.query("SELECT id FROM logs")}


def stored_count(db: Database) -> int:
    with db.session() as s:
        return int(s.one("SELECT count(*) AS n FROM logs")["n"])
