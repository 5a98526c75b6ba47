"""Jaeger and Zipkin import, on hand-written files that follow the documented schemas:
Jaeger's query-service JSON (`/api/traces`, the UI's "Download JSON": data[].spans[], processes,
references, microsecond startTime/duration, tags as key/type/value) and Zipkin's v2 JSON model
(zipkin-api zipkin2-api.yaml: id, traceId, parentId, kind, timestamp/duration in µs, localEndpoint,
remoteEndpoint, tags, shared)."""

import json

import pytest

from tierscope.ingest import FormatError, detect, load, load_file

US = 1_000
T0_US = 1_763_800_000_000_000  # µs since the epoch


def _jaeger_trace(i: int) -> dict:
    trace_id = f"{i:032x}"
    t = T0_US + i * 100_000
    ids = {k: f"{i:02x}{k:014x}" for k in range(1, 6)}
    return {
        "traceID": trace_id,
        "spans": [
            {
                "traceID": trace_id,
                "spanID": ids[1],
                "operationName": "GET /page",
                "references": [],
                "startTime": t,
                "duration": 40_000,
                "processID": "p1",
                "tags": [
                    {"key": "span.kind", "type": "string", "value": "server"},
                    {"key": "http.status_code", "type": "int64", "value": 200},
                ],
                "logs": [],
                "warnings": None,
            },
            {
                "traceID": trace_id,
                "spanID": ids[2],
                "operationName": "GET app",
                "references": [{"refType": "CHILD_OF", "traceID": trace_id, "spanID": ids[1]}],
                "startTime": t + 1_000,
                "duration": 38_000,
                "processID": "p1",
                "tags": [{"key": "span.kind", "type": "string", "value": "client"}],
            },
            # the app's entry span has no span.kind tag: an entry into another process counts as SERVER
            {
                "traceID": trace_id,
                "spanID": ids[3],
                "operationName": "GET /api",
                "references": [{"refType": "CHILD_OF", "traceID": trace_id, "spanID": ids[2]}],
                "startTime": t + 2_000,
                "duration": 35_000,
                "processID": "p2",
                "tags": [],
            },
            {
                "traceID": trace_id,
                "spanID": ids[4],
                "operationName": "SELECT",
                "references": [{"refType": "CHILD_OF", "traceID": trace_id, "spanID": ids[3]}],
                "startTime": t + 5_000,
                "duration": 10_000 + i,
                "processID": "p2",
                "tags": [
                    {"key": "span.kind", "type": "string", "value": "client"},
                    {"key": "db.system", "type": "string", "value": "mysql"},
                    {"key": "peer.hostname", "type": "string", "value": "db1"},
                    {"key": "peer.port", "type": "int64", "value": 3306},
                ],
            },
        ],
        "processes": {
            "p1": {"serviceName": "frontend", "tags": [{"key": "hostname", "type": "string", "value": "web-7"}]},
            "p2": {"serviceName": "backend", "tags": [{"key": "ip", "type": "string", "value": "10.1.0.2"}]},
        },
        "warnings": None,
    }


def test_jaeger_download(tmp_path):
    path = tmp_path / "traces.json"
    path.write_text(
        json.dumps(
            {"data": [_jaeger_trace(i) for i in range(3)], "total": 0, "limit": 0, "offset": 0, "errors": None},
            indent=1,
        )
    )
    assert detect(path) == "jaeger"
    result = load_file(path)
    assert result.skipped == 0
    rows = result.requests.to_pylist()
    tiers = sorted({r["tier"] for r in rows})
    assert tiers == ["backend", "frontend", "mysql"]
    assert len(rows) == 9
    front = [r for r in rows if r["tier"] == "frontend"]
    back = [r for r in rows if r["tier"] == "backend"]
    db = [r for r in rows if r["tier"] == "mysql"]
    for i in range(3):
        t = (T0_US + i * 100_000) * US
        assert (front[i]["arrival_ns"], front[i]["departure_ns"]) == (t, t + 40_000 * US)
        assert (back[i]["arrival_ns"], back[i]["departure_ns"]) == (t + 2_000 * US, t + 37_000 * US)
        assert db[i]["departure_ns"] - db[i]["arrival_ns"] == (10_000 + i) * US
        assert back[i]["parent_id"] == front[i]["request_id"]
        assert db[i]["parent_id"] == back[i]["request_id"]
    assert front[0]["server"] == "web-7" and back[0]["server"] == "10.1.0.2" and db[0]["server"] == "db1:3306"
    assert front[0]["status"] == "200"


def test_jaeger_malformed_span_and_bare_list(tmp_path):
    traces = [_jaeger_trace(i) for i in range(2)]
    del traces[1]["spans"][0]["startTime"]
    traces[1]["spans"][3]["processID"] = "p9"
    path = tmp_path / "list.json"
    path.write_text(json.dumps(traces))
    result = load_file(path, format="jaeger")
    assert result.skipped == 2
    assert result.skipped_at[0] == f"{path}:$[1].spans[0]: startTime missing"
    assert "p9" in result.skipped_at[1] and "spans[3]" in result.skipped_at[1]
    assert result.requests.num_rows == 3 + 1  # trace 0 whole; trace 1: only the backend SERVER span


def _zipkin_spans(i: int) -> list[dict]:
    tid = f"{i + 1:016x}"
    t = T0_US + i * 50_000
    web = {"serviceName": "web", "ipv4": "10.0.0.2", "port": 80}
    app = {"serviceName": "app", "ipv4": "10.0.0.3", "port": 8080}
    root, call, q = f"a{i:015x}", f"b{i:015x}", f"c{i:015x}"
    return [
        {
            "traceId": tid,
            "id": root,
            "name": "get /",
            "kind": "SERVER",
            "timestamp": t,
            "duration": 30_000,
            "localEndpoint": web,
            "tags": {"http.status_code": "200"},
        },
        {
            "traceId": tid,
            "parentId": root,
            "id": call,
            "name": "get /api",
            "kind": "CLIENT",
            "timestamp": t + 1_000,
            "duration": 28_000,
            "localEndpoint": web,
            "remoteEndpoint": {"serviceName": "app"},
        },
        # B3 shared span: the server half carries the client's id
        {
            "traceId": tid,
            "parentId": root,
            "id": call,
            "name": "get /api",
            "kind": "SERVER",
            "shared": True,
            "timestamp": t + 1_500,
            "duration": 27_000,
            "localEndpoint": app,
        },
        {
            "traceId": tid,
            "parentId": call,
            "id": q,
            "name": "select",
            "kind": "CLIENT",
            "timestamp": t + 3_000,
            "duration": 5_000,
            "localEndpoint": app,
            "remoteEndpoint": {"serviceName": "postgres", "ipv4": "10.0.0.4", "port": 5432},
            "tags": {"error": ""},
        },
    ]


def test_zipkin_v2_spans_and_traces(tmp_path):
    spans = [s for i in range(4) for s in _zipkin_spans(i)]
    flat = tmp_path / "spans.json"
    flat.write_text(json.dumps(spans))
    nested = tmp_path / "traces.json"
    nested.write_text(json.dumps([_zipkin_spans(i) for i in range(4)], indent=2))
    for path in (flat, nested):
        assert detect(path) == "zipkin"
        result = load_file(path)
        assert result.skipped == 0
        rows = result.requests.to_pylist()
        by = {t: [r for r in rows if r["tier"] == t] for t in ("web", "app", "postgres")}
        assert sorted({r["tier"] for r in rows}) == ["app", "postgres", "web"]
        assert [len(v) for v in by.values()] == [4, 4, 4]
        for i in range(4):
            t = (T0_US + i * 50_000) * US
            assert (by["web"][i]["arrival_ns"], by["web"][i]["departure_ns"]) == (t, t + 30_000 * US)
            assert by["app"][i]["arrival_ns"] == t + 1_500 * US
            assert by["app"][i]["parent_id"] == by["web"][i]["request_id"]
            assert by["postgres"][i]["parent_id"] == by["app"][i]["request_id"]
        assert by["postgres"][0]["server"] == "10.0.0.4:5432" and by["postgres"][0]["status"] == "ERROR"
        assert by["app"][0]["server"] == "10.0.0.3:8080"


def test_zipkin_client_span_of_an_opentelemetry_sdk_names_its_peer_from_the_tags(tmp_path):
    # what opentelemetry-exporter-zipkin-json sends for a psycopg2 query: no remoteEndpoint, the
    # peer only in the tags; the same server as the OTLP span of the same query would name
    app = {"serviceName": "shop-flask"}
    spans = [
        {"traceId": "a" * 32, "id": "1" * 16, "name": "GET /page", "kind": "SERVER", "timestamp": T0_US,
         "duration": 2_000, "localEndpoint": app},
        {"traceId": "a" * 32, "parentId": "1" * 16, "id": "2" * 16, "name": "SELECT", "kind": "CLIENT",
         "timestamp": T0_US + 500, "duration": 700, "localEndpoint": app,
         "tags": {"db.system": "postgresql", "net.peer.name": "127.0.0.1", "net.peer.port": "5432",
                  "db.statement": "SELECT id FROM items WHERE id = %s"}},
        {"traceId": "a" * 32, "parentId": "1" * 16, "id": "3" * 16, "name": "get", "kind": "CLIENT",
         "timestamp": T0_US + 1_300, "duration": 100, "localEndpoint": app,
         "tags": {"db.system.name": "redis", "server.address": "cache"}},
    ]  # fmt: skip
    path = tmp_path / "zipkin.json"
    path.write_text(json.dumps(spans))
    rows = {r["tier"]: r for r in load_file(path).requests.to_pylist()}
    assert (rows["postgresql"]["server"], rows["postgresql"]["recorder"]) == ("127.0.0.1:5432", "shop-flask")
    assert rows["redis"]["server"] == "cache" and rows["shop-flask"]["server"] == "shop-flask"


def test_a_pool_checkout_is_no_request_of_the_database_in_zipkin_and_jaeger(tmp_path):
    # what @opentelemetry/instrumentation-pg sends around a query: `pg-pool.connect` (the app
    # waiting for one of its own pooled connections; db.system.name set, no query text), then the
    # query. The checkout is not the database's work: no row, in every format (OTLP does the same)
    app = {"serviceName": "shop-express"}
    db = {"db.system.name": "postgresql", "server.address": "127.0.0.1", "server.port": "5432"}
    spans = [
        {"traceId": "a" * 32, "id": "1" * 16, "name": "GET /page", "kind": "SERVER", "timestamp": T0_US,
         "duration": 9_000, "localEndpoint": app},
        {"traceId": "a" * 32, "parentId": "1" * 16, "id": "2" * 16, "name": "pg-pool.connect", "kind": "CLIENT",
         "timestamp": T0_US + 100, "duration": 6_000, "localEndpoint": app, "tags": dict(db)},
        {"traceId": "a" * 32, "parentId": "1" * 16, "id": "3" * 16, "name": "pg.query:SELECT postgres",
         "kind": "CLIENT", "timestamp": T0_US + 6_200, "duration": 700, "localEndpoint": app,
         "tags": {**db, "db.query.text": "SELECT id FROM items WHERE id = $1"}},
    ]  # fmt: skip
    path = tmp_path / "zipkin.json"
    path.write_text(json.dumps(spans))
    rows = load_file(path, format="zipkin").requests.to_pylist()
    assert sorted((r["tier"], r["label"]) for r in rows) == [
        ("postgresql", "SELECT id FROM items WHERE id = ?"),  # the statement's fingerprint, not the span's name
        ("shop-express", "GET /page"),
    ]
    t = "b" * 32
    proc = {"p1": {"serviceName": "shop-express", "tags": []}}
    tags = [{"key": k, "type": "string", "value": v} for k, v in {**db, "span.kind": "client"}.items()]
    jaeger = {"data": [{"traceID": t, "processes": proc, "spans": [
        {"traceID": t, "spanID": "1" * 16, "operationName": "GET /page", "references": [], "startTime": T0_US,
         "duration": 9_000, "processID": "p1", "tags": [{"key": "span.kind", "type": "string", "value": "server"}]},
        {"traceID": t, "spanID": "2" * 16, "operationName": "pg-pool.connect", "startTime": T0_US + 100,
         "duration": 6_000, "processID": "p1", "tags": tags,
         "references": [{"refType": "CHILD_OF", "traceID": t, "spanID": "1" * 16}]},
        {"traceID": t, "spanID": "3" * 16, "operationName": "pg.query:SELECT postgres", "startTime": T0_US + 6_200,
         "duration": 700, "processID": "p1",
         "tags": tags + [{"key": "db.query.text", "type": "string", "value": "SELECT 1"}],
         "references": [{"refType": "CHILD_OF", "traceID": t, "spanID": "1" * 16}]},
    ]}]}  # fmt: skip
    path = tmp_path / "jaeger.json"
    path.write_text(json.dumps(jaeger))
    rows = load_file(path, format="jaeger").requests.to_pylist()
    assert sorted((r["tier"], r["label"]) for r in rows) == [
        ("postgresql", "SELECT ?"),
        ("shop-express", "GET /page"),
    ]


def test_zipkin_truncated_file_keeps_what_was_read(tmp_path):
    text = json.dumps([s for i in range(3) for s in _zipkin_spans(i)])
    path = tmp_path / "cut.json"
    path.write_text(text[: text.index('"c000000000000001"') + 40])  # cut inside trace 1's last span
    result = load_file(path, format="zipkin")
    assert result.skipped == 1 and "JSON syntax error" in result.skipped_at[0]
    assert result.skipped_at[0].startswith(f"{path}:$[7]")
    assert result.requests.num_rows == 3 + 2  # trace 0 whole; trace 1 without its db span


def test_wrong_format_errors(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"nothing": "here"}')
    with pytest.raises(FormatError, match="not Zipkin v2 JSON"):
        load_file(path, format="zipkin")
    with pytest.raises(FormatError, match="not Jaeger JSON"):
        load_file(path, format="jaeger")
    with pytest.raises(FormatError, match="unknown format 'pcapng'"):
        load_file(path, format="pcapng")
    with pytest.raises(FormatError, match="no such file"):
        load([tmp_path / "missing.json"])
