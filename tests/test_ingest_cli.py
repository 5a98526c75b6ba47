"""`tierscope analyze` end to end: files in, summary out, requests.parquet written, clear errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

EXE = Path(sys.executable).parent / "tierscope"
ENV = {**os.environ, "COLUMNS": "200"}


def _run(*args):
    return subprocess.run([str(EXE), *args], capture_output=True, text=True, timeout=120, env=ENV)


def _zipkin(path: Path, n: int) -> None:
    spans = []
    for i in range(n):
        t = 1_763_800_000_000_000 + i * 20_000
        spans.append(
            {
                "traceId": f"{i + 1:016x}",
                "id": f"{i + 1:016x}",
                "name": "get /",
                "kind": "SERVER",
                "timestamp": t,
                "duration": 15_000,
                "localEndpoint": {"serviceName": "web"},
            }
        )
        spans.append(
            {
                "traceId": f"{i + 1:016x}",
                "parentId": f"{i + 1:016x}",
                "id": f"c{i + 1:015x}",
                "name": "select",
                "kind": "CLIENT",
                "timestamp": t + 2_000,
                "duration": 10_000,
                "localEndpoint": {"serviceName": "web"},
                "remoteEndpoint": {"serviceName": "db"},
            }
        )
    spans.append({"traceId": "ff", "id": "ee", "kind": "SERVER"})  # malformed: no timestamp
    path.write_text(json.dumps(spans))


def test_analyze_writes_requests_and_reports_skips(tmp_path):
    src = tmp_path / "spans.json"
    _zipkin(src, 200)
    out = _run("analyze", str(src), "-o", str(tmp_path / "out"), "--window-ms", "20")
    assert out.returncode == 0, out.stderr
    assert "400 requests at 2 tier(s) db, web" in out.stdout
    assert "skipped 1 malformed record(s)" in out.stdout and f"{src}:$[400]" in out.stdout
    assert out.stdout.count("Bottleneck:") == 1  # one verdict line
    t = pq.read_table(tmp_path / "out" / "requests.parquet")
    assert t.num_rows == 400 and sorted(set(t.column("tier").to_pylist())) == ["db", "web"]


def test_analyze_rejects_unknown_file_with_one_error(tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_text("hello\nworld\n")
    out = _run("analyze", str(bad), "-o", str(tmp_path / "out"))
    assert out.returncode == 2
    assert "format not recognised" in out.stderr and "--format" in out.stderr
    assert "Traceback" not in out.stderr
    forced = _run("analyze", str(bad), "--format", "nginx", "-o", str(tmp_path / "out"))
    assert forced.returncode == 2 and "not an nginx access log" in forced.stderr
    assert not (tmp_path / "out" / "requests.parquet").exists()


def test_report_of_plain_trace_files(tmp_path):
    src = tmp_path / "spans.json"
    _zipkin(src, 50)
    out = _run("report", str(src), "-o", str(tmp_path / "r.html"))
    assert out.returncode == 4, out.stderr  # 50 requests over 1 ms: a report, but not enough data for a verdict
    page = (tmp_path / "r.html").read_text()
    assert "tierscope report: spans.json" in page and "skipped 1 malformed record" in page
    assert "workload-level analyses" in page  # the note saying why the coarse sections are missing
