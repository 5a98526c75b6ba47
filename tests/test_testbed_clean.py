"""`tierscope testbed up/status/down/clean` by hand: clean removes everything tierscope left and
nothing else. Runs after test_testbed.py (whose lab is down by then); needs root."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tierscope.testbed.lab import namespaces_unavailable

BIN = Path(sys.executable).parent
TINY = Path(__file__).resolve().parent.parent / "examples" / "specs" / "tiny.toml"
LAB = 8


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "tierscope"), "testbed", *args], capture_output=True, text=True, timeout=120)


def netns() -> list[str]:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split("\n")


def tierscope_cgroups() -> list[Path]:
    return [p for p in Path("/sys/fs/cgroup").glob("*/tierscope") if p.is_dir()]


@pytest.fixture
def needs_namespaces():
    reason = namespaces_unavailable()
    if reason:
        pytest.skip(f"namespaced hosts unavailable: {reason}")


def test_up_status_down_by_hand(needs_namespaces):
    up = cli("up", str(TINY), "--lab", str(LAB), "--point", "1")
    try:
        assert up.returncode == 0, up.stderr
        assert "point 1 of 2" in up.stdout
        assert f"tierscope{LAB}-db1" in " ".join(netns())
        assert f"10.77.{LAB}.4" in up.stdout and "cpu 0.5 cores" in up.stdout
        creds = re.search(r"database credentials: (\S+)", up.stdout)  # where the lab's secret is: root's alone
        assert creds and Path(creds.group(1)).stat().st_mode & 0o777 == 0o600, up.stdout
        again = cli("up", str(TINY), "--lab", str(LAB))
        assert again.returncode == 1 and "already up" in again.stderr
        st = cli("status")
        assert st.returncode == 0 and f"lab {LAB}: namespaces (bridge tsbr{LAB})" in st.stdout
        assert "db1: netns present, 0 processes" in st.stdout
    finally:
        down = cli("down", "--lab", str(LAB))
    assert down.returncode == 0, down.stderr
    assert not any(n.startswith(f"tierscope{LAB}-") for n in netns())
    assert not Path(f"/sys/class/net/tsbr{LAB}").exists()
    assert not Path(f"/sys/fs/cgroup/cpu/tierscope/{LAB}").exists()
    assert "no lab is up" in cli("status").stdout or f"lab {LAB}" not in cli("status").stdout


def _others_labs() -> list[str]:
    """tierscope things on this machine that are not this test's (clean would remove them too)."""
    from tierscope.testbed.clean import leftovers

    left = leftovers()
    other = [n for n in left["netns"] if not n.startswith(f"tierscope{LAB}-")]
    other += [c for c in left["cgroups"] if not (c.endswith("/tierscope") or f"/tierscope/{LAB}" in c)]
    return other + [f"process {p}" for p in left["processes"]]


def test_clean_removes_everything_tierscope_left_and_nothing_else(needs_namespaces):
    busy = _others_labs()
    if busy:
        pytest.skip(f"another tierscope lab is up on this machine and clean would remove it: {busy[:3]}")
    up = cli("up", str(TINY), "--lab", str(LAB))
    assert up.returncode == 0, up.stderr
    # a process left running in a host (as a crashed run would leave a server)
    from tierscope.testbed.lab import Testbed

    tb = Testbed.from_state(LAB)
    tb.detach()
    orphan = subprocess.Popen(tb.hosts["app1"].wrap(["sleep", "300"]), start_new_session=True)
    # things that look similar but are not tierscope's: they must survive
    other_ns = f"tsother{os.getpid()}"
    other_link = f"tsdummy{os.getpid() % 10000}"
    other_cg = Path(f"/sys/fs/cgroup/cpu/tsother{os.getpid()}")
    bystander = subprocess.Popen(["sleep", "300"])
    try:
        subprocess.run(["ip", "netns", "add", other_ns], check=True)
        subprocess.run(["ip", "link", "add", other_link, "type", "veth", "peer", "name", other_link + "p"],
                       check=True)  # fmt: skip
        other_cg.mkdir()
        time.sleep(0.2)
        assert orphan.poll() is None
        out = cli("clean")
        assert out.returncode == 0, out.stdout + out.stderr
        assert "removed 1 processes, 4 namespaces" in out.stdout
        orphan.wait(timeout=10)
        assert orphan.returncode == -9
        # nothing of tierscope's is left
        assert not [n for n in netns() if n.startswith("tierscope")]
        links = subprocess.run(["ip", "-d", "link"], capture_output=True, text=True).stdout
        assert f"tsbr{LAB}" not in links and "alias tierscope" not in links
        assert tierscope_cgroups() == []
        assert not list(Path("/run/tierscope").glob(f"lab{LAB}*"))  # state file and work dir
        # and nothing else was touched
        assert other_ns in " ".join(netns())
        assert Path(f"/sys/class/net/{other_link}").exists()
        assert other_cg.is_dir()
        assert bystander.poll() is None
        again = cli("clean")
        assert "removed 0 processes, 0 namespaces, 0 links, 0 cgroup directories, 0 state" in again.stdout
    finally:
        if orphan.poll() is None:
            orphan.kill()
        bystander.kill()
        bystander.wait()
        subprocess.run(["ip", "netns", "del", other_ns], capture_output=True)
        subprocess.run(["ip", "link", "del", other_link], capture_output=True)
        if other_cg.exists():
            other_cg.rmdir()
        cli("down", "--lab", str(LAB))


def test_clean_removes_the_shared_memory_a_killed_postgres_left(tmp_path):
    """A PostgreSQL server killed with SIGKILL leaves its dynamic shared memory segments in
    /dev/shm (only a restart on the same data directory would remove them, and a lab's work
    directory is gone by then); `testbed clean` removes them once no server runs, and leaves
    other files there alone."""
    from tierscope.services.base import free_port
    from tierscope.services.postgres import Postgres
    from tierscope.testbed.clean import postgres_running
    from tierscope.testbed.host import Host

    if postgres_running():
        pytest.skip("a PostgreSQL server runs on this machine: clean leaves the segments alone then")
    shm = Path("/dev/shm")
    before = set(shm.glob("PostgreSQL.*"))
    pg = Postgres(Host.loopback("db"), free_port(), tmp_path / "db", fsync=False, name="db")
    bystander = shm / f"tsother.{os.getpid()}"
    bystander.write_text("not PostgreSQL's")
    try:
        pg.start()
        made = set(shm.glob("PostgreSQL.*")) - before
        assert made, "the server made no segment"
        for pid in pg.pids():
            os.kill(pid, 9)
        pg.proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while postgres_running() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not postgres_running()
        assert all(s.exists() for s in made)  # left behind
        time.sleep(1.1)  # older than the check by clean's margin
        out = cli("clean")
        assert out.returncode == 0, out.stdout + out.stderr
        assert not any(s.exists() for s in made)
        assert re.search(r"(\d+) PostgreSQL shared memory segments", out.stdout).group(1) == str(len(made | before))
        assert bystander.exists()
    finally:
        bystander.unlink(missing_ok=True)
        pg.stop()
