"""`tierscope analyze` as a new user meets it (issue 11): output paths checked before the work,
pcap and binary files refused in one line, events tables accepted next to traces, `--json`, and
the exit statuses (0 verdict, 3 low confidence, 4 not enough data, 2 bad input)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from independent_sim import freeze_events, periodic, simulate, write_otlp  # simpy, the test extra
from test_analysis_independent import WARMUP_S, shop  # noqa: E402
from tierscope import tables  # noqa: E402
from tierscope.analysis.experiment import analyze_files, run_fine  # noqa: E402

EXE = Path(sys.executable).parent / "tierscope"
ENV = {**os.environ, "COLUMNS": "200"}


def tierscope(*args) -> subprocess.CompletedProcess:
    return subprocess.run([str(EXE), *map(str, args)], capture_output=True, text=True, timeout=300, env=ENV)


@pytest.fixture(scope="module")
def saturated_db(tmp_path_factory) -> Path:
    """A database saturated throughout (independent model): a verdict with medium or high confidence."""
    result = simulate(shop(), 24.0, WARMUP_S)
    return write_otlp(result.spans, tmp_path_factory.mktemp("sat") / "spans.json")


def one_error_line(out: subprocess.CompletedProcess) -> str:
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr
    return lines[0]


def test_an_output_directory_through_a_file_is_refused_before_the_import(tmp_path, saturated_db):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = tierscope("analyze", saturated_db, "-o", blocker / "out")
    assert out.returncode == 2
    assert "cannot create it" in one_error_line(out) and "imported" not in out.stdout
    out = tierscope("analyze", saturated_db, "-o", tmp_path / "ok", "--json", tmp_path)
    assert out.returncode == 2 and "is a directory" in one_error_line(out)
    assert not (tmp_path / "ok" / "requests.parquet").exists()


def test_a_window_below_one_millisecond_is_refused(tmp_path, saturated_db):
    out = tierscope("analyze", saturated_db, "--window-ms", "0.5", "-o", tmp_path / "o")
    assert out.returncode == 2 and "at least 1 ms" in one_error_line(out)


def test_a_pcap_is_sent_to_tierscope_trace_and_binary_bytes_are_not_printed(tmp_path):
    pcap = tmp_path / "capture.pcap"
    pcap.write_bytes(b"\xd4\xc3\xb2\xa1" + bytes(range(256)) * 4)
    out = tierscope("analyze", pcap, "-o", tmp_path / "o")
    # the commands of the hint run as given: `trace -o` names the requests file (README: a pcap is traced first)
    hint = f"tierscope trace {pcap} -o requests.parquet, then: tierscope analyze requests.parquet"
    assert out.returncode == 2 and hint in one_error_line(out)
    junk = tmp_path / "junk.bin"
    junk.write_bytes(bytes(range(256)) * 64)
    out = tierscope("analyze", junk, "-o", tmp_path / "o")
    line = one_error_line(out)
    assert out.returncode == 2 and all(c.isprintable() for c in line) and len(line) < 400


def test_json_and_exit_status_agree_with_the_analysis(tmp_path, saturated_db):
    out = tierscope("analyze", saturated_db, "-o", tmp_path / "o", "--json", "-")
    doc = json.loads(out.stdout)
    expected = analyze_files([saturated_db]).fine.verdict
    assert doc["verdict"]["kind"] == expected.kind == "single" and doc["verdict"]["tiers"] == expected.tiers
    assert doc["verdict"]["confidence"] == pytest.approx(expected.confidence, abs=1e-3)
    assert out.returncode == (0 if expected.confidence >= 0.5 else 3) == doc["status"]
    assert doc["saturated_share"]["postgres"] >= 0.9 and doc["n_star"]["db1"]["basis"] == "queue signature"


def test_a_trace_too_short_exits_4(tmp_path):
    result = simulate(shop(), 1.5, WARMUP_S)  # 30 windows of 50 ms: fewer than the 40 needed
    path = write_otlp(result.spans, tmp_path / "short.json")
    out = tierscope("analyze", path, "-o", tmp_path / "o", "--json", tmp_path / "v.json")
    assert out.returncode == 4, out.stderr
    assert json.loads((tmp_path / "v.json").read_text())["verdict"]["kind"] == "insufficient"


def test_an_events_table_next_to_the_trace_feeds_the_pause_detection(tmp_path):
    system = shop(db_s=0.0015, app_cores=2, freezes=periodic(0.51, 1.0, 0.15, 60))
    result = simulate(system, 24.0, WARMUP_S)
    trace = write_otlp(result.spans, tmp_path / "spans.json")
    events = freeze_events(system, WARMUP_S, 24.0)
    side = tables.write(tables.conform(events, "events"), tmp_path / "events.parquet", "events")
    out = tierscope("analyze", trace, side, "-o", tmp_path / "o", "--json", "-", "--verbose")
    doc = json.loads(out.stdout)
    data = analyze_files([trace])
    with_events, _ = run_fine(data.requests, events, data.window_ns)
    assert doc["verdict"]["kind"] == with_events.verdict.kind == "alternating"
    assert doc["saturated_share"] == pytest.approx(with_events.saturated_share, abs=1e-3)
    assert "app1 was paused" in out.stderr  # the summary (on stderr with --json -) names the pauses
