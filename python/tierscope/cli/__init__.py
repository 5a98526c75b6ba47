"""The `tierscope` command line: one verb per user job.

Each verb lives in its own module of this package and exposes `register(app)`; modules are found
automatically, so adding a verb means adding a file.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

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


def flowing(text: str) -> str:
    """A help text as paragraphs that wrap to the terminal: Rich keeps every line break of a
    docstring, so lines wrapped for the source at 100 columns came out ragged on an 80-column
    terminal. A paragraph's lines are joined with spaces unless it is a list or an indented block
    (a line after its first starting with "-", "*", "|" or a space), which keeps its lines."""
    out = []
    for para in re.split(r"\n\s*\n", inspect.cleandoc(text)):
        lines = para.splitlines()
        if any(line.startswith((" ", "-", "*", "|")) for line in lines[1:]):
            out.append(para)
        else:
            out.append(" ".join(line.strip() for line in lines))
    return "\n\n".join(out)


def _reflow_help(typer_app: typer.Typer) -> None:
    for command in typer_app.registered_commands:
        text = command.help or (command.callback.__doc__ if command.callback else None)
        if text:
            command.help = flowing(text)
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _reflow_help(group.typer_instance)


def _register_verbs() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(app)
    _reflow_help(app)


_register_verbs()


def main() -> None:
    app()
