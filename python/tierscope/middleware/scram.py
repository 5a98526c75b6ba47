"""SCRAM-SHA-256 (RFC 5802 / 7677) as PostgreSQL speaks it, both ends: the middleware logs in to
its backends with it (`ScramClient`) and asks its own clients for it (`ScramServer`), with the
lab's user and password (`tierscope.services.credentials`). No channel binding (the lab's
connections are not TLS): the client's GS2 header is "n,,", PostgreSQL's usual without SSL.

The PostgreSQL messages around it: AuthenticationSASL (R, code 10, the mechanisms), the client's
SASLInitialResponse (p: mechanism, length, client-first-message), AuthenticationSASLContinue (R,
11, server-first-message), SASLResponse (p: client-final-message), AuthenticationSASLFinal (R, 12,
server-final-message), then AuthenticationOk.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

MECHANISM = "SCRAM-SHA-256"
ITERATIONS = 4096  # PostgreSQL's scram_iterations default
#: AuthenticationRequest codes
SASL, SASL_CONTINUE, SASL_FINAL = 10, 11, 12


class ScramError(Exception):
    """A SCRAM exchange that failed: bad message, wrong password, or a server that did not prove itself."""


def _hmac(key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hashlib.sha256).digest()


def _attrs(message: str) -> dict[str, str]:
    out = {}
    for part in message.split(","):
        if len(part) < 2 or part[1] != "=":
            raise ScramError(f"bad SCRAM attribute {part[:20]!r}")
        out[part[0]] = part[2:]
    return out


def salted_password(password: str, salt: bytes, iterations: int) -> bytes:
    """Hi(password, salt, i) = PBKDF2-HMAC-SHA-256 (PostgreSQL applies no SASLprep to ASCII)."""
    return hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)


def _proofs(salted: bytes, auth_message: bytes) -> tuple[bytes, bytes, bytes]:
    """(client key, stored key, server signature) of one exchange."""
    client_key = _hmac(salted, b"Client Key")
    stored_key = hashlib.sha256(client_key).digest()
    server_signature = _hmac(_hmac(salted, b"Server Key"), auth_message)
    return client_key, stored_key, server_signature


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b))


class ScramClient:
    """The client's half: `first()`, then `final(server_first)`, then `verify(server_final)`."""

    def __init__(self, password: str, nonce: str | None = None):
        self.password = password
        self.nonce = nonce or secrets.token_urlsafe(18)
        self.first_bare = f"n=,r={self.nonce}"
        self._server_signature = b""

    def first(self) -> bytes:
        return ("n,," + self.first_bare).encode()

    def final(self, server_first: bytes) -> bytes:
        text = server_first.decode()
        a = _attrs(text)
        if not a.get("r", "").startswith(self.nonce) or "s" not in a or "i" not in a:
            raise ScramError("the server's first SCRAM message does not continue our nonce")
        salted = salted_password(self.password, base64.b64decode(a["s"]), int(a["i"]))
        without_proof = f"c=biws,r={a['r']}"
        auth = f"{self.first_bare},{text},{without_proof}".encode()
        client_key, stored_key, self._server_signature = _proofs(salted, auth)
        proof = _xor(client_key, _hmac(stored_key, auth))
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> None:
        a = _attrs(server_final.decode())
        if "e" in a:
            raise ScramError(f"the server refused: {a['e']}")
        if not hmac.compare_digest(base64.b64decode(a.get("v", "")), self._server_signature):
            raise ScramError("the server's SCRAM signature is wrong (it does not know the password)")


class ScramVerifier:
    """What a server keeps of a password: salt, iterations, stored key and the salted password's
    server key (computed once; PBKDF2's 4096 rounds are not paid per connection)."""

    def __init__(self, password: str, salt: bytes | None = None, iterations: int = ITERATIONS):
        self.salt = salt or secrets.token_bytes(16)
        self.iterations = iterations
        salted = salted_password(password, self.salt, iterations)
        self.stored_key = hashlib.sha256(_hmac(salted, b"Client Key")).digest()
        self.server_key = _hmac(salted, b"Server Key")

    def postgres_secret(self) -> str:
        """The verifier as pg_authid stores it (`ALTER ROLE ... PASSWORD '<this>'` sets the password
        without the server ever seeing it in clear, nor logging it)."""
        b64 = base64.b64encode
        return (
            f"SCRAM-SHA-256${self.iterations}:{b64(self.salt).decode()}$"
            f"{b64(self.stored_key).decode()}:{b64(self.server_key).decode()}"
        )


class ScramServer:
    """The server's half for one client: `first(client_first)` -> server-first-message,
    `final(client_final)` -> server-final-message (ScramError when the proof is wrong)."""

    def __init__(self, verifier: ScramVerifier):
        self.v = verifier
        self.client_first_bare = ""
        self.server_first = ""
        self.nonce = ""

    def first(self, client_first: bytes) -> bytes:
        text = client_first.decode("utf-8", "replace")
        if not text.startswith(("n,", "y,")):  # "p=": channel binding, which we do not offer
            raise ScramError("channel binding is not supported")
        parts = text.split(",", 2)
        if len(parts) != 3:
            raise ScramError("bad client-first-message")
        self.client_first_bare = parts[2]
        nonce = _attrs(self.client_first_bare).get("r", "")
        if not nonce:
            raise ScramError("client-first-message without a nonce")
        self.nonce = nonce + secrets.token_urlsafe(18)
        salt = base64.b64encode(self.v.salt).decode()
        self.server_first = f"r={self.nonce},s={salt},i={self.v.iterations}"
        return self.server_first.encode()

    def final(self, client_final: bytes) -> bytes:
        text = client_final.decode("utf-8", "replace")
        head, sep, proof_b64 = text.rpartition(",p=")
        if not sep:
            raise ScramError("client-final-message without a proof")
        a = _attrs(head)
        if a.get("r") != self.nonce:
            raise ScramError("client-final-message with another nonce")
        auth = f"{self.client_first_bare},{self.server_first},{head}".encode()
        try:
            proof = base64.b64decode(proof_b64, validate=True)
        except ValueError:
            raise ScramError("bad proof") from None
        client_key = _xor(proof, _hmac(self.v.stored_key, auth))
        if len(proof) != 32 or not hmac.compare_digest(hashlib.sha256(client_key).digest(), self.v.stored_key):
            raise ScramError("wrong password")
        return ("v=" + base64.b64encode(_hmac(self.v.server_key, auth)).decode()).encode()
