"""tierscope.procs: CPU time of a process tree, from /proc."""

from __future__ import annotations

import subprocess
import sys
import time

from tierscope.procs import cpu_seconds


def test_cpu_seconds_counts_a_busy_process_and_not_a_sleeping_one():
    busy = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\nimport sys; sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
    )
    idle = subprocess.Popen(["sleep", "30"])
    try:
        deadline = time.monotonic() + 20
        while cpu_seconds([busy.pid]) < 0.6 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # past its loop, waiting on its input
        spent = cpu_seconds([busy.pid])
        # the child's own count of its CPU time reached 0.6 s; the interpreter's start adds a little
        assert 0.6 <= spent < 1.5, spent
        assert cpu_seconds([idle.pid]) < 0.05
        # both together are the sum, and a process that is gone counts nothing
        assert cpu_seconds([busy.pid, idle.pid, 2**22 + 7]) == cpu_seconds([busy.pid]) + cpu_seconds([idle.pid])
    finally:
        busy.kill()
        idle.kill()
        busy.wait()
        idle.wait()
