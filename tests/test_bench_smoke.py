"""Benches that cannot rot (issue 24): every executable in bench/ compiles, answers `--help` (exit 0),
and runs its smoke size (`--smoke`, or the smallest options of a bench without one) to a last line
carrying its documented keys, each a finite number.

Nothing else runs the benches, so without this a refactor (a name moved, an option changed, a
service's credentials) breaks them unseen. The smoke runs measure nothing: seconds instead of
minutes, loopback and the lab's own namespaces only. They are slow one by one (PostgreSQL started
and loaded, a JVM, TPC-C's one warehouse), so they all start together when the first test needs
them, six at a time, the longest first, and each test waits for its own: 2 min 38 s in all on the
shared 2-core machine at load average 15-20 (2026-11-27; scaleout's Spark, ingest and overhead are
the long ones).

A bench needing root or a peer tool fails here saying what is missing (`make setup` installs the
Makefile's APT_PACKAGES): nothing is skipped. A new executable in bench/ without an entry in
SMOKE (or EXCLUDED) fails `test_every_bench_has_a_smoke_run`.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import ROOT

BENCH = ROOT / "bench"
BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Smoke:
    args: tuple[str, ...]  # the smoke run's arguments
    keys: tuple[str, ...]  # documented keys of the last line, each a finite number
    needs: tuple[str, ...] = ()  # programs on PATH (APT_PACKAGES, `make setup`)
    root: bool = False  # runs servers as their own OS users, tcpdump, namespaces
    group: str = ""  # benches of one group run one after the other (they share a resource)
    last_line: str = ""  # a regular expression for a bench whose last line is not key=value pairs


SMOKE: dict[str, Smoke] = {
    "analysis": Smoke(("--smoke",), ("seconds_10m", "peak_rss_mib", "ratio_vs_duckdb_sql", "ratio_vs_pandas")),
    "importers": Smoke(
        ("--smoke",),
        (
            "spans",
            "file_mib",
            "seconds",
            "peak_rss_mib",
            "naive_seconds",
            "naive_peak_rss_mib",
            "time_ratio_vs_naive",
            "rss_ratio_vs_naive",
        ),
    ),
    # owned by another engineer: no --smoke, its smallest size (1 MiB); its last line is not key=value
    "importer_strings": Smoke(("1",), (), last_line=r"MiB per CPU second: 1 MiB (?P<rate>[0-9.]+)$"),
    # owned by another engineer: no --smoke, its smallest options
    "ingest": Smoke(
        ("--rows", "100", "--clients", "2", "--records", "2"),
        (
            "direct_rows_per_s",
            "queue_rows_per_s",
            "durable_rows_per_s",
            "durable_everysec_rows_per_s",
            "ratio_durable_always_vs_everysec",
            "ratio_queue_vs_batch_ceiling",
            "ratio_store_path_vs_batch_ceiling",
            "lost_queue",
            "lost_durable",
            "lost_acknowledged_durable",
        ),
        needs=("redis-server",),
        root=True,
    ),
    "loadgen": Smoke(
        ("--smoke",),
        (
            "flat_ratio_vs_wrk",
            "paced_ratio_vs_peer",
            "rss_mib_100k_users",
            "think_mean_error_pct",
            "paced_ratio_vs_peer_1ms_grid",
        ),
        needs=("nginx", "wrk", "hey", "taskset"),
    ),
    "middleware_mysql": Smoke(
        ("--smoke",),
        ("mysql_select_ratio_vs_direct", "middleware_cpu_us_per_query"),
        needs=("mariadbd",),
        root=True,
    ),
    "middleware": Smoke(
        ("--smoke",),
        (
            "select_simple_ratio",
            "select_extended_ratio",
            "select_prepared_ratio",
            "tpcb_ratio",
            "replicas_agree",
            "select_ratio_vs_direct",
            "tpcb_ratio_vs_direct",
            "tpcb_one_client_ratio",
            "tpcb_both_replicas_ratio",
            "tpcb_ratio_vs_one_client",
            "tpcb_one_client_one_cpu_ratio",
            # TPC-B through the other scheduler (one write lock), in the same run
            "tpcb_other_scheduler_ratio",
            "other_scheduler_replicas_agree",
            # the peers in the same run (make setup installs both)
            "ratio_vs_pgbouncer_select",
            "ratio_vs_pgpool_select",
            "ratio_vs_pgpool_tpcb",
            "pgpool_replicas_agree",
        ),
        root=True,
    ),
    "oltp": Smoke(
        ("--smoke",),
        (
            "ycsb_ops_per_cpu_s_ratio_vs_peer",
            "tpcc_tpmc",
            "middleware_ratio_vs_direct",
            "pgbouncer_ratio_vs_direct",
            "middleware_ratio_vs_pgbouncer",
        ),
        root=True,
    ),
    "overhead": Smoke(
        ("--smoke",),
        (
            "overhead_pct",
            "first_request_s",
            "between_points_s",
            "monitor_cpu_pct",
            "machine_memory_cv_pct",
            "machine_cache_cv_pct",
        ),
        needs=("nginx", "tcpdump"),
        root=True,
    ),
    "rubbos": Smoke(
        ("--smoke",),
        (
            "load_rows_per_s_pg",
            "load_rows_per_s_mariadb",
            "ratio_vs_pgbench_init",
            "max_pages_per_s",
            "ratio_db_mb_per_s_vs_pgbench_init",
            "load_mb_per_s_pg",
            "load_mb_per_s_mariadb",
            "db_mb_pg",
            "db_mb_mariadb",
            "pgbench_init_rows_per_s",
            "max_at_users",
            "max_pages_per_s_wrk",
            "max_at_connections",
        ),
        needs=("nginx", "wrk", "mariadbd"),
        root=True,
    ),
    # --smoke leaves out the deployment (deploy_s=nan): tests/test_remote.py runs `tierscope run --hosts`
    "scaleout": Smoke(("--smoke",), ("spark_s_10m", "duckdb_s_10m"), needs=("java",)),
    "tpcw": Smoke(("--smoke",), ("load_rows_per_s", "ratio_vs_pgbench_init", "max_wips"), needs=("nginx",), root=True),
    "tracer": Smoke(
        ("--smoke",),
        (
            "packets_per_s",
            "ratio_vs_tshark",
            "peak_rss_mib",
            "capture_overhead_pct",
            "capture_overhead_tcpdump_pct",
            "capture_overhead_full_pct",
            "capture_overhead_bridge_pct",
            "capture_overhead_bridge_tcpdump_pct",
            "capture_cpu_overhead_pct",
            "capture_cpu_overhead_tcpdump_pct",
            "capture_cpu_overhead_bridge_pct",
            "capture_cpu_overhead_bridge_tcpdump_pct",
            "capture_program_ns_per_packet",
        ),
        needs=("nginx", "wrk", "tcpdump", "tshark", "taskset"),
        root=True,
    ),
    # not committed yet (another engineer's, in progress): its smallest options
    "analyze_otlp": Smoke(("--spans", "2000", "--rounds", "1"), ("spans", "rounds", "ratio", "ratio_min")),
}

#: compiled and run with --help only; their smoke runs are tested elsewhere
EXCLUDED = {
    # the diagnosis corpus: tests/test_diagnosis_corpus.py runs it (its fast subset)
    "diagnosis": "tests/test_diagnosis_corpus.py",
}

#: the longest first (seconds measured one by one on the loaded machine), so the pool ends early
EXPECTED_S = {
    "scaleout": 200,
    "ingest": 190,
    "overhead": 175,
    "oltp": 90,
    "tpcw": 80,
    "tracer": 50,
    "rubbos": 40,
    "middleware": 30,  # the Rust middleware, pgbouncer and pgpool-II (the Python one took most of 75 s)
}
WORKERS = 6
TIMEOUT_S = 300


def benches() -> list[str]:
    """Every executable file directly in bench/ (bench/diagnosis_corpus is the corpus' package)."""
    return sorted(p.name for p in BENCH.iterdir() if p.is_file() and os.access(p, os.X_OK))


def env() -> dict[str, str]:
    """As `make bench` runs them: the venv's programs (tierscope, tierscope-engine) first."""
    return {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}", "PYTHONUNBUFFERED": "1"}


def run(argv: list[str], timeout: float) -> tuple[int, str, float]:
    """(exit status, stdout + stderr, seconds); on a timeout the bench's process group gets SIGINT
    (a bench's `finally` blocks stop its services and remove its namespaces), then SIGTERM, then
    SIGKILL."""
    t0 = time.monotonic()
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out = ""
        for sig, wait in ((signal.SIGINT, 60), (signal.SIGTERM, 20), (signal.SIGKILL, None)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                out, _ = proc.communicate(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        return -1, f"timed out after {timeout:.0f} s\n{out}", time.monotonic() - t0
    return proc.returncode, out, time.monotonic() - t0


def missing(name: str) -> str | None:
    """What the bench needs and this machine lacks (None when nothing)."""
    s = SMOKE[name]
    if s.root and os.geteuid() != 0:
        return f"bench/{name} needs root (servers as their own OS users, capture, namespaces)"
    lacking = [p for p in s.needs if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]
    if lacking:
        return f"bench/{name} needs {', '.join(lacking)} (make setup installs the Makefile's APT_PACKAGES)"
    return None


class Runs:
    """The smoke runs, started together on first use: at most WORKERS at a time, a group's one
    after the other, the longest first."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.futures: dict[str, Future] = {}
        self.pool: ThreadPoolExecutor | None = None
        self.started = 0.0

    def start(self) -> None:
        with self.lock:
            if self.pool is not None:
                return
            self.started = time.monotonic()
            self.pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="bench-smoke")
            names = sorted((n for n in benches() if n in SMOKE), key=lambda n: -EXPECTED_S.get(n, 30))
            groups: dict[str, list[str]] = {}
            for n in names:
                groups.setdefault(SMOKE[n].group or n, []).append(n)
            chains = sorted(groups.values(), key=lambda g: -sum(EXPECTED_S.get(n, 30) for n in g))
            for chain in chains:
                futures = {n: Future() for n in chain}
                self.futures.update(futures)
                self.pool.submit(self._chain, chain, futures)

    @staticmethod
    def _chain(chain: list[str], futures: dict[str, Future]) -> None:
        for n in chain:
            try:
                why = missing(n)
                futures[n].set_result((None, why, 0.0) if why else run([str(BENCH / n), *SMOKE[n].args], TIMEOUT_S))
            except BaseException as err:  # noqa: BLE001 (reported by the bench's own test)
                futures[n].set_exception(err)

    def result(self, name: str) -> tuple[int | None, str, float]:
        self.start()
        return self.futures[name].result()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)
            print(f"\nbench smoke runs: {time.monotonic() - self.started:.0f} s in all")


@pytest.fixture(scope="module")
def runs():
    r = Runs()
    yield r
    r.close()


def test_every_bench_has_a_smoke_run(runs):
    """A new bench gets a smoke run (or a reason it is run elsewhere) when it is added. (Starts the
    smoke runs, so that the --help checks overlap them.)"""
    runs.start()
    without = [n for n in benches() if n not in SMOKE and n not in EXCLUDED]
    assert not without, f"bench/{', bench/'.join(without)}: add a smoke run to SMOKE in {Path(__file__).name}"


@pytest.mark.parametrize("name", benches())
def test_compiles_and_answers_help(name):
    path = BENCH / name
    compile(path.read_text(), str(path), "exec")  # a syntax error fails here, before anything runs
    status, out, _ = run([str(path), "--help"], 60)
    assert status == 0, f"bench/{name} --help exited {status}:\n{out[-3000:]}"
    assert "usage" in out.lower(), f"bench/{name} --help printed no usage:\n{out[-3000:]}"


def last_line(out: str) -> str:
    lines = [ln for ln in out.splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""


@pytest.mark.parametrize("name", [n for n in benches() if n in SMOKE])
def test_smoke_run(name, runs):
    status, out, took = runs.result(name)
    if status is None:
        pytest.fail(out)  # what is missing: nothing is skipped
    cmd = " ".join([f"bench/{name}", *SMOKE[name].args])
    assert status == 0, f"{cmd} exited {status} after {took:.0f} s:\n{out[-4000:]}"
    line = last_line(out)
    s = SMOKE[name]
    if s.last_line:
        m = re.search(s.last_line, line)
        assert m, f"{cmd}: last line {line!r} does not match {s.last_line!r}"
        values = {k: m.group(k) for k in m.groupdict()}
    else:
        pairs = [tok.split("=", 1) for tok in line.split() if "=" in tok]
        values = dict(pairs)
        absent = [k for k in s.keys if k not in values]
        assert not absent, f"{cmd}: last line lacks {absent}: {line!r}\n{out[-3000:]}"
    bad = {}
    for k in values if s.last_line else s.keys:
        try:
            x = float(values[k])
        except ValueError:
            x = math.nan
        if not math.isfinite(x):
            bad[k] = values[k]
    assert not bad, f"{cmd}: not finite numbers: {bad} in {line!r}\n{out[-3000:]}"
    print(f"{cmd}: {took:.0f} s")
