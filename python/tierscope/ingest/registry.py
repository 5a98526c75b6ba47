"""The import formats tierscope knows, by name; users add their own with `register_format`.

A format is three things: a name (what `--format` takes), `sniff(head)` telling whether the first
bytes of a file look like it, and `read(path, sink, **options)` streaming the file's requests into a
`RequestSink` (raising `FormatError` when the file is not that format at all). Formats installed
by other packages are found through the ``tierscope.importers`` entry-point group: each entry
point names a `Format` object.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from tierscope.ingest.result import RequestSink


@dataclass(frozen=True)
class Format:
    """One import format."""

    name: str
    description: str
    sniff: Callable[[bytes], bool]  # the first 64 KiB of the file
    read: Callable[..., None]  # read(path: Path, sink: RequestSink, **options)


_FORMATS: dict[str, Format] = {}
_loaded_plugins = False


def register_format(fmt: Format) -> Format:
    """Add (or replace) a format. Detection tries formats in registration order."""
    _FORMATS[fmt.name] = fmt
    return fmt


def formats() -> dict[str, Format]:
    """All known formats: the built-in ones, then those from ``tierscope.importers`` entry points."""
    global _loaded_plugins
    if not _loaded_plugins:
        _loaded_plugins = True
        # late: each format's module imports register_format from this one (a cycle)
        from tierscope.ingest import accesslog, jaeger, otlp, parquet, zipkin  # noqa: F401 (register)

        for entry in metadata.entry_points(group="tierscope.importers"):
            fmt = entry.load()
            if isinstance(fmt, Format):
                register_format(fmt)
    return dict(_FORMATS)


def read_with(fmt: Format, path: Path, sink: RequestSink, **options) -> None:
    fmt.read(path, sink, **options)
