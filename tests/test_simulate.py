"""The simulator against queueing arithmetic (Little's law, the utilisation law, the MMPP's index
of dispersion) and against its own tables (links, pauses, ground truth)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from conftest import ROOT
from tierscope import tables
from tierscope.analysis.windows import Intervals, share_above
from tierscope.simulate import SpecError, load_spec, parse_spec, simulate
from tierscope.simulate.arrivals import mmpp2_for, open_arrivals


def spec(**over):
    base = {
        "seed": 4,
        "duration_s": 20,
        "warmup_s": 1,
        "workload": {"users": 200, "think_time_s": 0.5},
        "tier": [
            {"name": "web", "cores": 2, "service_ms": 0.5},
            {"name": "app", "cores": 2, "service_ms": 2.0, "calls": 2},
            {"name": "db", "cores": 1, "service_ms": 1.0},
        ],
    }
    base.update(over)
    return parse_spec(base)


def test_littles_law_and_the_utilisation_law_hold():
    s = spec()
    sim = simulate(s)
    c = sim.client_requests.to_pandas()
    run_s = s.duration_s - s.warmup_s
    x = len(c) / run_s
    r = ((c.end_ns - c.start_ns) / 1e9).mean()
    # closed system: N = X (R + Z)
    assert s.workload.users == pytest.approx(x * (r + s.workload.think_time_s), rel=0.05)
    # utilisation law: U = X * D / cores, D = service per request at the tier
    cpu = sim.resources.to_pandas().groupby("host").value.mean() / 100
    assert cpu["app1"] == pytest.approx(x * 0.002 / 2, rel=0.08)
    # the db is called twice per app request: D_db = 2 x 1 ms
    assert cpu["db1"] == pytest.approx(x * 2 * 0.001 / 1, rel=0.08)


def test_tables_conform_and_links_nest():
    sim = simulate(spec())
    for name in ("requests", "client_requests", "events", "resources"):
        tables.conform(getattr(sim, name), name)
    r = sim.requests.to_pandas().set_index("request_id")
    db = r[r.tier == "db"]
    orphans = ~db.parent_id.isin(r.index)  # callers that arrived during the warm-up (not written)
    assert orphans.mean() < 0.01
    db = db[~orphans]
    parents = r.loc[db.parent_id]
    assert (parents.tier.values == "app").all()
    # a call lies inside its caller's interval (synchronous calls)
    assert (db.arrival_ns.values >= parents.arrival_ns.values).all()
    assert (db.departure_ns.values <= parents.departure_ns.values).all()
    # every app request made exactly two db calls (calls = 2) unless cut by the warm-up or the end
    per_parent = db.groupby("parent_id").size()
    assert (per_parent.value_counts().idxmax()) == 2
    assert set(r.status) == {"200", "OK"}


def test_freezes_stop_the_frozen_tier_and_are_written_as_events():
    s = spec(
        tier=[
            {"name": "app", "cores": 2, "service_ms": 1.0, "freeze": {"period_s": 0.5, "duration_s": 0.1}},
            {"name": "db", "cores": 1, "service_ms": 0.5},
        ]
    )
    sim = simulate(s)
    ev = sim.events.to_pandas()
    ev = ev[ev.kind == "injected_pause"]
    assert set(ev.host) == {"app1"}
    assert len(ev) == pytest.approx((s.duration_s - s.warmup_s) / 0.5, abs=3)
    assert ((ev.end_ns - ev.start_ns) <= 100_000_000).all()
    r = sim.requests.to_pandas()
    app_done = np.sort(r[r.tier == "app"].departure_ns.values)
    # no app request completes strictly inside a pause
    for a, b in zip(ev.start_ns.values, ev.end_ns.values):
        inside = np.searchsorted(app_done, b, "left") - np.searchsorted(app_done, a, "right")
        assert inside == 0
    truth = sim.saturation_truth.to_pandas()
    assert (truth[truth.server == "app1"].cause.str.contains("freeze")).any()


def test_cpu_saturation_truth_is_the_time_with_a_queue():
    # one tier, one core, threads plenty: saturated (a request waits for the core) exactly when
    # more than one request is in the server, which the requests table shows independently
    s = spec(
        tier=[{"name": "db", "cores": 1, "threads": 10_000, "service_ms": 2.0}],
        workload={"users": 400, "think_time_s": 1.0},
    )
    sim = simulate(s)
    r = sim.requests
    base = s.start_ns
    a = np.asarray(r["arrival_ns"]) - base
    d = np.asarray(r["departure_ns"]) - base
    n_windows = int(s.duration_s * 20) + 1
    above = share_above([Intervals(np.zeros(a.size, np.int32), a, d, +1)], np.array([1.0]), 1, n_windows, 50_000_000)
    t = sim.saturation_truth.to_pandas()
    truth_s = ((t.end_ns - t.start_ns) / 1e9).sum()
    assert set(t.cause) == {"cpu"}
    # requests still in the server at the end are not in the table: allow a small difference
    assert truth_s == pytest.approx(above.sum() * 0.05, rel=0.02, abs=0.05)
    assert truth_s > 1.0


def test_mmpp_index_of_dispersion_matches_the_spec():
    users, think, index = 100, 1.0, 20.0
    mmpp = mmpp2_for(users, think, index, surge_share=0.1, surge_factor=5)
    assert mmpp.index_of_dispersion(users) == pytest.approx(index)
    horizon, window = 2000.0, 10.0
    times = np.asarray(open_arrivals(mmpp, users, horizon, seed=7))
    counts = np.bincount((times // window).astype(int), minlength=int(horizon / window))
    assert counts.mean() / window == pytest.approx(users / think, rel=0.05)
    # counts over a window T of an MMPP: I(T) = 1 + (I - 1)(1 - (1 - e^{-rT}) / (rT))
    r = mmpp.to_surge + mmpp.to_normal
    expected = 1 + (index - 1) * (1 - (1 - np.exp(-r * window)) / (r * window))
    assert counts.var(ddof=1) / counts.mean() == pytest.approx(expected, rel=0.35)


def test_spec_errors_name_the_file_and_field(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('duration_s = 5\n[workload]\nusers = 0\nthink_time_s = 1\n[[tier]]\nname = "a"\nservice_ms = 1\n')
    with pytest.raises(SpecError, match=r"bad.toml: workload.users"):
        load_spec(bad)
    bad.write_text("duration_s = \n")
    with pytest.raises(SpecError, match="not valid TOML"):
        load_spec(bad)
    with pytest.raises(SpecError, match="no service_ms for label 'b'"):
        parse_spec(
            {
                "duration_s": 1,
                "workload": {"users": 1, "think_time_s": 1, "mix": {"a": 1, "b": 1}},
                "tier": [{"name": "t", "service_ms": {"a": 1.0}}],
            }
        )


def test_cli_writes_every_table(tmp_path):
    out = tmp_path / "sim"
    bin_dir = Path(sys.executable).parent
    done = subprocess.run(
        [str(bin_dir / "tierscope"), "simulate", str(ROOT / "examples/simulate/single.toml"), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    for name in ("requests", "client_requests", "events", "resources", "saturation_truth"):
        assert pq.read_table(out / f"{name}.parquet").num_rows > 0 or name == "events"
    assert (out / "manifest.json").exists()
    examples = sorted((ROOT / "examples/simulate").glob("*.toml"))
    assert len(examples) >= 2
    for example in examples:
        load_spec(example)


def test_an_exhausted_thread_pool_is_recorded_as_threads_saturation():
    # app has 4 threads; each holds its thread while its db call (1 core, 4 ms) is served, so
    # at 400 req/s offered the db queue fills the app's pool and requests wait for a thread
    s = spec(
        tier=[
            {"name": "app", "cores": 4, "threads": 4, "service_ms": 0.2},
            {"name": "db", "cores": 1, "threads": 100, "service_ms": 4.0},
        ],
        workload={"users": 400, "think_time_s": 1.0},
    )
    truth = simulate(s).saturation_truth.to_pandas()
    app = truth[truth.server == "app1"]
    assert app.cause.str.contains("threads").any()
    assert not app.cause.str.contains("cpu").any()  # 4 cores for 4 threads: the CPU never queues
    assert (truth[truth.server == "db1"].cause == "cpu").all()


def test_a_simulator_spec_that_is_not_utf8_names_the_line_and_column(tmp_path):
    from tierscope.simulate.spec import SpecError, load_spec

    bad = tmp_path / "bad.toml"
    bad.write_bytes(b'seed = 1\nname = "caf\xe9"\n')
    with pytest.raises(SpecError, match=r"bad.toml:2:12: not UTF-8 \(byte 0xe9\)"):
        load_spec(bad)
