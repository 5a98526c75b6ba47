"""Run the native tracer (`tierscope-engine trace`) on a capture file."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tierscope.engine import engine_path


class TraceError(RuntimeError):
    """The engine could not trace the capture (not a capture file, unreadable, bad server map)."""


#: The engine's exit status for a capture damaged part way (rows before the damage written).
EXIT_DAMAGED = 3


@dataclass
class TraceResult:
    """What the engine wrote and counted."""

    output: Path
    stats: dict = field(default_factory=dict)
    #: the engine's human summary and warnings (stderr)
    messages: str = ""

    @property
    def rows(self) -> int:
        return int(self.stats.get("exchanges", {}).get("total", 0))

    @property
    def stopped_early(self) -> str | None:
        return self.stats.get("stopped_early")

    @property
    def damaged(self) -> bool:
        """Reading stopped at damage inside the capture (a corrupt record, a read error), not at a
        file merely cut short: `stopped_early` says where; the rows before it were written."""
        return bool(self.stats.get("damaged"))

    @property
    def packets(self) -> int:
        """Packets read (before the damage, when `damaged`)."""
        return int(self.stats.get("packets", 0))


def trace_capture(
    capture: str | Path, output: str | Path, server_map: str | Path | None = None, timeout: float | None = None
) -> TraceResult:
    """Turn `capture` (pcap/pcapng) into the requests table at `output` (Parquet).

    Raises TraceError with the engine's message when the capture cannot be read at all; a cut or
    damaged capture gives partial results with `stopped_early` set (and `damaged` for damage inside
    the file, which `tierscope trace` turns into a failure).
    """
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    argv = [str(engine_path()), "trace", str(capture), "-o", str(output), "--stats"]
    if server_map is not None:
        argv += ["--server-map", str(server_map)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if out.returncode not in (0, EXIT_DAMAGED):
        msg = out.stderr.strip() or f"exit code {out.returncode}"
        raise TraceError(msg.removeprefix("tierscope-engine: error: "))
    stats = {}
    for line in out.stdout.splitlines()[::-1]:
        if line.startswith("{"):
            stats = json.loads(line)
            break
    return TraceResult(output=output, stats=stats, messages=out.stderr)
