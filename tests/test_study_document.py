"""One document and one run-directory layout for every study (issue 22 item 1): what
`tierscope run NAME --json` writes and every run leaves as OUT/<run>/study.json, whichever runner
the study's kind names. The experiment runner's is checked on a real run in test_runner.py, the
log service's in test_logservice_seed.py; here the document itself and the scaling study's
plumbing (its servers replaced by rows whose figures the test computes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tierscope.analysis.study import Finding
from tierscope.studies import presets_dir
from tierscope.studies.document import SCHEMA, study_document
from tierscope.studies.scaling import combine, node_work, write_results


def test_the_document_has_the_common_keys_and_what_the_kind_adds(tmp_path):
    found = Finding("db, then app", True, "as claimed", claim="db -> app", figures=[{"config": "a"}])
    doc = study_document(
        name="rubbos-scaleout",
        kind="spec",
        preset=Path("p.toml"),
        seed="000 §3",
        finding=found,
        run_dir=tmp_path,
        done=["p1"],
        skipped=["p0"],
        failed=[("p2", "tier died")],
        report=tmp_path / "report.html",
        body={"headline": "db CPU"},
    )
    assert doc["schema"] == SCHEMA and (doc["study"], doc["kind"], doc["seed"]) == ("rubbos-scaleout", "spec", "000 §3")
    assert doc["finding"]["holds"] is True and doc["finding"]["figures"] == [{"config": "a"}]
    assert doc["run"] == {
        "dir": str(tmp_path),
        "report": str(tmp_path / "report.html"),
        "done": ["p1"],
        "skipped": ["p0"],
        "failed": [{"point": "p2", "reason": "tier died"}],
    }
    assert doc["headline"] == "db CPU"
    json.dumps(doc)  # a JSON document as it is
    with pytest.raises(ValueError, match="may not set run"):
        study_document(
            name="x", kind="spec", preset="x", seed=None, finding=None, run_dir=tmp_path, done=[], body={"run": 1}
        )


def _row(nodes: int, ops_per_process: int) -> dict:
    """A Galera YCSB-B row of `nodes` nodes, each node's driver process doing `ops_per_process`
    operations in 10 s (what tierscope.studies.scaling.combine makes of the engine's summaries)."""
    summaries = [
        {
            "ops": ops_per_process,
            "ops_per_s": ops_per_process / 10,
            "errors": 0,
            "threads": 2,
            "operations": {"READ": {"count": ops_per_process}},
        }
    ] * nodes
    per = {
        f"db{i}": node_work("galera", {"Com_stmt_execute": ops_per_process, "Handler_update": 0}, 10.0)
        for i in range(1, nodes + 1)
    }
    return combine("galera", nodes, "ycsb-b", summaries, [], per)


def test_the_scaling_study_leaves_the_layout_and_the_document_of_every_study(tmp_path, monkeypatch):
    from tierscope.cli.run import run as run_verb

    rows = [_row(1, 8000), _row(3, 9000)]  # 800 ops/s on one node; 2,700 on three: 900 per node

    def fake_run_scaling(preset, out, say, workdir):
        write_results(rows, out, {"preset": preset.name})
        return rows

    monkeypatch.setattr("tierscope.studies.scaling.run_scaling", fake_run_scaling)
    monkeypatch.setattr("os.geteuid", lambda: 0)
    import typer

    app = typer.Typer()
    app.command()(run_verb)
    res = CliRunner().invoke(app, ["oltp-scaling", "-o", str(tmp_path), "--json", str(tmp_path / "doc.json")])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "doc.json").read_text())
    run_dir = tmp_path / "oltp-scaling"
    assert json.loads((run_dir / "study.json").read_text()) == doc
    assert (doc["study"], doc["kind"], doc["seed"]) == ("oltp-scaling", "oltp-scaling", "002")
    assert doc["preset"] == str(presets_dir() / "oltp-scaling.toml")
    assert doc["run"]["done"] == ["galera-1-ycsb-b", "galera-3-ycsb-b"] and doc["run"]["dir"] == str(run_dir)
    assert [r["throughput_per_node"] for r in doc["rows"]] == [800.0, 900.0]
    # the finding, per node from the fewest nodes to the most: 800 -> 900, 1.12x
    assert "galera ycsb-b 800 -> 900" in doc["finding"]["text"] and "(1.12x)" in doc["finding"]["text"]
    assert doc["finding"]["holds"] is None  # the catalog states figures, it claims nothing
    for name in ("results.parquet", "nodes.parquet", "results.json"):
        assert (run_dir / name).exists(), name
    page = (run_dir / "report.html").read_text()
    assert doc["run"]["report"] == str(run_dir / "report.html")
    assert (
        "Throughput per node" in page and "800 -&gt; 900" in page and "db3 9000/0" in page
    )  # each node served its own 9,000
    assert "Finding:" in res.output and "1.12x" in res.output


def test_options_the_scaling_study_cannot_use_are_refused(tmp_path):
    import typer

    from tierscope.cli.run import run as run_verb

    app = typer.Typer()
    app.command()(run_verb)
    res = CliRunner().invoke(app, ["oltp-scaling", "-o", str(tmp_path), "--loopback"])
    assert res.exit_code == 2 and "--loopback: not for the OLTP scaling study" in res.output
    assert not (tmp_path / "oltp-scaling").exists()
