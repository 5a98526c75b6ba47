"""The lab network: one Linux bridge, one network namespace per host with a veth pair into it.

Lab `n` uses the bridge `tsbr<n>` with address 10.77.<n>.1/24 (so the machine itself, where the
runner checks health, reaches every host) and gives hosts 10.77.<n>.2, .3, ... in order. Inside
each namespace the veth end is `eth0` and loopback is up. There is no default route and no NAT:
hosts reach each other and the machine, nothing else. A capture on the bridge (promiscuous, as
tcpdump does by default) sees every frame between hosts: one clock for every tier.

Everything carries a marker: namespaces are named `tierscope<n>-<host>`, links have the alias
`tierscope` (see `ip -d link`), which is how `clean` finds them.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

#: the alias (ifalias) set on every link tierscope creates
MARKER = "tierscope"
NETNS_PREFIX = "tierscope"
NETNS_DIR = Path("/run/netns")


class NetworkError(RuntimeError):
    """An `ip` command failed; the message has the command and its error output."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["ip", *args]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except FileNotFoundError as err:
        raise NetworkError("the `ip` program (iproute2) is not installed") from err
    if check and out.returncode != 0:
        raise NetworkError(f"{' '.join(cmd)}: {out.stderr.strip() or 'failed'}")
    return out


def bridge_name(lab: int) -> str:
    return f"tsbr{lab}"


def netns_name(lab: int, host: str) -> str:
    return f"{NETNS_PREFIX}{lab}-{host}"


def veth_name(lab: int, host: str) -> str:
    """The machine-side veth name (at most 15 characters, the kernel's limit)."""
    name = f"ts{lab}-{host}"
    if len(name) <= 15:
        return name
    return f"ts{lab}-" + hashlib.sha1(host.encode()).hexdigest()[: 15 - len(f"ts{lab}-")]


def subnet(lab: int) -> str:
    if not 0 <= lab <= 255:
        raise NetworkError(f"lab number must be 0..255, got {lab}")
    return f"10.77.{lab}"


def unavailable_reason() -> str | None:
    """Why network namespaces cannot be used here (None when they can): tries `ip netns add`."""
    if os.geteuid() != 0:
        return "not running as root (network namespaces need root)"
    probe = f"{NETNS_PREFIX}-probe-{os.getpid()}"
    try:
        out = ip("netns", "add", probe, check=False)
    except NetworkError as err:
        return str(err)
    if out.returncode != 0:
        return f"`ip netns add` was refused: {out.stderr.strip()}"
    ip("netns", "del", probe, check=False)
    return None


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def create_bridge(lab: int) -> str:
    """Create (or reuse) the lab's bridge with its address; returns its name."""
    br = bridge_name(lab)
    if not link_exists(br):
        ip("link", "add", br, "type", "bridge", "forward_delay", "0", "stp_state", "0")
        ip("link", "set", "dev", br, "alias", MARKER)
        ip("addr", "add", f"{subnet(lab)}.1/24", "dev", br)
    ip("link", "set", br, "up")
    return br


def add_host(lab: int, host: str, number: int) -> tuple[str, str]:
    """A namespace for `host` with address 10.77.<lab>.<number> on the bridge; returns (netns, address)."""
    if not 2 <= number <= 254:
        raise NetworkError(f"host number must be 2..254, got {number}")
    ns = netns_name(lab, host)
    veth = veth_name(lab, host)
    address = f"{subnet(lab)}.{number}"
    if (NETNS_DIR / ns).exists():
        ip("netns", "del", ns, check=False)
    if link_exists(veth):
        ip("link", "del", veth, check=False)
    ip("netns", "add", ns)
    ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
    ip("link", "set", "dev", veth, "alias", MARKER)
    ip("link", "set", veth, "master", bridge_name(lab))
    ip("link", "set", veth, "up")
    ip("-n", ns, "link", "set", "lo", "up")
    ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
    ip("-n", ns, "link", "set", "eth0", "up")
    return ns, address


def remove_host(lab: int, host: str) -> None:
    ns = netns_name(lab, host)
    if (NETNS_DIR / ns).exists():
        ip("netns", "del", ns, check=False)
    veth = veth_name(lab, host)
    if link_exists(veth):
        ip("link", "del", veth, check=False)


def remove_bridge(lab: int) -> None:
    br = bridge_name(lab)
    if link_exists(br):
        ip("link", "del", br, check=False)


def marked_links() -> list[str]:
    """Every link on the machine whose alias is tierscope's marker."""
    out = []
    for d in sorted(Path("/sys/class/net").iterdir()):
        try:
            alias = (d / "ifalias").read_text().strip()
        except OSError:
            continue
        if alias == MARKER:
            out.append(d.name)
    return out


def marked_netns() -> list[str]:
    """Every network namespace whose name starts with tierscope's prefix."""
    if not NETNS_DIR.exists():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(NETNS_PREFIX))


def netns_pids(ns: str) -> list[int]:
    out = ip("netns", "pids", ns, check=False)
    return [int(x) for x in out.stdout.split() if x.isdigit()]
