"""Ground truth for the tracer on HTTP: real nginx, real wrk and a real HTTP client on loopback,
captured by tcpdump; the tracer's rows are compared with wrk's own count, nginx's access log and
the client's own timing log."""

from __future__ import annotations

import collections
import http.client
import os
import shutil
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tierscope.services.base import free_port
from tierscope.testbed.host import Host
from tierscope.trace.capture import LiveCapture
from tierscope.trace.run import trace_capture

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="tcpdump on lo needs root"),
    pytest.mark.skipif(shutil.which("tcpdump") is None, reason="tcpdump not installed (make setup)"),
    pytest.mark.skipif(
        shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists(), reason="nginx not installed"
    ),
]

PORT = free_port()  # a port nothing listens on: parallel runs do not collide

WRK_SCRIPT = """
local n = 0
local limit = {limit}
local paths = {{"/index.html", "/missing", "/page.html?id=42"}}
request = function()
  return wrk.format("GET", paths[(n % 3) + 1])
end
response = function(status, headers, body)
  n = n + 1
  if n >= limit then wrk.thread:stop() end
end
"""


@pytest.fixture(scope="module")
def nginx(tmp_path_factory):
    from tierscope.services.nginx import Nginx

    base = tmp_path_factory.mktemp("trace-nginx")
    root = base / "root"
    root.mkdir()
    (root / "index.html").write_text("<html>" + "x" * 3000 + "</html>\n")  # > one segment? no: ~3 KB
    (root / "page.html").write_text("page\n")
    with Nginx(Host.loopback(), PORT, base / "nginx", root=root, workers=1) as ng:
        yield ng


def access_statuses(ng, skip: int) -> list[str]:
    """Status codes of the access log lines after the first `skip` (format: see services.nginx)."""
    lines = ng.access_log_lines()[skip:]
    return [ln.split()[5] for ln in lines]


def wait_log_settled(ng, timeout: float = 5.0) -> int:
    last, since = -1, time.monotonic()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        n = len(ng.access_log_lines())
        if n != last:
            last, since = n, time.monotonic()
        elif time.monotonic() - since > 0.3:
            break
        time.sleep(0.05)
    return last


def run_wrk(tmp_path, connections: int, limit: int) -> int:
    script = tmp_path / "stop.lua"
    script.write_text(WRK_SCRIPT.format(limit=limit))
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", "-d2s", "-s", str(script), f"http://127.0.0.1:{PORT}/"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    for line in out.stdout.splitlines():
        if "requests in" in line:
            return int(line.split()[0])
    raise AssertionError(f"no request count in wrk output:\n{out.stdout}")


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk not installed")
@pytest.mark.parametrize("connections", [1, 8])
def test_exchanges_equal_wrk_count_and_access_log_statuses(nginx, tmp_path, connections):
    before = wait_log_settled(nginx)
    pcap = tmp_path / "http.pcap"
    with LiveCapture("lo", pcap, filter=f"tcp port {PORT}") as cap:
        wrk_count = run_wrk(tmp_path, connections, limit=600)
    stats = cap.last_stats
    assert stats.dropped_by_kernel == 0
    wait_log_settled(nginx)
    logged = access_statuses(nginx, before)
    res = trace_capture(pcap, tmp_path / "requests.parquet")
    t = pq.read_table(res.output).to_pylist()
    answered = [r for r in t if r["status"] is not None]
    # nginx served exactly what the capture shows
    assert len(answered) == len(logged)
    assert collections.Counter(r["status"] for r in answered) == collections.Counter(logged)
    assert {"200", "404"} <= set(logged)
    # wrk counts the responses it read before stopping; with one connection that is all of them,
    # with more, up to one request per other connection was still in flight
    assert wrk_count <= len(answered) <= wrk_count + connections - 1
    if connections == 1:
        assert len(answered) == wrk_count == 600
    assert not any(r["inferred"] for r in answered)
    assert {r["label"] for r in answered} == {"GET /index.html", "GET /missing", "GET /page.html?id=?"}
    assert all(r["protocol"] == "http" and r["tier"] == "web" for r in t)
    assert all(r["server"] == f"127.0.0.1:{PORT}" for r in t)
    assert len({r["conn"] for r in t}) == connections
    # nginx adds X-Request-Id to every response
    assert all(r["request_id"] and len(r["request_id"]) == 32 for r in answered)
    assert res.stats["skipped"]["not_tcp"] == 0


def client_log(n: int) -> list[tuple[str, int, int, int]]:
    """n GETs on one keep-alive connection: (path, start_ns, end_ns, status) as the client saw them."""
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=5)
    log = []
    for i in range(n):
        path = ["/index.html", f"/page.html?id={i}", f"/nope/{i}"][i % 3]
        t0 = time.time_ns()
        conn.request("GET", path)
        r = conn.getresponse()
        r.read()
        t1 = time.time_ns()
        log.append((path, t0, t1, r.status))
        time.sleep(0.002)
    conn.close()
    return log


def test_per_exchange_times_agree_with_the_client_log(nginx, tmp_path):
    pcap = tmp_path / "timed.pcap"
    with LiveCapture("lo", pcap, filter=f"tcp port {PORT}"):
        log = client_log(60)
    res = trace_capture(pcap, tmp_path / "requests.parquet")
    rows = sorted(pq.read_table(res.output).to_pylist(), key=lambda r: r["arrival_ns"])
    assert len(rows) == len(log)
    precision = res.stats["timestamp_precision_ns"]
    assert precision == 1  # tcpdump --time-stamp-precision=nano
    slack = []
    for (path, t0, t1, status), r in zip(log, rows):
        assert r["status"] == str(status)
        # the packet carrying the request left after the client started sending, and the last
        # response packet arrived before the client finished reading (same clock, CLOCK_REALTIME)
        assert t0 - precision <= r["arrival_ns"] <= r["departure_ns"] <= t1 + precision, (path, t0, r, t1)
        slack += [r["arrival_ns"] - t0, t1 - r["departure_ns"]]
    # and the wire saw it close to the client's own times (the median: a busy machine may
    # deschedule the client now and then)
    assert sorted(slack)[len(slack) // 2] < 2_000_000


def test_snaplen_256_still_delimits_every_exchange(nginx, tmp_path):
    pcap = tmp_path / "short.pcap"
    with LiveCapture("lo", pcap, filter=f"tcp port {PORT}", snaplen=256):
        log = client_log(45)
    res = trace_capture(pcap, tmp_path / "requests.parquet")
    rows = sorted(pq.read_table(res.output).to_pylist(), key=lambda r: r["arrival_ns"])
    assert res.stats["tcp"]["snaplen_cut_segments"] > 0  # the 3 KB page did not fit in 256 bytes
    assert len(rows) == len(log)
    for (_path, t0, t1, status), r in zip(log, rows):
        assert r["status"] == str(status)
        assert t0 - 1 <= r["arrival_ns"] <= r["departure_ns"] <= t1 + 1
    # the page's response head was cut: its end was found by the direction change and flagged
    cut = [r for (p, *_), r in zip(log, rows) if p == "/index.html"]
    assert cut and all("delimited_by_turn" in (r["flags"] or "") and r["inferred"] for r in cut)
    assert all(r["bytes_out"] > 3000 for r in cut)  # bytes come from the wire lengths
