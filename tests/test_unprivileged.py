"""nginx's workers and the app servers run as the lab's unprivileged system user, never root.

Real runs (`tierscope run` of a one-point RUBBoS spec, on loopback and in namespaced hosts): while
the load runs, every nginx worker and every gunicorn process (master and workers) is owned by the
system user `make setup` makes (read in /proc/<pid>/status), the nginx master stays root (it binds
and holds the logs), the point finishes with every page and image served, and the database
password the app runs with is readable by root and that user only (not by `nobody`, not from a
command line, not from the credentials file). Also: `make setup`'s target makes the user once and
is idempotent, the services make it on first use the same way, and an account that is root or
could log in is refused. The clustering middleware (Python and Rust) runs as that user too, in a
one-point run with a middleware tier: owned by it in /proc, its work directory closed to others, its
password in its environment only, its stats written. And the middleware speaking the MySQL protocol (in front of a
real MariaDB) refuses a mysql client run as `nobody` without the lab's user and password, as
tests/test_credentials.py shows for the PostgreSQL protocol.
"""

from __future__ import annotations

import contextlib
import json
import pwd
import shutil
import subprocess
import tempfile
import threading
import time
import tomllib
import uuid
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from conftest import ROOT, needs_postgres, needs_root
from tierscope.runner import DONE, Progress, run_experiment
from tierscope.services._accounts import LAB_OS_USER, AccountError, lab_account
from tierscope.spec import spec_from_dict

TINY = ROOT / "examples" / "specs" / "tiny.toml"
RUNUSER = shutil.which("runuser")
SETPRIV = shutil.which("setpriv")
MYSQL = shutil.which("mariadb") or shutil.which("mysql")
HAVE_MARIADB = bool(shutil.which("mariadbd") or shutil.which("mysqld") or Path("/usr/sbin/mariadbd").exists())

pytestmark = needs_root("the servers drop to another OS user only from root")


def uids(pid: int) -> tuple[int, int, int, int]:
    """The real, effective, saved and filesystem uids of `pid` (/proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return tuple(int(x) for x in line.split()[1:5])  # type: ignore[return-value]
    raise AssertionError(f"no Uid line for pid {pid}")


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            out += [int(c) for c in (task / "children").read_text().split()]
    return out


def run_as(user: str, argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [RUNUSER, "-u", user, "--", *argv],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin"},
        cwd="/",
    )


def userdel(name: str) -> None:
    subprocess.run(["userdel", name], capture_output=True)
    subprocess.run(["groupdel", name], capture_output=True)


# --- the account ------------------------------------------------------------------------------------


def test_make_setup_makes_the_system_user_once(tmp_path):
    name = f"tstest{uuid.uuid4().hex[:8]}"
    try:
        first = subprocess.run(
            ["make", "-s", "system-user", f"LAB_OS_USER={name}"], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
        assert first.returncode == 0, first.stderr
        assert f"making the system user {name}" in first.stdout
        acct = pwd.getpwnam(name)
        assert 0 < acct.pw_uid < 1000 and acct.pw_shell.endswith("nologin") and acct.pw_dir == "/nonexistent"
        again = subprocess.run(
            ["make", "-s", "system-user", f"LAB_OS_USER={name}"], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
        assert again.returncode == 0 and again.stdout == "", again.stdout + again.stderr  # idempotent
        assert lab_account(name) == acct  # what the services accept
    finally:
        userdel(name)


def test_the_services_make_a_missing_user_on_first_use_the_same_way(capfd):
    name = f"tstest{uuid.uuid4().hex[:8]}"
    try:
        acct = lab_account(name)
        assert "made the system user" in capfd.readouterr().err
        assert 0 < acct.pw_uid < 1000 and acct.pw_shell.endswith("nologin") and acct.pw_gid != 0
        assert lab_account(name) == acct and capfd.readouterr().err == ""  # made once
    finally:
        userdel(name)


def test_an_account_that_is_root_or_can_log_in_is_refused():
    with pytest.raises(AccountError, match="must not be root"):
        lab_account("root")
    name = f"tstest{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--system", "--user-group", "--shell", "/bin/sh", name], check=True)
    try:
        with pytest.raises(AccountError, match="login shell /bin/sh"):
            lab_account(name)
    finally:
        userdel(name)


# --- a real run -------------------------------------------------------------------------------------


def one_point_spec(mode: str):
    raw = tomllib.loads(TINY.read_text())
    raw["workload"].update(users=[4], run="4s", ramp_up="1s", ramp_down="1s")
    raw["monitor"]["capture"] = False
    return spec_from_dict(raw, where=f"unprivileged-{mode}", name=f"unpriv-{mode}")


@needs_postgres
@pytest.mark.parametrize("mode", ["loopback", "namespaces"])
def test_nginx_workers_and_app_servers_run_as_the_lab_user(tmp_path, mode):
    if RUNUSER is None or SETPRIV is None:
        pytest.skip("runuser and setpriv (util-linux) are needed to act as other users")
    if mode == "namespaces":
        from tierscope.testbed.lab import namespaces_unavailable

        reason = namespaces_unavailable()
        if reason:
            pytest.skip(f"namespaced hosts unavailable: {reason}")
    lab = lab_account()
    progress = Progress()
    seen: dict = {}
    stop = threading.Event()

    def watch():  # while the load runs: who owns what, and who can read the app's secret
        while not stop.is_set() and "app" not in seen:
            if progress.phase in ("ramp_up", "run"):
                try:
                    (nginx_pid,) = tmp_path.glob("*/*/web1/nginx.pid")
                    (app_pid,) = tmp_path.glob("*/*/app1/gunicorn.pid")
                    web = int(nginx_pid.read_text())
                    app = int(app_pid.read_text())
                    web_workers, app_workers = children(web), children(app)
                    if web_workers and app_workers:
                        seen["web"] = {"master": uids(web), "workers": [uids(p) for p in web_workers]}
                        worker = app_workers[0]
                        seen["environ"] = Path(f"/proc/{worker}/environ").read_bytes().split(b"\0")
                        seen["cmdline"] = Path(f"/proc/{worker}/cmdline").read_bytes()
                        seen["nobody_environ"] = run_as("nobody", ["cat", f"/proc/{worker}/environ"])
                        seen["lab_environ"] = subprocess.run(
                            [
                                SETPRIV,
                                f"--reuid={lab.pw_uid}",
                                f"--regid={lab.pw_gid}",
                                "--clear-groups",
                                "cat",
                                f"/proc/{worker}/environ",
                            ],
                            capture_output=True,
                            timeout=30,
                        )
                        seen["app"] = {"master": uids(app), "workers": [uids(p) for p in app_workers]}
                except (ValueError, OSError):
                    pass  # not up yet, or between restarts
            time.sleep(0.1)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        result = run_experiment(one_point_spec(mode), tmp_path, mode=mode, progress=progress, report=False)
    finally:
        stop.set()
        t.join(timeout=40)
    assert result.failed == [] and len(result.done) == 1, result.failed
    assert "app" in seen, "the test never saw nginx and the app server running with their workers"

    # nginx: the master is root (it binds and holds the logs), every worker is the lab user
    assert seen["web"]["master"][0] == 0
    assert seen["web"]["workers"] and all(u == (lab.pw_uid,) * 4 for u in seen["web"]["workers"]), seen["web"]
    # gunicorn: the whole app server, master and workers
    assert seen["app"]["master"] == (lab.pw_uid,) * 4, seen["app"]
    assert all(u == (lab.pw_uid,) * 4 for u in seen["app"]["workers"]), seen["app"]

    # the database password: in the app's environment only, which root and the lab user can read
    d = result.dir / result.done[0]
    from tierscope.services.credentials import FILE_NAME, _read

    creds = _read(d / FILE_NAME)
    assert creds is not None
    assert f"RUBBOS_DB_PASSWORD={creds.password}".encode() in seen["environ"]
    assert creds.password.encode() not in seen["cmdline"]
    assert seen["nobody_environ"].returncode != 0 and creds.password not in seen["nobody_environ"].stdout
    assert seen["lab_environ"].returncode == 0 and creds.password.encode() in seen["lab_environ"].stdout
    for user in ("nobody", LAB_OS_USER):
        out = run_as(user, ["cat", str(d / FILE_NAME)])
        assert out.returncode != 0 and creds.password not in out.stdout, user

    # and the system served: pages from the app, images from nginx's document root
    assert json.loads((d / "manifest.json").read_text())["status"] == DONE
    log = pq.read_table(d / "client_requests.parquet")
    assert log.num_rows > 0
    bad = log.filter(pc.or_(pc.is_valid(log["error"]), pc.greater_equal(log["status"], 400)))
    assert bad.num_rows == 0, bad.slice(0, 5).to_pylist()
    assert (pc.sum(log["embedded_failed"]).as_py() or 0) == 0


def processes_with(needle: str) -> list[int]:
    """The live processes whose command line holds `needle` (not the shells and setpriv on the way)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = d.joinpath("cmdline").read_bytes().split(b"\0")
            if needle.encode() in argv and Path(argv[0].decode()).name not in ("sh", "setpriv", "ip"):
                out.append(int(d.name))
    return out


@needs_postgres
def test_the_middleware_runs_as_the_lab_user(tmp_path):
    """A one-point run through the clustering middleware (1/1/1/1): while the load runs the
    middleware process (found by its --stats path, owner read in /proc) is the lab user's, not root's."""
    if RUNUSER is None:
        pytest.skip("runuser (util-linux) is needed to act as nobody")
    from tierscope.engine import engine_path

    assert engine_path().exists(), engine_path()  # a missing engine binary fails, never skips
    lab = lab_account()
    raw = tomllib.loads(TINY.read_text())
    raw.update(topology="1/1/1/1-P", soft={"middleware": {"pool": 4}})
    raw["workload"].update(users=[4], run="4s", ramp_up="1s", ramp_down="1s")
    raw["monitor"]["capture"] = False
    spec = spec_from_dict(raw, where="unprivileged-mw", name="unpriv-mw")
    progress = Progress()
    seen: dict = {}
    stop = threading.Event()

    def watch():
        while not stop.is_set() and "mw" not in seen:
            if progress.phase in ("ramp_up", "run"):
                try:
                    for pid in processes_with("--stats"):
                        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                        if str(tmp_path).encode() not in b" ".join(argv):
                            continue
                        st = Path(argv[argv.index(b"--stats") + 1].decode()).parent.stat()
                        seen["workdir"] = (st.st_uid, st.st_mode & 0o777)
                        seen["environ"] = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                        seen["nobody_environ"] = run_as("nobody", ["cat", f"/proc/{pid}/environ"])
                        seen["argv"] = argv
                        seen["mw"] = uids(pid)
                except (ValueError, OSError):
                    pass
            time.sleep(0.1)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        result = run_experiment(spec, tmp_path, mode="loopback", progress=progress, report=False)
    finally:
        stop.set()
        t.join(timeout=40)
    assert result.failed == [] and len(result.done) == 1, result.failed
    assert "mw" in seen, "the test never saw the middleware running"
    assert seen["mw"] == (lab.pw_uid,) * 4, seen["mw"]  # real, effective, saved and filesystem uid
    program = seen["argv"][0].decode()
    assert program.endswith("tierscope-engine") and seen["argv"][1] == b"middleware", program
    assert seen["workdir"] == (lab.pw_uid, 0o700), seen["workdir"]  # its console and stats: closed to others

    d = result.dir / result.done[0]
    from tierscope.contracts.middleware import PASSWORD_ENV
    from tierscope.services.credentials import FILE_NAME, _read

    creds = _read(d / FILE_NAME)
    assert creds is not None
    assert f"{PASSWORD_ENV}={creds.password}".encode() in seen["environ"]
    assert creds.password.encode() not in b" ".join(seen["argv"])
    assert seen["nobody_environ"].returncode != 0 and creds.password not in seen["nobody_environ"].stdout
    # it wrote its stats as that user on exit, and served the app's reads
    stats = json.loads((d / "mw1" / "middleware.stats.json").read_text())
    assert stats["reads"] > 0, stats
    assert json.loads((d / "manifest.json").read_text())["status"] == DONE


def test_a_directory_closed_to_the_lab_user_is_named(tmp_path):
    from tierscope.services._accounts import blocked_for, make_traversable

    lab = lab_account()
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    code = closed / "module.py"
    code.write_text("x = 1\n")
    code.chmod(0o600)
    assert blocked_for(lab, code) in (closed, *closed.parents)  # pytest's own tmp dirs are 0700 too

    make_traversable(code)
    assert blocked_for(lab, code) == code  # the directories open, the file still unreadable
    code.chmod(0o644)
    assert blocked_for(lab, code) is None
    assert run_as(LAB_OS_USER, ["cat", str(code)]).stdout == "x = 1\n"  # what the kernel says too


# --- the MySQL-protocol middleware, as another local user -------------------------------------------


@pytest.mark.skipif(RUNUSER is None, reason="runuser (util-linux) runs the client as nobody")
@pytest.mark.skipif(not HAVE_MARIADB or MYSQL is None, reason="MariaDB server or client not installed")
def test_the_mysql_protocol_middleware_refuses_nobody_without_the_secret():
    """The middleware in front of MariaDB (MySQL protocol on both sides): a mysql client run
    as nobody gets in with the lab's user and password only."""
    from tierscope.services.base import free_port
    from tierscope.services.mariadb import MariaDB
    from tierscope.services.middleware import Middleware
    from tierscope.testbed.host import Host

    # not under pytest's 0700 tmp dirs: the mysql user must reach its directory
    work = Path(tempfile.mkdtemp(prefix="tierscope-unpriv-test-"))
    try:
        db = MariaDB(Host.loopback(), free_port(), work / "maria", durable=False, buffer_pool="32M", database="lab")
        mw = Middleware(
            Host.loopback("mw"),
            free_port(),
            work / "mw",
            backends=[db.address],
            database="lab",
            dbms="mariadb",
            pool=2,
        )
        c = db.credentials
        assert (mw.protocol, mw.user, mw.password) == ("mysql", c.user, c.password)  # the lab's, by default
        with db, mw:
            assert c.password not in " ".join(mw.command())  # not on its command line

            def mysql(*args: str) -> subprocess.CompletedProcess:
                tcp = ["-h", mw.host.address, "-P", str(mw.port), "--connect-timeout=5"]
                return run_as("nobody", [MYSQL, "--no-defaults", *tcp, "-N", "-B", *args, "-e", "select 42"])

            refused = {
                "no password": mysql("-u", c.user, "lab"),
                "a wrong password": mysql("-u", c.user, "-pguess", "lab"),
                "root without a password": mysql("-u", "root"),
                "root with the lab's password": mysql("-u", "root", f"-p{c.password}"),
            }
            for what, out in refused.items():
                assert out.returncode != 0 and "42" not in out.stdout, f"{what}: {out.stdout} {out.stderr}"
                assert "Access denied" in out.stderr, f"{what}: {out.stderr}"
            ok = mysql("-u", c.user, f"-p{c.password}", "lab")  # the password is what counts
            assert ok.returncode == 0 and ok.stdout.strip() == "42", ok.stderr
    finally:
        shutil.rmtree(work, ignore_errors=True)


@needs_postgres
def test_the_middleware_writes_its_stats_when_a_parent_was_closed_during_the_run():
    """The middleware writes its stats on exit, by path, as the lab user: a directory above its work
    directory closed to others while it runs (pytest closes its pytest-of-<user> directory when
    another session starts) is opened again (o+x) before it is stopped, and the stats are there."""
    from tierscope.engine import engine_path
    from tierscope.services.base import free_port
    from tierscope.services.middleware import Middleware
    from tierscope.services.postgres import Postgres
    from tierscope.testbed.host import Host

    assert engine_path().exists(), engine_path()  # a missing engine binary fails, never skips
    lab = lab_account()
    work = Path(tempfile.mkdtemp(prefix="tierscope-unpriv-test-"))
    try:
        pg = Postgres(Host.loopback(), free_port(), work / "pg", fsync=False, shared_buffers="32MB", database="lab")
        mw = Middleware(
            Host.loopback("mw"),
            free_port(),
            work / "run" / "mw",
            backends=[pg.address],
            database="lab",
            user=pg.credentials.user,
            password=pg.credentials.password,
            pool=2,
        )
        with pg, mw:
            assert mw.proc is not None and uids(mw.proc.pid) == (lab.pw_uid,) * 4
            (work / "run").chmod(0o700)  # closed to the lab user while the middleware runs
        stats = mw.stats()
        assert [b["name"] for b in stats["backends"]] == [pg.address], stats
        st = mw.workdir.stat()
        assert (st.st_uid, st.st_mode & 0o777) == (lab.pw_uid, 0o700)
    finally:
        shutil.rmtree(work, ignore_errors=True)
