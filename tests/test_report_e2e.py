"""End to end on a real web server: wrk drives a real nginx, `tierscope analyze` imports its access
log and writes the report; the row count is checked against wrk's own count."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tierscope.services.base import free_port

EXE = Path(sys.executable).parent / "tierscope"
CONNECTIONS = 8


@pytest.fixture(scope="module")
def wrk_log(tmp_path_factory):
    if not (shutil.which("nginx") or os.path.exists("/usr/sbin/nginx")):
        pytest.skip("nginx is not installed (Debian package nginx-light)")
    if not shutil.which("wrk"):
        pytest.skip("wrk is not installed (Debian package wrk)")
    from tierscope.services.nginx import Nginx
    from tierscope.testbed.host import Host

    work = tmp_path_factory.mktemp("e2e")
    (work / "www").mkdir()
    (work / "www" / "index.html").write_text("x" * 2048)
    server = Nginx(Host.loopback(), free_port(), work / "run", root=work / "www")
    with server:
        out = subprocess.run(
            ["wrk", "-t1", f"-c{CONNECTIONS}", "-d2s", server.url + "/index.html"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 0, out.stderr
        count = int(re.search(r"(\d+) requests in", out.stdout).group(1))
        time.sleep(0.3)
    log = work / "access.log"
    shutil.copy(server.access_log, log)
    return log, count


def test_analyze_real_nginx_log_with_report(wrk_log, tmp_path):
    log, wrk_count = wrk_log
    out = subprocess.run(
        [str(EXE), "analyze", str(log), "-o", str(tmp_path / "out"), "--report", "--json", str(tmp_path / "v.json")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "200"},
    )
    # one nginx log: a verdict, said with whatever confidence it earned (0 medium/high, 3 low)
    verdict = json.loads((tmp_path / "v.json").read_text())["verdict"]
    assert out.returncode == (0 if verdict["band"] in ("high", "medium") else 3), out.stderr
    t = pq.read_table(tmp_path / "out" / "requests.parquet")
    # nginx logs every response wrk counted, plus at most the requests in flight when wrk stopped
    assert wrk_count <= t.num_rows <= wrk_count + CONNECTIONS, (wrk_count, t.num_rows)
    assert out.stdout.count("Bottleneck:") == 1
    page = (tmp_path / "out" / "report.html").read_text()
    assert "tierscope report: access.log" in page
    assert 'id="timeline"' in page and 'id="main-sequence"' in page
