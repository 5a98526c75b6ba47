"""Live capture, started and stopped by tierscope: the engine's own capture (`tierscope-engine
capture`), or tcpdump where that cannot start, on an interface (optionally inside a host's
network namespace).

The engine's capture (issue 24) runs the same filter tcpdump compiles (`tcpdump -ddd`) and never
takes the outgoing copy of a packet: on `lo` it sees each packet once, arriving (tcpdump is handed
it twice and libpcap drops one in user space, after the kernel cloned and copied it); on a lab
bridge it sees each frame once, where it enters the bridge from a host's port, and does not make
the bridge promiscuous. Where the kernel loads it, the filter runs as an eBPF program on the TC
hook writing into a ring buffer (`via` "ebpf": no packet socket, so the kernel's packet taps stay
empty); else an AF_PACKET TPACKET_V3 socket runs it (`via` "packet"), and `ebpf_unavailable`
says why. It writes the same pcap
(nanosecond timestamps, Ethernet), so the tracer reads either. `method="auto"` (the default, or
`$TIERSCOPE_CAPTURE`) takes it and falls back to tcpdump when it cannot start (no engine, a kernel
without PACKET_IGNORE_OUTGOING, no CAP_NET_RAW...), saying why; `capture_info()` and the file
`<capture>.capture.json` beside the capture record which ran, and the point's manifest carries
it (`manifest.Manifest.capture`).

Both write packets with nanosecond timestamps; both are stopped with SIGINT so the file ends on a
whole record and the counts (captured, received by filter, dropped by kernel) are printed in
tcpdump's words, which `CaptureStats` carries. tcpdump is first left until the file stops growing
(it loses what its ring still holds at SIGINT); the engine hands over what it holds itself.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tierscope.engine import EngineNotFound, engine_path
from tierscope.procs import spawn
from tierscope.testbed.host import Host

#: the captures LiveCapture can run
METHODS = ("auto", "engine", "tcpdump")
#: how the engine's capture can take packets (its --via)
VIAS = ("auto", "ebpf", "packet")
#: what the engine's listening line says when eBPF could not load and the packet socket runs
EBPF_UNAVAILABLE = "eBPF not used: "


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
    #: which capture ran: "engine" or "tcpdump"
    method: str = "tcpdump"


def tcpdump_binary() -> str:
    found = shutil.which("tcpdump") or ("/usr/bin/tcpdump" if os.path.exists("/usr/bin/tcpdump") else None)
    if not found:
        raise CaptureError("tcpdump is not installed (run make setup, or apt-get install tcpdump)")
    return found


class LiveCapture:
    """A capture writing `path` from `interface` with a BPF `filter`; use as a context manager.

    `method`: "engine" (the engine's capture, an error when it cannot start), "tcpdump", or "auto"
    (the default: the engine's, else tcpdump; `$TIERSCOPE_CAPTURE` overrides the default).
    `via`: how the engine's capture takes packets: "auto" (eBPF where it loads, else the packet
    socket), "ebpf" or "packet"."""

    def __init__(
        self,
        interface: str,
        path: str | Path,
        filter: str = "tcp",
        snaplen: int = 0,
        host: Host | None = None,
        nanosecond: bool = True,
        method: str | None = None,
        via: str = "auto",
    ):
        self.interface = interface
        self.path = Path(path).absolute()
        self.filter = filter
        self.snaplen = snaplen
        self.host = host
        self.nanosecond = nanosecond
        self.method = method or os.environ.get("TIERSCOPE_CAPTURE") or "auto"
        if self.method not in METHODS:
            raise CaptureError(f"capture method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if via not in VIAS:
            raise CaptureError(f"the engine capture's via must be one of {', '.join(VIAS)}, got {via!r}")
        self.via = via
        #: the capture that runs ("engine" or "tcpdump"), once started
        self.used: str | None = None
        #: why the engine's capture was not used (auto only)
        self.fallback_reason: str | None = None
        self.listening: str = ""
        self.proc: subprocess.Popen | None = None
        self._log = self.path.with_suffix(self.path.suffix + ".tcpdump.log")
        self._t0 = 0.0

    @property
    def info_path(self) -> Path:
        """`<capture>.capture.json`: which capture ran, why, and its counts."""
        return self.path.with_suffix(self.path.suffix + ".capture.json")

    def _wrap(self, argv: list[str]) -> list[str]:
        if self.host is not None and self.host.netns:
            return ["ip", "netns", "exec", self.host.netns, *argv]
        return argv

    def argv(self) -> list[str]:
        """tcpdump's command line."""
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
        return self._wrap(argv)

    def compiled_filter(self) -> str:
        """The filter as the kernel runs it, compiled by tcpdump (`-ddd`: a count, then one
        `code jt jf k` per instruction) for Ethernet framing with the snapshot length as its
        accept value."""
        argv = [tcpdump_binary(), "-i", "lo", "-y", "EN10MB", "-s", str(self.snaplen or 262144), "-ddd", self.filter]
        try:
            out = subprocess.run(self._wrap(argv), capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise CaptureError(f"compiling the filter with tcpdump: {err}") from None
        if out.returncode != 0:
            raise CaptureError(f"tcpdump could not compile the filter {self.filter!r}: {out.stderr.strip()}")
        return ",".join(line.strip() for line in out.stdout.splitlines() if line.strip())

    def engine_argv(self) -> list[str]:
        """The engine capture's command line."""

        try:
            engine = str(engine_path())
        except EngineNotFound as err:
            raise CaptureError(str(err)) from None
        if not self.nanosecond:
            raise CaptureError("the engine's capture writes nanosecond timestamps only")
        argv = [engine, "capture", "-i", self.interface, "-w", str(self.path)]
        argv += ["-s", str(self.snaplen if self.snaplen > 0 else 262144), "--via", self.via]
        if self.filter:
            argv += ["--bpf", self.compiled_filter()]
        return self._wrap(argv)

    @property
    def engine_via(self) -> str | None:
        """How the engine's capture took packets ("ebpf" or "packet"; None for tcpdump), from the
        line it printed when it started listening."""
        if self.used != "engine":
            return None
        return "ebpf" if "eBPF on the TC hook" in self.listening else "packet"

    @property
    def ebpf_unavailable(self) -> str | None:
        """Why the engine's capture could not load its eBPF program, when it could not."""
        _, found, why = self.listening.partition(EBPF_UNAVAILABLE)
        return why.rsplit("), snapshot length", 1)[0] if found else None

    def start(self, timeout: float = 10.0) -> LiveCapture:
        """Start the capture and wait until it is listening."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.method in ("auto", "engine"):
            try:
                self._start(self.engine_argv(), "engine", timeout)
            except CaptureError as err:
                if self.method == "engine":
                    raise
                self.fallback_reason = f"the engine's capture could not start: {err}"
        if self.used is None:
            self._start(self.argv(), "tcpdump", timeout)
        self._write_info()
        return self

    def _start(self, argv: list[str], method: str, timeout: float) -> None:
        name = "tierscope-engine capture" if method == "engine" else "tcpdump"
        with open(self._log, "w") as log:
            self.proc = spawn(argv, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self._log.read_text(errors="replace")
            if "listening on" in text:
                self._t0 = time.monotonic()
                self.used = method
                self.listening = next((ln for ln in text.splitlines() if "listening on" in ln), "").strip()
                return
            rc = self.proc.poll()
            if rc is not None:
                self.proc = None
                last = text.strip().splitlines()[-1:] or [""]
                raise CaptureError(f"{name} exited with code {rc}: {last[0]}")
            time.sleep(0.02)
        self._kill()
        raise CaptureError(f"{name} did not start listening on {self.interface} within {timeout} s")

    def _kill(self) -> None:
        if self.proc is None:
            return
        self.proc.kill()
        self.proc.wait()
        self.proc = None

    def capture_info(self, stats: CaptureStats | None = None) -> dict:
        """Which capture ran and why: what `<capture>.capture.json` and the manifest hold."""
        info: dict = {
            "method": self.used,
            "requested": self.method,
            "interface": self.interface,
            "netns": self.host.netns if self.host is not None else None,
            "filter": self.filter,
            "snaplen": self.snaplen or 262144,
            "listening": self.listening,
            "fallback_reason": self.fallback_reason,
            "via": self.engine_via,
            "ebpf_unavailable": self.ebpf_unavailable,
        }
        if stats is not None:
            info.update(
                captured=stats.captured,
                received_by_filter=stats.received_by_filter,
                dropped_by_kernel=stats.dropped_by_kernel,
                seconds=round(stats.seconds, 3),
            )
        return info

    def _write_info(self, stats: CaptureStats | None = None) -> None:
        tmp = self.info_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.capture_info(stats), indent=1) + "\n")
        tmp.replace(self.info_path)

    def stop(self, timeout: float = 10.0, settle: bool = True) -> CaptureStats:
        """Stop the capture with SIGINT, wait for it, and return its counts. With `settle` (the
        default) tcpdump is first left until the file stops growing, so that no captured packet is
        lost (the engine's capture hands over what it holds by itself); a caller that only wants
        the capture's cost to end now passes settle=False."""
        stats = CaptureStats(
            path=self.path, seconds=time.monotonic() - self._t0 if self._t0 else 0.0, method=self.used or "tcpdump"
        )
        if self.proc is None:
            return stats
        if self.proc.poll() is None:
            if settle and self.used == "tcpdump":
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
        self._write_info(stats)
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
