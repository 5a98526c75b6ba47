"""The log service's WSGI application (gunicorn: `tierscope.apps.logservice.app:create_app()`).

    POST /log     Authorization: Bearer <token>
                  {"id": "<unique id, 1-64 characters>", "level": 0-7, "message": "..."}
                  201 {"status": "stored" | "queued"}  the record is stored (direct) or enqueued
                  400 malformed body (not JSON, nested too deep, a field of the wrong type, NUL
                  characters or unpaired surrogates), 401 unknown token, 413 body over the limit,
                  503 not taken (database busy past its timeout, queue full, broker down, tokens
                  not loaded yet): not acknowledged
    GET /health   200 when the database answers
    GET /stats    this worker's counters (mode, requests, refused, stored, queued)

A record is the client's: its key is (client, id), the client being the token's owner, so ids
chosen by one client never touch another client's records.

Configuration from the environment (`LogServiceConfig.from_env`): LOGSVC_MODE (direct, queue,
durable), LOGSVC_DBMS, LOGSVC_DB_HOST/PORT/USER/PASSWORD/NAME, LOGSVC_POOL_SIZE,
LOGSVC_DB_TIMEOUT_S (the wait for a connection), LOGSVC_AUTH_CACHE (1: every client's token hash
read when a worker starts and again at most every LOGSVC_AUTH_REFRESH_S when an unknown token
comes, so unknown tokens are answered from memory: seed 003's authentication cache with a
negative side; 0: one query per request), LOGSVC_COLLECTORS, LOGSVC_BATCH_ROWS,
LOGSVC_BATCH_MS, LOGSVC_QUEUE_MAX, LOGSVC_REDIS_URL, LOGSVC_REDIS_PASSWORD, LOGSVC_MAX_BODY.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, fields
from typing import Any

from tierscope.apps.dal import Database, DatabaseError, PoolTimeout
from tierscope.apps.logservice.schema import token_sha256
from tierscope.apps.logservice.store import DirectStore, DurableStore, QueueStore, Record, Refused
from tierscope.apps.web import log_to_stderr
from tierscope.contracts.dbms import DbConfig

MODES = ("direct", "queue", "durable")


@dataclass(frozen=True)
class LogServiceConfig:
    mode: str = "direct"
    dbms: str = "postgresql"
    db_host: str = "127.0.0.1"
    db_port: int = 5432
    db_user: str = "postgres"
    db_password: str = ""
    db_name: str = "logs"
    pool_size: int = 8
    db_timeout_s: float = 5.0
    auth_cache: bool = True
    auth_refresh_s: float = 10.0
    collectors: int = 2
    batch_rows: int = 1000
    batch_ms: float = 50.0
    queue_max: int = 100_000
    redis_url: str = ""
    redis_password: str = ""
    max_body: int = 16_384

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode: expected one of {', '.join(MODES)}, got {self.mode!r}")
        if self.mode == "durable" and not self.redis_url:
            raise ValueError("mode durable needs redis_url (the broker that keeps the queue)")

    def env(self) -> dict[str, str]:
        """As environment variables for the app server (inverse of `from_env`)."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f"LOGSVC_{f.name.upper()}"] = ("1" if v else "0") if isinstance(v, bool) else str(v)
        return out

    @classmethod
    def from_env(cls, env=os.environ) -> LogServiceConfig:
        kw = {}
        for f in fields(cls):
            raw = env.get(f"LOGSVC_{f.name.upper()}")
            if raw is None:
                continue
            kind: Any = type(f.default)  # every field has a default: bool, int, float or str
            kw[f.name] = raw == "1" if kind is bool else kind(raw)
        return cls(**kw)

    def db(self) -> DbConfig:
        return DbConfig(
            dbms=self.dbms,
            host=self.db_host,
            port=self.db_port,
            user=self.db_user,
            password=self.db_password,
            database=self.db_name,
            pool_size=self.pool_size,
            pool_timeout_s=self.db_timeout_s,
        )


def _answer(start_response, code: int, doc: dict):
    body = json.dumps(doc).encode()
    reason = {
        200: "OK",
        201: "Created",
        400: "Bad Request",
        401: "Unauthorized",
        404: "Not Found",
        405: "Method Not Allowed",
        413: "Payload Too Large",
        500: "Internal Server Error",
        503: "Service Unavailable",
    }[code]
    start_response(f"{code} {reason}", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]


class BadRecord(ValueError):
    pass


def _text(value: object) -> bool:
    """A string the database can keep: no NUL, no unpaired surrogate."""
    if not isinstance(value, str) or "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_record(body: bytes, client_id: int, received_ns: int) -> Record:
    """A record from a request body, or BadRecord saying what is wrong (never another error)."""
    try:
        doc = json.loads(body)
    except RecursionError:
        raise BadRecord("body: nested too deep (a record is one flat JSON object)") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise BadRecord(f"body is not JSON ({err.__class__.__name__})") from None
    if not isinstance(doc, dict):
        raise BadRecord("body: expected a JSON object")
    rid, level, message = doc.get("id"), doc.get("level", 6), doc.get("message")
    if not isinstance(rid, str) or not 1 <= len(rid) <= 64 or not _text(rid):
        raise BadRecord("id: expected a string of 1 to 64 characters (no NUL, valid UTF-8)")
    if not isinstance(level, int) or isinstance(level, bool) or not 0 <= level <= 7:
        raise BadRecord("level: expected an integer 0..7 (syslog severity)")
    if not isinstance(message, str):
        raise BadRecord("message: expected a string")
    if not _text(message):
        raise BadRecord("message: NUL characters and unpaired surrogates cannot be stored")
    return Record(rid, client_id, level, message, received_ns)


class LogService:
    def __init__(self, config: LogServiceConfig):
        self.config = config
        self.db = Database(config.db())
        self.store: DirectStore | QueueStore | DurableStore
        if config.mode == "direct":
            self.store = DirectStore(self.db)
        elif config.mode == "queue":
            self.store = QueueStore(
                self.db,
                collectors=config.collectors,
                batch_rows=config.batch_rows,
                batch_ms=config.batch_ms,
                queue_max=config.queue_max,
            )
        else:
            self.store = DurableStore(
                self.db,
                config.redis_url,
                password=config.redis_password,
                collectors=config.collectors,
                batch_rows=config.batch_rows,
                batch_ms=config.batch_ms,
                stream_max=config.queue_max,
            )
        self.tokens: dict[str, int] | None = None  # sha256 of the token -> client; None: not loaded
        self.tokens_at = float("-inf")  # monotonic time of the last load (or attempt)
        self.counts = {
            "requests": 0,
            "refused": 0,
            "unauthorized": 0,
            "malformed": 0,
            "auth_queries": 0,
            "auth_loads": 0,
            "errors": 0,
        }
        self._lock = threading.Lock()
        self._auth_lock = threading.Lock()
        self._open_pool()
        if config.auth_cache:  # warm: one query for every known client
            # before the worker serves: a database host of a few hundredths of a core can take
            # longer than `db_timeout_s` to log the pool's first connection in; asked again for up
            # to 20 s (a worker that still could not read the set answers 503 and tries later)
            deadline = time.monotonic() + 20.0
            self._load_tokens()
            while self.tokens is None and time.monotonic() < deadline:
                time.sleep(0.5)
                self._load_tokens()
        atexit.register(self.close)

    def _open_pool(self) -> None:
        """Open all `pool_size` connections before serving (best effort): the pool otherwise grows
        under the load, and logging a connection in on a saturated database takes longer than the
        requests wait (it spent the database's CPU on logins that time out, not on records)."""
        with contextlib.ExitStack() as held:
            for _ in range(self.config.pool_size):
                try:
                    held.enter_context(self.db.session())
                except DatabaseError:
                    break

    def _count(self, key: str) -> None:
        with self._lock:
            self.counts[key] += 1

    def _load_tokens(self) -> None:
        """Read every client's token hash (one query); on failure keep what was there."""
        self.tokens_at = time.monotonic()
        self._count("auth_loads")
        try:
            with self.db.session() as s:
                rows = s.query("SELECT id, token_sha256 FROM clients")
        except DatabaseError as err:
            logging.getLogger("tierscope.logservice").warning("auth cache not loaded: %s", err)
            return
        self.tokens = {r["token_sha256"]: int(r["id"]) for r in rows}

    def client_of(self, token: str, request_id: str | None) -> int | None:
        """The client id of `token` (None when unknown).

        With the cache, the answer comes from memory: a token not among the loaded ones is
        unknown. The set is read again when an unknown token comes and the last read is older
        than `auth_refresh_s` (one request at a time; the others answer from the set they have),
        so unknown tokens cost at most one query per worker per `auth_refresh_s` however many
        come. Raises DatabaseError when the set was never loaded and cannot be now."""
        digest = token_sha256(token)
        if not self.config.auth_cache:
            self._count("auth_queries")
            with self.db.session(request_id) as s:
                row = s.one("SELECT id FROM clients WHERE token_sha256 = %s", (digest,))
            return None if row is None else int(row["id"])
        tokens = self.tokens
        if tokens is not None and digest in tokens:
            return tokens[digest]
        stale = time.monotonic() - self.tokens_at >= (self.config.auth_refresh_s if tokens is not None else 1.0)
        if stale and self._auth_lock.acquire(blocking=False):
            try:
                if time.monotonic() - self.tokens_at >= (self.config.auth_refresh_s if tokens is not None else 1.0):
                    self._load_tokens()
            finally:
                self._auth_lock.release()
            tokens = self.tokens
        if tokens is None:
            raise DatabaseError("client tokens not loaded yet (database unavailable)")
        return tokens.get(digest)

    def __call__(self, environ, start_response):
        try:
            return self._handle(environ, start_response)
        except Exception:  # a bug, not the client's fault: logged, answered 500, not acknowledged
            logging.getLogger("tierscope.logservice").exception("request failed")
            self._count("errors")
            return _answer(start_response, 500, {"error": "internal error (logged)"})

    def _handle(self, environ, start_response):
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "GET")
        if path == "/health":
            try:
                with self.db.session() as s:
                    s.one("SELECT 1 AS one")
            except DatabaseError as err:
                return _answer(start_response, 503, {"error": str(err)})
            return _answer(start_response, 200, {"status": "ok", "mode": self.config.mode})
        if path == "/stats":
            return _answer(start_response, 200, {**self.store.stats(), **self.counts, "pid": os.getpid()})
        if path != "/log":
            return _answer(start_response, 404, {"error": f"no such path {path!r} (POST /log)"})
        if method != "POST":
            return _answer(start_response, 405, {"error": "POST a record to /log"})
        self._count("requests")
        received_ns = time.time_ns()
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = -1
        if length < 0:
            self._count("malformed")
            return _answer(start_response, 400, {"error": "Content-Length: expected a number of bytes"})
        if length > self.config.max_body:
            self._count("malformed")
            return _answer(start_response, 413, {"error": f"body of {length} bytes, at most {self.config.max_body}"})
        body = environ["wsgi.input"].read(length) if length else b""
        auth = environ.get("HTTP_AUTHORIZATION", "")
        request_id = environ.get("HTTP_X_REQUEST_ID")
        try:
            client = self.client_of(auth[7:].strip(), request_id) if auth.startswith("Bearer ") else None
        except PoolTimeout as err:
            self._count("refused")
            return _answer(start_response, 503, {"error": f"database busy: {err}"})
        except DatabaseError as err:
            self._count("refused")
            return _answer(start_response, 503, {"error": str(err)})
        if client is None:
            self._count("unauthorized")
            return _answer(start_response, 401, {"error": "unknown token (Authorization: Bearer <token>)"})
        try:
            record = parse_record(body, client, received_ns)
        except BadRecord as err:
            self._count("malformed")
            return _answer(start_response, 400, {"error": str(err)})
        try:
            status = self.store.put(record)
        except Refused as err:
            self._count("refused")
            return _answer(start_response, 503, {"error": str(err)})
        return _answer(start_response, 201, {"status": status})

    def close(self) -> None:
        """Write what is still queued in this process (clean exit), then close the pool."""
        self.store.close(deadline_s=8.0)
        self.db.close()


def create_app(config: LogServiceConfig | None = None) -> LogService:
    log_to_stderr()
    return LogService(config or LogServiceConfig.from_env())
