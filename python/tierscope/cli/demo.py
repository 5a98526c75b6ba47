"""`tierscope demo`: the preset experiment that shows the whole lab in under five minutes."""

from __future__ import annotations

from pathlib import Path

import typer


def preset(name: str) -> Path:
    """The path of a preset spec shipped with the package (`demo`, `demo-alternating`, `tiny`)."""
    import tierscope

    package = Path(tierscope.__file__).parent
    for folder in (package / "presets", package.parent.parent / "examples" / "specs"):
        path = folder / f"{name}.toml"
        if path.exists():
            return path
    raise FileNotFoundError(f"no preset {name!r} in {package / 'presets'}")


#: `demo --memory`: the memory study cut to the two memory sizes whose bottlenecks differ (disk at
#: ~30 %, CPU at 100 %) and two workload levels, below and above both knees, with shorter runs
#: (and a short ramp-up: the preset's 30 s lets the middle size's cache settle, which these two
#: sizes do not need)
MEMORY_DEMO = {
    "name": "tpcw-memory-demo",
    "node_types.D.memory": "128MiB",
    "sweep.matrix": {"node_types.D.memory": ["128MiB", "1GiB"]},
    "workload.users": [50, 400],
    "workload.ramp_up": "5s",
    "workload.run": "20s",
}


def demo(
    alternating: bool = typer.Option(
        False,
        "--alternating",
        help="Inject stop-the-world pauses into the app "
        "tier (like JVM garbage collections), so the bottleneck alternates.",
    ),
    out: Path = typer.Option(Path("results"), "-o", "--out", help="Results directory."),
    loopback: bool = typer.Option(False, "--loopback", help="Run on loopback without namespaces or limits."),
    ingest: bool = typer.Option(
        False,
        "--ingest",
        help="Instead: seed 003's log service, direct inserts vs queue "
        "and batch collectors, loss counted (about a minute).",
    ),
    memory: bool = typer.Option(
        False,
        "--memory",
        help="Instead: seed 004's memory study, reduced: the bookstore "
        "with its database host at 30 % and 100 % of the database size in memory, two "
        "workload levels each (about 5 minutes; the full study: tierscope run tpcw-memory).",
    ),
) -> None:
    """Run the demo experiment: a 3-tier RUBBoS system, four workload levels, a report.

    Builds nginx, an app server and PostgreSQL in hosts with tight CPU limits, drives them at four
    workload levels with the capture on, and writes report.html naming the bottleneck. Takes under
    five minutes on a 2-core machine, data load included.

    Example: [bold]tierscope demo[/bold]   or   [bold]tierscope demo --alternating[/bold]   or
    [bold]tierscope demo --ingest[/bold]   or   [bold]tierscope demo --memory[/bold]
    """
    if ingest:
        from tierscope.cli.ingest import run_study

        raise typer.Exit(run_study(preset("ingest"), out, loopback=loopback))
    from tierscope.cli.run import execute

    if memory:
        raise typer.Exit(
            execute(preset("tpcw-memory"), out, mode="loopback" if loopback else "auto", changes=MEMORY_DEMO)
        )
    spec = preset("demo-alternating" if alternating else "demo")
    raise typer.Exit(execute(spec, out, mode="loopback" if loopback else "auto"))


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
