"""tierscope's own tables as input: requests as is, client_requests as the client tier."""

import pyarrow as pa
import pytest

from tierscope import tables
from tierscope.ingest import FormatError, detect, load


def test_requests_and_client_requests(tmp_path):
    req = pa.table({"tier": ["db"] * 3, "server": ["db1"] * 3, "arrival_ns": [1, 5, 9], "departure_ns": [4, 8, 20]})
    tables.write(req, tmp_path / "requests.parquet", "requests")
    cli = pa.table(
        {
            "user": [1, 2],
            "session": [1, 1],
            "state": ["Home", "Story"],
            "start_ns": [0, 3],
            "end_ns": [30, 40],
            "status": pa.array([200, 503], pa.int32()),
            "bytes": [10, 0],
            "phase": ["run", "run"],
        }
    )
    tables.write(cli, tmp_path / "client_requests.parquet", "client_requests")
    assert detect(tmp_path / "requests.parquet") == "parquet"
    result = load([tmp_path / "requests.parquet", tmp_path / "client_requests.parquet"])
    rows = result.requests.to_pylist()
    assert len(rows) == 5 and result.records == 5 and result.skipped == 0
    assert [r["departure_ns"] for r in rows if r["tier"] == "db"] == [4, 8, 20]
    client = [r for r in rows if r["tier"] == "client"]
    assert [(r["label"], r["arrival_ns"], r["departure_ns"], r["status"], r["client"]) for r in client] == [
        ("Home", 0, 30, "200", "user1"),
        ("Story", 3, 40, "503", "user2"),
    ]
    bad = tmp_path / "resources.parquet"
    tables.write(
        pa.table({"ts_ns": [1], "host": ["h"], "metric": ["cpu"], "value": [1.0], "unit": ["%"]}), bad, "resources"
    )
    with pytest.raises(FormatError, match="neither a requests table"):
        load([bad])
