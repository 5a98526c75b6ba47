"""Messages reach the terminal as they were written: the CLI prints through Rich with markup on,
and a bracketed word in a message (`[interference]`, a host `[h1]`, a path `results[2]`) was taken
as a markup tag and dropped ("remove  for --hosts")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rich.console import Console

from tierscope.analysis.summary import Summary
from tierscope.report import print_summary

EXE = Path(sys.executable).parent / "tierscope"
ROOT = Path(__file__).resolve().parents[1]


def test_run_hosts_names_the_interference_section(tmp_path):
    """`tierscope run --hosts` refuses a spec with interference (it runs only on the local
    testbed) before any host is contacted, naming the section to remove."""
    spec = tmp_path / "paused.toml"
    spec.write_text(
        (ROOT / "examples" / "specs" / "tiny.toml").read_text()
        + '\n[[interference.pause]]\ntier = "app"\nperiod = "1s"\nduration = "50ms"\n'
    )
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        "all:\n  children:\n"
        "    web: {hosts: {h1: {ansible_host: 127.0.0.1}}}\n"
        "    app: {hosts: {h1: {ansible_host: 127.0.0.1}}}\n"
        "    db: {hosts: {h1: {ansible_host: 127.0.0.1}}}\n"
        "    client: {hosts: {h1: {ansible_host: 127.0.0.1}}}\n"
    )
    out = subprocess.run(
        [str(EXE), "run", str(spec), "--hosts", str(inventory), "-o", str(tmp_path / "results")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert "remove [interference] for --hosts" in out.stderr, out.stderr


def test_a_verdict_with_brackets_is_printed_whole():
    console = Console(record=True, width=400, color_system=None)
    summary = Summary(
        headline="single bottleneck at app [app1] (set by [interference])",
        confidence="low [h1]",
        look_at=["results[2]/point-0/report.html"],
        facts=[("[monitor] interval", "100 ms [bold]")],
    )
    print_summary(summary, console)
    text = console.export_text()
    for said in (
        "Bottleneck: single bottleneck at app [app1] (set by [interference])  How sure: low [h1]",
        "results[2]/point-0/report.html",
        "[monitor] interval",
        "100 ms [bold]",
    ):
        assert said in text, text
