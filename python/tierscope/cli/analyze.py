"""`tierscope analyze`: import traces or logs of any N-tier system and find the bottleneck."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console


def analyze(
    files: list[Path] = typer.Argument(..., help="Trace or log files: OTLP JSON, Jaeger, Zipkin, nginx/Apache "
                                                 "access logs, tierscope Parquet (detected per file)."),
    format: str | None = typer.Option(None, "--format", "-f", help="Read every file as this format instead of "
                                      "detecting it: otlp, jaeger, zipkin, nginx, apache, parquet."),
    window_ms: float = typer.Option(50.0, "--window-ms", help="Window of the fine-grained analysis, in ms."),
    output: Path = typer.Option(Path("tierscope-analysis"), "-o", "--output",
                                help="Directory for requests.parquet (and report.html with --report)."),
    report: bool = typer.Option(False, "--report", help="Also write DIR/report.html."),
    log_format: str | None = typer.Option(None, "--log-format", help="The nginx log_format or Apache LogFormat "
                                          "string of the access logs, when it is not the documented one."),
    tier: str | None = typer.Option(None, "--tier", help="Tier name for access-log rows (default: web)."),
) -> None:
    """Import traces or access logs of any system and find its bottleneck.

    Runs the fine-grained analysis, prints the summary, and writes the requests table (and
    optionally the HTML report).

    Example: [bold]tierscope analyze spans.jsonl access.log --window-ms 50 -o out --report[/bold]
    """
    from tierscope import tables
    from tierscope.ingest import FormatError
    from tierscope.report import build_summary, collect_files, print_summary, write_report

    console = Console()
    err = Console(stderr=True)
    options = {k: v for k, v in (("log_format", log_format), ("tier", tier)) if v is not None}
    if window_ms <= 0:
        err.print("[red]error:[/red] --window-ms must be positive")
        raise typer.Exit(2)
    try:
        data = collect_files(files, format=format, window_ns=int(round(window_ms * 1e6)), **options)
    except (FormatError, ValueError, OSError) as e:
        err.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None
    imported = data.imported
    console.print(f"imported {imported.summary()}")
    summary = build_summary(data)
    print_summary(summary, console)
    for note in data.notes:
        console.print(f"[dim]note: {note}[/dim]")
    out = tables.write(imported.requests, output / "requests.parquet", "requests")
    console.print(f"wrote {out}")
    if report:
        console.print(f"wrote {write_report(data, output / 'report.html', summary)}")


def register(app: typer.Typer) -> None:
    app.command("analyze")(analyze)
