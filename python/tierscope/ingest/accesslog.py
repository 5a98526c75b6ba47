"""Web server access logs with request timing: nginx (`$msec`, `$request_time`) and Apache
(`%{begin:usec}t`, `%D`).

nginx logs the line when the response is done: ``$msec`` is that moment (seconds since the epoch,
millisecond resolution) and ``$request_time`` the time since the first byte of the request was
read, so **arrival = $msec - $request_time** and departure = ``$msec`` (both exact integers of
milliseconds; no floating point). The expected format (docs/importers.md)::

    log_format tierscope '$remote_addr $msec $request_time $upstream_response_time $request_id $status '
                         '$body_bytes_sent $request_length $connection $connection_requests "$request"';

Apache's ``%{begin:usec}t`` is the start of the request in microseconds since the epoch and ``%D`` the
time taken in microseconds, so arrival = begin and departure = begin + %D::

    LogFormat "%{begin:usec}t %D %>s %I %O %a:%{remote}p %{c}L \\"%r\\"" tierscope

Any other layout works when its format string is given (``log_format=`` / ``--log-format``): the
format is compiled to a regular expression, and only ``$msec``+``$request_time`` (or
``%{begin:usec}t``/``%{usec}t``+``%D``) are required. Lines that do not match are skipped and
counted; a file whose first lines match neither format is rejected with one error.

Rows: tier ``web`` (option ``tier``), server = the log file's name without suffix (option
``server``), label = method and path without the query string, request_id = ``$request_id`` /
``%{UNIQUE_ID}e`` when present.
"""

from __future__ import annotations

import re
from pathlib import Path

from tierscope.ingest.registry import Format, register_format
from tierscope.ingest.result import FormatError, RequestSink

#: The format `tierscope.services.nginx` configures (kept equal to it; tested).
NGINX_FORMAT = (
    "$remote_addr $msec $request_time $upstream_response_time $request_id $status "
    '$body_bytes_sent $request_length $connection $connection_requests "$request"'
)
APACHE_FORMAT = '%{begin:usec}t %D %>s %I %O %a:%{remote}p %{c}L "%r"'

_NGINX_VAR = re.compile(r"\$([A-Za-z0-9_]+)")
_APACHE_DIRECTIVE = re.compile(r"%(?:\{([^}]*)\})?[<>]?([a-zA-Z])")
_NGINX_FIELDS = {
    "msec": r"\d+\.\d+",
    "request_time": r"\d+(?:\.\d+)?",
    "status": r"\d{3}",
    "request_length": r"\d+|-",
    "bytes_sent": r"\d+|-",
    "body_bytes_sent": r"\d+|-",
    "connection": r"\d+|-",
    "remote_port": r"\d+|-",
    "connection_requests": r"\d+|-",
    "upstream_response_time": r"(?:[\d.]+|-)(?:(?:, | : )(?:[\d.]+|-))*",
}
#: Apache directive -> our field name.
_APACHE_NAMES = {
    ("begin:usec", "t"): "usec",
    ("usec", "t"): "usec",
    (None, "D"): "duration_us",
    (None, "s"): "status",
    (None, "I"): "request_length",
    (None, "O"): "bytes_sent",
    (None, "b"): "bytes_sent",
    (None, "a"): "remote_addr",
    ("remote", "p"): "remote_port",
    ("c", "L"): "connection",
    (None, "r"): "request",
    ("UNIQUE_ID", "e"): "request_id",
}
_APACHE_FIELDS = {
    "usec": r"\d+",
    "duration_us": r"\d+",
    "status": r"\d{3}",
    "request_length": r"\d+|-",
    "bytes_sent": r"\d+|-",
    "remote_port": r"\d+|-",
}


def _compile(fmt: str, token: re.Pattern, name_of, patterns: dict[str, str]) -> tuple[re.Pattern, list[str]]:
    """A log format string as an anchored regex; returns it and the field name of each group."""
    parts: list[str] = []
    names: list[str] = []
    pos = 0
    for m in token.finditer(fmt):
        literal = fmt[pos : m.start()]
        parts.append(re.escape(literal))
        name = name_of(m)
        quoted = literal.endswith('"')
        pattern = patterns.get(name) or (r'(?:[^"\\]|\\.)*' if quoted else r"\S*")
        parts.append(f"(?P<g{len(names)}>{pattern})")
        names.append(name)
        pos = m.end()
    parts.append(re.escape(fmt[pos:]))
    return re.compile("^" + "".join(parts) + r"\s*$"), names


def compile_nginx(fmt: str = NGINX_FORMAT) -> tuple[re.Pattern, list[str]]:
    """An nginx ``log_format`` string compiled to a regex; it must contain $msec and $request_time."""
    regex, names = _compile(fmt, _NGINX_VAR, lambda m: m.group(1), _NGINX_FIELDS)
    if "msec" not in names or "request_time" not in names:
        raise ValueError("an nginx log format for tierscope needs $msec and $request_time")
    return regex, names


def compile_apache(fmt: str = APACHE_FORMAT) -> tuple[re.Pattern, list[str]]:
    """An Apache ``LogFormat`` string compiled to a regex; it must contain %{begin:usec}t and %D."""

    def name_of(m: re.Match) -> str:
        return _APACHE_NAMES.get((m.group(1), m.group(2))) or f"{m.group(1) or ''}{m.group(2)}"

    regex, names = _compile(fmt, _APACHE_DIRECTIVE, name_of, _APACHE_FIELDS)
    if "usec" not in names or "duration_us" not in names:
        raise ValueError("an Apache log format for tierscope needs %{begin:usec}t (or %{usec}t) and %D")
    return regex, names


def _ms(text: str) -> int:
    """Decimal seconds with up to millisecond resolution ("1732280000.123") as integer milliseconds."""
    whole, _, frac = text.partition(".")
    return int(whole) * 1000 + int((frac + "000")[:3])


def _int(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def _label(request: str | None) -> str | None:
    if not request or request == "-":
        return None
    parts = request.split(" ")
    if len(parts) >= 2:
        return f"{parts[0]} {parts[1].split('?', 1)[0]}"
    return request


def _read(
    path: Path,
    sink: RequestSink,
    regex: re.Pattern,
    names: list[str],
    kind: str,
    tier: str | None,
    server: str | None,
    probe_lines: int = 20,
) -> None:
    tier = tier or "web"
    server = server or path.name.split(".", 1)[0]
    matched = 0
    seen = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            seen += 1
            m = regex.match(line.rstrip("\n"))
            if m is None:
                if matched == 0 and seen >= probe_lines:
                    raise FormatError(
                        f"{path}: not an {kind} access log in the expected format: none of the first "
                        f"{probe_lines} lines match (line 1 should look like the log format in "
                        f"docs/importers.md; pass --log-format for another layout)"
                    )
                sink.skip(f"{path}:{lineno}", "line does not match the log format")
                continue
            g = {names[i]: v for i, v in enumerate(m.groups())}
            try:
                if kind == "nginx":
                    departure = _ms(g["msec"]) * 1_000_000
                    arrival = departure - _ms(g["request_time"]) * 1_000_000
                else:
                    arrival = int(g["usec"]) * 1000
                    departure = arrival + int(g["duration_us"]) * 1000
            except ValueError as err:
                sink.skip(f"{path}:{lineno}", f"bad time field ({err})")
                continue
            matched += 1
            addr, port = g.get("remote_addr"), g.get("remote_port")
            rid = g.get("request_id")
            sink.add(
                tier=tier,
                server=server,
                arrival_ns=arrival,
                departure_ns=departure,
                request_id=rid if rid not in (None, "", "-") else None,
                label=_label(g.get("request")),
                status=g.get("status"),
                bytes_in=_int(g.get("request_length")),
                bytes_out=_int(g.get("bytes_sent") or g.get("body_bytes_sent")),
                client=f"{addr}:{port}" if addr and port and port != "-" else addr,
                conn=_int(g.get("connection")),
                recorder=server,
            )
    if matched == 0 and seen > 0:
        raise FormatError(
            f"{path}: not an {kind} access log in the expected format: no line matches "
            f"(see docs/importers.md; pass --log-format for another layout)"
        )


def read_nginx(
    path: Path,
    sink: RequestSink,
    log_format: str | None = None,
    tier: str | None = None,
    server: str | None = None,
    **_options,
) -> None:
    """Stream an nginx access log (format `NGINX_FORMAT` unless `log_format` is given) into `sink`."""
    regex, names = compile_nginx(log_format or NGINX_FORMAT)
    _read(Path(path), sink, regex, names, "nginx", tier, server)


def read_apache(
    path: Path,
    sink: RequestSink,
    log_format: str | None = None,
    tier: str | None = None,
    server: str | None = None,
    **_options,
) -> None:
    """Stream an Apache access log (format `APACHE_FORMAT` unless `log_format` is given) into `sink`."""
    regex, names = compile_apache(log_format or APACHE_FORMAT)
    _read(Path(path), sink, regex, names, "apache", tier, server)


def _first_line(head: bytes) -> str:
    for line in head.decode("utf-8", "replace").splitlines():
        if line.strip():
            return line
    return ""


_NGINX_PREFIX = re.compile(r"^(?:\S+ )?\d{9,11}\.\d{3} \d+\.\d{3} ")
_APACHE_PREFIX = re.compile(r"^\d{15,17} \d+ ")


def sniff_nginx(head: bytes) -> bool:
    return bool(_NGINX_PREFIX.match(_first_line(head)))


def sniff_apache(head: bytes) -> bool:
    return bool(_APACHE_PREFIX.match(_first_line(head)))


NGINX = register_format(Format("nginx", "nginx access log with $msec and $request_time", sniff_nginx, read_nginx))
APACHE = register_format(Format("apache", "Apache access log with %{begin:usec}t and %D", sniff_apache, read_apache))
