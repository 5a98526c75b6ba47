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

import json

import pytest

from conftest import needs_root
from tierscope.cli.ingest import run_study
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
    # as `tierscope run ingest --json FILE` runs it, durable mode left out (its promise, nothing
    # acknowledged lost, is the kill drills': test_logservice.py)
    code = run_study(preset("ingest"), tmp_path, modes=["direct", "queue"], json_out=str(tmp_path / "doc.json"))
    doc = json.loads((tmp_path / "doc.json").read_text())
    results = {r["mode"]: r for r in doc["results"]}
    assert sorted(results) == ["direct", "queue"], doc["run"]
    for r in results.values():
        assert r["testbed"] == "namespaces", (r["mode"], r["testbed"], r["notes"])
        assert r["error"] == "", (r["mode"], r["error"])  # the database was read back
        assert r["sent"] == load.total == load.clients * load.records
        assert r["stored"] is not None and r["lost"] is not None and r["stored"] + r["lost"] == r["sent"]
        assert r["lost_acknowledged"] == 0, r  # counted by (client, id) in the database
    assert code == 0
    direct, queue = results["direct"], results["queue"]
    assert direct["lost"] / direct["sent"] > 0.98, direct  # seed 003: 98.7-99.5 % lost
    assert direct["refused"] > direct["sent"] / 2, direct  # refused at the door: no database connection free
    assert queue["lost"] == 0 and queue["stored"] == queue["sent"], queue
    # the study's own finding: its claim in presets/studies.toml (direct loses more than 98 %, the
    # queue none; durable mode, not run here, is not in it), as the run states it
    stated = doc["finding"]
    assert stated["text"].startswith("direct loses 9") and stated["text"].endswith("; queue loses none"), stated
    assert stated["holds"] is True, stated
    # the run directory every study leaves: a directory per mode, study.json (the same document as
    # --json) and the report with the finding
    run_dir = tmp_path / "ingest"
    assert (doc["study"], doc["kind"], doc["seed"], doc["run"]["dir"]) == ("ingest", "logservice", "003", str(run_dir))
    assert doc["run"]["done"] == ["direct", "queue"] and doc["run"]["failed"] == []
    assert json.loads((run_dir / "study.json").read_text()) == doc
    assert all((run_dir / m / "result.json").exists() for m in results)
    page = (run_dir / "report.html").read_text()
    assert doc["run"]["report"] == str(run_dir / "report.html") and "lost though acknowledged" in page
    assert stated["text"].split(" (")[0] in page
    print(f"\n{stated['text']}")
    for r in results.values():
        print(
            f"{r['mode']}: sent {r['sent']}, acknowledged {r['acknowledged']}, stored {r['stored']}, load {r['load_s']:.1f} s"
        )
