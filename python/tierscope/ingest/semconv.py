"""What OpenTelemetry's semantic conventions say about a CLIENT span, whatever format carries it.

OTLP carries a span's attributes; Zipkin and Jaeger exports of the same spans carry them as tags
(the SDKs' Zipkin exporters and Jaeger's OTLP receiver copy them). Both generations of the
conventions are read (`db.system` / `db.system.name`, `db.statement` / `db.query.text`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tierscope.ingest.sql_label import sql_fingerprint

#: Attributes that carry the operation a database CLIENT span sent (both generations of the
#: semantic conventions). A database span with none of them is connection or pool management.
DB_OPERATION_KEYS = (
    "db.statement",
    "db.query.text",
    "db.operation",
    "db.operation.name",
    "db.query.summary",
    "db.stored_procedure.name",
)


def not_the_callees_work(attrs: Mapping[str, Any], name: Any) -> bool:
    """A database CLIENT span named for a pool or a connection that sent no operation
    (`pg-pool.connect`, a pool checkout: the caller waiting for one of its own connections;
    `pg.connect`: opening one) is not a request the database served: it is not a row (it still
    links its children)."""
    if not (attrs.get("db.system") or attrs.get("db.system.name")):
        return False
    words = str(name or "").lower()
    return ("pool" in words or "connect" in words) and not any(attrs.get(k) for k in DB_OPERATION_KEYS)


#: Database systems whose statements are not SQL (a Redis command, a MongoDB query document): their
#: statement is left out of the label (it holds keys and values, one label per request).
NOT_SQL = frozenset(
    {"redis", "mongodb", "memcached", "elasticsearch", "opensearch", "dynamodb", "couchdb", "couchbase", "cosmosdb"}
)

#: Database systems with MySQL's quoting rules (backslash escapes, double-quoted strings).
MYSQL = frozenset({"mysql", "mariadb", "tidb"})


def client_label(attrs: Mapping[str, Any], name: Any) -> Any:
    """The label of a CLIENT span's request: the fingerprint of the SQL statement it sent
    (`db.statement` / `db.query.text`), as the tracer labels the same statement on the wire, else
    the span's name. Span names of database calls say little (``SELECT``, ``pg.query:SELECT
    postgres``): statements that differ a hundredfold in cost would share one label."""
    system = attrs.get("db.system.name") or attrs.get("db.system")
    statement = attrs.get("db.query.text") or attrs.get("db.statement")
    if system and str(system).lower() not in NOT_SQL and isinstance(statement, str) and statement.strip():
        return sql_fingerprint(statement, mysql=str(system).lower() in MYSQL)
    return name
