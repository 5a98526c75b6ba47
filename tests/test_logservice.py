"""The log service of seed 003 on real servers: PostgreSQL, gunicorn, Redis, the driver.

Ground truth: the record ids the test (or the driver) sent against the ids in the database; the
arithmetic of the counts on outcome tables written by the test."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
import urllib.error
import urllib.request

import pyarrow as pa
import pytest

from tierscope.apps.logservice.app import BadRecord, LogServiceConfig, parse_record
from tierscope.apps.logservice.driver import CONNECTION_ERROR, OUTCOMES, TIMEOUT, Load
from tierscope.apps.logservice.experiment import Service, count, run_mode
from tierscope.apps.logservice.preset import PresetError, load_preset
from tierscope.apps.logservice.schema import token
from conftest import needs_root

needs_root = needs_root("PostgreSQL runs as its own OS user")
needs_redis = pytest.mark.skipif(not shutil.which("redis-server"), reason="redis-server not installed")


# --- pure parts ------------------------------------------------------------------------------


def test_counts_of_outcomes_against_the_stored_ids():
    rows = [
        ("a", 1, 0, 10, 201),
        ("b", 1, 10, 30, 201),
        ("c", 2, 0, 5, 503),
        ("d", 2, 5, 5_000_000_005, TIMEOUT),
        ("e", 3, 0, 7, CONNECTION_ERROR),
        ("f", 3, 7, 9, 400),
    ]
    t = pa.Table.from_arrays([pa.array(c, f.type) for c, f in zip(zip(*rows), OUTCOMES)], schema=OUTCOMES)
    n = count(t, stored={"a", "d", "zz"})  # b acknowledged but missing; d timed out but stored
    assert (n["sent"], n["acknowledged"], n["refused"], n["timed_out"], n["connection_errors"], n["other"]) == (
        6,
        2,
        1,
        1,
        1,
        1,
    )
    assert n["stored"] == 2 and n["lost"] == 4 and n["lost_acknowledged"] == 1 and n["timed_out_stored"] == 1
    assert n["load_s"] == pytest.approx(5.000000005)
    assert n["p90_ms"] == pytest.approx((10 + 0.9 * (20 - 10)) / 1e6)


@pytest.mark.parametrize(
    "body, needle",
    [
        (b"not json", "body is not JSON"),
        (b"[1]", "expected a JSON object"),
        (b'{"message": "m"}', "id: expected a string"),
        (b'{"id": "' + b"x" * 65 + b'", "message": "m"}', "id: expected a string of 1 to 64"),
        (b'{"id": "a", "level": 9, "message": "m"}', "level: expected an integer 0..7"),
        (b'{"id": "a", "level": true, "message": "m"}', "level: expected an integer 0..7"),
        (b'{"id": "a"}', "message: expected a string"),
    ],
)
def test_a_malformed_record_says_what_is_wrong(body, needle):
    with pytest.raises(BadRecord, match=needle):
        parse_record(body, 1, 0)
    assert parse_record(b'{"id": "a", "message": "m"}', 3, 5).level == 6


def test_config_goes_through_the_environment_unchanged():
    c = LogServiceConfig(mode="queue", db_port=6543, auth_cache=False, batch_ms=12.5, redis_url="redis://x:1/0")
    assert LogServiceConfig.from_env(c.env()) == c
    with pytest.raises(ValueError, match="mode durable needs redis_url"):
        LogServiceConfig(mode="durable")


def test_the_shipped_preset_loads_and_bad_ones_name_the_key(tmp_path):
    from tierscope.cli.demo import preset

    modes, load, service, _ = load_preset(preset("ingest"))
    assert modes == ["direct", "queue", "durable"] and load.total == load.clients * load.records
    assert service.db_cpu and service.fsync
    for text, needle in (
        ("[load]\nclients = 0\n", "clients and records: expected >= 1"),
        ("[load]\nclient = 3\n", "load.client: unknown key"),
        ('[service]\ndb_cpu = "x"\n', "service.db_cpu: expected float"),
        ('modes = ["batch"]\n', "modes: expected a list of direct, queue, durable"),
        ('[service]\ndbms = "oracle"\n', "dbms: expected one of"),
    ):
        p = tmp_path / "p.toml"
        p.write_text(text)
        with pytest.raises(PresetError, match=needle):
            load_preset(p)


# --- the service on real servers -------------------------------------------------------------


@pytest.fixture
def postgres(tmp_path):
    from tierscope.apps.dal import Database, DbConfig
    from tierscope.apps.logservice import schema
    from tierscope.services.base import free_port
    from tierscope.services.postgres import Postgres
    from tierscope.testbed.host import Host

    with Postgres(Host.loopback(), free_port(), tmp_path / "pg", fsync=False) as pg:
        pg.create_database("logs")
        db = Database(DbConfig(host="127.0.0.1", port=pg.port, database="logs"))
        schema.create(db, clients=3)
        yield pg, db
        db.close()


def _app(tmp_path, pg, mode: str, **kw):
    from tierscope.services.appserver import AppServer
    from tierscope.services.base import free_port
    from tierscope.testbed.host import Host

    cfg = LogServiceConfig(mode=mode, db_port=pg.port, db_name="logs", **kw)
    return AppServer(
        Host.loopback(),
        free_port(),
        tmp_path / f"app-{mode}",
        app="tierscope.apps.logservice.app:create_app()",
        app_env=cfg.env(),
        health_path="/health",
        workers=2,
        threads=4,
    )


def _post(url: str, body: bytes, tok: str | None) -> int:
    headers = {"Content-Type": "application/json"}
    if tok is not None:
        headers["Authorization"] = f"Bearer {tok}"
    req = urllib.request.Request(url + "/log", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code


@needs_root
@pytest.mark.parametrize("mode", ["direct", "queue"])
def test_each_acknowledged_record_is_stored_once_and_bad_requests_store_nothing(tmp_path, postgres, mode):
    from tierscope.apps.logservice import schema

    pg, db = postgres
    app = _app(tmp_path, pg, mode, auth_cache=mode == "queue", max_body=1000).start()
    try:
        codes = [
            _post(app.url, json.dumps({"id": f"r{i}", "message": "hello"}).encode(), token(1 + i % 3))
            for i in range(60)
        ]
        assert codes == [201] * 60
        assert _post(app.url, json.dumps({"id": "r0", "message": "again"}).encode(), token(1)) == 201  # one row
        assert _post(app.url, b'{"id": "bad-token", "message": "m"}', token(99)) == 401
        assert _post(app.url, b'{"id": "no-token", "message": "m"}', None) == 401
        assert _post(app.url, b'{"id": "x", "message": 7}', token(1)) == 400
        assert _post(app.url, b"{", token(1)) == 400
        assert _post(app.url, json.dumps({"id": "big", "message": "m" * 2000}).encode(), token(1)) == 413
    finally:
        app.stop()  # a clean stop writes what the queue still holds
    assert schema.stored_ids(db) == {f"r{i}" for i in range(60)}
    with db.session() as s:
        rows = s.query("SELECT client_id, count(*) AS n FROM logs GROUP BY client_id ORDER BY client_id")
    assert [(r["client_id"], r["n"]) for r in rows] == [(1, 20), (2, 20), (3, 20)]


@needs_root
@needs_redis
def test_durable_mode_loses_no_acknowledged_record_when_the_app_is_killed(tmp_path):
    killed = {}

    def crash(app, hosts):
        time.sleep(1.5)  # the load is under way
        killed["pid"] = app.proc.pid
        os.killpg(app.proc.pid, signal.SIGKILL)

    load = Load(clients=100, records=40, timeout_s=2.0, start_spread_s=0.2, run="crash")
    r = run_mode("durable", Service(db_cpu=None, fsync=False, app_threads=16), load, tmp_path / "durable", crash=crash)
    assert killed and r.sent == 4000
    assert r.acknowledged > 100  # some were taken before the kill...
    assert r.connection_errors + r.timed_out > 0  # ...and the kill was felt
    assert r.lost_acknowledged == 0
    assert r.stored >= r.acknowledged


@needs_root
@needs_redis
def test_seed_003_direct_inserts_lose_records_the_queue_stores_them_all(tmp_path):
    """The finding: at the same offered load, with the database the bottleneck of direct inserts,
    direct mode refuses and loses records; queue and durable store every one."""
    from tierscope.cli.demo import preset

    _, load, service, _ = load_preset(preset("ingest"))
    load = Load(clients=1000, records=5, timeout_s=load.timeout_s, start_spread_s=load.start_spread_s)
    results = {
        m: run_mode(m, service, Load(**{**load.__dict__, "run": m}), tmp_path / m)
        for m in ("direct", "queue", "durable")
    }
    direct, queue, durable = results["direct"], results["queue"], results["durable"]
    for r in results.values():
        assert r.sent == 5000 and r.lost_acknowledged == 0
        assert r.stored + r.lost == r.sent
    if direct.testbed == "namespaces":  # the database's CPU limit makes it the bottleneck
        assert direct.lost > 0.1 * direct.sent
        assert direct.bottleneck.startswith("db1 CPU"), direct.bottleneck
    assert queue.lost == 0 and durable.lost == 0
    assert queue.stored_per_s > direct.stored_per_s
