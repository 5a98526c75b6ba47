"""The report: built from a run directory whose answers are known by construction, rendered to one
self-contained HTML file, and checked in headless Chromium (it renders; its plots have data)."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import plotly.offline
import pyarrow as pa
import pytest

from tierscope import tables
from tierscope.analysis.experiment import analyze_run
from tierscope.analysis.summary import build_summary
from tierscope.report import render_html, write_report

S = 1_000_000_000
MS = 1_000_000
Z = 1.0  # think time, s
D = 0.05  # total demand, s
# two configurations: one database server caps throughput at 100/s (db cpu), two at 180/s (app cpu)
CONFIGS = {"1/1/0/1": ("db1", 100.0), "1/1/0/2": ("app1", 180.0)}
LEVELS = [20, 60, 100, 140, 180, 220, 260]
RUN_S = 20


def _write_point(root: Path, config: str, users: int, rng, with_requests: bool) -> None:
    bottleneck, xmax = CONFIGS[config]
    r = max(D, users / xmax - Z)
    x = users / (r + Z)
    point = root / f"c{config.replace('/', '')}-u{users:04d}"
    t0 = 1_763_800_000 * S
    n = int(x * RUN_S)
    start = t0 + np.sort(rng.integers(0, int((RUN_S - 2) * S), n))
    rt = (rng.uniform(0.8, 1.2, n) * r * S).astype(np.int64)
    tables.write(
        pa.table(
            {
                "user": rng.integers(0, users, n),
                "session": np.zeros(n, np.int64),
                "state": ["Home"] * n,
                "start_ns": start,
                "end_ns": start + rt,
                "status": pa.array([200] * n, pa.int32()),
                "phase": ["run"] * n,
            }
        ),
        point / "client_requests.parquet",
        "client_requests",
    )
    util = min(100.0, 100.0 * x / xmax)  # utilisation law U = X * D_max
    ts = t0 + np.arange(RUN_S) * S
    res = {"ts_ns": [], "host": [], "metric": [], "value": [], "unit": []}
    for host in ("web1", "app1", "db1"):
        u = util if host == bottleneck else util * 0.4
        vals = np.clip(rng.normal(u, 1.5, RUN_S), 0, 100)
        res["ts_ns"] += ts.tolist()
        res["host"] += [host] * RUN_S
        res["metric"] += ["cpu"] * RUN_S
        res["value"] += vals.tolist()
        res["unit"] += ["percent"] * RUN_S
    tables.write(pa.table(res), point / "resources.parquet", "resources")
    if with_requests:  # nested requests web > app > db for the fine-grained analysis
        k = len(start)
        rows = {
            "tier": [],
            "server": [],
            "request_id": [],
            "parent_id": [],
            "label": [],
            "arrival_ns": [],
            "departure_ns": [],
        }
        for i in range(k):
            a, d = int(start[i]), int(start[i] + rt[i])
            span = d - a
            for tier, lo, hi, parent in (
                ("web", 0, 1.0, None),
                ("app", 0.05, 0.95, f"w{i}"),
                ("db", 0.1, 0.9, f"a{i}"),
            ):
                rows["tier"].append(tier)
                rows["server"].append(f"{tier}1")
                rows["request_id"].append(f"{tier[0]}{i}")
                rows["parent_id"].append(parent)
                rows["label"].append("search" if i % 97 == 0 and tier == "db" else "q")
                rows["arrival_ns"].append(a + int(lo * span))
                rows["departure_ns"].append(a + int(hi * span))
        tables.write(pa.table(rows), point / "requests.parquet", "requests")
    # the shape tierscope.runner.write_manifest writes
    manifest = {
        "status": "done",
        "reason": None,
        "point": {"id": point.name, "params": {"workload.users": users}, "users": users, "think_time_s": Z},
        "topology": config,
        "phases": {
            "ramp_up": {"start_ns": int(t0 - S), "end_ns": int(t0)},
            "run": {"start_ns": int(t0), "end_ns": int(t0 + RUN_S * S)},
        },
        "config": {"workload": {"users": [users], "think_time": Z}},
    }
    (point / "manifest.json").write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs") / "sweep1"
    rng = np.random.default_rng(7)
    for config in CONFIGS:
        for users in LEVELS:
            _write_point(root, config, users, rng, with_requests=(config == "1/1/0/1" and users == 140))
    broken = root / "c1101-u9999"  # a point whose run failed: left out, with a note
    broken.mkdir()
    (broken / "manifest.json").write_text(
        json.dumps(
            {
                "status": "failed",
                "reason": "tier died during the run: db1",
                "point": {"users": 9999},
                "topology": "1/1/0/1",
            }
        )
    )
    return root


def test_analyze_run_finds_knee_saturation_and_map(run_dir):
    data = analyze_run(run_dir)
    assert sorted(data.blackbox) == ["1/1/0/1", "1/1/0/2"]
    one, two = data.blackbox["1/1/0/1"], data.blackbox["1/1/0/2"]
    assert one.max_throughput == pytest.approx(100, rel=0.05)
    assert two.max_throughput == pytest.approx(180, rel=0.05)
    # knee N* = (D + Z) * X_max: 105 and 189 users; kneedle answers a measured level next to it
    assert one.knee.users in (100, 140) and two.knee.users in (180, 220)
    assert one.knee_bounds.users == pytest.approx(105, rel=0.08)
    wb = data.whitebox["1/1/0/1"]
    assert wb.saturated[260.0] == [("db1", "cpu")] and wb.saturated[20.0] == []
    m = {r["config"]: r for r in data.bmap.to_pylist()}
    assert m["1/1/0/1"]["bottleneck"] == "db CPU" and m["1/1/0/2"]["bottleneck"] == "app CPU"
    assert m["1/1/0/1"]["group"] == 1 and m["1/1/0/2"]["group"] == 2
    # the fine-grained point: the first level at or past the knee of the first configuration
    assert data.fine_point is not None and "140 users" in data.fine_point
    assert data.heavy is not None
    assert "point c1101-u9999 failed (tier died during the run: db1) and is left out" in data.notes
    assert 9999.0 not in data.blackbox["1/1/0/1"].curve.column("users").to_pylist()


def test_summary_names_the_bottleneck(run_dir):
    data = analyze_run(run_dir)
    s = build_summary(data)
    text = " ".join([s.headline, *s.look_at, *(k + " " + v for k, v in s.facts)])
    assert "db1 cpu" in text and "app1 cpu" in text
    # the hand-built point at the knee has no queue the fine grain can see; the white box decides
    assert data.fine is not None and data.fine.verdict.kind == "none"
    assert s.headline.startswith("Bottleneck at db1 (cpu) in the db tier")
    assert "found no saturated tier" in s.headline
    assert any("maximum throughput" in k for k, _ in s.facts)


def test_html_is_self_contained(run_dir, tmp_path):
    data = analyze_run(run_dir)
    page = render_html(data)
    js = plotly.offline.get_plotlyjs()
    assert page.count(js[:300]) == 1  # inlined exactly once
    assert not re.search(r"<script[^>]+src=", page)
    assert page.count("cdn.plot.ly") == js.count("cdn.plot.ly")  # only the library's unused topojson default
    for sid in ("load-curve", "density", "bottleneck-map"):
        assert f'id="{sid}"' in page
    # the summary comes first, before any figure
    assert page.index('id="summary"') < page.index('id="load-curve"')


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def dump_dom(html_path: Path) -> str:
    profile = tempfile.mkdtemp(prefix="tierscope-chromium-")
    try:
        out = subprocess.run(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--no-first-run",
                f"--user-data-dir={profile}",
                "--virtual-time-budget=15000",
                "--dump-dom",
                html_path.as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian package chromium)")
def test_report_renders_in_headless_chromium(run_dir, tmp_path):
    data = analyze_run(run_dir)
    path = write_report(data, tmp_path / "report.html")
    dom = dump_dom(path)
    assert "tierscope report: sweep1" in dom
    # Plotly drew its SVG: every figure section has a main-svg, and the traces have data
    sections = re.findall(r'<section id="([a-z-]+)"><h2>', dom)
    svgs = dom.count('class="main-svg"')
    assert svgs >= len([s for s in sections if s not in ("summary", "omitted")])
    lines = re.findall(r'class="js-line"[^>]*d="M([^"]+)"', dom)
    assert lines and max(len(d) for d in lines) > 20  # load curve lines with real coordinates
    assert dom.count('class="point"') >= len(LEVELS)  # markers of the load curve
    assert "<image" in dom or 'class="hm"' in dom  # heatmaps (densities, bottleneck map) drawn


def test_cli_report(run_dir, tmp_path):
    exe = Path(sys.executable).parent / "tierscope"
    out = subprocess.run(
        [str(exe), "report", str(run_dir), "-o", str(tmp_path / "r.html")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert out.returncode == 0, out.stderr  # the headline is said with medium or high confidence
    assert out.stdout.count("Bottleneck:") == 1 and "db1" in out.stdout
    assert (tmp_path / "r.html").stat().st_size > 1_000_000  # plotly.js is in the file
    bad = subprocess.run([str(exe), "report", str(tmp_path / "nope")], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "no such file or directory" in bad.stderr


def test_load_curve_falls_back_to_the_web_tier(tmp_path):
    """Without the generator's log, the web tier's requests give the load curve."""
    rng = np.random.default_rng(3)
    root = tmp_path / "nocli"
    for users in (20, 100, 180):
        _write_point(root, "1/1/0/1", users, rng, with_requests=True)
        (root / f"c1101-u{users:04d}" / "client_requests.parquet").unlink()
    curve = analyze_run(root).blackbox["1/1/0/1"].curve.to_pylist()
    for row in curve:  # X = N / (R + Z) with the generator's numbers, now measured at the web tier
        assert row["throughput"] == pytest.approx(row["users"] / (max(D, row["users"] / 100.0 - Z) + Z), rel=0.1)
