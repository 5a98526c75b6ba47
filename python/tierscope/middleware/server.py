"""Client sessions: the PostgreSQL front end of the middleware (the routing shared with the MySQL
front end is `routing.RoutingSession`).

A unit of work is one simple Query, or the extended-protocol messages up to and including Sync.
Named prepared statements are kept by the proxy (per client session) and run on the backends as
the unnamed statement, so any pooled backend connection can serve any unit.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import random
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from tierscope.middleware import scram, wire
from tierscope.middleware import sql as sqlmod
from tierscope.middleware.manager import Backend, NoBackend, RequestManager, log
from tierscope.middleware.pool import RECV_SIZE, BackendConnection, BackendError
from tierscope.middleware.replies import HIDE, PASS, ReplyPlan
from tierscope.middleware.routing import Result, RoutingSession

_DEALLOCATE = re.compile(r"^\s*DEALLOCATE\s+(?:PREPARE\s+)?(ALL|\"?[A-Za-z0-9_$]+\"?)\s*;?\s*$", re.IGNORECASE)
_session_ids = itertools.count(1)
_parse = functools.lru_cache(maxsize=4096)(wire.Parse.decode)  # a unit's Parse is read 2-3 times
_UNIT_PARTS = frozenset((wire.PARSE, wire.BIND, wire.DESCRIBE, wire.EXECUTE, wire.CLOSE))
_NOTED = frozenset((wire.ERROR, wire.COMMAND_COMPLETE, wire.READY))  # replies the proxy reads itself


@dataclass
class Outgoing:
    """What to send a backend for one unit and what to expect back."""

    data: bytes
    plan: list[tuple]  # ("sent", kind, mode, target) or ("here", encoded answer)
    unnamed: object = None  # the Parse the backend's unnamed statement holds afterwards

    def reply_plan(self, p: ReplyPlan | None = None) -> ReplyPlan:
        p = p if p is not None else ReplyPlan()
        for step in self.plan:
            if step[0] == "sent":
                p.sent(step[1], step[2], step[3])
            else:
                p.answered_here(step[1])
        return p


class Session(RoutingSession):
    """One client connection speaking the PostgreSQL protocol."""

    def __init__(self, manager: RequestManager, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        super().__init__(manager, reader, writer)
        self.id = next(_session_ids)
        self.statements: dict[str, wire.Parse] = {}
        self.unnamed: wire.Parse | None = None
        self.open: OpenUnit | None = None  # a unit the client flushed before its Sync

    # --- front end ---------------------------------------------------------------------------
    async def run(self) -> None:
        self.m.counts["sessions"] += 1
        try:
            if not await self.startup():
                return
            unit: list[wire.Message] = []
            buf, pos = b"", 0  # what the client sent and the proxy has not read yet (read in bulk)
            while True:
                if len(buf) - pos < 5:
                    chunk = await self.reader.read(RECV_SIZE)
                    if not chunk:
                        raise asyncio.IncompleteReadError(buf[pos:], None)
                    buf, pos = buf[pos:] + chunk if pos < len(buf) else chunk, 0
                    continue
                end = pos + 5 + wire.header_length(buf, pos)
                if end > len(buf):  # the rest of a long message, at once
                    buf, end, pos = buf[pos:] + await self.reader.readexactly(end - len(buf)), end - pos, 0
                msg = wire.Message(buf[pos : pos + 1], buf[pos + 5 : end])
                pos = end
                if msg.kind == wire.TERMINATE:
                    return
                if msg.kind in _UNIT_PARTS:  # nothing to answer yet: the unit goes on
                    unit.append(msg)
                    continue
                if msg.kind == wire.QUERY and self.open is None:
                    await self.dispatch([msg])
                elif msg.kind == wire.QUERY:
                    await self.open_step(unit + [msg], last=True)
                    unit = []
                elif msg.kind in wire.EXTENDED:
                    unit.append(msg)
                    if msg.kind == wire.SYNC and self.open is not None:
                        await self.open_step(unit, last=True)
                        unit = []
                    elif msg.kind == wire.SYNC:
                        await self.dispatch(unit)
                        unit = []
                    elif msg.kind == wire.FLUSH and self.open is None and len(unit) == 1:
                        unit = []  # nothing is waiting to be flushed
                    elif msg.kind == wire.FLUSH:
                        try:
                            if self.open is None:
                                await self.open_begin()
                        except NoBackend as err:
                            self.writer.write(wire.error(str(err), "08006"))
                            unit = []
                            continue
                        await self.open_step(unit, last=False)
                        unit = []
                else:
                    self.writer.write(
                        wire.error(f"message type {msg.kind!r} is not supported by the middleware", "0A000")
                        + wire.ready(self.status())
                    )
                await self.writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, wire.ProtocolError) as err:
            if isinstance(err, wire.ProtocolError):
                log(f"session {self.id}: {err}")
        except Exception as err:  # one client's trouble must not stop the others
            log(f"session {self.id}: closed after an unexpected error: {err!r}")
        finally:
            await self.end()

    async def startup(self) -> bool:
        while True:
            head = await self.reader.readexactly(4)
            n = int.from_bytes(head, "big")
            if n < 8 or n > 10000:
                raise wire.ProtocolError(f"bad startup packet length {n}")
            code, params = wire.parse_startup(await self.reader.readexactly(n - 4))
            if code in (wire.SSL_REQUEST, wire.GSSENC_REQUEST):
                self.writer.write(b"N")
                await self.writer.drain()
                continue
            if code == wire.CANCEL_REQUEST:  # not forwarded: the request runs to its end
                return False
            if code != wire.PROTOCOL_V3:
                self.writer.write(wire.error(f"unsupported protocol {code >> 16}.{code & 0xFFFF}", "0A000", "FATAL"))
                return False
            break
        if not await self.authenticate(params.get("user", "")):
            return False
        db = params.get("database") or params.get("user")
        if db != self.m.database:
            self.writer.write(
                wire.error(
                    f'database "{db}" does not exist (this middleware serves "{self.m.database}")', "3D000", "FATAL"
                )
            )
            return False
        out = [wire.auth_ok()]
        for k, v in self.m.parameters.items():
            out.append(wire.parameter_status(k, v))
        out.append(wire.backend_key(self.id, random.getrandbits(31)))
        out.append(wire.ready(b"I"))
        self.writer.write(b"".join(out))
        await self.writer.drain()
        return True

    async def authenticate(self, user: str) -> bool:
        """SCRAM-SHA-256 with the lab's user and password (the backends'): True when the client
        proved it knows them; otherwise a FATAL 28P01 error is sent and False returned."""

        def refuse() -> bool:
            self.writer.write(wire.error(f'password authentication failed for user "{user}"', "28P01", "FATAL"))
            return False

        async def response() -> bytes:
            kind = await self.reader.readexactly(1)
            n = int.from_bytes(await self.reader.readexactly(4), "big")
            if kind != wire.PASSWORD or not 4 <= n <= 10000:
                raise scram.ScramError(f"expected a SASL response, got message {kind!r}")
            return await self.reader.readexactly(n - 4)

        if not self.m.password:
            return refuse()  # a middleware without a password lets no one in
        server = scram.ScramServer(self.m.scram_verifier())
        try:
            self.writer.write(wire.auth_sasl([scram.MECHANISM]))
            await self.writer.drain()
            mechanism, first = wire.parse_sasl_initial(await response())
            if mechanism != scram.MECHANISM:
                raise scram.ScramError(f"unsupported SASL mechanism {mechanism!r}")
            self.writer.write(wire.auth_sasl_step(scram.SASL_CONTINUE, server.first(first)))
            await self.writer.drain()
            final = server.final(await response())
        except (scram.ScramError, wire.ProtocolError) as err:
            log(f"session {self.id}: authentication failed: {err}")
            return refuse()
        if user != self.m.user:  # checked after the exchange, so the answer does not tell which was wrong
            log(f"session {self.id}: authentication failed: user {user!r}")
            return refuse()
        self.writer.write(wire.auth_sasl_step(scram.SASL_FINAL, final))
        return True

    # --- units of work -----------------------------------------------------------------------
    async def dispatch(self, unit: list[wire.Message]) -> None:
        self.m.counts["units"] += 1
        if unit[0].kind == wire.QUERY and self.deallocate(wire.query_text(unit[0].body)):
            return
        if self.local_only(unit):
            return
        texts = self.texts(unit)
        kinds = [self.m.classify(t) for t in texts]
        if sqlmod.COPY in kinds:
            self.m.counts["errors_to_clients"] += 1
            self.writer.write(
                wire.error(
                    "COPY is not supported by the middleware (run it on every database server directly)", "0A000"
                )
                + wire.ready(self.status())
            )
            return
        kind = sqlmod.WRITE if sqlmod.WRITE in kinds else sqlmod.READ
        try:
            if self.txn is not None:  # inside a transaction every unit runs on all its backends
                self.m.counts["transaction_units"] += 1
                await self.write(unit)
            elif kind == sqlmod.READ:
                await self.read(unit, self.m.label(texts) if self.m.track and texts else None)
            else:
                await self.write(unit)
        except NoBackend as err:
            self.m.counts["errors_to_clients"] += 1
            self.writer.write(wire.error(str(err), "08006") + wire.ready(self.status()))

    def local_only(self, unit: list[wire.Message]) -> bool:
        """A unit that only prepares or closes named statements (psycopg's PQsendPrepare) is
        answered here: the proxy keeps named statements itself, no backend is involved."""
        answers: list[tuple[wire.Parse | wire.Target, bytes]] = []
        for msg in unit:
            if msg.kind == wire.PARSE:
                p = _parse(msg.body)
                if not p.name:
                    return False
                answers.append((p, wire.frame(wire.PARSE_COMPLETE, b"")))
            elif msg.kind == wire.CLOSE:
                t = wire.Target.decode(msg.body)
                if t.what != "S" or not t.name:
                    return False
                answers.append((t, wire.frame(wire.CLOSE_COMPLETE, b"")))
            elif msg.kind not in (wire.SYNC, wire.FLUSH):
                return False
        for what, _ in answers:
            if isinstance(what, wire.Parse):
                self.statements[what.name] = what
                self.m.counts["named_statements"] += 1
            else:
                self.statements.pop(what.name, None)
        self.writer.write(b"".join(a for _, a in answers) + wire.ready(self.status()))
        return True

    def deallocate(self, text: str) -> bool:
        """DEALLOCATE of a statement the proxy keeps is answered here."""
        m = _DEALLOCATE.match(text)
        if not m:
            return False
        name = m.group(1).strip('"')
        if name.upper() == "ALL":
            self.statements.clear()
            tag = "DEALLOCATE ALL"
        else:
            if self.statements.pop(name, None) is None:
                self.writer.write(
                    wire.error(f'prepared statement "{name}" does not exist', "26000") + wire.ready(self.status())
                )
                return True
            tag = "DEALLOCATE"
        self.writer.write(wire.command_complete(tag) + wire.ready(self.status()))
        return True

    def texts(self, unit: list[wire.Message]) -> list[str]:
        """The SQL the unit runs (statements named in Bind/Describe included)."""
        out = []
        unnamed = self.unnamed
        for msg in unit:
            if msg.kind == wire.QUERY:
                out.append(wire.query_text(msg.body))
            elif msg.kind == wire.PARSE:
                p = _parse(msg.body)
                out.append(p.sql)
                if not p.name:
                    unnamed = p
            elif msg.kind == wire.BIND:
                name = wire.Bind.decode(msg.body).statement
                stmt = self.statements.get(name) if name else unnamed
                if stmt is not None:
                    out.append(stmt.sql)
        return out

    def outgoing(self, unit: list[wire.Message], macros_at: datetime | None, slot: object = None) -> Outgoing:
        """The bytes for a backend connection and the reply plan (the same for every backend).
        `slot` is the Parse the backend's unnamed statement holds before (None: unknown)."""
        parts: list[bytes] = []
        plan: list[tuple] = []

        def text(p: wire.Parse) -> wire.Parse:
            if macros_at is None:
                return p
            new, n = sqlmod.rewrite_macros(p.sql, macros_at)
            self.m.counts["macros_rewritten"] += n
            return p._replace(sql=new) if n else p

        def load(p: wire.Parse | None) -> None:
            nonlocal slot
            if p is not None and slot is not p:
                parts.append(text(p)._replace(name="").encode())
                plan.append(("sent", wire.PARSE, HIDE, ""))
                slot = p

        for msg in unit:
            k = msg.kind
            if k == wire.QUERY:
                if macros_at is None:
                    parts.append(msg.encode())
                else:
                    q, n = sqlmod.rewrite_macros(wire.query_text(msg.body), macros_at)
                    self.m.counts["macros_rewritten"] += n
                    parts.append(wire.query(q) if n else msg.encode())
                plan.append(("sent", wire.QUERY, PASS, ""))
            elif k == wire.PARSE:
                p = _parse(msg.body)
                if p.name:
                    self.statements[p.name] = p
                    self.m.counts["named_statements"] += 1
                    plan.append(("here", wire.frame(wire.PARSE_COMPLETE, b"")))
                else:
                    self.unnamed = p
                    parts.append(msg.encode() if macros_at is None else text(p).encode())
                    plan.append(("sent", wire.PARSE, PASS, ""))
                    slot = p
            elif k == wire.BIND:
                b = wire.Bind.decode(msg.body)
                target = self.statements.get(b.statement) if b.statement else self.unnamed
                if b.statement and target is None:  # let the backend report the unknown name
                    parts.append(msg.encode())
                else:
                    load(target)
                    parts.append(b._replace(statement="").encode() if b.statement else msg.encode())
                plan.append(("sent", wire.BIND, PASS, ""))
            elif k in (wire.DESCRIBE, wire.CLOSE):
                t = wire.Target.decode(msg.body)
                if t.what == "S" and t.name:
                    stmt = self.statements.get(t.name)
                    if k == wire.CLOSE:
                        self.statements.pop(t.name, None)
                        plan.append(("here", wire.frame(wire.CLOSE_COMPLETE, b"")))
                        continue
                    if stmt is None:
                        parts.append(msg.encode())
                    else:
                        load(stmt)
                        parts.append(wire.Target("S", "").encode(wire.DESCRIBE))
                    plan.append(("sent", k, PASS, "S"))
                    continue
                if t.what == "S" and k == wire.DESCRIBE:
                    load(self.unnamed)
                parts.append(msg.encode())
                plan.append(("sent", k, PASS, t.what))
            else:  # Execute, Flush, Sync
                parts.append(msg.encode())
                if k != wire.FLUSH:
                    plan.append(("sent", k, PASS, ""))
        return Outgoing(b"".join(parts), plan, slot)

    async def execute(
        self, backend: Backend, conn: BackendConnection, out: Outgoing, sink=None, plan: ReplyPlan | None = None
    ) -> Result:
        """Send a unit (or the part of it up to a Flush, continuing `plan`) on one connection and
        read the answers due; with `sink`, the answers the client must see are passed to it as
        they come, else they are kept in the Result."""
        res = Result(backend, conn)
        plan = out.reply_plan(plan)

        def emit(data: bytes) -> None:
            if sink is not None:
                sink(data)
            else:
                res.replies.append(data)

        for early in plan.due_now():
            emit(early)
        try:
            conn.send(out.data)
            # the replies are parsed where they were received; consecutive replies the client sees
            # are passed on as one slice of the received bytes (not re-framed one by one)
            buf, pos, run = conn.buf, 0, -1  # run: where the replies not yet passed on begin
            reply = plan.reply
            while not plan.done:
                end = pos + 5 + wire.header_length(buf, pos) if len(buf) - pos >= 5 else 0
                if end and end <= len(buf):
                    kind = buf[pos : pos + 1]
                    passed, after = reply(kind)
                    if kind in _NOTED:
                        if kind == wire.ERROR:
                            res.ok = False
                            res.error = res.error or wire.error_text(buf[pos + 5 : end])
                        elif kind == wire.COMMAND_COMPLETE:
                            res.tags.append(wire.command_tag(buf[pos + 5 : end]))
                        else:
                            res.status = buf[pos + 5 : pos + 6]
                            conn.status = res.status
                    if passed:
                        if run < 0:
                            run = pos
                    elif run >= 0:
                        emit(buf[run:pos])
                        run = -1
                    if after:
                        if run >= 0:
                            emit(buf[run:end])
                            run = -1
                        for a in after:
                            emit(a)
                    pos = end
                    continue
                if run >= 0:
                    emit(buf[run:pos])
                    run = -1
                conn.buf = buf[pos:]
                buf, pos = await conn.more(end - len(buf) if end else 0), 0
            if run >= 0:
                emit(buf[run:pos])
            conn.buf = buf[pos:]
        except (OSError, asyncio.IncompleteReadError, wire.ProtocolError, BackendError) as err:
            res.ok, res.broken = False, True
            res.error = f"connection to {backend.name} failed: {err!r}"
            conn.close()
        return res

    # --- units the client flushes before Sync (pipeline mode) ---------------------------------
    async def open_begin(self) -> None:
        """A client that sends Flush and waits for replies before Sync: what comes later in the unit
        is unknown, so the unit runs like a write, on every backend under the write lock, answered
        by the first backend after all have replied to each part."""
        lease, pinned = await self.lease_for_write()
        self.writes_begin(lease)
        self.m.counts["writes"] += 1
        self.m.counts["flushed_units"] += 1
        self.open = OpenUnit(
            lease,
            pinned,
            datetime.now(UTC),
            {b.name: ReplyPlan() for b, _ in lease},
            {b.name: Result(b, c) for b, c in lease},
        )

    async def open_step(self, msgs: list[wire.Message], last: bool) -> None:
        ou = self.open
        assert ou is not None  # called only while a flushed unit is open
        out = self.outgoing(msgs, ou.macros_at, ou.slot)
        ou.slot = out.unnamed
        alive = [(b, c) for b, c in ou.lease if not ou.results[b.name].broken]
        try:
            steps = await asyncio.gather(*(self.execute(b, c, out, plan=ou.plans[b.name]) for b, c in alive))
        except BaseException:
            self.open = None
            self.abandon(ou.lease)
            self.writes_over(ou.lease)
            raise
        for step in steps:
            acc = ou.results[step.backend.name]
            acc.ok = acc.ok and step.ok
            acc.error = acc.error or step.error
            acc.broken = acc.broken or step.broken
            acc.status = step.status
            acc.tags += step.tags
        answering = next((st for st in steps if not st.broken), None)
        if answering is None or (ou.answering is not None and answering.backend is not ou.answering):
            self.open = None
            self.abandon(ou.lease)
            self.writes_over(ou.lease)
            raise ConnectionError("the backend answering a flushed unit failed mid-unit")
        ou.answering = answering.backend
        self.writer.write(b"".join(answering.replies))
        if last:
            self.open = None
            results = [ou.results[b.name] for b, _ in ou.lease]
            chosen = self.settle(results, ou.results[ou.answering.name])
            self.writes_over(ou.lease)
            if not chosen.ok:
                self.m.counts["errors_to_clients"] += 1


@dataclass
class OpenUnit:
    """A unit of work under way across several client flushes."""

    lease: list[tuple[Backend, BackendConnection]]
    pinned: bool
    macros_at: datetime
    plans: dict[str, ReplyPlan]
    results: dict[str, Result]
    slot: object = None
    answering: Backend | None = None


async def serve(manager: RequestManager, host: str, port: int) -> asyncio.AbstractServer:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            import socket

            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await Session(manager, reader, writer).run()

    return await asyncio.start_server(handle, host, port, backlog=1024, reuse_address=True)
