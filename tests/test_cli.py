"""The CLI's own contract: every verb's --help shows an example command (not just its Usage line)
whose options are all ones its parser declares; version names all three parts."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="250")  # one example per line: the help is not wrapped narrower
    return subprocess.run([str(BIN / "tierscope"), *args], capture_output=True, text=True, timeout=60, env=env)


def test_version_prints_package_engine_and_python():
    out = run("version")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("tierscope 0.")
    assert lines[1].startswith("tierscope-engine 0.")
    assert "missing" not in lines[1]
    assert lines[2] == f"python {sys.version.split()[0]}"


def _group():
    import typer.main

    from tierscope.cli import app

    return typer.main.get_command(app)


def _verbs() -> list[str]:
    return sorted(_group().commands)  # type: ignore[attr-defined]


def examples(verb: str, help_text: str) -> list[str]:
    """The `tierscope <verb> ...` commands the help's description shows (not its Usage line nor
    the option tables), one string each ("   or   " and backticks end one)."""
    text = help_text.split("\u256d", 1)[0]  # the description ends where the first table box starts
    text = "\n".join(line for line in text.splitlines() if not line.strip().startswith("Usage:"))
    found = []
    for para in re.split(r"\n\s*\n", text):
        para = " ".join(para.split("\n"))
        for m in re.finditer(rf"(?<![\w`-])tierscope {re.escape(verb)}\b", para):
            found.append(re.split(r"\s{2,}or\b|`", para[m.start() :], maxsplit=1)[0].strip())
    return found


def unknown_options(verb: str, command_line: str) -> list[str]:
    """The options of an example command line that the verb's parser (or its subcommand's) does
    not declare."""
    command = _group().commands[verb]  # type: ignore[attr-defined]
    words = command_line.split()[2:]
    sub = getattr(command, "commands", None)
    if sub is not None:  # a group: the first word names the subcommand
        assert words and words[0] in sub, f"{command_line!r}: no subcommand of {verb} ({sorted(sub)})"
        command, words = sub[words[0]], words[1:]
    declared = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
    flags = [w.split("=", 1)[0] for w in words if re.fullmatch(r"--?[A-Za-z][\w-]*(=.*)?", w)]
    return [f for f in flags if f not in declared]


@pytest.mark.parametrize("verb", _verbs())
def test_every_verb_has_help_with_an_example(verb):
    out = run(verb, "--help")
    assert out.returncode == 0, out.stderr
    assert "Example" in out.stdout, out.stdout
    shown = examples(verb, out.stdout)
    assert shown, f"no `tierscope {verb} ...` command in the help's description:\n{out.stdout}"
    for line in shown:  # every option an example uses is one the parser takes
        assert unknown_options(verb, line) == [], (line, out.stdout)


@pytest.mark.parametrize("verb", ["run", "analyze", "demo"])
def test_help_paragraphs_fill_an_80_column_terminal(verb):
    """Rich keeps a docstring's line breaks: lines wrapped at 100 columns in the source came out
    as a long line and a stub on 80 columns. Each paragraph of the description flows: every line
    but a paragraph's last fills at least half the width (a long path may wrap early)."""
    env = dict(os.environ, COLUMNS="80")
    out = subprocess.run([str(BIN / "tierscope"), verb, "--help"], capture_output=True, text=True, timeout=60, env=env)
    text = out.stdout.split("\u256d", 1)[0]
    paragraphs = [p.splitlines() for p in re.split(r"\n\s*\n", text) if p.strip() and "Usage:" not in p]
    assert paragraphs, out.stdout
    for lines in paragraphs:
        for line in lines[:-1]:
            assert len(line.rstrip()) >= 40, (line, lines)


def test_flowing_joins_a_paragraphs_lines_and_keeps_lists():
    from tierscope.cli import flowing

    assert flowing("One idea\n    wrapped.\n\n    Two.") == "One idea wrapped.\n\nTwo."
    assert flowing("A list:\n- one\n- two") == "A list:\n- one\n- two"
