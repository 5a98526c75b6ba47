"""The playbooks of a `--hosts` run: written as YAML into the run directory, run with ansible-playbook.

Per point, in `OUT/<run>/<point>/playbooks/`:
  up.yml    every host: check the work directory (`agent workdir`: ours, 0700, no symlink; made
            when missing), make the point's directory, copy the point (point.json), check the programs
            its servers need and apt-install the missing ones; then tier by tier (db, middleware,
            app, web) start each server's agent (`nohup setsid python -m tierscope.remote.agent serve`,
            which writes its pid file) and wait until it is ready (or say why not)
  load.yml  the client host: the workload generator, a bounded job (async with a time cap)
  down.yml  tier by tier in reverse: stop each agent by its pid file (it stops its monitor, capture
            and server, keeping their logs); every host: pack the point's files, fetch them here,
            remove them there
and `OUT/<run>/ansible/cleanup.yml` removes the run's files (the loaded data) from the hosts.
`OUT/<run>/ansible/ansible.cfg` turns on pipelining and ControlPersist (3-10x faster; research note
phase3-scaleout §1.2). Rerun one by hand with:
  ANSIBLE_CONFIG=OUT/<run>/ansible/ansible.cfg ansible-playbook -i OUT/<run>/ansible/inventory.yml OUT/<run>/<point>/playbooks/up.yml
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from tierscope import statedir
from tierscope.remote import RemoteError
from tierscope.remote.inventory import DEFAULT_WORKDIR

TIER_ORDER = ("db", "middleware", "app", "web")


class PlaybookFailed(RemoteError):
    """ansible-playbook failed; the message has the failed tasks' output."""


# Jinja's braces: %-formatting keeps them as Ansible reads them (UP031)
def _py(default_python: str) -> str:
    return "{{ tierscope_python | default('%s') }}" % default_python  # noqa: UP031


def _workdir() -> str:
    return "{{ tierscope_workdir | default('%s') }}" % DEFAULT_WORKDIR  # noqa: UP031


def _root(run_id: str) -> str:
    return f"{_workdir()}/{run_id}/{{{{ inventory_hostname }}}}"


def _workdir_task(agent: str) -> dict:
    """The first task of every play that writes or removes files on the hosts: the work directory
    is ours, 0700 and no symlink (made when missing), else the host's play stops there."""
    return {
        "name": "the work directory: ours, 0700, no symlink (made when missing)",
        "changed_when": False,
        "ansible.builtin.command": f"{agent} workdir --dir {_workdir()}",
    }


def write_config(run_dir: Path, inventory: Path) -> Path:
    """ansible.cfg and a copy of the inventory under run_dir/ansible; returns the config's path."""
    d = run_dir / "ansible"
    d.mkdir(parents=True, exist_ok=True)
    shutil.copy(inventory, d / "inventory.yml")
    cp = control_dir(run_dir)
    try:  # ssh's control sockets: a 0700 directory of ours, never one another user made first in /tmp
        statedir.secure_dir(cp)
    except statedir.StateError as err:
        raise RemoteError(f"{err} (the SSH control sockets of run {run_dir})") from None
    (d / "ansible.cfg").write_text(
        "[defaults]\n"
        "inventory = inventory.yml\n"
        "forks = 10\n"
        "retry_files_enabled = False\n"
        "interpreter_python = auto_silent\n"
        "nocolor = True\n"
        "[ssh_connection]\n"
        "pipelining = True\n"
        "ssh_args = -o ControlMaster=auto -o ControlPersist=60s\n"
        f"control_path_dir = {cp}\n"
        "control_path = %(directory)s/%%C\n"
    )
    return d / "ansible.cfg"


def control_dir(run_dir: Path) -> str:
    """A short directory for the SSH control sockets (a socket path must fit in 107 bytes); made
    0700 by `write_config`, which refuses one another user made first (`tierscope.statedir`)."""
    return f"/tmp/tsa-{hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:10]}"


def point_playbooks(
    pdir: Path,
    run_id: str,
    point_id: str,
    servers: dict[str, dict],
    generators: dict[str, dict],
    point_file: Path,
    url: str,
    load_seconds: float,
    default_python: str,
) -> dict[str, Path]:
    """Write up.yml, load.yml and down.yml for one point; `servers`: name -> {tier, host, address};
    `generators`: host -> {name, users, first} (one generator per host)."""
    out = pdir / "playbooks"
    out.mkdir(parents=True, exist_ok=True)
    py = _py(default_python)
    pd = f"{_root(run_id)}/{point_id}"
    agent = f"{py} -m tierscope.remote.agent"
    by_host: dict[str, list[str]] = {}
    for name, s in servers.items():
        by_host.setdefault(s["host"], []).append(name)
    hosts_used = sorted(set(by_host) | set(generators))
    common: dict[str, Any] = {
        "gather_facts": False,
        "any_errors_fatal": True,
        "vars": {"pd": pd, "servers_by_host": by_host},
    }

    def tier_play(tier: str, name: str, tasks: list) -> dict | None:
        hosts = sorted({s["host"] for s in servers.values() if s["tier"] == tier})
        if not hosts:
            return None
        names = {h: [n for n in by_host[h] if servers[n]["tier"] == tier] for h in hosts}
        return {
            "name": name,
            "hosts": ",".join(hosts),
            **common,
            "vars": {**common["vars"], "tier_servers": names},
            "tasks": tasks,
        }

    loop = "{{ tier_servers[inventory_hostname] }}"
    up = [
        {
            "name": f"prepare the hosts of point {point_id}",
            "hosts": ",".join(hosts_used),
            **common,
            "tasks": [
                _workdir_task(agent),  # before anything is written there
                {"name": "the point's directory", "ansible.builtin.file": {"path": "{{ pd }}", "state": "directory"}},
                {
                    "name": "the point (configuration of every server)",
                    "ansible.builtin.copy": {
                        "src": str(point_file.resolve()),
                        "dest": "{{ pd }}/point.json",
                        "mode": "0600",  # it carries the point's database password
                    },
                },
                {
                    "name": "which programs are missing",
                    "register": "check",
                    "changed_when": False,
                    "ansible.builtin.command": f"{agent} check --point {{{{ pd }}}}/point.json "
                    "--servers={{ servers_by_host.get(inventory_hostname, []) | join(',') }}",
                },
                {
                    "name": "install them",
                    "when": "(check.stdout | from_json).missing_packages | length > 0",
                    "ansible.builtin.apt": {
                        "name": "{{ (check.stdout | from_json).missing_packages }}",
                        "state": "present",
                        "update_cache": True,
                    },
                },
            ],
        }
    ]
    for tier in TIER_ORDER:
        play = tier_play(
            tier,
            f"start the {tier} tier",
            [
                {
                    "name": "start the agent (server, capture, monitor) with its pid file",
                    "loop": loop,
                    "ansible.builtin.shell": (
                        f"mkdir -p {{{{ pd }}}}/{{{{ item }}}} && cd {{{{ pd }}}}/{{{{ item }}}} && "
                        f"nohup setsid {agent} serve --point {{{{ pd }}}}/point.json --server {{{{ item }}}} "
                        "--dir {{ pd }}/{{ item }} > agent.log 2>&1 < /dev/null &"
                    ),
                    "args": {"creates": "{{ pd }}/{{ item }}/agent.pid"},
                },
                {
                    "name": "wait until it is ready",
                    "loop": loop,
                    "changed_when": False,
                    "ansible.builtin.command": f"{agent} wait --dir {{{{ pd }}}}/{{{{ item }}}} --timeout 300",
                },
            ],
        )
        if play:
            up.append(play)
    cap = int(load_seconds + 120)
    load = [
        {
            "name": "drive the workload",
            "hosts": ",".join(sorted(generators)),
            **common,
            "vars": {**common["vars"], "generators": generators},
            "tasks": [
                {
                    "name": f"the workload generator(s) against {url}, all at once (time cap {cap} s)",
                    "async": cap,
                    "poll": 1,
                    "ansible.builtin.command": (
                        f"{agent} load --point {{{{ pd }}}}/point.json --target {url} --dir {{{{ pd }}}}/{{{{ g.name }}}} "
                        "--users {{ g.users }} --first-user {{ g.first }}"
                    ),
                    "vars": {"g": "{{ generators[inventory_hostname] }}"},
                },
            ],
        }
    ]
    down = []
    for tier in reversed(TIER_ORDER):
        play = tier_play(
            tier,
            f"stop the {tier} tier",
            [
                {
                    "name": "stop the agent by its pid file",
                    "loop": loop,
                    "ignore_errors": True,
                    "ansible.builtin.command": f"{agent} stop --dir {{{{ pd }}}}/{{{{ item }}}} --timeout 60",
                },
            ],
        )
        if play:
            down.append(play)
    down.append(
        {
            "name": "fetch the point's files",
            "hosts": ",".join(hosts_used),
            **common,
            "tasks": [
                _workdir_task(agent),  # never pack into, nor remove through, a directory planted there
                {
                    "name": "pack them",
                    "changed_when": False,
                    "ansible.builtin.command": f"{agent} pack --dir {{{{ pd }}}} --out {{{{ pd }}}}.tar.gz",
                },
                {
                    "name": "fetch them",
                    "ansible.builtin.fetch": {
                        "src": "{{ pd }}.tar.gz",
                        "dest": f"{(pdir / 'remote').resolve()}/{{{{ inventory_hostname }}}}.tar.gz",
                        "flat": True,
                    },
                },
                {
                    "name": "remove them there",
                    "loop": ["{{ pd }}", "{{ pd }}.tar.gz"],
                    "ansible.builtin.file": {"path": "{{ item }}", "state": "absent"},
                },
            ],
        }
    )
    for play in down:  # stopping and fetching go on for every host whatever failed on one
        play["any_errors_fatal"] = False
    paths = {}
    for name, plays in (("up", up), ("load", load), ("down", down)):
        paths[name] = out / f"{name}.yml"
        paths[name].write_text(
            f"# generated by tierscope for point {point_id}; see docs/remote.md\n"
            + yaml.safe_dump(plays, sort_keys=False, width=120)
        )
    return paths


def cleanup_playbook(run_dir: Path, run_id: str, hosts: list[str], default_python: str = sys.executable) -> Path:
    plays = [
        {
            "name": "remove the run's files (loaded data) from the hosts",
            "hosts": ",".join(sorted(hosts)),
            "gather_facts": False,
            "tasks": [
                _workdir_task(f"{_py(default_python)} -m tierscope.remote.agent"),
                {
                    "name": "the host's files of the run",
                    "ansible.builtin.file": {"path": _root(run_id), "state": "absent"},
                },
                {
                    "name": "the run's directory and the work directory, once empty",
                    "changed_when": False,
                    "ansible.builtin.shell": f"rmdir {_root(run_id).rsplit('/', 1)[0]} 2>/dev/null; "
                    f"rmdir {_root(run_id).rsplit('/', 2)[0]} 2>/dev/null; true",
                },
            ],
        }
    ]
    path = run_dir / "ansible" / "cleanup.yml"
    path.write_text(yaml.safe_dump(plays, sort_keys=False, width=120))
    return path


def ansible_playbook() -> str:
    here = Path(sys.executable).parent / "ansible-playbook"
    found = str(here) if here.exists() else shutil.which("ansible-playbook")
    if not found:
        raise RemoteError(
            "ansible-playbook not found: install ansible-core (pip install ansible-core), "
            "which `pip install tierscope` does"
        )
    return found


def run_playbook(config: Path, playbook: Path, log: Path, timeout: float) -> float:
    """Run one playbook (output appended to `log`); returns its wall time; PlaybookFailed with the
    failed tasks' lines when it fails."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(config), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    t0 = time.monotonic()
    with open(log, "a") as f:
        f.write(f"\n### ansible-playbook {playbook}\n")
        f.flush()
        try:
            proc = subprocess.run(
                [ansible_playbook(), "-i", str(config.parent / "inventory.yml"), str(playbook)],
                stdout=f,
                stderr=subprocess.STDOUT,
                env=env,
                timeout=timeout,
                cwd=config.parent,
            )
        except subprocess.TimeoutExpired:
            raise PlaybookFailed(f"{playbook.name} did not finish within {timeout:.0f} s (log: {log})") from None
    seconds = time.monotonic() - t0
    if proc.returncode != 0:
        text = log.read_text(errors="replace").split(f"### ansible-playbook {playbook}")[-1]
        failures = failure_lines(text)
        if not failures:  # no task failed (a syntax error, a bad inventory...): Ansible's own last words
            failures = [ln.strip() for ln in text.splitlines() if ln.strip()][-3:]
        raise PlaybookFailed(
            f"{playbook.name} failed (exit {proc.returncode}): {'; '.join(failures)[-1500:]} (log: {log})"
        )
    return seconds


#: the line where Ansible reports a failed or unreachable host, before its result as JSON
_FAILED = re.compile(r"^(?:fatal|failed): \[([^\]]+)\](?: \(item=(.*?)\))?(?:: (FAILED|UNREACHABLE)!)? => ", re.M)
_TASK = re.compile(r"^TASK \[(.*)\] \**$", re.M)


def _last_line(value) -> str:
    if isinstance(value, list):
        value = "\n".join(map(str, value))
    lines = [ln.strip() for ln in str(value or "").splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def failure_lines(text: str) -> list[str]:
    """One line per failed host and task of ansible-playbook's output (`text`), instead of the
    result's JSON: "HOST: TASK[ (ITEM)]: why", why being the last line of the command's stderr, else
    Ansible's message. Failures Ansible was told to ignore are left out; repeats are said once."""
    out: list[str] = []
    decoder = json.JSONDecoder()
    for m in _FAILED.finditer(text):
        host, item, kind = m.group(1), m.group(2), m.group(3)
        try:
            result, end = decoder.raw_decode(text, m.end())
        except ValueError:
            result, end = {}, m.end()
        if not isinstance(result, dict):
            result = {}
        if text[end : end + 20].lstrip().startswith("...ignoring"):
            continue
        tasks = _TASK.findall(text, 0, m.start())
        task = tasks[-1] if tasks else "?"
        why = next(
            (w for w in (_last_line(result.get(k)) for k in ("stderr", "module_stderr", "msg")) if w),
            (kind or "failed").lower(),
        )
        line = f"{host}: {task}{f' ({item})' if item else ''}: {why[-300:]}"
        if line not in out:
            out.append(line)
    return out


def close_connections(run_dir: Path) -> None:
    """End the ControlPersist masters of the run (else they linger 60 s) and remove their directory."""
    d = Path(control_dir(run_dir))
    if not d.exists():
        return
    for sock in d.iterdir():
        subprocess.run(["ssh", "-S", str(sock), "-O", "exit", "x"], capture_output=True, timeout=10)
    shutil.rmtree(d, ignore_errors=True)
