"""Seed 003's finding on real servers, with the shipped preset (`tierscope run ingest`): at the
seed's overload, direct inserts lose more than 98 % of the records while the queue loses none.

The preset holds the database host to a thousandth of a core during the load (seed 003's database
stored 16-36 single inserts/s against ~3,000 records/s offered; here about 1/s against the few
hundred/s the app server takes, fewer on a machine busy with other suites), so the margin to 98 %
does not rest on this machine being quiet: on 2026-11-27, at load averages of 2-16 and once beside
three CPU-spinning shells, direct mode lost 99.6-99.8 % and the test took 82-91 s. Every number
asserted is counted by the run itself: what the driver sent and saw acknowledged against the
(client, id) keys read back from the database."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import needs_root
from tierscope.studies import loss_finding_of
from tierscope.studies.logservice import finding, run_mode
from tierscope.studies.logservice_preset import load_preset

needs_root = needs_root("PostgreSQL runs as its own OS user")


@needs_root
def test_seed_003_direct_inserts_lose_over_98_percent_the_queue_none(tmp_path):
    from tierscope.cli.demo import preset
    from tierscope.testbed.lab import namespaces_unavailable

    reason = namespaces_unavailable()
    if reason:  # the loopback fallback has no CPU limit: the finding would be left unchecked
        pytest.skip(f"the database's CPU limit needs namespaced hosts: {reason}")
    modes, load, service, _ = load_preset(preset("ingest"))
    assert modes == ["direct", "queue", "durable"] and service.db_cpu and service.db_cpu <= 0.002
    results = {  # durable mode's promise (nothing acknowledged lost) is the kill drills' (test_logservice.py)
        m: run_mode(m, service, replace(load, run=m), tmp_path / m, testbed_mode="namespaces")
        for m in ("direct", "queue")
    }
    for r in results.values():
        assert r.testbed == "namespaces", (r.mode, r.testbed, r.notes)
        assert r.error == "", (r.mode, r.error)  # the database was read back
        assert r.sent == load.total == load.clients * load.records
        assert r.stored is not None and r.lost is not None and r.stored + r.lost == r.sent
        assert r.lost_acknowledged == 0, r  # counted by (client, id) in the database
    direct, queue = results["direct"], results["queue"]
    assert direct.lost / direct.sent > 0.98, direct  # seed 003: 98.7-99.5 % lost
    assert direct.refused > direct.sent / 2, direct  # refused at the door: no database connection free
    assert queue.lost == 0 and queue.stored == queue.sent, queue
    verdict = finding(list(results.values()))
    assert verdict.startswith("direct loses 9") and verdict.endswith("; queue loses none"), verdict
    # the study's own finding: its claim in presets/studies.toml (direct loses more than 98 %, the
    # queue none; durable mode, not run here, is not in it) checked as `tierscope run ingest` does
    stated = loss_finding_of(verdict, list(results.values()), preset("ingest"))
    assert stated.holds is True, stated.line()
    print(f"\n{verdict}")
    for r in results.values():
        print(f"{r.mode}: sent {r.sent}, acknowledged {r.acknowledged}, stored {r.stored}, load {r.load_s:.1f} s")
