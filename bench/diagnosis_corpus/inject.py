#!/usr/bin/env python3
"""Fault injectors of the diagnosis corpus, each a process of its own with its own log (JSON lines).

  inject.py pause --procs FILE [--procs FILE] --period S --min-ms A --max-ms B --jitter J --seconds T --log L
      stop-the-world pauses: SIGSTOP every process listed in the cgroup.procs FILEs (read anew at each
      pause), sleep A..B ms, SIGCONT them; a pause starts every S s (+- J*S). Logs each pause's exact
      start_ns/end_ns (CLOCK_REALTIME, the spans' clock) and how many processes it stopped.
  inject.py burn --procs FILE [--procs FILE] --on S --off S --seconds T --log L
      a bursty noisy neighbour: joins the cgroups whose cgroup.procs FILEs are given, then burns one
      CPU for S s, idles for S s, and so on; logs each burst.
Both stop by themselves after T seconds, and on SIGTERM (a pause in progress is always ended).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import time

_stop = False


def _term(*_):
    global _stop
    _stop = True


def _pids(files: list[str]) -> list[int]:
    out: list[int] = []
    for f in files:
        try:
            out.extend(int(x) for x in open(f).read().split())
        except OSError:
            pass
    return sorted(set(out) - {os.getpid()})


def _signal(pids: list[int], sig: int) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


def pause(a, log) -> None:
    rng = random.Random(a.seed)
    t_end = time.monotonic() + a.seconds
    time.sleep(a.start)
    while not _stop and time.monotonic() < t_end:
        length = rng.uniform(a.min_ms, a.max_ms) / 1000.0
        pids = _pids(a.procs)
        start = time.time_ns()
        _signal(pids, signal.SIGSTOP)
        try:
            time.sleep(length)
        finally:
            _signal(pids, signal.SIGCONT)
            end = time.time_ns()
        log.write(json.dumps({"kind": "pause", "start_ns": start, "end_ns": end, "pids": len(pids)}) + "\n")
        log.flush()
        gap = a.period * (1 + rng.uniform(-a.jitter, a.jitter)) - length
        time.sleep(max(0.05, gap))


def burn(a, log) -> None:
    for f in a.procs:
        with open(f, "w") as fh:
            fh.write(str(os.getpid()))
    t_end = time.monotonic() + a.seconds
    time.sleep(a.start)
    while not _stop and time.monotonic() < t_end:
        start = time.time_ns()
        until = time.monotonic() + a.on
        acc = 0
        while time.monotonic() < until and not _stop:
            for i in range(2000):
                acc = (acc + i * i) % 1_000_003
        log.write(json.dumps({"kind": "burst", "start_ns": start, "end_ns": time.time_ns()}) + "\n")
        log.flush()
        time.sleep(a.off)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=("pause", "burn"))
    p.add_argument("--procs", action="append", required=True)
    p.add_argument("--period", type=float, default=1.0)
    p.add_argument("--min-ms", type=float, default=100)
    p.add_argument("--max-ms", type=float, default=200)
    p.add_argument("--jitter", type=float, default=0.2)
    p.add_argument("--on", type=float, default=1.0)
    p.add_argument("--off", type=float, default=1.0)
    p.add_argument("--start", type=float, default=1.0)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--log", required=True)
    a = p.parse_args()
    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    with open(a.log, "w") as log:
        (pause if a.mode == "pause" else burn)(a, log)


if __name__ == "__main__":
    main()
