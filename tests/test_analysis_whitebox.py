"""The white box beyond CPU, on resources tables whose answers are known by construction: a
disk-bound database, a socket-bound app server, the CPU quota as a resource, the bottleneck map
naming tier and resource, one host at 50 ms and re-aggregated to 1 s, and the monitor's arithmetic
on cgroup files written by the test (no root needed)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tierscope.analysis.bottleneck_map import ConfigurationResult, bottleneck_map, primary_bottleneck
from tierscope.analysis.whitebox import (
    bound_words,
    density,
    density_peaks,
    hardware_first,
    resource_of,
    saturated_in_tiers,
    two_grains,
    utilisation_samples,
    whitebox,
)

S = 1_000_000_000
MS = 1_000_000


def _table(series: dict[tuple[str, str, str], np.ndarray], interval_ns: int = S) -> pa.Table:
    """A resources table: (host, metric, unit) -> values sampled every `interval_ns`."""
    rows: dict[str, list] = {"ts_ns": [], "host": [], "metric": [], "value": [], "unit": []}
    for (host, metric, unit), values in series.items():
        n = len(values)
        rows["ts_ns"] += [(i + 1) * interval_ns for i in range(n)]
        rows["host"] += [host] * n
        rows["metric"] += [metric] * n
        rows["value"] += [float(v) for v in values]
        rows["unit"] += [unit] * n
    return pa.table(rows)


# --- a disk-bound database --------------------------------------------------------------------


def _disk_bound_points(rng) -> list[tuple[float, pa.Table]]:
    """db1's disk utilisation rises with the workload and is pinned above 95 % at 300 and 400
    users; its CPU stays near 40 %, the app server's near 30 %."""
    points = []
    for users, disk_mean in ((50, 20.0), (100, 45.0), (200, 80.0), (300, 99.0), (400, 99.5)):
        n = 240
        disk = rng.normal(disk_mean, 0.6 if disk_mean > 95 else 6.0, n)
        points.append((users, _table({
            ("db1", "disk_util", "percent"): np.minimum(disk, 100.0),
            ("db1", "cpu_util", "percent"): rng.normal(40, 4, n),
            ("app1", "cpu_util", "percent"): rng.normal(30, 4, n),
            ("db1", "disk_write_ops", "ops_per_s"): rng.normal(180, 10, n),  # a rate: not in the densities
        })))  # fmt: skip
    return points


def test_a_disk_bound_database_is_named_by_its_disk_not_its_cpu():
    wb = whitebox(_disk_bound_points(np.random.default_rng(11)))
    for users in (300.0, 400.0):
        assert wb.saturated[users] == [("db1", "disk_util")]  # the disk, and not db1's CPU at 40 %
    for users in (50.0, 100.0, 200.0):
        assert wb.saturated[users] == []
    shares = {(r["users"], r["host"], r["metric"]): r for r in wb.shares.to_pylist()}
    assert shares[(400.0, "db1", "disk_util")]["share_above"] > 0.9
    assert shares[(400.0, "db1", "cpu_util")]["share_above"] == 0.0
    assert shares[(400.0, "db1", "cpu_util")]["mean"] == pytest.approx(40, abs=1.5)
    # a rate without a ceiling stays out of the densities
    assert not [k for k in shares if k[2] == "disk_write_ops"]
    # the disk's density at 400 users peaks in the top five percent
    d = wb.density.filter(pa.compute.and_(pa.compute.equal(wb.density["users"], 400.0),
                                          pa.compute.equal(wb.density["metric"], "disk_util")))  # fmt: skip
    assert density_peaks(d["density"].to_numpy())[-1] >= 97.0

    # the cross-check of a verdict that names db: disk-bound
    cross = saturated_in_tiers(wb.shares, ["db", "app"], 400)
    assert [(s.host, s.metric, s.resource) for s in cross["db"]] == [("db1", "disk_util", "disk")]
    assert cross["app"] == []
    assert bound_words("db", cross["db"]) == "db, disk-bound"
    assert bound_words("app", cross["app"]) == "app"
    # at a level where nothing was saturated, the verdict's tier gets nothing
    assert saturated_in_tiers(wb.shares, ["db"], 100) == {"db": []}

    # the report's summary: the verdict's tier as the white box saw it, at the analysed level
    from types import SimpleNamespace

    from tierscope.analysis.experiment import Analysis
    from tierscope.analysis.summary import bound_tiers

    data = Analysis(
        title="t",
        blackbox={"1/1/1": SimpleNamespace(max_throughput_users=400.0)},
        whitebox={"1/1/1": wb},
        focus_config="1/1/1",
        fine_users=300.0,
    )
    assert bound_tiers(data, ["db", "app"]) == {"db": "db, disk-bound"}
    data.fine_users = 100.0  # nothing saturated where the fine-grained analysis looked: the maximum's level
    assert bound_tiers(data, ["db"]) == {"db": "db, disk-bound"}
    assert bound_tiers(data, ["app"]) == {}


def test_disk_operations_against_an_iops_limit_become_the_disk_utilisation():
    """A database with a 200 IOPS limit doing 198 writes/s in 70 % of the seconds and 100 in the
    rest: 99 % and 50 % of its disk, so its share above 95 % is 0.7 exactly; reads at 20/s against
    the same limit are 10 % and lose the per-sample maximum."""
    n = 100
    writes = np.where(np.arange(n) % 10 < 7, 198.0, 100.0)
    res = _table({("db1", "disk_write_ops", "ops_per_s"): writes,
                  ("db1", "disk_read_ops", "ops_per_s"): np.full(n, 20.0),
                  ("db1", "cpu_util", "percent"): np.full(n, 40.0)})  # fmt: skip
    limits = {("db1", "disk_write_ops"): 200, ("*", "disk_read_ops"): 200}
    x = utilisation_samples(res, limits)
    assert sorted(x) == [("db1", "cpu_util"), ("db1", "disk_util")]
    np.testing.assert_allclose(x[("db1", "disk_util")], writes / 2)
    wb = whitebox([(300, res)], limits=limits)
    share = {r["metric"]: r["share_above"] for r in wb.shares.to_pylist()}
    assert share == {"cpu_util": 0.0, "disk_util": pytest.approx(0.7)}
    assert wb.saturated[300.0] == [("db1", "disk_util")]
    # without the limit the operations are a rate only
    assert sorted(utilisation_samples(res)) == [("db1", "cpu_util")]
    with pytest.raises(ValueError, match="db1 disk_write_ops must be above 0"):
        utilisation_samples(res, {("db1", "disk_write_ops"): 0})


def test_a_host_that_reports_its_disk_utilisation_keeps_it():
    """A limit does not replace a utilisation the host measured itself."""
    res = _table({("db1", "disk_util", "percent"): np.full(10, 30.0),
                  ("db1", "disk_write_ops", "ops_per_s"): np.full(10, 200.0)})  # fmt: skip
    x = utilisation_samples(res, {("db1", "disk_write_ops"): 200})
    np.testing.assert_allclose(x[("db1", "disk_util")], 30.0)


# --- a socket-bound app server ----------------------------------------------------------------


def test_a_socket_bound_app_server_is_named_by_its_sockets():
    """app1's pool of 16 connections is full in 80 % of the samples (16 established) and holds 10
    in the rest; its CPU is at 50 %. Against the pool it is 100 % / 62.5 %: share 0.8."""
    n = 200
    estab = np.where(np.arange(n) % 5 < 4, 16.0, 10.0)
    res = _table({("app1", "sockets_established", "count"): estab,
                  ("app1", "cpu_util", "percent"): np.full(n, 50.0),
                  ("db1", "cpu_util", "percent"): np.full(n, 20.0),
                  ("app1", "net_tx_bytes", "bytes_per_s"): np.full(n, 1e6)})  # fmt: skip
    wb = whitebox([(150, res)], limits={("app1", "sockets_established"): 16})
    share = {(r["host"], r["metric"]): r["share_above"] for r in wb.shares.to_pylist()}
    assert share[("app1", "sockets_util")] == pytest.approx(0.8)
    assert share[("app1", "cpu_util")] == 0.0
    assert ("app1", "net_tx_bytes") not in share  # network bytes: a rate without a ceiling
    assert wb.saturated[150.0] == [("app1", "sockets_util")]
    cross = saturated_in_tiers(wb.shares, ["app"], 150)
    assert [s.resource for s in cross["app"]] == ["sockets"]
    assert cross["app"][0].share_above == pytest.approx(0.8)
    assert bound_words("app", cross["app"]) == "app, sockets-bound"


# --- the CPU quota ----------------------------------------------------------------------------


def test_a_throttled_host_is_the_resource_cpu_quota():
    """db1 at its quota: CPU (cpu_util) and CPU quota (cpu_quota) both pinned; both are named, as
    the resources "CPU" and "CPU quota", never as a resource called cpu_throttled."""
    n = 100
    res = _table({("db1", "cpu_util", "percent"): np.full(n, 99.0),
                  ("db1", "cpu_quota", "percent"): np.full(n, 97.0),
                  ("db1", "cpu_quota_periods", "count"): np.full(n, 10.0),
                  ("db1", "mem_util", "percent"): np.full(n, 30.0)})  # fmt: skip
    wb = whitebox([(200, res)])
    assert sorted(wb.saturated[200.0]) == [("db1", "cpu_quota"), ("db1", "cpu_util")]
    cross = saturated_in_tiers(wb.shares, ["db"], 200)
    assert sorted(s.resource for s in cross["db"]) == ["CPU", "CPU quota"]
    assert bound_words("db", cross["db"]) in ("db, CPU- and CPU quota-bound", "db, CPU quota- and CPU-bound")
    assert [resource_of(m) for m in ("cpu_quota", "cpu_util", "cpu", "disk_util", "disk_util_vda", "mem_util",
                                     "sockets_util", "net_rx_bytes")] == \
        ["CPU quota", "CPU", "CPU", "disk", "disk", "memory", "sockets", "net_rx_bytes"]  # fmt: skip

    from tierscope.analysis.summary import resource_name

    assert resource_name("cpu_quota") == "CPU quota"
    assert resource_name("disk_util") == "disk"


# --- the bottleneck map -----------------------------------------------------------------------


def test_the_bottleneck_map_names_tier_and_resource_per_configuration():
    results = [
        ConfigurationResult("1/1/0/1M", 300, {("db1", "disk_util"): 0.92, ("db1", "cpu_util"): 0.0,
                                              ("app1", "cpu_util"): 0.1}),
        ConfigurationResult("1/1/0/2M", 310, {("app1", "sockets_util"): 0.8, ("db1", "disk_util"): 0.6,
                                              ("db2", "disk_util"): 0.55}),
        ConfigurationResult("1/2/0/2M", 600, {("app1", "cpu_util"): 0.3, ("db1", "mem_util"): 0.2}),
        ConfigurationResult("big box", 650, {("db1", "cpu_quota"): 0.7}, counts={"db": 1, "app": 1}),
        ConfigurationResult("1/1/0/3M", 305, {("app1", "sockets_util"): 0.8, ("db1", "disk_util"): 0.45,
                                              ("db1", "cpu_util"): 0.3}),
    ]  # fmt: skip
    m = {r["config"]: r for r in bottleneck_map(results).to_pylist()}
    assert (m["1/1/0/1M"]["tier"], m["1/1/0/1M"]["resource"]) == ("db", "disk")
    assert m["1/1/0/1M"]["bottleneck"] == "db disk" and m["1/1/0/1M"]["bottleneck_metric"] == "db disk_util"
    # the sockets more often above 95 % (0.8) than the disk (0.6), but the disk saturated: the
    # hardware is the bottleneck, the connections its requests hold are a symptom (seed 004 §5)
    assert (m["1/1/0/2M"]["tier"], m["1/1/0/2M"]["resource"]) == ("db", "disk")
    assert m["1/1/0/2M"]["saturated"] == "app: sockets; db: disk"
    # the sockets saturated with no hardware resource saturated: the sockets
    assert (m["1/1/0/3M"]["tier"], m["1/1/0/3M"]["resource"]) == ("app", "sockets")
    assert m["1/2/0/2M"]["bottleneck"] is None and m["1/2/0/2M"]["resource"] is None
    assert m["1/2/0/2M"]["saturated"] is None
    assert m["big box"]["resource"] == "CPU quota"
    assert (m["big box"]["db"], m["big box"]["app"], m["big box"]["web"]) == (1, 1, None)
    assert (m["1/1/0/2M"]["db"], m["1/1/0/2M"]["app"]) == (2, 1)
    assert [m[c]["group"] for c in ("1/1/0/1M", "1/1/0/3M", "1/1/0/2M", "1/2/0/2M", "big box")] == [1, 1, 1, 2, 2]


# --- one host at two grains -------------------------------------------------------------------


def test_fifty_ms_bursts_vanish_at_one_second():
    """20 s of CPU at 50 ms: in every second one 100 ms burst at 100 % (2 samples, at a place that
    moves from second to second) and idle otherwise. Re-aggregated, every second is 10 % (2 of 20
    samples): no 1 s sample above 95 %, while 10 % of the 50 ms samples are."""
    rng = np.random.default_rng(3)
    values = np.zeros(400)
    for sec in range(20):
        at = int(rng.integers(0, 19))
        values[sec * 20 + at : sec * 20 + at + 2] = 100.0
    res = _table({("db1", "cpu_util", "percent"): values,
                  ("app1", "cpu_util", "percent"): np.full(400, 70.0)}, interval_ns=50 * MS)  # fmt: skip
    g = two_grains(res, "db1")
    assert (g.fine_interval_ns, g.coarse_interval_ns) == (50 * MS, S)
    assert g.fine.num_rows == 400
    assert g.coarse.num_rows == 20
    assert g.coarse["samples"].to_pylist() == [20] * 20
    np.testing.assert_allclose(g.coarse["value"].to_numpy(), 10.0)
    assert g.coarse["ts_ns"].to_pylist() == [(k + 1) * S for k in range(20)]
    assert g.coarse_share_above == 0.0
    assert g.fine_share_above == pytest.approx(40 / 400)


def test_two_grains_weights_samples_by_their_interval_and_keeps_whole_seconds():
    """Second 1 pinned at 100 %, second 2 at 0, then 0.4 s at 100: two whole seconds and a last
    one covered for less than half left out; a late sample (100 ms) weighs twice a 50 ms one."""
    values = np.concatenate([np.full(20, 100.0), np.full(20, 0.0), np.full(8, 100.0)])
    res = _table({("db1", "cpu_util", "percent"): values}, interval_ns=50 * MS)
    g = two_grains(res, "db1")
    assert g.coarse["value"].to_pylist() == [100.0, 0.0]
    assert g.coarse_share_above == 0.5 and g.fine_share_above == pytest.approx(28 / 48)
    # second 1: 18 samples of 50 ms at 0 %, then one of 100 ms at 100 %: 100 ms of 1 s busy
    ts = [k * 50 * MS for k in range(1, 19)] + [S]
    late = pa.table({"ts_ns": ts, "host": ["h"] * 19, "metric": ["cpu_util"] * 19,
                     "value": [0.0] * 18 + [100.0], "unit": ["percent"] * 19})  # fmt: skip
    g = two_grains(late, "h")
    assert g.coarse["value"].to_pylist() == [pytest.approx(10.0)]
    with pytest.raises(ValueError, match="db1 mem_util: expected at least two samples"):
        two_grains(res, "db1", "mem_util")
    with pytest.raises(ValueError, match="must be at least twice the sampling interval"):
        two_grains(res, "db1", coarse_ns=60 * MS)


# --- the monitor's arithmetic on cgroup files the test writes ----------------------------------


def _write_cgroup(root, usage_ns, user_ns, sys_ns, thr_ns, nthr, mem, inactive, majflt, wops, wbytes):
    cpu, acct, memory, blkio = (root / c for c in ("cpu", "cpuacct", "memory", "blkio"))
    for d in (cpu, acct, memory, blkio):
        d.mkdir(exist_ok=True)
    (acct / "cpuacct.usage").write_text(f"{usage_ns}\n")
    (acct / "cpuacct.usage_user").write_text(f"{user_ns}\n")
    (acct / "cpuacct.usage_sys").write_text(f"{sys_ns}\n")
    (cpu / "cpu.stat").write_text(f"nr_periods 100\nnr_throttled {nthr}\nthrottled_time {thr_ns}\n")
    (memory / "memory.usage_in_bytes").write_text(f"{mem}\n")
    (memory / "memory.limit_in_bytes").write_text(f"{64 * 2**20}\n")
    (memory / "memory.stat").write_text(f"cache 1\ntotal_inactive_file {inactive}\ntotal_pgmajfault {majflt}\n"
                                        f"total_swap 4096\n")  # fmt: skip
    (blkio / "blkio.throttle.io_serviced").write_text(
        f"254:0 Read 0\n254:0 Write {wops}\n254:0 Total {wops}\n7:0 Write 5\nTotal {wops + 5}\n"
    )
    (blkio / "blkio.throttle.io_service_bytes").write_text(
        f"254:0 Read 0\n254:0 Write {wbytes}\n254:0 Total {wbytes}\nTotal {wbytes}\n"
    )
    (blkio / "blkio.throttle.write_iops_device").write_text("254:0 200\n")
    (blkio / "blkio.throttle.write_bps_device").write_text("254:0 10000000\n")
    (blkio / "blkio.throttle.read_iops_device").write_text("")
    (blkio / "blkio.throttle.read_bps_device").write_text("")


def test_the_monitor_turns_cgroup_counters_into_disk_memory_and_quota_metrics(tmp_path):
    """Two samples 0.5 s apart of cgroup files with known counters: the rates, levels and
    utilisations follow by arithmetic (disk: 60 writes and 2.5 MB in 0.5 s against 200 IOPS and
    10 MB/s is 60 % and 50 %: 60 %)."""
    from tierscope.testbed.monitor import Target, _Host, _Series
    from tierscope.testbed.monitor import _table as rows_table

    _write_cgroup(tmp_path, 1_000, 600, 400, 0, 0, 40 * 2**20, 8 * 2**20, 7, 1000, 10**8)
    cg = {c: str(tmp_path / c) for c in ("cpu", "cpuacct", "memory", "blkio")}
    host = _Host(Target(name="db1", cgroups=cg, cores=0.5))
    ser = _Series(host)
    ser.sample(0)
    # 0.5 s later: 0.2 s of CPU (user:sys ticks 3:1), 0.1 s throttled in 4 periods, 16 MiB
    # working set growth, 30 major faults, 60 writes of 2.5 MB in all
    _write_cgroup(tmp_path, 1_000 + 200_000_000, 600 + 300, 400 + 100, 100_000_000, 4, 56 * 2**20, 8 * 2**20,
                  37, 1060, 10**8 + 2_500_000)  # fmt: skip
    ser.sample(500_000_000)
    out: list = []
    ser.drain(out)
    got = {r["metric"]: (r["value"], r["unit"]) for r in rows_table(out).to_pylist()}
    assert got["cpu_util"] == (pytest.approx(80.0), "percent")  # 0.4 of a core of a 0.5-core allowance
    assert got["cpu_user"][0] == pytest.approx(30.0) and got["cpu_system"][0] == pytest.approx(10.0)
    assert got["cpu_quota"] == (pytest.approx(20.0), "percent")
    assert got["cpu_quota_periods"] == (4.0, "count")
    assert not [m for m in got if "throttled" in m]
    assert got["mem_working_set"] == (48.0 * 2**20, "bytes")
    assert got["mem_util"] == (pytest.approx(75.0), "percent")  # 48 of 64 MiB
    assert got["mem_major_faults"] == (pytest.approx(60.0), "faults_per_s")
    assert got["mem_swap"] == (4096.0, "bytes")
    assert got["disk_write_ops"] == (pytest.approx(120.0), "ops_per_s")
    assert got["disk_write_bytes"] == (pytest.approx(5e6), "bytes_per_s")
    assert got["disk_util"] == (pytest.approx(60.0), "percent")


def test_density_of_a_pinned_disk_peaks_at_100():
    d = density(np.full(50, 100.0))
    assert density_peaks(d) == [100.0]


def test_sockets_are_the_bottleneck_only_where_no_hardware_is_saturated():
    """Seed 004 §5's three memory scenarios in the database host's samples: on disk, the disk
    saturated (90 % of the samples above 95 %) and the sockets pinned (all of them); partly in
    memory, the sockets pinned with the disk at 80 % and the CPU at 50 %; in memory, the CPU
    saturated and the sockets pinned as well. The primary bottleneck: disk, sockets, CPU."""
    n = 100
    disk_on_disk = np.where(np.arange(n) % 10 < 9, 99.0, 80.0)  # 90 % of the samples above 95 %
    levels = {
        "on disk": {("db1", "disk_util", "percent"): disk_on_disk, ("db1", "cpu_util", "percent"): np.full(n, 25.0),
                    ("db1", "sockets_util", "percent"): np.full(n, 100.0)},
        "partly": {("db1", "disk_util", "percent"): np.full(n, 80.0), ("db1", "cpu_util", "percent"): np.full(n, 50.0),
                   ("db1", "sockets_util", "percent"): np.full(n, 100.0)},
        "in memory": {("db1", "disk_util", "percent"): np.zeros(n), ("db1", "cpu_util", "percent"): np.full(n, 97.0),
                      ("db1", "sockets_util", "percent"): np.full(n, 100.0)},
    }  # fmt: skip
    want = {"on disk": "db disk_util", "partly": "db sockets_util", "in memory": "db cpu_util"}
    for name, samples in levels.items():
        wb = whitebox([(400, _table(samples))])
        shares = {(r["host"], r["metric"]): r["share_above"] for r in wb.shares.to_pylist()}
        assert shares[("db1", "sockets_util")] == 1.0  # the most often above 95 % everywhere
        assert primary_bottleneck(shares)[0] == want[name], (name, shares)
        # the saturated resources: every one of them, the hardware first
        assert wb.saturated[400.0][-1] == ("db1", "sockets_util")
        assert len(wb.saturated[400.0]) == (1 if name == "partly" else 2)
    assert hardware_first({("db1", "sockets_util"): 1.0, ("db1", "disk_util"): 0.49}) == {
        ("db1", "sockets_util"): 1.0,
        ("db1", "disk_util"): 0.49,
    }
