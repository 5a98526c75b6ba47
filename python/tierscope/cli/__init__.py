"""The `tierscope` command line: one verb per user job.

Each verb lives in its own module of this package and exposes `register(app)`; modules are found
automatically, so adding a verb means adding a file.
"""

from __future__ import annotations

import importlib
import pkgutil

import typer

app = typer.Typer(
    name="tierscope",
    help="A performance lab for N-tier systems: build the system under test, drive it with "
    "emulated users, trace every request at every tier, and find the bottleneck.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
)


@app.callback()
def _root() -> None:
    """A performance lab for N-tier systems. Start with [bold]make demo[/bold] or [bold]tierscope demo --help[/bold]."""


def _register_verbs() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(app)


_register_verbs()


def main() -> None:
    app()
