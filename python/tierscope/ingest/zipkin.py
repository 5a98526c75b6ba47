"""Zipkin v2 JSON: a list of spans (``/api/v2/spans`` POST body, ``/api/v2/trace/{id}``) or a list of
traces (``/api/v2/traces``: a list of lists of spans).

Span fields used: ``traceId``, ``id``, ``parentId``, ``name``, ``kind`` (SERVER, CLIENT, PRODUCER,
CONSUMER), ``timestamp`` and ``duration`` in microseconds, ``localEndpoint.serviceName`` (the tier),
``localEndpoint.ipv4``/``ipv6``/``port`` (the server), ``remoteEndpoint.serviceName`` (the callee of a
CLIENT span; without a remote endpoint, as the OpenTelemetry SDKs' Zipkin exporters send them, the
tags ``peer.service``, ``db.system.name``/``db.system`` name it and ``server.address``/
``net.peer.name`` with ``server.port``/``net.peer.port`` its server, as in OTLP; a database pool
checkout or connect that sent no operation, ``pg-pool.connect``, is no request of the database:
`semconv.not_the_callees_work`), ``tags`` (``http.status_code``, ``error``). B3 shared spans (a SERVER span carrying the
id of the CLIENT span that called it, ``"shared": true``) are handled: the CLIENT half is dropped
because its callee was traced. A span without ``kind`` and without ``parentId`` is a root request
(SERVER); other spans without ``kind`` are local work, not requests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tierscope.ingest import _json
from tierscope.ingest.registry import Format, register_format
from tierscope.ingest.result import FormatError, RequestSink
from tierscope.ingest.semconv import client_label, not_the_callees_work

NAME = "zipkin"


def _endpoint(ep: Any) -> tuple[str | None, str | None]:
    if not isinstance(ep, dict):
        return None, None
    host = ep.get("ipv4") or ep.get("ipv6")
    port = ep.get("port")
    addr = f"{host}:{port}" if host and port else host
    return ep.get("serviceName"), addr


def read_span(span: Any, where: str, sink: RequestSink) -> None:
    """One Zipkin v2 span into `sink` (or a skip with the reason)."""
    try:
        if not isinstance(span, dict):
            raise ValueError("span is not an object")
        if not span.get("id"):
            raise ValueError("id missing")
        span_id = str(span["id"]).lower()
        parent = str(span["parentId"]).lower() if span.get("parentId") else None
        start_us = _json.as_int(span.get("timestamp"), "timestamp")
        dur_us = _json.as_int(span.get("duration"), "duration")
        if dur_us < 0:
            raise ValueError(f"duration {dur_us} is negative")
        kind = str(span.get("kind") or "").lower()
        service, addr = _endpoint(span.get("localEndpoint"))
        if not kind and parent is None:
            kind = "server"
        sink.link(span_id, parent)  # a shared SERVER span has its CLIENT half's id and parent
        tags: dict = span["tags"] if isinstance(span.get("tags"), dict) else {}
        if kind == "server":
            if not service:
                raise ValueError("localEndpoint.serviceName missing (the tier)")
            tier, server = service, addr or service
        elif kind == "client":
            if not_the_callees_work(tags, span.get("name")):
                sink.note_seen()
                return
            remote, raddr = _endpoint(span.get("remoteEndpoint"))
            if raddr is None:  # the OpenTelemetry SDKs' Zipkin exporters leave the peer in the tags
                host = tags.get("server.address") or tags.get("net.peer.name")
                port = tags.get("server.port") or tags.get("net.peer.port")
                raddr = f"{host}:{port}" if host and port else host
            tier = (
                remote
                or tags.get("peer.service")
                or tags.get("db.system.name")
                or tags.get("db.system")
                or f"{service or 'unknown'}-downstream"
            )
            server = raddr or tier
        else:
            sink.note_seen()
            return
        status = (
            tags.get("http.status_code")
            or tags.get("http.response.status_code")
            or ("ERROR" if "error" in tags else "OK")
        )
        sink.add(
            tier=str(tier),
            server=str(server),
            arrival_ns=start_us * 1000,
            departure_ns=(start_us + dur_us) * 1000,
            request_id=span_id,
            parent_id=parent,
            label=client_label(tags, span.get("name")) if kind == "client" else span.get("name"),
            status=str(status),
            kind=kind,
            recorder=str(server) if kind == "server" else str(addr or service or tier),
            process=f"{service}\x1f{addr}",
        )
    except (ValueError, TypeError, KeyError) as err:
        sink.skip(where, str(err))


def sniff(head: bytes) -> bool:
    return head.lstrip()[:1] == b"[" and b'"traceId"' in head and (b'"localEndpoint"' in head or b'"timestamp"' in head)


def read(path: Path, sink: RequestSink, **_options) -> None:
    """Stream a Zipkin v2 JSON file into `sink`, one span (or one trace) at a time."""
    path = Path(path)
    if _json.head(path, 4096).lstrip()[:1] != b"[":
        raise FormatError(f"{path}: not Zipkin v2 JSON: expected a JSON list of spans (or of traces)")
    for where, item in _json.stream_items(path, "", sink, "Zipkin v2 JSON"):
        if isinstance(item, list):
            for j, span in enumerate(item):
                read_span(span, f"{where}[{j}]", sink)
        else:
            read_span(item, where, sink)


FORMAT = register_format(Format(NAME, "Zipkin v2 JSON (list of spans or of traces)", sniff, read))
