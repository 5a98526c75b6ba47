"""The MySQL-protocol front and back of the middleware (MariaDB behind it).

Client side: the middleware greets with a protocol-10 handshake offering mysql_native_password,
accepts the configured user and password (the backends' own) and the served database, and then
serves the text protocol: COM_QUERY is one unit of work, classified read or write by `sql` and
routed by `routing.RoutingSession` exactly as a PostgreSQL unit (reads to one backend by the
policy, writes broadcast under the write lock, a transaction pinned to one connection per backend
with the lock held until it ends). COM_PING, COM_INIT_DB (the served database only),
COM_RESET_CONNECTION, COM_SET_OPTION and COM_QUIT are answered here, and so are `USE <the served
database>` and `SET NAMES utf8mb4` (what every backend connection has from its login; PyMySQL
sends it on connect): neither takes the write lock. `SELECT @@socket` is answered with an empty
string: the Rust mysql driver asks it on a loopback address to switch to the server's unix socket,
and a backend's answer would take the client around the middleware.

Prepared statements (the binary protocol): COM_STMT_PREPARE runs on one backend (chosen like a
read) and the client gets the session's own statement id; COM_STMT_EXECUTE is a unit of work like a
query (a read or a write by the statement's SQL), and a backend connection that has not prepared
that SQL yet prepares it first (one more round trip, then kept: up to 256 statements per
connection). The parameter types the client bound last are sent with every execute (the
connection may not have seen them). Not supported, with an ERR packet (1235): cursors (an execute
with a cursor flag, COM_STMT_FETCH) and COM_STMT_SEND_LONG_DATA.

Transactions are seen in the backends' status flags, as the PostgreSQL side sees them in
ReadyForQuery: after BEGIN / START TRANSACTION, or SET autocommit=0, a backend's OK says "in
transaction" or "autocommit off", and the session keeps its connections (and the write lock) until
an OK says idle with autocommit on again (COMMIT, ROLLBACK, SET autocommit=1).

Time functions: a write whose text calls NOW(), CURRENT_TIMESTAMP, CURDATE(), UNIX_TIMESTAMP(), ...
runs on every backend between `SET timestamp = <the same instant>` and `SET timestamp = DEFAULT`
(sent in one write with it; their answers are hidden), so every replica stores the same value
(what MariaDB's statement-based replication does). SYSDATE(), RAND() and UUID() are not fixed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import re
import struct
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime

from tierscope.middleware import mysql_wire as my
from tierscope.middleware import sql as sqlmod
from tierscope.middleware.manager import Backend, NoBackend, RequestManager, log
from tierscope.middleware.pool import RECV_SIZE, BackendConnection, BackendError
from tierscope.middleware.routing import Result, RoutingSession

_session_ids = itertools.count(1)
#: statements kept prepared per backend connection at most (the oldest is closed beyond)
STMT_CACHE = 256
_USE = re.compile(r"^\s*USE\s+`?([A-Za-z0-9_$]+)`?\s*;?\s*$", re.IGNORECASE)
#: asked by the Rust mysql driver to switch to the server's unix socket on a loopback address: the
#: middleware has none (a backend's would send the client around the middleware)
_SOCKET = re.compile(r"^\s*SELECT\s+@@socket\s*;?\s*$", re.IGNORECASE)
#: what every backend connection already has (its login asks for utf8mb4): PyMySQL sends it on connect
_SET_NAMES = re.compile(r"^\s*SET\s+NAMES\s+'?utf8mb4'?(\s+COLLATE\s+'?utf8mb4_general_ci'?)?\s*;?\s*$", re.IGNORECASE)
#: time functions fixed by SET timestamp (SYSDATE is not: it reads the clock)
TIME_FUNCTIONS = frozenset(
    (
        "NOW",
        "CURRENT_TIMESTAMP",
        "CURRENT_DATE",
        "CURRENT_TIME",
        "CURDATE",
        "CURTIME",
        "LOCALTIME",
        "LOCALTIMESTAMP",
        "UNIX_TIMESTAMP",
        "UTC_TIMESTAMP",
        "UTC_DATE",
        "UTC_TIME",
    )
)
CURSORS_UNSUPPORTED = (
    "server-side cursors (COM_STMT_EXECUTE with a cursor flag, COM_STMT_FETCH) are not supported by the "
    "tierscope middleware"
)
LONG_DATA_UNSUPPORTED = "COM_STMT_SEND_LONG_DATA is not supported by the tierscope middleware"
ER_UNKNOWN_STMT_HANDLER = 1243


def time_functions(text: str) -> int:
    """How many time functions `text` calls (outside literals and comments)."""
    return sum(1 for t in sqlmod.tokens(text) if t.kind == "word" and t.text in TIME_FUNCTIONS)


def idle_status(flags: int) -> bytes:
    """b"I" when a connection with these status flags holds no transaction (autocommit on, none open)."""
    return b"I" if flags & my.STATUS_AUTOCOMMIT and not flags & my.STATUS_IN_TRANS else b"T"


# --- backends ------------------------------------------------------------------------------------


class MySQLBackendConnection(BackendConnection):
    """One authenticated MySQL-protocol session on a backend (mysql_native_password), with the
    statements prepared on it (by their SQL: any client's statement of the same text reuses one)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        super().__init__(reader, writer)
        self.stmts: OrderedDict[bytes, int] = OrderedDict()  # SQL -> the backend's statement id

    async def prepare(self, sql: bytes) -> tuple[list[tuple[int, bytes]], int | None, str | None]:
        """COM_STMT_PREPARE `sql` here: (the answer's packets as (sequence id, payload), the
        statement id or None and the error text when it failed). The oldest statement is closed
        when more than STMT_CACHE are prepared."""
        out = b""
        if len(self.stmts) >= STMT_CACHE:
            _, old = self.stmts.popitem(last=False)
            out = my.packet(0, bytes((my.COM_STMT_CLOSE,)) + struct.pack("<I", old))  # no answer
        self.send(out + my.packet(0, bytes((my.COM_STMT_PREPARE,)) + sql))
        seq, first = await self.read_packet()
        packets = [(seq, first)]
        if first[:1] == b"\xff":
            return packets, None, my.err_text(first)
        if first[:1] != b"\x00" or len(first) < 12:
            raise my.ProtocolError(f"unexpected answer to COM_STMT_PREPARE: 0x{first[0]:02x}")
        sid, columns, params = struct.unpack_from("<IHH", first, 1)
        for n in (params, columns):
            for _ in range(n + 1 if n else 0):  # the definitions, then an EOF
                packets.append(await self.read_packet())
        self.stmts[sql] = sid
        return packets, sid, None

    @classmethod
    async def open(  # type: ignore[override]
        cls, host: str, port: int, user: str, password: str, database: str, timeout: float = 10.0
    ) -> MySQLBackendConnection:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        except (TimeoutError, OSError) as err:
            raise BackendError(f"cannot connect to {host}:{port}: {err}") from err
        conn = cls(reader, writer)
        try:
            await asyncio.wait_for(conn._login(user, password, database), timeout)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, my.ProtocolError, IndexError) as err:
            conn.close()
            raise BackendError(f"{host}:{port}: login failed: {err!r}") from err
        except BackendError:
            conn.close()
            raise
        sock = writer.get_extra_info("socket")
        if sock is not None:
            import socket

            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    async def _login(self, user: str, password: str, database: str) -> None:
        seq, payload = await self.read_packet()
        if payload[:1] == b"\xff":
            raise BackendError(my.err_text(payload))
        hs = my.parse_handshake(payload)
        self.parameters = {"server_version": hs.version}
        caps = my.BACKEND_CAPS & (hs.caps | my.LONG_PASSWORD)
        for need in (my.PROTOCOL_41, my.SECURE_CONNECTION):
            if not caps & need:
                raise BackendError(f"the backend ({hs.version}) lacks capability 0x{need:x}")
        self.send(
            my.packet(seq + 1, my.handshake_response(caps, user, my.scramble_native(password, hs.salt), database))
        )
        while True:
            seq, payload = await self.read_packet()
            first = payload[:1]
            if first == b"\x00":
                self.status = idle_status(my.parse_ok(payload)[2])
                return
            if first == b"\xff":
                raise BackendError(my.err_text(payload))
            if first == b"\xfe":  # AuthSwitchRequest
                plugin, pos = my.cstring(payload, 1)
                if plugin.decode() != my.NATIVE_PASSWORD:
                    raise BackendError(
                        f"the backend asks for authentication plugin {plugin.decode()!r}; the middleware "
                        f"logs in with {my.NATIVE_PASSWORD} only"
                    )
                self.send(my.packet(seq + 1, my.scramble_native(password, payload[pos : pos + 20])))
                continue
            raise BackendError(f"unexpected packet 0x{payload[0]:02x} during login")

    async def read_packet(self) -> tuple[int, bytes]:
        """The next (sequence id, payload), a split payload joined."""
        parts, seq = [], 0
        while True:
            while len(self.buf) < 4:
                await self.more()
            n, seq = my.header(self.buf)
            if len(self.buf) < 4 + n:
                await self.more(4 + n - len(self.buf))
            parts.append(self.buf[4 : 4 + n])
            self.buf = self.buf[4 + n :]
            if n < my.MAX_PAYLOAD:
                return seq, b"".join(parts)

    def close(self) -> None:
        self.broken = True
        try:
            if not self.writer.is_closing():
                self.writer.write(my.packet(0, bytes((my.COM_QUIT,))))
            self.writer.close()
        except Exception:
            pass


@dataclass
class PStmt:
    """A statement a client prepared (its id is the session's own)."""

    sql: bytes
    text: str
    params: int
    columns: int
    kind: str  # sqlmod.READ or WRITE
    types: bytes | None = None  # the parameter types the client bound last (sent again on every execute)
    long_data: bool = False  # COM_STMT_SEND_LONG_DATA came (not supported)


@dataclass
class MyOutgoing:
    """The commands to send a backend for one unit, and per command whether the client sees its
    answer: `pre` + the query (or the execute of `stmt` with `body`, prepared on the connection
    first when it is not yet) + `post`."""

    query: bytes | None
    passed: list[bool]
    pre: bytes = b""
    post: bytes = b""
    stmt: PStmt | None = None
    body: bytes = b""  # COM_STMT_EXECUTE's payload after the statement id


# --- client sessions -----------------------------------------------------------------------------


class MySQLSession(RoutingSession):
    """One client connection speaking the MySQL protocol (text protocol)."""

    def __init__(self, manager: RequestManager, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        super().__init__(manager, reader, writer)
        self.id = next(_session_ids)
        self.buf = b""
        self.stmts: dict[int, PStmt] = {}  # prepared by the client, by the session's own ids
        self.next_stmt = 1

    async def read_packet(self) -> tuple[int, bytes]:
        parts, seq = [], 0
        while True:
            while len(self.buf) < 4:
                chunk = await self.reader.read(RECV_SIZE)
                if not chunk:
                    raise asyncio.IncompleteReadError(self.buf, None)
                self.buf += chunk
            n, seq = my.header(self.buf)
            if len(self.buf) < 4 + n:
                self.buf += await self.reader.readexactly(4 + n - len(self.buf))
            parts.append(self.buf[4 : 4 + n])
            self.buf = self.buf[4 + n :]
            if n < my.MAX_PAYLOAD:
                return seq, b"".join(parts)

    def reply(self, payload: bytes, seq: int = 1) -> None:
        self.writer.write(my.packet(seq, payload))

    def status_flags(self) -> int:
        return my.STATUS_IN_TRANS if self.txn else my.STATUS_AUTOCOMMIT

    async def run(self) -> None:
        self.m.counts["sessions"] += 1
        try:
            if not await self.login():
                return
            while True:
                seq, payload = await self.read_packet()
                if not payload:
                    raise my.ProtocolError("an empty command packet")
                cmd = payload[0]
                if cmd == my.COM_QUERY:
                    await self.query(payload)
                elif cmd == my.COM_QUIT:
                    return
                elif cmd == my.COM_PING:
                    self.reply(my.ok(status=self.status_flags()))
                elif cmd == my.COM_INIT_DB:
                    self.use(payload[1:].decode("utf-8", "replace"))
                elif cmd == my.COM_RESET_CONNECTION:
                    await self.reset()
                    self.reply(my.ok(status=self.status_flags()))
                elif cmd == my.COM_SET_OPTION:  # the backends allow multiple statements anyway
                    self.reply(my.eof(self.status_flags()))
                elif cmd == my.COM_STMT_PREPARE:
                    await self.stmt_prepare(payload[1:])
                elif cmd == my.COM_STMT_EXECUTE:
                    await self.stmt_execute(payload)
                elif cmd in (my.COM_STMT_CLOSE, my.COM_STMT_SEND_LONG_DATA, my.COM_STMT_RESET):
                    self.stmt_other(cmd, payload)
                elif cmd == my.COM_STMT_FETCH:
                    self.m.counts["errors_to_clients"] += 1
                    self.reply(my.err(my.ER_NOT_SUPPORTED_YET, CURSORS_UNSUPPORTED, "42000"))
                else:
                    self.m.counts["errors_to_clients"] += 1
                    self.reply(
                        my.err(my.ER_UNKNOWN_COM, f"command 0x{cmd:02x} is not supported by the middleware", "08S01")
                    )
                await self.writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, my.ProtocolError) as err:
            if isinstance(err, my.ProtocolError):
                log(f"session {self.id}: {err}")
        except Exception as err:  # one client's trouble must not stop the others
            log(f"session {self.id}: closed after an unexpected error: {err!r}")
        finally:
            await self.end()

    async def login(self) -> bool:
        salt = bytes(random.randint(33, 126) for _ in range(20))
        version = self.m.parameters.get("server_version", "5.5.5-10.11-MariaDB") + "-tierscope-middleware"
        self.reply(my.handshake_v10(self.id, salt, version), seq=0)
        await self.writer.drain()
        seq, payload = await self.read_packet()
        login = my.parse_login(payload)
        auth = login.auth
        if login.plugin and login.plugin != my.NATIVE_PASSWORD:  # ask for mysql_native_password
            self.reply(my.auth_switch(my.NATIVE_PASSWORD, salt), seq + 1)
            await self.writer.drain()
            seq, auth = await self.read_packet()
        if login.user != self.m.user or auth != my.scramble_native(self.m.password, salt):
            self.reply(
                my.err(
                    my.ER_ACCESS_DENIED,
                    f"Access denied for user '{login.user}' (the middleware accepts user '{self.m.user}' "
                    "with the backends' password)",
                    "28000",
                ),
                seq + 1,
            )
            await self.writer.drain()
            return False
        if login.database and login.database != self.m.database:
            self.reply(self.bad_db(login.database), seq + 1)
            await self.writer.drain()
            return False
        self.reply(my.ok(), seq + 1)
        await self.writer.drain()
        return True

    def bad_db(self, name: str) -> bytes:
        return my.err(my.ER_BAD_DB, f"Unknown database '{name}' (this middleware serves '{self.m.database}')", "42000")

    def use(self, name: str) -> None:
        if name == self.m.database:
            self.reply(my.ok(status=self.status_flags()))
        else:
            self.m.counts["errors_to_clients"] += 1
            self.reply(self.bad_db(name))

    async def reset(self) -> None:
        """COM_RESET_CONNECTION: an open transaction is rolled back (its connections closed)."""
        if self.last_write is not None:
            with contextlib.suppress(Exception):
                await self.last_write
        if self.txn is not None:
            for backend, conn in self.txn.values():
                conn.close()
                backend.pool.release(conn)
            self.txn = None
            self.m.write_lock.release()

    async def query(self, payload: bytes) -> None:
        self.m.counts["units"] += 1
        text = payload[1:].decode("utf-8", "replace")
        m = _USE.match(text)
        if m:
            self.use(m.group(1))
            return
        if _SET_NAMES.match(text):
            self.reply(my.ok(status=self.status_flags()))
            return
        if _SOCKET.match(text):
            self.writer.write(my.text_result("@@socket", [""], self.status_flags()))
            return
        kind = self.m.classify(text)
        try:
            if self.txn is not None:  # inside a transaction every unit runs on all its backends
                self.m.counts["transaction_units"] += 1
                await self.write(payload)
            elif kind == sqlmod.READ:
                await self.read(payload, self.m.label([text]) if self.m.track else None)
            else:
                await self.write(payload)
        except NoBackend as err:
            self.m.counts["errors_to_clients"] += 1
            self.reply(my.err(my.ER_UNKNOWN_ERROR, str(err), "08S01"))

    # --- prepared statements -----------------------------------------------------------------
    async def stmt_prepare(self, sql: bytes) -> None:
        """Prepare on one backend (chosen like a read; inside a transaction on its first pinned
        connection) and answer with the session's own statement id; every other connection that
        executes the statement prepares it first (`execute`)."""
        self.m.counts["named_statements"] += 1
        try:
            if self.txn is not None:
                backend, conn = next(iter(self.txn.values()))
                assert isinstance(conn, MySQLBackendConnection)
                packets, sid, error = await conn.prepare(sql)
            else:
                while True:
                    backend = self.m.choose_read()
                    try:
                        conn = await self.m.acquire(backend)
                    except BackendError as err:
                        self.m.disable(backend, f"prepare failed: {err}")
                        continue
                    assert isinstance(conn, MySQLBackendConnection)
                    try:
                        packets, sid, error = await conn.prepare(sql)
                    except (OSError, asyncio.IncompleteReadError, my.ProtocolError, IndexError) as err:
                        conn.close()
                        backend.pool.release(conn)
                        self.m.disable(backend, f"prepare failed: {err!r}")
                        continue
                    backend.pool.release(conn)
                    break
        except NoBackend as err:
            self.m.counts["errors_to_clients"] += 1
            self.reply(my.err(my.ER_UNKNOWN_ERROR, str(err), "08S01"))
            return
        if sid is None:
            self.m.counts["errors_to_clients"] += 1
            self.writer.write(b"".join(my.packet(q, pl) for q, pl in packets))
            return
        first = packets[0][1]
        cid = self.next_stmt
        self.next_stmt += 1
        _, columns, params = struct.unpack_from("<IHH", first, 1)
        text = sql.decode("utf-8", "replace")
        self.stmts[cid] = PStmt(sql, text, params, columns, self.m.classify(text))
        packets[0] = (packets[0][0], first[:1] + struct.pack("<I", cid) + first[5:])
        self.writer.write(b"".join(my.packet(q, pl) for q, pl in packets))

    async def stmt_execute(self, payload: bytes) -> None:
        cid = struct.unpack_from("<I", payload, 1)[0] if len(payload) >= 10 else -1
        st = self.stmts.get(cid)
        problem = None
        if st is None:
            problem = my.err(
                ER_UNKNOWN_STMT_HANDLER, f"Unknown prepared statement handler ({cid}) given to mysqld_stmt_execute"
            )
        elif payload[5]:
            problem = my.err(my.ER_NOT_SUPPORTED_YET, CURSORS_UNSUPPORTED, "42000")
        elif st.long_data:
            problem = my.err(my.ER_NOT_SUPPORTED_YET, LONG_DATA_UNSUPPORTED, "42000")
        if problem is not None:
            self.m.counts["errors_to_clients"] += 1
            self.reply(problem)
            return
        assert st is not None  # else a problem above
        body = payload[5:]  # flags, iteration count, then the parameters
        if st.params:
            nb = (st.params + 7) // 8
            at = 5 + nb  # the new-params-bound flag
            if body[at : at + 1] == b"\x01":
                st.types = body[at + 1 : at + 1 + 2 * st.params]
            elif st.types is not None:  # this backend connection may not have seen the types: send them again
                body = body[:at] + b"\x01" + st.types + body[at + 1 :]
        self.m.counts["units"] += 1
        unit = (st, body)
        try:
            if self.txn is not None:
                self.m.counts["transaction_units"] += 1
                await self.write(unit)
            elif st.kind == sqlmod.READ:
                await self.read(unit, self.m.label([st.text]) if self.m.track else None)
            else:
                await self.write(unit)
        except NoBackend as err:
            self.m.counts["errors_to_clients"] += 1
            self.reply(my.err(my.ER_UNKNOWN_ERROR, str(err), "08S01"))

    def stmt_other(self, cmd: int, payload: bytes) -> None:
        """COM_STMT_CLOSE and COM_STMT_SEND_LONG_DATA (no answer), COM_STMT_RESET (OK)."""
        cid = struct.unpack_from("<I", payload, 1)[0] if len(payload) >= 5 else -1
        if cmd == my.COM_STMT_CLOSE:
            self.stmts.pop(cid, None)  # the backends keep it prepared for the next client of that text
        elif cmd == my.COM_STMT_SEND_LONG_DATA:
            if cid in self.stmts:
                self.stmts[cid].long_data = True
        elif cid in self.stmts:
            self.stmts[cid].long_data = False
            self.reply(my.ok(status=self.status_flags()))
        else:
            self.m.counts["errors_to_clients"] += 1
            self.reply(
                my.err(
                    ER_UNKNOWN_STMT_HANDLER, f"Unknown prepared statement handler ({cid}) given to mysqld_stmt_reset"
                )
            )

    # --- the routing interface ---------------------------------------------------------------
    def outgoing(self, unit, macros_at: datetime | None) -> MyOutgoing:
        """`unit` is a COM_QUERY payload or (statement, execute body) for COM_STMT_EXECUTE."""
        if isinstance(unit, tuple):
            st, body = unit
            out = MyOutgoing(None, [True], stmt=st, body=body)
            text = st.text
        else:
            out = MyOutgoing(my.packet(0, unit), [True])
            text = unit[1:].decode("utf-8", "replace") if macros_at is not None else ""
        if macros_at is not None:
            n = time_functions(text)
            if n:
                self.m.counts["macros_rewritten"] += n
                out.pre = my.packet(0, b"\x03SET timestamp = %.6f" % macros_at.timestamp())
                out.post = my.packet(0, b"\x03SET timestamp = DEFAULT")
                out.passed = [False, True, False]
        return out

    async def execute(self, backend: Backend, conn: BackendConnection, out: MyOutgoing, sink=None) -> Result:
        """Send the unit's commands on one connection and read their answers; the client's bytes go
        to `sink` as they come (or into the Result)."""
        res = Result(backend, conn)
        emit = sink if sink is not None else res.replies.append
        try:
            if out.stmt is not None:
                assert isinstance(conn, MySQLBackendConnection)
                sid = conn.stmts.get(out.stmt.sql)
                if sid is None:  # first time on this connection: prepare it here (one more round trip)
                    packets, sid, error = await conn.prepare(out.stmt.sql)
                    if sid is None:
                        res.ok, res.error, res.status = False, error, conn.status
                        emit(my.packet(1, packets[0][1]))
                        return res
                else:
                    conn.stmts.move_to_end(out.stmt.sql)
                query = my.packet(0, bytes((my.COM_STMT_EXECUTE,)) + struct.pack("<I", sid) + out.body)
            else:
                assert out.query is not None  # a unit is a query or a statement's execute
                query = out.query
            conn.send(out.pre + query + out.post if out.pre else query)
            buf, pos, run = conn.buf, 0, -1  # run: where the bytes not yet passed on begin
            for passed in out.passed:
                r = my.Response()
                while not r.done:
                    need = 0
                    if len(buf) - pos >= 4:
                        n = buf[pos] | buf[pos + 1] << 8 | buf[pos + 2] << 16
                        end = pos + 4 + n
                        if end <= len(buf):
                            first = buf[pos + 4] if n else -1
                            r.feed(first, n, buf[pos + 4 : end] if first in (0, 0xFF, 0xFE) or r.state != 3 else b"")
                            if passed and run < 0:
                                run = pos
                            pos = end
                            continue
                        need = end - len(buf)
                    if run >= 0:
                        emit(buf[run:pos])
                        run = -1
                    conn.buf = buf[pos:]
                    buf, pos = await conn.more(need), 0
                if run >= 0:
                    emit(buf[run:pos])
                    run = -1
                if r.status is not None:
                    conn.status = idle_status(r.status)
                if passed:
                    res.ok = res.ok and r.ok
                    res.error = res.error or r.error
                    res.tags += r.tags
                elif not r.ok:  # the proxy's own command failed: the unit cannot be trusted
                    raise BackendError(f"the middleware's own command failed: {r.error}")
            conn.buf = buf[pos:]
            res.status = conn.status
        except (OSError, asyncio.IncompleteReadError, my.ProtocolError, BackendError, IndexError) as err:
            res.ok, res.broken = False, True
            res.error = f"connection to {backend.name} failed: {err!r}"
            conn.close()
        return res


async def serve(manager: RequestManager, host: str, port: int) -> asyncio.AbstractServer:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            import socket

            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await MySQLSession(manager, reader, writer).run()

    return await asyncio.start_server(handle, host, port, backlog=1024, reuse_address=True)


PASSWORD_ENV = "TIERSCOPE_MIDDLEWARE_PASSWORD"


def password_from_env() -> str:
    return os.environ.get(PASSWORD_ENV, "")
