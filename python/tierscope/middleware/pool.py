"""Connections to one database server (a backend) and their bounded pool (asyncio I/O).

`BackendConnection` is a PostgreSQL session, logged in with the lab's user and password
(scram-sha-256, what the lab's servers require; md5 and cleartext when a server asks for them);
with `protocol="mysql"` the pool opens `mysql_server.MySQLBackendConnection`s
(mysql_native_password) instead."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from tierscope.middleware import scram, wire

RECV_SIZE = 262144  # bytes asked for per read from a socket


class BackendError(Exception):
    """A backend could not be reached or broke the protocol (not an SQL error)."""


class BackendConnection:
    """One open, authenticated session on a backend, idle between units of work."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer
        self.parameters: dict[str, str] = {}
        self.status = b"I"  # transaction status from the last ReadyForQuery
        self.broken = False
        self.reused = False  # taken from the idle list (not opened for this use)
        self.buf = b""  # bytes received and not consumed yet (replies are read in bulk)

    @classmethod
    async def open(
        cls, host: str, port: int, user: str, database: str, timeout: float = 10.0, password: str = ""
    ) -> BackendConnection:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        except (TimeoutError, OSError) as err:
            raise BackendError(f"cannot connect to {host}:{port}: {err}") from err
        conn = cls(reader, writer)
        try:
            await asyncio.wait_for(conn._startup(user, database, password), timeout)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, wire.ProtocolError, scram.ScramError) as err:
            conn.close()
            raise BackendError(f"{host}:{port}: startup failed: {err!r}") from err
        except BackendError:
            conn.close()
            raise
        return conn

    async def _startup(self, user: str, database: str, password: str = "") -> None:
        self.writer.write(wire.startup_message({"user": user, "database": database, "client_encoding": "UTF8"}))
        await self.writer.drain()
        client: scram.ScramClient | None = None
        while True:
            kind, body = await self.read()
            if kind == wire.AUTH:
                code = wire.auth_request(body)
                if code == 0:
                    continue
                if not password and code in (wire.AUTH_CLEARTEXT, wire.AUTH_MD5, scram.SASL):
                    raise BackendError(f"the backend asks for a password (method {code}) and the middleware has none")
                if code == wire.AUTH_CLEARTEXT:
                    self.send(wire.password_message(password.encode() + b"\0"))
                elif code == wire.AUTH_MD5:
                    self.send(wire.password_message(wire.md5_password(user, password, body[4:8]) + b"\0"))
                elif code == scram.SASL:
                    if scram.MECHANISM not in wire.sasl_mechanisms(body):
                        raise BackendError(f"the backend offers {wire.sasl_mechanisms(body)}, not {scram.MECHANISM}")
                    client = scram.ScramClient(password)
                    self.send(wire.sasl_initial(scram.MECHANISM, client.first()))
                elif code == scram.SASL_CONTINUE and client is not None:
                    self.send(wire.password_message(client.final(body[4:])))
                elif code == scram.SASL_FINAL and client is not None:
                    client.verify(body[4:])
                    continue
                else:
                    raise BackendError(f"the backend asks for authentication method {code}, which the middleware lacks")
                await self.writer.drain()
            elif kind == wire.PARAMETER_STATUS:
                name, value = wire.parse_parameter_status(body)
                self.parameters[name] = value
            elif kind == wire.ERROR:
                raise BackendError(wire.error_text(body))
            elif kind == wire.READY:
                self.status = body[:1]
                return

    async def read(self) -> tuple[bytes, bytes]:
        """The next message (type, body)."""
        while True:
            buf = self.buf
            end = 5 + wire.header_length(buf) if len(buf) >= 5 else 0
            if end and len(buf) >= end:
                self.buf = buf[end:]
                return buf[:1], buf[5:end]
            await self.more(end - len(buf) if end else 0)

    async def more(self, missing: int = 0) -> bytes:
        """Whatever the backend sent next (or the `missing` rest of a long message, at once),
        appended to `buf` (which is also returned)."""
        if missing > 0:
            chunk = await self.reader.readexactly(missing)
        else:
            chunk = await self.reader.read(RECV_SIZE)
        if not chunk:
            raise asyncio.IncompleteReadError(self.buf, None)
        self.buf = self.buf + chunk if self.buf else chunk
        return self.buf

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    def close(self) -> None:
        self.broken = True
        try:
            if not self.writer.is_closing():
                self.writer.write(wire.frame(wire.TERMINATE, b""))
            self.writer.close()
        except Exception:
            pass


@dataclass
class BackendPool:
    """At most `size` connections to one backend; `acquire` waits for a free one."""

    name: str
    host: str
    port: int
    user: str
    database: str
    size: int = 16
    idle: list = field(default_factory=list)
    password: str = ""
    protocol: str = "postgres"  # or "mysql"
    opened: int = 0

    def __post_init__(self):
        self._slots = asyncio.Semaphore(self.size)

    async def acquire(self) -> BackendConnection:
        await self._slots.acquire()
        try:
            while self.idle:
                conn = self.idle.pop()
                if not conn.broken and not conn.writer.is_closing():
                    conn.reused = True
                    return conn
            if self.protocol == "mysql":
                from tierscope.middleware.mysql_server import MySQLBackendConnection

                conn = await MySQLBackendConnection.open(self.host, self.port, self.user, self.password, self.database)
            else:
                conn = await BackendConnection.open(
                    self.host, self.port, self.user, self.database, password=self.password
                )
            self.opened += 1
            return conn
        except BaseException:
            self._slots.release()
            raise

    def release(self, conn: BackendConnection) -> None:
        if conn.broken or conn.status != b"I" or conn.writer.is_closing():
            conn.close()
        else:
            self.idle.append(conn)
        self._slots.release()

    def drop_idle(self) -> None:
        """Close every idle connection (after one turned out broken)."""
        while self.idle:
            self.idle.pop().close()

    def close(self) -> None:
        self.drop_idle()
