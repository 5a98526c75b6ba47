"""The real servers the lab runs: each starts on loopback, answers, and stops leaving nothing."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import urllib.request

import pytest

from conftest import needs_root
from tierscope.services.base import SOCKET_PATH_MAX, ServiceError, free_port, socket_dir, tcp_answers
from tierscope.services.mariadb import MariaDB
from tierscope.services.nginx import Nginx
from tierscope.services.postgres import Postgres, pg_bindir
from tierscope.testbed.host import Host

needs_root = needs_root("servers run as their own OS users")


@pytest.mark.skipif(not shutil.which("nginx") and not os.path.exists("/usr/sbin/nginx"), reason="nginx not installed")
def test_nginx_serves_static_files_and_logs_each_request(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    (root / "index.html").write_text("hello tierscope\n")
    port = free_port()
    with Nginx(Host.loopback(), port, tmp_path / "nginx", root=root) as web:
        for _ in range(7):
            with urllib.request.urlopen(f"{web.url}/index.html") as r:
                assert r.read() == b"hello tierscope\n"
                assert r.headers["X-Request-Id"]
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{web.url}/missing")
        assert err.value.code == 404
        pids = web.pids()
        assert len(pids) >= 2  # master and one worker
    assert not tcp_answers("127.0.0.1", port)
    assert not any(os.path.exists(f"/proc/{p}") for p in pids)
    lines = (tmp_path / "nginx" / "access.log").read_text().splitlines()
    assert len(lines) == 8  # the health checks are not logged
    statuses = [line.split()[5] for line in lines]
    assert statuses.count("200") == 7 and statuses.count("404") == 1
    msec, request_time = float(lines[0].split()[1]), float(lines[0].split()[2])
    assert 1.6e9 < msec < 4e9 and 0 <= request_time < 5


def test_nginx_rejects_unknown_balance(tmp_path):
    with pytest.raises(ValueError, match="least_conn"):
        Nginx(Host.loopback(), 1, tmp_path, balance="random")


DEEP = "a-run-directory-nested-as-deep-as-pytest-or-a-user-puts-it" * 2


def test_socket_dir_is_short_enough_for_a_unix_socket(tmp_path):
    near = socket_dir(tmp_path, "mysqld.sock")
    assert near == tmp_path / "sock"
    far = socket_dir(tmp_path / DEEP, ".s.PGSQL.5432.lock")
    assert far != tmp_path / DEEP / "sock"
    assert len(os.fsencode(far / ".s.PGSQL.5432.lock")) <= SOCKET_PATH_MAX
    assert socket_dir(tmp_path / DEEP, "x") == socket_dir(tmp_path / DEEP, "x")  # one per workdir
    assert socket_dir(tmp_path / (DEEP + "2"), "x") != far


@needs_root
@pytest.mark.parametrize("where", ["pg", DEEP])
def test_postgres_starts_answers_sql_and_stops(tmp_path, where):
    pg_bindir()
    port = free_port()
    with Postgres(Host.loopback(), port, tmp_path / where, fsync=False) as pg:
        pg.create_database("lab")
        pg.create_database("lab")  # idempotent
        pg.sql("create table t (i int)", db="lab")
        pg.sql("insert into t select generate_series(1, 100)", db="lab")
        assert pg.sql("select sum(i) from t", db="lab") == [(5050,)]
        pids = pg.pids()
        sock = pg.socket_dir
        assert (sock / f".s.PGSQL.{port}").is_socket()
    assert not tcp_answers("127.0.0.1", port)
    assert sock.exists() == (sock.parent == tmp_path / where)  # nothing left outside the run
    assert not any(os.path.exists(f"/proc/{p}") for p in pids)


@needs_root
@pytest.mark.skipif(not os.path.exists("/usr/sbin/mariadbd"), reason="mariadb-server not installed")
@pytest.mark.parametrize("where", ["maria", DEEP])
def test_mariadb_starts_answers_sql_over_tcp_and_stops(tmp_path, where):
    import pymysql

    port = free_port()
    with MariaDB(Host.loopback(), port, tmp_path / where, durable=False) as db:
        db.create_database("lab")
        conn = pymysql.connect(**db.connect_args("lab"), autocommit=True)
        with conn.cursor() as cur:
            cur.execute("create table t (i int)")
            cur.executemany("insert into t values (%s)", [(i,) for i in range(1, 101)])
            cur.execute("select sum(i) from t")
            assert int(cur.fetchone()[0]) == 5050
        conn.close()
        pids = db.pids()
        sock = db.socket
        assert sock.is_socket()
    assert not tcp_answers("127.0.0.1", port)
    assert sock.parent.exists() == (sock.parent.parent == tmp_path / where)
    assert not any(os.path.exists(f"/proc/{p}") for p in pids)


def test_port_in_use_is_a_clear_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ServiceError, match="already in use"):
            Nginx(Host.loopback(), port, tmp_path / "n").start()


def dpkg_installed(package: str) -> bool:
    """Whether dpkg (the package manager, a peer of the lab's own probe) has `package` installed."""
    out = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True)
    return out.returncode == 0 and out.stdout.strip() == "install ok installed"


def test_missing_packages_name_what_a_host_lacks_for_each_dbms(monkeypatch, tmp_path):
    """What a remote agent reports before it installs: per DBMS, the packages whose programs are
    absent (the galera provider library is what galera-4 adds to mariadb-server). Ground truth:
    dpkg's own record of this host, then hosts made to lack or have every program."""
    from tierscope.services import databases, galera

    assert shutil.which("dpkg-query"), "dpkg-query: the lab's hosts are Debian (make setup installs with apt)"
    lacks = {p: not dpkg_installed(p) for p in ("postgresql-15", "mariadb-server", "galera-4")}
    assert databases.missing_packages("postgresql") == [p for p in ["postgresql-15"] if lacks[p]], lacks
    assert databases.missing_packages("mariadb") == [p for p in ["mariadb-server"] if lacks[p]], lacks
    assert databases.missing_packages("galera") == [p for p in ["mariadb-server", "galera-4"] if lacks[p]], lacks

    # a host with none of the programs: no server binary, no mariadbd/mysqld on PATH, no library
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("TIERSCOPE_PG_BINDIR", str(empty))
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(galera, "PROVIDER_LIBRARY", str(tmp_path / "no-libgalera_smm.so"))
    assert databases.missing_packages("postgresql") == ["postgresql-15"]
    assert databases.missing_packages("mariadb") == ["mariadb-server"]
    assert databases.missing_packages("galera") == ["mariadb-server", "galera-4"]

    # a host with all of them (stand-ins at the places each is looked for)
    full = tmp_path / "full"
    full.mkdir()
    for name in ("postgres", "mariadbd"):
        (full / name).write_text("#!/bin/sh\n")
        (full / name).chmod(0o755)
    (full / "libgalera_smm.so").write_bytes(b"")
    monkeypatch.setenv("TIERSCOPE_PG_BINDIR", str(full))
    monkeypatch.setenv("PATH", str(full))
    monkeypatch.setattr(galera, "PROVIDER_LIBRARY", str(full / "libgalera_smm.so"))
    assert [databases.missing_packages(d) for d in ("postgresql", "mariadb", "galera")] == [[], [], []]

    with pytest.raises(ValueError, match="dbms: expected one of postgresql, mariadb, galera"):
        databases.missing_packages("oracle")
