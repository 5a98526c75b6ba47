"""A disk of one head for a lab host (`disk_read_ms` of its node type): the host's processes
run with `serialdisk.c` preloaded, so a read that misses the page cache waits for the host's one
disk arm, which serves one read at a time for `disk_read_ms` each.

The kernel's blkio throttle (`disk_read_iops`) is a token bucket: a read under its rate passes at
once, so a disk at 70 % of its rate adds no time to the reads, and the connections that wait on
it are not held any longer. A disk with one arm adds S / (1 - rho) at utilisation rho, which is
what keeps a database's connections busy while neither its CPU nor its disk is saturated (seed
004 §5). The library is compiled from its C source with the machine's `cc` on first use (`make
setup` does it once) and copied, with the host's lock file, into the lab's work directory, where
every user of the host can read them and none can write them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("serialdisk.c")


class SerialDiskError(RuntimeError):
    pass


def library() -> Path:
    """The compiled library (built when missing or when its source changed)."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    out = Path(sys.prefix) / "lib" / "tierscope" / f"serialdisk-{digest}.so"
    if out.exists():
        return out
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SerialDiskError("disk_read_ms needs a C compiler to build its library (apt-get install gcc)")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out.parent, suffix=".so", delete=False) as tmp:
            part = Path(tmp.name)
    except OSError as err:
        raise SerialDiskError(
            f"cannot build its library in {out.parent}: {err}; build it once as its owner (the first lab with disk_read_ms run by root does)"
        ) from None
    try:
        done = subprocess.run(
            [cc, "-O2", "-shared", "-fPIC", "-Wall", "-o", str(part), str(SOURCE), "-ldl"],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise SerialDiskError(f"cannot build {SOURCE.name}: {done.stderr.strip()[-500:]}")
        part.chmod(0o755)
        part.replace(out)
    finally:
        part.unlink(missing_ok=True)
    return out


def host_env(host: str, read_ms: float, workdir: Path) -> tuple[tuple[str, str], ...]:
    """The environment that gives `host`'s processes a disk of one arm taking `read_ms` per read:
    the library and the host's lock file, placed (root's, mode 0644) in `workdir`."""
    workdir.mkdir(parents=True, exist_ok=True)
    lib = workdir / "serialdisk.so"
    src = library()
    if not lib.exists() or lib.read_bytes() != src.read_bytes():
        tmp = lib.with_suffix(".tmp")
        shutil.copyfile(src, tmp)
        tmp.chmod(0o644)
        tmp.replace(lib)
    lock = workdir / f"{host}.disk"
    lock.touch(mode=0o644, exist_ok=True)
    os.chmod(lock, 0o644)
    return (
        ("LD_PRELOAD", str(lib)),
        ("TIERSCOPE_DISK_READ_NS", str(int(round(read_ms * 1e6)))),
        ("TIERSCOPE_DISK_LOCK", str(lock)),
    )
