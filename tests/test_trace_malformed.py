"""Bad input to the tracer: a cut file, a file that is not a capture, corrupted packets and
records, a capture that starts mid-connection, traffic that is not TCP. No crash, a clear
message, partial results, and exact counts of what was skipped (arithmetic on the hand-built
capture is the ground truth)."""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tierscope.engine import engine_path
from tierscope.trace.run import TraceError, trace_capture

CLIENT = (bytes([10, 0, 0, 1]), 40000)
SERVER = (bytes([10, 0, 0, 2]), 8080)


class Pcap:
    """A classic pcap file (microseconds, Ethernet) built packet by packet."""

    def __init__(self):
        self.records: list[bytes] = []

    def raw(self, us: int, frame: bytes) -> None:
        self.records.append(struct.pack("<IIII", us // 1_000_000, us % 1_000_000, len(frame), len(frame)) + frame)

    def tcp(self, us, src, dst, seq, flags, payload=b""):
        tcp = struct.pack(">HHIIBBHHH", src[1], dst[1], seq, 0, 0x50, flags, 65535, 0, 0) + payload
        ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0x4000, 64, 6, 0, src[0], dst[0]) + tcp
        self.raw(us, b"\x00" * 12 + b"\x08\x00" + ip)

    def udp(self, us):
        udp = struct.pack(">HHHH", 5353, 5353, 12, 0) + b"dnsq"
        ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0, CLIENT[0], SERVER[0]) + udp
        self.raw(us, b"\x00" * 12 + b"\x08\x00" + ip)

    def arp(self, us):
        self.raw(us, b"\xff" * 6 + b"\x00" * 6 + b"\x08\x06" + b"\x00" * 28)

    def bytes(self) -> bytes:
        return struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1) + b"".join(self.records)


SYN, ACK, FIN = 0x02, 0x10, 0x01


def conversation(n: int, noise: bool = False) -> Pcap:
    """A connection with a handshake, n GET exchanges (request, response, client ACK), and a close.
    Records: 3 + 3n + 2 (+ 2 per exchange with noise: one UDP, one ARP)."""
    p = Pcap()
    p.tcp(1_000_000, CLIENT, SERVER, 99, SYN)
    p.tcp(1_000_010, SERVER, CLIENT, 499, SYN | ACK)
    p.tcp(1_000_020, CLIENT, SERVER, 100, ACK)
    cs, ss = 100, 500
    for i in range(n):
        t = 1_001_000 + i * 1000
        req = f"GET /items/{i} HTTP/1.1\r\nHost: s\r\n\r\n".encode()
        body = b"y" * (100 + i)
        resp = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        p.tcp(t, CLIENT, SERVER, cs, ACK, req)
        p.tcp(t + 300, SERVER, CLIENT, ss, ACK, resp)
        p.tcp(t + 310, CLIENT, SERVER, cs + len(req), ACK)
        if noise:
            p.udp(t + 400)
            p.arp(t + 500)
        cs += len(req)
        ss += len(resp)
    p.tcp(1_900_000, CLIENT, SERVER, cs, FIN | ACK)
    p.tcp(1_900_010, SERVER, CLIENT, ss, FIN | ACK)
    return p


def trace_bytes(tmp_path: Path, data: bytes, name="in.pcap"):
    f = tmp_path / name
    f.write_bytes(data)
    return trace_capture(f, tmp_path / "out.parquet")


def rows(res):
    return pq.read_table(res.output).to_pylist()


def test_clean_capture_gives_one_row_per_exchange(tmp_path):
    res = trace_bytes(tmp_path, conversation(10).bytes())
    r = rows(res)
    assert len(r) == 10
    assert [x["label"] for x in r] == ["GET /items/{id}"] * 10
    assert [x["arrival_ns"] for x in r] == [(1_001_000 + i * 1000) * 1000 for i in range(10)]
    assert [x["departure_ns"] for x in r] == [(1_001_300 + i * 1000) * 1000 for i in range(10)]
    assert res.stats["packets"] == 3 + 30 + 2
    assert res.stats["tcp"]["pure_acks"] == 1 + 10
    assert res.stopped_early is None


def test_truncated_file_keeps_what_came_before_the_cut(tmp_path):
    data = conversation(10).bytes()
    # cut in the middle of the response of exchange 6 (record 3 + 3*6 + 1)
    p = conversation(10)
    offset = 24 + sum(len(r) for r in p.records[: 3 + 3 * 6 + 1]) + 20
    res = trace_bytes(tmp_path, data[:offset])
    r = rows(res)
    answered = [x for x in r if x["status"] == "200"]
    assert len(answered) == 6
    # the 7th request was seen, its response was cut away: reported, not dropped
    unanswered = [x for x in r if x["status"] is None]
    assert len(unanswered) == 1 and "no_response" in unanswered[0]["flags"] and unanswered[0]["inferred"]
    assert "truncated at byte" in res.stopped_early
    assert "truncated at byte" in res.messages
    assert not res.damaged  # a file cut short (a killed tcpdump) is not damage


def test_not_a_capture_is_a_clear_error(tmp_path):
    for content in (b"", b"hello, this is a text file\n", b"\x0a\x0d\x0d"):
        f = tmp_path / "notes.txt"
        f.write_bytes(content)
        with pytest.raises(TraceError) as err:
            trace_capture(f, tmp_path / "out.parquet")
        assert "notes.txt" in str(err.value) and "not a capture file" in str(err.value), str(err.value)
    out = subprocess.run(
        [str(engine_path()), "trace", str(tmp_path / "missing.pcap"), "-o", str(tmp_path / "o.parquet")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "cannot open capture" in out.stderr and "missing.pcap" in out.stderr


def test_corrupted_packets_are_skipped_and_counted(tmp_path):
    p = conversation(10)
    # break the IP header (version nibble) of every client ACK after a response: 10 packets
    for i in range(10):
        k = 3 + 3 * i + 2
        rec = bytearray(p.records[k])
        rec[16 + 14] = 0x05  # IP version 0, header length 5
        p.records[k] = bytes(rec)
    res = trace_bytes(tmp_path, p.bytes())
    assert res.stats["skipped"]["malformed"] == 10
    assert len(rows(res)) == 10  # pure ACKs carried nothing the exchanges need


def test_corrupted_record_header_stops_with_partial_results(tmp_path):
    p = conversation(10)
    k = 3 + 3 * 4  # the request of exchange 4
    rec = bytearray(p.records[k])
    rec[8:12] = struct.pack("<I", 0x7FFFFFFF)  # captured length beyond any snapshot length
    p.records[k] = bytes(rec)
    res = trace_bytes(tmp_path, p.bytes())
    assert len([x for x in rows(res) if x["status"] == "200"]) == 4
    assert "corrupted packet record" in res.stopped_early
    assert res.damaged and res.packets == k


def test_corrupt_record_fails_the_cli_with_the_packets_kept(tmp_path):
    """A record header claiming 0xFFFFFFF0 captured bytes: the rows before it are written, and
    `tierscope trace` exits non-zero saying how many packets it kept (it used to exit 0 with a
    warning). A file merely cut short at the end stays a warning with status 0."""
    p = conversation(10)
    k = 3 + 3 * 6  # the request of exchange 6
    before = 24 + sum(len(r) for r in p.records[:k])
    rec = bytearray(p.records[k])
    rec[8:12] = struct.pack("<I", 0xFFFFFFF0)
    p.records[k] = bytes(rec)
    f = tmp_path / "bad.pcap"
    f.write_bytes(p.bytes())
    out = tmp_path / "out.parquet"
    engine = subprocess.run([str(engine_path()), "trace", str(f), "-o", str(out)], capture_output=True, text=True)
    assert engine.returncode == 3, engine.stderr
    assert f"kept the {k} packets read before it" in engine.stderr
    cli = subprocess.run(
        [str(Path(sys.executable).parent / "tierscope"), "trace", str(f), "-o", str(out)],
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 1, cli.stdout + cli.stderr
    err = " ".join(cli.stderr.split())
    assert f"corrupted packet record at byte {before} (captured length 4294967280" in err, err
    assert f"only the {k} packets before the damage were traced" in err, err
    assert len([x for x in pq.read_table(out).to_pylist() if x["status"] == "200"]) == 6
    # cut short inside the last record: a warning, status 0
    f.write_bytes(conversation(10).bytes()[:-7])
    cli = subprocess.run(
        [str(Path(sys.executable).parent / "tierscope"), "trace", str(f), "-o", str(out)],
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 0 and "truncated at byte" in cli.stderr, cli.stderr


def test_capture_starting_mid_connection(tmp_path):
    p = conversation(10)
    # drop the handshake, the first 3 exchanges and the request of the 4th
    p.records = p.records[3 + 3 * 3 + 1 :]
    res = trace_bytes(tmp_path, p.bytes())
    r = rows(res)
    assert len(r) == 6  # the 4th exchange's response has no request: skipped and counted
    assert res.stats["parsers"]["responses_without_request"] == 1
    assert res.stats["connections"]["mid_stream"] == 1
    assert all("mid_stream" in x["flags"] and not x["inferred"] for x in r)
    assert [x["label"] for x in r] == ["GET /items/{id}"] * 6
    assert r[0]["server"] == "10.0.0.2:8080"  # roles found from the payload, not the ports


def test_non_tcp_traffic_is_skipped_and_counted(tmp_path):
    res = trace_bytes(tmp_path, conversation(10, noise=True).bytes())
    assert len(rows(res)) == 10
    assert res.stats["skipped"]["not_tcp"] == 10
    assert res.stats["skipped"]["not_ip"] == 10
    assert "10 not IP, 10 not TCP" in res.messages


def test_unsupported_link_type_is_named(tmp_path):
    data = bytearray(conversation(2).bytes())
    data[20:24] = struct.pack("<I", 147)  # LINKTYPE_USER0
    res = trace_bytes(tmp_path, bytes(data))
    assert len(rows(res)) == 0
    assert res.stats["skipped"]["unsupported_link_type"] == res.stats["packets"]
    assert "no packet had a supported link type" in res.messages


def test_bad_server_map_names_file_and_line(tmp_path):
    f = tmp_path / "in.pcap"
    f.write_bytes(conversation(1).bytes())
    m = tmp_path / "servers.txt"
    m.write_text("10.0.0.2:8080 web web1\n10.0.0.3 app\n")
    with pytest.raises(TraceError) as err:
        trace_capture(f, tmp_path / "out.parquet", server_map=m)
    assert f"{m}:2:" in str(err.value)
    m.write_text("10.0.0.2:8080 web web1\n")
    r = rows(trace_capture(f, tmp_path / "out.parquet", server_map=m))
    assert (r[0]["tier"], r[0]["server"]) == ("web", "web1")


@pytest.mark.skipif(shutil.which("editcap") is None, reason="editcap (Wireshark) not installed")
def test_pcapng_and_nanosecond_pcap_give_the_same_rows(tmp_path):
    src = tmp_path / "in.pcap"
    src.write_bytes(conversation(5).bytes())
    want = rows(trace_capture(src, tmp_path / "a.parquet"))
    for fmt in ("pcapng", "nsecpcap"):
        dst = tmp_path / f"in.{fmt}"
        subprocess.run(["editcap", "-F", fmt, str(src), str(dst)], check=True, capture_output=True)
        got = rows(trace_capture(dst, tmp_path / f"{fmt}.parquet"))

        def key(r):
            return (r["arrival_ns"], r["departure_ns"], r["label"], r["status"], r["bytes_in"], r["bytes_out"])

        assert [key(r) for r in got] == [key(r) for r in want], fmt
