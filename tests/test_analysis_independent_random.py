"""The verdict on many independent systems it was not tuned for (slow: `make fidelity`).

Random 3-tier systems from the independent SimPy model (`independent_sim`): random tier names,
cores, service times, users, connection pools, and freezes of the app or the database. The truth
verdict applies the verdict rules to the model's own saturated windows (core queues, frozen while
holding requests); the analysis sees only the OTLP export. A verdict said with high confidence
must be right; the accuracy per confidence band is printed (`pytest -s`).
"""

from __future__ import annotations

import random

import pytest

from independent_sim import Page, Server, System, periodic, simulate, truth_windows, write_otlp  # simpy, the test extra
from tierscope.analysis.alternation import switches_per_second, verdict  # noqa: E402
from tierscope.analysis.experiment import analyze_files  # noqa: E402

pytestmark = pytest.mark.slow

CASES = 40
FIRST_SEED = int(__import__("os").environ.get("TIERSCOPE_FIRST_SEED", "0"))
DURATION_S = 20.0


def random_system(seed: int) -> System:
    rng = random.Random(seed)
    fe, app, db = (
        rng.choice(["web", "frontend", "nginx"]),
        rng.choice(["app", "api", "catalog"]),
        rng.choice(["db", "postgres", "mysql"]),
    )
    n_app = rng.choice([1, 1, 2])
    app_cores, db_cores = rng.choice([1, 2, 4]), rng.choice([1, 2, 4])
    s_app, s_db = rng.uniform(0.0005, 0.006), rng.uniform(0.0005, 0.008)
    users = rng.choice([50, 100, 200, 400, 600])
    connections = rng.choice([1000, 1000, 8, 16, 32])
    freeze_app = periodic(rng.uniform(0.3, 0.8), 1.0, 0.15, 60) if rng.random() < 0.3 else []
    freeze_db = periodic(rng.uniform(0.3, 0.8), 1.0, 0.1, 60) if not freeze_app and rng.random() < 0.15 else []
    servers = [Server(fe, "fe1", cores=8)]
    servers += [
        Server(app, f"{app}{i + 1}", cores=app_cores, threads=1000, connections=connections, freezes=freeze_app)
        for i in range(n_app)
    ]
    servers += [Server(db, f"{db}1", cores=db_cores, freezes=freeze_db)]
    pages = [
        Page("Home", 2, {fe: 0.0002, app: s_app * 0.5, db: s_db * 0.5}, {fe: 1, app: 1}),
        Page("Item", 3, {fe: 0.0002, app: s_app, db: s_db}, {fe: 1, app: 2}),
        Page("Search", 1, {fe: 0.0002, app: 2 * s_app, db: 3 * s_db}, {fe: 1, app: 1}),
    ]
    return System([fe, app, db], servers, pages, users=users, think_s=1.0, seed=seed)


def test_verdicts_on_random_independent_systems(tmp_path):
    rows = []
    for seed in range(FIRST_SEED, FIRST_SEED + CASES):
        system = random_system(seed)
        result = simulate(system, DURATION_S, 4.0)
        truth = truth_windows(result, system)
        expected = verdict(system.tiers, truth, switches_per_second(system.tiers, truth, 50_000_000))
        path = write_otlp(result.spans, tmp_path / f"s{seed}.json")
        got = analyze_files([path]).fine.verdict
        right = got.kind == expected.kind and set(got.tiers) == set(expected.tiers)
        band = "high" if got.confidence >= 0.8 else "medium" if got.confidence >= 0.5 else "low"
        rows.append((seed, band, right, got.text, expected.text))
    for seed, band, right, got, want in rows:
        print(f"seed {seed:2d} {band:6s} {'right' if right else 'WRONG'}: {got}  (truth: {want})")
    for band in ("high", "medium", "low"):
        mine = [r for r in rows if r[1] == band]
        if mine:
            print(f"{band}: {sum(r[2] for r in mine)}/{len(mine)} right")
    high = [r for r in rows if r[1] == "high"]
    assert len(high) >= CASES // 4
    assert all(r[2] for r in high), [r for r in high if not r[2]]
    assert sum(r[2] for r in rows) >= 0.75 * len(rows)
