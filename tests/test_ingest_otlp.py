"""OTLP JSON import, on spans made by the OpenTelemetry SDK itself.

Route to genuine OTLP JSON: the SDK's `InMemorySpanExporter` collects finished spans, the official
encoder (`opentelemetry-exporter-otlp-proto-common`, `encode_spans`) turns them into the
`ExportTraceServiceRequest` protobuf that OTLP exporters send, and `google.protobuf.json_format`
renders it as JSON with integer enums; trace/span ids are then written as hex, which is what the
OTLP/JSON specification requires in place of protobuf's generic base64 (the collector's file
exporter does the same). The base64 form is tested too, since Tempo and hand-rolled exporters use it.
"""

import base64
import json

import pytest
from google.protobuf.json_format import MessageToDict  # noqa: E402
from opentelemetry import trace  # noqa: E402
from opentelemetry.exporter.otlp.proto.common import trace_encoder as encoder
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from tierscope.ingest import FormatError, detect, load_file  # noqa: E402

T0 = 1_763_800_000_000_000_000  # ns
MS = 1_000_000
N_TRACES = 5


def _tracer(service: str, instance: str):
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": service, "service.instance.id": instance}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("tierscope-test"), exporter


def _make_spans():
    """web SERVER -> web CLIENT -> app SERVER -> app CLIENT (postgresql, not traced): known times."""
    web, web_exp = _tracer("web", "web1")
    app, app_exp = _tracer("app", "app1")
    K = trace.SpanKind
    for i in range(N_TRACES):
        t = T0 + i * 200 * MS
        s_web = web.start_span("GET /page", kind=K.SERVER, start_time=t, attributes={"http.response.status_code": 200})
        ctx = trace.set_span_in_context(s_web)
        c_web = web.start_span("GET app", kind=K.CLIENT, context=ctx, start_time=t + 10 * MS)
        s_app = app.start_span(
            "GET /api", kind=K.SERVER, context=trace.set_span_in_context(c_web), start_time=t + 12 * MS
        )
        internal = app.start_span(
            "render", kind=K.INTERNAL, context=trace.set_span_in_context(s_app), start_time=t + 15 * MS
        )
        c_db = app.start_span(
            "SELECT stories",
            kind=K.CLIENT,
            context=trace.set_span_in_context(internal),
            start_time=t + 20 * MS,
            attributes={"db.system": "postgresql", "server.address": "10.0.0.4", "server.port": 5432},
        )
        c_db.end(end_time=t + (50 + i) * MS)
        internal.end(end_time=t + 60 * MS)
        s_app.end(end_time=t + 88 * MS)
        c_web.end(end_time=t + 90 * MS)
        s_web.end(end_time=t + 100 * MS)
    return list(web_exp.get_finished_spans()) + list(app_exp.get_finished_spans())


def _otlp_dict(spans, hex_ids=True):
    doc = MessageToDict(encoder.encode_spans(spans), use_integers_for_enums=True)
    if hex_ids:
        for rs in doc["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if key in span:
                            span[key] = base64.b64decode(span[key]).hex()
    return doc


@pytest.fixture(scope="module")
def spans():
    return _make_spans()


def _check(result):
    t = result.requests
    assert result.skipped == 0
    rows = t.to_pylist()
    by_tier = {}
    for r in rows:
        by_tier.setdefault(r["tier"], []).append(r)
    assert sorted(by_tier) == ["app", "postgresql", "web"]  # web's CLIENT span is answered by app's SERVER span
    assert all(len(v) == N_TRACES for v in by_tier.values())
    web = sorted(by_tier["web"], key=lambda r: r["arrival_ns"])
    app = sorted(by_tier["app"], key=lambda r: r["arrival_ns"])
    db = sorted(by_tier["postgresql"], key=lambda r: r["arrival_ns"])
    for i in range(N_TRACES):
        t = T0 + i * 200 * MS
        assert (web[i]["arrival_ns"], web[i]["departure_ns"]) == (t, t + 100 * MS)
        assert (app[i]["arrival_ns"], app[i]["departure_ns"]) == (t + 12 * MS, t + 88 * MS)
        assert (db[i]["arrival_ns"], db[i]["departure_ns"]) == (t + 20 * MS, t + (50 + i) * MS)
        assert app[i]["parent_id"] == web[i]["request_id"]  # through web's CLIENT span
        assert db[i]["parent_id"] == app[i]["request_id"]  # through app's INTERNAL span
        assert web[i]["parent_id"] is None
    assert {r["server"] for r in web} == {"web1"}
    assert {r["server"] for r in db} == {"10.0.0.4:5432"}
    assert web[0]["status"] == "200" and web[0]["label"] == "GET /page"
    assert all(len(r["request_id"]) == 16 for r in rows)


def test_ndjson_file_exporter_layout(spans, tmp_path):
    path = tmp_path / "spans.jsonl"
    doc = _otlp_dict(spans)
    # The file exporter writes one export request per line; split the resources over two lines.
    lines = [json.dumps({"resourceSpans": [rs]}) for rs in doc["resourceSpans"]]
    path.write_text("\n".join(lines) + "\n")
    assert detect(path) == "otlp"
    _check(load_file(path))


def test_pretty_document_with_base64_ids_streams(spans, tmp_path):
    path = tmp_path / "spans.json"
    path.write_text(json.dumps(_otlp_dict(spans, hex_ids=False), indent=2))
    assert detect(path) == "otlp"
    _check(load_file(path))


def test_malformed_spans_are_skipped_with_json_paths(spans, tmp_path):
    doc = _otlp_dict(spans)
    bad = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
    del bad[0]["startTimeUnixNano"]
    bad[1]["endTimeUnixNano"] = "not-a-number"
    path = tmp_path / "spans.jsonl"
    path.write_text(json.dumps(doc) + "\n{this is not json\n")
    result = load_file(path)
    assert result.skipped == 3
    assert result.skipped_at[0].startswith(f"{path}:1:$.resourceSpans[0].scopeSpans[0].spans[0]: startTimeUnixNano")
    assert "spans[1]" in result.skipped_at[1] and "not-a-number" in result.skipped_at[1]
    assert result.skipped_at[2].startswith(f"{path}:2: not JSON")
    assert result.requests.num_rows >= 3 * N_TRACES - 2


def test_not_otlp_is_one_clear_error(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"hello": [1, 2, 3]}) + "\n")
    with pytest.raises(FormatError, match="not OTLP JSON: expected an object with a resourceSpans list"):
        load_file(path, format="otlp")
    with pytest.raises(FormatError, match="format not recognised"):
        detect(path)


def test_tempo_batches_and_legacy_instrumentation_library_spans(spans, tmp_path):
    """Grafana Tempo's trace-by-id JSON: `batches` in place of resourceSpans, base64 ids, and (older
    versions) `instrumentationLibrarySpans` in place of scopeSpans; kinds as enum names."""
    doc = _otlp_dict(spans, hex_ids=False)
    for rs in doc["resourceSpans"]:
        rs["instrumentationLibrarySpans"] = rs.pop("scopeSpans")
        for ss in rs["instrumentationLibrarySpans"]:
            for span in ss["spans"]:
                span["kind"] = {1: "SPAN_KIND_INTERNAL", 2: "SPAN_KIND_SERVER", 3: "SPAN_KIND_CLIENT"}[span["kind"]]
    path = tmp_path / "tempo.json"
    path.write_text(json.dumps({"batches": doc["resourceSpans"]}, indent=1))
    assert detect(path) == "otlp"
    _check(load_file(path))


def _one_resource_doc(n, resource_last=False, service="web", instance="web1"):
    """One resourceSpans element holding `n` SERVER spans (ids 1..n), as exporters that batch everything write."""
    spans = [
        {
            "traceId": f"{s + 1:032x}",
            "spanId": f"{s + 1:016x}",
            "name": f"GET /{s}",
            "kind": 2,
            "startTimeUnixNano": str(T0 + s * MS),
            "endTimeUnixNano": str(T0 + s * MS + MS // 2),
            "attributes": [{"key": "http.response.status_code", "value": {"intValue": "200"}}],
            "status": {},
        }
        for s in range(n)
    ]
    resource = {
        "attributes": [
            {"key": "service.name", "value": {"stringValue": service}},
            {"key": "service.instance.id", "value": {"stringValue": instance}},
        ]
    }
    scope_spans = [{"scope": {"name": "tierscope-test"}, "spans": spans}]
    element = (
        {"scopeSpans": scope_spans, "resource": resource}
        if resource_last
        else {"resource": resource, "scopeSpans": scope_spans}
    )
    return {"resourceSpans": [element]}


@pytest.mark.parametrize("indent", [None, 2])
@pytest.mark.parametrize("k", [1, 17, 39])
def test_cut_inside_the_only_element_keeps_the_spans_before_the_cut(tmp_path, k, indent):
    n = 40
    text = json.dumps(_one_resource_doc(n), indent=indent)
    cut = text.index(f'"{k + 1:016x}"') + 5  # inside span k's spanId
    path = tmp_path / "cut.json"
    path.write_text(text[:cut])
    assert detect(path) == "otlp"
    result = load_file(path)
    rows = result.requests.to_pylist()
    assert len(rows) == k
    assert [r["request_id"] for r in sorted(rows, key=lambda r: r["arrival_ns"])] == [f"{s + 1:016x}" for s in range(k)]
    assert {(r["tier"], r["server"]) for r in rows} == {("web", "web1")}
    assert result.skipped == 1
    assert result.skipped_at[0].startswith(
        f"{path}:$.resourceSpans[0].scopeSpans[0].spans[{k}]: JSON syntax error, rest of file unread"
    )


def test_cut_between_spans_and_after_the_last_span(tmp_path):
    n = 10
    text = json.dumps(_one_resource_doc(n))
    between = text.index(f'{{"traceId": "{5 + 1:032x}"')  # just before span 5 opens
    after = text.rindex('"status": {}}') + len('"status": {}}')  # every span complete, their list is not
    for cut, kept, at in ((between, 5, "spans[5]"), (after, n, f"spans[{n}]")):
        path = tmp_path / f"cut{cut}.json"
        path.write_text(text[:cut])
        result = load_file(path, format="otlp")
        assert result.requests.num_rows == kept
        assert (
            result.skipped == 1 and f"$.resourceSpans[0].scopeSpans[0].{at}: JSON syntax error" in result.skipped_at[0]
        )


def test_resource_after_scope_spans_still_names_the_tier(tmp_path):
    n = 6
    doc = _one_resource_doc(n, resource_last=True, service="app", instance="app7")
    doc["resourceSpans"].append(_one_resource_doc(1, service="web", instance="web1")["resourceSpans"][0])
    doc["resourceSpans"][1]["scopeSpans"][0]["spans"][0]["spanId"] = "f" * 16
    path = tmp_path / "resource_last.json"
    path.write_text(json.dumps(doc, indent=1))
    assert json.loads(path.read_text())["resourceSpans"][0].keys() == {"scopeSpans", "resource"}
    result = load_file(path)
    assert result.skipped == 0
    rows = result.requests.to_pylist()
    assert sorted((r["tier"], r["server"]) for r in rows) == [("app", "app7")] * n + [("web", "web1")]


def test_cut_before_any_complete_span_is_a_format_error(tmp_path):
    text = json.dumps(_one_resource_doc(5), indent=2)
    for cut in (
        text.index('"resource"') + 30,
        text.index('"spans"') + 12,
        text.index(f'"{1:016x}"') + 3,
        text.index('"status"'),
    ):
        path = tmp_path / "cut.json"
        path.write_text(text[:cut])
        with pytest.raises(FormatError, match="not OTLP JSON: JSON syntax error before the first complete span"):
            load_file(path, format="otlp")
