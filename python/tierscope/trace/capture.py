"""Live capture: tcpdump on an interface (optionally inside a host's network namespace), started
and stopped by tierscope.

tcpdump writes packets with nanosecond timestamps; it is stopped with SIGINT (after the file has
stopped growing, and waited for) so the file ends on a whole record and tcpdump reports its own
counts, including packets the kernel dropped, which `CaptureStats` carries.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tierscope.procs import spawn
from tierscope.testbed.host import Host


class CaptureError(RuntimeError):
    """tcpdump could not start or stop."""


@dataclass
class CaptureStats:
    """tcpdump's own counts at the end of a capture."""

    path: Path
    captured: int | None = None
    received_by_filter: int | None = None
    dropped_by_kernel: int | None = None
    seconds: float = 0.0


def tcpdump_binary() -> str:
    found = shutil.which("tcpdump") or ("/usr/bin/tcpdump" if os.path.exists("/usr/bin/tcpdump") else None)
    if not found:
        raise CaptureError("tcpdump is not installed (run make setup, or apt-get install tcpdump)")
    return found


class LiveCapture:
    """tcpdump writing `path` from `interface` with a BPF `filter`; use as a context manager."""

    def __init__(
        self,
        interface: str,
        path: str | Path,
        filter: str = "tcp",
        snaplen: int = 0,
        host: Host | None = None,
        nanosecond: bool = True,
    ):
        self.interface = interface
        self.path = Path(path).absolute()
        self.filter = filter
        self.snaplen = snaplen
        self.host = host
        self.nanosecond = nanosecond
        self.proc: subprocess.Popen | None = None
        self._log = self.path.with_suffix(self.path.suffix + ".tcpdump.log")
        self._t0 = 0.0

    def argv(self) -> list[str]:
        # Buffered output (no -U: one write per packet would cost the system under test CPU), an
        # 8 MiB kernel ring so bursts are not dropped; SIGINT makes tcpdump flush and close the file.
        argv = [tcpdump_binary(), "-i", self.interface, "-n", "-B", "8192", "-w", str(self.path)]
        argv += ["-s", str(self.snaplen if self.snaplen > 0 else 262144)]
        if os.geteuid() == 0:
            argv += ["-Z", "root"]  # keep root: the output directory may not be writable by tcpdump's user
        if self.nanosecond:
            argv.append("--time-stamp-precision=nano")
        if self.filter:
            argv.append(self.filter)
        if self.host is not None and self.host.netns:
            argv = ["ip", "netns", "exec", self.host.netns, *argv]
        return argv

    def start(self, timeout: float = 10.0) -> LiveCapture:
        """Start tcpdump and wait until it is listening."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self._log, "w") as log:
            self.proc = spawn(self.argv(), stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self._log.read_text(errors="replace")
            if "listening on" in text:
                self._t0 = time.monotonic()
                return self
            if self.proc.poll() is not None:
                raise CaptureError(f"tcpdump exited with code {self.proc.returncode}: {text.strip()}")
            time.sleep(0.02)
        self.stop()
        raise CaptureError(f"tcpdump did not start listening on {self.interface} within {timeout} s")

    def stop(self, timeout: float = 10.0, settle: bool = True) -> CaptureStats:
        """Stop tcpdump with SIGINT, wait for it, and return its counts. With `settle` (the
        default) first wait until the file stops growing, so that no captured packet is lost; a
        caller that only wants the capture's cost to end now passes settle=False."""
        stats = CaptureStats(path=self.path, seconds=time.monotonic() - self._t0 if self._t0 else 0.0)
        if self.proc is None:
            return stats
        if self.proc.poll() is None:
            if settle:
                self._settle()
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                try:
                    self.proc.wait(5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        self.proc = None
        text = self._log.read_text(errors="replace") if self._log.exists() else ""
        for attr, pattern in (
            ("captured", r"(\d+) packets? captured"),
            ("received_by_filter", r"(\d+) packets? received by filter"),
            ("dropped_by_kernel", r"(\d+) packets? dropped by kernel"),
        ):
            m = re.search(pattern, text)
            if m:
                setattr(stats, attr, int(m.group(1)))
        return stats

    def _settle(self, quiet: float = 1.2, limit: float = 5.0) -> None:
        """Wait until the file stops growing: packets the kernel holds for tcpdump but tcpdump has
        not written yet are lost when SIGINT ends its loop; libpcap hands them over when a ring block
        fills or its 1 s timeout expires, so wait for a quiet spell longer than that."""
        deadline = time.monotonic() + limit
        last, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            size = self.path.stat().st_size if self.path.exists() else 0
            if size != last:
                last, since = size, time.monotonic()
            elif time.monotonic() - since >= quiet:
                return
            time.sleep(0.05)

    def __enter__(self) -> LiveCapture:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.last_stats = self.stop()
