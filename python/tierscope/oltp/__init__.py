"""Database benchmarks (YCSB core workloads, TPC-C) run by the native engine against PostgreSQL or
MariaDB: build the engine's argv, run it, return its summary JSON; and start a throw-away
database server for a run.

The engine does the work (`tierscope-engine ycsb|tpcc load|run`, see docs/oltp.md); this module is
the thin layer the CLI (`tierscope oltp`) and the tests use.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tierscope.engine import engine_path
from tierscope.services.base import free_port
from tierscope.services.databases import database_server
from tierscope.testbed.host import Host

DBMS = ("postgresql", "mariadb")
#: YCSB's core workloads (the engine's `--workload`), each with what it does
YCSB_WORKLOADS = {
    "a": "50 % read / 50 % update",
    "b": "95 % read / 5 % update",
    "c": "100 % read",
    "d": "95 % read latest / 5 % insert",
    "e": "95 % short scans / 5 % insert",
    "f": "50 % read / 50 % read-modify-write",
}
#: the key distributions the engine's `--distribution` takes
YCSB_DISTRIBUTIONS = ("zipfian", "latest", "uniform")


def check_ycsb(workload: str, distribution: str | None = None) -> None:
    """ValueError naming the option and every valid value, for a workload or a key distribution
    the engine would refuse (only after the data were loaded)."""
    if workload.lower() not in YCSB_WORKLOADS:
        listed = ", ".join(f"{k} ({v})" for k, v in YCSB_WORKLOADS.items())
        raise ValueError(f"--workload {workload}: not a YCSB core workload; one of {listed}")
    if distribution is not None and distribution.lower() not in YCSB_DISTRIBUTIONS:
        raise ValueError(f"--distribution {distribution}: one of {', '.join(YCSB_DISTRIBUTIONS)}")


class OltpError(RuntimeError):
    """The engine refused or failed a run; `code` is its exit status (2: bad input, e.g. missing
    tables)."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def dsn_of(dbms: str, host: str, port: int, user: str, password: str, database: str) -> str:
    """The engine's DSN: a libpq keyword string for PostgreSQL, a mysql:// URL for MariaDB."""
    if dbms == "postgresql":
        pw = f" password={password}" if password else ""
        return f"host={host} port={port} user={user} dbname={database}{pw}"
    if dbms == "mariadb":
        return f"mysql://{user}:{password}@{host}:{port}/{database}"
    raise ValueError(f"dbms: expected one of {', '.join(DBMS)}, got {dbms!r}")


def dbms_of_dsn(dsn: str) -> str:
    """Which DBMS a DSN names (the engine's rule: mysql:// or mariadb:// URLs are MariaDB)."""
    return "mariadb" if dsn.strip().startswith(("mysql://", "mariadb://")) else "postgresql"


#: the environment variable the engine takes a DSN's password from (never its command line)
PASSWORD_ENV = "TIERSCOPE_DB_PASSWORD"


def without_password(dsn: str) -> tuple[str, str]:
    """(`dsn` without its password, the password or ''): the engine gets the password in its
    environment (`PASSWORD_ENV`), since every local user can read a command line in /proc."""
    if dbms_of_dsn(dsn) == "mariadb":
        from urllib.parse import unquote, urlsplit, urlunsplit

        u = urlsplit(dsn.strip())
        if u.password is None:
            return dsn, ""
        netloc = (u.username or "") + "@" + u.netloc.rpartition("@")[2]
        return urlunsplit(u._replace(netloc=netloc)), unquote(u.password)
    import psycopg

    params = psycopg.conninfo.conninfo_to_dict(dsn)
    password = params.pop("password", None)
    if not password:
        return dsn, ""
    return psycopg.conninfo.make_conninfo("", **params), str(password)


def run_engine(argv: list[str], timeout: float) -> dict:
    """Run `tierscope-engine <argv>` and return the JSON summary it prints last on stdout (a
    `--dsn`'s password goes to the engine in its environment, not on its command line)."""
    argv, env = list(argv), None
    if "--dsn" in argv[:-1]:
        i = argv.index("--dsn") + 1
        argv[i], password = without_password(argv[i])
        if password:
            env = {**os.environ, PASSWORD_ENV: password}
    cmd = [str(engine_path()), *argv]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as err:
        raise OltpError(f"{' '.join(argv[:2])}: no answer within {timeout:.0f} s", 124) from err
    if out.returncode != 0:
        msg = out.stderr.strip() or f"exit status {out.returncode}"
        raise OltpError(msg.removeprefix("tierscope-engine: error: "), out.returncode)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise OltpError(f"{' '.join(argv[:2])}: no summary on stdout", 1)
    return json.loads(lines[-1])


def _opt(argv: list[str], flag: str, value) -> None:
    if value is not None and value is not False:
        argv.extend([flag] if value is True else [flag, str(value)])


def ycsb_load(
    dsn: str,
    *,
    records: int = 10_000,
    field_count: int = 10,
    field_length: int = 100,
    threads: int = 2,
    timeout: float = 3600.0,
) -> dict:
    """(Re)create `usertable` and insert `records` rows; the engine's load summary."""
    argv = [
        "ycsb",
        "load",
        "--dsn",
        dsn,
        "--records",
        str(records),
        "--field-count",
        str(field_count),
        "--field-length",
        str(field_length),
        "--threads",
        str(threads),
        "--max-seconds",
        str(timeout),
    ]
    return run_engine(argv, timeout + 30)


def ycsb_run(
    dsn: str,
    *,
    workload: str = "a",
    threads: int = 4,
    duration: float = 30.0,
    ops: int | None = None,
    target: float | None = None,
    warmup: float | None = None,
    distribution: str | None = None,
    records: int | None = None,
    field_count: int = 10,
    field_length: int = 100,
    log: Path | None = None,
    seed: int | None = None,
) -> dict:
    """Run one YCSB workload (a-f); the engine's run summary (ops, ops/s, per-op latencies µs)."""
    check_ycsb(workload, distribution)
    argv = [
        "ycsb",
        "run",
        "--dsn",
        dsn,
        "--workload",
        workload.lower(),
        "--threads",
        str(threads),
        "--duration",
        str(duration),
        "--field-count",
        str(field_count),
        "--field-length",
        str(field_length),
    ]
    _opt(argv, "--ops", ops)
    _opt(argv, "--target", target)
    _opt(argv, "--warmup", warmup)
    _opt(argv, "--distribution", distribution.lower() if distribution else None)
    _opt(argv, "--records", records)
    _opt(argv, "--log", log)
    _opt(argv, "--seed", seed)
    return run_engine(argv, duration + 120)


def tpcc_load(dsn: str, *, warehouses: int = 1, threads: int = 2, timeout: float = 3600.0) -> dict:
    """Drop and create the nine TPC-C tables and load `warehouses` warehouses."""
    argv = [
        "tpcc",
        "load",
        "--dsn",
        dsn,
        "--warehouses",
        str(warehouses),
        "--threads",
        str(threads),
        "--max-seconds",
        str(timeout),
    ]
    return run_engine(argv, timeout + 30)


def tpcc_run(
    dsn: str,
    *,
    duration: float = 60.0,
    terminals: int | None = None,
    terminal_offset: int | None = None,
    no_waits: bool = False,
    wait_scale: float | None = None,
    warmup: float | None = None,
    txns: int | None = None,
    log: Path | None = None,
    seed: int | None = None,
) -> dict:
    """Run the TPC-C mix; the engine's summary (tpmC, per-type latencies and p90 rules). Drivers that
    share the warehouses give each a `terminal_offset` (the terminals started before it)."""
    argv = ["tpcc", "run", "--dsn", dsn, "--duration", str(duration)]
    _opt(argv, "--terminals", terminals)
    _opt(argv, "--terminal-offset", terminal_offset)
    _opt(argv, "--no-waits", no_waits)
    _opt(argv, "--wait-scale", wait_scale)
    _opt(argv, "--warmup", warmup)
    _opt(argv, "--txns", txns)
    _opt(argv, "--log", log)
    _opt(argv, "--seed", seed)
    return run_engine(argv, duration + 120)


@contextlib.contextmanager
def started_database(
    dbms: str, workdir: Path | None = None, *, database: str = "bench", cache: str = "256M", fsync: bool = False
) -> Iterator[tuple[object, str]]:
    """Start a PostgreSQL or MariaDB server of its own on loopback (a free port, data under
    `workdir` or a temporary directory), create `database`, yield (server, DSN); stop the server
    and remove a temporary data directory on the way out, also on errors."""

    if dbms not in DBMS:
        raise ValueError(f"dbms: expected one of {', '.join(DBMS)}, got {dbms!r}")
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"tierscope-oltp-{dbms}-")))
        svc, cfg = database_server(
            dbms, Host.loopback(), free_port(), Path(workdir) / dbms, database=database, cache=cache, fsync=fsync
        )
        svc.start()
        stack.callback(svc.stop)
        svc.create_database(database)  # type: ignore[attr-defined]
        yield svc, dsn_of(dbms, cfg.host, cfg.port, cfg.user, cfg.password, cfg.database)
