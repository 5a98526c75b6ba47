"""Verbs that write refuse an unwritable output before the work (a capture of --duration seconds,
a simulation), with exit status 2 and the option named."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

EXE = Path(sys.executable).parent / "tierscope"
SIM = Path(__file__).resolve().parent.parent / "examples" / "simulate" / "alternating.toml"


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([str(EXE), *map(str, args)], capture_output=True, text=True, timeout=120)


def test_simulate_refuses_an_output_under_a_file_before_simulating(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    started = time.monotonic()
    out = run("simulate", SIM, "-o", blocker / "sim")
    assert out.returncode == 2
    assert f"error: -o {blocker / 'sim'}: cannot create it" in out.stderr
    assert time.monotonic() - started < 20 and not (blocker.parent / "sim").exists()


def test_trace_refuses_an_output_under_a_file_before_capturing(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    started = time.monotonic()
    out = run("trace", "--live", "lo", "--duration", "30", "-o", blocker / "requests.parquet")
    assert out.returncode == 2 and f"directory {blocker}: exists and is not a directory" in out.stderr
    assert "capturing" not in out.stderr
    assert time.monotonic() - started < 20  # not after the 30 s capture
    out = run("trace", "--live", "lo", "--duration", "30", "-o", tmp_path / "r.parquet", "--keep-capture", tmp_path)
    assert out.returncode == 2 and "--keep-capture" in out.stderr and "is a directory" in out.stderr
