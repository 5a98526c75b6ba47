"""The server map file read by `tierscope-engine trace --server-map`.

One server per line: `address:port tier server [protocol]`, `*` for any address, `#` comments.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PROTOCOLS = ("http", "postgres", "mysql")


@dataclass(frozen=True)
class ServerEntry:
    """One server: where it listens, its tier and name, and optionally its protocol."""

    address: str  # IP address or "*"
    port: int
    tier: str
    server: str
    protocol: str | None = None

    def line(self) -> str:
        if not 0 < self.port < 65536:
            raise ValueError(f"server {self.server}: port {self.port} is not in 1-65535")
        if self.protocol is not None and self.protocol not in PROTOCOLS:
            raise ValueError(f"server {self.server}: protocol {self.protocol!r} is not one of {PROTOCOLS}")
        for name, v in (("tier", self.tier), ("server", self.server)):
            if not v or any(c.isspace() for c in v) or "#" in v:
                raise ValueError(f"server map: {name} {v!r} must be one word without '#'")
        addr = f"[{self.address}]" if ":" in self.address else self.address
        parts = [f"{addr}:{self.port}", self.tier, self.server]
        if self.protocol:
            parts.append(self.protocol)
        return " ".join(parts)


def write_server_map(entries: list[ServerEntry], path: str | Path) -> Path:
    """Write `entries` as a server map file and return its path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "# address:port tier server [protocol] (written by tierscope)\n"
    text += "".join(e.line() + "\n" for e in entries)
    path.write_text(text)
    return path
