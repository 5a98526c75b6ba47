"""The remote side of a `--hosts` run: `python -m tierscope.remote.agent VERB ...` on a host.

The playbooks call it; it reuses the services layer, so no server configuration lives in YAML.

  workdir --dir W                   make the host's work directory W for the run's files (0700), or
         refuse it (exit 1) when it is a symbolic link, another user's or writable by others: the
         playbooks call it before they write anything under W (`tierscope.statedir`)
  check  --point P --servers S,..   which programs the servers need are missing (JSON: Debian packages)
  serve  --point P --server S --dir D   start server S (data, config, program) in a cgroup of its own,
         tcpdump on its port and the resource monitor; write D/state.json (ready/failed); keep them
         until SIGTERM, then stop them, keep their logs in D/logs and write D/stopped.json
  wait   --dir D [--timeout T]      until D/state.json says ready (exit 0) or failed (exit 1)
  stop   --dir D [--timeout T]      SIGTERM the serving agent and wait for it (SIGKILL after T)
  load   --point P --target URL --dir D   run the workload generator (client_requests.parquet)
  pack   --dir D --out F            the point's files on this host as one tar.gz (data excluded)

P is the point as JSON (`tierscope.spec.Point`) plus `servers`: name -> {tier, address}, which the
controller writes from the inventory. Start order is the controller's (db, middleware, app, web).
The pid file D/agent.pid records the serving agent's pid, start time and command line, written
atomically and privately (`statedir.write_json`); `wait` and `stop` read it only when it is ours and
signal the pid only while it still names that same process (`statedir.same_process`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from tierscope import statedir
from tierscope.services import databases
from tierscope.services.credentials import Credentials, save_credentials
from tierscope.testbed.host import Host
from tierscope.testbed.monitor import Monitor, Target

if TYPE_CHECKING:  # `serve` imports it when it runs (pyarrow)
    from tierscope.trace.capture import LiveCapture

CGROUP_TOP = "tierscope-remote"
#: Debian packages of the programs a tier needs
#: the packages of the programs an agent needs besides its database servers (those: services.databases)
PACKAGES = {"nginx": "nginx-light", "tcpdump": "tcpdump"}


def _read_point(path: str):
    # late: tierscope.spec imports pydantic; the workdir, wait, stop and pack verbs start without it
    from tierscope.spec import Point

    raw = json.loads(Path(path).read_text())
    return Point.model_validate(raw["point"]), raw


def _ipv4_interface(address: str) -> str:
    """The network interface holding `address` on this host (for tcpdump)."""
    ip = socket.gethostbyname(address)
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=10).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) > 3 and parts[3].split("/")[0] == ip:
            return parts[1]
    raise RuntimeError(f"no interface of this host has the address {ip} (ip -4 addr show)")


def capture_interfaces(iface: str) -> list[tuple[str, str]]:
    """(interface, pcap file) to capture a server whose address is on `iface`: that interface, and
    `lo` as well: a client on the same host (the generator beside the web server, two tiers on one
    host) reaches the server's address through the loopback interface, never through `iface`."""
    return [(iface, "capture.pcap")] + ([("lo", CAPTURE_LO)] if iface != "lo" else [])


#: the loopback half of a server's capture (`capture_interfaces`), merged with the rest
CAPTURE_LO = "capture-lo.pcap"


# --- workdir ------------------------------------------------------------------------------------


def check_workdir(path: Path) -> int:
    """Make the host's work directory `path` (0700, missing parents too) or check the existing one."""
    try:
        made = statedir.secure_dir(path)
    except statedir.StateError as err:
        print(err, file=sys.stderr)  # the whole story; then the short line Ansible's failure shows
        print(
            f"{str(err).split(' (owner ')[0]} (tierscope_workdir: none of this run's files go there)", file=sys.stderr
        )
        return 1
    except OSError as err:
        print(
            f"tierscope_workdir {path}: cannot make it ({err.strerror}); set tierscope_workdir in the inventory "
            "to a directory of this user's that no one else can write",
            file=sys.stderr,
        )
        return 1
    print(made)
    return 0


# --- check --------------------------------------------------------------------------------------


def missing(point, raw: dict, servers: list[str]) -> list[str]:
    need = {"tcpdump"}
    out = []
    for name in servers:
        tier = raw["servers"][name]["tier"]
        if tier == "web":
            need.add("nginx")
        elif tier == "db":
            out += databases.missing_packages(databases.dbms_name(point.config.dbms))
    for prog in sorted(need):
        if not (shutil.which(prog) or Path(f"/usr/sbin/{prog}").exists()):
            out.append(PACKAGES[prog])
    return sorted(set(out))


# --- serve --------------------------------------------------------------------------------------


class Served:
    """What one `serve` started, to stop in reverse."""

    def __init__(self) -> None:
        self.services: list = []
        self.captures: list[LiveCapture] = []
        self.monitor: Monitor | None = None
        self.cgroup: str | None = None
        self.controllers: tuple[str, ...] = ()
        self.server_map: list[tuple[str, str, str, str]] = []  # address, tier, name, protocol
        self.notes: list[str] = []


def start_server(point, raw: dict, name: str, workdir: Path, host, served: Served) -> None:
    """Start server `name` of the point on this host with the assembly's start of its tier
    (`tierscope.assembly`, which `runner.start_tiers` uses for the whole system): the point's
    layout with the other servers at their inventory addresses, each server in `workdir/<name>`."""
    # late: tierscope.assembly and tierscope.apps import pyarrow; only `serve` needs them
    from tierscope import assembly
    from tierscope.apps import provider

    c = point.config
    app = provider(c.benchmark)
    tier = raw["servers"][name]["tier"]
    if "credentials" in raw:  # the controller's secret for the point: every host's servers share it
        creds = Credentials(raw["credentials"]["user"], raw["credentials"]["password"])
        save_credentials(workdir, creds)  # beside the servers' workdirs
        save_credentials(workdir / "peer-config", creds)  # beside the peer configuration's
    hosts = {n: Host(name=n, address=s["address"]) for n, s in raw["servers"].items()}
    hosts[name] = host
    layout = assembly.point_layout(c, hosts, workdir)
    soft = assembly.point_soft(c)
    system = assembly.RunningSystem(services=served.services, servers=served.server_map)
    tiers = {"db": layout.db, "middleware": layout.middleware, "app": layout.app, "web": layout.web}
    if tier not in tiers:
        raise ValueError(f"unknown tier {tier!r} for {name}")
    server = next(s for s in tiers[tier] if s.name == name)
    if tier == "db":
        data_dir = app.prepare_data(c, workdir.parent.parent / "data", lambda m: print(m, flush=True))
        _, _, warmed = assembly.start_database(app, layout.dbms, server, soft, system, data_dir=data_dir)
        if warmed is not None:
            served.notes.append(
                f"{name}: read its {warmed[0] / 2**20:.0f} MiB of table files before the load (soft.db.warm)"
            )
        return
    # the database configuration the app servers use, built as the db host builds it (not started)
    first = layout.db[0]
    _, cfg = assembly.database_server(
        app, layout.dbms, replace(first, workdir=workdir / "peer-config" / str(first.name)), soft
    )
    if tier == "middleware":
        assembly.start_middleware(server, [s.address for s in layout.db], cfg, soft, system)
    elif tier == "app":
        cfgs = assembly.app_db_configs(layout, cfg, soft)  # behind a middleware: pointing at it
        i = layout.app.index(server)
        assembly.start_app_server(app, server, cfgs[i % len(cfgs)], soft, system)
    else:
        root = app.static_root(layout.static_dir, c)
        assembly.start_web(server, root, [s.address for s in layout.app], soft, system)


def serve(point_file: str, name: str, workdir: Path) -> int:
    # late: tierscope.runner imports duckdb, cgroups pydantic, trace.capture pyarrow; only `serve` needs them
    from tierscope.runner import CAPTURE_FILTER, socket_limits
    from tierscope.testbed import cgroups, serialdisk
    from tierscope.trace.capture import LiveCapture

    workdir.mkdir(parents=True, exist_ok=True)
    statedir.write_json(workdir / "agent.pid", statedir.identity(os.getpid()))
    point, raw = _read_point(point_file)
    c = point.config
    stop = {"now": False}

    def on_term(signum, frame):
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    served = Served()
    state = workdir / "state.json"
    try:
        address = raw["servers"][name]["address"]
        server = next(s for s in c.servers() if s.name == name)
        nt = c.node_types.get(server.node_type)
        host = Host(name=name, address=address)
        reason = cgroups.unavailable_reason() if os.geteuid() == 0 else "not root"
        if reason is None:
            rel = f"{CGROUP_TOP}/{raw['tag']}/{name}"
            served.cgroup = rel
            served.controllers = cgroups.create(rel, nt, workdir)
            # a disk of one arm (`disk_read_ms`): every process of the host reads through it
            env = serialdisk.host_env(name, nt.disk_read_ms, workdir / "disks") if nt and nt.disk_read_ms else ()
            host = Host(name=name, address=address, cgroup=rel, controllers=served.controllers, env=env)
        else:
            served.notes.append(f"{name}: no cgroup limits nor resource samples on this host ({reason})")
        start_server(point, raw, name, workdir, host, served)
        if c.monitor.capture:
            port = served.server_map[-1][0].rsplit(":", 1)[1]
            for iface, pcap in capture_interfaces(_ipv4_interface(address)):
                served.captures.append(
                    LiveCapture(
                        iface,
                        workdir / pcap,
                        filter=f"tcp port {port} and ({CAPTURE_FILTER})",
                        snaplen=c.monitor.snaplen,
                    ).start()
                )
        if served.cgroup:
            machine = len(cgroups.machine_cpus())
            cg = {k: str(cgroups.path(k, served.cgroup)) for k in ("cpu", "cpuacct", "memory", "blkio")}
            target = Target(
                name=name,
                cgroups=cg,
                netns=None,
                cores=nt.cores(machine) if nt else float(machine),
                socket_limit=socket_limits(c).get(name),
            )
            served.monitor = Monitor([target], c.monitor.interval, workdir / "resources.parquet", machine=False).start()
        state.write_text(
            json.dumps({"status": "ready", "pid": os.getpid(), "server_map": served.server_map, "notes": served.notes})
        )
    except BaseException as err:  # noqa: BLE001 - say why, then stop what started
        state.write_text(
            json.dumps(
                {
                    "status": "failed",
                    "error": f"{type(err).__name__}: {err}",
                    "traceback": traceback.format_exc()[-3000:],
                }
            )
        )
        _stop_served(served, workdir)
        return 1
    died = None
    while not stop["now"]:  # bounded by the controller's stop (and its SIGKILL after a timeout)
        if died is None:
            dead = [s.name for s in served.services if not s.running()]
            if dead:
                died = f"tier died during the run: {', '.join(dead)}"
                served.notes.append(died)
        time.sleep(0.2)
    _stop_served(served, workdir)
    (workdir / "stopped.json").write_text(
        json.dumps({"died": died, "notes": served.notes, "server_map": served.server_map})
    )
    return 0


def _stop_served(served: Served, workdir: Path) -> None:
    # late: tierscope.assembly imports pyarrow, cgroups pydantic; only `serve` needs them
    from tierscope.assembly import RunningSystem
    from tierscope.testbed import cgroups

    for what, obj in [("monitor", served.monitor)] + [("capture", c) for c in served.captures]:
        if obj is not None:
            try:
                obj.stop()
            except Exception as err:
                served.notes.append(f"stopping the {what}: {err}")
    served.monitor, served.captures = None, []
    RunningSystem(services=served.services).stop(
        on_error=lambda svc, err: served.notes.append(f"stopping {svc.name}: {err}")
    )
    for svc in served.services:
        for log, path in svc.logs().items():
            (workdir / "logs" / svc.name).mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):
                shutil.copy(path, workdir / "logs" / svc.name / f"{log}.log")
        data_dir = getattr(svc, "data_dir", None)
        if data_dir is not None:
            shutil.rmtree(data_dir, ignore_errors=True)
            shutil.rmtree(svc.workdir / "sock", ignore_errors=True)
    served.services = []
    shutil.rmtree(workdir / "peer-config", ignore_errors=True)
    if served.cgroup:
        try:
            cgroups.remove(served.cgroup)
            for parent in (served.cgroup.rsplit("/", 1)[0], CGROUP_TOP):
                cgroups.remove_if_empty(parent)
        except Exception as err:
            served.notes.append(f"removing cgroup {served.cgroup}: {err}")
        served.cgroup = None


def wait_ready(workdir: Path, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    state = workdir / "state.json"
    while time.monotonic() < deadline:
        if state.exists():
            try:
                s = json.loads(state.read_text())
            except ValueError:
                s = {}
            if s.get("status") == "ready":
                print(json.dumps(s))
                return 0
            if s.get("status") == "failed":
                print(f"{workdir.name}: {s.get('error')}\n{s.get('traceback', '')}", file=sys.stderr)
                return 1
        try:
            agent = _agent(workdir)
        except statedir.StateError as err:
            print(f"{workdir.name}: {err}", file=sys.stderr)
            return 1
        if agent is not None and not agent[0]:
            log = workdir / "agent.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            print(f"{workdir.name}: the agent exited before its server was ready:\n{tail}", file=sys.stderr)
            return 1
        time.sleep(0.1)
    print(f"{workdir.name}: not ready within {timeout:.0f} s", file=sys.stderr)
    return 1


def _agent(workdir: Path) -> tuple[bool, dict, str] | None:
    """The serving agent's record in `workdir`: (still that process, the record, why not); None when
    there is no pid file yet. StateError when the file or its directory is not to be trusted."""
    if not os.path.lexists(workdir):  # the point never started here
        return None
    record = statedir.read_json(workdir / "agent.pid")
    if record is None:
        return None
    same, why = statedir.same_process(record)
    return same, record, why


def stop_agent(workdir: Path, timeout: float) -> int:
    try:
        agent = _agent(workdir)
    except statedir.StateError as err:  # planted: signal nothing
        print(f"{workdir.name}: {err}; nothing stopped", file=sys.stderr)
        return 1
    if agent is None or not agent[0]:
        print(f"{workdir.name}: not running" + (f" ({agent[2]})" if agent else ""))
        return 0
    record = agent[1]
    pid = record["pid"]
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not statedir.same_process(record)[0]:
            print(f"{workdir.name}: stopped")
            return 0
        time.sleep(0.1)
    if statedir.same_process(record)[0]:
        os.kill(pid, signal.SIGKILL)
    print(f"{workdir.name}: killed after {timeout:.0f} s", file=sys.stderr)
    return 1


# --- load ---------------------------------------------------------------------------------------


def load(point_file: str, target: str, workdir: Path, users: int | None, first_user: int) -> int:
    # late: tierscope.runner imports duckdb (tierscope.load rich); only the load verb needs them
    from tierscope.load import engine_args, run_load, workload_options
    from tierscope.runner import users_of, workload_file

    point, raw = _read_point(point_file)
    c = point.config
    w = c.workload
    workdir.mkdir(parents=True, exist_ok=True)
    argv = engine_args(
        workload_file(c),
        target=target,
        log=workdir / "client_requests.parquet",
        users=users if users is not None else users_of(point),
        seed=point.seed + first_user,
        **workload_options(w),
        quiet=True,
    )
    t0 = time.time_ns()
    with open(workdir / "generator.stderr.log", "w") as stderr:
        result = run_load(argv, stderr_to=stderr)
    (workdir / "generator.json").write_text(
        json.dumps(
            {"load_start_ns": t0, "returncode": result.returncode, "summary": result.summary, "first_user": first_user}
        )
    )
    return result.returncode


def pack(workdir: Path, out: Path) -> int:
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w:gz") as tar:
        if workdir.exists():
            for p in sorted(workdir.iterdir()):
                tar.add(p, arcname=p.name, filter=lambda ti: None if "/sock" in ti.name else ti)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tierscope.remote.agent",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("workdir")
    p.add_argument("--dir", required=True, type=Path)
    p = sub.add_parser("check")
    p.add_argument("--point", required=True)
    p.add_argument("--servers", required=True)
    p = sub.add_parser("serve")
    p.add_argument("--point", required=True)
    p.add_argument("--server", required=True)
    p.add_argument("--dir", required=True, type=Path)
    for verb in ("wait", "stop"):
        p = sub.add_parser(verb)
        p.add_argument("--dir", required=True, type=Path)
        p.add_argument("--timeout", type=float, default=120.0)
    p = sub.add_parser("load")
    p.add_argument("--point", required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--dir", required=True, type=Path)
    p.add_argument("--users", type=int, default=None)
    p.add_argument("--first-user", type=int, default=0)
    p = sub.add_parser("pack")
    p.add_argument("--dir", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    a = ap.parse_args(argv)
    if a.verb == "workdir":
        return check_workdir(a.dir)
    if a.verb == "check":
        point, raw = _read_point(a.point)
        print(json.dumps({"missing_packages": missing(point, raw, [s for s in a.servers.split(",") if s])}))
        return 0
    if a.verb == "serve":
        return serve(a.point, a.server, a.dir)
    if a.verb == "wait":
        return wait_ready(a.dir, a.timeout)
    if a.verb == "stop":
        return stop_agent(a.dir, a.timeout)
    if a.verb == "load":
        return load(a.point, a.target, a.dir, a.users, a.first_user)
    return pack(a.dir, a.out)


if __name__ == "__main__":
    sys.exit(main())
