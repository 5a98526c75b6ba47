"""python -m tierscope.middleware: run the RAIDb-1 clustering middleware until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from tierscope.middleware import balance
from tierscope.middleware.manager import (
    WAITS,
    NoBackend,
    RequestManager,
    log,
    make_backends,
)
from tierscope.middleware.mysql_server import PASSWORD_ENV, password_from_env

EPILOG = """\
Reads (SELECT without FOR UPDATE/SHARE/LOCK IN SHARE MODE, SHOW, VALUES, TABLE) go to one backend;
every other statement is broadcast to all enabled backends under one database-wide write lock. A
backend that fails a write another backend executed is disabled. Counts go to --stats on exit.

Protocols (--protocol): postgres (PostgreSQL v3 on both sides; the middleware logs in to the
backends with trust authentication) or mysql (MariaDB/MySQL on both sides: the middleware logs in
to the backends as --user with mysql_native_password and the password in the environment variable
TIERSCOPE_MIDDLEWARE_PASSWORD, and accepts that same user and password from its clients). With
mysql the text protocol (COM_QUERY, COM_PING, COM_INIT_DB, COM_RESET_CONNECTION, COM_SET_OPTION,
COM_QUIT) and prepared statements (COM_STMT_PREPARE/EXECUTE/CLOSE/RESET: a statement is prepared on
a backend connection the first time it runs there) are served; cursors (COM_STMT_FETCH) and
COM_STMT_SEND_LONG_DATA are answered with ERR 1235; no SSL, compression or LOAD DATA LOCAL INFILE.

Example: python -m tierscope.middleware --listen 127.0.0.1:25322 --backend 127.0.0.1:5433 \\
    --backend 127.0.0.1:5434 --db rubbos --user postgres --pool 16 --policy lprf --stats mw.json
Example (MariaDB): TIERSCOPE_MIDDLEWARE_PASSWORD=tierscope python -m tierscope.middleware \\
    --protocol mysql --listen 127.0.0.1:25322 --backend 127.0.0.1:3307 --backend 127.0.0.1:3308 \\
    --db rubbos --user tierscope --stats mw.json
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m tierscope.middleware",
        description="A C-JDBC-like RAIDb-1 clustering middleware speaking the PostgreSQL or the MySQL protocol.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--listen", required=True, metavar="ADDR:PORT", help="address and port clients connect to")
    ap.add_argument(
        "--backend",
        action="append",
        required=True,
        metavar="HOST:PORT",
        help="a database server (repeat; the order is the LPRF order)",
    )
    ap.add_argument(
        "--protocol",
        choices=("postgres", "mysql"),
        default="postgres",
        help="the wire protocol on both sides: postgres (PostgreSQL backends, default) or mysql (MariaDB backends)",
    )
    ap.add_argument("--db", default="rubbos", metavar="NAME", help="the database served (default: rubbos)")
    ap.add_argument(
        "--user",
        help="the user the middleware connects to the backends as, with the password in $" + PASSWORD_ENV + " "
        "(postgres: scram-sha-256; mysql: mysql_native_password), and the only user its clients may "
        "log in as, with the same password (default tierscope, the lab's user)",
    )
    ap.add_argument("--pool", type=int, default=16, help="connections to each backend at most (default: 16)")
    ap.add_argument(
        "--policy",
        choices=balance.POLICIES,
        default=balance.LPRF,
        help="read balancing: lprf = Least-Pending-Requests-First (default), rr = round robin, "
        "wrr = weighted round robin (--weights), lrt = least (pending + 1) x recent read latency, "
        "aware = least expected wait (the expected remaining service of the reads in flight, by "
        "their statements' moving-average service times: away from replicas busy with heavy queries)",
    )
    ap.add_argument(
        "--weights", metavar="W,W,...", help="with wrr: one weight per --backend, in order (default: all 1)"
    )
    ap.add_argument(
        "--labels",
        action="store_true",
        help="keep per-statement service times and heavy reads per backend under any policy "
        "(aware always does); they go to --stats",
    )
    ap.add_argument(
        "--heavy-factor",
        type=float,
        default=10.0,
        metavar="K",
        help="a statement is heavy when its average service time is more than K times the typical "
        "read's (the median over the reads; default: 10)",
    )
    ap.add_argument(
        "--series-interval",
        type=float,
        default=0.05,
        metavar="S",
        help="sample pending requests, heavy reads in flight and reads done per backend every S "
        "seconds into the stats' series (the last hour at 50 ms; 0: off; default: 0.05)",
    )
    ap.add_argument(
        "--wait",
        choices=WAITS,
        default="first",
        help="answer a write after the first backend succeeded (default) or after all finished",
    )
    ap.add_argument(
        "--loop",
        choices=("auto", "asyncio", "uvloop"),
        default="auto",
        help="the event loop: uvloop (libuv, faster) or asyncio's own; auto = uvloop when it is installed (default)",
    )
    ap.add_argument("--stats", metavar="PATH", help="write the counts as JSON here on exit")
    ap.add_argument(
        "--connect-timeout", type=float, default=10.0, help="seconds to wait for the backends at start (default: 10)"
    )
    args = ap.parse_args(argv)
    if args.user is None:
        from tierscope.contracts.dbms import LAB_USER

        args.user = LAB_USER
    host, sep, port = args.listen.rpartition(":")
    if not sep or not port.isdigit() or not host:
        ap.error(f"--listen {args.listen!r}: expected ADDR:PORT")
    args.listen_host, args.listen_port = host.strip("[]"), int(port)
    if args.heavy_factor <= 1:
        ap.error(f"--heavy-factor {args.heavy_factor}: expected > 1")
    if args.series_interval < 0:
        ap.error(f"--series-interval {args.series_interval}: expected >= 0")
    if args.pool < 1:
        ap.error(f"--pool {args.pool}: expected >= 1")
    args.weight_list = [1.0] * len(args.backend)
    if args.weights:
        try:
            args.weight_list = [float(w) for w in args.weights.split(",")]
        except ValueError:
            ap.error(f"--weights {args.weights!r}: expected numbers separated by commas")
        if (
            len(args.weight_list) != len(args.backend)
            or any(w < 0 for w in args.weight_list)
            or not any(w > 0 for w in args.weight_list)
        ):
            ap.error(f"--weights {args.weights!r}: expected {len(args.backend)} weights >= 0, one > 0")
    return args


async def main_async(args: argparse.Namespace) -> int:
    if not password_from_env():
        log(
            f"no password: set {PASSWORD_ENV} to the backends' password (the middleware asks its "
            "clients for the same user and password, and lets no one in without one)"
        )
        return 2
    try:
        backends = make_backends(
            args.backend, args.user, args.db, args.pool, password=password_from_env(), protocol=args.protocol
        )
    except ValueError as err:
        log(str(err))
        return 2
    for b, w in zip(backends, args.weight_list):
        b.weight = w
    manager = RequestManager(
        backends,
        args.policy,
        args.wait,
        database=args.db,
        user=args.user,
        track_labels=args.labels,
        heavy_factor=args.heavy_factor,
        protocol=args.protocol,
        password=password_from_env(),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await manager.check_backends(args.connect_timeout)
    except NoBackend as err:
        log(str(err))
        return 1
    if args.protocol == "mysql":
        from tierscope.middleware.mysql_server import serve
    else:
        from tierscope.middleware.server import serve
    try:
        server = await serve(manager, args.listen_host, args.listen_port)
    except OSError as err:
        log(f"cannot listen on {args.listen}: {err}")
        return 1
    log(
        f"listening on {args.listen} ({args.protocol}); backends {', '.join(args.backend)}; policy {args.policy}; "
        f"wait {args.wait}; pool {args.pool}; loop {type(loop).__module__.split('.')[0]}"
    )
    manager.start_series(args.series_interval)
    try:
        await stop.wait()
    finally:
        manager.stop_series()
        server.close()
        await manager.drain()  # a write answered with wait=first may still run on a slower backend
        manager.close()
        if args.stats:
            manager.write_stats(args.stats)
        s = manager.stats()
        log(
            f"stopped: {s['units']} units, {s['reads']} reads "
            f"({', '.join(str(b['reads']) for b in s['backends'])} per backend), {s['writes']} writes, "
            f"disabled: {s['disabled'] or 'none'}"
        )
    return 0


def loop_factory(choice: str):
    """The event loop factory for --loop (None: asyncio's default loop)."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError as err:
        if choice == "uvloop":
            raise SystemExit("middleware: --loop uvloop: uvloop is not installed (pip install uvloop)") from err
        return None
    return uvloop.new_event_loop


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with asyncio.Runner(loop_factory=loop_factory(args.loop)) as runner:
        return runner.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
