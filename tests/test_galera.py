"""Galera as a database tier (tierscope.services.galera): a real 3-node cluster of MariaDB 10.11 with
Debian's galera-4 on loopback (distinct ports per node), then RUBBoS on a `1/1/0/2G` topology
end to end in the lab's namespaced hosts.

Ground truth: what the test wrote on one node and reads on another; the nodes' own wsrep status
counters; the process table after stopping; the generator's and the tracer's counts per server.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
import tomllib
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pymysql
import pytest

from tierscope.apps import snapshot
from tierscope.apps.dal import Database, hosts_of
from tierscope.contracts.dbms import DbConfig
from tierscope.services.base import ServiceError, free_port, tcp_answers
from tierscope.services.credentials import LAB_USER
from tierscope.services.databases import client_config, data_dbms, dbms_name
from tierscope.services.galera import GaleraCluster, cluster_serving, provider_library
from tierscope.services.mariadb import MariaDB
from tierscope.spec import SpecError, db_topology_problem, parse_notation, spec_from_dict
from tierscope.testbed.host import Host

TINY = Path(__file__).resolve().parent.parent / "examples" / "specs" / "tiny.toml"

needs_galera = [
    pytest.mark.skipif(os.geteuid() != 0, reason="MariaDB runs as its own OS user: needs root"),
    pytest.mark.skipif(not Path("/usr/lib/galera/libgalera_smm.so").exists(), reason="galera-4 not installed"),
    pytest.mark.skipif(not shutil.which("rsync"), reason="rsync not installed (the SST method)"),
]


# --- the spec: the letter G --------------------------------------------------------------------


def test_the_letter_g_is_a_galera_cluster_without_middleware():
    t = parse_notation("1/1/0/3G")
    assert t["db"] == {"count": 3, "node_type": None, "dbms": "galera"}
    assert parse_notation("1/2/0/2GL")["db"] == {"count": 2, "node_type": "L", "dbms": "galera"}
    assert parse_notation("1/2/0/2L-G")["db"] == {"count": 2, "node_type": "L", "dbms": "galera"}
    assert db_topology_problem("galera", 3, 0) is None
    assert db_topology_problem("galera", 1, 0) is None
    assert "replicates by itself" in db_topology_problem("galera", 2, 1)
    assert "no clustering middleware" in db_topology_problem("mariadb", 2, 0)  # plain MariaDB: still refused
    assert "no clustering middleware" in db_topology_problem("postgres", 2, 0)


def _spec(topology: str, **extra) -> dict:
    raw = tomllib.loads(TINY.read_text())
    raw["topology"] = topology
    raw.update(extra)
    return raw


def test_a_galera_spec_loads_and_says_its_notation():
    spec = spec_from_dict(_spec("1/1/0/3G"), where="g.toml", name="g")
    from tierscope.spec import expand

    c = expand(spec)[0].config
    assert c.topology.db.dbms == "galera" and c.notation() == "1S/1S/0/3S-G"
    assert [s.name for s in c.tier_servers("db")] == ["db1", "db2", "db3"]
    assert {s.dbms for s in c.tier_servers("db")} == {"galera"}
    c2 = expand(spec_from_dict(_spec("1/1/0/2", dbms="G"), where="g.toml", name="g"))[0].config
    assert c2.topology.db.dbms == "galera" and c2.topology.db.count == 2


@pytest.mark.parametrize(
    "topology, expected",
    [
        ("1/1/1/2G", "g.toml: topology: the topology has 1 clustering middleware server(s) with galera"),
        ("1/1/0/2M", "g.toml: topology: the topology has 2 database servers and no clustering middleware"),
    ],
)
def test_galera_with_middleware_is_refused(topology, expected):
    with pytest.raises(SpecError) as err:
        spec_from_dict(_spec(topology), where="g.toml", name="g")
    assert expected in str(err.value)


def test_g_is_no_longer_a_node_type():
    raw = _spec("1/1/0/1")
    raw["node_types"]["G"] = {"cpu": 1}
    with pytest.raises(SpecError, match="G \\(Galera\\): those are DBMS letters"):
        spec_from_dict(raw, where="g.toml", name="g")


def test_galera_is_mariadb_to_the_apps_and_the_tracer():
    from tierscope.services import databases

    assert dbms_name("galera") == "galera" and data_dbms("galera") == "mariadb"
    assert databases.PORT["galera"] == 3306 and databases.PROTOCOL["galera"] == "mysql"


def test_a_host_list_names_every_node():
    assert hosts_of("10.0.0.2", 3306) == [("10.0.0.2", 3306)]
    assert hosts_of("10.0.0.2:3307, 10.0.0.3", 3306) == [("10.0.0.2", 3307), ("10.0.0.3", 3306)]
    assert hosts_of("::1", 3306) == [("::1", 3306)] and hosts_of("[::1]:3307", 1) == [("::1", 3307)]
    with pytest.raises(ValueError):
        hosts_of(" , ", 3306)


def test_the_factory_makes_the_database_servers_of_one_point_one_cluster(tmp_path):
    from tierscope.services import galera
    from tierscope.services.databases import database_server

    h = Host.loopback()
    made = [
        database_server("galera", h, 3306, tmp_path / "point" / f"db{i}", database="rubbos", name=f"db{i}")
        for i in (1, 2, 3)
    ]
    nodes = [svc for svc, _ in made]
    assert {id(n.cluster) for n in nodes} == {id(nodes[0].cluster)} and nodes[0].cluster.nodes == nodes
    assert len({n.group_port for n in nodes}) == 3  # loopback: a group port each
    assert len(nodes[0].cluster.name) <= 32  # gcomm's limit, whatever the point's name
    with pytest.raises(ValueError, match="32"):
        GaleraCluster("x" * 33)
    assert all(cfg.dbms == "mariadb" and cfg.port == 3306 and cfg.user == LAB_USER for _, cfg in made)
    other, _ = database_server("galera", h, 3306, tmp_path / "other" / "db1", database="rubbos", name="db1")
    assert other.cluster is not nodes[0].cluster
    assert nodes[0].cluster not in galera._CLUSTERS.values()  # never started: forgotten for the next point
    for n in nodes:  # as if every node had run and stopped: the directory's next node starts a new cluster
        n.started = True
    again, _ = database_server("galera", h, 3306, tmp_path / "other" / "db2", database="rubbos", name="db2")
    assert again.cluster is other.cluster
    ns = Host(name="db1", address="10.77.0.2", netns="tierscope-x-db1")
    inside, _ = database_server("galera", ns, 3306, tmp_path / "ns" / "db1", database="rubbos", name="db1")
    assert (inside.group_port, inside.ist_port, inside.sst_port) == (4567, 4568, 4444)  # own address: defaults
    galera._CLUSTERS.clear()


# --- a real 3-node cluster on loopback ---------------------------------------------------------


@pytest.fixture(scope="module")
def labdir():
    """A work directory outside /tmp/pytest-of-root: every pytest session that starts (another
    one on this machine, too) resets that directory to mode 0700, and the servers, running as
    `mysql`, could then no longer reach their own files in the middle of a test."""
    d = Path(tempfile.mkdtemp(prefix="tierscope-galera-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _connect(node, db="lab", **kw):
    return pymysql.connect(
        host=node.host.address,
        port=node.port,
        user=node.credentials.user,
        password=node.credentials.password,
        database=db,
        autocommit=True,
        connect_timeout=5,
        **kw,
    )


def _one(node, sql, db="lab"):
    with _connect(node, db) as conn, conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetchall()


@pytest.fixture(scope="module")
def cluster(labdir):
    """Three nodes started from copies of one MariaDB snapshot (a table `t` with one row), the way
    the runner starts them; stopped at the end, and the test checks nothing is left."""
    for mark in needs_galera:
        if mark.args[0]:
            pytest.skip(mark.kwargs["reason"])
    provider_library()
    root = labdir / "cluster"
    host = Host.loopback()
    seed = MariaDB(host, free_port(), root / "seed", durable=False, buffer_pool="32M")
    with seed:
        seed.create_database("lab")
        seed.sql("CREATE TABLE t (id INT PRIMARY KEY AUTO_INCREMENT, v VARCHAR(40), n INT DEFAULT 0)", db="lab")
        seed.sql("INSERT INTO t (v) VALUES ('from the snapshot')", db="lab")
    c = GaleraCluster("test-galera")
    nodes = [
        c.node(host, free_port(), root / f"db{i}", durable=False, buffer_pool="32M", max_connections=50, name=f"db{i}")
        for i in (1, 2, 3)
    ]
    for n in nodes:
        snapshot.copy_tree(seed.data_dir, n.data_dir)
    try:
        c.start()
        yield c
    finally:
        pids = [p for n in c.nodes for p in n.pids()]
        c.stop()
        for n in c.nodes:
            assert not tcp_answers(n.host.address, n.port)
            assert not tcp_answers(n.host.address, n.group_port)
        assert not any(os.path.exists(f"/proc/{p}") for p in pids)


@pytest.mark.usefixtures("cluster")
class TestThreeNodes:
    # the tests share one cluster and run in this order; the last one kills a node

    def test_three_nodes_synced_in_one_cluster_that_kept_the_snapshot_state(self, cluster):
        status = cluster.wait_for_size(3, timeout=30)
        assert set(status) == {"db1", "db2", "db3"}
        for s in status.values():
            assert s["wsrep_cluster_size"] == "3" and s["wsrep_local_state_comment"] == "Synced"
            assert s["wsrep_cluster_status"] == "Primary" and s["wsrep_ready"] == "ON"
            assert s["wsrep_cluster_state_uuid"] == cluster.state_uuid  # seeded: the snapshot's state
        assert len({s["wsrep_last_committed"] for s in status.values()}) == 1
        # each joiner caught up by IST from its donor's gcache, no SST: its error log says so
        for n in cluster.nodes[1:]:
            log = n.error_log.read_text()
            assert "IST received" in log and "SST received: 00000000" not in log
            assert "rsync SST completed on joiner" not in log  # the script ran in bypass (IST) mode only
        # every node had the snapshot's row before any replication
        assert {_one(n, "SELECT v FROM t WHERE id = 1")[0][0] for n in cluster.nodes} == {"from the snapshot"}

    def test_a_row_written_on_node_1_is_read_on_node_3_and_back(self, cluster):
        n1, _, n3 = cluster.nodes
        _one(n1, "INSERT INTO t (v) VALUES ('written on db1')")
        # the commit on db1 returned after certification; db3 applies it asynchronously, but with
        # wsrep_sync_wait = 1 a read waits until db3 has applied everything committed before it
        with _connect(n3) as conn, conn.cursor() as cur:
            cur.execute("SET SESSION wsrep_sync_wait = 1")
            cur.execute("SELECT count(*) FROM t WHERE v = 'written on db1'")
            assert cur.fetchone()[0] == 1
        _one(n3, "INSERT INTO t (v) VALUES ('written on db3')")
        with _connect(n1) as conn, conn.cursor() as cur:
            cur.execute("SET SESSION wsrep_sync_wait = 1")
            cur.execute("SELECT count(*) FROM t WHERE v LIKE 'written on db%'")
            assert cur.fetchone()[0] == 2
        # auto-increment is interleaved by node (wsrep_auto_increment_control): no duplicate ids
        ids = [r[0] for r in _one(n1, "SELECT id FROM t ORDER BY id")]
        assert len(ids) == len(set(ids)) == 3

    def test_a_conflicting_write_fails_certification_with_a_deadlock_error(self, cluster):
        n1, n2, _ = cluster.nodes
        with _connect(n1) as a, _connect(n2) as b, a.cursor() as ca, b.cursor() as cb:
            ca.execute("BEGIN")
            ca.execute("UPDATE t SET n = n + 1 WHERE id = 1")  # local to db1 until COMMIT
            cb.execute("UPDATE t SET n = n + 10 WHERE id = 1")  # commits first, cluster-wide
            with pytest.raises(pymysql.err.OperationalError) as err:
                ca.execute("COMMIT")  # db1's transaction was aborted by the replicated write
            assert err.value.args[0] == 1213  # ER_LOCK_DEADLOCK: the client must retry
        with _connect(n1) as conn, conn.cursor() as cur:
            cur.execute("SET SESSION wsrep_sync_wait = 1")
            cur.execute("SELECT n FROM t WHERE id = 1")
            assert cur.fetchone()[0] == 10  # db2's write, once
        s1 = n1.wsrep_status()  # db1 counted the abort: by its applier (BF) or at certification
        assert int(s1["wsrep_local_bf_aborts"]) + int(s1["wsrep_local_cert_failures"]) >= 1

    def test_the_app_pool_spreads_sessions_over_every_node(self, cluster):
        n1 = cluster.nodes[0]
        base = n1.db_config("lab")
        assert cluster_serving(n1.host.address, n1.port) is None  # made by hand, not by the factory
        cfg = DbConfig(
            "mariadb",
            host=cluster.client_hosts(),
            port=n1.port,
            user=n1.credentials.user,
            password=n1.credentials.password,
            database="lab",
            pool_size=2,
        )
        assert client_config(base) == base
        db = Database(cfg)
        try:
            seen = []
            for _ in range(9):
                with db.session("r") as s:
                    seen.append(s.one("SELECT @@wsrep_node_name AS node")["node"])
            assert seen == ["db1", "db2", "db3"] * 3  # round robin, one session at a time
            assert db._impl.opened <= 2  # the pool bound holds over all nodes
        finally:
            db.close()
        assert db._impl.opened == 0

    def test_an_empty_node_joins_by_rsync_sst_and_leaves_cleanly(self, cluster, labdir):
        n1 = cluster.nodes[0]
        extra = cluster.node(
            n1.host, free_port(), labdir / "cluster" / "db4", durable=False, buffer_pool="32M", name="db4"
        )
        try:
            extra.start()
            assert cluster.wait_for_size(4, timeout=60)["db4"]["wsrep_local_state_comment"] == "Synced"
            log = extra.error_log.read_text()
            assert "rsync SST completed on joiner" in log
            assert _one(extra, "SELECT count(*) FROM t")[0][0] == 3
        finally:
            extra.stop()
            cluster.nodes.remove(extra)
        cluster.wait_for_size(3, timeout=30)  # a clean shutdown is a graceful leave

    def test_a_killed_node_leaves_the_cluster_and_the_rest_still_take_writes(self, cluster):
        n1, n2, n3 = cluster.nodes
        pid = n3.proc.pid
        os.kill(pid, signal.SIGKILL)
        n3.proc.wait(timeout=10)
        t0 = time.monotonic()
        status = cluster.wait_for_size(2, timeout=60)  # evs.suspect_timeout (5 s) then a new view
        seen_after = time.monotonic() - t0
        assert set(status) == {"db1", "db2"} and seen_after < 60
        print(f"\nthe other nodes saw the killed node leave after {seen_after:.1f} s")
        assert all(s["wsrep_cluster_status"] == "Primary" for s in status.values())  # 2 of 3: quorum
        _one(n2, "INSERT INTO t (v) VALUES ('written on db2 after db3 died')")
        with _connect(n1) as conn, conn.cursor() as cur:
            cur.execute("SET SESSION wsrep_sync_wait = 1")
            cur.execute("SELECT count(*) FROM t WHERE v LIKE '%after db3 died'")
            assert cur.fetchone()[0] == 1
        n3.stop()  # reaps what is left of the killed node


def test_a_node_whose_provider_refuses_its_options_fails_with_its_log(labdir):
    for mark in needs_galera:
        if mark.args[0]:
            pytest.skip(mark.kwargs["reason"])
    c = GaleraCluster("refused")
    node = c.node(
        Host.loopback(),
        free_port(),
        labdir / "refused" / "db1",
        durable=False,
        buffer_pool="32M",
        name="db1",
        settings={"wsrep_provider_options": '"gcache.size=8M; no.such.option=1"'},
    )
    with pytest.raises(ServiceError) as err:
        c.start()
    assert "db1: seeding the Galera state" in str(err.value) and "no.such.option" in str(err.value)
    assert not node.running() and not tcp_answers("127.0.0.1", node.port)


# --- RUBBoS on 1/1/0/2G end to end -------------------------------------------------------------


@pytest.mark.skipif(not shutil.which("tcpdump"), reason="tcpdump not installed")
def test_rubbos_on_a_two_node_galera_cluster_end_to_end(labdir):
    for mark in needs_galera:
        if mark.args[0]:
            pytest.skip(mark.kwargs["reason"])
    from tierscope.runner import DONE, run_experiment

    raw = _spec("1/1/0/2G")
    raw["sweep"] = {"matrix": {"topology": ["1/1/0/2G"]}}  # a long point id, as real sweeps make
    raw["mix"] = "read_write"  # writes too: they replicate, reads and writes go to both nodes
    raw["workload"] = {"users": [8], "think_time": "300ms", "ramp_up": "1s", "run": "4s", "ramp_down": "1s"}
    raw["soft"] = {"db": {"cache": "32MiB"}}
    spec = spec_from_dict(raw, where="galera-e2e", name="galera-e2e")
    t0 = time.monotonic()
    result = run_experiment(spec, labdir / "runs", report=False)
    seconds = time.monotonic() - t0
    assert result.failed == [] and len(result.done) == 1, result.failed
    d = result.dir / result.done[0]
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["status"] == DONE and manifest["topology"] == "1S/1S/0/2S-G"
    servers = {s["server"]: s for s in manifest["servers"]}
    assert servers["db1"]["protocol"] == servers["db2"]["protocol"] == "mysql"
    requests = pq.read_table(d / "requests.parquet")
    db = requests.filter(pc.equal(requests["tier"], "db"))
    per_server = {s: db.filter(pc.equal(db["server"], s)).num_rows for s in ("db1", "db2")}
    client = pq.read_table(d / "client_requests.parquet")
    assert client.num_rows > 20
    # one app server, its pool alternating sessions between the nodes: both serve about half
    assert per_server["db1"] > 20 and per_server["db2"] > 20, per_server
    assert 0.5 < per_server["db1"] / per_server["db2"] < 2.0, per_server
    # writes happened (and were certified) at both
    labels = db.column("label").to_pylist()
    assert any(lbl and lbl.lstrip().upper().startswith(("INSERT", "UPDATE")) for lbl in labels)
    # both nodes' logs kept, the cluster of two was whole, and it is gone now
    for name in ("db1", "db2"):
        log = (d / "logs" / name / "error.log").read_text()
        assert "Synchronized with group" in log
    assert "members(2)" in (d / "logs" / "db2" / "error.log").read_text()
    # each node's wsrep counters, taken as it stopped: both replicated write sets of their own and
    # applied the other's (a write on one node is applied on every node)
    wsrep = {n: json.loads((d / "logs" / n / "wsrep.log").read_text()) for n in ("db1", "db2")}
    assert wsrep["db2"]["wsrep_cluster_size"] == "2" and wsrep["db1"]["wsrep_cluster_size"] == "1"  # db2 stops first
    for n in ("db1", "db2"):
        assert int(wsrep[n]["wsrep_replicated"]) > 0 and int(wsrep[n]["wsrep_received"]) > 0, wsrep[n]
    print(
        {
            n: {
                k.removeprefix("wsrep_"): w[k]
                for k in (
                    "wsrep_replicated",
                    "wsrep_received",
                    "wsrep_local_cert_failures",
                    "wsrep_local_bf_aborts",
                    "wsrep_flow_control_paused",
                )
            }
            for n, w in wsrep.items()
        }
    )
    assert not _lab_mariadbd_running(d)
    print(f"\n1/1/0/2G RUBBoS point: {seconds:.1f} s wall, {client.num_rows} client requests, db rows {per_server}")


@pytest.mark.skipif(not shutil.which("tcpdump"), reason="tcpdump not installed")
def test_the_bookstore_on_a_two_node_galera_cluster_end_to_end(labdir):
    """The bookstore's provider asks the services layer what the RUBBoS one asks (MariaDB's
    snapshot, every node of the cluster): its pool spreads over both nodes too."""
    for mark in needs_galera:
        if mark.args[0]:
            pytest.skip(mark.kwargs["reason"])
    from tierscope.runner import run_experiment

    raw = _spec("1/1/0/2G", benchmark="tpcw", mix="shopping", scale="tiny")
    raw["workload"] = {"users": [8], "think_time": "300ms", "ramp_up": "1s", "run": "5s", "ramp_down": "1s"}
    raw["soft"] = {"db": {"cache": "32MiB"}}
    result = run_experiment(spec_from_dict(raw, where="galera-tpcw", name="galera-tpcw"), labdir / "runs", report=False)
    assert result.failed == [] and len(result.done) == 1, result.failed
    d = result.dir / result.done[0]
    requests = pq.read_table(d / "requests.parquet")
    db = requests.filter(pc.equal(requests["tier"], "db"))
    per_server = {s: db.filter(pc.equal(db["server"], s)).num_rows for s in ("db1", "db2")}
    assert pq.read_table(d / "client_requests.parquet").num_rows > 20
    assert per_server["db1"] > 20 and per_server["db2"] > 20, per_server
    assert 0.5 < per_server["db1"] / per_server["db2"] < 2.0, per_server
    assert not _lab_mariadbd_running(d)


def _lab_mariadbd_running(point_dir: Path) -> bool:
    """True when a mariadbd whose command line names this point's directory still runs."""
    needle = str(point_dir).encode()
    for p in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            cmd = p.read_bytes()
        except OSError:
            continue
        if b"mariadbd" in cmd and needle in cmd:
            return True
    return False
