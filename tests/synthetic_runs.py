"""Synthetic run directories for the study-finding tests (no lab): what the runner writes for a
point (manifest, the client's requests, the resource samples), with the figures chosen by the test."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from conftest import PRESETS

S = 1_000_000_000


def memory_run(root: Path, busy: dict[str, str], study: str | None = "tpcw-memory") -> Path:
    """A run of one configuration per key of `busy` (the db host's memory, e.g. "150MiB") at 50 and
    100 users: the metric `busy[memory]` ("disk_util": db1's; "app1:connections_util": another
    host's) pinned at 100 %, app1's CPU at 30 %; run.json names `study`'s preset."""
    root.mkdir(parents=True, exist_ok=True)
    for index, memory in enumerate(busy):
        for j, users in enumerate((50, 100)):
            d = root / f"memory{memory}-users{users}"
            d.mkdir()
            m = {
                "point": {
                    "id": d.name,
                    "index": 2 * index + j,
                    "params": {"node_types.D.memory": memory, "workload.users": users},
                    "users": users,
                    "think_time_s": 1.0,
                },
                "topology": "1W/1A/0/1D-P",
                "tiers": {"web": 1, "app": 1, "middleware": 0, "db": 1},
                "phases": {"run": {"start_ns": 0, "end_ns": 20 * S}},
            }
            (d / "manifest.json").write_text(json.dumps(m))
            n = users * (1 + index) * 20 // 10  # requests in 20 s: more with more memory
            starts = [i * (20 * S // n) for i in range(n)]
            pq.write_table(
                pa.table(
                    {
                        "start_ns": pa.array(starts, pa.int64()),
                        "end_ns": pa.array([t + 10_000_000 for t in starts], pa.int64()),
                        "phase": ["run"] * n,
                        "user": pa.array([i % users for i in range(n)], pa.int64()),
                        "session": pa.array([0] * n, pa.int64()),
                        "state": ["home"] * n,
                    }
                ),
                d / "client_requests.parquet",
            )
            rows: dict[str, list] = {"ts_ns": [], "host": [], "metric": [], "value": [], "unit": []}
            pinned_host, _, pinned = busy[memory].rpartition(":")
            for host, metric, value in ((pinned_host or "db1", pinned, 100.0), ("app1", "cpu_util", 30.0)):
                for t in range(1, 21):
                    for k, v in (("ts_ns", t * S), ("host", host), ("metric", metric), ("value", value)):
                        rows[k].append(v)
                    rows["unit"].append("percent")
            pq.write_table(pa.table(rows), d / "resources.parquet")
    if study is not None:
        (root / "run.json").write_text(json.dumps({"spec": str(PRESETS / f"{study}.toml")}))
    return root
