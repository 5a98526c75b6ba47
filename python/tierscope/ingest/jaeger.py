"""Jaeger JSON: the UI's "Download JSON" and the query API (``/api/traces``) output.

Layout: ``{"data": [{"traceID", "spans": [...], "processes": {"p1": {"serviceName", "tags"}}}]}``;
also accepted: a bare list of traces, or one trace object. Times are microseconds
(``startTime`` since the epoch, ``duration``), converted to nanoseconds.

Mapping to `requests`: the tier is the span's process ``serviceName``; the server is the process
tag ``hostname`` (else ``ip``, else the tier). The span kind comes from the ``span.kind`` tag;
a span without it counts as a SERVER span when it is an entry into its service (no parent, or a
parent in another process). SERVER spans are requests at their tier; CLIENT spans become requests
at the downstream tier (``peer.service``, ``db.system.name``/``db.system``, ``peer.hostname``) when no
SERVER span answers them, but a database pool checkout or connect that sent no operation
(`semconv.not_the_callees_work`) is no request of the database; the parent is the first ``CHILD_OF`` (else ``FOLLOWS_FROM``) reference.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tierscope.ingest import _json
from tierscope.ingest.registry import Format, register_format
from tierscope.ingest.result import FormatError, RequestSink
from tierscope.ingest.semconv import client_label, not_the_callees_work

NAME = "jaeger"


def _tags(items: Any) -> dict[str, Any]:
    if isinstance(items, dict):
        return items
    return {t["key"]: t.get("value") for t in items or [] if isinstance(t, dict) and "key" in t}


def _parent(span: dict) -> str | None:
    refs = span.get("references") or []
    for wanted in ("CHILD_OF", "FOLLOWS_FROM"):
        for ref in refs:
            if isinstance(ref, dict) and ref.get("refType") == wanted and ref.get("spanID"):
                return str(ref["spanID"]).lower()
    parent = span.get("parentSpanID")
    return str(parent).lower() if parent not in (None, "", "0") else None


def read_trace(trace: Any, where: str, sink: RequestSink) -> None:
    """Every span of one Jaeger trace object into `sink`."""
    if not isinstance(trace, dict) or not isinstance(trace.get("spans"), list):
        sink.skip(where, "expected a trace object with a spans list")
        return
    processes = trace.get("processes") or {}
    service_of: dict[str, str | None] = {}
    for span in trace["spans"]:
        if isinstance(span, dict) and span.get("spanID"):
            service_of[str(span["spanID"]).lower()] = _service(span, processes)[0]
    for i, span in enumerate(trace["spans"]):
        loc = f"{where}.spans[{i}]"
        try:
            _span(span, processes, service_of, sink)
        except (ValueError, TypeError, KeyError) as err:
            sink.skip(loc, str(err))


def _service(span: dict, processes: dict) -> tuple[str | None, dict]:
    proc = span.get("process")
    if not isinstance(proc, dict):
        proc = processes.get(span.get("processID"))
    if not isinstance(proc, dict):
        return None, {}
    return proc.get("serviceName"), _tags(proc.get("tags"))


def _span(span: dict, processes: dict, service_of: dict, sink: RequestSink) -> None:
    if not isinstance(span, dict):
        raise ValueError("span is not an object")
    if not span.get("spanID"):
        raise ValueError("spanID missing")
    span_id = str(span["spanID"]).lower()
    service, ptags = _service(span, processes)
    if not service:
        raise ValueError(f"processID {span.get('processID')!r} has no serviceName in processes")
    start_us = _json.as_int(span.get("startTime"), "startTime")
    dur_us = _json.as_int(span.get("duration"), "duration")
    if dur_us < 0:
        raise ValueError(f"duration {dur_us} is negative")
    parent = _parent(span)
    sink.link(span_id, parent)
    tags = _tags(span.get("tags"))
    kind = str(tags.get("span.kind") or "").lower()
    if not kind and (parent is None or service_of.get(parent, service) != service):
        kind = "server"
    if kind == "server":
        tier = service
        server = ptags.get("hostname") or ptags.get("ip") or service
    elif kind == "client":
        if not_the_callees_work(tags, span.get("operationName")):
            sink.note_seen()
            return
        tier = (
            tags.get("peer.service")
            or tags.get("db.system.name")
            or tags.get("db.system")
            or tags.get("peer.hostname")
            or tags.get("server.address")
            or f"{service}-downstream"
        )
        host = tags.get("peer.hostname") or tags.get("server.address") or tags.get("peer.ipv4")
        port = tags.get("peer.port") or tags.get("server.port")
        server = f"{host}:{port}" if host and port else (host or tier)
    else:
        sink.note_seen()
        return
    status = tags.get("http.status_code") or tags.get("http.response.status_code")
    if status is None:
        status = "ERROR" if tags.get("error") in (True, "true") else "OK"
    sink.add(
        tier=str(tier),
        server=str(server),
        arrival_ns=start_us * 1000,
        departure_ns=(start_us + dur_us) * 1000,
        request_id=span_id,
        parent_id=parent,
        label=client_label(tags, span.get("operationName")) if kind == "client" else span.get("operationName"),
        status=str(status),
        kind=kind,
        recorder=str(server) if kind == "server" else str(ptags.get("hostname") or ptags.get("ip") or service),
        process=f"{service}\x1f{ptags.get('hostname') or ptags.get('ip')}",
    )


def sniff(head: bytes) -> bool:
    return (
        head.lstrip()[:1] in (b"{", b"[")
        and b'"traceID"' in head
        and (b'"operationName"' in head or b'"processes"' in head)
    )


def read(path: Path, sink: RequestSink, **_options) -> None:
    """Stream a Jaeger JSON file into `sink`, one trace at a time."""
    path = Path(path)
    prefix = _json.find_array(path, ("data",))
    if prefix is not None:
        for where, trace in _json.stream_items(path, prefix, sink, "Jaeger JSON"):
            read_trace(trace, where, sink)
        return
    first = _json.head(path).lstrip()[:1]
    if first == b"[":
        for where, trace in _json.stream_items(path, "", sink, "Jaeger JSON"):
            read_trace(trace, where, sink)
        return
    if first == b"{" and _json.find_array(path, ("spans",)) == "spans":  # one trace object: small by nature
        read_trace(_json.load_document(path, "Jaeger JSON"), f"{path}:$", sink)
        return
    raise FormatError(
        f'{path}: not Jaeger JSON: expected {{"data": [traces]}}, a list of traces, or one trace '
        f"object with traceID, spans and processes"
    )


FORMAT = register_format(Format(NAME, "Jaeger JSON (UI download, query API)", sniff, read))
