"""OpenTelemetry OTLP JSON: the SDK/collector file exporters (NDJSON) and single JSON documents.

Layout (OTLP/JSON, opentelemetry-proto): ``{"resourceSpans": [{"resource": {"attributes": [...]},
"scopeSpans": [{"spans": [...]}]}]}``. Also accepted: the legacy ``instrumentationLibrarySpans``,
Grafana Tempo's ``batches`` in place of ``resourceSpans``, snake_case field names, a wrapping
object (Jaeger's API v3 ``{"result": {...}}``), times as strings or numbers, ids as hex (the
OTLP/JSON rule) or base64 (protobuf's generic JSON mapping), kinds as integers or enum names.

Mapping to `requests` (one row per request at one server):

- the tier is the resource's ``service.name``; the server is ``service.instance.id``, else
  ``host.name``, else ``server.address[:server.port]`` of the span, else the tier;
- a SERVER span is a request at its tier: arrival = ``startTimeUnixNano``, departure =
  ``endTimeUnixNano``; label = span name; status = ``http.response.status_code`` (or the older
  ``http.status_code``), else ``ERROR``/``OK`` from the span status;
- a CLIENT span is a request at the *downstream* tier only when no SERVER span answers it (an
  uninstrumented database, say): tier = ``peer.service``, else ``db.system.name``/``db.system``,
  else ``server.address``; server = ``server.address[:port]`` (or ``net.peer.name[:port]``);
- INTERNAL, PRODUCER and CONSUMER spans are not requests but still link parents to children;
- ``parent_id`` is the nearest ancestor span that is itself a row (the upstream request).
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path
from typing import Any

from tierscope.ingest import _json
from tierscope.ingest.registry import Format, register_format
from tierscope.ingest.result import FormatError, RequestSink

NAME = "otlp"
_KINDS = {
    1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer", 0: "unspecified",
    "SPAN_KIND_INTERNAL": "internal", "SPAN_KIND_SERVER": "server", "SPAN_KIND_CLIENT": "client",
    "SPAN_KIND_PRODUCER": "producer", "SPAN_KIND_CONSUMER": "consumer", "SPAN_KIND_UNSPECIFIED": "unspecified",
}
_TOP_KEYS = ("resourceSpans", "resource_spans", "batches")


def _get(obj: dict, *names: str, default: Any = None) -> Any:
    for name in names:
        if name in obj:
            return obj[name]
    return default


def norm_id(value: Any, what: str) -> str | None:
    """A span/trace id as lowercase hex: hex is kept, base64 (protobuf JSON mapping) converted."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError(f"{what} is {value!r}, expected a hex string")
    if len(value) in (16, 32):
        try:
            int(value, 16)
            return value.lower()
        except ValueError:
            pass
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{what} {value!r} is neither hex nor base64") from None
    if len(raw) not in (8, 16):
        raise ValueError(f"{what} {value!r} decodes to {len(raw)} bytes, expected 8 or 16")
    return raw.hex()


def _value(v: Any) -> Any:
    if not isinstance(v, dict):
        return v
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        return int(v["intValue"])
    for key in ("boolValue", "doubleValue", "string_value", "bool_value", "double_value"):
        if key in v:
            return v[key]
    if "int_value" in v:
        return int(v["int_value"])
    return None


def attributes(items: Any) -> dict[str, Any]:
    """OTLP ``[{"key": k, "value": {"stringValue": ...}}]`` as a plain dict."""
    out: dict[str, Any] = {}
    for item in items or []:
        if isinstance(item, dict) and "key" in item:
            out[item["key"]] = _value(item.get("value"))
    return out


def _addr(attrs: dict, host_keys: tuple[str, ...], port_keys: tuple[str, ...]) -> str | None:
    if not attrs:
        return None
    for k in host_keys:
        host = attrs.get(k)
        if host not in (None, ""):
            break
    else:
        return None
    for k in port_keys:
        port = attrs.get(k)
        if port not in (None, ""):
            return f"{host}:{port}"
    return str(host)


def _status(attrs: dict, span: dict) -> str:
    for key in ("http.response.status_code", "http.status_code", "rpc.grpc.status_code"):
        if attrs.get(key) is not None:
            return str(attrs[key])
    code = _get(_get(span, "status", default={}) or {}, "code", default=0)
    return "ERROR" if code in (2, "STATUS_CODE_ERROR") else "OK"


def _int_or_none(v: Any) -> int | None:
    try:
        return int(v) if v is not None else None
    except (TypeError, ValueError):
        return None


def read_resource_spans(rs: Any, where: str, sink: RequestSink) -> None:
    """Every span of one ``resourceSpans`` element into `sink`."""
    if not isinstance(rs, dict):
        sink.skip(where, "expected an object with resource and scopeSpans")
        return
    res_attrs = attributes(_get(rs.get("resource") or {}, "attributes", default=[]))
    service = res_attrs.get("service.name")
    instance = res_attrs.get("service.instance.id") or res_attrs.get("host.name")
    scopes = _get(rs, "scopeSpans", "scope_spans", "instrumentationLibrarySpans", "instrumentation_library_spans",
                  default=None)
    if not isinstance(scopes, list):
        sink.skip(where, "no scopeSpans list")
        return
    for si, scope in enumerate(scopes):
        spans = scope.get("spans") if isinstance(scope, dict) else None
        if not isinstance(spans, list):
            sink.skip(f"{where}.scopeSpans[{si}]", "no spans list")
            continue
        for pi, span in enumerate(spans):
            loc = f"{where}.scopeSpans[{si}].spans[{pi}]"
            try:
                _span(span, service, instance, sink)
            except (ValueError, TypeError, KeyError, AttributeError) as err:
                sink.skip(loc, str(err))


def _span(span: dict, service: str | None, instance: str | None, sink: RequestSink) -> None:
    if not isinstance(span, dict):
        raise ValueError("span is not an object")
    get = span.get
    span_id = norm_id(get("spanId", get("span_id")), "spanId")
    if span_id is None:
        raise ValueError("spanId missing")
    parent = norm_id(get("parentSpanId", get("parent_span_id")), "parentSpanId")
    start = _json.as_int(get("startTimeUnixNano", get("start_time_unix_nano")), "startTimeUnixNano")
    end = _json.as_int(get("endTimeUnixNano", get("end_time_unix_nano")), "endTimeUnixNano")
    if end < start:
        raise ValueError(f"endTimeUnixNano {end} is before startTimeUnixNano {start}")
    kind = _KINDS.get(get("kind", 0), "unspecified")
    sink.link(span_id, parent)
    attrs = attributes(span.get("attributes"))
    if kind == "server":
        if not service:
            raise ValueError("resource has no service.name (the tier)")
        server = instance or _addr(attrs, ("server.address", "net.host.name"), ("server.port", "net.host.port")) or service
        tier = service
    elif kind == "client":
        tier = attrs.get("peer.service") or attrs.get("db.system.name") or attrs.get("db.system") \
            or attrs.get("server.address") or attrs.get("net.peer.name")
        if not tier:
            tier = f"{service or 'unknown'}-downstream"
        server = _addr(attrs, ("server.address", "net.peer.name", "net.sock.peer.addr"),
                       ("server.port", "net.peer.port", "net.sock.peer.port")) or str(tier)
    else:
        sink.note_seen()
        return
    sink.add(
        tier=str(tier), server=str(server), arrival_ns=start, departure_ns=end, request_id=span_id,
        parent_id=parent, label=span.get("name"), status=_status(attrs, span),
        bytes_in=_int_or_none(attrs.get("http.request.body.size")),
        bytes_out=_int_or_none(attrs.get("http.response.body.size")),
        client=_addr(attrs, ("client.address", "net.sock.peer.addr", "net.peer.ip"), ("client.port", "net.sock.peer.port"))
        if kind == "server" else None,
        kind=kind,
    )


def sniff(head: bytes) -> bool:
    if head.lstrip()[:1] not in (b"{", b"["):
        return False
    return (b'"resourceSpans"' in head or b'"resource_spans"' in head
            or (b'"batches"' in head and (b'"scopeSpans"' in head or b'"instrumentationLibrarySpans"' in head)))


def read(path: Path, sink: RequestSink, **_options) -> None:
    """Stream an OTLP JSON file into `sink` (see the module docstring for the mapping)."""
    path = Path(path)
    first = _json.first_line_object(path)
    if isinstance(first, dict):  # NDJSON: one ExportTraceServiceRequest per line
        any_ok = False
        for where, doc in _json.ndjson_values(path, sink):
            items = _find_resource_spans(doc)
            if items is None:
                if not any_ok and sink.records == 0:
                    raise FormatError(f"{where}: not OTLP JSON: expected an object with a resourceSpans list, "
                                      f"got keys {sorted(doc)[:5] if isinstance(doc, dict) else type(doc).__name__}")
                sink.skip(where, "no resourceSpans list")
                continue
            any_ok = True
            key, rss = items
            for i, rs in enumerate(rss):
                read_resource_spans(rs, f"{where}:$.{key}[{i}]", sink)
        return
    prefix = _json.find_array(path, _TOP_KEYS)
    if prefix is None:
        raise FormatError(f"{path}: not OTLP JSON: no resourceSpans (or batches) list found in the first "
                          f"10,000 JSON tokens; expected {{\"resourceSpans\": [...]}} as the file exporter writes")
    for where, rs in _json.stream_items(path, prefix, sink, "OTLP JSON"):
        read_resource_spans(rs, where, sink)


def _find_resource_spans(doc: Any, depth: int = 0) -> tuple[str, list] | None:
    if not isinstance(doc, dict) or depth > 3:
        return None
    for key in _TOP_KEYS:
        if isinstance(doc.get(key), list):
            return key, doc[key]
    for value in doc.values():
        found = _find_resource_spans(value, depth + 1)
        if found:
            return found
    return None


FORMAT = register_format(Format(NAME, "OpenTelemetry OTLP JSON (file exporter, collector, Tempo)", sniff, read))
