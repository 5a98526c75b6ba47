"""The SQL fingerprint of the trace importers (`tierscope.ingest.sql_label`): the same label as the
tracer gives the same statement on the wire (engine/tests/fingerprint_cases.json, which `cargo
test` checks against the tracer), and what only a span shows (drivers' placeholders)."""

import json
from pathlib import Path

import pytest

from tierscope.ingest.semconv import client_label
from tierscope.ingest.sql_label import MAX_LABEL, TRUNCATED_MARK, sql_fingerprint

CASES = json.loads((Path(__file__).parents[1] / "engine" / "tests" / "fingerprint_cases.json").read_text())["cases"]


@pytest.mark.parametrize("case", CASES, ids=[c["sql"][:40] for c in CASES])
def test_the_importers_fingerprint_is_the_tracers(case):
    assert sql_fingerprint(case["sql"], mysql=case["mysql"]) == case["label"]


def test_drivers_placeholders_are_literals():
    # psycopg's %s and %(name)s, SQLAlchemy's :name: the wire shows the values the driver put there
    want = "UPDATE kv SET v = ? WHERE k = ? AND t = x::int"
    for sql in ("UPDATE kv SET v = %s WHERE k = %s AND t = x::int",
                "UPDATE kv SET v = %(v)s WHERE k = :key AND t = x::int",
                "UPDATE kv SET v = 'a' WHERE k = 7 AND t = x::int"):  # fmt: skip
        assert sql_fingerprint(sql) == want


def test_a_long_statement_is_cut_and_marked():
    label = sql_fingerprint("SELECT " + ", ".join(f"column_{i}" for i in range(200)) + " FROM t")
    assert label.endswith(TRUNCATED_MARK) and len(label) == MAX_LABEL + len(TRUNCATED_MARK)


def test_a_database_spans_label_is_its_statement_not_its_name():
    pg = {"db.system": "postgresql", "db.statement": "SELECT pg_sleep(%s)"}
    assert client_label(pg, "SELECT") == "SELECT pg_sleep(?)"
    newer = {"db.system.name": "postgresql", "db.query.text": "SELECT * FROM t WHERE id = $1"}
    assert client_label(newer, "pg.query:SELECT postgres") == "SELECT * FROM t WHERE id = ?"
    # no statement, not SQL, or not a database: the span's name
    assert client_label({"db.system": "postgresql"}, "SELECT") == "SELECT"
    assert client_label({"db.system": "redis", "db.statement": "GET user:42"}, "GET") == "GET"
    assert client_label({"http.request.method": "GET"}, "GET /x") == "GET /x"
