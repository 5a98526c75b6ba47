"""`tierscope version`: package, engine and Python versions."""

from __future__ import annotations

import platform

import typer
from rich.console import Console


def version() -> None:
    """Print the versions of tierscope, its native engine and Python.

    Example: [bold]tierscope version[/bold]
    """
    from tierscope import __version__
    from tierscope.engine import EngineNotFound, engine_version

    try:
        engine = engine_version()
    except EngineNotFound as err:
        engine = f"missing ({err})"
    console = Console()
    console.print(f"tierscope {__version__}")
    console.print(f"tierscope-engine {engine}")
    console.print(f"python {platform.python_version()}")


def register(app: typer.Typer) -> None:
    app.command("version")(version)
