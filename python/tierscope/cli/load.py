"""`tierscope load`: drive a system with the emulated users of a workload file."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.live import Live
from rich.markup import escape


def load(
    workload: Path = typer.Argument(
        ..., help="Workload file (TOML, see docs/workload.md).", exists=True, dir_okay=False
    ),
    target: str | None = typer.Option(
        None, "--target", help="URL to send requests to: http://HOST:PORT, optionally with a path prefix."
    ),
    log: Path | None = typer.Option(
        None, "--log", help="Write one row per request (client_requests) to this Parquet file."
    ),
    users: int | None = typer.Option(None, "--users", help="Override the number of emulated users (closed loop)."),
    rate: float | None = typer.Option(None, "--rate", help="Override the arrival rate per second (open loop)."),
    duration: str | None = typer.Option(None, "--duration", help="Override the run phase, e.g. 60, 30s, 5m."),
    ramp_up: str | None = typer.Option(None, "--ramp-up", help="Override the ramp-up phase."),
    ramp_down: str | None = typer.Option(None, "--ramp-down", help="Override the ramp-down phase."),
    think: float | None = typer.Option(None, "--think", help="Override the mean think time (s; 0 = none)."),
    policy: str | None = typer.Option(None, "--policy", help="Connection policy: per-user, per-request or pool."),
    pool_size: int | None = typer.Option(None, "--pool-size", help="Connections in the pool (policy pool)."),
    seed: int | None = typer.Option(None, "--seed", help="Random seed."),
    dry_run: int | None = typer.Option(
        None, "--dry-run", help="Walk the chain for N requests without sending; print the page counts."
    ),
    json_lines: bool = typer.Option(False, "--json", help="Print the engine's JSON lines instead of the live display."),
    no_embedded: bool = typer.Option(
        False, "--no-embedded", help="Do not fetch the pages' images even when the workload's embedded section says so."
    ),
    embedded_connections: int | None = typer.Option(
        None, "--embedded-connections", min=1, help="Override the workload's embedded connections (per user)."
    ),
) -> None:
    """Run a workload against a target: live progress, then a per-page summary of the run phase.

    Ctrl-C, SIGTERM or SIGHUP stops the run cleanly: the generator stops too, the log is flushed
    and readable, the summary is printed and the exit status is non-zero (128 + the signal).

    Example: tierscope load examples/static-site.toml --target http://127.0.0.1:8080 --log run.parquet --users 50 --duration 20s
    """
    from tierscope.load import LiveView, LoadError, describe_all_phases, engine_args, run_load, summary_table

    console = Console()
    if target is None and dry_run is None:
        console.print("[red]error:[/red] --target URL is required (or --dry-run N)")
        raise typer.Exit(2)
    argv = engine_args(
        workload,
        target=target,
        log=log,
        users=users,
        rate=rate,
        duration=duration,
        ramp_up=ramp_up,
        ramp_down=ramp_down,
        think=think,
        policy=policy,
        pool_size=pool_size,
        seed=seed,
        dry_run=dry_run,
        no_embedded=no_embedded,
        embedded_connections=embedded_connections,
    )
    try:
        if json_lines or dry_run is not None:
            result = run_load(argv, on_progress=lambda p: print(json.dumps(p), flush=True))
            if result.summary is not None:
                print(json.dumps(result.summary if dry_run is not None else {"summary": result.summary}))
        else:
            view = LiveView(escape(f"tierscope load {workload.name} -> {target}"))
            with Live(view, console=console, refresh_per_second=4, transient=False):
                result = run_load(argv, on_progress=view.update)
            if result.summary is not None:
                console.print(summary_table(result.summary))
                console.print(describe_all_phases(result.summary), markup=False)
    except LoadError as err:
        console.print(f"[red]error:[/red] {escape(str(err))}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from err
    if result.stderr.strip():
        console.print(result.stderr.strip(), style="yellow", markup=False)
    if result.interrupted:  # 128 + the signal: 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP
        raise typer.Exit(128 + (result.signal or 2))
    if result.returncode != 0:
        raise typer.Exit(result.returncode)


def register(app: typer.Typer) -> None:
    app.command("load")(load)
