"""Several generators driven as one: the users' split and the merge of their logs (pure parts of
`[client] hosts = K`; the run over SSH is tests/test_remote.py::test_two_generator_hosts_drive_as_one)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tierscope import tables
from tierscope.load import SESSION_STRIDE, merge_client_logs, split_users


@pytest.mark.parametrize(
    "users, k, want",
    [
        (10, 2, [(0, 5), (5, 5)]),
        (7, 3, [(0, 3), (3, 2), (5, 2)]),
        (5, 1, [(0, 5)]),
    ],
)
def test_split_users(users, k, want):
    assert split_users(users, k) == want
    assert sum(n for _, n in split_users(users, k)) == users


def _log(path, users, sessions, start):
    n = len(users)
    t = pa.table(
        {
            "user": users,
            "session": sessions,
            "state": ["Home"] * n,
            "start_ns": start,
            "end_ns": [s + 1000 for s in start],
            "phase": ["run"] * n,
        }
    )
    tables.write(tables.conform(t, "client_requests"), path, "client_requests")


def test_merge_numbers_users_after_each_other_and_moves_clocks(tmp_path):
    _log(tmp_path / "a.parquet", [0, 1, 0], [0, 1, 2], [100, 300, 500])
    _log(tmp_path / "b.parquet", [0, 1], [0, 1], [200, 400])
    rows = merge_client_logs(
        [(tmp_path / "a.parquet", 0, 0), (tmp_path / "b.parquet", 2, -50), (tmp_path / "missing.parquet", 4, 0)],
        tmp_path / "out.parquet",
    )
    assert rows == 5
    t = pq.read_table(tmp_path / "out.parquet").to_pydict()
    assert t["start_ns"] == [100, 150, 300, 350, 500]  # b's clock moved by -50 ns, rows in time order
    assert t["user"] == [0, 2, 1, 3, 0]
    assert t["session"] == [0, SESSION_STRIDE, 1, SESSION_STRIDE + 1, 2]
    assert t["end_ns"] == [1100, 1150, 1300, 1350, 1500]
