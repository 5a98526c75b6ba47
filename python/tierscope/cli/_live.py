"""The live display of a running experiment (Rich), fed by the runner's `Progress`."""

from __future__ import annotations

import threading
import time

from rich.console import Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from tierscope.runner import Progress


def render(p: Progress) -> Group:
    head = Table.grid(padding=(0, 2))
    for _ in range(2):
        head.add_column()
    head.add_row("point", f"{p.point_index}/{p.points_total}  [bold]{escape(p.point_id)}[/bold]")
    head.add_row("phase", escape(p.phase))
    elapsed = time.monotonic() - p.point_started if p.point_started else 0.0
    left = max(0.0, p.point_seconds - elapsed)
    head.add_row("users", f"{p.active_users}/{p.users}")
    head.add_row("requests/s", f"{p.rps:,.0f}")
    head.add_row("p90 response", f"{p.p90_ms:.1f} ms" if p.p90_ms is not None else "-")
    head.add_row("errors", f"[red]{p.errors}[/red]" if p.errors else "0")
    head.add_row("time left", f"{left:.0f} s of this point's load")
    parts: list[RenderableType] = [head]
    if p.point_seconds:
        parts.append(ProgressBar(total=p.point_seconds, completed=min(elapsed, p.point_seconds), width=50))
    if p.finished:
        done = Table("point", "status", "note", box=None, padding=(0, 1))
        for pid, status, note in p.finished[-8:]:
            style = {"done": "green", "failed": "red"}.get(status, "dim")
            done.add_row(escape(pid), f"[{style}]{escape(status)}[/{style}]", escape(note[:80]))
        parts.append(done)
    parts += [Text(m, style="dim") for m in p.messages[-4:]]
    return Group(*parts)


class LiveDisplay:
    """Refreshes the display 4 times a second from another thread while the runner works.

    Not on a terminal (`enabled` False: a log file, a pipe, CI), it prints one plain line per
    message and per finished point instead, so a long sweep still shows that it advances.
    """

    def __init__(self, progress: Progress, enabled: bool = True):
        self.progress = progress
        self.enabled = enabled
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._printed = (0, 0)  # messages, finished points already printed as lines

    def __enter__(self) -> LiveDisplay:
        if self.enabled:
            self._live = Live(render(self.progress), refresh_per_second=4, transient=False)
            self._live.__enter__()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(0.25):
            self._refresh()

    def _refresh(self) -> None:
        if self.enabled:
            self._live.update(render(self.progress))
            return
        p = self.progress
        seen_messages, seen_points = self._printed
        new = min(p.messages_said - seen_messages, len(p.messages))
        for message in p.messages[len(p.messages) - new :]:
            print(message, flush=True)
        for pid, status, note in p.finished[seen_points:]:
            print(f"point {pid}: {status}{' (' + note + ')' if note else ''}", flush=True)
        self._printed = (p.messages_said, len(p.finished))

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self._refresh()
        if self.enabled:
            self._live.__exit__(*exc)
