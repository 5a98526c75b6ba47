"""The SQL cases shared by the Python and the Rust middleware (issue 25): one machine-readable file,
engine/tests/sql_cases.json, read here against `tierscope.middleware.sql` and by `cargo test`
(engine/src/middleware/sql.rs) against the Rust port. Both must give every answer in it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tierscope.middleware import sql

CASES_PATH = Path(__file__).resolve().parent.parent / "engine" / "tests" / "sql_cases.json"
CASES = json.loads(CASES_PATH.read_text())


def test_the_shared_file_has_both_sections():
    assert len(CASES["classify"]) >= 20 and len(CASES["label"]) >= 20
    assert {c["kind"] for c in CASES["classify"]} == {sql.READ, sql.WRITE}


@pytest.mark.parametrize("case", CASES["classify"], ids=lambda c: repr(c["sql"])[:60])
def test_classification(case):
    assert sql.classify(case["sql"]) == case["kind"]


@pytest.mark.parametrize("case", CASES["label"], ids=lambda c: repr(c["sql"])[:60])
def test_label(case):
    assert sql.label(case["sql"]) == case["label"]
