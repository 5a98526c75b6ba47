"""End to end: `tierscope run` on a tiny two-point sweep, in real namespaced hosts (or loopback).

Ground truth: the generator's own log (client_requests) against what the tracer saw at the web
tier on the wire; the manifest's status against what the test did to the system (killing a tier).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
import tomllib
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from conftest import needs_root, needs_tcpdump
from tierscope.runner import DONE, FAILED, Progress, run_experiment
from tierscope.spec import load_spec, spec_from_dict

TINY = Path(__file__).resolve().parent.parent / "examples" / "specs" / "tiny.toml"

pytestmark = [
    needs_root("the lab starts PostgreSQL as its own OS user"),
    needs_tcpdump,
]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    spec = load_spec(TINY)
    result = run_experiment(spec, out)
    return spec, result


def test_every_point_finishes_with_every_table(tiny_run):
    spec, result = tiny_run
    assert result.failed == [] and not result.interrupted
    assert len(result.done) == 2
    for pid in result.done:
        d = result.dir / pid
        manifest = json.loads((d / "manifest.json").read_text())
        assert manifest["status"] == DONE
        for table in ("requests", "client_requests", "resources", "events"):
            assert (d / f"{table}.parquet").exists(), table
        phases = manifest["phases"]
        assert phases["ramp_up"]["end_ns"] == phases["run"]["start_ns"]
        assert phases["run"]["end_ns"] - phases["run"]["start_ns"] == 5_000_000_000
        assert manifest["point"]["users"] in (5, 10)
        assert manifest["topology"] == "1S/1S/0/1S-P"


def test_sockets_util_is_established_connections_against_the_servers_limit(tiny_run):
    spec, result = tiny_run
    from tierscope.spec import expand

    c = expand(spec)[0].config
    limits = {"db1": c.soft.db.max_connections, "web1": c.soft.web.workers * c.soft.web.connections}
    res = pq.read_table(result.dir / result.done[0] / "resources.parquet").to_pylist()
    if not any(r["metric"] == "sockets_established" for r in res):
        pytest.skip("loopback fallback: no per-host network namespace")
    by = {}
    for r in res:
        by.setdefault((r["host"], r["metric"]), {})[r["ts_ns"]] = r["value"]
    for host, limit in limits.items():
        util, estab = by[(host, "sockets_util")], by[(host, "sockets_established")]
        assert util.keys() == estab.keys()
        assert all(util[t] == pytest.approx(estab[t] * 100.0 / limit) for t in util)
        assert max(estab.values()) >= 1  # the app's pool / the generator's connections
    assert ("app1", "sockets_util") not in by  # no limit the soft resources state


def test_requests_traced_at_the_web_tier_match_the_generator_log(tiny_run):
    _, result = tiny_run
    for pid in result.done:
        d = result.dir / pid
        client = pq.read_table(d / "client_requests.parquet")
        requests = pq.read_table(d / "requests.parquet")
        web = requests.filter(pc.equal(requests["tier"], "web"))
        assert client.num_rows > 10
        assert web.num_rows == client.num_rows
        tiers = set(requests.column("tier").to_pylist())
        assert {"web", "app", "db"} <= tiers


def test_more_users_more_throughput(tiny_run):
    _, result = tiny_run
    counts = {}
    for pid in result.done:
        m = json.loads((result.dir / pid / "manifest.json").read_text())
        counts[m["point"]["users"]] = m["tables"]["client_requests"]
    # closed loop far from saturation: throughput grows with users (X = N / (R + Z))
    assert counts[10] > counts[5] * 1.3


def test_report_is_written(tiny_run):
    _, result = tiny_run
    assert result.report is not None and result.report.stat().st_size > 100_000
    assert "plotly" in result.report.read_text()[:2_000_000].lower()


def test_resume_runs_only_what_is_missing(tiny_run, tmp_path):
    spec, result = tiny_run
    run_dir = tmp_path / "tiny"
    shutil.copytree(result.dir, run_dir)
    first, second = sorted(result.done)
    (run_dir / second / "manifest.json").unlink()
    before = (run_dir / first / "manifest.json").stat().st_mtime_ns
    again = run_experiment(spec, tmp_path, resume=True, report=False)
    assert again.skipped == [first]
    assert again.done == [second]
    assert (run_dir / first / "manifest.json").stat().st_mtime_ns == before


def test_run_json_gives_the_points_and_the_verdict(tiny_run, tmp_path):
    import subprocess
    import sys

    spec, result = tiny_run
    shutil.copytree(result.dir, tmp_path / "tiny")
    out = tmp_path / "verdict.json"
    cmd = [
        str(Path(sys.executable).parent / "tierscope"),
        "run",
        str(TINY),
        "-o",
        str(tmp_path),
        "--resume",
        "--json",
        str(out),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert sorted(doc["run"]["skipped"]) == sorted(result.done) and doc["run"]["failed"] == []
    assert doc["run"]["report"] == str(tmp_path / "tiny" / "report.html")
    assert sorted(r["users"] for cfg in doc["levels"].values() for r in cfg) == [5, 10]
    assert doc["headline"] and doc["confidence"]
    # the layout and the document every study leaves (tierscope.studies.document): the same
    # document in the run directory, naming the spec (not a shipped study: no seed)
    assert json.loads((tmp_path / "tiny" / "study.json").read_text()) == doc
    assert (doc["study"], doc["kind"], doc["seed"], doc["preset"]) == ("tiny", "spec", None, str(TINY))
    bad = subprocess.run(
        cmd[:-1] + [str(out / "v.json")],
        capture_output=True,  # under a file
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--json" in bad.stderr


def test_a_tier_killed_mid_run_gives_a_failed_point_and_the_sweep_goes_on(tmp_path):
    raw = tomllib.loads(TINY.read_text())
    raw["workload"]["users"] = [5, 6]
    raw["workload"]["run"] = "6s"
    spec = spec_from_dict(raw, where="killed", name="killed")
    progress = Progress()
    killed: list[int] = []

    def killer():
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not killed:
            if progress.point_index == 1 and progress.phase == "run":
                for pidfile in tmp_path.glob("*/*/app1/gunicorn.pid"):
                    pid = int(pidfile.read_text())
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            time.sleep(0.1)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    result = run_experiment(spec, tmp_path, progress=progress, report=False)
    t.join(timeout=5)
    assert killed, "the test never saw the app server running"
    assert len(result.failed) == 1 and len(result.done) == 1
    pid, reason = result.failed[0]
    assert "app1" in reason
    manifest = json.loads((result.dir / pid / "manifest.json").read_text())
    assert manifest["status"] == FAILED and "app1" in manifest["reason"]
    # nothing of the lab is left running
    assert not any(os.path.exists(f"/proc/{p}") for p in killed)
    alive_ns = set(os.popen("ip netns list").read().split())
    for m in result.dir.glob("*/manifest.json"):
        hosts = json.loads(m.read_text())["testbed"]["hosts"]
        assert hosts, m
        assert not {h["netns"] for h in hosts.values() if h["netns"]} & alive_ns


def test_ctrl_c_stops_cleanly_keeps_finished_points_and_leaves_nothing(tmp_path):
    import subprocess
    import sys

    cmd = [str(Path(sys.executable).parent / "tierscope"), "run", str(TINY), "-o", str(tmp_path), "--no-report"]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    run_dir = tmp_path / "tiny"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not list(run_dir.glob("*/manifest.json")):
        time.sleep(0.2)
    second = [d for d in run_dir.glob("users*") if not (d / "manifest.json").exists()]
    while time.monotonic() < deadline and not second:  # wait until the second point has begun
        time.sleep(0.2)
        second = [d for d in run_dir.glob("users*") if not (d / "manifest.json").exists()]
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert "interrupted" in out
    finished = list(run_dir.glob("*/manifest.json"))
    assert len(finished) == 1 and json.loads(finished[0].read_text())["status"] == DONE
    assert not second[0].exists()  # the unfinished point is not a result

    def left() -> list[str]:  # every process started for the run, by its command line
        return subprocess.run(["pgrep", "-af", str(tmp_path)], capture_output=True, text=True).stdout.splitlines()

    # the run has exited: whatever it started is gone (one second for a SIGKILLed child's exit)
    deadline = time.monotonic() + 1.0
    while left() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left() == [], out
