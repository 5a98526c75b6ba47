"""The hosts' clocks: each host's offset from the controller's, measured over SSH, NTP-style.

One SSH session per host runs a tiny probe that answers every line it reads with its clock
(`time.time_ns()`); the controller stamps each exchange before sending (t0) and after the answer
(t1). The sample with the shortest round trip wins: offset = remote - (t0 + t1) / 2, known to
within half that round trip. Offsets go into every point's manifest (`clock_offsets_ns`) and are
applied to what each host recorded; a run whose largest offset is above the bound (inventory
variable `tierscope_clock_bound`, default 10 ms: a fifth of the analysis' 50 ms windows) is
refused, with the offsets and what to do.
"""

from __future__ import annotations

import contextlib
import os
import select
import shlex
import subprocess
import time
from dataclasses import dataclass

from tierscope.remote import RemoteError
from tierscope.remote.inventory import HostEntry

PROBE = (
    "import sys, time\n"
    "shift = int(sys.argv[1])\n"
    "print('ready', flush=True)\n"
    "for line in sys.stdin:\n"
    "    print(time.time_ns() + shift, flush=True)\n"
)


class ClockError(RemoteError):
    """A clock offset above the bound, or a host whose clock could not be read."""


@dataclass
class Offset:
    host: str
    offset_ns: int  # host clock - controller clock
    rtt_ns: int  # the round trip of the sample used (the offset is known to within half of it)


def ssh_argv(host: HostEntry, *, control_dir: str | None = None) -> list[str]:
    """The `ssh` command line Ansible would use for `host` (user, port, key, common args)."""
    v = host.vars
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]
    if v.get("ansible_user"):
        argv += ["-l", str(v["ansible_user"])]
    if v.get("ansible_port"):
        argv += ["-p", str(v["ansible_port"])]
    key = v.get("ansible_ssh_private_key_file") or v.get("ansible_private_key_file")
    if key:
        argv += ["-i", os.path.expanduser(str(key))]
    for k in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        if v.get(k):
            argv += shlex.split(str(v[k]))
    if control_dir:
        argv += ["-o", "ControlMaster=auto", "-o", "ControlPersist=30s", "-o", f"ControlPath={control_dir}/%C"]
    return argv + [host.address]


def measure(host: HostEntry, samples: int = 20, timeout: float = 20.0, shift_ns: int = 0) -> Offset:
    """The offset of `host`'s clock. `shift_ns` is added to the host's answers (a simulated offset,
    for tests of the refusal)."""
    python = str(host.vars.get("ansible_python_interpreter") or "python3")
    remote = f"{shlex.quote(python)} -c {shlex.quote(PROBE)} {int(shift_ns)}"
    proc = subprocess.Popen(
        [*ssh_argv(host), remote],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
        start_new_session=True,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None  # pipes
    stdin, stdout, stderr = proc.stdin, proc.stdout, proc.stderr
    deadline = time.monotonic() + timeout

    def readline() -> str:
        r, _, _ = select.select([stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not r:
            raise ClockError(f"{host.name} ({host.address}): no answer from the clock probe within {timeout:.0f} s")
        line = stdout.readline()
        if not line:
            proc.wait(timeout=5)
            raise ClockError(
                f"{host.name} ({host.address}): cannot read its clock over ssh: "
                f"{stderr.read().strip()[-500:] or f'ssh exited with {proc.returncode}'}"
            )
        return line.strip()

    try:
        if readline() != "ready":
            raise ClockError(f"{host.name}: the clock probe said something unexpected")
        best: tuple[int, int] | None = None
        for _ in range(samples):
            t0 = time.time_ns()
            stdin.write("x\n")
            stdin.flush()
            remote_ns = int(readline())
            t1 = time.time_ns()
            rtt = t1 - t0
            if best is None or rtt < best[1]:
                best = (remote_ns - (t0 + t1) // 2, rtt)
        assert best is not None
        return Offset(host.name, best[0], best[1])
    finally:
        with contextlib.suppress(OSError):
            stdin.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def measure_all(hosts: list[HostEntry], shift_ns: dict[str, int] | None = None) -> dict[str, Offset]:
    return {h.name: measure(h, shift_ns=(shift_ns or {}).get(h.name, 0)) for h in hosts}


def check(offsets: dict[str, Offset], bound_s: float, inventory: str = "the inventory") -> None:
    """Refuse (ClockError) when a host's clock is off by more than `bound_s`."""
    bound_ns = int(bound_s * 1e9)
    bad = {n: o for n, o in offsets.items() if abs(o.offset_ns) > bound_ns}
    if bad:
        listed = ", ".join(f"{n} {o.offset_ns / 1e6:+.1f} ms (±{o.rtt_ns / 2e6:.1f})" for n, o in sorted(bad.items()))
        raise ClockError(
            f"clock offset above the bound of {bound_s * 1e3:g} ms: {listed}. Timestamps from these hosts "
            "would put requests in the wrong 50 ms windows. Synchronise the clocks (chrony/NTP: `chronyc "
            "makestep`), or raise tierscope_clock_bound in the inventory's all.vars if you accept the error "
            f"({inventory})."
        )
