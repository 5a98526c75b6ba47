"""The table schemas: the contract between tierscope's stages (see docs/tables.md).

All times are integers in nanoseconds since the Unix epoch (`*_ns`); durations likewise.
Every stage writes and reads these as Parquet files.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

#: One row per request seen at one server (traced off the wire, imported, or simulated).
REQUESTS = pa.schema(
    [
        pa.field("tier", pa.string(), nullable=False),  # web, app, middleware, db (or a service name)
        pa.field("server", pa.string(), nullable=False),  # e.g. app1 or 10.0.0.3:8080
        pa.field("request_id", pa.string()),  # X-Request-Id / sqlcommenter / span id
        pa.field("parent_id", pa.string()),  # the request at the upstream tier that caused this one
        pa.field("label", pa.string()),  # page name, URL template or SQL fingerprint
        pa.field("arrival_ns", pa.int64(), nullable=False),  # first byte of the request seen
        pa.field("departure_ns", pa.int64(), nullable=False),  # last byte of the response seen
        pa.field("status", pa.string()),  # HTTP code, SQL error code or OK
        pa.field("bytes_in", pa.int64()),  # request bytes (client to server)
        pa.field("bytes_out", pa.int64()),  # response bytes (server to client)
        pa.field("client", pa.string()),  # client address:port
        pa.field("conn", pa.int64()),  # connection id within the source
        pa.field("source", pa.string()),  # trace, otlp, jaeger, zipkin, nginx, apache, simulate...
        # Filled by the passive tracer (null from other sources):
        pa.field("protocol", pa.string()),  # http, postgres, mysql
        pa.field("server_addr", pa.string()),
        pa.field("server_port", pa.int32()),
        pa.field("client_addr", pa.string()),
        pa.field("client_port", pa.int32()),
        pa.field("inferred", pa.bool_()),  # times or pairing inferred (see flags)
        pa.field("truncated", pa.bool_()),  # payload cut by the snapshot length: label is partial
        pa.field("flags", pa.string()),  # comma list: mid_stream, pipelined, delimited_by_turn, ...
        # Filled by cross-tier linking (tierscope.trace.link):
        pa.field("link", pa.string()),  # how parent_id was found: request_id, time_containment, ...
        pa.field("transaction", pa.string()),  # the root request's id (or row key) of this row's tree
        # Whose clock stamped arrival_ns and departure_ns: the process itself for its own requests
        # (SERVER spans, access logs: recorder == server), the calling process for a CLIENT span
        # standing for an uninstrumented callee; null when an outside observer stamped them (the
        # passive tracer on the wire, a simulator). A paused recorder stamps nothing (issue 26).
        pa.field("recorder", pa.string()),
    ]
)

#: The workload generator's own log: one row per request it sent.
CLIENT_REQUESTS = pa.schema(
    [
        pa.field("user", pa.int64(), nullable=False),
        pa.field("session", pa.int64(), nullable=False),
        pa.field("state", pa.string(), nullable=False),  # page (Markov state) name
        pa.field("path", pa.string()),  # URL path and query sent
        pa.field("intended_ns", pa.int64()),  # scheduled start: the arrival (open loop) or end of think (closed)
        pa.field("start_ns", pa.int64(), nullable=False),
        pa.field("first_byte_ns", pa.int64()),
        pa.field("end_ns", pa.int64(), nullable=False),
        pa.field("status", pa.int32()),  # HTTP status, 0 when no response
        pa.field("bytes", pa.int64()),  # response bytes
        pa.field("error", pa.string()),  # null, connect, timeout, reset, http5xx, marker, embedded, cancelled, other
        pa.field("phase", pa.string(), nullable=False),  # ramp_up, run, ramp_down
        pa.field("embedded", pa.int32()),  # images fetched with the page; null: fetching off or the page failed
        pa.field("embedded_bytes", pa.int64()),  # their response bytes on the wire
        pa.field("embedded_failed", pa.int32()),  # of those, no 2xx/3xx response
    ]
)

#: Resource samples, long and narrow: a new metric needs no schema change.
RESOURCES = pa.schema(
    [
        pa.field("ts_ns", pa.int64(), nullable=False),
        pa.field("host", pa.string(), nullable=False),
        pa.field("metric", pa.string(), nullable=False),  # e.g. cpu_user, cpu_system, mem_rss
        pa.field("value", pa.float64(), nullable=False),
        pa.field("unit", pa.string(), nullable=False),  # e.g. percent, bytes, ops_per_s
    ]
)

#: Things that happened to a host over an interval: gc, injected_pause, restart, failure...
EVENTS = pa.schema(
    [
        pa.field("start_ns", pa.int64(), nullable=False),
        pa.field("end_ns", pa.int64(), nullable=False),
        pa.field("host", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("detail", pa.string()),
    ]
)

SCHEMAS: dict[str, pa.Schema] = {
    "requests": REQUESTS,
    "client_requests": CLIENT_REQUESTS,
    "resources": RESOURCES,
    "events": EVENTS,
}


def empty(name: str) -> pa.Table:
    """An empty table with the named schema."""
    return SCHEMAS[name].empty_table()


def conform(table: pa.Table, name: str) -> pa.Table:
    """Cast `table` to the named schema (columns in contract order; missing nullable ones as nulls).

    Raises ValueError naming the first missing required column.
    """
    schema = SCHEMAS[name]
    columns = []
    for field in schema:
        if field.name in table.column_names:
            columns.append(table.column(field.name).cast(field.type))
        elif field.nullable:
            columns.append(pa.nulls(table.num_rows, field.type))
        else:
            raise ValueError(f"{name}: required column {field.name!r} is missing")
    return pa.Table.from_arrays(columns, schema=schema)


def write(table: pa.Table, path: str | Path, name: str) -> Path:
    """Write `table` as Parquet after conforming it to the named schema."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(conform(table, name), path)
    return path


def read(path: str | Path, name: str) -> pa.Table:
    """Read a Parquet file and conform it to the named schema."""
    return conform(pq.read_table(path), name)
