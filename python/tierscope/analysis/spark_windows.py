"""Per-server load, exclusive load and throughput per window on Spark, for traces beyond one machine.

The query is `windows.sql_query`, the text DuckDB runs (`windows.window_series_sql`), in its Spark
dialect: the two engines differ only in how a row is exploded into its windows
(`windows.SQL_DIALECTS`). So both give the same rows and the same values (integer nanoseconds
relative to the base; one division by W at the end), which tests/test_analysis_spark.py checks on
a million requests.

    from tierscope.analysis.spark_windows import window_series_spark
    series = window_series_spark(["requests.parquet"], exclusive=True)          # local[2]
    series = window_series_spark(["hdfs:///runs/r1/requests"], master="spark://head:7077")

The master is the argument, else $TIERSCOPE_SPARK_MASTER, else ``local[2]`` (Spark inside this
process's JVM on two cores, no cluster needed). With a cluster master the paths must be readable
by the executors (HDFS, S3, a shared file system). pyspark is an optional dependency
(``pip install 'tierscope[spark]'``) and needs Java 17 or later; both are imported or looked for
only when a Spark function runs. A master is checked before any JVM starts (`check_master`): a
malformed local master, or a standalone master nobody answers at, is one line
(`EngineUnavailable`) instead of a minute of retries and a Java stack trace; `error_line` turns
what Spark raises later into one line too.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from tierscope.contracts import DEFAULT_WINDOW_NS

from .windows import (
    _check_window,
    floor_base,
    preflight,
    preflight_query,
    shared_id_count,
    sql_conform,
    sql_empty,
    sql_query,
)

#: Spark inside this process's JVM, on as many cores as the lab's reference machine has.
DEFAULT_MASTER = "local[2]"
#: Environment variable naming the master when no argument does.
MASTER_ENV = "TIERSCOPE_SPARK_MASTER"
#: The name the requests are registered under in the session's catalog.
VIEW = "tierscope_requests"
#: pyspark warns about pandas >= 3 wherever it checks the version, also where it uses no pandas
#: (this module moves data as Arrow only), so the warning is silenced around its calls.
PANDAS_WARNING = "PySpark does not yet fully support pandas"


#: the local masters Spark accepts: local, local[N], local[*], local[N,F], local[*,F], local-cluster[N,C,M]
_LOCAL_MASTER = re.compile(
    r"local(\[\s*(\*|[1-9][0-9]*)\s*(,\s*[0-9]+\s*)?\]|-cluster\[\s*[1-9][0-9]*\s*,\s*[1-9][0-9]*\s*,\s*[1-9][0-9]*\s*\])?"
)
#: what `tierscope analyze --spark-master` takes, for messages
MASTER_FORMS = "local[N], local[*], spark://HOST:PORT, yarn or k8s://URL"


class EngineUnavailable(RuntimeError):
    """The Spark engine cannot run here: pyspark is not installed, no Java runtime was found, or
    the master is malformed or does not answer."""


def java_executable() -> str | None:
    """The `java` pyspark will start: $JAVA_HOME/bin/java, else `java` on the PATH (None if neither)."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = os.path.join(home, "bin", "java")
        return candidate if os.access(candidate, os.X_OK) else None
    return shutil.which("java")


def check_spark() -> None:
    """Raise `EngineUnavailable` with what to install when pyspark or Java is missing."""
    try:
        import pyspark  # noqa: F401
    except ImportError as e:
        raise EngineUnavailable(
            "the Spark engine needs pyspark: pip install 'tierscope[spark]' (or pip install 'pyspark>=3.5,<5')"
        ) from e
    if java_executable() is None:
        where = "$JAVA_HOME/bin/java" if os.environ.get("JAVA_HOME") else "java on the PATH"
        raise EngineUnavailable(
            f"the Spark engine needs a Java runtime (17 or later); {where} was not found "
            "(Debian: apt-get install openjdk-17-jre-headless)"
        )


def resolve_master(master: str | None = None) -> str:
    """The master URL to use: the argument, else $TIERSCOPE_SPARK_MASTER, else local[2]."""
    return master or os.environ.get(MASTER_ENV) or DEFAULT_MASTER


def check_master(master: str | None = None, timeout: float = 3.0) -> str:
    """The master to use (`resolve_master`), checked before Spark starts: a `local...` master must
    be one of Spark's local forms, and a standalone `spark://HOST:PORT[,HOST:PORT...]` must have a
    TCP listener at one of its addresses at least (Spark would retry for a minute, then fail with a
    stack trace). Other masters (yarn, k8s://...) are left to Spark. `EngineUnavailable` (one
    line) when the master cannot be used."""
    master = resolve_master(master).strip()
    if master.startswith("local"):
        if not _LOCAL_MASTER.fullmatch(master):
            raise EngineUnavailable(f"{master}: not a Spark master; use {MASTER_FORMS}")
        return master
    if master.startswith("spark://"):
        reasons = []
        for address in master[len("spark://") :].split(","):
            host, _, port = address.strip().rpartition(":")
            host = host.strip("[]")
            if not host or not port.isdigit():
                raise EngineUnavailable(f"{master}: a standalone master is spark://HOST:PORT (e.g. spark://head:7077)")
            try:
                with socket.create_connection((host, int(port)), timeout=timeout):
                    return master
            except OSError as e:
                reasons.append(f"{address.strip()}: {(e.strerror or str(e) or type(e).__name__).lower()}")
        raise EngineUnavailable(
            f"{master}: no Spark master answers ({'; '.join(reasons)}); start one there "
            "($SPARK_HOME/sbin/start-master.sh) or use local[N]"
        )
    return master


def error_line(e: BaseException, log: str | Path | None = None) -> str:
    """One line for an error Spark raised: the Java exception's own message (without its class
    name) for a Py4JJavaError; when the JVM died before py4j could ask it (spark-submit refusing a
    master: JAVA_GATEWAY_EXITED), the refusal the JVM wrote to `log`; else the first line of the
    Python exception's text."""
    try:
        text = str(e)
    except Exception:  # py4j asks the JVM for the text; the JVM may be gone
        text = ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    java = [line[1:].strip() for line in lines if line.startswith(":")]
    if not java and log is not None and "JAVA_GATEWAY_EXITED" in text:
        try:
            logged = Path(log).read_text(errors="replace").splitlines()
        except OSError:
            logged = []
        java = [m.group(1) for m in map(re.compile(r'(?:Exception in thread "main"|Error:)\s+(.+)').match, logged) if m]
    line = java[0] if java else lines[0] if lines else type(e).__name__
    return re.sub(r"^(?:[A-Za-z_$][\w$]*\.)+[A-Za-z_$][\w$]*(?:Exception|Error): ", "", line)


def spark_session(
    master: str | None = None,
    conf: dict[str, str] | None = None,
    app_name: str = "tierscope",
    log: str | Path | None = None,
) -> Any:
    """A SparkSession on `master` (see `resolve_master`, checked by `check_master`), offline: no UI,
    and in local mode bound to the loopback interface only. `conf` adds or overrides Spark
    settings. `log`: a file that gets everything the JVM prints (its log4j log, its warnings and
    stack traces), when this call starts the JVM (the first session of the process); otherwise
    the JVM writes to this process's stdout and stderr."""
    check_spark()
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    master = check_master(master)
    settings = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"}
    if master.startswith("local"):
        settings.update({"spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1"})
    settings.update(conf or {})
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    if log is not None and SparkContext._gateway is None:
        from pyspark.java_gateway import launch_gateway

        launch = SparkConf().setMaster(master).setAppName(app_name).setAll(list(settings.items()))
        with open(log, "ab") as out:
            SparkContext._ensure_initialized(
                gateway=launch_gateway(  # type: ignore[no-untyped-call]
                    launch, popen_kwargs={"stdout": out, "stderr": out}
                )
            )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=PANDAS_WARNING)
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def _to_arrow(frame: Any) -> pa.Table | None:
    """A Spark DataFrame as an Arrow table (None when it has no rows and Spark gave no schema)."""
    if hasattr(frame, "toArrow"):  # pyspark >= 4.0
        return frame.toArrow()
    batches = frame._collect_as_arrow()  # pyspark 3.5
    return pa.Table.from_batches(batches) if batches else None


def _series(
    session: Any, sources: list[str], window_ns: int, base_ns: int | None, exclusive: bool, shared_ids: str
) -> pa.Table:
    frame = session.read.parquet(*sources)
    frame.createOrReplaceTempView(VIEW)
    columns = set(frame.columns)
    links = exclusive and {"request_id", "parent_id"} <= columns
    row = tuple(session.sql(preflight_query(VIEW, columns, links)).collect()[0])
    first = preflight(row, ", ".join(sources), shared_ids=shared_ids)
    links = links and not shared_id_count(row)
    if first is None:
        return sql_empty(exclusive)
    if base_ns is None:
        base_ns = floor_base(first, window_ns)
    query = sql_query(VIEW, window_ns, base_ns, exclusive=exclusive, links=links, dialect="spark")
    result = _to_arrow(session.sql(query))
    return sql_empty(exclusive) if result is None else sql_conform(result, exclusive)


def window_series_spark(
    paths: str | Sequence[str],
    window_ns: int = DEFAULT_WINDOW_NS,
    base_ns: int | None = None,
    *,
    exclusive: bool = False,
    shared_ids: str = "error",
    master: str | None = None,
    spark: Any = None,
    conf: dict[str, str] | None = None,
) -> pa.Table:
    """`windows.window_series_sql`'s table (tier, server, window_start_ns, load, [load_exclusive],
    throughput; windows a server never touches absent), computed by Spark SQL over requests
    Parquet files or directories.

    `spark`: an existing SparkSession to use (left running); otherwise one is started on `master`
    with `conf` (`spark_session`) and stopped before returning, also on error. `base_ns` defaults
    to the earliest arrival floored to a multiple of the window. With `exclusive`, request ids must
    be unique: a traced run's shared ids raise `windows.SharedRequestIds`, or with
    `shared_ids="ignore"` the links are left out (`load_exclusive` = `load`).
    """
    window_ns = _check_window(window_ns)
    sources = [paths] if isinstance(paths, str) else list(paths)
    if not sources:
        raise ValueError("no requests files given")
    own = spark is None
    session = spark_session(master, conf) if own else spark
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=PANDAS_WARNING)
            return _series(session, sources, window_ns, base_ns, exclusive, shared_ids)
    finally:
        if own:
            session.stop()
