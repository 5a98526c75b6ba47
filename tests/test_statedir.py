"""State tierscope can trust (issue 21): `tierscope rubbos up/down` refuse a run directory or state
file planted by someone else, never write through a symlink, and stop only the processes they
started (pid, start time and command line all matching). Real processes: a `sleep` plays the
victim another user's planted state file names."""

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

from tierscope import statedir

BIN = Path(sys.executable).parent
NOBODY = pwd.getpwnam("nobody")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


def tierscope(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "tierscope"), *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def run_dir():
    d = Path(tempfile.mkdtemp(prefix="tierscope-state-test-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def victim():
    """A process that is not tierscope's (in a session of its own, as the servers `up` starts)."""
    p = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield p
    p.kill()
    p.wait()


def _alive(p: subprocess.Popen) -> bool:
    return p.poll() is None


def _state(pids: list[dict]) -> dict:
    return {"url": "http://127.0.0.1:1/", "processes": [{"name": "db", "kind": "postgres", **x} for x in pids]}


def _plant(run_dir: Path, state: dict) -> Path:
    f = run_dir / "state.json"
    f.write_text(json.dumps(state))
    return f


@needs_root
def test_state_dir_of_another_user_is_refused_and_the_victim_lives(run_dir, victim):
    """/tmp/tierscope-rubbos made first by another user, with a state file naming a root process
    (with its true start time and command line even): refused, naming the directory and its owner."""
    _plant(run_dir, _state([statedir.identity(victim.pid)]))
    os.chown(run_dir, NOBODY.pw_uid, NOBODY.pw_gid)
    out = tierscope("rubbos", "down", "--run-dir", str(run_dir))
    msg = " ".join(out.stderr.split())
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"refusing state directory {run_dir}: it is owned by nobody (uid {NOBODY.pw_uid})" in msg, msg
    assert "drwx------ 0700" in msg, msg
    time.sleep(0.2)
    assert _alive(victim)


def test_state_dir_writable_by_others_is_refused(run_dir, victim):
    _plant(run_dir, _state([statedir.identity(victim.pid)]))
    os.chmod(run_dir, 0o777)
    out = tierscope("rubbos", "down", "--run-dir", str(run_dir))
    assert out.returncode == 1 and "group or others can write to it" in out.stderr, out.stderr
    assert "0777" in out.stderr
    assert _alive(victim)


@needs_root
def test_state_file_of_another_user_is_refused(run_dir, victim):
    f = _plant(run_dir, _state([statedir.identity(victim.pid)]))
    os.chown(f, NOBODY.pw_uid, NOBODY.pw_gid)
    out = tierscope("rubbos", "down", "--run-dir", str(run_dir))
    assert out.returncode == 1, out.stderr
    assert f"refusing state file {f}: it is owned by nobody" in " ".join(out.stderr.split())
    assert _alive(victim)


@pytest.mark.parametrize("record", ["pid only", "wrong start time", "other command"])
def test_recorded_pid_that_is_not_the_process_started_is_left_alone(run_dir, victim, record):
    """The record names a live process, but not the one `up` started: a planted record without
    start time and command line, a reused pid (another start time), another program."""
    who = statedir.identity(victim.pid)
    rec = {
        "pid only": {"pid": victim.pid},
        "wrong start time": {**who, "start_time": who["start_time"] - 1},
        "other command": {**who, "cmdline": ["postgres", "-D", "/x"]},
    }[record]
    f = _plant(run_dir, _state([rec]))
    out = tierscope("rubbos", "down", "--run-dir", str(run_dir))
    assert out.returncode == 1, out.stdout + out.stderr
    assert "not stopping 1 recorded process(es)" in out.stderr and f"pid {victim.pid}" in out.stderr
    time.sleep(0.2)
    assert _alive(victim)
    assert f.exists()  # kept for the user to look at


def test_the_process_recorded_is_stopped(run_dir, victim):
    """The control: the same state file with the victim's true identity, in a directory of ours,
    does stop it (so the refusals above are the checks at work, not a `down` that stops nothing)."""
    f = _plant(run_dir, _state([statedir.identity(victim.pid)]))
    out = tierscope("rubbos", "down", "--run-dir", str(run_dir))
    assert out.returncode == 0, out.stderr
    assert f"stopped db (pid {victim.pid})" in out.stdout
    victim.wait(timeout=10)
    assert not f.exists()


def test_planted_symlink_is_refused_and_its_target_untouched(run_dir):
    target = Path(tempfile.mkdtemp(prefix="tierscope-state-target-")) / "precious.conf"
    try:
        target.write_text("root's own file\n")
        os.chmod(target, 0o644)
        (run_dir / "state.json").symlink_to(target)
        # up: refused before starting anything (no server, no port), the target unchanged
        out = tierscope("rubbos", "up", "--run-dir", str(run_dir), "--port", "1", "--app-port", "2")
        assert out.returncode == 1, out.stdout + out.stderr
        assert f"refusing state file {run_dir / 'state.json'}: it is a symbolic link (to {target})" in " ".join(
            out.stderr.split()
        )
        assert not (run_dir / "postgresql").exists()
        # down: refused too
        out = tierscope("rubbos", "down", "--run-dir", str(run_dir))
        assert out.returncode == 1 and "it is a symbolic link" in out.stderr, out.stderr
        # the writer itself never follows it
        with pytest.raises(statedir.StateError, match="symbolic link"):
            statedir.write_json(run_dir / "state.json", {"processes": []})
        assert target.read_text() == "root's own file\n"
        assert stat.S_IMODE(target.stat().st_mode) == 0o644
        assert (run_dir / "state.json").is_symlink()
    finally:
        shutil.rmtree(target.parent)


def test_run_dir_that_is_a_symlink_is_refused(run_dir):
    link = run_dir / "link"
    link.symlink_to(run_dir)
    with pytest.raises(statedir.StateError, match=f"refusing state directory {link}: it is a symbolic link"):
        statedir.secure_dir(link)
    out = tierscope("rubbos", "down", "--run-dir", str(link))
    assert out.returncode == 1 and "it is a symbolic link" in out.stderr, out.stderr


def test_state_written_atomically_private_and_read_back(run_dir):
    d = statedir.secure_dir(run_dir / "a" / "b")
    assert stat.S_IMODE(os.lstat(d).st_mode) == 0o700 and stat.S_IMODE(os.lstat(d.parent).st_mode) == 0o700
    f = statedir.write_json(d / "state.json", {"n": 1})
    f2 = statedir.write_json(d / "state.json", {"n": 2})
    assert f == f2 and statedir.read_json(f) == {"n": 2}
    assert stat.S_IMODE(f.stat().st_mode) == 0o600
    assert sorted(p.name for p in d.iterdir()) == ["state.json"]  # no temporary file left


def test_identity_is_pid_start_time_and_command_line(victim):
    who = statedir.identity(victim.pid)
    assert who["cmdline"] == ["sleep", "300"]
    with open(f"/proc/{victim.pid}/stat") as f:
        assert who["start_time"] == int(f.read().rsplit(")", 1)[1].split()[19])
    assert statedir.same_process(who) == (True, "")
    victim.kill()
    victim.wait()
    assert statedir.identity(victim.pid) is None
    assert statedir.same_process(who)[0] is False


def test_default_dirs():
    if os.geteuid() == 0:
        assert statedir.default_dir("rubbos") == Path("/run/tierscope/rubbos")
    from tierscope.apps.rubbos import system

    if not os.environ.get("TIERSCOPE_RUBBOS_DIR"):
        assert statedir.default_dir("rubbos") == system.DEFAULT_RUN_DIR


@needs_root
def test_a_user_gets_a_private_default_and_cannot_use_roots(tmp_path):
    """As user nobody (no $XDG_RUNTIME_DIR): the default run directory is under the user's home,
    made 0700; root's /run/tierscope (or any directory of another user) is refused by `down`."""
    home = Path(tempfile.mkdtemp(prefix="tierscope-home-"))
    try:
        os.chown(home, NOBODY.pw_uid, NOBODY.pw_gid)
        as_nobody = ["setpriv", f"--reuid={NOBODY.pw_uid}", f"--regid={NOBODY.pw_gid}", "--clear-groups"]
        env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"} | {"HOME": str(home)}
        code = "from tierscope.apps.rubbos import system; from tierscope import statedir; "
        code += "print(statedir.secure_dir(system.DEFAULT_RUN_DIR))"
        out = subprocess.run([*as_nobody, sys.executable, "-c", code], capture_output=True, text=True, env=env)
        want = home / ".local" / "state" / "tierscope" / "rubbos"
        assert out.returncode == 0 and out.stdout.strip() == str(want), out.stderr
        st = os.lstat(want)
        assert st.st_uid == NOBODY.pw_uid and stat.S_IMODE(st.st_mode) == 0o700
        root_dir = Path(tempfile.mkdtemp(prefix="tierscope-roots-"))
        os.chmod(root_dir, 0o755)
        try:
            out = subprocess.run(
                [*as_nobody, str(BIN / "tierscope"), "rubbos", "down", "--run-dir", str(root_dir)],
                capture_output=True,
                text=True,
                env=env,
            )
            assert out.returncode == 1
            assert f"refusing state directory {root_dir}: it is owned by root (uid 0), not by you (nobody" in " ".join(
                out.stderr.split()
            )
        finally:
            root_dir.rmdir()
    finally:
        shutil.rmtree(home)


@needs_root
def test_ssh_control_dir_planted_in_tmp_is_refused(run_dir):
    """A remote run's SSH control sockets go to a short /tmp directory named after the run: made
    0700 by tierscope, refused when another user made it first (they could swap the sockets)."""
    from tierscope.remote import RemoteError
    from tierscope.remote.playbooks import close_connections, control_dir, write_config

    inventory = run_dir / "inventory.yml"
    inventory.write_text("all:\n  hosts: {}\n")
    cp = Path(control_dir(run_dir / "run"))
    try:
        write_config(run_dir / "run", inventory)
        assert stat.S_IMODE(os.lstat(cp).st_mode) == 0o700 and os.lstat(cp).st_uid == os.geteuid()
        close_connections(run_dir / "run")
        assert not cp.exists()
        cp.mkdir(mode=0o755)
        os.chown(cp, NOBODY.pw_uid, NOBODY.pw_gid)
        with pytest.raises(RemoteError, match=f"refusing state directory {cp}: it is owned by nobody"):
            write_config(run_dir / "run", inventory)
    finally:
        shutil.rmtree(cp, ignore_errors=True)
