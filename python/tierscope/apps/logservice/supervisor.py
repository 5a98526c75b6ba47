"""A supervisor for the log service's servers: a thread that restarts the broker, the database and
the app server (whose workers run the collectors) when one of them dies, so a single fault (a
kill -9 of any of them) is repaired without anyone watching.

Each watched `Service` is checked every `every_s`; one whose process has exited is started again
(`Service.start`: same port, same data directory, so Redis replays its append-only file and
PostgreSQL recovers from its WAL), with pauses growing to 5 s while it fails to come back. Every
restart is kept in `restarts` (name, when it was seen dead, when it answered again, or the error).
Inside the app server, gunicorn replaces a dead worker and each worker replaces a dead collector
thread (`store._Collectors.watch`).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

log = logging.getLogger("tierscope.logservice")


@dataclass
class Restart:
    name: str
    died_s: float  # monotonic time the death was seen
    back_s: float | None = None  # monotonic time it answered again (None: not yet)
    error: str = ""

    @property
    def down_s(self) -> float | None:
        return None if self.back_s is None else self.back_s - self.died_s


class Supervisor:
    """Restart the services in `watched` ({name: Service}) when their process exits."""

    def __init__(self, watched: dict, every_s: float = 0.2):
        self.watched = dict(watched)
        self.every_s = every_s
        self.restarts: list[Restart] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lock = threading.Lock()  # held while a service is restarted (callers may stop one meanwhile)

    def start(self) -> Supervisor:
        self._thread = threading.Thread(target=self._loop, name="supervisor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching (before the services are stopped on purpose); waits for a restart under way."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=120)

    def _dead(self, name: str, svc) -> bool:
        return name in self._failed or (svc.proc is not None and svc.proc.poll() is not None)

    def _loop(self) -> None:
        pause: dict[str, float] = {}
        retry_at: dict[str, float] = {}
        self._failed: set[str] = set()  # services whose restart failed (their proc is None)
        while not self._stop.wait(self.every_s):
            for name, svc in self.watched.items():
                if self._stop.is_set() or not self._dead(name, svc):
                    continue
                now = time.monotonic()
                if now < retry_at.get(name, 0.0):
                    continue
                with self.lock:
                    if self._stop.is_set():
                        return
                    rec = next((r for r in self.restarts if r.name == name and r.back_s is None), None)
                    if rec is None:
                        code = svc.proc.returncode if svc.proc is not None else None
                        log.warning("supervisor: %s died (status %s), restarting", name, code)
                        rec = Restart(name, now)
                        self.restarts.append(rec)
                    try:
                        if svc.proc is not None:
                            svc.stop(timeout=1)  # reaps it and kills what is left of its process group
                        svc.start()
                    except Exception as err:  # try again later, pauses growing to 5 s
                        rec.error = f"{type(err).__name__}: {str(err)[:300]}"
                        pause[name] = min(5.0, pause.get(name, 0.25) * 2)
                        retry_at[name] = time.monotonic() + pause[name]
                        log.warning("supervisor: %s did not come back (%s); again in %.1f s", name, err, pause[name])
                        self._failed.add(name)
                        continue
                    self._failed.discard(name)
                    rec.back_s, rec.error = time.monotonic(), ""
                    pause.pop(name, None)
                    log.warning("supervisor: %s back after %.1f s", name, rec.down_s)

    def summary(self) -> list[str]:
        """One line per restart: "broker1 restarted, down 1.2 s"."""
        out = []
        for r in self.restarts:
            if r.back_s is None:
                out.append(f"{r.name} died and was not restarted ({r.error or 'still trying'})")
            else:
                out.append(f"{r.name} restarted by the supervisor, down {r.down_s:.1f} s")
        return out
