"""Three ways to store a log record, chosen by the service's mode (seed 003).

- `DirectStore`: one INSERT per record in autocommit, on the request's thread; the record is
  acknowledged once stored. Under load the requests wait for a database connection; past the
  pool timeout the record is refused (503) and never stored: seed 003's lost logs.
- `QueueStore`: the request puts the record in a bounded in-process FIFO and is acknowledged at
  once; `collectors` threads take batches of up to `batch_rows` records (or what came within
  `batch_ms`) and write each batch in one statement. A full queue refuses (503), never drops.
  Records still queued when the process exits cleanly are written before it exits; a crash loses
  them (acknowledged but only in memory): use `DurableStore` for that.
- `DurableStore`: the request appends the record to a Redis stream (a broker process of its own)
  and is acknowledged once Redis has it; collector threads read batches through a consumer group,
  write them, then acknowledge and delete them in Redis. Records a crashed process had read but not
  written stay pending in the group and are claimed by the survivors (or the restarted app) after
  `claim_idle_ms`; writes are idempotent by record id, so a redelivered record is one row.

A batch is one statement: PostgreSQL `INSERT ... SELECT FROM unnest(arrays) ON CONFLICT DO
NOTHING`, MariaDB `INSERT IGNORE ... VALUES (...), (...)`, keyed by (client_id, id). A batch that
fails because the database is down or busy is retried (pauses growing to 2 s) until it is written
or the store is closed with a deadline; a batch the database refuses for its data is split until
the offending record is alone, which is set aside (`dead_letter`) so it cannot block the others.
A collector thread that dies is replaced.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from tierscope.apps.dal import Database, DatabaseError, PoolTimeout

log = logging.getLogger("tierscope.logservice")


@dataclass(frozen=True)
class Record:
    id: str
    client_id: int
    level: int
    message: str
    received_ns: int


class Refused(RuntimeError):
    """The record was not taken (not acknowledged): the client may send it again."""


COLUMNS = "(id, client_id, level, message, received_ns)"


def data_error(err: BaseException) -> bool:
    """True when the database refused a statement for its data (not for being down or busy)."""
    cause = err.__cause__
    name = type(cause).__name__ if cause is not None else ""
    if name in ("DataError", "IntegrityError", "CharacterNotInRepertoire", "UntranslatableCharacter"):
        return True
    mod = type(cause).__module__ if cause is not None else ""
    if mod.startswith("psycopg"):
        import psycopg

        return isinstance(cause, (psycopg.DataError, psycopg.IntegrityError))
    if mod.startswith("pymysql"):
        import pymysql

        return isinstance(cause, (pymysql.err.DataError, pymysql.err.IntegrityError))
    return False


def insert_one(db: Database, r: Record) -> None:
    verb = "INSERT IGNORE" if db.dbms == "mariadb" else "INSERT"
    tail = "" if db.dbms == "mariadb" else " ON CONFLICT (client_id, id) DO NOTHING"
    with db.session(r.id) as s:
        s.execute(
            f"{verb} INTO logs {COLUMNS} VALUES (%s, %s, %s, %s, %s){tail}",
            (r.id, r.client_id, r.level, r.message, r.received_ns),
        )


def insert_batch(db: Database, rows: list[Record]) -> None:
    """Write `rows` in one statement (idempotent by (client, id)), returning once the commit is in
    the database's log: a PostgreSQL configured with `synchronous_commit = off` (the lab's
    `fsync=False`) would answer before, and a crash of the database would then lose a batch the
    collector has already deleted from its queue. (MariaDB's non-durable setting,
    `innodb_flush_log_at_trx_commit = 2`, writes the log at each commit: a crash of the server
    process loses nothing; a crash of the host can.)"""
    if not rows:
        return
    with db.session() as s:
        if db.dbms == "postgresql":
            s.execute("SET synchronous_commit = on")
            s.execute(
                f"INSERT INTO logs {COLUMNS} SELECT * FROM unnest(%s::varchar[], %s::integer[], %s::smallint[], "
                "%s::text[], %s::bigint[]) ON CONFLICT (client_id, id) DO NOTHING",
                (
                    [r.id for r in rows],
                    [r.client_id for r in rows],
                    [r.level for r in rows],
                    [r.message for r in rows],
                    [r.received_ns for r in rows],
                ),
            )
        else:
            s.execute(
                f"INSERT IGNORE INTO logs {COLUMNS} VALUES " + ",".join(["(%s, %s, %s, %s, %s)"] * len(rows)),
                tuple(x for r in rows for x in (r.id, r.client_id, r.level, r.message, r.received_ns)),
            )


class DirectStore:
    mode = "direct"

    def __init__(self, db: Database):
        self.db = db
        self.stored = 0
        self._lock = threading.Lock()

    def put(self, r: Record) -> str:
        try:
            insert_one(self.db, r)
        except PoolTimeout as err:
            raise Refused(f"database busy: {err}") from err
        except DatabaseError as err:
            raise Refused(f"not stored: {err}") from err
        with self._lock:
            self.stored += 1
        return "stored"

    def stats(self) -> dict:
        return {"mode": self.mode, "stored": self.stored}

    def close(self, deadline_s: float = 10.0) -> None:
        pass


class _Collectors:
    """Threads that write batches taken by `take(batch_rows, batch_ms)` until closed."""

    def __init__(self, db: Database, collectors: int, batch_rows: int, batch_ms: float):
        if collectors < 1 or batch_rows < 1 or batch_ms <= 0:
            raise ValueError("collectors and batch_rows must be >= 1 and batch_ms > 0")
        self.db, self.batch_rows, self.batch_s = db, batch_rows, batch_ms / 1000
        self.stored = self.batches = self.retries = self.dead = self.restarted = 0
        self.writing = 0  # records a collector has taken and not yet written (or set aside)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._deadline = float("inf")
        self._threads = [self._thread(i) for i in range(collectors)]
        self._next_watch = 0.0

    def _thread(self, i: int) -> threading.Thread:
        return threading.Thread(target=self._loop, name=f"collector-{i}", daemon=True)

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def watch(self) -> None:
        """Replace collector threads that died (checked at most once a second, from the requests)."""
        now = time.monotonic()
        if now < self._next_watch or self._stop.is_set():
            return
        with self._lock:
            if now < self._next_watch:
                return
            self._next_watch = now + 1.0
            for i, t in enumerate(self._threads):
                if not t.is_alive():
                    log.error("collector-%d died; starting a new one", i)
                    self._threads[i] = self._thread(i)
                    self._threads[i].start()
                    self.restarted += 1

    def _insert(self, rows: list) -> None:
        """Write `rows`; a batch refused for its data is split until the bad record is alone,
        which goes to `dead_letter` (the others are written)."""
        try:
            insert_batch(self.db, [r for r, _ in rows])
        except DatabaseError as err:
            if not data_error(err):
                raise
            if len(rows) == 1:
                log.error(
                    "collector: record %s of client %s refused by the database: %s",
                    rows[0][0].id,
                    rows[0][0].client_id,
                    err,
                )
                self.dead_letter(rows[0], str(err))
                with self._lock:
                    self.dead += 1
                return
            half = len(rows) // 2
            self._insert(rows[:half])
            self._insert(rows[half:])

    def _write(self, rows: list) -> bool:
        """Write until it works or the close deadline passes; True when written."""
        with self._lock:
            self.writing += len(rows)
        try:
            return self._write_held(rows)
        finally:
            with self._lock:
                self.writing -= len(rows)

    def _write_held(self, rows: list) -> bool:
        pause = 0.1
        while True:
            try:
                self._insert(rows)
                break
            except Exception as err:  # the database or the pool: keep the batch, try again
                with self._lock:
                    self.retries += 1
                if time.monotonic() > self._deadline:
                    log.error("collector: %d records not written at shutdown: %s", len(rows), err)
                    return False
                log.warning("collector: batch of %d failed (%s), retrying in %.1f s", len(rows), err, pause)
                time.sleep(pause)
                pause = min(2.0, pause * 2)
        self.written(rows)
        with self._lock:
            self.stored += len(rows)
            self.batches += 1
        return True

    def _loop(self) -> None:
        while True:
            try:
                rows = self.take(self.batch_rows, self.batch_s)
                if rows:
                    self._write(rows)
                elif self._stop.is_set():
                    return
            except Exception:  # a collector never dies: what it held stays queued or pending
                log.exception("collector: unexpected error")
                time.sleep(0.2)

    def take(self, n: int, within_s: float) -> list:
        raise NotImplementedError

    def written(self, rows: list) -> None:
        """Called once `rows` are in the database."""

    def dead_letter(self, row, reason: str) -> None:
        """Called for a record the database refused for its data (it is not retried)."""

    def close(self, deadline_s: float) -> None:
        self._deadline = time.monotonic() + deadline_s
        self._stop.set()
        for t in self._threads:
            t.join(timeout=max(0.0, self._deadline - time.monotonic()) + 1)


class QueueStore(_Collectors):
    mode = "queue"

    def __init__(
        self,
        db: Database,
        *,
        collectors: int = 2,
        batch_rows: int = 1000,
        batch_ms: float = 50,
        queue_max: int = 100_000,
    ):
        super().__init__(db, collectors, batch_rows, batch_ms)
        self.queue: queue.Queue = queue.Queue(maxsize=queue_max)
        self.start()

    def put(self, r: Record) -> str:
        if self._stop.is_set():
            raise Refused("shutting down")
        self.watch()
        try:
            self.queue.put_nowait((r, None))
        except queue.Full:
            raise Refused(f"queue full ({self.queue.maxsize} records)") from None
        return "queued"

    def take(self, n: int, within_s: float) -> list:
        try:
            rows = [self.queue.get(timeout=within_s)]
        except queue.Empty:
            return []
        end = time.monotonic() + within_s
        while len(rows) < n:
            try:
                rows.append(self.queue.get_nowait())
            except queue.Empty:
                left = end - time.monotonic()
                if left <= 0:
                    break
                try:
                    rows.append(self.queue.get(timeout=left))
                except queue.Empty:
                    break
        return rows

    def stats(self) -> dict:
        return {
            "mode": self.mode,
            "queued": self.queue.qsize() + self.writing,  # waiting, or taken and being written
            "stored": self.stored,
            "batches": self.batches,
            "retries": self.retries,
            "dead": self.dead,
        }


STREAM, GROUP, DEAD = "logs", "collectors", "logs-dead"


class DurableStore(_Collectors):
    mode = "durable"

    def __init__(
        self,
        db: Database,
        redis_url: str,
        *,
        password: str | None = None,
        collectors: int = 2,
        batch_rows: int = 1000,
        batch_ms: float = 50,
        claim_idle_ms: int = 5000,
        stream_max: int = 1_000_000,
    ):
        import redis

        super().__init__(db, collectors, batch_rows, batch_ms)
        from redis.backoff import ExponentialBackoff
        from redis.retry import Retry

        # requests wait for one of a bounded set of broker connections (rather than fail); a
        # command that meets a broken connection is tried again 3 times within about a second
        # (a broker restarting that fast is not felt; a retried XADD that had been applied is a
        # second entry of the same record: one row), then the request is refused (503)
        pool = redis.BlockingConnectionPool.from_url(
            redis_url,
            password=password or None,
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 3),
            max_connections=64,
            timeout=10,
            socket_timeout=10,
            socket_connect_timeout=2,
        )
        self.redis = redis.Redis(connection_pool=pool)
        self.claim_idle_ms = claim_idle_ms
        self.stream_max = stream_max
        self.consumer = f"{socket.gethostname()}-{os.getpid()}"
        self._group = False
        try:
            self._ensure_group()
        except redis.RedisError as err:  # the broker is down: the collectors try again
            log.warning("durable store: broker unavailable at start (%s)", err)
        self._local = threading.local()
        self._claim_lock = threading.Lock()
        self._next_claim = 0.0
        self._backlog, self._backlog_at = 0, 0.0
        self.start()

    def _ensure_group(self) -> None:
        import redis

        try:
            self.redis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
        except redis.ResponseError as err:
            if "BUSYGROUP" not in str(err):
                raise
        self._group = True

    def put(self, r: Record) -> str:
        """Acknowledged (returns) only once the broker has the record; with the broker's
        `appendfsync always`, once it is in the broker's append-only file on disk."""
        import redis

        if self._stop.is_set():
            raise Refused("shutting down")
        self.watch()
        try:
            now = time.monotonic()
            if now >= self._backlog_at:  # the stream's length, read at most every 100 ms
                self._backlog, self._backlog_at = self.redis.xlen(STREAM), now + 0.1
            if self._backlog >= self.stream_max:
                raise Refused(f"stream full ({self.stream_max} records)")
            self.redis.xadd(STREAM, {"id": r.id, "c": r.client_id, "l": r.level, "m": r.message, "t": r.received_ns})
        except redis.RedisError as err:
            raise Refused(f"broker unavailable: {err}") from err
        return "queued"

    @staticmethod
    def _record(fields: dict) -> Record:
        f = {k.decode(): v for k, v in fields.items()}
        return Record(f["id"].decode(), int(f["c"]), int(f["l"]), f["m"].decode("utf-8", "replace"), int(f["t"]))

    def take(self, n: int, within_s: float) -> list:
        import redis

        name = getattr(self._local, "name", None)
        if name is None:
            name = self._local.name = f"{self.consumer}-{threading.get_ident()}"
        try:
            if not self._group:
                self._ensure_group()
            entries = self._claim(name, n)
            if not entries and not self._stop.is_set():
                # redis-py types replies loosely: [[stream, [(id, fields), ...]]]
                got: Any = self.redis.xreadgroup(
                    GROUP, name, {STREAM: ">"}, count=n, block=max(1, int(within_s * 1000))
                )
                entries = got[0][1] if got else []
            elif not entries:  # closing: whatever is still unread, without waiting
                got = self.redis.xreadgroup(GROUP, name, {STREAM: ">"}, count=n)
                entries = got[0][1] if got else []
        except redis.ResponseError as err:
            if "NOGROUP" in str(err):
                self._group = False
            log.warning("collector: broker refused (%s)", err)
            time.sleep(0.2)
            return []
        except redis.RedisError as err:
            log.warning("collector: broker unavailable (%s)", err)
            time.sleep(0.2)
            return []
        return [(self._record(fields), eid) for eid, fields in entries if fields]

    def _claim(self, name: str, n: int) -> list:
        """Entries another (dead) consumer read and left unacknowledged for `claim_idle_ms`."""
        now = time.monotonic()
        with self._claim_lock:
            if now < self._next_claim:
                return []
            self._next_claim = now + max(0.5, self.claim_idle_ms / 2000)
        _next, entries, *_ = self.redis.xautoclaim(
            STREAM, GROUP, name, min_idle_time=self.claim_idle_ms, start_id="0-0", count=n
        )
        return entries

    def written(self, rows: list) -> None:
        ids = [eid for _, eid in rows]
        pipe = self.redis.pipeline(transaction=False)
        pipe.xack(STREAM, GROUP, *ids)
        pipe.xdel(STREAM, *ids)
        pipe.execute()

    def dead_letter(self, row, reason: str) -> None:
        r, eid = row
        self.redis.xadd(
            DEAD, {"id": r.id, "c": r.client_id, "l": r.level, "m": r.message, "t": r.received_ns, "why": reason[:500]}
        )
        self.written([row])

    def stats(self) -> dict:
        try:
            backlog = self.redis.xlen(STREAM)
        except Exception:
            backlog = None
        return {
            "mode": self.mode,
            "queued": backlog,
            "stored": self.stored,
            "batches": self.batches,
            "retries": self.retries,
            "dead": self.dead,
        }
