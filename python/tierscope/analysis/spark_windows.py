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
only when a Spark function runs.
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Sequence

import pyarrow as pa

from .windows import (
    DEFAULT_WINDOW_NS,
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


class EngineUnavailable(RuntimeError):
    """The Spark engine cannot run here: pyspark is not installed or no Java runtime was found."""


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


def spark_session(master: str | None = None, conf: dict[str, str] | None = None, app_name: str = "tierscope"):
    """A SparkSession on `master` (see `resolve_master`), offline: no UI, and in local mode bound to
    the loopback interface only. `conf` adds or overrides Spark settings."""
    check_spark()
    from pyspark.sql import SparkSession

    master = resolve_master(master)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
    )
    if master.startswith("local"):
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=PANDAS_WARNING)
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def _to_arrow(frame) -> pa.Table | None:
    """A Spark DataFrame as an Arrow table (None when it has no rows and Spark gave no schema)."""
    if hasattr(frame, "toArrow"):  # pyspark >= 4.0
        return frame.toArrow()
    batches = frame._collect_as_arrow()  # pyspark 3.5
    return pa.Table.from_batches(batches) if batches else None


def _series(
    session, sources: list[str], window_ns: int, base_ns: int | None, exclusive: bool, shared_ids: str
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
    spark=None,
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
