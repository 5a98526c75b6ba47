"""The engine's capture (`tierscope-engine capture`, issue 24) against tcpdump on the same traffic:
both run at once with the lab's filter and snapshot length, on loopback and on a lab bridge (nginx
and wrk in two network namespaces, as `tierscope run` places them), and the tracer's rows from each
file must be the same exchanges (nginx's X-Request-Id, client, status, bytes), as many as wrk
itself counted; so for both ways the engine takes packets, its eBPF program on the TC hook and its
packet socket. The fallbacks (eBPF to the packet socket, the engine to tcpdump) say why and reach
the manifest."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tierscope import manifest
from tierscope.services.base import free_port
from tierscope.testbed.host import Host
from tierscope.trace.capture import LiveCapture
from tierscope.trace.run import trace_capture

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="a packet socket needs root"),
    pytest.mark.skipif(shutil.which("tcpdump") is None, reason="tcpdump not installed (make setup)"),
    pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk not installed (make setup)"),
    pytest.mark.skipif(
        shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists(), reason="nginx not installed"
    ),
]

PORT = free_port()

from test_trace_http import WRK_SCRIPT  # noqa: E402  (the same three pages, stopped after `limit`)


def lab_filter() -> str:
    from tierscope.runner import CAPTURE_FILTER

    return f"tcp port {PORT} and ({CAPTURE_FILTER})"


def site(base: Path) -> Path:
    root = base / "root"
    root.mkdir()
    (root / "index.html").write_text("<html>" + "x" * 3000 + "</html>\n")  # cut by the 512-byte snapshot
    (root / "page.html").write_text("page\n")
    return root


def run_wrk(tmp_path: Path, url: str, connections: int, limit: int, prefix: list[str] | None = None) -> int:
    script = tmp_path / "stop.lua"
    script.write_text(WRK_SCRIPT.format(limit=limit))
    out = subprocess.run(
        [*(prefix or []), "wrk", "-t1", f"-c{connections}", "-d3s", "-s", str(script), url],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    for line in out.stdout.splitlines():
        if "requests in" in line:
            return int(line.split()[0])
    raise AssertionError(f"no request count in wrk output:\n{out.stdout}")


def side_by_side(
    tmp_path: Path, interface: str, url: str, connections: int, prefix: list[str] | None = None, via: str = "auto"
):
    """The engine's capture (taking packets `via`) and tcpdump at once on `interface` while wrk
    runs; returns wrk's count and each capture's rows, stats and record."""
    caps = {
        m: LiveCapture(interface, tmp_path / f"{m}.pcap", filter=lab_filter(), snaplen=512, method=m, via=via)
        for m in ("engine", "tcpdump")
    }
    for cap in caps.values():
        cap.start()
    try:
        count = run_wrk(tmp_path, url, connections, limit=600, prefix=prefix)
    finally:
        stats = {m: cap.stop() for m, cap in caps.items()}
    rows = {}
    for m, cap in caps.items():
        assert cap.used == m
        res = trace_capture(cap.path, tmp_path / f"{m}.parquet")
        rows[m] = pq.read_table(res.output).to_pylist()
    return count, rows, stats, caps


def assert_same_exchanges(count: int, connections: int, rows: dict, stats: dict) -> None:
    for m, st in stats.items():
        assert st.dropped_by_kernel == 0, m
        assert st.captured and st.captured > 0, m
        assert st.method == m
    answered = {m: [r for r in rs if r["status"] is not None] for m, rs in rows.items()}
    # wrk counts the responses it read before stopping: all of them on one connection, else up to
    # one request per other connection was still in flight
    for m, rs in answered.items():
        assert count <= len(rs) <= count + connections - 1, (m, count, len(rs))
    if connections == 1:
        assert len(answered["engine"]) == count == 600

    def key(r: dict) -> tuple:
        return (r["request_id"], r["client"], r["label"], r["status"], r["bytes_in"], r["bytes_out"])

    engine = sorted(map(key, rows["engine"]), key=str)
    tcpdump = sorted(map(key, rows["tcpdump"]), key=str)
    assert engine == tcpdump
    assert all(r["request_id"] and len(r["request_id"]) == 32 for r in answered["engine"])
    assert len({r["request_id"] for r in answered["engine"]}) == len(answered["engine"])
    assert not any(r["inferred"] and "delimited_by_turn" not in (r["flags"] or "") for r in answered["engine"])
    # one clock: each exchange stamped by both captures within a millisecond
    t = {r["request_id"]: (r["arrival_ns"], r["departure_ns"]) for r in rows["tcpdump"]}
    for r in rows["engine"]:
        a, d = t[r["request_id"]]
        assert abs(r["arrival_ns"] - a) < 1_000_000 and abs(r["departure_ns"] - d) < 1_000_000, (r, a, d)


@pytest.fixture(scope="module")
def nginx_lo(tmp_path_factory):
    from tierscope.services.nginx import Nginx

    base = tmp_path_factory.mktemp("capture-nginx")
    with Nginx(Host.loopback(), PORT, base / "nginx", root=site(base), workers=1) as ng:
        yield ng


@pytest.mark.parametrize(("via", "connections"), [("ebpf", 1), ("ebpf", 8), ("packet", 8)])
def test_loopback_engine_capture_equals_tcpdump_and_wrk(nginx_lo, tmp_path, via, connections):
    count, rows, stats, caps = side_by_side(tmp_path, "lo", f"http://127.0.0.1:{PORT}/", connections, via=via)
    assert caps["engine"].engine_via == via, caps["engine"].listening
    assert caps["engine"].capture_info()["via"] == via
    assert_same_exchanges(count, connections, rows, stats)
    # each packet once: the engine never took the outgoing copy that tcpdump's libpcap discards
    assert stats["engine"].captured == stats["tcpdump"].captured
    assert stats["engine"].received_by_filter == stats["engine"].captured
    assert stats["tcpdump"].received_by_filter == 2 * stats["tcpdump"].captured
    assert "incoming copies only" in caps["engine"].listening


@pytest.mark.parametrize("via", ["ebpf", "packet"])
def test_a_filter_on_the_payload_takes_what_tcpdumps_takes(nginx_lo, tmp_path, via):
    """The eBPF program reads header bytes directly from the packet's linear part and the rest
    (TCP's payload sits in page fragments) through the kernel's LD_IND; a filter on the payload's
    first word ("GET ") takes each request once, as tcpdump does and as many as wrk sent."""
    get = f"tcp dst port {PORT} and tcp[((tcp[12]&0xf0)>>2):4] = 0x47455420"
    caps = {
        m: LiveCapture("lo", tmp_path / f"{m}.pcap", filter=get, snaplen=96, method=m, via=via)
        for m in ("engine", "tcpdump")
    }
    for cap in caps.values():
        cap.start()
    try:
        count = run_wrk(tmp_path, f"http://127.0.0.1:{PORT}/", 1, limit=600)
    finally:
        stats = {m: cap.stop() for m, cap in caps.items()}
    assert caps["engine"].engine_via == via, caps["engine"].listening
    assert count == 600
    assert stats["engine"].captured == stats["tcpdump"].captured == count, stats


def test_bridge_engine_capture_equals_tcpdump_and_wrk(tmp_path):
    from tierscope.services.nginx import Nginx
    from tierscope.testbed import network
    from tierscope.testbed.lab import free_lab

    why = network.unavailable_reason()
    if why:
        pytest.skip(why)
    lab = free_lab(first=40)
    try:
        bridge = network.create_bridge(lab)
        client_ns, _ = network.add_host(lab, "client", 2)
        web_ns, web_addr = network.add_host(lab, "web", 3)
        web = Host(name="web", address=web_addr, netns=web_ns)
        with Nginx(web, PORT, tmp_path / "nginx", root=site(tmp_path), workers=1):
            count, rows, stats, caps = side_by_side(
                tmp_path,
                bridge,
                f"http://{web_addr}:{PORT}/",
                4,
                prefix=["ip", "netns", "exec", client_ns],
                via="ebpf",
            )
    finally:
        network.remove_host(lab, "client")
        network.remove_host(lab, "web")
        network.remove_bridge(lab)
    assert_same_exchanges(count, 4, rows, stats)
    assert stats["engine"].captured == stats["tcpdump"].captured
    assert "frames entering it from its 2 ports" in caps["engine"].listening
    assert caps["engine"].engine_via == "ebpf"
    assert all(r["server"] == f"{web_addr}:{PORT}" for r in rows["engine"])


def test_falls_back_to_tcpdump_and_says_so_in_the_manifest(tmp_path, monkeypatch):
    fake = tmp_path / "old-engine"
    fake.write_text("#!/bin/sh\necho \"error: unrecognized subcommand 'capture'\" >&2\nexit 2\n")
    fake.chmod(0o755)
    monkeypatch.setenv("TIERSCOPE_ENGINE", str(fake))
    monkeypatch.delenv("TIERSCOPE_CAPTURE", raising=False)
    pcap = tmp_path / "capture.pcap"
    with LiveCapture("lo", pcap, filter=f"tcp port {PORT}") as cap:
        pass
    assert cap.used == "tcpdump"
    assert cap.fallback_reason and "unrecognized subcommand" in cap.fallback_reason
    with pytest.raises(Exception, match="unrecognized subcommand"):
        LiveCapture("lo", tmp_path / "e.pcap", filter=f"tcp port {PORT}", method="engine").start()
    info = json.loads(cap.info_path.read_text())
    assert info["method"] == "tcpdump" and info["requested"] == "auto" and info["captured"] == 0
    manifest.write(manifest.Manifest(), tmp_path / "manifest.json")
    m = manifest.read(tmp_path / "manifest.json")
    assert m.capture is not None and m.capture.method == "tcpdump"
    assert m.capture.fallback_reason == cap.fallback_reason


def test_engine_capture_is_recorded_in_the_manifest(tmp_path):
    pcap = tmp_path / "capture.pcap"
    with LiveCapture("lo", pcap, filter=lab_filter(), snaplen=512) as cap:
        pass
    assert cap.used == "engine" and cap.fallback_reason is None
    assert cap.engine_via == "ebpf" and cap.ebpf_unavailable is None, cap.listening
    manifest.write(manifest.Manifest(), tmp_path / "manifest.json")
    m = manifest.read(tmp_path / "manifest.json")
    assert m.capture is not None and m.capture.method == "engine" and m.capture.requested == "auto"
    assert m.capture.dropped_by_kernel == 0
    assert m.capture.via == "ebpf"


def test_a_filter_ebpf_cannot_run_falls_back_to_the_packet_socket_and_says_why(tmp_path):
    # tcpdump compiles `vlan` to an ancillary load (the VLAN tag's presence), which the eBPF
    # translation does not take: the packet socket runs the filter, and the record says so
    pcap = tmp_path / "capture.pcap"
    with LiveCapture("lo", pcap, filter="vlan", snaplen=512) as cap:
        pass
    info = json.loads(cap.info_path.read_text())
    assert info["method"] == "engine" and info["via"] == "packet"
    assert info["ebpf_unavailable"] and "ancillary" in info["ebpf_unavailable"], info
    assert "AF_PACKET" in info["listening"]
    with pytest.raises(Exception, match="ancillary"):
        LiveCapture("lo", tmp_path / "e.pcap", filter="vlan", method="engine", via="ebpf").start()
