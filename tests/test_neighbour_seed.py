"""Seed 001 §5's finding on real servers, with the shipped preset (`tierscope run rubbos-neighbour`):
a collocated neighbour whose CPU demand turns bursty raises the system's response time although
its mean CPU stays the same.

The preset runs the demo's RUBBoS system (nginx, the app server, PostgreSQL on a quarter core in
namespaced hosts with cgroup CPU quotas) at 50 users with a CPU burner in the database host's
cgroup (at nice -10) asking 0.1 cores on average: steady (I = 1) and bursty (I = 400, ON and OFF
periods of exactly their means). Every number asserted is measured by the run: response times
from the generator's log, the neighbour's CPU from its own CPU time in its events (interpolated
to the run phase), the database host's CPU from the monitor's cgroup samples; the equal means are
checked, not assumed. The measured runs are in docs/spec.md ("Seed 001 §5: a bursty neighbour").
About 2 minutes; marked `fidelity` like tests/test_fidelity.py. Needs root and PostgreSQL 15.
"""

from __future__ import annotations

import random
import re
import tomllib
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from conftest import PRESETS, needs_postgres, needs_root
from tierscope import manifest
from tierscope.analysis.experiment import analyze_run
from tierscope.runner import run_experiment
from tierscope.spec import SpecError, expand, spec_from_dict
from tierscope.studies import finding_of
from tierscope.testbed.interference import mmpp_periods, work_arrivals

PRESET = PRESETS / "rubbos-neighbour.toml"

CPU_S = re.compile(r"cpu_s_at_on=([0-9.]+) cpu_s_at_off=([0-9.]+)")


def neighbour_cores(point_dir: Path, host: str, start_ns: int, end_ns: int) -> tuple[float, int, float]:
    """The burner's mean CPU (cores) from `start_ns` to `end_ns`, its number of ON periods and its
    mean CPU while ON.

    Its events give its own CPU time at the start and end of every ON period (and so of every OFF
    one); in between the cumulative CPU time is interpolated linearly."""
    ev = pq.read_table(point_dir / "events.parquet")
    ev = ev.filter(pc.and_(pc.equal(ev["kind"], "noisy_neighbour_burst"), pc.equal(ev["host"], host)))
    points, on_s, on_cpu = [], 0.0, 0.0
    for row in ev.to_pylist():
        m = CPU_S.search(row["detail"])
        assert m, row["detail"]
        points += [(row["start_ns"], float(m[1])), (row["end_ns"], float(m[2]))]
        on_s += (row["end_ns"] - row["start_ns"]) / 1e9
        on_cpu += float(m[2]) - float(m[1])
    points.sort()
    t = np.array([p[0] for p in points], dtype=float)
    cpu = np.array([p[1] for p in points])
    assert t[0] <= start_ns and t[-1] >= end_ns, "the burner ran through the whole run phase"
    used = np.interp(end_ns, t, cpu) - np.interp(start_ns, t, cpu)
    return float(used / ((end_ns - start_ns) / 1e9)), ev.num_rows, on_cpu / on_s


def host_cores(point_dir: Path, host: str, start_ns: int, end_ns: int) -> float:
    """The host's mean CPU (cores: its cgroup's user + system time) over the monitor's samples."""
    r = pq.read_table(point_dir / "resources.parquet").to_pandas()
    r = r[(r.host == host) & r.metric.isin(["cpu_user", "cpu_system"]) & (r.ts_ns > start_ns) & (r.ts_ns <= end_ns)]
    per_sample = r.groupby("ts_ns").value.sum()
    assert len(per_sample) >= 20, len(per_sample)
    return float(per_sample.mean() / 100)


def measure(point_dir: Path) -> dict:
    run = manifest.read(point_dir / "manifest.json").phases.run
    assert run is not None
    a, b = run.start_ns, run.end_ns
    cr = pq.read_table(point_dir / "client_requests.parquet").to_pandas()
    cr = cr[cr.phase == "run"]
    ok = cr[cr.error.isna()]
    rt = (ok.end_ns - ok.start_ns).to_numpy() / 1e6
    nb, bursts, while_on = neighbour_cores(point_dir, "db1", a, b)
    return {
        "pages": len(cr),
        "errors": len(cr) - len(ok),
        "pages_per_s": len(cr) / ((b - a) / 1e9),
        "rt_mean_ms": float(rt.mean()),
        "rt_p90_ms": float(np.percentile(rt, 90)),
        "neighbour_cores": nb,
        "bursts": bursts,
        "neighbour_cores_while_on": while_on,
        "db1_cores": host_cores(point_dir, "db1", a, b),
    }


def test_the_preset_sweeps_only_the_neighbours_burstiness_and_a_bad_index_is_named():
    """No root: the two points differ in the neighbour's index of dispersion alone (a sweep path
    into an array of tables), and an index past the array's end is a spec error naming it."""
    raw = tomllib.loads(PRESET.read_text())
    steady, bursty = expand(spec_from_dict(raw, where="rubbos-neighbour.toml"))
    assert [p.id.split("-")[0] for p in (steady, bursty)] == ["burstiness1", "burstiness400"]
    a, b = steady.config.model_dump(), bursty.config.model_dump()
    assert a["interference"]["noisy_neighbour"][0].pop("burstiness") == 1
    assert b["interference"]["noisy_neighbour"][0].pop("burstiness") == 400
    assert a == b
    raw["sweep"]["matrix"] = {"interference.noisy_neighbour.1.burstiness": [1, 400]}
    with pytest.raises(SpecError, match=r"sweep.matrix.interference.noisy_neighbour.1.burstiness: .*index 0..0"):
        spec_from_dict(raw, where="rubbos-neighbour.toml")


def test_a_regular_schedule_has_the_same_mean_over_any_run_the_exponential_one_does_not():
    """No root, the preset's schedules alone, 100 seeds: over its 35 s run at I = 400 the work that
    arrives with exactly-mean ON and OFF periods is off the mean by 5 % rms (at most 10 %: less
    than one burst, 16 % of the mean); with exponential ones by 31 % rms (sqrt(I job / (u T)) is
    34 %)."""
    raw = tomllib.loads(PRESET.read_text())
    nn, run = raw["interference"]["noisy_neighbour"][0], 35
    assert raw["workload"]["run"] == f"{run}s"
    u, peak = nn["utilization"], nn["peak"]
    lam, on, off = mmpp_periods(u, 400, 0.001, peak=peak)
    dev = {}
    for regular in (False, True):
        means = []
        for seed in range(100):
            jobs = 0
            for kind, t in work_arrivals(random.Random(seed), lam, on, off, regular):
                if t > run:
                    break
                jobs += kind == "job"
            means.append(jobs * 0.001 / run)
        dev[regular] = np.array(means) / u - 1
    rms = {k: float(np.sqrt(np.mean(v**2))) for k, v in dev.items()}
    print(f"\nregular: rms {rms[True]:.3f}, max {np.abs(dev[True]).max():.3f}; exponential: rms {rms[False]:.3f}")
    assert rms[True] < 0.07 and np.abs(dev[True]).max() < on * peak / (u * run)
    assert rms[False] > 0.2


@pytest.mark.fidelity
@needs_root("the lab starts PostgreSQL as its own OS user")
@needs_postgres
def test_seed_001_5_a_bursty_neighbour_raises_response_time_at_the_same_mean_cpu(tmp_path):
    from tierscope.testbed.lab import namespaces_unavailable

    reason = namespaces_unavailable()
    if reason:  # the loopback fallback has no CPU quota to share: the finding would be left unchecked
        pytest.skip(f"the neighbour shares the database host's CPU quota, which needs namespaced hosts: {reason}")
    raw = tomllib.loads(PRESET.read_text())
    nn = raw["interference"]["noisy_neighbour"][0]
    assert nn["server"] == "db1" and nn["regular"] and nn["nice"] < 0 and raw["workload"]["users"] == [50]
    spec = spec_from_dict(raw, where="rubbos-neighbour.toml", name="rubbos-neighbour")
    result = run_experiment(spec, tmp_path, report=False)
    assert not result.interrupted and result.failed == [], result.failed
    by_i = {}
    for pid in result.done:
        point = manifest.read(result.dir / pid / "manifest.json").point
        by_i[point.params["interference.noisy_neighbour.0.burstiness"]] = measure(result.dir / pid)
    assert sorted(by_i) == [1, 400]
    steady, bursty = by_i[1], by_i[400]
    for i, m in by_i.items():
        print(f"\nI={i}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in m.items()))
    for m in (steady, bursty):
        assert m["pages"] > 1200 and m["errors"] <= 0.01 * m["pages"], m
        # the neighbour got what it asked for (0.1 cores) in the run phase
        assert m["neighbour_cores"] == pytest.approx(nn["utilization"], rel=0.2), m
    assert steady["bursts"] == 1 and bursty["bursts"] >= 5  # I = 1: always ON; I = 400: ~2.2 s of 5.5
    # the same mean: the neighbour's own CPU and its host's, database included
    assert bursty["neighbour_cores"] == pytest.approx(steady["neighbour_cores"], rel=0.1)
    assert bursty["db1_cores"] == pytest.approx(steady["db1_cores"], rel=0.15)
    # the bursts were bursts: while ON the burner got well above its mean (0.15-0.17 cores of the
    # 0.25 it asks on a machine that gives the lab its CPU; 0.12 when other work pegged both cores
    # for the whole run and the response times of both points were the machine's, 175-188 ms)
    assert bursty["neighbour_cores_while_on"] > 1.3 * bursty["neighbour_cores"], (
        "the machine did not give the database host its quota: the neighbour's bursts were smoothed",
        bursty,
    )
    # and yet the response time rises with burstiness (seed 001 Fig. 8): 2.2-10.7x in five runs,
    # two of them beside two CPU-spinning shells (docs/spec.md)
    assert bursty["rt_mean_ms"] > 1.5 * steady["rt_mean_ms"], (steady, bursty)
    # the study's own finding on the same run: its claim in presets/studies.toml (mean response time
    # 1.5x at db1's mean CPU within 15 %) checked as `tierscope run rubbos-neighbour` checks it (the
    # analysis reads the two points' tables: 0.1 s, no capture to analyse)
    finding = finding_of(analyze_run(result.dir), PRESET)
    assert finding.holds is True, finding.line()
