"""Importers: traces and logs of any N-tier system into tierscope's `requests` table.

>>> from tierscope.ingest import load
>>> result = load(["spans.json", "access.log"])          # formats detected per file
>>> result.requests.num_rows, result.skipped, result.skipped_at

Formats (docs/importers.md): OTLP JSON, Jaeger JSON, Zipkin v2 JSON, nginx and Apache access logs
with request timing, tierscope Parquet (`requests`, `client_requests`). Add a format with
`register_format(Format(...))` or a ``tierscope.importers`` entry point.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tierscope.ingest.callees import own_times_for_calls
from tierscope.ingest.detect import detect
from tierscope.ingest.registry import Format, formats, register_format
from tierscope.ingest.result import FormatError, ImportResult, RequestSink

__all__ = [
    "Format",
    "FormatError",
    "ImportResult",
    "RequestSink",
    "detect",
    "formats",
    "load",
    "load_file",
    "register_format",
]


def load_file(path: str | Path, format: str | None = None, **options) -> ImportResult:
    """Read one file into a `requests` table; `format` overrides detection. Options go to the reader
    (access logs: `log_format`, `tier`, `server`)."""
    path = Path(path)
    known = formats()
    name = format or detect(path)
    if name not in known:
        raise FormatError(f"unknown format {name!r}; known formats: {', '.join(known)}")
    if not path.is_file():
        raise FormatError(f"{path}: {'is a directory' if path.is_dir() else 'no such file'}")
    fmt = known[name]
    sink = RequestSink(source=name)
    fmt.read(path, sink, **options)
    return sink.finish(str(path), name)


def load(paths: Iterable[str | Path], format: str | None = None, **options) -> ImportResult:
    """Read several files (each detected on its own unless `format` is given) into one result."""
    result: ImportResult | None = None
    for path in paths:
        part = load_file(path, format, **options)
        result = part if result is None else result.merge(part)
    if result is None:
        raise FormatError("no input files")
    requests, replaced = own_times_for_calls(result.requests)
    note = replaced.note()
    if note:
        result.requests = requests
        result.notes.append(note)
    return result
