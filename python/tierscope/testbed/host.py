"""A host: where a server runs. Either the machine's loopback, or a network namespace of its own
with an address on tierscope's bridge and its own cgroups (CPU, memory, disk limits).

Services (tierscope.services) take a Host and start their program through `host.wrap(argv)`, and
listen on `host.address`. The testbed issue creates namespaced hosts; loopback works everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Host:
    """Where a server runs: `netns` None means the machine itself (loopback)."""

    name: str
    address: str = "127.0.0.1"
    netns: str | None = None
    #: cgroup v1 paths relative to each controller root, e.g. "tierscope/db1"; None = no limits.
    cgroup: str | None = None
    controllers: tuple[str, ...] = field(default=("cpu", "cpuacct", "memory", "blkio"))
    #: environment every process of the host gets (e.g. its disk's, `testbed.serialdisk`)
    env: tuple[tuple[str, str], ...] = ()

    @classmethod
    def loopback(cls, name: str = "local") -> Host:
        return cls(name=name)

    def wrap(self, argv: list[str]) -> list[str]:
        """The command line that runs `argv` inside this host (namespace and cgroups).

        The process joins the host's cgroups first (in the root mount namespace, where
        /sys/fs/cgroup is visible: `ip netns exec` remounts /sys) and then enters the network
        namespace; children inherit both. Joining fails loudly (exit 125) rather than run unlimited.
        """
        out = list(argv)
        if self.env:
            out = ["env", *(f"{k}={v}" for k, v in self.env), *out]
        if self.netns:
            out = ["ip", "netns", "exec", self.netns, *out]
        if self.cgroup:
            procs = " ".join(f"/sys/fs/cgroup/{c}/{self.cgroup}/cgroup.procs" for c in self.controllers)
            script = (
                f'for f in {procs}; do echo $$ > "$f" || '
                '{ echo "tierscope: cannot join cgroup $f" >&2; exit 125; }; done; exec "$@"'
            )
            out = ["sh", "-c", script, "tierscope-host", *out]
        return out

    @property
    def limited(self) -> bool:
        """True when this host has cgroup limits of its own."""
        return self.cgroup is not None
