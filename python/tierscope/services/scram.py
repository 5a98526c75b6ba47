"""SCRAM-SHA-256 (RFC 5802 / 7677) as PostgreSQL stores it: the verifier of the lab's password that
`tierscope.services.postgres` sets on the lab's role (`ALTER ROLE ... PASSWORD '<verifier>'`), so
the server never sees the password in clear. The exchange itself (the middleware logging in to its
backends and asking its clients) is the Rust middleware's, `engine/src/middleware/scram.rs`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

MECHANISM = "SCRAM-SHA-256"
ITERATIONS = 4096  # PostgreSQL's scram_iterations default


def _hmac(key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hashlib.sha256).digest()


def salted_password(password: str, salt: bytes, iterations: int) -> bytes:
    """Hi(password, salt, i) = PBKDF2-HMAC-SHA-256 (PostgreSQL applies no SASLprep to ASCII)."""
    return hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)


class ScramVerifier:
    """What a server keeps of a password: salt, iterations, stored key and the salted password's
    server key (computed once; PBKDF2's 4096 rounds are not paid per connection)."""

    def __init__(self, password: str, salt: bytes | None = None, iterations: int = ITERATIONS):
        self.salt = salt or secrets.token_bytes(16)
        self.iterations = iterations
        salted = salted_password(password, self.salt, iterations)
        self.stored_key = hashlib.sha256(_hmac(salted, b"Client Key")).digest()
        self.server_key = _hmac(salted, b"Server Key")

    def accepts(self, auth_message: bytes, proof: bytes) -> bool:
        """Whether a client's proof over `auth_message` shows it knows the password (RFC 5802 §3:
        ClientKey = proof XOR HMAC(StoredKey, AuthMessage), and H(ClientKey) must be StoredKey)."""
        client_key = bytes(x ^ y for x, y in zip(proof, _hmac(self.stored_key, auth_message), strict=False))
        return len(proof) == 32 and hmac.compare_digest(hashlib.sha256(client_key).digest(), self.stored_key)

    def server_signature(self, auth_message: bytes) -> bytes:
        """The server's proof that it knows the password too (the `v=` of server-final-message)."""
        return _hmac(self.server_key, auth_message)

    def postgres_secret(self) -> str:
        """The verifier as pg_authid stores it (`ALTER ROLE ... PASSWORD '<this>'` sets the password
        without the server ever seeing it in clear, nor logging it)."""
        b64 = base64.b64encode
        return (
            f"SCRAM-SHA-256${self.iterations}:{b64(self.salt).decode()}$"
            f"{b64(self.stored_key).decode()}:{b64(self.server_key).decode()}"
        )
