"""Access-log import: nginx logs written by a real nginx, Apache lines in the documented format."""

import shutil
import time
import urllib.error
import urllib.request

import pytest

from tierscope.ingest import FormatError, detect, load_file
from tierscope.ingest.accesslog import NGINX_FORMAT, compile_apache
from tierscope.services.base import free_port

N_OK = 40
N_MISSING = 7


@pytest.fixture(scope="module")
def nginx_log(tmp_path_factory):
    if shutil.which("nginx") is None and not __import__("os").path.exists("/usr/sbin/nginx"):
        pytest.skip("nginx is not installed (Debian package nginx-light)")
    from tierscope.services.nginx import Nginx
    from tierscope.testbed.host import Host

    work = tmp_path_factory.mktemp("nginx")
    root = work / "www"
    root.mkdir()
    (root / "page.html").write_text("<p>hello</p>" * 100)
    server = Nginx(Host.loopback(), free_port(), work / "run", root=root)
    windows = []
    with server:
        for i in range(N_OK + N_MISSING):
            path = f"/page.html?i={i}" if i < N_OK else f"/missing{i}.html"
            t0 = time.time_ns()
            try:
                with urllib.request.urlopen(server.url + path, timeout=5) as r:
                    r.read()
            except urllib.error.HTTPError as err:
                assert err.code == 404
            windows.append((t0, time.time_ns()))
        deadline = time.time() + 5  # nginx writes the line after the response; wait for the last one
        while len(server.access_log_lines()) < N_OK + N_MISSING and time.time() < deadline:
            time.sleep(0.05)
        log = work / "access.log"
        shutil.copy(server.access_log, log)
    return log, windows


def test_documented_format_is_what_the_nginx_service_writes():
    from tierscope.services.nginx import LOG_FORMAT

    assert NGINX_FORMAT == LOG_FORMAT


def test_real_nginx_log(nginx_log):
    log, windows = nginx_log
    assert detect(log) == "nginx"
    result = load_file(log)
    t = result.requests.to_pylist()  # log order = completion order = the order sent (one at a time)
    assert result.skipped == 0
    assert len(t) == N_OK + N_MISSING
    assert [r["status"] for r in t].count("200") == N_OK
    assert [r["status"] for r in t].count("404") == N_MISSING
    assert {r["tier"] for r in t} == {"web"} and {r["source"] for r in t} == {"nginx"}
    assert t[0]["label"] == "GET /page.html" and t[-1]["label"] == f"GET /missing{N_OK + N_MISSING - 1}.html"
    ms = 1_000_000
    for row, (t0, t1) in zip(t, windows):
        # nginx's clock resolution is 1 ms: each request lies inside the client's own window, ± 1 ms
        assert t0 - ms <= row["arrival_ns"] <= row["departure_ns"] <= t1 + ms
        assert row["arrival_ns"] % ms == 0 and row["departure_ns"] % ms == 0
        assert len(row["request_id"]) == 32
        assert row["client"].startswith("127.0.0.1")
    assert t[0]["bytes_out"] == len("<p>hello</p>" * 100)


def test_arrival_is_msec_minus_request_time_exactly(tmp_path):
    log = tmp_path / "access.log"
    log.write_text(
        '127.0.0.1 1763800000.250 0.125 0.120 0123456789abcdef0123456789abcdef 200 512 80 3 1 "GET /a?x=1 HTTP/1.1"\n'
        "garbage line\n"
        '127.0.0.1 1763800001.001 1.001 0.900, 0.100 - 502 0 80 4 2 "POST /b HTTP/1.1"\n'
    )
    result = load_file(log)
    rows = result.requests.to_pylist()
    assert len(rows) == 2 and result.skipped == 1
    assert result.skipped_at == [f"{log}:2: line does not match the log format"]
    assert rows[0]["departure_ns"] == 1_763_800_000_250_000_000
    assert rows[0]["arrival_ns"] == 1_763_800_000_125_000_000
    assert rows[1]["arrival_ns"] == 1_763_800_000_000_000_000 and rows[1]["request_id"] is None
    assert rows[0]["label"] == "GET /a" and rows[1]["status"] == "502"


def test_apache_begin_usec_and_D(tmp_path):
    log = tmp_path / "apache_access.log"
    log.write_text(
        '1763800000123456 2500 200 310 1024 10.0.0.9:51234 7 "GET /story?id=4 HTTP/1.1"\n'
        '1763800000200000 1000000 500 310 0 10.0.0.9:51235 8 "GET /x HTTP/1.1"\n'
    )
    assert detect(log) == "apache"
    rows = load_file(log, tier="front", server="apache1").requests.to_pylist()
    assert rows[0]["arrival_ns"] == 1_763_800_000_123_456_000
    assert rows[0]["departure_ns"] == 1_763_800_000_123_456_000 + 2_500_000
    assert rows[1]["departure_ns"] - rows[1]["arrival_ns"] == 1_000_000_000
    assert rows[0]["tier"] == "front" and rows[0]["server"] == "apache1" and rows[0]["conn"] == 7
    assert rows[0]["client"] == "10.0.0.9:51234" and rows[0]["bytes_out"] == 1024


def test_custom_format_and_clear_error(tmp_path):
    log = tmp_path / "custom.log"
    log.write_text('[1763800000.500] rt=0.250 "GET / HTTP/1.1" 200\n')
    rows = load_file(log, format="nginx", log_format='[$msec] rt=$request_time "$request" $status').requests.to_pylist()
    assert rows[0]["arrival_ns"] == 1_763_800_000_250_000_000
    with pytest.raises(FormatError, match="not an nginx access log"):
        load_file(log, format="nginx")
    with pytest.raises(ValueError, match="needs %"):
        compile_apache("%h %t")
