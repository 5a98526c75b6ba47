"""python -m tierscope.middleware.bench: what the middleware costs, measured with pgbench (the peer).

Two PostgreSQL servers on loopback with the same pgbench data; pgbench runs the same script
against one server directly and against the middleware in front of both, side by side:
read-only (`-S`, extended protocol and prepared statements) and pgbench's TPC-B-like read/write
transactions (BEGIN ... END, which the middleware broadcasts under its write lock). Prints every
figure, then one line of key=value pairs. Needs root (PostgreSQL runs as its own OS user).

Example: python -m tierscope.middleware.bench --seconds 8 --clients 4
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def pgbench(bindir: Path, host: str, port: int, args: list[str], seconds: int) -> float:
    """Transactions per second pgbench reports (without connection time)."""
    out = subprocess.run([str(bindir / "pgbench"), "-h", host, "-p", str(port), "-U", "postgres", "-n",
                          "-T", str(seconds), *args, "bench"], capture_output=True, text=True, timeout=seconds + 60)
    if out.returncode != 0:
        raise RuntimeError(f"pgbench {' '.join(args)} on {host}:{port} failed:\n{out.stdout}\n{out.stderr}")
    m = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out.stdout)
    if not m:
        raise RuntimeError(f"no tps in pgbench output:\n{out.stdout}")
    return float(m.group(1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tierscope.middleware.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=8, help="length of each pgbench run (default 8)")
    ap.add_argument("--clients", type=int, default=4, help="pgbench clients (default 4)")
    ap.add_argument("--policy", default="lprf", choices=("lprf", "rr"))
    args = ap.parse_args(argv)

    from tierscope.services.base import free_port
    from tierscope.services.middleware import Middleware
    from tierscope.services.postgres import Postgres, pg_bindir
    from tierscope.testbed.host import Host

    bindir = pg_bindir()
    work = Path(tempfile.mkdtemp(prefix="tierscope-mw-bench-"))
    pgs = [Postgres(Host.loopback(f"db{i}"), free_port(), work / f"db{i}", fsync=False, name=f"db{i}")
           for i in (1, 2)]
    started: list = []
    figures: dict[str, float] = {}
    try:
        for p in pgs:
            p.start()
            started.append(p)
            p.create_database("bench")
            subprocess.run([str(bindir / "pgbench"), "-i", "-q", "-s", "1", "-h", p.host.address, "-p", str(p.port),
                            "-U", "postgres", "bench"], check=True, capture_output=True)
        mw = Middleware(Host.loopback("mw"), free_port(), work / "mw", backends=[p.address for p in pgs],
                        database="bench", pool=max(4, args.clients), policy=args.policy)
        mw.start()
        started.append(mw)
        c = ["-c", str(args.clients), "-j", "1"]
        cases = [("select_extended", ["-S", "-M", "extended"]), ("select_prepared", ["-S", "-M", "prepared"]),
                 ("tpcb", ["-M", "extended"])]
        def balances() -> list[int]:
            return [int(p.sql("SELECT sum(abalance) FROM pgbench_accounts", "bench")[0][0]) for p in pgs]

        for name, extra in cases:
            direct = pgbench(bindir, pgs[0].host.address, pgs[0].port, c + extra, args.seconds)
            before = balances()  # the direct run changed the first server only
            via = pgbench(bindir, mw.host.address, mw.port, c + extra, args.seconds)
            after = balances()
            figures[f"{name}_direct_tps"] = direct
            figures[f"{name}_middleware_tps"] = via
            print(f"{name:16s} direct {direct:9.1f} tps   through the middleware {via:9.1f} tps   "
                  f"({via / direct:.0%} of direct)", flush=True)
        mw.stop()
        stats = mw.stats()
        print(f"middleware: {stats['reads']} reads ({', '.join(str(b['reads']) for b in stats['backends'])} per "
              f"backend), {stats['writes']} write units, disabled {stats['disabled'] or 'none'}")
        changes = [a - b for a, b in zip(after, before)]
        print(f"the middleware's read/write run changed both replicas alike: {changes[0] == changes[1]} "
              f"(sum(abalance) changes {changes})")
        figures["replicas_agree"] = int(changes[0] == changes[1])
    finally:
        for s in reversed(started):
            s.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
