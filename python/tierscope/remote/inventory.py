"""The inventory of real hosts: an Ansible YAML inventory whose groups are tierscope's tiers.

    all:
      vars:
        ansible_user: root
        ansible_ssh_private_key_file: ~/.ssh/lab_key
        tierscope_python: /opt/tierscope/.venv/bin/python   # where tierscope is installed on the hosts
      children:
        web:    {hosts: {h1: {ansible_host: 10.0.0.11}}}
        app:    {hosts: {h2: {ansible_host: 10.0.0.12}}}
        db:     {hosts: {h3: {ansible_host: 10.0.0.13}}}
        client: {hosts: {h4: {ansible_host: 10.0.0.14}}}

The spec's servers of a tier go to the hosts of the group of that name, in order (web1 to the
group's first host, ...); a host may be in several groups (then it runs several servers, each in
its own cgroup). Any error names the file, the line and the field.
"""

from __future__ import annotations

import ipaddress
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tierscope.remote import RemoteError
from tierscope.spec import SpecError, parse_duration
from tierscope.textfile import read_utf8

GROUPS = ("web", "app", "middleware", "db", "client")
#: the variables tierscope reads (besides Ansible's own connection variables)
TIERSCOPE_VARS = {
    "tierscope_python": "the Python interpreter with tierscope installed on the host (default: the "
    "controller's own, right when the hosts share its file system or its layout)",
    "tierscope_workdir": "where the host keeps a run's files (default /var/lib/tierscope/remote; made 0700, "
    "refused when it is a symbolic link, another user's or writable by others)",
    "tierscope_clock_bound": "largest clock offset accepted, a duration such as 10ms (default 10ms)",
}
#: a root host's directory for the runs' files (their servers' data too: on disk, not a tmpfs such
#: as /run); never a fixed /tmp path another local user could make first (the agent's `workdir`
#: verb checks it before anything is written there, `tierscope.statedir`)
DEFAULT_WORKDIR = "/var/lib/tierscope/remote"
DEFAULT_CLOCK_BOUND_S = 0.010
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class InventoryError(RemoteError):
    """A bad inventory file; the message names the file, the line and the field."""


@dataclass
class HostEntry:
    """One inventory host: its name, its address and its variables (all.vars, then the group's,
    then its own)."""

    name: str
    address: str
    vars: dict[str, Any] = field(default_factory=dict)
    groups: list[str] = field(default_factory=list)

    @property
    def python(self) -> str:
        return str(self.vars.get("tierscope_python") or sys.executable)

    @property
    def workdir(self) -> str:
        return str(self.vars.get("tierscope_workdir") or DEFAULT_WORKDIR)


@dataclass
class Inventory:
    path: Path
    hosts: dict[str, HostEntry]
    groups: dict[str, list[str]]  # group -> host names, in file order
    clock_bound_s: float = DEFAULT_CLOCK_BOUND_S

    def assign(self, config) -> dict[str, HostEntry]:
        """Server name -> host for a PointConfig (`client1` for the generator); InventoryError
        when a tier has more servers than its group has hosts."""
        out: dict[str, HostEntry] = {}
        for tier in ("web", "app", "middleware", "db"):
            servers = config.tier_servers(tier)
            hosts = self.groups.get(tier, [])
            if len(servers) > len(hosts):
                raise InventoryError(
                    f"{self.path}: the spec's topology {config.notation()} has {len(servers)} {tier} "
                    f"server(s) but group '{tier}' has {len(hosts)} host(s); add hosts to 'children: {tier}: hosts:'"
                )
            for s, h in zip(servers, hosts):
                out[s.name] = self.hosts[h]
        clients = self.groups.get("client", [])
        k = config.client.hosts
        if k > len(clients):
            raise InventoryError(
                f"{self.path}: the spec's [client] hosts = {k} generators but group 'client' has "
                f"{len(clients)} host(s); each generator runs on a host of its own"
            )
        for i in range(k):
            out[f"client{i + 1}"] = self.hosts[clients[i]]
        return out


def _err(path: Path, node, what: str) -> InventoryError:
    line = node.start_mark.line + 1 if node is not None else 1
    return InventoryError(f"{path}, line {line}: {what}")


def _mapping(path: Path, node, where: str) -> list[tuple[Any, Any]]:
    if node is None or (isinstance(node, yaml.ScalarNode) and node.value in ("", "~", "null")):
        return []
    if not isinstance(node, yaml.MappingNode):
        raise _err(path, node, f"{where}: expected a mapping (key: value lines), got {_kind(node)}")
    return [(k, v) for k, v in node.value]


def _kind(node) -> str:
    return {yaml.ScalarNode: "a single value", yaml.SequenceNode: "a list"}.get(type(node), "a mapping")


def _scalar(path: Path, node, where: str) -> Any:
    if not isinstance(node, yaml.ScalarNode):
        raise _err(path, node, f"{where}: expected a single value, got {_kind(node)}")
    return yaml.safe_load(yaml.serialize(node))


def _vars(path: Path, node, where: str) -> dict[str, Any]:
    out = {}
    for k, v in _mapping(path, node, where):
        key = _scalar(path, k, where)
        out[key] = yaml.safe_load(yaml.serialize(v)) if v is not None else None
        if key == "tierscope_clock_bound":
            _clock_bound(path, v, f"{where}.{key}")
        elif str(key).startswith("tierscope_") and key not in TIERSCOPE_VARS:
            raise _err(path, k, f"{where}.{key}: unknown tierscope variable; known: {', '.join(TIERSCOPE_VARS)}")
    return out


def _clock_bound(path: Path, node, where: str) -> float:
    try:
        value = parse_duration(_scalar(path, node, where))
    except (SpecError, ValueError, TypeError) as err:
        raise _err(path, node, f"{where}: {err}") from None
    if value <= 0:
        raise _err(path, node, f"{where}: must be above 0")
    return value


def load_inventory(path: str | Path) -> Inventory:
    """Read and check an inventory; InventoryError naming file, line and field."""
    path = Path(path)
    try:
        text = read_utf8(path, "an inventory is YAML, which")
    except ValueError as err:
        raise InventoryError(str(err)) from None
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        raise InventoryError(f"{path}, line {line}: not valid YAML: {getattr(err, 'problem', err)}") from None
    top = dict((_scalar(path, k, "top level"), (k, v)) for k, v in _mapping(path, root, "top level"))
    if "all" not in top:
        raise _err(path, root, "the inventory needs a top-level 'all:' with 'children:' (groups web, app, db, client)")
    all_vars: dict[str, Any] = {}
    children = children_key = None
    for k, v in _mapping(path, top["all"][1], "all"):
        key = _scalar(path, k, "all")
        if key == "vars":
            all_vars = _vars(path, v, "all.vars")
        elif key == "children":
            children, children_key = v, k
        elif key == "hosts":
            raise _err(
                path,
                k,
                "all.hosts: put every host in a group under 'all: children:' "
                f"({', '.join(GROUPS)}), which says what runs on it",
            )
        else:
            raise _err(path, k, f"all.{key}: unknown key (expected vars, children)")
    if children is None:
        raise _err(path, top["all"][0], "all.children: missing; list the groups " + ", ".join(GROUPS))
    hosts: dict[str, HostEntry] = {}
    groups: dict[str, list[str]] = {}
    host_nodes: dict[str, Any] = {}
    own_vars: dict[str, dict] = {}  # host -> its own variables
    layered: dict[str, dict] = {}  # host -> its groups' variables
    for gk, gv in _mapping(path, children, "all.children"):
        group = _scalar(path, gk, "all.children")
        if group not in GROUPS:
            raise _err(path, gk, f"all.children.{group}: unknown group (tierscope's groups: {', '.join(GROUPS)})")
        group_vars: dict[str, Any] = {}
        members: list[str] = []
        for k, v in _mapping(path, gv, f"all.children.{group}"):
            key = _scalar(path, k, f"all.children.{group}")
            if key == "vars":
                group_vars = _vars(path, v, f"all.children.{group}.vars")
            elif key == "hosts":
                for hk, hv in _mapping(path, v, f"all.children.{group}.hosts"):
                    name = str(_scalar(path, hk, f"all.children.{group}.hosts"))
                    where = f"all.children.{group}.hosts.{name}"
                    if not _NAME.match(name):
                        raise _err(path, hk, f"{where}: a host name is letters, digits, '.', '_' and '-'")
                    hvars = _vars(path, hv, where)
                    address = hvars.get("ansible_host", name if name not in hosts else hosts[name].address)
                    if not address:
                        raise _err(path, hk, f"{where}.ansible_host: missing (the host's address)")
                    _check_address(path, hv if hv is not None else hk, f"{where}.ansible_host", str(address))
                    if name in hosts:
                        if str(address) != hosts[name].address:
                            raise _err(
                                path,
                                hk,
                                f"{where}.ansible_host: {address} but the host is "
                                f"{hosts[name].address} at line {host_nodes[name].start_mark.line + 1}",
                            )
                        hosts[name].groups.append(group)
                    else:
                        hosts[name] = HostEntry(name, str(address), {}, [group])
                        host_nodes[name] = hk
                    own_vars.setdefault(name, {}).update(hvars)
                    members.append(name)
            else:
                raise _err(path, k, f"all.children.{group}.{key}: unknown key (expected hosts, vars)")
        for name in members:
            layered.setdefault(name, {}).update(group_vars)
        groups[group] = members
    if not groups.get("client"):
        raise _err(
            path,
            children_key,
            "all.children.client: missing or empty; the generator runs on the client group's first host",
        )
    for name, h in hosts.items():  # Ansible's precedence: all.vars < group vars < host vars
        h.vars = {**all_vars, **layered.get(name, {}), **own_vars.get(name, {})}
    bound = DEFAULT_CLOCK_BOUND_S
    for k, v in _mapping(path, top["all"][1], "all"):
        if _scalar(path, k, "all") == "vars":
            for vk, vv in _mapping(path, v, "all.vars"):
                if _scalar(path, vk, "all.vars") == "tierscope_clock_bound":
                    bound = _clock_bound(path, vv, "all.vars.tierscope_clock_bound")
    return Inventory(path=path, hosts=hosts, groups=groups, clock_bound_s=bound)


def _check_address(path: Path, node, where: str, address: str) -> None:
    try:
        ipaddress.ip_address(address)
        return
    except ValueError:
        pass
    if not re.match(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$", address):
        raise _err(path, node, f"{where}: '{address}' is neither an IP address nor a host name")
