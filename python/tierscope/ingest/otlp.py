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
  else ``server.address``; server = ``server.address[:port]`` (or ``net.peer.name[:port]``); label
  = the fingerprint of its SQL statement (``db.query.text``/``db.statement``, as the tracer labels
  it on the wire), else the span name;
- INTERNAL, PRODUCER and CONSUMER spans are not requests but still link parents to children,
  nor is a database CLIENT span named for a pool or a connection that sent no operation (a pool
  checkout such as ``pg-pool.connect``: the caller waiting for its own pool, not the database's work);
- ``recorder`` (whose clock stamped the times) is the server itself for a SERVER span, and the
  calling process for a CLIENT span (named as that process's SERVER rows are);
- ``parent_id`` is the nearest ancestor span that is itself a row (the upstream request).

A single document is read span by span, so a file cut part way (a truncated write, a full disk)
keeps every complete span before the cut and counts the rest as one skipped record.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path
from typing import Any

import ijson
from ijson.common import ObjectBuilder

from tierscope.ingest import _json
from tierscope.ingest.registry import Format, register_format
from tierscope.ingest.result import FormatError, RequestSink
from tierscope.ingest.semconv import client_label, not_the_callees_work

NAME = "otlp"
_KINDS = {
    1: "internal",
    2: "server",
    3: "client",
    4: "producer",
    5: "consumer",
    0: "unspecified",
    "SPAN_KIND_INTERNAL": "internal",
    "SPAN_KIND_SERVER": "server",
    "SPAN_KIND_CLIENT": "client",
    "SPAN_KIND_PRODUCER": "producer",
    "SPAN_KIND_CONSUMER": "consumer",
    "SPAN_KIND_UNSPECIFIED": "unspecified",
}
_TOP_KEYS = ("resourceSpans", "resource_spans", "batches")
_SCOPE_KEYS = ("scopeSpans", "scope_spans", "instrumentationLibrarySpans", "instrumentation_library_spans")
_NO_SERVICE = "resource has no service.name (the tier)"


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


def _service_instance(resource: Any) -> tuple[str | None, str | None]:
    """(service.name, service.instance.id or host.name) of a ``resource`` object."""
    items = resource.get("attributes") if isinstance(resource, dict) else None
    res_attrs = attributes(items if isinstance(items, list) else None)
    return res_attrs.get("service.name"), res_attrs.get("service.instance.id") or res_attrs.get("host.name")


def read_resource_spans(rs: Any, where: str, sink: RequestSink) -> None:
    """Every span of one ``resourceSpans`` element into `sink`."""
    if not isinstance(rs, dict):
        sink.skip(where, "expected an object with resource and scopeSpans")
        return
    service, instance = _service_instance(rs.get("resource"))
    scopes = _get(rs, *_SCOPE_KEYS, default=None)
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
            raise ValueError(_NO_SERVICE)
        server = (
            instance or _addr(attrs, ("server.address", "net.host.name"), ("server.port", "net.host.port")) or service
        )
        tier = service
    elif kind == "client":
        if not_the_callees_work(attrs, span.get("name")):
            sink.note_seen()
            return
        tier = str(
            attrs.get("peer.service")
            or attrs.get("db.system.name")
            or attrs.get("db.system")
            or attrs.get("server.address")
            or attrs.get("net.peer.name")
            or f"{service or 'unknown'}-downstream"
        )
        server = _addr(
            attrs,
            ("server.address", "net.peer.name", "net.sock.peer.addr"),
            ("server.port", "net.peer.port", "net.sock.peer.port"),
        ) or str(tier)
    else:
        sink.note_seen()
        return
    sink.add(
        tier=str(tier),
        server=str(server),
        arrival_ns=start,
        departure_ns=end,
        request_id=span_id,
        parent_id=parent,
        label=client_label(attrs, span.get("name")) if kind == "client" else span.get("name"),
        status=_status(attrs, span),
        bytes_in=_int_or_none(attrs.get("http.request.body.size")),
        bytes_out=_int_or_none(attrs.get("http.response.body.size")),
        client=_addr(
            attrs, ("client.address", "net.sock.peer.addr", "net.peer.ip"), ("client.port", "net.sock.peer.port")
        )
        if kind == "server"
        else None,
        kind=kind,
        recorder=str(server) if kind == "server" else str(instance or service or tier),
        process=f"{service}\x1f{instance}",
    )


def sniff(head: bytes) -> bool:
    if head.lstrip()[:1] not in (b"{", b"["):
        return False
    return (
        b'"resourceSpans"' in head
        or b'"resource_spans"' in head
        or (b'"batches"' in head and (b'"scopeSpans"' in head or b'"instrumentationLibrarySpans"' in head))
    )


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
                    raise FormatError(
                        f"{where}: not OTLP JSON: expected an object with a resourceSpans list, "
                        f"got keys {sorted(doc)[:5] if isinstance(doc, dict) else type(doc).__name__}"
                    )
                sink.skip(where, "no resourceSpans list")
                continue
            any_ok = True
            key, rss = items
            for i, rs in enumerate(rss):
                read_resource_spans(rs, f"{where}:$.{key}[{i}]", sink)
        return
    prefix = _json.find_array(path, _TOP_KEYS)
    if prefix is None:
        raise FormatError(
            f"{path}: not OTLP JSON: no resourceSpans (or batches) list found in the first "
            f'10,000 JSON tokens; expected {{"resourceSpans": [...]}} as the file exporter writes'
        )
    _read_document(path, prefix, sink)


# Where `_read_document` is between values: inside the top array, a resourceSpans element, its
# scopeSpans list, one scope, or that scope's spans list.
_TOP, _ELEM, _SCOPES, _SCOPE, _SPANS = range(5)
# What the value being read (captured) becomes once complete.
_CAP_SKIP, _CAP_RESOURCE, _CAP_SPAN = range(10, 13)  # distinct from the levels: `want` holds either
_STARTS = frozenset(("start_map", "start_array"))
_ENDS = frozenset(("end_map", "end_array"))


def _read_document(path: Path, prefix: str, sink: RequestSink) -> None:
    """The resourceSpans array(s) at ijson `prefix` of one JSON document, span by span.

    Each span is built on its own (`ObjectBuilder` on `ijson.parse` events) and handed to `_span`
    as soon as it is complete, so a file cut part way (a truncated write, a full disk) keeps every
    span before the cut even when one resourceSpans element holds them all, as exporters often
    write. A span needs its element's ``resource`` (the tier); when the resource comes after
    ``scopeSpans`` in the element, that element's spans wait for it (or for the element's end).
    A syntax error part way ends the read: what was read is kept, and the rest is one skipped
    record at the span (or element) being read; with nothing complete before it, a FormatError.
    """
    base = f"{path}:{'$.' + prefix if prefix else '$'}"
    i = j = k = -1  # element, scope and span index (locations say scopeSpans whatever the key's spelling)
    level = _TOP
    want = None  # after a map key: what its value is (None: not waiting for a value)
    depth = 0  # > 0 while capturing a value (building it, or skipping it when builder is None)
    builder: ObjectBuilder | None = None
    cap = _CAP_SKIP
    elements = spans_read = 0  # complete elements and complete spans (whether they import or not)
    # Per element: the resource's service and instance once read, spans waiting for it, and which
    # lists were found; per scope: whether it had a spans list.
    has_resource = has_scopes = has_spans = False
    service = instance = None
    pending: list[tuple[str, Any]] = []

    def emit(span: Any, loc: str, cut: bool = False) -> None:
        try:
            _span(span, service, instance, sink)
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            reason = str(err)
            if cut and reason == _NO_SERVICE:
                reason += ": the element's resource is not in the file (cut before it)"
            sink.skip(loc, reason)

    def flush(cut: bool = False) -> None:
        for loc, span in pending:
            emit(span, loc, cut)
        pending.clear()

    def where() -> str:
        """The location reading stopped at: the span (element, scope) being read, else the next one."""
        elem = f"{base}[{i}]"
        if level == _TOP:
            return elem if depth else f"{base}[{i + 1}]"
        if level == _ELEM:
            return f"{elem}.resource" if depth and cap == _CAP_RESOURCE else elem
        if level == _SCOPES:
            return f"{elem}.scopeSpans[{j if depth else j + 1}]"
        if level == _SCOPE:
            return f"{elem}.scopeSpans[{j}]"
        return f"{elem}.scopeSpans[{j}].spans[{k if depth else k + 1}]"

    with _json.guarded(path) as f:  # nesting bounded, strings read in linear time
        events = ijson.parse(f, buf_size=f.buf_size, use_float=True)
        try:
            for pfx, event, value in events:
                if event != "start_array" or pfx != prefix:
                    continue
                # Inside one top array (a document may hold several, e.g. a list of export requests).
                for _pfx, event, value in events:
                    if depth:  # inside the value being captured: only its end matters here
                        if builder is not None:
                            builder.event(event, value)
                        if event in _STARTS:
                            depth += 1
                            continue
                        if event not in _ENDS:
                            continue
                        depth -= 1
                        if depth:
                            continue
                        captured = builder.value if builder is not None else None
                    elif want is not None:  # the value of a key just read
                        wanted, want = want, None
                        if wanted in (_SCOPES, _SPANS):
                            if event == "start_array":
                                if wanted == _SCOPES:
                                    level, has_scopes, j = _SCOPES, True, -1
                                else:
                                    level, has_spans, k = _SPANS, True, -1
                                continue
                            wanted = _CAP_SKIP  # not a list: as if the key were absent
                        cap = wanted
                        if event in _STARTS:
                            builder = ObjectBuilder() if cap != _CAP_SKIP else None
                            if builder is not None:
                                builder.event(event, value)
                            depth = 1
                            continue
                        captured = value  # a scalar value is complete at once
                    elif level == _SPANS:
                        if event == "end_array":
                            level = _SCOPE
                            continue
                        k += 1
                        cap = _CAP_SPAN
                        if event in _STARTS:
                            builder = ObjectBuilder()
                            builder.event(event, value)
                            depth = 1
                            continue
                        captured = value
                    elif level == _SCOPE:
                        if event == "map_key":
                            want = _SPANS if value == "spans" and not has_spans else _CAP_SKIP
                        elif event == "end_map":
                            if not has_spans:
                                sink.skip(f"{base}[{i}].scopeSpans[{j}]", "no spans list")
                            level = _SCOPES
                        continue
                    elif level == _ELEM:
                        if event == "map_key":
                            if value == "resource":
                                want = _CAP_RESOURCE
                            elif value in _SCOPE_KEYS and not has_scopes:  # the first list found is read
                                want = _SCOPES
                            else:
                                want = _CAP_SKIP
                        elif event == "end_map":
                            if not has_scopes:
                                sink.skip(f"{base}[{i}]", "no scopeSpans list")
                            flush()
                            elements += 1
                            level = _TOP
                        continue
                    elif level == _SCOPES:
                        if event == "end_array":
                            level = _ELEM
                            continue
                        j += 1
                        if event == "start_map":
                            level, has_spans = _SCOPE, False
                            continue
                        sink.skip(f"{base}[{i}].scopeSpans[{j}]", "no spans list")
                        cap, builder, depth = _CAP_SKIP, None, 1 if event in _STARTS else 0
                        continue
                    else:  # _TOP
                        if event == "end_array":
                            break
                        i += 1
                        if event == "start_map":
                            level, has_resource, has_scopes = _ELEM, False, False
                            service = instance = None
                            continue
                        sink.skip(f"{base}[{i}]", "expected an object with resource and scopeSpans")
                        if event in _STARTS:
                            cap, builder, depth = _CAP_SKIP, None, 1
                        else:
                            elements += 1
                        continue
                    # A captured value is complete.
                    builder = None
                    if cap == _CAP_SPAN:
                        spans_read += 1
                        loc = f"{base}[{i}].scopeSpans[{j}].spans[{k}]"
                        if has_resource:
                            emit(captured, loc)
                        else:
                            pending.append((loc, captured))
                    elif cap == _CAP_RESOURCE:
                        has_resource = True
                        service, instance = _service_instance(captured)
                        flush()
                    elif level == _TOP:  # a skipped element that was not an object
                        elements += 1
        except ijson.JSONError as err:
            err = f.syntax_error(err)
            if not spans_read and not elements:
                raise FormatError(
                    f"{path}: not OTLP JSON: JSON syntax error before the first complete span ({err})"
                ) from None
            # The cut first (only the first few skip locations are kept), then the spans of an element
            # whose resource was to come after them: CLIENT spans and the parent links still count.
            sink.skip(where(), f"JSON syntax error, rest of file unread ({err})")
            flush(cut=True)


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
