"""`tierscope simulate SPEC -o DIR`: simulate a closed N-tier system and write its tables."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape


def simulate(
    spec: Path = typer.Argument(..., help="simulation spec (TOML, see docs/simulate.md)"),
    output: Path = typer.Option(..., "-o", "--output", help="directory for the tables"),
) -> None:
    """Simulate a closed N-tier system and write its tables with the ground truth.

    Users, thread pools, cores, freezes and bursts; writes requests, client_requests, events,
    resources and saturation_truth as Parquet.

    Example: [bold]tierscope simulate examples/simulate/alternating.toml -o out/alternating[/bold]
    """
    from tierscope.cli._output import OutputError, check_output_dir
    from tierscope.simulate import SpecError, load_spec
    from tierscope.simulate import simulate as run

    console = Console()
    try:
        parsed = load_spec(spec)
        check_output_dir(output, "-o")
    except (SpecError, OutputError) as err:
        Console(stderr=True).print(
            f"[red]error:[/red] {escape(str(err))}", markup=True, highlight=False, soft_wrap=True
        )
        raise typer.Exit(2) from None
    started = time.perf_counter()
    sim = run(parsed)
    paths = sim.write(output)
    elapsed = time.perf_counter() - started
    simulated = parsed.duration_s - parsed.warmup_s
    console.print(
        f"simulated {simulated:g} s in {elapsed:.1f} s: {sim.client_requests.num_rows} client requests "
        f"({sim.client_requests.num_rows / simulated:.0f}/s), {sim.requests.num_rows} requests at "
        f"{len(parsed.tier)} tiers, {sim.events.num_rows} events",
        markup=False,
    )
    for name, path in paths.items():
        console.print(f"  {name}: {path}", markup=False)
    truth = sim.saturation_truth.to_pylist()
    if truth:
        console.print("ground truth, share of the run each server was saturated:")
        per: dict[str, list] = {}
        for row in truth:
            item = per.setdefault(row["server"], [0, set()])
            item[0] += row["end_ns"] - row["start_ns"]
            item[1].update(row["cause"].split("+"))
        for server, (ns, causes) in per.items():
            console.print(f"  {server}: {ns / 1e9 / simulated:.1%} ({', '.join(sorted(causes))})", markup=False)
    else:
        console.print("ground truth: no server was ever saturated")


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate)
