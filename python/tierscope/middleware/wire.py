"""PostgreSQL v3 wire-protocol framing: what a proxy needs to read and write (pure functions).

A message is a type byte, a 4-byte big-endian length (counting itself, not the type) and a body.
The startup packet has no type byte. Strings are NUL-terminated UTF-8.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

PROTOCOL_V3 = 196608  # 3.0
SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102
MAX_MESSAGE = 1 << 30

# frontend message types
QUERY, PARSE, BIND, DESCRIBE, EXECUTE, CLOSE, SYNC, FLUSH, TERMINATE = (
    b"Q",
    b"P",
    b"B",
    b"D",
    b"E",
    b"C",
    b"S",
    b"H",
    b"X",
)
EXTENDED = frozenset((PARSE, BIND, DESCRIBE, EXECUTE, CLOSE, SYNC, FLUSH))

# backend message types
(
    AUTH,
    PARAMETER_STATUS,
    BACKEND_KEY,
    READY,
    ERROR,
    NOTICE,
    NOTIFICATION,
    PARSE_COMPLETE,
    BIND_COMPLETE,
    CLOSE_COMPLETE,
    COMMAND_COMPLETE,
    DATA_ROW,
    ROW_DESCRIPTION,
    NO_DATA,
    PARAMETER_DESCRIPTION,
    EMPTY_QUERY,
    PORTAL_SUSPENDED,
) = (b"R", b"S", b"K", b"Z", b"E", b"N", b"A", b"1", b"2", b"3", b"C", b"D", b"T", b"n", b"t", b"I", b"s")
ASYNC = frozenset((NOTICE, PARAMETER_STATUS, NOTIFICATION))


class ProtocolError(Exception):
    """The peer sent something this proxy does not understand or support."""


class Message(NamedTuple):
    kind: bytes
    body: bytes

    def encode(self) -> bytes:
        return frame(self.kind, self.body)


def frame(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!I", len(body) + 4) + body


_LENGTH = struct.Struct("!I")


def header_length(header: bytes, pos: int = 0) -> int:
    """The body length announced by the 5-byte message header at `pos`."""
    n = _LENGTH.unpack_from(header, pos + 1)[0]
    if n < 4 or n > MAX_MESSAGE:
        raise ProtocolError(f"bad message length {n} for type {header[pos : pos + 1]!r}")
    return n - 4


def split(buf: bytes) -> tuple[list[Message], bytes]:
    """The complete messages at the start of `buf` and the incomplete rest."""
    out, pos = [], 0
    while len(buf) - pos >= 5:
        n = header_length(buf, pos)
        if len(buf) - pos - 5 < n:
            break
        out.append(Message(buf[pos : pos + 1], bytes(buf[pos + 5 : pos + 5 + n])))
        pos += 5 + n
    return out, bytes(buf[pos:])


def cstring(body: bytes, pos: int = 0) -> tuple[str, int]:
    """The NUL-terminated string at `pos` and the position after its NUL."""
    end = body.find(b"\0", pos)
    if end < 0:
        raise ProtocolError("unterminated string")
    return body[pos:end].decode("utf-8", "replace"), end + 1


def cstr(s: str) -> bytes:
    return s.encode() + b"\0"


# --- startup -------------------------------------------------------------------------------------


def parse_startup(body: bytes) -> tuple[int, dict[str, str]]:
    """The protocol code and parameters of a startup packet body (after its length)."""
    if len(body) < 4:
        raise ProtocolError("startup packet too short")
    code = struct.unpack("!I", body[:4])[0]
    params: dict[str, str] = {}
    if code == PROTOCOL_V3:
        pos = 4
        while pos < len(body) and body[pos : pos + 1] != b"\0":
            key, pos = cstring(body, pos)
            value, pos = cstring(body, pos)
            params[key] = value
    return code, params


def startup_message(params: dict[str, str]) -> bytes:
    body = struct.pack("!I", PROTOCOL_V3) + b"".join(cstr(k) + cstr(v) for k, v in params.items()) + b"\0"
    return struct.pack("!I", len(body) + 4) + body


# --- frontend messages ---------------------------------------------------------------------------


def query(sql: str) -> bytes:
    return frame(QUERY, cstr(sql))


def query_text(body: bytes) -> str:
    return cstring(body)[0]


class Parse(NamedTuple):
    name: str
    sql: str
    types: bytes  # the parameter type count and OIDs, kept as sent

    @classmethod
    def decode(cls, body: bytes) -> Parse:
        name, pos = cstring(body)
        sql, pos = cstring(body, pos)
        return cls(name, sql, body[pos:])

    def encode(self) -> bytes:
        return frame(PARSE, cstr(self.name) + cstr(self.sql) + self.types)


class Bind(NamedTuple):
    portal: str
    statement: str
    rest: bytes  # formats, parameter values, result formats, kept as sent

    @classmethod
    def decode(cls, body: bytes) -> Bind:
        portal, pos = cstring(body)
        statement, pos = cstring(body, pos)
        return cls(portal, statement, body[pos:])

    def encode(self) -> bytes:
        return frame(BIND, cstr(self.portal) + cstr(self.statement) + self.rest)


class Target(NamedTuple):
    """The body of Describe and Close: 'S' (statement) or 'P' (portal) and a name."""

    what: str
    name: str

    @classmethod
    def decode(cls, body: bytes) -> Target:
        if not body or body[:1] not in (b"S", b"P"):
            raise ProtocolError(f"Describe/Close: expected 'S' or 'P', got {body[:1]!r}")
        return cls(body[:1].decode(), cstring(body, 1)[0])

    def encode(self, kind: bytes) -> bytes:
        return frame(kind, self.what.encode() + cstr(self.name))


# --- backend messages ----------------------------------------------------------------------------


def auth_request(body: bytes) -> int:
    return struct.unpack("!I", body[:4])[0]


def auth_ok() -> bytes:
    return frame(AUTH, struct.pack("!I", 0))


#: AuthenticationRequest codes of the password methods (SASL's are in `tierscope.middleware.scram`)
AUTH_CLEARTEXT, AUTH_MD5 = 3, 5
#: the frontend's PasswordMessage / SASLInitialResponse / SASLResponse type
PASSWORD = b"p"


def auth_sasl(mechanisms: list[str]) -> bytes:
    """AuthenticationSASL: the SASL mechanisms the server offers."""
    return frame(AUTH, struct.pack("!I", 10) + b"".join(cstr(m) for m in mechanisms) + b"\0")


def auth_sasl_step(code: int, data: bytes) -> bytes:
    """AuthenticationSASLContinue (11) or AuthenticationSASLFinal (12) carrying `data`."""
    return frame(AUTH, struct.pack("!I", code) + data)


def sasl_mechanisms(body: bytes) -> list[str]:
    """The mechanisms of an AuthenticationSASL body (after its code)."""
    return [m.decode("utf-8", "replace") for m in body[4:].split(b"\0") if m]


def sasl_initial(mechanism: str, data: bytes) -> bytes:
    """SASLInitialResponse: the chosen mechanism and the client-first-message."""
    return frame(PASSWORD, cstr(mechanism) + struct.pack("!i", len(data)) + data)


def parse_sasl_initial(body: bytes) -> tuple[str, bytes]:
    """(mechanism, client-first-message) of a SASLInitialResponse."""
    mechanism, pos = cstring(body)
    if pos + 4 > len(body):
        raise ProtocolError("SASLInitialResponse too short")
    n = struct.unpack_from("!i", body, pos)[0]
    data = body[pos + 4 :]
    if n != len(data):
        raise ProtocolError("SASLInitialResponse length does not match")
    return mechanism, data


def password_message(data: bytes) -> bytes:
    """PasswordMessage / SASLResponse carrying `data` as is."""
    return frame(PASSWORD, data)


def md5_password(user: str, password: str, salt: bytes) -> bytes:
    """The md5 method's answer: "md5" + md5(md5(password + user) + salt) in hex."""
    import hashlib

    inner = hashlib.md5((password + user).encode()).hexdigest().encode()
    return b"md5" + hashlib.md5(inner + salt).hexdigest().encode()


def parameter_status(name: str, value: str) -> bytes:
    return frame(PARAMETER_STATUS, cstr(name) + cstr(value))


def parse_parameter_status(body: bytes) -> tuple[str, str]:
    name, pos = cstring(body)
    return name, cstring(body, pos)[0]


def backend_key(pid: int, secret: int) -> bytes:
    return frame(BACKEND_KEY, struct.pack("!II", pid, secret))


def ready(status: bytes = b"I") -> bytes:
    return frame(READY, status)


def command_complete(tag: str) -> bytes:
    return frame(COMMAND_COMPLETE, cstr(tag))


def command_tag(body: bytes) -> str:
    return cstring(body)[0]


def error(message: str, code: str = "XX000", severity: str = "ERROR") -> bytes:
    fields = b"S" + cstr(severity) + b"V" + cstr(severity) + b"C" + cstr(code) + b"M" + cstr(message)
    return frame(ERROR, fields + b"\0")


def error_fields(body: bytes) -> dict[str, str]:
    """The fields of an ErrorResponse/NoticeResponse body by their code letter."""
    out, pos = {}, 0
    while pos < len(body) and body[pos : pos + 1] != b"\0":
        code = body[pos : pos + 1].decode()
        value, pos = cstring(body, pos + 1)
        out[code] = value
    return out


def error_text(body: bytes) -> str:
    f = error_fields(body)
    return f"{f.get('S', 'ERROR')} {f.get('C', '')}: {f.get('M', '')}".strip()
