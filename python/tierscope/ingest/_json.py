"""Streaming helpers shared by the JSON importers (OTLP, Jaeger, Zipkin).

Two layouts are read without loading a whole document: NDJSON (one JSON value per line, as the
OpenTelemetry file exporter and the collector's file exporter write) line by line, and one large
JSON document item by item with ijson (only the array elements under the wanted key are built).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ijson

from tierscope.ingest.result import FormatError, RequestSink

HEAD_BYTES = 65_536


def head(path: Path, n: int = HEAD_BYTES) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)


#: A first line longer than this is not taken for NDJSON: the file is streamed as one document.
NDJSON_LINE_LIMIT = 8 * 2**20


def first_line_object(path: Path) -> dict | list | None:
    """The first non-empty line parsed as JSON when it is a complete JSON value of at most
    `NDJSON_LINE_LIMIT` bytes (so the file is NDJSON), else None (stream it as one document)."""
    with open(path, "rb") as f:
        while True:
            raw = f.readline(NDJSON_LINE_LIMIT)
            if not raw:
                return None
            if raw.strip():
                break
        if len(raw) >= NDJSON_LINE_LIMIT and not raw.endswith(b"\n"):
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return None


def ndjson_values(path: Path, sink: RequestSink) -> Iterator[tuple[str, Any]]:
    """(location, value) per non-empty line; a line that is not JSON is skipped and counted."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                value = json.loads(raw)
            except ValueError as err:
                sink.skip(f"{path}:{lineno}", f"not JSON ({err.__class__.__name__}: {str(err)[:60]})")
                continue
            yield f"{path}:{lineno}", value


def find_array(path: Path, keys: tuple[str, ...], max_events: int = 10_000) -> str | None:
    """The ijson prefix of the first array stored under one of `keys` (at any depth), or None."""
    with open(path, "rb") as f:
        try:
            for n, (prefix, event, _value) in enumerate(ijson.parse(f)):
                if event == "start_array" and prefix.rsplit(".", 1)[-1] in keys:
                    return prefix
                if n > max_events:
                    return None
        except ijson.JSONError:
            return None
    return None


def stream_items(path: Path, prefix: str, sink: RequestSink, fmt: str) -> Iterator[tuple[str, Any]]:
    """(JSON path, element) for each element of the array at `prefix`, one at a time.

    A syntax error part way (a truncated file) ends the stream: what was read is kept, and the
    rest is counted as one skipped record at the element where reading stopped.
    """
    jpath = "$." + prefix if prefix else "$"
    i = -1
    with open(path, "rb") as f:
        try:
            for i, item in enumerate(ijson.items(f, (prefix + ".item") if prefix else "item", use_float=True)):
                yield f"{path}:{jpath}[{i}]", item
        except ijson.JSONError as err:
            if i < 0:
                raise FormatError(f"{path}: not {fmt}: JSON syntax error before the first element ({err})") from None
            sink.skip(f"{path}:{jpath}[{i + 1}]", f"JSON syntax error, rest of file unread ({err})")


def as_int(value: Any, what: str) -> int:
    """An integer from a JSON number or a decimal string (OTLP writes 64-bit numbers as strings)."""
    kind = type(value)
    if kind is int:
        return value
    if kind is str:
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"{what} is {value!r}, expected an integer") from None
    if kind is float and value.is_integer():
        return int(value)
    if value is None:
        raise ValueError(f"{what} missing")
    raise ValueError(f"{what} is {value!r}, expected an integer")
