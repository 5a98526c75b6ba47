"""The testbed: one machine turned into a cluster of hosts for one sweep point.

`Testbed.up(point)` gives every server of the point's topology (and the workload generator,
`client1`) a host: a network namespace on the lab bridge with its own address and its own cgroups
set from its node type. `down()` removes all of it, also on exceptions, Ctrl-C, SIGTERM and exit
(everything is registered for cleanup as it is created).

Without root, or where `ip netns add` or the cgroup v1 controllers are refused, the testbed falls
back to loopback: every host gets its own 127.77.<lab>.<n> address on `lo`, with no limits, and
`lost` says exactly what that costs.

Each lab's state file (`state_dir()`, written atomically, refused when planted: `tierscope.statedir`)
records its owner: the pid, start time and command line of the process that built it. A lab whose
owner is dead (a SIGKILLed run) and that was not detached on purpose (`tierscope testbed up`) is
an orphan: `find_orphans()` names it, `remove_orphan()` removes it (processes in its hosts, in its
namespaces and holding files in its directories, then namespaces, veths, bridge, cgroups, state).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import signal
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

from tierscope import statedir
from tierscope.spec import NodeType, Point, PointConfig
from tierscope.testbed import cgroups, network, serialdisk
from tierscope.testbed.cgroups import BASE_CONTROLLERS
from tierscope.testbed.clean import _kill
from tierscope.testbed.host import Host
from tierscope.testbed.interference import NoisyNeighbourProcess, PauseInjector, events_table
from tierscope.testbed.monitor import Monitor, Target

CLIENT = "client1"
LOOPBACK_LOST = (
    "no CPU, memory or disk limits: node types are ignored, every host shares the whole machine",
    "no per-host resource metrics: the monitor records machine-wide CPU only",
    "no bridge: the capture runs on lo (each host still has its own 127.77.<lab>.<n> address)",
    "noisy neighbours run unconfined (they compete with everything, not one host)",
)


class TestbedError(RuntimeError):
    """The testbed could not be built or removed; the message says what and why."""


def state_dir() -> Path:
    """Where `tierscope testbed` keeps its state: /run/tierscope as root, else a directory of the
    user's own ($XDG_RUNTIME_DIR/tierscope/testbed or ~/.local/state/tierscope/testbed)."""
    if os.geteuid() == 0 and Path("/run").is_dir():
        return statedir.ROOT_DIR
    return statedir.default_dir("testbed")


def free_lab(first: int = 0, last: int = 63) -> int:
    """The first lab number with no bridge and no state file (another run or test may hold one)."""
    for lab in range(first, last + 1):
        if not network.link_exists(network.bridge_name(lab)) and not (state_dir() / f"lab{lab}.json").exists():
            return lab
    raise TestbedError(f"every lab number {first}..{last} is in use (see `tierscope testbed status`)")


def namespaces_unavailable() -> str | None:
    """Why namespaced hosts with limits cannot be built here (None when they can)."""
    return network.unavailable_reason() or cgroups.unavailable_reason()


class Testbed:
    """Hosts for one point: `with Testbed(lab=0) as tb: hosts = tb.up(point)`.

    `mode` is "auto" (namespaces when possible, else loopback), "namespaces" (fail when not
    possible) or "loopback".
    """

    __test__ = False  # not a pytest class

    def __init__(
        self,
        lab: int | None = 0,
        workdir: str | Path | None = None,
        mode: str = "auto",
        point_dir: str | Path | None = None,
    ):
        """`lab=None`: the first free lab, chosen as the hosts are built under a lock every process
        choosing one takes, so that two runs started together never pick the same number (until
        then `lab` is the first free one at construction, a guess)."""
        if mode not in ("auto", "namespaces", "loopback"):
            raise TestbedError(f"mode must be auto, namespaces or loopback, got {mode!r}")
        self.pick_free = lab is None
        if lab is None:
            lab = free_lab()
        network.subnet(lab)  # validates the lab number
        self.lab = lab
        self.requested_mode = mode
        self.mode: str | None = None
        #: the default work dir (under the state dir) is disposable and removed by down()
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or state_dir() / f"lab{lab}").absolute()
        #: the run's directory for this lab (a point's), whose files the lab's processes write:
        #: an orphan's processes are found by the files they hold there too (tcpdump, the monitor)
        self.point_dir = Path(point_dir).absolute() if point_dir else None
        self.hosts: dict[str, Host] = {}
        self.node_types: dict[str, NodeType | None] = {}
        self.lost: list[str] = []
        self.fallback_reason: str | None = None
        self._cleanups: list[Callable[..., None]] = []  # called without arguments (some bind loop values)
        self._monitors: list[Monitor] = []
        self._injectors: list[PauseInjector] = []
        self._burners: list[NoisyNeighbourProcess] = []
        self._prev_sigterm: Callable[[int, FrameType | None], Any] | int | None = None
        self._owns_state = False  # True once this object wrote (or adopted) the lab's state file

    # --- building -------------------------------------------------------------------------------

    @property
    def state_file(self) -> Path:
        return state_dir() / f"lab{self.lab}.json"

    @property
    def bridge(self) -> str | None:
        return network.bridge_name(self.lab) if self.mode == "namespaces" else None

    @property
    def capture_interface(self) -> str:
        """Where a capture sees every tier: the bridge, or lo in the loopback fallback."""
        return self.bridge or "lo"

    def _resolve_mode(self) -> str:
        if self.requested_mode == "loopback":
            self.fallback_reason = "loopback requested"
            return "loopback"
        reason = namespaces_unavailable()
        if reason is None:
            return "namespaces"
        if self.requested_mode == "namespaces":
            raise TestbedError(f"cannot build namespaced hosts: {reason}")
        self.fallback_reason = reason
        return "loopback"

    def up(self, point: Point | PointConfig) -> dict[str, Host]:
        """Build a host per server (web1, app1, ..., db1) and for the generator (client1)."""
        if self.hosts:
            raise TestbedError("this testbed is already up; call down() first")
        config = point.config if isinstance(point, Point) else point
        plan: list[tuple[str, NodeType | None]] = [(s.name, config.node_types[s.node_type]) for s in config.servers()]
        client_nt = config.node_types[config.client.node_type] if config.client.node_type else None
        plan.append((CLIENT, client_nt))
        return self.up_hosts(plan)

    def up_hosts(self, plan: list[tuple[str, NodeType | None]]) -> dict[str, Host]:
        """Build the hosts of `plan`: (name, node type or None for no limits), in address order."""
        if self.hosts:
            raise TestbedError("this testbed is already up; call down() first")
        if len(plan) > 253:
            raise TestbedError(f"too many hosts for one lab subnet: {len(plan)} (at most 253)")
        self.mode = self._resolve_mode()
        self._register_exit()
        try:
            with self._lab_chosen():
                self.workdir.mkdir(parents=True, exist_ok=True)
                if self.mode == "namespaces":
                    self._up_namespaces(plan)
                else:
                    self.lost = list(LOOPBACK_LOST)
                    for i, (name, nt) in enumerate(plan):
                        self.hosts[name] = Host(name=name, address=f"127.77.{self.lab}.{i + 2}")
                        self.node_types[name] = nt
                self._save_state()
        except (cgroups.CgroupError, network.NetworkError, OSError) as err:
            self._down_quietly()
            raise TestbedError(f"cannot build the hosts of lab {self.lab}: {err}") from err
        except BaseException:
            self._down_quietly()
            raise
        return dict(self.hosts)

    def _reclaim_stale(self) -> None:
        """Remove a lab left by a process that died (kill -9, crash) without taking it down.

        A lab left up on purpose by `tierscope testbed up` (detached) is never touched.
        """
        if self.state_file.exists():
            try:
                state = statedir.read_json(self.state_file) or {}
            except statedir.StateError:
                return  # not ours to remove: building fails below, naming the file
            if state.get("detached") or owner_alive(state)[0]:
                return
        elif not network.link_exists(network.bridge_name(self.lab)):
            return
        remove_orphan(self.lab)

    @contextlib.contextmanager
    def _lab_chosen(self) -> Iterator[None]:
        """With `lab=None`: the first free lab chosen, one chooser at a time until the chosen lab's
        state file (and bridge) exist, which the body writes."""
        if not self.pick_free:
            yield
            return
        _secure_state_dir()
        with open(state_dir() / "choose-lab.lock", "w") as choosing:
            fcntl.flock(choosing, fcntl.LOCK_EX)
            self.lab = free_lab()
            if self._own_workdir:
                self.workdir = (state_dir() / f"lab{self.lab}").absolute()
            yield

    def _up_namespaces(self, plan: list[tuple[str, NodeType | None]]) -> None:
        _secure_state_dir()
        with open(self.state_file.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two processes never build the same lab at once
            self._build_namespaces(plan)
            self._save_state()

    def _build_namespaces(self, plan: list[tuple[str, NodeType | None]]) -> None:
        self._reclaim_stale()
        if self.state_file.exists() or network.link_exists(network.bridge_name(self.lab)):
            raise TestbedError(
                f"lab {self.lab} is already up (bridge {network.bridge_name(self.lab)} or "
                f"{self.state_file} exists); run `tierscope testbed down --lab {self.lab}` or "
                "`tierscope testbed clean`"
            )
        self._cleanups.append(lambda: network.remove_bridge(self.lab))
        network.create_bridge(self.lab)
        parent = f"{cgroups.TOP}/{self.lab}"
        self._cleanups.append(lambda: cgroups.remove_if_empty(cgroups.TOP))
        self._cleanups.append(lambda: cgroups.remove_if_empty(parent))
        for i, (name, nt) in enumerate(plan):
            rel = f"{parent}/{name}"
            self._cleanups.append(lambda name=name: network.remove_host(self.lab, name))
            self._cleanups.append(lambda rel=rel: cgroups.remove(rel))
            ns, address = network.add_host(self.lab, name, i + 2)
            controllers = cgroups.create(rel, nt, self.workdir)
            self.hosts[name] = Host(
                name=name, address=address, netns=ns, cgroup=rel, controllers=controllers,
                env=self._host_env(name, nt),
            )  # fmt: skip
            self.node_types[name] = nt

    def _host_env(self, name: str, nt: NodeType | None) -> tuple[tuple[str, str], ...]:
        """What every process of host `name` runs with: a disk of one arm (`disk_read_ms`)."""
        if nt is None or nt.disk_read_ms is None:
            return ()
        try:
            return serialdisk.host_env(name, nt.disk_read_ms, self.workdir / "disks")
        except serialdisk.SerialDiskError as err:
            raise TestbedError(f"host {name}: {err}") from err

    def _register_exit(self) -> None:
        atexit.register(self.down)
        try:
            if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
                self._prev_sigterm = signal.SIG_DFL

                def _term(signum, frame):
                    raise SystemExit(128 + signum)

                signal.signal(signal.SIGTERM, _term)
        except ValueError:  # not the main thread
            pass

    def _save_state(self) -> None:
        _secure_state_dir()
        state = {
            "lab": self.lab,
            "mode": self.mode,
            "fallback_reason": self.fallback_reason,
            "lost": self.lost,
            "bridge": self.bridge,
            "workdir": str(self.workdir),
            "point_dir": str(self.point_dir) if self.point_dir else None,
            "created_ns": time.time_ns(),
            "pid": os.getpid(),
            # the owner: a lab whose owner is gone (and that was not detached) is an orphan
            "owner": statedir.identity(os.getpid()),
            "hosts": {
                n: {
                    "address": h.address,
                    "netns": h.netns,
                    "cgroup": h.cgroup,
                    "controllers": list(h.controllers),
                    "node_type": nt.model_dump(mode="json") if (nt := self.node_types.get(n)) is not None else None,
                }
                for n, h in self.hosts.items()
            },
        }
        statedir.write_json(self.state_file, state)
        self._owns_state = True

    @classmethod
    def from_state(cls, lab: int = 0) -> Testbed:
        """The testbed described by a state file (left up by `tierscope testbed up`)."""
        f = state_dir() / f"lab{lab}.json"
        try:
            state = statedir.read_json(f)
        except (OSError, statedir.StateError) as err:
            raise TestbedError(f"no testbed state for lab {lab} ({f}: {err})") from err
        if state is None:
            raise TestbedError(f"no testbed state for lab {lab} ({f} does not exist)")
        tb = cls(lab=lab, workdir=state.get("workdir"), mode=state["mode"], point_dir=state.get("point_dir"))
        tb._own_workdir = tb.workdir == (state_dir() / f"lab{lab}").absolute()
        tb.mode = state["mode"]
        tb._owns_state = True
        tb.lost = state.get("lost", [])
        tb.fallback_reason = state.get("fallback_reason")
        for name, h in state["hosts"].items():
            nt = h.get("node_type")
            tb.node_types[name] = NodeType.model_validate(nt) if nt else None
            tb.hosts[name] = Host(
                name=name, address=h["address"], netns=h["netns"], cgroup=h["cgroup"],
                controllers=tuple(h["controllers"]),
                env=tb._host_env(name, tb.node_types[name]) if tb.mode == "namespaces" else (),
            )  # fmt: skip
            if tb.mode == "namespaces":
                tb._cleanups.append(lambda name=name: network.remove_host(lab, name))
                if h["cgroup"]:
                    tb._cleanups.append(lambda rel=h["cgroup"]: cgroups.remove(rel))
        if tb.mode == "namespaces":
            tb._cleanups[:0] = [
                lambda: network.remove_bridge(lab),
                lambda: cgroups.remove_if_empty(cgroups.TOP),
                lambda: cgroups.remove_if_empty(f"{cgroups.TOP}/{lab}"),
            ]
        return tb

    # --- what runs on it ------------------------------------------------------------------------

    def pids(self, host: str) -> list[int]:
        """Processes running in a host (its cgroup); [] in the loopback fallback."""
        h = self.hosts[host]
        return cgroups.procs(h.cgroup) if h.cgroup else []

    def cores(self, host: str) -> float:
        """The host's CPU allowance in cores."""
        nt = self.node_types.get(host)
        machine = len(cgroups.machine_cpus()) if self.mode == "namespaces" else (os.cpu_count() or 1)
        return nt.cores(machine) if nt is not None and self.mode == "namespaces" else float(machine)

    def monitor_targets(self, socket_limits: dict[str, int] | None = None) -> list[Target]:
        """What the resource monitor samples: every namespaced host ([] in the loopback fallback).
        `socket_limits`: per host, the connections its servers accept (gives `sockets_util`)."""
        out = []
        for name, h in self.hosts.items():
            if not h.cgroup:
                continue
            cg = {c: str(cgroups.path(c, h.cgroup)) for c in ("cpu", "cpuacct", "memory", "blkio")}
            out.append(
                Target(name=name, cgroups=cg, netns=str(network.NETNS_DIR / h.netns) if h.netns else None,
                       cores=self.cores(name), socket_limit=(socket_limits or {}).get(name))
            )  # fmt: skip
        return out

    def start_monitor(self, interval: float, out: str | Path, socket_limits: dict[str, int] | None = None) -> Monitor:
        """Start the resource monitor on every host; stopped by `down()` if not before."""
        mon = Monitor(self.monitor_targets(socket_limits), interval, Path(out)).start()
        self._monitors.append(mon)
        return mon

    def start_interference(
        self, point: Point | PointConfig, seed: int = 0, pids: dict[str, Callable[[], list[int]]] | None = None
    ) -> Interference:
        """Start the point's pauses and noisy neighbours.

        `pids` gives, per host, the processes to pause (default: the host's cgroup; required in
        the loopback fallback, where hosts have no cgroup).
        """
        config = point.config if isinstance(point, Point) else point
        inj: list[PauseInjector] = []
        burners: list[NoisyNeighbourProcess] = []
        targets = lambda item: (  # noqa: E731
            [s.name for s in config.tier_servers(item.tier)] if item.tier else [item.server]
        )
        for pause in config.interference.pause:  # check before starting anything
            for name in targets(pause):
                if (pids or {}).get(name) is None and not self.hosts[name].cgroup:
                    raise TestbedError(
                        f"pauses of {name}: in the loopback fallback a host has no cgroup; "
                        "pass pids={host: callable} with the processes to pause"
                    )
        k = 0
        for nn in config.interference.noisy_neighbour:
            for name in targets(nn):
                b = NoisyNeighbourProcess(self.hosts[name], nn, self.workdir, seed=seed + k)
                self._burners.append(b)
                burners.append(b.start())
                k += 1
        for pause in config.interference.pause:
            for name in targets(pause):
                src = (pids or {}).get(name) or partial(self.pids, name)

                def own(src=src) -> list[int]:
                    return [p for p in src() if p not in {b.pid for b in self._burners}]

                inj.append(PauseInjector(name, pause, own, seed=seed + k).start())
                k += 1
        self._injectors.extend(inj)
        return Interference(inj, burners)

    # --- removal --------------------------------------------------------------------------------

    def down(self) -> None:
        """Stop everything started on the testbed and remove every host (idempotent)."""
        errors = []
        for mon in self._monitors:
            try:
                mon.stop()
            except Exception as err:  # keep tearing down
                errors.append(f"monitor: {err}")
        for inj in self._injectors:
            inj.stop()
        for b in self._burners:
            b.stop()
        self._monitors, self._injectors, self._burners = [], [], []
        for fn in reversed(self._cleanups):
            try:
                fn()
            except Exception as err:
                errors.append(str(err))
        self._cleanups = []
        self.hosts = {}
        if self._owns_state:
            self.state_file.unlink(missing_ok=True)
            self._owns_state = False
            if self._own_workdir:
                import shutil

                shutil.rmtree(self.workdir, ignore_errors=True)
        with contextlib.suppress(Exception):
            atexit.unregister(self.down)
        if self._prev_sigterm is not None:
            with contextlib.suppress(ValueError):
                signal.signal(signal.SIGTERM, self._prev_sigterm)
            self._prev_sigterm = None
        if errors:
            raise TestbedError("testbed down left errors: " + "; ".join(errors))

    def _down_quietly(self) -> None:
        with contextlib.suppress(TestbedError):
            self.down()

    def detach(self) -> None:
        """Leave the hosts up after this process exits (`tierscope testbed up`); `from_state` finds them."""
        with contextlib.suppress(Exception):
            atexit.unregister(self.down)
        if self._prev_sigterm is not None:
            with contextlib.suppress(ValueError):
                signal.signal(signal.SIGTERM, self._prev_sigterm)
            self._prev_sigterm = None
        self._cleanups = []
        if self._owns_state and self.state_file.exists():
            state = statedir.read_json(self.state_file) or {}
            state["detached"] = True
            statedir.write_json(self.state_file, state)
        self._owns_state = False

    def __enter__(self) -> Testbed:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.down()
            return
        try:  # an exception is on its way: do not hide it behind a teardown error
            self.down()
        except TestbedError as err:
            exc.add_note(str(err))

    def describe(self) -> str:
        """A few lines: mode, what is lost, and each host with its address and limits."""
        lines = [f"lab {self.lab}: {self.mode or 'down'}"
                 + (f" (bridge {self.bridge})" if self.bridge else "")]  # fmt: skip
        if self.mode == "loopback":
            lines.append(f"  fallback because: {self.fallback_reason}")
            lines += [f"  lost: {x}" for x in self.lost]
        for name, h in self.hosts.items():
            nt = self.node_types.get(name)
            limits = _limits(nt) if (nt is not None and self.mode == "namespaces") else "no limits"
            lines.append(f"  {name:<10} {h.address:<15} {limits}")
        return "\n".join(lines)


class Interference:
    """The running injectors of one point; `stop()` returns their `events` table."""

    def __init__(self, injectors: list[PauseInjector], burners: list[NoisyNeighbourProcess]):
        self.injectors = injectors
        self.burners = burners

    def stop(self):
        import pyarrow as pa

        tables = [i.stop() for i in self.injectors] + [b.stop() for b in self.burners]
        return pa.concat_tables(tables) if tables else events_table([])


def _limits(nt: NodeType) -> str:
    parts = []
    if nt.cpu is not None:
        parts.append(f"cpu {nt.cpu:g} cores")
    if nt.cpus:
        parts.append(f"cpus {nt.cpus}")
    if nt.memory:
        parts.append(f"memory {nt.memory / 2**20:.0f} MiB")
    for k in ("disk_read_bps", "disk_write_bps", "disk_read_iops", "disk_write_iops", "disk_read_ms"):
        v = getattr(nt, k)
        if v:
            parts.append(f"{k} {v:g}")
    return ", ".join(parts) or "no limits"


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _secure_state_dir() -> Path:
    try:
        return statedir.secure_dir(state_dir())
    except statedir.StateError as err:
        raise TestbedError(str(err)) from None


def owner_alive(state: dict) -> tuple[bool, int | None]:
    """Whether the process that built the lab of `state` still runs (same pid, start time and
    command line; state files from before owners were recorded: the pid alone), and its pid."""
    owner = state.get("owner")
    if isinstance(owner, dict) and owner.get("pid"):
        return statedir.same_process(owner)[0], owner["pid"]
    pid = state.get("pid")
    return _alive(pid if isinstance(pid, int) else None), pid if isinstance(pid, int) else None


class Orphan:
    """A lab whose owner died without taking it down (one line: `str(orphan)`)."""

    def __init__(self, lab: int, pid: int | None, state: dict | None):
        self.lab, self.pid, self.state = lab, pid, state

    def __str__(self) -> str:
        if self.state is None:
            return f"lab {self.lab}: orphaned, bridge {network.bridge_name(self.lab)} with no state file"
        return f"lab {self.lab}: orphaned, owner pid {self.pid} dead"


def _lock_held(lab: int) -> bool:
    """Whether a process is building lab `lab` right now (it holds the lab's lock file)."""
    try:
        fd = os.open(state_dir() / f"lab{lab}.lock", os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def find_orphans() -> list[Orphan]:
    """Labs whose owner is dead and that were not left up on purpose (`testbed up` detaches), and
    lab bridges with no state file that no process is building."""
    out: list[Orphan] = []
    labs_with_state = set()
    d = state_dir()
    for f in sorted(d.glob("lab*.json")) if d.is_dir() else []:
        try:
            state = statedir.read_json(f) or {}
            lab = int(state["lab"])
        except (OSError, KeyError, TypeError, ValueError, statedir.StateError):
            continue
        labs_with_state.add(lab)
        if state.get("detached"):
            continue
        alive, pid = owner_alive(state)
        if not alive:
            out.append(Orphan(lab, pid, state))
    for link in network.marked_links():
        if link.startswith("tsbr") and link[4:].isdigit():
            lab = int(link[4:])
            if lab not in labs_with_state and not _lock_held(lab):
                out.append(Orphan(lab, None, None))
    return sorted(out, key=lambda o: o.lab)


def _lineage() -> set[int]:
    """This process and its ancestors (never killed by a clean-up run from them)."""
    mine = {os.getpid()}
    p = os.getppid()
    while p > 1 and p not in mine:
        mine.add(p)
        try:
            with open(f"/proc/{p}/stat", "rb") as f:
                p = int(f.read().rsplit(b")", 1)[1].split()[1])
        except OSError:
            break
    return mine


def holders(dirs: list[Path]) -> dict[int, str]:
    """Processes (pid -> what) whose working directory or an open file is inside one of `dirs`."""
    roots = [str(Path(d).absolute()) for d in dirs if d]
    if not roots:
        return {}

    def inside(target: str) -> bool:
        return any(target == r or target.startswith(r + "/") for r in roots)

    out: dict[int, str] = {}
    mine = _lineage()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in mine:
            continue
        pid = int(entry)
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
            if inside(cwd):
                out[pid] = f"working directory {cwd}"
                continue
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if inside(target):
                    out[pid] = f"open file {target}"
                    break
        except OSError:
            continue
    return out


def lab_processes(lab: int, state: dict | None) -> set[int]:
    """Every process of a lab: in its hosts' cgroups, in its namespaces, and holding files in its
    work and point directories."""

    pids: set[int] = set()
    for c in BASE_CONTROLLERS:
        pids.update(cgroups.procs(f"{cgroups.TOP}/{lab}", c))
    prefix = network.netns_name(lab, "")
    for ns in network.marked_netns():
        if ns.startswith(prefix):
            pids.update(network.netns_pids(ns))
    if state:
        dirs = [Path(x) for x in (state.get("workdir"), state.get("point_dir")) if x]
        # only a lab's own directories: never "/", /tmp, a home directory or one of its parents
        home = Path.home().absolute()
        dirs = [d for d in dirs if d.is_absolute() and len(d.parts) >= 3 and d not in (home, *home.parents)]
        pids.update(holders(dirs))
    return pids - _lineage()


def remove_orphan(lab: int) -> dict[str, list]:
    """Remove lab `lab` whatever its owner left: kill its processes, delete its namespaces (and
    with them the veths' peers), its veths and bridge, its cgroups, its state file and its own work
    directory. Returns what went: {"processes", "netns", "links", "cgroups", "errors"}."""
    import shutil

    f = state_dir() / f"lab{lab}.json"
    try:
        state = statedir.read_json(f)
    except statedir.StateError as err:
        return {"processes": [], "netns": [], "links": [], "cgroups": [], "errors": [str(err)]}
    out: dict[str, list] = {"processes": [], "netns": [], "links": [], "cgroups": [], "errors": []}
    out["processes"] = _kill(lab_processes(lab, state))
    prefix = network.netns_name(lab, "")
    for ns in network.marked_netns():
        if ns.startswith(prefix):
            r = network.ip("netns", "del", ns, check=False)
            (out["netns"] if r.returncode == 0 else out["errors"]).append(
                ns if r.returncode == 0 else f"netns {ns}: {r.stderr.strip()}"
            )
    veths = [link for link in network.marked_links() if link.startswith(f"ts{lab}-")]
    for link in [*veths, network.bridge_name(lab)]:
        if network.link_exists(link):
            r = network.ip("link", "del", link, check=False)
            if r.returncode == 0 or not network.link_exists(link):
                out["links"].append(link)
            else:
                out["errors"].append(f"link {link}: {r.stderr.strip()}")
    parent = f"{cgroups.TOP}/{lab}"
    before = [str(p) for p in cgroups.existing() if f"/{parent}/" in str(p) + "/"]
    try:
        cgroups.remove(parent)
        out["cgroups"] = before
    except cgroups.CgroupError as err:
        out["errors"].append(str(err))
    cgroups.remove_if_empty(cgroups.TOP)
    if state is not None:
        f.unlink(missing_ok=True)
        workdir = Path(state.get("workdir") or "")
        if workdir == (state_dir() / f"lab{lab}").absolute():  # the lab's own, not a run's point
            shutil.rmtree(workdir, ignore_errors=True)
    return out
