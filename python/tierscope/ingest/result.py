"""What an importer hands back: the `requests` table plus an honest account of what was skipped.

Importers never hold the foreign document in memory. They emit one row per request into a
`RequestSink`, which keeps at most `batch_rows` rows as Python lists and turns them into Arrow
record batches (compact, columnar) as it goes. Span formats also record a tiny `id -> parent`
link per span so that, at the end, each request's `parent_id` can point at the *request at the
upstream tier* (skipping the CLIENT and INTERNAL spans in between), and CLIENT spans whose callee
was itself traced can be dropped (see `RequestSink.finish`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from tierscope.tables import REQUESTS, conform

#: How many skipped-record locations an import keeps (the count is always complete).
MAX_LOCATIONS = 5

#: Internal columns carried until `finish`: the span kind ("server"/"client"/"" for logs) and span id.
_KIND = "_kind"
_SPAN = "_span"
#: ...and the emitting process (an OpenTelemetry resource), whose SERVER rows name its recorder.
_PROCESS = "_process"


class FormatError(ValueError):
    """The file is not in the format being read (or in no known format). One clear message."""


@dataclass
class ImportResult:
    """The requests read from one or more files, and what could not be read.

    `requests` follows `tierscope.tables.REQUESTS`; `skipped` counts malformed records and
    `skipped_at` holds where the first few were (``file:line`` or ``file:$.json.path``) and why.
    """

    requests: pa.Table
    formats: dict[str, str] = field(default_factory=dict)  # file -> format name
    records: int = 0  # records seen (rows kept + skipped)
    skipped: int = 0
    skipped_at: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was done to the rows across files

    def merge(self, other: ImportResult) -> ImportResult:
        """Both results as one (tables concatenated, counts added)."""
        return ImportResult(
            requests=pa.concat_tables([self.requests, other.requests]),
            formats={**self.formats, **other.formats},
            records=self.records + other.records,
            skipped=self.skipped + other.skipped,
            skipped_at=(self.skipped_at + other.skipped_at)[:MAX_LOCATIONS],
            notes=self.notes + other.notes,
        )

    def summary(self) -> str:
        """One line for a terminal: rows, tiers, skipped records and where the first ones were."""
        tiers = sorted(set(self.requests.column("tier").to_pylist())) if self.requests.num_rows else []
        text = f"{self.requests.num_rows} requests at {len(tiers)} tier(s) {', '.join(tiers)}"
        if self.skipped:
            text += f"; skipped {self.skipped} malformed record(s), first at: " + "; ".join(self.skipped_at)
        for note in self.notes:
            text += f"; {note}"
        return text


#: The columns importers fill (the rest of `REQUESTS`, e.g. the tracer's, are added as nulls at the end).
_FILLED = (
    "tier",
    "server",
    "request_id",
    "parent_id",
    "label",
    "arrival_ns",
    "departure_ns",
    "status",
    "bytes_in",
    "bytes_out",
    "client",
    "conn",
    "source",
    "recorder",
)
_WORK_SCHEMA = pa.schema(
    [REQUESTS.field(n) for n in _FILLED]
    + [pa.field(_KIND, pa.string()), pa.field(_SPAN, pa.string()), pa.field(_PROCESS, pa.string())]
)


class RequestSink:
    """Collects rows from an importer with bounded Python-side memory."""

    def __init__(self, source: str, batch_rows: int = 65_536) -> None:
        self.source = source
        self.batch_rows = batch_rows
        self._cols: dict[str, list] = {f.name: [] for f in _WORK_SCHEMA}
        self._batches: list[pa.RecordBatch] = []
        self._tables: list[pa.Table] = []  # rows that came as whole requests tables (Parquet)
        self._links: dict[str, str | None] = {}  # span id -> parent span id, every span seen
        self.records = 0
        self.skipped = 0
        self.skipped_at: list[str] = []

    # -- what importers call -------------------------------------------------------------
    def add(
        self,
        *,
        tier: str,
        server: str,
        arrival_ns: int,
        departure_ns: int,
        request_id: str | None = None,
        parent_id: str | None = None,
        label: str | None = None,
        status: str | None = None,
        bytes_in: int | None = None,
        bytes_out: int | None = None,
        client: str | None = None,
        conn: int | None = None,
        kind: str = "",
        recorder: str | None = None,
        process: str | None = None,
    ) -> None:
        """One request at one server. `kind` is "server" or "client" for spans, "" otherwise.
        `recorder`: whose clock stamped the times (docs/tables.md); `process`: a key of the process
        that emitted the span (its resource): at `finish`, every row of a process that has SERVER
        rows gets the server name of those rows as recorder, so one process has one name."""
        self.records += 1
        c = self._cols
        c["tier"].append(tier)
        c["server"].append(server)
        c["request_id"].append(request_id)
        c["parent_id"].append(parent_id)
        c["label"].append(label)
        c["arrival_ns"].append(int(arrival_ns))
        c["departure_ns"].append(int(departure_ns))
        c["status"].append(status)
        c["bytes_in"].append(bytes_in)
        c["bytes_out"].append(bytes_out)
        c["client"].append(client)
        c["conn"].append(conn)
        c["source"].append(self.source)
        c["recorder"].append(recorder)
        c[_PROCESS].append(process)
        c[_KIND].append(kind)
        c[_SPAN].append(request_id)
        if len(c["tier"]) >= self.batch_rows:
            self._flush()

    def link(self, span_id: str, parent_id: str | None) -> None:
        """Remember a span's parent (every span, emitted or not) for parent resolution."""
        self._links.setdefault(span_id, parent_id)

    def note_seen(self) -> None:
        """A record that was read and deliberately not turned into a request (e.g. an INTERNAL span)."""
        self.records += 1

    def skip(self, where: str, why: str) -> None:
        """Count a malformed record; keep the location of the first few."""
        self.records += 1
        self.skipped += 1
        if len(self.skipped_at) < MAX_LOCATIONS:
            self.skipped_at.append(f"{where}: {why}")

    def add_table(self, table: pa.Table) -> None:
        """Rows that are already a requests table (Parquet input)."""
        self.records += table.num_rows
        self._tables.append(conform(table, "requests"))

    # -- the end ---------------------------------------------------------------------------
    def _flush(self) -> None:
        if self._cols["tier"]:
            self._batches.append(pa.RecordBatch.from_pydict(self._cols, schema=_WORK_SCHEMA))
            self._cols = {f.name: [] for f in _WORK_SCHEMA}

    def finish(self, file_label: str, format_name: str) -> ImportResult:
        """The requests table: CLIENT rows whose callee was traced dropped, parents resolved.

        A CLIENT span stands for a downstream request only when no SERVER span answers it: it is
        dropped when a SERVER span has it as parent (OpenTelemetry, Jaeger) or shares its id
        (Zipkin B3 shared spans). A request's `parent_id` is then the nearest ancestor span that is
        itself a row, so it names the request at the upstream tier.
        """
        self._flush()
        table = pa.Table.from_batches(self._batches, schema=_WORK_SCHEMA)
        self._batches = []
        kinds = table.column(_KIND)
        if self._links and pc.any(pc.equal(kinds, "client")).as_py():
            servers = table.filter(pc.equal(kinds, "server"))
            answered = pa.concat_arrays(
                [servers.column(_SPAN).combine_chunks(), servers.column("parent_id").combine_chunks()]
            ).drop_null()
            drop = pc.and_(pc.equal(kinds, "client"), pc.is_in(table.column(_SPAN), value_set=answered))
            table = table.filter(pc.invert(pc.fill_null(drop, False)))
        if self._links:
            rows = set(table.column(_SPAN).drop_null().to_pylist())
            resolved = []
            for parent in table.column("parent_id").to_pylist():
                hops = 0
                while parent is not None and parent not in rows and hops < 64:
                    parent = self._links.get(parent)
                    hops += 1
                resolved.append(parent if parent in rows else None)
            table = table.set_column(
                table.schema.get_field_index("parent_id"), "parent_id", pa.array(resolved, pa.string())
            )
        table = _name_recorders(table)
        table = conform(table.drop_columns([_KIND, _SPAN, _PROCESS]), "requests")
        if self._tables:
            table = pa.concat_tables([table, *self._tables])
            self._tables = []
        return ImportResult(
            requests=table,
            formats={file_label: format_name},
            records=self.records,
            skipped=self.skipped,
            skipped_at=list(self.skipped_at),
        )


def _name_recorders(table: pa.Table) -> pa.Table:
    """Every row of a process (`_PROCESS`) that has SERVER rows records under the server name most of
    those rows carry (the process's own requests and the CLIENT rows it stamped for its callees)."""
    if table.num_rows == 0 or table.column(_PROCESS).null_count == table.num_rows:
        return table
    own = table.filter(pc.and_(pc.equal(table.column(_KIND), "server"), pc.is_valid(table.column(_PROCESS))))
    if own.num_rows == 0:
        return table
    counts = own.group_by([_PROCESS, "server"]).aggregate([([], "count_all")]).to_pylist()
    name: dict[str, tuple[int, str]] = {}
    for r in counts:
        best = name.get(r[_PROCESS])
        if best is None or (r["count_all"], r["server"]) > best:
            name[r[_PROCESS]] = (r["count_all"], r["server"])
    processes = table.column(_PROCESS).to_pylist()
    recorders = table.column("recorder").to_pylist()
    named = [name[p][1] if p in name else r for p, r in zip(processes, recorders)]
    return table.set_column(table.schema.get_field_index("recorder"), "recorder", pa.array(named, pa.string()))
