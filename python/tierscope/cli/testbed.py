"""`tierscope testbed up|down|status|clean`: build and remove the hosts of a spec by hand."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

testbed_app = typer.Typer(
    name="testbed",
    help="Build the hosts of a spec (network namespaces on a bridge, cgroup limits) and remove "
    "them.\n\nExample: tierscope testbed up examples/specs/tiny.toml",
    no_args_is_help=True,
    add_completion=False,
)

LAB_OPTION = typer.Option(0, "--lab", min=0, max=255, help="Lab number: bridge tsbr<N>, subnet 10.77.<N>.0/24.")


def _pick_point(spec_path: Path, point: str | None):
    from tierscope.spec import SpecError, expand, load_spec

    try:
        points = expand(load_spec(spec_path))
    except SpecError as err:
        raise typer.BadParameter(str(err), param_hint="SPEC") from None
    if point is None:
        return points[0], len(points)
    for p in points:
        if point == p.id or point == str(p.index):
            return p, len(points)
    raise typer.BadParameter(
        f"no point {point!r} in {spec_path}; points are 0..{len(points) - 1} or ids such as {points[0].id}",
        param_hint="--point",
    )


@testbed_app.command("up")
def up(
    spec: Path = typer.Argument(..., exists=True, dir_okay=False, help="The experiment spec (TOML)."),
    point: str = typer.Option(None, "--point", help="Which sweep point (index or id); default the first."),
    lab: int = LAB_OPTION,
    mode: str = typer.Option("auto", "--mode", help="auto, namespaces or loopback."),
) -> None:
    """Build the hosts of one point of SPEC and leave them up (state in /run/tierscope).

    Run programs in a host with `ip netns exec tierscope<LAB>-<host> ...`. Labs orphaned by a run
    that died (its owner process gone) are named first, one line each; `tierscope testbed clean
    --orphans` removes them.

    Example: tierscope testbed up examples/specs/tiny.toml --point 0
    """
    from tierscope.testbed.lab import Testbed, TestbedError

    p, n = _pick_point(spec, point)
    _say_orphans(Console(stderr=True, highlight=False, soft_wrap=True))
    tb = Testbed(lab=lab, mode=mode)
    try:
        tb.up(p)
    except TestbedError as err:
        Console(stderr=True).print(f"[red]testbed up failed:[/red] {escape(str(err))}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    tb.detach()
    console = Console(soft_wrap=True)
    console.print(f"point {p.index} of {n}: {p.id} ({p.config.notation()})", markup=False)
    console.print(tb.describe(), markup=False, highlight=False)
    console.print(f"state: {tb.state_file}", markup=False)
    from tierscope.services.credentials import lab_credentials

    creds = lab_credentials(tb.workdir)
    console.print(
        f"database credentials: {creds.path} (user {creds.user}, root only; the database servers and "
        f"the middleware tierscope starts with their work directories in {tb.workdir} require them)",
        markup=False,
        highlight=False,
    )


@testbed_app.command("down")
def down(lab: int = LAB_OPTION) -> None:
    """Remove the hosts of a lab built by `tierscope testbed up` (processes, namespaces, cgroups).

    Example: tierscope testbed down --lab 0
    """
    from tierscope.testbed.lab import Testbed, TestbedError

    try:
        tb = Testbed.from_state(lab)
        tb.down()
    except TestbedError as err:
        Console(stderr=True).print(f"[red]testbed down:[/red] {escape(str(err))}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    Console().print(f"lab {lab} is down")


def _say_orphans(console: Console) -> list:
    """One line per orphaned lab (its owner is dead); returns them."""
    from tierscope.testbed.lab import find_orphans

    try:
        orphans = find_orphans()
    except OSError:
        return []
    for o in orphans:
        console.print(f"{o} (remove with `tierscope testbed clean --orphans`)", markup=False)
    return orphans


@testbed_app.command("status")
def status() -> None:
    """Show every lab that is up, and anything tierscope left that no lab claims.

    A lab whose owner process is dead (a run that was SIGKILLed) and that was not left up on
    purpose by `testbed up` is shown as orphaned: "lab 0: orphaned, owner pid 28923 dead".

    Example: tierscope testbed status
    """
    import json

    from tierscope.testbed import clean as cleaning
    from tierscope.testbed import network
    from tierscope.testbed.lab import Testbed, state_dir

    console = Console(highlight=False, soft_wrap=True)
    orphaned = {o.lab for o in _say_orphans(console)}
    files = sorted(state_dir().glob("lab*.json")) if state_dir().exists() else []
    claimed_ns: set[str] = set()
    for f in files:
        try:
            lab = int(json.loads(f.read_text())["lab"])
            tb = Testbed.from_state(lab)
        except Exception as err:
            console.print(f"{f}: unreadable ({err})", markup=False)
            continue
        first, _, rest = tb.describe().partition("\n")
        console.print(first + (" — ORPHANED (owner dead)" if lab in orphaned else ""), markup=False)
        if rest:
            console.print(rest, markup=False)
        for name, h in tb.hosts.items():
            if h.netns:
                claimed_ns.add(h.netns)
                alive = (network.NETNS_DIR / h.netns).exists()
                pids = tb.pids(name)
                console.print(
                    f"    {name}: netns {'present' if alive else 'MISSING'}, {len(pids)} processes",
                    markup=False,
                )
    if not files:
        console.print("no lab is up")
    try:
        left = cleaning.leftovers()
    except OSError:
        left = {}
    stray_ns = [n for n in left.get("netns", []) if n not in claimed_ns]
    if stray_ns or (not files and any(left.get(k) for k in ("links", "cgroups", "processes"))):
        console.print(
            "left over (remove with `tierscope testbed clean`): "
            + ", ".join(f"{len(v)} {k}" for k, v in left.items() if v)
        )


@testbed_app.command("clean")
def clean(
    orphans: bool = typer.Option(
        False,
        "--orphans",
        help="Remove only the labs whose owner is dead (a killed run's): their processes, namespaces, "
        "bridge, veths and cgroups; labs in use and labs left up by `testbed up` are kept.",
    ),
) -> None:
    """Remove every namespace, link, cgroup and process tierscope left, and nothing else.

    Also PostgreSQL's shared memory segments in /dev/shm that killed servers left, when no
    PostgreSQL server runs. With --orphans, only the labs whose owner process is dead (`tierscope
    run` does this at its start). Both remove the stand-in SSH hosts of a killed `testbed
    ssh-hosts`.

    Example: tierscope testbed clean   or   tierscope testbed clean --orphans
    """
    from tierscope.remote.sshhosts import remove_orphans
    from tierscope.testbed.clean import clean as do_clean
    from tierscope.testbed.lab import state_dir

    console = Console(highlight=False, soft_wrap=True)
    for line in remove_orphans():  # stand-in SSH hosts whose `testbed ssh-hosts` was killed
        console.print(line, markup=False)
    if orphans:
        raise typer.Exit(clean_orphans(console))

    out = do_clean(state_dir())
    console.print(
        f"removed {len(out.processes)} processes, {len(out.netns)} namespaces, {len(out.links)} "
        f"links, {len(out.cgroups)} cgroup directories, {len(out.state_files)} state files and work dirs, "
        f"{len(out.segments)} PostgreSQL shared memory segments left by killed servers"
    )
    for e in out.errors:
        console.print(f"[red]could not remove:[/red] {escape(str(e))}", soft_wrap=True)
    if out.errors:
        raise typer.Exit(1)


def clean_orphans(console: Console) -> int:
    """Remove every orphaned lab, one line each; returns 1 when something could not be removed."""
    from tierscope.testbed.lab import find_orphans, remove_orphan

    found = find_orphans()
    if not found:
        console.print("no orphaned lab")
        return 0
    failed = 0
    for o in found:
        gone = remove_orphan(o.lab)
        console.print(
            f"{o}: removed {len(gone['processes'])} processes, {len(gone['netns'])} namespaces, "
            f"{len(gone['links'])} links (bridge and veths), {len(gone['cgroups'])} cgroup directories",
            markup=False,
        )
        for e in gone["errors"]:
            console.print(f"  could not remove: {e}", markup=False)
        failed |= bool(gone["errors"])
    return int(failed)


def default_groups(count: int) -> dict[str, list[str]]:
    """The inventory groups for `count` stand-in hosts h1..hN without --groups: web h1, app h2, db h3
    (a `1/1/0/1` spec such as examples/specs/tiny.toml), the generator on h4 when there is one, else
    beside the web server on h1."""
    if count < 3:
        raise ValueError(f"{count} hosts: a web, an app and a db host need 3 at least; or give --groups")
    return {"web": ["h1"], "app": ["h2"], "db": ["h3"], "client": ["h4" if count >= 4 else "h1"]}


def parse_groups(text: str, hosts: list[str]) -> dict[str, list[str]]:
    """`--groups "web=h1 app=h2,h3 db=h4 client=h1"` -> {"web": ["h1"], "app": ["h2", "h3"], ...}."""
    from tierscope.remote.inventory import GROUPS

    groups: dict[str, list[str]] = {}
    for item in text.split():
        group, _, names = item.partition("=")
        if group not in GROUPS or not names:
            raise ValueError(f"--groups {item!r}: expected GROUP=HOST[,HOST...] with GROUP one of {', '.join(GROUPS)}")
        unknown = [n for n in names.split(",") if n not in hosts]
        if unknown:
            raise ValueError(f"--groups {item!r}: no host {unknown[0]!r}; the hosts are {', '.join(hosts)}")
        groups.setdefault(group, []).extend(names.split(","))
    return groups


@testbed_app.command("ssh-hosts")
def ssh_hosts(
    count: int = typer.Argument(4, min=1, max=20, help="How many hosts (h1..hN)."),
    inventory: Path = typer.Option(
        Path("inventory.yml"), "--inventory", "-i", help="Where the Ansible inventory of the hosts is written."
    ),
    groups: str | None = typer.Option(
        None,
        "--groups",
        metavar="'GROUP=HOST[,HOST] ...'",
        help="Which host runs which tier, e.g. 'web=h1 app=h2 db=h3 client=h4' (groups: web, app, middleware, db, "
        "client); default: web h1, app h2, db h3, client h4 (or h1 with 3 hosts).",
    ),
) -> None:
    """Stand-in machines on this one: N hosts reached over SSH, to try `tierscope run --hosts`.

    Each host is a network namespace on a bridge (10.233.K.0/24) with its own sshd: generated host
    keys checked against a known_hosts file, key-only root login. The namespaces share this
    machine's files, so tierscope is installed on every host. Writes the inventory (the keys and
    known_hosts it names live while the hosts do), then waits: run the spec in another terminal,
    and press Ctrl-C here to remove the hosts (sshd, namespaces, bridge, keys). Hosts whose owner was
    killed are removed by the next `ssh-hosts`. Needs root and openssh-server.

    Example: [bold]tierscope testbed ssh-hosts 4 -i inv.yml[/bold], then
    [bold]tierscope run examples/specs/tiny.toml --hosts inv.yml[/bold]
    """
    import signal
    import threading

    from tierscope.cli import _output
    from tierscope.remote.sshhosts import SshHosts, remove_orphans, unavailable_reason

    console, err = Console(highlight=False, soft_wrap=True), Console(stderr=True, highlight=False, soft_wrap=True)
    names = [f"h{i + 1}" for i in range(count)]
    try:
        chosen = parse_groups(groups, names) if groups else default_groups(count)
        _output.check_output_file(inventory, "--inventory")
    except (ValueError, OSError) as e:
        err.print(f"[red]error:[/red] {escape(str(e))}")
        raise typer.Exit(_output.BAD_INPUT) from None
    why = unavailable_reason()
    if why:
        err.print(f"[red]error:[/red] stand-in SSH hosts: {escape(why)}")
        raise typer.Exit(_output.BAD_INPUT)
    for line in remove_orphans():
        err.print(line, markup=False)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    lab = SshHosts(names)
    try:
        with console.status(f"starting {count} hosts (namespaces and sshd)"):
            lab.open()
        if stop.is_set():
            raise typer.Exit(130)
        lab.write_inventory(inventory, chosen)
        for n in names:
            tiers = [g for g, hs in chosen.items() if n in hs]
            console.print(f"{n}  {lab.addresses[n]}  {', '.join(tiers) or '(no tier)'}", markup=False)
        console.print(
            f"inventory: {inventory}; try: tierscope run examples/specs/tiny.toml --hosts {inventory}\n"
            "Ctrl-C removes the hosts.",
            markup=False,
        )
        while not stop.wait(0.5):
            pass
    finally:
        with console.status("removing the hosts"):
            lab.close()
    console.print(f"removed {count} hosts", markup=False)


def register(app: typer.Typer) -> None:
    app.add_typer(testbed_app, name="testbed")
