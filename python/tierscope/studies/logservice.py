"""Seed 003's log-service study (`tierscope run ingest`): one mode of the log service (apps.logservice)
at one offered load, on real servers, loss counted in the database.

Hosts (namespaces with cgroups when the machine allows, else loopback): `app1` (gunicorn running
the log service), `db1` (PostgreSQL or MariaDB, its CPU limited by `db_cpu` cores), `broker1`
(Redis, durable mode only, `appendfsync always` and a password made for the run) and `client1`
(the driver, `python -m tierscope.apps.logservice.driver`, given the clients' tokens, random per
run, in a 0600 file). A supervisor (`apps.logservice.supervisor.Supervisor`) restarts the database, the broker and
the app server when one dies. The resource monitor samples every namespaced host. After the load,
the service is drained (what its queue still holds is written) and stopped cleanly, then every
record is looked up in the database by (client, id):

- sent: records the driver posted; acknowledged: answered 201; refused: 503 (not taken);
  timed out: no answer within the timeout (the record may still be stored);
- lost = sent but not stored; lost_acknowledged = acknowledged but not stored (must be 0).

Once the driver has finished, the counts are always returned: a drain or a stop that fails is
noted (`notes`), and when the database cannot be read after 60 s `stored`, `lost` and
`lost_acknowledged` are None (unknown) with the reason in `error`.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tierscope.analysis.whitebox import MIN_SHARE, resource_of, whitebox
from tierscope.apps.dal import Database
from tierscope.apps.logservice import schema
from tierscope.apps.logservice.app import MODES, LogServiceConfig
from tierscope.apps.logservice.driver import CONNECTION_ERROR, TIMEOUT, Load
from tierscope.apps.logservice.supervisor import Supervisor
from tierscope.services.appserver import AppServer
from tierscope.services.databases import PORT, database_server
from tierscope.services.redis import APPENDFSYNC, Redis
from tierscope.spec import NodeType
from tierscope.testbed import cgroups
from tierscope.testbed.lab import Testbed

APP = "tierscope.apps.logservice.app:create_app()"
APP_PORT, REDIS_PORT = 8080, 6379


@dataclass(frozen=True)
class Service:
    """The service under test, the same in every mode."""

    dbms: str = "postgresql"
    db_cpu: float | None = 0.1  # cores of the database host (None: no limit)
    db_cpu_period: float = 0.1  # its CFS period, seconds (the quota, db_cpu x period, is at least 1 ms)
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
    broker_fsync: str = "always"  # the broker's appendfsync: always, everysec or no
    supervise: bool = True  # restart the database, the broker and the app server when they die

    def __post_init__(self):
        if self.dbms not in PORT:
            raise ValueError(f"dbms: expected one of {', '.join(PORT)}, got {self.dbms!r}")
        if not 0.001 <= self.db_cpu_period <= 1.0:
            raise ValueError(f"db_cpu_period: expected 0.001 to 1 s, got {self.db_cpu_period}")
        if self.db_cpu and self.db_cpu * self.db_cpu_period < 0.001:
            raise ValueError(
                f"db_cpu: a quota of {1000 * self.db_cpu * self.db_cpu_period:g} ms per {self.db_cpu_period:g} s "
                "period is below the kernel's 1 ms (raise db_cpu_period)"
            )
        if self.broker_fsync not in APPENDFSYNC:
            raise ValueError(f"broker_fsync: expected one of {', '.join(APPENDFSYNC)}, got {self.broker_fsync!r}")


@dataclass
class ModeResult:
    mode: str
    sent: int
    acknowledged: int
    refused: int
    timed_out: int
    connection_errors: int
    other: int
    stored: int | None  # None: the database could not be read (see `error`)
    lost: int | None
    lost_acknowledged: int | None
    timed_out_stored: int | None
    load_s: float
    stored_per_s: float
    p90_ms: float | None
    bottleneck: str = ""  # the most saturated resource during the load, "db1 CPU quota 71 %"
    # the saturated resources during the load (`saturated`), most saturated first: [] = none
    saturated: list[dict] = field(default_factory=list)
    testbed: str = ""
    notes: list[str] = field(default_factory=list)
    error: str = ""  # why the stored records could not be counted

    def as_dict(self) -> dict:
        return asdict(self)


def count(outcomes: pa.Table, stored: set[tuple[int, str]] | None) -> dict:
    """The counts of a mode's outcomes against the (client, id) keys in the database (pure);
    `stored` None: the database could not be read, the stored and lost counts are None."""
    status = outcomes["status"]
    keys = list(zip(outcomes["client"].to_pylist(), outcomes["id"].to_pylist()))
    sent = set(keys)

    def keyset(mask) -> set:
        t = outcomes.filter(mask)
        return set(zip(t["client"].to_pylist(), t["id"].to_pylist()))

    acked = keyset(pc.equal(status, 201))
    timed = keyset(pc.equal(status, TIMEOUT))
    n = {
        k: int(pc.sum(pc.equal(status, v)).as_py() or 0)
        for k, v in (
            ("acknowledged", 201),
            ("refused", 503),
            ("timed_out", TIMEOUT),
            ("connection_errors", CONNECTION_ERROR),
        )
    }
    span = (pc.max(outcomes["done_ns"]).as_py() - pc.min(outcomes["sent_ns"]).as_py()) / 1e9 if keys else 0.0
    ok = outcomes.filter(pc.equal(status, 201))
    lat = pc.subtract(ok["done_ns"], ok["sent_ns"])
    p90 = pc.quantile(lat, 0.9)[0].as_py() / 1e6 if ok.num_rows else None
    stored_here = len(sent & stored) if stored is not None else None
    return dict(
        sent=len(keys),
        **n,
        other=len(keys) - sum(n.values()),
        stored=stored_here,
        lost=len(sent - stored) if stored is not None else None,
        lost_acknowledged=len(acked - stored) if stored is not None else None,
        timed_out_stored=len(timed & stored) if stored is not None else None,
        load_s=round(span, 3),
        stored_per_s=round(stored_here / span, 1) if span > 0 and stored_here is not None else 0.0,
        p90_ms=p90,
    )


def bottleneck(resources: pa.Table | None, start_ns: int, end_ns: int) -> str:
    """The most saturated resource during the load, from the white box's shares above 95 %
    (`analysis.whitebox`): "db1 CPU quota 71 %" (share of the samples), or the busiest CPU when
    nothing reaches 95 %: "app1 CPU mean 61 %"."""
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


#: a host's CPU whose mean over the load reaches this share of its allowance is saturated
#: (a quota or a cpuset cannot give more, whatever its samples' jitter)
SATURATED_MEAN = 90.0


def saturated(resources: pa.Table | None, start_ns: int, end_ns: int) -> list[dict]:
    """The resources saturated during the load, most saturated first: a host's resource with at
    least half its samples above 95 % (the white box's rule, `docs/analysis.md`), or a CPU whose
    mean reaches `SATURATED_MEAN` % of its allowance (a quota of a few milliseconds per period
    reads as 0 % or 200 % from one sample to the next). One entry per host and resource ("CPU"
    for both its utilisation and its quota): {"host", "resource", "share_above", "mean"}."""
    if resources is None or resources.num_rows == 0:
        return []
    inside = resources.filter(
        pc.and_(pc.greater_equal(resources["ts_ns"], start_ns), pc.less_equal(resources["ts_ns"], end_ns))
    )
    if inside.num_rows == 0:
        return []
    rows = [r for r in whitebox([(0, inside)]).shares.to_pylist() if r["metric"] not in ("cpu_user", "cpu_system")]
    cpu_mean = {r["host"]: r["mean"] for r in rows if r["metric"] == "cpu_util"}  # of the allowance
    out: dict[tuple[str, str], dict] = {}
    for r in rows:
        resource = "CPU" if resource_of(r["metric"]) == "CPU quota" else resource_of(r["metric"])
        by_mean = r["metric"] == "cpu_util" and r["mean"] >= SATURATED_MEAN
        if r["share_above"] < MIN_SHARE and not by_mean:
            continue
        key = (r["host"], resource)
        share = max(r["share_above"], out[key]["share_above"] if key in out else 0.0)
        mean = cpu_mean.get(r["host"], r["mean"]) if resource == "CPU" else r["mean"]
        out[key] = {"host": r["host"], "resource": resource, "share_above": round(share, 3), "mean": round(mean, 1)}
    return sorted(out.values(), key=lambda d: (-d["share_above"], -d["mean"], d["host"]))


def describe_saturated(items: list[dict]) -> str:
    """The table's cell: "db1 CPU (85 % of samples > 95 %)", "db1 CPU (its whole allowance)" (by
    its mean), or "none"."""
    if not items:
        return "none"
    return ", ".join(
        f"{d['host']} {d['resource']} "
        + (
            f"({100 * d['share_above']:.0f} % of samples > 95 %)"
            if d["share_above"] >= MIN_SHARE
            else "(its whole allowance)"
        )
        for d in items
    )


def _percent(part: int, whole: int) -> str:
    p = 100 * part / max(1, whole)
    return f"{p:.1f} %" if p < 99.95 else "100 %"


def _and(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def finding(results: list[ModeResult]) -> str:
    """The study's verdict across its modes, in words: "direct loses 99.2 % of the records (4,958
    of 5,000) with db1's CPU saturated; queue and durable lose none"."""
    parts, lossless = [], []
    for r in results:
        if r.lost is None:
            parts.append(f"{r.mode}: loss unknown ({r.error or 'the database was not read'})")
        elif r.lost == 0:
            lossless.append(r.mode)
        else:
            if r.testbed and r.testbed != "namespaces":
                why = "(loopback: resources not measured)"
            else:
                names = [f"{d['host']}'s {d['resource']}" for d in r.saturated]
                why = f"with {_and(names)} saturated" if names else "with no resource saturated"
            parts.append(f"{r.mode} loses {_percent(r.lost, r.sent)} of the records ({r.lost:,} of {r.sent:,}) {why}")
        if r.lost_acknowledged:
            parts.append(f"{r.mode} lost {r.lost_acknowledged:,} acknowledged records")
    if lossless:
        parts.append(f"{_and(lossless)} lose{'s' if len(lossless) == 1 else ''} none")
    return "; ".join(parts)


def run_mode(
    mode: str,
    service: Service,
    load: Load,
    workdir: Path,
    *,
    testbed_mode: str = "auto",
    phase: Callable[[str], None] = lambda s: None,
    fault: Callable[..., None] | None = None,
) -> ModeResult:
    """Run `mode` under `load`; tables in `workdir` (outcomes.parquet, resources.parquet, result.json).

    `fault(servers, hosts, supervisor)`: called once the load has started, with the running servers
    by role ({"app": AppServer, "db": the database, "broker": Redis in durable mode}) and the
    supervisor (None when `service.supervise` is off; holding its `lock` delays its restarts); the
    kill drills kill one of the servers with it, and the supervisor brings it back."""
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {', '.join(MODES)}, got {mode!r}")
    workdir.mkdir(parents=True, exist_ok=True)
    secrets_dir = workdir / "secrets"
    secrets_dir.mkdir(mode=0o700, exist_ok=True)
    secrets_dir.chmod(0o700)
    db_nt = NodeType(cpu=service.db_cpu, cpu_period=service.db_cpu_period) if service.db_cpu else None
    limited = ""  # the database host's cgroup while it has its limit
    services: list = []
    notes: list[str] = []
    supervisor: Supervisor | None = None
    stored: set | None = None
    error = ""
    with Testbed(lab=None, workdir=workdir / "testbed", mode=testbed_mode) as tb:
        phase("building hosts")
        # the database host starts without a CPU limit (a few thousandths of a core would take
        # minutes to start PostgreSQL and create the tables); it gets `db_cpu` for the load and
        # the drain, and loses it again for the read-back
        hosts = tb.up_hosts([("app1", None), ("db1", None), ("broker1", None), ("client1", None)])
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
            dbs.create_database("logs")  # type: ignore[attr-defined]  # the PostgreSQL and MariaDB servers have it
            broker = None
            if mode == "durable":
                broker = Redis(
                    hosts["broker1"], REDIS_PORT, workdir / "broker1", appendfsync=service.broker_fsync, name="broker1"
                )
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
                redis_url=f"redis://{hosts['broker1'].address}:{REDIS_PORT}/0" if broker else "",
                redis_password=broker.password if broker else "",
            )
            db = Database(_own(cfg))
            try:
                tokens = schema.create(db, load.clients)
            finally:
                db.close()
            tokens_path = schema.write_tokens(secrets_dir / "tokens.json", tokens)
            if broker is not None:
                phase("starting the broker")
                services.append(broker.start())
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
            roles = {"db": dbs, "app": app, **({"broker": broker} if broker else {})}
            if service.supervise:
                supervisor = Supervisor({s.name: s for s in roles.values()}).start()
            if not _wait_workers(app, service.app_workers, deadline_s=60):
                notes.append(f"not every one of the {service.app_workers} app workers answered before the load")
            db_cgroup = hosts["db1"].cgroup
            if db_nt is not None and db_cgroup:
                _limit_cpu(db_cgroup, db_nt)
                tb.node_types["db1"] = db_nt  # the monitor's 100 % of cpu_util: the quota
                limited = db_cgroup
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
                "--tokens",
                str(tokens_path),
                "--load",
                json.dumps(asdict(load)),
            ]
            proc = subprocess.Popen(
                hosts["client1"].wrap(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            if fault is not None:
                fault(roles, hosts, supervisor)
            out, err = proc.communicate(timeout=load.records * load.timeout_s + load.start_spread_s + 120)
            if proc.returncode != 0:
                raise RuntimeError(f"driver failed ({proc.returncode}): {err.strip()[-2000:]}")
            outcomes = pq.read_table(outcomes_path)
            # from here on, the counts are always returned: what fails is noted
            phase(f"{mode}: draining")
            try:
                _wait_back(supervisor, deadline_s=90)
                if not _drain(app, mode, deadline_s=180, workers=service.app_workers):
                    notes.append("drain: the queue was not empty within the deadline")
            except Exception as e:
                notes.append(f"drain failed: {type(e).__name__}: {e}")
            if supervisor is not None:
                supervisor.stop()
                notes.extend(supervisor.summary())
            try:
                app.stop()
            except Exception as e:
                notes.append(f"stopping the app failed: {type(e).__name__}: {e}")
            monitor.stop()
            if limited:
                _limit_cpu(limited, None)
            stored, error = _stored(cfg, deadline_s=60)
        finally:
            if supervisor is not None:
                supervisor.stop()
            if limited:  # a failed mode: its servers stop at full speed
                with contextlib.suppress(OSError):
                    _limit_cpu(limited, None)
            for s in reversed(services):
                try:
                    s.stop()
                except Exception as e:
                    notes.append(f"stopping {s.name} failed: {type(e).__name__}: {e}")
        resources = pq.read_table(workdir / "resources.parquet") if (workdir / "resources.parquet").exists() else None
        counts = count(outcomes, stored)
        start, end = pc.min(outcomes["sent_ns"]).as_py(), pc.max(outcomes["done_ns"]).as_py()
        try:
            neck, full = bottleneck(resources, start, end), saturated(resources, start, end)
        except Exception as e:
            neck, full = "", []
            notes.append(f"bottleneck: {type(e).__name__}: {e}")
        result = ModeResult(
            mode=mode, **counts, bottleneck=neck, saturated=full, testbed=tb.mode or "", notes=notes, error=error
        )
        if tb.lost:
            result.notes.append("loopback testbed: no CPU limit on the database, " + "; ".join(tb.lost))
    (workdir / "result.json").write_text(json.dumps(result.as_dict(), indent=2) + "\n")
    return result


def _limit_cpu(cgroup: str, node_type) -> None:
    """Give a host's cgroup the CPU quota of `node_type` (None: no limit) while it runs."""
    cpu = cgroups.path("cpu", cgroup)
    (cpu / "cpu.cfs_quota_us").write_text("-1")  # first: a period below the old quota is refused
    if node_type is not None and node_type.cpu:
        period_us = int(round(node_type.cpu_period * 1e6))
        (cpu / "cpu.cfs_period_us").write_text(str(period_us))
        (cpu / "cpu.cfs_quota_us").write_text(str(int(round(node_type.cpu * period_us))))


def _own(cfg: LogServiceConfig):
    """The experiment's own database connection (the schema, the read-back): one connection that
    waits up to 30 s, not the app's short `db_timeout_s` (a database host of a few hundredths of a
    core takes longer than that to log a connection in)."""
    return replace(cfg.db(), pool_size=1, pool_timeout_s=30.0)


def _stored(cfg: LogServiceConfig, deadline_s: float) -> tuple[set | None, str]:
    """The stored (client, id) keys, asking again until `deadline_s` passes; (None, why) then."""
    end, why = time.monotonic() + deadline_s, ""
    while True:
        try:
            db = Database(_own(cfg))
            try:
                return schema.stored_keys(db), ""
            finally:
                db.close()
        except Exception as e:
            why = f"{type(e).__name__}: {e}"
        if time.monotonic() > end:
            return None, f"stored records not counted: the database did not answer within {deadline_s:.0f} s ({why})"
        time.sleep(1.0)


def _wait_back(supervisor, deadline_s: float) -> None:
    """Wait until the supervisor has brought back every server that died (or the deadline)."""
    if supervisor is None:
        return
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and any(r.back_s is None for r in supervisor.restarts):
        time.sleep(0.2)


def _wait_workers(app, workers: int, deadline_s: float) -> bool:
    """Wait until `workers` different app workers have answered /stats (each answers once it has
    opened its connections and read the tokens), so that none is still starting when the
    database gets its limit; False when they had not within `deadline_s`."""
    seen: set = set()
    end = time.monotonic() + deadline_s
    while len(seen) < workers and time.monotonic() < end:
        try:
            with urllib.request.urlopen(app.url + "/stats", timeout=2) as r:
                seen.add(json.loads(r.read()).get("pid"))
        except OSError:
            time.sleep(0.1)
    return len(seen) >= workers


def _drain(app, mode: str, deadline_s: float, workers: int = 1) -> bool:
    """Wait until the service's queues are empty: every one of its `workers` says so (its /stats,
    records waiting or being written), six readings running; False when they were not within
    `deadline_s`. (Each reading lands on one worker: one worker's empty queue says nothing of the
    others'.)"""
    if mode == "direct":
        return True
    if mode == "durable":
        workers = 1  # the broker's stream is every worker's: one reading counts all
    end, quiet = time.monotonic() + deadline_s, 0
    last: dict = {}  # worker pid -> (its last `queued`, when); a dead worker's reading expires
    while time.monotonic() < end and quiet < 6:
        now = time.monotonic()
        try:
            with urllib.request.urlopen(app.url + "/stats", timeout=2) as r:
                doc = json.loads(r.read())
            last[doc.get("pid")] = (doc.get("queued"), now)
        except OSError:
            last.clear()  # a worker that does not answer may hold records
        recent = [q for q, at in last.values() if now - at < 5.0]
        quiet = quiet + 1 if len(recent) >= workers and all(q == 0 for q in recent) else 0
        time.sleep(0.25)
    return quiet >= 6
