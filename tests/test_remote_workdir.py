"""A `--hosts` run's files on the hosts are kept where no other local user can plant them (issue 21).

The work directory was a fixed /tmp path (`/tmp/tierscope-remote`) any local user could make first;
now the default is root's /var/lib/tierscope/remote, and whatever the inventory names is checked on
the host before anything is written there or removed through it (`agent workdir`, the first task of
up.yml, of the fetch play of down.yml and of cleanup.yml): made 0700 when missing, refused when it
is a symbolic link, another user's or writable by others. The agent's pid file records its pid,
start time and command line; `agent stop` signals nothing a planted or stale pid file names.
Real processes: the agent run as a program, directories planted by user `nobody` (setpriv), a
`sleep` as the process a planted pid file names.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from conftest import needs_root
from tierscope import statedir
from tierscope.remote.inventory import DEFAULT_WORKDIR

NOBODY = pwd.getpwnam("nobody")
AS_NOBODY = ["setpriv", f"--reuid={NOBODY.pw_uid}", f"--regid={NOBODY.pw_gid}", "--clear-groups"]


def agent(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tierscope.remote.agent", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def tmp():
    """A scratch directory in /tmp itself (sticky, world-writable: where a planter works)."""
    d = Path(tempfile.mkdtemp(prefix="tierscope-remote-test-"))
    os.chmod(d, 0o1777)  # like /tmp: anyone may make an entry in it
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def victim():
    p = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield p
    p.kill()
    p.wait()


def test_the_default_work_directory_is_not_under_tmp():
    assert not DEFAULT_WORKDIR.startswith(("/tmp", "/var/tmp", "/dev/shm"))
    assert DEFAULT_WORKDIR == "/var/lib/tierscope/remote"


def test_every_play_that_writes_or_removes_on_the_hosts_checks_the_work_directory_first(tmp_path):
    from tierscope.remote import playbooks

    point = tmp_path / "point.json"
    point.write_text("{}")
    books = playbooks.point_playbooks(
        tmp_path / "p1",
        "run-1",
        "p1",
        {"web1": {"tier": "web", "host": "h1", "address": "10.0.0.1"}},
        {"h1": {"name": "client1", "users": 1, "first": 0}},
        point,
        "http://10.0.0.1:80",
        10.0,
        "/usr/bin/python3",
    )
    (tmp_path / "ansible").mkdir()
    cleanup = playbooks.cleanup_playbook(tmp_path, "run-1", ["h1"])
    up = yaml.safe_load(books["up"].read_text())
    down = yaml.safe_load(books["down"].read_text())
    plays = {"up": up[0], "fetch": down[-1], "cleanup": yaml.safe_load(cleanup.read_text())[0]}
    for which, play in plays.items():
        first = play["tasks"][0]["ansible.builtin.command"]
        assert "-m tierscope.remote.agent workdir --dir " in first, which
        assert f"default('{DEFAULT_WORKDIR}')" in first, which
    text = "".join(p.read_text() for p in (*books.values(), cleanup))
    assert "/tmp/tierscope-remote" not in text


@needs_root("a directory planted by another user")
def test_the_work_directory_is_made_private_when_missing(tmp):
    w = tmp / "ts" / "remote"
    out = agent("workdir", "--dir", str(w))
    assert out.returncode == 0, out.stderr
    for d in (w, w.parent):
        st = os.lstat(d)
        assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o700, (d, oct(st.st_mode))
    again = agent("workdir", "--dir", str(w))  # ours and private: accepted as it is
    assert again.returncode == 0 and again.stdout.strip() == str(w), again.stderr


@needs_root("a directory planted by another user")
def test_a_work_directory_planted_in_tmp_is_refused_and_nothing_is_written_there(tmp):
    planted = tmp / "tierscope-remote"
    made = subprocess.run([*AS_NOBODY, "mkdir", "-m", "0700", str(planted)], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    out = agent("workdir", "--dir", str(planted))
    assert out.returncode == 1
    assert f"refusing state directory {planted}: it is owned by nobody" in out.stderr, out.stderr
    assert list(planted.iterdir()) == [] and os.lstat(planted).st_uid == NOBODY.pw_uid  # untouched

    # a symlink to a directory of root's: refused, not followed
    target = tmp / "roots"
    target.mkdir(mode=0o700)
    link = tmp / "link"
    subprocess.run([*AS_NOBODY, "ln", "-s", str(target), str(link)], check=True)
    out = agent("workdir", "--dir", str(link))
    assert out.returncode == 1 and "it is a symbolic link" in out.stderr, out.stderr

    # root's own, but others may write to it (an inventory naming a shared directory)
    shared = tmp / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    out = agent("workdir", "--dir", str(shared))
    assert out.returncode == 1 and "group or others can write to it" in out.stderr, out.stderr


def test_a_work_directory_that_cannot_be_made_says_to_set_tierscope_workdir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = agent("workdir", "--dir", str(blocker / "remote"))
    assert out.returncode == 1 and "set tierscope_workdir" in out.stderr, out.stderr


def test_stop_where_nothing_started_says_not_running(tmp_path):
    out = agent("stop", "--dir", str(tmp_path / "never" / "web1"), "--timeout", "1")
    assert out.returncode == 0 and "not running" in out.stdout, out.stdout + out.stderr


@needs_root("a pid file planted by another user")
def test_stop_signals_nothing_a_planted_or_stale_pid_file_names(tmp, victim):
    d = tmp / "point" / "web1"
    d.mkdir(parents=True)
    os.chmod(tmp / "point", 0o755)
    os.chmod(d, 0o755)
    pidfile = d / "agent.pid"

    pidfile.write_text(str(victim.pid))  # a bare pid (the old format): no start time to check
    out = agent("stop", "--dir", str(d), "--timeout", "2")
    assert out.returncode == 1 and "expected a JSON object" in out.stderr, out.stdout + out.stderr
    assert victim.poll() is None

    record = statedir.identity(victim.pid)
    assert record is not None
    stale = dict(record, start_time=record["start_time"] - 1)  # the recorded agent exited, its pid reused
    pidfile.unlink()
    statedir.write_json(pidfile, stale)
    out = agent("stop", "--dir", str(d), "--timeout", "2")
    assert out.returncode == 0 and f"pid {victim.pid} started at tick" in out.stdout, out.stdout + out.stderr
    assert victim.poll() is None

    pidfile.unlink()  # the right record, but in a file another user owns
    pidfile.write_text(json.dumps(record))
    pidfile.chmod(0o600)
    os.chown(pidfile, NOBODY.pw_uid, NOBODY.pw_gid)
    out = agent("stop", "--dir", str(d), "--timeout", "2")
    assert out.returncode == 1 and "refusing state file" in out.stderr and "nothing stopped" in out.stderr, out.stderr
    assert victim.poll() is None

    pidfile.unlink()  # the record the agent itself writes: that process is stopped
    statedir.write_json(pidfile, record)
    t0 = time.monotonic()
    out = agent("stop", "--dir", str(d), "--timeout", "10")
    assert out.returncode == 0 and "stopped" in out.stdout, out.stdout + out.stderr
    assert victim.wait(timeout=5) == -15 and time.monotonic() - t0 < 10
