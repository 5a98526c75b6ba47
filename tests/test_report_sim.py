"""Coarse analyses and the report on simulated sweeps, against queueing arithmetic.

Two configurations of a closed 3-tier system (think time Z = 0.2 s), each swept over users:
  A: app 2 ms on 1 core (500/s), db 4 ms on 1 core (250/s)  -> db bottleneck, X_max = 250/s
  B: the same with 4 database cores (1000/s)                 -> app bottleneck, X_max = 500/s
Asymptotic bounds give the knee N* = (D + Z) * X_max with D = 0.3 + 2 + 4 ms.
"""

import json
import re

import pytest

import tierscope.simulate as sim
from tierscope.analysis.experiment import analyze_run  # noqa: E402
from tierscope.analysis.summary import build_summary  # noqa: E402
from tierscope.report import render_html  # noqa: E402

Z = 0.2
D = 0.0063
LEVELS = [5, 20, 40, 60, 80, 120, 160, 200]
CONFIGS = {"A-1db-core": (1, 250.0, "db1"), "B-4db-cores": (4, 500.0, "app1")}


def _spec(users: int, db_cores: int) -> dict:
    return {
        "seed": users,
        "duration_s": 12,
        "warmup_s": 2,
        "workload": {"users": users, "think_time_s": Z},
        "tier": [
            {"name": "web", "threads": 400, "cores": 2, "service_ms": 0.3},
            {"name": "app", "threads": 400, "cores": 1, "service_ms": 2.0},
            {"name": "db", "threads": 400, "cores": db_cores, "service_ms": 4.0},
        ],
    }


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("sim") / "grid"
    for config, (cores, _x, _b) in CONFIGS.items():
        for users in LEVELS:
            result = sim.simulate(sim.parse_spec(_spec(users, cores)))
            result.write(root / config / f"u{users:04d}")
    return root


def test_knee_max_throughput_and_bottleneck_from_simulation(sweep):
    data = analyze_run(sweep)
    assert sorted(data.blackbox) == sorted(CONFIGS)
    for config, (_cores, xmax, bottleneck) in CONFIGS.items():
        bb = data.blackbox[config]
        n_star = (D + Z) * xmax
        assert bb.max_throughput == pytest.approx(xmax, rel=0.06), config
        assert bb.knee_bounds.users == pytest.approx(n_star, rel=0.15), config
        # Kneedle picks a measured level; the nearest levels around N* qualify
        below = max(u for u in LEVELS if u <= n_star)
        above = min(u for u in LEVELS if u >= n_star)
        assert below <= bb.knee.users <= above + (above - below), (config, bb.knee, n_star)
        wb = data.whitebox[config]
        top = max(LEVELS)
        assert [h for h, _m in wb.saturated[float(top)]] == [bottleneck], (config, wb.saturated[float(top)])
        assert wb.saturated[5.0] == []
    m = {r["config"]: r for r in data.bmap.to_pylist()}
    assert m["A-1db-core"]["bottleneck"] == "db CPU" and m["B-4db-cores"]["bottleneck"] == "app CPU"
    assert m["A-1db-core"]["bottleneck_metric"] == "db cpu_user"
    assert (m["A-1db-core"]["group"], m["B-4db-cores"]["group"]) == (1, 2)


def test_report_of_simulated_sweep(sweep):
    data = analyze_run(sweep)
    summary = build_summary(data)
    page = render_html(data, summary)
    for sid in ("load-curve", "density", "bottleneck-map"):
        assert f'id="{sid}"' in page
    # the fine-grained sections, and the verdict at the knee agreeing with the white box: the
    # database (one core) is the simulated bottleneck of the first configuration
    assert data.fine is not None
    for sid in ("timeline", "main-sequence", "strip"):
        assert f'id="{sid}"' in page
    assert data.fine.verdict.kind == "single" and data.fine.verdict.tiers == ["db"], data.fine.verdict
    assert summary.headline.startswith("Single bottleneck at db. The white box agrees: db1 cpu_user")
    manifest = json.loads(next(sweep.rglob("manifest.json")).read_text())
    assert manifest["kind"] == "simulation"


def _alternating_spec() -> dict:
    """Seed 001 in miniature: 250 ms stop-the-world pauses every second at the app tier push the
    queue down to the database when the app resumes, so the two take turns being saturated."""
    return {
        "seed": 11,
        "duration_s": 12,
        "warmup_s": 1,
        "workload": {"users": 600, "think_time_s": 1.0},
        "tier": [
            {"name": "web", "cores": 2, "threads": 2000, "service_ms": 0.2},
            {
                "name": "app",
                "cores": 2,
                "threads": 2000,
                "service_ms": 1.0,
                "freeze": {"period_s": 1.0, "duration_s": 0.25},
            },
            {"name": "db", "cores": 2, "threads": 2000, "service_ms": 2.0},
        ],
    }


def test_alternating_point_report_renders_fine_grained_sections(tmp_path):
    from test_report import CHROMIUM, dump_dom
    from tierscope.report import write_report

    sim.simulate(sim.parse_spec(_alternating_spec())).write(tmp_path / "alt" / "p600")
    data = analyze_run(tmp_path / "alt")
    assert data.fine.verdict.kind == "alternating" and sorted(data.fine.verdict.tiers) == ["app", "db"]
    summary = build_summary(data)
    assert summary.headline.startswith("Transient bottlenecks alternating between app (paused"), summary.headline
    assert "db (saturated by the burst after each pause)" in summary.headline
    assert any("app1 was paused" in line for line in summary.look_at)  # the freezes, from the events table
    path = write_report(data, tmp_path / "alt.html", summary)
    page = path.read_text()
    for sid in ("timeline", "main-sequence", "strip", "correlation"):
        assert f'id="{sid}"' in page
    assert 'id="load-curve"' not in page  # one workload level: no curve to draw
    assert data.truth is not None and "db (truth)" in page and "app (truth)" in page  # the simulator's truth rows
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (Debian package chromium)")
    dom = dump_dom(path)
    lines = re.findall(r'class="js-line"[^>]*d="M([^"]+)"', dom)
    assert len([d for d in lines if len(d) > 100]) >= 6  # load and throughput of 3 servers (legend lines are short)
    assert dom.count('class="point"') >= 100  # main-sequence dots
    assert dom.count("<image") >= 2  # strip chart and correlation heatmaps rasterised by Plotly


def _older_simulator_manifest(path) -> None:
    """Rewrite a simulator manifest in the shape simulators wrote before the typed manifest: the run
    interval at the top level, `rows` for `tables`, the workload level only inside `spec`."""
    m = json.loads(path.read_text())
    run = m.pop("phases")["run"]
    old = {"kind": "simulation", "spec": m["spec"], "start_ns": run["start_ns"], "end_ns": run["end_ns"]}
    old["rows"] = m["tables"]
    path.write_text(json.dumps(old, indent=2))


def test_simulation_directories_written_before_the_typed_manifest_read_the_same(sweep, tmp_path):
    import shutil

    old_root = tmp_path / "grid"
    shutil.copytree(sweep / "A-1db-core", old_root / "A-1db-core")
    for m in old_root.glob("*/*/manifest.json"):
        _older_simulator_manifest(m)
    assert "phases" not in json.loads(next(old_root.glob("*/*/manifest.json")).read_text())
    new, old = analyze_run(sweep), analyze_run(old_root)
    bb_new, bb_old = new.blackbox["A-1db-core"], old.blackbox["A-1db-core"]
    assert bb_old.curve.num_rows == len(LEVELS)
    assert (bb_old.max_throughput, bb_old.max_throughput_users) == (bb_new.max_throughput, bb_new.max_throughput_users)
    assert bb_old.curve.column("seconds").to_pylist() == bb_new.curve.column("seconds").to_pylist()
    assert bb_old.knee == bb_new.knee
    assert old.whitebox["A-1db-core"].saturated == new.whitebox["A-1db-core"].saturated
    assert not any("no load curve" in n for n in old.notes)
