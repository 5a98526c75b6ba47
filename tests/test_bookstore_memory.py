"""Fidelity of seed 004's memory study (issues 12 and 22): with the database host's memory at about
30 % of the database, the bottleneck is its disk; in the middle, the app's connections run out
with neither the disk nor the CPU saturated, both busy; with the whole database in memory, the CPU.

The scenario is the shipped preset `tpcw-memory` (its three memory sizes) at one workload level
above every knee, run end to end by the runner (real nginx, app server and PostgreSQL in
namespaced hosts, the database host's memory and disk limited by its cgroups), then analysed as
`tierscope report` does. The verdict (the bottleneck map's most saturated resource per memory
size) must name the disk at 128 MiB, the app's connections in the middle and the CPU at 1 GiB, and
the run's own samples must agree: at 128 MiB the database host reads from its disk at the disk's
limit; in the middle the app's connections are all taken while the disk reads below its limit
and the CPU works below its quota; at 1 GiB it reads almost nothing and its CPU is busy. Ground truth is
the configuration the test chose (the memory limit) and the kernel's and the app's own counters,
not the analysis.

About 5 minutes (plus about 25 s for the data load when no snapshot is cached); marked
`fidelity`: `make test` runs it, `pytest -m "not fidelity"` leaves it out. Needs root and
PostgreSQL 15.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from conftest import needs_postgres, needs_root
from tierscope.analysis.experiment import analyze_run
from tierscope.runner import run_experiment
from tierscope.spec import NodeType, spec_from_dict
from tierscope.studies import finding_of

PRESET = Path(__file__).resolve().parent.parent / "python" / "tierscope" / "presets" / "tpcw-memory.toml"

pytestmark = [
    pytest.mark.fidelity,
    needs_root("the lab starts PostgreSQL as its own OS user"),
    needs_postgres,
]

LOW, MID, HIGH = "128MiB", "330MiB", "1GiB"


def median(point_dir: Path, host: str, metric: str) -> float:
    """The median of the point's samples of `metric` on `host` in its measured phase (`run`: after
    the ramp-up, when the cache has warmed as far as the memory allows)."""
    run = json.loads((point_dir / "manifest.json").read_text())["phases"]["run"]
    r = pq.read_table(point_dir / "resources.parquet")
    r = r.filter(
        pc.and_(
            pc.and_(pc.equal(r["host"], host), pc.equal(r["metric"], metric)),
            pc.and_(pc.greater_equal(r["ts_ns"], run["start_ns"]), pc.less_equal(r["ts_ns"], run["end_ns"])),
        )
    )
    assert r.num_rows > 0, f"no {metric} samples for {host} in {point_dir}'s run"
    return float(np.median(r["value"].to_numpy()))


def test_memory_moves_the_bottleneck_from_the_disk_to_the_cpu(tmp_path):
    raw = tomllib.loads(PRESET.read_text())
    raw["workload"].update(users=[400], run="30s", ramp_down="2s")  # the preset's 30 s ramp-up
    assert raw["sweep"]["matrix"]["node_types.D.memory"] == [LOW, MID, HIGH]
    spec = spec_from_dict(raw, where="<memory study>", name="memory")
    result = run_experiment(spec, tmp_path, report=False)
    assert not result.interrupted and result.failed == [], result.failed
    points = {m: next(result.dir / p for p in result.done if p.startswith(f"memory{m}-")) for m in (LOW, MID, HIGH)}

    # the system as built: little memory -> the database reads from its disk at the disk's limit
    # (60 reads/s: one arm, 16.7 ms a read); all of it in memory -> few reads (2-4 a second in the
    # run: a fifth of the limit at most), the CPU busy
    limit = NodeType.model_validate(raw["node_types"]["D"]).read_iops_limit()
    assert limit == 60
    assert median(points[LOW], "db1", "disk_read_ops") >= 0.8 * limit
    assert median(points[HIGH], "db1", "disk_read_ops") < 0.2 * limit
    assert median(points[HIGH], "db1", "cpu_util") >= 85
    # in the middle: the app's two connections taken (both workers' pages queue for them), the disk
    # reading but below its limit, the CPU busy (below its quota in most seconds: the verdict)
    assert median(points[MID], "app1", "connections_util") == 100
    assert 0.2 * limit <= median(points[MID], "db1", "disk_read_ops") < limit  # (at its limit: the verdict)
    assert median(points[MID], "db1", "cpu_util") >= 50

    # the verdict, per memory size
    data = analyze_run(result.dir, window_ns=50_000_000)
    assert data.bmap is not None and data.bmap.num_rows == 3, data.notes
    rows = {r["config"].split("=")[-1]: r for r in data.bmap.to_pylist()}
    assert (rows[LOW]["tier"], rows[LOW]["resource"]) == ("db", "disk"), rows[LOW]
    assert (rows[MID]["tier"], rows[MID]["resource"]) == ("app", "connections"), rows[MID]
    assert rows[HIGH]["tier"] == "db" and rows[HIGH]["resource"] in ("CPU", "CPU quota"), rows[HIGH]
    # and memory buys throughput (seed 004 Fig. 2: knees at 30, 270 and 330 users), the first
    # memory most. In the steady state the middle size serves nearly what the whole database in
    # memory does (pages/s at 400 users in six runs of this test: 330 MiB 343, 425, 370, 373,
    # 334 and 342 against 1 GiB's 357, 426, 412, 357, 370 and 383; the low size 172-207), so the
    # order of the last two is within this machine's noise and is not asserted; the first
    # memory's gain must be the larger
    x = {m: rows[m]["max_throughput"] for m in (LOW, MID, HIGH)}
    assert x[LOW] < x[MID] and x[LOW] < x[HIGH], x
    assert x[MID] - x[LOW] > x[HIGH] - x[MID], x
    # the study's own finding on this run: its claim in presets/studies.toml (db disk, app
    # connections, db CPU) checked as `tierscope run tpcw-memory` checks it
    finding = finding_of(data, PRESET)
    assert finding.holds is True, finding.line()
