"""One data-access module for the apps (RUBBoS, the log service) over PostgreSQL (psycopg 3 +
psycopg_pool) and MariaDB (PyMySQL with a bounded pool), chosen by configuration.

Every statement is parameterised (`%s` placeholders in both drivers) and gets the request id
appended as a trailing sqlcommenter comment, `/*request_id='<url-encoded id>'*/`, so a passive
tracer can link each query to the page that caused it.

A request takes one connection for its whole duration (like a servlet taking one JDBC connection
from its pool): `with db.session(request_id) as s: s.query(...)`. The pool per process is bounded
(`pool_size`); waiting longer than `pool_timeout_s` for a connection raises `PoolTimeout`.
All statements run in autocommit mode, as in the original (no explicit transactions).

For MariaDB, `host` may list several servers, "addr[:port],addr[:port],..." (a port omitted is
`port`), like MariaDB Connector/J's load-balanced URL: the nodes of a multi-master cluster
(Galera). The pool then gives each session a connection to the next node round robin, reusing an
idle one to that node or opening one, and fails over to the other nodes when a node refuses; it
never holds more than `pool_size` connections open in all.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any
from urllib.parse import quote

from tierscope.contracts import poolgauge
from tierscope.contracts.dbms import DbConfig


class DatabaseError(RuntimeError):
    """A statement failed (wraps the driver's error)."""

    #: the connection is unusable after it (the pool discards it)
    broken: bool = False


class PoolTimeout(DatabaseError):
    """No connection became free within the pool timeout."""


class DuplicateKey(DatabaseError):
    """An INSERT violated a unique constraint."""


def hosts_of(host: str, port: int) -> list[tuple[str, int]]:
    """The (address, port) pairs of a host list "addr[:port],addr[:port]" (`port` when omitted)."""
    out = []
    for part in host.split(","):
        part = part.strip()
        if not part:
            continue
        addr, sep, p = part.rpartition(":")
        if sep and addr and p.isdigit() and (part.count(":") == 1 or addr.endswith("]")):
            out.append((addr.strip("[]"), int(p)))
        else:
            out.append((part, port))
    if not out:
        raise ValueError(f"host: expected an address or a list addr[:port],..., got {host!r}")
    return out


def sqlcomment(request_id: str | None) -> str:
    """The trailing sqlcommenter comment for a request id ('' when None).

    The id is URL-encoded (so it can never close the comment) and `%` is doubled because both
    drivers treat the statement as a `%s` format string.
    """
    if not request_id:
        return ""
    return " /*request_id='" + quote(request_id, safe="").replace("%", "%%") + "'*/"


def like_prefix(word: str) -> str:
    """A LIKE pattern matching values that start with `word` (wildcards in `word` escaped)."""
    return word.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def like_prefix10(word: str) -> str:
    """The pattern for left(col, 10) that matches exactly when col LIKE like_prefix(word)."""
    head = word[:10]
    esc = head.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return esc if len(word) >= 10 else esc + "%"


class Session:
    """One request's use of one pooled connection."""

    def __init__(self, db: Database, conn: Any, request_id: str | None):
        self.db = db
        self.conn = conn
        self.comment = sqlcomment(request_id)
        self.statements = 0

    def _run(self, sql: str, params: tuple):
        self.statements += 1
        return self.db._execute(self.conn, sql + self.comment, tuple(params))

    def query(self, sql: str, params: tuple = ()) -> list[dict]:
        """Rows of a SELECT as dicts."""
        cur = self._run(sql, params)
        try:
            return list(cur.fetchall())
        finally:
            cur.close()

    def one(self, sql: str, params: tuple = ()) -> dict | None:
        rows = self.query(sql, params)
        return rows[0] if rows else None

    def execute(self, sql: str, params: tuple = ()) -> int:
        """Run an UPDATE/DELETE; return the number of rows it changed."""
        cur = self._run(sql, params)
        try:
            return cur.rowcount
        finally:
            cur.close()

    def insert(self, sql: str, params: tuple = ()) -> int:
        """Run an INSERT of one row into a table with an `id` column; return the new id."""
        if self.db.config.dbms == "postgresql":
            cur = self._run(sql + " RETURNING id", params)
            try:
                return int(cur.fetchone()["id"])
            finally:
                cur.close()
        cur = self._run(sql, params)
        try:
            return int(cur.lastrowid)
        finally:
            cur.close()


class Database:
    """A bounded pool of connections to the RUBBoS database."""

    def __init__(self, config: DbConfig):
        self.config = config
        self.dbms = config.dbms
        self._impl: _PostgresPool | _MariaPool
        if config.dbms == "postgresql":
            self._impl = _PostgresPool(config)
        else:
            self._impl = _MariaPool(config)
        #: the connections taken, for the lab (contracts.poolgauge; None outside a lab)
        self._gauge = poolgauge.from_env(config.pool_size)

    @contextmanager
    def session(self, request_id: str | None = None) -> Iterator[Session]:
        # counted from the request for a connection: one given back while others wait passes to
        # one of them and is never free (contracts.poolgauge)
        if self._gauge is not None:
            self._gauge.add(1)
        try:
            conn = self._impl.get()
        except BaseException:
            if self._gauge is not None:
                self._gauge.add(-1)
            raise
        ok = True
        try:
            yield Session(self, conn, request_id)
        except DatabaseError as err:
            ok = not getattr(err, "broken", False)
            raise
        except BaseException:
            ok = False
            raise
        finally:
            self._impl.put(conn, ok)
            if self._gauge is not None:
                self._gauge.add(-1)

    def _execute(self, conn, sql: str, params: tuple):
        return self._impl.execute(conn, sql, params)

    def close(self) -> None:
        self._impl.close()


class _PostgresPool:
    def __init__(self, config: DbConfig):
        import psycopg
        from psycopg.rows import dict_row
        from psycopg_pool import ConnectionPool

        self.psycopg = psycopg
        conninfo = psycopg.conninfo.make_conninfo(
            host=config.host,
            port=config.port,
            user=config.user,
            dbname=config.database,
            password=config.password or None,
            connect_timeout=5,
        )
        self.timeout = config.pool_timeout_s
        self.pool = ConnectionPool(
            conninfo,
            min_size=1,
            max_size=config.pool_size,
            timeout=config.pool_timeout_s,
            kwargs={"autocommit": True, "prepare_threshold": None, "row_factory": dict_row},
            open=True,
            name=config.database,
        )

    def get(self):
        from psycopg_pool import PoolTimeout as PgPoolTimeout

        try:
            return self.pool.getconn(timeout=self.timeout)
        except PgPoolTimeout as err:
            raise PoolTimeout(f"no database connection free within {self.timeout} s") from err

    def put(self, conn, ok: bool) -> None:
        self.pool.putconn(conn)  # the pool discards connections that are broken

    def execute(self, conn, sql: str, params: tuple):
        psycopg = self.psycopg
        try:
            return conn.execute(sql, params)
        except psycopg.errors.UniqueViolation as err:
            raise DuplicateKey(str(err).strip()) from err
        except psycopg.Error as err:
            raise DatabaseError(f"{type(err).__name__}: {str(err).strip()}") from err

    def close(self) -> None:
        self.pool.close()


class _MariaPool:
    """A bounded pool of PyMySQL connections: at most `pool_size` exist at once; over several
    nodes, sessions go to them round robin (see the module docstring)."""

    def __init__(self, config: DbConfig):
        import pymysql

        self.pymysql = pymysql
        self.config = config
        self.nodes = hosts_of(config.host, config.port)
        self.idle: list[queue.LifoQueue] = [queue.LifoQueue() for _ in self.nodes]
        self.slots = threading.BoundedSemaphore(config.pool_size)
        self.lock = threading.Lock()
        self.next_node = 0
        self.opened = 0  # connections open now (in use or idle)
        self.closed = False

    def _connect(self, node: int):
        c = self.config
        host, port = self.nodes[node]
        conn = self.pymysql.connect(
            host=host,
            port=port,
            user=c.user,
            password=c.password,
            database=c.database,
            autocommit=True,
            charset="utf8mb4",
            connect_timeout=5,
            cursorclass=self.pymysql.cursors.DictCursor,
        )
        conn.tierscope_node = node
        return conn

    def get(self):
        if not self.slots.acquire(timeout=self.config.pool_timeout_s):
            raise PoolTimeout(f"no database connection free within {self.config.pool_timeout_s} s")
        with self.lock:
            first = self.next_node
            self.next_node = (first + 1) % len(self.nodes)
        try:
            return self.idle[first].get_nowait()
        except queue.Empty:
            pass
        self._make_room()
        errors = []
        for k in range(len(self.nodes)):  # the chosen node, then fail over to the next ones
            node = (first + k) % len(self.nodes)
            try:
                conn = self._connect(node)
            except self.pymysql.Error as err:
                errors.append(f"{self.nodes[node][0]}:{self.nodes[node][1]}: {err}")
                continue
            with self.lock:
                self.opened += 1
            return conn
        self.slots.release()
        raise DatabaseError(f"cannot connect to MariaDB: {'; '.join(errors)}")

    def _make_room(self) -> None:
        """Close an idle connection to another node when the pool is full (only with several nodes)."""
        with self.lock:
            if self.opened < self.config.pool_size:
                return
        for q in self.idle:
            try:
                conn = q.get_nowait()
            except queue.Empty:
                continue
            self._close(conn)
            return

    def _close(self, conn) -> None:
        with suppress(Exception):
            conn.close()
        with self.lock:
            self.opened -= 1

    def put(self, conn, ok: bool) -> None:
        if ok and conn.open and not self.closed:
            self.idle[getattr(conn, "tierscope_node", 0)].put(conn)
        else:
            self._close(conn)
        self.slots.release()

    def execute(self, conn, sql: str, params: tuple):
        pymysql = self.pymysql
        cur = conn.cursor()
        try:
            cur.execute(sql, params)
            return cur
        except pymysql.err.IntegrityError as err:
            cur.close()
            if err.args and err.args[0] == 1062:
                raise DuplicateKey(str(err)) from err
            raise DatabaseError(f"IntegrityError: {err}") from err
        except pymysql.Error as err:
            cur.close()
            e = DatabaseError(f"{type(err).__name__}: {err}")
            e.broken = isinstance(err, (pymysql.err.OperationalError, pymysql.err.InterfaceError))
            raise e from err

    def close(self) -> None:
        self.closed = True
        for q in self.idle:
            while True:
                try:
                    conn = q.get_nowait()
                except queue.Empty:
                    break
                self._close(conn)
