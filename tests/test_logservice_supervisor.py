"""The log service's supervisor on throwaway processes (no servers): a killed service is started
again, a start that fails is tried again, a stopped supervisor restarts nothing."""

from __future__ import annotations

import os
import signal
import time

from tierscope.apps.logservice.supervisor import Supervisor
from tierscope.services.base import Service
from tierscope.testbed.host import Host


class Sleeper(Service):
    kind = "sleeper"
    start_timeout = 5.0

    def __init__(self, workdir, fail_starts: int = 0):
        super().__init__(Host.loopback(), 1, workdir, name="sleeper1")
        self.fail_starts = fail_starts
        self.starts = 0

    def prepare(self) -> None:
        self.starts += 1
        if self.starts <= self.fail_starts:
            raise RuntimeError(f"start {self.starts} fails on purpose")

    def command(self) -> list[str]:
        return ["sleep", "60"]

    def healthy(self) -> bool:  # (nothing listens on port 1, so the port-in-use check passes)
        return True


def _wait(cond, timeout: float = 15.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return False


def test_a_killed_service_is_started_again_and_the_restart_is_reported(tmp_path):
    svc = Sleeper(tmp_path / "s").start()
    sup = Supervisor({"sleeper1": svc}, every_s=0.05).start()
    try:
        first = svc.proc.pid
        os.killpg(first, signal.SIGKILL)
        assert _wait(lambda: svc.running() and svc.proc.pid != first)
        assert _wait(lambda: sup.restarts and sup.restarts[0].back_s is not None)
        assert sup.summary()[0].startswith("sleeper1 restarted by the supervisor, down ")
    finally:
        sup.stop()
        svc.stop()


def test_a_start_that_fails_is_tried_again(tmp_path):
    svc = Sleeper(tmp_path / "s", fail_starts=0).start()
    svc.fail_starts = 3  # the next two starts fail (starts 2 and 3), the fourth works
    sup = Supervisor({"sleeper1": svc}, every_s=0.05).start()
    try:
        os.killpg(svc.proc.pid, signal.SIGKILL)
        assert _wait(lambda: svc.running() and svc.starts == 4, timeout=20)
        assert len(sup.restarts) == 1 and sup.restarts[0].back_s is not None
    finally:
        sup.stop()
        svc.stop()


def test_a_stopped_supervisor_restarts_nothing(tmp_path):
    svc = Sleeper(tmp_path / "s").start()
    sup = Supervisor({"sleeper1": svc}, every_s=0.05).start()
    sup.stop()
    os.killpg(svc.proc.pid, signal.SIGKILL)
    time.sleep(0.5)
    assert not svc.running() and sup.restarts == []
    svc.stop()
