"""The shipped studies: one catalog (presets/studies.toml) that `tierscope run --list`, `run --help`
and an unknown name all print from, one table per preset and one preset per table; `tierscope run
NAME` runs each with the runner of its kind."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tierscope.cli.run import KINDS, kind_of, presets_dir, studies

BIN = Path(sys.executable).parent


def tierscope(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="250")
    return subprocess.run([str(BIN / "tierscope"), *args], capture_output=True, text=True, timeout=60, env=env)


def test_every_preset_has_a_catalog_entry_and_every_entry_a_preset():
    names = [s.name for s in studies()]
    files = sorted(p.stem for p in presets_dir().glob("*.toml") if p.name != "studies.toml")
    assert sorted(names) == files
    for s in studies():
        assert s.path.exists() and s.kind in KINDS and s.seed[:3] in {"000", "001", "002", "003", "004"}
        assert s.finding and 0 < s.minutes <= 60, s


def test_run_list_prints_every_study_one_a_line_name_seed_finding_minutes():
    out = tierscope("run", "--list")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == len(studies())
    for line, s in zip(lines, studies()):
        assert line.split()[0] == s.name
        assert f"seed {s.seed}" in line and s.finding in line and line.endswith(f"(~{s.minutes:g} min)")


def test_run_help_and_an_unknown_name_list_every_study():
    names = [s.name for s in studies()]
    help_text = " ".join(tierscope("run", "--help").stdout.split())
    for name in names:
        assert name in help_text
    out = tierscope("run", "no-such-preset")
    assert out.returncode == 2
    assert "no-such-preset: no such file, nor a shipped study" in out.stderr
    listed = [line.split()[0] for line in out.stderr.splitlines()[1:] if line.strip()]
    assert listed == names


def test_each_preset_is_run_by_the_runner_of_its_kind(tmp_path):
    kinds = {s.name: kind_of(s.path) for s in studies()}
    assert kinds["ingest"] == "logservice" and kinds["oltp-scaling"] == "oltp-scaling"
    assert kinds["demo"] == kinds["tpcw-memory"] == "spec"
    # a copy outside the package is recognised by its keys
    copy = tmp_path / "my-ingest.toml"
    copy.write_text((presets_dir() / "ingest.toml").read_text())
    assert kind_of(copy) == "logservice"
    assert kind_of(tmp_path / "missing.toml") == "spec"  # the spec loader says what is wrong


@pytest.mark.parametrize("flag", [["--hosts", "inventory.yml"], ["--resume"]])
def test_options_the_log_service_has_no_use_for_are_refused_in_one_line(flag):
    out = tierscope("run", "ingest", *flag)
    assert out.returncode == 2
    assert "not for seed 003's log service" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_a_bad_log_service_preset_given_to_run_names_the_key(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[service]\ndb_cpu = 0.0005\n")
    out = tierscope("run", str(bad), "-o", str(tmp_path / "out"))
    assert out.returncode == 2
    assert "below the kernel's 1 ms" in out.stderr
