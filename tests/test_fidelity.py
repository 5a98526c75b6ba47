"""Fidelity, from real runs in the box (issue 5): the named bottleneck follows the CPU limits.

Each scenario is a short sweep built from a shipped preset (`tierscope demo`'s systems) with
`spec_from_dict`, run end to end by the runner (real nginx, app server, PostgreSQL in namespaced
hosts with cgroup CPU quotas; capture traced and linked), then analysed as `tierscope report`
does. Ground truth is the configuration the test chose: the tier given the smallest CPU quota
relative to its work is the bottleneck — and the run's own resource samples must agree (that
host's CPU busy, throttled by its quota), so a verdict that happens to match a mis-built system
cannot pass.

* database on a quarter core (the demo): "single bottleneck at db";
* database on a full core, app server on a quarter: "single bottleneck at app";
* app server paused 150 ms about every second (SIGSTOP/SIGCONT), database near saturation
  (the alternating demo): "bottleneck alternating between app and db".

About 1–1.5 minutes each (3.6 min for the three here); marked `fidelity`: `make test` runs them
(issue 11: the real-run scenarios run in CI once per `make test`), and so does `make fidelity`;
`pytest -m "not slow and not fidelity"` leaves them out. Needs root, tcpdump and PostgreSQL 15.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from conftest import PRESETS, needs_postgres, needs_root, needs_tcpdump
from tierscope.analysis.experiment import analyze_run
from tierscope.analysis.summary import build_summary
from tierscope.runner import run_experiment
from tierscope.spec import spec_from_dict
from tierscope.studies import finding_of

pytestmark = [
    pytest.mark.fidelity,
    needs_root("the lab starts PostgreSQL as its own OS user"),
    needs_tcpdump,
    needs_postgres,
]


def preset(name: str, **changes) -> dict:
    raw = tomllib.loads((PRESETS / f"{name}.toml").read_text())
    for dotted, value in changes.items():
        node = raw
        *path, last = dotted.split(".")
        for key in path:
            node = node.setdefault(key, {})
        node[last] = value
    return raw


def run(raw: dict, out: Path, name: str):
    spec = spec_from_dict(raw, where=f"<fidelity {name}>", name=name)
    result = run_experiment(spec, out, report=False)
    assert not result.interrupted and result.failed == [], result.failed
    data = analyze_run(result.dir, window_ns=50_000_000)
    return result, data, build_summary(data)


def cpu_util(point_dir: Path, host: str, metric: str = "cpu_util") -> float:
    """Median of a host's CPU metric over the point (percent of its quota)."""
    r = pq.read_table(point_dir / "resources.parquet")
    r = r.filter(pc.and_(pc.equal(r["host"], host), pc.equal(r["metric"], metric)))
    return float(np.median(r["value"].to_numpy()))


def point_dir(result, users: int) -> Path:
    return next(result.dir / p for p in result.done if p.startswith(f"users{users}-"))


SHORT = {"workload.ramp_up": "3s", "workload.run": "15s", "workload.ramp_down": "2s"}


def test_a_database_on_a_quarter_core_is_named_the_bottleneck(tmp_path):
    # the top level past the quarter core's capacity however fast the machine: 300 users were
    # enough on a busy machine (the database saturated near 160 pages/s) but not on a quiet one
    # (2026-11-28: 286 pages/s at 300 users, its CPU at 86 %, hardly throttled)
    raw = preset("demo", **SHORT, **{"workload.users": [50, 150, 450]})
    result, data, summary = run(raw, tmp_path, "fidelity-db")
    # the system as built: at 450 users the database host's CPU is pinned at its quota and
    # throttled, the app server's (a full core) is not
    top = point_dir(result, 450)
    assert cpu_util(top, "db1") > 90
    assert cpu_util(top, "db1", "cpu_quota") > 50
    assert cpu_util(top, "app1") < 70
    verdict = data.fine.verdict
    assert data.fine.exclusive, "the runner links the traced rows: exclusive load decides"
    assert verdict.kind == "single" and verdict.tiers == ["db"], verdict
    assert summary.headline.startswith("Single bottleneck at db."), summary.headline
    assert "white box agrees: db1" in summary.headline
    # the demo study's own finding on this cut of it (three of its four levels, shorter): its claim
    # in presets/studies.toml (db CPU) checked as `tierscope run demo` checks it
    finding = finding_of(data, PRESETS / "demo.toml")
    assert finding.holds is True, finding.line()


def test_more_database_cpu_moves_the_bottleneck_to_the_app_tier(tmp_path):
    # the app server (~110 pages/s on a quarter core) with a 10 ms CFS period: at the default
    # 100 ms a quarter core runs 25 ms and stops 75 ms, on/off at the scale of the 50 ms windows
    raw = preset(
        "demo",
        **SHORT,
        **{
            # 280 users: well past the app's quarter core (at 140 it served 127 pages/s at 80 % of
            # its quota, 2026-11-28)
            "workload.users": [60, 100, 280],
            "node_types.L.cpu": 1.0,
            "node_types.A.cpu": 0.25,
            "node_types.A.cpu_period": "10ms",
        },
    )
    result, data, summary = run(raw, tmp_path, "fidelity-app")
    top = point_dir(result, 280)
    # at its quota in the kernel's counters: throttled in (nearly) every one of the 100 CFS periods
    # of each second. Its run time then reads about 90 % of the quota, not 100 %: with a 2.5 ms
    # quota per 10 ms period the cgroup is stopped a little before its quota is used up (88.8 % in
    # a CI run, 89.9 % here with 100 of 100 periods throttled, 2026-11-28), so `cpu_util` alone
    # cannot say "at its quota"
    assert cpu_util(top, "app1", "cpu_quota_periods") >= 90
    assert cpu_util(top, "app1") > 80
    assert cpu_util(top, "db1") < 70
    verdict = data.fine.verdict
    assert verdict.kind == "single" and verdict.tiers == ["app"], verdict
    assert summary.headline.startswith("Single bottleneck at app."), summary.headline


def test_injected_app_pauses_make_the_bottleneck_alternate(tmp_path):
    raw = preset(
        "demo-alternating",
        **{"workload.users": [80], "workload.ramp_up": "3s", "workload.run": "30s", "workload.ramp_down": "2s"},
    )
    result, data, summary = run(raw, tmp_path, "fidelity-alternating")
    d = point_dir(result, 80)
    events = pq.read_table(d / "events.parquet")
    pauses = events.filter(pc.equal(events["kind"], "injected_pause"))
    assert pauses.num_rows >= 20  # one about every second of the 35 s
    fine = data.fine
    assert fine.verdict.kind == "alternating", fine.verdict
    assert fine.verdict.tiers == ["app", "db"]
    # the study's own finding on this cut of it (its 80-user level only): its claim in
    # presets/studies.toml (alternating between app and db) checked as `tierscope run
    # demo-alternating` checks it
    finding = finding_of(data, PRESETS / "demo-alternating.toml")
    assert finding.holds is True, finding.line()
    # in the seeds' words: the app paused (its events), the database saturated by the burst after
    assert re.fullmatch(
        r"Transient bottlenecks alternating between app \(paused \d+ times, median \d+ ms\) and db "
        r"\(saturated by the burst after each pause\)\.(.*)",
        summary.headline,
    ), summary.headline
    # the pauses explain the app's load (seed 001 Fig. 6b). The load climbs through each pause (its
    # requests pile up) while the pause ratio is flat: Pearson's r of a ramp against a box is well
    # below 1 and noisy (0.43-0.60 over four runs of this test), so the firm check is the mean: the
    # app's exclusive load in its half-paused windows or more against its unpaused ones (8.1x, 8.9x
    # and 8.8x in three runs)
    row = [r for r in fine.pauses.to_pylist() if r["server"] == "app1"][0]
    assert row["corr_load_vs_pause_ratio"] > 0.3
    app = fine.series.filter(pc.equal(fine.series["server"], "app1"))
    ratio = app["pause_ratio"].to_numpy()
    load = app["load_exclusive"].to_numpy()
    assert load[ratio >= 0.5].mean() > 3 * load[ratio == 0].mean()
    assert fine.switches_per_s > 0.5
