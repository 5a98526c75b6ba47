"""Credentials everywhere: every database server the lab starts, and the middleware, require the
lab's secret (a random password per lab, in a 0600 file), and no other local user gets in.

Real servers, started through the services layer. Another local user is `nobody` (`runuser -u
nobody --`): psql over TCP and over the unix socket, mysql over TCP and over its socket, and a
PostgreSQL client through the middleware (`tierscope-engine middleware`); every attempt without the secret is
refused, and the lab user with the secret connects (from nobody too: the password is what counts).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import needs_postgres, needs_root
from tierscope.services.credentials import FILE_NAME, LAB_USER, CredentialsError, lab_credentials

PSQL = shutil.which("psql") or "/usr/lib/postgresql/15/bin/psql"
MYSQL = shutil.which("mariadb") or shutil.which("mysql")
HAVE_MARIADB = bool(shutil.which("mariadbd") or shutil.which("mysqld") or Path("/usr/sbin/mariadbd").exists())
RUNUSER = shutil.which("runuser")

as_nobody_possible = pytest.mark.skipif(
    os.geteuid() != 0 or RUNUSER is None, reason="running a client as user nobody needs root and runuser"
)


def as_nobody(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `argv` as the OS user nobody, with only `env` (and PATH) in its environment."""
    clean = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", **(env or {})}
    return subprocess.run(
        [RUNUSER, "-u", "nobody", "--", *argv], capture_output=True, text=True, timeout=60, env=clean, cwd="/"
    )


@pytest.fixture(scope="module")
def work():
    # not under pytest's 0700 tmp dirs: the postgres and mysql users must reach their directories
    d = Path(tempfile.mkdtemp(prefix="tierscope-cred-test-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


# --- the credentials file -------------------------------------------------------------------------


def test_the_credentials_file_is_made_once_private_and_random(tmp_path):
    a = lab_credentials(tmp_path)
    assert a.user == LAB_USER and len(a.password) >= 40 and a.path == tmp_path / FILE_NAME
    st = a.path.stat()
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
    assert lab_credentials(tmp_path) == a  # the lab's servers share it
    assert lab_credentials(tmp_path / "other") != a  # another lab, another secret
    assert a.password not in repr(a)
    assert set(os.listdir(tmp_path)) == {FILE_NAME, "other"}  # no temporary file left


def test_a_planted_or_loose_credentials_file_is_replaced(tmp_path):
    planted = tmp_path / FILE_NAME
    planted.write_text(json.dumps({"user": LAB_USER, "password": "known-to-the-planter"}))
    planted.chmod(0o644)  # readable by others: not a secret
    c = lab_credentials(tmp_path)
    assert c.password != "known-to-the-planter" and stat.S_IMODE(c.path.stat().st_mode) == 0o600

    target = tmp_path / "victim"
    target.write_text("root's file")
    c.path.unlink()
    c.path.symlink_to(target)  # a symlink is never followed
    d = lab_credentials(tmp_path)
    assert not d.path.is_symlink() and target.read_text() == "root's file"


def test_a_credentials_file_of_garbage_is_an_error_not_a_password(tmp_path):
    from tierscope.services.credentials import _read

    bad = tmp_path / FILE_NAME
    bad.write_text("not json")
    bad.chmod(0o600)
    with pytest.raises(CredentialsError, match="not a credentials file"):
        _read(bad)


@as_nobody_possible
def test_nobody_cannot_read_the_credentials_file(work):
    c = lab_credentials(work / "lab")
    out = as_nobody(["cat", str(c.path)])
    assert out.returncode != 0 and c.password not in out.stdout


# --- PostgreSQL ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pg(work):
    if os.geteuid() != 0:
        pytest.skip("PostgreSQL runs as its own OS user: needs root")
    from tierscope.services.base import free_port
    from tierscope.services.postgres import Postgres
    from tierscope.testbed.host import Host

    p = Postgres(Host.loopback(), free_port(), work / "pg", fsync=False, shared_buffers="32MB", database="lab")
    p.start()
    try:
        yield p
    finally:
        p.stop()


def psql(pg, *args: str, password: str | None = None) -> subprocess.CompletedProcess:
    env = {"PGCONNECT_TIMEOUT": "5"} | ({"PGPASSWORD": password} if password is not None else {})
    return as_nobody([PSQL, "-X", "-w", "-p", str(pg.port), "-d", "lab", "-tA", *args], env)


@needs_root("PostgreSQL runs as its own OS user")
@needs_postgres
@as_nobody_possible
def test_postgres_refuses_nobody_over_tcp_and_the_socket(pg):
    c = pg.credentials
    tcp = ["-h", pg.host.address]
    refused = {
        "superuser over TCP": psql(pg, *tcp, "-U", "postgres", "-c", "select 1"),
        "superuser over TCP with the lab's password": psql(
            pg, *tcp, "-U", "postgres", "-c", "select 1", password=c.password
        ),
        "lab user without a password": psql(pg, *tcp, "-U", c.user, "-c", "select 1"),
        "lab user with a wrong password": psql(pg, *tcp, "-U", c.user, "-c", "select 1", password="guess"),
        "superuser over the socket": psql(pg, "-h", str(pg.socket_dir), "-U", "postgres", "-c", "select 1"),
        "lab user over the socket": psql(
            pg, "-h", str(pg.socket_dir), "-U", c.user, "-c", "select 1", password=c.password
        ),
    }
    for what, out in refused.items():
        assert out.returncode != 0 and out.stdout.strip() != "1", f"{what}: {out.stdout} {out.stderr}"
    assert "no pg_hba.conf entry" in refused["superuser over TCP"].stderr
    assert "password authentication failed" in refused["lab user with a wrong password"].stderr
    assert "Permission denied" in refused["superuser over the socket"].stderr
    # the socket's directory: the postgres user's alone
    import pwd

    st = pg.socket_dir.stat()
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == pwd.getpwnam("postgres").pw_uid
    hba = (pg.data_dir / "pg_hba.conf").read_text()
    assert "trust" not in hba.replace("no trust", "") and "scram-sha-256" in hba
    # with the secret: in, as a user that is no superuser and cannot run programs
    ok = psql(
        pg, *tcp, "-U", c.user, "-c", "select rolsuper from pg_roles where rolname = current_user", password=c.password
    )
    assert ok.returncode == 0 and ok.stdout.strip() == "f", ok.stderr
    shell = psql(pg, *tcp, "-U", c.user, "-c", "COPY (SELECT 1) TO PROGRAM 'id'", password=c.password)
    assert shell.returncode != 0 and "must be superuser" in shell.stderr, shell.stderr


@needs_root("PostgreSQL runs as its own OS user")
@needs_postgres
def test_postgres_listens_on_its_host_address_only(pg):
    from tierscope.services.base import tcp_answers

    conf = (pg.data_dir / "postgresql.auto.conf").read_text()
    assert f"listen_addresses = '{pg.host.address}'" in conf
    assert not tcp_answers("127.0.0.2", pg.port) or pg.host.address == "0.0.0.0"


# --- the middleware (PostgreSQL protocol) --------------------------------------------------------


@needs_root("PostgreSQL runs as its own OS user")
@needs_postgres
@as_nobody_possible
def test_the_middleware_refuses_clients_without_the_secret(pg, work):
    from tierscope.engine import engine_path
    from tierscope.services.base import free_port
    from tierscope.services.middleware import Middleware
    from tierscope.testbed.host import Host

    assert engine_path().exists(), engine_path()  # a missing engine binary fails here, never skips
    mw = Middleware(
        Host.loopback("mw"),
        free_port(),
        work / "mw",
        backends=[pg.address],
        database="lab",
        pool=2,
        name="mw",
    )
    assert (mw.user, mw.password) == (pg.credentials.user, pg.credentials.password)  # the lab's, by default
    mw.start()
    try:
        assert pg.credentials.password not in " ".join(mw.command())  # not on its command line

        def through(user: str, password: str | None) -> subprocess.CompletedProcess:
            env = {"PGCONNECT_TIMEOUT": "5"} | ({"PGPASSWORD": password} if password is not None else {})
            argv = [PSQL, "-X", "-w", "-h", mw.host.address, "-p", str(mw.port), "-U", user, "-d", "lab", "-tA"]
            return as_nobody([*argv, "-c", "select 42"], env)

        c = pg.credentials
        for what, out in {
            "no password": through(c.user, None),
            "a wrong password": through(c.user, "guess"),
            "another user with the password": through("postgres", c.password),
        }.items():
            assert out.returncode != 0 and "42" not in out.stdout, f"{what}: {out.stdout} {out.stderr}"
        wrong = through(c.user, "guess")
        assert "password authentication failed" in wrong.stderr, wrong.stderr
        ok = through(c.user, c.password)
        assert ok.returncode == 0 and ok.stdout.strip() == "42", ok.stderr
    finally:
        mw.stop()


# --- MariaDB ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def maria(work):
    if os.geteuid() != 0:
        pytest.skip("MariaDB runs as its own OS user: needs root")
    if not HAVE_MARIADB or MYSQL is None:
        pytest.skip("MariaDB server or client not installed")
    from tierscope.services.base import free_port
    from tierscope.services.mariadb import MariaDB
    from tierscope.testbed.host import Host

    m = MariaDB(Host.loopback(), free_port(), work / "maria", durable=False, buffer_pool="32M", database="lab")
    m.start()
    try:
        yield m
    finally:
        m.stop()


def mysql(m, *args: str) -> subprocess.CompletedProcess:
    return as_nobody([MYSQL, "--no-defaults", "--connect-timeout=5", "-N", "-B", *args, "-e", "select 42"])


@as_nobody_possible
def test_mariadb_refuses_nobody_over_tcp_and_the_socket(maria):
    c = maria.credentials
    tcp = ["-h", maria.host.address, "-P", str(maria.port)]
    refused = {
        "root over TCP": mysql(maria, *tcp, "-u", "root"),
        "root over TCP with the lab's password": mysql(maria, *tcp, "-u", "root", f"-p{c.password}"),
        "lab user without a password": mysql(maria, *tcp, "-u", c.user),
        "lab user with a wrong password": mysql(maria, *tcp, "-u", c.user, "-pguess"),
        "root over the socket": mysql(maria, f"--socket={maria.socket}", "-u", "root"),
        "lab user over the socket": mysql(maria, f"--socket={maria.socket}", "-u", c.user, f"-p{c.password}"),
    }
    for what, out in refused.items():
        assert out.returncode != 0 and "42" not in out.stdout, f"{what}: {out.stdout} {out.stderr}"
    assert "Access denied" in refused["root over TCP"].stderr
    assert "(13)" in refused["root over the socket"].stderr  # EACCES: the socket's directory is closed
    assert stat.S_IMODE(maria.socket.parent.stat().st_mode) & 0o077 == 0
    ok = mysql(maria, *tcp, "-u", c.user, f"-p{c.password}", "lab")
    assert ok.returncode == 0 and ok.stdout.strip() == "42", ok.stderr


def test_mariadb_root_is_socket_only_and_the_lab_user_has_its_database_only(maria):
    import pymysql

    users = {(u, h): p for u, h, p in maria.sql("SELECT user, host, plugin FROM mysql.user")}
    assert users[("root", "localhost")] == "unix_socket" and [u for u in users if u[0] == "root"] == [
        ("root", "localhost")
    ]
    conn = pymysql.connect(**maria.connect_args("lab"), autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW GRANTS")
            grants = [g[0] for g in cur.fetchall()]
            assert any("ALL PRIVILEGES ON `lab`.*" in g for g in grants), grants
            assert not any("ON *.*" in g and "USAGE" not in g for g in grants), grants
            assert not any("WITH GRANT OPTION" in g for g in grants), grants
            for statement in ("CREATE DATABASE other", "SELECT * FROM mysql.user", "SELECT LOAD_FILE('/etc/passwd')"):
                try:
                    cur.execute(statement)
                    got = cur.fetchall()
                except pymysql.err.MySQLError:
                    continue
                assert got in ((), ((None,),)), (statement, got)  # LOAD_FILE without FILE: NULL
    finally:
        conn.close()


def test_a_dsns_password_leaves_the_engines_command_line_for_its_environment():
    from tierscope.oltp import without_password

    assert without_password("host=10.0.0.2 port=5432 user=tierscope password=s3-cr_et dbname=bench") == (
        "user=tierscope dbname=bench host=10.0.0.2 port=5432",
        "s3-cr_et",
    )
    assert without_password("mysql://tierscope:s3-cr_et@10.0.0.2:3306/bench") == (
        "mysql://tierscope@10.0.0.2:3306/bench",
        "s3-cr_et",
    )
    for dsn in ("host=127.0.0.1 port=1 user=x dbname=x", "mysql://tierscope@127.0.0.1:3306/bench"):
        assert without_password(dsn) == (dsn, "")


# --- a namespaced lab: every host reachable through the bridge, none without the secret -----------

NS_SPEC = """
topology = "1/1/1/1S"
[node_types.S]
cpu = 1.0
memory = "512MiB"
[workload]
users = [1]
"""


@needs_root("network namespaces and PostgreSQL's own OS user")
@needs_postgres
@as_nobody_possible
def test_in_a_namespaced_lab_the_database_and_the_middleware_refuse_nobody(work):
    from tierscope.services.middleware import Middleware
    from tierscope.services.postgres import Postgres
    from tierscope.spec import expand, parse_spec
    from tierscope.testbed.lab import Testbed, free_lab, namespaces_unavailable

    reason = namespaces_unavailable()
    if reason:
        pytest.skip(f"namespaced hosts unavailable: {reason}")
    point = expand(parse_spec(NS_SPEC, where="test"))[0]
    lab = work / "nslab"
    with Testbed(lab=free_lab(40), workdir=lab / "testbed", mode="namespaces") as tb:
        tb.up(point)
        db_host = tb.hosts["db1"]
        mw_host = tb.hosts["mw1"]
        pg = Postgres(db_host, 5432, lab / "db1", fsync=False, shared_buffers="32MB", database="lab")
        mw = Middleware(mw_host, 25322, lab / "mw1", backends=[pg.address], database="lab", pool=2)
        with pg, mw:
            c = pg.credentials
            assert (mw.user, mw.password) == (c.user, c.password)  # one lab, one secret
            assert f"listen_addresses = '{db_host.address}'" in (pg.data_dir / "postgresql.auto.conf").read_text()

            def psql(host: str, port: int, user: str, password: str | None) -> subprocess.CompletedProcess:
                env = {"PGCONNECT_TIMEOUT": "5"} | ({"PGPASSWORD": password} if password is not None else {})
                argv = [PSQL, "-X", "-w", "-tA", "-h", host, "-p", str(port), "-U", user, "-d", "lab"]
                return as_nobody([*argv, "-c", "select 42"], env)

            for host, port in ((db_host.address, pg.port), (mw_host.address, mw.port)):
                for user, password in (("postgres", None), (c.user, None), (c.user, "guess"), ("postgres", c.password)):
                    out = psql(host, port, user, password)
                    assert out.returncode != 0 and "42" not in out.stdout, (host, user, out.stderr)
                ok = psql(host, port, c.user, c.password)
                assert ok.returncode == 0 and ok.stdout.strip() == "42", (host, ok.stderr)


def test_the_scram_verifier_matches_rfc7677():
    """The verifier the lab sets on its PostgreSQL role checks RFC 7677's example exchange (user
    "user", password "pencil"). Both ends of the exchange are the Rust middleware's, checked by
    `cargo test` (engine/src/middleware/scram.rs: client_and_server_agree_and_a_wrong_password_fails,
    hi_matches_rfc7677) and end to end by the login tests above."""
    import base64

    from tierscope.services.scram import ScramVerifier

    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    nonce = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
    auth = f"n=user,r=rOprNGfwEbeRWgbNEkqO,r={nonce},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096,c=biws,r={nonce}".encode()
    proof = base64.b64decode("dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    v = ScramVerifier("pencil", salt=salt)
    assert v.accepts(auth, proof)
    assert v.server_signature(auth) == base64.b64decode("6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
    assert not ScramVerifier("pencil!", salt=salt).accepts(auth, proof)  # another password
    assert not v.accepts(auth + b"x", proof)  # another exchange
    # the verifier PostgreSQL stores: SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>
    secret = v.postgres_secret()
    assert secret.startswith("SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$") and secret.count(":") == 2
    stored, server = (base64.b64decode(x) for x in secret.split("$")[2].split(":"))
    assert (stored, server) == (v.stored_key, v.server_key)
