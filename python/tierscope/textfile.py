"""Reading a text file a user wrote (a spec, a simulator spec, an inventory): UTF-8 or an error that
names the file, the line and the column of the first byte that is not."""

from __future__ import annotations

from pathlib import Path


def read_utf8(path: str | Path, what: str = "a text file") -> str:
    """The file's text; ValueError `path: cannot read: ...` or `path:line:column: not UTF-8 (byte
    0x..); <what> is UTF-8 text`."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ValueError(f"{path}: cannot read: {err.strerror or err}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise ValueError(
            f"{path}:{line}:{column}: not UTF-8 (byte 0x{data[err.start]:02x}); {what} is UTF-8 text"
        ) from None
