"""The fine-grained analysis across many seeds (slow: `make fidelity`): the scenarios of
test_analysis_fine.py must hold for every seed, not just the ones `make test` runs."""

from __future__ import annotations

import pytest

from test_analysis_fine import one_tier, precision_recall, three_tiers
from tierscope.analysis.fine import analyze_fine
from tierscope.simulate import simulate

pytestmark = pytest.mark.slow
SEEDS = [1, 2, 3, 4, 5, 6, 7, 8, 21, 42]


@pytest.mark.parametrize("seed", SEEDS)
def test_alternating_for_every_seed(seed):
    sim = simulate(three_tiers(600, app_freeze=True, db_service_ms=2.0, index=1, seed=seed))
    fg = analyze_fine(sim.requests, sim.events)
    assert fg.verdict.kind == "alternating" and fg.verdict.tiers == ["app", "db"], fg.verdict
    for tier in ("app", "db"):
        precision, recall, _ = precision_recall(fg, sim.saturation_truth, tier)
        assert precision >= 0.9 and recall >= 0.9, (tier, precision, recall)


@pytest.mark.parametrize("seed", SEEDS)
def test_single_for_every_seed(seed):
    sim = simulate(three_tiers(600, app_freeze=False, db_service_ms=2.6, index=200, seed=seed))
    fg = analyze_fine(sim.requests, sim.events)
    assert (fg.verdict.kind, fg.verdict.tiers) == ("single", ["db"]), fg.verdict


@pytest.mark.parametrize("seed", SEEDS)
def test_none_for_every_seed(seed):
    sim = simulate(three_tiers(300, app_freeze=False, db_service_ms=2.0, index=1, seed=seed))
    assert analyze_fine(sim.requests, sim.events).verdict.kind == "none"


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("cores", [1, 2, 4, 8])
def test_n_star_for_every_seed(seed, cores):
    sim = simulate(one_tier(cores, cores * 0.5, "exponential", users=1200, seed=seed))
    ns = analyze_fine(sim.requests, sim.events).n_star["db1"]
    assert abs(ns.n_star - cores) <= 0.15 * cores, ns
