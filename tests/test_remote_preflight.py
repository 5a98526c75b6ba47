"""A host that cannot run tierscope is said once, in one line, before any point of a `--hosts` run;
a failed playbook is one line per host and task, not Ansible's result JSON (issue 22: "a host
without tierscope installed gives 101 lines of Ansible JSON per point").

The hosts are the stand-in SSH hosts of the other remote tests (tierscope.remote.sshhosts): real
sshd, real ssh and ansible-playbook. A host "without tierscope" is one whose `tierscope_python`
is the system interpreter, which has no tierscope, as on a machine where it was never installed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import EXAMPLES, needs_root
from tierscope.remote.inventory import load_inventory
from tierscope.remote.playbooks import PlaybookFailed, close_connections, failure_lines, run_playbook, write_config
from tierscope.remote.preflight import HostsNotReady, check_tierscope, why_not
from tierscope.remote.sshhosts import SshHosts, unavailable_reason

EXE = Path(sys.executable).parent / "tierscope"
SYSTEM_PYTHON = "/usr/bin/python3"

needs_sshd = pytest.mark.skipif(unavailable_reason() is not None, reason=f"SSH hosts: {unavailable_reason()}")

# ansible-playbook's output as ansible-core 2.19 writes it (a failed task, a failure it was told
# to ignore, a loop item, an unreachable host, a result printed over several lines)
ANSIBLE_OUTPUT = """
PLAY [prepare the hosts of point users5-70c19ca1] ******************************

TASK [which programs are missing] **********************************************
[ERROR]: Task failed: Module failed: non-zero return code
Origin: /tmp/out/tiny/users5-70c19ca1/playbooks/up.yml:23:5

fatal: [h1]: FAILED! => {"changed": false, "cmd": ["/usr/bin/python3", "-m", "tierscope.remote.agent", "check"], \
"msg": "non-zero return code", "rc": 1, "stderr": "/usr/bin/python3: Error while finding module specification for \
'tierscope.remote.agent' (ModuleNotFoundError: No module named 'tierscope')", "stderr_lines": ["/usr/bin/python3: \
Error while finding module specification for 'tierscope.remote.agent' (ModuleNotFoundError: No module named \
'tierscope')"], "stdout": "", "stdout_lines": []}

TASK [stop the agent by its pid file] ******************************************
failed: [h2] (item=web1) => {"ansible_loop_var": "item", "item": "web1", "msg": "non-zero return code", "rc": 1, \
"stderr": "no pid file"}
...ignoring

TASK [start the agent (server, capture, monitor) with its pid file] ************
failed: [h3] (item=db1) => {
    "ansible_loop_var": "item",
    "item": "db1",
    "msg": "non-zero return code",
    "rc": 2,
    "stderr": "Traceback (most recent call last):\\n  File \\"x.py\\", line 1\\nOSError: [Errno 28] No space left on device"
}
fatal: [h4]: UNREACHABLE! => {"changed": false, "msg": "Failed to connect to the host via ssh: ssh: connect to host \
10.0.0.14 port 22: Connection refused", "unreachable": true}
fatal: [h1]: FAILED! => {"msg": "non-zero return code", "stderr": "/usr/bin/python3: Error while finding module \
specification for 'tierscope.remote.agent' (ModuleNotFoundError: No module named 'tierscope')"}

PLAY RECAP *********************************************************************
h1                         : ok=2    changed=2    unreachable=0    failed=1    skipped=0    rescued=0    ignored=0
"""


def test_failure_lines_are_one_per_host_and_task_without_json():
    lines = failure_lines(ANSIBLE_OUTPUT)
    assert lines == [
        "h1: which programs are missing: /usr/bin/python3: Error while finding module specification for "
        "'tierscope.remote.agent' (ModuleNotFoundError: No module named 'tierscope')",
        "h3: start the agent (server, capture, monitor) with its pid file (db1): OSError: [Errno 28] No space "
        "left on device",
        "h4: start the agent (server, capture, monitor) with its pid file: Failed to connect to the host via ssh: "
        "ssh: connect to host 10.0.0.14 port 22: Connection refused",
        "h1: start the agent (server, capture, monitor) with its pid file: /usr/bin/python3: Error while finding "
        "module specification for 'tierscope.remote.agent' (ModuleNotFoundError: No module named 'tierscope')",
    ]
    assert not any("{" in line or "stderr_lines" in line for line in lines)


def test_why_an_interpreter_cannot_run_tierscope():
    traceback = "Traceback (most recent call last):\n  File \"<string>\", line 1\nModuleNotFoundError: No module named 'tierscope'\n"
    assert why_not("/usr/bin/python3", 1, traceback) == "/usr/bin/python3 has no module tierscope"
    missing = "bash: line 1: /opt/ts/bin/python: No such file or directory\n"
    assert why_not("/opt/ts/bin/python", 127, missing) == "/opt/ts/bin/python does not exist"
    assert why_not("/usr/bin/python3", 1, "SyntaxError: bad\n") == "/usr/bin/python3: SyntaxError: bad"


@pytest.fixture(scope="module")
def lab():
    with SshHosts(["h1", "h2"]) as hosts:
        yield hosts


def _inventory(lab, path: Path, without_tierscope: list[str]) -> Path:
    """h1 web and client, h2 app and db; the hosts named run the system Python (no tierscope)."""
    inv = lab.inventory({"web": ["h1"], "app": ["h2"], "db": ["h2"], "client": ["h1"]})
    for group in inv["all"]["children"].values():
        for name, entry in group["hosts"].items():
            if name in without_tierscope:
                entry["tierscope_python"] = SYSTEM_PYTHON
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


@needs_root("network namespaces and sshd")
@needs_sshd
def test_a_host_without_tierscope_is_one_line_before_any_point(lab, tmp_path):
    inventory = _inventory(lab, tmp_path / "inventory.yml", ["h2"])
    inv = load_inventory(inventory)
    with pytest.raises(HostsNotReady) as refused:
        check_tierscope(list(inv.hosts.values()), str(inventory))
    assert f"h2 ({lab.addresses['h2']}): {SYSTEM_PYTHON} has no module tierscope" in str(refused.value)
    assert "h1" not in str(refused.value)
    ok = load_inventory(_inventory(lab, tmp_path / "ok.yml", []))
    from tierscope import __version__

    assert check_tierscope(list(ok.hosts.values())) == {"h1": __version__, "h2": __version__}

    out = subprocess.run(
        [str(EXE), "run", str(EXAMPLES / "tiny.toml"), "--hosts", str(inventory), "-o", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        f"error: tierscope cannot run on 1 of the 2 hosts: h2 ({lab.addresses['h2']}): {SYSTEM_PYTHON} has no "
        f"module tierscope. Install tierscope there (pip install tierscope, with the same version as here) or set "
        f"tierscope_python to its interpreter in {inventory}"
    ]
    run_dir = tmp_path / "out" / "tiny"
    assert not [p for p in run_dir.iterdir() if p.is_dir()], "a point was started"


@needs_root("network namespaces and sshd")
@needs_sshd
def test_a_failed_playbook_is_one_line(lab, tmp_path):
    inventory = _inventory(lab, tmp_path / "inventory.yml", ["h2"])
    config = write_config(tmp_path / "run", inventory)
    book = tmp_path / "check.yml"
    book.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "the agent's check",
                    "hosts": "h1,h2",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "name": "run the agent",
                            "changed_when": False,
                            "ansible.builtin.command": "{{ tierscope_python | default('%s') }} -m "  # noqa: UP031 (Jinja's braces)
                            "tierscope.remote.agent --help" % sys.executable,
                        }
                    ],
                }
            ]
        )
    )
    try:
        with pytest.raises(PlaybookFailed) as failed:
            run_playbook(config, book, tmp_path / "ansible.log", timeout=120)
    finally:
        close_connections(tmp_path / "run")
    message = str(failed.value)
    assert "\n" not in message and "{" not in message, message
    assert message.startswith("check.yml failed (exit 2): h2: run the agent: ")
    assert "No module named 'tierscope'" in message and "h1:" not in message
