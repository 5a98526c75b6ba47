"""`tierscope oltp`: database benchmarks (YCSB, TPC-C) driven by the native engine."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

oltp_app = typer.Typer(
    name="oltp",
    help="Database benchmarks run by the native engine, talking to the database directly "
    "(no web or app tier): the YCSB core workloads A-F and TPC-C.\n\n"
    "Without --dsn a PostgreSQL or MariaDB server of its own is started on loopback for the run "
    "(--dbms), loaded, driven and stopped; its data directory is temporary unless --workdir is given. "
    "With --dsn the given database is used: a libpq string such as "
    "'host=127.0.0.1 port=5432 user=postgres dbname=bench' or 'mysql://user:password@host:3306/bench'.\n\n"
    "Examples:\n\n"
    "  tierscope oltp ycsb --dbms postgresql --workload c --records 100000 --threads 4 --duration 30\n\n"
    "  tierscope oltp ycsb --dsn 'mysql://tierscope:tierscope@127.0.0.1:3306/bench' --workload a --target 2000\n\n"
    "  tierscope oltp tpcc --dbms mariadb --warehouses 2 --no-waits --duration 60\n\n"
    "The engine itself: tierscope-engine ycsb --help, tierscope-engine tpcc --help; docs/oltp.md.",
    no_args_is_help=True,
)

_DBMS_HELP = "Server to start for the run when no --dsn: postgresql or mariadb."
_DSN_HELP = "Use this database instead of starting one (libpq string or mysql:// URL)."


def _database(console: Console, dbms: str, dsn: str | None, workdir: Path | None):
    """A context manager yielding the DSN: the given one, or a started server's."""
    import contextlib

    from tierscope.oltp import DBMS, started_database

    if dsn:
        return contextlib.nullcontext(dsn)
    if dbms not in DBMS:
        console.print(f"[red]error:[/red] --dbms: expected one of {', '.join(DBMS)}, got {escape(repr(dbms))}")
        raise typer.Exit(2)

    @contextlib.contextmanager
    def started():
        console.print(f"starting {dbms} ...", style="dim", markup=False)
        with started_database(dbms, workdir) as (_svc, the_dsn):
            yield the_dsn

    return started()


def _ops_table(title: str, ops: dict, extra: tuple[str, ...] = ()) -> Table:
    t = Table(title=title)
    for col in ("operation", "count", "errors", "p50 µs", "p90 µs", "p99 µs", "max µs", *extra):
        t.add_column(col, justify="left" if col == "operation" else "right")
    for name, o in ops.items():
        row = [
            name,
            str(o["count"]),
            str(o["errors"]),
            str(o["p50_us"]),
            str(o["p90_us"]),
            str(o["p99_us"]),
            str(o["max_us"]),
        ]
        if "p90 rule" in extra:
            row.append(f"{o.get('p90_rule', '')} (≤ {o.get('p90_limit_s', '')} s)")
        t.add_row(*row)
    return t


@oltp_app.command("ycsb")
def ycsb(
    workload: str = typer.Option(
        "a",
        "--workload",
        "-w",
        help="YCSB core workload: a (50 % read / 50 % update), "
        "b (95/5), c (100 % read), d (95 % read latest / 5 % insert), e (95 % short scans / "
        "5 % insert), f (50 % read / 50 % read-modify-write). Keys: scrambled Zipf θ=0.99 "
        "(d: latest).",
    ),
    dbms: str = typer.Option("postgresql", "--dbms", help=_DBMS_HELP),
    dsn: str | None = typer.Option(None, "--dsn", help=_DSN_HELP),
    records: int = typer.Option(10_000, "--records", min=1, help="Rows to load (≈1 KB each with the default fields)."),
    field_length: int = typer.Option(100, "--field-length", min=1, help="Characters per field (10 fields)."),
    threads: int = typer.Option(4, "--threads", min=1, help="Client threads, one connection each."),
    target: float | None = typer.Option(
        None,
        "--target",
        help="Total ops/s to offer (default: as fast as "
        "possible). Latency is then measured from each operation's intended "
        "start, so a stalled server shows up as latency (coordinated omission "
        "corrected).",
    ),
    duration: float = typer.Option(30.0, "--duration", min=0.1, help="Seconds to run."),
    ops: int | None = typer.Option(None, "--ops", min=1, help="Stop after this many operations (or the duration)."),
    warmup: float | None = typer.Option(None, "--warmup", help="Seconds at the start not counted."),
    distribution: str | None = typer.Option(
        None, "--distribution", help="Override the key distribution: zipfian, latest or uniform."
    ),
    no_load: bool = typer.Option(False, "--no-load", help="Do not (re)load the table (it must exist, with --dsn)."),
    log: Path | None = typer.Option(None, "--log", help="Write one row per operation to this Parquet file."),
    workdir: Path | None = typer.Option(
        None, "--workdir", help="Data directory of a started server (default: temporary)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the engine's summaries as JSON lines."),
) -> None:
    """Load a YCSB usertable and run one core workload; print ops/s and per-operation latencies.

    Example: tierscope oltp ycsb --dbms mariadb --workload b --records 50000 --threads 8 --duration 20
    """
    from tierscope.oltp import OltpError, check_ycsb, ycsb_load, ycsb_run

    console = Console()
    try:  # before a server starts and the data are loaded (the engine would refuse only then)
        check_ycsb(workload, distribution)
    except ValueError as err:
        Console(stderr=True).print(f"[red]error:[/red] {escape(str(err))}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from err
    try:
        with _database(console, dbms, dsn, workdir) as the_dsn:
            if not no_load:
                loaded = ycsb_load(the_dsn, records=records, field_length=field_length)
                if json_out:
                    print(json.dumps(loaded))
                else:
                    console.print(f"loaded {loaded['records']} records in {loaded['seconds']} s")
            s = ycsb_run(
                the_dsn,
                workload=workload,
                threads=threads,
                duration=duration,
                ops=ops,
                target=target,
                warmup=warmup,
                distribution=distribution,
                field_length=field_length,
                log=log,
            )
    except OltpError as err:
        console.print(f"[red]error:[/red] {escape(str(err))}", highlight=False, soft_wrap=True)
        raise typer.Exit(err.code or 1) from err
    if json_out:
        print(json.dumps(s))
        return
    console.print(
        _ops_table(
            f"YCSB {s['workload'].upper()} on {s['dbms']} ({s['distribution']} keys, "
            f"{s['threads']} threads, latency from {'intended' if s['latency_from'] == 'intended' else 'actual'} start)",
            s["operations"],
        )
    )
    console.print(
        f"{s['ops']} ops in {s['seconds']} s = [bold]{s['ops_per_s']} ops/s[/bold], {s['errors']} errors; "
        f"driver CPU {s['cpu_s']} s ({s['ops_per_cpu_s']} ops per CPU-second)"
    )


@oltp_app.command("tpcc")
def tpcc(
    dbms: str = typer.Option("postgresql", "--dbms", help=_DBMS_HELP),
    dsn: str | None = typer.Option(None, "--dsn", help=_DSN_HELP),
    warehouses: int = typer.Option(1, "--warehouses", "-W", min=1, help="Warehouses to load (≈100 MB each)."),
    terminals: int | None = typer.Option(
        None, "--terminals", min=1, help="Terminals (default 10 per warehouse, each bound to a warehouse and district)."
    ),
    no_waits: bool = typer.Option(
        False,
        "--no-waits",
        help="Drop keying and think times (BenchBase's default): "
        "measures the database at saturation; the run is then 'TPC-C-like'. With the spec's "
        "waits one warehouse gives at most 12.86 tpmC.",
    ),
    terminal_offset: int = typer.Option(
        0,
        "--terminal-offset",
        min=0,
        help="Bind the terminals as terminals K.. of one numbering: several drivers sharing the "
        "warehouses (one per host or per node) each take the number of terminals started before them, "
        "so no two terminals share a warehouse and district.",
    ),
    duration: float = typer.Option(60.0, "--duration", min=0.1, help="Seconds to run."),
    warmup: float | None = typer.Option(None, "--warmup", help="Seconds at the start not counted."),
    no_load: bool = typer.Option(False, "--no-load", help="Do not (re)load the tables (they must exist, with --dsn)."),
    log: Path | None = typer.Option(None, "--log", help="Write one row per transaction to this Parquet file."),
    workdir: Path | None = typer.Option(
        None, "--workdir", help="Data directory of a started server (default: temporary)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the engine's summaries as JSON lines."),
) -> None:
    """Load TPC-C and run the 45/43/4/4/4 mix; print tpmC and the 90th-percentile rules per transaction.

    Example: tierscope oltp tpcc --dbms postgresql --warehouses 1 --no-waits --duration 30
    """
    from tierscope.oltp import OltpError, tpcc_load, tpcc_run

    console = Console()
    try:
        with _database(console, dbms, dsn, workdir) as the_dsn:
            if not no_load:
                loaded = tpcc_load(the_dsn, warehouses=warehouses)
                if json_out:
                    print(json.dumps(loaded))
                else:
                    console.print(
                        f"loaded {warehouses} warehouse(s), {loaded['total_rows']} rows in {loaded['seconds']} s"
                    )
            s = tpcc_run(
                the_dsn,
                duration=duration,
                terminals=terminals,
                terminal_offset=terminal_offset or None,
                no_waits=no_waits,
                warmup=warmup,
                log=log,
            )
    except OltpError as err:
        console.print(f"[red]error:[/red] {escape(str(err))}", highlight=False, soft_wrap=True)
        raise typer.Exit(err.code or 1) from err
    if json_out:
        print(json.dumps(s))
        return
    console.print(
        _ops_table(
            f"TPC-C on {s['dbms']}: {s['warehouses']} warehouse(s), {s['terminals']} terminals, "
            f"waits {'on' if s['waits'] else 'off'}",
            s["transactions"],
            ("p90 rule",),
        )
    )
    like = " (TPC-C-like: waits shortened or off)" if s["tpcc_like"] else ""
    console.print(
        f"[bold]tpmC {s['tpmC']}[/bold]{like}; {s['tpm_total']} transactions/min; "
        f"New-Orders {s['new_orders']['committed']} committed + {s['new_orders']['rolled_back']} rolled back; "
        f"{s['errors']} errors; p90 rules {'passed' if s['p90_rules_passed'] else 'FAILED'}"
    )


_SCALE_HELP = (
    "Seed 002's scaling experiment: the same workloads against 1, 2, 3 ... database nodes; throughput, throughput "
    "per node, and each node's own count of work read from the server.\n\n"
    "For every target and node count the servers start on loopback (ports of their own) from a copy of data loaded "
    "once per target; every workload runs; all is stopped and removed before the next size. galera: N MariaDB nodes "
    "in one Galera cluster, one driver process per node. middleware: the RAIDb-1 middleware in front of N PostgreSQL "
    "replicas, one driver process through it.\n\n"
    "The last column is each node's counters over the workload, served / rows written: for Galera Com_stmt_execute "
    "(statements run for the node's own clients) / Handler_write+Handler_update+Handler_delete (rows written, the "
    "write sets applied for the other nodes included); for PostgreSQL xact_commit / "
    "tup_inserted+tup_updated+tup_deleted. 'per node' throughput is the total divided by N (seed 002's figure); the "
    "counters show where the work really went.\n\n"
    "On one machine all nodes share the same CPUs: adding nodes adds no capacity, so the table shows what each design "
    "costs per node, not seed 002's scale-out. Needs root, MariaDB with galera-4, PostgreSQL 15. The shipped preset "
    "takes about 8 minutes here. Preset format and measured figures: docs/oltp.md, 'Scaling (seed 002)'.\n\n"
    "Examples:\n\n"
    "  tierscope oltp scale -o out   (the same as tierscope run oltp-scaling -o out)\n\n"
    "  tierscope oltp scale --target galera --workload ycsb-a --workload ycsb-b --nodes 1,3 --duration 10"
)


@oltp_app.command("scale", help=_SCALE_HELP)
def scale(
    preset: Path | None = typer.Argument(
        None,
        help="A scaling preset (TOML); default: the shipped "
        "presets/oltp-scaling.toml (Galera and the middleware, 1/2/3 nodes, "
        "YCSB B and A, TPC-C).",
    ),
    out: Path = typer.Option(
        Path("results"),
        "--out",
        "-o",
        help="Results directory: OUT/<run>/ gets results.json, "
        "results.parquet (one row per target x nodes x workload), nodes.parquet (one row "
        "per node: its own counters), study.json (the study document) and report.html.",
    ),
    run_name: str | None = typer.Option(None, "--name", help="Run name (default: the preset's name)."),
    target: list[str] | None = typer.Option(
        None, "--target", help="Only these targets of the preset (galera, middleware); repeatable."
    ),
    nodes: str | None = typer.Option(None, "--nodes", help="Override the node counts, e.g. 1,3."),
    workload: list[str] | None = typer.Option(
        None,
        "--workload",
        "-w",
        help="Only these workloads of the preset (ycsb-a, ycsb-b, ycsb-c, ycsb-f, tpcc); repeatable.",
    ),
    duration: float | None = typer.Option(None, "--duration", help="Override the seconds per workload."),
    workdir: Path | None = typer.Option(
        None,
        "--workdir",
        help="Where the temporary data directories go (default: the system's temporary directory); removed at the end.",
    ),
    json_out: str | None = typer.Option(
        None, "--json", metavar="FILE", help="Also write the study document to FILE ('-' for stdout)."
    ),
) -> None:
    raise typer.Exit(
        run_scaling_study(
            preset,
            out,
            run_name=run_name,
            json_out=json_out,
            target=target,
            nodes=nodes,
            workload=workload,
            duration=duration,
            workdir=workdir,
        )
    )


def run_scaling_study(
    preset: Path | None,
    out: Path,
    *,
    run_name: str | None = None,
    json_out: str | None = None,
    target: list[str] | None = None,
    nodes: str | None = None,
    workload: list[str] | None = None,
    duration: float | None = None,
    workdir: Path | None = None,
) -> int:
    """Run a scaling preset (`tierscope oltp scale`, `tierscope run oltp-scaling`): the table, the
    finding in words; OUT/<run>/ gets the tables, study.json (the study document,
    `tierscope.studies.document`) and report.html (<run>: `run_name`, default the preset's name).
    Returns the exit status."""
    from rich.table import Table as RichTable

    from tierscope.analysis.study import scaling_finding
    from tierscope.cli import _output
    from tierscope.report.html import write_study_page  # plotly: loaded when a study runs, not for --help
    from tierscope.studies import study_of
    from tierscope.studies.document import FILE_NAME, study_document
    from tierscope.studies.scaling import DEFAULT_PRESET, load_preset, run_scaling, table_rows

    # a piped table keeps its columns; with --json - the terminal output goes to stderr
    console = Console(stderr=json_out == "-") if Console().is_terminal else Console(width=200, stderr=json_out == "-")
    path = Path(preset) if preset else DEFAULT_PRESET
    try:
        p = load_preset(preset)
        if target:
            p.targets = [t for t in p.targets if t in target] or list(target)
        if workload:
            p.workloads = [w.lower() for w in workload]
        if nodes:
            p.nodes = [int(x) for x in nodes.split(",") if x.strip()]
        if duration is not None:
            p.duration = duration
            p.warmup = min(p.warmup, duration / 4)
        problems = p.problems()
        if problems:
            raise ValueError("; ".join(problems))
        if json_out not in (None, "-"):
            _output.check_output_file(Path(json_out), "--json")
    except (ValueError, OSError) as err:
        console.print(f"[red]error:[/red] {escape(str(err))}", highlight=False, soft_wrap=True)
        return _output.BAD_INPUT
    import os

    if os.geteuid() != 0:
        console.print("[red]error:[/red] the database servers run as their own OS users (mysql, postgres): run as root")
        return _output.BAD_INPUT
    run_dir = out / (run_name or path.stem)
    try:
        rows = run_scaling(p, out=run_dir, say=lambda m: console.print(m, style="dim", markup=False), workdir=workdir)
    except KeyboardInterrupt:
        Console(stderr=True).print("[yellow]interrupted[/yellow]: servers are stopped and their data removed")
        return 130
    except Exception as err:  # a server that would not start, an engine that failed
        console.print(f"[red]error:[/red] {escape(str(err))}", highlight=False, soft_wrap=True)
        return _output.FAILED
    title = (
        f"{p.name}: {p.duration:g} s per workload ({p.warmup:g} s warm-up), "
        f"{p.threads_per_node} YCSB threads / {p.terminals_per_node} TPC-C terminals per node"
    )
    heads = ["target", "nodes", "workload", "throughput", "per node", "p90 ms", "errors"]
    heads.append("per node measured: served / rows written")
    cells = [list(c) for c in table_rows(rows)]
    t = RichTable(title=title)
    for col in heads:
        t.add_column(col, justify="left" if col in ("target", "workload") or col.startswith("per node m") else "right")
    for row in cells:
        t.add_row(*row)
    console.print(t)
    found = scaling_finding(rows)
    console.print(f"[bold]Finding:[/bold] {escape(found.line())}", highlight=False, soft_wrap=True)
    report = write_study_page(run_dir / "report.html", title, found, [("Throughput per node", heads, cells)])
    study = study_of(path)
    doc = study_document(
        name=study.name if study else path.stem,
        kind="oltp-scaling",
        preset=path,
        seed=study.seed if study else None,
        finding=found,
        run_dir=run_dir,
        done=[f"{r['target']}-{r['nodes']}-{r['workload']}" for r in rows],
        report=report,
        body={"rows": [{k: v for k, v in r.items() if k != "summaries"} for r in rows]},
    )
    _output.write_document(doc, str(run_dir / FILE_NAME))
    console.print(f"tables: {run_dir} (results.parquet, nodes.parquet, results.json); report: {report}", markup=False)
    if json_out is not None:
        where = _output.write_document(doc, json_out)
        if where != "stdout":
            console.print(f"wrote {where}", markup=False)
    return _output.OK


def register(app: typer.Typer) -> None:
    app.add_typer(oltp_app, name="oltp")
