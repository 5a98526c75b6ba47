"""`tierscope trace`: every request at every tier from one packet capture."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape


def trace(
    capture: Path | None = typer.Argument(None, help="Capture file (pcap/pcapng) written by tcpdump."),
    output: Path = typer.Option(Path("requests.parquet"), "-o", "--output", help="Requests table to write (Parquet)."),
    server_map: Path | None = typer.Option(
        None,
        "--server-map",
        help="Server map file: lines `address:port tier server protocol` (protocol optional: http, postgres, mysql; `*` = any address).",
    ),
    live: str | None = typer.Option(
        None,
        "--live",
        help="Capture live from this interface (e.g. lo): the engine's capture, tcpdump where it cannot start.",
    ),
    filter: str = typer.Option("tcp", "--filter", help="BPF filter for --live, e.g. 'tcp port 80 or tcp port 5432'."),
    duration: float = typer.Option(10.0, "--duration", help="Seconds to capture with --live."),
    snaplen: int = typer.Option(0, "--snaplen", help="Bytes kept per packet with --live (0 = whole packets)."),
    keep_capture: Path | None = typer.Option(None, "--keep-capture", help="With --live: keep the pcap file here."),
    link: bool = typer.Option(True, "--link/--no-link", help="Link rows across tiers (parent_id, transaction)."),
) -> None:
    """Turn a packet capture into the requests table: one row per request/response exchange at
    every server (HTTP/1.x, PostgreSQL, MySQL/MariaDB), with arrival and departure times from the
    capture's single clock, labels (URL templates, SQL fingerprints), status and bytes.

    Exit status: 0 traced (a capture cut short at the end, as a killed tcpdump leaves it, is a
    warning); 1 the capture is damaged part way (a corrupt record or block): the rows before the
    damage are written and the error says how many packets were kept; 2 not a readable capture or
    bad arguments.

    Example: tierscope trace capture.pcap -o requests.parquet --server-map servers.txt

    Example: tierscope trace --live lo --filter 'tcp port 8080 or tcp port 5432' --duration 30 -o requests.parquet
    """
    from tierscope.cli._output import OutputError, check_output_file
    from tierscope.trace.capture import CaptureError, LiveCapture
    from tierscope.trace.link import link_file
    from tierscope.trace.run import TraceError, trace_capture

    console = Console(stderr=True)
    if (capture is None) == (live is None):
        console.print("[red]error:[/red] give a CAPTURE file or --live IFACE (one of them)")
        raise typer.Exit(2)
    try:  # before capturing for --duration seconds, not after
        check_output_file(output, "-o")
        if keep_capture is not None:
            check_output_file(keep_capture, "--keep-capture")
    except OutputError as err:
        console.print(f"[red]error:[/red] {escape(str(err))}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from err
    tmpdir = None
    if live is not None:
        if duration <= 0:
            console.print("[red]error:[/red] --duration must be > 0 seconds")
            raise typer.Exit(2)
        if keep_capture is not None:
            capture = keep_capture
        else:
            tmpdir = tempfile.TemporaryDirectory(prefix="tierscope-trace-")
            capture = Path(tmpdir.name) / "live.pcap"
        cap = LiveCapture(live, capture, filter=filter, snaplen=snaplen)
        try:
            cap.start()
            console.print(f"capturing on {live} ({filter!r}) for {duration:g} s ...", markup=False)
            try:
                time.sleep(duration)
            except KeyboardInterrupt:
                console.print("interrupted: stopping the capture")
            stats = cap.stop()
        except CaptureError as err:
            console.print(f"[red]error:[/red] {escape(str(err))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from err
        finally:
            cap.stop()
        dropped = stats.dropped_by_kernel or 0
        if cap.fallback_reason:
            console.print(f"note: tcpdump captured instead: {cap.fallback_reason}", markup=False)
        name = "tierscope-engine capture" if stats.method == "engine" else "tcpdump"
        console.print(f"{name}: {stats.captured} packets captured, {dropped} dropped by the kernel", markup=False)
    assert capture is not None
    if not capture.exists():
        console.print(f"[red]error:[/red] capture file {escape(str(capture))} does not exist", highlight=False)
        raise typer.Exit(2)
    try:
        result = trace_capture(capture, output, server_map)
    except TraceError as err:
        console.print(f"[red]error:[/red] {escape(str(err))}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from err
    finally:
        pass
    for line in result.messages.strip().splitlines():
        console.print(line, markup=False, highlight=False)
    if link and result.rows > 0:
        kinds = link_file(output)
        counts = ", ".join(f"{n} by {kind}" for kind, n in kinds.items() if kind != "root")
        console.print(f"linked across tiers: {counts or 'no parents found'}", markup=False)
    console.print(f"wrote {result.rows} rows to {output}", markup=False)
    if tmpdir is not None:
        tmpdir.cleanup()
    if result.damaged:
        console.print(
            f"[red]error:[/red] the capture is damaged ({escape(str(result.stopped_early))}); only the {result.packets} "
            f"packets before the damage were traced",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("trace")(trace)
