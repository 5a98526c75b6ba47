"""`tierscope rubbos`: start, stop and load the RUBBoS bulletin board (nginx, gunicorn app
servers, PostgreSQL or MariaDB) on this machine."""

from __future__ import annotations

from pathlib import Path

import typer

rubbos_app = typer.Typer(
    help="The RUBBoS bulletin board as a real 3-tier system: up, down, load, workloads.\n\n"
    "Example: tierscope rubbos up --dbms mariadb --scale tiny --app-servers 2",
    no_args_is_help=True,
)


@rubbos_app.command("up")
def up(
    dbms: str = typer.Option("postgresql", help="postgresql or mariadb"),
    scale: str = typer.Option("tiny", help="data scale: tiny, small or paper"),
    app_servers: int = typer.Option(1, "--app-servers", min=1, help="number of gunicorn app servers"),
    workers: int = typer.Option(2, min=1, help="worker processes per app server"),
    threads: int = typer.Option(8, min=1, help="threads per worker (like Tomcat maxThreads)"),
    pool_size: int = typer.Option(0, min=0, help="DB connections per worker (0 = threads)"),
    balance: str = typer.Option("round_robin", help="nginx balancing: round_robin or least_conn"),
    port: int = typer.Option(8080, help="nginx port"),
    app_port: int = typer.Option(9001, help="first app server port (then +1, +2, ...)"),
    db_port: int = typer.Option(0, help="database port (0 = 25432 for PostgreSQL, 23306 for MariaDB)"),
    seed: int = typer.Option(42, help="data generator seed"),
    fresh: bool = typer.Option(False, help="reload the data even if a fresh snapshot exists"),
    run_dir: Path = typer.Option(
        None,
        help="where configs, logs and state go (default /run/tierscope/rubbos as root, else "
        "$XDG_RUNTIME_DIR/tierscope/rubbos or ~/.local/state/tierscope/rubbos); refused when another user "
        "owns it or can write to it",
    ),
    snapshots: Path = typer.Option(None, help="snapshot directory (default ~/.cache/tierscope/rubbos/snapshots)"),
) -> None:
    """Start the database (restoring or loading the scale), N app servers and nginx; print the URL.

    Example: tierscope rubbos up --dbms postgresql --scale tiny --app-servers 2
    """
    from tierscope.apps.rubbos import system
    from tierscope.services.base import ServiceError

    if dbms not in ("postgresql", "mariadb"):
        raise typer.BadParameter(f"expected postgresql or mariadb, got {dbms!r}", param_hint="--dbms")
    if balance not in ("round_robin", "least_conn"):
        raise typer.BadParameter(f"expected round_robin or least_conn, got {balance!r}", param_hint="--balance")
    from tierscope.apps.rubbos.datagen import PRESETS

    if scale not in PRESETS:
        raise typer.BadParameter(f"expected one of {', '.join(PRESETS)}, got {scale!r}", param_hint="--scale")
    o = system.Options(
        dbms=dbms,
        scale=scale,
        seed=seed,
        app_servers=app_servers,
        workers=workers,
        threads=threads,
        pool_size=pool_size or None,
        balance=balance,
        port=port,
        app_port=app_port,
        db_port=db_port or None,
        run_dir=run_dir or system.DEFAULT_RUN_DIR,
        fresh=fresh,
    )
    if snapshots:
        o.snapshots = snapshots
    try:
        s = system.bring_up(o, say=typer.echo)
    except (ServiceError, OSError, ValueError) as err:
        typer.echo(f"rubbos up failed: {err}", err=True)
        raise typer.Exit(1) from err
    assert s.web is not None  # bring_up starts the web tier
    typer.echo(f"nginx access log: {s.web.access_log}")
    typer.echo(f"state: {Path(o.run_dir) / 'state.json'} (stop with: tierscope rubbos down)")
    typer.echo(s.url)


@rubbos_app.command("down")
def down(run_dir: Path = typer.Option(None, help="the run directory given to `up`")) -> None:
    """Stop everything `tierscope rubbos up` started.

    Only processes whose pid, start time and command line still match what `up` recorded are
    signalled. A state directory or file another user owns or can write to, or a symbolic link, is
    refused (exit 1, nothing stopped); a recorded process that is no longer the one `up` started is
    left alone and named (exit 1).

    Example: tierscope rubbos down
    """
    from tierscope.apps.rubbos import system
    from tierscope.services.base import ServiceError

    try:
        system.bring_down(run_dir or system.DEFAULT_RUN_DIR, say=typer.echo)
    except ServiceError as err:
        typer.echo(f"rubbos down: {err}", err=True)
        raise typer.Exit(1) from err


@rubbos_app.command("load")
def load(
    dbms: str = typer.Option("postgresql", help="postgresql or mariadb"),
    scale: str = typer.Option("tiny", help="tiny, small or paper"),
    seed: int = typer.Option(42),
    db_port: int = typer.Option(0, help="database port (0 = default)"),
    run_dir: Path = typer.Option(
        None, help="scratch directory for the database server (default rubbos-load next to up's run directory)"
    ),
    snapshots: Path = typer.Option(None, help="snapshot directory (default ~/.cache/tierscope/rubbos/snapshots)"),
) -> None:
    """Generate and bulk-load a scale into a fresh database server, report rows per table and the
    database size, and save the snapshot that `up` restores.

    Example: tierscope rubbos load --dbms mariadb --scale small
    """
    from tierscope.apps.rubbos import system
    from tierscope.apps.rubbos.datagen import PRESETS
    from tierscope.services.base import ServiceError

    if scale not in PRESETS:
        raise typer.BadParameter(f"expected one of {', '.join(PRESETS)}, got {scale!r}", param_hint="--scale")
    o = system.Options(
        dbms=dbms,
        scale=scale,
        seed=seed,
        db_port=db_port or None,
        fresh=True,
        run_dir=run_dir or system.DEFAULT_RUN_DIR.with_name("rubbos-load"),
    )
    if snapshots:
        o.snapshots = snapshots
    import shutil

    from tierscope.statedir import StateError, secure_dir

    try:
        secure_dir(o.run_dir)
    except StateError as err:
        typer.echo(f"rubbos load failed: {err}", err=True)
        raise typer.Exit(1) from err
    work = Path(o.run_dir) / dbms
    if work.exists():
        shutil.rmtree(work)
    try:
        db, _cfg, _report, _ = system.start_loaded_db(o, work, say=typer.echo)
    except (ServiceError, OSError, ValueError) as err:
        typer.echo(f"rubbos load failed: {err}", err=True)
        raise typer.Exit(1) from err
    db.stop()


@rubbos_app.command("workloads")
def workloads(
    out: Path = typer.Option(None, help="directory to write to (default: the package's workloads/)"),
    users: int = typer.Option(100, help="emulated users in the files"),
) -> None:
    """Write the RUBBoS workload files (browse_only, read_write and the no-search variants).

    Example: tierscope rubbos workloads --out /tmp/wl --users 200
    """
    import shutil

    from tierscope.apps.rubbos import mixes

    target = out or mixes.WORKLOAD_DIR
    target.mkdir(parents=True, exist_ok=True)
    for mix in mixes.MIXES:
        p = target / f"{mix}.toml"
        p.write_text(mixes.workload_toml(mix, users=users))
        typer.echo(p)
    if target != mixes.WORKLOAD_DIR:
        shutil.copy(mixes.WORKLOAD_DIR / "dictionary.txt", target / "dictionary.txt")


def register(app: typer.Typer) -> None:
    app.add_typer(rubbos_app, name="rubbos")
