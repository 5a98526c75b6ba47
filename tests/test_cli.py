"""The CLI's own contract: every verb has --help with an example; version names all three parts."""

import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "tierscope"), *args], capture_output=True, text=True, timeout=60)


def test_version_prints_package_engine_and_python():
    out = run("version")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("tierscope 0.")
    assert lines[1].startswith("tierscope-engine 0.")
    assert "missing" not in lines[1]
    assert lines[2] == f"python {sys.version.split()[0]}"


def _verbs() -> list[str]:
    from tierscope.cli import app

    import typer.main

    group = typer.main.get_command(app)
    return sorted(group.commands)  # type: ignore[attr-defined]


@pytest.mark.parametrize("verb", _verbs())
def test_every_verb_has_help_with_an_example(verb):
    out = run(verb, "--help")
    assert out.returncode == 0, out.stderr
    assert "tierscope " + verb in out.stdout.replace("\n", " ") or "Example" in out.stdout, out.stdout
