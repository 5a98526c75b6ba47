"""What both protocol front ends share: the routing of a client's units of work over the backends.

A protocol session (the PostgreSQL one in `server`, the MySQL one in `mysql_server`) subclasses
`RoutingSession` and provides the protocol-specific parts of this small interface:

- `outgoing(unit, macros_at)`: what to send one backend connection for a unit (with the time macros
  fixed to the instant `macros_at` for a write; None for a read), the same object for every backend;
- `execute(backend, conn, out, sink=None)`: send it on one connection and read the complete answer
  into a `Result` (the client's bytes passed to `sink` as they come, or kept in `Result.replies`),
  with `Result.status` b"I" when the connection is idle (no transaction, autocommit) afterwards;
- `run()`: the client's side of the connection, calling `read(unit)` or `write(unit)` per unit.

Shared here: the read balancing (by the manager's policy, with retries elsewhere when a backend
fails), the write broadcast under the database-wide write lock, pinned transactions, answering by
the wait policy, disabling backends that fail or disagree, and the counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from tierscope.middleware.manager import Backend, NoBackend, RequestManager
from tierscope.middleware.pool import BackendConnection, BackendError

if TYPE_CHECKING:
    from tierscope.middleware.server import OpenUnit


@dataclass
class Result:
    """One backend's complete answer to a unit."""

    backend: Backend
    conn: BackendConnection | None
    replies: list[bytes] = field(default_factory=list)
    ok: bool = True  # no ErrorResponse
    error: str | None = None
    tags: list[str] = field(default_factory=list)
    status: bytes = b"I"
    broken: bool = False  # the connection failed (not an SQL error)


class RoutingSession:
    """One client connection: the protocol-independent routing (see the module docstring)."""

    def __init__(self, manager: RequestManager, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.m = manager
        self.reader = reader
        self.writer = writer
        self.txn: dict[str, tuple[Backend, BackendConnection]] | None = None  # pinned, lock held
        self.last_write: asyncio.Task | None = None
        self.open: OpenUnit | None = None  # a unit the client flushed before its end (the PostgreSQL pipeline mode)

    # --- the protocol's part -----------------------------------------------------------------
    def outgoing(self, unit, macros_at: datetime | None):
        raise NotImplementedError

    async def execute(self, backend: Backend, conn: BackendConnection, out, sink=None) -> Result:
        raise NotImplementedError

    # --- shared ------------------------------------------------------------------------------
    def status(self) -> bytes:
        return b"T" if self.txn else b"I"

    async def end(self) -> None:
        if self.last_write is not None:
            with contextlib.suppress(Exception):
                await self.last_write
        if self.open is not None:  # the client left in the middle of a flushed unit
            ou, self.open = self.open, None
            self.abandon(ou.lease)
            self.writes_over(ou.lease)
        elif self.txn is not None:  # the client left inside a transaction: roll it back by closing
            for backend, conn in self.txn.values():
                conn.close()
                backend.pool.release(conn)
            self.txn = None
            self.m.write_lock.release()
        with contextlib.suppress(Exception):
            self.writer.close()

    async def read(self, unit, label: str | None = None) -> None:
        out = self.outgoing(unit, None)
        while True:
            backend = self.m.choose_read(label)
            token = self.m.read_begin(backend, label)
            started = backend.writes_started
            client_saw = False
            held: list[bytes] = []
            held_bytes = 0

            # one socket write per 64 KiB, not per message; called only within this iteration (B023)
            def sink(data: bytes) -> None:
                nonlocal client_saw, held_bytes
                held.append(data)  # noqa: B023
                held_bytes += len(data)
                if held_bytes >= 65536:
                    client_saw = True
                    self.writer.write(b"".join(held))  # noqa: B023
                    held.clear()  # noqa: B023
                    held_bytes = 0

            try:
                await backend.wait_for_writes(started)
                if not backend.enabled:  # disabled by the write it waited for: choose again
                    continue
                try:
                    conn = await self.m.acquire(backend)
                except BackendError as err:
                    self.m.disable(backend, f"read failed: {err}")
                    self.m.counts["read_retries"] += 1
                    continue
                t0 = time.perf_counter()
                res = await self.execute(backend, conn, out, sink)
                backend.pool.release(conn)
                if not res.broken:
                    self.m.read_done(backend, time.perf_counter() - t0, label)
                if res.broken and conn.reused and not client_saw:
                    # an idle pooled connection may have gone stale: once more on a new one
                    backend.pool.drop_idle()
                    held.clear()
                    held_bytes = 0
                    try:
                        conn = await self.m.acquire(backend)
                    except BackendError:
                        pass
                    else:
                        res = await self.execute(backend, conn, out, sink)
                        backend.pool.release(conn)
                if not res.broken and held:
                    self.writer.write(b"".join(held))
            finally:
                backend.pending -= 1
                self.m.read_end(backend, token)
            backend.reads += 1
            self.m.counts["reads"] += 1
            if res.broken:
                self.m.disable(backend, f"read failed: {res.error}")
                if client_saw:  # part of the answer is out: the client connection cannot continue
                    raise ConnectionError(res.error)
                self.m.counts["read_retries"] += 1
                continue
            if not res.ok:
                self.m.counts["errors_to_clients"] += 1
            return

    async def lease_for_write(self) -> tuple[list[tuple[Backend, BackendConnection]], bool]:
        """A connection on every enabled backend with the write lock held (or the transaction's
        pinned connections); returns (lease, pinned)."""
        if self.txn is not None:
            return list(self.txn.values()), True
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await self.m.write_lock.acquire()
        self.m.counts["write_lock_wait_s"] += loop.time() - t0
        try:
            lease = []
            targets = self.m.enabled()
            if not targets:
                raise NoBackend("no database backend is enabled")
            conns = await asyncio.gather(*(self.m.acquire(b) for b in targets), return_exceptions=True)
            for b, c in zip(targets, conns):
                if isinstance(c, BaseException):
                    self.m.disable(b, f"write failed: cannot get a connection: {c}")
                else:
                    lease.append((b, c))
            if not lease:
                raise NoBackend("no database backend could be reached for a write")
        except BaseException:
            self.m.write_lock.release()
            raise
        return lease, False

    async def write(self, unit) -> None:
        lease, pinned = await self.lease_for_write()
        out = self.outgoing(unit, datetime.now(UTC))
        self.m.counts["writes"] += 1
        answer: asyncio.Future = asyncio.get_running_loop().create_future()
        self.last_write = asyncio.create_task(self.broadcast(lease, out, answer))
        self.m.inflight.add(self.last_write)
        self.last_write.add_done_callback(self.m.inflight.discard)
        chosen: Result = await answer
        self.writer.write(b"".join(chosen.replies))
        if not chosen.ok:
            self.m.counts["errors_to_clients"] += 1
        if chosen.status != b"I" or pinned:
            await self.last_write  # a transaction: its connections and the lock stay with it

    def writes_begin(self, lease: list[tuple[Backend, BackendConnection]]) -> None:
        for b, _ in lease:
            b.pending += 1
            b.writes_started += 1

    def writes_end(self, backend: Backend) -> None:
        backend.pending -= 1
        backend.writes += 1

    def writes_over(self, lease: list[tuple[Backend, BackendConnection]]) -> None:
        """A write unit is over on every leased backend (after settling who is disabled)."""
        for b, _ in lease:
            self.writes_end(b)
            b.write_finished()

    async def broadcast(self, lease: list[tuple[Backend, BackendConnection]], out, answer: asyncio.Future) -> None:
        """Run a write unit on every leased backend; answer the client by the wait policy (the first
        backend to succeed, or all), then settle the unit."""
        finished_here: set[str] = set()
        try:
            self.writes_begin(lease)

            async def one(b: Backend, c: BackendConnection) -> Result:
                try:
                    r = await self.execute(b, c, out)
                finally:
                    self.writes_end(b)
                if r.ok:  # reads waiting for this write on b may go; after a failure, settle first
                    finished_here.add(b.name)
                    b.write_finished()
                return r

            tasks = [asyncio.create_task(one(b, c)) for b, c in lease]
            by_task = {t: i for i, t in enumerate(tasks)}
            done_results: dict[int, Result] = {}
            pending = set(tasks)
            while pending:
                finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                now_ok = []
                for t in finished:
                    i = by_task[t]
                    done_results[i] = t.result()
                    if done_results[i].ok:
                        now_ok.append(i)
                if self.m.wait == "first" and not answer.done() and now_ok:  # the first to succeed
                    answer.set_result(done_results[min(now_ok)])
            results = [done_results[i] for i in range(len(tasks))]
            chosen = answer.result() if answer.done() else None
            chosen = self.settle(results, chosen)
            for b, _ in lease:
                if b.name not in finished_here:
                    finished_here.add(b.name)
                    b.write_finished()
            if not answer.done():
                answer.set_result(chosen)
        except BaseException as err:
            for b, _ in lease:
                if b.name not in finished_here:
                    b.write_finished()
            self.abandon(lease)
            if not answer.done():
                answer.set_exception(err if isinstance(err, Exception) else NoBackend(str(err)))
            raise

    def settle(self, results: list[Result], chosen: Result | None) -> Result:
        """After a write unit ran on every leased backend: disable the backends that failed where
        another succeeded (or whose result differs), then either keep the connections and the lock
        for the open transaction or give them back. Returns the result that answers the client."""
        ok = [r for r in results if r.ok]
        if chosen is None:
            chosen = ok[0] if ok else next((r for r in results if not r.broken), results[0])
        if ok:
            for r in results:
                if not r.ok:
                    r.backend.failed_writes += 1
                    self.m.disable(r.backend, f"write failed where {chosen.backend.name} succeeded: {r.error}")
                elif r.tags != chosen.tags:
                    self.m.disable(
                        r.backend, f"write result {r.tags} differs from {chosen.backend.name}'s {chosen.tags}"
                    )
        elif all(r.broken for r in results):
            for r in results:
                self.m.disable(r.backend, f"write failed: {r.error}")
        alive = [r for r in results if r.backend.enabled and r.conn is not None and not r.broken]
        in_txn = any(r.status != b"I" for r in alive)
        for r in results:
            if r.conn is not None and not (in_txn and r in alive):
                if in_txn:
                    r.conn.close()  # a backend dropped from the transaction
                r.backend.pool.release(r.conn)
        if in_txn:
            self.txn = {r.backend.name: (r.backend, r.conn) for r in alive if r.conn is not None}  # all of alive
        else:
            self.txn = None
            self.m.write_lock.release()
        return chosen

    def abandon(self, lease: list[tuple[Backend, BackendConnection]]) -> None:
        """Something unexpected broke a write: close its connections and free the lock."""
        for b, c in lease:
            c.close()
            b.pool.release(c)
        self.txn = None
        if self.m.write_lock.locked():
            self.m.write_lock.release()
