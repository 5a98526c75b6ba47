"""Which format a file is in: the first 64 KiB are shown to every known format's `sniff`."""

from __future__ import annotations

from pathlib import Path

from tierscope.ingest import _json
from tierscope.ingest.registry import formats
from tierscope.ingest.result import FormatError

#: Detection order: the cheap, unambiguous signatures first.
_ORDER = ("parquet", "otlp", "jaeger", "zipkin", "nginx", "apache")


def detect(path: str | Path) -> str:
    """The name of the format of `path`; FormatError naming the known formats when none fits."""
    path = Path(path)
    if path.is_dir():
        raise FormatError(
            f"{path}: is a directory; give trace or log files (a run directory goes to `tierscope report {path}`)"
        )
    if not path.is_file():
        raise FormatError(f"{path}: no such file")
    head = _json.head(path)
    known = formats()
    names = [n for n in _ORDER if n in known] + [n for n in known if n not in _ORDER]
    for name in names:
        try:
            if known[name].sniff(head):
                return name
        except Exception:  # a plugin's sniff must not stop detection
            continue
    first = head.decode("utf-8", "replace").lstrip().splitlines()[:1]
    shown = (first[0][:80] + "…") if first and len(first[0]) > 80 else (first[0] if first else "(empty file)")
    raise FormatError(
        f"{path}: format not recognised (starts with {shown!r}); known formats: "
        f"{', '.join(names)}; pass --format to choose one"
    )
