"""tierscope's own Parquet tables: `requests` as is, and the generator's `client_requests` as the
requests seen at the client (tier ``client``, server ``generator``, label = the page/state,
arrival = ``start_ns``, departure = ``end_ns``). Read in record batches (bounded memory)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tierscope.ingest.registry import Format, register_format
from tierscope.ingest.result import FormatError, RequestSink
from tierscope.tables import CLIENT_REQUESTS, REQUESTS, conform

NAME = "parquet"


def client_to_requests(batch: pa.Table) -> pa.Table:
    """`client_requests` rows as `requests` rows at the client (the workload generator)."""
    n = batch.num_rows
    status = batch.column("status").cast(pa.string()) if "status" in batch.column_names else pa.nulls(n, pa.string())
    user = batch.column("user").cast(pa.string())
    table = pa.table(
        {
            "tier": pa.array(["client"] * n, pa.string()),
            "server": pa.array(["generator"] * n, pa.string()),
            "label": batch.column("state"),
            "arrival_ns": batch.column("start_ns"),
            "departure_ns": batch.column("end_ns"),
            "status": status,
            "bytes_out": batch.column("bytes") if "bytes" in batch.column_names else pa.nulls(n, pa.int64()),
            "client": pc.binary_join_element_wise("user", user, ""),
            "source": pa.array(["client_requests"] * n, pa.string()),
        }
    )
    return conform(table, "requests")


def read(path: Path, sink: RequestSink, **_options) -> None:
    """Stream a `requests` or `client_requests` Parquet file into `sink`."""
    path = Path(path)
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as err:
        raise FormatError(f"{path}: not a Parquet file ({err})") from None
    cols = set(pf.schema_arrow.names)
    required_req = {f.name for f in REQUESTS if not f.nullable}
    required_cli = {f.name for f in CLIENT_REQUESTS if not f.nullable} - {"phase", "session"}
    if required_req <= cols:
        convert = lambda t: conform(t, "requests")  # noqa: E731
    elif required_cli <= cols:
        convert = client_to_requests
    else:
        raise FormatError(
            f"{path}: Parquet, but neither a requests table (needs {sorted(required_req)}) nor "
            f"client_requests (needs {sorted(required_cli)}); it has {sorted(cols)[:12]}"
        )
    for batch in pf.iter_batches(batch_size=262_144):
        sink.add_table(convert(pa.Table.from_batches([batch])))


def sniff(head: bytes) -> bool:
    return head[:4] == b"PAR1"


FORMAT = register_format(Format(NAME, "tierscope Parquet tables (requests, client_requests)", sniff, read))
