"""`tierscope testbed ssh-hosts`: stand-in SSH hosts one command away (issue 22: "stand-in SSH
hosts ... are one command away so a user can try --hosts on one machine").

The command is run as a user runs it: it writes an inventory, then a real `ssh` with the
inventory's key and known_hosts (host keys checked) reaches each host at its address, inside its
namespace; Ctrl-C removes everything. A killed command's hosts are removed by `testbed clean` (and
the next `ssh-hosts`), and a planted record is not acted on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import needs_root
from tierscope.cli.testbed import default_groups, parse_groups
from tierscope.remote.sshhosts import DIR_PREFIX, OWNER_FILE, SshHosts, remove_orphans, unavailable_reason

EXE = Path(sys.executable).parent / "tierscope"

needs_sshd = pytest.mark.skipif(unavailable_reason() is not None, reason=f"SSH hosts: {unavailable_reason()}")


def test_groups_default_and_given():
    assert default_groups(3) == {"web": ["h1"], "app": ["h2"], "db": ["h3"], "client": ["h1"]}
    assert default_groups(5)["client"] == ["h4"]
    with pytest.raises(ValueError, match="3 at least"):
        default_groups(2)
    hosts = ["h1", "h2", "h3"]
    assert parse_groups("web=h1 app=h2,h3 db=h3 client=h1", hosts) == {
        "web": ["h1"],
        "app": ["h2", "h3"],
        "db": ["h3"],
        "client": ["h1"],
    }
    with pytest.raises(ValueError, match="no host 'h9'"):
        parse_groups("web=h9", hosts)
    with pytest.raises(ValueError, match="GROUP one of web, app, middleware, db, client"):
        parse_groups("cache=h1", hosts)


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _links() -> set[str]:
    return {p.name for p in Path("/sys/class/net").iterdir()}


def _running_sshd(pid: int) -> bool:
    """An sshd that has not exited (an exited one not yet reaped by init is a zombie: state Z)."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
    except (OSError, IndexError):
        return False
    return comm == "sshd" and state != "Z"


def _start(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, list[str]]:
    """Start the command; returns it and its first lines, up to the one saying how to remove them."""
    proc = subprocess.Popen(
        [str(EXE), "testbed", "ssh-hosts", *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    deadline = time.monotonic() + 60
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip())
        if "Ctrl-C removes the hosts" in line:
            return proc, lines
    proc.kill()
    pytest.fail(f"ssh-hosts did not come up: {lines}")


def _ssh(inv: dict, host: str, command: str) -> str:
    v = inv["all"]["vars"]
    addr = next(g["hosts"][host]["ansible_host"] for g in inv["all"]["children"].values() if host in g["hosts"])
    argv = ["ssh", "-i", v["ansible_ssh_private_key_file"], *v["ansible_ssh_common_args"].split()]
    argv += ["-o", "BatchMode=yes", "-o", "ConnectTimeout=10", f"root@{addr}", command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout


@needs_root("network namespaces and sshd")
@needs_sshd
def test_hosts_answer_over_ssh_with_their_keys_then_ctrl_c_removes_them(tmp_path):
    proc, lines = _start(tmp_path, "3", "-i", "inv.yml", "--groups", "web=h1 app=h2 db=h3 client=h3")
    try:
        inv = yaml.safe_load((tmp_path / "inv.yml").read_text())
        children = inv["all"]["children"]
        assert {g: sorted(children[g]["hosts"]) for g in children} == {
            "web": ["h1"],
            "app": ["h2"],
            "db": ["h3"],
            "client": ["h3"],
        }
        key = Path(inv["all"]["vars"]["ansible_ssh_private_key_file"])
        record = json.loads((key.parent / OWNER_FILE).read_text())
        assert record["owner"] == proc.pid and record["names"] == ["h1", "h2", "h3"]
        k = record["k"]
        assert {f"tsr{k}-h1", f"tsr{k}-h2", f"tsr{k}-h3"} <= _namespaces()
        # each host is reached at its own address, inside its own namespace (its eth0 has that
        # address), with the host key checked against the known_hosts file (StrictHostKeyChecking=yes)
        for host, group in (("h1", "web"), ("h3", "db")):
            addr = children[group]["hosts"][host]["ansible_host"]
            assert any(line.startswith(f"{host}  {addr}") for line in lines), lines
            assert f"inet {addr}/24" in _ssh(inv, host, "ip -4 -o addr show dev eth0")
    finally:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=60)
    assert rc == 0, proc.stdout.read() if proc.stdout else rc
    assert not any(n.startswith(f"tsr{k}-") for n in _namespaces())
    assert f"tsrbr{k}" not in _links()
    assert not key.parent.exists()
    assert not any(_running_sshd(p) for p in record["sshd"].values())


@needs_root("network namespaces and sshd")
@needs_sshd
def test_a_killed_commands_hosts_are_removed_by_testbed_clean(tmp_path):
    proc, _ = _start(tmp_path, "3", "-i", "inv.yml")
    inv = yaml.safe_load((tmp_path / "inv.yml").read_text())
    lab_dir = Path(inv["all"]["vars"]["ansible_ssh_private_key_file"]).parent
    record = json.loads((lab_dir / OWNER_FILE).read_text())
    proc.kill()  # SIGKILL: no clean-up of its own
    proc.wait(timeout=10)
    k, sshd = record["k"], record["sshd"]
    assert f"tsr{k}-h1" in _namespaces() and all(_running_sshd(p) for p in sshd.values())

    # what `tierscope run` does at its start, and the next `ssh-hosts`
    out = subprocess.run([str(EXE), "testbed", "clean", "--orphans"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"on tsrbr{k}: owner pid {proc.pid} dead, removed" in out.stdout, out.stdout
    assert not any(n.startswith(f"tsr{k}-") for n in _namespaces())
    assert f"tsrbr{k}" not in _links() and not lab_dir.exists()
    assert not any(_running_sshd(p) for p in sshd.values())


@needs_root("network namespaces and sshd")
@needs_sshd
def test_a_live_owners_hosts_and_planted_records_are_left_alone(tmp_path):
    with SshHosts(["h1"]) as lab:  # this process owns it: alive
        # a record this module did not write: world-writable directory, naming the live lab's
        # namespace with a dead owner; another whose names are not host names
        planted = tmp_path / f"{DIR_PREFIX}planted"
        planted.mkdir()
        os.chmod(planted, 0o777)
        (planted / OWNER_FILE).write_text(json.dumps({"owner": 999999, "k": lab.k, "names": ["h1"], "sshd": {}}))
        odd = tmp_path / f"{DIR_PREFIX}odd"
        odd.mkdir(mode=0o700)
        (odd / OWNER_FILE).write_text(json.dumps({"owner": 999999, "k": lab.k, "names": ["../x"], "sshd": {}}))
        assert remove_orphans(tmp_path) == []
        assert all(f"tsrbr{lab.k}:" not in line for line in remove_orphans())  # the live lab is kept
        assert f"tsr{lab.k}-h1" in _namespaces() and planted.exists() and odd.exists()
