"""A sweep over something other than the topology (say, the database host's memory) gives one
configuration per swept value: one load curve, one row of the bottleneck map, one line of the
configuration table the terminal prints."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from rich.console import Console

from tierscope.analysis.blackbox import BlackBox, Knee
from tierscope.analysis.bottleneck_map import ConfigurationResult, bottleneck_map
from tierscope.analysis.experiment import Analysis
from tierscope.analysis.points import read_point
from tierscope.manifest import Manifest
from tierscope.manifest import read as read_manifest
from tierscope.manifest import write as write_manifest
from tierscope.report.summary import configuration_table


def manifest(params: dict) -> dict:
    return {"topology": "1W/1A/0/1D-P", "point": {"params": params, "users": params.get("workload.users")}}


def configuration(topology: str | None, params: dict) -> str | None:
    return Manifest.model_validate({"topology": topology, "point": {"params": params}}).configuration()


def test_swept_values_but_the_workload_level_name_the_configuration():
    memory = {"node_types.D.memory": "150MiB", "workload.users": 50}
    assert configuration("1W/1A/0/1D-P", memory) == "1W/1A/0/1D-P node_types.D.memory=150MiB"
    # users alone, or a swept topology (already in the name): the topology
    assert configuration("1/1/0/1", {"workload.users": 50}) == "1/1/0/1"
    assert configuration("1/2/0/1", {"topology": "1/2/0/1", "workload.users": 5}) == "1/2/0/1"
    # two swept keys, in the order of the spec
    two = {"soft.app.threads": 4, "node_types.D.memory": "1GiB", "workload.users": 5}
    assert configuration("1/1/0/1", two) == "1/1/0/1 soft.app.threads=4 node_types.D.memory=1GiB"
    assert configuration(None, {}) is None


def test_a_manifest_that_is_not_one_is_an_error_naming_the_field(tmp_path):
    bad = tmp_path / "manifest.json"
    bad.write_text(json.dumps({"status": "done", "point": {"users": "many"}}))
    with pytest.raises(ValueError, match=r"manifest.json: point.users: .*'many'"):
        read_manifest(bad)
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        read_manifest(bad)
    bad.write_text(json.dumps({"status": "finished"}))
    with pytest.raises(ValueError, match="status"):
        read_manifest(bad)


def test_a_manifest_keeps_what_it_does_not_type(tmp_path):
    path = tmp_path / "manifest.json"
    raw = {
        "status": "done",
        "point": {"users": 5, "think_time_s": 1.0},
        "phases": {"run": {"start_ns": 1, "end_ns": 9}},
        "generator": {"total": {"p90_ms": 3.5}},
        "machine": {"cpus": 2},
    }
    path.write_text(json.dumps(raw))
    m = read_manifest(path)
    assert (m.point.users, m.point.think_time_s, m.run_interval()) == (5.0, 1.0, (1, 9))
    write_manifest(m, path)
    again = json.loads(path.read_text())
    assert again["generator"] == {"total": {"p90_ms": 3.5}} and again["machine"] == {"cpus": 2}


def test_points_of_two_memory_sizes_are_two_configurations(tmp_path):
    for memory in ("150MiB", "1GiB"):
        for users in (50, 100):
            d = tmp_path / f"memory{memory}-users{users}"
            d.mkdir()
            (d / "manifest.json").write_text(
                json.dumps(manifest({"node_types.D.memory": memory, "workload.users": users}))
            )
    configs = {read_point(d).config for d in tmp_path.iterdir()}
    assert configs == {"1W/1A/0/1D-P node_types.D.memory=150MiB", "1W/1A/0/1D-P node_types.D.memory=1GiB"}


def test_the_bottleneck_map_reads_server_counts_from_the_topology_word():
    results = [
        ConfigurationResult("1W/1A/0/2D-P node_types.D.memory=150MiB", 50.0, {("db1", "disk_util"): 0.9}),
        ConfigurationResult("1W/1A/0/2D-P node_types.D.memory=1GiB", 200.0, {("db1", "cpu_util"): 0.7}),
    ]
    rows = bottleneck_map(results).to_pylist()
    assert [(r["db"], r["app"], r["tier"], r["resource"]) for r in rows] == [(2, 1, "db", "disk"), (2, 1, "db", "CPU")]


def test_the_configuration_table_has_one_row_per_configuration():
    a, b = "1/1/0/1 node_types.D.memory=150MiB", "1/1/0/1 node_types.D.memory=1GiB"
    data = Analysis(title="memory")
    data.bmap = bottleneck_map(
        [
            ConfigurationResult(a, 50.0, {("db1", "disk_util"): 0.9}),
            ConfigurationResult(b, 200.0, {("db1", "cpu_util"): 0.3}),
        ]
    )
    curve = pa.table({"users": [1.0]})
    data.blackbox = {
        a: BlackBox(curve, Knee(50.0, "kneedle", 0, ""), 50.0, 100.0),
        b: BlackBox(curve, None, 200.0, 300.0),
    }
    console = Console(width=200, record=True)
    console.print(configuration_table(data))
    text = console.export_text()
    assert "db disk (90% of the time)" in text and "no saturated resource" in text and "disk_util" not in text
    lines = [line for line in text.splitlines() if "node_types.D.memory" in line]
    assert len(lines) == 2 and " 50 " in lines[0] and "200.0" in lines[1]
    data.bmap = data.bmap.slice(0, 1)
    assert configuration_table(data) is None
