"""A callee's own rows (its port on the wire) replace the calls its callers stamped (issue 26)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from independent_sim import ns, periodic, simulate, truth_shares, write_otlp_inprocess
from test_analysis_inprocess import BLIND, DURATION_S, FREEZE_S, WARMUP_S, shop
from tierscope.analysis.experiment import analyze_files
from tierscope.ingest.callees import own_times_for_calls
from tierscope.tables import conform

MS = 1_000_000


def _rows(rows: list[dict]) -> pa.Table:
    cols = {k: [r.get(k) for r in rows] for k in ("tier", "server", "request_id", "parent_id", "label",
                                                   "arrival_ns", "departure_ns", "recorder", "server_addr",
                                                   "server_port", "source")}  # fmt: skip
    return conform(pa.table(cols), "requests")


def app(rid: str, a: int, d: int) -> dict:
    return dict(tier="app", server="app1", request_id=rid, arrival_ns=a * MS, departure_ns=d * MS, recorder="app1")


def call(rid: str, parent: str, a: int, d: int, server: str = "127.0.0.1:5432") -> dict:
    return dict(tier="postgresql", server=server, request_id=rid, parent_id=parent, arrival_ns=a * MS,
                departure_ns=d * MS, recorder="app1", source="otlp")  # fmt: skip


def wire(rid: str, a_us: int, d_us: int, addr: str = "127.0.0.1") -> dict:
    return dict(tier="postgresql", server="127.0.0.1:5432", request_id=rid, arrival_ns=a_us * 1000,
                departure_ns=d_us * 1000, server_addr=addr, server_port=5432, source="trace")  # fmt: skip


def test_each_call_takes_the_callee_row_that_answered_it():
    t = _rows(
        [
            app("r1", 0, 100),
            app("r2", 5, 120),
            call("c1", "r1", 10, 60),  # stretched: the app took the reply late
            call("c2", "r2", 12, 110, server="localhost:5432"),  # same endpoint, another spelling
            call("c3", "r2", 111, 115),  # nothing on the wire answers it
            wire("w1", 10_300, 11_900),  # answers c1 (1.6 ms of the db's own time)
            wire("w2", 11_950, 14_000),  # a stamp in whole ms (c2 at 12 ms) still holds w2 (11.95 ms)
            wire("w3", 200_000, 201_000),  # another client of the db (monitoring): stays
        ]
    )
    out, done = own_times_for_calls(t)
    assert (done.matched, done.unanswered, done.endpoints) == (2, 1, ("127.0.0.1:5432",))
    db = {r["request_id"]: r for r in out.to_pylist() if r["tier"] == "postgresql"}
    assert set(db) == {"w1", "w2", "w3"}  # every row of the db is the db's own
    assert (db["w1"]["parent_id"], db["w2"]["parent_id"], db["w3"]["parent_id"]) == ("r1", "r2", None)
    assert db["w1"]["departure_ns"] - db["w1"]["arrival_ns"] == 1_600_000
    assert out.num_rows == 5


def test_calls_stay_when_the_callee_has_no_rows_of_its_own():
    t = _rows([app("r1", 0, 100), call("c1", "r1", 10, 60), wire("w1", 10_300, 11_900, addr="10.0.0.9")])
    out, done = own_times_for_calls(t)
    assert done.note() is None and out.num_rows == 3


def test_a_paused_apps_database_on_the_wire_earns_the_alternating_verdict(tmp_path):
    # the signature case of test_analysis_inprocess, the database untraced: alone, the app's stamps
    # cannot tell (at most 0.45); with the database's port on the wire (its own times), they can
    system = shop(db_s=0.0015, freezes=periodic(0.51, 1.0, FREEZE_S, 60))
    result = simulate(system, DURATION_S, WARMUP_S)
    truth = truth_shares(result, system)
    assert 0.15 <= truth["app"] <= 0.25 and truth["postgres"] > 0.2, truth
    spans = write_otlp_inprocess(result.spans, system, tmp_path / "spans.json", uninstrumented=BLIND,
                                 db_system="postgres")  # fmt: skip
    db = [s for s in result.spans if s.tier == "postgres"]
    wire_rows = _rows(
        [
            dict(
                tier="postgres",
                server=f"{s.server}:5432",
                request_id=f"w{i}",
                label=s.name,
                arrival_ns=ns(s.start_s),
                departure_ns=ns(s.end_s),
                server_addr=s.server,
                server_port=5432,
                source="trace",
            )
            for i, s in enumerate(db)
        ]
    )
    pq.write_table(wire_rows, tmp_path / "wire.parquet")
    alone = analyze_files([spans]).fine.verdict
    assert alone.kind == "alternating" and alone.confidence <= 0.45, alone
    data = analyze_files([spans, tmp_path / "wire.parquet"])
    # every call the app stamped found the database's own row (the front's calls are not on the wire)
    calls = sum(1 for s in db if s.start_s >= WARMUP_S)
    note = next(n for n in data.notes if "replaced by the callee's own rows" in n)
    assert note.startswith(f"{calls} call(s)") and "dropped" not in note, (note, calls)
    reqs = data.requests
    assert set(reqs.filter(pa.compute.equal(reqs.column("tier"), "postgres")).column("source").to_pylist()) == {"trace"}
    v = data.fine.verdict
    assert v.kind == "alternating" and set(v.tiers) == {"app", "postgres"}, (v.text, v.evidence)
    assert v.confidence >= 0.8, v
    assert "postgres (saturated by the burst after each pause)" in v.text, v.text
