"""The SQL cases of the middleware (issue 25): one machine-readable file, engine/tests/sql_cases.json,
read by `cargo test` (engine/src/middleware/sql.rs: classification_matches_the_shared_cases,
labels_match_the_shared_cases) and here, through the running middleware (`tierscope-engine
middleware` in front of two PostgreSQL servers): each statement is sent alone, over the simple
protocol, to a middleware of its own, and what that middleware did with it is read from the counts
it writes on exit: one read (routed to one backend) or one write (to every backend), and, with
`--labels`, the read's label among its per-statement counts. A statement the servers refuse (most
cases name tables that do not exist) is routed all the same: the routing is what is checked.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import test_middleware
from conftest import needs_postgres, needs_root
from test_middleware_rust import dsn, engine_built, rust_middleware  # noqa: F401  (engine_built: autouse)

CASES_PATH = Path(__file__).resolve().parent.parent / "engine" / "tests" / "sql_cases.json"
CASES = json.loads(CASES_PATH.read_text())

servers = test_middleware.pair
pytestmark = [needs_root("PostgreSQL runs as its own OS user"), needs_postgres]


def routed(servers, sql: str) -> tuple[dict, str | None, bool]:
    """Send `sql` alone through a fresh middleware: its counts on exit, the SQLSTATE of the error the
    client got (None: no error) and whether the session was left inside a transaction (which the
    middleware then rolls back on every backend: one more write unit)."""
    import psycopg

    stats: dict = {}
    error, in_transaction = None, False
    with (
        rust_middleware(servers, "lprf", stats=stats, extra=("--labels", "--series-interval", "0")) as mw,
        psycopg.connect(dsn(mw), autocommit=True, cursor_factory=psycopg.ClientCursor) as conn,
    ):
        # ClientCursor, no parameters: one simple Query with this text; refused by the servers or
        # not, it is routed all the same
        try:
            conn.execute(sql)
        except psycopg.Error as err:
            error = err.sqlstate or type(err).__name__
        in_transaction = conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    assert stats, "the middleware wrote no counts"
    return stats, error, in_transaction


def test_the_shared_file_has_both_sections():
    assert len(CASES["classify"]) >= 20 and len(CASES["label"]) >= 20
    assert {c["kind"] for c in CASES["classify"]} == {"read", "write"}


@pytest.mark.parametrize("case", CASES["classify"], ids=lambda c: repr(c["sql"])[:60])
def test_classification(servers, case):
    stats, error, in_transaction = routed(servers, case["sql"])
    got = (stats["reads"], stats["writes"])
    if case["sql"].upper().startswith("COPY"):
        # refused by the middleware itself (0A000: COPY is not supported) before it is routed: its
        # classification is checked by `cargo test` only (sql.rs classification_matches_the_shared_cases)
        assert error == "0A000" and got == (0, 0), (error, stats)
    elif case.get("deferred"):
        # a plain BEGIN: answered by the middleware (the client is in a transaction), sent to the
        # servers with the session's next unit, here the COMMIT psycopg sends as the connection
        # closes: one write unit on each server where a BEGIN sent at once makes two
        assert in_transaction and error is None, (error, in_transaction)
        assert got == (0, 1) and all(b["writes"] == 1 for b in stats["backends"]), stats
    elif case["kind"] == "read":
        assert got == (1, 0), stats
        assert sum(b["reads"] for b in stats["backends"]) == 1 and all(b["writes"] == 0 for b in stats["backends"])
    else:
        # a unit that leaves a transaction open (BEGIN) is followed by the middleware's rollback
        assert got == (0, 1 + in_transaction), (in_transaction, stats)
        assert all(b["writes"] == 1 + in_transaction for b in stats["backends"]), stats["backends"]


@pytest.mark.parametrize("case", CASES["label"], ids=lambda c: repr(c["sql"])[:60])
def test_label(servers, case):
    stats, _, _ = routed(servers, case["sql"])
    if stats["reads"] == 1:  # a read: its label is counted once
        assert stats["labels"]["counts"] == {case["label"]: 1}, stats["labels"]
    else:  # a write has no label in the counts (only reads are timed per label): `cargo test` checks it
        assert stats["writes"] >= 1 and stats["labels"]["counts"] == {}, stats
