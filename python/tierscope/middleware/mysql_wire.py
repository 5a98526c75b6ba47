"""MySQL client/server protocol framing (the subset a proxy of the text protocol needs; pure functions).

A packet is a 3-byte little-endian payload length, a 1-byte sequence id and the payload; a payload
of 2^24-1 bytes or more is split over several packets (the last one shorter). A command starts a
new sequence at 0 and its answer continues it (1, 2, ...). Integers are little-endian; a
"length-encoded" integer is one byte below 0xFB, or 0xFC/0xFD/0xFE and 2/3/8 bytes.

What the middleware uses: the server handshake (protocol 10) and the client's HandshakeResponse41
with mysql_native_password, OK/ERR/EOF packets, and `Response`, which follows the answer to one
COM_QUERY or COM_STMT_EXECUTE (OK, ERR, or result sets of column definitions, EOF, rows in the text
or the binary format, EOF; several with SERVER_MORE_RESULTS_EXISTS) to tell where it ends. Neither side uses CLIENT_DEPRECATE_EOF or
CLIENT_SESSION_TRACK, so the backends' answers pass to the clients byte for byte.
"""

from __future__ import annotations

import hashlib
import struct
from typing import NamedTuple

MAX_PAYLOAD = 0xFFFFFF

# commands
COM_QUIT, COM_INIT_DB, COM_QUERY, COM_FIELD_LIST = 0x01, 0x02, 0x03, 0x04
COM_STATISTICS, COM_PING, COM_CHANGE_USER = 0x09, 0x0E, 0x11
COM_STMT_PREPARE, COM_STMT_EXECUTE, COM_STMT_SEND_LONG_DATA, COM_STMT_CLOSE = 0x16, 0x17, 0x18, 0x19
COM_STMT_RESET, COM_SET_OPTION, COM_STMT_FETCH, COM_RESET_CONNECTION = 0x1A, 0x1B, 0x1C, 0x1F

# capability flags
LONG_PASSWORD = 1
FOUND_ROWS = 1 << 1
LONG_FLAG = 1 << 2
CONNECT_WITH_DB = 1 << 3
LOCAL_FILES = 1 << 7
PROTOCOL_41 = 1 << 9
SSL = 1 << 11
TRANSACTIONS = 1 << 13
SECURE_CONNECTION = 1 << 15
MULTI_STATEMENTS = 1 << 16
MULTI_RESULTS = 1 << 17
PS_MULTI_RESULTS = 1 << 18
PLUGIN_AUTH = 1 << 19
CONNECT_ATTRS = 1 << 20
PLUGIN_AUTH_LENENC = 1 << 21
SESSION_TRACK = 1 << 23
DEPRECATE_EOF = 1 << 24

#: what the middleware asks of its backends: fixed, so every pooled connection answers alike
BACKEND_CAPS = (
    LONG_PASSWORD
    | LONG_FLAG
    | CONNECT_WITH_DB
    | PROTOCOL_41
    | TRANSACTIONS
    | SECURE_CONNECTION
    | MULTI_STATEMENTS
    | MULTI_RESULTS
    | PS_MULTI_RESULTS
    | PLUGIN_AUTH
)
#: what the middleware offers its clients: the backends' set plus what only concerns the login
#: (no SSL, compression, LOCAL INFILE, session tracking or DEPRECATE_EOF)
SERVER_CAPS = BACKEND_CAPS | CONNECT_ATTRS | PLUGIN_AUTH_LENENC

# server status flags
STATUS_IN_TRANS = 0x0001
STATUS_AUTOCOMMIT = 0x0002
STATUS_MORE_RESULTS = 0x0008

UTF8MB4_GENERAL_CI = 45
NATIVE_PASSWORD = "mysql_native_password"

# error codes the middleware sends itself
ER_ACCESS_DENIED = 1045
ER_BAD_DB = 1049
ER_UNKNOWN_COM = 1047
ER_NOT_SUPPORTED_YET = 1235
ER_UNKNOWN_ERROR = 1105


class ProtocolError(Exception):
    """The peer sent something this proxy does not understand or support."""


# --- framing -------------------------------------------------------------------------------------


def packet(seq: int, payload: bytes) -> bytes:
    """`payload` framed as packets from sequence id `seq` (split at 2^24-1 bytes)."""
    if len(payload) < MAX_PAYLOAD:
        return struct.pack("<I", len(payload))[:3] + bytes((seq & 0xFF,)) + payload
    out, pos = [], 0
    while True:
        chunk = payload[pos : pos + MAX_PAYLOAD]
        out.append(struct.pack("<I", len(chunk))[:3] + bytes((seq & 0xFF,)) + chunk)
        seq, pos = seq + 1, pos + len(chunk)
        if len(chunk) < MAX_PAYLOAD:
            return b"".join(out)


def header(buf: bytes, pos: int = 0) -> tuple[int, int]:
    """(payload length, sequence id) of the packet header at `pos`."""
    return buf[pos] | buf[pos + 1] << 8 | buf[pos + 2] << 16, buf[pos + 3]


def lenenc_int(buf: bytes, pos: int) -> tuple[int, int]:
    """The length-encoded integer at `pos` and the position after it."""
    b = buf[pos]
    if b < 0xFB:
        return b, pos + 1
    if b == 0xFC:
        return int.from_bytes(buf[pos + 1 : pos + 3], "little"), pos + 3
    if b == 0xFD:
        return int.from_bytes(buf[pos + 1 : pos + 4], "little"), pos + 4
    if b == 0xFE:
        return int.from_bytes(buf[pos + 1 : pos + 9], "little"), pos + 9
    raise ProtocolError(f"bad length-encoded integer 0x{b:02x}")


def lenenc(n: int) -> bytes:
    if n < 0xFB:
        return bytes((n,))
    if n < 1 << 16:
        return b"\xfc" + n.to_bytes(2, "little")
    if n < 1 << 24:
        return b"\xfd" + n.to_bytes(3, "little")
    return b"\xfe" + n.to_bytes(8, "little")


def cstring(buf: bytes, pos: int) -> tuple[bytes, int]:
    end = buf.find(b"\0", pos)
    if end < 0:
        return buf[pos:], len(buf)
    return buf[pos:end], end + 1


# --- authentication ------------------------------------------------------------------------------


def scramble_native(password: str, salt: bytes) -> bytes:
    """mysql_native_password's answer: SHA1(pw) XOR SHA1(salt + SHA1(SHA1(pw))); empty for no password."""
    if not password:
        return b""
    h1 = hashlib.sha1(password.encode()).digest()
    h2 = hashlib.sha1(h1).digest()
    h3 = hashlib.sha1(salt[:20] + h2).digest()
    return bytes(a ^ b for a, b in zip(h1, h3))


class Handshake(NamedTuple):
    version: str
    connection_id: int
    salt: bytes
    caps: int
    charset: int
    status: int
    plugin: str


def handshake_v10(connection_id: int, salt: bytes, version: str, status: int = STATUS_AUTOCOMMIT) -> bytes:
    """The server's greeting (payload) offering SERVER_CAPS and mysql_native_password with a 20-byte salt."""
    caps = SERVER_CAPS
    return (
        b"\x0a"
        + version.encode()
        + b"\0"
        + struct.pack("<I", connection_id & 0xFFFFFFFF)
        + salt[:8]
        + b"\0"
        + struct.pack("<H", caps & 0xFFFF)
        + bytes((UTF8MB4_GENERAL_CI,))
        + struct.pack("<H", status)
        + struct.pack("<H", caps >> 16)
        + bytes((21,))
        + b"\0" * 10
        + salt[8:20]
        + b"\0"
        + NATIVE_PASSWORD.encode()
        + b"\0"
    )


def parse_handshake(payload: bytes) -> Handshake:
    if not payload or payload[0] != 10:
        raise ProtocolError(f"expected a protocol 10 handshake, got first byte {payload[:1]!r}")
    version, pos = cstring(payload, 1)
    conn_id = struct.unpack_from("<I", payload, pos)[0]
    salt = payload[pos + 4 : pos + 12]
    pos += 13
    caps = struct.unpack_from("<H", payload, pos)[0]
    pos += 2
    charset, status, status_pos = 0, 0, pos
    if len(payload) > pos:
        charset = payload[pos]
        status = struct.unpack_from("<H", payload, pos + 1)[0]
        caps |= struct.unpack_from("<H", payload, pos + 3)[0] << 16
        auth_len = payload[pos + 5]
        pos = status_pos + 6 + 10
        if caps & SECURE_CONNECTION:
            n = max(13, auth_len - 8)
            salt += payload[pos : pos + n].rstrip(b"\0")
            pos += n
    plugin = cstring(payload, pos)[0].decode() if caps & PLUGIN_AUTH and pos < len(payload) else ""
    return Handshake(version.decode("utf-8", "replace"), conn_id, salt[:20], caps, charset, status, plugin)


class Login(NamedTuple):
    caps: int
    charset: int
    user: str
    auth: bytes
    database: str | None
    plugin: str


def handshake_response(caps: int, user: str, auth: bytes, database: str | None, plugin: str = NATIVE_PASSWORD) -> bytes:
    """The client's HandshakeResponse41 (payload)."""
    if database:
        caps |= CONNECT_WITH_DB
    else:
        caps &= ~CONNECT_WITH_DB
    out = (
        struct.pack("<IIB", caps, MAX_PAYLOAD, UTF8MB4_GENERAL_CI)
        + b"\0" * 23
        + user.encode()
        + b"\0"
        + bytes((len(auth),))
        + auth
    )
    if database:
        out += database.encode() + b"\0"
    if caps & PLUGIN_AUTH:
        out += plugin.encode() + b"\0"
    return out


def parse_login(payload: bytes) -> Login:
    if len(payload) < 32:
        raise ProtocolError("handshake response too short")
    caps, _, charset = struct.unpack_from("<IIB", payload, 0)
    if not caps & PROTOCOL_41:
        raise ProtocolError("the client does not speak protocol 4.1")
    if caps & SSL and len(payload) == 32:
        raise ProtocolError("the client asks for SSL, which the middleware does not offer")
    user, pos = cstring(payload, 32)
    if caps & PLUGIN_AUTH_LENENC:
        n, pos = lenenc_int(payload, pos)
        auth, pos = payload[pos : pos + n], pos + n
    elif caps & SECURE_CONNECTION:
        n = payload[pos]
        auth, pos = payload[pos + 1 : pos + 1 + n], pos + 1 + n
    else:
        auth, pos = cstring(payload, pos)
    database = None
    if caps & CONNECT_WITH_DB and pos < len(payload):
        db, pos = cstring(payload, pos)
        database = db.decode("utf-8", "replace") or None
    plugin = ""
    if caps & PLUGIN_AUTH and pos < len(payload):
        plugin = cstring(payload, pos)[0].decode("utf-8", "replace")
    return Login(caps, charset, user.decode("utf-8", "replace"), bytes(auth), database, plugin)


def auth_switch(plugin: str, salt: bytes) -> bytes:
    return b"\xfe" + plugin.encode() + b"\0" + salt[:20] + b"\0"


# --- OK, ERR, EOF --------------------------------------------------------------------------------


def ok(affected: int = 0, insert_id: int = 0, status: int = STATUS_AUTOCOMMIT, warnings: int = 0) -> bytes:
    return b"\x00" + lenenc(affected) + lenenc(insert_id) + struct.pack("<HH", status, warnings)


def err(code: int, message: str, state: str = "HY000") -> bytes:
    return b"\xff" + struct.pack("<H", code) + b"#" + state.encode()[:5].ljust(5, b"0") + message.encode()


def eof(status: int = STATUS_AUTOCOMMIT, warnings: int = 0) -> bytes:
    return b"\xfe" + struct.pack("<HH", warnings, status)


def lenenc_str(b: bytes) -> bytes:
    return lenenc(len(b)) + b


def text_result(column: str, values: list[str], status: int = STATUS_AUTOCOMMIT) -> bytes:
    """A whole text-protocol answer (packets from sequence id 1): one VARCHAR column, one row per value."""
    coldef = (
        lenenc_str(b"def")
        + lenenc_str(b"") * 3
        + lenenc_str(column.encode())
        + lenenc_str(b"")
        + b"\x0c"
        + struct.pack("<HIBHB", UTF8MB4_GENERAL_CI, 1024, 0xFD, 0, 0)
        + b"\0\0"
    )
    payloads = [lenenc(1), coldef, eof(status)] + [lenenc_str(v.encode()) for v in values] + [eof(status)]
    return b"".join(packet(i + 1, p) for i, p in enumerate(payloads))


def parse_ok(payload: bytes) -> tuple[int, int, int]:
    """(affected rows, last insert id, status flags) of an OK packet."""
    affected, pos = lenenc_int(payload, 1)
    insert_id, pos = lenenc_int(payload, pos)
    status = struct.unpack_from("<H", payload, pos)[0] if len(payload) >= pos + 2 else 0
    return affected, insert_id, status


def parse_err(payload: bytes) -> tuple[int, str, str]:
    """(error code, SQLSTATE, message) of an ERR packet."""
    code = struct.unpack_from("<H", payload, 1)[0] if len(payload) >= 3 else 0
    if payload[3:4] == b"#":
        return code, payload[4:9].decode("ascii", "replace"), payload[9:].decode("utf-8", "replace")
    return code, "HY000", payload[3:].decode("utf-8", "replace")


def err_text(payload: bytes) -> str:
    code, state, message = parse_err(payload)
    return f"ERROR {code} ({state}): {message}"


def is_eof(payload_len: int, first: int) -> bool:
    return first == 0xFE and payload_len < 9


# --- following an answer -------------------------------------------------------------------------


class Response:
    """Where the answer to one COM_QUERY ends: feed it the packets (their first payload byte, their
    payload length and the payload) in order until `done`. Notes what the proxy needs: success,
    the first error, one tag per statement ("OK <affected rows>" or "ROWS <n>") and the status flags
    of the last OK/EOF (None when none came)."""

    __slots__ = ("state", "columns", "rows", "done", "ok", "error", "tags", "status", "continued")

    def __init__(self):
        self.state = 0  # 0: first packet of a result; 1: column definitions; 2: their EOF; 3: rows
        self.columns = 0
        self.rows = 0
        self.done = False
        self.ok = True
        self.error: str | None = None
        self.tags: list[str] = []
        self.status: int | None = None
        self.continued = False  # the previous packet was full: this one continues it

    def feed(self, first: int, length: int, payload: bytes) -> None:
        if self.done:
            raise ProtocolError("a packet after the end of the answer")
        if self.continued:
            self.continued = length == MAX_PAYLOAD
            return
        self.continued = length == MAX_PAYLOAD
        st = self.state
        if st == 3:
            if first == 0xFE and length < 9:
                status = struct.unpack_from("<H", payload, 3)[0] if length >= 5 else 0
                self.tags.append(f"ROWS {self.rows}")
                self._end_of_result(status)
            elif first == 0xFF:
                self._error(payload)
            else:
                self.rows += 1
        elif st == 0:
            if first == 0x00 and length >= 7:
                affected, _, status = parse_ok(payload)
                self.tags.append(f"OK {affected}")
                self._end_of_result(status)
            elif first == 0xFF:
                self._error(payload)
            elif first == 0xFB:
                raise ProtocolError("the backend asks for a LOCAL INFILE, which the middleware does not support")
            else:
                self.columns, _ = lenenc_int(payload, 0)
                self.rows = 0
                self.state = 1 if self.columns else 2
        elif st == 1:
            self.columns -= 1
            if self.columns == 0:
                self.state = 2
        elif st == 2:
            if first == 0xFF:
                self._error(payload)
            elif not (first == 0xFE and length < 9):
                raise ProtocolError(f"expected EOF after the column definitions, got 0x{first:02x}")
            else:
                self.state = 3

    def _end_of_result(self, status: int) -> None:
        self.status = status
        self.state = 0
        if not status & STATUS_MORE_RESULTS:
            self.done = True

    def _error(self, payload: bytes) -> None:
        self.ok = False
        self.error = self.error or err_text(payload)
        self.done = True  # an error ends the answer (and any further results)
