"""Seed 002's scaling experiment (RubatoDB, TPC-C and YCSB over 1..16 nodes, throughput per node)
on one machine: the same workloads against a database tier of 1, 2, 3, ... nodes, one table of
throughput and throughput per node, and each node's own count of the work it did.

Targets (a preset's `targets`):

* ``galera``: a Galera cluster of N MariaDB nodes (`tierscope.services.galera`) on loopback with
  ports of their own. Every node takes clients: the driver runs one engine process per node, each
  with `threads_per_node` YCSB threads / `terminals_per_node` TPC-C terminals connected to its node.
* ``middleware``: the RAIDb-1 middleware (`tierscope.services.middleware`) in front of N PostgreSQL
  replicas; one engine process with threads_per_node x N threads connected to the middleware,
  which sends reads to one replica and every write (and every explicit transaction) to all.

Data is loaded once into a seed server per DBMS (MariaDB for Galera, PostgreSQL for the
replicas: YCSB's usertable and TPC-C's tables side by side in one database), stopped, and its data
directory copied into every node of every size (a Galera node seeds its wsrep state from the copy,
docs/galera.md), so no size pays a load and all start from the same rows.

Per node, the server's own counters are read before and after each workload (deltas), and for
Galera the CPU time its mariadbd used (`cpu_s`, from /proc; the row's `db_cpu_us_per_op` is the
cluster's CPU time per driver operation). On one machine the nodes share its cores, so throughput
per node falls with the node count whatever the mix; the CPU per operation is a figure of the
work, not of the machine's share of it: nodes on hosts of their own turn it into throughput (per
node, the rate falls as the cluster's CPU per operation grows):

* MariaDB/Galera: ``Com_stmt_execute`` (prepared statements the node ran for its own clients: the
  drivers prepare every statement; ``Com_update`` would also count the row events a node applies
  for the others), ``Handler_write + Handler_update + Handler_delete``
  (rows the node wrote: its clients' and the write sets it applied for the other nodes),
  ``wsrep_replicated`` (write sets it originated), ``wsrep_received`` (write sets it got from the
  group), ``wsrep_local_cert_failures``, ``wsrep_local_bf_aborts``.
* PostgreSQL: ``pg_stat_database.xact_commit`` (transactions, reads and broadcast writes),
  ``tup_inserted + tup_updated + tup_deleted`` less those of the middleware's recovery table
  (rows written), and the middleware's reads per
  replica. The middleware is started per workload and stopped after it, so its replicas' backends
  exit and flush their statistics before they are read.

Everything runs under one temporary directory (outside /tmp/pytest-of-*), every server is stopped
and the directory removed on the way out, also on errors and Ctrl-C. Needs root (the servers run
as their own OS users), MariaDB with galera-4, PostgreSQL 15 and the engine.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import shutil
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tierscope.apps.snapshot import copy_tree
from tierscope.contracts.middleware import RECOVERY_TABLE
from tierscope.oltp import dsn_of, tpcc_load, tpcc_run, ycsb_load, ycsb_run
from tierscope.procs import cpu_seconds
from tierscope.services.base import free_port
from tierscope.services.galera import GaleraCluster
from tierscope.services.mariadb import MariaDB
from tierscope.services.middleware import Middleware
from tierscope.services.postgres import Postgres
from tierscope.testbed.host import Host

TARGETS = ("galera", "middleware")
WORKLOADS = ("ycsb-a", "ycsb-b", "ycsb-c", "ycsb-f", "tpcc")
DEFAULT_PRESET = Path(__file__).resolve().parent.parent / "presets" / "oltp-scaling.toml"
DATABASE = "bench"


@dataclass
class ScalePreset:
    """A scaling experiment: every target x every node count x every workload."""

    name: str = "oltp-scaling"
    targets: list[str] = field(default_factory=lambda: ["galera", "middleware"])
    nodes: list[int] = field(default_factory=lambda: [1, 2, 3])
    workloads: list[str] = field(default_factory=lambda: ["ycsb-b", "ycsb-a", "tpcc"])
    duration: float = 20.0
    warmup: float = 2.0
    records: int = 10_000
    threads_per_node: int = 2
    warehouses: int = 1
    terminals_per_node: int = 2
    waits: bool = False
    cache: str = "64M"
    policy: str = "lprf"
    pool: int = 8

    def problems(self) -> list[str]:
        out = []
        bad = [t for t in self.targets if t not in TARGETS]
        if not self.targets or bad:
            out.append(f"targets: expected some of {', '.join(TARGETS)}, got {self.targets}")
        if not self.nodes or any(not isinstance(n, int) or n < 1 or n > 5 for n in self.nodes):
            out.append(f"nodes: expected node counts 1..5 (one machine), got {self.nodes}")
        bad = [w for w in self.workloads if w not in WORKLOADS]
        if not self.workloads or bad:
            out.append(f"workloads: expected some of {', '.join(WORKLOADS)}, got {self.workloads}")
        if not 0 < self.duration <= 600:
            out.append(f"duration: expected 0 < seconds <= 600, got {self.duration}")
        if not 0 <= self.warmup < self.duration:
            out.append(f"warmup: expected 0 <= seconds < duration, got {self.warmup}")
        for k in ("records", "threads_per_node", "warehouses", "terminals_per_node", "pool"):
            if int(getattr(self, k)) < 1:
                out.append(f"{k}: expected >= 1, got {getattr(self, k)}")
        if not self.cache.endswith("M") or not self.cache[:-1].isdigit():
            out.append(f"server.cache: expected '<n>M', got {self.cache!r}")
        return out


def load_preset(path: str | Path | None = None) -> ScalePreset:
    """Read a scaling preset (TOML, docs/oltp.md "Scaling (seed 002)"); ValueError naming the
    file and every problem when it is wrong."""
    path = Path(path) if path else DEFAULT_PRESET
    raw = tomllib.loads(path.read_text())
    known = {"name", "targets", "nodes", "workloads", "duration", "warmup", "ycsb", "tpcc", "server", "middleware"}
    problems = [f"unknown key {k!r}" for k in raw if k not in known]
    sections = {
        "ycsb": {"records", "threads_per_node"},
        "tpcc": {"warehouses", "terminals_per_node", "waits"},
        "server": {"cache"},
        "middleware": {"policy", "pool"},
    }
    flat: dict = {k: raw[k] for k in ("name", "targets", "nodes", "workloads", "duration", "warmup") if k in raw}
    for sec, keys in sections.items():
        for k, v in raw.get(sec, {}).items():
            if k not in keys:
                problems.append(f"[{sec}]: unknown key {k!r} (expected {', '.join(sorted(keys))})")
            else:
                flat[k] = v
    p = ScalePreset(**flat)
    p.workloads = [w.lower() for w in p.workloads]
    problems += p.problems()
    if problems:
        raise ValueError(f"{path}: " + "; ".join(problems))
    return p


# ---- counters ----------------------------------------------------------------------------------

MARIADB_COUNTERS = (
    "Com_stmt_execute",
    "Com_select",
    "Com_insert",
    "Com_update",
    "Com_delete",
    "Com_commit",
    "Handler_write",
    "Handler_update",
    "Handler_delete",
    "wsrep_replicated",
    "wsrep_received",
    "wsrep_local_cert_failures",
    "wsrep_local_bf_aborts",
)


def mariadb_counters(node) -> dict[str, int]:
    """The node's global status counters this module uses (wsrep ones are absent without Galera)."""
    rows = node.sql("SHOW GLOBAL STATUS WHERE Variable_name IN (" + ",".join(f"'{c}'" for c in MARIADB_COUNTERS) + ")")
    return {k: int(v) for k, v in rows if str(v).lstrip("-").isdigit()}


def postgres_counters(server, database: str = DATABASE) -> dict[str, int]:
    """pg_stat_database's counters of `database` on one replica, the rows the middleware writes
    for its own bookkeeping (each backend's recovery position, one update per write unit) left out
    of the rows written."""
    row = server.sql(
        "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted, tup_fetched "
        "FROM pg_stat_database WHERE datname = %s",
        params=(database,),
    )[0]
    out = dict(
        zip(
            ("xact_commit", "xact_rollback", "tup_inserted", "tup_updated", "tup_deleted", "tup_fetched"),
            (int(x) for x in row),
        )
    )
    own = server.sql(
        "SELECT coalesce(sum(n_tup_ins), 0), coalesce(sum(n_tup_upd), 0), coalesce(sum(n_tup_del), 0) "
        "FROM pg_stat_user_tables WHERE relname = %s",
        db=database,
        params=(RECOVERY_TABLE,),
    )[0]
    for key, n in zip(("tup_inserted", "tup_updated", "tup_deleted"), own):
        out[key] -= int(n)
    return out


def sessions_gone(server, database: str = DATABASE, timeout: float = 10.0) -> None:
    """Wait until no session is connected to `database` on a PostgreSQL server (a backend flushes
    its statistics when it exits), at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not server.sql("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", params=(database,))[0][0]:
            return
        time.sleep(0.1)


def settled(read: Callable[[], dict], timeout: float = 5.0) -> dict:
    """Read counters until two reads 0.3 s apart agree (PostgreSQL's statistics arrive when the
    backends flush them); the last read after `timeout` seconds."""
    last = read()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = read()
        if now == last:
            return now
        last = now
    return last


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after}


def node_work(kind: str, d: dict[str, int], seconds: float, reads: int | None = None) -> dict:
    """One node's measured work over a workload from its counter deltas `d`."""
    if kind == "galera":
        # the drivers run every statement prepared: Com_stmt_execute counts the node's own clients'
        # statements (Com_update also counts the row events a Galera node applies for the others)
        served = d.get("Com_stmt_execute", 0)
        rows = d.get("Handler_write", 0) + d.get("Handler_update", 0) + d.get("Handler_delete", 0)
        out: dict[str, Any] = {
            "served": served,
            "rows_written": rows,
            "write_sets_local": d.get("wsrep_replicated", 0),
            "write_sets_received": d.get("wsrep_received", 0),
            "cert_failures": d.get("wsrep_local_cert_failures", 0),
            "bf_aborts": d.get("wsrep_local_bf_aborts", 0),
        }
    else:
        rows = d.get("tup_inserted", 0) + d.get("tup_updated", 0) + d.get("tup_deleted", 0)
        out = {
            "served": d.get("xact_commit", 0),
            "rows_written": rows,
            "reads_routed": reads,
            "rollbacks": d.get("xact_rollback", 0),
        }
    out["served_per_s"] = round(out["served"] / seconds, 1) if seconds > 0 else None
    out["counters"] = d
    return out


# ---- results -----------------------------------------------------------------------------------


def p90_ms(logs: list[Path], op: str | None = None) -> float | None:
    """The 90th percentile (ms) of the logged operations that did not fail (all of `op`'s)."""
    tables = [pq.read_table(p, columns=["op", "latency_us", "status"]) for p in logs if p.exists()]
    if not tables:
        return None
    t = pa.concat_tables(tables)
    mask = pc.not_equal(t["status"], "error")
    if op:
        mask = pc.and_(mask, pc.equal(t["op"], op))
    lat = t.filter(mask)["latency_us"]
    if len(lat) == 0:
        return None
    return round(pc.quantile(lat, q=0.9, interpolation="higher")[0].as_py() / 1000.0, 3)


def combine(
    target: str, nodes: int, workload: str, summaries: list[dict], logs: list[Path], per_node: dict[str, dict]
) -> dict:
    """One row of the table from the engine summaries of the processes that ran at once."""
    tpcc = workload == "tpcc"
    rate = sum(s["tpmC"] if tpcc else s["ops_per_s"] for s in summaries)
    row = {
        "target": target,
        "nodes": nodes,
        "workload": workload,
        "metric": "tpmC" if tpcc else "ops/s",
        "throughput": round(rate, 1),
        "throughput_per_node": round(rate / nodes, 1),
        "ops": sum(sum(t["count"] for t in s["transactions"].values()) if tpcc else s["ops"] for s in summaries),
        "p90_ms": p90_ms(logs, "NEW_ORDER" if tpcc else None),
        "p90_of": "New-Order" if tpcc else "all operations",
        "errors": sum(s["errors"] for s in summaries),
        "clients": sum(s.get("terminals", s.get("threads", 0)) for s in summaries),
        "processes": len(summaries),
        "per_node": per_node,
    }
    if tpcc:
        row["new_orders_committed"] = sum(s["new_orders"]["committed"] for s in summaries)
        row["rollbacks"] = sum(sum(t.get("rollbacks", 0) for t in s["transactions"].values()) for s in summaries)
    else:
        row["updates"] = sum(s["operations"].get("UPDATE", {}).get("count", 0) for s in summaries)
        row["reads"] = sum(s["operations"].get("READ", {}).get("count", 0) for s in summaries)
    row["summaries"] = summaries
    return row


def write_results(rows: list[dict], out: Path, meta: dict) -> dict[str, Path]:
    """results.json (everything), results.parquet (one row per target x nodes x workload) and
    nodes.parquet (one row per node of each)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "results.json", "parquet": out / "results.parquet", "nodes": out / "nodes.parquet"}
    paths["json"].write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str) + "\n")
    flat = [{k: v for k, v in r.items() if k not in ("per_node", "summaries")} for r in rows]
    if flat:
        keys = sorted({k for r in flat for k in r})
        pq.write_table(pa.Table.from_pylist([{k: r.get(k) for k in keys} for r in flat]), paths["parquet"])
    per = [
        {
            "target": r["target"],
            "nodes": r["nodes"],
            "workload": r["workload"],
            "node": name,
            **{k: v for k, v in w.items() if k != "counters"},
        }
        for r in rows
        for name, w in r["per_node"].items()
    ]
    if per:
        keys = sorted({k for r in per for k in r})
        pq.write_table(pa.Table.from_pylist([{k: r.get(k) for k in keys} for r in per]), paths["nodes"])
    return paths


# ---- clusters ----------------------------------------------------------------------------------


def _run_workload(
    workload: str, dsn: str, preset: ScalePreset, clients: int, log: Path, seed: int, first_client: int = 0
) -> dict:
    """One driver process; `first_client`: the clients the other drivers of the same run started
    before this one (TPC-C terminals then take their own warehouses and districts)."""
    if workload == "tpcc":
        return tpcc_run(
            dsn,
            duration=preset.duration,
            warmup=preset.warmup or None,
            terminals=clients,
            terminal_offset=first_client or None,
            no_waits=not preset.waits,
            log=log,
            seed=seed,
        )
    return ycsb_run(
        dsn,
        workload=workload.split("-")[1],
        threads=clients,
        duration=preset.duration,
        warmup=preset.warmup or None,
        records=preset.records,
        log=log,
        seed=seed,
    )


def _load(dsn: str, preset: ScalePreset) -> dict:
    loaded = {}
    if any(w.startswith("ycsb") for w in preset.workloads):
        loaded["ycsb"] = ycsb_load(dsn, records=preset.records)
    if "tpcc" in preset.workloads:
        loaded["tpcc"] = tpcc_load(dsn, warehouses=preset.warehouses)
    return loaded


def _wipe(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def galera_seed(root: Path, preset: ScalePreset, say: Callable[[str], None]):
    """A stopped MariaDB server holding the loaded data (the snapshot the nodes copy)."""
    seed = MariaDB(
        Host.loopback(),
        free_port(),
        root / "seed-mariadb",
        durable=False,
        buffer_pool=preset.cache,
        name="seed-mariadb",
    )
    with seed:
        seed.create_database(DATABASE)
        say("loading the MariaDB seed (copied into every Galera node) ...")
        c = seed.credentials
        loaded = _load(dsn_of("mariadb", "127.0.0.1", seed.port, c.user, c.password, DATABASE), preset)
    return seed, loaded


def postgres_seed(root: Path, preset: ScalePreset, say: Callable[[str], None]):
    """A stopped PostgreSQL server holding the loaded data (the snapshot the replicas copy)."""
    seed = Postgres(
        Host.loopback(),
        free_port(),
        root / "seed-postgres",
        fsync=False,
        shared_buffers=preset.cache.replace("M", "MB"),
        name="seed-postgres",
    )
    with seed:
        seed.create_database(DATABASE)
        say("loading the PostgreSQL seed (copied into every replica) ...")
        loaded = _load(seed.dsn(DATABASE), preset)
    return seed, loaded


def run_galera(n: int, seed, root: Path, preset: ScalePreset, say: Callable[[str], None]) -> list[dict]:
    """Start an n-node Galera cluster from copies of `seed`, run every workload with one engine
    process per node, stop the cluster and remove its data; one result row per workload."""
    host = Host.loopback()
    where = root / f"galera-{n}"
    rows = []
    cluster = GaleraCluster(f"tierscope-scale-{n}")
    nodes = [
        cluster.node(
            host,
            free_port(),
            where / f"db{i}",
            durable=False,
            buffer_pool=preset.cache,
            max_connections=100,
            name=f"db{i}",
        )
        for i in range(1, n + 1)
    ]
    try:
        for node in nodes:
            copy_tree(seed.data_dir, node.data_dir)
        t0 = time.monotonic()
        cluster.start()
        cluster.wait_for_size(n, timeout=60)
        say(f"galera: {n} node(s) synced in {time.monotonic() - t0:.1f} s")
        c = nodes[0].credentials  # the lab's, beside the nodes' workdirs: one for the cluster
        dsns = [dsn_of("mariadb", "127.0.0.1", node.port, c.user, c.password, DATABASE) for node in nodes]
        for w in preset.workloads:
            clients = preset.terminals_per_node if w == "tpcc" else preset.threads_per_node
            logs = [where / f"{w}-db{i + 1}.parquet" for i in range(n)]
            before = [mariadb_counters(node) for node in nodes]
            cpu_before = [cpu_seconds(node.pids()) for node in nodes]
            with concurrent.futures.ThreadPoolExecutor(n) as pool:
                futs = [
                    pool.submit(_run_workload, w, dsns[i], preset, clients, logs[i], 1000 * n + i + 1, i * clients)
                    for i in range(n)
                ]
                summaries = [f.result() for f in futs]
            cpu = [cpu_seconds(node.pids()) - b for node, b in zip(nodes, cpu_before)]
            after = [mariadb_counters(node) for node in nodes]
            seconds = max(s["seconds"] for s in summaries) + (preset.warmup or 0)
            per_node = {
                node.name: {**node_work("galera", delta(a, b), seconds), "cpu_s": round(c, 3)}
                for node, a, b, c in zip(nodes, after, before, cpu)
            }
            row = combine("galera", n, w, summaries, logs, per_node)
            row["db_cpu_us_per_op"] = round(1e6 * sum(cpu) / row["ops"], 1) if row["ops"] else None
            row["counted_seconds"] = round(seconds, 3)
            rows.append(row)
            say(brief(row))
    finally:
        cluster.stop()
        _wipe(where)
    return rows


def run_middleware(n: int, seed, root: Path, preset: ScalePreset, say: Callable[[str], None]) -> list[dict]:
    """Start n PostgreSQL replicas from copies of `seed` and, per workload, the middleware in
    front of them; one engine process through the middleware; stop all and remove the data."""
    host = Host.loopback()
    where = root / f"middleware-{n}"
    rows = []
    with contextlib.ExitStack() as stack:
        stack.callback(_wipe, where)
        reps = []
        for i in range(1, n + 1):
            r = Postgres(
                host,
                free_port(),
                where / f"db{i}",
                fsync=False,
                shared_buffers=preset.cache.replace("M", "MB"),
                max_connections=100,
                name=f"db{i}",
            )
            copy_tree(seed.data_dir, r.data_dir)
            stack.callback(r.stop)
            r.start()
            reps.append(r)
        say(f"middleware: {n} PostgreSQL replica(s) up")
        for w in preset.workloads:
            clients = n * (preset.terminals_per_node if w == "tpcc" else preset.threads_per_node)
            mw = Middleware(
                host,
                free_port(),
                where / f"mw-{w}",
                backends=[r.address for r in reps],
                database=DATABASE,
                pool=max(preset.pool, clients),
                policy=preset.policy,
                name="mw1",
            )
            log = where / f"{w}.parquet"
            before = [settled(partial(postgres_counters, r)) for r in reps]
            try:
                mw.start()
                summary = _run_workload(
                    w,
                    mw.dsn(),
                    preset,
                    clients,
                    log,
                    1000 * n + 1,
                )
            finally:
                mw.stop()
            stats = mw.stats()
            for r in reps:
                sessions_gone(r)
            after = [settled(partial(postgres_counters, r)) for r in reps]
            seconds = summary["seconds"] + (preset.warmup or 0)
            reads = {b["name"]: b["reads"] for b in stats["backends"]}
            per_node = {
                r.name: node_work("middleware", delta(a, b), seconds, reads.get(r.address))
                for r, a, b in zip(reps, after, before)
            }
            row = combine("middleware", n, w, [summary], [log], per_node)
            row["counted_seconds"] = round(seconds, 3)
            row["middleware"] = {k: stats.get(k) for k in ("reads", "writes", "transaction_units", "disabled")}
            if stats.get("disabled"):
                raise RuntimeError(f"middleware disabled replica(s) {stats['disabled']} during {w} on {n} node(s)")
            rows.append(row)
            say(brief(row))
    return rows


def brief(row: dict) -> str:
    nodes = ", ".join(f"{k} {v['served']}/{v['rows_written']}" for k, v in row["per_node"].items())
    return (
        f"{row['target']} x{row['nodes']} {row['workload']}: {row['throughput']} {row['metric']} "
        f"({row['throughput_per_node']} per node), p90 {row['p90_ms']} ms, {row['errors']} errors; "
        f"served/rows written per node: {nodes}"
    )


def run_scaling(
    preset: ScalePreset, out: Path | None = None, say: Callable[[str], None] = print, workdir: Path | None = None
) -> list[dict]:
    """Run the whole preset; return the rows (and write them under `out` when given). Everything
    started is stopped and the work directory removed, also on errors."""
    rows: list[dict] = []
    root = Path(tempfile.mkdtemp(prefix="tierscope-scale-", dir=workdir))
    started = time.time()
    try:
        for target in preset.targets:
            seed, loaded = (galera_seed if target == "galera" else postgres_seed)(root, preset, say)
            say(f"loaded: {json.dumps({k: v.get('seconds') for k, v in loaded.items()})} s")
            for n in preset.nodes:
                rows += (run_galera if target == "galera" else run_middleware)(n, seed, root, preset, say)
            _wipe(seed.workdir)
    finally:
        _wipe(root)
        if out is not None and rows:
            meta = {
                "preset": preset.__dict__,
                "started": started,
                "wall_s": round(time.time() - started, 1),
                "loadavg_end": os.getloadavg(),
                "cpus": os.cpu_count(),
            }
            write_results(rows, out, meta)
    return rows


def table_rows(rows: list[dict]) -> Iterator[list[str]]:
    """The printed table: target, nodes, workload, throughput, per node, p90, errors, and each
    node's measured work (statements or transactions served / rows written)."""
    for r in rows:
        per = ", ".join(f"{k} {v['served']}/{v['rows_written']}" for k, v in r["per_node"].items())
        yield [
            r["target"],
            str(r["nodes"]),
            r["workload"],
            f"{r['throughput']:g} {r['metric']}",
            f"{r['throughput_per_node']:g}",
            "" if r["p90_ms"] is None else f"{r['p90_ms']:g}",
            str(r["errors"]),
            per,
        ]
