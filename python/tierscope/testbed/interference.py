"""Injected interference: stop-the-world pauses and a bursty noisy neighbour.

Pauses emulate the JVM garbage collections of seed 001 §4: every `period` the target host's
processes get SIGSTOP, and after `duration` SIGCONT. Each pause becomes an `events` row of kind
`injected_pause` with its measured start and end.

The noisy neighbour emulates the collocated VM of seed 001 §5: a CPU burner placed in the
target host's cgroup (so it competes for the same quota) whose work arrives as a two-state
Markov-modulated Poisson process (an interrupted Poisson process: jobs arrive at rate
lambda = peak / job while ON, none while OFF, ON and OFF last exponential times). For a mean
demand u (cores), p_on = u / peak, and an index of dispersion I of the job counts,

    I = 1 + 2 lambda r_off / (r_off + r_on)^2     (r_off = 1/mean_on, r_on = 1/mean_off)

so mean_on = (I - 1) / (2 lambda (1 - p_on)^2) and mean_off = (I - 1) / (2 lambda p_on (1 - p_on)).
I = 1 is a plain Poisson stream of jobs at rate u / job (not bursty). Work is measured in the
burner's own CPU time, so a throttled burner takes longer, as a real neighbour would. Its ON
periods become `events` rows of kind `noisy_neighbour_burst`, each with the burner's CPU time at
its start and end (what it burned in between, and between bursts, is measured, not assumed).

Exponential ON and OFF periods make the mean demand over a run a random number: over T seconds it
spreads by about sqrt(I job / (u T)) around u (24 % at I = 400, u = 0.15 cores, T = 40 s, over 200
schedules). `regular = true` keeps the same means and Poisson jobs while ON but makes every ON and
OFF period last exactly its mean (a square wave starting at a random phase): the same mean demand
and burst length, the mean over a run within one burst of u. `nice` below 0 lets the burner
outweigh the host's own threads on a CPU they share (a VM gets its share of a core however many
threads the other VM runs; one thread among k busy ones gets 1/(k+1)).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tierscope.procs import spawn

if TYPE_CHECKING:  # the burner process starts fast: no pydantic import on its path
    from tierscope.spec import NoisyNeighbour, Pause
    from tierscope.testbed.host import Host

MARKER_ENV = "TIERSCOPE_MARKER"


def events_table(rows: list[tuple[int, int, str, str, str]]):
    """An `events` table from (start_ns, end_ns, host, kind, detail) tuples."""
    import pyarrow as pa

    # late: tierscope.tables imports pyarrow; the burner process starts without it
    from tierscope.tables import EVENTS

    cols: list[Any] = list(zip(*rows)) if rows else [[], [], [], [], []]
    return pa.Table.from_arrays([pa.array(c, type=f.type) for c, f in zip(cols, EVENTS)], schema=EVENTS)


class PauseInjector:
    """Pause one host's processes on a schedule, in a background thread.

    `pids` returns the process ids to stop at the moment of each pause (so restarted or forked
    processes are caught). Stopped processes always get SIGCONT, also when the injector stops
    in the middle of a pause.
    """

    def __init__(self, host: str, pause: Pause, pids: Callable[[], list[int]], seed: int = 0):
        self.host = host
        self.pause = pause
        self.pids = pids
        self.rng = random.Random(seed)
        self.rows: list[tuple[int, int, str, str, str]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopped: list[int] = []
        self._lock = threading.Lock()

    def start(self) -> PauseInjector:
        self._thread = threading.Thread(target=self._run, name=f"pause-{self.host}", daemon=True)
        self._thread.start()
        return self

    def _signal(self, pids: list[int], sig: int) -> list[int]:
        done = []
        for pid in pids:
            try:
                os.kill(pid, sig)
                done.append(pid)
            except ProcessLookupError:
                pass
        return done

    def _run(self) -> None:
        p = self.pause
        next_t = time.monotonic() + p.start
        while not self._stop.is_set():
            if self._stop.wait(max(0.0, next_t - time.monotonic())):
                break
            pids = [x for x in self.pids() if x != os.getpid()]
            with self._lock:
                start_ns = time.time_ns()
                self._stopped = self._signal(pids, signal.SIGSTOP)
            t0 = time.monotonic()
            self._stop.wait(p.duration)
            with self._lock:
                self._signal(self._stopped, signal.SIGCONT)
                end_ns = time.time_ns()
                n = len(self._stopped)
                self._stopped = []
            self.rows.append(
                (start_ns, end_ns, self.host, "injected_pause",
                 f"SIGSTOP/SIGCONT of {n} processes, planned {p.duration * 1e3:.0f} ms")
            )  # fmt: skip
            period = p.period * (1 + self.rng.uniform(-p.jitter, p.jitter)) if p.jitter else p.period
            next_t = t0 + period

    def stop(self):
        """Stop injecting (resuming anything paused); returns the events table of the pauses."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        with self._lock:
            self._signal(self._stopped, signal.SIGCONT)
            self._stopped = []
        return events_table(self.rows)


# --- the noisy neighbour -----------------------------------------------------------------------


def mmpp_periods(utilization: float, burstiness: float, job: float, peak: float = 1.0) -> tuple[float, float, float]:
    """(lambda in jobs/s while ON, mean ON s, mean OFF s) for the given mean demand and index I.

    mean ON/OFF are inf/0 when I = 1 (a plain Poisson stream at rate utilization / job).
    """
    lam = peak / job
    p_on = utilization / peak
    if burstiness <= 1.0 + 1e-9 or p_on >= 1.0:
        return utilization / job, math.inf, 0.0
    mean_on = (burstiness - 1) / (2 * lam * (1 - p_on) ** 2)
    mean_off = (burstiness - 1) / (2 * lam * p_on * (1 - p_on))
    return lam, mean_on, mean_off


def work_arrivals(rng: random.Random, lam: float, mean_on: float, mean_off: float, regular: bool = False):
    """The burner's schedule, in seconds from its start: yields ("job", t), ("on", t), ("off", t).

    An interrupted Poisson process: jobs at rate `lam` while ON, none while OFF; ON and OFF last
    exponential times with the given means (mean_on = inf: always ON, a plain Poisson stream), or
    exactly their means when `regular`, from a random phase of the cycle.
    """
    if math.isinf(mean_on):
        yield ("on", 0.0)
        t = 0.0
        while True:
            t += rng.expovariate(lam)
            yield ("job", t)
    on = rng.random() < mean_on / (mean_on + mean_off)
    t = 0.0
    # regular: the first period is the rest of a cycle entered at a uniform phase
    left = rng.uniform(0, mean_on if on else mean_off) if regular else 0.0
    if on:
        yield ("on", 0.0)
    while True:
        if regular:
            end = t + ((mean_on if on else mean_off) - left)
            left = 0.0
        else:
            end = t + rng.expovariate(1 / (mean_on if on else mean_off))
        if on:
            a = t + rng.expovariate(lam)
            while a < end:
                yield ("job", a)
                a += rng.expovariate(lam)
            yield ("off", end)
        else:
            yield ("on", end)
        on = not on
        t = end


def burn(
    utilization: float,
    burstiness: float,
    job: float,
    peak: float,
    seed: int,
    bursts: Path | None,
    duration: float | None = None,
    regular: bool = False,
    nice: int = 0,
) -> None:
    """The burner's main loop (runs until SIGTERM, or `duration` seconds).

    Jobs arrive on the `work_arrivals` schedule; each is `job` seconds of this thread's CPU time,
    spun in chunks of at most 5 ms; the backlog carries over when the burner falls behind. What
    the loop itself costs between chunks (waking up for each job) counts as work done, so its CPU
    time is the work that arrived, steady or bursty (not ~8 % more for a steady stream). The
    log gets `start <ns>`, `on|off <ns> <cpu_ns>` and `end <ns> <cpu_ns>` lines (cpu_ns: this
    thread's CPU time since the start line).
    """
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    if nice:  # PermissionError below 0 without CAP_SYS_NICE: the start fails, saying so
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    lam, mean_on, mean_off = mmpp_periods(utilization, burstiness, job, peak)
    schedule = work_arrivals(random.Random(seed), lam, mean_on, mean_off, regular)
    log = open(bursts, "a", buffering=1) if bursts else None  # noqa: SIM115 (closed in the finally below)
    cpu_base = time.thread_time_ns()  # the interpreter's start-up is not the neighbour's work
    cpu_ns = lambda: time.thread_time_ns() - cpu_base  # noqa: E731
    t0 = time.monotonic()
    t0_ns = time.time_ns()
    if log:
        log.write(f"start {t0_ns}\n")  # the parent waits for this line: the burner runs
    end = duration if duration else math.inf
    on_since: float | None = None
    backlog = 0.0
    cpu = time.thread_time
    charged = cpu()  # CPU time accounted as work: the loop's own cost (waking, sleeping) included
    kind, at = next(schedule)
    try:
        while not stop["now"]:
            now = time.monotonic() - t0
            if now >= end:
                break
            while at <= now:
                if kind == "job":
                    backlog += job
                elif kind == "on":
                    on_since = at
                    if log:
                        log.write(f"on {t0_ns + int(at * 1e9)} {cpu_ns()}\n")
                else:
                    if log and on_since is not None:
                        log.write(f"off {t0_ns + int(at * 1e9)} {cpu_ns()}\n")
                    on_since = None
                kind, at = next(schedule)
            if backlog > 0:
                chunk = min(backlog, 0.005)
                target = charged + chunk  # what the loop spent since the last chunk is work done
                charged = target
                while cpu() < target:
                    pass
                backlog -= chunk
            else:
                time.sleep(max(0.0, min(at, end) - (time.monotonic() - t0)))
    finally:
        if log:
            now_ns, spent = time.time_ns(), cpu_ns()
            if on_since is not None:
                log.write(f"off {now_ns} {spent}\n")
            log.write(f"end {now_ns} {spent}\n")
            log.close()


class NoisyNeighbourProcess:
    """The burner process in a host (its cgroup and namespace); `stop()` returns its burst events."""

    def __init__(self, host: Host, spec: NoisyNeighbour, workdir: Path, seed: int = 0):
        self.host = host
        self.spec = spec
        self.workdir = Path(workdir)
        self.seed = seed
        self.bursts = self.workdir / f"noisy-{host.name}-{seed}.bursts"
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> NoisyNeighbourProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        s = self.spec
        argv = [
            sys.executable, "-m", "tierscope.testbed.interference", "burn",
            "--utilization", str(s.utilization), "--burstiness", str(s.burstiness),
            "--job", str(s.job), "--peak", str(s.peak), "--seed", str(self.seed),
            "--bursts", str(self.bursts),
        ] + (["--regular"] if s.regular else []) + (["--nice", str(s.nice)] if s.nice else [])  # fmt: skip
        env = dict(os.environ, **{MARKER_ENV: "noisy_neighbour"})
        self.bursts.unlink(missing_ok=True)
        self.proc = spawn(
            self.host.wrap(argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, start_new_session=True, env=env,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while not (self.bursts.exists() and self.bursts.read_text().startswith("start ")):
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace")[-2000:] if self.proc.stderr else ""
                raise RuntimeError(f"noisy neighbour in {self.host.name} exited at start: {err}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"noisy neighbour in {self.host.name} did not start within 30 s")
            time.sleep(0.02)
        return self

    def stop(self):
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        return events_table(self._bursts(time.time_ns()))

    def _bursts(self, now_ns: int) -> list[tuple[int, int, str, str, str]]:
        """ON periods from the burner's log, each with the burner's CPU time (seconds) at its
        start and end in the detail (`cpu_s_at_on=... cpu_s_at_off=...`); one still open (burner
        killed) ends at `now_ns` with the last CPU time logged."""
        rows: list[tuple[int, int, str, str, str]] = []
        on: tuple[int, int] | None = None
        last_cpu = 0
        s = self.spec
        detail = (f"burner at {s.peak:g} cores, I={s.burstiness:g}" + (", regular" if s.regular else "")
                  + (f", nice {s.nice}" if s.nice else ""))  # fmt: skip
        text = self.bursts.read_text() if self.bursts.exists() else ""
        for line in text.splitlines():
            kind, *fields = line.split()
            if not fields or not all(f.isdigit() for f in fields):
                continue
            ns = int(fields[0])
            last_cpu = int(fields[1]) if len(fields) > 1 else last_cpu
            if kind == "on":
                on = (ns, last_cpu)
            elif kind == "off" and on is not None:
                rows.append((on[0], ns, self.host.name, "noisy_neighbour_burst",
                             f"{detail}, cpu_s_at_on={on[1] / 1e9:.4f} cpu_s_at_off={last_cpu / 1e9:.4f}"))  # fmt: skip
                on = None
        if on is not None:
            rows.append((on[0], now_ns, self.host.name, "noisy_neighbour_burst",
                         f"{detail}, cpu_s_at_on={on[1] / 1e9:.4f} cpu_s_at_off={last_cpu / 1e9:.4f}"))  # fmt: skip
        return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tierscope.testbed.interference")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("burn", help="a bursty CPU burner (2-state MMPP of CPU work)")
    b.add_argument("--utilization", type=float, required=True, help="mean demand, cores")
    b.add_argument("--burstiness", type=float, default=1.0, help="index of dispersion I (>= 1)")
    b.add_argument("--job", type=float, default=0.001, help="CPU seconds per job")
    b.add_argument("--peak", type=float, default=1.0, help="demand while ON, cores (<= 1)")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--bursts", type=Path, default=None, help="log 'start|on|off <ns>' lines here")
    b.add_argument("--duration", type=float, default=None, help="seconds (default: until SIGTERM)")
    b.add_argument("--regular", action="store_true", help="ON and OFF last exactly their means")
    b.add_argument("--nice", type=int, default=0, help="the burner's nice value (below 0 needs root)")
    args = ap.parse_args(argv)
    burn(
        args.utilization, args.burstiness, args.job, args.peak, args.seed, args.bursts, args.duration,
        args.regular, args.nice,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
