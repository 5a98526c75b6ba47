"""Streaming helpers shared by the JSON importers (OTLP, Jaeger, Zipkin).

Two layouts are read without loading a whole document: NDJSON (one JSON value per line, as the
OpenTelemetry file exporter and the collector's file exporter write) line by line, and one large
JSON document item by item with ijson (only the array elements under the wanted key are built).

Every byte goes through `Scanner` before a parser sees it, which keeps two promises whatever the
file holds (a corrupt or hostile file included):

- nesting is bounded: a value nested deeper than `MAX_DEPTH` levels is a `JSONLimitError` naming
  the file, line and byte (unbounded nesting made ijson build a prefix string per level, O(depth²)
  time and memory, and `json.loads` raise RecursionError);
- string scanning is linear: the chunks of a string that spans chunks are held back and handed
  to the parser at once when the string ends (yajl, ijson's C backend, re-reads a token it holds
  from its start at every chunk, so a 200 MB string fed in 64 KiB pieces cost O(n²)); a string
  longer than `MAX_STRING` bytes (unterminated, most likely) is a `JSONLimitError`, and a string
  still open at the end of the file is named in the syntax error.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ijson
import numpy as np

from tierscope.ingest.result import FormatError, RequestSink

HEAD_BYTES = 65_536
#: Deepest nesting of arrays and objects read (OTLP spans need about 10; an attribute value made of
#: nested kvlists a few more per level).
MAX_DEPTH = 256
#: Longest string read, in bytes (with its escapes).
MAX_STRING = 64 * 2**20
#: Bytes read from the file at a time.
CHUNK = 64 * 1024


class JSONLimitError(FormatError):
    """The file goes past a bound the JSON readers keep (nesting depth, string length)."""


class Scanner:
    """The lexical state of a JSON text fed in chunks: inside a string or not, and the nesting depth.

    Linear in the input and vectorised (NumPy over each chunk: the quotes that are not escaped
    toggle the string state, the brackets outside strings step the depth), with a Python step only
    per quote that follows a backslash. `feed` raises `JSONLimitError` naming the file, line and
    byte past `MAX_DEPTH` or `MAX_STRING`.
    """

    def __init__(self, name: str | Path, max_depth: int | None = None, max_string: int | None = None):
        self.name = str(name)
        self.max_depth = MAX_DEPTH if max_depth is None else max_depth
        self.max_string = MAX_STRING if max_string is None else max_string
        self.depth = 0
        self.in_string = False
        self.offset = 0  # bytes fed before the current chunk
        self.lines = 0  # newlines fed before the current chunk
        self.backslashes = 0  # backslashes ending the input so far
        self.string_at = (0, 0)  # (line, byte) where the open string starts

    def where(self, line: int, byte: int) -> str:
        return f"{self.name}: line {line}, byte offset {byte}"

    def _line(self, chunk: bytes, pos: int) -> int:
        return self.lines + chunk.count(b"\n", 0, pos) + 1

    def feed(self, chunk: bytes) -> None:
        n = len(chunk)
        if not n:
            return
        a = np.frombuffer(chunk, np.uint8)
        quotes = np.flatnonzero(a == 0x22)
        if quotes.size:
            # A quote after an odd run of backslashes is escaped (inside a string; outside, a
            # backslash is a syntax error the parser reports).
            after = quotes[quotes > 0]
            maybe = after[a[after - 1] == 0x5C]
            escaped = [q for q in maybe.tolist() if self._run(chunk, q) % 2]
            if quotes[0] == 0 and self.backslashes % 2:
                escaped.append(0)
            if escaped:
                quotes = np.setdiff1d(quotes, np.array(escaped, dtype=quotes.dtype), assume_unique=True)
        folded = a | 0x20  # "[" -> "{" and "]" -> "}", no other byte lands on either
        brackets = np.flatnonzero((folded == 0x7B) | (folded == 0x7D))
        if brackets.size:
            inside = (np.searchsorted(quotes, brackets) + self.in_string) & 1
            brackets = brackets[inside == 0]
        if brackets.size:
            steps = np.where(folded[brackets] == 0x7B, 1, -1)
            depths = np.cumsum(steps) + self.depth
            depths -= np.minimum(np.minimum.accumulate(depths), 0)  # never below 0 (a stray closer)
            if int(depths.max()) > self.max_depth:
                pos = int(brackets[int(np.argmax(depths > self.max_depth))])
                raise JSONLimitError(
                    f"{self.where(self._line(chunk, pos), self.offset + pos)}: JSON nested deeper than "
                    f"{self.max_depth} levels (arrays and objects); tierscope reads at most {self.max_depth}: "
                    "corrupt, or not a trace"
                )
            self.depth = int(depths[-1])
        if quotes.size % 2:
            self.in_string = not self.in_string
            if self.in_string:
                last = int(quotes[-1])
                self.string_at = (self._line(chunk, last), self.offset + last)
        tail = n - len(chunk.rstrip(b"\\"))
        self.backslashes = self.backslashes + n if tail == n else tail
        self.offset += n
        self.lines += chunk.count(b"\n")
        if self.in_string and self.offset - self.string_at[1] > self.max_string:
            line, byte = self.string_at
            raise JSONLimitError(
                f"{self.where(line, byte)}: a string longer than {self.max_string:,} bytes (no closing quote by "
                f"byte {self.offset:,}): unterminated or corrupt; tierscope reads strings of at most "
                f"{self.max_string // 2**20} MiB"
            )

    def _run(self, chunk: bytes, q: int) -> int:
        """How many backslashes come right before chunk[q] (with those ending earlier chunks)."""
        k = q
        while k > 0 and chunk[k - 1] == 0x5C:
            k -= 1
        return q - k + (self.backslashes if k == 0 else 0)

    def unterminated(self) -> str | None:
        """At the end of the input: the string left open, if any, as words for an error."""
        if not self.in_string:
            return None
        line, byte = self.string_at
        return (
            f"a string opened at line {line}, byte offset {byte} is not closed by the end of the file "
            f"({self.offset - byte:,} bytes later)"
        )


def check_value(raw: bytes, name: str | Path, offset: int = 0, line: int = 1) -> None:
    """Raise JSONLimitError when one JSON text held in memory (an NDJSON line, starting at byte
    `offset` and line `line` of file `name`) nests deeper than `MAX_DEPTH` (what `json.loads` would
    meet as a RecursionError, or build for later code to choke on)."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:
        return
    scan = Scanner(name)
    scan.offset, scan.lines = offset, line - 1
    scan.feed(raw)


class GuardedReader:
    """A binary file for ijson (``ijson.parse(reader, buf_size=reader.buf_size)``) whose bytes are
    checked by `Scanner` before the parser sees them.

    `read` hands out the file in `CHUNK` pieces, except that a chunk ending inside a string is held
    back and handed out with the chunks up to the string's end, so the parser reads each string
    once (linear time; ijson asks for up to `buf_size` bytes, enough for any string `Scanner`
    lets through). Counts what it handed out: `pieces`, `bytes`, `largest` (one piece), and
    `open_ends` (pieces ending inside a string: 0, but for a string left open at the end).
    """

    def __init__(self, f, name: str | Path):
        self.f = f
        self.scan = Scanner(name)
        self.buf_size = self.scan.max_string + 2 * CHUNK
        self.eof = False
        self.pieces = self.bytes = self.largest = self.open_ends = 0

    def read(self, n: int = -1) -> bytes:
        if n == 0 or self.eof:
            return b""
        held: list[bytes] = []
        while True:
            chunk = self.f.read(CHUNK)
            if not chunk:
                self.eof = True
                break
            self.scan.feed(chunk)
            held.append(chunk)
            if not self.scan.in_string:
                break
        data = held[0] if len(held) == 1 else b"".join(held)
        if data:
            self.pieces += 1
            self.bytes += len(data)
            self.largest = max(self.largest, len(data))
            self.open_ends += self.scan.in_string
        return data

    def syntax_error(self, err: Exception) -> Exception:
        """`err` (an ijson syntax error) naming the string left open, when the file ended inside one."""
        why = self.scan.unterminated() if self.eof else None
        if why is None:
            return err
        return type(err)(why)


@contextmanager
def guarded(path: Path) -> Iterator[GuardedReader]:
    """The file at `path` as a `GuardedReader` (see the module docstring)."""
    with open(path, "rb") as f:
        yield GuardedReader(f, path)


def parse_events(path: Path, **config) -> Generator[tuple[str, str, Any], None, None]:
    """``ijson.parse`` events of the file at `path`, every byte checked by `Scanner`: a bound crossed
    is a `JSONLimitError` (after the events before it); a syntax error an ``ijson.JSONError`` that
    names a string left open at the end of the file."""
    with guarded(path) as reader:
        try:
            yield from ijson.parse(reader, buf_size=reader.buf_size, **config)
        except ijson.JSONError as err:
            raise reader.syntax_error(err) from None


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
        check_value(raw, path, f.tell() - len(raw))
        try:
            return json.loads(raw)
        except ValueError:
            return None


def ndjson_values(path: Path, sink: RequestSink) -> Iterator[tuple[str, Any]]:
    """(location, value) per non-empty line; a line that is not JSON is skipped and counted."""
    offset = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            start, offset = offset, offset + len(raw)
            if not raw.strip():
                continue
            try:
                check_value(raw, path, start, lineno)
            except JSONLimitError as err:
                sink.skip(f"{path}:{lineno}", str(err).removeprefix(f"{path}: "))
                continue
            try:
                value = json.loads(raw)
            except ValueError as err:
                sink.skip(f"{path}:{lineno}", f"not JSON ({err.__class__.__name__}: {str(err)[:60]})")
                continue
            yield f"{path}:{lineno}", value


def find_array(path: Path, keys: tuple[str, ...], max_events: int = 10_000) -> str | None:
    """The ijson prefix of the first array stored under one of `keys` (at any depth), or None."""
    events = parse_events(path)
    try:
        for n, (prefix, event, _value) in enumerate(events):
            if event == "start_array" and prefix.rsplit(".", 1)[-1] in keys:
                return prefix
            if n > max_events:
                return None
    except ijson.JSONError:
        return None
    finally:
        events.close()
    return None


def stream_items(path: Path, prefix: str, sink: RequestSink, fmt: str) -> Iterator[tuple[str, Any]]:
    """(JSON path, element) for each element of the array at `prefix`, one at a time.

    A syntax error part way (a truncated file) ends the stream: what was read is kept, and the
    rest is counted as one skipped record at the element where reading stopped.
    """
    jpath = "$." + prefix if prefix else "$"
    i = -1
    with guarded(path) as f:
        try:
            items = ijson.items(f, (prefix + ".item") if prefix else "item", buf_size=f.buf_size, use_float=True)
            for i, item in enumerate(items):
                yield f"{path}:{jpath}[{i}]", item
        except ijson.JSONError as err:
            err = f.syntax_error(err)
            if i < 0:
                raise FormatError(f"{path}: not {fmt}: JSON syntax error before the first element ({err})") from None
            sink.skip(f"{path}:{jpath}[{i + 1}]", f"JSON syntax error, rest of file unread ({err})")


def load_document(path: Path, fmt: str) -> Any:
    """The whole JSON document at `path` (a small one), its nesting and strings bounded as when
    streaming; not JSON is a FormatError naming the file and the format expected."""
    with guarded(path) as f:
        data = b"".join(iter(lambda: f.read(f.buf_size), b""))
    try:
        return json.loads(data)
    except ValueError as err:
        raise FormatError(f"{path}: not {fmt}: {err}") from None


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
