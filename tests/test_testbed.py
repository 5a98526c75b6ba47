"""Hosts on one machine: limits are enforced, the bridge connects hosts, the monitor's numbers
match arithmetic, pauses stop processes, and the loopback fallback works without root.

Ground truth: cpuacct's own counter for CPU, the kernel's OOM kill for memory, a byte count we
send ourselves for the network, timestamps written by the paused process for pauses.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tierscope.spec import Pause, expand, parse_spec
from tierscope.testbed.host import Host
from tierscope.testbed.interference import PauseInjector, mmpp_periods, work_arrivals
from tierscope.testbed.lab import Testbed, namespaces_unavailable

LAB = 7  # tests use their own lab (bridge tsbr7, 10.77.7.0/24); `testbed up` by hand uses 0
LAB2 = 6  # for tests that build a testbed of their own while LAB is up

SPEC = """
topology = "1/1/0/1X"
[node_types.X]
description = "a fifth of a core, 64 MiB"
cpu = 0.2
memory = "64MiB"
[node_types.S]
cpu = 1.0
memory = "512MiB"
[workload]
users = [1]
"""


def _point():
    return expand(parse_spec(SPEC, where="test"))[0]


def _needs_namespaces():
    reason = namespaces_unavailable()
    if reason:
        pytest.skip(f"namespaced hosts unavailable: {reason}")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    _needs_namespaces()
    tb = Testbed(lab=LAB, workdir=tmp_path_factory.mktemp("lab"))
    tb.up(_point())
    yield tb
    tb.down()


def _spawn(host: Host, code: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(host.wrap([sys.executable, "-c", code]), start_new_session=True, **kw)


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.kill()
    p.wait(timeout=10)


def _usage_ns(tb: Testbed, host: str) -> int:
    return int(Path(f"/sys/fs/cgroup/cpuacct/{tb.hosts[host].cgroup}/cpuacct.usage").read_text())


# --- limits ------------------------------------------------------------------------------------


def test_cpu_quota_is_enforced_and_the_monitor_sees_it(lab, tmp_path):
    """A busy loop in a host with a 20 % quota gets 20 % +- 3 % of a core (cpuacct over ~3 s);
    the monitor at 50 ms reports the same, and its own cost stays under 2 % of one core."""
    mon = lab.start_monitor(0.05, tmp_path / "resources.parquet")
    burner = _spawn(lab.hosts["db1"], "while True: pass")
    try:
        time.sleep(0.5)  # let the first quota periods settle
        u0, t0, w0 = _usage_ns(lab, "db1"), time.monotonic_ns(), time.time_ns()
        time.sleep(3.0)
        u1, t1, w1 = _usage_ns(lab, "db1"), time.monotonic_ns(), time.time_ns()
    finally:
        _stop(burner)
    table = mon.stop()
    share = (u1 - u0) / (t1 - t0)
    print(f"\ncpu share under a 0.2-core quota: {share:.3f} cores")
    assert share == pytest.approx(0.20, abs=0.03)

    df = table.to_pandas()
    during = df[(df.ts_ns > w0 + 50_000_000) & (df.ts_ns <= w1)]
    db = during[during.host == "db1"]
    cpu = db[db.metric.isin(["cpu_user", "cpu_system"])].groupby("ts_ns").value.sum()
    util = db[db.metric == "cpu_util"].set_index("ts_ns").value.sort_index()
    # samples are rates over unequal intervals (the loop wakes when it can): weight by interval
    dt = np.diff(np.concatenate([[cpu.index[0] - 50_000_000], cpu.index.values])).astype(float)
    cpu_mean = float((cpu.values * dt).sum() / dt.sum())
    util_mean = float((util.values * dt).sum() / dt.sum())
    print(
        f"monitor: db1 cpu {cpu_mean:.1f} % of a core over {len(cpu)} samples of 50 ms "
        f"(max {cpu.max():.0f} %: the 20 ms quota of each 100 ms period is spent in one burst)"
    )
    assert len(cpu) >= 50  # 3 s at 50 ms = 60 samples
    assert cpu_mean == pytest.approx(20.0, abs=3.0)
    assert util_mean == pytest.approx(100.0, abs=15.0)  # 20 % of a core = the whole allowance
    # At 50 ms the quota's bursts often show (samples near 40 % and near 0), but how the kernel
    # spreads a 20 ms allowance inside each 100 ms period varies from run to run (seen: 16-24 %
    # in every sample), so the shape is printed above, not asserted; the means are the claim.
    # a busy loop under a quota is throttled in every 100 ms CFS period: ~30 in 3 s
    periods = db[db.metric == "cpu_quota_periods"].value.sum()
    assert 10 <= periods <= 35  # most of the 30 periods (fewer when the machine itself is busy)
    assert db[db.metric == "cpu_quota"].value.mean() > 5
    idle = during[(during.host == "app1") & (during.metric == "cpu_user")].value
    assert idle.mean() < 2.0  # nothing runs in app1
    cost = mon.summary["cost_percent_core"]
    print(
        f"monitor cost at 50 ms, {len(lab.hosts)} hosts: {cost:.2f} % of one core "
        f"({mon.summary['samples']} samples, {mon.summary['late']} late)"
    )
    assert (df.metric == "monitor_cpu").sum() == 1
    assert cost < 2.0
    assert mon.summary["late"] <= 3


def test_memory_hog_is_contained(lab):
    """A process touching 256 MiB in a 64 MiB host is killed by the OOM killer, and the group
    never went past its limit."""
    code = (
        "import sys\nchunks=[]\n"
        "for i in range(256):\n"
        "    chunks.append(bytearray(1 << 20))\n"
        "print('survived', flush=True)\n"
    )
    memdir = Path(f"/sys/fs/cgroup/memory/{lab.hosts['db1'].cgroup}")
    (memdir / "memory.max_usage_in_bytes").write_text("0")
    hog = _spawn(lab.hosts["db1"], code, stdout=subprocess.PIPE)
    out, _ = hog.communicate(timeout=60)
    limit = int((memdir / "memory.limit_in_bytes").read_text())
    peak = int((memdir / "memory.max_usage_in_bytes").read_text())
    assert limit == 64 * 2**20
    assert b"survived" not in out
    assert hog.returncode == -signal.SIGKILL
    assert peak <= limit
    oom = dict(line.split() for line in (memdir / "memory.oom_control").read_text().splitlines())
    assert int(oom.get("oom_kill", "1")) >= 1


# --- the bridge --------------------------------------------------------------------------------


def test_bridge_connects_hosts_and_the_monitor_counts_the_bytes(lab, tmp_path):
    """An HTTP transfer of a 4 MiB file from web1 to client1 arrives intact, and the monitor's
    network bytes for web1 (tx) and client1 (rx) add up to the payload plus TCP/IP overhead."""
    payload = random.Random(5).randbytes(4 * 2**20)
    (tmp_path / "blob").write_bytes(payload)
    web = lab.hosts["web1"]
    server = subprocess.Popen(
        web.wrap([sys.executable, "-m", "http.server", "8000", "--bind", web.address,
                  "--directory", str(tmp_path)]),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    mon = None
    try:
        deadline = time.monotonic() + 10
        fetch = (
            "import sys, urllib.request, time\n"
            f"url = 'http://{web.address}:8000/blob'\n"
            "for i in range(100):\n"
            "    try:\n"
            "        data = urllib.request.urlopen(url, timeout=5).read(); break\n"
            "    except OSError:\n"
            "        time.sleep(0.1)\n"
            "sys.stdout.buffer.write(data)\n"
        )
        # wait for the server (the probe's bytes come before the monitor starts)
        while time.monotonic() < deadline:
            probe = subprocess.run(lab.hosts["client1"].wrap(
                [sys.executable, "-c", f"import socket; socket.create_connection(('{web.address}', 8000), 1)"]),
                capture_output=True)  # fmt: skip
            if probe.returncode == 0:
                break
            time.sleep(0.1)
        mon = lab.start_monitor(0.1, tmp_path / "resources.parquet")
        time.sleep(0.3)
        got = subprocess.run(lab.hosts["client1"].wrap([sys.executable, "-c", fetch]),
                             capture_output=True, timeout=60)  # fmt: skip
        time.sleep(0.5)
        table = mon.stop()
    finally:
        if mon is not None and mon.proc is not None:
            mon.stop()
        _stop(server)
    assert got.returncode == 0, got.stderr.decode()[-500:]
    assert got.stdout == payload

    df = table.to_pandas().sort_values("ts_ns")

    def total_bytes(host, metric):
        rows = df[(df.host == host) & (df.metric == metric)]
        dt = np.diff(np.concatenate([[rows.ts_ns.iloc[0] - 100_000_000], rows.ts_ns.values])) / 1e9
        return float((rows.value.values * dt).sum())

    sent = total_bytes("web1", "net_tx_bytes")
    received = total_bytes("client1", "net_rx_bytes")
    n = len(payload)
    print(
        f"\n4 MiB over the bridge: web1 tx {sent:.0f} B, client1 rx {received:.0f} B "
        f"({100 * (sent / n - 1):.1f} % overhead)"
    )
    for value in (sent, received):
        assert n <= value <= n * 1.10  # payload + headers of ~3,000 segments and the HTTP exchange
    assert total_bytes("app1", "net_tx_bytes") < 20_000  # app1 was not involved


def test_the_monitor_sees_memory_in_use_and_established_connections(lab, tmp_path):
    """db1 (64 MiB) holds 24 MiB it touched; client1 holds 5 TCP connections to a server in web1.
    The monitor's working set of db1 covers the 24 MiB and its memory utilisation is that over
    64 MiB; its mem_usage matches the cgroup's own counter read by the test; web1 and client1 each
    count exactly 5 established connections, app1 none."""
    web = lab.hosts["web1"]
    server = _spawn(web, "import socket, time\n"
                         f"s = socket.create_server(('{web.address}', 8100), backlog=16)\n"
                         "held = []\n"
                         "while True:\n    held.append(s.accept()[0])\n",
                    stdout=subprocess.DEVNULL)  # fmt: skip
    client = hog = None
    try:
        hog = _spawn(lab.hosts["db1"], "import sys, time\nb = bytearray(24 << 20)\n"
                                       "for i in range(0, len(b), 4096): b[i] = 1\n"
                                       "print('ready', flush=True)\ntime.sleep(60)\n",
                     stdout=subprocess.PIPE, text=True)  # fmt: skip
        # no probe connection: a server that holds what it accepts keeps a closed one in
        # CLOSE_WAIT, which the kernel's CurrEstab counts
        client = _spawn(lab.hosts["client1"], "import socket, time\n"
                                              "held = []\n"
                                              "while len(held) < 5:\n"
                                              "    try:\n"
                                              f"        held.append(socket.create_connection(('{web.address}', 8100), 1))\n"
                                              "    except OSError: time.sleep(0.05)\n"
                                              "print('ready', flush=True)\ntime.sleep(60)\n",
                        stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert hog.stdout.readline().strip() == "ready"
        assert client.stdout.readline().strip() == "ready"
        mon = lab.start_monitor(0.1, tmp_path / "resources.parquet")
        time.sleep(1.0)
        memdir = Path(f"/sys/fs/cgroup/memory/{lab.hosts['db1'].cgroup}")
        usage = int((memdir / "memory.usage_in_bytes").read_text())
        time.sleep(0.3)
        df = mon.stop().to_pandas()
    finally:
        for p in (client, hog, server):
            if p is not None:
                _stop(p)
    med = df.groupby(["host", "metric"]).value.median()
    print(
        f"\ndb1 working set {med['db1', 'mem_working_set'] / 2**20:.1f} MiB, mem_util {med['db1', 'mem_util']:.1f} %; "
        f"established: web1 {med['web1', 'sockets_established']:.0f}, client1 {med['client1', 'sockets_established']:.0f}"
    )
    assert 24 * 2**20 <= med["db1", "mem_working_set"] <= 64 * 2**20
    db = df[df.host == "db1"].pivot_table(index="ts_ns", columns="metric", values="value")
    np.testing.assert_allclose(db.mem_util, db.mem_working_set * 100 / (64 * 2**20), rtol=1e-9)
    assert med["db1", "mem_usage"] == pytest.approx(usage, abs=2 * 2**20)
    assert (df[(df.host == "db1") & (df.metric == "mem_swap")].value == 0).all()  # the machine has no swap in use
    for host in ("web1", "client1"):
        assert (df[(df.host == host) & (df.metric == "sockets_established")].value == 5).all()
    assert (df[(df.host == "app1") & (df.metric == "sockets_established")].value == 0).all()


def test_every_host_has_its_own_namespace_address_and_cgroup(lab):
    addrs = {h.address for h in lab.hosts.values()}
    assert addrs == {f"10.77.{LAB}.{i}" for i in range(2, 6)}
    assert list(lab.hosts) == ["web1", "app1", "db1", "client1"]
    for name, h in lab.hosts.items():
        out = subprocess.run(h.wrap(["ip", "-4", "-o", "addr", "show", "dev", "eth0"]),
                             capture_output=True, text=True, check=True)  # fmt: skip
        assert f"{h.address}/24" in out.stdout
        cg = subprocess.run(h.wrap(["cat", "/proc/self/cgroup"]), capture_output=True, text=True, check=True)
        assert f"cpu:/tierscope/{LAB}/{name}" in cg.stdout.replace("cpu,cpuacct", "cpu")
    quota = Path(f"/sys/fs/cgroup/cpu/tierscope/{LAB}/db1/cpu.cfs_quota_us").read_text().strip()
    period = Path(f"/sys/fs/cgroup/cpu/tierscope/{LAB}/db1/cpu.cfs_period_us").read_text().strip()
    assert (int(quota), int(period)) == (20_000, 100_000)
    assert Path(f"/sys/fs/cgroup/cpu/tierscope/{LAB}/client1/cpu.cfs_quota_us").read_text().strip() == "-1"


# --- interference ------------------------------------------------------------------------------


def test_pauses_stop_the_hosts_processes_and_are_recorded(lab, tmp_path):
    """A process stamping the clock every 5 ms shows gaps exactly where the events say it was
    stopped: 3 pauses of 200 ms every 500 ms."""
    stamps = tmp_path / "stamps"
    code = (
        "import time\n"
        f"f = open({str(stamps)!r}, 'w', buffering=1)\n"
        "while True:\n"
        "    f.write(f'{time.time_ns()}\\n'); time.sleep(0.005)\n"
    )
    ticker = _spawn(lab.hosts["app1"], code)
    try:
        time.sleep(0.3)
        pause = Pause(tier="app", period="500ms", duration="200ms", start="100ms")
        inj = PauseInjector("app1", pause, lambda: lab.pids("app1")).start()
        time.sleep(1.45)
        events = inj.stop().to_pylist()
        time.sleep(0.1)
    finally:
        _stop(ticker)
    assert len(events) == 3
    assert {e["kind"] for e in events} == {"injected_pause"}
    assert all(e["host"] == "app1" for e in events)
    for e in events:
        # at least the planned 200 ms; a loaded machine may wake the injector a little late
        assert 195 <= (e["end_ns"] - e["start_ns"]) / 1e6 <= 300
        assert "of 1 processes" in e["detail"]
    t = np.array([int(x) for x in stamps.read_text().split()])
    gaps = np.diff(t)
    long = gaps > 100e6
    assert long.sum() == 3  # the ticker stopped exactly three times
    for e, before, after in zip(events, t[:-1][long], t[1:][long]):
        # each gap lies around a recorded pause: stopped after its last stamp, resumed at SIGCONT
        assert before <= e["start_ns"] + 5e6
        assert abs(after - e["end_ns"]) < 40e6
        assert (after - before) / 1e6 == pytest.approx((e["end_ns"] - e["start_ns"]) / 1e6, abs=40)


def test_noisy_neighbour_burns_its_mean_demand_in_the_host(lab, tmp_path):
    """A Poisson (I = 1) burner asking 0.1 cores in the 1-core app1 uses 0.1 +- 0.03 cores."""
    from tierscope.spec import NoisyNeighbour
    from tierscope.testbed.interference import NoisyNeighbourProcess

    nn = NoisyNeighbourProcess(
        lab.hosts["app1"], NoisyNeighbour(tier="app", utilization=0.1, burstiness=1.0), tmp_path, seed=3
    ).start()
    try:
        time.sleep(0.5)
        u0, t0 = _usage_ns(lab, "app1"), time.monotonic_ns()
        time.sleep(3.0)
        u1, t1 = _usage_ns(lab, "app1"), time.monotonic_ns()
        assert nn.pid in lab.pids("app1")
    finally:
        events = nn.stop()
    share = (u1 - u0) / (t1 - t0)
    print(f"\nburner asking 0.1 cores used {share:.3f} cores")
    assert share == pytest.approx(0.10, abs=0.03)
    assert events.num_rows == 1  # I = 1: one ON period spanning the whole run
    assert events.column("kind").to_pylist() == ["noisy_neighbour_burst"]


def test_burner_schedule_has_the_requested_mean_and_index_of_dispersion():
    """Arithmetic, no root: counts of the MMPP schedule in 5 s windows have mean u/job per second
    and variance/mean = I."""
    for burstiness in (1.0, 20.0):
        lam, on, off = mmpp_periods(0.3, burstiness, 0.001)
        horizon, w = 2000.0, 5.0
        times = []
        for kind, t in work_arrivals(random.Random(11), lam, on, off):
            if t > horizon:
                break
            if kind == "job":
                times.append(t)
        counts = np.histogram(times, bins=np.arange(0, horizon + w / 2, w))[0]
        assert len(times) / horizon == pytest.approx(300, rel=0.05)
        assert counts.var() / counts.mean() == pytest.approx(burstiness, rel=0.25)


# --- without root ------------------------------------------------------------------------------


def test_loopback_fallback_gives_each_host_an_address_and_says_what_is_lost(tmp_path):
    with Testbed(lab=LAB, workdir=tmp_path, mode="loopback") as tb:
        hosts = tb.up(_point())
        assert tb.mode == "loopback"
        assert [h.address for h in hosts.values()] == [f"127.77.{LAB}.{i}" for i in range(2, 6)]
        assert all(h.netns is None and h.cgroup is None for h in hosts.values())
        assert any("no CPU, memory or disk limits" in x for x in tb.lost)
        assert "lost:" in tb.describe()
        assert tb.capture_interface == "lo"
        assert tb.monitor_targets() == []
        web = hosts["web1"]
        server = subprocess.Popen(
            web.wrap([sys.executable, "-m", "http.server", "8011", "--bind", web.address,
                      "--directory", str(tmp_path)]),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            (tmp_path / "hello").write_text("hello")
            for _ in range(100):
                try:
                    body = urllib.request.urlopen(f"http://{web.address}:8011/hello", timeout=2).read()
                    break
                except OSError:
                    time.sleep(0.05)
            assert body == b"hello"
        finally:
            _stop(server)
        with pytest.raises(Exception) as info:
            tb.start_interference(expand(parse_spec(
                SPEC + '[[interference.pause]]\ntier="app"\nperiod="1s"\nduration="100ms"\n'))[0])  # fmt: skip
        assert "loopback fallback" in str(info.value)
    assert not tb.state_file.exists()


def test_host_wrap_joins_cgroups_before_entering_the_namespace():
    h = Host(name="db1", address="10.77.0.4", netns="tierscope0-db1", cgroup="tierscope/0/db1")
    argv = h.wrap(["postgres", "-D", "x"])
    assert argv[0] == "sh"
    assert argv[argv.index("tierscope-host") + 1 :] == ["ip", "netns", "exec", "tierscope0-db1", "postgres", "-D", "x"]
    assert "/sys/fs/cgroup/cpuacct/tierscope/0/db1/cgroup.procs" in argv[2]
    assert Host.loopback().wrap(["true"]) == ["true"]


# --- disk limits, machine metrics, cleanup on signals ------------------------------------------

DISK_SPEC = """
topology = "1/1/0/1X"
[node_types.X]
disk_write_bps = "10MB"
disk_read_iops = 200
[workload]
users = [1]
"""


def test_disk_limits_are_enforced_and_the_monitor_counts_the_operations(tmp_path_factory):
    """10 MiB written with O_DIRECT at a 10 MB/s limit take about 1.05 s; 200 direct reads at
    200 IOPS about 1 s; the monitor's disk bytes and operations add up to what dd did."""
    _needs_namespaces()
    work = Path(tempfile.mkdtemp(prefix="tierscope-disk-", dir="/var/tmp"))
    try:
        with Testbed(lab=LAB2, workdir=work) as tb:
            h = tb.up(expand(parse_spec(DISK_SPEC))[0])["db1"]
            mon = tb.start_monitor(0.1, work / "resources.parquet")
            t0 = time.monotonic()
            w = subprocess.run(h.wrap(["dd", "if=/dev/zero", f"of={work}/f", "bs=1M", "count=10",
                                       "oflag=direct"]), capture_output=True, text=True)  # fmt: skip
            t_write = time.monotonic() - t0
            if w.returncode != 0 and "Invalid argument" in w.stderr:
                pytest.skip(f"O_DIRECT not supported on {work}")
            assert w.returncode == 0, w.stderr
            t0 = time.monotonic()
            r = subprocess.run(h.wrap(["dd", f"if={work}/f", "of=/dev/null", "bs=4k", "count=200",
                                       "iflag=direct"]), capture_output=True, text=True)  # fmt: skip
            t_read = time.monotonic() - t0
            assert r.returncode == 0, r.stderr
            time.sleep(0.3)
            df = mon.stop().to_pandas()
    finally:
        subprocess.run(["rm", "-rf", str(work)])
    print(f"\n10 MiB at 10 MB/s: {t_write:.2f} s; 200 reads at 200 IOPS: {t_read:.2f} s")
    assert 0.85 <= t_write <= 2.5
    assert 0.8 <= t_read <= 2.5
    db = df[df.host == "db1"].sort_values("ts_ns")

    def total(metric):
        rows = db[db.metric == metric]
        return float(rows.value.sum() * 0.1)  # rates x the 100 ms interval

    written = total("disk_write_bytes")
    assert written == pytest.approx(10 * 2**20, rel=0.15)
    assert 195 <= total("disk_read_ops") <= 260  # dd's 200 reads (+ loading dd if not cached)
    # the disk's utilisation against its limits: about 100 % while dd ran (10 MB/s of 10 MB/s,
    # then 200 of 200 IOPS), and the per-sample arithmetic from the rates and the limits
    wide = db.pivot_table(index="ts_ns", columns="metric", values="value")
    busy = wide[(wide.disk_write_bytes > 0) | (wide.disk_read_ops > 0)]
    expect = np.maximum(busy.disk_write_bytes / 10e6, busy.disk_read_ops / 200) * 100
    np.testing.assert_allclose(busy.disk_util, expect, rtol=1e-9)
    print(f"db1 disk_util while dd ran: median {busy.disk_util.median():.0f} % over {len(busy)} samples")
    assert len(busy) >= 12  # ~2 s of I/O at 100 ms
    assert 70 <= busy.disk_util.median() <= 130


def test_machine_cpu_is_recorded_without_hosts(tmp_path):
    """The monitor with no hosts (the loopback fallback) still records machine-wide CPU: a busy
    loop shows up as at least 80 % of a core."""
    from tierscope.testbed.monitor import Monitor

    mon = Monitor([], 0.1, tmp_path / "r.parquet").start()
    burner = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()+1.5\nwhile time.time()<t: pass"])
    burner.wait(timeout=30)
    df = mon.stop().to_pandas()
    m = df[df.host == "machine"].groupby("ts_ns").value.sum()
    assert set(df.host) == {"machine", "monitor"}
    assert m.max() >= 80.0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_killed_run_leaves_no_hosts_behind(sig, tmp_path):
    """Ctrl-C (SIGINT) or SIGTERM to a process holding a testbed removes its hosts."""
    _needs_namespaces()
    code = (
        "import sys, time\n"
        "from tierscope.spec import expand, parse_spec\n"
        "from tierscope.testbed.lab import Testbed\n"
        f"tb = Testbed(lab={LAB2}, workdir={str(tmp_path)!r})\n"
        f"tb.up(expand(parse_spec({SPEC!r}))[0])\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "up", p.stderr.read() if p.poll() is not None else ""
        assert Path(f"/run/netns/tierscope{LAB2}-db1").exists()
        p.send_signal(sig)
        # usually under half a second, but once in a full suite (2026-11-29) more than 30 s (cause
        # not found; alone it took 0.42-0.47 s in eight runs). The removal runs `ip` several times,
        # each allowed 20 s: what is checked is that nothing is left behind, not how fast
        p.wait(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode != 0, p.stderr.read()  # it ended by the signal, not by its own end
    assert not [n for n in os.listdir("/run/netns") if n.startswith(f"tierscope{LAB2}-")]
    assert not Path(f"/sys/class/net/tsbr{LAB2}").exists()
    assert not Path(f"/sys/fs/cgroup/cpu/tierscope/{LAB2}").exists()


def test_auto_mode_falls_back_to_loopback_and_names_the_reason(tmp_path, monkeypatch):
    """Where namespaces are refused (here: told so), auto mode builds loopback hosts and keeps the
    reason; mode="namespaces" refuses instead."""
    import tierscope.testbed.lab as labmod

    monkeypatch.setattr(labmod, "namespaces_unavailable", lambda: "`ip netns add` was refused: EPERM")
    with Testbed(lab=LAB2, workdir=tmp_path) as tb:
        tb.up(_point())
        assert tb.mode == "loopback"
        assert tb.fallback_reason == "`ip netns add` was refused: EPERM"
        assert "fallback because: `ip netns add` was refused" in tb.describe()
    with pytest.raises(labmod.TestbedError) as info:
        Testbed(lab=LAB2, workdir=tmp_path, mode="namespaces").up(_point())
    assert "cannot build namespaced hosts: `ip netns add` was refused" in str(info.value)


def test_a_capture_on_the_bridge_sees_traffic_between_hosts(lab, tmp_path):
    """tcpdump on the lab bridge (promiscuous) sees both directions of a client1 -> web1 exchange:
    one clock for every tier."""
    import shutil

    if not shutil.which("tcpdump"):
        pytest.skip("tcpdump is not installed (apt install tcpdump)")
    web, client = lab.hosts["web1"], lab.hosts["client1"]
    server = subprocess.Popen(
        web.wrap([sys.executable, "-m", "http.server", "8001", "--bind", web.address, "--directory", str(tmp_path)]),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    cap = subprocess.Popen(
        ["tcpdump", "-i", lab.capture_interface, "-nn", "-l", "-c", "4", "tcp port 8001 and tcp[tcpflags] & tcp-syn != 0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        time.sleep(1.0)  # tcpdump attaches; the server binds
        fetch = f"import urllib.request\nfor i in range(2): urllib.request.urlopen('http://{web.address}:8001/').read()"
        subprocess.run(client.wrap([sys.executable, "-c", fetch]), check=True, capture_output=True, timeout=30)
        out, _ = cap.communicate(timeout=10)
    finally:
        if cap.poll() is None:
            cap.kill()
            cap.wait()
        _stop(server)
    lines = out.splitlines()
    assert len(lines) == 4  # SYN and SYN-ACK of two connections
    assert sum(f"{client.address}." in line.split(">")[0] for line in lines) == 2
    assert sum(f"{web.address}.8001 >" in line for line in lines) == 2


def test_a_lab_left_by_a_dead_process_is_reclaimed(tmp_path):
    """kill -9 leaves the hosts behind; the next Testbed on that lab removes them and builds anew,
    while a lab left up on purpose (`tierscope testbed up`) is refused, not taken."""
    _needs_namespaces()
    code = (
        "import time\n"
        "from tierscope.spec import expand, parse_spec\n"
        "from tierscope.testbed.lab import Testbed\n"
        f"Testbed(lab={LAB2}, workdir={str(tmp_path)!r}).up(expand(parse_spec({SPEC!r}))[0])\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "up"
    p.kill()
    p.wait()
    assert Path(f"/run/netns/tierscope{LAB2}-db1").exists()  # left behind
    with Testbed(lab=LAB2, workdir=tmp_path) as tb:
        tb.up(_point())
        assert tb.mode == "namespaces" and len(tb.hosts) == 4
        tb.detach()  # now it is left up on purpose
    try:
        with pytest.raises(Exception) as info:
            Testbed(lab=LAB2, workdir=tmp_path).up(_point())
        assert "already up" in str(info.value)
    finally:
        Testbed.from_state(LAB2).down()
    assert not Path(f"/run/netns/tierscope{LAB2}-db1").exists()


def test_start_interference_runs_the_points_pauses_and_neighbours(lab, tmp_path):
    """The runner's entry point: a point's pauses (app tier) and noisy neighbour (db1) start in the
    right hosts and come back as one events table."""
    extra = (
        '[[interference.pause]]\ntier = "app"\nperiod = "400ms"\nduration = "100ms"\nstart = "100ms"\n'
        '[[interference.noisy_neighbour]]\nserver = "db1"\nutilization = 0.05\nburstiness = 1\n'
    )
    point = expand(parse_spec(SPEC + extra))[0]
    sleeper = _spawn(lab.hosts["app1"], "import time; time.sleep(30)")
    try:
        time.sleep(0.2)
        running = lab.start_interference(point, seed=1)  # returns once the burner runs
        t0 = time.monotonic()
        burner_pids = [b.pid for b in running.burners]
        assert burner_pids and burner_pids[0] in lab.pids("db1")
        time.sleep(1.0)
        elapsed = time.monotonic() - t0
        events = running.stop().to_pylist()
    finally:
        _stop(sleeper)
    kinds = [e["kind"] for e in events]
    expected = int((elapsed - 0.1) // 0.4) + 1  # pauses start at 0.1 s, 0.5 s, 0.9 s, ...
    assert kinds.count("injected_pause") in (expected - 1, expected)
    assert kinds.count("noisy_neighbour_burst") == 1
    assert {e["host"] for e in events if e["kind"] == "injected_pause"} == {"app1"}
    assert all("of 1 processes" in e["detail"] for e in events if e["kind"] == "injected_pause")
    assert not [p for p in burner_pids if Path(f"/proc/{p}").exists()]


def test_monitor_series_turn_counters_into_rates_and_break_at_gaps():
    """Arithmetic on the monitor's bulk conversion: counters sampled at known times give the
    rates by hand, a series continues across flushes, and a failed read breaks it."""
    from tierscope.testbed.monitor import _Series, _table

    class Counter:
        name = "h1"

        def __init__(self):
            self.values = iter([0, 10, 30, 60, 100, 150])

        def read(self):
            return (next(self.values),)

        def metrics(self):
            return [("x_rate", "per_s", lambda d, c, dt: d[:, 0] / dt),
                    ("x_level", "count", lambda d, c, dt: c[:, 0])]  # fmt: skip

    ser = _Series(Counter())
    out: list = []
    ser.sample(0)
    ser.sample(100_000_000)  # +10 in 0.1 s
    ser.drain(out)
    ser.sample(300_000_000)  # +20 in 0.2 s, across a flush
    ser.gap()  # a failed read: no rate across it
    ser.sample(400_000_000)  # 60
    ser.sample(500_000_000)  # 100: +40 in 0.1 s
    ser.drain(out)
    t = _table(out).to_pylist()
    rate = [(r["ts_ns"], r["value"]) for r in t if r["metric"] == "x_rate"]
    assert rate == [(100_000_000, pytest.approx(100.0)), (300_000_000, pytest.approx(100.0)),
                    (500_000_000, pytest.approx(400.0))]  # fmt: skip
    assert [r["value"] for r in t if r["metric"] == "x_level"] == [10.0, 30.0, 100.0]
    assert {r["host"] for r in t} == {"h1"} and {r["unit"] for r in t} == {"per_s", "count"}


def test_two_runs_started_together_choose_different_free_labs(tmp_path):
    """`Testbed(lab=None)` (what `tierscope run` builds) picks its lab as it builds, one chooser at a
    time: two processes that both saw the same first free lab at construction still come up on two
    labs, both at once. (Choosing at construction made the second fail with "lab N is already up":
    two benches of the smoke run, 2026-11-28.)"""
    _needs_namespaces()
    go = tmp_path / "go"
    code = (
        "import os, sys, time\n"
        "from tierscope.testbed.lab import Testbed\n"
        "tb = Testbed(lab=None, workdir=sys.argv[1])\n"
        "print(tb.lab, flush=True)\n"  # the guess at construction
        f"while not os.path.exists({str(go)!r}): time.sleep(0.005)\n"
        "tb.up_hosts([('web1', None), ('db1', None)])\n"
        "print(tb.lab, flush=True)\n"
        "sys.stdin.readline()\n"  # stays up until the test has seen both
        "tb.down()\n"
        "print('down', flush=True)\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path / f"w{i}")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    try:
        guesses = [int(p.stdout.readline()) for p in procs]
        assert guesses[0] == guesses[1]  # both saw the same first free lab
        go.touch()
        lines = [p.stdout.readline().strip() for p in procs]
        assert all(ln.isdigit() for ln in lines), [p.stderr.read() for p in procs if p.poll() is not None]
        labs = [int(ln) for ln in lines]
        assert labs[0] != labs[1]
        for lab in labs:  # both up at once
            assert Path(f"/run/netns/tierscope{lab}-db1").exists()
        for p in procs:
            p.stdin.write("\n")
            p.stdin.flush()
        assert [p.stdout.readline().strip() for p in procs] == ["down", "down"]
        for lab in labs:
            assert not Path(f"/run/netns/tierscope{lab}-db1").exists()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
