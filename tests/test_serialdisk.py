"""A disk of one arm (`disk_read_ms`, testbed.serialdisk): a read that misses the page cache waits
its service time, one read at a time across the host's processes; a cached read does not wait.

Ground truth is arithmetic: n cold reads at S each cannot end before n x S, and two processes'
reads served one at a time cannot both end before (n1 + n2) x S.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tierscope.spec import expand, parse_spec
from tierscope.testbed import serialdisk
from tierscope.testbed.lab import Testbed, namespaces_unavailable

BLOCK = 8192
# a reader: evicts its file from the page cache, then n reads of distinct blocks (cold), then the
# same reads again (cached); prints the start (monotonic, shared by every process of the
# machine), the two loops' durations and the end
READER = """
import os, sys, time
path, n, first = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fd = os.open(path, os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead: every block a read of its own
blocks = [(first + 37 * i) % 2048 for i in range(n)]
for b in blocks:  # its own blocks only: the other reader's may be cached by now
    os.posix_fadvise(fd, b * 8192, 8192, os.POSIX_FADV_DONTNEED)
t0 = time.monotonic()
for b in blocks:
    assert len(os.pread(fd, 8192, b * 8192)) == 8192
t1 = time.monotonic()
for b in blocks:
    os.pread(fd, 8192, b * 8192)
t2 = time.monotonic()
print(t0, t1 - t0, t2 - t1, t2)
"""


def _data_file(d: Path) -> Path:
    """16 MiB written around the page cache (O_DIRECT): no block of it is cached to begin with
    (freshly written pages do not always leave the cache when asked)."""
    f = d / "data.bin"
    done = subprocess.run(
        ["dd", "if=/dev/urandom", f"of={f}", "bs=1M", "count=16", "oflag=direct"], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"O_DIRECT writes not supported in {d}: {done.stderr.strip()[-200:]}")
    return f


def test_reads_that_miss_the_cache_wait_one_at_a_time_and_cached_ones_do_not(tmp_path):
    lib = serialdisk.library()
    data = _data_file(tmp_path)
    env = dict(os.environ)
    env.update(serialdisk.host_env("h", 30.0, tmp_path / "disks"))
    n, s = 10, 0.030
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", READER, str(data), str(n), str(first)], env=env, stdout=subprocess.PIPE, text=True
        )
        for first in (0, 1000)
    ]
    outs = [p.communicate(timeout=60)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    starts, colds, warms, ends = ([float(o[i]) for o in outs] for i in range(4))
    print(f"\nlibrary {lib.name}; cold loops {colds}, cached loops {warms}")
    # each process' 10 cold reads: at least 10 x 30 ms
    assert min(colds) >= n * s * 0.95, (colds, warms, ends)
    # both processes' 20 reads one at a time: the later one ends no earlier than 20 x 30 ms after
    # the first began
    assert max(ends) - min(starts) >= 2 * n * s * 0.95
    # the same blocks again, cached: no wait (all 10 together under one service time)
    assert max(warms) < s


def test_a_host_with_disk_read_ms_serves_its_users_reads_one_at_a_time(tmp_path):
    """The lab gives every process of such a host the disk (an unprivileged user's too), and the
    blkio read limit that makes the monitor's `disk_util` the arm's busy share (1000 / 25 ms)."""
    reason = namespaces_unavailable()
    if reason:
        pytest.skip(f"namespaced hosts unavailable: {reason}")
    work = Path(tempfile.mkdtemp(prefix="tierscope-serialdisk-", dir="/var/tmp"))
    try:
        work.chmod(0o755)
        data = _data_file(work)
        data.chmod(0o644)
        spec = 'topology = "1/1/0/1D"\n[node_types.D]\ndisk_read_ms = 25\n[workload]\nusers = [1]\n'
        with Testbed(lab=6, workdir=work / "lab") as tb:
            h = tb.up(expand(parse_spec(spec, where="test"))[0])["db1"]
            limit = Path(f"/sys/fs/cgroup/blkio/{h.cgroup}/blkio.throttle.read_iops_device").read_text()
            argv = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                    sys.executable, "-c", READER, str(data), "8", "5"]  # fmt: skip
            t = time.monotonic()
            done = subprocess.run(h.wrap(argv), capture_output=True, text=True, timeout=60)
            wall = time.monotonic() - t
    finally:
        subprocess.run(["rm", "-rf", str(work)])
    assert done.returncode == 0, done.stderr
    assert "cannot be preloaded" not in done.stderr, done.stderr
    _, cold, warm, _ = (float(x) for x in done.stdout.split())
    print(f"\nas nobody on db1: 8 cold reads {cold:.3f} s, cached {warm:.4f} s ({wall:.2f} s in all); limit {limit!r}")
    assert limit.split()[-1] == "40"
    assert cold >= 8 * 0.025 * 0.95
    assert warm < 0.025


THREADS = """
import os, sys, threading, time
path = sys.argv[1]
fd = os.open(path, os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead: every block a read of its own
blocks = [(f + 37 * i) % 2048 for f in (0, 1000) for i in range(6)]
for b in blocks:  # its own blocks only: the other reader's may be cached by now
    os.posix_fadvise(fd, b * 8192, 8192, os.POSIX_FADV_DONTNEED)
def reads(first):
    for i in range(6):
        assert len(os.pread(fd, 8192, ((first + 37 * i) % 2048) * 8192)) == 8192
t0 = time.monotonic()
ts = [threading.Thread(target=reads, args=(f,)) for f in (0, 1000)]
for t in ts: t.start()
for t in ts: t.join()
print(time.monotonic() - t0)
"""


def test_threads_of_one_process_take_the_arm_in_turn(tmp_path):
    """Two threads share their process' descriptor of the lock file (a flock does not exclude its
    own holder): 2 x 6 cold reads at 30 ms still take 12 x 30 ms."""
    data = _data_file(tmp_path)
    env = dict(os.environ)
    env.update(serialdisk.host_env("h", 30.0, tmp_path / "disks"))
    done = subprocess.run(
        [sys.executable, "-c", THREADS, str(data)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) >= 12 * 0.030 * 0.95
