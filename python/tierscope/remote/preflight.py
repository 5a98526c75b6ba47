"""Before the first point of a `--hosts` run: can every host run tierscope?

Each point's playbooks start `PYTHON -m tierscope.remote.agent` on the hosts (PYTHON: the
inventory's `tierscope_python`, default the controller's own interpreter). On a host where that
interpreter has no tierscope, every point failed the same way, each with a screenful of Ansible's
JSON. `check_tierscope` asks every host once, over SSH (as `clock` does), and refuses the run in
one line naming the hosts and what is missing there.
"""

from __future__ import annotations

import shlex
import subprocess

from tierscope.remote import RemoteError
from tierscope.remote.clock import ssh_argv
from tierscope.remote.inventory import HostEntry

#: what a host's interpreter must be able to do: import the agent; it prints tierscope's version
PROBE = "import tierscope, tierscope.remote.agent; print(tierscope.__version__)"


class HostsNotReady(RemoteError):
    """One or more hosts cannot run tierscope's agent."""


def why_not(python: str, returncode: int, stderr: str) -> str:
    """What an interpreter's failed probe says, in a few words: 'PYTHON has no module tierscope',
    'PYTHON does not exist', or the last line of its error."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    last = lines[-1] if lines else f"exit status {returncode}"
    if "No module named" in last:
        missing = last.split("No module named", 1)[1].strip(" '\"():")
        return f"{python} has no module {missing.split('.')[0] or 'tierscope'}"
    if returncode == 127 or "No such file or directory" in last or "not found" in last:
        return f"{python} does not exist"
    return f"{python}: {last[-300:]}"


def probe(host: HostEntry, timeout: float = 60.0) -> tuple[str | None, str | None]:
    """(tierscope's version on `host`, None), or (None, why it cannot run there)."""
    remote = f"{shlex.quote(host.python)} -c {shlex.quote(PROBE)}"
    try:
        out = subprocess.run([*ssh_argv(host), remote], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"no answer over ssh within {timeout:.0f} s"
    if out.returncode == 255:  # ssh's own failure
        return None, f"ssh: {(out.stderr.strip().splitlines() or ['exit status 255'])[-1]}"
    if out.returncode != 0:
        return None, why_not(host.python, out.returncode, out.stderr)
    return (out.stdout.strip().splitlines() or ["?"])[-1], None


def refusal(problems: dict[str, str], hosts: dict[str, HostEntry], inventory: str) -> str:
    """The one line that refuses the run: every host that cannot run tierscope and why."""
    listed = "; ".join(f"{n} ({hosts[n].address}): {why}" for n, why in sorted(problems.items()))
    return (
        f"tierscope cannot run on {len(problems)} of the {len(hosts)} hosts: {listed}. Install tierscope there "
        f"(pip install tierscope, with the same version as here) or set tierscope_python to its interpreter "
        f"in {inventory}"
    )


def check_tierscope(hosts: list[HostEntry], inventory: str = "the inventory") -> dict[str, str]:
    """tierscope's version on every host; HostsNotReady (one line) when a host cannot run it."""
    versions: dict[str, str] = {}
    problems: dict[str, str] = {}
    for h in hosts:
        version, why = probe(h)
        if why is not None:
            problems[h.name] = why
        else:
            assert version is not None  # probe gives a version or why not
            versions[h.name] = version
    if problems:
        raise HostsNotReady(refusal(problems, {h.name: h for h in hosts}, inventory))
    return versions
