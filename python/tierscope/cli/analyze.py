"""`tierscope analyze`: import traces or logs of any N-tier system and find the bottleneck."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from tierscope.cli import _output

#: the smallest window: below 1 ms a window holds a fraction of one request's service
MIN_WINDOW_MS = 1.0
#: bytes per (server, window) cell of the fine-grained series, all columns and passes together
CELL_BYTES = 200
#: pcap and pcapng magic numbers
PCAP_MAGIC = (b"\xa1\xb2\xc3\xd4", b"\xd4\xc3\xb2\xa1", b"\xa1\xb2\x3c\x4d", b"\x4d\x3c\xb2\xa1", b"\x0a\x0d\x0d\x0a")

EPILOG = ("Exit status: 0 a verdict with medium or high confidence; 3 a verdict with low confidence; "
          "4 not enough data for a verdict; 2 bad input (a file, an option, an output path); 1 a failure.")


def _table_kind(path: Path) -> str | None:
    """'events' or 'resources' for a Parquet file of those tables (docs/tables.md), else None."""
    if path.suffix != ".parquet" or not path.is_file():
        return None
    import pyarrow.parquet as pq

    from tierscope.tables import EVENTS, RESOURCES

    try:
        cols = set(pq.read_schema(path).names)
    except Exception:  # not Parquet after all: the importers say so
        return None
    for name, schema in (("events", EVENTS), ("resources", RESOURCES)):
        if {f.name for f in schema if not f.nullable} <= cols and "arrival_ns" not in cols:
            return name
    return None


def _refuse_pcap(path: Path) -> None:
    if path.is_file():
        with open(path, "rb") as f:
            head = f.read(4)
        if head in PCAP_MAGIC:
            raise ValueError(f"{path}: a packet capture (pcap); trace it first: tierscope trace {path} -o DIR, "
                             f"then: tierscope analyze DIR/requests.parquet")


def _memory_needed(requests, window_ns: int) -> int:
    import pyarrow.compute as pc

    span = int(pc.max(requests.column("departure_ns")).as_py()) - int(pc.min(requests.column("arrival_ns")).as_py())
    servers = len(pc.unique(requests.column("server")))
    return (span // window_ns + 1) * servers * CELL_BYTES


def _available_memory() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def analyze(
    files: list[Path] = typer.Argument(..., help="Trace or log files: OTLP JSON, Jaeger, Zipkin, nginx/Apache "
                                                 "access logs, tierscope Parquet tables (requests, and events or "
                                                 "resources next to them), or one run/point directory."),
    format: str | None = typer.Option(None, "--format", "-f", help="Read every trace file as this format instead "
                                      "of detecting it: otlp, jaeger, zipkin, nginx, apache, parquet."),
    window_ms: float = typer.Option(50.0, "--window-ms", help=f"Window of the fine-grained analysis, in ms "
                                    f"(at least {MIN_WINDOW_MS:g})."),
    output: Path = typer.Option(Path("tierscope-analysis"), "-o", "--output",
                                help="Directory for requests.parquet (and report.html with --report)."),
    report: bool = typer.Option(False, "--report", help="Also write DIR/report.html."),
    json_out: str | None = typer.Option(None, "--json", help="Write the verdict, saturated shares, N* and the "
                                        "per-level table as JSON to this file ('-' for stdout)."),
    log_format: str | None = typer.Option(None, "--log-format", help="The nginx log_format or Apache LogFormat "
                                          "string of the access logs, when it is not the documented one."),
    tier: str | None = typer.Option(None, "--tier", help="Tier name for access-log rows (default: web)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Also print how the verdict was reached."),
) -> None:
    """Import traces or access logs of any system and find its bottleneck.

    Runs the fine-grained analysis, prints the summary, and writes the requests table (and
    optionally the HTML report and a JSON document). Events and resources Parquet tables given
    next to the traces feed the pause detection and the white box.

    Example: [bold]tierscope analyze spans.jsonl access.log --window-ms 50 -o out --report --json -[/bold]
    """
    from tierscope import tables
    from tierscope.ingest import FormatError
    from tierscope.report import build_summary, collect_files, collect_run, print_summary, write_report

    console = Console(stderr=json_out == "-")
    err = Console(stderr=True)

    def fail(message: str) -> None:
        from rich.markup import escape

        err.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
        raise typer.Exit(_output.BAD_INPUT)

    if window_ms < MIN_WINDOW_MS:
        fail(f"--window-ms {window_ms:g}: at least {MIN_WINDOW_MS:g} ms (a shorter window holds a fraction of one "
             f"request's service)")
    window_ns = int(round(window_ms * 1e6))
    try:
        _output.check_output_dir(output, "-o")
        if json_out not in (None, "-"):
            _output.check_output_file(Path(json_out), "--json")
        missing = [str(p) for p in files if not p.exists()]
        if missing:
            raise FileNotFoundError(f"no such file or directory: {', '.join(missing)}")
        dirs = [p for p in files if p.is_dir()]
        if dirs and len(files) > 1:
            raise ValueError("give one run or point directory, or files (not both)")
        for p in files:
            _refuse_pcap(p)
        if dirs:
            data = collect_run(dirs[0], window_ns=window_ns)
            requests = data.requests
        else:
            kinds = {p: _table_kind(p) for p in files}
            side = {k: [p for p, v in kinds.items() if v == k] for k in ("events", "resources")}
            traces = [p for p, v in kinds.items() if v is None]
            if not traces:
                raise ValueError("no trace or requests file among the inputs (only events/resources tables)")
            import pyarrow as pa
            import pyarrow.parquet as pq

            extra = {k: pa.concat_tables([tables.conform(pq.read_table(p), k) for p in ps]) if ps else None
                     for k, ps in side.items()}
            options = {k: v for k, v in (("log_format", log_format), ("tier", tier)) if v is not None}
            from tierscope.ingest import load

            imported = load(traces, format, **options)
            if imported.requests.num_rows:
                need, have = _memory_needed(imported.requests, window_ns), _available_memory()
                if have is not None and need > have // 2:
                    raise ValueError(f"--window-ms {window_ms:g} over this trace needs about {need / 2**30:.1f} GiB, "
                                     f"{have / 2**30:.1f} GiB available: use a larger window")
            data = collect_files(traces, format=format, window_ns=window_ns, events=extra["events"],
                                 resources=extra["resources"], imported=imported, **options)
            requests = data.imported.requests
            console.print(f"imported {data.imported.summary()}")
    except (FormatError, ValueError, OSError) as e:
        fail(_output.printable(str(e)))
    summary = build_summary(data)
    print_summary(summary, console, verbose=verbose, data=data)
    if verbose:
        for note in data.notes:
            console.print(f"[dim]note: {note}[/dim]")
    elif data.notes:
        console.print(f"[dim]{len(data.notes)} note(s): --verbose shows them[/dim]")
    try:
        if requests is not None and requests.num_rows:
            console.print(f"wrote {tables.write(requests, output / 'requests.parquet', 'requests')}")
        if report:
            console.print(f"wrote {write_report(data, output / 'report.html', summary)}")
        if json_out is not None:
            where = _output.write_json(data, summary, json_out)
            if where != "stdout":
                console.print(f"wrote {where}")
    except OSError as e:
        fail(f"writing the results: {e.strerror or e}" + (" (disk full)" if _output.no_space(e) else ""))
    raise typer.Exit(_output.verdict_status(data, summary))


def register(app: typer.Typer) -> None:
    app.command("analyze", epilog=EPILOG)(analyze)
