"""What the tests share: where the repository's files are, and the skip conditions of tests that
need the machine's privileges or programs (each says what is missing). Tests import these names
(`from conftest import ROOT, needs_root`); pytest puts this directory on the import path."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

#: the repository's root, its example specs and the shipped presets
ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "specs"
PRESETS = ROOT / "python" / "tierscope" / "presets"

POSTGRES = Path("/usr/lib/postgresql/15/bin/postgres")


def needs_root(why: str) -> pytest.MarkDecorator:
    """Skip unless root; `why` says what needs it (e.g. "PostgreSQL runs as its own OS user")."""
    return pytest.mark.skipif(os.geteuid() != 0, reason=f"{why}: needs root")


needs_postgres = pytest.mark.skipif(not POSTGRES.exists(), reason="postgresql-15 not installed")
needs_tcpdump = pytest.mark.skipif(shutil.which("tcpdump") is None, reason="tcpdump not installed")
