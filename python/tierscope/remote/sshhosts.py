"""Stand-in "real hosts" on one machine: network namespaces on a bridge, each with its own sshd.

For the tests and bench/scaleout of the `--hosts` path (research note phase3-scaleout §1.1): the
namespaces share the file system (so tierscope is installed on every "host"), but Ansible reaches
each one over SSH at its own address exactly as it reaches a real machine: real sshd, generated
host keys checked against a known_hosts file, key-only root login.

    with SshHosts(["h1", "h2", "h3"]) as lab:
        lab.write_inventory(path, {"web": ["h1"], "app": ["h2"], "db": ["h3"], "client": ["h3"]})

Needs root, `ip`, `/usr/sbin/sshd` (Debian openssh-server) and `ssh-keygen`. `close()` (also on
exit of the `with`) stops every sshd and SSH master, removes the namespaces, the bridge and the keys.
Each lab records its owner (the process that made it) in its directory; `remove_orphans()` removes
the labs whose owner died without closing them (a killed `tierscope testbed ssh-hosts`, a killed
test), checking every recorded name and pid before it acts on it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

SSHD = "/usr/sbin/sshd"

#: where the labs' directories go (keys, sshd configurations, logs, the owner record)
DIR_PREFIX = "tierscope-sshhosts-"
#: the owner record in a lab's directory: {"owner": pid, "k": subnet, "names": [...], "sshd": {name: pid}}
OWNER_FILE = "lab.json"
_NAME = re.compile(r"[a-z][a-z0-9]{0,14}")


def unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for prog in ("ip", "nsenter", "ssh", "ssh-keygen", "ssh-keyscan"):
        if shutil.which(prog) is None:
            return f"{prog} not installed"
    if not Path(SSHD).exists():
        return f"{SSHD} not installed (apt-get install openssh-server)"
    return None


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=check)


def _free_subnet() -> int:
    used = _run("ip", "-o", "-4", "addr", "show").stdout
    links = {p.name for p in Path("/sys/class/net").iterdir()}
    for k in range(1, 250):
        # a veth of an earlier lab outlives it while its namespace drains (orphaned TCP sockets)
        stale = any(name.startswith(f"tsrv{k}x") for name in links)
        if f" 10.233.{k}." not in used and f"tsrbr{k}" not in links and not stale:
            return k
    raise RuntimeError("no free 10.233.K.0/24 subnet for the SSH hosts")


class SshHosts:
    def __init__(self, names: list[str]):
        bad = [n for n in names if not _NAME.fullmatch(n)]
        if bad or not names or len(set(names)) != len(names):
            raise ValueError(f"host names: expected distinct names like h1 (a-z, 0-9, up to 15), got {names!r}")
        self.names = list(names)
        self.owner = os.getpid()
        self.k = _free_subnet()
        self.bridge = f"tsrbr{self.k}"
        self.dir = Path(tempfile.mkdtemp(prefix=DIR_PREFIX))
        self.addresses = {n: f"10.233.{self.k}.{i + 11}" for i, n in enumerate(self.names)}
        self.netns = {n: f"tsr{self.k}-{n}" for n in self.names}
        self.sshd_pids: dict[str, int] = {}
        self.key = self.dir / "client_key"
        self.known_hosts = self.dir / "known_hosts"

    def __enter__(self) -> SshHosts:
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _record(self) -> None:
        record = {"owner": self.owner, "k": self.k, "names": self.names, "sshd": self.sshd_pids}
        (self.dir / OWNER_FILE).write_text(json.dumps(record))

    def open(self) -> None:
        self._record()  # before the first thing made: a lab killed half-built is still found
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"10.233.{self.k}.1/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key))
        shutil.copy(self.dir / "client_key.pub", self.dir / "authorized_keys")
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
        for i, n in enumerate(self.names):
            ns, veth = self.netns[n], f"tsrv{self.k}x{i}"
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _run("ip", "link", "set", veth, "master", self.bridge, "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.addresses[n]}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            hostkey = self.dir / f"host_{n}"
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(hostkey))
            conf = self.dir / f"sshd_{n}.conf"
            conf.write_text(
                "\n".join(
                    [
                        f"ListenAddress {self.addresses[n]}:22",
                        f"HostKey {hostkey}",
                        f"PidFile {self.dir}/sshd_{n}.pid",
                        f"AuthorizedKeysFile {self.dir}/authorized_keys",
                        "PermitRootLogin prohibit-password",
                        "PasswordAuthentication no",
                        "KbdInteractiveAuthentication no",
                        "UsePAM no",
                        "StrictModes no",
                        "MaxSessions 50",
                        "MaxStartups 50",
                        "Subsystem sftp /usr/lib/openssh/sftp-server",
                        "",
                    ]
                )
            )
            _run(SSHD, "-t", "-f", str(conf))
            # nsenter --net, not `ip netns exec`: that one also remounts /sys, which would hide the
            # cgroup hierarchy from the sessions (a real host sees its /sys/fs/cgroup)
            proc = subprocess.Popen(
                [
                    "nsenter",
                    f"--net=/run/netns/{ns}",
                    SSHD,
                    "-D",
                    "-f",
                    str(conf),
                    "-E",
                    str(self.dir / f"sshd_{n}.log"),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            self.sshd_pids[n] = proc.pid  # nsenter execs: this is sshd's pid
            self._record()
        deadline = time.monotonic() + 15
        lines: list[str] = []
        while time.monotonic() < deadline:
            scan = subprocess.run(
                ["ssh-keyscan", "-T", "2", "-t", "ed25519", *self.addresses.values()],
                capture_output=True,
                text=True,
                timeout=30,
            )
            lines = [ln for ln in scan.stdout.splitlines() if ln and not ln.startswith("#")]
            if len(lines) == len(self.names):
                break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"sshd did not answer on every host: {len(lines)} of {len(self.names)}")
        self.known_hosts.write_text("\n".join(lines) + "\n")

    def host_vars(self) -> dict:
        return {
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(self.key),
            "ansible_python_interpreter": "/usr/bin/python3",
            "ansible_ssh_common_args": f"-o UserKnownHostsFile={self.known_hosts} -o StrictHostKeyChecking=yes",
        }

    def inventory(self, groups: dict[str, list[str]], **extra_vars) -> dict:
        return {
            "all": {
                "vars": {**self.host_vars(), **extra_vars},
                "children": {
                    g: {"hosts": {h: {"ansible_host": self.addresses[h]} for h in hosts}} for g, hosts in groups.items()
                },
            }
        }

    def write_inventory(self, path: str | Path, groups: dict[str, list[str]], **extra_vars) -> Path:
        path = Path(path)
        path.write_text(yaml.safe_dump(self.inventory(groups, **extra_vars), sort_keys=False))
        return path

    def close(self) -> None:
        for pid in self.sshd_pids.values():
            if not _is_sshd(pid):
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                    if Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z":
                        break
                except (ProcessLookupError, OSError):
                    break
                time.sleep(0.05)
            else:
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        self.sshd_pids = {}
        for n in self.names:  # session processes left in a namespace (none expected) die with it
            pids = _run("ip", "netns", "pids", self.netns[n], check=False).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _run("ip", "netns", "del", self.netns[n], check=False)
        _run("ip", "link", "del", self.bridge, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


def _is_sshd(pid: int) -> bool:
    """Is `pid` (still) an sshd? A recorded pid may have been reused by another program."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "sshd"
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _lab_of(record_path: Path) -> SshHosts | None:
    """The lab an owner record describes, rebuilt to be closed; None when the record is not one
    this module wrote (wrong types, names or subnet; a directory not ours alone, or a symlink:
    such a directory is left alone)."""
    d = record_path.parent
    try:
        st = d.lstat()
        if d.is_symlink() or st.st_uid != os.geteuid() or st.st_mode & 0o022 or record_path.is_symlink():
            return None
        rec = json.loads(record_path.read_text())
        owner, k, names, sshd = int(rec["owner"]), int(rec["k"]), list(rec["names"]), dict(rec["sshd"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if owner <= 0 or not 1 <= k < 250 or not all(isinstance(n, str) and _NAME.fullmatch(n) for n in names):
        return None
    if set(sshd) - set(names) or not all(isinstance(p, int) and p > 1 for p in sshd.values()):
        return None
    lab = SshHosts.__new__(SshHosts)
    lab.names, lab.k, lab.bridge, lab.dir = names, k, f"tsrbr{k}", record_path.parent
    lab.netns = {n: f"tsr{k}-{n}" for n in names}
    lab.sshd_pids = sshd
    lab.owner = owner
    return lab


def remove_orphans(tmp: Path | None = None) -> list[str]:
    """Remove the stand-in labs whose owner process is dead; returns one line per lab removed."""
    gone = []
    for record in sorted(Path(tmp or tempfile.gettempdir()).glob(f"{DIR_PREFIX}*/{OWNER_FILE}")):
        lab = _lab_of(record)
        if lab is None or _alive(lab.owner):
            continue
        lab.close()
        gone.append(f"SSH hosts {', '.join(lab.names)} on {lab.bridge}: owner pid {lab.owner} dead, removed")
    return gone
