"""Seed 002's scaling experiment as a preset (`tierscope oltp scale`, tierscope.studies.scaling).

What must hold on any fixed hardware, whatever its size, checked against the servers' own
counters and arithmetic rather than the driver alone:

* On Galera every write is applied on every node: in YCSB-A on 3 nodes each node's rows written
  (Handler_update) and write sets applied (wsrep_replicated + wsrep_received) equal the write sets
  the whole cluster originated (the sum of wsrep_replicated), so the work summed over the nodes per
  client operation is about 3 times that of 1 node.
* Each node served its own clients: the sum over nodes of Com_stmt_execute is the driver's count of
  operations.
* YCSB-A's throughput per node falls faster from 1 to 3 nodes than YCSB-B's (every write costs
  every node; on one machine the nodes also share the CPUs, so neither can scale out here).
* Through the middleware, every PostgreSQL replica updated exactly the rows the driver updated
  (the drivers' prepared statements pass through it), and its reads went to one replica each.
* Nothing is left running and the work directory is removed.

The real-cluster tests take about 2.5 minutes on the shared 2-core machine: marked `fidelity`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import PRESETS, needs_postgres, needs_root
from tierscope.studies.scaling import ScalePreset, combine, load_preset, node_work, run_scaling, table_rows

needs_galera = pytest.mark.skipif(
    not Path("/usr/lib/galera/libgalera_smm.so").exists(), reason="galera-4 not installed"
)


# ---- the preset and the arithmetic (no servers) -------------------------------------------------


def test_the_shipped_preset_scales_galera_and_the_middleware_over_1_2_3_nodes():
    p = load_preset(PRESETS / "oltp-scaling.toml")
    assert p.targets == ["galera", "middleware"] and p.nodes == [1, 2, 3]
    assert p.workloads == ["ycsb-b", "ycsb-a", "tpcc"]  # seed 002's read- and write-intensive mixes, TPC-C
    assert p.problems() == []
    assert load_preset() == p  # the default


@pytest.mark.parametrize(
    "text, says",
    [
        ('targets = ["rubato"]', "targets: expected some of galera, middleware"),
        ("nodes = [0, 2]", "nodes: expected node counts 1..5"),
        ('workloads = ["ycsb-z"]', "workloads: expected some of"),
        ("duration = 5\nwarmup = 5", "warmup: expected 0 <= seconds < duration"),
        ("[ycsb]\nthreads = 3", "[ycsb]: unknown key 'threads' (expected records, threads_per_node)"),
        ("speed = 1", "unknown key 'speed'"),
    ],
)
def test_a_wrong_preset_is_refused_with_the_file_and_the_key(tmp_path, text, says):
    f = tmp_path / "p.toml"
    f.write_text(text + "\n")
    with pytest.raises(ValueError) as err:
        load_preset(f)
    assert str(err.value).startswith(str(f)) and says in str(err.value)


def test_a_row_adds_the_processes_and_divides_by_the_nodes_and_shows_each_node():
    s = [
        {
            "ops": 300,
            "ops_per_s": 100.0,
            "errors": 1,
            "threads": 2,
            "operations": {"READ": {"count": 150}, "UPDATE": {"count": 149}},
        }
    ] * 3
    per = {
        f"db{i}": node_work(
            "galera",
            {"Com_stmt_execute": 300, "Handler_update": 450, "wsrep_replicated": 150, "wsrep_received": 300},
            3.0,
        )
        for i in (1, 2, 3)
    }
    row = combine("galera", 3, "ycsb-a", s, [], per)
    assert (row["throughput"], row["throughput_per_node"], row["errors"], row["ops"]) == (300.0, 100.0, 3, 900)
    assert row["updates"] == 447 and row["clients"] == 6 and row["p90_ms"] is None
    assert per["db1"]["served_per_s"] == 100.0 and per["db1"]["rows_written"] == 450
    cells = next(table_rows([row]))
    assert cells[:7] == ["galera", "3", "ycsb-a", "300 ops/s", "100", "", "3"]
    assert cells[7] == "db1 300/450, db2 300/450, db3 300/450"


def test_scale_help_teaches_the_preset_the_counters_and_the_limits():
    from tierscope.cli.oltp import oltp_app

    out = CliRunner().invoke(oltp_app, ["scale", "--help"], terminal_width=200).output
    for words in (
        "oltp-scaling.toml",
        "Com_stmt_execute",
        "xact_commit",
        "share the same CPUs",
        "--nodes",
        "results.parquet",
    ):
        assert words in out, words


@pytest.mark.parametrize(
    "args, says",
    [
        (["--nodes", "1,x"], "invalid literal"),
        (["--nodes", "0,2"], "nodes: expected node counts 1..5"),
        (["--workload", "ycsb-q"], "workloads: expected some of"),
    ],
)
def test_scale_refuses_wrong_overrides_before_starting_anything(args, says, tmp_path):
    from tierscope.cli.oltp import oltp_app

    res = CliRunner().invoke(oltp_app, ["scale", "-o", str(tmp_path / "out"), *args], terminal_width=200)
    assert res.exit_code == 2 and says in res.output
    assert not (tmp_path / "out").exists()


# ---- real clusters -----------------------------------------------------------------------------


def _left_behind(root: Path) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout.splitlines()
    return [line for line in ps if str(root) in line]


@pytest.fixture(scope="module")
def workdir():
    """Outside /tmp/pytest-of-root (another pytest session resets it to mode 0700, and the servers
    run as their own users)."""
    d = Path(tempfile.mkdtemp(prefix="tierscope-scaletest-"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def galera_rows(workdir):
    if os.geteuid() != 0:
        pytest.skip("MariaDB runs as its own OS user: needs root")
    if not Path("/usr/lib/galera/libgalera_smm.so").exists():
        pytest.skip("galera-4 not installed")
    preset = ScalePreset(
        targets=["galera"],
        nodes=[1, 3],
        # B, A, A, B on each cluster: a drift of the machine's speed during a cluster's runs
        # (it is shared) weighs on both mixes alike instead of on the one that ran second
        workloads=["ycsb-b", "ycsb-a", "ycsb-a", "ycsb-b"],
        duration=8,
        warmup=0,
        records=2000,
        # 6 clients per node: with 2, one node was not kept busy and both mixes fell alike
        # (test_galera_write_heavy_costs_every_node_...)
        threads_per_node=6,
    )
    rows = run_scaling(preset, out=workdir / "out", workdir=workdir, say=lambda m: None)
    assert not _left_behind(workdir)
    assert [p.name for p in workdir.iterdir()] == ["out"]  # the data directories are gone
    out: dict[tuple[int, str], list[dict]] = {}
    for r in rows:
        out.setdefault((r["nodes"], r["workload"]), []).append(r)
    assert all(len(v) == 2 for v in out.values()) and len(out) == 4, sorted(out)
    return out


def _driver_ops(row) -> int:
    return sum(s["ops"] + s["errors"] for s in row["summaries"])


@pytest.mark.fidelity
@needs_root("MariaDB runs as its own OS user")
@needs_galera
def test_galera_every_write_is_applied_on_every_node(galera_rows):
    one, three = galera_rows[(1, "ycsb-a")][0], galera_rows[(3, "ycsb-a")][0]
    for row in (one, three):
        nodes = row["per_node"]
        assert len(nodes) == row["nodes"]
        # each node served its own clients: the statements the nodes ran are the driver's operations
        served = sum(n["served"] for n in nodes.values())
        assert abs(served - _driver_ops(row)) <= 0.01 * served + 10, (served, _driver_ops(row))
        # the write sets the cluster originated ...
        originated = sum(n["write_sets_local"] for n in nodes.values())
        assert originated >= 0.9 * row["updates"] > 0
        for name, n in nodes.items():
            # ... every node applied (its own and the others'), and wrote their rows
            applied = n["write_sets_local"] + n["write_sets_received"]
            assert applied >= 0.97 * originated, (name, applied, originated)
            assert abs(n["counters"]["Handler_update"] - originated) <= 0.03 * originated + 5, (name, n, originated)
    # so the rows written, summed over the nodes, per client operation grow with the nodes (x3 ideally)
    per_op = {r["nodes"]: sum(n["rows_written"] for n in r["per_node"].values()) / _driver_ops(r) for r in (one, three)}
    assert per_op[3] >= 2.5 * per_op[1], per_op


@pytest.mark.fidelity
@needs_root("MariaDB runs as its own OS user")
@needs_galera
def test_galera_write_heavy_costs_every_node_more_than_read_heavy(galera_rows):
    """Seed 002's finding on one machine: from 1 to 3 nodes YCSB-A's throughput per node falls
    further than YCSB-B's, because every write costs every node and a read only one. On hosts of
    their own, a node's throughput is what its CPU buys at the cluster's CPU cost per operation, so
    the check is on that cost: from 1 to 3 nodes it grows more for A than for B.

    Throughput per node itself cannot be the check here: the three nodes share two cores, so it
    falls to about a fifth for either mix and which falls further follows the machine. Each mix
    runs twice per cluster (B A A B) and it came out 0.184 / 0.175 and 0.173 / 0.172 (2 clients per
    node, in the suite), 0.154 / 0.21 (alone), and with 6 clients per node 0.162-0.196 / 0.200-0.254
    over seven runs alone but 0.233 / 0.173 in CI (2026-11-29). The CPU per operation grew, A / B:
    2.16 / 1.77, 1.95 / 1.48 and 2.08 / 1.49 on a quiet machine, 2.03 / 1.84 and 2.37 / 1.90 with
    a busy loop beside (2026-11-29, 6 s runs); with 2 clients per node 2.50 / 2.89 once (at one
    node the reads were then cheap, 31 us against 42-49 us with 6 clients)."""
    mean = lambda rows, key: sum(r[key] for r in rows) / len(rows)  # noqa: E731
    mixes = ("ycsb-a", "ycsb-b")
    growth = {
        w: mean(galera_rows[(3, w)], "db_cpu_us_per_op") / mean(galera_rows[(1, w)], "db_cpu_us_per_op") for w in mixes
    }
    fall = {
        w: mean(galera_rows[(3, w)], "throughput_per_node") / mean(galera_rows[(1, w)], "throughput_per_node")
        for w in mixes
    }
    runs = {k: [(round(r["throughput_per_node"]), r["db_cpu_us_per_op"]) for r in v] for k, v in galera_rows.items()}
    print(f"\nCPU per operation, 3 nodes over 1: {growth}; throughput per node: {fall}; each run's: {runs}")
    assert growth["ycsb-a"] > growth["ycsb-b"], (growth, runs)
    for rows in galera_rows.values():
        for r in rows:
            assert r["throughput_per_node"] == pytest.approx(r["throughput"] / r["nodes"], abs=0.1)
            # the cluster's CPU time per operation is that of the nodes' own processes
            cpu = sum(n["cpu_s"] for n in r["per_node"].values())
            assert r["db_cpu_us_per_op"] == pytest.approx(1e6 * cpu / r["ops"], rel=0.01)
            # each node worked: at 6 clients a node takes a good part of a core
            assert all(n["cpu_s"] > 0.1 * r["counted_seconds"] for n in r["per_node"].values()), r["per_node"]


@pytest.mark.fidelity
@needs_root("PostgreSQL runs as its own OS user")
@needs_postgres
def test_middleware_every_replica_applies_the_drivers_updates(workdir):
    preset = ScalePreset(
        targets=["middleware"], nodes=[2], workloads=["ycsb-a"], duration=4, warmup=0, records=2000, threads_per_node=2
    )
    (row,) = run_scaling(preset, workdir=workdir, say=lambda m: None)
    assert not _left_behind(workdir)
    assert row["errors"] == 0 and row["updates"] > 0 and row["middleware"]["disabled"] == []
    reps = row["per_node"].values()
    # prepared statements through the middleware: each replica updated exactly the driver's rows ...
    assert [n["counters"]["tup_updated"] for n in reps] == [row["updates"]] * 2
    # ... and each read went to one replica; beside the driver's reads the replicas served the
    # units that prepare statements (13 per connection, Parse/Describe/Sync), no more
    extra = sum(n["reads_routed"] for n in reps) - row["reads"]
    assert 0 <= extra <= 13 * row["clients"], extra
