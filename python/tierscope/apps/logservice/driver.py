"""The log service's clients (seed 003): C clients, each posting R records one after the other
over its own keep-alive connection, each request with a timeout. Every record has a unique id
(`<run>-<client>-<n>`), so what the database holds can be compared record by record with what
was sent and acknowledged.

One outcome row per record: id, client, sent_ns, done_ns, status (the HTTP status; TIMEOUT when
no answer came within the timeout, the connection is then closed and the next record goes on a
new one; CONNECTION_ERROR when the connection failed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tierscope.apps.logservice.schema import read_tokens

TIMEOUT, CONNECTION_ERROR = 0, -1

OUTCOMES = pa.schema(
    [
        ("id", pa.string()),
        ("client", pa.int32()),
        ("sent_ns", pa.int64()),
        ("done_ns", pa.int64()),
        ("status", pa.int16()),
    ]
)


@dataclass(frozen=True)
class Load:
    clients: int = 200
    records: int = 20  # per client
    timeout_s: float = 5.0
    start_spread_s: float = 1.0  # clients start spread evenly over this time
    message_bytes: int = 200
    run: str = "r"

    def __post_init__(self):
        if self.clients < 1 or self.records < 1:
            raise ValueError("clients and records: expected >= 1")
        if self.timeout_s <= 0 or self.start_spread_s < 0 or self.message_bytes < 0:
            raise ValueError("timeout_s > 0, start_spread_s >= 0 and message_bytes >= 0 expected")

    @property
    def total(self) -> int:
        return self.clients * self.records


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    if length:
        await reader.readexactly(length)
    return status


async def _client(
    n: int, load: Load, host: str, port: int, token: str, delay: float, out: list, done: Callable[[], None]
) -> None:
    await asyncio.sleep(delay)
    auth = f"Bearer {token}"
    message = "x" * load.message_bytes
    conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    for i in range(load.records):
        rid = f"{load.run}-{n}-{i}"
        body = json.dumps({"id": rid, "level": 6, "message": message}).encode()
        req = (
            f"POST /log HTTP/1.1\r\nHost: {host}\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        sent = time.time_ns()
        try:
            if conn is None:
                conn = await asyncio.wait_for(asyncio.open_connection(host, port), load.timeout_s)
            conn[1].write(req)
            status = await asyncio.wait_for(_read_response(conn[0]), load.timeout_s - (time.time_ns() - sent) / 1e9)
        except TimeoutError:
            status = TIMEOUT
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, IndexError):
            status = CONNECTION_ERROR
        if status <= 0 and conn is not None:
            conn[1].close()
            conn = None
        out.append((rid, n, sent, time.time_ns(), status))
        done()
    if conn is not None:
        conn[1].close()


async def _drive(load: Load, host: str, port: int, tokens: dict[int, str], tick: Callable[[int], None]) -> list:
    out: list = []
    counter = [0]

    def done() -> None:
        counter[0] += 1
        if counter[0] % 500 == 0:
            tick(counter[0])

    step = load.start_spread_s / load.clients
    await asyncio.gather(
        *(
            _client(n, load, host, port, tokens[n], i * step, out, done)
            for i, n in enumerate(range(1, load.clients + 1))
        )
    )
    tick(counter[0])
    return out


def drive(
    load: Load, host: str, port: int, tokens: dict[int, str], tick: Callable[[int], None] = lambda n: None
) -> pa.Table:
    """Post `load.total` records to host:port, client n with `tokens[n]`; one outcome row per
    record (OUTCOMES)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, load.clients * 2 + 256))
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    rows = asyncio.run(_drive(load, host, port, tokens, tick))
    cols: list[Any] = list(zip(*rows)) if rows else [[]] * 5
    return pa.Table.from_arrays([pa.array(c, t.type) for c, t in zip(cols, OUTCOMES)], schema=OUTCOMES)


def acknowledged(outcomes: pa.Table) -> set[str]:
    """Ids of the records the service acknowledged (201)."""
    return set(outcomes.filter(pc.equal(outcomes["status"], 201))["id"].to_pylist())


def main(argv: list[str] | None = None) -> int:
    """`python -m tierscope.apps.logservice.driver --host H --port P --out F --tokens FILE --load JSON`
    (the experiment runs it inside the client host; the tokens come in a file, never on the
    command line, which every user can read)."""
    ap = argparse.ArgumentParser(description="Post log records to the log service; one outcome row per record.")
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--out", required=True, help="Parquet file of the outcomes")
    ap.add_argument("--tokens", required=True, help='the clients\' tokens, a JSON file {"1": "<token>", ...}')
    ap.add_argument("--load", default="{}", help='the Load as JSON, e.g. \'{"clients": 100, "records": 10}\'')
    args = ap.parse_args(argv)
    load = Load(**json.loads(args.load))

    table = drive(load, args.host, args.port, read_tokens(args.tokens))
    pq.write_table(table, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
