"""The resource monitor: samples every host at a fixed interval (1 s default, down to 50 ms) and
writes the `resources` table (ts_ns, host, metric, value, unit).

It runs as a small process of its own (`python -m tierscope.testbed.monitor`), so it shares no
interpreter lock with the runner and its cost can be measured alone. Every file it reads is
opened once and re-read with `os.pread` on the kept-open descriptor; the namespace files
(/proc/net/dev, sockstat, snmp) are opened from inside each host's network namespace (setns)
and stay bound to it. Rows are flushed to Parquet every few seconds.

Metrics per host (value over the interval ending at `ts_ns`; rates are per second):

| metric | unit | from |
|---|---|---|
| cpu_user, cpu_system | percent_core (100 = one core busy) | cpuacct.usage (exact run time), split by the ratio of usage_user / usage_sys (tick-based) |
| cpu_util | percent (100 = the host's CPU allowance: quota, cpuset or machine) | the same |
| cpu_quota | percent: the CPU quota biting (growth of throttled_time over the interval; the kernel sums it over CPUs and adds it when a period ends, so read it as "how hard", and cpu_quota_periods as "how often") | cpu.stat throttled_time |
| cpu_quota_periods | count (CFS periods in which the quota ran out, in the interval) | cpu.stat nr_throttled |
| mem_usage | bytes | memory.usage_in_bytes (includes page cache) |
| mem_working_set | bytes | usage less the inactive page cache (memory.stat total_inactive_file): what the host cannot give back without paging |
| mem_util | percent (100 = the host's memory limit, or the machine's RAM when the limit is higher or unset) | mem_working_set / memory.limit_in_bytes |
| mem_major_faults | faults_per_s (page-cache misses: pages read back from disk) | memory.stat total_pgmajfault |
| mem_swap | bytes | memory.stat total_swap |
| disk_read_ops, disk_write_ops | ops_per_s | blkio.throttle.io_serviced |
| disk_read_bytes, disk_write_bytes | bytes_per_s | blkio.throttle.io_service_bytes |
| disk_util | percent (only for a host with disk limits: the highest of its read/write ops and bytes rates against the blkio.throttle limits of the limited disk; may pass 100 in a short interval, as the kernel dispatches in slices) | the same, and blkio.throttle.*_device |
| net_rx_bytes, net_tx_bytes | bytes_per_s | /proc/net/dev in the host's netns (all but lo) |
| net_rx_packets, net_tx_packets | packets_per_s | the same |
| sockets_tcp, sockets_tcp_tw | count | /proc/net/sockstat in the netns (TCP inuse, tw) |
| sockets_established | count (TCP connections established or closing-wait, both directions) | /proc/net/snmp in the netns (Tcp CurrEstab) |
| sockets_util | percent (only when the target has a `socket_limit`: sockets_established against it) | the same |

Host `machine` gets cpu_user and cpu_system (percent_core, from /proc/stat), mem_util (percent:
MemTotal less MemAvailable of /proc/meminfo) and, per whole disk, `disk_util_<disk>` (percent: the
share of the interval the disk had I/O in flight, io_ticks of /proc/diskstats, what iostat calls
%util) with `disk_ops_<disk>` (ops_per_s, reads + writes completed). Host `monitor`
gets, once at the end, `monitor_cpu` (percent_core: the monitor's own CPU time over its sampling
time), `monitor_samples` (count) and `monitor_late` (count of samples taken late by more than
half an interval) and `monitor_read_errors` (host samples skipped because a file could not be
read, e.g. the host was removed).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tierscope.procs import spawn

CLONE_NEWNET = 0x40000000
FLUSH_EVERY_S = 5.0
MARKER_ENV = "TIERSCOPE_MARKER"


@dataclass
class Target:
    """One host as the monitor sees it: its cgroup directories and its network namespace."""

    name: str
    cgroups: dict[str, str] = field(default_factory=dict)  # controller -> absolute directory
    netns: str | None = None  # /run/netns/<name>
    cores: float = 1.0  # the CPU allowance, for cpu_util
    socket_limit: int | None = None  # connections the host's servers accept, for sockets_util


# --- the sampling process ----------------------------------------------------------------------


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _open_in_netns(netns: str, files: list[str]) -> list[int]:
    """Open /proc/thread-self/net/<file> from inside a namespace; the descriptors stay bound to it."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(netns, os.O_RDONLY)
    try:
        _setns(target)
        try:
            return [os.open(f"/proc/thread-self/net/{f}", os.O_RDONLY) for f in files]
        finally:
            _setns(home)
    finally:
        os.close(target)
        os.close(home)


class _Host:
    """Kept-open descriptors, limits and previous counters of one target."""

    # positions in the tuple `read` returns
    USER, SYS, NTHR, THR, MEM, ROPS, WOPS, RBY, WBY, RXB, TXB, RXP, TXP, TCP, TW, USAGE = range(16)
    WSET, MAJFLT, SWAP, LROPS, LWOPS, LRBY, LWBY, ESTAB = range(16, 24)

    def __init__(self, t: Target):
        self.name = t.name
        self.cores = t.cores or 1.0
        self.socket_limit = t.socket_limit
        cg = t.cgroups
        op = lambda c, f: os.open(os.path.join(cg[c], f), os.O_RDONLY) if c in cg else -1  # noqa: E731
        self.user = op("cpuacct", "cpuacct.usage_user")
        self.sys = op("cpuacct", "cpuacct.usage_sys")
        self.usage = op("cpuacct", "cpuacct.usage")
        self.cpustat = op("cpu", "cpu.stat")
        self.mem = op("memory", "memory.usage_in_bytes")
        self.memstat = op("memory", "memory.stat")
        self.ios = op("blkio", "blkio.throttle.io_serviced")
        self.iob = op("blkio", "blkio.throttle.io_service_bytes")
        self.mem_ceiling = _memory_ceiling(cg.get("memory"))
        self.disk_device, self.disk_limits = _disk_limits(cg.get("blkio"))
        self.netdev = self.sockstat = self.snmp = -1
        if t.netns:
            self.netdev, self.sockstat, self.snmp = _open_in_netns(t.netns, ["dev", "sockstat", "snmp"])

    def read(self) -> tuple:
        pr = os.pread
        user = int(pr(self.user, 64, 0)) if self.user >= 0 else 0
        sysn = int(pr(self.sys, 64, 0)) if self.sys >= 0 else 0
        nthr = thr = 0
        if self.cpustat >= 0:
            for line in pr(self.cpustat, 1024, 0).split(b"\n"):
                if line.startswith(b"nr_throttled "):
                    nthr = int(line[13:])
                elif line.startswith(b"throttled_time "):
                    thr = int(line[15:])
        mem = int(pr(self.mem, 64, 0)) if self.mem >= 0 else -1
        wset = majflt = swap = 0
        if self.memstat >= 0:
            buf = pr(self.memstat, 8192, 0)
            wset = max(mem - _field(buf, b"\ntotal_inactive_file "), 0)
            majflt = _field(buf, b"\ntotal_pgmajfault ")
            swap = _field(buf, b"\ntotal_swap ")
        rops = wops = rby = wby = 0
        lrops = lwops = lrby = lwby = 0
        dev = self.disk_device
        if self.ios >= 0:
            for line in pr(self.ios, 65536, 0).split(b"\n"):
                p = line.split()
                if len(p) == 3:
                    if p[1] == b"Read":
                        rops += int(p[2])
                        if p[0] == dev:
                            lrops = int(p[2])
                    elif p[1] == b"Write":
                        wops += int(p[2])
                        if p[0] == dev:
                            lwops = int(p[2])
            for line in pr(self.iob, 65536, 0).split(b"\n"):
                p = line.split()
                if len(p) == 3:
                    if p[1] == b"Read":
                        rby += int(p[2])
                        if p[0] == dev:
                            lrby = int(p[2])
                    elif p[1] == b"Write":
                        wby += int(p[2])
                        if p[0] == dev:
                            lwby = int(p[2])
        rxb = txb = rxp = txp = 0
        tcp = tw = estab = -1
        if self.netdev >= 0:
            for line in pr(self.netdev, 65536, 0).split(b"\n")[2:]:
                name, _, rest = line.partition(b":")
                if not rest or name.strip() == b"lo":
                    continue
                f = rest.split()
                rxb += int(f[0])
                rxp += int(f[1])
                txb += int(f[8])
                txp += int(f[9])
            for line in pr(self.sockstat, 4096, 0).split(b"\n"):
                if line.startswith(b"TCP:"):
                    p = line.split()
                    tcp = int(p[p.index(b"inuse") + 1])
                    tw = int(p[p.index(b"tw") + 1])
                    break
            buf = pr(self.snmp, 8192, 0)
            head = buf.find(b"\nTcp:")
            values = buf.find(b"\nTcp:", head + 1)
            if head >= 0 and values >= 0:
                names = buf[head + 1 : values].split()
                estab = int(buf[values + 1 : buf.find(b"\n", values + 1)].split()[names.index(b"CurrEstab")])
        usage = int(pr(self.usage, 64, 0)) if self.usage >= 0 else 0
        return (user, sysn, nthr, thr, mem, rops, wops, rby, wby, rxb, txb, rxp, txp, tcp, tw, usage,
                wset, majflt, swap, lrops, lwops, lrby, lwby, estab)  # fmt: skip

    def metrics(self) -> list[tuple[str, str, Callable]]:
        """(metric, unit, f(deltas, counters, dt_s) -> values) for what this host can report."""
        import numpy as np

        H = _Host
        cpu = lambda i: lambda d, c, dt: d[:, i] * 100.0 / (dt * 1e9)  # noqa: E731
        rate = lambda i: lambda d, c, dt: d[:, i] / dt  # noqa: E731
        level = lambda i: lambda d, c, dt: c[:, i]  # noqa: E731
        cores = self.cores

        def share(i: int):
            # cpuacct.usage is the scheduler's exact run time; usage_user/usage_sys come from
            # clock ticks (biased for bursts shorter than a few ticks), so they only split it
            def f(d, c, dt):
                ticks = d[:, 0] + d[:, 1]
                part = np.where(ticks > 0, d[:, i] / np.where(ticks > 0, ticks, 1), 1.0 - i)
                return d[:, 15] * part * 100.0 / (dt * 1e9)

            return f

        out: list[tuple[str, str, Callable]] = []
        if self.user >= 0:
            out += [
                ("cpu_user", "percent_core", share(0)),
                ("cpu_system", "percent_core", share(1)),
                ("cpu_util", "percent", lambda d, c, dt: d[:, 15] * 100.0 / (dt * 1e9) / cores),
            ]  # fmt: skip
        if self.cpustat >= 0:
            out += [("cpu_quota", "percent", cpu(3)),
                    ("cpu_quota_periods", "count", lambda d, c, dt: d[:, 2])]  # fmt: skip
        if self.mem >= 0:
            out.append(("mem_usage", "bytes", level(H.MEM)))
        if self.memstat >= 0:
            ceiling = self.mem_ceiling
            out += [("mem_working_set", "bytes", level(H.WSET)),
                    ("mem_util", "percent", lambda d, c, dt: c[:, H.WSET] * 100.0 / ceiling),
                    ("mem_major_faults", "faults_per_s", rate(H.MAJFLT)),
                    ("mem_swap", "bytes", level(H.SWAP))]  # fmt: skip
        if self.ios >= 0:
            out += [("disk_read_ops", "ops_per_s", rate(5)), ("disk_write_ops", "ops_per_s", rate(6)),
                    ("disk_read_bytes", "bytes_per_s", rate(7)),
                    ("disk_write_bytes", "bytes_per_s", rate(8))]  # fmt: skip
            if self.disk_limits:
                limits = [(H.LROPS + i, v) for i, v in enumerate(self.disk_limits) if v]

                def disk_util(d, c, dt):
                    return np.max([d[:, i] / dt * 100.0 / v for i, v in limits], axis=0)

                out.append(("disk_util", "percent", disk_util))
        if self.netdev >= 0:
            out += [("net_rx_bytes", "bytes_per_s", rate(9)), ("net_tx_bytes", "bytes_per_s", rate(10)),
                    ("net_rx_packets", "packets_per_s", rate(11)),
                    ("net_tx_packets", "packets_per_s", rate(12)),
                    ("sockets_tcp", "count", level(13)), ("sockets_tcp_tw", "count", level(14)),
                    ("sockets_established", "count", level(H.ESTAB))]  # fmt: skip
            if self.socket_limit:
                limit = float(self.socket_limit)
                out.append(("sockets_util", "percent", lambda d, c, dt: c[:, H.ESTAB] * 100.0 / limit))
        return out


def _field(buf: bytes, key: bytes) -> int:
    """The number after `key` (b"\\nname ") in a "name value" file; 0 when the key is absent."""
    i = buf.find(key)
    if i < 0:
        return 0
    j = i + len(key)
    k = buf.find(b"\n", j)
    return int(buf[j : k if k >= 0 else len(buf)].split()[0])


def _mem_total() -> int:
    with open("/proc/meminfo", "rb") as f:
        for line in f:
            if line.startswith(b"MemTotal:"):
                return int(line.split()[1]) * 1024
    raise OSError("MemTotal missing from /proc/meminfo")


def _memory_ceiling(memdir: str | None) -> float:
    """The memory a host may use: its cgroup limit, or the machine's RAM when that is lower."""
    total = _mem_total()
    if not memdir:
        return float(total)
    try:
        limit = int(Path(memdir, "memory.limit_in_bytes").read_text())
    except (OSError, ValueError):
        return float(total)
    return float(min(limit, total))


def _disk_limits(blkdir: str | None) -> tuple[bytes | None, tuple[int, int, int, int] | None]:
    """The limited disk (b"MAJ:MIN") and its (read iops, write iops, read bps, write bps) limits, 0 = none."""
    if not blkdir:
        return None, None
    found: dict[bytes, list[int]] = {}
    for i, f in enumerate(("read_iops", "write_iops", "read_bps", "write_bps")):
        try:
            text = Path(blkdir, f"blkio.throttle.{f}_device").read_bytes()
        except OSError:
            continue
        for line in text.split(b"\n"):
            p = line.split()
            if len(p) == 2 and int(p[1]) > 0:
                found.setdefault(p[0], [0, 0, 0, 0])[i] = int(p[1])
    if not found:
        return None, None
    dev = sorted(found)[0]  # the lab limits one disk
    return dev, tuple(found[dev])  # type: ignore[return-value]


def whole_disks() -> list[str]:
    """Names of the machine's whole physical disks (/sys/block entries with a device: vda, sda, nvme0n1)."""
    base = Path("/sys/block")
    if not base.exists():
        return []
    return sorted(
        p.name for p in base.iterdir() if (p / "device").exists() and not p.name.startswith(("loop", "ram", "zram"))
    )


class _Machine:
    """Machine-wide CPU from /proc/stat (user+nice, system+irq+softirq, in clock ticks), memory in
    use from /proc/meminfo, and each whole disk's busy time and operations from /proc/diskstats."""

    def __init__(self, disks: list[str] | None = None):
        self.name = "machine"
        self.fd = os.open("/proc/stat", os.O_RDONLY)
        self.meminfo = os.open("/proc/meminfo", os.O_RDONLY)
        self.diskstats = os.open("/proc/diskstats", os.O_RDONLY)
        self.hz = os.sysconf("SC_CLK_TCK")
        self.disks = [d.encode() for d in (whole_disks() if disks is None else disks)]
        self.disk_keys = [b" " + d + b" " for d in self.disks]

    def read(self) -> tuple:
        f = os.pread(self.fd, 256, 0).split(b"\n", 1)[0].split()
        buf = b"\n" + os.pread(self.meminfo, 256, 0)  # MemTotal and MemAvailable are its first lines
        total = _field(buf, b"\nMemTotal:")
        avail = _field(buf, b"\nMemAvailable:")
        out = [int(f[1]) + int(f[2]), int(f[3]) + int(f[6]) + int(f[7]), total - avail, total]
        if self.disks:
            buf = os.pread(self.diskstats, 16384, 0)
            for key in self.disk_keys:
                i = buf.find(key)
                if i < 0:
                    out += (0, 0)
                    continue
                p = buf[i : buf.find(b"\n", i)].split()  # name, reads, ..., writes, ..., io_ticks
                out += (int(p[10]), int(p[1]) + int(p[5]))  # io_ticks (ms), reads + writes
        return tuple(out)

    def metrics(self) -> list[tuple[str, str, Callable]]:
        hz = self.hz
        out: list[tuple[str, str, Callable]] = [
            ("cpu_user", "percent_core", lambda d, c, dt: d[:, 0] * 100.0 / (hz * dt)),
            ("cpu_system", "percent_core", lambda d, c, dt: d[:, 1] * 100.0 / (hz * dt)),
            ("mem_util", "percent", lambda d, c, dt: c[:, 2] * 100.0 / c[:, 3]),
        ]
        for k, name in enumerate(self.disks):
            i = 4 + 2 * k
            out += [(f"disk_util_{name.decode()}", "percent", lambda d, c, dt, i=i: d[:, i] / 10.0 / dt),
                    (f"disk_ops_{name.decode()}", "ops_per_s", lambda d, c, dt, i=i: d[:, i + 1] / dt)]  # fmt: skip
        return out


class _Series:
    """Raw counter samples of one source, turned into rows in bulk (numpy) at each flush.

    The sampling loop only appends (t_ns, counters); a None breaks the series (a failed read), so
    no rate is computed across it.
    """

    def __init__(self, source):
        self.source = source
        self.spec = source.metrics()
        self.buf: list = []
        self.last = None

    def sample(self, t_ns: int) -> None:
        self.buf.append((t_ns, self.source.read()))

    def gap(self) -> None:
        self.buf.append(None)

    def drain(self, out: list) -> None:
        import numpy as np

        buf, self.buf = self.buf, []
        segment = [self.last] if self.last is not None else []
        for item in buf + [None]:
            if item is not None:
                segment.append(item)
                continue
            if len(segment) >= 2:
                t = np.fromiter((x[0] for x in segment), dtype=np.int64, count=len(segment))
                c = np.array([x[1] for x in segment], dtype=np.float64)
                d = np.diff(c, axis=0)
                dt = np.diff(t) / 1e9
                ts = t[1:]
                for metric, unit, f in self.spec:
                    out.append((ts, self.source.name, metric, np.asarray(f(d, c[1:], dt), dtype=np.float64), unit))
            segment = []
        self.last = buf[-1] if buf and buf[-1] is not None else (None if buf else self.last)


def _table(chunks: list):
    """A resources table from (ts array, host, metric, values array, unit) chunks."""
    import numpy as np
    import pyarrow as pa

    # late: tierscope.tables imports pyarrow; the monitor process starts without it
    from tierscope.tables import RESOURCES

    if not chunks:
        return RESOURCES.empty_table()
    ts = np.concatenate([c[0] for c in chunks])
    values = np.concatenate([c[3] for c in chunks])
    host, metric, unit = [], [], []
    for c in chunks:
        n = len(c[0])
        host += [c[1]] * n
        metric += [c[2]] * n
        unit += [c[4]] * n
    return pa.Table.from_arrays(
        [pa.array(ts, pa.int64()), pa.array(host, pa.string()), pa.array(metric, pa.string()),
         pa.array(values, pa.float64()), pa.array(unit, pa.string())],
        schema=RESOURCES,
    )  # fmt: skip


def sample_loop(
    targets: list[Target], interval: float, out: Path, machine: bool = True, ready=None, parent: int | None = None
) -> dict:
    """Sample until SIGTERM/SIGINT (or the parent exits); write `out` (Parquet). Returns the summary."""
    import pyarrow.parquet as pq

    # late: tierscope.tables imports pyarrow; the monitor process starts without it
    from tierscope.tables import RESOURCES

    series = [_Series(_Host(t)) for t in targets]
    if machine:
        series.append(_Series(_Machine()))
    stop = {"now": False}
    rfd, wfd = os.pipe()
    os.set_blocking(wfd, False)
    signal.set_wakeup_fd(wfd)

    def _stop(signum, frame):
        stop["now"] = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    writer = pq.ParquetWriter(str(out), RESOURCES)
    warm = _Series(_Machine())  # pays numpy's and pyarrow's lazy imports before the clock starts
    warm.sample(time.time_ns())
    warm.sample(time.time_ns() + 1)
    chunks: list = []
    warm.drain(chunks)
    _table(chunks)
    chunks = []
    samples = late = errors = 0
    if ready:
        ready()
    cpu0 = time.process_time()
    wall0 = time.monotonic()
    next_t = wall0
    last_flush = wall0
    last_parent_check = wall0
    try:
        while not stop["now"]:
            t_ns = time.time_ns()
            for ser in series:
                try:
                    ser.sample(t_ns)
                except (OSError, ValueError):  # the host went away (down, crashed): skip it
                    ser.gap()
                    errors += 1
            samples += 1
            now = time.monotonic()
            if now - last_flush >= FLUSH_EVERY_S:
                for ser in series:
                    ser.drain(chunks)
                writer.write_table(_table(chunks))
                chunks = []
                last_flush = now
            if parent and now - last_parent_check >= 1.0:
                last_parent_check = now
                if os.getppid() != parent:
                    break
            next_t += interval
            wait = next_t - time.monotonic()
            if wait < -interval / 2:
                late += 1
                next_t = time.monotonic()  # fell behind: start over from now
                continue
            if wait > 0:
                r, _, _ = select.select([rfd], [], [], wait)
                if r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(rfd, 64)
    finally:
        wall = time.monotonic() - wall0
        cpu = time.process_time() - cpu0
        summary = {
            "samples": samples,
            "late": late,
            "read_errors": errors,
            "wall_s": wall,
            "cpu_s": cpu,
            "cost_percent_core": 100.0 * cpu / wall if wall > 0 else 0.0,
        }
        import numpy as np

        for ser in series:
            ser.drain(chunks)
        end = np.array([time.time_ns()], dtype=np.int64)
        for metric, value, unit in (
            ("monitor_cpu", summary["cost_percent_core"], "percent_core"),
            ("monitor_samples", samples, "count"),
            ("monitor_late", late, "count"),
            ("monitor_read_errors", errors, "count"),
        ):
            chunks.append((end, "monitor", metric, np.array([float(value)]), unit))
        writer.write_table(_table(chunks))
        writer.close()
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tierscope.testbed.monitor")
    ap.add_argument("config", help="JSON: {interval, machine, targets: [{name, cgroups, netns, cores}]}")
    ap.add_argument("out", help="the resources table to write (Parquet)")
    args = ap.parse_args(argv)
    cfg = json.loads(Path(args.config).read_text())
    targets = [Target(**t) for t in cfg["targets"]]

    def ready():
        sys.stdout.write("ready\n")
        sys.stdout.flush()

    summary = sample_loop(
        targets, float(cfg["interval"]), Path(args.out), bool(cfg.get("machine", True)),
        ready=ready, parent=cfg.get("parent"),
    )  # fmt: skip
    sys.stdout.write(json.dumps(summary) + "\n")
    sys.stdout.flush()
    return 0


# --- the parent's handle -----------------------------------------------------------------------


class MonitorError(RuntimeError):
    pass


class Monitor:
    """Start the sampling process for some hosts; `stop()` returns the resources table.

    Example::

        with Monitor(targets, interval=0.05, out=Path("resources.parquet")) as mon:
            ...  # run the workload
        table = mon.table      # pyarrow.Table with the RESOURCES schema
        mon.summary["cost_percent_core"]
    """

    def __init__(self, targets: list[Target], interval: float, out: Path, machine: bool = True):
        if not 0.05 - 1e-9 <= interval <= 60:
            raise MonitorError(f"monitor interval must be between 50ms and 60s, got {interval}s")
        self.targets = targets
        self.interval = interval
        self.out = Path(out)
        self.machine = machine
        self.proc: subprocess.Popen | None = None
        self.summary: dict = {}
        self.table = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> Monitor:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        cfg_path = self.out.with_suffix(".monitor.json")
        cfg_path.write_text(
            json.dumps(
                {
                    "interval": self.interval,
                    "machine": self.machine,
                    "parent": os.getpid(),
                    "targets": [asdict(t) for t in self.targets],
                }
            )
        )
        env = dict(os.environ, **{MARKER_ENV: "monitor"})
        self.proc = spawn(
            [sys.executable, "-m", "tierscope.testbed.monitor", str(cfg_path), str(self.out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
            env=env,
        )
        assert self.proc.stdout is not None and self.proc.stderr is not None  # pipes
        r, _, _ = select.select([self.proc.stdout], [], [], 30)
        line = self.proc.stdout.readline() if r else ""
        if line.strip() != "ready":
            err = self.proc.stderr.read() if self.proc.poll() is not None else ""
            self.proc.kill()
            self.proc.wait()
            raise MonitorError(f"resource monitor did not start: {err.strip()[-2000:] or 'no answer'}")
        return self

    def stop(self):
        """Stop sampling; returns the resources table (also kept as `.table`)."""
        import pyarrow.parquet as pq

        # late: tierscope.tables imports pyarrow; the agent imports Monitor and starts without it
        from tierscope.tables import conform

        if self.proc is None:
            return self.table
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            out, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
        self.proc = None
        lines = [x for x in out.splitlines() if x.startswith("{")]
        if not lines:
            raise MonitorError(f"resource monitor failed: {err.strip()[-2000:]}")
        self.summary = json.loads(lines[-1])
        self.table = conform(pq.read_table(self.out), "resources")
        return self.table

    def __enter__(self) -> Monitor:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":
    sys.exit(main())
