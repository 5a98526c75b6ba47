"""Galera Cluster: DBMS-internal clustering with Debian's galera-4 provider inside MariaDB 10.11.

A `GaleraNode` is a `MariaDB` server with wsrep on (`wsrep_provider` = libgalera_smm.so,
`binlog_format=ROW`, `innodb_autoinc_lock_mode=2`). The nodes of one `GaleraCluster` start in
order: the first bootstraps a new cluster (`--wsrep-new-cluster`), every later one joins it with
`wsrep_cluster_address = gcomm://<the running nodes' group addresses>`. A node is healthy once it is
`Synced`, ready, and the cluster counts every node started so far; so after the last node of N
starts, `wsrep_cluster_size` is N on all of them.

State transfer. Every node of a lab cluster starts from a copy of the same snapshot (the runner
restores the loaded data into each database server's data directory). A copy of a MariaDB snapshot
has no Galera state, and a joiner whose InnoDB records no wsrep position cannot take an incremental
transfer. So before its first start each such node is seeded (`GaleraNode.seed`): `grastate.dat`
names the cluster's state UUID at seqno 0, the node bootstraps alone once (its bootstrap view is
seqno 1, which InnoDB records) and stops cleanly. Then every node holds the same state; node 1
bootstraps the cluster at it, and a joiner needs no snapshot state transfer (SST), only an
incremental one (IST, Galera's own transfer from the donor's gcache) of what the cluster wrote
since node 1 started (the lab account: a few write sets). A joiner with an empty data directory
gets a full SST by `rsync` (`wsrep_sst_method=rsync`: offline, no account needed); that is the
path a new or diverged node takes.

Ports. In its own network namespace a node uses Galera's defaults (group 4567, IST 4568, SST
4444) on its host's address; on a shared address (loopback) each node takes free ports.

The cluster is multi-master: reads and writes go to any node. A write executes on its node, and
at COMMIT its row images (write set) are ordered cluster-wide and certified on every node; a write
set touching a row another node committed first since the transaction began fails certification
and the client gets a deadlock error (1213) after `wsrep_retry_autocommit` (default 1) server-side
retries of an autocommit statement. docs/galera.md says more.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

from tierscope.services._accounts import give_to
from tierscope.services.base import ServiceError, free_port
from tierscope.services.mariadb import MariaDB
from tierscope.testbed.host import Host

PROVIDER_LIBRARY = "/usr/lib/galera/libgalera_smm.so"
#: Galera's default ports: group communication, incremental state transfer, snapshot state transfer
GROUP_PORT, IST_PORT, SST_PORT = 4567, 4568, 4444
#: the SST method when a node must copy a whole data directory (works offline, needs no account)
SST_METHOD = "rsync"
#: the longest cluster name gcomm carries (a longer one breaks every join: "handling gmcast
#: protocol message failed ... types.hpp:String()")
MAX_NAME = 32


def provider_library() -> str:
    """The wsrep provider's path; ServiceError when galera-4 is not installed."""
    if not Path(PROVIDER_LIBRARY).exists():
        raise ServiceError(f"{PROVIDER_LIBRARY} not found (is galera-4 installed? run make setup)")
    return PROVIDER_LIBRARY


class GaleraCluster:
    """The nodes of one Galera cluster in start order (the first to start bootstraps it)."""

    def __init__(self, name: str = "tierscope", state_uuid: str | None = None):
        if not 0 < len(name) <= MAX_NAME:
            raise ValueError(f"Galera cluster name {name!r}: 1 to {MAX_NAME} characters (gcomm's limit)")
        self.name = name
        #: the state UUID every node's grastate.dat names, so nodes started from one snapshot agree
        self.state_uuid = state_uuid or str(uuid.uuid4())
        self.nodes: list[GaleraNode] = []

    def node(self, host: Host, port: int, workdir: str | Path, **kwargs) -> GaleraNode:
        """A new node of this cluster (not started)."""
        return GaleraNode(host, port, workdir, cluster=self, **kwargs)

    def running(self) -> list[GaleraNode]:
        return [n for n in self.nodes if n.running()]

    def start(self) -> GaleraCluster:
        """Start every node in order (node 1 bootstraps, the others join); stop all on failure."""
        try:
            for n in self.nodes:
                n.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every node, the last started first."""
        errors = []
        for n in reversed(self.nodes):
            try:
                n.stop()
            except Exception as err:  # keep stopping the others
                errors.append(f"{n.name}: {err}")
        if errors:
            raise ServiceError("stopping the Galera cluster: " + "; ".join(errors))

    def client_hosts(self) -> str:
        """The running nodes as `address:port,address:port` (what an app's pool spreads over)."""
        return ",".join(n.address for n in self.running())

    def wait_for_size(self, size: int, timeout: float = 60.0) -> dict[str, dict[str, str]]:
        """Wait until every running node says the cluster has `size` nodes and it is Synced;
        return each node's wsrep status. ServiceError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        last: dict[str, dict[str, str]] = {}
        while True:
            last = {}
            for n in self.running():
                try:
                    last[n.name] = n.wsrep_status()
                except Exception as err:
                    last[n.name] = {"error": str(err)}
            if last and all(
                s.get("wsrep_cluster_size") == str(size) and s.get("wsrep_local_state_comment") == "Synced"
                for s in last.values()
            ):
                return last
            if time.monotonic() >= deadline:
                brief = {
                    k: {x: v.get(x) for x in ("wsrep_cluster_size", "wsrep_local_state_comment", "error")}
                    for k, v in last.items()
                }
                raise ServiceError(
                    f"Galera cluster {self.name}: not {size} Synced nodes after {timeout:.0f} s: {brief}"
                )
            time.sleep(0.2)

    def __enter__(self) -> GaleraCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class GaleraNode(MariaDB):
    """One node of a `GaleraCluster`: a MariaDB server with the Galera provider loaded."""

    kind = "galera"
    start_timeout = 180.0  # a joiner may need a full SST

    def __init__(
        self,
        host: Host,
        port: int,
        workdir: str | Path,
        *,
        cluster: GaleraCluster,
        group_port: int | None = None,
        ist_port: int | None = None,
        sst_port: int | None = None,
        gcache: str = "32M",
        slave_threads: int = 1,
        **kwargs,
    ):
        super().__init__(host, port, workdir, **kwargs)
        self.cluster = cluster
        shared = host.netns is None  # loopback: several nodes on one address need ports of their own
        self.group_port = group_port or (free_port(host.address) if shared else GROUP_PORT)
        self.ist_port = ist_port or (free_port(host.address) if shared else IST_PORT)
        self.sst_port = sst_port or (free_port(host.address) if shared else SST_PORT)
        self.gcache = gcache
        self.slave_threads = slave_threads
        self.bootstrap = False
        self.started = False  # started at least once (so a cluster all of whose nodes stopped is over)
        cluster.nodes.append(self)

    @property
    def group_address(self) -> str:
        return f"{self.host.address}:{self.group_port}"

    @property
    def grastate(self) -> Path:
        return self.data_dir / "grastate.dat"

    def peers(self) -> list[GaleraNode]:
        """The other nodes of the cluster that run now (whom this node joins)."""
        return [n for n in self.cluster.running() if n is not self]

    def conf(self) -> str:
        provider_options = "; ".join(
            (
                f"gmcast.listen_addr=tcp://{self.host.address}:{self.group_port}",
                f"ist.recv_addr={self.host.address}:{self.ist_port}",
                f"gcache.size={self.gcache}",
            )
        )
        peers = "" if self.bootstrap else ",".join(n.group_address for n in self.peers())
        wsrep = {
            "wsrep_on": "ON",
            "wsrep_provider": provider_library(),
            "wsrep_provider_options": f'"{provider_options}"',
            "wsrep_cluster_name": self.cluster.name,
            "wsrep_cluster_address": f"gcomm://{peers}",
            "wsrep_node_name": self.name,
            "wsrep_node_address": self.group_address,
            "wsrep_node_incoming_address": self.address,
            "wsrep_sst_method": SST_METHOD,
            "wsrep_sst_receive_address": f"{self.host.address}:{self.sst_port}",
            "wsrep_slave_threads": str(self.slave_threads),
            "binlog_format": "ROW",
            "default_storage_engine": "InnoDB",
            "innodb_autoinc_lock_mode": "2",
        }
        text = super().conf()
        return text + "".join(f"{k} = {v}\n" for k, v in wsrep.items() if k not in self.settings)

    def prepare(self) -> None:
        """Write the configuration; give a copy of the snapshot the cluster's state (`seed`); an
        empty joiner gets an empty data directory (SST fills it)."""
        self.bootstrap = not self.peers()
        self.started = True
        super().prepare()  # mariadb-install-db only for a bootstrap node without data (initialised)
        if (self.data_dir / "mysql").is_dir() and not self.grastate.exists():
            self.seed()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        give_to(self.user, self.data_dir)

    def initialised(self) -> bool:
        # a joiner with no data gets it from a donor (SST); only the bootstrap node installs a new one
        return super().initialised() or not self.bootstrap

    def seed(self, timeout: float = 60.0) -> None:
        """Turn a copy of the snapshot (a MariaDB data directory with no Galera state) into the
        cluster's state: write grastate.dat with the cluster's UUID at seqno 0, bootstrap the node
        alone once (the bootstrap view is seqno 1, written to InnoDB as the node's position) and
        stop it cleanly. Every node seeded from a copy of one snapshot then holds the same state,
        so a joiner needs no SST, only an IST of what the cluster wrote since it started."""
        self.grastate.write_text(
            f"# GALERA saved state\nversion: 2.1\nuuid:    {self.cluster.state_uuid}\nseqno:   0\n"
            "safe_to_bootstrap: 1\n"
        )
        was = self.bootstrap
        self.bootstrap = True
        self.conf_path.write_text(self.conf())
        give_to(self.user, self.workdir)
        with open(self._console, "ab") as console:
            proc = subprocess.Popen(
                self.host.wrap(self.command()),
                stdout=console,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    raise ServiceError(
                        f"{self.name}: seeding the Galera state: mariadbd exited with status "
                        f"{proc.returncode}\n{self._log_tail()}"
                    )
                try:
                    if self.wsrep_status().get("wsrep_local_state_comment") == "Synced":
                        break
                except Exception:
                    pass
                if time.monotonic() > deadline:
                    raise ServiceError(
                        f"{self.name}: seeding the Galera state: not Synced after {timeout:.0f} s\n{self._log_tail()}"
                    )
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
            self.bootstrap = was
            self.conf_path.write_text(self.conf())
        if proc.returncode != 0:
            raise ServiceError(f"{self.name}: seeding the Galera state: mariadbd stopped with status {proc.returncode}")

    def command(self) -> list[str]:
        argv = super().command()
        return argv + ["--wsrep-new-cluster"] if self.bootstrap else argv

    def wsrep_status(self) -> dict[str, str]:
        """The node's wsrep status variables (wsrep_cluster_size, wsrep_local_state_comment, ...)."""
        return {k: v for k, v in self.sql("SHOW GLOBAL STATUS LIKE 'wsrep_%'")}

    @property
    def status_path(self) -> Path:
        return self.workdir / "wsrep-status.json"

    def stop(self, timeout: float = 20.0) -> None:
        """Write the node's wsrep counters (certification failures, brute-force aborts, flow
        control, write sets replicated and received) to `status_path`, then stop it."""
        if self.running():
            try:
                import json

                status = self.wsrep_status()
                status["taken_at_ns"] = str(time.time_ns())
                self.status_path.write_text(json.dumps(status, indent=1, sort_keys=True))
            except Exception:  # a node that does not answer any more is stopped all the same
                pass
        super().stop(timeout)

    def logs(self) -> dict[str, Path]:
        out = super().logs()
        if self.status_path.exists():
            out["wsrep"] = self.status_path
        return out

    def healthy(self) -> bool:
        try:
            s = self.wsrep_status()
        except Exception:
            return False
        expected = len(self.cluster.running())
        return (
            s.get("wsrep_ready") == "ON"
            and s.get("wsrep_local_state_comment") == "Synced"
            and int(s.get("wsrep_cluster_size") or 0) >= expected
        )


def cluster_serving(host: str, port: int) -> GaleraCluster | None:
    """The cluster (made by `node_of`) one of whose running nodes listens on host:port."""
    for cluster in _CLUSTERS.values():
        if any(n.host.address == host and n.port == port for n in cluster.running()):
            return cluster
    return None


#: clusters made by `node_of`, by the directory their nodes' workdirs are in (one per point)
_CLUSTERS: dict[Path, GaleraCluster] = {}


def _over(cluster: GaleraCluster) -> bool:
    """Every node of the cluster was started and none runs any more."""
    return bool(cluster.nodes) and all(n.started and not n.running() for n in cluster.nodes)


def node_of(host: Host, port: int, workdir: str | Path, **kwargs) -> GaleraNode:
    """A new node (not started) of the cluster whose nodes live beside `workdir` (the database
    servers of one runner point: `<point>/db1`, `<point>/db2`, ...). A cluster none of whose nodes
    runs any more is forgotten, so the same directory later holds a new cluster."""
    key = Path(workdir).absolute().parent
    for k, c in list(_CLUSTERS.items()):
        if k != key and not c.running():  # another point's cluster, over or never started
            del _CLUSTERS[k]
    cluster = _CLUSTERS.get(key)
    if cluster is None or _over(cluster):
        digest = hashlib.sha1(str(key).encode()).hexdigest()[:12]
        cluster = _CLUSTERS[key] = GaleraCluster(name=f"tierscope-{digest}")
    return cluster.node(host, port, workdir, **kwargs)
