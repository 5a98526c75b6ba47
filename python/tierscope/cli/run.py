"""`tierscope run SPEC`: run every point of an experiment spec, then analyse and report."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

# the catalog of shipped studies lives in tierscope.studies (the runner reads it too, to put the
# finding in the report); its names stay importable from here
from tierscope.studies import KINDS as KINDS
from tierscope.studies import Study as Study
from tierscope.studies import finding_of as finding_of
from tierscope.studies import finding_of_run as finding_of_run
from tierscope.studies import presets_dir as presets_dir
from tierscope.studies import studies as studies
from tierscope.studies import study_of as study_of
from tierscope.studies.document import FILE_NAME, study_document


def study_lines() -> list[str]:
    """`run --list`: one line per study: name, seed, finding, minutes."""
    rows = studies()
    width = max(len(s.name) for s in rows)
    seed_width = max(len(s.seed) for s in rows) + 5
    return [f"{s.name:<{width}}  {'seed ' + s.seed:<{seed_width}}  {s.finding}  (~{s.minutes:g} min)" for s in rows]


def _names() -> str:
    try:
        return ", ".join(s.name for s in studies())
    except (OSError, ValueError, tomllib.TOMLDecodeError):
        return "see tierscope run --list"


_STUDY_NAMES = _names()  # for --help


def kind_of(path: Path) -> str:
    """How the file at `path` is run: its study's kind when it is a shipped preset, else read from
    its keys (a log-service file has [service] or [load], a scaling file has targets); "spec"
    otherwise, also when it cannot be read (the spec loader then says why)."""
    try:
        for s in studies():
            if s.path.resolve() == path.resolve():
                return s.kind
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return "spec"
    if "workload" not in raw and ({"service", "load", "modes"} & set(raw)):
        return "logservice"
    if "workload" not in raw and "targets" in raw and "nodes" in raw:
        return "oltp-scaling"
    return "spec"


def run(
    spec_path: Path | None = typer.Argument(
        None,
        metavar="SPEC",
        help="Experiment spec (TOML; see docs/spec.md), or the name of a shipped study "
        f"(tierscope run --list): {_STUDY_NAMES}.",
        show_default=False,
    ),
    list_studies: bool = typer.Option(
        False, "--list", help="Print every shipped study, one a line: name, seed, finding, minutes; then exit."
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

    A shipped study is run by the runner its kind names (`tierscope run --list`): `ingest` (seed
    003's log service; `tierscope ingest` is the same with overrides), its verdict the finding
    across its modes ("direct loses 99.2 % of the records with db1's CPU saturated; queue and
    durable lose none"); `oltp-scaling` (`tierscope oltp scale` with overrides). Every study leaves
    the same layout: OUT/<run>/<point>/ (a mode for the log service), OUT/<run>/report.html and
    OUT/<run>/study.json, the document --json writes (docs/spec.md, "The study document").

    Exit status: 0 all points done, 1 a point failed, 2 bad spec or output, 130 interrupted.

    Example: [bold]tierscope run examples/specs/tiny.toml -o results[/bold]   or
    [bold]tierscope run tpcw-memory[/bold] (seed 004's memory study, about 20 minutes)   or
    [bold]tierscope run --list[/bold]   or, on machines reached over SSH:
    [bold]tierscope run examples/specs/tiny.toml --hosts inventory.yml[/bold]
    """
    err = Console(stderr=True)
    if list_studies:
        for line in study_lines():
            print(line)
        raise typer.Exit(0)
    if spec_path is None:
        err.print("[red]error:[/red] missing SPEC: a spec file or the name of a shipped study", highlight=False)
        for line in study_lines():
            err.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(2)
    if not spec_path.exists() and not spec_path.suffix and len(spec_path.parts) == 1:
        from tierscope.cli.demo import preset

        named = {s.name: s.path for s in studies()}
        try:
            spec_path = named.get(str(spec_path)) or preset(str(spec_path))
        except FileNotFoundError:
            err.print(
                f"[red]error:[/red] {escape(str(spec_path))}: no such file, nor a shipped study; the studies "
                "(tierscope run NAME):",
                highlight=False,
                soft_wrap=True,
            )
            for line in study_lines():
                err.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
    kind = kind_of(spec_path)
    if kind != "spec":
        raise typer.Exit(
            _run_other(
                kind,
                spec_path,
                out,
                loopback=loopback,
                json_out=json_out,
                run_name=run_name,
                resume=resume,
                hosts=hosts,
            )
        )
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


def _run_other(
    kind: str,
    path: Path,
    out: Path,
    *,
    loopback: bool,
    json_out: str | None,
    run_name: str | None,
    resume: bool,
    hosts: Path | None,
) -> int:
    """Run a study that is not a spec with its own runner; options it has no use for are refused."""
    from tierscope.cli import _output

    unused = [flag for flag, given in (("--resume", resume), ("--hosts", hosts is not None)) if given]
    if kind == "oltp-scaling" and loopback:
        unused.append("--loopback")
    if unused:
        what = "seed 003's log service" if kind == "logservice" else "the OLTP scaling study"
        Console(stderr=True).print(
            f"[red]error:[/red] {' and '.join(unused)}: not for {what} ({path.name}), which runs on this machine "
            "in one go",
            highlight=False,
            soft_wrap=True,
        )
        return _output.BAD_INPUT
    if kind == "logservice":
        from tierscope.cli.ingest import run_study

        return run_study(path, out, loopback=loopback, json_out=json_out, run_name=run_name)
    from tierscope.cli.oltp import run_scaling_study

    return run_scaling_study(path, out, run_name=run_name, json_out=json_out)


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
    finding = None
    if result.report is not None:
        from tierscope.report import configuration_table, print_summary

        print_summary(result.summary, console)
        configurations = configuration_table(result.data) if result.data is not None else None
        if configurations is not None:
            console.print(configurations)
        console.print(f"report: {result.report}", markup=False)
    if result.data is not None:
        finding = finding_of(result.data, spec_path)
        console.print(f"[bold]Finding:[/bold] {escape(finding.line())}", highlight=False, soft_wrap=True)
    study = study_of(spec_path)
    doc = study_document(
        name=study.name if study else spec.name,
        kind="spec",
        preset=spec_path,
        seed=study.seed if study else None,
        finding=finding,
        run_dir=result.dir,
        done=result.done,
        skipped=result.skipped,
        failed=result.failed,
        report=result.report,
        body=_output.verdict_document(result.data, result.summary) if result.summary is not None else {},
    )
    _output.write_document(doc, str(result.dir / FILE_NAME))
    if json_out is not None:
        where = _output.write_document(doc, json_out)
        if where != "stdout":
            console.print(f"wrote {where}", markup=False)
    return 0 if not result.failed else 1


def register(app: typer.Typer) -> None:
    app.command("run")(run)
