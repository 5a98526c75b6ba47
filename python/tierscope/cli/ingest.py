"""`tierscope ingest [PRESET]`: seed 003's log service, each mode at the same offered load, loss
counted by record id in the database."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tierscope.cli import _output
from tierscope.studies import loss_finding_of, study_of
from tierscope.studies.document import FILE_NAME, study_document


def _saturated_cell(r) -> str:
    from tierscope.studies.logservice import describe_saturated

    return "unknown" if r.testbed and r.testbed != "namespaces" else describe_saturated(r.saturated)


def results_rows(results: list) -> tuple[list[str], list[list[str]]]:
    """The modes' counts as (headings, rows): one column per mode, one row per measure (fits a
    terminal with three modes); the terminal's table and the report's."""

    def known(v) -> str:
        return "unknown" if v is None else str(v)

    measures = [
        ("records sent", lambda r: str(r.sent)),
        ("acknowledged (201)", lambda r: str(r.acknowledged)),
        ("refused (503)", lambda r: str(r.refused)),
        ("timed out", lambda r: f"{r.timed_out} ({known(r.timed_out_stored)} stored)"),
        ("connection errors", lambda r: str(r.connection_errors + r.other)),
        ("stored", lambda r: known(r.stored)),
        (
            "lost (sent, not stored)",
            lambda r: "unknown" if r.lost is None else f"{r.lost} ({100 * r.lost / max(1, r.sent):.1f} %)",
        ),
        ("lost though acknowledged", lambda r: known(r.lost_acknowledged)),
        ("stored rows/s", lambda r: f"{r.stored_per_s:.0f}"),
        ("p90 of acknowledged, ms", lambda r: f"{r.p90_ms:.0f}" if r.p90_ms is not None else "-"),
        ("saturated resource", lambda r: _saturated_cell(r)),
    ]
    return ["", *(r.mode for r in results)], [[name, *(cell(r) for r in results)] for name, cell in measures]


def results_table(results: list) -> Table:
    """`results_rows` as a Rich table."""
    t = Table(title="log service: the same offered load in each mode")
    heads, rows = results_rows(results)
    for i, h in enumerate(heads):
        t.add_column(h, justify="right" if i else "left")
    for row in rows:
        t.add_row(*row)
    return t


def ingest(
    preset_path: Path = typer.Argument(
        None,
        metavar="[PRESET]",
        help="An ingest preset (TOML); default: the shipped python/tierscope/presets/ingest.toml (tierscope run ingest).",
    ),
    out: Path = typer.Option(
        Path("results"),
        "-o",
        "--out",
        help="Results directory: OUT/<run>/<mode>/, OUT/<run>/study.json and report.html (<run>: --name, default the preset's name).",
    ),
    modes: list[str] | None = typer.Option(
        None, "--mode", help="Only this mode (repeat for several): direct, queue, durable."
    ),
    clients: int | None = typer.Option(None, "--clients", min=1, help="Override load.clients."),
    records: int | None = typer.Option(None, "--records", min=1, help="Override load.records (per client)."),
    loopback: bool = typer.Option(False, "--loopback", help="Run on loopback without namespaces or limits."),
    run_name: str | None = typer.Option(None, "--name", help="Run name (default: the preset's name)."),
    json_out: str | None = typer.Option(
        None, "--json", metavar="FILE", help="Also write the study document to FILE ('-' for stdout)."
    ),
) -> None:
    """Compare the log service's modes at the same offered load (seed 003).

    Starts the database (its CPU limited), the broker (durable mode), the log service on the app
    server and the driver in hosts of their own, for each mode in turn; the driver's clients post
    records with unique ids and a timeout. After each mode the service is drained and every id is
    looked up in the database. Prints, per mode: records sent, acknowledged, refused (503),
    timed out, stored, lost (sent, not stored), lost though acknowledged (must be 0), stored
    rows/s, p90 latency and the saturated resources during the load (or "none"), and the servers
    the supervisor restarted; the counts are printed even when the database could not be read at
    the end ("unknown"). Then the finding across the modes in one line ("direct loses 99.7 % of
    the records (4,986 of 5,000) with db1's CPU saturated; queue and durable lose none").
    Tables in OUT/ingest/<mode>/, the study document in OUT/ingest/study.json (as every study's:
    docs/spec.md, "The study document"), the report in OUT/ingest/report.html. The same as
    `tierscope run ingest`.

    Exit status: 0 done, 1 a mode failed, lost an acknowledged record or could not be counted,
    2 bad preset.

    Example: [bold]tierscope ingest[/bold]   or   [bold]tierscope ingest --mode direct --clients 500[/bold]
    """
    raise typer.Exit(
        run_study(
            preset_path,
            out,
            modes=modes,
            clients=clients,
            records=records,
            loopback=loopback,
            run_name=run_name,
            json_out=json_out,
        )
    )


def run_study(
    preset_path: Path | None,
    out: Path,
    *,
    modes: list[str] | None = None,
    clients: int | None = None,
    records: int | None = None,
    loopback: bool = False,
    json_out: str | None = None,
    run_name: str | None = None,
) -> int:
    """Run a log-service preset (`tierscope ingest`, `tierscope run ingest`): each mode in turn,
    the table, the finding across the modes in words; OUT/<run>/<mode>/, OUT/<run>/study.json (the study
    document, `tierscope.studies.document`) and OUT/<run>/report.html (<run>: `run_name`, default the
    preset's name). Returns the exit status."""
    from tierscope.cli.demo import preset
    from tierscope.report.html import write_study_page  # plotly: loaded when a study runs, not for --help
    from tierscope.studies.logservice import finding, run_mode
    from tierscope.studies.logservice_preset import PresetError, load_preset

    console, err = Console(stderr=json_out == "-"), Console(stderr=True)
    try:
        path = preset_path or preset("ingest")
        chosen, load, service, description = load_preset(path)
        if modes:
            bad = [m for m in modes if m not in ("direct", "queue", "durable")]
            if bad:
                raise PresetError(f"--mode {bad[0]}: expected direct, queue or durable")
            chosen = list(dict.fromkeys(modes))
        load = replace(load, clients=clients or load.clients, records=records or load.records)
        if json_out not in (None, "-"):
            _output.check_output_file(Path(json_out), "--json")
    except (PresetError, FileNotFoundError, ValueError, OSError) as e:
        err.print(f"[red]error:[/red] {escape(str(e))}", highlight=False, soft_wrap=True)
        return _output.BAD_INPUT
    run_dir = out / (run_name or path.stem)
    console.print(
        f"{description or path}: {load.clients} clients x {load.records} records, timeout "
        f"{load.timeout_s:g} s; modes {', '.join(chosen)}",
        markup=False,
    )
    results, failed = [], []
    with console.status("") as status:
        for mode in chosen:
            try:
                results.append(
                    run_mode(
                        mode,
                        service,
                        replace(load, run=mode),
                        run_dir / mode,
                        testbed_mode="loopback" if loopback else "auto",
                        phase=lambda s: status.update(escape(s)),
                    )
                )
            except KeyboardInterrupt:
                err.print("[yellow]interrupted[/yellow]: servers and hosts are stopped")
                return 130
            except Exception as e:  # one mode failing does not stop the others
                failed.append((mode, f"{type(e).__name__}: {e}"))
    if results:
        console.print(results_table(results))
    for r in results:
        for note in r.notes:
            console.print(f"[dim]{r.mode}: {escape(note)}[/dim]", highlight=False, soft_wrap=True)
        if r.error:
            err.print(f"[red]{r.mode}[/red]: {escape(str(r.error))}", highlight=False, soft_wrap=True)
    for mode, reason in failed:
        err.print(f"[red]failed[/red] {mode}: {escape(reason)}", highlight=False, soft_wrap=True)
    verdict = finding(results) if results else ""
    stated = loss_finding_of(verdict, results, path)
    if verdict:
        console.print(f"[bold]Finding:[/bold] {escape(stated.line())}", highlight=False, soft_wrap=True)
    report = write_study_page(
        run_dir / "report.html",
        f"{path.stem}: the log service's modes at the same offered load",
        stated,
        [("Each mode at the same offered load", *results_rows(results))] if results else [],
        [f"{r.mode}: {n}" for r in results for n in r.notes]
        + [f"{r.mode}: {r.error}" for r in results if r.error]
        + [f"{m} failed: {why}" for m, why in failed],
    )
    study = study_of(path)
    doc = study_document(
        name=study.name if study else path.stem,
        kind="logservice",
        preset=path,
        seed=study.seed if study else None,
        finding=stated,
        run_dir=run_dir,
        done=[r.mode for r in results],
        failed=failed,
        report=report,
        body={"results": [r.as_dict() for r in results]},
    )
    _output.write_document(doc, str(run_dir / FILE_NAME))
    console.print(f"tables: {run_dir}; report: {report}", markup=False)
    if any((run_dir / m / "secrets").exists() for m in chosen):
        broker = f", {run_dir}/durable/broker1/redis.password (the broker's)" if "durable" in chosen else ""
        console.print(
            f"credentials (0600, made for this run): {run_dir}/<mode>/secrets/tokens.json (the clients' tokens)"
            + broker,
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    if json_out is not None:
        where = _output.write_document(doc, json_out)
        if where != "stdout":
            console.print(f"wrote {where}", markup=False)
    return 1 if failed or any(r.lost_acknowledged is None or r.lost_acknowledged for r in results) else 0


def register(app: typer.Typer) -> None:
    app.command("ingest")(ingest)
