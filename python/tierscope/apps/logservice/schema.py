"""The log service's tables and its clients' tokens.

`clients(id, token_sha256)`: who may post; the table keeps the SHA-256 of each client's token, not
the token (a token is random per run, `secrets.token_urlsafe`, handed to the driver in a 0600
file). `logs(client_id, id, level, message, received_ns)`: one row per stored record, keyed by
(client, id): `id` is chosen by the client, so a record stored twice (e.g. redelivered by the
durable queue after a crash) is one row, a client cannot reach another client's records by
choosing its ids, and loss is counted by (client, id).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from pathlib import Path

from tierscope.apps.dal import Database
from tierscope.services.redis import write_secret

TABLES = {
    "postgresql": [
        "DROP TABLE IF EXISTS logs",
        "DROP TABLE IF EXISTS clients",
        "CREATE TABLE clients (id integer PRIMARY KEY, token_sha256 char(64) NOT NULL UNIQUE)",
        "CREATE TABLE logs (client_id integer NOT NULL, id varchar(64) NOT NULL, level smallint NOT NULL, "
        "message text NOT NULL, received_ns bigint NOT NULL, PRIMARY KEY (client_id, id))",
    ],
    "mariadb": [
        "DROP TABLE IF EXISTS logs",
        "DROP TABLE IF EXISTS clients",
        "CREATE TABLE clients (id int PRIMARY KEY, token_sha256 char(64) NOT NULL UNIQUE) ENGINE=InnoDB",
        "CREATE TABLE logs (client_id int NOT NULL, id varchar(64) NOT NULL, level smallint NOT NULL, "
        "message text NOT NULL, received_ns bigint NOT NULL, PRIMARY KEY (client_id, id)) "
        "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
    ],
}


def token_sha256(token: str) -> str:
    """What the clients table keeps of a token."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def new_tokens(clients: int) -> dict[int, str]:
    """A random token for each client 1..`clients` (not derivable from anything)."""
    return {i: secrets.token_urlsafe(24) for i in range(1, clients + 1)}


def create(db: Database, clients: int) -> dict[int, str]:
    """Create the tables afresh, register clients 1..`clients` with new random tokens and return
    the tokens ({client: token})."""
    tokens = new_tokens(clients)
    with db.session() as s:
        for sql in TABLES[db.dbms]:
            s.execute(sql)
        for start in range(1, clients + 1, 1000):
            ids = range(start, min(clients, start + 999) + 1)
            s.execute(
                "INSERT INTO clients (id, token_sha256) VALUES " + ",".join(["(%s, %s)"] * len(ids)),
                tuple(x for i in ids for x in (i, token_sha256(tokens[i]))),
            )
    return tokens


def write_tokens(path: Path, tokens: dict[int, str]) -> Path:
    """Keep `tokens` in `path`, readable by its owner only (the driver reads it with `read_tokens`)."""
    write_secret(Path(path), json.dumps({str(k): v for k, v in tokens.items()}))
    return Path(path)


def read_tokens(path: Path) -> dict[int, str]:
    return {int(k): v for k, v in json.loads(Path(path).read_text()).items()}


def stored_keys(db: Database) -> set[tuple[int, str]]:
    """The (client, id) of every stored record."""
    with db.session() as s:
        return {(int(r["client_id"]), r["id"]) for r in s.query("SELECT client_id, id FROM logs")}


def stored_count(db: Database) -> int:
    with db.session() as s:
        return int(s.one("SELECT count(*) AS n FROM logs")["n"])  # type: ignore[index]  # an aggregate: one row
