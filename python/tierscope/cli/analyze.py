"""`tierscope analyze`: import traces or logs of any N-tier system and find the bottleneck."""

from __future__ import annotations

import os
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from tierscope.cli import _output
from tierscope.contracts import DEFAULT_WINDOW_NS, MIN_WINDOW_NS

#: the smallest window (contracts.MIN_WINDOW_NS), in ms
MIN_WINDOW_MS = MIN_WINDOW_NS / 1e6

# The options `analyze` and `report` share, one definition each.
#: the window of the fine-grained analysis, in ms (`window_ns_of` checks it)
WINDOW_MS_OPTION = typer.Option(
    DEFAULT_WINDOW_NS / 1e6,
    "--window-ms",
    help=f"Window of the fine-grained analysis, in ms (at least {MIN_WINDOW_MS:g}).",
)
#: the format of the trace files, when not detected
FORMAT_OPTION = typer.Option(
    None,
    "--format",
    "-f",
    help="Read every trace file as this format instead of detecting it: otlp, jaeger, zipkin, nginx, apache, parquet.",
)
#: the verdict as JSON
JSON_OPTION = typer.Option(
    None,
    "--json",
    help="Write the verdict, saturated shares, N* and the per-level table as JSON to this file ('-' for stdout).",
)
#: how the verdict was reached
VERBOSE_OPTION = typer.Option(False, "--verbose", "-v", help="Also print how the verdict was reached.")


def print_notes(notes: list[str], console: Console, verbose: bool) -> None:
    """The analysis' notes with --verbose; else how many there are."""
    if verbose:
        for note in notes:
            console.print(f"[dim]note: {escape(note)}[/dim]")
    elif notes:
        console.print(f"[dim]{len(notes)} note(s): --verbose shows them[/dim]")


def window_ns_of(window_ms: float) -> int:
    """--window-ms in ns; ValueError below the smallest window."""
    if window_ms < MIN_WINDOW_MS:
        raise ValueError(
            f"--window-ms {window_ms:g}: at least {MIN_WINDOW_MS:g} ms (a shorter window holds a fraction of one "
            f"request's service)"
        )
    return int(round(window_ms * 1e6))


#: bytes per (server, window) cell of the fine-grained series, all columns and passes together
CELL_BYTES = 200
#: pcap and pcapng magic numbers
PCAP_MAGIC = (b"\xa1\xb2\xc3\xd4", b"\xd4\xc3\xb2\xa1", b"\xa1\xb2\x3c\x4d", b"\x4d\x3c\xb2\xa1", b"\x0a\x0d\x0d\x0a")

EPILOG = (
    "Exit status: 0 a verdict with medium or high confidence (with --engine duckdb or spark: the "
    "window series was written); 3 a verdict with low confidence; 4 not enough data for a verdict; "
    "2 bad input (a file, an option, an output path, or the engine is not installed); 1 a failure."
)

#: Where the window analysis runs (--engine); the first is the default.
ENGINES = ("numpy", "duckdb", "spark")
#: Options that only the whole (numpy) analysis uses.
WHOLE_ANALYSIS_ONLY = ("--report", "--json", "--format", "--log-format", "--tier")


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
            raise ValueError(
                f"{path}: a packet capture (pcap); trace it first: tierscope trace {path} -o requests.parquet, "
                f"then: tierscope analyze requests.parquet"
            )


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


def _engine_sources(files: list[str], engine: str) -> list[str]:
    """The requests Parquet inputs of --engine duckdb/spark, checked; ValueError naming the file.

    A local file must be a requests table; a directory holding requests.parquet (a point or an
    `analyze -o` directory) means that file, any other directory its Parquet files (Spark writes
    tables as directories); for Spark, a URL with a scheme (hdfs://, s3a://) is passed on as is.
    """
    import pyarrow.parquet as pq

    out = []
    for name in files:
        if "://" in name:
            if engine != "spark":
                raise ValueError(f"{name}: URLs are read by --engine spark only")
            out.append(name)
            continue
        path = Path(name)
        if not path.exists():
            raise FileNotFoundError(f"no such file or directory: {name}")
        if path.is_dir():
            if (path / "requests.parquet").is_file():
                path = path / "requests.parquet"
            else:
                out.append(str(path) if engine == "spark" else str(path / "*.parquet"))
                continue
        _refuse_pcap(path)
        try:
            columns = set(pq.read_schema(path).names)
        except Exception:
            columns = set()
        if "arrival_ns" not in columns:
            raise ValueError(
                f"{path}: not a tierscope requests table (Parquet with arrival_ns); --engine {engine} "
                f"reads only those: import other formats first with `tierscope analyze {path} -o DIR`, "
                f"then `tierscope analyze DIR/requests.parquet --engine {engine}`"
            )
        out.append(str(path))
    return out


def _series_summary(series, window_ns: int) -> list[dict]:
    """Per server, over the trace's window axis (first to last window of any server): requests
    completed, mean and peak window load, mean exclusive load, mean throughput (/s)."""
    import numpy as np

    if series.num_rows == 0:
        return []
    starts = np.asarray(series.column("window_start_ns"), np.int64)
    n_windows = int((starts.max() - starts.min()) // window_ns) + 1
    seconds = n_windows * window_ns / 1e9
    tier = series.column("tier").to_pylist()
    server = series.column("server").to_pylist()
    load = np.asarray(series.column("load"), np.float64)
    excl = np.asarray(series.column("load_exclusive"), np.float64) if "load_exclusive" in series.column_names else None
    thr = np.asarray(series.column("throughput"), np.float64)
    rows: dict[tuple[str, str], list[int]] = {}
    for i, key in enumerate(zip(tier, server)):
        rows.setdefault(key, []).append(i)
    out = []
    for (t, s), idx in rows.items():
        done = float(thr[idx].sum()) * window_ns / 1e9
        out.append(
            {
                "tier": t,
                "server": s,
                "requests": round(done),
                "load_mean": float(load[idx].sum()) / n_windows,
                "load_peak": float(load[idx].max()),
                "load_exclusive_mean": None if excl is None else float(excl[idx].sum()) / n_windows,
                "throughput": done / seconds,
            }
        )
    return out


def _analyze_windows(
    files: list[str], engine: str, master: str | None, window_ns: int, output: Path, console: Console, fail
) -> None:
    """--engine duckdb|spark: the per-window series of requests tables too big for memory."""
    import pyarrow.parquet as pq
    from rich.table import Table

    from tierscope.analysis.windows import SharedRequestIds, window_series_sql

    try:
        _output.check_output_dir(output, "-o")
        sources = _engine_sources(files, engine)
    except (ValueError, OSError) as e:
        fail(_output.printable(str(e)))
    session = None
    if engine == "spark":
        from tierscope.analysis import spark_windows

        # the option, else the environment variable (either is named in messages), else local[2]
        named = ""
        if master:
            named = "--spark-master "
        elif os.environ.get(spark_windows.MASTER_ENV):
            named = f"${spark_windows.MASTER_ENV}="
        master = spark_windows.resolve_master(master)
        try:
            spark_windows.check_spark()
            spark_windows.check_master(master)
        except spark_windows.EngineUnavailable as e:
            fail(f"{named}{e}" if str(e).startswith(master) else str(e))
        where = f"spark ({master})"
    else:
        where = "duckdb"
    console.print(f"window series of {', '.join(sources)} on {where}", markup=False, highlight=False, soft_wrap=True)
    if engine == "spark":
        # the JVM's log and stack traces go to a file; what went wrong is said in one line
        log = output / "spark.log"
        try:
            session = spark_windows.spark_session(master, log=log)
        except spark_windows.EngineUnavailable as e:
            fail(str(e))
        except Exception as e:  # Spark's own refusal (a master it cannot parse, a cluster that says no)
            why = _output.printable(spark_windows.error_line(e, log))
            fail(f"{named}{master}: Spark did not start: {why} (its log: {log})")

        def run(exclusive: bool):
            return spark_windows.window_series_spark(sources, window_ns, exclusive=exclusive, spark=session)
    else:

        def run(exclusive: bool):
            return window_series_sql(sources, window_ns, exclusive=exclusive)

    note = None
    try:
        try:
            series = run(True)
        except SharedRequestIds as e:
            note = f"no exclusive load: {e}"
            series = run(False)
    except (ValueError, OSError) as e:
        fail(_output.printable(str(e)))
    except Exception as e:  # the engine's own errors (a Spark AnalysisException for a bad path, ...)
        if type(e).__name__ == "AnalysisException":
            fail(_output.printable(str(e).splitlines()[0] if str(e) else type(e).__name__))
        if session is None or not type(e).__module__.startswith(("py4j", "pyspark")):
            raise
        from rich.markup import escape

        Console(stderr=True).print(
            f"[red]error:[/red] Spark failed: {escape(_output.printable(spark_windows.error_line(e, output / 'spark.log')))} "
            f"(its log: {escape(str(output / 'spark.log'))})",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(_output.FAILED) from e
    finally:
        if session is not None:
            session.stop()
    if note:
        from rich.markup import escape

        console.print(f"[yellow]note:[/yellow] {escape(note)}", highlight=False)
    summary = _series_summary(series, window_ns)
    if not summary:
        console.print("no requests in the input")
        raise typer.Exit(_output.NOT_ENOUGH_DATA)
    table = Table(
        title=f"per server, {window_ns / 1e6:g} ms windows",
        caption="load, excl. load: mean over the "
        "trace; peak: the largest window's load; excl.: without the time waiting on downstream calls",
    )
    for name in ("tier", "server", "requests", "load", "peak", "excl. load", "req/s"):
        table.add_column(name, justify="left" if name in ("tier", "server") else "right")
    for r in summary:
        excl = "—" if r["load_exclusive_mean"] is None else f"{r['load_exclusive_mean']:.2f}"
        table.add_row(
            r["tier"],
            r["server"],
            f"{r['requests']:,}",
            f"{r['load_mean']:.2f}",
            f"{r['load_peak']:.2f}",
            excl,
            f"{r['throughput']:,.1f}",
        )
    console.print(table)
    try:
        path = output / "windows.parquet"
        pq.write_table(series, path)
    except OSError as e:
        fail(f"writing the results: {e.strerror or e}" + (" (disk full)" if _output.no_space(e) else ""))
    console.print(
        f"wrote {path} ({series.num_rows:,} rows: tier, server, window_start_ns, load, "
        f"{'load_exclusive, ' if 'load_exclusive' in series.column_names else ''}throughput)"
    )
    raise typer.Exit(_output.OK)


def analyze(
    files: list[str] = typer.Argument(
        ...,
        help="Trace or log files: OTLP JSON, Jaeger, Zipkin, nginx/Apache "
        "access logs, tierscope Parquet tables (requests, and events or "
        "resources next to them), or one run/point directory. With "
        "--engine duckdb/spark: requests Parquet files or directories "
        "(spark also reads hdfs://, s3a://... URLs).",
    ),
    format: str | None = FORMAT_OPTION,
    window_ms: float = WINDOW_MS_OPTION,
    output: Path = typer.Option(
        Path("tierscope-analysis"),
        "-o",
        "--output",
        help="Directory for requests.parquet (and report.html with --report).",
    ),
    report: bool = typer.Option(False, "--report", help="Also write DIR/report.html."),
    json_out: str | None = JSON_OPTION,
    log_format: str | None = typer.Option(
        None,
        "--log-format",
        help="The nginx log_format or Apache LogFormat string of the access logs, when it is not the documented one.",
    ),
    tier: str | None = typer.Option(None, "--tier", help="Tier name for access-log rows (default: web)."),
    verbose: bool = VERBOSE_OPTION,
    engine: str = typer.Option(
        "numpy",
        "--engine",
        metavar="|".join(ENGINES),
        help="Where the window analysis runs. numpy (default): the whole analysis in "
        "memory: per-window load, N*, saturated windows, the verdict, the report. "
        "duckdb or spark: only the per-server window series (load, exclusive load, "
        "throughput) of requests tables too big for memory, from one SQL query both "
        "engines run; written to DIR/windows.parquet with a per-server summary. "
        "spark runs on --spark-master and needs pyspark (pip install "
        "'tierscope\\[spark]') and Java 17+.",
    ),
    spark_master: str | None = typer.Option(
        None,
        "--spark-master",
        metavar="URL",
        help="Spark master for --engine spark: local[N] (Spark inside this "
        "process on N cores), spark://host:7077, yarn, k8s://...; default "
        "$TIERSCOPE_SPARK_MASTER, else local[2]. A cluster's executors "
        "must be able to read the input paths.",
    ),
) -> None:
    """Import traces or access logs of any system and find its bottleneck.

    Runs the fine-grained analysis, prints the summary, and writes the requests table (and
    optionally the HTML report and a JSON document). Events and resources Parquet tables given
    next to the traces feed the pause detection and the white box.

    Example: [bold]tierscope analyze spans.jsonl access.log --window-ms 50 -o out --report --json -[/bold]

    Big traces: [bold]tierscope analyze requests.parquet --engine spark --spark-master local[2] -o out[/bold]
    """
    from tierscope import tables
    from tierscope.analysis.experiment import analyze_files, analyze_run
    from tierscope.analysis.summary import build_summary
    from tierscope.ingest import FormatError
    from tierscope.report import print_summary, write_report

    console = Console(stderr=json_out == "-")
    err = Console(stderr=True)

    def fail(message: str) -> None:
        from rich.markup import escape

        err.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
        raise typer.Exit(_output.BAD_INPUT)

    try:
        window_ns = window_ns_of(window_ms)
    except ValueError as e:
        fail(str(e))
    if engine not in ENGINES:
        fail(f"--engine {engine}: one of {', '.join(ENGINES)}")
    if spark_master is not None and engine != "spark":
        fail(f"--spark-master is for --engine spark (this is --engine {engine})")
    if engine != "numpy":
        given = [
            name
            for name, value in zip(WHOLE_ANALYSIS_ONLY, (report, json_out, format, log_format, tier))
            if value not in (None, False) and not (name == "--format" and value == "parquet")
        ]
        if given:
            fail(
                f"{', '.join(given)}: only with the whole analysis (--engine numpy); --engine {engine} writes "
                f"the window series only"
            )
        _analyze_windows(files, engine, spark_master, window_ns, output, console, fail)
    paths = [Path(f) for f in files]
    try:
        _output.check_output_dir(output, "-o")
        if json_out not in (None, "-"):
            _output.check_output_file(Path(json_out), "--json")
        missing = [str(p) for p in paths if not p.exists()]
        if missing:
            raise FileNotFoundError(f"no such file or directory: {', '.join(missing)}")
        dirs = [p for p in paths if p.is_dir()]
        if dirs and len(paths) > 1:
            raise ValueError("give one run or point directory, or files (not both)")
        for p in paths:
            _refuse_pcap(p)
        if dirs:
            data = analyze_run(dirs[0], window_ns=window_ns)
            requests = data.requests
        else:
            kinds = {p: _table_kind(p) for p in paths}
            side = {k: [p for p, v in kinds.items() if v == k] for k in ("events", "resources")}
            traces = [p for p, v in kinds.items() if v is None]
            if not traces:
                raise ValueError("no trace or requests file among the inputs (only events/resources tables)")
            import pyarrow as pa
            import pyarrow.parquet as pq

            extra = {
                k: pa.concat_tables([tables.conform(pq.read_table(p), k) for p in ps]) if ps else None
                for k, ps in side.items()
            }
            options = {k: v for k, v in (("log_format", log_format), ("tier", tier)) if v is not None}
            from tierscope.ingest import load

            imported = load(traces, format, **options)
            if imported.requests.num_rows:
                need, have = _memory_needed(imported.requests, window_ns), _available_memory()
                if have is not None and need > have // 2:
                    raise ValueError(
                        f"--window-ms {window_ms:g} over this trace needs about {need / 2**30:.1f} GiB, "
                        f"{have / 2**30:.1f} GiB available: use a larger window"
                    )
            data = analyze_files(
                traces,
                format=format,
                window_ns=window_ns,
                events=extra["events"],
                resources=extra["resources"],
                imported=imported,
                **options,
            )
            assert data.imported is not None  # analyze_files was given the import
            requests = data.imported.requests
            console.print(f"imported {data.imported.summary()}", markup=False)
    except (FormatError, ValueError, OSError) as e:
        fail(_output.printable(str(e)))
    summary = build_summary(data)
    print_summary(summary, console, verbose=verbose, data=data)
    print_notes(data.notes, console, verbose)
    try:
        if requests is not None and requests.num_rows:
            console.print(f"wrote {tables.write(requests, output / 'requests.parquet', 'requests')}", markup=False)
        if report:
            console.print(f"wrote {write_report(data, output / 'report.html', summary)}", markup=False)
        if json_out is not None:
            where = _output.write_json(data, summary, json_out)
            if where != "stdout":
                console.print(f"wrote {where}", markup=False)
    except OSError as e:
        fail(f"writing the results: {e.strerror or e}" + (" (disk full)" if _output.no_space(e) else ""))
    raise typer.Exit(_output.verdict_status(data, summary))


def register(app: typer.Typer) -> None:
    app.command("analyze", epilog=EPILOG)(analyze)
