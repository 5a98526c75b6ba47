"""`tierscope report`: the HTML report of a run directory or of trace files."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from tierscope.cli.analyze import (
    EPILOG,
    FORMAT_OPTION,
    JSON_OPTION,
    VERBOSE_OPTION,
    WINDOW_MS_OPTION,
    print_notes,
    window_ns_of,
)


def report(
    inputs: list[Path] = typer.Argument(
        ...,
        help="A run directory (DIR/<run>/<point>/ with Parquet tables and "
        "manifest.json), a point directory, or trace/log files.",
    ),
    output: Path = typer.Option(Path("report.html"), "-o", "--output", help="The HTML file to write."),
    window_ms: float = WINDOW_MS_OPTION,
    point: str | None = typer.Option(
        None,
        "--point",
        help="Point (directory name) for the fine-grained analysis; default: the first point at or past the knee.",
    ),
    think_time: float | None = typer.Option(
        None,
        "--think-time",
        help="Users' mean think time in seconds, for the knee from asymptotic bounds (default: from the manifest).",
    ),
    format: str | None = FORMAT_OPTION,
    json_out: str | None = JSON_OPTION,
    verbose: bool = VERBOSE_OPTION,
) -> None:
    """Write one self-contained HTML report (works offline) and print its summary.

    Example: [bold]tierscope report runs/sweep1 -o report.html[/bold]
    """
    from rich.markup import escape

    from tierscope.analysis.experiment import analyze_files, analyze_run
    from tierscope.analysis.summary import build_summary
    from tierscope.cli import _output
    from tierscope.ingest import FormatError
    from tierscope.report import print_summary, write_report

    console = Console(stderr=json_out == "-")
    err = Console(stderr=True)
    try:
        window_ns = window_ns_of(window_ms)
        _output.check_output_file(output, "-o")
        if json_out not in (None, "-"):
            _output.check_output_file(Path(json_out), "--json")
        if len(inputs) == 1 and inputs[0].is_dir():
            data = analyze_run(inputs[0], window_ns=window_ns, point=point, think_time_s=think_time)
        else:
            missing = [str(p) for p in inputs if not p.exists()]
            if missing:
                raise FileNotFoundError(f"no such file or directory: {', '.join(missing)}")
            if any(p.is_dir() for p in inputs):
                raise ValueError("give one run directory, or trace files (not several directories)")
            data = analyze_files(inputs, format=format, window_ns=window_ns)
    except (FormatError, ValueError, OSError) as e:
        err.print(f"[red]error:[/red] {escape(_output.printable(str(e)))}", highlight=False, soft_wrap=True)
        raise typer.Exit(_output.BAD_INPUT) from None
    summary = build_summary(data)
    print_summary(summary, console, verbose=verbose, data=data)
    finding = None
    if len(inputs) == 1 and inputs[0].is_dir():
        from tierscope.cli.run import finding_of_run

        finding = finding_of_run(data, inputs[0])
        if finding is not None:
            console.print(f"[bold]Finding:[/bold] {escape(finding.line())}", highlight=False, soft_wrap=True)
    print_notes(data.notes, console, verbose)
    try:
        console.print(f"wrote {write_report(data, output, summary, finding=finding)}", markup=False)
        if json_out is not None:
            doc = _output.verdict_document(data, summary)
            if finding is not None:
                doc["finding"] = finding.as_dict()
            where = _output.write_document(doc, json_out)
            if where != "stdout":
                console.print(f"wrote {where}", markup=False)
    except OSError as e:
        err.print(
            f"[red]error:[/red] writing the results: {escape(str(e.strerror or e))}", highlight=False, soft_wrap=True
        )
        raise typer.Exit(_output.BAD_INPUT) from None
    raise typer.Exit(_output.verdict_status(data, summary))


def register(app: typer.Typer) -> None:
    app.command("report", epilog=EPILOG)(report)
