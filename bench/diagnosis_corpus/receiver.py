"""A small OTLP/HTTP trace receiver: POST /v1/traces, protobuf or JSON bodies; and a Zipkin one:
POST /api/v2/spans, a JSON list of Zipkin v2 spans (what an SDK's Zipkin JSON exporter sends).

Keeps every ExportTraceServiceRequest it accepts and writes them in the two JSON forms users have:
  * OTLP JSON as the OTLP specification encodes it: hex trace/span ids, enums as integers,
    lowerCamelCase keys, one ExportTraceServiceRequest per line (what the SDK and collector file
    exporters write);
  * protobuf's canonical JSON mapping (google.protobuf.json_format.MessageToJson of
    opentelemetry-proto's message): base64 ids, enum names; all batches merged into one document.
"""

from __future__ import annotations

import base64
import gzip
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

_ID_KEYS = ("traceId", "spanId", "parentSpanId")


def _hex_ids(obj):
    """Turn the base64 ids of protobuf's JSON mapping into OTLP JSON's hex ids, in place."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in _ID_KEYS and isinstance(v, str):
                obj[k] = base64.b64decode(v).hex()
            else:
                _hex_ids(v)
    elif isinstance(obj, list):
        for v in obj:
            _hex_ids(v)
    return obj


def otlp_json_line(msg: ExportTraceServiceRequest) -> str:
    d = json_format.MessageToDict(msg, use_integers_for_enums=True)
    return json.dumps(_hex_ids(d), separators=(",", ":"))


class Receiver:
    """Listens on 127.0.0.1 (a free port); `url` is the traces endpoint to give the SDKs."""

    def __init__(self) -> None:
        self.batches: list[ExportTraceServiceRequest] = []
        self.zipkin: list[dict] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _body(self) -> bytes:
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():  # the JS exporter streams
                    parts = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            break
                        parts.append(self.rfile.read(size))
                        self.rfile.readline()
                    body = b"".join(parts)
                else:
                    body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding", "").lower() == "gzip":
                    body = gzip.decompress(body)
                return body

            def _empty(self, code: int) -> None:
                """A reply with no body."""
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self):
                body = self._body()
                if self.path.rstrip("/") == "/api/v2/spans":
                    try:
                        spans = json.loads(body)
                        if not isinstance(spans, list):
                            raise ValueError("not a list of spans")
                    except ValueError:
                        return self._empty(400)
                    with receiver.lock:
                        receiver.zipkin.extend(spans)
                    return self._empty(202)
                if self.path.rstrip("/") != "/v1/traces":
                    return self._empty(404)
                ctype = self.headers.get("Content-Type", "")
                msg = ExportTraceServiceRequest()
                try:
                    if "json" in ctype:
                        json_format.Parse(body, msg, ignore_unknown_fields=True)
                    else:
                        msg.ParseFromString(body)
                except Exception:
                    return self._empty(400)
                with receiver.lock:
                    receiver.batches.append(msg)
                if "json" in ctype:
                    out, rtype = b"{}", "application/json"
                else:
                    out, rtype = ExportTraceServiceResponse().SerializeToString(), "application/x-protobuf"
                self.send_response(200)
                self.send_header("Content-Type", rtype)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1/traces"
        self.zipkin_url = f"http://127.0.0.1:{self.port}/api/v2/spans"
        self.thread = threading.Thread(target=self.server.serve_forever, name="otlp-receiver", daemon=True)
        self.thread.start()

    def span_count(self) -> int:
        with self.lock:
            return sum(len(ss.spans) for b in self.batches for rs in b.resource_spans for ss in rs.scope_spans)

    def take(self) -> list[ExportTraceServiceRequest]:
        """The OTLP batches received since the last take (the Zipkin spans are dropped with them)."""
        return self.take_both()[0]

    def take_both(self) -> tuple[list[ExportTraceServiceRequest], list[dict]]:
        """The OTLP batches and the Zipkin spans received since the last take."""
        with self.lock:
            out, self.batches = self.batches, []
            zipkin, self.zipkin = self.zipkin, []
        return out, zipkin

    def write(self, batches: list[ExportTraceServiceRequest], hex_path: Path, b64_path: Path) -> int:
        with open(hex_path, "w") as f:
            for b in batches:
                f.write(otlp_json_line(b) + "\n")
        merged = ExportTraceServiceRequest()
        for b in batches:
            merged.resource_spans.extend(b.resource_spans)
        Path(b64_path).write_text(json_format.MessageToJson(merged) + "\n")
        return sum(len(ss.spans) for rs in merged.resource_spans for ss in rs.scope_spans)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
