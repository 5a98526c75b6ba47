"""Linking rows across tiers: by request id, and by time containment when ids are absent. The
hand-built cases check the rules; the live case (nginx web tier proxying to an nginx app tier,
X-Request-Id forwarded) checks that time containment finds the same parents the ids give."""

from __future__ import annotations

import http.client
import os
import shutil
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tierscope import tables
from tierscope.services.base import free_port
from tierscope.testbed.host import Host
from tierscope.trace.capture import LiveCapture
from tierscope.trace.link import link_transactions
from tierscope.trace.run import trace_capture
from tierscope.trace.servermap import ServerEntry, write_server_map


def table(rows: list[dict]) -> pa.Table:
    full = []
    for r in rows:
        d = {f.name: None for f in tables.REQUESTS}
        d.update(source="test", conn=0)
        d.update(r)
        full.append(d)
    return pa.Table.from_pylist(full, schema=tables.REQUESTS)


def row(tier, server_addr, client_addr, arr, dep, rid=None, conn=0):
    return dict(
        tier=tier,
        server=f"{tier}@{server_addr}",
        server_addr=server_addr,
        client_addr=client_addr,
        arrival_ns=arr,
        departure_ns=dep,
        request_id=rid,
        conn=conn,
    )


def test_time_containment_picks_the_enclosing_request_and_flags_ambiguity():
    t = table(
        [
            row("web", "10.0.0.2", "10.0.0.1", 0, 100, conn=1),  # 0
            row("web", "10.0.0.2", "10.0.0.1", 10, 50, conn=2),  # 1
            row("app", "10.0.0.3", "10.0.0.2", 20, 40),  # 2: inside 0 and 1
            row("app", "10.0.0.3", "10.0.0.2", 60, 90),  # 3: inside 0 only
            row("db", "10.0.0.4", "10.0.0.3", 25, 30),  # 4: inside 2
            row("db", "10.0.0.4", "10.0.0.9", 25, 30),  # 5: from a host with no upstream
            row("app", "10.0.0.3", "10.0.0.2", 95, 120),  # 6: outlives every web request
        ]
    )
    out = link_transactions(t).to_pylist()
    key = lambda i: f"{t['server'][i]}#{t['conn'][i]}@{t['arrival_ns'][i]}"  # noqa: E731
    assert [r["link"] for r in out] == [
        None,
        None,
        "time_containment_ambiguous",
        "time_containment",
        "time_containment",
        None,
        None,
    ]
    assert out[2]["parent_id"] == key(1)  # the latest-arriving enclosing request
    assert out[3]["parent_id"] == key(0)
    assert out[4]["parent_id"] == key(2)
    assert out[4]["transaction"] == key(1) and out[3]["transaction"] == key(0)
    assert out[5]["parent_id"] is None and out[5]["transaction"] == key(5)
    # rows without ids get their row key as id: every parent_id names a row's request_id
    assert [r["request_id"] for r in out] == [key(i) for i in range(7)]


def test_request_id_wins_over_time_and_links_to_the_nearest_tier():
    t = table(
        [
            row("web", "10.0.0.2", "10.0.0.1", 0, 100, rid="r1"),
            row("app", "10.0.0.3", "10.0.0.2", 10, 90, rid="r1"),
            row("db", "10.0.0.4", "10.0.0.3", 20, 30, rid="r1"),
            row("db", "10.0.0.4", "10.0.0.3", 40, 50, rid="r1"),
            row("web", "10.0.0.2", "10.0.0.1", 5, 95, rid="r2"),
        ]
    )
    out = link_transactions(t).to_pylist()
    assert [r["link"] for r in out] == [None, "request_id", "request_id", "request_id", None]
    app = "r1/app@10.0.0.3#0@10"
    assert [r["request_id"] for r in out] == ["r1", app, "r1/db@10.0.0.4#0@20", "r1/db@10.0.0.4#0@40", "r2"]
    assert [r["parent_id"] for r in out] == [None, "r1", app, app, None]
    assert [r["transaction"] for r in out] == ["r1", "r1", "r1", "r1", "r2"]


def test_a_page_id_on_two_top_rows_stays_on_neither():
    # two web rows with one X-Request-Id (a client reusing it): neither keeps the bare id, so ids
    # stay unique and a child names one parent row
    t = table(
        [
            row("web", "10.0.0.2", "10.0.0.1", 0, 100, rid="r1", conn=1),
            row("web", "10.0.0.2", "10.0.0.1", 200, 300, rid="r1", conn=2),
            row("app", "10.0.0.3", "10.0.0.2", 210, 290, rid="r1"),
        ]
    )
    out = link_transactions(t).to_pylist()
    ids = [r["request_id"] for r in out]
    assert ids == ["r1/web@10.0.0.2#1@0", "r1/web@10.0.0.2#2@200", "r1/app@10.0.0.3#0@210"]
    assert out[2]["parent_id"] == ids[1]  # the one containing it


WEB = free_port()
APP = next(p for p in iter(free_port, None) if p != WEB)

live = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("tcpdump") is None, reason="tcpdump on lo needs root")


@live
def test_two_tier_capture_links_by_id_and_by_time_alike(tmp_path):
    from tierscope.services.nginx import Nginx

    root = tmp_path / "root"
    root.mkdir()
    for i in range(3):
        (root / f"p{i}.html").write_text(f"page {i}\n" * 50)
    with (
        Nginx(Host.loopback(), APP, tmp_path / "app", root=root, name="app1"),
        Nginx(
            Host.loopback(),
            WEB,
            tmp_path / "web",
            upstreams=[f"127.0.0.1:{APP}"],
            locations="        proxy_hide_header X-Request-Id;\n",
            name="web1",
        ),
    ):
        pcap = tmp_path / "two.pcap"
        with LiveCapture("lo", pcap, filter=f"tcp port {WEB} or tcp port {APP}"):
            conn = http.client.HTTPConnection("127.0.0.1", WEB, timeout=5)
            for i in range(30):
                conn.request("GET", f"/p{i % 3}.html")
                r = conn.getresponse()
                r.read()
                assert r.status == 200
            conn.close()
    smap = write_server_map(
        [ServerEntry("127.0.0.1", WEB, "web", "web1"), ServerEntry("127.0.0.1", APP, "app", "app1", "http")],
        tmp_path / "servers.txt",
    )
    res = trace_capture(pcap, tmp_path / "requests.parquet", server_map=smap)
    t = tables.read(res.output, "requests")
    rows = t.to_pylist()
    assert sorted((r["tier"], r["server"]) for r in rows) == [("app", "app1")] * 30 + [("web", "web1")] * 30
    by_id = link_transactions(t).to_pylist()
    apps = [r for r in by_id if r["tier"] == "app"]
    assert all(r["link"] == "request_id" for r in apps)
    web_ids = {r["request_id"] for r in by_id if r["tier"] == "web"}
    assert {r["parent_id"] for r in apps} == web_ids and len(web_ids) == 30
    assert web_ids == {r["request_id"] for r in rows if r["tier"] == "web"}  # the page ids stay on the web rows
    # the same capture without ids: time containment on the web host finds the same parents
    web_key = {r["request_id"]: f"{r['server']}#{r['conn']}@{r['arrival_ns']}" for r in by_id if r["tier"] == "web"}
    no_ids = t.set_column(t.column_names.index("request_id"), "request_id", pa.nulls(t.num_rows, pa.string()))
    by_time = link_transactions(no_ids).to_pylist()
    for a_id, a_time in zip(by_id, by_time):
        if a_id["tier"] == "app":
            assert a_time["link"] == "time_containment"
            assert a_time["parent_id"] == web_key[a_id["parent_id"]]


@live
def test_cli_live_capture_and_file_mode(tmp_path):
    from typer.testing import CliRunner

    from tierscope.cli import app as cli
    from tierscope.services.nginx import Nginx

    root = tmp_path / "root"
    root.mkdir()
    (root / "index.html").write_text("hello\n")
    stop = threading.Event()
    done: list[int] = []
    with Nginx(Host.loopback(), WEB, tmp_path / "web", root=root):

        def client():
            conn = http.client.HTTPConnection("127.0.0.1", WEB, timeout=5)
            while not stop.is_set():
                conn.request("GET", "/index.html")
                conn.getresponse().read()
                done.append(time.time_ns())
                time.sleep(0.02)
            conn.close()

        th = threading.Thread(target=client)
        th.start()
        try:
            out = tmp_path / "live.parquet"
            keep = tmp_path / "live.pcap"
            res = CliRunner().invoke(
                cli,
                [
                    "trace",
                    "--live",
                    "lo",
                    "--filter",
                    f"tcp port {WEB}",
                    "--duration",
                    "1.5",
                    "-o",
                    str(out),
                    "--keep-capture",
                    str(keep),
                ],
            )
        finally:
            stop.set()
            th.join()
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())  # Rich wraps long paths at the terminal width
    assert "packets captured" in said and f"rows to {out}" in said
    rows = pq.read_table(out).to_pylist()
    # the client ran before, during and after the 1.5 s capture, one request every ~20 ms
    assert 20 <= len([r for r in rows if r["status"] == "200"]) <= len(done)
    assert all(r["label"] == "GET /index.html" for r in rows)
    # file mode on the kept capture gives the same rows
    again = tmp_path / "again.parquet"
    res2 = CliRunner().invoke(cli, ["trace", str(keep), "-o", str(again)])
    assert res2.exit_code == 0, res2.output
    assert pq.read_table(again).num_rows == len(rows)
    # bad input: a clear message, exit code 2
    bad = tmp_path / "bad.pcap"
    bad.write_text("not a capture")
    res3 = CliRunner().invoke(cli, ["trace", str(bad), "-o", str(tmp_path / "x.parquet")])
    assert res3.exit_code == 2 and "not a capture file" in res3.output


def test_a_table_linked_by_an_older_tierscope_is_found_and_linked_again(tmp_path):
    """Before ids were unique per row, linking kept every row's carried id and pointed a child's
    `parent_id` at that same id, which its parent and its siblings carry too: ambiguous links."""
    from tierscope.analysis.experiment import _point_requests
    from tierscope.analysis.points import LazyTables, Point
    from tierscope.trace.link import rows_linked_to_their_own_id

    rows = []
    for k in range(3):  # page k: web -> app -> db, all carrying id p<k>
        t0 = 1000 * k
        rows += [
            row("web", "10.0.0.2", "10.0.0.1", t0, t0 + 100, rid=f"p{k}", conn=k),
            row("app", "10.0.0.3", "10.0.0.2", t0 + 10, t0 + 90, rid=f"p{k}", conn=k),
            row("db", "10.0.0.4", "10.0.0.3", t0 + 20, t0 + 30, rid=f"p{k}", conn=k),
        ]
    fresh = link_transactions(table(rows))
    assert rows_linked_to_their_own_id(fresh) == 0 and rows_linked_to_their_own_id(table(rows)) == 0
    older = table(rows)
    older = older.set_column(
        older.column_names.index("parent_id"),
        "parent_id",
        pa.array([None if r["tier"] == "web" else r["request_id"] for r in rows], pa.string()),
    )
    assert rows_linked_to_their_own_id(older) == 6  # every app and db row
    point = Point(path=tmp_path, name="old-point", tables=LazyTables())
    point.tables["requests"] = older
    notes: list[str] = []
    relinked = _point_requests(point, notes)
    assert relinked.column("request_id").to_pylist() == fresh.column("request_id").to_pylist()
    assert relinked.column("parent_id").to_pylist() == fresh.column("parent_id").to_pylist()
    assert len(notes) == 1 and "linked by an older tierscope (6 rows" in notes[0]
    assert _point_requests(point, notes) is relinked and len(notes) == 1  # linked once, noted once
