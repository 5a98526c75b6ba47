"""The study's finding in the HTML report (issue 22 follow-up): the report of a run of a shipped
study says what the study claims, whether it holds and the figures behind it, as the terminal's
"Finding:" line does; and the bottleneck map names resources as users read them ("db CPU quota",
not "db cpu_quota") in the text, the HTML and the --json document. Small synthetic run directories
(tests/synthetic_runs.py, no lab)."""

from __future__ import annotations

import html
import json
import re

from typer.testing import CliRunner

from conftest import PRESETS
from synthetic_runs import memory_run
from tierscope.analysis.experiment import analyze_run
from tierscope.report import render_html
from tierscope.studies import finding_of_run

AS_CLAIMED = {"128MiB": "disk_util", "330MiB": "app1:connections_util", "1GiB": "cpu_quota"}
SWAPPED = {"128MiB": "cpu_quota", "330MiB": "app1:connections_util", "1GiB": "disk_util"}


def finding_section(page: str) -> str:
    m = re.search(r'<section class="finding (\w+)" id="finding">(.*?)</section>', page, re.S)
    assert m is not None, "no finding section"
    return m[1] + " " + " ".join(html.unescape(re.sub(r"<[^>]+>", " ", m[2])).split())


def test_the_report_of_a_run_whose_claim_holds_states_the_finding_and_its_figures(tmp_path):
    run = memory_run(tmp_path / "run", AS_CLAIMED)
    data = analyze_run(run)
    finding = finding_of_run(data, run)
    assert finding is not None and finding.holds is True
    text = finding_section(render_html(data, finding=finding))
    assert text.startswith("holds ")
    assert (
        "The study's finding holds: db disk at db memory 128 MiB, app connections at db memory 330 MiB,"
        " db CPU at db memory 1 GiB" in text
    )
    assert "Claimed: db disk at 128MiB; app connections at 330MiB; db CPU at 1GiB" in text
    assert "Found: " + finding.text in text
    # the figures: one row per configuration, the bottleneck by tier and resource
    assert "db memory 128 MiB" in text and "db disk (db1 above 95 % in 100 % of the samples at" in text
    assert "db CPU quota (db1 above 95 % in 100 % of the samples at" in text
    assert "cpu_quota" not in text and "disk_util" not in text


def test_the_report_says_does_not_hold_when_the_run_contradicts_the_claim(tmp_path):
    run = memory_run(tmp_path / "run", SWAPPED)
    data = analyze_run(run)
    finding = finding_of_run(data, run)
    assert finding is not None and finding.holds is False
    text = finding_section(render_html(data, finding=finding))
    assert text.startswith("fails ")
    assert "The study's finding does not hold: db memory 128 MiB: expected db disk, found CPU-bound" in text
    assert "db CPU quota (db1 above 95 %" in text and "db disk (db1 above 95 %" in text


def test_a_report_without_a_study_has_no_finding_section(tmp_path):
    run = memory_run(tmp_path / "run", AS_CLAIMED, study=None)
    data = analyze_run(run)
    assert finding_of_run(data, run) is None
    assert 'id="finding"' not in render_html(data)
    # a run of a spec that is not a shipped study: its bottlenecks, nothing checked
    (run / "run.json").write_text(json.dumps({"spec": str(tmp_path / "mine.toml")}))
    finding = finding_of_run(data, run)
    assert finding is not None and finding.holds is None
    text = finding_section(render_html(data, finding=finding))
    assert text.startswith("undecided ") and "No stated finding to check: not a shipped study." in text
    assert "Claimed" not in text and "db memory 128 MiB: disk-bound" in text


def test_the_runner_and_tierscope_report_write_the_finding_in_the_html(tmp_path):
    from tierscope.cli import app
    from tierscope.runner import write_run_report
    from tierscope.spec import load_spec

    run = memory_run(tmp_path / "run", SWAPPED)
    path, _, _ = write_run_report(run, load_spec(PRESETS / "tpcw-memory.toml"))
    assert "The study's finding does not hold" in finding_section(path.read_text())
    out = tmp_path / "again.html"
    result = CliRunner().invoke(app, ["report", str(run), "-o", str(out), "--json", str(tmp_path / "v.json")])
    assert "Finding:" in result.output and "does not hold" in result.output, result.output
    assert "The study's finding does not hold" in finding_section(out.read_text())
    doc = json.loads((tmp_path / "v.json").read_text())
    assert doc["finding"]["holds"] is False


def test_the_bottleneck_map_names_the_resource_as_read_in_text_html_and_json(tmp_path):
    from rich.console import Console

    from tierscope.analysis.summary import build_summary
    from tierscope.cli._output import verdict_document
    from tierscope.report import configuration_table

    run = memory_run(tmp_path / "run", AS_CLAIMED)
    data = analyze_run(run)
    assert data.bmap is not None
    rows = {r["config"].split("=")[-1]: r for r in data.bmap.to_pylist()}
    assert rows["1GiB"]["bottleneck"] == "db CPU quota" and rows["1GiB"]["bottleneck_metric"] == "db cpu_quota"
    assert rows["128MiB"]["bottleneck"] == "db disk" and rows["128MiB"]["bottleneck_metric"] == "db disk_util"
    console = Console(width=200, record=True)
    console.print(configuration_table(data))
    table = console.export_text()
    assert "db CPU quota (100% of the time)" in table and "db disk (100% of the time)" in table
    assert "cpu_quota" not in table and "disk_util" not in table
    summary = build_summary(data)
    assert any("bottleneck db CPU quota (bottleneck map)" in line for line in summary.look_at), summary.look_at
    page = render_html(data, summary)
    assert "db CPU quota (g" in page and "db cpu_quota" not in page
    doc = json.loads(json.dumps(verdict_document(data, summary)))
    assert [c["label"] for c in doc["configurations"]] == ["db memory 128 MiB", "db memory 330 MiB", "db memory 1 GiB"]
    assert rows["330MiB"]["bottleneck"] == "app connections"
    by_label = {c["label"]: c for c in doc["configurations"]}
    assert by_label["db memory 1 GiB"]["bottleneck"] == "db CPU quota"
    assert by_label["db memory 1 GiB"]["bottleneck_metric"] == "db cpu_quota"
    assert by_label["db memory 128 MiB"]["tier"] == "db" and by_label["db memory 128 MiB"]["resource"] == "disk"
