"""One mode of the log service at one offered load, on real servers, loss counted in the database.

Hosts (namespaces with cgroups when the machine allows, else loopback): `app1` (gunicorn running
the log service), `db1` (PostgreSQL or MariaDB, its CPU limited by `db_cpu` cores), `broker1`
(Redis, durable mode only) and `client1` (the driver, `python -m tierscope.apps.logservice.driver`).
The resource monitor samples every namespaced host. After the load, the service is drained (what
its queue still holds is written) and stopped cleanly, then every record id is looked up in the
database:

- sent: records the driver posted; acknowledged: answered 201; refused: 503 (not taken);
  timed out: no answer within the timeout (the record may still be stored);
- lost = sent but not stored; lost_acknowledged = acknowledged but not stored (must be 0).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tierscope.apps.logservice.app import MODES, LogServiceConfig
from tierscope.apps.logservice.driver import CONNECTION_ERROR, TIMEOUT, Load
from tierscope.services.databases import PORT, database_server

APP = "tierscope.apps.logservice.app:create_app()"
APP_PORT, REDIS_PORT = 8080, 6379


@dataclass(frozen=True)
class Service:
    """The service under test, the same in every mode."""

    dbms: str = "postgresql"
    db_cpu: float | None = 0.1  # cores of the database host (None: no limit)
    fsync: bool = True
    app_workers: int = 2
    app_threads: int = 256  # like a servlet container: many threads, few connections
    pool_size: int = 4  # database connections per app worker
    db_timeout_s: float = 0.5  # the app's wait for a database connection
    auth_cache: bool = True
    collectors: int = 2
    batch_rows: int = 1000
    batch_ms: float = 50.0
    queue_max: int = 200_000

    def __post_init__(self):
        if self.dbms not in PORT:
            raise ValueError(f"dbms: expected one of {', '.join(PORT)}, got {self.dbms!r}")


@dataclass
class ModeResult:
    mode: str
    sent: int
    acknowledged: int
    refused: int
    timed_out: int
    connection_errors: int
    other: int
    stored: int
    lost: int
    lost_acknowledged: int
    timed_out_stored: int
    load_s: float
    stored_per_s: float
    p90_ms: float | None
    bottleneck: str = ""  # the most saturated resource during the load, "db1 CPU quota 71 %"
    testbed: str = ""
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def count(outcomes: pa.Table, stored: set[str]) -> dict:
    """The counts of a mode's outcomes against the ids in the database (pure)."""
    status = outcomes["status"]
    ids = outcomes["id"].to_pylist()
    sent = set(ids)
    acked = set(outcomes.filter(pc.equal(status, 201))["id"].to_pylist())
    timed = set(outcomes.filter(pc.equal(status, TIMEOUT))["id"].to_pylist())
    n = {
        k: int(pc.sum(pc.equal(status, v)).as_py() or 0)
        for k, v in (
            ("acknowledged", 201),
            ("refused", 503),
            ("timed_out", TIMEOUT),
            ("connection_errors", CONNECTION_ERROR),
        )
    }
    span = (pc.max(outcomes["done_ns"]).as_py() - pc.min(outcomes["sent_ns"]).as_py()) / 1e9 if ids else 0.0
    ok = outcomes.filter(pc.equal(status, 201))
    lat = pc.subtract(ok["done_ns"], ok["sent_ns"])
    p90 = pc.quantile(lat, 0.9)[0].as_py() / 1e6 if ok.num_rows else None
    stored_here = len(sent & stored)
    return dict(
        sent=len(ids),
        **n,
        other=len(ids) - sum(n.values()),
        stored=stored_here,
        lost=len(sent - stored),
        lost_acknowledged=len(acked - stored),
        timed_out_stored=len(timed & stored),
        load_s=round(span, 3),
        stored_per_s=round(stored_here / span, 1) if span > 0 else 0.0,
        p90_ms=p90,
    )


def bottleneck(resources: pa.Table | None, start_ns: int, end_ns: int) -> str:
    """The most saturated resource during the load, from the white box's shares above 95 %
    (`analysis.whitebox`): "db1 CPU quota 71 %" (share of the samples), or the busiest CPU when
    nothing reaches 95 %: "app1 CPU mean 61 %"."""
    from tierscope.analysis.whitebox import resource_of, whitebox

    if resources is None or resources.num_rows == 0:
        return ""
    inside = resources.filter(
        pc.and_(pc.greater_equal(resources["ts_ns"], start_ns), pc.less_equal(resources["ts_ns"], end_ns))
    )
    rows = [r for r in whitebox([(0, inside)]).shares.to_pylist() if r["metric"] not in ("cpu_user", "cpu_system")]
    if not rows:
        return ""
    top = max(rows, key=lambda r: (r["share_above"], r["mean"]))
    if top["share_above"] > 0:
        return f"{top['host']} {resource_of(top['metric'])} {100 * top['share_above']:.0f} %"
    cpu = max((r for r in rows if r["metric"] == "cpu_util"), key=lambda r: r["mean"], default=top)
    return f"{cpu['host']} {resource_of(cpu['metric'])} mean {cpu['mean']:.0f} %"


def run_mode(
    mode: str,
    service: Service,
    load: Load,
    workdir: Path,
    *,
    testbed_mode: str = "auto",
    phase: Callable[[str], None] = lambda s: None,
    crash: Callable | None = None,
) -> ModeResult:
    """Run `mode` under `load`; tables in `workdir` (outcomes.parquet, resources.parquet, result.json).

    `crash(app, hosts)`: called once the load has started (tests kill the app with it)."""
    from tierscope.apps.dal import Database
    from tierscope.apps.logservice import schema
    from tierscope.services.appserver import AppServer
    from tierscope.services.redis import Redis
    from tierscope.spec import NodeType
    from tierscope.testbed.lab import Testbed, free_lab

    if mode not in MODES:
        raise ValueError(f"mode: expected one of {', '.join(MODES)}, got {mode!r}")
    workdir.mkdir(parents=True, exist_ok=True)
    db_nt = NodeType(cpu=service.db_cpu) if service.db_cpu else None
    services: list = []
    with Testbed(lab=free_lab(), workdir=workdir / "testbed", mode=testbed_mode) as tb:
        phase("building hosts")
        hosts = tb.up_hosts([("app1", None), ("db1", db_nt), ("broker1", None), ("client1", None)])
        try:
            phase("starting the database")
            db_host = hosts["db1"]
            dbs, db_cfg = database_server(
                service.dbms,
                db_host,
                PORT[service.dbms],
                workdir / "db1",
                database="logs",
                fsync=service.fsync,
                max_connections=service.app_workers * (service.pool_size + 2) + 10,
                name="db1",
            )
            services.append(dbs.start())
            dbs.create_database("logs")
            cfg = LogServiceConfig(
                mode=mode,
                dbms=service.dbms,
                db_host=db_cfg.host,
                db_port=db_cfg.port,
                db_user=db_cfg.user,
                db_password=db_cfg.password,
                db_name=db_cfg.database,
                pool_size=service.pool_size,
                db_timeout_s=service.db_timeout_s,
                auth_cache=service.auth_cache,
                collectors=service.collectors,
                batch_rows=service.batch_rows,
                batch_ms=service.batch_ms,
                queue_max=service.queue_max,
                redis_url=f"redis://{hosts['broker1'].address}:{REDIS_PORT}/0" if mode == "durable" else "",
            )
            db = Database(cfg.db())
            try:
                schema.create(db, load.clients)
            finally:
                db.close()
            if mode == "durable":
                phase("starting the broker")
                services.append(Redis(hosts["broker1"], REDIS_PORT, workdir / "broker1", name="broker1").start())
            phase("starting the log service")
            app = AppServer(
                hosts["app1"],
                APP_PORT,
                workdir / "app1",
                app=APP,
                app_env=cfg.env(),
                health_path="/health",
                workers=service.app_workers,
                threads=service.app_threads,
                connections=max(1000, load.clients),
                backlog=max(2048, load.clients),
                name="app1",
            )
            services.append(app.start())
            monitor = tb.start_monitor(0.25, workdir / "resources.parquet")
            phase(f"{mode}: {load.clients} clients x {load.records} records")
            outcomes_path = workdir / "outcomes.parquet"
            argv = [
                sys.executable,
                "-m",
                "tierscope.apps.logservice.driver",
                "--host",
                hosts["app1"].address,
                "--port",
                str(APP_PORT),
                "--out",
                str(outcomes_path),
                "--load",
                json.dumps(asdict(load)),
            ]
            proc = subprocess.Popen(
                hosts["client1"].wrap(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            if crash is not None:
                crash(app, hosts)
            out, err = proc.communicate(timeout=load.records * load.timeout_s + load.start_spread_s + 120)
            if proc.returncode != 0:
                raise RuntimeError(f"driver failed ({proc.returncode}): {err.strip()[-2000:]}")
            outcomes = pq.read_table(outcomes_path)
            phase(f"{mode}: draining")
            if not app.running():
                app.start()  # the crashed app's replacement claims what its predecessor left pending
            _drain(app, mode, deadline_s=60 if mode == "durable" else 20)
            app.stop()
            monitor.stop()
            db = Database(cfg.db())
            try:
                stored = schema.stored_ids(db)
            finally:
                db.close()
        finally:
            for s in reversed(services):
                s.stop()
        resources = pq.read_table(workdir / "resources.parquet") if (workdir / "resources.parquet").exists() else None
        counts = count(outcomes, stored)
        start, end = pc.min(outcomes["sent_ns"]).as_py(), pc.max(outcomes["done_ns"]).as_py()
        result = ModeResult(mode=mode, **counts, bottleneck=bottleneck(resources, start, end), testbed=tb.mode or "")
        if tb.lost:
            result.notes.append("loopback testbed: no CPU limit on the database, " + "; ".join(tb.lost))
    (workdir / "result.json").write_text(json.dumps(result.as_dict(), indent=2) + "\n")
    return result


def _drain(app, mode: str, deadline_s: float) -> None:
    """Wait until the service's queues are empty (every worker's /stats says so twice running)."""
    import urllib.request

    if mode == "direct":
        return
    end, quiet = time.monotonic() + deadline_s, 0
    while time.monotonic() < end and quiet < 6:
        try:
            with urllib.request.urlopen(app.url + "/stats", timeout=2) as r:
                queued = json.loads(r.read()).get("queued")
        except OSError:
            queued = None
        quiet = quiet + 1 if queued == 0 else 0
        time.sleep(0.25)
