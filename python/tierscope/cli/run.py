"""`tierscope run SPEC`: run every point of an experiment spec, then analyse and report."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape


def run(
    spec_path: Path = typer.Argument(
        ...,
        metavar="SPEC",
        help="Experiment spec (TOML; see docs/spec.md), or the "
        "name of a shipped preset: demo, demo-alternating, tpcw-memory.",
    ),
    out: Path = typer.Option(Path("results"), "-o", "--out", help="Results directory: OUT/<run>/<point>/."),
    resume: bool = typer.Option(False, "--resume", help="Skip points that finished in an earlier run."),
    run_name: str | None = typer.Option(None, "--name", help="Run name (default: the spec's name)."),
    loopback: bool = typer.Option(
        False,
        "--loopback",
        help="Run every server on loopback without limits (what is lost is printed), instead of namespaced hosts.",
    ),
    hosts: Path | None = typer.Option(
        None,
        "--hosts",
        metavar="INVENTORY",
        help="Run on real hosts over SSH, deployed with Ansible: an Ansible YAML "
        "inventory whose groups web/app/middleware/db/client say which host runs "
        "which tier (docs/remote.md). The playbooks are written into the run "
        "directory; clocks are checked first.",
    ),
    no_report: bool = typer.Option(False, "--no-report", help="Do not analyse nor write report.html."),
    json_out: str | None = typer.Option(
        None,
        "--json",
        metavar="FILE",
        help="Also write the verdict and the points' outcome as JSON to FILE "
        "('-' for stdout; the terminal output then goes to stderr).",
    ),
) -> None:
    """Run an experiment spec: every sweep point, then the report naming the bottleneck.

    For each point: build the hosts, start the tiers, drive the workload, capture and monitor,
    collect the tables into OUT/<run>/<point>/. Ctrl-C stops cleanly and keeps finished points
    (continue with --resume). First, labs a killed run left (their owner process is dead) are named,
    one line each ("lab 0: orphaned, owner pid 28923 dead"), and removed like `tierscope testbed
    clean --orphans`; --resume never deletes a point directory that live processes still hold.

    Exit status: 0 all points done, 1 a point failed, 2 bad spec or output, 130 interrupted.

    Example: [bold]tierscope run examples/specs/tiny.toml -o results[/bold]   or
    [bold]tierscope run tpcw-memory[/bold] (seed 004's memory study, about 15 minutes)   or, on
    machines reached over SSH: [bold]tierscope run examples/specs/tiny.toml --hosts inventory.yml[/bold]
    """
    if not spec_path.exists() and not spec_path.suffix and len(spec_path.parts) == 1:
        from tierscope.cli.demo import preset

        with contextlib.suppress(FileNotFoundError):  # execute() reports the missing file
            spec_path = preset(str(spec_path))
    code = execute(
        spec_path,
        out,
        resume=resume,
        run_name=run_name,
        mode="loopback" if loopback else "auto",
        report=not no_report,
        json_out=json_out,
        hosts=hosts,
    )
    raise typer.Exit(code)


def changed_spec(spec_path: Path, changes: dict):
    """The spec of `spec_path` with `changes` (dotted key -> value) applied before validation."""
    import tomllib

    from tierscope.spec import SpecError, spec_from_dict

    try:
        raw = tomllib.loads(spec_path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise SpecError(f"{spec_path}: {err}") from err
    for dotted, value in changes.items():
        node = raw
        *path, last = dotted.split(".")
        for key in path:
            node = node.setdefault(key, {})
        node[last] = value
    return spec_from_dict(raw, where=str(spec_path), name=raw.get("name", spec_path.stem))


def execute(
    spec_path: Path,
    out: Path,
    *,
    resume: bool = False,
    run_name: str | None = None,
    mode: str = "auto",
    report: bool = True,
    json_out: str | None = None,
    changes: dict | None = None,
    hosts: Path | None = None,
) -> int:
    """Load the spec, run it with the live display, print the outcome; returns the exit status.
    `changes` (dotted key -> value) replace keys of the spec file before it is validated; `hosts`
    (an inventory) runs it on real hosts (tierscope.remote)."""
    from tierscope.cli import _output
    from tierscope.cli._live import LiveDisplay
    from tierscope.runner import Progress, run_experiment
    from tierscope.spec import SpecError, load_spec

    console = Console(stderr=json_out == "-")
    try:
        spec = load_spec(spec_path) if not changes else changed_spec(spec_path, changes)
        if json_out not in (None, "-"):
            _output.check_output_file(Path(json_out), "--json")
    except (SpecError, ValueError, OSError) as err:
        Console(stderr=True).print(f"[red]error:[/red] {escape(str(err))}", highlight=False, soft_wrap=True)
        return _output.BAD_INPUT
    progress = Progress()
    if hosts is None:  # labs a killed run left on this machine: named (one line each) and removed
        from tierscope.runner import remove_orphaned_labs

        remove_orphaned_labs(lambda line: Console(stderr=True).print(line, markup=False, highlight=False))
    # Ctrl-C raises KeyboardInterrupt here; the runner stops the current point's generator, tears
    # the point down, drops its unfinished directory and returns with `interrupted` set.
    with LiveDisplay(progress, enabled=sys.stdout.isatty() and json_out != "-"):
        if hosts is not None:
            from tierscope.remote import RemoteError
            from tierscope.remote.run import run_remote

            try:
                result = run_remote(
                    spec, out, hosts, resume=resume, run_name=run_name, progress=progress, report=report
                )
            except RemoteError as err:
                Console(stderr=True).print(f"[red]error:[/red] {escape(str(err))}", highlight=False, soft_wrap=True)
                return _output.BAD_INPUT
        else:
            result = run_experiment(
                spec, out, resume=resume, mode=mode, run_name=run_name, progress=progress, report=report
            )
    console.print(f"run directory: {result.dir}", markup=False)
    console.print(f"points: {len(result.done)} done, {len(result.failed)} failed, {len(result.skipped)} skipped")
    for pid, reason in result.failed:
        console.print(f"  [red]failed[/red] {escape(pid)}: {escape(str(reason))}", highlight=False, soft_wrap=True)
    if result.interrupted:
        console.print("[yellow]interrupted[/yellow]: finished points are kept; continue with --resume")
        return 130
    if result.report is not None:
        from tierscope.report import configuration_table, print_summary

        print_summary(result.summary, console)
        configurations = configuration_table(result.data) if result.data is not None else None
        if configurations is not None:
            console.print(configurations)
        console.print(f"report: {result.report}", markup=False)
    if json_out is not None:
        doc = _output.verdict_document(result.data, result.summary) if result.summary is not None else {}
        doc["run"] = {
            "dir": str(result.dir),
            "done": result.done,
            "skipped": result.skipped,
            "failed": [{"point": p, "reason": r} for p, r in result.failed],
            "report": str(result.report) if result.report else None,
        }
        where = _output.write_document(doc, json_out)
        if where != "stdout":
            console.print(f"wrote {where}", markup=False)
    return 0 if not result.failed else 1


def register(app: typer.Typer) -> None:
    app.command("run")(run)
