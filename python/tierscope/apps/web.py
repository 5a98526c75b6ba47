"""What the apps' WSGI front ends share (RUBBoS, the bookstore): a request served with its
request id (`serve`), the health check, the answer to a page that failed (`failure`: 400 for a
malformed request, 500 without the trace for the rest), a GET or POST form parsed safely, typed
parameters that answer HTTP 400 when malformed, the database settings from `<PREFIX>_*`
environment variables, and the small page helpers both use."""

from __future__ import annotations

import html
import logging
import re
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs

from tierscope.apps.dal import DatabaseError, PoolTimeout
from tierscope.contracts.dbms import DbConfig
from tierscope.services.credentials import LAB_USER

#: a request id a client may send (X-Request-Id): printable ASCII without spaces, 1 to 128 long
REQUEST_ID_RE = re.compile(r"^[\x21-\x7e]{1,128}$")
#: the content type of the pages
HTML = "text/html; charset=utf-8"

#: what a front end answers: (status, content type, body)
Answer = tuple[str, str, bytes]


def serve(environ: dict, start_response: Callable[..., Any], dispatch: Callable[..., Answer]) -> list[bytes]:
    """One request: `dispatch(environ, path, method, request id, start time)` answers it; the
    request id is the client's X-Request-Id when well formed (a new one otherwise) and goes back
    in the answer's X-Request-Id; a HEAD request gets no body."""
    t0 = time.perf_counter()
    rid = environ.get("HTTP_X_REQUEST_ID", "")
    if not REQUEST_ID_RE.match(rid):
        rid = uuid.uuid4().hex
    path = environ.get("PATH_INFO", "/")
    method = environ.get("REQUEST_METHOD", "GET")
    status, ctype, body = dispatch(environ, path, method, rid, t0)
    start_response(status, [("Content-Type", ctype), ("Content-Length", str(len(body))), ("X-Request-Id", rid)])
    return [body] if method != "HEAD" else [b""]


def health(db: Any, rid: str) -> Answer:
    """200 "ok" once the database `db` (an apps.dal.Database) answers a query, 503 with the error
    otherwise."""
    try:
        with db.session(rid) as s:
            s.query("SELECT 1 AS one")
        return "200 OK", "text/plain", b"ok\n"
    except Exception as err:
        return "503 Service Unavailable", "text/plain", f"ERROR: database: {err}\n".encode()


def failure(err: Exception, rid: str, script: str, page: Callable[[str, str], str], log: logging.Logger) -> Answer:
    """The answer to the page `script` that raised `err` (`page(title, body)` the app's page):
    400 with the reason for a BadRequest; 500 with the pool's timeout for a PoolTimeout (logged);
    otherwise 500 naming the kind of failure (a database error, or the exception's type) and the
    request, without the trace (logged with it)."""
    if isinstance(err, BadRequest):
        return "400 Bad Request", HTML, page("Bad request", f"<p>Bad request: {esc(err)}</p>\n").encode()
    if isinstance(err, PoolTimeout):
        log.error("request %s %s: %s", rid, script, err)
        return "500 Internal Server Error", HTML, page("ERROR", f"<p>ERROR: {esc(err)}</p>\n").encode()
    log.error("request %s %s failed", rid, script, exc_info=err)
    kind = "database error" if isinstance(err, DatabaseError) else type(err).__name__
    return (
        "500 Internal Server Error",
        HTML,
        page("ERROR", f"<p>ERROR: {esc(kind)} while processing {esc(script)} (request {esc(rid)}).</p>\n").encode(),
    )


def log_to_stderr() -> None:
    """An app's log lines to stderr (gunicorn's error log) with time and pid, unless the process
    has set up logging already."""
    if not logging.getLogger().handlers:
        logging.basicConfig(
            stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(process)d %(levelname)s %(message)s"
        )


class BadRequest(Exception):
    """A malformed or missing parameter: HTTP 400."""


def parse_form(environ: dict, max_body_bytes: int) -> dict[str, list[str]]:
    """The query string's parameters, plus a url-encoded POST body's; BadRequest for another
    content type, a body over `max_body_bytes`, text that is not UTF-8 or a NUL character."""
    try:
        values = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True, errors="strict")
        if environ.get("REQUEST_METHOD") == "POST":
            ctype = environ.get("CONTENT_TYPE", "")
            if ctype and not ctype.startswith("application/x-www-form-urlencoded"):
                raise BadRequest(f"unsupported Content-Type {ctype!r} (expected a url-encoded form)")
            try:
                length = int(environ.get("CONTENT_LENGTH") or 0)
            except ValueError:
                raise BadRequest("invalid Content-Length") from None
            if length > max_body_bytes:
                raise BadRequest(f"form body larger than {max_body_bytes} bytes")
            body = environ["wsgi.input"].read(length) if length > 0 else b""
            for k, v in parse_qs(body.decode("utf-8"), keep_blank_values=True, errors="strict").items():
                values.setdefault(k, []).extend(v)
    except UnicodeDecodeError:
        raise BadRequest("parameters are not valid UTF-8") from None
    for k, v in values.items():
        if any("\x00" in s for s in v):
            raise BadRequest(f"parameter {k}: contains a NUL character")
    return values


class FormRequest:
    """One request's parameters (the first value of each in `params`, all of them in `multi`)."""

    #: the largest form body accepted
    max_body_bytes = 64 * 1024

    def __init__(self, environ: dict, request_id: str):
        self.environ = environ
        self.request_id = request_id
        self.multi = parse_form(environ, self.max_body_bytes)
        self.params = {k: v[0] for k, v in self.multi.items()}

    def text(self, name: str, max_len: int, required: bool = True, default: str = "") -> str:
        """A text parameter of at most `max_len` characters; absent or empty: `default`, or 400 when
        required."""
        value = self.params.get(name)
        if value is None or value == "":
            if required:
                raise BadRequest(f"parameter {name}: missing")
            return default
        if len(value) > max_len:
            raise BadRequest(f"parameter {name}: longer than {max_len} characters")
        return value

    def int(
        self,
        name: str,
        default: int | None = None,
        lo: int = -(2**31),
        hi: int = 2**31 - 1,
        required: bool = True,
        value: str | None = None,
    ) -> int | None:
        """An integer parameter in [lo, hi] (or `value` checked as one); absent or empty: `default`
        when given or not `required`, else 400."""
        if value is None:
            value = self.params.get(name)
        if value is None or value == "":
            if default is not None or not required:
                return default
            raise BadRequest(f"parameter {name}: missing")
        if not re.fullmatch(r"[+-]?\d{1,10}", value):
            raise BadRequest(f"parameter {name}: expected an integer, got {value[:40]!r}")
        n = int(value)
        if not lo <= n <= hi:
            raise BadRequest(f"parameter {name}: {n} is outside [{lo}, {hi}]")
        return n


def db_config_from_env(env: Mapping[str, str], prefix: str, database: str) -> DbConfig:
    """`<prefix>_DBMS` (postgresql|mariadb), `_DB_HOST`, `_DB_PORT`, `_DB_USER`, `_DB_PASSWORD`,
    `_DB_NAME` (default `database`), `_POOL_SIZE`, `_POOL_TIMEOUT_S`; ValueError when one is bad.
    The user defaults to the lab's (`tierscope`); the lab's servers require its password."""
    dbms = env.get(f"{prefix}_DBMS", "postgresql")
    postgres = dbms == "postgresql"
    return DbConfig(
        dbms=dbms,
        host=env.get(f"{prefix}_DB_HOST", "127.0.0.1"),
        port=int(env.get(f"{prefix}_DB_PORT", 5432 if postgres else 3306)),
        user=env.get(f"{prefix}_DB_USER", LAB_USER),
        password=env.get(f"{prefix}_DB_PASSWORD", ""),  # the lab's, from its credentials file
        database=env.get(f"{prefix}_DB_NAME", database),
        pool_size=int(env.get(f"{prefix}_POOL_SIZE", "8")),
        pool_timeout_s=float(env.get(f"{prefix}_POOL_TIMEOUT_S", "10")),
    )


def esc(value) -> str:
    """HTML-escaped text of any value (None -> "")."""
    return html.escape("" if value is None else str(value), quote=True)


def sorry(title: str, message: str) -> tuple[str, str]:
    """A page that found nothing or refuses: its title and body (contains "Sorry")."""
    return title, f"<p>Sorry, {esc(message)}</p>\n"


def now() -> datetime:
    return datetime.now().replace(microsecond=0)


def fmt_date(d) -> str:
    return d.strftime("%Y-%m-%d %H:%M:%S") if isinstance(d, datetime) else esc(d)
