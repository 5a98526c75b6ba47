"""Run the native workload generator (`tierscope-engine load`) and show what it reports.

The engine prints one JSON object per second (progress) and a final object with `"summary"`
(docs/workload.md, Outputs). `run_load` drives it and hands progress to a callback; `LiveView`
renders a Rich live display; `summary_table` the final per-page table.
Ctrl-C is forwarded to the engine, which stops, flushes its Parquet log and still prints the
summary; the result then says `interrupted` and the exit status is non-zero. SIGTERM and SIGHUP
(when nobody else handles them) do the same: the engine runs in its own session, so without this
it would outlive us with an empty log.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from tierscope.engine import engine_path
from tierscope.procs import spawn


class LoadError(RuntimeError):
    """The generator could not run (bad workload file, bad target, engine missing...)."""


@dataclass
class LoadResult:
    returncode: int
    summary: dict[str, Any] | None
    progress: list[dict[str, Any]] = field(default_factory=list)
    stderr: str = ""
    interrupted: bool = False
    #: the signal (SIGTERM, SIGHUP) that stopped the run, forwarded to the engine as SIGINT
    signal: int | None = None


#: signals that stop a run as Ctrl-C does (SIGINT arrives as KeyboardInterrupt)
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextmanager
def _forward_signals(state: dict[str, Any]) -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP are noted in `state["signal"]` and sent on to the engine
    (`state["proc"]`, once it exists) as SIGINT: it stops, flushes its log and prints its summary,
    which we still read. Only signals left at their default action are taken over (a caller's own
    handler, or SIG_IGN under nohup, is kept), and only in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(signum: int, frame: Any) -> None:
        state.setdefault("signal", signum)
        proc = state.get("proc")
        if proc is not None:
            proc.send_signal(signal.SIGINT)

    previous = {}
    for s in FORWARDED_SIGNALS:
        if signal.getsignal(s) == signal.SIG_DFL:
            previous[s] = signal.signal(s, forward)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def workload_options(w: Any) -> dict[str, Any]:
    """`engine_args` options from a spec's `[workload]` (`spec.Workload`): its phases, think time,
    burstiness and session minimum, the same for every generator of a point, local or remote."""
    return {
        "ramp_up": f"{w.ramp_up}s",
        "duration": f"{w.run}s",
        "ramp_down": f"{w.ramp_down}s",
        "think": w.think_time,
        "think_dispersion": w.dispersion if w.dispersion > 1 else None,
        "session_min": f"{w.session_min}s" if w.session_min is not None else None,
    }


def engine_args(
    workload: str | Path,
    *,
    target: str | None = None,
    log: str | Path | None = None,
    users: int | None = None,
    rate: float | None = None,
    duration: str | None = None,
    ramp_up: str | None = None,
    ramp_down: str | None = None,
    think: float | None = None,
    think_dispersion: float | None = None,
    session_min: str | None = None,
    policy: str | None = None,
    pool_size: int | None = None,
    connect_timeout: float | None = None,
    request_timeout: float | None = None,
    seed: int | None = None,
    dry_run: int | None = None,
    quiet: bool = False,
    no_embedded: bool = False,
    embedded_connections: int | None = None,
) -> list[str]:
    """The engine's argv for these options (None = as in the workload file)."""
    argv = [str(engine_path()), "load", str(workload)]
    options: list[tuple[str, Any]] = [
        ("--target", target),
        ("--log", log),
        ("--users", users),
        ("--rate", rate),
        ("--duration", duration),
        ("--ramp-up", ramp_up),
        ("--ramp-down", ramp_down),
        ("--think", think),
        ("--think-dispersion", think_dispersion),
        ("--session-min", session_min),
        ("--policy", policy),
        ("--pool-size", pool_size),
        ("--connect-timeout", connect_timeout),
        ("--request-timeout", request_timeout),
        ("--seed", seed),
        ("--dry-run", dry_run),
        ("--embedded-connections", embedded_connections),
    ]
    for flag, value in options:
        if value is not None:
            argv += [flag, str(value)]
    if quiet:
        argv.append("--quiet")
    if no_embedded:
        argv.append("--no-embedded")
    return argv


def split_users(users: int, generators: int) -> list[tuple[int, int]]:
    """Each generator's share of `users` as (first user id, count): `users // generators` each, the
    first `users % generators` one more, numbered one after the other (0-based)."""
    base, extra = divmod(int(users), int(generators))
    out, first = [], 0
    for k in range(generators):
        n = base + (1 if k < extra else 0)
        out.append((first, n))
        first += n
    return out


#: generator k's session ids are offset by k * SESSION_STRIDE (each generator numbers its own from 0)
SESSION_STRIDE = 1 << 40


def merge_client_logs(parts: Sequence[tuple[str | Path, int, int]], out: str | Path) -> int:
    """One client_requests table from several generators' logs: `parts` are (log, first user id,
    clock correction in ns to add to every *_ns column). Generator k's user ids are moved after the
    previous generators' (`first`), its session ids by k * SESSION_STRIDE; rows sorted by start_ns.
    Returns the rows written."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    # late: tierscope.tables imports pyarrow, which only the merge of the logs needs
    from tierscope import tables

    merged = []
    for k, (log, first, shift_ns) in enumerate(parts):
        if not Path(log).exists():
            continue
        t = tables.conform(pq.read_table(log), "client_requests")
        for i, f in enumerate(t.schema):
            if f.name == "user" and first:
                t = t.set_column(i, f, pc.add(t.column(i), pa.scalar(first, f.type)))
            elif f.name == "session" and k:
                t = t.set_column(i, f, pc.add(t.column(i), pa.scalar(k * SESSION_STRIDE, f.type)))
            elif f.name.endswith("_ns") and shift_ns:
                t = t.set_column(i, f, pc.add(t.column(i), pa.scalar(shift_ns, f.type)))
        merged.append(t)
    if not merged:
        return 0
    t = pa.concat_tables(merged)
    t = t.take(pc.sort_indices(t, [("start_ns", "ascending")]))
    tables.write(t, out, "client_requests")
    return t.num_rows


def run_load(
    argv: Sequence[str],
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    stderr_to: Any = subprocess.PIPE,
) -> LoadResult:
    """Run the engine with `argv`, calling `on_progress` for every progress line.

    On KeyboardInterrupt the engine gets SIGINT (once more, in case the terminal did not send
    it), we keep reading until it has written its summary, and the result says interrupted.
    SIGTERM and SIGHUP are handled the same way (see `_forward_signals`) and named in `signal`.
    """
    state: dict[str, Any] = {}
    with _forward_signals(state):
        # the engine runs in its own session so a terminal's Ctrl-C reaches it exactly once: from us
        proc = spawn(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=stderr_to,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        state["proc"] = proc
        if "signal" in state:  # it came while the engine was being started
            proc.send_signal(signal.SIGINT)
        try:
            result = _follow(proc, on_progress, stderr_to)
        finally:
            if proc.poll() is None:  # we are failing: stop the engine, it flushes its log
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    if "signal" in state:
        result.signal = state["signal"]
        result.interrupted = True
    return result


def _follow(proc: subprocess.Popen, on_progress, stderr_to) -> LoadResult:
    result = LoadResult(returncode=-1, summary=None)
    interrupted = False
    assert proc.stdout is not None
    while True:
        try:
            line = proc.stdout.readline()
        except KeyboardInterrupt:
            interrupted = True
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
            continue
        if not line:
            break
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "summary" in obj:
            result.summary = obj["summary"]
        elif "dry_run" in obj:
            result.summary = obj
        else:
            result.progress.append(obj)
            if on_progress is not None:
                try:
                    on_progress(obj)
                except KeyboardInterrupt:
                    interrupted = True
                    if proc.poll() is None:
                        proc.send_signal(signal.SIGINT)
    while True:
        try:
            result.returncode = proc.wait()
            break
        except KeyboardInterrupt:
            interrupted = True
            proc.send_signal(signal.SIGINT)
    if proc.stderr is not None and stderr_to is subprocess.PIPE:
        result.stderr = proc.stderr.read()
    result.interrupted = interrupted or bool(result.summary and result.summary.get("interrupted"))
    if result.summary is None and result.returncode not in (0, 130, 143):
        raise LoadError(result.stderr.strip() or f"tierscope-engine load exited with {result.returncode}")
    return result


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v:,.2f}"


class LiveView:
    """A Rich renderable of the latest progress line plus a short requests/s history."""

    BARS = " ▁▂▃▄▅▆▇█"

    def __init__(self, title: str):
        self.title = title
        self.last: dict[str, Any] | None = None
        self.history: list[float] = []

    def update(self, line: dict[str, Any]) -> None:
        self.last = line
        self.history = (self.history + [float(line.get("rps") or 0.0)])[-60:]

    def spark(self) -> str:
        if not self.history:
            return ""
        top = max(self.history) or 1.0
        return "".join(self.BARS[min(8, int(round(8 * x / top)))] for x in self.history)

    def __rich__(self) -> Group:
        t = Table(title=self.title, show_edge=False, expand=False)
        for col in (
            "t (s)",
            "phase",
            "active users",
            "in flight",
            "req/s",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "errors/s",
            "requests",
            "errors",
        ):
            t.add_column(col, justify="right")
        p = self.last
        if p is None:
            t.add_row(*(["-"] * 11))
        else:
            t.add_row(
                f"{p['t']:.0f}",
                p["phase"],
                f"{p['active_users']:,}",
                f"{p.get('in_flight', 0):,}",
                f"{p['rps']:,.1f}",
                _ms(p.get("p50_ms")),
                _ms(p.get("p90_ms")),
                _ms(p.get("p99_ms")),
                f"{p['errors']:,}",
                f"{p.get('requests_total', 0):,}",
                f"{p.get('errors_total', 0):,}",
            )
        return Group(t, Text(f"req/s (last {len(self.history)} s): {self.spark()}", style="cyan"))


def summary_table(summary: dict[str, Any]) -> Table:
    """Per page and total over the run phase: count, errors, mean, p50, p90, p99, p99.9, max, X."""
    t = Table(
        title=f"run phase: {summary.get('run_s', 0):.1f} s, "
        f"throughput {summary.get('throughput_rps') or 0:,.1f} req/s (completed)"
    )
    for col in ("page", "count", "errors", "mean ms", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms", "req/s"):
        t.add_column(col, justify="left" if col == "page" else "right")

    def row(name: str, s: dict[str, Any], style: str | None = None) -> None:
        kinds = ", ".join(f"{k} {v}" for k, v in s.get("errors_by_kind", {}).items())
        errors = f"{s['errors']:,}" + (f" ({kinds})" if kinds else "")
        t.add_row(
            name,
            f"{s['count']:,}",
            errors,
            _ms(s.get("mean_ms")),
            _ms(s.get("p50_ms")),
            _ms(s.get("p90_ms")),
            _ms(s.get("p99_ms")),
            _ms(s.get("p999_ms")),
            _ms(s.get("max_ms")),
            _ms(s.get("throughput_rps")),
            style=style,
        )

    for name, s in sorted(summary.get("pages", {}).items(), key=lambda kv: -kv[1]["count"]):
        row(escape(name), s)
    if "total" in summary:
        row("total", summary["total"], style="bold")
    return t


def describe_all_phases(summary: dict[str, Any]) -> str:
    """One line on every phase: requests, errors by kind, the log file."""
    a = summary.get("all_phases", {})
    errs = {k: v for k, v in a.get("errors_by_kind", {}).items() if v}
    parts = [
        f"all phases: {a.get('requests', 0):,} requests (ramp-up {a.get('ramp_up', 0):,}, "
        f"run {a.get('run', 0):,}, ramp-down {a.get('ramp_down', 0):,})",
        "errors: " + (", ".join(f"{k} {v:,}" for k, v in errs.items()) if errs else "none"),
    ]
    if "log" in summary:
        parts.append(f"log: {summary['log']['path']} ({summary['log']['rows']:,} rows)")
    if summary.get("interrupted"):
        parts.append("INTERRUPTED")
    return "; ".join(parts)
